"""I/O (test support): a real loopback HTTP server speaking the OpenAI Responses wire format, scripted by a queue.

In-process (uvicorn in a background thread):

    with FakeResponsesServer() as server:          # or: async with FakeResponsesServer() as server:
        server.enqueue(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "2"})
        server.enqueue(body=completed_response([function_call_item("get_ticket", {"ticketId": "T1"})]))
        client = ResponsesClient(api_key="sk-test", base_url=server.url, model="fake")
        ...
        assert server.requests[0]["input"] == [...]

As a subprocess (for a worker process under test): `python -m tests.fake_responses_server --port N`
(`--port 0` picks a free port); the first stdout line is `FAKE_RESPONSES_URL=http://127.0.0.1:N/v1`.
`FakeResponsesProcess` wraps that and offers the same `enqueue` / `requests` over HTTP:
`POST /_enqueue` (JSON: status, body, headers, delay_seconds), `GET /_requests`, `POST /_reset`.

With an empty queue every call gets a completed response with one assistant message "fake final answer".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

DEFAULT_TEXT = "fake final answer"
URL_LINE_PREFIX = "FAKE_RESPONSES_URL="
_ids = itertools.count(1)


# --- wire-format helpers --------------------------------------------------------------------------------


def completed_response(items: list[dict[str, Any]], *, status: str = "completed", **extra: Any) -> dict[str, Any]:
    """A Responses envelope around `items` (pass `status="incomplete"` and extra fields for faults)."""
    n = next(_ids)
    return {
        "id": f"resp_fake_{n}",
        "object": "response",
        "created_at": 1_700_000_000 + n,
        "status": status,
        "model": "fake-model",
        "output": items,
        "parallel_tool_calls": True,
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        **extra,
    }


def message_item(text: str, *, item_id: str = "msg_fake") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(name: str, arguments: dict[str, Any] | str, *, call_id: str = "call_fake_1") -> dict[str, Any]:
    """A function_call item; `arguments` as a dict is encoded, as a str is sent as is (it may be broken JSON)."""
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "status": "completed",
        "name": name,
        "arguments": encoded,
        "call_id": call_id,
    }


def reasoning_item(item_id: str = "rs_fake_1", encrypted_content: str = "gAAAA-opaque==") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": "thinking about it"}],
        "encrypted_content": encrypted_content,
    }


# --- the server ---------------------------------------------------------------------------------------


@dataclass
class _Scripted:
    status: int = 200
    body: dict[str, Any] | list[Any] | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0


class _State:
    """Queue and records, shared by the test thread and the server thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: deque[_Scripted] = deque()
        self.requests: list[Any] = []
        self.headers: list[dict[str, str]] = []

    def reset(self) -> None:
        with self.lock:
            self.queue.clear()
            self.requests.clear()
            self.headers.clear()


def create_app(state: _State) -> FastAPI:
    app = FastAPI(title="fake Responses API")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        raw = await request.body()
        try:
            recorded: Any = json.loads(raw)
        except ValueError:
            recorded = raw.decode("utf-8", "replace")
        with state.lock:
            state.requests.append(recorded)
            state.headers.append({k.lower(): v for k, v in request.headers.items()})
            scripted = (
                state.queue.popleft()
                if state.queue
                else _Scripted(body=completed_response([message_item(DEFAULT_TEXT)]))
            )
        if scripted.delay_seconds:
            await asyncio.sleep(scripted.delay_seconds)
        body = scripted.body
        content = body if isinstance(body, str) else json.dumps(body if body is not None else {})
        headers = {"content-type": "application/json", **{k.lower(): v for k, v in scripted.headers.items()}}
        return Response(content=content, status_code=scripted.status, headers=headers)

    @app.post("/_enqueue")
    async def enqueue(request: Request) -> dict[str, int]:
        data = await request.json()
        entries = data if isinstance(data, list) else [data]
        with state.lock:
            state.queue.extend(_Scripted(**entry) for entry in entries)
            return {"queued": len(state.queue)}

    @app.get("/_requests")
    async def requests() -> list[Any]:
        with state.lock:
            return list(state.requests)

    @app.post("/_reset")
    async def reset() -> dict[str, bool]:
        state.reset()
        return {"ok": True}

    return app


class FakeResponsesServer:
    """The server in a background thread of this process; `url` is the base_url for a client."""

    def __init__(self, port: int = 0) -> None:
        self._state = _State()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Bind now (not inside uvicorn) so the port is known and reserved before the thread starts.
        self._socket.bind(("127.0.0.1", port))
        self.port = int(self._socket.getsockname()[1])
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root_url}/v1"
        config = uvicorn.Config(create_app(self._state), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def enqueue(
        self,
        *,
        status: int = 200,
        body: dict[str, Any] | list[Any] | str | None = None,
        headers: dict[str, str] | None = None,
        delay_seconds: float = 0.0,
    ) -> None:
        """Script the next answer; answers are used in order, one per request."""
        with self._state.lock:
            self._state.queue.append(_Scripted(status, body, dict(headers or {}), delay_seconds))

    @property
    def requests(self) -> list[Any]:
        """Every request body received so far (decoded JSON, or the raw text if it was not JSON)."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        with self._state.lock:
            return list(self._state.headers)

    def reset(self) -> None:
        self._state.reset()

    def start(self) -> FakeResponsesServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="fake-responses", daemon=True
        )
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                return self
            if not self._thread.is_alive():
                break
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("fake Responses server did not start")

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._socket.close()

    def __enter__(self) -> FakeResponsesServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeResponsesServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)


class FakeResponsesProcess:
    """The server as a child process (`python -m tests.fake_responses_server`), driven over HTTP."""

    def __init__(self, port: int = 0) -> None:
        self._port = port
        self._process: subprocess.Popen[str] | None = None
        self.url = ""
        self.root_url = ""

    def __enter__(self) -> FakeResponsesProcess:
        project_root = Path(__file__).resolve().parent.parent
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_responses_server", "--port", str(self._port)],
            cwd=project_root,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith(URL_LINE_PREFIX):
            self._stop()
            raise RuntimeError(f"fake Responses server did not start (first line: {line!r})")
        self.url = line.removeprefix(URL_LINE_PREFIX)
        self.root_url = self.url.removesuffix("/v1")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None

    def enqueue(
        self,
        *,
        status: int = 200,
        body: dict[str, Any] | list[Any] | str | None = None,
        headers: dict[str, str] | None = None,
        delay_seconds: float = 0.0,
    ) -> None:
        entry = {"status": status, "body": body, "headers": headers or {}, "delay_seconds": delay_seconds}
        httpx.post(f"{self.root_url}/_enqueue", json=entry, timeout=10).raise_for_status()

    @property
    def requests(self) -> list[Any]:
        response = httpx.get(f"{self.root_url}/_requests", timeout=10)
        response.raise_for_status()
        result: list[Any] = response.json()
        return result

    def reset(self) -> None:
        httpx.post(f"{self.root_url}/_reset", timeout=10).raise_for_status()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake OpenAI Responses API on 127.0.0.1 for tests.")
    parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one")
    args = parser.parse_args(argv)
    server = FakeResponsesServer(port=args.port)
    server.start()
    # The parent reads this line to learn the port (it may have asked for port 0).
    print(f"{URL_LINE_PREFIX}{server.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
