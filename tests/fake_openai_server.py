"""I/O (test support): a real loopback HTTP server speaking both OpenAI wire formats - `POST .../responses` and
`POST .../chat/completions` - answering from a queue, with answers built from the official SDK's own types.

    with FakeOpenAIServer() as server:
        server.reply(chat_completion(calls=[("get_ticket", {"ticketId": "T1"}, "call_1")]))
        server.reply(error_body("slow down"), status=429, headers={"Retry-After": "2"})
        server.hold_next()                     # the next request gets no answer until the server stops
        server.reply(responses_response(...), fault="cut", fault_after=3)   # streamed: cut after 3 events
        client = ChatCompletionsClient(api_key="sk-test", base_url=server.url, model="fake-model")
        ...
        assert server.requests[0].body["messages"][0] == {...}

Any path that ends in /responses or /chat/completions is served (Azure's deployment paths included). With an
empty queue a call gets a plain text answer in the format it asked in, DEFAULT_TEXT. A request that asks to stream
(`"stream": true`) gets its answer as the server-sent events that API sends, built from the SDK's own event and
chunk types: the text in pieces of STREAM_PIECE characters, each call's arguments likewise, then the whole answer
(Responses: `response.completed`; Chat Completions: the finish reason, then a usage chunk and `[DONE]`). A
reply's `fault` breaks its stream after `fault_after` events: "cut" (the connection drops), "garbage" (a chunk
that is not JSON), "stall" (nothing more until the server stops) or "end" (the body ends cleanly, the answer
unfinished); "error" sends the API's own error event and ends; "pause" holds the rest of the stream until
`resume()`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
)
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.completion_usage import PromptTokensDetails
from openai.types.responses import (
    Response as ResponsesResponse,
)
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from openai.types.shared import ErrorObject

DEFAULT_TEXT = "fake final answer"
# How many characters of text (or of a call's arguments) one streamed event carries.
STREAM_PIECE = 4
_ids = itertools.count(1)


# --- answers, built from the SDK's types -------------------------------------------------------------------


def chat_completion(
    text: str | None = None,
    calls: Sequence[tuple[str, dict[str, Any] | str, str]] = (),
    *,
    finish_reason: str | None = None,
    usage: tuple[int, int] | None = (11, 7),
    cached: int | None = None,
) -> dict[str, Any]:
    """A Chat Completions answer: `text`, and a tool call per (name, arguments, call id); `usage` is (prompt,
    completion) tokens, `cached` the prompt tokens the server says it served from its cache."""
    n = next(_ids)
    tool_calls = [
        ChatCompletionMessageFunctionToolCall(
            id=call_id,
            type="function",
            function=Function(name=name, arguments=args if isinstance(args, str) else json.dumps(args)),
        )
        for name, args, call_id in calls
    ]
    completion = ChatCompletion(
        id=f"chatcmpl-fake-{n}",
        object="chat.completion",
        created=1_700_000_000 + n,
        model="fake-model",
        choices=[
            Choice.model_validate(
                {
                    "index": 0,
                    "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
                    "message": ChatCompletionMessage(role="assistant", content=text, tool_calls=tool_calls or None),
                }
            )
        ],
        usage=None
        if usage is None
        else CompletionUsage(
            prompt_tokens=usage[0],
            completion_tokens=usage[1],
            total_tokens=sum(usage),
            prompt_tokens_details=None if cached is None else PromptTokensDetails(cached_tokens=cached),
        ),
    )
    return completion.to_dict()


def output_message(text: str, *, item_id: str = "msg_fake") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def function_call(name: str, arguments: dict[str, Any] | str, call_id: str) -> ResponseFunctionToolCall:
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ResponseFunctionToolCall(
        type="function_call", id=f"fc_{call_id}", status="completed", name=name, arguments=encoded, call_id=call_id
    )


def reasoning(item_id: str = "rs_fake", encrypted_content: str = "gAAAA-opaque==") -> ResponseReasoningItem:
    return ResponseReasoningItem(
        type="reasoning",
        id=item_id,
        summary=[Summary(type="summary_text", text="thinking about it")],
        encrypted_content=encrypted_content,
    )


def responses_response(
    *output: ResponseOutputItem,
    status: str = "completed",
    incomplete_reason: str | None = None,
    usage: tuple[int, int] | None = (11, 7),
    cached: int = 0,
) -> dict[str, Any]:
    """A Responses API answer with these output items; `usage` is (input, output) tokens, `cached` the input
    tokens served from the cache."""
    n = next(_ids)
    response = ResponsesResponse.model_validate(
        {
            "id": f"resp_fake_{n}",
            "object": "response",
            "created_at": 1_700_000_000 + n,
            "model": "fake-model",
            "status": status,
            "output": list(output),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "incomplete_details": None
            if incomplete_reason is None
            else IncompleteDetails.model_validate({"reason": incomplete_reason}),
            "usage": None
            if usage is None
            else ResponseUsage(
                input_tokens=usage[0],
                output_tokens=usage[1],
                total_tokens=sum(usage),
                input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
                output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            ),
        }
    )
    return response.to_dict()


def error_body(message: str, *, code: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An error answer's body, as OpenAI writes it: {"error": {"message", "type", "param", "code"}}."""
    return {"error": ErrorObject(message=message, type=kind, param=None, code=code).to_dict()}


