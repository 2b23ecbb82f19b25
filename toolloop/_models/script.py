"""Pure (plus one file read): load a scripted model - the exact output items to return, turn by turn.

Script format
-------------
A script is a JSON file with a top-level object holding a "turns" list. Turn N is the list of output
items the model returns on its N-th call, in Responses API shape; other top-level keys (for example a
"description") are ignored. When the workflow asks for more turns than the script has, the script
has run out (the run stops with a model error).

    {
      "description": "read an order, then answer",
      "turns": [
        [
          {"type": "reasoning", "id": "rs_1", "summary": []},
          {"type": "function_call", "name": "get_order",
           "arguments": "{\"orderId\": \"A100\"}", "call_id": "call_1"}
        ],
        [
          {"type": "message", "content": "Order A100 has shipped."}
        ]
      ]
    }

Item types:
- "function_call": "name" (string), "call_id" (string) and "arguments", which must be a JSON *string*
  (as the API sends it). It is not parsed here, so a script can hold deliberately broken arguments
  such as "{\"orderId\": \"A1" to test how bad JSON is handled.
- "message": an assistant message. "content" is a list of {"type": "output_text", "text": "..."}
  parts, or, for convenience, a plain string (turned into one output_text part). "role", if given,
  must be "assistant".
- "reasoning": kept exactly as written and sent back to the model unchanged, like a real one.
Any other field on an item is kept. An empty turn ([]) is allowed: it is a model that answered nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from toolloop._core.contracts import ConversationItem
from toolloop._models.adapter import ModelRequest
from toolloop._models.errors import ModelCallError, ScriptError, json_type

_ITEM: TypeAdapter[ConversationItem] = TypeAdapter(ConversationItem)

ITEM_TYPES = ("function_call", "message", "reasoning")


def load_script(path: str | Path) -> list[list[ConversationItem]]:
    """Read and check a script file; every problem is a ScriptError naming the file and the spot."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"script file not found: {file}") from None
    except IsADirectoryError:
        raise ScriptError(f"script path is a directory, not a file: {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"cannot read script file {file}: {type(exc).__name__}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(
            f"script file {file} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    try:
        return parse_script(data)
    except ScriptError as exc:
        raise ScriptError(f"script file {file}: {exc}") from None


def parse_script(data: Any) -> list[list[ConversationItem]]:
    """Check an already-decoded script (`{"turns": [[item, ...], ...]}`) and build its items."""
    if not isinstance(data, dict) or "turns" not in data:
        raise ScriptError('a script must be a JSON object with a "turns" list')
    turns = data["turns"]
    if not isinstance(turns, list):
        raise ScriptError(f'"turns" must be a list, got {json_type(turns)}')
    result: list[list[ConversationItem]] = []
    for t, turn in enumerate(turns, start=1):
        if not isinstance(turn, list):
            raise ScriptError(f"turn {t} is not a list of items, got {json_type(turn)}")
        result.append([_item(f"turn {t} item {i}", raw) for i, raw in enumerate(turn, start=1)])
    return result


def _item(where: str, raw: Any) -> ConversationItem:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: an item must be an object, got {json_type(raw)}")
    kind = raw.get("type")
    if kind == "function_call":
        for field in ("name", "call_id"):
            value = raw.get(field)
            if not isinstance(value, str) or not value:
                got = "nothing" if field not in raw else json_type(value) if not isinstance(value, str) else "''"
                raise ScriptError(f"{where}: function_call needs '{field}' as a non-empty string, got {got}")
        if not isinstance(raw.get("arguments"), str):
            got = "nothing" if "arguments" not in raw else json_type(raw["arguments"])
            raise ScriptError(f"{where}: function_call needs 'arguments' as a JSON string, got {got}")
        item = dict(raw)
    elif kind == "message":
        item = _message(where, raw)
    elif kind == "reasoning":
        item = dict(raw)
    elif kind is None:
        raise ScriptError(f"{where}: item has no 'type' (expected one of {', '.join(ITEM_TYPES)})")
    else:
        raise ScriptError(f"{where}: unknown item type {kind!r} (expected one of {', '.join(ITEM_TYPES)})")
    try:
        return _ITEM.validate_python(item)
    except ValidationError as exc:  # pragma: no cover - the checks above make the models accept it
        raise ScriptError(f"{where}: {exc.errors()[0]['msg']}") from None


def _message(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    role = raw.get("role", "assistant")
    if role != "assistant":
        raise ScriptError(f"{where}: a scripted message is the model's, so 'role' must be 'assistant', got {role!r}")
    content = raw.get("content")
    if isinstance(content, str):
        content = [{"type": "output_text", "text": content}]
    elif isinstance(content, list):
        for p, part in enumerate(content, start=1):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ScriptError(f"{where}: message content part {p} must be an object with a 'type'")
            if part["type"] == "output_text" and not isinstance(part.get("text"), str):
                raise ScriptError(f"{where}: message content part {p} (output_text) needs 'text' as a string")
    else:
        got = "nothing" if "content" not in raw else json_type(content)
        raise ScriptError(f"{where}: message needs 'content' as a string or a list of output_text parts, got {got}")
    return {**raw, "role": "assistant", "content": content}


class ScriptModel:
    """The model adapter of `--model script:FILE`: turn N answers with the script's N-th turn, which the
    worker reads from the request (a script is per request). It needs no conversation."""

    needs_conversation = False
    # Each model turn's input carries this turn's part of the request's script (ModelTurnInput.script_turn).
    # Whoever starts a request writes its answers, tool calls included: a worker serves it only when its
    # configuration allows scripted models (ToolloopPlugin(allow_scripted_models=True)).
    scripted = True

    def label(self, model_name: str | None) -> str:
        return "script"

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        if request.scripted_output is None:
            raise ModelCallError(
                "exhausted",
                f"the model script has {request.script_length} turn(s) but the model was called a "
                f"{_ordinal(request.turn)} time; add a turn that ends with a message",
            )
        return list(request.scripted_output)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
