"""End to end: the write protocol (approval, operation ids, unknown outcomes, read-back) against the real
Temporal dev server and the real business service, with faults injected at the service's boundary.
Every test counts effects in the service's own tables (GET /admin/effects), not the workflow's word."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import toolloop
from demo.agent import build as build_demo
from devstack.processes import free_port, start_worker
from tests.agent_helpers import (
    U1,
    activity_steps,
    approving,
    assert_eventually,
    call,
    decide,
    decisions_in_history,
    effects,
    say,
    script_spec,
    service_requests,
    set_faults,
    start_agent,
    stored_report,
    ticket_version,
    tool_outputs,
    waiting_operation,
    worker_env,
)
from tests.conftest import (
    APPROVAL_KEY,
    APPROVAL_VERIFY_KEY,
    OTHER_SIGNING_KEY,
    REPO_ROOT,
    BusinessService,
    approval_token,
    start_service,
)
from tests.user_tools import Entry, in_process_ledger
from toolloop import AgentSpec, Toolset, request_result
from toolloop import data_converter as toolloop_data_converter
from toolloop._core.approvals import APPROVAL_WRONG_REQUEST, payload_digest, run_binding
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentProgress,
    AgentResult,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalWait,
    DecisionAnswer,
    Limits,
    NextApproval,
    OperationRecord,
    WriteInput,
)
from toolloop._core.names import (
    AGENT_WORKFLOW,
    APPROVE_OPERATION_UPDATE,
    EXECUTE_WRITE_ACTIVITY,
    GET_LEDGER_QUERY,
    GET_PROGRESS_QUERY,
    MODEL_TURN_ACTIVITY,
    NEXT_APPROVAL_UPDATE,
    READ_BACK_ACTIVITY,
    RUN_TOOL_ACTIVITY,
)
from toolloop._temporal.approval_channel import ApprovalRefused, fetch_approval_request, send_decision
from toolloop._temporal.converter import data_converter
from toolloop._temporal.following import RunFollower, approvals_as_they_come, pending_approvals, pending_once_answered
from toolloop._temporal.plugin import workflow_runner
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker
from toolloop.testing import RequestEnded
from toolloop.workflows.agent import AgentWorkflow

pytestmark = pytest.mark.e2e

FAST = {"write_timeout_seconds": 2, "unknown_resolution_seconds": 10}


async def run_approved(
    client: Client, settings: Settings, service: BusinessService, turns: list[list[dict[str, Any]]], **limits: Any
) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
    handle = await start_agent(client, settings, "write", model=script_spec(*turns), limits=Limits(**limits))
    async with approving(handle, service.approval_key):
        result = await asyncio.wait_for(request_result(handle), timeout=120)
    return result, handle


def note_call(version: int, text: str, call_id: str) -> dict[str, Any]:
    return call("append_ticket_note", {"ticketId": "T1001", "text": text, "expectedVersion": version}, call_id)


async def start_two_notes(
    client: Client, settings: Settings, service: BusinessService, first: str, second: str, answer: str
) -> WorkflowHandle[Any, AgentResult]:
    """A request whose model proposes one note, then another (each its own approval), then answers."""
    version = await ticket_version(service.url)
    turns = [[note_call(version, first, "w1")], [note_call(version + 1, second, "w2")], [say(answer)]]
    return await start_agent(client, settings, "write", model=script_spec(*turns))


async def test_approved_note_is_written_once_and_verified(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "  Replacement shipped.  ", "w1")], [say("Noted.")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    [op] = result.operations
    assert (op.state, op.call_ids, op.attempts) == ("verified", ["w1"], 1)
    assert op.transitions == ["proposed", "validated", "awaiting_approval", "approved", "sent", "completed", "verified"]
    assert op.approval is not None and op.approval.decision == "approved" and op.approval.by == "u1 via test"
    assert op.arguments["text"] == "Replacement shipped."  # trimmed before it was approved and digested
    [effect] = await effects(admin, op.operation_id)
    assert effect["kind"] == "note"
    output = (await tool_outputs(handle))["w1"]
    assert output["ok"] is True and output["state"] == "verified" and output["operation_id"] == op.operation_id
    assert await ticket_version(business_service.url) == version + 1


Encoded = list[tuple[SerializationContext | None, bytes]]


class ContextRecordingCodec(PayloadCodec, WithSerializationContext):
    """An identity codec that records each payload it encodes with the serialization context it had."""

    def __init__(self, seen: Encoded, context: SerializationContext | None = None) -> None:
        self.seen = seen
        self.context = context

    def with_context(self, context: SerializationContext) -> ContextRecordingCodec:
        return ContextRecordingCodec(self.seen, context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.seen.extend((self.context, p.data) for p in payloads)
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


async def test_a_users_payload_codec_still_gets_each_commands_context(
    settings: Settings, business_service: BusinessService
) -> None:
    seen: Encoded = []
    converter = dataclasses.replace(data_converter(), payload_codec=ContextRecordingCodec(seen))
    coded = await Client.connect(settings.temporal_address, data_converter=converter)
    async with running_worker(coded, settings, build_demo(settings.service_url)) as worker:
        runner = worker.config(active_config=True).get("workflow_runner")
        assert isinstance(runner, SandboxedWorkflowRunner)  # asked for every context, as the SDK does
        handle = await start_agent(
            coded, settings, "read", model=script_spec([call("get_ticket", {"ticketId": "T1001"}, "r1")], [say("Ok.")])
        )
        result = await asyncio.wait_for(request_result(handle), timeout=60)
    assert [(c.call_id, c.ok) for c in result.calls] == [("r1", True)]
    # The workflow's commands: each activity's input went through the codec with that activity's context.
    encoded = [(context, json.loads(data)) for context, data in seen if data.startswith(b"{")]
    [tool_input] = [c for c, value in encoded if value.get("call_id") == "r1" and "arguments" in value]
    assert isinstance(tool_input, ActivitySerializationContext) and tool_input.activity_type == RUN_TOOL_ACTIVITY
    turn_inputs = [c for c, value in encoded if "new_items" in value]
    assert len(turn_inputs) == 2
    assert all(
        isinstance(c, ActivitySerializationContext) and c.activity_type == MODEL_TURN_ACTIVITY for c in turn_inputs
    )


async def activities_run(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The activity types the run ran, in order (from its history)."""
    return await activity_steps(handle)


