"""End to end: threads (issue 26) on a real dev server, a demo worker and the real business service. A
follow-up is shown what happened before it (the question, each write with the outcome its ledger recorded,
the answer); the same write in a later message is the same operation and is never done twice, and one an
earlier message left unknown is settled by the service's status before anything is sent; messages sent at
once run one after another, in the order accepted; another user's thread id names another thread; and every
history replays."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer, Worker

import toolloop
from demo.agent import build as build_demo
from devstack.processes import free_port, start_temporal_dev_server, start_worker
from tests.agent_helpers import (
    U1,
    activity_steps,
    assert_eventually,
    call,
    conversation,
    decisions_in_history,
    effects,
    say,
    script_spec,
    service_requests,
    set_faults,
    ticket_version,
    tool_outputs,
    worker_env,
)
from tests.conftest import APPROVAL_KEY, REPO_ROOT, start_service
from toolloop._core.approvals import APPROVAL_WRONG_REQUEST, CLOCK_TOLERANCE_SECONDS
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import (
    AgentInput,
    AgentResult,
    DecisionAnswer,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ThreadContext,
    ThreadOperation,
)
from toolloop._core.names import AGENT_WORKFLOW, APPROVE_OPERATION_UPDATE
from toolloop._core.threads import KEPT_MESSAGES, MAX_QUEUED, MESSAGES_PER_RUN
from toolloop._temporal.converter import data_converter
from toolloop._temporal.plugin import workflow_runner
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker
from toolloop.workflows.agent import AgentWorkflow
from toolloop.workflows.thread import ThreadWorkflow

pytestmark = pytest.mark.e2e

U2 = toolloop.Actor(user_id="u2", tenant_id="acme")
# Writes settle fast here: a status or read-back that cannot conclude gives up in seconds.
FAST = toolloop.Limits(unknown_resolution_seconds=3, settle_seconds=5, status_max_attempts=2)


def _client(client: Client, settings: Settings) -> toolloop.ToolloopClient:
    return toolloop.ToolloopClient(client, task_queue=settings.task_queue, signing_key=APPROVAL_KEY, channel="test")


def _thread(client: Client, settings: Settings, actor: toolloop.Actor = U1) -> toolloop.ToolloopThread:
    return _client(client, settings).thread(f"t-{uuid.uuid4().hex[:8]}", actor=actor)


def _note(version: int, text: str) -> dict[str, Any]:
    return {"ticketId": "T1001", "text": text, "expectedVersion": version}


async def _note_posts(admin: httpx.AsyncClient) -> list[dict[str, Any]]:
    return [r for r in await service_requests(admin, "/tickets/T1001/notes") if r["method"] == "POST"]


async def _replays(client: Client, *handles: WorkflowHandle[Any, Any]) -> None:
    replayer = Replayer(
        workflows=[AgentWorkflow, ThreadWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner()
    )
    for handle in handles:
        await replayer.replay_workflow(await handle.fetch_history())


async def test_a_follow_up_is_shown_the_earlier_question_its_write_as_recorded_and_its_answer(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: first")
    first = await asyncio.wait_for(
        thread.run(
            "note that the parcel left",
            model=script_spec([call("append_ticket_note", note, "w1")], [say("Noted on T1001.")]),
            approver=lambda _: True,
        ),
        120,
    )
    [op] = first.operations
    assert op.state == "verified"
    second = await asyncio.wait_for(thread.run("which ticket was that?", model=script_spec([say("T1001.")])), 120)
    assert second.final_text == "T1001." and second.operations == []

    async def both_finished() -> bool:
        # A run's report comes from its request; the thread's list says finished once the thread's workflow has
        # seen that request close, a workflow task later.
        return [(m.number, m.state, m.outcome) for m in await thread.messages()] == [
            (1, "finished", "answered"),
            (2, "finished", "answered"),
        ]

    await assert_eventually(both_finished, what="both messages finished and answered in the thread's list")
    [one, two] = await thread.messages()
    request_two = client.get_workflow_handle(two.workflow_id)
    shown = await conversation(request_two)
    # Exactly what happened, in order: the question, the write with its recorded outcome, the answer, then the
    # new question; no read, nothing proposed as if done.
    assert [type(i).__name__ for i in shown[:5]] == [
        "MessageItem",
        "FunctionCallItem",
        "FunctionCallOutputItem",
        "MessageItem",
        "MessageItem",
    ]
    asked, write, outcome, answer, question = shown[:5]
    assert isinstance(asked, MessageItem) and asked.role == "user" and asked.text() == "note that the parcel left"
    assert isinstance(write, FunctionCallItem) and write.name == "append_ticket_note"
    assert json.loads(write.arguments) == note and write.call_id == "m1_w1"
    assert isinstance(outcome, FunctionCallOutputItem) and outcome.call_id == "m1_w1"
    told = json.loads(outcome.output)
    assert (told["state"], told["operation_id"], told["ok"]) == ("verified", op.operation_id, True)
    assert isinstance(answer, MessageItem) and answer.role == "assistant" and answer.text() == "Noted on T1001."
    assert isinstance(question, MessageItem) and question.text() == "which ticket was that?"
    await tool_outputs(request_two)  # every call of the message's own request answered exactly once
    assert len(await effects(admin, op.operation_id)) == 1

    # The UI finds the thread's requests by its id, and the thread's own workflow.
    query = f'ToolloopThread = "{thread.thread_id}"'

    async def listed() -> bool:
        found = {w.id async for w in client.list_workflows(query)}
        return found == {one.workflow_id, two.workflow_id, thread.workflow_id}

    await assert_eventually(listed, what="the thread's workflows listed by ToolloopThread")
    await _replays(client, thread.handle, client.get_workflow_handle(one.workflow_id), request_two)


async def test_the_same_write_in_a_later_message_is_the_same_operation_and_is_never_done_twice(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: once")
    first = await asyncio.wait_for(
        thread.run(
            "add the note",
            model=script_spec([call("append_ticket_note", note, "w1")], [say("Done.")]),
            approver=lambda _: True,
        ),
        120,
    )
    await asyncio.wait_for(thread.run("thanks", model=script_spec([say("You are welcome.")])), 120)
    shown: list[toolloop.ApprovalRequest] = []

    def approver(approval: toolloop.ApprovalRequest) -> bool:
        shown.append(approval)
        return True

    third = await asyncio.wait_for(
        thread.run(
            "add that note again",
            model=script_spec([call("append_ticket_note", note, "w1")], [say("It was already there.")]),
            approver=approver,
        ),
        120,
    )
    [op] = first.operations
    # Nothing asked and nothing sent: the thread's earlier message did it, and the model is told so.
    assert shown == [] and third.operations == []
    [message_one, _, message_three] = await thread.messages()
    outputs = await tool_outputs(client.get_workflow_handle(message_three.workflow_id))
    assert outputs["w1"]["state"] == "verified" and outputs["w1"]["operation_id"] == op.operation_id
    assert outputs["w1"]["done_by_earlier_request"] == message_one.request_id
    assert len(await effects(admin, op.operation_id)) == 1
    assert len(await _note_posts(admin)) == 1


async def test_a_write_an_earlier_message_left_unknown_is_settled_by_status_and_never_sent_again(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # Message 1: the service commits the note, the reply is lost, and its status cannot be read: unknown.
    await set_faults(
        admin,
        {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "action": "drop"},
        {"method": "GET", "path_regex": "^/operations/", "status": 503},
    )
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: unknown fate")
    first = await asyncio.wait_for(
        thread.run(
            "add the note",
            model=script_spec([call("append_ticket_note", note, "w1")], [say("I could not confirm it.")]),
            limits=FAST,
            approver=lambda _: True,
        ),
        120,
    )
    [op] = first.operations
    assert op.state == "unknown" and first.outcome == "unknown"
    (await admin.delete("/admin/faults")).raise_for_status()

    # Message 2 proposes the very same note: its status is asked first, it is found done, and nothing is
    # approved or sent again.
    shown: list[toolloop.ApprovalRequest] = []
    second = await asyncio.wait_for(
        thread.run(
            "try the note again",
            model=script_spec([call("append_ticket_note", note, "w9")], [say("It was done after all.")]),
            limits=FAST,
            approver=lambda a: shown.append(a) or True,
        ),
        120,
    )
    [again] = second.operations
    assert again.operation_id == op.operation_id
    assert again.state == "verified" and again.attempts == 0 and shown == []
    assert [c.state for c in again.status_checks] == ["completed"]
    assert again.transitions[:3] == ["proposed", "validated", "unknown"]
    assert len(await effects(admin, op.operation_id)) == 1
    assert len(await _note_posts(admin)) == 1
    # What message 2's model was shown of message 1: unknown, as its ledger recorded it.
    [_, two] = await thread.messages()
    shown_items = await conversation(client.get_workflow_handle(two.workflow_id))
    [earlier] = [i for i in shown_items if isinstance(i, FunctionCallOutputItem) and i.call_id == "m1_w1"]
    assert json.loads(earlier.output)["state"] == "unknown"


async def test_an_approval_given_in_an_earlier_message_is_refused_in_a_later_one_and_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # Message 1: the note is approved, but the service answers every attempt 503 before doing anything and its
    # status says not found: the note stays unknown, never done, with message 1's signed decision in its history.
    await set_faults(admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "status": 503})
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: approved in message 1 only")
    model = script_spec([call("append_ticket_note", note, "w1")], [say("Done.")])
    # A short deadline: no approval of message 1, and no attempt of it, outlives it.
    short = FAST.model_copy(update={"deadline_seconds": 6.0})
    first = await asyncio.wait_for(thread.run("add the note", model=model, limits=short, approver=lambda _: True), 120)
    [op] = first.operations
    assert (op.state, op.attempts) == ("unknown", FAST.max_write_attempts) and op.approval is not None
    assert await effects(admin, op.operation_id) == []
    (await admin.delete("/admin/faults")).raise_for_status()
    # Message 2 at once: the service has no record of the note, but an attempt of message 1 could still be on its
    # way and commit until message 1's deadline. So the note stays unknown: no approval asked, nothing sent.
    asked: list[toolloop.ApprovalRequest] = []
    at_once = await asyncio.wait_for(
        thread.run("add it now", model=model, limits=FAST, approver=lambda a: asked.append(a) or True), 120
    )
    [held] = at_once.operations
    assert (held.operation_id, held.state, held.attempts, asked) == (op.operation_id, "unknown", 0, [])
    assert [c.state for c in held.status_checks] == ["not_found"]
    assert "may still take effect until" in (held.output or {}).get("message", "")
    assert await effects(admin, op.operation_id) == []
    # Once message 1's deadline has passed (that instant is known: the clock is waited for), "not found" is
    # conclusive: the service refuses to commit an attempt whose approval has expired.
    assert op.may_commit_until is not None and held.may_commit_until == op.may_commit_until
    await asyncio.sleep(
        max((op.may_commit_until - datetime.now(UTC)).total_seconds() + CLOCK_TOLERANCE_SECONDS + 0.5, 0)
    )
    [one, _] = await thread.messages()
    message_one = client.get_workflow_handle(one.workflow_id)
    # What anyone who reads message 1's history can copy: its approve_operation Update's input.
    [copied] = await decisions_in_history(client, message_one)
    assert (copied.operation_id, copied.digest, copied.approve) == (op.operation_id, op.digest, True)

    # Message 3 proposes the very same note: not found at the service, so it waits for an approval of its own.
    second = await thread.request(await thread.send("add the note again", model=model, limits=FAST))
    approval = await anext(aiter(second.approvals()))
    assert (approval.operation_id, approval.digest) == (op.operation_id, op.digest)
    # Message 1's decision, sent to message 3 as it stands in message 1's history: refused as another request's
    # (before its expiry is even looked at), nothing recorded. While it was still valid, no message asked for an
    # approval of this note (message 2 above); tests/test_writes_e2e.py sends a valid decision of another request.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await second.handle.execute_update(APPROVE_OPERATION_UPDATE, copied, result_type=DecisionAnswer)
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == APPROVAL_WRONG_REQUEST
    assert [(o.state, o.approval) for o in await second.operations()] == [("awaiting_approval", None)]
    assert await effects(admin, op.operation_id) == []
    # A person's approval in message 3 sends it, once.
    await second.decide(approval, approve=True)
    report = await asyncio.wait_for(second.result(), 120)
    [again] = report.operations
    assert (again.operation_id, again.state, again.attempts) == (op.operation_id, "verified", 1)
    assert len(await effects(admin, op.operation_id)) == 1
    await _replays(client, thread.handle, message_one, second.handle)


async def test_messages_sent_at_once_run_one_after_another_in_the_order_accepted(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    thread = _thread(client, settings)
    version = await ticket_version(settings.service_url)

    def message(name: str) -> Any:
        # Each message holds a write that waits for approval: the one accepted second must wait for it.
        note = _note(version, f"thread: {name}")
        model = script_spec([call("append_ticket_note", note, "w1")], [say(f"{name} done")])
        return thread.send(name, request_id=f"m-{name}", model=model)

    sent = await asyncio.gather(message("a"), message("b"))
    first_sent, second_sent = sorted(sent, key=lambda s: s.number)
    assert (first_sent.number, first_sent.ahead, second_sent.number, second_sent.ahead) == (1, 0, 2, 1)
    # Both are answered at once, queued: the first starts as soon as the thread takes it.
    assert (first_sent.state, second_sent.state) == ("queued", "queued")
    first = await thread.request(first_sent.request_id)
    approval = await anext(aiter(first.approvals()))
    # While the first waits for its approval, the second has not started: no request workflow exists for it.
    states = {m.request_id: m.state for m in await thread.messages()}
    assert states == {first_sent.request_id: "running", second_sent.request_id: "queued"}
    with pytest.raises(RPCError) as missing:
        await client.get_workflow_handle(second_sent.workflow_id).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND
    await first.decide(approval, approve=True)
    first_report = await first.result()
    second = await thread.request(second_sent.request_id)
    await second.decide(await anext(aiter(second.approvals())), approve=True)
    second_report = await second.result()
    first_name, second_name = first_sent.request_id[2:], second_sent.request_id[2:]
    assert (first_report.final_text, second_report.final_text) == (f"{first_name} done", f"{second_name} done")
    # One after the other: the second started once the first had closed, and it was shown the first.
    first_closed = (await first.handle.describe()).close_time
    second_started = (await second.handle.describe()).start_time
    assert first_closed is not None and second_started >= first_closed
    shown = await conversation(second.handle)
    assert isinstance(shown[0], MessageItem) and shown[0].text() == first_name
    # Both notes name the ticket's version before either: the second reached the service after the first had
    # committed, so the service refused it - never two requests working on one thread at once.
    [op_one], [op_two] = first_report.operations, second_report.operations
    assert (op_one.state, op_two.state) == ("verified", "failed")
    assert (op_two.output or {}).get("code") == "VERSION_CONFLICT"
    assert [len(await effects(admin, op.operation_id)) for op in (op_one, op_two)] == [1, 0]
    await _replays(client, thread.handle, first.handle, second.handle)


async def test_a_thread_rebuilt_from_history_at_every_task_keeps_its_order_and_every_history_replays(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    """A worker that caches no run rebuilds the thread and its requests from history for every task, as a worker
    does for runs another one held when it was killed. Messages sent while the first waits for its approval, two
    of them at once, keep the order their answers gave them, each request is its own message's, and every
    history replays. (It does not reproduce tests/histories/unreplayable: that needed a kill at one moment.)"""
    queue = f"no-cache-{uuid.uuid4().hex[:8]}"
    requests = toolloop.ToolloopClient(client, task_queue=queue, signing_key=APPROVAL_KEY, channel="test")
    thread = requests.thread(f"t-{uuid.uuid4().hex[:8]}", actor=U1)
    note = _note(await ticket_version(settings.service_url), "thread: rebuilt")
    demo = build_demo(settings.service_url)
    async with running_worker(client, settings, demo, task_queue=queue, max_cached_workflows=0):
        first_sent = await thread.send(
            "a", model=script_spec([call("append_ticket_note", note, "w1")], [say("a done")])
        )
        first = await thread.request(first_sent)
        approval = await asyncio.wait_for(anext(aiter(first.approvals())), 60)
        # Two at once: either may be accepted first; the answers say which.
        later = await asyncio.gather(*(thread.send(q, model=script_spec([say(f"{q} done")])) for q in ("b", "c")))
        by_number = sorted(zip(("b", "c"), later, strict=True), key=lambda pair: pair[1].number)
        assert [(m.number, m.ahead) for m in (first_sent, *(accepted for _, accepted in by_number))] == [
            (1, 0),
            (2, 1),
            (3, 2),
        ]
        await first.decide(approval, approve=True)
        reports = [await asyncio.wait_for(first.result(), 60)]
        for _, accepted in by_number:
            reports.append(await asyncio.wait_for((await thread.request(accepted)).result(), 60))

        async def all_finished() -> bool:
            return [(m.state, m.outcome) for m in await thread.messages()] == [("finished", "answered")] * 3

        await assert_eventually(all_finished, what="every message finished and answered in the thread's list")
        records = await thread.messages()
    assert [r.final_text for r in reports] == ["a done", *(f"{q} done" for q, _ in by_number)]
    assert [m.request_id for m in records] == [first_sent.request_id, *(a.request_id for _, a in by_number)]
    # One after another, in that order.
    handles = [client.get_workflow_handle(m.workflow_id) for m in records]
    times = [await h.describe() for h in handles]
    for before, after in zip(times, times[1:], strict=False):
        assert before.close_time is not None and after.start_time >= before.close_time
    [op] = reports[0].operations
    assert op.state == "verified" and len(await effects(admin, op.operation_id)) == 1
    await _replays(client, thread.handle, *handles)


async def test_a_message_sent_again_is_the_same_message_and_its_id_with_another_question_is_refused(
    client: Client, settings: Settings, worker: Worker
) -> None:
    thread = _thread(client, settings)
    accepted = await thread.send("hello", request_id="m1", model=script_spec([say("hi")]))
    again = await thread.send("hello", request_id="m1", model=script_spec([say("hi")]))
    assert (again.number, again.workflow_id, again.attached, accepted.attached) == (
        1,
        accepted.workflow_id,
        True,
        False,
    )
    with pytest.raises(toolloop.RequestIdReused):
        await thread.send("something else", request_id="m1", model=script_spec([say("hi")]))
    report = await (await thread.request("m1")).result()
    assert report.final_text == "hi"
    assert [m.request_id for m in await thread.messages()] == ["m1"]


async def test_a_started_message_is_found_by_its_own_request_without_following_the_thread(
    client: Client, settings: Settings, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = _thread(client, settings)
    accepted = await thread.send("hello", model=script_spec([say("hi")]))
    assert (accepted.ahead, accepted.state) == (0, "queued") and accepted.submission.startswith("sha256:")
    request_handle = client.get_workflow_handle(accepted.workflow_id)

    async def started() -> bool:
        with contextlib.suppress(RPCError):
            return (await request_handle.describe()).parent_id == thread.workflow_id
        return False

    await assert_eventually(started, what="the message's request started as the thread's child")

    async def no_following(self: toolloop.ToolloopThread) -> Any:
        raise AssertionError("followed the thread")
        yield

    # Once it has started, its own workflow says so: one describe, no query of the thread, no long poll.
    monkeypatch.setattr(toolloop.ToolloopThread, "follow", no_following)
    report = await asyncio.wait_for((await thread.request(accepted)).result(), 60)
    assert report.final_text == "hi"


async def test_a_message_whose_request_id_another_request_holds_is_refused_never_taken_for_that_request(
    client: Client, settings: Settings, worker: Worker
) -> None:
    requests = _client(client, settings)
    thread = _thread(client, settings)
    # The same user's plain request, same question and model (so the same submission), under the id the
    # message then asks for: the thread cannot start its request, and the started workflow is not the message's.
    taken = f"taken-{uuid.uuid4().hex[:8]}"  # request ids are scoped to the user, across threads
    plain = await requests.run("hello", actor=U1, request_id=taken, model=script_spec([say("hi")]))
    assert plain.final_text == "hi"
    accepted = await thread.send("hello", request_id=taken, model=script_spec([say("hi")]))
    assert accepted.ahead == 0
    with pytest.raises(toolloop.MessageRefused, match="already used"):
        await asyncio.wait_for(thread.request(accepted), 60)
    [record] = await thread.messages()
    assert record.state == "refused"


async def test_a_message_sent_again_after_the_thread_forgot_it_is_refused_never_taken_for_its_old_request(
    client: Client, settings: Settings, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The in-process worker's thread continues as new after every message and keeps one message record, so a
    # message's request id is forgotten two messages later (500 records and 50 messages a run otherwise).
    monkeypatch.setattr("toolloop.workflows.thread.MESSAGES_PER_RUN", 1)
    monkeypatch.setattr("toolloop._core.threads.KEPT_MESSAGES", 1)
    thread = _thread(client, settings)
    reused = f"again-{uuid.uuid4().hex[:8]}"
    first = await asyncio.wait_for(thread.run("hello", request_id=reused, model=script_spec([say("hi")])), 60)
    await asyncio.wait_for(thread.run("next", model=script_spec([say("ok")])), 60)
    assert first.final_text == "hi"

    async def forgotten() -> bool:
        # The thread continues as new once it has recorded the second message: after the answer, not before.
        return reused not in [m.request_id for m in await thread.messages()]

    await assert_eventually(forgotten, what="the thread's next run keeps only the newest message")
    # The same message again: the thread cannot start its request (that id ran under an earlier run of the
    # thread), and the old request, a child of this thread with the same submission, is not this message's.
    accepted = await thread.send("hello", request_id=reused, model=script_spec([say("hi")]))
    assert (accepted.ahead, accepted.attached) == (0, False)
    with pytest.raises(toolloop.MessageRefused, match="already used"):
        await asyncio.wait_for(thread.request(accepted), 60)


def test_a_thread_run_never_forgets_a_message_it_started() -> None:
    """What lets a client take a request started by the run that accepted its message for that message's."""
    assert KEPT_MESSAGES > MESSAGES_PER_RUN + MAX_QUEUED


