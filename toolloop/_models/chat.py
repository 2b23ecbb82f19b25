"""I/O: the Chat Completions adapter on the official SDK (`client.chat.completions.create`), for the
OpenAI-compatible servers that speak only that API (vLLM, llama.cpp's server, Ollama, ...).

toolloop's conversation is Responses-shaped, so each call converts it to chat messages (`chat_messages`,
`chat_tools`) and the answer back to Responses-shaped items (`chat_answer`), keeping every call id: these
three are pure. What a chat message cannot carry is dropped on the way out (`reasoning` items, say), and the
answer's `reasoning_content` and other fields outside the API are not kept. Errors and retries are as for the
Responses adapter (toolloop._models.openai_sdk).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from openai import omit

from toolloop._core.contracts import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
)
from toolloop._models.adapter import ModelAnswer, TextSink
from toolloop._models.errors import ModelCallError, json_type
from toolloop._models.openai_sdk import OpenAIEndpoint, OpenAIModel, token_usage

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

logger = logging.getLogger(__name__)

# Fields our adapter owns; `extra_body` cannot override them.
_RESERVED = frozenset({"model", "messages", "tools", "parallel_tool_calls", "stream"})
# The fields of a Responses function tool that a Chat Completions function carries.
_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
# Finish reasons of an answer cut short: not a whole answer, whatever it holds.
_CUT_SHORT = frozenset({"length", "content_filter"})


# --- pure: to chat messages and back ------------------------------------------------------------------------


def chat_messages(instructions: str, conversation: Sequence[ConversationItem]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages: the instructions as the system message, then each item
    in order. An assistant's function calls join its message of that turn (one message, `tool_calls` in the
    order the model made them), each output is a `tool` message with the call's id, and items chat has no
    form for (`reasoning`, ...) are left out."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in conversation:
        if isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif isinstance(item, MessageItem):
            messages.append(_chat_message(item))
    for message in messages:
        # An assistant message needs a text unless it carries tool calls or a refusal.
        if message["role"] == "assistant" and message["content"] is None and len(message) == 2:
            message["content"] = ""
    return messages


def _chat_message(item: MessageItem) -> dict[str, Any]:
    if item.role != "assistant":
        role = "system" if item.role in ("system", "developer") else "user"
        return {"role": role, "content": _text(item, ("input_text", "output_text", "text"))}
    message: dict[str, Any] = {"role": "assistant", "content": _text(item, ("output_text", "text")) or None}
    refusal = "".join(str(part.get("refusal", "")) for part in _parts(item) if part.get("type") == "refusal")
    if refusal:
        message["refusal"] = refusal
    return message


def _parts(item: MessageItem) -> list[dict[str, Any]]:
    return [] if isinstance(item.content, str) else item.content


def _text(item: MessageItem, kinds: tuple[str, ...]) -> str:
    if isinstance(item.content, str):
        return item.content
    return "".join(str(part.get("text", "")) for part in item.content if part.get("type") in kinds)


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Responses-shaped function tools (`{"type": "function", "name", ...}`) as Chat Completions tools
    (`{"type": "function", "function": {"name", ...}}`). Another kind of tool has no chat form: rejected."""
    converted = []
    for tool in tools:
        if tool.get("type") != "function":
            raise ModelCallError(
                "rejected",
                f"tool {tool.get('name')!r} is of type {tool.get('type')!r}: Chat Completions has function tools only",
            )
        converted.append({"type": "function", "function": {k: tool[k] for k in _FUNCTION_FIELDS if k in tool}})
    return converted