async def test_the_happy_path_reads_the_effect_back_inside_the_write_attempt(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "read me back", "w1")], [say("Noted.")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    [op] = result.operations
    assert op.state == "verified" and op.evidence is not None and op.evidence["verified"] is True
    # One activity for the write and its read-back, none of its own for the read-back.
    assert await activities_run(handle) == [MODEL_TURN_ACTIVITY, EXECUTE_WRITE_ACTIVITY, MODEL_TURN_ACTIVITY]
    # And it is a real read of the service's state after the write, not the write's own reply.
    requests = [(r["method"], r["path"]) for r in await service_requests(admin, "/tickets/T1001")]
    assert requests[-2:] == [("POST", "/tickets/T1001/notes"), ("GET", "/tickets/T1001")]
    assert len(await effects(admin, op.operation_id)) == 1


async def test_a_read_back_the_attempt_cannot_conclude_is_read_again_by_its_own_activity(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    # The read right after the write fails once; the write itself is never resent.
    await set_faults(admin, {"method": "GET", "path_regex": "^/tickets/T1001$", "status": 503, "times": 1})
    turns = [[note_call(version, "read me later", "w1")], [say("Noted.")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 1)
    assert await activities_run(handle) == [
        MODEL_TURN_ACTIVITY,
        EXECUTE_WRITE_ACTIVITY,
        READ_BACK_ACTIVITY,
        MODEL_TURN_ACTIVITY,
    ]
    requests = [(r["method"], r["path"]) for r in await service_requests(admin, "/tickets/T1001")]
    assert requests[-3:] == [("POST", "/tickets/T1001/notes"), ("GET", "/tickets/T1001"), ("GET", "/tickets/T1001")]
    assert len(await effects(admin, op.operation_id)) == 1
    # The report holds the read-back activity's result itself.
    [stored_op] = (await stored_report(handle))["operations"]
    assert stored_op["evidence"] == op.evidence
    [ledger] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    assert op == ledger and op.evidence is not None and op.evidence["verified"] is True


async def test_a_waiting_client_learns_of_each_approval_from_the_history_not_by_polling(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # The fallback sleep is an hour: only the long poll on the run's history can wake this client.
    handle = await start_two_notes(client, settings, business_service, "first", "second", "Both noted.")
    approved: list[str] = []
    async with RunFollower(handle, fallback_seconds=3600) as follower:
        while len(approved) < 2:
            if not await asyncio.wait_for(follower.wait(), timeout=60):
                continue
            for request in await pending_approvals(handle):
                assert request.operation_id not in approved
                await send_decision(handle, request, approve=True, decider=U1, key=APPROVAL_KEY)
                approved.append(request.operation_id)
    result = await asyncio.wait_for(request_result(handle), timeout=60)
    assert [(op.operation_id, op.state, op.call_ids) for op in result.operations] == [
        (approved[0], "verified", ["w1"]),
        (approved[1], "verified", ["w2"]),
    ]
    for operation_id in approved:
        assert len(await effects(admin, operation_id)) == 1
    assert sorted(await tool_outputs(handle)) == ["w1", "w2"]


async def test_approvals_as_they_come_yields_each_operation_once_and_ends_with_the_run(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    handle = await start_two_notes(client, settings, business_service, "one", "two", "ok")
    seen: list[str] = []
    answers = []
    async for request in approvals_as_they_come(handle):
        # Exactly what the workflow itself answers for it.
        assert [request] == await pending_approvals(handle)
        seen.append(request.operation_id)
        answers.append(await send_decision(handle, request, approve=len(seen) == 1, decider=U1, key=APPROVAL_KEY))
    # The iterator ended by itself when the run closed.
    result = await request_result(handle)
    assert [(op.operation_id, op.state) for op in result.operations] == [(seen[0], "verified"), (seen[1], "denied")]
    assert len(await effects(admin, seen[0])) == 1 and await effects(admin, seen[1]) == []
    # Each decision is answered with the operation's state right after it and its approval, exactly as the
    # workflow recorded them. History stores only the state and the time: who decided and until when an
    # approval holds are in the decision's token, once.
    assert [(a.operation_id, a.tool, a.state) for a in answers] == [
        (seen[0], "append_ticket_note", "approved"),
        (seen[1], "append_ticket_note", "denied"),
    ]
    assert [op.approval for op in result.operations] == [a.approval for a in answers]
    assert [a.approval.by if a.approval else None for a in answers] == ["u1 via cli"] * 2
    assert [a.approval.decision if a.approval else None for a in answers] == ["approved", "rejected"]
    stored = await update_answers(handle, APPROVE_OPERATION_UPDATE)
    assert [(answer["state"], sorted(answer), answer["next"]) for answer in stored] == [
        ("approved", ["at", "next", "state"], None),
        ("denied", ["at", "next", "state"], None),
    ]
    ledger = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    assert [op.approval for op in ledger] == [a.approval for a in answers]


async def test_a_client_that_joins_late_is_given_only_the_operation_still_waiting(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    handle = await start_two_notes(client, settings, business_service, "one", "two", "ok")
    following = approvals_as_they_come(handle)
    first = await anext(following)
    await following.aclose()
    await send_decision(handle, first, approve=True, decider=U1, key=APPROVAL_KEY)
    await assert_eventually(lambda: _second_waits(handle, first.operation_id))
    # A new client has been given nothing: the workflow hands it the one operation still waiting.
    late = approvals_as_they_come(handle)
    second = await anext(late)
    assert second.operation_id != first.operation_id and second.arguments["text"] == "two"
    assert [second] == await pending_approvals(handle)
    await send_decision(handle, second, approve=False, decider=U1, key=APPROVAL_KEY)
    assert [request async for request in late] == []  # and nothing more until the run closed
    result = await request_result(handle)
    assert [op.state for op in result.operations] == ["verified", "denied"]
    assert len(await effects(admin, first.operation_id)) == 1 and await effects(admin, second.operation_id) == []


async def test_approvals_come_from_the_workflows_next_approval_update_and_a_finished_request_refuses_it(
    client: Client, settings: Settings, worker: Worker, business_service: BusinessService
) -> None:
    handle = await start_two_notes(client, settings, business_service, "one", "two", "ok")
    given = []
    async for request in approvals_as_they_come(handle):
        given.append(request.operation_id)
        await send_decision(handle, request, approve=True, decider=U1, key=APPROVAL_KEY)
    result = await request_result(handle)
    assert [op.operation_id for op in result.operations] == given and len(set(given)) == 2
    # One Update per operation, each answered with that operation's whole payload, and a last one answered
    # with nothing when the run finished: the follower read no history and asked no query.
    answers = await update_answers(handle, NEXT_APPROVAL_UPDATE)
    assert [a["approval"]["operation_id"] if a["approval"] else None for a in answers] == [*given, None]
    assert [a["approval"]["arguments"]["text"] for a in answers[:2]] == ["one", "two"]
    accepted_before = len(await update_answers(handle, None))
    # Asked again once the run has closed: the server refuses it (nothing recorded), and a follower that joins
    # now ends at once.
    with pytest.raises(RPCError) as refused:
        await handle.execute_update(NEXT_APPROVAL_UPDATE, ApprovalWait(), result_type=NextApproval)
    assert refused.value.status == RPCStatusCode.NOT_FOUND
    assert [r async for r in approvals_as_they_come(handle)] == []
    assert len(await update_answers(handle, None)) == accepted_before


async def update_answers(handle: WorkflowHandle[Any, Any], name: str | None) -> list[Any]:
    """The answers (decoded JSON) of the run's completed Updates named `name` (None: all), in order."""
    names: dict[str, str] = {}
    answers = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            accepted = event.workflow_execution_update_accepted_event_attributes.accepted_request
            names[accepted.meta.update_id] = accepted.input.name
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            completed = event.workflow_execution_update_completed_event_attributes
            if name is None or names[completed.meta.update_id] == name:
                answers.append(json.loads(completed.outcome.success.payloads[0].data))
    return answers


async def test_an_approval_waiting_while_no_worker_runs_is_shown_once_one_answers(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "while the worker is away", "w1")], [say("Noted.")]]
    async with running_worker(client, settings, build_demo(settings.service_url)):
        handle = await start_agent(client, settings, "write", model=script_spec(*turns))
        waiting = await waiting_operation(handle)
    # No worker answers a query now ("no poller seen"), so the follower keeps asking, and gets the request
    # once one runs.
    with pytest.raises(RPCError) as no_worker:
        await asyncio.wait_for(pending_approvals(handle), timeout=60)
    assert no_worker.value.status == RPCStatusCode.FAILED_PRECONDITION
    follower = asyncio.ensure_future(anext(approvals_as_they_come(handle)))
    async with running_worker(client, settings, build_demo(settings.service_url)):
        request = await asyncio.wait_for(follower, timeout=60)
        assert (request.operation_id, request.state, request.arguments["text"]) == (
            waiting.operation_id,
            "awaiting_approval",
            "while the worker is away",
        )
        assert request.digest == payload_digest(request.digest_subject, request.arguments) == waiting.digest
        await send_decision(handle, request, approve=True, decider=U1, key=APPROVAL_KEY)
        result = await asyncio.wait_for(request_result(handle), timeout=60)
    [op] = result.operations
    assert (op.operation_id, op.state, op.attempts) == (waiting.operation_id, "verified", 1)
    assert len(await effects(admin, op.operation_id)) == 1


async def test_a_follower_waiting_for_a_worker_ends_when_the_run_ends(
    client: Client, settings: Settings, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    async with running_worker(client, settings, build_demo(settings.service_url)):
        handle = await start_agent(client, settings, "write", model=script_spec([note_call(version, "x", "w1")]))
        await waiting_operation(handle)
    # The follower asks while no worker answers; the run is then terminated: it ends, with nothing yielded.
    follower = asyncio.ensure_future(anext(approvals_as_they_come(handle), None))
    await handle.terminate("no worker will come back")
    assert await asyncio.wait_for(follower, timeout=120) is None
    # Whatever the interleaving: asked after the run closed, with no worker to answer, nothing is pending
    # (asking again for ever would never end the follower).
    assert await asyncio.wait_for(pending_once_answered(handle), timeout=120) == []


async def _second_waits(handle: WorkflowHandle[Any, Any], first: str) -> bool:
    return any(r.operation_id != first for r in await pending_approvals(handle))


async def test_same_write_proposed_twice_makes_one_effect(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "Twice?", "w1")], [note_call(version, "Twice?", "w2")], [say("done")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    [op] = result.operations
    assert op.call_ids == ["w1", "w2"] and op.state == "verified"
    assert len(await effects(admin, op.operation_id)) == 1
    outputs = await tool_outputs(handle)
    assert outputs["w2"]["same_operation_as_call"] == "w1"
    assert outputs["w2"]["operation_id"] == outputs["w1"]["operation_id"] == op.operation_id
    assert len(await note_posts(admin)) == 1


async def test_the_same_write_proposed_again_under_the_same_call_id_is_answered_and_the_request_answers(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # A model that uses call id w1 again in round 2 for the same note. Round 1's attempt read the note back, so its
    # output was referred to rather than stored again; round 2 answered from the ledger but still referred to it,
    # and turn 3 found no output for w1 in round 2: the request failed (model_error) with the note verified.
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "Again?", "w1")], [note_call(version, "Again?", "w1")], [say("done")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    assert (result.stop_reason, result.final_text) == ("final_answer", "done")
    [op] = result.operations
    assert op.call_ids == ["w1", "w1"] and op.state == "verified"
    assert len(await effects(admin, op.operation_id)) == 1 and len(await note_posts(admin)) == 1
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    await replayer.replay_workflow(await handle.fetch_history())


async def test_a_write_whose_identical_calls_are_distinct_makes_each_one_after_its_own_approval(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # The demo's calendar tool, declared so that two identical events are two operations.
    spec = build_demo(settings.service_url)
    tools = Toolset()
    for tool in spec.tools.registry:
        tools.add(dataclasses.replace(tool, each_call_distinct=tool.name == "create_calendar_event"))
    event = {
        "calendarId": "cal-u1",
        "title": "stand-up twice",
        "start": "2027-03-01T09:00:00Z",
        "end": "2027-03-01T09:15:00Z",
    }
    twice = [call("create_calendar_event", event, "e1"), call("create_calendar_event", event, "e2")]
    async with running_worker(client, settings, dataclasses.replace(spec, tools=tools)):
        handle = await start_agent(
            client, settings, "w", model=script_spec(twice, [call("create_calendar_event", event, "e3")], [say("ok")])
        )
        async with approving(handle, business_service.approval_key) as approved:
            result = await asyncio.wait_for(request_result(handle), timeout=120)
    # Three proposals of one payload: three operations, each approved on its own and made once.
    assert [op.call_ids for op in result.operations] == [["e1"], ["e2"], ["e3"]]
    assert len({op.operation_id for op in result.operations}) == 3 and sorted(approved) == sorted(
        op.operation_id for op in result.operations
    )
    assert all(op.state == "verified" for op in result.operations)
    for op in result.operations:
        [made] = await effects(admin, op.operation_id)
        assert made["title"] == "stand-up twice"


async def test_waiting_for_an_approval_that_never_comes_says_the_request_ended(
    client: Client, settings: Settings, worker: Worker
) -> None:
    handle = await start_agent(client, settings, "r", model=script_spec([say("nothing to approve")]))
    with pytest.raises(RequestEnded, match="ended without any operation waiting"):
        await waiting_operation(handle)


async def test_an_in_process_write_verifies_the_approval_the_workflow_sent_it(
    client: Client, settings: Settings
) -> None:
    written: list[str] = []
    # A tool without a source: its approvals are for its own name.
    tools = in_process_ledger(written, keys=APPROVAL_VERIFY_KEY, audience="add_entry")
    async with running_worker(client, settings, AgentSpec(tools=tools)):
        turns = [[call("add_entry", {"text": "in process"}, "w1")], [say("ok")]]
        handle = await start_agent(client, settings, "w", model=script_spec(*turns))
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=60)
    # The digest the activity gave the tool is the one the approval was signed for: written once.
    [op] = result.operations
    assert written == ["in process"] and op.state == "completed" and op.attempts == 1


async def test_no_approval_within_ttl_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "unapproved", "w1")], [say("ok")]]
    handle = await start_agent(
        client, settings, "write", model=script_spec(*turns), limits=Limits(approval_ttl_seconds=1)
    )
    result = await asyncio.wait_for(request_result(handle), timeout=60)

    [op] = result.operations
    assert (op.state, op.attempts, op.approval) == ("expired", 0, None)
    assert (await tool_outputs(handle))["w1"]["code"] == "CONFIRMATION_REQUIRED"
    assert await effects(admin, op.operation_id) == []
    assert await service_requests(admin, "/tickets/T1001/notes") == []


async def note_posts(admin: httpx.AsyncClient) -> list[dict[str, Any]]:
    return [r for r in await service_requests(admin, "/tickets/T1001/notes") if r["method"] == "POST"]


async def test_rejected_operation_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client, settings, "w", model=script_spec([note_call(version, "no thanks", "w1")], [say("ok")])
    )
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id, approve=False)
    result = await asyncio.wait_for(request_result(handle), timeout=60)

    [done] = result.operations
    assert done.state == "denied" and done.approval is not None
    # Who decided is read from the signed token, not from the caller's words.
    assert (done.approval.decision, done.approval.by) == ("rejected", "u1 via test")
    # Its own code: a person said no, which the model and the receipt tell from an approval that never came.
    assert (await tool_outputs(handle))["w1"]["code"] == "REJECTED"
    assert await effects(admin, op.operation_id) == []
    assert await note_posts(admin) == []


