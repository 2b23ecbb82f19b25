"""I/O: the trusted approval channel. It holds the approval key, shows a human the exact operation,
mints a token bound to (user, operation id, payload digest, expiry) and sends it by Temporal Update."""

from __future__ import annotations

import time
from typing import Any

from temporalio.client import WorkflowHandle

from agentcore.approvals import ApprovalClaims, mint_approval_token
from agentcore.contracts import Actor, ApprovalDecision, OperationRecord
from agentcore.digests import payload_digest
from agentcore.names import APPROVE_OPERATION_UPDATE

DEFAULT_APPROVAL_TTL_SECONDS = 600.0


class ApprovalRefused(Exception):
    """The channel will not sign this operation (what it would show differs from what it would sign)."""


def check_shown_payload(op: OperationRecord) -> None:
    """The digest the workflow asks us to sign must be the digest of the arguments we show the human."""
    if "***" in op.arguments.values():
        return  # redacted values cannot be re-digested here; the service still checks the digest
    if payload_digest(op.tool, op.arguments) != op.digest:
        raise ApprovalRefused(f"operation {op.operation_id}: its digest does not match the arguments shown")


def mint_for(op: OperationRecord, approver: Actor, key: str, ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS) -> str:
    check_shown_payload(op)
    now = time.time()
    claims = ApprovalClaims(
        user_id=approver.user_id,
        tenant_id=approver.tenant_id,
        operation_id=op.operation_id,
        digest=op.digest,
        approved_by=approver.user_id,
        approved_at=now,
        expires_at=now + ttl_seconds,
    )
    return mint_approval_token(key.encode("utf-8"), claims)


async def send_decision(
    handle: WorkflowHandle[Any, Any],
    op: OperationRecord,
    *,
    approve: bool,
    approver: Actor,
    key: str | None,
    channel: str = "cli",
    ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
) -> OperationRecord:
    """Approve or reject; raises temporalio's WorkflowUpdateFailedError if the workflow refuses it."""
    token = None
    if approve:
        if key is None:
            raise ApprovalRefused("no approval key: set TOOLLOOP_APPROVAL_KEY or use the local stack")
        token = mint_for(op, approver, key, ttl_seconds)
    decision = ApprovalDecision(
        operation_id=op.operation_id,
        digest=op.digest,
        approve=approve,
        token=token,
        by=f"{approver.user_id} via {channel}",
    )
    result: OperationRecord = await handle.execute_update(
        APPROVE_OPERATION_UPDATE, decision, result_type=OperationRecord
    )
    return result
