"""End to end: a worker's end-of-request hook (ToolloopPlugin(on_request_end=...)) runs once per request, after
its report is final, however the request ended (answered, cancelled, failed); a hook that fails changes
nothing the request did; a worker without a hook adds no step to any history; every history replays."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker

import toolloop
from demo.agent import build as build_demo
from tests.agent_helpers import U1, activity_steps, call, marker_count, say, script_spec, ticket_version
from tests.conftest import APPROVAL_VERIFY_KEY
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import ApprovalWait, NextApproval
from toolloop._core.names import NEXT_APPROVAL_UPDATE, REQUEST_ENDED_ACTIVITY
from toolloop._temporal.settings import Settings

pytestmark = pytest.mark.e2e

Hook = Callable[[toolloop.FinishedRequest], Awaitable[None]]


def _plugin(settings: Settings, hook: Hook | None) -> toolloop.ToolloopPlugin:
    return toolloop.ToolloopPlugin(
        build_demo(settings.service_url),
        approval_verify_key=APPROVAL_VERIFY_KEY,
        allow_scripted_models=True,
        on_request_end=hook,
    )


@asynccontextmanager
async def _worker(client: Client, settings: Settings, hook: Hook | None) -> AsyncIterator[None]:
    plugin = _plugin(settings, hook)
    async with plugin.toolset.opened(), Worker(client, task_queue=settings.task_queue, plugins=[plugin]):
        yield


async def _replays(handle: WorkflowHandle, settings: Settings) -> None:  # type: ignore[type-arg]
    history = await handle.fetch_history()
    replayed = await Replayer(workflows=[], plugins=[_plugin(settings, None)]).replay_workflow(history)
    assert replayed.replay_failure is None


async def test_the_hook_runs_once_after_an_answer_with_the_requests_labels(client: Client, settings: Settings) -> None:
    ended: list[toolloop.FinishedRequest] = []

    async def hook(finished: toolloop.FinishedRequest) -> None:
        ended.append(finished)

    tl = toolloop.ToolloopClient(client, task_queue=settings.task_queue)
    async with _worker(client, settings, hook):
        request = await tl.start(
            "hello", actor=U1, model=script_spec([say("hi")]), metadata={"task": "t-17"}, request_id="hooked"
        )
        result = await asyncio.wait_for(request.result(), 60)
    [finished] = ended
    run_id = (await request.handle.describe()).run_id
    assert (finished.workflow_id, finished.run_id) == (request.workflow_id, run_id)
    assert finished.actor == U1 and finished.metadata == {"task": "t-17"}
    assert (finished.status, finished.stop_reason, finished.outcome) == ("completed", "final_answer", "answered")
    assert result.outcome == "answered"
    # Its step comes last, after the report was made; the report itself is the workflow's result. Its patch
    # marker is the run's only one (a run that ended without the step, on older workflow code, replays).
    assert (await activity_steps(request.handle))[-1] == REQUEST_ENDED_ACTIVITY
    assert await marker_count(request.handle) == 1
    await _replays(request.handle, settings)


async def test_the_hook_runs_after_a_cancel_and_after_a_failure(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    ended: list[toolloop.FinishedRequest] = []

    async def hook(finished: toolloop.FinishedRequest) -> None:
        ended.append(finished)

    tl = toolloop.ToolloopClient(client, task_queue=settings.task_queue)
    note = {"ticketId": "T1001", "text": "never", "expectedVersion": await ticket_version(settings.service_url)}
    async with _worker(client, settings, hook):
        waiting = await tl.start(
            "add a note", actor=U1, model=script_spec([call("append_ticket_note", note, "w1")], [say("noted")])
        )
        async for _ in waiting.approvals():
            await waiting.cancel()
            break
        cancelled = await asyncio.wait_for(waiting.result(), 60)
        # A turn with neither a message nor a call: the request fails, with its report.
        silent = await tl.start("say nothing", actor=U1, model=script_spec([]))
        failed = await asyncio.wait_for(silent.result(), 60)
    assert cancelled.stop_reason == "cancelled" and failed.status == "failed"
    assert [(f.workflow_id, f.stop_reason, f.status) for f in ended] == [
        (waiting.workflow_id, "cancelled", "stopped"),
        (silent.workflow_id, failed.stop_reason, "failed"),
    ]
    for request in (waiting, silent):
        assert (await activity_steps(request.handle)).count(REQUEST_ENDED_ACTIVITY) == 1
        await _replays(request.handle, settings)


async def test_a_failing_hook_is_retried_and_changes_nothing_the_request_did(
    client: Client, settings: Settings
) -> None:
    attempts: list[str] = []

    async def hook(finished: toolloop.FinishedRequest) -> None:
        attempts.append(finished.workflow_id)
        raise RuntimeError("the hook's own store is down")

    tl = toolloop.ToolloopClient(client, task_queue=settings.task_queue)
    async with _worker(client, settings, hook):
        request = await tl.start("hello", actor=U1, model=script_spec([say("hi")]))
        result = await asyncio.wait_for(request.result(), 60)
    assert result.outcome == "answered" and result.final_text == "hi"
    assert attempts == [request.workflow_id] * 3  # io_retry_policy(3), then the request ends as it was
    await _replays(request.handle, settings)


async def test_a_worker_without_a_hook_adds_no_step(client: Client, settings: Settings) -> None:
    tl = toolloop.ToolloopClient(client, task_queue=settings.task_queue)
    async with _worker(client, settings, None):
        request = await tl.start("hello", actor=U1, model=script_spec([say("hi")]))
        await asyncio.wait_for(request.result(), 60)
    assert REQUEST_ENDED_ACTIVITY not in await activity_steps(request.handle)
    assert await marker_count(request.handle) == 0


async def test_a_request_that_finished_refuses_an_approver_while_its_hook_still_runs(
    client: Client, settings: Settings
) -> None:
    # The report is final and the hook runs, so the run is still open: the workflow's validator refuses a
    # next_approval (nothing more will wait), which leaves no trace in its history, and a follower ends.
    hook_running = asyncio.Event()
    release = asyncio.Event()

    async def hook(_: toolloop.FinishedRequest) -> None:
        hook_running.set()
        await release.wait()

    tl = toolloop.ToolloopClient(client, task_queue=settings.task_queue)
    async with _worker(client, settings, hook):
        request = await tl.start("hello", actor=U1, model=script_spec([say("hi")]))
        await asyncio.wait_for(hook_running.wait(), 60)
        assert (await request.handle.describe()).status == WorkflowExecutionStatus.RUNNING
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await request.handle.execute_update(NEXT_APPROVAL_UPDATE, ApprovalWait(), result_type=NextApproval)
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.type == ErrorType.REQUEST_FINISHED
        assert [a async for a in request.approvals()] == []
        release.set()
        result = await asyncio.wait_for(request.result(), 60)
    assert result.final_text == "hi"
    kinds = [event.event_type async for event in request.handle.fetch_history_events()]
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED not in kinds
    await _replays(request.handle, settings)
