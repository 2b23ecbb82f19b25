"""End to end: token usage and budgets with a real worker on the Chat Completions adapter, against a loopback
OpenAI-compatible server that reports each answer's usage. A request stops with `budget` once the reported
totals reach its `max_total_tokens` (every call_id still answered once, no further model call), one under its
budget completes; the report, the UI's details, the CLI's receipt, the API's view and the web page show the same
totals, which are the sums of what the server reported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from playwright.async_api import expect
from pydantic import SecretStr
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from demo.agent import build as build_demo
from devstack.processes import free_port, start_api
from tests.agent_helpers import assert_eventually, run_agent, tool_outputs
from tests.api_helpers import U1, api_env, worker_settings
from tests.conftest import REPO_ROOT, BusinessService, TemporalServer
from tests.fake_openai_server import FakeOpenAIServer, chat_completion
from tests.test_web_page_e2e import WAIT_MS, ask, browse, log_in
from tests.test_web_page_e2e import Api as PageApi
from toolloop._core.contracts import EventsPage, Limits, ModelSpec
from toolloop._core.names import GET_EVENTS_QUERY
from toolloop._core.text import markdown_literal
from toolloop._core.usage import ModelPrice, RequestUsage, usage_line
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

API_KEY = "sk-test-usage-e2e-0123456789"
MODEL = "local-model"
PRICE = ModelPrice(input=0.40, cached_input=0.10, output=1.60)
OPENAI = ModelSpec(provider="openai")


def chat_settings(base: Settings, server: FakeOpenAIServer) -> Settings:
    """A worker's settings for the loopback server's Chat Completions API, with a price for its model."""
    return base.model_copy(
        update={
            "openai_api_key": SecretStr(API_KEY),
            "openai_base_url": server.url,
            "openai_api": "chat",
            "openai_model": MODEL,
            "model_prices": {MODEL: PRICE},
        }
    )


def cost(input_tokens: int, cached: int, output_tokens: int) -> float:
    return (
        (input_tokens - cached) * PRICE.input + cached * (PRICE.cached_input or 0) + output_tokens * PRICE.output
    ) / 1e6


def reads(*calls: tuple[str, str]) -> list[tuple[str, dict[str, Any], str]]:
    """Order status reads, one per (call id, order id)."""
    return [("get_order_status", {"orderId": order}, call_id) for call_id, order in calls]


@pytest.fixture
async def chat_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def chat_worker(client: Client, settings: Settings, chat_server: FakeOpenAIServer) -> AsyncIterator[None]:
    configured = chat_settings(settings, chat_server)
    async with running_worker(client, configured, build_demo(configured.service_url)):
        yield


async def details(handle: WorkflowHandle[Any, Any]) -> str:
    """The current details the Temporal UI shows on the workflow's page (its built-in metadata query)."""
    metadata: WorkflowMetadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def test_a_request_stops_at_its_token_budget_with_every_call_answered_once(
    client: Client, settings: Settings, chat_worker: None, chat_server: FakeOpenAIServer
) -> None:
    # 1,040 tokens after turn 1 (under 2,000: turn 2 runs), 2,370 after turn 2: no turn 3.
    chat_server.reply(chat_completion(None, reads(("c1", "A100"), ("c2", "A102")), usage=(1000, 40), cached=600))
    chat_server.reply(chat_completion(None, reads(("c3", "A100")), usage=(1300, 30), cached=1000))
    chat_server.reply(chat_completion("never asked for", usage=(1, 1)))

    result, handle = await run_agent(
        client, settings, "A100 and A102?", model=OPENAI, limits=Limits(max_total_tokens=2000)
    )

    assert (result.status, result.stop_reason, result.outcome, result.rounds) == ("stopped", "budget", "stopped", 2)
    assert result.error == "the token budget was reached: 2,370 of max_total_tokens 2,000"
    assert len(chat_server.requests) == 2  # the budget was checked before a third model call
    # Every call_id answered once (tool_outputs checks it): the first turn's in the second turn's input, the
    # last turn's (which the model never saw: the budget stopped it) by one record each in the report.
    outputs = await tool_outputs(handle)
    assert sorted(outputs) == ["c1", "c2"] and all(output["ok"] for output in outputs.values())
    assert sorted((c.call_id, c.round, c.ok) for c in result.calls) == [
        ("c1", 1, True),
        ("c2", 1, True),
        ("c3", 2, True),
    ]
    # The totals are the sums of what the server reported, and their cost by the worker's price table.
    assert result.usage.model_dump(exclude={"cost"}) == RequestUsage(
        input_tokens=2300, cached_input_tokens=1600, output_tokens=70, total_tokens=2370, turns=2
    ).model_dump(exclude={"cost"})
    assert result.usage.cost == pytest.approx(cost(1000, 600, 40) + cost(1300, 1000, 30))

    # The UI's details and the final event say the same.
    line = usage_line(result.usage)
    assert line is not None and line.startswith("tokens: 2,300 in (1,600 cached), 70 out, 2,370 total; cost ")
    assert markdown_literal(line) in await details(handle)
    page: EventsPage = await handle.query(GET_EVENTS_QUERY, 0, result_type=EventsPage)
    assert (
        page.events[-1].kind == "final" and RequestUsage.model_validate(page.events[-1].data["usage"]) == result.usage
    )


