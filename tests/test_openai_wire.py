"""Pure: the OpenAI adapters' logic without a server - Responses-shaped items to chat messages and back (call ids
kept), answers read into items and usage, and every failure classified (retry or not, how long to wait, what
the message may say)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from tests.fake_openai_server import (
    chat_completion,
    error_body,
    function_call,
    output_message,
    reasoning,
    responses_response,
)
from toolloop._core.contracts import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
    item_to_wire,
    user_message,
)
from toolloop._models.adapter import ModelAnswer, TokenUsage
from toolloop._models.chat import ChatStream, chat_answer, chat_messages, chat_tools
from toolloop._models.errors import ModelCallError
from toolloop._models.openai_sdk import (
    decode_body,
    error_detail,
    is_context_length_error,
    retry_after_seconds,
    status_failure,
    token_usage,
)
from toolloop._models.responses import responses_answer

KEY = "sk-test-SECRET-0123456789abcdef"
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look one thing up.",
    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
    "strict": True,
}


def malformed(data: object, reader: Any) -> str:
    with pytest.raises(ModelCallError) as caught:
        reader(data)
    assert caught.value.kind == "malformed"
    return caught.value.message


# --- to chat messages ----------------------------------------------------------------------------------------


def test_a_conversation_becomes_chat_messages_with_every_call_id_kept() -> None:
    conversation = [
        user_message("Look up a and b"),
        OtherItem.model_validate({"type": "reasoning", "id": "rs_1", "summary": []}),
        MessageItem.model_validate({"role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]}),
        FunctionCallItem(call_id="call_a", name="lookup", arguments='{"id":"a"}'),
        FunctionCallItem(call_id="call_b", name="lookup", arguments='{"id":"b"}'),
        FunctionCallOutputItem(call_id="call_a", output='{"ok":true}'),
        FunctionCallOutputItem(call_id="call_b", output='{"ok":false}'),
        FunctionCallItem(call_id="call_c", name="lookup", arguments='{"id":"c"}'),
        FunctionCallOutputItem(call_id="call_c", output="{}"),
        MessageItem.model_validate({"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}),
        user_message("Thanks"),
    ]

    assert chat_messages("Be brief.", conversation) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Look up a and b"},
        # The reasoning item has no chat form; the text and both calls of the turn are one message.
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"id":"a"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": '{"id":"b"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"ok":true}'},
        {"role": "tool", "tool_call_id": "call_b", "content": '{"ok":false}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_c", "type": "function", "function": {"name": "lookup", "arguments": '{"id":"c"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "{}"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks"},
    ]


def test_no_instructions_no_system_message_and_an_empty_assistant_text_stays_a_text() -> None:
    empty = MessageItem.model_validate({"role": "assistant", "content": []})
    assert chat_messages("", [user_message("hi"), empty]) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
    ]


def test_a_refusal_goes_back_as_the_assistant_messages_refusal() -> None:
    refused = MessageItem.model_validate(
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot help with that."}]}
    )
    assert chat_messages("", [refused]) == [
        {"role": "assistant", "content": None, "refusal": "I cannot help with that."}
    ]


def test_function_tools_become_chat_tools_and_other_tools_are_refused() -> None:
    assert chat_tools([TOOL]) == [
        {
            "type": "function",
            "function": {k: TOOL[k] for k in ("name", "description", "parameters", "strict")},
        }
    ]
    with pytest.raises(ModelCallError) as caught:
        chat_tools([{"type": "web_search"}])
    assert caught.value.kind == "rejected" and "function tools only" in caught.value.message


# --- chat answers back to items ------------------------------------------------------------------------------


def test_a_chat_text_answer_is_one_assistant_message_with_its_usage() -> None:
    answer = chat_answer(chat_completion("A100 has shipped.", usage=(120, 9)))

    assert isinstance(answer, ModelAnswer)
    [message] = answer
    assert isinstance(message, MessageItem) and message.role == "assistant"
    assert message.text() == "A100 has shipped."
    assert answer.usage == TokenUsage(input_tokens=120, output_tokens=9, total_tokens=129)


def test_parallel_chat_tool_calls_become_function_calls_with_their_ids() -> None:
    answer = chat_answer(chat_completion("", [("lookup", {"id": "a"}, "call_a"), ("lookup", '{"id": "b"}', "call_b")]))

    # The empty text beside the calls is no message.
    assert [item_to_wire(i) for i in answer] == [
        {"type": "function_call", "call_id": "call_a", "name": "lookup", "arguments": '{"id": "a"}'},
        {"type": "function_call", "call_id": "call_b", "name": "lookup", "arguments": '{"id": "b"}'},
    ]


def test_text_beside_calls_comes_first_and_a_chat_round_trip_keeps_the_turn_whole() -> None:
    answer = chat_answer(chat_completion("Looking.", [("lookup", {"id": "a"}, "call_a")]))
    assert [type(i) for i in answer] == [MessageItem, FunctionCallItem]

    [_, again] = chat_messages("", [user_message("q"), *answer])
    assert again["content"] == "Looking." and [c["id"] for c in again["tool_calls"]] == ["call_a"]


def test_a_chat_answer_without_usage_has_none() -> None:
    assert chat_answer(chat_completion("ok", usage=None)).usage is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("not an object", "response body is a JSON string, not an object"),
        ({"choices": []}, "'choices' is an empty list"),
        ({"object": "chat.completion"}, "'choices' is a JSON null"),
        ({"choices": [{"finish_reason": "stop"}]}, "'message' is a JSON null"),
        (chat_completion("half an ans", finish_reason="length"), "finish_reason is 'length'"),
        (chat_completion("", finish_reason="content_filter"), "finish_reason is 'content_filter'"),
        (chat_completion(None), "neither a text nor a tool call"),
        (
            {"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": ["a"]}}]},
            "'content' is a JSON array",
        ),
    ],
)
def test_a_chat_answer_that_is_no_whole_answer_is_malformed(data: object, expected: str) -> None:
    assert expected in malformed(data, chat_answer)


def _call(**fields: Any) -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}} | fields


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            {"type": "function", "function": {"name": "f", "arguments": "{}"}},
            "'id' must be a non-empty string, got missing",
        ),
        (_call(id=""), "'id' must be a non-empty string, got empty"),
        (_call(function={"arguments": "{}"}), "'name' must be a non-empty string, got missing"),
        (_call(function={"name": "f", "arguments": {"a": 1}}), "'arguments' must be a string, got a JSON object"),
        (_call(type="custom", custom={"name": "f", "input": "x"}), "tool call 1 is of type 'custom'"),
        (_call(function=None), "'function' is a JSON null"),
    ],
)
def test_a_tool_call_without_its_id_name_or_arguments_string_is_malformed(call: dict[str, Any], expected: str) -> None:
    data = {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [call]}}]}
    assert expected in malformed(data, chat_answer)


# --- Responses answers ----------------------------------------------------------------------------------------


def test_a_responses_answer_keeps_every_item_field_and_reads_its_usage() -> None:
    output = [
        reasoning("rs_1", "gAAAA-secret=="),
        function_call("lookup", {"id": "a"}, "call_a"),
        output_message("Hm."),
    ]
    data = responses_response(*output, usage=(50, 5))

    answer = responses_answer(data)

    assert [type(i) for i in answer] == [OtherItem, FunctionCallItem, MessageItem]
    assert [item_to_wire(i) for i in answer] == data["output"]
    assert answer.usage == TokenUsage(input_tokens=50, output_tokens=5, total_tokens=55)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("server_error", "temporary"),
        ("rate_limit_exceeded", "temporary"),
        (None, "temporary"),
        ("invalid_prompt", "rejected"),
        ("throttling_exception", "temporary"),
        (400, "rejected"),
        (429, "temporary"),
    ],
)
def test_a_failed_responses_answer_is_asked_again_unless_its_code_says_it_fails_every_time(
    code: str | int | None, kind: str
) -> None:
    data = {"status": "failed", "error": {"code": code, "message": "no"}, "output": []}
    with pytest.raises(ModelCallError) as failed:
        responses_answer(data)
    assert failed.value.kind == kind


def test_an_incomplete_responses_answer_is_malformed_and_says_why() -> None:
    data = responses_response(output_message("half"), status="incomplete", incomplete_reason="max_output_tokens")
    assert malformed(data, responses_answer) == "response status is 'incomplete' (max_output_tokens), not 'completed'"


@pytest.mark.parametrize(
    "usage",
    [
        None,
        "lots",
        {"input_tokens": "5", "output_tokens": 1},
        {"input_tokens": -1, "output_tokens": 1},
        {"input_tokens": True, "output_tokens": 1},
    ],
)
def test_unreadable_usage_is_none_never_a_failure(usage: object) -> None:
    assert token_usage(usage, "input_tokens", "output_tokens") is None


def test_usage_without_a_total_adds_it_up() -> None:
    assert token_usage({"prompt_tokens": 3, "completion_tokens": 4}, "prompt_tokens", "completion_tokens") == (
        TokenUsage(input_tokens=3, output_tokens=4, total_tokens=7)
    )


# --- failures -------------------------------------------------------------------------------------------------


def test_429_is_temporary_with_the_servers_retry_after_in_seconds() -> None:
    error = status_failure(429, {"retry-after": "2"}, error_body("Rate limit reached")["error"])
    assert (error.kind, error.retry_after_seconds) == ("temporary", 2.0)
    assert error.message == "model endpoint answered HTTP 429: Rate limit reached"


def test_retry_after_as_an_http_date_and_openais_milliseconds() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert retry_after_seconds({"retry-after": format_datetime(now + timedelta(seconds=30), usegmt=True)}, now) == 30
    # A date already past: retry now, not never.
    assert retry_after_seconds({"retry-after": format_datetime(now - timedelta(seconds=30), usegmt=True)}, now) == 0
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    for unreadable in ({}, {"retry-after": "soon"}, {"retry-after": "nan"}, {"retry-after": "inf"}):
        assert retry_after_seconds(unreadable) is None


@pytest.mark.parametrize("status", [408, 500, 502, 503, 529])
def test_timeouts_and_server_errors_are_temporary(status: int) -> None:
    error = status_failure(status, {}, "upstream busy")
    assert (error.kind, error.retry_after_seconds) == ("temporary", None)
    assert error.message == f"model endpoint answered HTTP {status}: upstream busy"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_other_client_errors_are_rejected(status: int) -> None:
    error = status_failure(
        status, {"retry-after": "5"}, {"message": "bad tool schema", "type": "invalid_request_error"}
    )
    assert (error.kind, error.retry_after_seconds) == ("rejected", None)
    assert error.message == f"model endpoint rejected the request: HTTP {status}: bad tool schema"


@pytest.mark.parametrize(
    "body",
    [
        # OpenAI (Chat Completions and Responses)
        error_body("This model's maximum context length is 8192 tokens. However, ...", code="context_length_exceeded")[
            "error"
        ],
        {"message": "Your input exceeds the context window of this model.", "type": "invalid_request_error"},
        # vLLM
        {"object": "error", "message": "This model's maximum context length is 4096 tokens.", "code": 400},
        # llama.cpp's server
        {"code": 400, "message": "the request exceeds the available context size", "type": "exceed_context_size_error"},
        # an Anthropic-compatible gateway, and a server whose error is only text
        {"message": "prompt is too long: 210000 tokens > 200000 maximum"},
        "context length exceeded",
    ],
)
def test_a_context_window_exceeded_is_rejected_with_a_clear_line(body: object) -> None:
    assert is_context_length_error(body)
    error = status_failure(400, {}, body)
    assert error.kind == "rejected" and error.retry_after_seconds is None
    assert error.message.startswith("the conversation no longer fits the model's context window (HTTP 400: ")
    assert "\n" not in error.message


def test_an_ordinary_bad_request_is_no_context_error() -> None:
    assert not is_context_length_error({"message": "Invalid schema for function 'lookup'", "code": "invalid_schema"})
    assert not is_context_length_error(None)


def test_an_error_message_never_holds_the_key_or_more_than_a_slice_of_the_body() -> None:
    echoed = status_failure(401, {}, {"message": f"Incorrect API key provided: {KEY}"}, secrets=[KEY])
    assert KEY not in echoed.message and "Incorrect API key provided: [redacted]" in echoed.message
    long = status_failure(503, {}, "x" * 5000)
    assert len(long.message) < 400
    # A key at the cut is redacted before it is cut: no half of it survives.
    cut = error_detail("y" * 290 + KEY, secrets=[KEY])
    assert KEY[:8] not in cut


def test_a_body_that_is_not_json_is_malformed_quoting_its_start() -> None:
    with pytest.raises(ModelCallError) as caught:
        decode_body(b"<html>Bad gateway " + KEY.encode() + b"</html>" + b"x" * 500, secrets=[KEY])
    assert caught.value.kind == "malformed"
    assert caught.value.message.startswith("response body is not JSON: '<html>Bad gateway [redacted]")
    assert len(caught.value.message) < 120
    assert decode_body(json.dumps({"a": 1}).encode()) == {"a": 1}


# --- a streamed Chat Completions answer, put together ------------------------------------------------------


def test_streamed_chunks_make_the_answer_a_call_without_streaming_gets() -> None:
    # The shape OpenAI and vLLM stream: the role, text pieces, each call's id and name, then its arguments in
    # pieces (two calls interleaved by index), the finish reason, and the usage alone in a last chunk.
    chunks: list[dict[str, Any]] = [
        {
            "id": "c1",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        },
        {"choices": [{"index": 0, "delta": {"content": "Looking "}}]},
        {"choices": [{"index": 0, "delta": {"content": "up."}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": ""},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": '{"id"'},
                            }
                        ]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"id": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"a"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": ': "b"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}},
    ]
    stream = ChatStream()
    texts = [stream.add(chunk) for chunk in chunks]
    assert [t for t in texts if t] == ["Looking ", "up."]

    answer = chat_answer(stream.completion())

    assert [(type(i).__name__, getattr(i, "call_id", None), getattr(i, "arguments", None)) for i in answer] == [
        ("MessageItem", None, None),
        ("FunctionCallItem", "call_a", '{"id": "a"}'),
        ("FunctionCallItem", "call_b", '{"id": "b"}'),
    ]
    assert answer.usage is not None and (answer.usage.input_tokens, answer.usage.output_tokens) == (20, 9)


def test_a_stream_without_its_finish_reason_or_any_chunk_is_temporary_and_a_bad_chunk_malformed() -> None:
    stream = ChatStream()
    with pytest.raises(ModelCallError, match="before its first chunk") as nothing:
        stream.completion()
    stream.add(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "x", "arguments": '{"a'}}]},
                }
            ]
        }
    )
    with pytest.raises(ModelCallError, match="before the answer was complete") as cut:
        stream.completion()
    assert nothing.value.kind == cut.value.kind == "temporary"
    with pytest.raises(ModelCallError) as bad:
        ChatStream().add(["not", "an", "object"])
    assert bad.value.kind == "malformed"
    # Cut short by length: put together, then refused as an answer like any other answer cut short.
    short = ChatStream()
    short.add({"choices": [{"index": 0, "delta": {"content": "half an ans"}, "finish_reason": "length"}]})
    with pytest.raises(ModelCallError, match="finish_reason is 'length'"):
        chat_answer(short.completion())


@pytest.mark.parametrize(
    ("call", "words"),
    [
        ({"index": None, "id": "c", "function": {"name": "x", "arguments": "{}"}}, "index is None"),
        ({"index": "1", "id": "c", "function": {"name": "x"}}, "index is '1'"),
        ({"index": 0, "id": "c", "function": "x"}, "function is a JSON string"),
    ],
)
def test_a_streamed_tool_call_that_cannot_be_put_together_is_malformed(call: dict[str, Any], words: str) -> None:
    with pytest.raises(ModelCallError, match=words) as caught:
        ChatStream().add({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    assert caught.value.kind == "malformed"


def test_two_streamed_tool_calls_under_one_index_are_malformed_not_joined() -> None:
    stream = ChatStream()
    first = {"index": 0, "id": "call_a", "function": {"name": "lookup", "arguments": ""}}
    stream.add({"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
    second = {"index": 0, "id": "call_b", "function": {"name": "lookup", "arguments": '{"id": "b"}'}}
    with pytest.raises(ModelCallError, match="two streamed tool calls have index 0"):
        stream.add({"choices": [{"index": 0, "delta": {"tool_calls": [second]}}]})
