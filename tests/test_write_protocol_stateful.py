"""A stateful model of the write protocol against the real service (its process, over loopback HTTP):
Hypothesis interleaves sends (with a valid, expired, mis-bound or missing approval, and a fault before the
commit, after it, or none), resends under one key with another payload, and status queries. After every
step, for every operation: at most one effect, an effect exactly when the model says the service committed
it, and the service's idempotency ledger (its status answer) agreeing with its effect table."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.conftest import BusinessService, approval_token

U1 = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
PATH = "/calendars/cal-u1/events"
SLOTS = [0, 1, 2]  # three operations per example, each with its own key
TOOL = "create_calendar_event"


def body(key: str, slot: int, variant: int = 0) -> dict[str, Any]:
    hour = 9 + slot
    return {
        "calendarId": "cal-u1",
        "title": f"stateful {key}" + (" (other payload)" if variant else ""),
        "start": f"2027-03-0{1 + variant}T{hour:02d}:00:00Z",
        "end": f"2027-03-0{1 + variant}T{hour:02d}:30:00Z",
        "attendees": [],
    }


# Faults the service injects on the next POST (demo.bizservice.faults), or none.
FAULTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "unavailable_before_commit": {"status": 503},
    "drop_after_commit": {"when": "after_commit", "action": "drop"},
    "500_after_commit": {"when": "after_commit", "status": 500},
    "cut_after_commit": {"when": "after_commit", "action": "truncate"},
}


class WriteProtocol(RuleBasedStateMachine):
    service: BusinessService  # set by the test below

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.http = httpx.AsyncClient(base_url=self.service.url, timeout=10, trust_env=False)
        self.admin = {"X-Admin-Token": self.service.admin_token}
        # Fresh keys per example: the service (and its tables) are shared by the whole run.
        self.keys = [f"op_{uuid.uuid4().hex}" for _ in SLOTS]
        # The model: which key's effect the service committed, and with which payload variant.
        self.committed: dict[str, int] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.http.delete("/admin/faults", headers=self.admin))
        self.run(self.http.aclose())
        self.loop.close()

    @rule(
        slot=st.sampled_from(SLOTS),
        variant=st.sampled_from([0, 0, 1]),
        approval=st.sampled_from(["valid", "valid", "expired", "other_digest", "other_operation", "none"]),
        fault=st.sampled_from(list(FAULTS)),
    )
    def send(self, slot: int, variant: int, approval: str, fault: str) -> None:
        key = self.keys[slot]
        payload = body(key, slot, variant)
        headers = {**U1, "Idempotency-Key": key}
        if approval != "none":
            bound = body(key, slot, 1 - variant) if approval == "other_digest" else payload
            operation = self.keys[(slot + 1) % len(SLOTS)] if approval == "other_operation" else key
            expires = -5.0 if approval == "expired" else 300.0
            headers["X-Approval-Token"] = approval_token(operation, TOOL, bound, expires_in=expires)
        fault_rule = FAULTS[fault]
        rules = [{"method": "POST", "path_regex": f"^{PATH}$", "times": 1, **fault_rule}] if fault_rule else []
        self.run(self.http.put("/admin/faults", json={"rules": rules}, headers=self.admin))
        response: httpx.Response | None
        try:
            response = self.run(self.http.post(PATH, json=payload, headers=headers))
        except httpx.TransportError:
            response = None  # the reply was lost or cut: the client cannot tell what happened
        self.run(self.http.delete("/admin/faults", headers=self.admin))
        first = self.committed.get(key)
        before = fault == "unavailable_before_commit"
        if response is not None and before:
            assert response.status_code == 503, response.text  # refused before anything was looked at
            return
        if first is not None:
            # The key is taken: the same payload gets the stored result (nothing is done again, so no
            # after-commit fault fires) if its approval is the one it needs, expired or not; another payload,
            # or no such approval, is refused. Never a second effect.
            assert response is not None, fault
            code = _code(response)
            if first == variant and approval in ("valid", "expired"):
                assert response.status_code in (200, 201), response.text
            elif first == variant:
                assert (response.status_code, code) == (403, "APPROVAL_REQUIRED"), response.text
            else:
                assert code in ("IDEMPOTENCY_KEY_REUSED", "APPROVAL_REQUIRED", "APPROVAL_EXPIRED"), response.text
            return
        if approval != "valid":
            # No valid approval bound to this operation and payload: refused, nothing done (an expired one with
            # its own code).
            assert response is not None and response.status_code == 403, (approval, response)
            expected = "APPROVAL_EXPIRED" if approval == "expired" else "APPROVAL_REQUIRED"
            assert _code(response) == expected, response.text
            return
        self.committed[key] = variant
        if response is None:
            assert fault in ("drop_after_commit", "cut_after_commit"), fault  # committed, then the reply was lost
        elif fault == "500_after_commit":
            assert response.status_code == 500
        else:
            assert response.status_code == 201, response.text

    @rule(slot=st.sampled_from(SLOTS))
    def ask_status(self, slot: int) -> None:
        key = self.keys[slot]
        response = self.run(self.http.get(f"/operations/{key}", headers=U1))
        assert response.status_code == 200, response.text
        state = response.json()["state"]
        assert state == ("completed" if key in self.committed else "not_found"), (key, response.json())

    @invariant()
    def effects_agree_with_the_model_and_the_ledger(self) -> None:
        for slot, key in enumerate(self.keys):
            mine = self.run(self.http.get("/admin/effects", params={"operation_id": key}, headers=self.admin))
            effects = mine.json()["effects"]
            assert len(effects) == (1 if key in self.committed else 0), (key, self.committed, effects)
            if effects:
                assert effects[0]["title"] == body(key, slot, self.committed[key])["title"]


def _code(response: httpx.Response) -> str | None:
    return response.json().get("code") if "json" in response.headers.get("content-type", "") else None


def test_the_write_protocol_holds_under_random_interleavings(business_service: BusinessService) -> None:
    WriteProtocol.service = business_service
    run_state_machine_as_test(
        WriteProtocol,
        settings=settings(
            max_examples=25,
            stateful_step_count=12,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
