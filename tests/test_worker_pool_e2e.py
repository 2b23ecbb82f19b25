"""End to end: a pool of two real `python worker.py --tools demo.agent:build` processes on one task queue (what
docker-compose's `deploy.replicas` runs) shares the work, and losing one to SIGKILL mid-request loses nothing:
the other finishes every request, every call_id is answered once, and a write in flight at the kill makes
exactly one effect in the service's own table. Which process ran what is read from the workflow histories
(the worker identity, `pid@host`, on each task-started event)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from devstack.processes import ManagedProcess, start_worker
from tests.agent_helpers import (
    approving,
    assert_eventually,
    call,
    effects,
    say,
    script_spec,
    service_requests,
    set_faults,
    start_agent,
    ticket_version,
    tool_outputs,
    worker_env,
)
from tests.conftest import REPO_ROOT
from toolloop._core.contracts import AgentResult, Limits
from toolloop._core.names import EXECUTE_WRITE_ACTIVITY, RUN_TOOL_ACTIVITY
from toolloop._temporal.results import request_result
from toolloop._temporal.settings import Settings

pytestmark = pytest.mark.e2e

# The orders of u1 (acme) in the demo's seed data.
ORDERS = ["A100", *(f"A{n}" for n in range(102, 126))]


def orders(request: int, count: int) -> list[str]:
    """`count` distinct orders of u1 for the request numbered `request` (they wrap around the 25)."""
    return [ORDERS[(request * count + i) % len(ORDERS)] for i in range(count)]


@pytest.fixture
async def pool(settings: Settings, tmp_path: Path) -> AsyncIterator[list[ManagedProcess]]:
    """Two worker processes on this test's task queue, started side by side; stopped (only these) after."""
    env = worker_env(settings)
    started = await asyncio.gather(
        *(asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / f"worker-{n}.log") for n in (1, 2)),
        return_exceptions=True,
    )
    workers = [proc for proc in started if isinstance(proc, ManagedProcess)]
    try:
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        yield workers
    finally:
        for proc in workers:
            proc.stop()


def _pid(identity: str) -> int:
    # The Python SDK's default worker identity is "pid@host".
    return int(identity.split("@", 1)[0])


async def task_pids(handle: WorkflowHandle[Any, Any], *, after: datetime | None = None) -> list[int]:
    """The pid of the worker that took each workflow and activity task, in history order (those started after
    `after` only, when given)."""
    history = await handle.fetch_history()
    pids = []
    for event in history.events:
        if after is not None and event.event_time.ToDatetime(tzinfo=UTC) <= after:
            continue
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            pids.append(_pid(event.workflow_task_started_event_attributes.identity))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            pids.append(_pid(event.activity_task_started_event_attributes.identity))
    return pids


async def running_activities(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, int]]:
    """(activity type, worker pid) of each activity a worker is executing right now."""
    description = await handle.describe()
    return [
        (pending.activity_type.name, _pid(pending.last_worker_identity))
        for pending in description.raw_description.pending_activities
        if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED and pending.last_worker_identity
    ]


def reads(orders: list[str], rounds: int, prefix: str) -> list[list[dict[str, Any]]]:
    """A script: `rounds` turns of two parallel reads each, then an answer."""
    turns = [
        [call("get_order_status", {"orderId": order}, f"{prefix}-r{n}-{order}") for order in orders[2 * n : 2 * n + 2]]
        for n in range(rounds)
    ]
    return [*turns, [say("done")]]


def assert_answered(result: AgentResult, outputs: dict[str, dict[str, Any]], calls: int) -> None:
    assert (result.status, result.stop_reason, result.final_text) == ("completed", "final_answer", "done")
    assert len(outputs) == len(result.calls) == calls
    assert all(output["ok"] is True for output in outputs.values()), outputs


async def test_two_worker_processes_share_the_requests_and_answer_every_call_once(
    client: Client, settings: Settings, admin: httpx.AsyncClient, pool: list[ManagedProcess]
) -> None:
    # A little latency keeps both workers busy at once, so neither drains the queue alone.
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/", "latency_ms": 100})
    handles = [
        await start_agent(client, settings, f"reads {n}", model=script_spec(*reads(orders(n, 4), 2, f"q{n}")))
        for n in range(8)
    ]
    results = await asyncio.wait_for(asyncio.gather(*(request_result(h) for h in handles)), timeout=120)

    pids_by_request = []
    for handle, result in zip(handles, results, strict=True):
        assert_answered(result, await tool_outputs(handle), calls=4)
        pids_by_request.append(set(await task_pids(handle)))
    # Only these two processes took tasks, and both did: the pool shared the work.
    every_pid = set().union(*pids_by_request)
    assert every_pid == {proc.pid for proc in pool}, (every_pid, [proc.pid for proc in pool])
    # Every read reached the service once (no worker lost a task, none was run twice).
    logged = [r["path"] for r in await service_requests(admin, "/orders/")]
    assert sorted(logged) == sorted(f"/orders/{order}" for n in range(8) for order in orders(n, 4))


