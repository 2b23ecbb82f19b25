"""Records the workflow histories committed under tests/histories/, one per scenario family, which
tests/test_replay_histories.py replays with the current workflow code (FAULTS W8: an incompatible change
must fail CI).

Refresh them only after a deliberate change that old histories may not survive (and say so in the commit):

    .venv/bin/python -m tests.record_histories [NAME ...]

With names, only those are recorded: the others stay as earlier code recorded them, so they keep checking
that today's code still replays what is already in flight.

It starts its own Temporal dev server, business service and in-process worker on free loopback ports, runs
each scenario against them, writes tests/histories/<name>.json and stops everything it started."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client, WorkflowHandle

from demo.agent import build as build_demo
from devstack.processes import free_port, start_business_service, start_temporal_dev_server
from tests.agent_helpers import (
    METERED_SCRIPT,
    REMOTE_SCRIPT,
    U1,
    MeteredScriptModel,
    RemoteScriptModel,
    approving,
    call,
    decide,
    say,
    script_spec,
    set_faults,
    start_agent,
    ticket_version,
    waiting_operation,
)
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, REPO_ROOT
from toolloop import AgentSpec, ToolloopClient, request_result
from toolloop._core.contracts import AgentResult, ApprovalRequest, Limits, ModelSpec, OperationRecord
from toolloop._core.names import GET_LEDGER_QUERY
from toolloop._temporal.converter import data_converter
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

HISTORIES = Path(__file__).resolve().parent / "histories"

Scenario = Callable[[Client, Settings, httpx.AsyncClient], Awaitable[WorkflowHandle[Any, AgentResult]]]


async def _finished(handle: WorkflowHandle[Any, AgentResult]) -> WorkflowHandle[Any, AgentResult]:
    await asyncio.wait_for(request_result(handle), timeout=120)
    return handle


async def read_loop(client: Client, settings: Settings, admin: httpx.AsyncClient) -> WorkflowHandle[Any, AgentResult]:
    """Parallel reads (one slow), a call that fails validation, an unknown tool, then the answer."""
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 300})
    turn = [
        call("get_order_status", {"orderId": "A100"}, "slow"),
        call("get_order_status", {"orderId": "A102"}, "fast"),
        call("get_order_status", {"orderId": "A\u0661\u0660\u0660"}, "unicode_digits"),
        call("nope", {}, "unknown"),
    ]
    handle = await start_agent(client, settings, "orders?", model=script_spec(turn, [say("ok")]))
    return await _finished(handle)


async def offline_model(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    handle = await start_agent(client, settings, "Where is my order A100?", model=ModelSpec(provider="offline"))
    return await _finished(handle)


async def write_lost_reply(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """An approved refund whose reply is lost: status query, read-back; then the same write again."""
    await set_faults(
        admin, {"method": "POST", "path_regex": "^/orders/A104/refunds$", "when": "after_commit", "action": "drop"}
    )
    refund = call("refund_order", {"orderId": "A104", "amountCents": 10, "reason": "replay"}, "w1")
    again = {**refund, "call_id": "w2"}
    handle = await start_agent(
        client, settings, "w", model=script_spec([refund], [again], [say("ok")]), limits=Limits(write_timeout_seconds=3)
    )
    async with approving(handle):
        return await _finished(handle)


async def write_rejected(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    note = call("append_ticket_note", {"ticketId": "T1003", "text": "no", "expectedVersion": 1}, "w1")
    handle = await start_agent(client, settings, "w", model=script_spec([note], [say("ok")]))
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id, approve=False)
    return await _finished(handle)


async def write_expired_at_deadline(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    event = {
        "calendarId": "cal-u1",
        "title": "Caf\u00e9",
        "start": "2026-12-03T12:00:00+02:00",
        "end": "2026-12-03T11:00:00Z",
        "attendees": ["b@example.com", "a@example.com"],
    }
    turn = [call("create_calendar_event", event, "w1")]
    handle = await start_agent(
        client, settings, "w", model=script_spec(turn, [say("ok")]), limits=Limits(deadline_seconds=2)
    )
    return await _finished(handle)


async def per_round_cap(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """Over the per-round cap with reads and a write: the extra calls are answered, nothing more runs."""
    turn = [
        call("get_ticket", {"ticketId": "T1001"}, "r1"),
        call(
            "append_ticket_note",
            {"ticketId": "T1001", "text": "capped", "expectedVersion": await ticket_version(settings.service_url)},
            "w1",
        ),
        call("get_ticket", {"ticketId": "T1003"}, "r2"),
    ]
    handle = await start_agent(client, settings, "w", model=script_spec(turn), limits=Limits(max_calls_per_round=1))
    return await _finished(handle)


async def model_error(client: Client, settings: Settings, admin: httpx.AsyncClient) -> WorkflowHandle[Any, AgentResult]:
    """The model fails (its script runs out after one read)."""
    turn = [call("get_ticket", {"ticketId": "T1001"}, "r1")]
    handle = await start_agent(client, settings, "w", model=script_spec(turn))
    return await _finished(handle)


async def reads_by_reference(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """Reads whose outputs the next turn refers to (stored once), read whole by the offline model."""
    question = "Where are my orders A100 and A102?"
    handle = await start_agent(client, settings, question, model=ModelSpec(provider="offline"))
    return await _finished(handle)


async def write_verified_in_attempt(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """An approved note read back inside its write attempt; then one whose first read-back fails, read
    again by the read-back activity."""
    first = call(
        "append_ticket_note",
        {"ticketId": "T1001", "text": "in the attempt", "expectedVersion": await ticket_version(settings.service_url)},
        "w1",
    )
    second = call("append_ticket_note", {"ticketId": "T1001", "text": "by its activity", "expectedVersion": 2}, "w2")
    handle = await start_agent(client, settings, "w", model=script_spec([first], [second], [say("ok")]))
    async with approving(handle):
        await asyncio.wait_for(_first_verified(handle), timeout=60)
        await set_faults(admin, {"method": "GET", "path_regex": "^/tickets/T1001$", "status": 503, "times": 1})
        return await _finished(handle)


async def approved_note(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """Two reads in one round, then a note approved and verified."""
    reads = [call("get_order_status", {"orderId": order}, f"r-{order}") for order in ("A100", "A102")]
    note = call(
        "append_ticket_note",
        {"ticketId": "T1001", "text": "approved note", "expectedVersion": await ticket_version(settings.service_url)},
        "w1",
    )
    handle = await start_agent(client, settings, "w", model=script_spec(reads, [note], [say("ok")]))
    async with approving(handle):
        return await _finished(handle)


async def in_process_model(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """A model in the worker's process (the script's), every step an activity all the same: reads (one slow,
    one rejected), a turn proposing an approved note, and a turn answering."""
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 300})
    reads = [
        call("get_order_status", {"orderId": "A100"}, "slow"),
        call("get_order_status", {"orderId": "A102"}, "fast"),
        call("get_order_status", {"orderId": "A1"}, "bad"),
    ]
    note = call(
        "append_ticket_note",
        {"ticketId": "T1001", "text": "in process", "expectedVersion": await ticket_version(settings.service_url)},
        "w1",
    )
    handle = await start_agent(client, settings, "w", model=script_spec(reads, [note], [say("ok")]))
    async with approving(handle):
        return await _finished(handle)


async def remote_model_write(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """A model behind a network call (it needs the conversation) reads a ticket and proposes a note, approved
    and verified: the report holds the operation's arguments, digest, evidence, approval and output."""
    note = call(
        "append_ticket_note",
        {"ticketId": "T1001", "text": "remote model", "expectedVersion": await ticket_version(settings.service_url)},
        "w1",
    )
    model = script_spec([call("get_ticket", {"ticketId": "T1001"}, "r1")], [note], [say("ok")])
    handle = await start_agent(client, settings, "w", model=model.model_copy(update={"provider": REMOTE_SCRIPT}))
    async with approving(handle):
        return await _finished(handle)