def forged_token(
    request: ApprovalRequest,
    *,
    approve: bool,
    workflow_id: str | None,
    user: str = "u1",
    key: str = APPROVAL_KEY,
    expires_in: float = 60,
    run_id: str | None = None,
) -> str:
    """A decision token made by hand for the request `workflow_id` (its run as the request names it, or
    `run_id`), to try what the approval channel never signs."""
    return approval_token(
        request.operation_id,
        request.tool,
        request.arguments,
        user=user,
        key=key,
        expires_in=expires_in,
        decision="approve" if approve else "reject",
        request=run_binding(workflow_id, run_id or request.run_id or "") if workflow_id is not None else None,
    )


async def test_a_decision_from_a_closed_run_is_refused_when_its_workflow_id_is_started_again(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # Anyone who may start workflows can start a closed request's workflow id again, and the same call then has
    # the same operation id and digest. The first run's decision, as its history holds it, is not the second's.
    version = await ticket_version(business_service.url)
    inp = AgentInput(
        request="w",
        actor=Actor(user_id="u1", tenant_id="acme"),
        model=script_spec([note_call(version, "one run", "w1")], [say("ok")]),
    )
    workflow_id = f"test-{uuid.uuid4().hex[:12]}"

    async def run() -> WorkflowHandle[Any, AgentResult]:
        started = await client.start_workflow(
            AGENT_WORKFLOW, inp, id=workflow_id, task_queue=settings.task_queue, result_type=AgentResult
        )
        # This very run, whatever runs under the id later.
        return client.get_workflow_handle(workflow_id, run_id=started.first_execution_run_id, result_type=AgentResult)

    first = await run()
    op = await waiting_operation(first)
    await decide(first, op.operation_id, approve=False)
    assert [o.state for o in (await request_result(first)).operations] == ["denied"]
    [copied] = await decisions_in_history(client, first)
    second = await run()
    again = await waiting_operation(second)
    assert (again.operation_id, again.digest) == (op.operation_id, op.digest) and second.run_id != first.run_id
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await second.execute_update(APPROVE_OPERATION_UPDATE, copied, result_type=DecisionAnswer)
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == APPROVAL_WRONG_REQUEST
    # Its own decision is taken: done once.
    await decide(second, again.operation_id)
    [done] = (await request_result(second)).operations
    assert done.state == "verified" and len(await effects(admin, done.operation_id)) == 1
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    for handle in (first, second):
        await replayer.replay_workflow(await handle.fetch_history())


DECISION_FORGERIES = [
    "other_user",
    "other_digest",
    "expired",
    "unsigned",
    "no_token",
    "decision_swapped",
    "outlives_deadline",
    "other_request",
    "other_run",
    "no_request",
]


@pytest.mark.parametrize("approve", [True, False], ids=["approve", "reject"])
@pytest.mark.parametrize("forgery", DECISION_FORGERIES)
async def test_update_validator_refuses_bad_decisions_and_nothing_is_sent(
    client: Client,
    settings: Settings,
    worker: Worker,
    admin: httpx.AsyncClient,
    business_service: BusinessService,
    forgery: str,
    approve: bool,
) -> None:
    # An approval and a rejection are checked alike: only the request's own user, through the channel.
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client,
        settings,
        "w",
        model=script_spec([note_call(version, "forged?", "w1")], [say("ok")]),
        limits=Limits(approval_ttl_seconds=3, deadline_seconds=120),
    )
    op = await waiting_operation(handle)
    request = await fetch_approval_request(handle, op.operation_id)
    assert request is not None
    digest = request.digest
    token: str | None = forged_token(request, approve=approve, workflow_id=handle.id)
    if forgery == "other_user":
        token = forged_token(request, approve=approve, workflow_id=handle.id, user="u2")
    elif forgery == "other_digest":
        other = request.model_copy(update={"arguments": {**request.arguments, "text": "something else"}})
        other.digest = digest = payload_digest(other.tool, other.arguments)
        token = forged_token(other, approve=approve, workflow_id=handle.id)
    elif forgery == "expired":
        token = forged_token(request, approve=approve, workflow_id=handle.id, expires_in=-1)
    elif forgery == "unsigned":
        token = forged_token(request, approve=approve, workflow_id=handle.id, key=OTHER_SIGNING_KEY)
    elif forgery == "no_token":
        token = None
    elif forgery == "decision_swapped":
        token = forged_token(request, approve=not approve, workflow_id=handle.id)
    elif forgery == "outlives_deadline":
        if not approve:
            pytest.skip("a rejection commits nothing; only an approval must expire by the deadline")
        token = forged_token(request, approve=approve, workflow_id=handle.id, expires_in=3600)
    elif forgery == "other_request":
        # Given in another request with the same operation and payload (a thread's earlier message).
        token = forged_token(request, approve=approve, workflow_id="test-another-request")
    elif forgery == "other_run":
        # Given in another run of the same workflow id (a closed request's id started again).
        token = forged_token(request, approve=approve, workflow_id=handle.id, run_id="an-earlier-run")
    elif forgery == "no_request":
        token = forged_token(request, approve=approve, workflow_id=None)  # as a channel older than the claim
    decision = ApprovalDecision(operation_id=op.operation_id, digest=digest, approve=approve, token=token, by="u1")

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(APPROVE_OPERATION_UPDATE, decision)
    if forgery in ("other_request", "other_run", "no_request"):
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == APPROVAL_WRONG_REQUEST
    result = await asyncio.wait_for(request_result(handle), timeout=60)

    [done] = result.operations
    assert (done.state, done.approval) == ("expired", None)
    assert await effects(admin, done.operation_id) == []
    assert await note_posts(admin) == []


