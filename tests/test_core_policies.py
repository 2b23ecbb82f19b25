"""Pure: a Cedar policy set decides allow, deny or ask for one proposed write (toolloop/_core/policies.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolloop._core.policies import PolicyError, WriteProposal, load_policies

SCHEMA = """
entity Role;
entity User in [Role] { tenant: String };
entity Approval;
type Order = { order_id: String, late: Bool, paid_from: String, total_cents: Long, refunded_cents: Long };
action refund_order appliesTo { principal: [User, Role], resource: [Approval],
  context: { tenant: String, requester: User,
             arguments: { orderId: String, amountCents: Long, reason: String, toAccount?: String },
             facts: { order?: Order } } };
"""

POLICY = """
@id("small-late-refund")
permit(principal, action == Action::"refund_order", resource == Approval::"rule")
when { context.facts has order && context.facts.order.late && context.arguments.amountCents <= 500 &&
       context.arguments.amountCents <= context.facts.order.total_cents - context.facts.order.refunded_cents };
@id("refund-to-payer-only")
forbid(principal, action == Action::"refund_order", resource)
when { context.arguments has toAccount &&
       !(context.facts has order && context.arguments.toAccount == context.facts.order.paid_from) };
@id("requester-decides-up-to-50")
permit(principal, action == Action::"refund_order", resource == Approval::"person")
when { principal == context.requester && context.arguments.amountCents <= 5000 };
@id("manager-decides-refunds")
permit(principal in Role::"manager", action == Action::"refund_order", resource == Approval::"person");
@id("four-eyes-over-1000")
permit(principal, action == Action::"refund_order", resource == Approval::"second_person")
when { context.arguments.amountCents > 100000 };
"""

ORDER = {"order_id": "A100", "late": True, "paid_from": "acct-u1-1", "total_cents": 12999, "refunded_cents": 0}


def _load(tmp_path: Path, policy: str = POLICY, schema: str = SCHEMA):  # type: ignore[no-untyped-def]
    (tmp_path / "p.cedar").write_text(policy)
    (tmp_path / "s.cedarschema").write_text(schema)
    return load_policies(tmp_path / "p.cedar", tmp_path / "s.cedarschema")


def _refund(amount: int, facts: dict | None = None, tool: str = "refund_order", **extra: str) -> WriteProposal:  # type: ignore[type-arg]
    arguments = {"orderId": "A100", "amountCents": amount, "reason": "late", **extra}
    return WriteProposal(tool, "acme", "u1", (), arguments, {"order": ORDER} if facts is None else facts)


def test_a_small_refund_on_a_late_order_is_allowed_by_its_rule(tmp_path: Path) -> None:
    verdict = _load(tmp_path).evaluate(_refund(300))
    assert (verdict.verdict, verdict.rules) == ("allow", ["small-late-refund"])


def test_without_the_fact_the_rule_does_not_match_and_the_requester_is_asked(tmp_path: Path) -> None:
    verdict = _load(tmp_path).evaluate(_refund(300, facts={}))
    assert verdict.verdict == "ask"
    assert verdict.deciders is not None and verdict.deciders.requester and verdict.deciders.roles == ["manager"]
    assert verdict.rules == ["requester-decides-up-to-50", "manager-decides-refunds"]


def test_a_larger_refund_needs_a_manager_and_above_1000_two_people(tmp_path: Path) -> None:
    policies = _load(tmp_path)
    larger = policies.evaluate(_refund(9000))
    assert larger.verdict == "ask" and larger.deciders is not None
    assert (larger.deciders.requester, larger.deciders.roles, larger.deciders.approvals) == (False, ["manager"], 1)
    largest = policies.evaluate(_refund(200000))
    assert largest.deciders is not None and largest.deciders.approvals == 2
    assert "four-eyes-over-1000" in largest.rules


def test_a_refund_to_another_account_is_denied_even_under_the_threshold(tmp_path: Path) -> None:
    verdict = _load(tmp_path).evaluate(_refund(300, toAccount="acct-attacker-9"))
    assert (verdict.verdict, verdict.rules) == ("deny", ["refund-to-payer-only"])
    same = _load(tmp_path).evaluate(_refund(300, toAccount="acct-u1-1"))
    assert same.verdict == "allow"


def test_a_tool_the_policy_does_not_know_and_arguments_it_cannot_read_are_denied(tmp_path: Path) -> None:
    policies = _load(tmp_path)
    unknown = policies.evaluate(_refund(300, tool="delete_everything"))
    assert unknown.verdict == "deny" and "could not be evaluated" in unknown.reason
    odd = WriteProposal("refund_order", "acme", "u1", (), {"orderId": "A100", "amountCents": 3.5}, {})
    assert policies.evaluate(odd).verdict == "deny"


def test_a_policy_that_does_not_validate_or_parse_refuses_to_load_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as invalid:
        _load(tmp_path, POLICY.replace("amountCents <= 500", "amountCent <= 500"))
    assert "small-late-refund" in str(invalid.value) and "\n" not in str(invalid.value)
    with pytest.raises(PolicyError, match="does not parse"):
        _load(tmp_path, "permit(principal, action, resource")
    with pytest.raises(PolicyError, match="cannot be read"):
        load_policies(tmp_path / "missing.cedar", tmp_path / "s.cedarschema")


def test_the_version_is_the_files_hash(tmp_path: Path) -> None:
    first = _load(tmp_path)
    assert first.version == _load(tmp_path).version
    assert _load(tmp_path, POLICY + "\n// changed\n").version != first.version


def test_two_people_where_only_the_requester_may_decide_is_denied_not_left_waiting(tmp_path: Path) -> None:
    alone = """
@id("requester-decides")
permit(principal, action == Action::"refund_order", resource == Approval::"person")
when { principal == context.requester };
@id("four-eyes")
permit(principal, action == Action::"refund_order", resource == Approval::"second_person");
"""
    denied = _load(tmp_path, policy=alone).evaluate(_refund(300))
    assert (denied.verdict, denied.reason) == ("deny", "it needs two people, and only the requester may decide it")
