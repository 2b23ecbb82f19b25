"""Pure: stage 3 of a round - check each proposed call (registered name, JSON object, schema and ranges)
and turn every failure into a result code. Never raises on model output."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from toolloop._core.codes import ResultCode
from toolloop._core.contracts import CheckedCall, FunctionCallItem, error_output
from toolloop._core.registry import ToolRegistry

_MAX_ERRORS_SHOWN = 5
_JSON_KIND = {type(None): "null", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _shorten(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_validation_error(exc: ValidationError) -> str:
    """Field-by-field hints without echoing the (possibly huge or hostile) input values."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False)[:_MAX_ERRORS_SHOWN]:
        loc = ".".join(str(p) for p in err["loc"]) or "arguments"
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "is not an accepted field"
        elif kind == "missing":
            msg = "is required"
        else:
            msg = err["msg"]
        parts.append(f"{_shorten(loc)}: {msg}")
    more = len(exc.errors()) - _MAX_ERRORS_SHOWN
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


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
        args = spec.arguments.model_validate_json(call.arguments, strict=True)
    except ValidationError as exc:
        return reject(ResultCode.BAD_ARGUMENTS, describe_validation_error(exc))
    return CheckedCall(
        call_id=call.call_id,
        name=spec.name,
        read_only=spec.read_only,
        summary=spec.summary(args),
        arguments=spec.canonical_arguments(args),
        redact=list(spec.redact),
    )


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