async def test_another_users_thread_id_names_another_thread(client: Client, settings: Settings, worker: Worker) -> None:
    mine = _thread(client, settings)
    await asyncio.wait_for(mine.run("my secret plan", model=script_spec([say("noted")])), 120)
    theirs = _client(client, settings).thread(mine.thread_id, actor=U2)
    # Not found, exactly as a thread that does not exist.
    with pytest.raises(toolloop.ThreadNotFound):
        await theirs.messages()
    with pytest.raises(toolloop.ThreadNotFound):
        await theirs.request([m.request_id for m in await mine.messages()][0])
    # Their first message starts their own thread, which knows nothing of mine.
    report = await asyncio.wait_for(theirs.run("what was the plan?", model=script_spec([say("no idea")])), 120)
    [message] = await theirs.messages()
    shown = await conversation(client.get_workflow_handle(message.workflow_id))
    assert [i.text() for i in shown if isinstance(i, MessageItem) and i.role == "user"] == ["what was the plan?"]
    assert report.final_text == "no idea" and theirs.workflow_id != mine.workflow_id
    assert [m.number for m in await mine.messages()] == [1]


async def test_a_thread_of_200_messages_keeps_working_with_bounded_history_and_model_input(
    client: Client, settings: Settings, worker: Worker
) -> None:
    thread = _thread(client, settings)
    shown_turns = 5
    limits = toolloop.Limits(thread_turns=shown_turns)

    def model(number: int) -> toolloop.ModelSpec:
        # Every tenth message reads a ticket first: its call must still be answered exactly once.
        if number % 10 == 0:
            return script_spec([call("get_ticket", {"ticketId": "T1001"}, f"r{number}")], [say(f"answer {number}")])
        return script_spec([say(f"answer {number}")])

    requests: dict[int, toolloop.ToolloopRequest] = {}
    for batch in range(50):
        # Four at a time: each batch queues behind the message that runs.
        numbers = range(batch * 4 + 1, batch * 4 + 5)
        sent = await asyncio.gather(
            *(thread.send(f"question {n}", request_id=f"q{n:03}", model=model(n), limits=limits) for n in numbers)
        )
        for accepted in sent:
            # Keyed by question: within a batch, the order the thread accepted them in is its own.
            requests[int(accepted.request_id[1:])] = await thread.request(accepted.request_id)
        for number in numbers:
            await asyncio.wait_for(requests[number].result(), 120)

    async def all_finished() -> bool:
        # The thread's list says a message finished once the thread's workflow has seen its request close.
        return {(m.state, m.outcome) for m in await thread.messages()} == {("finished", "answered")}

    await assert_eventually(all_finished, what="every message finished and answered in the thread's list")
    assert [m.number for m in await thread.messages()] == list(range(1, 201))
    # The thread's workflow handed itself on every 50 messages: each run's history stays bounded.
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{thread.workflow_id}"')]
    assert len(runs) >= 4
    run_handles = [client.get_workflow_handle(thread.workflow_id, run_id=run.run_id) for run in runs]
    for handle in run_handles:
        history = await handle.fetch_history()
        assert len(history.events) < 1200, (handle.run_id, len(history.events))
    await _replays(client, *run_handles)
    # The model's input is bounded too: the last message is shown the newest earlier turns only.
    question_of = {m.number: m.question for m in await thread.messages()}
    last = await thread.request([m.request_id for m in await thread.messages() if m.number == 200][0])
    shown = await conversation(last.handle)
    asked = [i.text() for i in shown if isinstance(i, MessageItem) and i.role == "user"]
    assert asked == [question_of[n] for n in range(200 - shown_turns, 201)]
    for number in (10, 100, 200):
        outputs = await tool_outputs(requests[number].handle)
        assert list(outputs) == [f"r{number}"] and outputs[f"r{number}"]["ok"] is True
    await _replays(client, requests[1].handle, last.handle)


