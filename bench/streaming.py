"""I/O: the streaming phase - what streaming a model's answers costs a worker, measured in one run against the
same requests without it (issue 25: at most 5% more worker CPU per request and 1.1x the history).

Two workers of toolloop (`python worker.py --tools bench.agent:build`), each on its own task queue, call the
`openai` model over HTTP: a loopback endpoint in this process that plays the benchmark's requests in the
Responses wire format (the calls of `bench.scenarios`, then an answer of ANSWER_CHARS characters). One asks for
streamed answers and writes their text to a live text store (a redis-server started here); the other asks for
plain answers and has no store. Write requests run on each in turn, the order reversed every other round; each
figure is the median of the rounds' ratios."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.types import Receive, Scope, Send

from bench.clients import OursStack, history_of, new_request_id
from bench.report import PLAIN_ANSWERS, STREAMED, Streaming, StreamingRound
from bench.scenarios import Scenario, calls_for_turn, scenario_of
from bench.stack import OURS_TOOLS, REPO_ROOT, BenchStack, reset_service
from devstack.processes import ManagedProcess, free_port, start_worker, wait_for_log_line
from faultbed.model_endpoint import read_body, response_body, send_events, stream_events
from toolloop._core.contracts import ModelSpec

if TYPE_CHECKING:
    from bench.phases import Bench

# The answer's length: a paragraph, about what a model writes after a round of tools.
ANSWER_CHARS = 800
ANSWER_TEXT = ("Every order is accounted for: each one was found, its state read, and the event booked. " * 10)[
    :ANSWER_CHARS
]
SCENARIO = Scenario(reads=3, write=True)


# --- the model endpoint -----------------------------------------------------------------------------------


def _turn_of(conversation: list[dict[str, Any]]) -> int:
    """Which model turn a call is, from the calls already in its conversation (their ids are c<turn>-...)."""
    turns = {
        int(item["call_id"].split("-")[0][1:])
        for item in conversation
        if item.get("type") == "function_call" and str(item.get("call_id", "")).startswith("c")
    }
    return max(turns, default=0) + 1


def bench_response(conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The Responses answer to one call of a benchmark request: its next calls, or the answer."""
    first = next(i for i in conversation if i.get("type", "message") == "message" and i.get("role") == "user")
    content = first["content"]
    text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    turn = _turn_of(conversation)
    calls = calls_for_turn(scenario_of(text), turn)
    if calls is None:
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": f"msg_{turn}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": ANSWER_TEXT, "annotations": []}],
            }
        ]
    else:
        output = [
            {
                "type": "function_call",
                "id": f"fc_{c.call_id}",
                "call_id": c.call_id,
                "name": c.name,
                "arguments": json.dumps(c.arguments),
                "status": "completed",
            }
            for c in calls
        ]
    return response_body(f"resp_bench_{turn}", "bench-endpoint", output, input_tokens=100, output_tokens=50)


