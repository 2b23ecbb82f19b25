"""End to end: a real worker configured with two named models (TOOLLOOP_MODELS) on two loopback OpenAI-compatible
servers - `small` on the Responses API with the OPENAI_* key, `large` on Chat Completions with a key of its own
- answers a request on each from the right server, asking it for the right provider model with the right key;
and a request that names another model for `large` (started without the CLI's or the API's check) is refused
at its first turn, with nothing sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from demo.agent import build as build_demo
from tests.agent_helpers import run_agent
from tests.fake_openai_server import FakeOpenAIServer, chat_completion, output_message, responses_response
from toolloop._core.contracts import ModelSpec
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

SMALL_KEY = "sk-test-small-named-0123456789"
LARGE_KEY = "sk-test-large-named-9876543210"


@pytest.fixture
async def small_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def large_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def named_worker(
    client: Client,
    settings: Settings,
    small_server: FakeOpenAIServer,
    large_server: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Worker]:
    monkeypatch.setenv("LARGE_API_KEY", LARGE_KEY)
    table = {
        "small": {"model": "gpt-small"},
        "large": {"model": "gpt-large", "api": "chat", "base_url": large_server.url, "api_key_env": "LARGE_API_KEY"},
    }
    # Read as a worker's entry point reads them: the environment (here the test's settings) plus the table.
    named = Settings.model_validate(
        {
            **{str(f.validation_alias): getattr(settings, n) for n, f in Settings.model_fields.items()},
            "OPENAI_API_KEY": SMALL_KEY,
            "OPENAI_BASE_URL": small_server.url,
            "TOOLLOOP_MODELS": json.dumps(table),
        }
    )
    async with running_worker(client, named, build_demo(named.service_url)) as worker:
        yield worker


async def test_each_request_gets_the_named_model_it_asks_for(
    client: Client,
    settings: Settings,
    named_worker: Worker,
    small_server: FakeOpenAIServer,
    large_server: FakeOpenAIServer,
) -> None:
    small_server.reply(responses_response(output_message("small says A100 ships with DHL.")))
    large_server.reply(chat_completion("large says A100 ships with DHL."))

    small, _ = await run_agent(client, settings, "Where is A100?", model=ModelSpec.named("small"))
    large, _ = await run_agent(client, settings, "Where is A100?", model=ModelSpec.named("large"))

    assert (small.status, small.final_text) == ("completed", "small says A100 ships with DHL.")
    assert (large.status, large.final_text) == ("completed", "large says A100 ships with DHL.")
    assert (small.model_label, large.model_label) == ("small (gpt-small)", "large (gpt-large)")
    [to_small] = small_server.requests
    [to_large] = large_server.requests
    assert (to_small.path, to_small.body["model"]) == ("/v1/responses", "gpt-small")
    assert (to_large.path, to_large.body["model"]) == ("/v1/chat/completions", "gpt-large")
    assert to_small.headers["authorization"] == f"Bearer {SMALL_KEY}"
    assert to_large.headers["authorization"] == f"Bearer {LARGE_KEY}"


async def test_a_named_model_refuses_another_provider_model_at_the_first_turn(
    client: Client, settings: Settings, named_worker: Worker, large_server: FakeOpenAIServer
) -> None:
    result, _ = await run_agent(client, settings, "Where is A100?", model=ModelSpec.named("large:other-model"))

    assert result.status == "failed", result
    assert "'large' serves 'gpt-large' only" in (result.error or ""), result.error
    assert large_server.requests == []