async def test_a_cost_budget_the_worker_cannot_count_stops_after_the_first_unpriced_turn(
    client: Client, settings: Settings, chat_server: FakeOpenAIServer
) -> None:
    # The worker has no price for the model the server answers as: max_cost was silently never reached, and the
    # request ran to max_rounds. It now stops once a turn had no price, and says why.
    unpriced = chat_settings(settings, chat_server).model_copy(update={"model_prices": {"another-model": PRICE}})
    chat_server.reply(chat_completion(None, reads(("c1", "A100")), usage=(100, 10)))
    chat_server.reply(chat_completion("never asked for", usage=(1, 1)))
    async with running_worker(client, unpriced, build_demo(unpriced.service_url)):
        result, handle = await run_agent(client, settings, "A100?", model=OPENAI, limits=Limits(max_cost=0.01))
    assert (result.status, result.stop_reason, result.rounds) == ("stopped", "budget", 1)
    assert result.error == "max_cost 0.01 cannot be kept: the worker has no price for this model"
    assert len(chat_server.requests) == 1 and result.usage.unpriced_turns == 1
    assert sorted(await tool_outputs(handle)) == [] and [c.call_id for c in result.calls] == ["c1"]


async def test_a_request_under_its_budget_completes_with_its_totals(
    client: Client, settings: Settings, chat_worker: None, chat_server: FakeOpenAIServer
) -> None:
    chat_server.reply(chat_completion(None, reads(("c1", "A100")), usage=(500, 20)))
    chat_server.reply(chat_completion("A100 ships with DHL.", usage=(600, 10), cached=500))

    result, _ = await run_agent(
        client, settings, "A100?", model=OPENAI, limits=Limits(max_total_tokens=10_000, max_cost=1.0)
    )

    assert (result.status, result.stop_reason, result.final_text) == (
        "completed",
        "final_answer",
        "A100 ships with DHL.",
    )
    assert (result.usage.input_tokens, result.usage.cached_input_tokens) == (1100, 500)
    assert (result.usage.output_tokens, result.usage.total_tokens, result.usage.turns) == (30, 1130, 2)
    assert result.usage.cost == pytest.approx(cost(500, 0, 20) + cost(600, 500, 10))
    assert result.usage.unpriced_turns == 0


