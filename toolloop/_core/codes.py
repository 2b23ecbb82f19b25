"""Pure: the result codes the model sees and the error types activities raise (one table, one place).

| error type (ApplicationError.type) | raised by      | retryable | workflow reaction                             |
|------------------------------------|----------------|-----------|-----------------------------------------------|
| ServiceTemporarilyUnavailable      | tool activity  | yes       | after the budget: TEMPORARY_UNAVAILABLE output |
| ModelTemporarilyUnavailable        | model activity | yes       | after the budget: stop, model_error           |
| ModelRequestRejected               | model activity | no        | stop, model_error                             |
| ModelResponseMalformed             | model activity | no        | stop, model_error                             |
| ScriptExhausted                    | model activity | no        | stop, model_error                             |
| ToolMisconfigured                  | tool activity  | no        | INTERNAL output, the loop goes on             |
| OperationStatusUnavailable         | status activity| yes       | after the budget: the operation stays unknown |
| EvidenceNotYetVisible              | read-back      | yes       | after the budget: completed, not verified     |
| WriteOutcomeUnknown                | write attempt  | no        | ask the status (details: the WriteOutcome)    |
| RequestFailed                      | the workflow   | no        | the run fails; details: the AgentResult       |
| UntrustedInput                     | the workflow   | no        | the run fails at start: its input brought a   |
|                                    |                |           | verify key (trust is the worker's config)     |

A write attempt returns what it established (completed, refused, not sent, in progress), or fails with
WriteOutcomeUnknown when it is unclear; the workflow runs the state machine of DESIGN.md either way, and
Temporal never resends a write.
"""

from __future__ import annotations

from enum import StrEnum


class ResultCode(StrEnum):
    """Codes of `{"ok": false, "code": ...}` tool results: the contract with the model (DESIGN.md)."""

    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    BAD_JSON = "BAD_JSON"
    BAD_ARGUMENTS = "BAD_ARGUMENTS"
    NOT_AVAILABLE = "NOT_AVAILABLE"
    FORBIDDEN = "FORBIDDEN"
    CONFLICT = "CONFLICT"
    VERSION_CONFLICT = "VERSION_CONFLICT"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    CONFIRMATION_REQUIRED = "CONFIRMATION_REQUIRED"
    # A person said no (not: no approval came in time, which is CONFIRMATION_REQUIRED).
    REJECTED = "REJECTED"
    # A rule of the deployment's approval policy forbids it (or no rule lets anyone decide it): never sent.
    POLICY_DENIED = "POLICY_DENIED"
    TEMPORARY_UNAVAILABLE = "TEMPORARY_UNAVAILABLE"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    LIMIT_REACHED = "LIMIT_REACHED"
    # Our own fault (a tool executor that broke its contract); never carries details to the model.
    INTERNAL = "INTERNAL"


class ErrorType(StrEnum):
    """`ApplicationError.type` values; callers branch on these, never on message text."""

    SERVICE_TEMPORARILY_UNAVAILABLE = "ServiceTemporarilyUnavailable"
    MODEL_TEMPORARILY_UNAVAILABLE = "ModelTemporarilyUnavailable"
    MODEL_REQUEST_REJECTED = "ModelRequestRejected"
    MODEL_RESPONSE_MALFORMED = "ModelResponseMalformed"
    SCRIPT_EXHAUSTED = "ScriptExhausted"
    TOOL_MISCONFIGURED = "ToolMisconfigured"
    OPERATION_STATUS_UNAVAILABLE = "OperationStatusUnavailable"
    EVIDENCE_NOT_YET_VISIBLE = "EvidenceNotYetVisible"
    # The request failed (model error, no answer): the workflow fails with the AgentResult as its details.
    REQUEST_FAILED = "RequestFailed"
    # The request's input tried to bring what only the worker's configuration may (an approval verify key):
    # the run fails at its start and takes no decision.
    UNTRUSTED_INPUT = "UntrustedInput"
    # A `next_approval` Update sent to a request that has finished: nothing more waits for a decision.
    REQUEST_FINISHED = "RequestFinished"
    # A write attempt that ended without a definite answer: the attempt fails (visibly, in the UI) with the
    # WriteOutcome as its details, and the workflow asks the operation's status.
    WRITE_OUTCOME_UNKNOWN = "WriteOutcomeUnknown"
    # A thread refused a message: another user's, not a request id, or no such message in the thread.
    NOT_THIS_THREAD = "NotThisThread"
    # A thread's message sent again under its request id with another question, model, limits or tools.
    REQUEST_ID_REUSED = "RequestIdReused"
    # A thread with MAX_QUEUED messages waiting already refused another one.
    THREAD_FULL = "ThreadFull"
    # A thread that was closed refused a new message (those accepted before still run).
    THREAD_CLOSED = "ThreadClosed"
