"""End to end: toolloop's one client (toolloop.ToolloopClient) on a real dev server, a demo worker and the
real business service. One call runs a request with a write, the approver seeing the exact payload before
anything is signed; a request id starts a request once and attaches after; another user's request looks
like none; decisions name the channel that sent them; cancel and follow work as the CLI and the API use
them."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, Interceptor, OutboundInterceptor, WorkflowUpdateFailedError
from temporalio.service import RetryConfig, RPCError, RPCStatusCode
from temporalio.worker import Worker

import toolloop
from devstack.processes import free_port, start_temporal_dev_server
from tests.agent_helpers import U1, assert_eventually, call, effects, say, script_spec, service_requests, ticket_version
from tests.conftest import APPROVAL_KEY
from toolloop._core.approvals import generate_signing_key, payload_digest
from toolloop._core.names import APPROVE_OPERATION_UPDATE, NEXT_APPROVAL_UPDATE
from toolloop._temporal.settings import Settings

pytestmark = pytest.mark.e2e

U2 = toolloop.Actor(user_id="u2", tenant_id="acme")


class _CallCounter(Interceptor):
    """Counts the client's starts and Updates (temporalio's public client interceptor)."""

    def __init__(self) -> None:
        self.made: dict[str, int] = {}

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Counting(next, self.made)


class _Counting(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, made: dict[str, int]) -> None:
        super().__init__(next)
        self._made = made

    def _count(self, what: str) -> None:
        self._made[what] = self._made.get(what, 0) + 1

    async def start_workflow(self, input: Any) -> Any:
        self._count("start")
        return await super().start_workflow(input)

    async def start_workflow_update(self, input: Any) -> Any:
        self._count("update")
        return await super().start_workflow_update(input)

    async def start_update_with_start_workflow(self, input: Any) -> Any:
        self._count("update_with_start")
        return await super().start_update_with_start_workflow(input)


def _client(client: Client, settings: Settings, *, key: str | None = APPROVAL_KEY) -> toolloop.ToolloopClient:
    return toolloop.ToolloopClient(client, task_queue=settings.task_queue, signing_key=key, channel="test-app")


def _note_script(note: dict[str, Any]) -> toolloop.ModelSpec:
    return script_spec([call("append_ticket_note", note, "w1")], [say("noted")])


async def _note(settings: Settings, text: str) -> dict[str, Any]:
    return {"ticketId": "T1001", "text": text, "expectedVersion": await ticket_version(settings.service_url)}


async def test_one_call_runs_a_write_the_approver_saw_exactly_and_the_service_did_once(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    note = await _note(settings, "client run")
    shown: list[toolloop.ApprovalRequest] = []

    async def approver(approval: toolloop.ApprovalRequest) -> bool:
        shown.append(approval)
        return True

    result = await asyncio.wait_for(
        _client(client, settings).run("add a note", actor=U1, model=_note_script(note), approver=approver), 120
    )
    [seen] = shown
    # What the approver was shown is the payload the service received, and the digest it signed covers it.
    assert seen.tool == "append_ticket_note" and seen.arguments == note
    assert seen.digest == payload_digest(seen.digest_subject, note)
    [op] = result.operations
    assert op.operation_id == seen.operation_id and op.state == "verified"
    assert op.approval is not None and op.approval.decision == "approved" and op.approval.by == "u1 via test-app"
    assert result.outcome == "answered" and result.final_text == "noted"
    [effect] = await effects(admin, op.operation_id)
    posts = [r for r in await service_requests(admin) if r["method"] == "POST"]
    assert len(posts) == 1 and effect["operation_id"] == op.operation_id


async def test_a_rejection_sends_nothing_and_a_sync_approver_works_too(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    note = await _note(settings, "client reject")
    result = await asyncio.wait_for(
        _client(client, settings).run("add a note", actor=U1, model=_note_script(note), approver=lambda _: False),
        120,
    )
    [op] = result.operations
    assert op.state == "denied" and op.approval is not None and op.approval.by == "u1 via test-app"
    assert result.outcome == "not_done"
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []
    assert await effects(admin, op.operation_id) == []


async def test_an_approver_that_leaves_an_operation_lets_another_client_decide_it_on_the_payload_it_fetched(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    note = await _note(settings, "decided elsewhere")
    starter = _client(client, settings, key=None)  # starts and sees, cannot sign
    approver = _client(client, settings)
    left: list[str] = []
    seen = asyncio.Event()

    def leave(approval: toolloop.ApprovalRequest) -> None:
        left.append(approval.operation_id)
        seen.set()

    started = await starter.start("add a note", actor=U1, model=_note_script(note), request_id="leave-it")
    leaving = asyncio.create_task(approver.request("leave-it", actor=U1).decide_each(leave))
    with pytest.raises(toolloop.ApprovalRefused, match="no approval signing key"):
        await starter.request("leave-it", actor=U1).decide_each(leave)
    # The approver that leaves it has seen it (an operation decided before it looked is never shown to it).
    await asyncio.wait_for(seen.wait(), 60)
    request = approver.request("leave-it", actor=U1)
    async for approval in request.approvals():
        [pending] = await request.pending_approvals()
        assert pending == approval and pending.arguments == note
        assert await request.approval(approval.operation_id) == approval
        receipt = await request.decide(approval, approve=True)
        assert receipt.state == "approved"
        break
    result = await asyncio.wait_for(started.result(), 120)
    # The approver that left it saw it once and decided nothing; its loop ends with the run.
    assert await asyncio.wait_for(leaving, 60) == []
    assert left == [approval.operation_id]
    assert [op.state for op in result.operations] == ["verified"]
    assert len(await effects(admin, result.operations[0].operation_id)) == 1


async def test_a_request_id_starts_one_request_and_attaches_after_and_another_users_looks_like_none(
    client: Client, settings: Settings, worker: Worker
) -> None:
    tl = _client(client, settings)
    first = await tl.start("hello", actor=U1, request_id="once", model=script_spec([say("hi")]))
    again = await tl.start("hello", actor=U1, request_id="once", model=script_spec([say("hi")]))
    assert (first.attached, again.attached) == (False, True)
    assert again.workflow_id == first.workflow_id and again.handle.run_id is None
    assert (await again.handle.describe()).run_id == (await first.handle.describe()).run_id
    # The same id with anything else submitted differently is another request, refused.
    for other in (
        {"question": "something else"},
        {"tools": ["get_ticket"]},
        {"metadata": {"task": "t-1"}},
        {"model": script_spec([say("hello")])},
    ):
        submission: dict[str, Any] = {"question": "hello", "model": script_spec([say("hi")]), **other}
        with pytest.raises(toolloop.RequestIdReused):
            await tl.start(submission.pop("question"), actor=U1, request_id="once", **submission)
    # Request ids are scoped to their user: u2's "once" is another request, and u1's is none of u2's.
    other = await tl.start("hello", actor=U2, request_id="once", model=script_spec([say("hi")]))
    assert other.attached is False and other.workflow_id != first.workflow_id
    with pytest.raises(toolloop.RequestNotFound):
        await tl.request_of_workflow(first.workflow_id, actor=U2)
    with pytest.raises(toolloop.RequestNotFound):
        await tl.request_of_workflow("no-such-workflow", actor=U1)
    mine = await tl.request_of_workflow(first.workflow_id, actor=U1)
    assert mine.request_id == "once"
    assert (await asyncio.wait_for(mine.result(), 60)).final_text == "hi"


async def test_follow_ends_with_the_finished_progress_and_cancel_stops_a_waiting_write(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    tl = _client(client, settings)
    note = await _note(settings, "to be cancelled")
    request = await tl.start("add a note", actor=U1, model=_note_script(note))
    phases: list[str] = []

    async def follow() -> toolloop.AgentProgress:
        last = None
        async for progress in request.follow():
            phases.append(progress.phase)
            last = progress
            if any(op.state == "awaiting_approval" for op in progress.operations) and not last.done:
                await request.cancel()
        assert last is not None
        return last

    last = await asyncio.wait_for(follow(), 120)
    assert last.done and phases[-1].startswith("finished")
    result = await request.result()
    # The numbered events a resuming stream reads: the last is the final one, with the outcome.
    page = await request.events(0)
    assert page.done and page.events[-1].kind == "final" and page.events[-1].data["outcome"] == result.outcome
    assert [e.seq for e in page.events] == list(range(1, len(page.events) + 1))
    assert (await request.events(len(page.events) - 1)).events == page.events[-1:]
    assert result.stop_reason == "cancelled"
    assert [op.state for op in result.operations] == ["expired"]  # never approved, never sent
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []


async def test_a_client_without_a_signing_key_refuses_to_run_with_an_approver_before_starting_anything(
    client: Client, settings: Settings
) -> None:
    tl = _client(client, settings, key=None)
    with pytest.raises(toolloop.ApprovalRefused, match="no approval signing key"):
        await tl.run("hello", actor=U1, request_id="never-started", approver=lambda _: True)
    with pytest.raises(toolloop.RequestNotFound):
        await tl.request_of_workflow(tl.request("never-started", actor=U1).workflow_id, actor=U1)


async def test_a_temporal_that_does_not_answer_is_an_error_never_a_missing_request(tmp_path: Path) -> None:
    # "Not found" would tell a caller the request does not exist, when nobody could look: a server of its own,
    # stopped under a connected client.
    port = free_port()
    server = start_temporal_dev_server(tmp_path, port, ui_port=None)
    try:
        temporal = await Client.connect(
            f"127.0.0.1:{port}", data_converter=toolloop.data_converter(), retry_config=RetryConfig(max_retries=0)
        )
        tl = toolloop.ToolloopClient(temporal)
        with pytest.raises(toolloop.RequestNotFound):
            await tl.request_of_workflow("ask-acme-u1-x", actor=U1)  # answered: there is none
    finally:
        server.stop()
    with pytest.raises(RPCError) as failed:
        await tl.request_of_workflow("ask-acme-u1-x", actor=U1)
    assert failed.value.status == RPCStatusCode.UNAVAILABLE


async def test_a_refusal_that_leaves_the_operation_waiting_is_raised_never_passed_over(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # A channel whose key the workers do not hold: every decision it signs is refused, and the operation
    # still waits. run() says so at once rather than returning "expired" when the approval runs out.
    wrong = _client(client, settings, key=generate_signing_key())
    note = await _note(settings, "wrong key")
    with pytest.raises(WorkflowUpdateFailedError):
        await asyncio.wait_for(
            wrong.run(
                "add a note", actor=U1, model=_note_script(note), request_id="wrong-key", approver=lambda _: True
            ),
            120,
        )
    request = wrong.request("wrong-key", actor=U1)
    [waiting] = await request.pending_approvals()
    await request.cancel()
    assert (await asyncio.wait_for(request.result(), 60)).stop_reason == "cancelled"
    assert await effects(admin, waiting.operation_id) == []


async def test_an_approver_that_fails_fails_run(client: Client, settings: Settings, worker: Worker) -> None:
    def broken(approval: toolloop.ApprovalRequest) -> bool:
        raise RuntimeError("the approver's own store is down")

    tl = _client(client, settings)
    note = await _note(settings, "broken approver")
    with pytest.raises(RuntimeError, match="store is down"):
        await asyncio.wait_for(
            tl.run("add a note", actor=U1, model=_note_script(note), request_id="broken", approver=broken), 120
        )
    request = tl.request("broken", actor=U1)
    await request.cancel()
    assert (await asyncio.wait_for(request.result(), 60)).stop_reason == "cancelled"


async def test_run_learns_each_approval_from_the_start_and_from_the_decision_before_it(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # Two writes in turn. The first wait rides the start (update-with-start, accepted in the run's first
    # workflow task), and each decision's Update also waits for the next operation: three Updates in all, no
    # query, no history followed.
    version = await ticket_version(settings.service_url)
    first = {"ticketId": "T1001", "text": "first", "expectedVersion": version}
    second = {"ticketId": "T1001", "text": "second", "expectedVersion": version + 1}
    model = script_spec(
        [call("append_ticket_note", first, "w1")], [call("append_ticket_note", second, "w2")], [say("both")]
    )
    shown: list[str] = []
    calls = _CallCounter()
    counted = Client(**{**client.config(), "interceptors": [calls]})
    result = await asyncio.wait_for(
        _client(counted, settings).run(
            "two notes", actor=U1, model=model, approver=lambda a: bool(shown.append(a.arguments["text"])) or True
        ),
        120,
    )
    assert shown == ["first", "second"] and [op.state for op in result.operations] == ["verified", "verified"]
    # One call started the run with its first wait; each decision was the only other Update sent.
    assert calls.made == {"update_with_start": 1, "update": 2}
    for op in result.operations:
        assert len(await effects(admin, op.operation_id)) == 1
    handle = client.get_workflow_handle(result.workflow_id)
    updates: list[tuple[str, Any]] = []
    names: dict[str, str] = {}
    first_task_done = False
    async for event in handle.fetch_history_events():
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            accepted = event.workflow_execution_update_accepted_event_attributes.accepted_request
            names[accepted.meta.update_id] = accepted.input.name
            if accepted.input.name == NEXT_APPROVAL_UPDATE:
                # The start's wait was accepted by the first workflow task, before any activity.
                assert not first_task_done
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            first_task_done = True
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            completed = event.workflow_execution_update_completed_event_attributes
            answer = json.loads(completed.outcome.success.payloads[0].data)
            updates.append((names[completed.meta.update_id], answer))
    [wait, decided_first, decided_second] = updates
    assert wait[0] == NEXT_APPROVAL_UPDATE and wait[1]["approval"]["arguments"] == first
    assert decided_first[0] == decided_second[0] == APPROVE_OPERATION_UPDATE
    assert decided_first[1]["state"] == "approved" and decided_first[1]["next"]["approval"]["arguments"] == second
    # The last decision waited until the request finished: nothing more to decide.
    assert decided_second[1]["next"] == {"approval": None}


async def test_run_with_an_approver_on_a_request_id_already_started_attaches_and_decides_it(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    note = await _note(settings, "attached run")
    tl = _client(client, settings)
    started = await tl.start("add a note", actor=U1, request_id="run-twice", model=_note_script(note))
    # Not the first call for this id: the update-with-start finds the run, and run() attaches and decides it.
    result = await asyncio.wait_for(
        tl.run("add a note", actor=U1, request_id="run-twice", model=_note_script(note), approver=lambda _: True),
        120,
    )
    assert result.workflow_id == started.workflow_id
    [op] = result.operations
    assert op.state == "verified" and len(await effects(admin, op.operation_id)) == 1


async def test_cancelling_an_approver_that_waits_for_the_next_operation_leaves_it_cancelled(
    client: Client, settings: Settings, worker: Worker
) -> None:
    note = await _note(settings, "left for later")
    tl = _client(client, settings)
    request = await tl.start("add a note", actor=U1, model=_note_script(note))
    left: list[str] = []
    # The approver leaves the operation to someone else, so the loop waits in the workflow for the next one.
    deciding = asyncio.ensure_future(request.decide_each(lambda a: left.append(a.operation_id)))

    async def shown() -> bool:
        return bool(left)

    await assert_eventually(shown, within=60, what="the operation was shown")
    deciding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await deciding
    # The request is untouched: the operation still waits, and a decision from elsewhere settles it.
    [waiting] = await request.pending_approvals()
    assert waiting.operation_id == left[0]
    await request.decide(waiting, approve=False)
    assert (await asyncio.wait_for(request.result(), 60)).operations[0].state == "denied"


async def test_what_waits_for_a_decider_says_when_it_may_leave_one_out_and_never_reads_as_nothing_waits(
    client: Client, settings: Settings, worker: Worker
) -> None:
    # A user of their own, so no other test's running requests are among theirs.
    requester = toolloop.Actor(user_id=f"u-{uuid.uuid4().hex[:8]}", tenant_id="acme")
    tl = _client(client, settings)
    started, waiting = [], []
    for i in range(2):
        request = await tl.start("add a note", actor=requester, model=_note_script(await _note(settings, f"waits {i}")))
        started.append(request)
        async for approval in request.approvals():
            waiting.append((request.workflow_id, approval.operation_id))
            break
    try:

        async def both_listed() -> bool:
            found = await tl.to_decide(requester)
            listed = [(request.workflow_id, approval.operation_id) for request, approval in found.approvals]
            return found.complete and sorted(listed) == sorted(waiting)

        await assert_eventually(both_listed, within=60, what="both waiting operations are listed, and all")
        # Read one request of two: what it lists waits, and it says there may be more.
        found = await tl.to_decide(requester, limit=1)
        assert not found.complete
        [(request, approval)] = found.approvals
        assert (request.workflow_id, approval.operation_id) in waiting

        # A request no worker serves (its queue has none): its operations are not known now, and the list says so
        # (before, that request counted as one where nothing waits).
        unserved = toolloop.ToolloopClient(client, task_queue=f"nobody-{uuid.uuid4().hex[:8]}", channel="test-app")
        orphan = await unserved.start("add a note", actor=requester, model=_note_script(await _note(settings, "x")))
        try:

            async def unknown_one_listed() -> bool:
                # The orphan is listed by visibility (a moment after its start) and cannot be asked.
                ids = [e.id async for e in client.list_workflows(f'WorkflowId = "{orphan.workflow_id}"')]
                return bool(ids)

            await assert_eventually(unknown_one_listed, within=60, what="visibility lists the unserved request")
            found = await tl.to_decide(requester)
            assert not found.complete
            assert sorted((r.workflow_id, a.operation_id) for r, a in found.approvals) == sorted(waiting)
        finally:
            await orphan.handle.terminate("test over")
    finally:
        for request in started:
            await request.cancel()
