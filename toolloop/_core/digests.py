"""Pure: canonical payloads, their digests, and operation ids derived from them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 as is: the same payload always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def payload_digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """What an approval is bound to and what the service compares under one idempotency key."""
    text = canonical_json({"tool": tool, "arguments": dict(arguments)})
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def derive_operation_id(request_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """Stable for the same intended operation within one request: the same tool and payload proposed
    again (with a new call_id) is the same operation, so it can never make a second effect."""
    text = canonical_json({"request": request_id, "tool": tool, "arguments": dict(arguments)})
    return "op_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
