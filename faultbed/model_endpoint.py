"""I/O: the scripted model endpoint - a loopback HTTP server speaking the OpenAI Responses wire format that
answers one chaos run's scripted turns, so the worker's real Responses adapter (toolloop's `openai` model)
talks to it over a real socket, and the plan's model endpoint faults happen on that exchange:

- `status_429`: HTTP 429 with `Retry-After: 1`;
- `status_500`: HTTP 500;
- `timeout`: no answer until long after the model activity's timeout (the worker gives up first);
- `reset`: the connection closes without a byte of reply;
- `stream_cut`, `stream_stall`, `stream_garbage`: a streamed answer (the worker asks for one unless
  OPENAI_STREAM=false) breaks in the middle of its first call's arguments, or of its text without a call: the
  connection drops, nothing more comes, or a chunk that is not JSON comes and then the connection drops.

A call that asks to stream gets its answer as the Responses API's server-sent events: `response.created`, each
output item added with its text or arguments in pieces, and `response.completed` with the whole response.

Every POST /v1/responses is one model call, numbered from 1 for the run; a fault fires on its call number
as faultbed.plan.fault_fires decides (the Nth call, or a seeded draw). Which turn a call gets is read from
the conversation it sends, not counted: the first turn with a function call not answered yet in its input
(the last turn once all are). So a call the worker repeats after a fault, a timeout or a crash gets the
same turn again, as a real model would be asked again.

A process fault "during a model turn" uses `pause`: the Nth call is held (counted as arrived) until the
runner has struck and releases it; a streamed call is held in the middle of its stream (its text and part of
its first call's arguments already sent), so a worker killed there dies with an answer half read."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

from faultbed.plan import ENDPOINT_FAULTS, STREAM_FAULTS, ModelFaultSpec, fault_fires


@dataclass(frozen=True)
class EndpointFault:
    index: int  # in the plan
    spec: ModelFaultSpec


def endpoint_faults(faults: Sequence[Any]) -> list[EndpointFault]:
    """The faults of a plan the endpoint injects, with their index in the plan."""
    return [
        EndpointFault(i, f)
        for i, f in enumerate(faults)
        if isinstance(f, ModelFaultSpec) and f.fault in ENDPOINT_FAULTS
    ]


@dataclass
class _Pause:
    call_number: int
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)


class ScriptedModelEndpoint:
    """One run at a time: `load` its turns and faults, point the worker's Responses adapter at `url`."""

    def __init__(self, *, timeout_hold_seconds: float = 30.0) -> None:
        self._hold = timeout_hold_seconds
        self.turns: list[list[dict[str, Any]]] = []
        self.faults: list[EndpointFault] = []
        self.seed = 0
        self.calls = 0
        self.fired: Counter[int] = Counter()
        # Wall-clock time each fault first fired (for the recovery time).
        self.first_fired_at: dict[int, float] = {}
        self._pause: _Pause | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def load(self, turns: list[list[dict[str, Any]]], faults: list[EndpointFault], seed: int) -> None:
        self.turns, self.faults, self.seed = turns, faults, seed
        self.calls = 0
        self.fired.clear()
        self.first_fired_at.clear()
        self.release()
        self._pause = None

    def pause(self, call_number: int) -> asyncio.Event:
        """Hold the `call_number`-th call when it comes; the returned event is set once it has arrived."""
        self._pause = _Pause(call_number)
        return self._pause.arrived

    def release(self) -> None:
        if self._pause is not None:
            self._pause.released.set()

    async def start(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])
        # Critical only: uvicorn logs an error for each hang-up this endpoint injects on purpose.
        config = uvicorn.Config(self._app, interface="asgi3", log_level="critical", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                await self._task  # raises what stopped it
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.release()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 10)
        if self._socket is not None:
            self._socket.close()

    # --- The ASGI app -----------------------------------------------------------------------------------

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> str | None:
        if scope["type"] != "http":
            return None
        try:
            return await self._answer(scope, receive, send)
        except asyncio.CancelledError:
            # The endpoint is stopping while a call is held: hang up quietly.
            return "endpoint stopping"

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> str | None:
        body = await read_body(receive)
        if scope["method"] != "POST" or not scope["path"].endswith("/responses"):
            await _send_json(send, 404, {"error": {"message": "not found"}})
            return None
        self.calls += 1
        number = self.calls
        try:
            asked = json.loads(body)
            conversation, streamed = asked.get("input", []), asked.get("stream") is True
        except (ValueError, AttributeError):
            conversation, streamed = [], False
        pause = self._pause if self._pause is not None and self._pause.call_number == number else None
        if pause is not None and not streamed:
            await self._hold_paused(pause, receive)
            pause = None
        fault = self._fault_for(number)
        kind = None if fault is None else fault.spec.fault
        if kind == "status_429":
            await _send_json(send, 429, {"error": {"message": "rate limited (injected)"}}, [(b"retry-after", b"1")])
            return None
        if kind == "status_500":
            await _send_json(send, 500, {"error": {"message": "server error (injected)"}})
            return None
        if kind == "reset":
            # uvicorn closes the connection when the app returns a value without having replied.
            return "fault injected: model connection reset"
        if kind == "timeout":
            # No answer until the worker gives up on the call (or a long bound passes).
            await _first_of(_disconnected(receive), seconds=self._hold)
        response = _response(number, self._turn_for(conversation))
        if streamed:
            return await self._stream(send, receive, response, kind if kind in STREAM_FAULTS else None, pause)
        await _send_json(send, 200, response)
        return None

    async def _hold_paused(self, pause: _Pause, receive: Receive) -> None:
        pause.arrived.set()
        await _first_of(pause.released.wait(), _disconnected(receive), seconds=self._hold)

    async def _stream(
        self, send: Send, receive: Receive, response: dict[str, Any], fault: str | None, pause: _Pause | None
    ) -> str | None:
        events, middle = stream_events(response)
        await send(_STREAM_HEAD)
        for index, event in enumerate(events):
            if pause is not None and index == middle:
                # A strike "during a model turn" lands with the answer half streamed: its text and part of its
                # first call's arguments sent, the rest held until the runner has struck.
                await self._hold_paused(pause, receive)
            if fault is not None and index == middle:
                if fault == "stream_stall":
                    # Nothing more until the worker gives up on the call (or a long bound passes).
                    await _first_of(_disconnected(receive), seconds=self._hold)
                elif fault == "stream_garbage":
                    await send(
                        {"type": "http.response.body", "body": b'data: {"type": "response.out\n\n', "more_body": True}
                    )
                # uvicorn drops the connection when the app returns in the middle of a body.
                return f"fault injected: model stream {fault}"
            await send({"type": "http.response.body", "body": _framed(event), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None

    def _fault_for(self, number: int) -> EndpointFault | None:
        # Every call matches every endpoint fault: the call number is the fault's call number.
        for fault in self.faults:
            if fault_fires(fault.spec.when, self.seed, fault.index, number, self.fired[fault.index]):
                self.fired[fault.index] += 1
                self.first_fired_at.setdefault(fault.index, time.time())
                return fault
        return None

    def _turn_for(self, conversation: Any) -> list[dict[str, Any]]:
        items = conversation if isinstance(conversation, list) else []
        answered = {i.get("call_id") for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"}
        for turn in self.turns:
            calls = [i["call_id"] for i in turn if i.get("type") == "function_call"]
            if any(c not in answered for c in calls):
                return turn
        return self.turns[-1] if self.turns else []


async def read_body(receive: Receive) -> bytes:
    """A request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first_of(*waits: Awaitable[Any], seconds: float) -> None:
    """Until the first of `waits` is done, or `seconds` passed."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _response(number: int, turn: list[dict[str, Any]]) -> dict[str, Any]:
    output = []
    for position, item in enumerate(turn):
        wire = dict(item)
        if wire.get("type") == "function_call":
            wire.setdefault("id", f"fc_{number}_{position}")
        else:
            wire.setdefault("id", f"msg_{number}_{position}")
        wire.setdefault("status", "completed")
        if wire.get("type") == "message":
            wire["content"] = [{"annotations": [], **part} for part in wire.get("content", [])]
        output.append(wire)
    return response_body(f"resp_chaos_{number}", "chaos-script", output, input_tokens=1, output_tokens=1)


def response_body(
    response_id: str, model: str, output: list[dict[str, Any]], *, input_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """A completed Responses API answer with these output items and this usage."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


async def send_events(send: Send, events: list[dict[str, Any]]) -> None:
    """A whole event stream: the head, each event as the Responses API frames it, the end."""
    await send(_STREAM_HEAD)
    for event in events:
        await send({"type": "http.response.body", "body": _framed(event), "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


_STREAM_HEAD = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
}


def _framed(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


# Characters of text or arguments per streamed event.
_PIECE = 8


def stream_events(response: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """A Responses answer as the events of a streamed call, and where a stream fault breaks it: the middle of
    the first call's arguments, else of the text."""
    seq = itertools.count()
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "sequence_number": next(seq),
            "response": {**response, "status": "in_progress", "output": [], "usage": None},
        }
    ]
    middle = None
    for index, item in enumerate(response["output"]):
        if item.get("type") == "function_call":
            events.append(_added(next(seq), index, {**item, "arguments": "", "status": "in_progress"}))
            pieces = _pieces(item.get("arguments", ""))
            for n, piece in enumerate(pieces):
                if middle is None and n == len(pieces) // 2:
                    middle = len(events)
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "delta": piece,
                    }
                )
            continue
        events.append(_added(next(seq), index, item))
        for part_index, part in enumerate(item.get("content", []) if item.get("type") == "message" else []):
            for piece in _pieces(part.get("text", "")):
                events.append(
                    {
                        "type": "response.output_text.delta",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": part_index,
                        "delta": piece,
                        "logprobs": [],
                    }
                )
    events.append({"type": "response.completed", "sequence_number": next(seq), "response": response})
    # Without a call: halfway through, never the last event (the answer must not be complete).
    return events, middle if middle is not None else max(1, min(len(events) // 2, len(events) - 1))


def _added(sequence_number: int, index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "response.output_item.added",
        "sequence_number": sequence_number,
        "output_index": index,
        "item": item,
    }


def _pieces(text: str) -> list[str]:
    return [text[i : i + _PIECE] for i in range(0, len(text), _PIECE)] or [""]


async def _send_json(send: Send, status: int, data: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(data).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
