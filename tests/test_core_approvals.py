"""Pure tests: decision tokens (Ed25519: the channel signs, everyone else only verifies) and the approval
channel's rules for what it will sign."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY
from toolloop._core.approvals import (
    ApprovalClaims,
    ApprovalInvalid,
    approval_wait_of,
    approval_wait_summary,
    check_verify_key,
    generate_signing_key,
    mint_approval_token,
    payload_digest,
    read_approval_claims,
    verify_approval_token,
    verify_key_for,
)
from toolloop._core.contracts import Actor, ApprovalRequest
from toolloop._temporal.approval_channel import ApprovalRefused, check_shown_payload, sign_decision

KEY, VERIFY = APPROVAL_KEY, APPROVAL_VERIFY_KEY
NOW = 1_800_000_000.0
EXPECTED = {"user_id": "u1", "tenant_id": "acme", "operation_id": "op_1", "digest": "sha256:d", "decision": "approve"}


def claims(**changes: Any) -> ApprovalClaims:
    base: dict[str, Any] = {
        "user_id": "u1",
        "tenant_id": "acme",
        "operation_id": "op_1",
        "digest": "sha256:d",
        "approved_by": "u1",
        "approved_at": NOW,
        "expires_at": NOW + 60,
    }
    return ApprovalClaims(**{**base, **changes})


def test_a_signed_token_verifies_and_carries_its_claims() -> None:
    token = mint_approval_token(KEY, claims(channel="cli"))
    verified = verify_approval_token(VERIFY, token, now=NOW, expected=EXPECTED)
    assert verified == read_approval_claims(token) == claims(channel="cli")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"user_id": "u2"}, "another user"),
        ({"tenant_id": "globex"}, "another tenant"),
        ({"operation_id": "op_2"}, "another operation"),
        ({"digest": "sha256:other"}, "another digest"),
        ({"decision": "reject"}, "a decision to reject, not to approve"),
        ({"expires_at": NOW}, "expired"),
        ({"expires_at": NOW - 1}, "expired"),
        ({"decide_by": NOW}, "after the operation's approval window closed"),
        ({"decide_by": NOW - 0.001}, "after the operation's approval window closed"),
    ],
)
def test_a_token_for_anything_else_is_refused_with_its_reason(change: dict[str, Any], reason: str) -> None:
    token = mint_approval_token(KEY, claims(**change))
    with pytest.raises(ApprovalInvalid, match=reason):
        verify_approval_token(VERIFY, token, now=NOW, expected=EXPECTED)


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "no-dot-at-all",
        "garbage.garbage",
        mint_approval_token(generate_signing_key(), claims()),  # another channel's key
        mint_approval_token(KEY, claims()).rsplit(".", 1)[0] + ".",  # signature cut off
        mint_approval_token(KEY, claims(user_id="u2")).split(".")[0]
        + "."
        + mint_approval_token(KEY, claims()).split(".")[1],
    ],
    ids=["none", "empty", "no_signature", "garbage", "other_key", "cut", "body_swapped"],
)
def test_a_token_not_signed_by_the_channel_for_this_body_is_refused(token: str | None) -> None:
    with pytest.raises(ApprovalInvalid):
        verify_approval_token(VERIFY, token, now=NOW, expected=EXPECTED)


def test_the_test_key_pairs_belong_together_and_new_keys_are_fresh() -> None:
    assert verify_key_for(APPROVAL_KEY) == APPROVAL_VERIFY_KEY
    assert verify_key_for(OTHER_SIGNING_KEY) != APPROVAL_VERIFY_KEY
    fresh = generate_signing_key()
    assert fresh != generate_signing_key() and len(verify_key_for(fresh)) == 43


def test_keys_are_checked_and_the_public_key_cannot_sign() -> None:
    assert check_verify_key(VERIFY) == VERIFY
    for bad in ("", "short", "!" * 43):
        with pytest.raises(ValueError):
            check_verify_key(bad)
    with pytest.raises(ValueError):
        verify_key_for("not a key")
    assert verify_key_for(KEY) == VERIFY != KEY
    # A token "signed" with the public key (as if it were a private key) is not valid.
    forged = mint_approval_token(VERIFY, claims())
    with pytest.raises(ApprovalInvalid):
        verify_approval_token(VERIFY, forged, now=NOW, expected=EXPECTED)


def test_read_claims_refuses_a_malformed_token() -> None:
    with pytest.raises(ApprovalInvalid, match="malformed"):
        read_approval_claims("bm90IGpzb24.sig")


# --- The channel: what it shows is what it signs -----------------------------------------------------------

ARGS = {"ticketId": "T1001", "text": "hello", "expectedVersion": 1}


def request(**changes: Any) -> ApprovalRequest:
    base: dict[str, Any] = {
        "operation_id": "op_1",
        "tool": "append_ticket_note",
        "arguments": ARGS,
        "digest": payload_digest("append_ticket_note", ARGS),
        "state": "awaiting_approval",
        "actor": Actor(user_id="u1"),
        "deadline": datetime.fromtimestamp(time.time() + 120, tz=UTC),
    }
    return ApprovalRequest(**{**base, **changes})


@pytest.mark.parametrize(
    "shown",
    [{**ARGS, "text": "***"}, {**ARGS, "text": "hello "}, {k: v for k, v in ARGS.items() if k != "text"}],
    ids=["redacted_value", "other_value", "missing_value"],
)
def test_the_channel_refuses_to_sign_what_it_cannot_recompute_from_what_it_shows(shown: dict[str, Any]) -> None:
    # The digest covers the whole payload; a value hidden from the channel (or changed) cannot be signed.
    with pytest.raises(ApprovalRefused, match="does not match the arguments shown"):
        check_shown_payload(request(arguments=shown))
    with pytest.raises(ApprovalRefused):
        sign_decision(request(arguments=shown), Actor(user_id="u1"), KEY, approve=True)


@pytest.mark.parametrize("approve", [True, False])
def test_a_decision_token_never_outlives_the_requests_deadline(approve: bool) -> None:
    deadline = datetime.fromtimestamp(time.time() + 30, tz=UTC)
    token = sign_decision(request(deadline=deadline), Actor(user_id="u1"), KEY, approve=approve, ttl_seconds=600)
    signed = verify_approval_token(
        VERIFY,
        token,
        now=time.time(),
        expected={**EXPECTED, "digest": request().digest, "decision": "approve" if approve else "reject"},
    )
    assert signed.expires_at == deadline.timestamp() and signed.channel == "cli"
    assert (signed.user_id, signed.tenant_id, signed.approved_by) == ("u1", "acme", "u1")


def test_the_channel_signs_nothing_after_the_deadline() -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    with pytest.raises(ApprovalRefused, match="deadline has passed"):
        sign_decision(request(deadline=past), Actor(user_id="u1"), KEY, approve=True)


def test_an_approval_waits_timer_summary_names_its_tool_and_operation_and_no_other_timer_does() -> None:
    summary = approval_wait_summary("refund_order", "op_0123456789abcdef0123456789abcdef", "10:05:00 UTC")
    assert summary == "waiting for approval of refund_order op_0123456789a… until 10:05:00 UTC"
    assert approval_wait_of(summary) == ("refund_order", "op_0123456789a…")
    assert approval_wait_of("pause before resending refund_order op_0123456789a… (same key)") is None
    assert approval_wait_of("waiting for approval of refund_order") is None
