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
from toolloop._core.registry import ToolRegistry

logger = logging.getLogger(__name__)
_JSON_KIND = {type(None): "null", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _shorten(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_call(registry: ToolRegistry, call: FunctionCallItem) -> CheckedCall:
    spec = registry.get(call.name)
    if spec is None:
        return CheckedCall(
            call_id=call.call_id,
            name=call.name,
            summary=f"{_shorten(call.name)} (unknown tool)",
            rejection=error_output(
                ResultCode.UNKNOWN_TOOL,
                f"There is no tool named {_shorten(call.name)!r}. Available: {', '.join(registry.names())}.",
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

    try:
        parsed = json.loads(call.arguments, parse_constant=_reject_constant)
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
        timeout_seconds=spec.timeout_seconds,
        max_attempts=spec.max_attempts,
        # Only a write has a status query and a read-back to lack (a read keeps the defaults, left out of history).
        has_status=spec.read_only or spec.status is not None,
        has_read_back=spec.read_only or spec.read_back is not None,
        local=spec.read_only and spec.local,
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


def check_turn(registry: ToolRegistry, calls: Sequence[FunctionCallItem]) -> tuple[list[CheckedCall], str | None]:
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
    return [check_call(registry, call) for call in calls], None