def _pieces(text: str) -> list[str]:
    return [text[i : i + STREAM_PIECE] for i in range(0, len(text), STREAM_PIECE)] or [""]


def responses_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses API answer as the events a streamed call gets: `response.created`, each output item added
    and its text or arguments in pieces, then the terminal event with the whole response."""
    seq = itertools.count()
    shell = ResponsesResponse.model_validate({**response, "status": "in_progress", "output": [], "usage": None})
    events: list[Any] = [ResponseCreatedEvent(type="response.created", response=shell, sequence_number=next(seq))]
    for index, item in enumerate(response.get("output", [])):
        events.append(
            ResponseOutputItemAddedEvent.model_validate(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": item,
                    "sequence_number": next(seq),
                }
            )
        )
        if item.get("type") == "message":
            for part_index, part in enumerate(item.get("content", [])):
                for piece in _pieces(part.get("text", "")) if part.get("type") == "output_text" else []:
                    events.append(
                        ResponseTextDeltaEvent(
                            type="response.output_text.delta",
                            item_id=item.get("id", ""),
                            output_index=index,
                            content_index=part_index,
                            delta=piece,
                            logprobs=[],
                            sequence_number=next(seq),
                        )
                    )
        elif item.get("type") == "function_call":
            for piece in _pieces(item.get("arguments", "")):
                events.append(
                    ResponseFunctionCallArgumentsDeltaEvent(
                        type="response.function_call_arguments.delta",
                        item_id=item.get("id", ""),
                        output_index=index,
                        delta=piece,
                        sequence_number=next(seq),
                    )
                )
    whole = ResponsesResponse.model_validate(response)
    terminal = {"completed": ResponseCompletedEvent, "incomplete": ResponseIncompleteEvent}.get(
        response.get("status", ""), ResponseFailedEvent
    )
    events.append(
        terminal.model_validate(
            {"type": f"response.{response.get('status')}", "response": whole, "sequence_number": next(seq)}
        )
    )
    return [event.to_dict() for event in events]


def chat_chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """A Chat Completions answer as the chunks a streamed call gets: the role, the text in pieces, each tool
    call's id and name and then its arguments in pieces, the finish reason, and (when the answer has usage)
    a last chunk with no choice and the usage, as `stream_options.include_usage` asks."""
    message = completion["choices"][0]["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": piece} for piece in _pieces(message["content"])] if message.get("content") else []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            }
        )
        deltas += [
            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            for piece in _pieces(function["arguments"])
        ]
    last = len(deltas) - 1
    chunks: list[dict[str, Any]] = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": completion["choices"][0]["finish_reason"] if n == last else None,
                }
            ],
            "usage": None,
        }
        for n, delta in enumerate(deltas)
    ]
    if completion.get("usage") is not None:
        chunks.append({"choices": [], "usage": completion["usage"]})
    common = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
    }
    return [ChatCompletionChunk.model_validate({**common, **chunk}).to_dict() for chunk in chunks]


def _as_events(body: Any, chat: bool) -> list[dict[str, Any]] | None:
    """A scripted answer as stream events, or None for a body that is not an answer (sent as it is, as a
    misconfigured server or a proxy would)."""
    try:
        return chat_chunks(body) if chat else responses_events(body)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        return None


# --- the server ----------------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    # A dict or list is sent as JSON; a str as it is (a broken body, say).
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    hold: bool = False
    # Streamed answers only: "cut", "garbage" or "stall" after this many events.
    fault: str | None = None
    fault_after: int = 0


@dataclass(frozen=True)
class Received:
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    # The client's side of the connection (host:port): the same for calls that reused a connection.
    peer: str = ""


class FakeOpenAIServer:
    """The server in a background thread of this process; `url` is the base URL for a client (".../v1")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._received: list[Received] = []
        self._released = threading.Event()
        self._resumed = threading.Event()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Bound now (not inside uvicorn), so the port is known and reserved before the thread starts.
        self._socket.bind(("127.0.0.1", 0))
        self.root_url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.url = f"{self.root_url}/v1"
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def reply(
        self,
        body: Any = None,
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        fault: str | None = None,
        fault_after: int = 0,
    ) -> None:
        """Script the next answer; answers are used in order, one per request, whatever its path. `fault`
        breaks a streamed answer after `fault_after` events ("cut", "garbage", "stall", "end"), or holds the rest
        until resume() ("pause")."""
        if fault not in (None, "cut", "garbage", "stall", "end", "pause", "error"):
            raise ValueError(f"unknown stream fault {fault!r}")
        with self._lock:
            self._queue.append(Reply(status, body, dict(headers or {}), fault=fault, fault_after=fault_after))

    def hold_next(self) -> None:
        """The next request gets no answer until the server stops (a client's timeout gives up first)."""
        with self._lock:
            self._queue.append(Reply(hold=True))

    def resume(self) -> None:
        """A stream paused by `fault="pause"` goes on (and later ones do not pause)."""
        self._resumed.set()

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def _app(self) -> FastAPI:
        app = FastAPI(title="fake OpenAI API")

        @app.post("/{path:path}")
        async def answer(path: str, request: Request) -> Response:
            raw = await request.body()
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
            peer = f"{request.client.host}:{request.client.port}" if request.client else ""
            headers = {k.lower(): v for k, v in request.headers.items()}
            received = Received("/" + path, request.url.query, headers, body, peer)
            chat = path.endswith("chat/completions")
            if not chat and not path.endswith("responses"):
                return Response(status_code=404)
            with self._lock:
                self._received.append(received)
                scripted = self._queue.popleft() if self._queue else Reply()
            if scripted.hold:
                await asyncio.to_thread(self._released.wait)
                return Response(status_code=503)
            if scripted.body is None:
                scripted.body = (
                    chat_completion(DEFAULT_TEXT) if chat else responses_response(output_message(DEFAULT_TEXT))
                )
            headers = {k.lower(): v for k, v in scripted.headers.items()}
            streamed = isinstance(body, dict) and body.get("stream") is True
            events = _as_events(scripted.body, chat) if streamed and scripted.status == 200 else None
            if events is not None:
                return StreamingResponse(
                    self._sse(events, scripted, chat), media_type="text/event-stream", headers=headers
                )
            content = scripted.body if isinstance(scripted.body, str) else json.dumps(scripted.body)
            headers = {"content-type": "application/json", **headers}
            return Response(content=content, status_code=scripted.status, headers=headers)

        return app

    async def _sse(self, events: list[dict[str, Any]], scripted: Reply, chat: bool) -> AsyncIterator[bytes]:
        for sent, event in enumerate(events):
            if scripted.fault == "pause" and sent == scripted.fault_after:
                # The rest of the answer waits for resume(): a test sees the text so far arrive first.
                await asyncio.to_thread(self._resumed.wait)
            elif scripted.fault is not None and sent == scripted.fault_after:
                if scripted.fault == "end":
                    return  # a clean end of the body, before the answer's last event
                if scripted.fault == "error":
                    # The provider gives up mid-answer, as each API says it.
                    problem = {
                        "message": "The server had an error while processing your request.",
                        "type": "server_error",
                    }
                    if chat:
                        yield f"data: {json.dumps({'error': problem})}\n\n".encode()
                    else:
                        event = {"type": "error", "code": "server_error", "message": problem["message"]}
                        yield f"event: error\ndata: {json.dumps(event)}\n\n".encode()
                    return
                if scripted.fault == "garbage":
                    yield b'data: {"choices": [{"delta": \n\n'
                elif scripted.fault == "stall":
                    await asyncio.to_thread(self._released.wait)
                # "cut", and after the others: the response ends with an error, so the connection drops mid-body.
                raise ConnectionAbortedError(f"stream fault {scripted.fault} after {sent} events")
            name = "" if chat else f"event: {event['type']}\n"
            yield f"{name}data: {json.dumps(event)}\n\n".encode()
        if chat:
            yield b"data: [DONE]\n\n"
        # The body ends a moment after the last event, as a real server's does (a client that stops reading at
        # the last event and closes the response loses its connection).
        await asyncio.sleep(0.02)

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="fake-openai", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._released.set()  # a held request answers, so the server can shut down
        self._resumed.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._socket.close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeOpenAIServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)
