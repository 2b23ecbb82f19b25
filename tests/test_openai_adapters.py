"""Tests (I/O): the Responses and Chat Completions adapters, on the official `openai` SDK, against a real loopback
server speaking each wire format (answers built from the SDK's own types): answers, parallel tool calls, usage,
and each failure as the activity will see it - one request per call, the SDK's own retries off."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any, Literal

import pytest
from openai import AsyncAzureOpenAI, AsyncOpenAI
from pydantic import ValidationError

from tests.fake_openai_server import (
    FakeOpenAIServer,
    chat_completion,
    error_body,
    function_call,
    output_message,
    responses_response,
)
from toolloop._core.contracts import Actor, FunctionCallItem, FunctionCallOutputItem, MessageItem, user_message
from toolloop._models.adapter import ModelAnswer, ModelRequest, TokenUsage
from toolloop._models.chat import ChatCompletionsClient, ChatCompletionsModel
from toolloop._models.errors import ModelCallError
from toolloop._models.openai_sdk import OpenAIEndpoint, stream_error
from toolloop._models.responses import ResponsesClient, ResponsesModel
from toolloop._temporal.settings import WorkerSettings, settings_error
from toolloop._temporal.worker_factory import settings_models

Api = Literal["responses", "chat"]
API_KEY = "sk-test-SECRET-0123456789abcdef"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look one thing up.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        yield running


def endpoint(api: Api, base_url: str, **options: Any) -> ResponsesClient | ChatCompletionsClient:
    kind = ResponsesClient if api == "responses" else ChatCompletionsClient
    return kind(**{"api_key": API_KEY, "base_url": base_url, "model": "fake-model", "timeout_seconds": 5, **options})


@pytest.fixture(
    params=[("responses", True), ("chat", True), ("responses", False), ("chat", False)],
    ids=["responses-streamed", "chat-streamed", "responses-plain", "chat-plain"],
)
async def client(request: pytest.FixtureRequest, server: FakeOpenAIServer) -> AsyncIterator[OpenAIEndpoint]:
    api, stream = request.param
    async with endpoint(api, server.url, stream=stream) as opened:
        yield opened


def api_of(client: OpenAIEndpoint) -> Api:
    return "responses" if isinstance(client, ResponsesClient) else "chat"


def text_answer(api: Api, text: str, usage: tuple[int, int] = (11, 7)) -> dict[str, Any]:
    return (
        responses_response(output_message(text), usage=usage)
        if api == "responses"
        else chat_completion(text, usage=usage)
    )


def calls_answer(api: Api, *calls: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    if api == "responses":
        return responses_response(*(function_call(*call) for call in calls))
    return chat_completion(None, calls)


async def ask(client: OpenAIEndpoint, conversation: list[Any] | None = None) -> ModelAnswer:
    assert isinstance(client, ResponsesClient | ChatCompletionsClient)
    return await client.respond(
        instructions="You are a test.",
        conversation=conversation if conversation is not None else [user_message("Look up a")],
        tools=TOOLS,
    )


async def failure(client: OpenAIEndpoint, server: FakeOpenAIServer) -> ModelCallError:
    before = len(server.requests)
    with pytest.raises(ModelCallError) as caught:
        await ask(client)
    assert API_KEY not in str(caught.value) and API_KEY not in repr(caught.value)
    # One request: the SDK's retries are off, Temporal's retry policy is the only one.
    assert len(server.requests) == before + 1
    return caught.value


async def test_a_text_answer_and_its_usage(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    server.reply(text_answer(api_of(client), "a is 42.", usage=(120, 9)))

    answer = await ask(client)

    [message] = answer
    assert isinstance(message, MessageItem) and message.text() == "a is 42."
    assert answer.usage == TokenUsage(input_tokens=120, output_tokens=9, total_tokens=129)


async def test_parallel_tool_calls_keep_their_ids_and_go_back_with_their_outputs(
    server: FakeOpenAIServer, client: OpenAIEndpoint
) -> None:
    api = api_of(client)
    server.reply(calls_answer(api, ("lookup", {"id": "a"}, "call_a"), ("lookup", {"id": "b"}, "call_b")))
    conversation: list[Any] = [user_message("Look up a and b")]

    calls = await ask(client, conversation)

    assert [(c.call_id, c.name, c.arguments) for c in calls if isinstance(c, FunctionCallItem)] == [
        ("call_a", "lookup", '{"id": "a"}'),
        ("call_b", "lookup", '{"id": "b"}'),
    ]
    conversation += [*calls, *(FunctionCallOutputItem(call_id=c, output=f'{{"{c}":1}}') for c in ("call_a", "call_b"))]
    await ask(client, conversation)

    sent = server.requests[-1].body
    if api == "responses":
        assert [(i["type"], i["call_id"]) for i in sent["input"][1:]] == [
            ("function_call", "call_a"),
            ("function_call", "call_b"),
            ("function_call_output", "call_a"),
            ("function_call_output", "call_b"),
        ]
    else:
        [_, _, assistant, *outputs] = sent["messages"]
        assert [c["id"] for c in assistant["tool_calls"]] == ["call_a", "call_b"]
        assert outputs == [
            {"role": "tool", "tool_call_id": "call_a", "content": '{"call_a":1}'},
            {"role": "tool", "tool_call_id": "call_b", "content": '{"call_b":1}'},
        ]


async def test_the_request_carries_model_instructions_tools_key_and_extra_headers(server: FakeOpenAIServer) -> None:
    for api in ("responses", "chat"):
        headers = {"X-Title": "toolloop", "X-Gateway-Key": "gw-SECRET-abcdef"}
        async with endpoint(api, server.url, extra_headers=headers) as client:
            await ask(client)
        sent = server.requests[-1]
        assert sent.headers["authorization"] == f"Bearer {API_KEY}"
        assert (sent.headers["x-title"], sent.headers["x-gateway-key"]) == ("toolloop", "gw-SECRET-abcdef")
        assert sent.body["model"] == "fake-model" and sent.body["parallel_tool_calls"] is True
        if api == "responses":
            assert sent.path == "/v1/responses"
            assert sent.body["instructions"] == "You are a test." and sent.body["tools"] == TOOLS
            assert sent.body["input"] == [{"type": "message", "role": "user", "content": "Look up a"}]
        else:
            assert sent.path == "/v1/chat/completions"
            assert sent.body["messages"] == [
                {"role": "system", "content": "You are a test."},
                {"role": "user", "content": "Look up a"},
            ]
            assert [t["function"]["name"] for t in sent.body["tools"]] == ["lookup"]


async def test_a_chat_call_without_tools_sends_neither_tools_nor_parallel_tool_calls(server: FakeOpenAIServer) -> None:
    async with ChatCompletionsClient(api_key=API_KEY, base_url=server.url, model="m") as client:
        await client.respond(instructions="", conversation=[user_message("hi")], tools=[], model="other-model")
    sent = server.requests[-1].body
    assert "tools" not in sent and "parallel_tool_calls" not in sent and sent["model"] == "other-model"


async def test_429_with_retry_after_in_seconds_is_temporary(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    server.reply(error_body("Rate limit reached"), status=429, headers={"Retry-After": "2"})

    error = await failure(client, server)

    assert (error.kind, error.retry_after_seconds) == ("temporary", 2.0)
    assert error.message == "model endpoint answered HTTP 429: Rate limit reached"


async def test_429_with_retry_after_as_a_date_is_temporary(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    server.reply(error_body("Rate limit reached"), status=429, headers={"Retry-After": later})

    error = await failure(client, server)

    assert error.kind == "temporary"
    assert error.retry_after_seconds is not None and 30 < error.retry_after_seconds <= 60


async def test_500_is_temporary(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    server.reply(error_body("The server had an error", kind="server_error"), status=500)

    error = await failure(client, server)

    assert (error.kind, error.retry_after_seconds) == ("temporary", None)
    assert "HTTP 500" in error.message


async def test_no_answer_within_the_timeout_is_temporary(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    # The server holds the request until it stops: only the client's own timeout ends the call.
    server.hold_next()
    async with endpoint(api_of(client), server.url, timeout_seconds=0.5) as impatient:
        error = await failure(impatient, server)

    assert error.kind == "temporary"
    assert error.message == "the model endpoint did not answer within 0.5 s (ReadTimeout)"


async def test_a_context_window_exceeded_is_rejected(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    server.reply(error_body(message, code="context_length_exceeded"), status=400)

    error = await failure(client, server)

    assert error.kind == "rejected"
    assert error.message == f"the conversation no longer fits the model's context window (HTTP 400: {message})"


async def test_a_401_echoing_the_key_is_rejected_and_redacted(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    server.reply(error_body(f"Incorrect API key provided: {API_KEY}", code="invalid_api_key"), status=401)

    error = await failure(client, server)

    assert error.kind == "rejected"
    assert error.message == "model endpoint rejected the request: HTTP 401: Incorrect API key provided: [redacted]"


async def test_an_extra_headers_secret_echoed_back_is_redacted(server: FakeOpenAIServer) -> None:
    async with endpoint("chat", server.url, extra_headers={"X-Gateway-Key": "gw-SECRET-abcdef"}) as client:
        server.reply(error_body("unknown gateway key gw-SECRET-abcdef"), status=403)
        error = await failure(client, server)
    assert error.message == "model endpoint rejected the request: HTTP 403: unknown gateway key [redacted]"


@pytest.mark.parametrize("body", ["<html>502 Bad Gateway</html>", '{"choices": [', ""])
async def test_a_garbage_body_is_malformed(server: FakeOpenAIServer, client: OpenAIEndpoint, body: str) -> None:
    server.reply(body)

    error = await failure(client, server)

    assert error.kind == "malformed"
    if client.stream:
        assert error.message.startswith("a streamed call was answered with application/json, not an event stream")
        assert error.message.endswith("an endpoint that cannot stream needs streaming off (OPENAI_STREAM=false)")
    else:
        assert error.message.startswith("response body is not JSON")


async def test_a_well_formed_body_of_the_wrong_shape_is_malformed(
    server: FakeOpenAIServer, client: OpenAIEndpoint
) -> None:
    server.reply({"id": "x", "object": "list", "data": []})

    error = await failure(client, server)

    assert error.kind == "malformed"
    if client.stream:
        # A streamed call answered with a plain JSON body: the endpoint does not stream.
        assert "not an event stream" in error.message
        return
    assert (
        error.message
        == {
            "responses": "response status is None, not 'completed'",
            "chat": "response 'choices' is a JSON null, not a list of at least one choice",
        }[api_of(client)]
    )


async def test_an_answer_cut_short_is_malformed(server: FakeOpenAIServer, client: OpenAIEndpoint) -> None:
    if api_of(client) == "responses":
        server.reply(
            responses_response(
                output_message("half an ans"), status="incomplete", incomplete_reason="max_output_tokens"
            )
        )
    else:
        server.reply(chat_completion("half an ans", finish_reason="length"))

    error = await failure(client, server)

    assert error.kind == "malformed"
    assert (
        error.message
        == {
            "responses": "response status is 'incomplete' (max_output_tokens), not 'completed'",
            "chat": "response finish_reason is 'length', not a finished answer",
        }[api_of(client)]
    )


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_connection_refused_is_temporary(api: Api) -> None:
    # A bound socket that never listens: connections to it are refused for as long as we hold it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        async with endpoint(api, f"http://127.0.0.1:{sock.getsockname()[1]}/v1") as client:
            with pytest.raises(ModelCallError) as caught:
                await ask(client)
    assert caught.value.kind == "temporary"
    assert caught.value.message.startswith("could not reach the model endpoint (ConnectError: ")


async def test_a_client_of_your_own_is_used_without_its_retries(server: FakeOpenAIServer) -> None:
    mine = AsyncOpenAI(api_key=API_KEY, base_url=server.url, max_retries=5)
    async with mine:
        async with ChatCompletionsClient(openai_client=mine, model="fake-model") as client:
            server.reply(error_body("busy"), status=503)
            error = await failure(client, server)
            assert error.kind == "temporary"
        # Ours to close, not the adapter's: the client still works.
        assert not mine.is_closed()


async def test_an_azure_client_reaches_its_deployment(server: FakeOpenAIServer) -> None:
    azure = AsyncAzureOpenAI(api_key=API_KEY, azure_endpoint=server.root_url, api_version="2024-10-21")
    async with azure, ChatCompletionsClient(openai_client=azure, model="my-deployment") as client:
        server.reply(chat_completion("from Azure"))
        [message] = await ask(client)

    assert isinstance(message, MessageItem) and message.text() == "from Azure"
    sent = server.requests[-1]
    assert sent.path == "/openai/deployments/my-deployment/chat/completions"
    assert sent.query == "api-version=2024-10-21" and sent.headers["api-key"] == API_KEY


def test_bad_configuration_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="api_key is empty"):
        ChatCompletionsClient(api_key="", model="m")
    with pytest.raises(ValueError, match="must start with http"):
        ResponsesClient(api_key=API_KEY, model="m", base_url="localhost:8000/v1")
    with pytest.raises(ValueError, match="may not set"):
        ChatCompletionsClient(api_key=API_KEY, model="m", extra_body={"messages": []})
    assert API_KEY not in repr(ResponsesClient(api_key=API_KEY, model="m"))


@pytest.mark.parametrize(("api", "adapter"), [("responses", ResponsesModel), ("chat", ChatCompletionsModel)])
async def test_the_workers_settings_choose_the_api_and_configure_the_endpoint(
    server: FakeOpenAIServer, api: Api, adapter: type[Any]
) -> None:
    settings = WorkerSettings.model_validate(
        {
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_BASE_URL": server.url,
            "OPENAI_MODEL": "configured-model",
            "OPENAI_API": api,
            "OPENAI_EXTRA_HEADERS": '{"X-Gateway-Key": "gw-SECRET-abcdef"}',
            "OPENAI_TIMEOUT_SECONDS": "7.5",
        }
    )
    assert "gw-SECRET" not in repr(settings)
    async with settings_models(settings) as models:
        model = models["openai"]
        assert isinstance(model, adapter) and model.client.timeout_seconds == 7.5
        server.reply(text_answer(api, "configured"))
        [message] = await model.respond(
            ModelRequest(
                turn=1, conversation=[user_message("hi")], instructions="", tools=[], actor=Actor(user_id="u1")
            )
        )
    assert isinstance(message, MessageItem) and message.text() == "configured"
    sent = server.requests[-1]
    assert sent.body["model"] == "configured-model" and sent.headers["x-gateway-key"] == "gw-SECRET-abcdef"
    assert sent.path == {"responses": "/v1/responses", "chat": "/v1/chat/completions"}[api]


async def test_without_a_key_the_worker_has_no_openai_model_and_a_bad_api_is_refused() -> None:
    async with settings_models(WorkerSettings.model_validate({"OPENAI_API": "chat"})) as models:
        assert models == {}
    with pytest.raises(ValidationError) as caught:
        WorkerSettings.model_validate({"OPENAI_API": "completions"})
    assert settings_error(caught.value).startswith("OPENAI_API: Input should be 'responses' or 'chat'")


# --- streamed answers -------------------------------------------------------------------------------------------


@pytest.fixture(params=["responses", "chat"])
async def streamed(request: pytest.FixtureRequest, server: FakeOpenAIServer) -> AsyncIterator[OpenAIEndpoint]:
    async with endpoint(request.param, server.url, timeout_seconds=2) as opened:
        yield opened


async def ask_streamed(client: OpenAIEndpoint) -> tuple[ModelAnswer, list[str]]:
    pieces: list[str] = []

    async def on_text(piece: str) -> None:
        pieces.append(piece)

    assert isinstance(client, ResponsesClient | ChatCompletionsClient)
    answer = await client.respond(
        instructions="You are a test.", conversation=[user_message("Look up a")], tools=TOOLS, on_text=on_text
    )
    return answer, pieces


async def test_a_streamed_text_arrives_in_pieces_and_the_answer_is_the_whole(
    server: FakeOpenAIServer, streamed: OpenAIEndpoint
) -> None:
    text = "The order A100 shipped on Monday and arrives on Thursday."
    server.reply(text_answer(api_of(streamed), text, usage=(120, 9)))

    answer, pieces = await ask_streamed(streamed)

    sent = server.requests[-1].body
    assert sent["stream"] is True
    if api_of(streamed) == "chat":
        assert sent["stream_options"] == {"include_usage": True}
    assert len(pieces) == len(text) // 4 + 1 and "".join(pieces) == text
    assert [item.model_dump(exclude_none=True)["content"][0]["text"] for item in answer] == [text]
    # The usage the stream's last event (or chunk) carries.
    assert answer.usage == TokenUsage(input_tokens=120, output_tokens=9, total_tokens=129)


async def test_streamed_call_arguments_are_taken_whole_from_the_finished_answer(
    server: FakeOpenAIServer, streamed: OpenAIEndpoint
) -> None:
    arguments = {"id": "a-rather-long-identifier-" + "x" * 40}
    server.reply(calls_answer(api_of(streamed), ("lookup", arguments, "call_1"), ("lookup", {"id": "b"}, "call_2")))

    answer, pieces = await ask_streamed(streamed)

    # Arguments in many chunks never reach the text sink, and each call has them whole.
    assert pieces == []
    calls = [item for item in answer if isinstance(item, FunctionCallItem)]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_1", "lookup", json.dumps(arguments)),
        ("call_2", "lookup", json.dumps({"id": "b"})),
    ]


@pytest.mark.parametrize("fault", ["cut", "garbage", "stall"])
async def test_a_stream_broken_in_the_middle_of_a_calls_arguments_is_temporary(
    server: FakeOpenAIServer, streamed: OpenAIEndpoint, fault: str
) -> None:
    # Text first, then a call whose arguments are cut after a few pieces.
    if api_of(streamed) == "responses":
        answer = responses_response(output_message("Looking it up."), function_call("lookup", {"id": "abcdefgh"}, "c1"))
        fault_after = 2 + 4 + 1 + 2  # created, the message and its 4 pieces, the call, 2 pieces of its arguments
    else:
        answer = chat_completion("Looking it up.", [("lookup", {"id": "abcdefgh"}, "c1")])
        fault_after = 1 + 4 + 1 + 2  # the role, 4 pieces of text, the call's name, 2 pieces of its arguments
    server.reply(answer, fault=fault, fault_after=fault_after)

    with pytest.raises(ModelCallError) as caught:
        await ask_streamed(streamed)

    assert caught.value.kind == "temporary"
    expected = {
        "cut": "the model endpoint's stream broke off",
        "garbage": "the model endpoint's stream carried a chunk that is not JSON",
        "stall": "the model endpoint did not answer within 2 s",
    }[fault]
    assert caught.value.message.startswith(expected)


async def test_a_stream_that_ends_early_without_its_last_event_is_temporary(
    server: FakeOpenAIServer, streamed: OpenAIEndpoint
) -> None:
    # The server closes the stream cleanly (no cut) after a few events: the answer never completed.
    server.reply(text_answer(api_of(streamed), "a long enough text"), fault="end", fault_after=3)
    with pytest.raises(ModelCallError) as caught:
        await ask_streamed(streamed)
    assert caught.value.kind == "temporary"
    assert caught.value.message in (
        "the model endpoint's stream ended before the response was complete",
        "the model endpoint's stream ended before the answer was complete",
    )


async def test_an_error_the_provider_sends_in_the_middle_of_a_stream_is_temporary(
    server: FakeOpenAIServer, streamed: OpenAIEndpoint
) -> None:
    server.reply(text_answer(api_of(streamed), "an answer the server gives up on"), fault="error", fault_after=3)
    with pytest.raises(ModelCallError) as caught:
        await ask_streamed(streamed)
    assert caught.value.kind == "temporary"
    assert caught.value.message == (
        "the model endpoint's stream reported an error: The server had an error while processing your request."
    )


async def test_a_streamed_response_that_failed_is_temporary(server: FakeOpenAIServer) -> None:
    async with endpoint("responses", server.url) as client:
        failed = responses_response(output_message("half"), status="failed")
        server.reply(failed)
        with pytest.raises(ModelCallError) as caught:
            await ask_streamed(client)
    assert caught.value.kind == "temporary"
    assert caught.value.message.startswith("the model endpoint failed the response")


async def test_streamed_calls_reuse_one_connection(server: FakeOpenAIServer, streamed: OpenAIEndpoint) -> None:
    # Each answer is read to its end (or briefly drained): the connection goes back to the pool, not closed.
    for text in ("first answer", "second answer", "third answer"):
        server.reply(text_answer(api_of(streamed), text))
        answer, _ = await ask_streamed(streamed)
        assert answer[0].model_dump()["content"][0]["text"] == text
    peers = {r.peer for r in server.requests[-3:]}
    assert len(peers) == 1, peers


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        ({"message": "The server had an error.", "type": "server_error"}, "temporary", "stream reported an error"),
        ({"message": "overloaded", "code": 503}, "temporary", "stream reported an error"),
        ({"message": "This model's maximum context length is 8192 tokens.", "code": 400}, "rejected", "context window"),
        ({"message": "bad tool schema", "type": "BadRequestError", "code": 400}, "rejected", "rejected the request"),
        ({"message": "slow down", "code": "429"}, "temporary", "stream reported an error"),
        ("upstream went away", "temporary", "upstream went away"),
        # A provider's own code for a request that fails the same way every time: not worth 5 paid attempts.
        ({"message": "Invalid prompt.", "code": "invalid_prompt"}, "rejected", "rejected the request"),
        ({"message": "Image policy.", "code": "image_content_policy_violation"}, "rejected", "rejected the request"),
        ({"message": "Rate limit reached.", "code": "rate_limit_exceeded"}, "temporary", "stream reported an error"),
        ({"message": "The server had an error.", "code": "server_error"}, "temporary", "stream reported an error"),
        # A gateway's own name for "slow down" is not the request's fault.
        ({"message": "Busy.", "code": "too_many_requests"}, "temporary", "stream reported an error"),
    ],
)
def test_an_error_inside_a_stream_is_judged_as_it_would_be_before_one(error: object, kind: str, words: str) -> None:
    found = stream_error(error)
    assert found.kind == kind and words in found.message