async def test_a_thread_goes_on_across_a_worker_kill_and_a_temporal_restart_between_and_under_queued_messages(
    settings: Settings, admin: httpx.AsyncClient, tmp_path: Path
) -> None:
    # A Temporal of its own (restarted below on the same SQLite file) and worker processes killed for real.
    port = free_port()
    server = await asyncio.to_thread(start_temporal_dev_server, tmp_path / "temporal", port, None)
    address = f"127.0.0.1:{port}"
    env = {**worker_env(settings), "TEMPORAL_ADDRESS": address}
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(lambda: server.stop())
        worker = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "worker-1.log")
        stack.callback(worker.kill9)
        client = await Client.connect(address, data_converter=data_converter())
        thread = _thread(client, settings)
        note = _note(await ticket_version(settings.service_url), "thread: across restarts")
        # Message 1 waits for approval; message 2 is queued behind it.
        first_sent = await thread.send(
            "add the note", model=script_spec([call("append_ticket_note", note, "w1")], [say("Added.")])
        )
        second_sent = await thread.send("did it work?", model=script_spec([say("Yes, it was added.")]))
        assert second_sent.ahead == 1
        first = await thread.request(first_sent.request_id)
        approval = await anext(aiter(first.approvals()))

        # The worker is killed and Temporal restarted while message 2 waits in the queue.
        worker.kill9()
        server.stop()
        server = await asyncio.to_thread(start_temporal_dev_server, tmp_path / "temporal", port, None)
        worker = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "worker-2.log")
        stack.callback(worker.kill9)
        client = await Client.connect(address, data_converter=data_converter())
        thread = _client(client, settings).thread(thread.thread_id, actor=U1)
        first = await thread.request(first_sent.request_id)
        await first.decide(approval, approve=True)
        first_report = await asyncio.wait_for(first.result(), 120)
        second_report = await asyncio.wait_for((await thread.request(second_sent.request_id)).result(), 120)

        # Between messages: another kill, another worker.
        worker.kill9()
        worker = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "worker-3.log")
        stack.callback(worker.stop)
        third_report = await asyncio.wait_for(
            thread.run(
                "add it again",
                model=script_spec([call("append_ticket_note", note, "w1")], [say("It was there already.")]),
                approver=lambda _: True,
            ),
            120,
        )

        [op] = first_report.operations
        assert op.state == "verified" and second_report.final_text == "Yes, it was added."
        assert third_report.operations == []  # the same write: told again, never done again
        assert len(await effects(admin, op.operation_id)) == 1
        assert len(await _note_posts(admin)) == 1
        messages = await thread.messages()
        assert [(m.number, m.state) for m in messages] == [(1, "finished"), (2, "finished"), (3, "finished")]
        shown = await conversation(client.get_workflow_handle(messages[1].workflow_id))
        [told] = [i for i in shown if isinstance(i, FunctionCallOutputItem) and i.call_id == "m1_w1"]
        assert json.loads(told.output)["state"] == "verified"
        await _replays(client, thread.handle, *(client.get_workflow_handle(m.workflow_id) for m in messages))