class BenchModelEndpoint:
    """POST .../responses: the benchmark's answers, streamed as the Responses API's events when asked."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}/v1"
        config = uvicorn.Config(self._app, interface="asgi3", log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BenchModelEndpoint:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                await self._task
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)
        self._socket.close()

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        asked = json.loads(await read_body(receive))
        response = bench_response(asked.get("input", []))
        if asked.get("stream") is True:
            await send_events(send, stream_events(response)[0])
            return
        data = json.dumps(response).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})


# --- the two workers and the store -------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(stack: BenchStack) -> Iterator[str]:
    """A throwaway redis-server on a free loopback port (no persistence); its URL."""
    port = free_port()
    log = stack.root / "logs" / "redis.log"
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = ManagedProcess.spawn("redis", command, log, cwd=stack.root)
    try:
        wait_for_log_line(log, "Ready to accept connections", 30.0, proc, start_offset=proc.log_offset)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.stop()


@contextlib.asynccontextmanager
async def streaming_workers(
    stack: BenchStack, model_url: str, store_url: str, pids: dict[str, int]
) -> AsyncIterator[dict[str, str]]:
    """The two workers, by mode: their task queues (and into `pids`, their PIDs). Stopped on exit."""
    queues = {mode: f"{stack.ours_queue}-{mode}" for mode in (STREAMED, PLAIN_ANSWERS)}
    procs: list[ManagedProcess] = []
    try:
        for mode, queue in queues.items():
            env = {
                "TEMPORAL_ADDRESS": stack.temporal_address,
                "TOOLLOOP_TASK_QUEUE": queue,
                "TOOLLOOP_SERVICE_URL": stack.service_url,
                "TOOLLOOP_APPROVAL_VERIFY_KEY": stack.verify_key,
                "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
                "OPENAI_API_KEY": "sk-bench-not-a-real-key",
                "OPENAI_BASE_URL": model_url,
                "OPENAI_STREAM": "true" if mode == STREAMED else "false",
                **({"TOOLLOOP_LIVE_TEXT_URL": store_url} if mode == STREAMED else {}),
            }
            log = stack.root / "logs" / f"worker-{mode}.log"
            procs.append(await asyncio.to_thread(start_worker, REPO_ROOT, env, log, tools=OURS_TOOLS))
            pids[mode] = procs[-1].pid
        yield queues
    finally:
        for proc in procs:
            proc.stop()


# --- the phase ----------------------------------------------------------------------------------------------


async def streaming(bench: Bench) -> None:
    """Write requests on the streaming worker and on the plain one, in rounds; worker CPU and history per
    request of each, and their ratios."""
    stack, sizes = bench.stack, bench.sizes
    found = Streaming()
    bench.results.streaming = found
    async with BenchModelEndpoint() as endpoint:
        with redis_server(stack) as store_url:
            pids: dict[str, int] = {}
            async with streaming_workers(stack, endpoint.url, store_url, pids) as queues:
                clients = {
                    mode: OursStack(
                        bench.ours.client,
                        queue,
                        stack.signing_key,
                        model=ModelSpec(provider="openai"),
                        answer=ANSWER_TEXT,
                    )
                    for mode, queue in queues.items()
                }
                for mode, pid in pids.items():
                    bench.meter.watch(f"worker-{mode}", pid)
                for number in range(sizes.stack_rounds):
                    modes = (PLAIN_ANSWERS, STREAMED) if number % 2 == 0 else (STREAMED, PLAIN_ANSWERS)
                    measured = StreamingRound()
                    for mode in modes:
                        bench.say(f"streaming, round {number + 1} of {sizes.stack_rounds}: {mode} answers")
                        await _measure(bench, clients[mode], mode, measured)
                    found.rounds.append(measured)


async def _measure(bench: Bench, client: OursStack, mode: str, into: StreamingRound) -> None:
    sizes = bench.sizes
    await reset_service(bench.admin)
    gate = asyncio.Semaphore(max(1, sizes.in_flight))

    async def one(phase: str, i: int) -> Any:
        async with gate:
            return await client.run(SCENARIO, new_request_id(phase, i))

    await asyncio.gather(*(one(f"warm-stream-{mode}", i) for i in range(sizes.warmup)))
    with bench.meter.window() as window:
        outcomes = await asyncio.gather(*(one(f"stream-{mode}", i) for i in range(sizes.throughput)))
    failed = bench.check(f"streaming {mode}", outcomes)
    done = [o for o in outcomes if o.ok and o.workflow_id is not None]
    sizes_of = [(await history_of(client.client, o.workflow_id)).bytes for o in done]
    worker = f"worker-{mode}"
    if worker in window.cpu and done:
        into.worker_ms[mode] = window.cpu[worker] * 1000 / len(outcomes)
    into.history_bytes[mode] = statistics.mean(sizes_of) if sizes_of else 0.0
    into.requests[mode] = len(outcomes) - failed
