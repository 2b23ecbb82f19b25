"""Pure: the two errors the model adapters raise (a failed model call, a bad script file)."""

from __future__ import annotations

import re
from typing import Literal

ModelCallErrorKind = Literal["temporary", "rejected", "malformed", "exhausted"]

# Longest provider text we copy into a message: enough to diagnose, too short to leak a whole body.
MAX_DETAIL_CHARS = 300


def truncate(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ModelCallError(Exception):
    """A model call that gave no usable answer.

    `kind` tells the caller what to do (the message is for people, never branched on):
    temporary -> try again later (429, 5xx, network); rejected -> the request itself is wrong (4xx);
    malformed -> the provider answered, but not with a completed, well-formed response; exhausted -> a
    scripted model has no turn left.
    `message` is safe to show: it never holds the API key or more than a short slice of a body.
    """

    def __init__(self, kind: ModelCallErrorKind, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.kind: ModelCallErrorKind = kind
        self.message = message
        self.retry_after_seconds = retry_after_seconds

    def __repr__(self) -> str:
        retry = self.retry_after_seconds
        return f"ModelCallError(kind={self.kind!r}, message={self.message!r}, retry_after_seconds={retry!r})"


class ScriptError(ValueError):
    """A script file (or in-memory script) that does not have the documented shape."""


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages such as 'got object'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# A provider's error codes that say the same request fails every time (invalid_prompt, a content policy, an
# invalid image, a context too long); any other code (a gateway's own: throttling, busy) is worth another attempt.
_PERMANENT_CODE = re.compile(r"invalid|policy|unsupported|not_found|context_length|bad_request|refus", re.IGNORECASE)


def temporary_code(code: object) -> bool:
    """Whether a provider's error code leaves another attempt worth making: an HTTP status by its class (4xx but
    408 and 429 is final), a named code unless it says the request itself is at fault; no code: worth it."""
    text = str(code).strip() if isinstance(code, int | str) else ""
    if text.isascii() and text.isdigit():
        return not (400 <= int(text) < 500) or int(text) in (408, 429)
    return _PERMANENT_CODE.search(text) is None
