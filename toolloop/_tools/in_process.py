"""Pure: a write that takes effect in the worker's own process (a database the tool writes itself, no service
that checks the approval token) checks the token itself, exactly as a service's idempotency kit does."""

from __future__ import annotations

import time
from collections.abc import Iterable

from toolloop._core.approvals import (
    CLOCK_TOLERANCE_SECONDS,
    ApprovalClaims,
    ApprovalInvalid,
    PolicyClaims,
    read_policy_claims,
    split_tokens,
    verify_approval_token,
    verify_key_set,
    verify_write_decisions,
)
from toolloop._core.codes import ResultCode
from toolloop._core.registry import ToolContext, ToolError


def verify_approval(
    ctx: ToolContext,
    *,
    keys: str | Iterable[str],
    audience: str,
    policy_keys: str | Iterable[str] | None = None,
    policy_rules: Iterable[str] | None = None,
) -> ApprovalClaims | PolicyClaims:
    """The call's approval, verified before an in-process write takes effect: signed with one of `keys` (the
    approval channel's public keys, by key id), for `audience`, not expired, and a decision to approve this
    call's operation id and payload digest by this call's user and tenant. With `policy_keys` (the policy
    evaluator's public keys: docs/POLICIES.md) the write is decided by policy, as a service's kit checks it:
    the policy's decision (returned) and the people it asks for. Raises ToolError (CONFIRMATION_REQUIRED, with
    the reason) otherwise: the write is then not done, and the model is told."""
    if ctx.operation_id is None or ctx.approval_digest is None:
        raise ToolError(ResultCode.INTERNAL, "verify_approval is for side-effecting calls; nothing was done")
    expected = {
        "operation_id": ctx.operation_id,
        "digest": ctx.approval_digest,
        "user_id": ctx.actor.user_id,
        "tenant_id": ctx.actor.tenant_id,
        "decision": "approve",
    }
    # As a service's kit does before it claims the key: a token about to expire is refused with the clocks'
    # tolerance. The workflow calls a write "not done" once its approval has expired and nothing is recorded, so
    # nothing may take effect from that long before (the write must commit before claims.expires_at too).
    now = time.time() + CLOCK_TOLERANCE_SECONDS
    try:
        if policy_keys is not None:
            del expected["decision"]
            verify_write_decisions(
                verify_key_set(keys),
                verify_key_set(policy_keys),
                ctx.approval_token,
                now=now,
                audience=audience,
                expected=expected,
                known_rules=policy_rules,
            )
            return read_policy_claims(split_tokens(ctx.approval_token)[0])
        claims = verify_approval_token(
            verify_key_set(keys), ctx.approval_token, now=now, audience=audience, expected=expected
        )
        if claims.approved_by != claims.user_id:
            raise ApprovalInvalid("the approval was not made by the person the write acts for")
        return claims
    except ApprovalInvalid as exc:
        raise ToolError(ResultCode.CONFIRMATION_REQUIRED, f"{exc}; nothing was done") from None
