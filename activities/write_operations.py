"""Activity (I/O): one send attempt of a side-effecting call, the status query by operation id, and
the read-back. A send attempt never raises for what it learned: it reports it, and the workflow's
state machine decides (Temporal must not resend a write on its own)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from toolloop._core.approvals import payload_digest
from toolloop._core.arguments import ArgumentsRejected
from toolloop._core.codes import ErrorType, ResultCode
from toolloop._core.contracts import (
    OperationQuery,
    ReadBackInput,
    WriteInput,
    WriteOutcome,
    error_output,
    write_output_in_attempt,
)
from toolloop._core.names import EXECUTE_WRITE_ACTIVITY, QUERY_OPERATION_STATUS_ACTIVITY, READ_BACK_ACTIVITY
from toolloop._core.outputs import cap_output
from toolloop._core.registry import (
    Evidence,
    EvidenceNotYetVisible,
    OperationStatus,
    ResultRejected,
    ToolError,
    ToolRegistry,
    ToolSpec,
    ToolTemporaryError,
    WriteInProgress,
    WriteNotSent,
    WriteOutcomeUnknown,
)
from toolloop._temporal.telemetry import WRITE_ATTEMPTS, count
from toolloop.activities.conversation import RunKey, ToolOutputStore
from toolloop.activities.tool_calls import log_arguments, tool_context

_SIDE_EFFECT = {"completed": "yes", "refused": "no", "not_sent": "no", "in_progress": "maybe", "unknown": "maybe"}
# Stored write outputs are small receipts; this cap only guards history against a misbehaving tool.
_MAX_WRITE_OUTPUT_BYTES = 16_384
# What the in-activity read-back leaves of the attempt's time, so the attempt never times out over it.
_READ_BACK_MARGIN_SECONDS = 0.5


def _time_left(info: activity.Info) -> float:
    """Seconds until this attempt's start-to-close timeout (none set: a bounded default)."""
    if info.start_to_close_timeout is None:
        return 5.0
    started = info.started_time
    return info.start_to_close_timeout.total_seconds() - (datetime.now(UTC) - started).total_seconds()


