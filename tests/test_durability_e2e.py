"""End to end: a worker process killed with SIGKILL mid-request, determinism of stored histories, and the
real Responses adapter driving the workflow through a loopback Responses server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from demo.agent import build as build_demo
from devstack.processes import start_worker
from tests.agent_helpers import (
    approving,
    assert_eventually,
    call,
    conversation,
    run_agent,
    say,
    script_spec,
    service_requests,
    set_faults,
    start_agent,
    tool_outputs,
    worker_env,
)
from tests.conftest import REPO_ROOT, BusinessService
from tests.fake_responses_server import (
    FakeResponsesServer,
    completed_response,
    function_call_item,
    message_item,
    reasoning_item,
)
from toolloop import request_result
from toolloop._core.contracts import FunctionCallOutputItem, Limits, ModelSpec, OtherItem
from toolloop._temporal.converter import data_converter
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker, workflow_runner
from toolloop.workflows.agent import AgentWorkflow

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("model", ["offline", "openai"])
async def test_worker_killed_mid_request_new_worker_finishes_with_every_call_answered_once(
    client: Client, settings: Settings, admin: httpx.AsyncClient, tmp_path: Path, model: str
) -> None:
    # The first read hangs at the service, so the worker dies while the call is in flight.
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 5000, "times": 1})
    env = worker_env(settings)
    async with contextlib.AsyncExitStack() as stack:
        if model == "openai":
            # A model behind a network call: each turn an activity of its own, the conversation rebuilt from
            # history by a worker that did not run the earlier turns.
            responses = await stack.enter_async_context(FakeResponsesServer())
            responses.enqueue(
                body=completed_response([function_call_item("get_order_status", {"orderId": "A100"}, call_id="fc_1")])
            )
            responses.enqueue(body=completed_response([message_item("A100 ships with DHL.")]))
            # Plain answers: this server answers with a body, not a stream (streaming has tests of its own).
            env = {**env, "OPENAI_API_KEY": API_KEY, "OPENAI_BASE_URL": responses.url, "OPENAI_STREAM": "false"}
        first = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "first.log")
        stack.callback(first.kill9)
        handle = await start_agent(
            client,
            settings,
            "Where is my order A100?",
            model=ModelSpec(provider=model),
            limits=Limits(tool_timeout_seconds=2),
        )

        async def read_in_flight() -> bool:
            return any(r["path"] == "/orders/A100" for r in await service_requests(admin, "/orders"))

        await assert_eventually(read_in_flight, what="the first worker's read reached the service")
        first.kill9()
        assert not first.alive()
        second = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "second.log")
        stack.callback(second.stop)
        result = await asyncio.wait_for(request_result(handle), timeout=90)

    assert (result.status, result.stop_reason) == ("completed", "final_answer")
    assert result.final_text is not None and "DHL" in result.final_text
    [record] = result.calls
    outputs = await tool_outputs(handle)
    assert list(outputs) == [record.call_id] and outputs[record.call_id]["carrier"] == "DHL"
    # The abandoned attempt and its retry: a read may run twice, the model saw one answer.
    assert [r["path"] for r in await service_requests(admin, "/orders")] == ["/orders/A100", "/orders/A100"]
    # The new worker had no cached conversation: it rebuilt turn 1, and the read's output it refers to, from
    # the workflow's history - for a model behind a network call and for one in the worker's process alike.
    assert "conversation rebuilt from history" in (tmp_path / "second.log").read_text()
    if model == "openai":
        [_, second_turn] = responses.requests
        [given] = [i for i in second_turn["input"] if i["type"] == "function_call_output"]
        assert given["call_id"] == "fc_1" and json.loads(given["output"])["carrier"] == "DHL"


async def test_stored_histories_replay_deterministically(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    handles = []
    async with running_worker(client, settings, build_demo(settings.service_url), max_cached_workflows=0):
        # A write with an approval Update, a lost reply and a status query, then a repeat of it.
        await set_faults(
            admin, {"method": "POST", "path_regex": "^/orders/A104/refunds$", "when": "after_commit", "action": "drop"}
        )
        refund = call("refund_order", {"orderId": "A104", "amountCents": 10, "reason": "replay"}, "w1")
        again = {**refund, "call_id": "w2"}
        handle = await start_agent(
            client,
            settings,
            "w",
            model=script_spec([refund], [again], [say("ok")]),
            limits=Limits(write_timeout_seconds=3),
        )
        async with approving(handle, business_service.approval_key):
            result = await asyncio.wait_for(request_result(handle), timeout=60)
        assert [op.state for op in result.operations] == ["verified"]
        handles.append(handle)

        await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 300})
        turn = [
            call("get_order_status", {"orderId": "A100"}, "slow"),
            call("get_order_status", {"orderId": "A102"}, "fast"),
            call("nope", {}, "bad"),
        ]
        for request, kwargs in [
            ("Where is my order A100?", {}),
            ("x", {"model": script_spec(turn, [say("ok")])}),
            ("x", {"model": script_spec(turn, turn), "limits": Limits(max_rounds=1)}),
        ]:
            _, handle = await run_agent(client, settings, request, **kwargs)
            handles.append(handle)
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    for handle in handles:
        await replayer.replay_workflow(await handle.fetch_history())


# --- The real Responses adapter, through the workflow -------------------------------------------------

API_KEY = "sk-test-" + uuid.uuid4().hex


@pytest.fixture
async def responses_server() -> AsyncIterator[FakeResponsesServer]:
    with FakeResponsesServer() as server:
        yield server


@pytest.fixture
async def openai_worker(
    client: Client, settings: Settings, responses_server: FakeResponsesServer
) -> AsyncIterator[Worker]:
    openai_settings = settings.model_copy(
        # Plain answers: this server answers with a body, not a stream (streaming has tests of its own).
        update={"openai_api_key": SecretStr(API_KEY), "openai_base_url": responses_server.url, "openai_stream": False}
    )
    async with running_worker(client, openai_settings, build_demo(openai_settings.service_url)) as w:
        yield w


async def test_responses_adapter_retries_429_and_sends_every_item_back(
    client: Client,
    settings: Settings,
    openai_worker: Worker,
    responses_server: FakeResponsesServer,
    admin: httpx.AsyncClient,
) -> None:
    reasoning = reasoning_item("rs_1", encrypted_content="opaque-1")
    responses_server.enqueue(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "1"})
    responses_server.enqueue(
        body=completed_response(
            [reasoning, function_call_item("get_order_status", {"orderId": "A100"}, call_id="fc_1")]
        )
    )
    responses_server.enqueue(body=completed_response([message_item("A100 shipped with DHL.")]))

    result, handle = await run_agent(client, settings, "Where is A100?", model=ModelSpec(provider="openai"))

    assert (result.status, result.final_text, result.rounds) == ("completed", "A100 shipped with DHL.", 2)
    assert [(c.call_id, c.ok) for c in result.calls] == [("fc_1", True)]
    sent = responses_server.requests
    assert len(sent) == 3  # 429, then the tool call, then the answer
    assert sent[0] == sent[1]  # the retry sent the same request
    tools = {t["name"]: t for t in sent[0]["tools"]}
    assert set(tools) == {
        "get_order_status",
        "list_my_orders",
        "get_ticket",
        "find_free_slots",
        "append_ticket_note",
        "create_calendar_event",
        "refund_order",
    }
    assert all(t["strict"] is True for t in tools.values())
    second_input = sent[2]["input"]
    assert second_input[0] == {"type": "message", "role": "user", "content": "Where is A100?"}
    assert reasoning in second_input  # reasoning items go back unchanged
    [output] = [i for i in second_input if i["type"] == "function_call_output"]
    assert output["call_id"] == "fc_1" and json.loads(output["output"])["carrier"] == "DHL"
    items = await conversation(handle)
    assert any(isinstance(i, OtherItem) and i.type == "reasoning" for i in items)
    assert [i.call_id for i in items if isinstance(i, FunctionCallOutputItem)] == ["fc_1"]
    assert len(await service_requests(admin, "/orders")) == 1


async def test_a_request_limited_to_some_tools_offers_only_those_and_forbids_the_rest(
    client: Client,
    settings: Settings,
    openai_worker: Worker,
    responses_server: FakeResponsesServer,
    admin: httpx.AsyncClient,
) -> None:
    # FAULTS.md M4: a refund this request was not given, asked for all the same (as planted text might).
    refund = {"orderId": "A100", "amountCents": 100, "reason": "asked"}
    responses_server.enqueue(body=completed_response([function_call_item("refund_order", refund, call_id="fc_r")]))
    responses_server.enqueue(body=completed_response([message_item("I cannot refund that here.")]))

    result, _ = await run_agent(
        client, settings, "Refund A100", model=ModelSpec(provider="openai"), allowed_tools=["get_order_status"]
    )

    # The model was offered only the allowed tool, on every turn.
    assert [[t["name"] for t in sent["tools"]] for sent in responses_server.requests] == [["get_order_status"]] * 2
    # The refund was answered FORBIDDEN, became no operation, and never reached the service.
    assert [(c.call_id, c.ok, c.code) for c in result.calls] == [("fc_r", False, "FORBIDDEN")]
    [output] = [i for i in responses_server.requests[1]["input"] if i["type"] == "function_call_output"]
    assert json.loads(output["output"])["code"] == "FORBIDDEN"
    assert result.operations == [] and await service_requests(admin, "/orders") == []


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": {"message": "Invalid schema for function"}}, "Invalid schema for function"),
        (200, "this is not json", "not JSON"),
        (200, completed_response([], status="incomplete"), "incomplete"),
        (200, {"status": "completed", "output": {"not": "a list"}}, "output"),
    ],
)
async def test_responses_adapter_definite_failures_stop_without_retry(
    client: Client,
    settings: Settings,
    openai_worker: Worker,
    responses_server: FakeResponsesServer,
    status: int,
    body: object,
    expected: str,
) -> None:
    responses_server.enqueue(status=status, body=body)

    result, _ = await run_agent(client, settings, "Where is A100?", model=ModelSpec(provider="openai"))

    assert (result.status, result.stop_reason, result.calls) == ("failed", "model_error", [])
    assert result.error is not None and expected in result.error
    assert API_KEY not in result.error
    assert len(responses_server.requests) == 1