def chat_answer(data: object) -> ModelAnswer:
    """A Chat Completions answer (the decoded body) as Responses-shaped items: the first choice's text (and
    refusal) as an assistant message, then each tool call as a `function_call` with the call's id; its usage
    beside them. A malformed ModelCallError when the answer is cut short (`finish_reason` length or
    content_filter), holds nothing, or a tool call lacks its id, name or arguments string."""
    if not isinstance(data, dict):
        raise ModelCallError("malformed", f"response body is a JSON {json_type(data)}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        got = "an empty list" if choices == [] else f"a JSON {json_type(choices)}"
        raise ModelCallError("malformed", f"response 'choices' is {got}, not a list of at least one choice")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ModelCallError("malformed", f"choice 1 is a JSON {json_type(choice)}, not an object")
    finish = choice.get("finish_reason")
    if finish in _CUT_SHORT:
        raise ModelCallError("malformed", f"response finish_reason is {finish!r}, not a finished answer")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelCallError("malformed", f"choice 1 'message' is a JSON {json_type(message)}, not an object")
    content, refusal, calls = message.get("content"), message.get("refusal"), message.get("tool_calls")
    if content is not None and not isinstance(content, str):
        raise ModelCallError("malformed", f"message 'content' is a JSON {json_type(content)}, not a string")
    if calls is None:
        calls = []
    if not isinstance(calls, list):
        raise ModelCallError("malformed", f"message 'tool_calls' is a JSON {json_type(calls)}, not a list")

    parts: list[dict[str, Any]] = []
    # Servers often send an empty text beside tool calls: no message for it then.
    if content is not None and (content.strip() or not calls):
        parts.append({"type": "output_text", "text": content, "annotations": []})
    if isinstance(refusal, str) and refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    items: list[ConversationItem] = []
    if parts:
        items.append(MessageItem(role="assistant", content=parts))
    items += [_function_call(index, call) for index, call in enumerate(calls, start=1)]
    if not items:
        raise ModelCallError("malformed", "the answer has neither a text nor a tool call")
    return ModelAnswer(items, usage=token_usage(data.get("usage"), "prompt_tokens", "completion_tokens"))


def _function_call(index: int, call: object) -> FunctionCallItem:
    where = f"tool call {index}"
    if not isinstance(call, dict):
        raise ModelCallError("malformed", f"{where} is a JSON {json_type(call)}, not an object")
    kind = call.get("type", "function")
    if kind != "function":
        raise ModelCallError("malformed", f"{where} is of type {kind!r}, not 'function'")
    function = call.get("function")
    if not isinstance(function, dict):
        raise ModelCallError("malformed", f"{where}: 'function' is a JSON {json_type(function)}, not an object")
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
    # The id pairs the call with its output next turn, so it cannot be empty; arguments may be "".
    for field, value, may_be_empty in (("id", call_id, False), ("name", name, False), ("arguments", arguments, True)):
        if isinstance(value, str) and (value or may_be_empty):
            continue
        got = "missing" if value is None else "empty" if value == "" else f"a JSON {json_type(value)}"
        wanted = "a string" if may_be_empty else "a non-empty string"
        raise ModelCallError("malformed", f"{where}: '{field}' must be {wanted}, got {got}")
    return FunctionCallItem(call_id=call_id, name=name, arguments=arguments)


# --- I/O: the endpoint ----------------------------------------------------------------------------------------


class ChatCompletionsClient(OpenAIEndpoint):
    """One Chat Completions endpoint (`POST {base_url}/chat/completions`) through the official SDK. Holds the
    API key; nothing it raises or logs contains that key."""

    # extra_body holds server-specific options ({"temperature": 0}, vLLM's {"top_k": 20}, ...): opt-in.
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
        """One model call: the answer as Responses-shaped items (and its usage), or a ModelCallError. `model`
        overrides the client's default model for this call; streamed, the text goes to `on_text` as it comes."""
        model_name = model or self.model
        messages = chat_messages(instructions, conversation)
        logger.debug("model request", extra={"api": "chat", "model": model_name, "messages": len(messages)})
        # No tools: neither `tools` nor `parallel_tool_calls` (OpenAI refuses the second without the first).
        offered = chat_tools(tools)
        call: dict[str, Any] = {
            "model": model_name,
            "messages": cast("list[ChatCompletionMessageParam]", messages),
            "tools": cast("list[ChatCompletionToolUnionParam]", offered) if offered else omit,
            "parallel_tool_calls": True if offered else omit,
            "extra_body": self._extra_body or None,
        }
        if self.stream:
            # Usage comes in a last chunk of its own, and only when asked for.
            streamed = self.client.chat.completions.with_streaming_response.create(
                **call, stream=True, stream_options={"include_usage": True}
            )
            body = await self._streamed_completion(streamed, on_text)
        else:
            body = await self._answer_body(self.client.chat.completions.with_raw_response.create(**call))
        answer = chat_answer(body)
        answer.model = model_name  # the name the worker's price table knows it by
        return answer

    async def _streamed_completion(self, call: Any, on_text: TextSink | None) -> object:
        """Read a streamed completion: each piece of text to `on_text`, the chunks put together (ChatStream)
        into the completion `chat_answer` reads. A stream that ends before its choice has a finish reason was
        cut: temporary."""
        stream = ChatStream()
        async with contextlib.aclosing(self._stream_data(call)) as chunks:
            async for chunk in chunks:
                text = stream.add(chunk)
                if text and on_text is not None:
                    await on_text(text)
        return stream.completion()


class ChatStream:
    """Pure: the chunks of a streamed Chat Completions answer put together into the answer's JSON, as a call
    without streaming gets it (the first choice only): its text and refusal, each tool call by its index (id,
    name, and its arguments joined in order), the finish reason and the usage of the last chunk. A chunk that
    is not an object, or a choice's delta that is not one, is malformed."""

    def __init__(self) -> None:
        self._head: dict[str, Any] = {}
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: object = None
        self._chunks = 0

    def add(self, chunk: object) -> str | None:
        """Take one chunk; the text it adds, if any."""
        if not isinstance(chunk, dict):
            raise ModelCallError("malformed", f"a stream chunk is a JSON {json_type(chunk)}, not an object")
        self._chunks += 1
        for key in ("id", "created", "model"):
            self._head.setdefault(key, chunk.get(key))
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        choices = chunk.get("choices") or []
        first = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
        if first is None:
            return None
        if first.get("finish_reason"):
            self._finish = first["finish_reason"]
        delta = first.get("delta") or {}
        if not isinstance(delta, dict):
            raise ModelCallError("malformed", f"a stream chunk's delta is a JSON {json_type(delta)}, not an object")
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                raise ModelCallError("malformed", f"a streamed tool call is a JSON {json_type(call)}, not an object")
            self._add_call(call)
        refusal = delta.get("refusal")
        if isinstance(refusal, str):
            self._refusal.append(refusal)
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._text.append(text)
            return text
        return None

    def _add_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self._calls))
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ModelCallError("malformed", f"a streamed tool call's index is {index!r}, not a number from 0")
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise ModelCallError("malformed", f"a streamed tool call's function is a JSON {json_type(function)}")
        known = self._calls.setdefault(index, {"type": "function", "function": {"arguments": ""}})
        call_id = call.get("id")
        if call_id:
            if known.get("id") not in (None, call_id):
                # Two calls under one index: joined, one of them would be lost without a word.
                raise ModelCallError("malformed", f"two streamed tool calls have index {index}")
            known["id"] = call_id
        if isinstance(function.get("name"), str) and function["name"]:
            known["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            known["function"]["arguments"] += function["arguments"]

    def completion(self) -> dict[str, Any]:
        """The answer as a Chat Completions body; temporary when the stream ended before it was complete."""
        if self._chunks == 0:
            raise ModelCallError("temporary", "the model endpoint's stream ended before its first chunk")
        if self._finish is None:
            raise ModelCallError("temporary", "the model endpoint's stream ended before the answer was complete")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) if self._text else None}
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        choice = {"index": 0, "finish_reason": self._finish, "message": message}
        return {**self._head, "object": "chat.completion", "choices": [choice], "usage": self._usage}


class ChatCompletionsModel(OpenAIModel):
    """The model adapter for the Chat Completions API (OpenAI or an OpenAI-compatible server): the whole
    conversation as messages each turn, answers read back as Responses-shaped items, so the workflow, the
    history and the other adapters see the same items whichever API a worker uses."""

    def __init__(self, client: ChatCompletionsClient) -> None:
        super().__init__(client)
