"""Pure: stage 3 of a round - check each proposed call (registered name, JSON object, schema and ranges)
and turn every failure into a result code. Never raises on model output."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from toolloop._core.arguments import ArgumentsRejected
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import CheckedCall, FunctionCallItem, error_output
from toolloop._core.registry import ToolError, ToolRegistry

logger = logging.getLogger(__name__)
_JSON_KIND = {type(None): "null", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
# Bounds on a call's arguments as the model wrote them, checked before anything parses them: hostile or
# broken output (arrays nested 200,000 deep, a 50 MB string) is answered to the model, never a failed turn.
MAX_ARGUMENT_BYTES = 64 * 1024
MAX_ARGUMENT_DEPTH = 32


def argument_text_problem(text: str) -> str | None:
    """Why the arguments' text is too large or nested too deep to parse; None if neither. A linear scan
    (no recursion): brackets inside strings do not count."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_ARGUMENT_BYTES:
        return f"arguments are {size} bytes; at most {MAX_ARGUMENT_BYTES} are accepted"
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_ARGUMENT_DEPTH:
                return f"arguments nest more than {MAX_ARGUMENT_DEPTH} levels deep"
        elif char in "]}":
            depth -= 1
    return None


def _reject_non_finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {_shorten(text)} is too large")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _shorten(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_call(registry: ToolRegistry, call: FunctionCallItem, offered: Collection[str] | None = None) -> CheckedCall:
    """One call checked against the registry; `offered`: the tools the request offers (None: every tool), the only
    ones an unknown tool's answer names, so the model learns of no tool it was not given."""
    spec = registry.get(call.name)
    if spec is None:
        available = [name for name in registry.names() if offered is None or name in offered]
        return CheckedCall(
            call_id=call.call_id,
            name=call.name,
            summary=f"{_shorten(call.name)} (unknown tool)",
            rejection=error_output(
                ResultCode.UNKNOWN_TOOL,
                f"There is no tool named {_shorten(call.name)!r}. Available: {', '.join(available) or 'none'}.",
            ),
        )

    def reject(code: ResultCode, message: str) -> CheckedCall:
        return CheckedCall(
            call_id=call.call_id,
            name=spec.name,
            read_only=spec.read_only,
            summary=f"{spec.name} (rejected)",
            rejection=error_output(code, message),
        )

    problem = argument_text_problem(call.arguments)
    if problem is not None:
        return reject(ResultCode.BAD_ARGUMENTS, f"{problem}; send smaller, flatter arguments.")
    try:
        parsed = json.loads(call.arguments, parse_constant=_reject_constant, parse_float=_reject_non_finite)
    except (ValueError, RecursionError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        return reject(ResultCode.BAD_JSON, f"arguments are not valid JSON ({_shorten(detail)}); send a JSON object.")
    if not isinstance(parsed, dict):
        kind = _JSON_KIND.get(type(parsed), "value")
        return reject(ResultCode.BAD_JSON, f"arguments must be a JSON object, got {kind}.")
    try:
        args = spec.schema.check(call.arguments)
    except ArgumentsRejected as exc:
        return reject(ResultCode.BAD_ARGUMENTS, str(exc))
    try:
        # The tool author's own code (canonical form, digest target, summary): a bug there is INTERNAL for
        # this call, never an exception that fails the model turn.
        arguments = spec.canonical_arguments(args)
        target = spec.digest_target(args)
        summary = spec.summary(args)
    except ToolError as refusal:  # a value the tool refuses to place (a path segment "..", say)
        return reject(refusal.code, refusal.message)
    except Exception:
        logger.exception("tool %s: its canonical form, target or summary failed", spec.name)
        return reject(ResultCode.INTERNAL, "this tool is misconfigured; nothing was run.")
    return CheckedCall(
        call_id=call.call_id,
        name=spec.name,
        read_only=spec.read_only,
        summary=summary,
        arguments=arguments,
        redact=list(spec.redact),
        target=target,
        audience=None if spec.read_only else spec.approval_audience,
        policy_facts=list(spec.policy_facts),
        timeout_seconds=spec.timeout_seconds,
        max_attempts=spec.max_attempts,
        # Only a write has a status query and a read-back to lack (a read keeps the defaults, left out of history).
        has_status=spec.read_only or spec.status is not None,
        has_read_back=spec.read_only or spec.read_back is not None,
        each_call_distinct=spec.each_call_distinct and not spec.read_only,
    )


def forbid_not_allowed(calls: Sequence[CheckedCall], allowed: Collection[str] | None) -> list[CheckedCall]:
    """The turn's calls with every runnable call to a tool this request may not use answered FORBIDDEN
    (None: every tool is allowed). The workflow applies it to whatever the model turn returned."""
    if allowed is None:
        return list(calls)
    permitted = set(allowed)
    return [
        call
        if call.rejection is not None or call.name in permitted
        else CheckedCall(
            call_id=call.call_id,
            name=call.name,
            read_only=call.read_only,
            summary=f"{_shorten(call.name)} (not allowed)",
            rejection=error_output(
                ResultCode.FORBIDDEN, f"{_shorten(call.name)!r} is not available to this request; it was not run."
            ),
        )
        for call in calls
    ]


def check_turn(
    registry: ToolRegistry, calls: Sequence[FunctionCallItem], offered: Collection[str] | None = None
) -> tuple[list[CheckedCall], str | None]:
    """Check every call of one model turn. A `call_id` used twice makes the turn a protocol error:
    nothing in it runs, and each distinct `call_id` gets one output."""
    counts = Counter(c.call_id for c in calls)
    duplicated = sorted(cid for cid, n in counts.items() if n > 1)
    if duplicated:
        message = (
            f"call_id {_shorten(duplicated[0])!r} appears {counts[duplicated[0]]} times in one turn; "
            "nothing in this turn ran. Use a distinct call_id per call."
        )
        seen: set[str] = set()
        checked = []
        for call in calls:
            if call.call_id in seen:
                continue
            seen.add(call.call_id)
            checked.append(
                CheckedCall(
                    call_id=call.call_id,
                    name=call.name,
                    summary=f"{_shorten(call.name)} (rejected)",
                    rejection=error_output(ResultCode.BAD_ARGUMENTS, message),
                )
            )
        return checked, message
    return [check_call(registry, call, offered) for call in calls], None
