"""Pure tests: what a service checks of one write's decisions when it decides writes by policy - the policy's
signed decision first, then the people it asks for (toolloop/_core/approvals.py, verify_write_decisions)."""

from __future__ import annotations

from typing import Any

import jwt
import pytest

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY
from toolloop._core.approvals import (
    APPROVAL_REQUIRED,
    APPROVAL_UNKNOWN_KEY,
    MAX_GRANT_USES,
    POLICY_DECISION_INVALID,
    POLICY_DECISION_REQUIRED,
    ApprovalClaims,
    ApprovalInvalid,
    Deciders,
    GrantClaims,
    PolicyClaims,
    counted_approvers,
    join_tokens,
    mint_approval_token,
    read_approval_claims,
    verify_key_for,
    verify_key_set,
    verify_write_decisions,
)
from toolloop._core.contracts import GrantTerms

POLICY_KEY = OTHER_SIGNING_KEY
PEOPLE = verify_key_set(APPROVAL_VERIFY_KEY)
POLICY = verify_key_set(verify_key_for(POLICY_KEY))
NOW = 1_800_000_000.0
BOUND = {"user_id": "u1", "tenant_id": "acme", "operation_id": "op_1", "digest": "sha256:d"}
RULES = {"small-late-refund", "manager-decides", "four-eyes"}


def _policy(verdict: str = "allow", key: str = POLICY_KEY, **change: Any) -> str:
    claims: dict[str, Any] = {
        "aud": "bizservice",
        **BOUND,
        "verdict": verdict,
        "rules": ["small-late-refund"] if verdict == "allow" else ["manager-decides"],
        "policy_version": "sha256:v1",
        "deciders": None if verdict == "allow" else {"requester": False, "roles": ["manager"], "approvals": 1},
        "iat": NOW - 1,
        "exp": NOW + 60,
        **change,
    }
    return mint_approval_token(key, PolicyClaims.model_validate(claims))


def _person(by: str, roles: list[str] | None = None, at: float = NOW - 1, **change: Any) -> str:
    claims: dict[str, Any] = {
        "aud": "bizservice",
        **BOUND,
        "approved_by": by,
        "iat": at,
        "exp": NOW + 60,
        "roles": roles or [],
        **change,
    }
    return mint_approval_token(APPROVAL_KEY, ApprovalClaims.model_validate(claims))


def _check(header: str | None, policy_keys: dict[str, str] = POLICY) -> float:
    return verify_write_decisions(
        PEOPLE, policy_keys, header, now=NOW, audience="bizservice", expected=BOUND, known_rules=RULES
    )


def _refused(header: str | None, policy_keys: dict[str, str] = POLICY) -> str:
    with pytest.raises(ApprovalInvalid) as refused:
        _check(header, policy_keys)
    return refused.value.code


def test_a_rules_allow_is_enough_on_its_own_and_expires_with_the_decision() -> None:
    assert _check(_policy()) == NOW + 60


def test_a_policy_that_asks_needs_the_people_it_admits() -> None:
    asked = _policy("ask")
    assert _refused(asked) == APPROVAL_REQUIRED
    assert _refused(join_tokens([asked, _person("u1")])) == APPROVAL_REQUIRED  # the requester is not admitted
    assert _refused(join_tokens([asked, _person("m1", ["clerk"])])) == APPROVAL_REQUIRED
    assert _check(join_tokens([asked, _person("m1", ["manager"], exp=NOW + 30)])) == NOW + 30


def test_four_eyes_needs_two_distinct_people_and_the_requester_never_second() -> None:
    deciders = {"requester": True, "roles": ["manager"], "approvals": 2}
    asked = _policy("ask", rules=["four-eyes"], deciders=deciders)
    manager, requester = _person("m1", ["manager"], at=NOW - 5), _person("u1", at=NOW - 2)
    assert _refused(join_tokens([asked, manager])) == APPROVAL_REQUIRED
    assert _refused(join_tokens([asked, manager, manager])) == APPROVAL_REQUIRED  # one person twice
    assert _refused(join_tokens([asked, manager, requester])) == APPROVAL_REQUIRED  # the requester second
    first = _person("u1", at=NOW - 9)
    assert _check(join_tokens([asked, manager, first])) == NOW + 60  # the requester first, a manager second


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, POLICY_DECISION_REQUIRED),
        (_person("u1"), POLICY_DECISION_INVALID),  # a person's approval where the policy's must come first
        (_policy(key=APPROVAL_KEY), POLICY_DECISION_INVALID),  # signed by the approval channel, not the policy
        (_policy(digest="sha256:other"), POLICY_DECISION_INVALID),
        (_policy(operation_id="op_2"), POLICY_DECISION_INVALID),
        (_policy(user_id="u2"), POLICY_DECISION_INVALID),
        (_policy(rules=["made-up-rule"]), POLICY_DECISION_INVALID),
        (_policy(rules=[]), POLICY_DECISION_INVALID),
        (_policy(exp=NOW - 1), POLICY_DECISION_INVALID),
        (_policy(aud="another-service"), POLICY_DECISION_INVALID),
        (_policy("ask", deciders=None), POLICY_DECISION_INVALID),
    ],
)
def test_a_forged_or_misbound_policy_decision_is_refused_with_its_own_code(header: str | None, code: str) -> None:
    assert _refused(header) == code