async def test_the_requests_own_user_rejects_through_the_channel_and_the_receipt_names_them(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    # A second write keeps the request open (waiting for its approval) while the first one is tried again.
    turns = [[note_call(version, "reject me", "w1")], [note_call(version, "and me", "w2")], [say("ok")]]
    handle = await start_agent(client, settings, "w", model=script_spec(*turns))
    op = await waiting_operation(handle)
    # Another user of the tenant may not decide u1's write: the channel signs nothing for them.
    with pytest.raises(ApprovalRefused, match="u2 may not decide it"):
        await decide(handle, op.operation_id, approve=False, decider=Actor(user_id="u2", tenant_id="acme"))
    await decide(handle, op.operation_id, approve=False)
    # An approval after the rejection is refused.
    with pytest.raises(WorkflowUpdateFailedError) as late:
        await decide(handle, op.operation_id, approve=True)
    assert "not waiting" in str(late.value.cause)
    second = await waiting_operation(handle)
    await decide(handle, second.operation_id, approve=False)
    result = await asyncio.wait_for(request_result(handle), timeout=60)

    done = result.operations[0]
    assert done.state == "denied" and done.approval is not None and done.approval.by == "u1 via test"
    assert done.transitions.count("denied") == 1
    assert await note_posts(admin) == []


async def test_service_refuses_an_approval_that_expired_before_execution(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # The token is valid when approved, but the write reaches the service after it expired.
    await set_faults(admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "latency_ms": 2500})
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client,
        settings,
        "w",
        model=script_spec([note_call(version, "late", "w1")], [say("ok")]),
        limits=Limits(write_timeout_seconds=5),
    )
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id, ttl=1.5)
    result = await asyncio.wait_for(request_result(handle), timeout=60)

    [done] = result.operations
    # The attempt was cut off when the approval ran out; the service's status (asked after that) decides.
    assert done.state == "failed" and done.attempts == 1
    assert [c.state for c in done.status_checks][-1] == "not_found"
    assert (await tool_outputs(handle))["w1"]["code"] == "CONFIRMATION_REQUIRED"

    async def refused_on_arrival() -> bool:
        return [p["status"] for p in await note_posts(admin)] == [403]

    await assert_eventually(refused_on_arrival, what="the late attempt was refused by the service")
    assert await effects(admin, op.operation_id) == []


