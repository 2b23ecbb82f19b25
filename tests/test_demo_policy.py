"""The demo's approval policy (config/policies/demo.cedar with its schema) decides each of its rules' cases, on
arguments as the demo tools dump them and facts as the demo service returns them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from demo.bizservice.app import create_app
from demo.bizservice.seed import SEED_FACTS
from demo.tools import AppendTicketNoteArgs, CreateCalendarEventArgs, Order, RefundOrderArgs, Ticket
from toolloop._api.tokens import PUBLISHED_DEMO_TOKENS, TokenMap
from toolloop._core.policies import Policies, PolicyVerdict, WriteProposal, load_policies

REPO = Path(__file__).resolve().parents[1]
POLICIES = REPO / "config" / "policies"
# The fields of each fact the policy reads: the write declarations' PolicyFact(fields=...) must be these.
ORDER_FACT = ["late", "paid_from", "refundable_cents"]
TICKET_FACT = ["owner"]
PAID_FROM = SEED_FACTS["order_a100"]["paid_from"]
LATE_ORDER = {"late": True, "paid_from": PAID_FROM, "refundable_cents": 12999}


@pytest.fixture(scope="module")
def policies() -> Policies:
    return load_policies(POLICIES / "demo.cedar", POLICIES / "demo.cedarschema")


def _dump(model: type[BaseModel], arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the workflow binds them: validated, then dumped under the model's names (None kept)."""
    dumped: dict[str, Any] = model.model_validate(arguments).model_dump(mode="json", by_alias=True)
    return dumped


def _refund(amount: int, order: dict[str, Any] | None = LATE_ORDER, **extra: Any) -> WriteProposal:
    arguments = _dump(RefundOrderArgs, {"orderId": "A100", "amountCents": amount, "reason": "late", **extra})
    return _proposal("refund_order", arguments, {} if order is None else {"order": order})


def _proposal(
    tool: str, arguments: dict[str, Any], facts: dict[str, Any], roles: tuple[str, ...] = ()
) -> WriteProposal:
    return WriteProposal(tool, "acme", "u1", roles, arguments, facts)


def _asked(verdict: PolicyVerdict) -> tuple[bool, list[str], int]:
    assert verdict.verdict == "ask" and verdict.deciders is not None, verdict
    return verdict.deciders.requester, verdict.deciders.roles, verdict.deciders.approvals


def test_the_policy_validates_and_names_every_rule(policies: Policies) -> None:
    assert sorted(policies.rule_names.values()) == sorted(
        [
            "small-late-refund",
            "refund-to-payer-only",
            "refund-over-refundable",
            "manager-decides-larger-refunds",
            "four-eyes-over-200",
            "own-ticket-note",
            "requester-decides-the-rest",
        ]
    )
    assert policies.roles == ["manager"]


@pytest.mark.parametrize("to_account", [None, PAID_FROM], ids=["no-toAccount", "the-paying-account"])
@pytest.mark.parametrize("amount", [1, 1000])
def test_a_small_refund_of_a_late_order_is_allowed_by_its_rule(
    policies: Policies, amount: int, to_account: str | None
) -> None:
    verdict = policies.evaluate(_refund(amount, toAccount=to_account))
    assert (verdict.verdict, verdict.rules) == ("allow", ["small-late-refund"])


def test_a_refund_to_another_account_is_denied_even_under_the_threshold(policies: Policies) -> None:
    foreign = policies.evaluate(_refund(300, toAccount="acct-u2-0001"))
    assert (foreign.verdict, foreign.rules) == ("deny", ["refund-to-payer-only"])
    # Without the order read, nobody knows which account paid: a named account is refused too.
    unread = policies.evaluate(_refund(300, order=None, toAccount=PAID_FROM))
    assert (unread.verdict, unread.rules) == ("deny", ["refund-to-payer-only"])


def test_a_refund_over_what_is_refundable_is_denied(policies: Policies) -> None:
    verdict = policies.evaluate(_refund(501, order={**LATE_ORDER, "refundable_cents": 500}))
    assert (verdict.verdict, verdict.rules) == ("deny", ["refund-over-refundable"])
    assert policies.evaluate(_refund(500, order={**LATE_ORDER, "refundable_cents": 500})).verdict == "allow"


def test_a_small_refund_not_covered_by_the_rule_asks_the_requester(policies: Policies) -> None:
    for proposal in (_refund(500, order={**LATE_ORDER, "late": False}), _refund(500, order=None)):
        verdict = policies.evaluate(proposal)
        assert _asked(verdict) == (True, [], 1)
        assert verdict.rules == ["requester-decides-the-rest"]