class WriteActivities:
    def __init__(
        self,
        registry: ToolRegistry,
        http: httpx.AsyncClient,
        retention_seconds: float | None = None,
        outputs: ToolOutputStore | None = None,
    ) -> None:
        self._registry = registry
        # Where a model turn on this worker takes a write's output from (WriteInput.round).
        self._outputs = outputs
        self._http = http
        self._log_rules: dict[str, dict[str, bool]] = {}
        # The worker's configured key retention, for services that do not declare theirs.
        self._retention_seconds = retention_seconds

    def _spec(self, name: str) -> ToolSpec:
        spec = self._registry.get(name)
        if spec is None or spec.read_only:
            raise ApplicationError(
                f"side-effecting tool {name!r} is not registered on this worker",
                type=ErrorType.TOOL_MISCONFIGURED,
                non_retryable=True,
            )
        return spec

    @activity.defn(name=EXECUTE_WRITE_ACTIVITY)
    async def execute_write(self, inp: WriteInput) -> WriteOutcome:
        spec = self._spec(inp.tool)
        try:
            args = spec.schema.load(inp.arguments)
        except ArgumentsRejected:
            # Nothing was sent: a tool whose checked arguments do not validate again is misconfigured.
            activity.logger.error("write arguments do not validate again", extra={"tool": inp.tool})
            message = "this tool is misconfigured; nothing was sent."
            return WriteOutcome(kind="refused", output=error_output(ResultCode.INTERNAL, message), detail=message)
        # What the approval is bound to, as the workflow computed it: for a write that checks its token itself.
        digest = payload_digest(spec.digest_target(args) or spec.name, inp.arguments)
        ctx = tool_context(spec, inp.actor, self._http, inp.call_id, inp.operation_id, inp.approval_token, digest)
        started = time.monotonic()
        outcome: WriteOutcome
        try:
            data = await spec.execute(ctx, args)
        except ToolError as err:
            outcome = WriteOutcome(kind="refused", output=error_output(err.code, err.message), detail=err.code)
        except WriteNotSent as err:
            outcome = WriteOutcome(kind="not_sent", retry_after_seconds=err.retry_after_seconds, detail=str(err))
        except WriteInProgress as err:
            outcome = WriteOutcome(kind="in_progress", detail=str(err))
        except WriteOutcomeUnknown as err:
            outcome = WriteOutcome(kind="unknown", retry_after_seconds=err.retry_after_seconds, detail=str(err))
        except Exception:
            # Whatever broke, the request may have left: unknown, never "not executed".
            activity.logger.exception(
                "write executor failed", extra={"tool": inp.tool, "operation_id": inp.operation_id}
            )
            outcome = WriteOutcome(kind="unknown", detail="the executor failed unexpectedly")
        else:
            outcome = self._completed(spec, data, inp)
        outcome.duration_ms = int((time.monotonic() - started) * 1000)
        count(activity.metric_meter(), WRITE_ATTEMPTS, "write attempts by outcome", tool=inp.tool, outcome=outcome.kind)
        activity.logger.info(
            "write attempt done",
            extra={
                "request_id": activity.info().workflow_id,
                "operation_id": inp.operation_id,
                "tool": inp.tool,
                "attempt": inp.attempt,
                "call_id": inp.call_id,
                "kind": outcome.kind,
                "code": (outcome.output or {}).get("code"),
                "duration_ms": outcome.duration_ms,
                # Whether this attempt made the effect: yes, no, or maybe (an unclear outcome asks the status).
                "side_effect": _SIDE_EFFECT[outcome.kind],
                "arguments": log_arguments(spec, inp.arguments, self._log_rules),
            },
        )
        if outcome.kind == "unknown":
            # Not green in the UI: the attempt ended without a definite answer. The workflow reads the outcome
            # from the details and asks the operation's status (this is never retried by Temporal).
            raise ApplicationError(
                f"the outcome of this attempt is unknown: {outcome.detail}",
                outcome.model_dump(mode="json"),
                type=ErrorType.WRITE_OUTCOME_UNKNOWN,
                non_retryable=True,
            )
        if outcome.kind == "completed" and spec.read_back is not None and outcome.output is not None:
            outcome.evidence = await self._read_back_now(spec, args, inp, outcome.output)
        self._keep_output_for_next_turn(inp, outcome)
        return outcome

    def _keep_output_for_next_turn(self, inp: WriteInput, outcome: WriteOutcome) -> None:
        """For a next model turn that runs as an activity: what it is told of this write, when this attempt
        establishes it alone (the turn refers to it rather than history storing it again)."""
        if self._outputs is None or inp.round is None:
            return
        told = write_output_in_attempt(inp, outcome)
        if told is not None:
            info = activity.info()
            run = RunKey(info.workflow_id or "", info.workflow_run_id or "")
            self._outputs.put(run, inp.round, inp.call_id, told)

    async def _read_back_now(
        self, spec: ToolSpec, args: Any, inp: WriteInput, output: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The read-back on the happy path, in the write's own activity (it saves a workflow task and an
        activity). It is the same real read of the service as the read-back activity, within what is left
        of this attempt's time; anything short of a conclusion leaves it to that activity."""
        assert spec.read_back is not None
        budget = _time_left(activity.info()) - _READ_BACK_MARGIN_SECONDS
        if budget <= 0:
            return None
        try:
            ctx = tool_context(spec, inp.actor, self._http, operation_id=inp.operation_id)
            async with asyncio.timeout(budget):
                evidence = await spec.read_back(ctx, args, output)
        except Exception as err:
            # Not visible yet, a timeout, or a failure: the read-back activity reads again (it never writes).
            activity.logger.info(
                "read-back deferred to its own activity",
                extra={"operation_id": inp.operation_id, "tool": inp.tool, "why": type(err).__name__},
            )
            return None
        return evidence.model_dump(mode="json")

    @staticmethod
    def _completed(spec: ToolSpec, data: Any, inp: WriteInput) -> WriteOutcome:
        try:
            output = spec.output_of(data)
        except ResultRejected as err:
            # The write went through, but its answer is not what the tool declares: not provably done.
            activity.logger.error("write answered outside its result model", extra={"tool": inp.tool, "why": str(err)})
            return WriteOutcome(kind="unknown", detail="the tool's answer does not match its declared result")
        return WriteOutcome(kind="completed", output=cap_output(output, _MAX_WRITE_OUTPUT_BYTES))

    @activity.defn(name=QUERY_OPERATION_STATUS_ACTIVITY)
    async def query_operation_status(self, inp: OperationQuery) -> OperationStatus:
        spec = self._spec(inp.tool)
        if spec.status is None:
            raise ApplicationError(
                f"tool {inp.tool!r} has no status query", type=ErrorType.TOOL_MISCONFIGURED, non_retryable=True
            )
        try:
            ctx = tool_context(spec, inp.actor, self._http, operation_id=inp.operation_id)
            status = await spec.status(ctx, inp.operation_id)
        except ToolTemporaryError as err:
            delay = timedelta(seconds=err.retry_after_seconds) if err.retry_after_seconds else None
            raise ApplicationError(
                f"status of {inp.operation_id} unavailable: {err}",
                type=ErrorType.OPERATION_STATUS_UNAVAILABLE,
                next_retry_delay=delay,
            ) from None
        if status.output is not None:
            status.output = cap_output(status.output, _MAX_WRITE_OUTPUT_BYTES)
        if status.retention_seconds is None:
            status.retention_seconds = self._retention_seconds
        return status

    @activity.defn(name=READ_BACK_ACTIVITY)
    async def read_back_operation(self, inp: ReadBackInput) -> Evidence:
        spec = self._spec(inp.tool)
        if spec.read_back is None:
            return Evidence(verified=False, detail="this tool has no read-back")
        try:
            args = spec.schema.load(inp.arguments)
        except ArgumentsRejected:
            return Evidence(verified=False, detail="this tool is misconfigured; its read-back could not run")
        try:
            ctx = tool_context(spec, inp.actor, self._http, operation_id=inp.operation_id)
            return await spec.read_back(ctx, args, inp.output)
        except (EvidenceNotYetVisible, ToolTemporaryError) as err:
            # A stale read is worth reading again; it never leads to writing again.
            raise ApplicationError(
                f"read-back of {inp.operation_id}: {err}", type=ErrorType.EVIDENCE_NOT_YET_VISIBLE
            ) from None
