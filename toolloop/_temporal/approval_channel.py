"""I/O: the trusted approval channel. It holds the approval signing key, fetches the whole payload of an
operation from the workflow (redaction is for logs and history, never for the person who decides), checks
that the digest it would sign is the digest of what it shows, and sends a signed decision (approve or
reject) by Temporal Update. Whoever decides is the channel's session, never a name from the workflow."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError

from toolloop._core.approvals import ApprovalClaims, GrantClaims, mint_approval_token, payload_digest, run_binding
from toolloop._core.contracts import (
    Actor,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalWait,
    DecisionAnswer,
    DecisionReceipt,
    GrantTerms,
    approval_record,
)
from toolloop._core.names import APPROVE_OPERATION_UPDATE, GET_APPROVAL_REQUEST_QUERY
from toolloop._temporal.following import next_approval, raise_if_cancelling

DEFAULT_APPROVAL_TTL_SECONDS = 600.0


class ApprovalRefused(Exception):
    """The channel will not sign this decision (what it would show differs from what it would sign, the
    request's deadline has passed, or it holds no key)."""


class RequestFinished(ApprovalRefused):
    """The request has ended (answered, stopped, failed or cancelled): it takes no more decisions."""


async def raise_if_finished(handle: WorkflowHandle[Any, Any]) -> None:
    """RequestFinished if the request's workflow is no longer running."""
    status = (await handle.describe()).status
    if status != WorkflowExecutionStatus.RUNNING:
        name = status.name.lower() if status is not None else "closed"
        raise RequestFinished(f"request {handle.id} has finished ({name}); it takes no more decisions")


def check_shown_payload(request: ApprovalRequest) -> None:
    """The digest the workflow asks us to sign must be the digest of the arguments we show the human;
    a payload we cannot re-digest (a value hidden from us) is never signed."""
    if payload_digest(request.digest_subject, request.arguments) != request.digest:
        raise ApprovalRefused(f"operation {request.operation_id}: its digest does not match the arguments shown")


def sign_decision(
    request: ApprovalRequest,
    decider: Actor,
    signing_key: str,
    *,
    workflow_id: str,
    approve: bool,
    channel: str = "cli",
    ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
    roles: Sequence[str] = (),
    grant: GrantClaims | None = None,
) -> str:
    """A token for `decider`'s decision on exactly this payload. It never outlives the request's deadline,
    so nothing can be committed after it, and it names the end of the operation's approval window: a
    decision made after it is refused by the workflow and by the service. Its audience is the one the
    workflow names for the operation (the service or tool source that will check it); its header names the
    signing key's id, so the verifying side picks the key, two of them during a rotation. It is made for the
    person the write acts for (`user_id`), decided by `decider` with `roles` (their identity's): someone the
    operation's policy does not name (or, without a policy, anyone but the requester) gets no token. It names
    the request it is given in (`workflow_id` and the run the approval request names, run_binding): the
    workflow takes it in no other, though a thread's later message, or a new run under a closed request's
    workflow id, proposes the same operation and payload again."""
    check_shown_payload(request)
    if decider.tenant_id != request.actor.tenant_id or not request.may_decide(decider.user_id, roles):
        raise ApprovalRefused(f"operation {request.operation_id}: {decider.user_id} may not decide it")
    now = time.time()
    expires_at = now + ttl_seconds
    if request.deadline is not None:
        expires_at = min(expires_at, request.deadline.timestamp())
    if expires_at <= now:
        raise ApprovalRefused(f"operation {request.operation_id}: the request's deadline has passed")
    decide_by = request.approval_expires_at.timestamp() if request.approval_expires_at is not None else None
    if decide_by is not None and now >= decide_by:
        raise ApprovalRefused(f"operation {request.operation_id}: its approval window has closed")
    if not request.audience:
        raise ApprovalRefused(f"operation {request.operation_id}: the request names no audience to sign for")
    claims = ApprovalClaims(
        audience=request.audience,
        user_id=request.actor.user_id,
        tenant_id=request.actor.tenant_id,
        operation_id=request.operation_id,
        digest=request.digest,
        approved_by=decider.user_id,
        roles=sorted(set(roles)),
        approved_at=now,
        expires_at=expires_at,
        decision="approve" if approve else "reject",
        channel=channel,
        decide_by=decide_by,
        grant=grant if approve else None,
        request=_bound_to(request, workflow_id),
    )
    return mint_approval_token(signing_key, claims)


def _bound_to(request: ApprovalRequest, workflow_id: str) -> str:
    """The run the operation waits in, as its workflow said (an older worker names none: its workflow id)."""
    return run_binding(workflow_id, request.run_id) if request.run_id else workflow_id


def grant_claims(terms: GrantTerms, request: ApprovalRequest, workflow_id: str) -> GrantClaims:
    """What a person grants with their approval of `request`, in the request `workflow_id`: the next writes of
    its tool within `terms` (the arguments named in `same` keep the approved write's values)."""
    missing = [name for name in terms.same if name not in request.arguments]
    if missing:
        raise ApprovalRefused(f"operation {request.operation_id}: it has no argument {', '.join(missing)}")
    same = {name: request.arguments[name] for name in terms.same}
    return GrantClaims(
        request=_bound_to(request, workflow_id), tool=request.tool, uses=terms.uses, max=terms.max, same=same
    )


async def fetch_approval_request(
    handle: WorkflowHandle[Any, Any], operation_id: str, rpc_timeout: timedelta | None = None
) -> ApprovalRequest | None:
    """The operation's whole payload as the workflow holds it; None if the request has no such operation."""
    request: ApprovalRequest | None = await handle.query(
        GET_APPROVAL_REQUEST_QUERY,
        operation_id,
        result_type=ApprovalRequest | None,  # type: ignore[arg-type]
        rpc_timeout=rpc_timeout,
    )
    return request


async def send_decision(
    handle: WorkflowHandle[Any, Any],
    request: ApprovalRequest,
    *,
    approve: bool,
    decider: Actor,
    key: str | None,
    channel: str = "cli",
    ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
    roles: Sequence[str] = (),
    grant: GrantTerms | None = None,
) -> DecisionReceipt:
    """Approve or reject; the operation's state right after. `grant` (with an approval): the next writes of the
    same tool in this request that the decider approves in advance (docs/POLICIES.md, "Grants"). Raises
    temporalio's WorkflowUpdateFailedError if the workflow refuses it, and RequestFinished if the request ended
    before the decision reached it."""
    receipt, _ = await _send(
        handle, request, approve, decider, key, channel, ttl_seconds, roles, then_wait=None, grant=grant
    )
    return receipt


async def send_decision_then_wait(
    handle: WorkflowHandle[Any, Any],
    request: ApprovalRequest,
    *,
    approve: bool,
    decider: Actor,
    key: str | None,
    seen: list[str],
    channel: str = "cli",
    ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
    roles: Sequence[str] = (),
) -> tuple[DecisionReceipt, ApprovalRequest | None]:
    """`send_decision`, and then the next operation waiting for approval that is not in `seen` once one waits
    (None once the request finished), from the same Update: for an approver that decides each in turn."""
    receipt, answer = await _send(
        handle, request, approve, decider, key, channel, ttl_seconds, roles, then_wait=ApprovalWait(seen=seen)
    )
    if answer.next is None:
        # A worker older than then_wait answered at once, without waiting: wait with an Update of its own.
        return receipt, await next_approval(handle, seen)
    return receipt, answer.next.approval


async def _send(
    handle: WorkflowHandle[Any, Any],
    request: ApprovalRequest,
    approve: bool,
    decider: Actor,
    key: str | None,
    channel: str,
    ttl_seconds: float,
    roles: Sequence[str],
    then_wait: ApprovalWait | None,
    grant: GrantTerms | None = None,
) -> tuple[DecisionReceipt, DecisionAnswer]:
    if key is None:
        raise ApprovalRefused("no approval key: set TOOLLOOP_APPROVAL_KEY or use the local stack")
    granted = grant_claims(grant, request, handle.id) if grant is not None and approve else None
    token = sign_decision(
        request,
        decider,
        key,
        workflow_id=handle.id,
        approve=approve,
        channel=channel,
        ttl_seconds=ttl_seconds,
        roles=roles,
        grant=granted,
    )
    decision = ApprovalDecision(
        operation_id=request.operation_id,
        digest=request.digest,
        approve=approve,
        token=token,
        by=f"{decider.user_id} via {channel}",
        then_wait=then_wait,
    )
    try:
        answer: DecisionAnswer = await handle.execute_update(
            APPROVE_OPERATION_UPDATE, decision, result_type=DecisionAnswer
        )
    except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError):
        raise_if_cancelling()
        # An Update that raced the end of the run is aborted by the server: say that, not "try again".
        await raise_if_finished(handle)
        raise
    # The workflow answers with the state and when it recorded the decision; the rest is in the token.
    receipt = DecisionReceipt(
        operation_id=request.operation_id,
        tool=request.tool,
        state=answer.state,
        approval=approval_record(token, answer.at) if answer.at is not None else None,
    )
    return receipt, answer
