"""End to end: a real worker configured for Chat Completions (OPENAI_API=chat) runs a request against a loopback
OpenAI-compatible server - the tool calls and the answer come from that server, a 429 is retried by Temporal,
and each tool's output goes back to the model under its call's id."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Worker

from demo.agent import build as build_demo
from tests.agent_helpers import run_agent, service_requests
from tests.fake_openai_server import FakeOpenAIServer, chat_completion, error_body
from toolloop._core.contracts import ModelSpec
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

API_KEY = "sk-test-chat-e2e-0123456789"


@pytest.fixture
async def chat_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def chat_worker(client: Client, settings: Settings, chat_server: FakeOpenAIServer) -> AsyncIterator[Worker]:
    chat_settings = settings.model_copy(
        update={
            "openai_api_key": SecretStr(API_KEY),
            "openai_base_url": chat_server.url,
            "openai_api": "chat",
            "openai_model": "local-model",
        }
    )
    async with running_worker(client, chat_settings, build_demo(chat_settings.service_url)) as worker:
        yield worker


async def test_a_worker_on_chat_completions_runs_a_request_from_the_servers_calls_and_answer(
    client: Client,
    settings: Settings,
    chat_worker: Worker,
    chat_server: FakeOpenAIServer,
    admin: httpx.AsyncClient,
) -> None:
    chat_server.reply(error_body("slow down"), status=429, headers={"Retry-After": "1"})
    chat_server.reply(
        chat_completion(
            None,
            [
                ("get_order_status", {"orderId": "A100"}, "call_a100"),
                ("get_order_status", {"orderId": "A102"}, "call_a102"),
            ],
        )
    )
    chat_server.reply(chat_completion("A100 ships with DHL; A102 was delivered."))

    result, _ = await run_agent(client, settings, "Where are A100 and A102?", model=ModelSpec(provider="openai"))

    assert (result.status, result.stop_reason) == ("completed", "final_answer")
    assert result.final_text == "A100 ships with DHL; A102 was delivered."
    assert result.model_label == "openai:default"
    assert sorted((c.call_id, c.ok) for c in result.calls) == [("call_a100", True), ("call_a102", True)]
    assert sorted(r["path"] for r in await service_requests(admin, "/orders")) == ["/orders/A100", "/orders/A102"]

    busy, first, second = (r.body for r in chat_server.requests)
    assert busy == first  # Temporal's retry after the 429 sent the same request
    assert first["model"] == "local-model"
    assert first["messages"][1:] == [{"role": "user", "content": "Where are A100 and A102?"}]
    assert {t["function"]["name"] for t in first["tools"]} >= {"get_order_status", "refund_order"}
    [assistant, *outputs] = second["messages"][2:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_a100", "call_a102"]
    given = {o["tool_call_id"]: json.loads(o["content"]) for o in outputs}
    assert [o["role"] for o in outputs] == ["tool", "tool"]
    assert given["call_a100"]["carrier"] == "DHL" and given["call_a102"]["status"] == "delivered"
