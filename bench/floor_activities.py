"""Activities (I/O): the floor's model and business calls - plain httpx calls to the same endpoints with the
same headers toolloop's tools send, answers passed on as text. Given a policy's signing key (the policy phase),
its writes are decided by rule: the write activity signs the policy's allow itself (the floor evaluates no
policy: it is the baseline)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from temporalio import activity

from bench.floor_types import FloorCall, FloorReadBack, FloorTurn, FloorWrite, Plan
from bench.scenarios import (
    ANSWER,
    CALENDAR,
    REPORT_TOOL,
    WRITE_TOOL,
    calls_for_turn,
    report_output,
    scenario_of,
    write_body,
)
from demo.bizservice.writes import AUDIENCE
from toolloop._core.approvals import PolicyClaims, http_subject, mint_approval_token, payload_digest

ACTOR_HEADERS = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
WRITE_PATH = f"/calendars/{CALENDAR}/events"
_DECISION_TTL_S = 600.0


class FloorActivities:
    """`policy`: the policy's signing key and the rule its decisions name; given, every write is decided by it."""

    def __init__(self, http: httpx.AsyncClient, policy: tuple[str, str] | None = None) -> None:
        self._http = http
        self._policy = policy

    @activity.defn(name="floor_model")
    async def model(self, turn: FloorTurn) -> Plan:
        calls = calls_for_turn(scenario_of(turn.request), turn.turn)
        if calls is None:
            return Plan(answer=ANSWER)
        by_rule = self._policy is not None
        return Plan(
            calls=[
                FloorCall(c.name, c.arguments, c.call_id, write=c.name == WRITE_TOOL, by_rule=by_rule) for c in calls
            ]
        )

    @activity.defn(name="floor_read")
    async def read(self, call: FloorCall) -> str:
        if call.name == REPORT_TOOL:
            return json.dumps(report_output(call.arguments["reportId"], call.arguments["size"]))
        response = await self._http.get(f"/orders/{call.arguments['orderId']}", headers=ACTOR_HEADERS)
        response.raise_for_status()
        return response.text

    @activity.defn(name="floor_write")
    async def write(self, inp: FloorWrite) -> str:
        body = write_body(inp.arguments)
        token = inp.token if inp.token is not None else self._rule_decision(inp.key, body)
        headers = {**ACTOR_HEADERS, "Idempotency-Key": inp.key, "X-Approval-Token": token}
        response = await self._http.post(WRITE_PATH, json=body, headers=headers)
        response.raise_for_status()
        event_id: str = response.json()["event_id"]
        return event_id

    @activity.defn(name="floor_read_back")
    async def read_back(self, inp: FloorReadBack) -> str:
        response = await self._http.get(f"/calendars/{CALENDAR}/events/{inp.event_id}", headers=ACTOR_HEADERS)
        response.raise_for_status()
        return response.text

    def _rule_decision(self, key: str, body: dict[str, Any]) -> str:
        """The policy's allow for this very POST, as the policy evaluator would sign it."""
        if self._policy is None:
            raise RuntimeError("a write decided by rule, and this floor holds no policy key")
        signing_key, rule = self._policy
        now = time.time()
        claims = PolicyClaims(
            audience=AUDIENCE,
            user_id=ACTOR_HEADERS["X-Actor-User"],
            tenant_id=ACTOR_HEADERS["X-Actor-Tenant"],
            operation_id=key,
            digest=payload_digest(http_subject("POST", WRITE_PATH), body),
            verdict="allow",
            rules=[rule],
            policy_version="floor",
            decided_at=now,
            expires_at=now + _DECISION_TTL_S,
        )
        return mint_approval_token(signing_key, claims)

    def all(self) -> list[Callable[..., Any]]:
        return [self.model, self.read, self.write, self.read_back]