def test_a_larger_refund_asks_a_manager_not_the_requester(policies: Policies) -> None:
    verdict = policies.evaluate(_refund(1001))
    assert _asked(verdict) == (False, ["manager"], 1)
    assert verdict.rules == ["manager-decides-larger-refunds"]


def test_above_20000_cents_the_requester_confirms_and_a_manager_countersigns(policies: Policies) -> None:
    big_order = {**LATE_ORDER, "refundable_cents": 100000}
    at = policies.evaluate(_refund(20000, order=big_order))
    assert _asked(at) == (False, ["manager"], 1)
    above = policies.evaluate(_refund(20001, order=big_order))
    assert _asked(above) == (True, ["manager"], 2)
    assert above.rules == ["requester-decides-the-rest", "manager-decides-larger-refunds", "four-eyes-over-200"]


def test_a_note_on_the_requesters_own_ticket_is_allowed_and_without_the_read_asks_them(policies: Policies) -> None:
    arguments = _dump(AppendTicketNoteArgs, {"ticketId": "T1001", "text": "Photos received.", "expectedVersion": 1})
    own = policies.evaluate(_proposal("append_ticket_note", arguments, {"ticket": {"owner": "u1"}}))
    assert (own.verdict, own.rules) == ("allow", ["own-ticket-note"])
    unread = policies.evaluate(_proposal("append_ticket_note", arguments, {}))
    assert _asked(unread) == (True, [], 1) and unread.rules == ["requester-decides-the-rest"]


def test_a_calendar_event_asks_the_requester(policies: Policies) -> None:
    arguments = _dump(
        CreateCalendarEventArgs,
        {
            "calendarId": "cal-u1",
            "title": "Supplier call",
            "start": "2026-12-03T10:00:00Z",
            "end": "2026-12-03T11:00:00Z",
            "attendees": None,
        },
    )
    verdict = policies.evaluate(_proposal("create_calendar_event", arguments, {}))
    assert _asked(verdict) == (True, [], 1) and verdict.rules == ["requester-decides-the-rest"]


def test_a_fact_with_a_field_the_schema_lacks_is_denied(policies: Policies) -> None:
    # The write declarations must select exactly ORDER_FACT / TICKET_FACT: anything else fails closed.
    verdict = policies.evaluate(_refund(300, order={**LATE_ORDER, "status": "shipped"}))
    assert verdict.verdict == "deny" and "could not be evaluated" in verdict.reason


# --- Facts as the demo service returns them -----------------------------------------------------------


def _fact(model: type[BaseModel], body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    output = model.model_validate(body).model_dump(mode="json")
    return {field: output[field] for field in fields}


async def test_the_facts_the_tools_return_are_what_the_policy_reads(policies: Policies, tmp_path: Path) -> None:
    transport = httpx.ASGITransport(app=create_app(tmp_path / "biz.db"))
    u1 = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
    async with httpx.AsyncClient(transport=transport, base_url="http://svc", headers=u1) as client:
        a100 = (await client.get("/orders/A100")).json()
        a102 = (await client.get("/orders/A102")).json()
        ticket = (await client.get("/tickets/T1001")).json()
    late = _fact(Order, a100, ORDER_FACT)
    assert late == {"late": True, "paid_from": PAID_FROM, "refundable_cents": SEED_FACTS["order_a100"]["total_cents"]}
    assert policies.evaluate(_refund(800, order=late)).verdict == "allow"
    in_time = _fact(Order, a102, ORDER_FACT)
    assert policies.evaluate(_refund(800, order=in_time)).verdict == "ask"
    note = _dump(AppendTicketNoteArgs, {"ticketId": "T1001", "text": "Thanks.", "expectedVersion": 1})
    own = {"ticket": _fact(Ticket, ticket, TICKET_FACT)}
    assert policies.evaluate(_proposal("append_ticket_note", note, own)).verdict == "allow"


def test_the_demo_managers_have_published_tokens_with_the_manager_role() -> None:
    path = REPO / "config" / "api_tokens.json"
    TokenMap.load(path)  # the API's parser takes the file, roles and all
    entries = json.loads(path.read_text())["tokens"]
    for entry in entries:
        assert hashlib.sha256(entry["token"].encode()).digest() in PUBLISHED_DEMO_TOKENS
    managers = {(e["tenant_id"], e["user_id"]) for e in entries if "manager" in e.get("roles", [])}
    assert managers == {(tenant, user) for tenant, (user, _) in SEED_FACTS["managers"].items()}


def test_the_readme_shows_the_demo_policy_verbatim() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Approval policies") :]
    shown = section[section.index("```cedar\n") + len("```cedar\n") :]
    assert shown[: shown.index("```\n")] == (POLICIES / "demo.cedar").read_text()