async def test_a_worker_killed_mid_request_loses_nothing_the_other_finishes_every_request(
    client: Client, settings: Settings, admin: httpx.AsyncClient, pool: list[ManagedProcess]
) -> None:
    await set_faults(
        admin,
        # Reads are slow, so several are in flight on both workers when one dies.
        {"method": "GET", "path_regex": "^/orders/", "latency_ms": 1500},
        # The note commits, then its reply stalls: the write is in flight, its effect already made.
        {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "latency_ms": 60000},
    )
    # The write's attempt stays in flight for its whole timeout (its reply never comes in time), long enough
    # for the checks below to see it there on a busy machine; reads time out sooner, so the survivor takes
    # them over.
    limits = Limits(tool_timeout_seconds=4, write_timeout_seconds=15, unknown_resolution_seconds=30)
    version = await ticket_version(settings.service_url)
    note = {"ticketId": "T1001", "text": "written while a worker died", "expectedVersion": version}
    writer = await start_agent(
        client,
        settings,
        "note",
        model=script_spec([call("append_ticket_note", note, "w1")], [say("done")]),
        limits=limits,
    )
    readers = [
        await start_agent(
            client,
            settings,
            f"reads {n}",
            model=script_spec(*reads(orders(n, 8), 4, f"k{n}")),
            limits=limits,
        )
        for n in range(4)
    ]
    async with approving(writer) as approved:

        async def decided() -> bool:
            return bool(approved)

        await assert_eventually(decided, within=30, what="the note was approved")
    # Out of the block: nothing polls the workflows with queries while a worker dies.
    [operation_id] = approved

    holder: list[int] = []

    async def write_in_flight() -> bool:
        # Committed at the service, and its one attempt still running on a worker (the reply stalls).
        holder[:] = [pid for name, pid in await running_activities(writer) if name == EXECUTE_WRITE_ACTIVITY]
        return bool(holder) and bool(await effects(admin, operation_id))

    await assert_eventually(write_in_flight, within=30, what="the note is committed and its reply in flight")
    [victim] = [proc for proc in pool if proc.pid == holder[0]]
    [survivor] = [proc for proc in pool if proc is not victim]

    async def victim_also_reads() -> bool:
        # Every read is an activity: slow ones are in flight on both workers.
        running = [activity for h in readers for activity in await running_activities(h)]
        return (RUN_TOOL_ACTIVITY, victim.pid) in running

    await assert_eventually(victim_also_reads, within=10, what="the doomed worker holds reads in flight too")
    # Still in flight on the doomed worker when it dies: what happens to it next is the survivor's.
    assert await write_in_flight() and holder == [victim.pid]
    victim.kill9()
    killed_at = datetime.now(UTC)
    assert not victim.alive() and survivor.alive()

    results = await asyncio.wait_for(asyncio.gather(*(request_result(h) for h in [writer, *readers])), timeout=150)

    for handle, result in zip(readers, results[1:], strict=True):
        assert_answered(result, await tool_outputs(handle), calls=8)
    written = results[0]
    assert (written.status, written.stop_reason) == ("completed", "final_answer")
    [op] = written.operations
    # The only attempt's reply never came back; the status query found it done, the read-back verified it.
    assert (op.operation_id, op.state, op.call_ids, op.attempts) == (operation_id, "verified", ["w1"], 1)
    assert list(await tool_outputs(writer)) == ["w1"]
    [effect] = await effects(admin, operation_id)
    assert (effect["kind"], effect["text"]) == ("note", note["text"])
    assert [r["method"] for r in await service_requests(admin, "/tickets/T1001/notes")] == ["POST"]
    # Both processes worked on these requests; everything after the kill was the survivor's.
    pids = [await task_pids(h) for h in [writer, *readers]]
    assert {pid for request in pids for pid in request} == {victim.pid, survivor.pid}
    # Everything after the kill was the survivor's (a reader may have finished on the doomed worker before
    # it: every step is an activity, which either worker may take).
    after = [await task_pids(h, after=killed_at) for h in [writer, *readers]]
    assert after[0] and {pid for request in after for pid in request} == {survivor.pid}