def test_without_policy_keys_the_person_the_write_acts_for_approves_once() -> None:
    assert _check(_person("u1"), {}) == NOW + 60
    assert _refused(_person("m1", ["manager"]), {}) == APPROVAL_REQUIRED
    assert _refused(join_tokens([_person("u1"), _person("u1")]), {}) == APPROVAL_REQUIRED
    # A policy's decision means nothing to a service without policy keys: its key is not one this side holds.
    assert _refused(_policy(), {}) == APPROVAL_UNKNOWN_KEY


def test_counted_approvers_skip_rejections_strangers_and_repeats() -> None:
    deciders = Deciders(requester=True, roles=["manager"], approvals=2)
    claims = [
        read_approval_claims(token)
        for token in (
            _person("u1", at=NOW - 9),
            _person("x9", ["clerk"], at=NOW - 8),
            _person("m1", ["manager"], at=NOW - 7, decision="reject"),
            _person("m2", ["manager"], at=NOW - 6),
            _person("m2", ["manager"], at=NOW - 5),
        )
    ]
    assert counted_approvers(deciders, "u1", claims) == ["u1", "m2"]


def test_a_grant_covers_only_its_tool_within_its_bounds() -> None:
    grant = GrantClaims(request="wf", tool="refund_order", uses=2, max={"amountCents": 2000}, same={"orderId": "A1"})
    assert grant.covers("refund_order", {"orderId": "A1", "amountCents": 2000})
    assert not grant.covers("refund_order", {"orderId": "A1", "amountCents": 2001})
    assert not grant.covers("refund_order", {"orderId": "A2", "amountCents": 5})
    assert not grant.covers("refund_order", {"orderId": "A1"})  # a bound on a missing argument fails
    assert not grant.covers("refund_order", {"orderId": "A1", "amountCents": True})
    assert not grant.covers("refund_order", {"orderId": "A1", "amountCents": "5"})
    assert not grant.covers("append_ticket_note", {"orderId": "A1", "amountCents": 5})


def test_a_requester_holding_the_role_is_admitted_only_as_the_requester() -> None:
    # A refund the policy leaves to managers: the manager who asked for it may not decide it.
    managers = Deciders(requester=False, roles=["manager"], approvals=1)
    assert not managers.admits("m1", "m1", ["manager"]) and managers.admits("m1", "m2", ["manager"])
    own = read_approval_claims(_person("m1", ["manager"], user_id="m1"))
    assert counted_approvers(managers, "m1", [own]) == []


def test_a_decision_where_no_policy_is_carries_only_the_claims_it_always_had() -> None:
    # An older verifier forbids claims it does not know: roles and grant appear only when they say something.
    plain = jwt.decode(_person("u1"), options={"verify_signature": False})
    assert set(plain) == {
        "v", "aud", "user_id", "tenant_id", "operation_id", "digest", "approved_by", "iat", "exp", "decision",
        "channel", "decide_by",
    }  # fmt: skip
    assert "roles" in jwt.decode(_person("m1", ["manager"]), options={"verify_signature": False})


def test_a_grant_without_bounds_or_with_too_many_uses_is_refused() -> None:
    with pytest.raises(ValueError, match="a grant needs bounds"):
        GrantTerms(uses=2)
    with pytest.raises(ValueError):
        GrantTerms(uses=MAX_GRANT_USES + 1, same=["orderId"])
    with pytest.raises(ValueError):
        GrantTerms(uses=1, max={"amountCents": float("inf")})