async def test_the_deadline_ends_the_approval_wait_and_nothing_is_sent(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client,
        settings,
        "w",
        model=script_spec([note_call(version, "too late", "w1")], [say("ok")]),
        limits=Limits(deadline_seconds=3, approval_ttl_seconds=300),
    )
    op = await waiting_operation(handle)
    # The approval TTL is 300 s, but the request's deadline comes first.
    result = await asyncio.wait_for(request_result(handle), timeout=30)

    [done] = result.operations
    assert (done.state, done.attempts, done.approval) == ("expired", 0, None)
    assert done.approval_expires_at == done.deadline
    assert done.note is not None and "deadline" in done.note
    assert result.stop_reason == "deadline"
    # An approval that comes after the deadline is not signed, and nothing is sent.
    with pytest.raises(ApprovalRefused, match="deadline"):
        await decide(handle, op.operation_id)
    assert await effects(admin, op.operation_id) == []
    assert await note_posts(admin) == []


async def test_a_write_stalled_at_the_service_past_the_deadline_is_never_committed_and_is_resolved(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # The service claims the key and then stalls with the request in hand until after the deadline. The
    # approval expires at the deadline and the service checks that at commit: nothing may be written.
    await set_faults(
        admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_claim", "latency_ms": 7000}
    )
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client,
        settings,
        "w",
        model=script_spec([note_call(version, "stalled past the deadline", "w1")], [say("ok")]),
        limits=Limits(deadline_seconds=5, settle_seconds=20, write_timeout_seconds=10),
    )
    async with approving(handle):
        result = await asyncio.wait_for(request_result(handle), timeout=60)

    [done] = result.operations
    assert done.deadline is not None
    # Resolved by status queries before the run reported: in progress while the service held the key,
    # then not there; and "not done" is said only after the approval had expired.
    checks = [c.state for c in done.status_checks]
    assert checks[0] == "in_progress" and checks[-1] == "not_found"
    assert all(c.at >= done.deadline for c in done.status_checks if c.state == "not_found")
    assert (done.state, done.attempts) == ("failed", 1)
    assert result.stop_reason == "deadline"
    # The loop stopped at the deadline, so the model never read this output; the ledger keeps what it says.
    assert await tool_outputs(handle) == {}
    assert done.output is not None and done.output["code"] == "LIMIT_REACHED"
    [post] = await note_posts(admin)
    assert post["status"] == 403  # refused at commit: its approval had expired
    assert await effects(admin, done.operation_id) == []
    assert await ticket_version(business_service.url) == version


