"""Test helpers: start agent workflows, read their history, build scripted model turns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentProgress,
    AgentResult,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    Limits,
    ModelSpec,
    ModelTurnInput,
    ModelTurnResult,
    OperationRecord,
)
from toolloop._core.names import AGENT_WORKFLOW, GET_PROGRESS_QUERY, MODEL_TURN_ACTIVITY
from toolloop._temporal.approval_channel import fetch_approval_request, send_decision
from toolloop._temporal.settings import Settings

U1 = Actor(user_id="u1", tenant_id="acme")


async def waiting_operation(handle: WorkflowHandle[Any, Any]) -> OperationRecord:
    """The first operation waiting for approval, once the workflow has one."""
    found: list[OperationRecord] = []

    async def check() -> bool:
        progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
        found[:] = [op for op in progress.operations if op.state == "awaiting_approval"]
        return bool(found)

    await assert_eventually(check, what="an operation waits for approval")
    return found[0]


async def decide(
    handle: WorkflowHandle[Any, Any],
    operation_id: str,
    *,
    approve: bool = True,
    decider: Actor = U1,
    key: str = APPROVAL_KEY,
    ttl: float = 600,
) -> OperationRecord:
    """What the approval channel does: fetch the whole payload, sign the decision, send it."""
    request = await fetch_approval_request(handle, operation_id)
    assert request is not None, f"no operation {operation_id}"
    return await send_decision(handle, request, approve=approve, decider=decider, key=key, ttl_seconds=ttl)


@contextlib.asynccontextmanager
async def approving(
    handle: WorkflowHandle[Any, Any], key: str = APPROVAL_KEY, approver: Actor = U1, ttl: float = 600
) -> AsyncIterator[list[str]]:
    """Approve every operation the workflow asks about (what `ask --auto-approve` does)."""
    approved: list[str] = []

    async def loop() -> None:
        while True:
            progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
            for op in progress.operations:
                if op.state == "awaiting_approval" and op.operation_id not in approved:
                    await decide(handle, op.operation_id, decider=approver, key=key, ttl=ttl)
                    approved.append(op.operation_id)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(loop())
    try:
        yield approved
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def call(name: str, arguments: dict[str, Any] | str, call_id: str) -> dict[str, Any]:
    """A scripted `function_call` item; a str is sent verbatim (malformed JSON included)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "name": name, "arguments": args, "call_id": call_id}


def say(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def script_spec(*turns: list[dict[str, Any]]) -> ModelSpec:
    return ModelSpec.model_validate({"provider": "script", "script": [list(t) for t in turns]})


async def start_agent(
    client: Client,
    settings: Settings,
    request: str,
    *,
    user: str = "u1",
    tenant: str = "acme",
    model: ModelSpec | None = None,
    limits: Limits | None = None,
    verify_key: str | None = APPROVAL_VERIFY_KEY,
) -> WorkflowHandle[Any, AgentResult]:
    return await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request=request,
            actor=Actor(user_id=user, tenant_id=tenant),
            model=model or ModelSpec(provider="offline"),
            limits=limits or Limits(),
            approval_verify_key=verify_key,
        ),
        id=f"test-{uuid.uuid4().hex[:12]}",
        task_queue=settings.task_queue,
        result_type=AgentResult,
    )


async def run_agent(
    client: Client, settings: Settings, request: str, **kwargs: Any
) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
    handle = await start_agent(client, settings, request, **kwargs)
    return await asyncio.wait_for(handle.result(), timeout=120), handle


async def model_turns(handle: WorkflowHandle[Any, Any]) -> list[tuple[ModelTurnInput, ModelTurnResult | None]]:
    """Every model turn's input and result, decoded from the workflow's history."""
    converter = handle._client.data_converter
    inputs: dict[int, ModelTurnInput] = {}
    results: dict[int, ModelTurnResult] = {}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == MODEL_TURN_ACTIVITY:
                [inputs[event.event_id]] = await converter.decode(attrs.input.payloads, [ModelTurnInput])
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in inputs:
                [results[done.scheduled_event_id]] = await converter.decode(done.result.payloads, [ModelTurnResult])
    return [(inputs[k], results.get(k)) for k in sorted(inputs)]


async def conversation(handle: WorkflowHandle[Any, Any]) -> list[ConversationItem]:
    items: list[ConversationItem] = []
    for turn_input, turn_result in await model_turns(handle):
        items += turn_input.new_items
        if turn_result is not None:
            items += turn_result.items
    return items


async def tool_outputs(handle: WorkflowHandle[Any, AgentResult]) -> dict[str, dict[str, Any]]:
    """call_id -> parsed output, from the outputs the model received. Asserts invariant 2 on the whole
    run: every function_call is answered exactly once. Calls followed by another model turn must be
    answered in that turn's input; the calls of the last turn (a limit stopped the loop before the
    model saw their outputs) must each have exactly one record in the result."""
    turns = await model_turns(handle)
    result = await handle.result()
    outputs: list[FunctionCallOutputItem] = []
    calls: list[str] = []
    for turn_input, _ in turns:
        outputs += [i for i in turn_input.new_items if isinstance(i, FunctionCallOutputItem)]
    for number, (_, turn_result) in enumerate(turns):
        if turn_result is None:
            continue
        turn_calls = [i.call_id for i in turn_result.items if isinstance(i, FunctionCallItem)]
        calls += turn_calls
        if number + 1 < len(turns):
            answered = [o.call_id for o in turns[number + 1][0].new_items if isinstance(o, FunctionCallOutputItem)]
            assert sorted(answered) == sorted(set(turn_calls)), (
                f"turn {number + 1}: calls {turn_calls}, outputs {answered}"
            )
    answered = [o.call_id for o in outputs]
    assert len(answered) == len(set(answered)), f"a call_id was answered twice: {answered}"
    assert set(answered) <= set(calls), "an output answers no call"
    recorded = [c.call_id for c in result.calls]
    assert len(recorded) == len(set(recorded)), f"a call_id was recorded twice: {recorded}"
    assert set(recorded) == set(calls), f"calls {calls} but records {recorded}"
    return {o.call_id: json.loads(o.output) for o in outputs}


async def service_requests(admin: httpx.AsyncClient, path_prefix: str = "/") -> list[dict[str, Any]]:
    response = await admin.get("/admin/requests", params={"path_prefix": path_prefix})
    response.raise_for_status()
    return list(response.json()["requests"])


async def set_faults(admin: httpx.AsyncClient, *rules: dict[str, Any]) -> None:
    (await admin.put("/admin/faults", json={"rules": list(rules)})).raise_for_status()


async def assert_eventually(check: Callable[[], Awaitable[bool]], within: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not true within {within} s: {what}")


async def effects(admin: httpx.AsyncClient, operation_id: str) -> list[dict[str, Any]]:
    """The service's own effect rows made under one operation id."""
    response = await admin.get("/admin/effects", params={"operation_id": operation_id})
    response.raise_for_status()
    return list(response.json()["effects"])


def worker_env(settings: Settings, service_url: str | None = None) -> dict[str, str]:
    """The environment of a `python worker.py` process serving this test's task queue."""
    return {
        "TEMPORAL_ADDRESS": settings.temporal_address,
        "TOOLLOOP_TASK_QUEUE": settings.task_queue,
        "TOOLLOOP_SERVICE_URL": service_url or settings.service_url,
    }
