"""Activity (I/O): run one validated tool call through its registered executor and map the outcome
to a result code. Definite answers are returned; transient failures raise so Temporal retries them."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from toolloop._core.arguments import ArgumentsRejected
from toolloop._core.codes import ErrorType, ResultCode
from toolloop._core.contracts import Actor, ToolCallInput, ToolCallResult, error_output, output_json
from toolloop._core.names import RUN_TOOL_ACTIVITY
from toolloop._core.outputs import cap_output
from toolloop._core.redaction import for_logs, log_rules
from toolloop._core.registry import (
    ResultRejected,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
    ToolTemporaryError,
)
from toolloop._temporal.telemetry import TOOL_RESULTS, count
from toolloop._tools.http import default_actor_headers
from toolloop.activities.conversation import RunKey, ToolOutputStore


def log_arguments(spec: ToolSpec, arguments: dict[str, Any], cache: dict[str, dict[str, bool]]) -> dict[str, Any]:
    """The arguments as logs may show them: masked field by field (free text, amounts, `redact`)."""
    rules = cache.get(spec.name)
    if rules is None:
        rules = cache[spec.name] = log_rules(spec.definition()["parameters"], spec.redact)
    return for_logs(arguments, rules)


def tool_context(
    spec: ToolSpec,
    actor: Actor,
    http: httpx.AsyncClient,
    call_id: str = "",
    operation_id: str | None = None,
    token: str | None = None,
    digest: str | None = None,
) -> ToolContext:
    """The executor's view: its source's client (the worker's shared one for a tool without a source) and
    the actor as that source expects it."""
    source = spec.source
    actor_headers = getattr(source, "actor_headers", default_actor_headers)
    return ToolContext(
        actor=actor,
        http=source.http if source is not None else http,
        workflow_id=activity.info().workflow_id or "",
        call_id=call_id,
        operation_id=operation_id,
        approval_token=token,
        headers=dict(actor_headers(actor)),
        approval_digest=digest,
    )


class ToolActivities:
    def __init__(self, registry: ToolRegistry, http: httpx.AsyncClient, outputs: ToolOutputStore | None = None) -> None:
        self._registry = registry
        # For tools without a source of their own.
        self._http = http
        # Where the next model turn on this worker picks the outputs up (the workflow refers to them).
        self._outputs = outputs
        self._log_rules: dict[str, dict[str, bool]] = {}

    @activity.defn(name=RUN_TOOL_ACTIVITY)
    async def run_tool(self, inp: ToolCallInput) -> ToolCallResult:
        info = activity.info()
        spec = self._registry.get(inp.tool)
        if spec is None or not spec.read_only:
            # The model turn validated this name, as a read, on some worker; this worker lacks the tool, or knows
            # it as a write (a deploy that made it one, MCP workers that read its hints differently): a write
            # runs only through execute_write, with its operation id and approval. Nothing is run.
            raise ApplicationError(
                f"tool {inp.tool!r} is not registered as a read on this worker",
                type=ErrorType.TOOL_MISCONFIGURED,
                non_retryable=True,
            )
        try:
            args = spec.schema.load(inp.arguments)
        except ArgumentsRejected:
            # Validated once already by the model turn: failing again is this tool's bug, not the model's,
            # and retrying cannot fix it.
            raise ApplicationError(
                f"tool {inp.tool!r}: its checked arguments do not validate again",
                type=ErrorType.TOOL_MISCONFIGURED,
                non_retryable=True,
            ) from None
        ctx = tool_context(spec, inp.actor, self._http, inp.call_id)
        started = time.monotonic()
        output: dict[str, Any]
        try:
            output = spec.output_of(await spec.execute(ctx, args))
        except ResultRejected as err:
            activity.logger.error("tool answered outside its result model", extra={"tool": inp.tool, "why": str(err)})
            output = error_output(
                ResultCode.INTERNAL, "the tool gave an answer it does not declare; this is not your fault."
            )
        except ToolError as err:
            output = error_output(err.code, err.message)
        except ToolTemporaryError as err:
            delay = timedelta(seconds=err.retry_after_seconds) if err.retry_after_seconds else None
            raise ApplicationError(
                err.args[0], type=ErrorType.SERVICE_TEMPORARILY_UNAVAILABLE, next_retry_delay=delay
            ) from None
        except Exception:
            # A broken executor: log the details for operators, give the model only a code.
            activity.logger.exception("tool executor failed", extra={"tool": inp.tool, "call_id": inp.call_id})
            output = error_output(ResultCode.INTERNAL, "the tool failed unexpectedly; this is not your fault.")
        duration_ms = int((time.monotonic() - started) * 1000)
        code = output.get("code") or "ok"
        count(activity.metric_meter(), TOOL_RESULTS, "tool call results by tool and code", tool=inp.tool, code=code)
        activity.logger.info(
            "tool call done",
            extra={
                "request_id": info.workflow_id,
                "call_id": inp.call_id,
                "tool": inp.tool,
                "round": inp.round,
                "ok": output.get("ok"),
                "code": output.get("code"),
                "duration_ms": duration_ms,
                "side_effect": False,
                "arguments": log_arguments(spec, inp.arguments, self._log_rules),
                "attempt": info.attempt,
            },
        )
        result = ToolCallResult(
            call_id=inp.call_id, output=cap_output(output, inp.max_output_bytes), duration_ms=duration_ms
        )
        # The next model turn refers to this output in history: the worker keeps it for that turn.
        if self._outputs is not None:
            run = RunKey(info.workflow_id or "", info.workflow_run_id or "")
            self._outputs.put(run, inp.round, inp.call_id, output_json(result.output))
        return result