async def calendar_event_write(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """A calendar event (arguments the check completes with defaults) approved, created with an id the
    service chooses, and read back in its own attempt."""
    write = call(
        "create_calendar_event",
        {"calendarId": "cal-u1", "title": "told", "start": "2027-02-01T10:00:00Z", "end": "2027-02-01T11:00:00Z"},
        "w1",
    )
    model = script_spec([call("get_order_status", {"orderId": "A100"}, "r1")], [write], [say("ok")])
    handle = await start_agent(client, settings, "w", model=model)
    async with approving(handle):
        return await _finished(handle)


async def approver_run(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> WorkflowHandle[Any, AgentResult]:
    """Two notes decided through toolloop's client: `run(approver=...)` starts the request with its first
    next_approval wait (update-with-start), each decision waits for the next operation (then_wait), and a
    second client only watches (`approvals()`), its last wait answered with nothing when the run ends."""
    version = await ticket_version(settings.service_url)
    first = call("append_ticket_note", {"ticketId": "T1001", "text": "first", "expectedVersion": version}, "w1")
    second = call("append_ticket_note", {"ticketId": "T1001", "text": "second", "expectedVersion": version + 1}, "w2")
    requests = ToolloopClient(client, task_queue=settings.task_queue, signing_key=APPROVAL_KEY, channel="test")
    watched: list[str] = []
    watcher: asyncio.Task[None] | None = None

    def approve(approval: ApprovalRequest) -> bool:
        nonlocal watcher
        if watcher is None:

            async def watch() -> None:
                async for seen in requests.request("approver-run", actor=U1).approvals():
                    watched.append(seen.operation_id)

            watcher = asyncio.ensure_future(watch())
        return True

    result = await asyncio.wait_for(
        requests.run(
            "two notes",
            actor=U1,
            request_id="approver-run",
            model=script_spec([first], [second], [say("ok")]),
            approver=approve,
        ),
        timeout=120,
    )
    if watcher is not None:
        await asyncio.wait_for(watcher, timeout=60)
    return client.get_workflow_handle(result.workflow_id, result_type=AgentResult)


async def budget_stop(client: Client, settings: Settings, admin: httpx.AsyncClient) -> WorkflowHandle[Any, AgentResult]:
    """A model that reports its usage (110 tokens a turn) reads twice; its 200-token budget is reached after the
    second turn, so the loop stops with `budget` before a third (the read of turn 2 still answered)."""
    turns = [call("get_order_status", {"orderId": "A100"}, "r1")], [call("get_ticket", {"ticketId": "T1001"}, "r2")]
    model = script_spec(*turns, [say("never asked for")]).model_copy(update={"provider": METERED_SCRIPT})
    handle = await start_agent(client, settings, "w", model=model, limits=Limits(max_total_tokens=200))
    return await _finished(handle)


async def _first_verified(handle: WorkflowHandle[Any, AgentResult]) -> None:
    while True:
        ledger = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
        if any(op.call_ids == ["w1"] and op.state == "verified" for op in ledger):
            return
        await asyncio.sleep(0.01)


SCENARIOS: dict[str, Scenario] = {
    "read_loop": read_loop,
    "offline_model": offline_model,
    "write_lost_reply": write_lost_reply,
    "write_rejected": write_rejected,
    "write_expired_at_deadline": write_expired_at_deadline,
    "per_round_cap": per_round_cap,
    "model_error": model_error,
    "reads_by_reference": reads_by_reference,
    "write_verified_in_attempt": write_verified_in_attempt,
    "approved_note": approved_note,
    "in_process_model": in_process_model,
    "remote_model_write": remote_model_write,
    "calendar_event_write": calendar_event_write,
    "approver_run": approver_run,
    "budget_stop": budget_stop,
}


def _recording_spec(service_url: str) -> AgentSpec:
    """The demo agent, plus the script model as if it were behind a network call, and as if its provider
    reported usage."""
    spec = build_demo(service_url)
    return replace(
        spec, models={**spec.models, REMOTE_SCRIPT: RemoteScriptModel(), METERED_SCRIPT: MeteredScriptModel()}
    )


async def record(directory: Path, only: set[str]) -> None:
    temporal = start_temporal_dev_server(directory / "temporal", free_port(), ui_port=None)
    port = free_port()
    token = secrets.token_urlsafe(16)
    service = start_business_service(
        directory / "service.sqlite", port, token, approval_verify_key=APPROVAL_VERIFY_KEY, cwd=REPO_ROOT
    )
    try:
        address = temporal.cmd[temporal.cmd.index("--port") + 1]
        client = await Client.connect(f"127.0.0.1:{address}", data_converter=data_converter())
        settings = Settings.model_validate(
            {
                "TEMPORAL_ADDRESS": f"127.0.0.1:{address}",
                "TOOLLOOP_TASK_QUEUE": "record-histories",
                "TOOLLOOP_SERVICE_URL": f"http://127.0.0.1:{port}",
                "TOOLLOOP_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY,
                "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
            }
        )
        HISTORIES.mkdir(exist_ok=True)
        async with (
            running_worker(client, settings, _recording_spec(settings.service_url), max_cached_workflows=0),
            httpx.AsyncClient(base_url=settings.service_url, headers={"X-Admin-Token": token}) as admin,
        ):
            for name, scenario in SCENARIOS.items():
                if only and name not in only:
                    continue
                (await admin.post("/admin/reset")).raise_for_status()
                handle = await scenario(client, settings, admin)
                history = await handle.fetch_history()
                # The workflow id is part of what replays: operation ids are derived from it.
                stored = {"workflow_id": handle.id, "history": json.loads(history.to_json())}
                text = json.dumps(stored, indent=1, sort_keys=True)
                (HISTORIES / f"{name}.json").write_text(text + "\n")
                print(f"recorded {name}: {len(history.events)} events")
    finally:
        service.stop()
        temporal.stop()


def main() -> None:
    # Names given: record only those (the others stay as recorded by earlier code, which must still replay).
    only = set(sys.argv[1:])
    unknown = only - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"error: no scenario {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="toolloop-histories-") as directory:
        asyncio.run(record(Path(directory), only))


if __name__ == "__main__":
    main()
