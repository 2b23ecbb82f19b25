"""Tests (I/O): the Responses adapter against a real loopback HTTP server - round trips and failure kinds of a
plain (not streamed) answer: the clients here turn streaming off (a streamed answer's own tests are in
tests/test_openai_adapters.py)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from tests.fake_responses_server import (
    FakeResponsesProcess,
    FakeResponsesServer,
    completed_response,
    function_call_item,
    message_item,
    reasoning_item,
)
from toolloop._core.contracts import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
    item_to_wire,
    user_message,
)
from toolloop._models.errors import ModelCallError
from toolloop._models.responses import ResponsesClient

pytestmark = pytest.mark.asyncio

API_KEY = "sk-test-SECRET-0123456789abcdef"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_order_status",
        "description": "Status of one order.",
        "parameters": {
            "type": "object",
            "properties": {"orderId": {"type": "string"}},
            "required": ["orderId"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeResponsesServer]:
    with FakeResponsesServer() as running:
        yield running


@pytest_asyncio.fixture
async def client(server: FakeResponsesServer) -> AsyncIterator[ResponsesClient]:
    server.reset()
    async with ResponsesClient(
        api_key=API_KEY, base_url=server.url, model="fake-model", timeout_seconds=5, stream=False
    ) as c:
        yield c


async def call(client: ResponsesClient, conversation: list[Any] | None = None) -> list[Any]:
    return await client.respond(
        instructions="You are a test.",
        conversation=conversation if conversation is not None else [user_message("Where is my order A100?")],
        tools=TOOLS,
    )


async def failure(client: ResponsesClient) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        await call(client)
    assert API_KEY not in caught.value.message
    assert API_KEY not in str(caught.value) and API_KEY not in repr(caught.value)
    return caught.value


async def test_completed_response_items_round_trip_with_every_field(
    server: FakeResponsesServer, client: ResponsesClient
) -> None:
    output = [
        reasoning_item("rs_1", "gAAAA-secret-reasoning=="),
        function_call_item("get_order_status", {"orderId": "A100"}, call_id="call_a"),
        message_item("Looking it up."),
    ]
    server.enqueue(body=completed_response(output))

    items = await call(client)

    assert [type(i) for i in items] == [OtherItem, FunctionCallItem, MessageItem]
    assert [item_to_wire(i) for i in items] == output


async def test_request_carries_model_tools_auth_and_input(server: FakeResponsesServer, client: ResponsesClient) -> None:
    await call(client)

    (sent,) = server.requests
    assert sent["model"] == "fake-model"
    assert sent["instructions"] == "You are a test."
    assert sent["tools"] == TOOLS
    assert sent["parallel_tool_calls"] is True
    assert sent["input"] == [{"type": "message", "role": "user", "content": "Where is my order A100?"}]
    assert server.request_headers[0]["authorization"] == f"Bearer {API_KEY}"


async def test_model_can_be_overridden_per_call(server: FakeResponsesServer, client: ResponsesClient) -> None:
    await client.respond(instructions="i", conversation=[user_message("hi")], tools=[], model="other-model")

    assert server.requests[0]["model"] == "other-model"


async def test_reasoning_and_calls_are_sent_back_unchanged(
    server: FakeResponsesServer, client: ResponsesClient
) -> None:
    first_output = [
        reasoning_item("rs_42", "gAAAA-opaque=="),
        function_call_item("get_order_status", {"orderId": "A100"}, call_id="call_x"),
    ]
    server.enqueue(body=completed_response(first_output))
    conversation: list[Any] = [user_message("Where is my order A100?")]
    conversation += await call(client, conversation)
    conversation.append(FunctionCallOutputItem(call_id="call_x", output='{"ok":true,"status":"shipped"}'))

    await call(client, conversation)

    second = server.requests[1]["input"]
    assert second[1:3] == first_output
    assert second[3] == {
        "type": "function_call_output",
        "call_id": "call_x",
        "output": '{"ok":true,"status":"shipped"}',
    }


async def test_429_is_temporary_with_retry_after_then_next_call_succeeds(
    server: FakeResponsesServer, client: ResponsesClient
) -> None:
    server.enqueue(status=429, body={"error": {"message": "Rate limit reached"}}, headers={"Retry-After": "2"})

    error = await failure(client)
    assert error.kind == "temporary"
    assert error.retry_after_seconds == 2
    assert "429" in error.message

    items = await call(client)
    assert isinstance(items[0], MessageItem) and items[0].text() == "fake final answer"


async def test_500_is_temporary(server: FakeResponsesServer, client: ResponsesClient) -> None:
    server.enqueue(status=500, body={"error": {"message": "The server had an error"}})

    error = await failure(client)
    assert error.kind == "temporary"
    assert error.retry_after_seconds is None


async def test_400_is_rejected_with_provider_message(server: FakeResponsesServer, client: ResponsesClient) -> None:
    server.enqueue(status=400, body={"error": {"message": "bad tool schema", "type": "invalid_request_error"}})

    error = await failure(client)
    assert error.kind == "rejected"
    assert "bad tool schema" in error.message


async def test_401_echoing_the_key_is_rejected_and_redacted(
    server: FakeResponsesServer, client: ResponsesClient
) -> None:
    server.enqueue(status=401, body={"error": {"message": f"Incorrect API key provided: {API_KEY}"}})

    error = await failure(client)
    assert error.kind == "rejected"
    assert "Incorrect API key provided" in error.message


async def test_long_error_body_is_truncated(server: FakeResponsesServer, client: ResponsesClient) -> None:
    server.enqueue(status=503, body="x" * 5000, headers={"content-type": "text/plain"})

    error = await failure(client)
    assert error.kind == "temporary"
    assert len(error.message) < 400


async def test_body_not_json_is_malformed(server: FakeResponsesServer, client: ResponsesClient) -> None:
    server.enqueue(body="not json")

    error = await failure(client)
    assert error.kind == "malformed"
    assert "not JSON" in error.message


async def test_incomplete_status_is_malformed_and_says_why(
    server: FakeResponsesServer, client: ResponsesClient
) -> None:
    server.enqueue(
        body=completed_response(
            [message_item("half an ans")], status="incomplete", incomplete_details={"reason": "max_output_tokens"}
        )
    )

    error = await failure(client)
    assert error.kind == "malformed"
    assert error.message == "response status is 'incomplete' (max_output_tokens), not 'completed'"


async def test_output_not_a_list_is_malformed(server: FakeResponsesServer, client: ResponsesClient) -> None:
    server.enqueue(body={**completed_response([]), "output": {"type": "message"}})

    error = await failure(client)
    assert error.kind == "malformed"
    assert "'output'" in error.message


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("just a string", "output item 1 is a JSON string, not an object"),
        ({"type": "function_call", "arguments": "{}", "call_id": "c1"}, "'name' must be a string, got missing"),
        (
            {"type": "function_call", "name": "f", "arguments": {"a": 1}, "call_id": "c1"},
            "'arguments' must be a string, got a JSON object",
        ),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "'call_id' must be a string, got missing"),
        ({"id": "x"}, "output item 1 has no 'type'"),
    ],
)
async def test_bad_output_item_is_malformed(
    server: FakeResponsesServer, client: ResponsesClient, item: Any, expected: str
) -> None:
    server.enqueue(body=completed_response([item]))

    error = await failure(client)
    assert error.kind == "malformed"
    assert expected in error.message


async def test_connection_refused_is_temporary() -> None:
    # A bound socket that never listens: connections to it are refused for as long as we hold it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        async with ResponsesClient(
            api_key=API_KEY, base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_seconds=5, stream=False
        ) as c:
            error = await failure(c)
    assert error.kind == "temporary"
    assert "could not reach" in error.message


async def test_read_timeout_is_temporary(server: FakeResponsesServer) -> None:
    server.reset()
    server.enqueue(delay_seconds=1.0)
    async with ResponsesClient(api_key=API_KEY, base_url=server.url, model="m", timeout_seconds=0.2, stream=False) as c:
        error = await failure(c)
    assert error.kind == "temporary"
    assert "ReadTimeout" in error.message


async def test_subprocess_server_serves_the_queue() -> None:
    with FakeResponsesProcess() as process:
        process.enqueue(body=completed_response([function_call_item("get_order_status", {"orderId": "A7"})]))
        async with ResponsesClient(
            api_key=API_KEY, base_url=process.url, model="m", timeout_seconds=5, stream=False
        ) as c:
            first = await call(c)
            second = await call(c)
        assert isinstance(first[0], FunctionCallItem)
        assert isinstance(second[0], MessageItem) and second[0].text() == "fake final answer"
        assert len(process.requests) == 2
