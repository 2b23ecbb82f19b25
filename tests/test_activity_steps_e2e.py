"""End to end: every step of a request - each model turn, each read, each write attempt - is an activity of its
own, and the run's history holds no marker (no local activity, no patch): a local activity's result can reach
the workflow a task after its marker when a query arrives meanwhile, and a replay then takes another path.
Nothing is lost by it: every call answered once, each output stored once, what each turn was given still in
history."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from demo.agent import build as build_demo
from tests.agent_helpers import (
    REMOTE_SCRIPT,
    RemoteScriptModel,
    activity_steps,
    approving,
    call,
    effects,
    marker_count,
    model_turns,
    run_agent,
    say,
    script_spec,
    service_requests,
    set_faults,
    start_agent,
    ticket_version,
    tool_outputs,
)
from toolloop import ConversationItem, FunctionCallOutputItem, request_result
from toolloop._core.contracts import AgentProgress, ModelTurnInput, OperationRecord
from toolloop._core.names import GET_LEDGER_QUERY, GET_PROGRESS_QUERY, MODEL_TURN_ACTIVITY, RUN_TOOL_ACTIVITY
from toolloop._models.adapter import ModelRequest
from toolloop._temporal.converter import data_converter
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e


class SeeingRemoteScript(RemoteScriptModel):
    """The remote script model, noting the tool outputs each turn was shown (turn -> call_id -> output)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs_seen: dict[int, dict[str, Any]] = {}
        # Per turn: which request the call said it serves, and its starter's labels.
        self.requests_seen: dict[int, tuple[str, dict[str, str]]] = {}

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        outputs = [i for i in request.conversation if isinstance(i, FunctionCallOutputItem)]
        self.outputs_seen[request.turn] = {i.call_id: json.loads(i.output) for i in outputs}
        self.requests_seen[request.turn] = (request.request_id, dict(request.metadata))
        return await super().respond(request)


async def stored_turn_inputs(handle: WorkflowHandle[Any, Any], turn: int) -> list[ModelTurnInput]:
    """The inputs of turn `turn` as history stores them."""
    found: list[ModelTurnInput] = []
    async for event in handle.fetch_history_events():
        attrs = event.activity_task_scheduled_event_attributes
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and attrs.activity_type.name == (
            MODEL_TURN_ACTIVITY
        ):
            [inp] = await data_converter().decode(attrs.input.payloads, [ModelTurnInput])
            found += [inp] if inp.turn == turn else []
    return found


async def test_reads_and_an_in_process_models_turns_are_activities_and_each_output_is_stored_once(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 300})
    reads = [
        call("get_order_status", {"orderId": "A100"}, "slow"),
        call("get_order_status", {"orderId": "A102"}, "fast"),
        call("get_order_status", {"orderId": "A1"}, "bad"),
    ]
    again = [call("get_ticket", {"ticketId": "T1001"}, "t1")]
    result, handle = await run_agent(client, settings, "x", model=script_spec(reads, again, [say("done")]))

    assert (result.status, result.final_text, result.rounds) == ("completed", "done", 3)
    assert [(c.call_id, c.code) for c in result.calls] == [
        ("slow", None),
        ("fast", None),
        ("bad", "BAD_ARGUMENTS"),
        ("t1", None),
    ]
    # The script model runs in the worker's process; its turns are activities all the same.
    assert await activity_steps(handle) == [
        MODEL_TURN_ACTIVITY,
        RUN_TOOL_ACTIVITY,
        RUN_TOOL_ACTIVITY,
        MODEL_TURN_ACTIVITY,
        RUN_TOOL_ACTIVITY,
        MODEL_TURN_ACTIVITY,
    ]
    assert await marker_count(handle) == 0
    # Each read ran once, at the service; the invalid one never left.
    assert sorted(r["path"] for r in await service_requests(admin, "/orders")) == ["/orders/A100", "/orders/A102"]
    assert [r["path"] for r in await service_requests(admin, "/tickets")] == ["/tickets/T1001"]
    # What each turn was given is in history, each call answered exactly once.
    outputs = await tool_outputs(handle)
    assert set(outputs) == {"slow", "fast", "bad", "t1"}
    assert outputs["slow"]["order_id"] == "A100" and outputs["bad"]["code"] == "BAD_ARGUMENTS"
    # The reads' outputs are stored once, as their activities' results: the second turn's input refers to
    # them and carries only the rejection, which no activity produced.
    [stored] = await stored_turn_inputs(handle, turn=2)
    assert stored.outputs_in_history == ["slow", "fast"]
    assert [(i.call_id, bool(i.output)) for i in stored.new_items if isinstance(i, FunctionCallOutputItem)] == [
        ("slow", False),
        ("fast", False),
        ("bad", True),
    ]


