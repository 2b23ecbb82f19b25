"""I/O: the OpenAI Responses API adapter on the official SDK (`client.responses.create`), for OpenAI or any
compatible base URL.

It sends the whole conversation as `input` and returns the response's `output` items as our models, keeping
every field so they go back unchanged next round. It never retries: Temporal owns retries, so each failure
becomes a ModelCallError whose `kind` says whether retrying can help (toolloop._models.openai_sdk). Reading an
answer is the pure `responses_answer`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import TypeAdapter, ValidationError

from toolloop._core.contracts import ConversationItem, item_to_wire
from toolloop._models.adapter import ModelAnswer, TextSink
from toolloop._models.errors import ModelCallError, json_type, temporary_code, truncate
from toolloop._models.openai_sdk import OpenAIEndpoint, OpenAIModel, token_usage

if TYPE_CHECKING:
    from openai.types.responses import ResponseInputParam, ToolParam

logger = logging.getLogger(__name__)

_ITEM: TypeAdapter[ConversationItem] = TypeAdapter(ConversationItem)

# Fields our adapter owns; `extra_body` cannot override them.
_RESERVED = frozenset({"model", "instructions", "input", "tools", "parallel_tool_calls", "stream"})
# The events that end a streamed response, each carrying the whole response.
_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


# --- pure: reading an answer ---------------------------------------------------------------------------------


def responses_answer(data: object) -> ModelAnswer:
    """A Responses API answer (the decoded body) as our items and its usage, or a malformed ModelCallError:
    the answer must be `completed` and every output item well formed (a function call's name, arguments and
    call id strings)."""
    if not isinstance(data, dict):
        raise ModelCallError("malformed", f"response body is a JSON {json_type(data)}, not an object")
    state = data.get("status")
    if state == "failed":
        # The provider's own failure to finish the answer (a streamed call says so in its last event): asked again,
        # unless its code says the same request fails every time (invalid_prompt, a content policy).
        error = data.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        why = f"the model endpoint failed the response{_why_not_completed(data)}"
        raise ModelCallError("temporary", why) if temporary_code(code) else ModelCallError("rejected", why)
    if state != "completed":
        raise ModelCallError("malformed", f"response status is {state!r}{_why_not_completed(data)}, not 'completed'")
    output = data.get("output")
    if not isinstance(output, list):
        raise ModelCallError("malformed", f"response 'output' is a JSON {json_type(output)}, not a list")
    items = [_item(index, raw) for index, raw in enumerate(output, start=1)]
    return ModelAnswer(items, usage=token_usage(data.get("usage"), "input_tokens", "output_tokens"))


def _item(index: int, raw: Any) -> ConversationItem:
    where = f"output item {index}"
    if not isinstance(raw, dict):
        raise ModelCallError("malformed", f"{where} is a JSON {json_type(raw)}, not an object")
    kind = raw.get("type")
    if not isinstance(kind, str) or not kind:
        raise ModelCallError("malformed", f"{where} has no 'type'")
    if kind == "function_call":
        for field in ("name", "arguments", "call_id"):
            if not isinstance(raw.get(field), str):
                got = "missing" if field not in raw else f"a JSON {json_type(raw[field])}"
                raise ModelCallError("malformed", f"{where}: function_call '{field}' must be a string, got {got}")
    try:
        return _ITEM.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"][1:]) or "item"
        raise ModelCallError("malformed", f"{where} ({kind}): {loc}: {first['msg']}") from None


def _why_not_completed(data: dict[str, Any]) -> str:
    details = data.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if isinstance(reason, str):
        return f" ({truncate(reason, 80)})"
    error = data.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return f" ({truncate(message, 120)})" if isinstance(message, str) else ""


# --- I/O: the endpoint ----------------------------------------------------------------------------------------


class ResponsesClient(OpenAIEndpoint):
    """One Responses API endpoint (`POST {base_url}/responses`) through the official SDK. Holds the API key;
    nothing it raises or logs contains that key."""

    # extra_body holds e.g. {"store": False, "include": ["reasoning.encrypted_content"]}; provider-specific, so opt-in.
    reserved_body_fields = _RESERVED

    async def respond(
        self,
        *,
        instructions: str,
        conversation: Sequence[ConversationItem],
        tools: list[dict[str, Any]],
        model: str | None = None,
        on_text: TextSink | None = None,
    ) -> ModelAnswer:
        """One model call: the response's output items (and its usage), or a ModelCallError. `model`
        overrides the client's default model for this call (a run may name its own); streamed, the text goes to
        `on_text` as it is written."""
        model_name = model or self.model
        logger.debug("model request", extra={"api": "responses", "model": model_name, "input_items": len(conversation)})
        call: dict[str, Any] = {
            "model": model_name,
            "instructions": instructions,
            # Our items are the wire format already, every field the provider sent included.
            "input": cast("ResponseInputParam", [item_to_wire(item) for item in conversation]),
            "tools": cast("list[ToolParam]", tools),
            "parallel_tool_calls": True,
            "extra_body": self._extra_body or None,
        }
        if self.stream:
            streamed = self.client.responses.with_streaming_response.create(**call, stream=True)
            body = await self._streamed_response(streamed, on_text)
        else:
            body = await self._answer_body(self.client.responses.with_raw_response.create(**call))
        answer = responses_answer(body)
        answer.model = model_name  # the name the worker's price table knows it by
        return answer

    async def _streamed_response(self, call: Any, on_text: TextSink | None) -> object:
        """Read a streamed response: each text delta to `on_text`, and the response as the terminal event
        (`response.completed`, `.incomplete` or `.failed`) carries it whole - the only place the answer is read
        from, by `responses_answer` as a plain call's body. A stream that ends without one was cut: temporary."""
        # Closed at once however reading ends (the terminal event, a failure): the response is released.
        async with contextlib.aclosing(self._stream_data(call)) as events:
            async for event in events:
                kind = event.get("type") if isinstance(event, dict) else None
                if kind == "response.output_text.delta":
                    delta = event.get("delta")
                    if on_text is not None and isinstance(delta, str) and delta:
                        await on_text(delta)
                elif kind in _TERMINAL_EVENTS:
                    return event.get("response")
        raise ModelCallError("temporary", "the model endpoint's stream ended before the response was complete")


class ResponsesModel(OpenAIModel):
    """The model adapter for the OpenAI Responses API (or any compatible base URL): the whole conversation
    as `input`, the tools in strict mode, every output item kept so it goes back unchanged next round.

    Server-side conversation state (`previous_response_id`) is not used: it needs the provider to store
    responses (refused under zero data retention), is missing from many compatible servers, and is lost
    when a request moves to another model or provider; the workflow's history already holds each item
    once and the worker's cache makes rebuilding the conversation rare."""

    def __init__(self, client: ResponsesClient) -> None:
        super().__init__(client)