async def test_stale_version_is_a_version_conflict_without_effect(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    result, handle = await run_approved(
        client, settings, business_service, [[note_call(version + 5, "stale", "w1")], [say("ok")]]
    )

    assert result.operations[0].state == "failed"
    assert (await tool_outputs(handle))["w1"]["code"] == "VERSION_CONFLICT"
    assert await effects(admin, result.operations[0].operation_id) == []


async def test_refund_over_refundable_and_without_amount_are_rejected(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    turns = [
        [
            call("refund_order", {"orderId": "A103", "amountCents": 10**9, "reason": "too much"}, "over"),
            call("refund_order", {"orderId": "A103", "reason": "no amount"}, "no_amount"),
            call("refund_order", {"orderId": "A103", "amountCents": None, "reason": "null amount"}, "null_amount"),
        ],
        [say("ok")],
    ]
    result, handle = await run_approved(client, settings, business_service, turns)

    outputs = await tool_outputs(handle)
    assert {k: v["code"] for k, v in outputs.items()} == {
        "over": "BAD_ARGUMENTS",
        "no_amount": "BAD_ARGUMENTS",
        "null_amount": "BAD_ARGUMENTS",
    }
    [op] = result.operations  # the calls without an amount never became operations
    assert op.call_ids == ["over"] and op.state == "failed"
    assert await effects(admin, op.operation_id) == []


async def test_commit_then_dropped_reply_is_resolved_by_status_and_verified(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    await set_faults(
        admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "action": "drop"}
    )
    version = await ticket_version(business_service.url)
    result, handle = await run_approved(
        client, settings, business_service, [[note_call(version, "dropped reply", "w1")], [say("ok")]], **FAST
    )

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 1)
    assert [c.state for c in op.status_checks] == ["completed"]
    assert "unknown" in op.transitions
    assert len(await effects(admin, op.operation_id)) == 1


async def test_status_down_after_lost_reply_stays_unknown_and_is_not_resent(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    await set_faults(
        admin,
        {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "action": "drop"},
        {"method": "GET", "path_regex": "^/operations/", "status": 503},
    )
    version = await ticket_version(business_service.url)
    result, handle = await run_approved(
        client,
        settings,
        business_service,
        [[note_call(version, "unknown fate", "w1")], [say("I could not confirm the note.")]],
        status_max_attempts=2,
        **FAST,
    )

    [op] = result.operations
    assert (op.state, op.attempts) == ("unknown", 1)
    assert [c.state for c in op.status_checks] == ["unavailable"]
    output = (await tool_outputs(handle))["w1"]
    assert output["ok"] is False and output["code"] == "OUTCOME_UNKNOWN"
    assert [c.code for c in result.calls] == ["OUTCOME_UNKNOWN"]
    # It did happen (the service committed), and it was sent exactly once: unknown, never resent.
    assert len(await effects(admin, op.operation_id)) == 1
    posts = await note_posts(admin)
    assert len(posts) == 1


async def test_a_429_after_commit_is_never_reported_not_done(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # The service commits, then answers 429. With no attempt left to resend, only the status can tell.
    await set_faults(
        admin,
        {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "status": 429, "times": 1},
    )
    version = await ticket_version(business_service.url)
    result, handle = await run_approved(
        client,
        settings,
        business_service,
        [[note_call(version, "busy after commit", "w1")], [say("ok")]],
        max_write_attempts=1,
        **FAST,
    )

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 1)
    assert [c.state for c in op.status_checks] == ["completed"]
    assert (await tool_outputs(handle))["w1"]["state"] == "verified"
    assert len(await note_posts(admin)) == 1  # never resent: the status said it was done
    assert len(await effects(admin, op.operation_id)) == 1


async def test_503_before_commit_is_resent_with_the_same_key_once(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    await set_faults(admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "status": 503, "times": 1})
    version = await ticket_version(business_service.url)
    result, _ = await run_approved(
        client, settings, business_service, [[note_call(version, "after a 503", "w1")], [say("ok")]], **FAST
    )

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 2)
    assert [c.state for c in op.status_checks] == ["not_found"]
    assert len(await effects(admin, op.operation_id)) == 1
    posts = await note_posts(admin)
    assert [p["status"] for p in posts] == [503, 201]


async def test_a_resend_refused_after_an_unclear_attempt_is_unknown_never_not_done(
    client: Client, settings: Settings
) -> None:
    # Attempt 1's answer is lost (it may have arrived), the status says not found (which cannot rule out an
    # attempt still on its way), and the resend is refused (a replica or a worker of another version, say).
    # Before, the write was recorded as not done.
    sent: list[str] = []
    tools = toolloop.Toolset()

    async def add_entry(ctx: toolloop.ToolContext, args: Entry) -> dict[str, int]:
        """Write an entry in a ledger."""
        sent.append(args.text)
        if len(sent) == 1:
            raise toolloop.WriteOutcomeUnknown("the reply was lost")
        raise toolloop.ToolError(toolloop.ResultCode.CONFLICT, "this replica does not take it")

    async def status(ctx: toolloop.ToolContext, operation_id: str) -> toolloop.OperationStatus:
        return toolloop.OperationStatus(state="not_found", retention_seconds=86_400)

    tools.write(add_entry, status=status, read_back=None)
    async with running_worker(client, settings, AgentSpec(tools=tools)):
        turns = [[call("add_entry", {"text": "refused after doubt"}, "w1")], [say("ok")]]
        handle = await start_agent(client, settings, "w", model=script_spec(*turns), limits=Limits(**FAST))
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=60)
        replayer = Replayer(
            workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner()
        )
        await replayer.replay_workflow(await handle.fetch_history())

    [op] = result.operations
    assert (op.state, op.attempts, sent) == ("unknown", 2, ["refused after doubt"] * 2)
    assert [c.state for c in op.status_checks] == ["not_found"]
    assert result.outcome == "unknown"
    assert (await tool_outputs(handle))["w1"]["code"] == "OUTCOME_UNKNOWN"


async def test_retry_while_first_attempt_still_in_flight_makes_one_effect(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # Attempt 1 stalls before the service claims the key; the workflow times out, the status says
    # not_found, attempt 2 (same key) commits, and then attempt 1 arrives and must not write again.
    await set_faults(admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "latency_ms": 4000, "times": 1})
    version = await ticket_version(business_service.url)
    result, _ = await run_approved(
        client, settings, business_service, [[note_call(version, "stalled first", "w1")], [say("ok")]], **FAST
    )

    [op] = result.operations
    assert op.state == "verified" and op.attempts == 2

    async def both_attempts_answered() -> bool:
        posts = await note_posts(admin)
        return len(posts) == 2 and all(p["ended_at"] is not None for p in posts)

    await assert_eventually(both_attempts_answered, what="the stalled first attempt was answered too")
    assert len(await effects(admin, op.operation_id)) == 1


