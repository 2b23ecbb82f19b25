"""End to end: a real worker whose model streams (the official SDK against a loopback server speaking the
Responses wire format) writes each turn's text to a real Redis as it is written, and a client following the
request reads it - pieces that add up to the answer, and for a stream cut in the middle of a tool call's
arguments, a restart and the retried turn's text only, with the call run once, from the finished answer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Worker

from demo.agent import build as build_demo
from tests.agent_helpers import service_requests
from tests.fake_openai_server import FakeOpenAIServer, function_call, output_message, responses_response
from toolloop._core.contracts import Actor, ModelSpec
from toolloop._core.live_text import Shown
from toolloop._live.store import LiveTextStore
from toolloop._temporal.client import ToolloopClient, ToolloopRequest
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

API_KEY = "sk-test-live-e2e-0123456789"
USER = Actor(user_id="u1", tenant_id="acme")


@pytest.fixture
async def model_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def streaming_worker(
    client: Client, settings: Settings, model_server: FakeOpenAIServer, live_text_url: str
) -> AsyncIterator[Worker]:
    streaming = settings.model_copy(
        update={
            "openai_api_key": SecretStr(API_KEY),
            "openai_base_url": model_server.url,
            # A stalled stream gives up after this long (the turn's attempt fails and is retried).
            "openai_timeout_seconds": 2.0,
            "live_text_url": live_text_url,
        }
    )
    async with running_worker(client, streaming, build_demo(streaming.service_url)) as worker:
        yield worker


@pytest.fixture
async def toolloop_client(client: Client, settings: Settings, live_text_url: str) -> AsyncIterator[ToolloopClient]:
    async with LiveTextStore(live_text_url) as store:
        yield ToolloopClient(client, task_queue=settings.task_queue, live_text=store)


async def shown_until_done(request: ToolloopRequest) -> list[Shown]:
    return [shown async for shown in request.live_text()]


async def test_a_streamed_answer_reaches_the_client_in_pieces_that_make_the_answer(
    streaming_worker: Worker, model_server: FakeOpenAIServer, toolloop_client: ToolloopClient
) -> None:
    answer = "Your order A100 left the warehouse on Monday; it should arrive on Thursday."
    # The rest of the answer waits until the client has the first pieces: they reach it while it is written.
    model_server.reply(responses_response(output_message(answer)), fault="pause", fault_after=6)

    request = await toolloop_client.start("Where is A100?", actor=USER, model=ModelSpec(provider="openai"))
    shown: list[Shown] = []
    async for piece in request.live_text():
        shown.append(piece)
        if len(shown) == 1:
            assert piece.kind == "text" and answer.startswith(piece.text) and piece.text != answer
            model_server.resume()
    result = await request.result()

    assert result.final_text == answer
    texts = [s.text for s in shown if s.kind == "text"]
    assert len(texts) >= 2 and "".join(texts) == answer  # several pieces, the answer once
    assert [s.kind for s in shown if s.kind != "text"] == ["complete"]
    assert {(s.turn, s.attempt) for s in shown} == {(1, 1)}


async def test_a_stream_broken_mid_arguments_restarts_the_turn_and_the_call_runs_once(
    streaming_worker: Worker,
    model_server: FakeOpenAIServer,
    toolloop_client: ToolloopClient,
    admin: httpx.AsyncClient,
) -> None:
    turn_one = responses_response(
        output_message("Let me look that up."), function_call("get_order_status", {"orderId": "A100"}, "call_1")
    )
    # created, the message and its 5 pieces, the call, 2 pieces of its 5 arguments: then the stream stalls (its
    # text so far shown), and the worker gives up on it after its timeout.
    model_server.reply(turn_one, fault="stall", fault_after=1 + 1 + 5 + 1 + 2)
    model_server.reply(turn_one)
    model_server.reply(responses_response(output_message("A100 ships with DHL.")))

    request = await toolloop_client.start("Where is A100?", actor=USER, model=ModelSpec(provider="openai"))
    shown = await shown_until_done(request)
    result = await request.result()

    assert result.final_text == "A100 ships with DHL."
    # The broken attempt's text was shown, then the restart, then the retried attempt's text only.
    turn_one_shown = [(s.kind, s.attempt, s.text) for s in shown if s.turn == 1]
    assert turn_one_shown[0] == ("text", 1, "Let me look that up.")
    restart = turn_one_shown.index(("restarted", 2, ""))
    assert "".join(t for k, a, t in turn_one_shown[restart:] if k == "text") == "Let me look that up."
    assert turn_one_shown[-1] == ("complete", 2, "")
    assert "".join(s.text for s in shown if s.turn == 2 and s.kind == "text") == "A100 ships with DHL."
    # The call ran once, from the finished answer: one call record, one request at the service.
    assert [(c.call_id, c.ok) for c in result.calls] == [("call_1", True)]
    assert [r["path"] for r in await service_requests(admin, "/orders")] == ["/orders/A100"]
    assert len(model_server.requests) == 3


async def test_a_model_that_does_not_stream_gives_the_same_events_per_turn(
    streaming_worker: Worker, toolloop_client: ToolloopClient
) -> None:
    # The demo's offline model answers whole: its text arrives as one piece per turn, then complete.
    request = await toolloop_client.start("Where is my order A100?", actor=USER, model=ModelSpec(provider="offline"))
    shown = await shown_until_done(request)
    result = await request.result()

    assert result.final_text and result.final_text.startswith("[offline model]")
    final_turn = max(s.turn for s in shown)
    assert [(s.kind, s.text) for s in shown if s.turn == final_turn] == [
        ("text", result.final_text),
        ("complete", ""),
    ]