async def test_a_write_left_unknown_is_not_sent_again_once_the_service_may_have_forgotten_it(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    # A service that keeps operation ids for 10 s (approvals must expire before that, so the requests are short).
    service = await asyncio.to_thread(start_service, tmp_path / "short-memory", 10.0)
    env = worker_env(settings, service.url)
    worker = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "worker.log")
    limits = toolloop.Limits(
        deadline_seconds=8,
        approval_ttl_seconds=7,
        write_timeout_seconds=2,
        max_write_attempts=1,
        unknown_resolution_seconds=2,
        settle_seconds=3,
        status_max_attempts=1,
    )
    refund = {"orderId": "A100", "amountCents": 500, "reason": "damaged"}
    try:
        async with httpx.AsyncClient(
            base_url=service.url, headers={"X-Admin-Token": service.admin_token}, timeout=10
        ) as admin:
            # Message 1: the refund is committed, its reply lost, its status unreadable: unknown.
            await set_faults(
                admin,
                {"method": "POST", "path_regex": "^/orders/A100/refunds$", "when": "after_commit", "action": "drop"},
                {"method": "GET", "path_regex": "^/operations/", "status": 503},
            )
            thread = _thread(client, settings)
            first = await asyncio.wait_for(
                thread.run(
                    "refund 5 EUR on A100",
                    model=script_spec([call("refund_order", refund, "w1")], [say("I could not confirm it.")]),
                    limits=limits,
                    approver=lambda _: True,
                ),
                120,
            )
            [op] = first.operations
            assert op.state == "unknown" and len(await effects(admin, op.operation_id)) == 1
            (await admin.delete("/admin/faults")).raise_for_status()

            async def forgotten() -> bool:
                who = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
                answer = await admin.get(f"/operations/{op.operation_id}", headers=who)
                return answer.status_code == 200 and answer.json()["state"] == "not_found"

            await assert_eventually(forgotten, within=60, what="the service forgot the operation id")
            # Message 2 proposes the very same refund: "not found" no longer proves it was not done.
            second = await asyncio.wait_for(
                thread.run(
                    "please try the refund again",
                    model=script_spec([call("refund_order", refund, "w1")], [say("I cannot tell.")]),
                    limits=limits,
                    approver=lambda _: True,
                ),
                120,
            )
            [again] = second.operations
            assert again.operation_id == op.operation_id
            assert (again.state, again.attempts) == ("unknown", 0)
            assert [c.state for c in again.status_checks] == ["not_found"]
            assert len(await effects(admin, op.operation_id)) == 1
    finally:
        worker.stop()
        service.process.stop()


