"""Pure tests: decision tokens (EdDSA JWTs: the channel signs, everyone else only verifies, with the key the
token's kid names among the keys it holds) and the approval channel's rules for what it will sign."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY
from toolloop._core.approvals import (
    APPROVAL_EXPIRED,
    APPROVAL_REQUIRED,
    APPROVAL_UNKNOWN_KEY,
    APPROVAL_WRONG_AUDIENCE,
    APPROVAL_WRONG_REQUEST,
    ApprovalClaims,
    ApprovalInvalid,
    approval_wait_summary,
    check_approval_claims,
    check_verify_key,
    generate_signing_key,
    key_id,
    mint_approval_token,
    payload_digest,
    read_approval_claims,
    verify_approval_token,
    verify_key_for,
    verify_key_set,
)
from toolloop._core.contracts import Actor, ApprovalRequest
from toolloop._temporal.approval_channel import ApprovalRefused, check_shown_payload, sign_decision

KEY = APPROVAL_KEY
VERIFY = verify_key_set(APPROVAL_VERIFY_KEY)
NOW = 1_800_000_000.0
AUD = "bizservice"
EXPECTED = {"user_id": "u1", "tenant_id": "acme", "operation_id": "op_1", "digest": "sha256:d", "decision": "approve"}


def claims(**changes: Any) -> ApprovalClaims:
    base: dict[str, Any] = {
        "audience": AUD,
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
    verified = verify_approval_token(VERIFY, token, now=NOW, audience=AUD, expected=EXPECTED)
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
        verify_approval_token(VERIFY, token, now=NOW, audience=AUD, expected=EXPECTED)


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
        verify_approval_token(VERIFY, token, now=NOW, audience=AUD, expected=EXPECTED)


def test_the_test_key_pairs_belong_together_and_new_keys_are_fresh() -> None:
    assert verify_key_for(APPROVAL_KEY) == APPROVAL_VERIFY_KEY
    assert verify_key_for(OTHER_SIGNING_KEY) != APPROVAL_VERIFY_KEY
    fresh = generate_signing_key()
    assert fresh != generate_signing_key() and len(verify_key_for(fresh)) == 43


def test_keys_are_checked_and_the_public_key_cannot_sign() -> None:
    assert check_verify_key(APPROVAL_VERIFY_KEY) == APPROVAL_VERIFY_KEY
    for bad in ("", "short", "!" * 43):
        with pytest.raises(ValueError):
            check_verify_key(bad)
    with pytest.raises(ValueError):
        verify_key_set(f"{APPROVAL_VERIFY_KEY},short")
    with pytest.raises(ValueError):
        verify_key_for("not a key")
    assert verify_key_for(KEY) == APPROVAL_VERIFY_KEY != KEY
    # A token "signed" with the public key (as if it were a private key) is not valid.
    forged = mint_approval_token(APPROVAL_VERIFY_KEY, claims())
    with pytest.raises(ApprovalInvalid):
        verify_approval_token(VERIFY, forged, now=NOW, audience=AUD, expected=EXPECTED)


def test_a_token_is_a_standard_eddsa_jwt_naming_its_key_id_and_audience() -> None:
    token = mint_approval_token(KEY, claims())
    assert jwt.get_unverified_header(token) == {"alg": "EdDSA", "typ": "JWT", "kid": key_id(APPROVAL_VERIFY_KEY)}
    # Any JWT library verifies it with the public key alone: the standard claims under their registered names.
    public = jwt.PyJWK({"kty": "OKP", "crv": "Ed25519", "x": APPROVAL_VERIFY_KEY}).key
    data = jwt.decode(
        token, public, algorithms=["EdDSA"], audience=AUD, options={"verify_exp": False, "verify_iat": False}
    )
    assert (data["aud"], data["iat"], data["exp"], data["user_id"]) == (AUD, NOW, NOW + 60, "u1")


@pytest.mark.parametrize(
    ("token", "audience", "now", "code"),
    [
        (mint_approval_token(KEY, claims()), "notes", NOW, APPROVAL_WRONG_AUDIENCE),
        (mint_approval_token(KEY, claims()), AUD, NOW + 60, APPROVAL_EXPIRED),
        (mint_approval_token(KEY, claims(decide_by=NOW - 1)), AUD, NOW, APPROVAL_EXPIRED),
        (mint_approval_token(OTHER_SIGNING_KEY, claims()), AUD, NOW, APPROVAL_UNKNOWN_KEY),
        (mint_approval_token(KEY, claims(user_id="u2")), AUD, NOW, APPROVAL_REQUIRED),
    ],
    ids=["wrong_audience", "expired", "decided_late", "unknown_kid", "other_user"],
)
def test_refusals_carry_distinct_codes(token: str, audience: str, now: float, code: str) -> None:
    with pytest.raises(ApprovalInvalid) as refused:
        verify_approval_token(VERIFY, token, now=now, audience=audience, expected=EXPECTED)
    assert refused.value.code == code


def test_a_decision_given_in_another_request_is_refused_where_the_request_is_known() -> None:
    # A thread's later message proposes the same operation and payload again: only the request the decision
    # names tells the two apart. The workflow names its own; a service knows no request and checks none.
    given = read_approval_claims(mint_approval_token(KEY, claims(request="thread-m1")))
    assert given.request == "thread-m1"
    assert check_approval_claims(given, now=NOW, audience=AUD, expected=EXPECTED, request="thread-m1") == given
    older = read_approval_claims(mint_approval_token(KEY, claims()))  # an older channel names no request
    for token_claims, reason in ((given, "given in request 'thread-m1', not in this one"), (older, "names no request")):
        with pytest.raises(ApprovalInvalid, match=reason) as refused:
            check_approval_claims(token_claims, now=NOW, audience=AUD, expected=EXPECTED, request="thread-m2")
        assert refused.value.code == APPROVAL_WRONG_REQUEST
    # What a service checks (the kit verifies the same way) takes the claim and ignores it.
    token = mint_approval_token(KEY, claims(request="thread-m1"))
    assert verify_approval_token(VERIFY, token, now=NOW, audience=AUD, expected=EXPECTED) == given


def test_a_forged_kid_does_not_help_a_token_signed_with_another_key() -> None:
    # The header names the trusted key's id, the signature is another key's: the signature check refuses it.
    other = mint_approval_token(OTHER_SIGNING_KEY, claims())
    _, body, signature = other.split(".")
    header = jwt.utils.base64url_encode(
        b'{"alg":"EdDSA","kid":"' + key_id(APPROVAL_VERIFY_KEY).encode() + b'","typ":"JWT"}'
    ).decode()
    with pytest.raises(ApprovalInvalid) as refused:
        verify_approval_token(VERIFY, f"{header}.{body}.{signature}", now=NOW, audience=AUD, expected=EXPECTED)
    assert refused.value.code == APPROVAL_REQUIRED and "signature" in str(refused.value)


def test_during_a_rotation_both_keys_verify_and_the_old_one_stops_once_removed() -> None:
    old_token, new_token = mint_approval_token(KEY, claims()), mint_approval_token(OTHER_SIGNING_KEY, claims())
    both = verify_key_set(f"{APPROVAL_VERIFY_KEY}, {verify_key_for(OTHER_SIGNING_KEY)}")
    assert set(both) == {key_id(APPROVAL_VERIFY_KEY), key_id(verify_key_for(OTHER_SIGNING_KEY))}
    for token in (old_token, new_token):
        verify_approval_token(both, token, now=NOW, audience=AUD, expected=EXPECTED)
    only_new = verify_key_set([verify_key_for(OTHER_SIGNING_KEY)])
    verify_approval_token(only_new, new_token, now=NOW, audience=AUD, expected=EXPECTED)
    with pytest.raises(ApprovalInvalid) as refused:
        verify_approval_token(only_new, old_token, now=NOW, audience=AUD, expected=EXPECTED)
    assert refused.value.code == APPROVAL_UNKNOWN_KEY
    with pytest.raises(ApprovalInvalid) as none_held:
        verify_approval_token({}, new_token, now=NOW, audience=AUD, expected=EXPECTED)
    assert none_held.value.code == APPROVAL_UNKNOWN_KEY


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
        "audience": AUD,
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
        sign_decision(request(arguments=shown), Actor(user_id="u1"), KEY, workflow_id="w1", approve=True)


@pytest.mark.parametrize("approve", [True, False])
def test_a_decision_token_never_outlives_the_requests_deadline(approve: bool) -> None:
    deadline = datetime.fromtimestamp(time.time() + 30, tz=UTC)
    token = sign_decision(
        request(deadline=deadline), Actor(user_id="u1"), KEY, workflow_id="w1", approve=approve, ttl_seconds=600
    )
    signed = verify_approval_token(
        VERIFY,
        token,
        now=time.time(),
        audience=AUD,
        expected={**EXPECTED, "digest": request().digest, "decision": "approve" if approve else "reject"},
    )
    assert signed.expires_at == deadline.timestamp() and signed.channel == "cli" and signed.request == "w1"
    assert (signed.user_id, signed.tenant_id, signed.approved_by) == ("u1", "acme", "u1")


def test_the_channel_signs_nothing_after_the_deadline() -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    with pytest.raises(ApprovalRefused, match="deadline has passed"):
        sign_decision(request(deadline=past), Actor(user_id="u1"), KEY, workflow_id="w1", approve=True)


def test_an_approval_waits_timer_summary_names_its_tool_and_operation() -> None:
    summary = approval_wait_summary("refund_order", "op_0123456789abcdef0123456789abcdef", "10:05:00 UTC")
    assert summary == "waiting for approval of refund_order op_0123456789a… until 10:05:00 UTC"


def test_an_occurrence_makes_identical_calls_distinct_operations_and_only_when_asked() -> None:
    from toolloop._core.approvals import derive_operation_id

    args = {"to": "bob", "amountCents": 1000}
    same = derive_operation_id("req-1", "pay", args)
    assert same == derive_operation_id("req-1", "pay", dict(reversed(list(args.items()))))
    first, second = (derive_operation_id("req-1", "pay", args, occurrence=n) for n in (0, 1))
    assert len({same, first, second}) == 3
    assert first == derive_operation_id("req-1", "pay", args, occurrence=0)  # stable: a replay counts the same


def test_an_in_process_write_refuses_a_token_within_the_clocks_tolerance_of_expiry_as_the_kit_does() -> None:
    # The workflow calls a write not done once its approval expired and nothing is recorded; a kit refuses to
    # start one that close to expiry, and an in-process write (verify_approval) now does too. Before, 0.5 s left
    # was enough, and the effect could commit after the expiry.
    import httpx

    import toolloop
    from toolloop._core.approvals import CLOCK_TOLERANCE_SECONDS

    def context(seconds_left: float) -> toolloop.ToolContext:
        now = time.time()
        token = mint_approval_token(KEY, claims(approved_at=now, expires_at=now + seconds_left))
        return toolloop.ToolContext(
            actor=Actor(user_id="u1", tenant_id="acme"),
            http=httpx.AsyncClient(),
            workflow_id="wf",
            call_id="w1",
            operation_id="op_1",
            approval_token=token,
            approval_digest="sha256:d",
        )

    with pytest.raises(toolloop.ToolError) as refused:
        toolloop.verify_approval(context(CLOCK_TOLERANCE_SECONDS / 4), keys=APPROVAL_VERIFY_KEY, audience=AUD)
    assert refused.value.code == "CONFIRMATION_REQUIRED"
    verified = toolloop.verify_approval(context(60), keys=APPROVAL_VERIFY_KEY, audience=AUD)
    assert verified.operation_id == "op_1"