async def test_the_cli_receipt_prints_the_totals_of_a_request_stopped_by_its_budget(
    temporal_server: TemporalServer, settings: Settings, chat_worker: None, chat_server: FakeOpenAIServer
) -> None:
    chat_server.reply(chat_completion(None, reads(("c1", "A100")), usage=(150, 10)))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_", "OPENAI_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_TASK_QUEUE": settings.task_queue,
    }
    command = [sys.executable, str(REPO_ROOT / "starter.py"), "ask", "--user", "u1", "--no-local-stack"]
    command += ["--model", "openai", "--max-total-tokens", "100", "Where is my order A100?"]
    # In a thread: this test's worker runs on this event loop while the CLI waits for the result.
    done = await asyncio.to_thread(
        subprocess.run, command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )

    assert done.returncode == 1, done.stderr  # stopped at a limit
    assert "the request stopped (budget)" in done.stdout
    assert "status stopped, stop budget, rounds 1" in done.stderr
    assert "tokens: 150 in (0 cached), 10 out, 160 total; cost 0.000076\n" in done.stderr
    assert len(chat_server.requests) == 1


async def test_the_api_takes_a_token_budget_and_its_view_and_the_web_page_show_the_totals(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    chat_server: FakeOpenAIServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    task_queue = f"api-usage-{os.urandom(4).hex()}"
    port = free_port()
    # The page asks with the API's default model: the loopback server's.
    models = {"TOOLLOOP_API_MODEL": "openai", "TOOLLOOP_API_MODELS": "offline,script,openai"}
    environment = api_env(temporal_server, task_queue, **models)
    log = tmp_path_factory.mktemp("api-usage") / "api.log"
    process = await asyncio.to_thread(start_api, REPO_ROOT, environment, port, log)
    served = PageApi(url=f"http://127.0.0.1:{port}", port=port, env=environment, log=log, process=process)
    chat_server.reply(chat_completion(None, reads(("c1", "A100")), usage=(150, 10), cached=100))
    try:
        configured = chat_settings(worker_settings(temporal_server, task_queue), chat_server)
        async with (
            running_worker(client, configured, build_demo(business_service.url)),
            httpx.AsyncClient(base_url=served.url, timeout=30, trust_env=False) as http,
        ):
            schemas = (await http.get("/openapi.json")).json()["components"]["schemas"]
            assert "max_total_tokens" in schemas["LimitsBody"]["properties"]
            assert "usage" in schemas["RequestView"]["properties"]

            body = {"question": "Where is my order A100?", "limits": {"max_total_tokens": 100}}
            created = await http.post("/v1/requests", json=body, headers=U1)
            assert created.status_code == 201, created.text
            request_id = created.json()["id"]
            view: dict[str, Any] = {}

            async def finished() -> bool:
                view.update((await http.get(f"/v1/requests/{request_id}", headers=U1)).json())
                return view.get("status") not in (None, "running")

            await assert_eventually(finished, within=60, what=f"request {request_id} finished")

            # A request asked on the page, followed live to its end, shows its totals in its card.
            chat_server.reply(chat_completion("A100 ships with DHL.", usage=(200, 20), cached=50))
            async with browse(served) as browsed:
                await log_in(browsed.page)
                asked = await ask(browsed.page, "Where is my order A100?")
                card = browsed.page.locator(f'[data-request-id="{asked}"]')
                await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
                await expect(card.locator('[data-field="usage"]')).to_have_text(
                    "200 in (50 cached), 20 out, 220 total; cost 0.000097"
                )
    finally:
        process.stop()

    assert (view["status"], view["stop_reason"], view["outcome"]) == ("stopped", "budget", "stopped")
    assert [(c["call_id"], c["ok"]) for c in view["calls"]] == [("c1", True)]
    usage = RequestUsage.model_validate(view["usage"])
    assert usage.model_dump(exclude={"cost"}) == RequestUsage(
        input_tokens=150, cached_input_tokens=100, output_tokens=10, total_tokens=160, turns=1
    ).model_dump(exclude={"cost"})
    assert usage.cost == pytest.approx(cost(150, 100, 10))