async def test_worker_killed_after_commit_before_reply_recorded_makes_one_effect(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService, tmp_path: Path
) -> None:
    await set_faults(
        admin,
        {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "latency_ms": 6000},
    )
    env = worker_env(settings)
    version = await ticket_version(business_service.url)
    first = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "first.log")
    second = None
    try:
        handle = await start_agent(
            client,
            settings,
            "w",
            model=script_spec([note_call(version, "killed worker", "w1")], [say("ok")]),
            limits=Limits(write_timeout_seconds=3, unknown_resolution_seconds=10),
        )
        async with approving(handle, business_service.approval_key) as approved:
            await assert_eventually(lambda: _has(approved), what="approved")

            async def committed() -> bool:
                return len(await effects(admin, approved[0])) == 1

            await assert_eventually(committed, what="the service committed the note")
            first.kill9()
            second = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "second.log")
            result = await asyncio.wait_for(request_result(handle), timeout=90)
    finally:
        first.kill9()
        if second is not None:
            second.stop()

    [op] = result.operations
    assert op.state == "verified" and op.attempts == 1
    assert [c.state for c in op.status_checks] == ["completed"]
    assert len(await effects(admin, op.operation_id)) == 1


async def _has(items: list[str]) -> bool:
    return bool(items)


# --- Retention: a late retry past the idempotency window fails closed ------------------------------


RETENTION_SECONDS = 10


@pytest.fixture
def short_retention_service(tmp_path: Path) -> Iterator[BusinessService]:
    service = start_service(tmp_path / "short", retention_seconds=RETENTION_SECONDS)
    yield service
    service.process.stop()


async def test_late_retry_past_retention_is_not_resent_and_stays_unknown(
    client: Client, settings: Settings, short_retention_service: BusinessService, tmp_path: Path
) -> None:
    # The worker dies right after the service committed; it comes back only after the service has
    # forgotten the key. The status then says not_found, and a resend would be a second effect.
    service = short_retention_service
    limits = Limits(
        approval_ttl_seconds=2,
        write_timeout_seconds=3,
        max_write_attempts=2,
        unknown_resolution_seconds=1,
        # A caller cannot raise the retention: the service declares its own (10 s) on its status answers.
        idempotency_retention_seconds=10**6,
    )
    env = worker_env(settings, service.url)
    version = await ticket_version(service.url)
    async with httpx.AsyncClient(base_url=service.url, headers={"X-Admin-Token": service.admin_token}) as svc_admin:
        await set_faults(
            svc_admin,
            {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "latency_ms": 3000},
        )
        first = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "first.log")
        second = None
        try:
            handle = await start_agent(
                client, settings, "w", model=script_spec([note_call(version, "late", "w1")], [say("ok")]), limits=limits
            )
            # The approval expires before the service forgets the key (it refuses one that would outlive it).
            async with approving(handle, service.approval_key, ttl=RETENTION_SECONDS - 2) as approved:
                await assert_eventually(lambda: _has(approved), what="approved")

                async def committed() -> bool:
                    return len(await effects(svc_admin, approved[0])) == 1

                await assert_eventually(committed, within=10, what="the service committed the note")
                first.kill9()
            await asyncio.sleep(RETENTION_SECONDS + 0.5)
            second = await asyncio.to_thread(start_worker, REPO_ROOT, env, tmp_path / "second.log")
            result = await asyncio.wait_for(request_result(handle), timeout=60)
        finally:
            first.kill9()
            if second is not None:
                second.stop()

        [op] = result.operations
        assert (op.state, op.attempts) == ("unknown", 1)
        assert [c.state for c in op.status_checks] == ["not_found"]
        assert op.note is not None and "expired" in op.note
        assert (await tool_outputs(handle))["w1"]["code"] == "OUTCOME_UNKNOWN"
        posts = [r for r in await service_requests(svc_admin, "/tickets/T1001/notes") if r["method"] == "POST"]
        assert len(posts) == 1
        response = await svc_admin.get("/admin/effects", params={"operation_id": op.operation_id})
        assert len(response.json()["effects"]) == 1


async def test_unreachable_service_is_retried_then_not_done(
    client: Client, settings: Settings, business_service: BusinessService
) -> None:
    # Nothing listens on this port: every attempt is refused before anything is sent.
    unreachable = settings.model_copy(update={"service_url": f"http://127.0.0.1:{free_port()}"})
    turns = [[note_call(1, "nobody home", "w1")], [say("ok")]]
    async with running_worker(client, unreachable, build_demo(unreachable.service_url)):
        result, handle = await run_approved(client, unreachable, business_service, turns, max_write_attempts=2)

    [op] = result.operations
    assert (op.state, op.attempts, op.status_checks) == ("failed", 2, [])
    output = (await tool_outputs(handle))["w1"]
    assert output["code"] == "TEMPORARY_UNAVAILABLE" and output["operation_id"] == op.operation_id


