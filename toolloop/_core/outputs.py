"""Pure: size-capping tool outputs before they become payloads in history."""

from __future__ import annotations

from typing import Any

from toolloop._core.contracts import output_json

TRUNCATION_MARKER = "...[truncated]"


def output_size(output: dict[str, Any]) -> int:
    return len(output_json(output).encode("utf-8"))


def cap_output(output: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """Return `output` unchanged if it fits, else a valid JSON object that says it was truncated,
    keeps `ok`/`code`, and carries as much of the original text as fits within `max_bytes`."""
    size = output_size(output)
    if size <= max_bytes:
        return output
    text = output_json(output)
    head: dict[str, Any] = {"ok": bool(output.get("ok", False)), "truncated": True, "original_bytes": size}
    if "code" in output:
        head["code"] = output["code"]
    budget = max_bytes - output_size({**head, "preview": TRUNCATION_MARKER})
    while True:
        preview = text.encode("utf-8")[: max(budget, 0)].decode("utf-8", "ignore") + TRUNCATION_MARKER
        capped = {**head, "preview": preview}
        overshoot = output_size(capped) - max_bytes
        if overshoot <= 0:
            return capped
        # JSON escaping made the preview longer than its raw bytes: cut the overshoot and try again.
        budget -= max(overshoot, 1)