async def test_an_approved_write_is_an_activity_done_once_and_verified(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    version = await ticket_version(settings.service_url)
    note = call("append_ticket_note", {"ticketId": "T1001", "text": "activities", "expectedVersion": version}, "w1")
    handle = await start_agent(
        client, settings, "w", model=script_spec([call("get_ticket", {"ticketId": "T1001"}, "r1")], [note], [say("ok")])
    )
    async with approving(handle) as approved:
        result = await asyncio.wait_for(request_result(handle), timeout=60)

    [op] = result.operations
    assert (result.status, op.state, approved) == ("completed", "verified", [op.operation_id])
    assert len(await effects(admin, op.operation_id)) == 1
    assert await activity_steps(handle) == [
        MODEL_TURN_ACTIVITY,
        RUN_TOOL_ACTIVITY,
        MODEL_TURN_ACTIVITY,
        "execute_write",
        MODEL_TURN_ACTIVITY,
    ]
    assert await marker_count(handle) == 0
    outputs = await tool_outputs(handle)
    assert outputs["w1"]["state"] == "verified" and outputs["w1"]["operation_id"] == op.operation_id
    # The write's output is stored once: its attempt read the effect back, so the attempt's input and result
    # hold all of it and the last turn's input only refers to it. Read back from there, it is exactly what
    # the workflow told the model.
    [told] = await stored_turn_inputs(handle, turn=3)
    assert told.outputs_in_history == ["w1"]
    [ledger] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    assert ledger.output == outputs["w1"] and ledger.output["result"]["ticket_id"] == "T1001"


async def test_a_remote_model_is_told_a_writes_output_by_reference_and_given_it_whole(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    version = await ticket_version(settings.service_url)
    note = call("append_ticket_note", {"ticketId": "T1001", "text": "remote turns", "expectedVersion": version}, "w1")
    spec = build_demo(settings.service_url)
    model_adapter = SeeingRemoteScript()
    spec = dataclasses.replace(spec, models={**spec.models, REMOTE_SCRIPT: model_adapter})
    async with running_worker(client, settings, spec):
        read = call("get_ticket", {"ticketId": "T1001"}, "r1")
        model = script_spec([read], [note], [say("ok")]).model_copy(update={"provider": REMOTE_SCRIPT})
        handle = await start_agent(client, settings, "w", model=model, metadata={"task": "bench-17"})
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=60)

        [op] = result.operations
        assert (result.status, result.final_text, op.state) == ("completed", "ok", "verified")
        # The adapter knows which request each call serves, and the labels its starter gave it.
        assert model_adapter.requests_seen == {turn: (handle.id, {"task": "bench-17"}) for turn in (1, 2, 3)}
        assert len(await effects(admin, op.operation_id)) == 1
        [ledger] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
        assert ledger.output is not None and ledger.output["state"] == "verified"
        # The model was told the write's outcome in its third turn, an activity. The write's attempt read the
        # effect back, so its input and result hold that output: the turn's stored input only refers to it,
        # and the model was given it whole (from the worker's output store).
        [told] = await stored_turn_inputs(handle, turn=3)
        [given] = [i for i in told.new_items if isinstance(i, FunctionCallOutputItem)]
        assert (told.outputs_in_history, given.output) == (["w1"], "")
        assert model_adapter.outputs_seen[3] == {"w1": ledger.output}
        # Read back from history (what another worker rebuilds), it is the same; and the report holds it.
        *_, (third, _) = await model_turns(handle)
        [rebuilt] = [i for i in third.new_items if isinstance(i, FunctionCallOutputItem)]
        assert json.loads(rebuilt.output) == ledger.output
        assert op.output == ledger.output
        assert op == ledger
        progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
        assert result.calls == progress.calls and [(c.call_id, c.round) for c in result.calls] == [("r1", 1), ("w1", 2)]
