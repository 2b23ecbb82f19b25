"""Pure: size-capping tool outputs before they become payloads in history.

An output over the cap keeps its JSON structure: every key stays, and only long strings and long lists are
shortened, each with a marker the model can read, so a field after a long one (a ticket's `version` after
its notes) is still there. All strings are cut to one length and all lists to one count, the largest that
fit (found by bisection), and the top level says how big the output was."""

from __future__ import annotations

from typing import Any

from toolloop._core.contracts import output_json

TRUNCATION_MARKER = "...[truncated]"
# The key added to a capped output's top level; a tool's own key of that name is replaced.
CAPPED_KEY = "_truncated"
# Lists are cut to this many times fewer items than strings keep characters (an item is rarely shorter).
_CHARS_PER_ITEM = 8


def output_size(output: dict[str, Any]) -> int:
    return len(output_json(output).encode("utf-8"))


def _more(count: int) -> str:
    return f"...[{count} more]"


def _shortened(value: Any, chars: int) -> Any:
    """`value` with every string cut to `chars` characters and every list to `chars // 8` items (at least
    one), each cut marked; a cut is made only where it makes the value shorter."""
    if isinstance(value, str):
        if len(value) > chars + len(TRUNCATION_MARKER):
            return value[:chars] + TRUNCATION_MARKER
        return value
    if isinstance(value, dict):
        return {key: _shortened(item, chars) for key, item in value.items()}
    if isinstance(value, list):
        items = max(1, chars // _CHARS_PER_ITEM)
        kept = [_shortened(item, chars) for item in value[:items]]
        if len(value) > items + 1:
            return [*kept, _more(len(value) - items)]
        return kept + [_shortened(item, chars) for item in value[items:]]
    return value


def _longest(value: Any) -> int:
    """The longest string (in characters) or list (in items, times the per-item ratio) anywhere in `value`."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return max((_longest(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return max([len(value) * _CHARS_PER_ITEM, *(_longest(item) for item in value)])
    return 0


_MAX_CODE_CHARS = 64


def cap_output(output: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """Return `output` unchanged if it fits, else the same JSON object with long strings and lists
    shortened so that it fits within `max_bytes`, plus `_truncated: {"original_bytes": N}`. `ok` and
    `code` are never shortened; a missing `ok` becomes false (an output that says nothing is not success).
    Where even the keys alone do not fit, a short preview of the JSON text is returned instead."""
    size = output_size(output)
    if size <= max_bytes:
        return output
    head: dict[str, Any] = {"ok": bool(output.get("ok", False))}
    code = output.get("code")
    if isinstance(code, str) and len(code) <= _MAX_CODE_CHARS:  # a result code; a long `code` is data (a snippet)
        head["code"] = code
    head[CAPPED_KEY] = {"original_bytes": size}
    body = {key: value for key, value in output.items() if key not in head}

    def capped_at(chars: int) -> dict[str, Any]:
        return {**head, **_shortened(body, chars)}

    low, high = 0, _longest(body)
    if output_size(capped_at(low)) > max_bytes:
        return _preview(output, head, size, max_bytes)
    # The largest length that fits (the size grows with it).
    while low < high:
        middle = (low + high + 1) // 2
        if output_size(capped_at(middle)) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return capped_at(low)


def _preview(output: dict[str, Any], head: dict[str, Any], size: int, max_bytes: int) -> dict[str, Any]:
    """The last resort (more keys than the cap holds): as much of the JSON text as fits, marked."""
    head = {**head, CAPPED_KEY: {"original_bytes": size, "keys_dropped": True}}
    text = output_json(output)
    budget = max_bytes - output_size({**head, "preview": TRUNCATION_MARKER})
    while True:
        preview = text.encode("utf-8")[: max(budget, 0)].decode("utf-8", "ignore") + TRUNCATION_MARKER
        capped = {**head, "preview": preview}
        overshoot = output_size(capped) - max_bytes
        if overshoot <= 0 or budget <= 0:
            return capped
        # JSON escaping made the preview longer than its raw bytes: cut the overshoot and try again.
        budget -= max(overshoot, 1)
