"""End to end over real HTTP: the API process's event stream carries the model's text as it is written
(`model_text`), from the live text store a real worker writes to while its model streams - text that arrives
while the answer is still being written, pieces that make the answer once, and then the `final` event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from temporalio.client import Client

from tests.api_helpers import U1, Api, running_api
from tests.conftest import BusinessService, TemporalServer
from tests.fake_openai_server import FakeOpenAIServer, output_message, responses_response

pytestmark = pytest.mark.e2e

ANSWER = "Your order A100 left the warehouse on Monday and should arrive on Thursday."


@pytest.fixture
async def model_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def api(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: Any,
    model_server: FakeOpenAIServer,
    live_text_url: str,
) -> AsyncIterator[Api]:
    async with running_api(
        temporal_server,
        business_service,
        client,
        tmp_path_factory,
        env={"TOOLLOOP_LIVE_TEXT_URL": live_text_url, "TOOLLOOP_API_MODELS": "offline,script,openai"},
        worker_env={
            "TOOLLOOP_LIVE_TEXT_URL": live_text_url,
            "OPENAI_API_KEY": "sk-test-live-api-0123456789",
            "OPENAI_BASE_URL": model_server.url,
        },
    ) as started:
        yield started


async def test_the_event_stream_carries_the_models_text_as_it_is_written(
    api: Api, model_server: FakeOpenAIServer
) -> None:
    # The answer stops after its first pieces until the test has seen them in the stream.
    model_server.reply(responses_response(output_message(ANSWER)), fault="pause", fault_after=4)
    async with httpx.AsyncClient(base_url=api.url, timeout=60, trust_env=False) as http:
        created = await http.post("/v1/requests", json={"question": "Where is A100?", "model": "openai"}, headers=U1)
        assert created.status_code == 201, created.text
        request_id = created.json()["id"]

        texts: list[dict[str, Any]] = []
        kinds: list[str] = []
        numbered: list[int] = []
        async with aconnect_sse(http, "GET", f"/v1/requests/{request_id}/events", headers=U1) as source:
            async for sse in source.aiter_sse():
                kinds.append(sse.event)
                if sse.event != "model_text":
                    numbered.append(int(sse.id))
                if sse.event == "model_text":
                    data = json.loads(sse.data)
                    texts.append(data)
                    if len(texts) == 1:
                        # Seen before the rest of the answer was even sent.
                        assert ANSWER.startswith(data["text"]) and data["text"] != ANSWER
                        model_server.resume()
                if sse.event == "final":
                    final = json.loads(sse.data)
                    break

    pieces = [t["text"] for t in texts if t["kind"] == "text"]
    assert "".join(pieces) == ANSWER and len(pieces) >= 2
    assert {(t["turn"], t["attempt"]) for t in texts} == {(1, 1)}
    assert texts[-1]["kind"] == "complete"
    assert kinds.index("model_text") < kinds.index("final")
    assert final["data"]["final_text"] == ANSWER
    # The request's own events keep their numbers (text events carry none: Last-Event-ID stays theirs).
    assert numbered == list(range(numbered[0], numbered[0] + len(numbered)))