async def test_a_request_started_with_a_thread_history_of_its_own_is_refused_and_runs_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # Started directly on the task queue, claiming a thread in which the note was done already (so it would be
    # told "done" and never sent): what earlier messages did is only what the thread's own workflow says.
    note = _note(await ticket_version(settings.service_url), "claimed done")
    claimed = ThreadOperation(operation_id="op_claimed", tool="append_ticket_note", call_id="w0", state="verified")
    handle = await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request="add the note",
            actor=U1,
            model=script_spec([call("append_ticket_note", note, "w1")], [say("done")]),
            thread=ThreadContext(thread_id="t", scope="thread-acme-u1-t-forged", operations=[claimed]),
        ),
        id=f"test-{uuid.uuid4().hex[:12]}",
        task_queue=settings.task_queue,
        result_type=AgentResult,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), timeout=60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.UNTRUSTED_INPUT
    assert await activity_steps(handle) == []  # not even a model turn ran
    assert len(await _note_posts(admin)) == 0


async def test_a_write_of_a_message_terminated_mid_send_stays_known_as_unknown_and_is_never_sent_twice(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # The service holds the note's POST; the message's request is terminated while it is in flight.
    await set_faults(admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "latency_ms": 3000})
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: terminated mid-send")
    model = script_spec([call("append_ticket_note", note, "w1")], [say("Added.")])
    first = await thread.request(await thread.send("add the note", model=model, limits=FAST))
    await first.decide(await anext(aiter(first.approvals())), approve=True)

    async def posted() -> bool:
        return len(await _note_posts(admin)) == 1

    await assert_eventually(posted, what="the note's POST reached the service")
    await first.handle.terminate("an operator stops it")

    async def first_finished() -> bool:
        return [m.state for m in await thread.messages()] == ["finished"]

    await assert_eventually(first_finished, what="the thread recorded the terminated message")
    # Its outcome is the one rule's (ask exits 3 for it): a write it sent may have happened. Before, "failed".
    assert [m.outcome for m in await thread.messages()] == ["unknown"]
    (await admin.delete("/admin/faults")).raise_for_status()
    # The held POST goes on at the service and commits (the terminated request never learns it).
    [sent] = await first.operations()

    async def committed() -> bool:
        return len(await effects(admin, sent.operation_id)) == 1

    await assert_eventually(committed, what="the held note committed at the service")
    # Message 2 proposes the same note: the thread knew it was sent, so its status is asked first.
    shown: list[toolloop.ApprovalRequest] = []
    second = await asyncio.wait_for(
        thread.run("add it", model=model, limits=FAST, approver=lambda a: shown.append(a) or True), 120
    )
    [again] = second.operations
    assert (again.state, again.attempts, shown) == ("verified", 0, [])
    assert [c.state for c in again.status_checks] == ["completed"]
    assert len(await effects(admin, again.operation_id)) == 1 and len(await _note_posts(admin)) == 1
    [_, two] = await thread.messages()
    shown_items = await conversation(client.get_workflow_handle(two.workflow_id))
    [earlier] = [i for i in shown_items if isinstance(i, FunctionCallOutputItem) and i.call_id == "m1_w1"]
    assert json.loads(earlier.output)["state"] == "unknown"
    await _replays(client, thread.handle, client.get_workflow_handle(two.workflow_id))