async def test_two_spellings_of_one_event_are_one_operation_and_one_effect(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # Another UTC offset, another order and a repeat in the attendee set, another Unicode normal form.
    first = {
        "calendarId": "cal-u1",
        "title": "Caf\u00e9 with the supplier",
        "start": "2026-12-04T12:00:00+02:00",
        "end": "2026-12-04T11:00:00Z",
        "attendees": ["ops@example.com", "ada@example.org"],
    }
    second = {
        **first,
        "title": "Cafe\u0301 with the supplier",
        "start": "2026-12-04T10:00:00Z",
        "end": "2026-12-04T06:00:00-05:00",
        "attendees": ["ada@example.org", "ops@example.com", "ada@example.org"],
    }
    turns = [[call("create_calendar_event", first, "e1")], [call("create_calendar_event", second, "e2")], [say("ok")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    [op] = result.operations
    assert op.call_ids == ["e1", "e2"] and op.state == "verified"
    outputs = await tool_outputs(handle)
    assert outputs["e2"]["same_operation_as_call"] == "e1"
    [effect] = await effects(admin, op.operation_id)
    assert (effect["title"], effect["start"], effect["attendees"]) == (
        "Caf\u00e9 with the supplier",
        "2026-12-04T10:00:00Z",
        ["ada@example.org", "ops@example.com"],
    )
    assert len([r for r in await service_requests(admin, "/calendars/cal-u1/events") if r["method"] == "POST"]) == 1


# --- Cancellation (FAULTS.md C4, C5) ------------------------------------------------------------------------


async def test_a_request_cancelled_while_its_write_waits_for_approval_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client, settings, "w", model=script_spec([note_call(version, "never approved", "w1")], [say("ok")])
    )
    op = await waiting_operation(handle)
    await handle.cancel()
    result = await asyncio.wait_for(request_result(handle), timeout=60)
    [done] = result.operations
    assert (result.stop_reason, done.state, done.approval) == ("cancelled", "expired", None)
    # The service never saw the write, and holds no effect of it.
    assert await note_posts(admin) == [] and await effects(admin, op.operation_id) == []
    assert await ticket_version(business_service.url) == version


async def test_a_request_cancelled_while_its_committed_write_is_in_flight_reports_it_done_once(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    # The service commits the note, then holds its reply for 2 s; the request is cancelled meanwhile.
    await set_faults(
        admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "when": "after_commit", "latency_ms": 2000}
    )
    version = await ticket_version(business_service.url)
    handle = await start_agent(
        client,
        settings,
        "w",
        model=script_spec([note_call(version, "cancelled in flight", "w1")], [say("ok")]),
        limits=Limits(write_timeout_seconds=10),
    )
    async with approving(handle) as approved:
        # The approver decides as soon as the operation waits (a second follower could find it decided).
        async def committed() -> bool:
            return bool(approved) and len(await effects(admin, approved[0])) == 1

        await assert_eventually(committed, what="the service committed the note")
        await handle.cancel()
        result = await asyncio.wait_for(request_result(handle), timeout=60)
    [done] = result.operations
    # The attempt in flight was waited for, not abandoned: its reply came, and the effect was read back.
    assert (result.stop_reason, done.state, done.attempts) == ("cancelled", "verified", 1)
    assert [p["status"] for p in await note_posts(admin)] == [201]
    assert len(await effects(admin, done.operation_id)) == 1
    assert await ticket_version(business_service.url) == version + 1


@pytest.fixture
def private_service(tmp_path: Path) -> Iterator[BusinessService]:
    """A business service of this test's own (its users can be revoked without touching other tests)."""
    service = start_service(tmp_path / "private")
    yield service
    service.process.stop()


async def test_authority_revoked_before_the_approved_write_runs_is_refused_there_and_reported_not_done(
    client: Client, settings: Settings, private_service: BusinessService
) -> None:
    # FAULTS.md Z1: the write is proposed and approved by u1, whose access the service has taken away
    # meanwhile. The service decides with what is true when the write arrives, not when it was proposed.
    service = private_service
    own = settings.model_copy(update={"service_url": service.url})
    version = await ticket_version(service.url)
    async with (
        httpx.AsyncClient(base_url=service.url, headers={"X-Admin-Token": service.admin_token}) as svc_admin,
        running_worker(client, own, build_demo(service.url)),
    ):
        handle = await start_agent(
            client, own, "w", model=script_spec([note_call(version, "after revocation", "w1")], [say("ok")])
        )
        op = await waiting_operation(handle)
        revoked = await svc_admin.post("/admin/revoke", json={"user_id": "u1", "tenant_id": "acme"})
        assert revoked.json() == {"revoked": True}
        await decide(handle, op.operation_id, key=service.approval_key)
        result = await asyncio.wait_for(request_result(handle), timeout=60)
        [done] = result.operations
        # One attempt, refused at execution, never resent; reported not done, and the service holds nothing.
        assert (done.state, done.attempts) == ("failed", 1)
        assert done.output is not None and (done.output["ok"], done.output["code"]) == (False, "FORBIDDEN")
        posts = [r for r in await service_requests(svc_admin, "/tickets/T1001/notes") if r["method"] == "POST"]
        assert [p["status"] for p in posts] == [401]
        assert await effects(svc_admin, done.operation_id) == []


async def test_the_workflows_own_result_is_the_whole_report(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    reads = [call("get_ticket", {"ticketId": "T1001"}, "r1"), call("get_ticket", {"ticketId": "T0"}, "r2")]
    turns = [reads, [note_call(version, "Replacement shipped.", "w1")], [say("Noted.")]]
    result, handle = await run_approved(client, settings, business_service, turns)

    # What a plain client reading handle.result() gets (the UI's Result panel too) is the whole report:
    # the same as toolloop.request_result, the ledger and what the model was told.
    raw = await handle.result()
    assert raw == result and (raw.final_text, raw.workflow_id, raw.status) == ("Noted.", handle.id, "completed")
    # A client that runs no worker reads it with toolloop's data converter alone.
    plain = await Client.connect(settings.temporal_address, data_converter=toolloop_data_converter())
    assert await plain.get_workflow_handle(handle.id, result_type=AgentResult).result() == result
    stored = await stored_report(handle)
    assert stored["workflow_id"] == handle.id and stored["status"] == "completed"
    progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
    assert raw.calls == progress.calls and [c.call_id for c in raw.calls] == ["r1", "r2", "w1"]
    assert [(c.ok, c.code) for c in raw.calls] == [(True, None), (False, "BAD_ARGUMENTS"), (True, None)]
    [ledger] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    [op] = raw.operations
    assert op == ledger and op.approval is not None and op.approval.by == "u1 via test"
    assert op.evidence is not None and op.evidence["verified"] is True and op.first_sent_at is not None
    assert op.output == (await tool_outputs(handle))["w1"]
    assert op.digest == payload_digest(op.target or op.tool, op.arguments)
    assert op.arguments["text"] == "Replacement shipped." and len(await effects(admin, op.operation_id)) == 1


async def test_a_failed_requests_whole_report_travels_in_its_failure(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    # Rejected, then the script runs out: the model fails, and the report travels in the failure's details.
    handle = await start_agent(client, settings, "w", model=script_spec([note_call(version, "no thanks", "w1")]))
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id, approve=False)
    result = await asyncio.wait_for(request_result(handle), timeout=60)

    assert (result.status, result.stop_reason) == ("failed", "model_error")
    stored = await stored_report(handle)
    assert stored["final_text"] is None  # there is no answer
    [done] = result.operations
    assert done.approval is not None and (done.approval.decision, done.approval.by) == ("rejected", "u1 via test")
    assert done.output is not None and done.output["code"] == "REJECTED"
    assert stored["operations"][0]["approval"]["decision"] == "rejected"
    [ledger] = await handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
    assert done == ledger
    assert await effects(admin, op.operation_id) == []


async def test_every_write_attempt_carries_the_approvals_token_in_its_input(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "token in the input", "w1")], [say("Noted.")]]
    result, handle = await run_approved(client, settings, business_service, turns)
    [op] = result.operations
    assert op.state == "verified" and len(await effects(admin, op.operation_id)) == 1

    events = [event async for event in handle.fetch_history_events()]
    # The decision, among the Updates the approver's follower sent (next_approval).
    [request] = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        == APPROVE_OPERATION_UPDATE
    ]
    [decision] = await client.data_converter.decode(request.input.args.payloads, [ApprovalDecision])
    # The attempt needs nothing but its input: no read of the run's history from the activity.
    [scheduled] = [
        e.activity_task_scheduled_event_attributes
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == EXECUTE_WRITE_ACTIVITY
    ]
    [attempt] = await client.data_converter.decode(scheduled.input.payloads, [WriteInput])
    assert decision.token and attempt.approval_token == decision.token