async def test_the_next_message_waits_until_a_terminated_requests_writes_are_read_and_then_meets_them(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The terminated request's ledger cannot be read for a while (a busy worker, a deploy that cannot replay it):
    # the thread keeps asking, and the next message waits, rather than forget what the request did.
    import toolloop.activities.threads as ledger_activity

    monkeypatch.setattr(ledger_activity, "GET_LEDGER_QUERY", "no_such_query")
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: ledger read late")
    event = {"calendarId": "cal-u1", "title": "Parcel call", "start": "2027-03-02T10:00:00Z"}
    event["end"] = "2027-03-02T10:30:00Z"
    model = script_spec(
        [call("append_ticket_note", note, "w1")], [call("create_calendar_event", event, "w2")], [say("Both.")]
    )
    first = await thread.request(await thread.send("note it, then book a call", model=model))
    approvals = aiter(first.approvals())
    await first.decide(await anext(approvals), approve=True)
    # The note is done; the request is terminated while the event waits for its approval.
    assert (await anext(approvals)).tool == "create_calendar_event"
    await first.handle.terminate("an operator stops it")
    again_model = script_spec([call("append_ticket_note", note, "w1")], [say("Already there.")])
    second_sent = await thread.send("add the note", model=again_model)
    assert second_sent.ahead == 1

    async def failed_again() -> bool:
        pending = (await thread.handle.describe()).raw_description.pending_activities
        return any(p.activity_type.name == "request_ledger" and p.attempt >= 3 for p in pending)

    await assert_eventually(failed_again, what="the ledger asked again after failed attempts")
    assert [m.state for m in await thread.messages()] == ["running", "queued"]
    # Asked with no limit on attempts (it used to give up after 5 and record no writes at all).
    scheduled = [
        e.activity_task_scheduled_event_attributes
        async for e in thread.handle.fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert [a.retry_policy.maximum_attempts for a in scheduled] == [0]
    monkeypatch.undo()
    # Read at last: message 2 meets the note as done, and sends nothing; the event was never sent.
    second = await thread.request(second_sent)
    report = await asyncio.wait_for(second.result(), 120)
    [one, _] = await thread.messages()
    outputs = await tool_outputs(second.handle)
    assert report.operations == [] and outputs["w1"]["state"] == "verified"
    assert outputs["w1"]["done_by_earlier_request"] == one.request_id
    assert len(await effects(admin, outputs["w1"]["operation_id"])) == 1 and len(await _note_posts(admin)) == 1
    assert one.outcome == "failed"
    await _replays(client, thread.handle, second.handle)


async def test_a_full_thread_refuses_one_more_message_and_a_closed_one_is_never_started_again_empty(
    client: Client, settings: Settings, worker: Worker
) -> None:
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: holds the queue")
    # The first waits for an approval that never comes; the queue behind it fills up.
    await thread.send("hold", model=script_spec([call("append_ticket_note", note, "w1")], [say("held")]))
    for number in range(MAX_QUEUED):
        accepted = await thread.send(f"queued {number}", model=script_spec([say("ok")]))
        assert (accepted.state, accepted.ahead) == ("queued", number + 1)
    with pytest.raises(toolloop.ThreadBusy):
        await thread.send("one too many", model=script_spec([say("ok")]))
    assert len(await thread.messages()) == MAX_QUEUED + 1  # the refused one was not kept
    # An operator closes the thread's workflow: a new message is refused, never the start of an empty thread
    # that would have forgotten what the earlier messages did.
    await thread.handle.terminate("an operator closes it")
    with pytest.raises(toolloop.ThreadClosed):
        await thread.send("after the close", model=script_spec([say("ok")]))
    async for execution in client.list_workflows(f'WorkflowId = "{thread.workflow_id}"'):
        assert execution.status == WorkflowExecutionStatus.TERMINATED


async def test_a_closed_thread_runs_what_it_accepted_refuses_new_messages_and_then_ends(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    thread = _thread(client, settings)
    note = _note(await ticket_version(settings.service_url), "thread: before the close")
    first = await thread.send("note it", model=script_spec([call("append_ticket_note", note, "w1")], [say("noted")]))
    second = await thread.send("and then?", model=script_spec([say("that was all")]))
    assert (first.ahead, second.ahead) == (0, 1)
    # Closed while the first waits for its approval and the second waits behind it. (The thread's list says
    # running a workflow task after the first's request started: either may show.)
    request = await thread.request(first)
    approval = await anext(aiter(request.approvals()))
    closing = await thread.close()
    assert [m.number for m in closing] == [1, 2] and closing[0].state in ("queued", "running")
    assert closing[1].state == "queued"
    with pytest.raises(toolloop.ThreadClosed, match="has been closed"):
        await thread.send("one more", model=script_spec([say("never")]))
    # A send the thread accepted before is still the same message (a retry), not a new one.
    again = await thread.send("and then?", request_id=second.request_id, model=script_spec([say("that was all")]))
    assert (again.attached, again.number) == (True, 2)
    assert await thread.close() == await thread.messages()  # closing again is the same close
    await request.decide(approval, approve=True)
    [op] = (await request.result()).operations
    assert op.state == "verified" and len(await effects(admin, op.operation_id)) == 1
    # The message accepted before the close runs after the first, and the thread's workflow then ends.
    assert (await (await thread.request(second)).result()).final_text == "that was all"
    assert (await thread.handle.result()) is None
    assert [(m.number, m.state, m.outcome) for m in await thread.messages()] == [
        (1, "finished", "answered"),
        (2, "finished", "answered"),
    ]
    with pytest.raises(toolloop.ThreadClosed):
        await thread.send("after the end", model=script_spec([say("never")]))
    # Still the same message when sent again after the thread ended, and its id with another question refused.
    late = await thread.send("and then?", request_id=second.request_id, model=script_spec([say("that was all")]))
    assert (late.attached, late.number, late.state) == (True, 2, "finished")
    assert (await (await thread.request(late)).result()).final_text == "that was all"
    with pytest.raises(toolloop.RequestIdReused):
        await thread.send("something else", request_id=second.request_id, model=script_spec([say("x")]))
    assert [m.number for m in await thread.close()] == [1, 2]
    # Another user's thread of that id does not exist: closing it says so, as for any unknown thread.
    with pytest.raises(toolloop.ThreadNotFound):
        await _client(client, settings).thread(thread.thread_id, actor=U2).close()
    await _replays(client, thread.handle)


async def test_a_client_without_a_signing_key_refuses_to_run_a_message_with_an_approver_before_sending_it(
    client: Client, settings: Settings, worker: Worker
) -> None:
    keyless = toolloop.ToolloopClient(client, task_queue=settings.task_queue, channel="test")
    thread = keyless.thread(f"t-{uuid.uuid4().hex[:8]}", actor=U1)
    with pytest.raises(toolloop.ApprovalRefused, match="no approval signing key"):
        await thread.run("add a note", model=script_spec([say("ok")]), approver=lambda _: True)
    with pytest.raises(toolloop.ThreadNotFound):
        await thread.messages()  # nothing was sent: the thread never started
