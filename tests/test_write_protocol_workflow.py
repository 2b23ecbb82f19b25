"""Workflow tests of the write protocol with stand-in activities registered under the real activity names
(no business service, no worker process: the workflow runs on an in-process worker against the test
session's dev server). They reach the branches no end-to-end fault reaches on demand: a status that stays
in progress, attempts used up after a request may have arrived, a 409, the pause after a 429, every
validator case, the retention limit, model retries running out, no answer, writes over the per-round cap,
and a write whose read-back cannot see it."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from tests.agent_helpers import (
    U1,
    approving,
    assert_eventually,
    call,
    decide,
    say,
    stored_report,
    tool_outputs,
    waiting_operation,
)
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY
from toolloop import request_result
from toolloop._core.approvals import mint_approval_token, payload_digest, read_approval_claims
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentResult,
    ApprovalDecision,
    ApprovalRequest,
    ConversationItem,
    FunctionCallItem,
    Limits,
    ModelSpec,
    ModelTurnInput,
    ModelTurnResult,
    OperationQuery,
    ReadBackInput,
    ToolCallInput,
    ToolCallResult,
    WriteInput,
    WriteOutcome,
)
from toolloop._core.names import (
    AGENT_WORKFLOW,
    APPROVE_OPERATION_UPDATE,
    EXECUTE_WRITE_ACTIVITY,
    MODEL_TURN_ACTIVITY,
    QUERY_OPERATION_STATUS_ACTIVITY,
    READ_BACK_ACTIVITY,
    RUN_TOOL_ACTIVITY,
)
from toolloop._core.registry import Evidence, OperationStatus, ToolContext, ToolRegistry, ToolSpec
from toolloop._core.validation import check_turn
from toolloop._temporal.approval_channel import ApprovalRefused, fetch_approval_request, sign_decision
from toolloop._temporal.trust import TrustedApprovalKeys
from toolloop._temporal.worker_factory import workflow_runner
from toolloop.workflows.agent import AgentWorkflow

pytestmark = pytest.mark.e2e  # needs the session's Temporal dev server (nothing else)


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, description="x")


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="x")


async def _never(ctx: ToolContext, args: Any) -> dict[str, Any]:
    raise AssertionError("stand-in activities run instead")


async def _no_status(ctx: ToolContext, operation_id: str) -> OperationStatus:
    raise AssertionError("stand-in activities run instead")


async def _no_evidence(ctx: ToolContext, args: Any, output: Any) -> Evidence:
    raise AssertionError("stand-in activities run instead")


REGISTRY = ToolRegistry()
REGISTRY.register(
    ToolSpec("note", "Write a note.", NoteArgs, "side_effecting", _never, status=_no_status, read_back=_no_evidence)
)
REGISTRY.register(ToolSpec("read", "Read a thing.", ReadArgs, "read_only", _never))

ITEM: TypeAdapter[ConversationItem] = TypeAdapter(ConversationItem)


@dataclass
class StandIns:
    """Activities under the real names, answering from per-test scripts and recording every call."""

    turns: list[list[dict[str, Any]]] = field(default_factory=list)
    model_error: ApplicationError | None = None
    writes: list[WriteOutcome | float] = field(default_factory=list)  # a float: sleep that long, then unknown
    statuses: list[OperationStatus | Exception] = field(default_factory=list)
    evidence: list[Evidence | Exception] = field(default_factory=list)
    sent: list[WriteInput] = field(default_factory=list)
    asked: list[OperationQuery] = field(default_factory=list)
    read_backs: list[ReadBackInput] = field(default_factory=list)
    reads: list[ToolCallInput] = field(default_factory=list)
    offered: list[list[str] | None] = field(default_factory=list)

    @activity.defn(name=MODEL_TURN_ACTIVITY)
    async def model_turn(self, inp: ModelTurnInput) -> ModelTurnResult:
        self.offered.append(inp.offered_tools)
        if self.model_error is not None:
            raise self.model_error
        raw = self.turns[inp.turn - 1] if inp.turn <= len(self.turns) else [say("done")]
        items = [ITEM.validate_python(item) for item in raw]
        calls = [i for i in items if isinstance(i, FunctionCallItem)]
        checked, protocol_error = check_turn(REGISTRY, calls)
        return ModelTurnResult(
            items=items,
            calls=checked,
            model_label="stand-in",
            protocol_error=protocol_error,
        )

    @activity.defn(name=RUN_TOOL_ACTIVITY)
    async def run_tool(self, inp: ToolCallInput) -> ToolCallResult:
        self.reads.append(inp)
        return ToolCallResult(call_id=inp.call_id, output={"ok": True, "key": inp.arguments["key"]}, duration_ms=1)

    @activity.defn(name=EXECUTE_WRITE_ACTIVITY)
    async def execute_write(self, inp: WriteInput) -> WriteOutcome:
        self.sent.append(inp)
        step = self.writes.pop(0) if self.writes else WriteOutcome(kind="completed", output={"note_id": "N1"})
        if isinstance(step, float):
            await asyncio.sleep(step)  # longer than the attempt may take: the workflow gives up on it
            return WriteOutcome(kind="unknown", detail="too late")
        return step

    @activity.defn(name=QUERY_OPERATION_STATUS_ACTIVITY)
    async def query_operation_status(self, inp: OperationQuery) -> OperationStatus:
        self.asked.append(inp)
        step = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        if isinstance(step, Exception):
            raise step
        return step

    @activity.defn(name=READ_BACK_ACTIVITY)
    async def read_back_operation(self, inp: ReadBackInput) -> Evidence:
        self.read_backs.append(inp)
        step = self.evidence.pop(0) if len(self.evidence) > 1 else (self.evidence or [verified()])[0]
        if isinstance(step, Exception):
            raise step
        return step

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.model_turn,
            self.run_tool,
            self.execute_write,
            self.query_operation_status,
            self.read_back_operation,
        ]


def verified() -> Evidence:
    return Evidence(verified=True, detail="the note is there", checks={"text": True})


def completed(note_id: str = "N1") -> OperationStatus:
    return OperationStatus(state="completed", output={"ok": True, "note_id": note_id}, retention_seconds=86400)


def status(state: str, retention: float | None = 86400) -> OperationStatus:
    return OperationStatus.model_validate({"state": state, "retention_seconds": retention})


def unavailable() -> ApplicationError:
    return ApplicationError("status down", type=ErrorType.OPERATION_STATUS_UNAVAILABLE)


FAST = {"write_timeout_seconds": 2, "unknown_resolution_seconds": 3, "status_max_attempts": 1}


@dataclass
class Harness:
    client: Client
    task_queue: str
    stand_ins: StandIns

    async def start(
        self, limits: Limits | None = None, verify_key: str | None = None
    ) -> WorkflowHandle[Any, AgentResult]:
        """`verify_key`: what an input that tries to bring one holds (refused: the worker's keys decide)."""
        return await self.client.start_workflow(
            AGENT_WORKFLOW,
            AgentInput(
                request="stand-in",
                actor=U1,
                model=ModelSpec(provider="script", script=[]),
                limits=limits or Limits(**FAST),
                approval_verify_key=verify_key,
            ),
            id=f"standin-{uuid.uuid4().hex[:12]}",
            task_queue=self.task_queue,
            result_type=AgentResult,
        )

    async def run_approved(self, limits: Limits | None = None) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
        handle = await self.start(limits)
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=60)
        return result, handle


def standin_worker(client: Client, task_queue: str, stand_ins: StandIns, *, trusted: bool = True) -> Worker:
    """The workflow with stand-in activities, and (unless `trusted` is False) the plugin's trust interceptor
    holding the channel's public key, as ToolloopPlugin wires it."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[AgentWorkflow],
        activities=stand_ins.activities(),
        workflow_runner=workflow_runner(),
        interceptors=[TrustedApprovalKeys(APPROVAL_VERIFY_KEY)] if trusted else [],
    )


@pytest.fixture
async def harness(client: Client) -> AsyncIterator[Harness]:
    stand_ins = StandIns()
    task_queue = f"standin-{uuid.uuid4().hex[:10]}"
    async with standin_worker(client, task_queue, stand_ins):
        yield Harness(client, task_queue, stand_ins)


def note(text: str, call_id: str) -> dict[str, Any]:
    return call("note", {"text": text}, call_id)


def read(key: str, call_id: str) -> dict[str, Any]:
    return call("read", {"key": key}, call_id)


# --- Unknown outcomes -------------------------------------------------------------------------------------


async def test_status_in_progress_until_the_window_ends_stays_unknown(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="unknown", detail="cut")]
    s.statuses = [status("in_progress")]
    result, handle = await harness.run_approved()

    [op] = result.operations
    assert (op.state, op.attempts) == ("unknown", 1)
    assert len(op.status_checks) >= 2 and {c.state for c in op.status_checks} == {"in_progress"}
    assert (await tool_outputs(handle))["w1"]["code"] == "OUTCOME_UNKNOWN"
    assert len(s.sent) == 1 and s.read_backs == []


async def test_attempts_used_up_after_the_request_may_have_arrived_stay_unknown(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="unknown"), WriteOutcome(kind="unknown")]
    s.statuses = [status("not_found")]
    result, handle = await harness.run_approved(Limits(**FAST, max_write_attempts=2))

    [op] = result.operations
    # The last "not found" cannot rule out an earlier attempt still on its way: never "not done".
    assert (op.state, op.attempts) == ("unknown", 2)
    assert [c.state for c in op.status_checks] == ["not_found", "not_found"]
    assert (await tool_outputs(handle))["w1"]["code"] == "OUTCOME_UNKNOWN"
    assert [w.operation_id for w in s.sent] == [op.operation_id] * 2  # the same key every time


async def test_a_409_in_progress_is_resolved_by_the_status(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="in_progress", detail="409")]
    s.statuses = [status("in_progress"), completed()]
    result, _ = await harness.run_approved()

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 1)
    assert [c.state for c in op.status_checks] == ["in_progress", "completed"]
    assert len(s.read_backs) == 1


async def test_after_a_429_the_resend_waits_for_retry_after_and_uses_the_same_key(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="unknown", retry_after_seconds=2.0, detail="429")]
    s.statuses = [status("not_found")]
    result, handle = await harness.run_approved()

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 2)
    assert [c.state for c in op.status_checks] == ["not_found"]  # asked before resending
    assert [w.operation_id for w in s.sent] == [op.operation_id] * 2
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert timedelta(seconds=2) in timers


async def test_status_down_after_a_doubtful_attempt_stays_unknown(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="unknown")]
    s.statuses = [unavailable()]
    result, _ = await harness.run_approved()

    [op] = result.operations
    assert (op.state, op.attempts, [c.state for c in op.status_checks]) == ("unknown", 1, ["unavailable"])


# --- Retention: what the service declares, never the request -----------------------------------------------


@pytest.mark.parametrize("declared", [0.001, None], ids=["past_declared_retention", "retention_not_declared"])
async def test_a_resend_past_the_declared_retention_fails_closed(harness: Harness, declared: float | None) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="unknown")]
    s.statuses = [status("not_found", retention=declared)]
    # The request's own retention setting is ignored, however large.
    result, handle = await harness.run_approved(Limits(**FAST, idempotency_retention_seconds=10**9))

    [op] = result.operations
    assert (op.state, op.attempts) == ("unknown", 1)
    assert op.note is not None and "may have expired" in op.note
    assert len(s.sent) == 1
    assert (await tool_outputs(handle))["w1"]["code"] == "OUTCOME_UNKNOWN"


# --- Evidence: "done" only after a read-back (issue 11, bug 1) ---------------------------------------------


async def test_a_completed_write_is_read_back_before_it_is_called_verified(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    result, handle = await harness.run_approved()

    [op] = result.operations
    assert op.state == "verified" and op.evidence == verified().model_dump(mode="json")
    [asked] = s.read_backs
    assert (asked.operation_id, asked.output) == (op.operation_id, {"note_id": "N1"})
    assert (await tool_outputs(handle))["w1"]["state"] == "verified"


@pytest.mark.parametrize(
    "evidence",
    [
        ApplicationError("not visible", type=ErrorType.EVIDENCE_NOT_YET_VISIBLE),
        Evidence(verified=False, detail="the note's text differs", checks={"text": False}),
    ],
    ids=["read_back_cannot_see_it", "read_back_differs"],
)
async def test_a_write_whose_read_back_fails_ends_completed_not_verified(
    harness: Harness, evidence: Evidence | Exception
) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.evidence = [evidence]
    result, handle = await harness.run_approved(Limits(**FAST, readback_max_attempts=2))

    [op] = result.operations
    assert op.state == "completed" and "verified" not in op.transitions
    assert s.read_backs  # the workflow asked for evidence
    output = (await tool_outputs(handle))["w1"]
    assert (output["state"], output["verified"]) == ("completed", False)
    # The report holds the evidence, whether the read-back activity returned it or it was made up after the
    # activity gave up.
    [stored] = (await stored_report(handle))["operations"]
    assert stored["evidence"] == op.evidence and op.evidence is not None and op.evidence["verified"] is False


# --- The per-round cap counts writes (issue 11, bug 3) ------------------------------------------------------


@pytest.mark.parametrize(
    "turn",
    [
        [note("a", "w1"), note("b", "w2"), note("c", "w3")],
        [read("x", "r1"), note("a", "w1"), read("y", "r2"), note("b", "w2")],
        [note("a", "w1"), read("x", "r1"), note("b", "w2")],
    ],
    ids=["writes_only", "reads_and_writes", "write_read_write"],
)
async def test_writes_count_toward_the_per_round_cap(harness: Harness, turn: list[dict[str, Any]]) -> None:
    s = harness.stand_ins
    s.turns = [turn, [say("ok")]]
    result, handle = await harness.run_approved(Limits(**FAST, max_calls_per_round=2))

    await tool_outputs(handle)  # every call_id answered exactly once
    # The loop stops at the cap, so the model never reads these outputs: the records carry their codes.
    codes = {c.call_id: c.code for c in result.calls}
    ids = [c["call_id"] for c in turn]
    assert list(codes) == ids
    assert [codes[i] for i in ids[2:]] == ["LIMIT_REACHED"] * len(ids[2:])
    assert all(codes[i] is None for i in ids[:2])
    # Nothing over the cap ran: no approval asked, nothing sent, no read made.
    ran = {w.call_id for w in s.sent} | {r.call_id for r in s.reads}
    assert ran == set(ids[:2])
    assert len(result.operations) == sum(1 for c in turn[:2] if c["name"] == "note")
    assert result.stop_reason == "max_calls_per_round"


# --- The approval Update's validator ------------------------------------------------------------------------


async def test_validator_refuses_unknown_operation_missing_token_and_not_waiting(harness: Harness) -> None:
    s = harness.stand_ins
    # The second write keeps the request open while the first one is decided on again.
    s.turns = [[note("n", "w1")], [note("m", "w2")], [say("ok")]]
    handle = await harness.start()
    op = await waiting_operation(handle)
    cases = {
        "unknown operation": ApprovalDecision(operation_id="op_nope", digest=op.digest, approve=True, token="x"),
        "needs a token": ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=True),
        "needs a token ": ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=False),
    }
    for needle, decision in cases.items():
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(APPROVE_OPERATION_UPDATE, decision)
        assert needle.strip() in str(refused.value.cause)
    await decide(handle, op.operation_id, approve=False)
    with pytest.raises(WorkflowUpdateFailedError) as late:
        await decide(handle, op.operation_id, approve=True)
    assert "not waiting for approval" in str(late.value.cause)
    second = await waiting_operation(handle)
    await decide(handle, second.operation_id, approve=False)
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert [op.state for op in result.operations] == ["denied", "denied"] and s.sent == []


async def test_the_same_approval_twice_is_recorded_once(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [5.0]  # the first attempt hangs, so the operation is past "approved" when it comes again
    s.statuses = [completed()]
    handle = await harness.start()
    op = await waiting_operation(handle)
    request = await fetch_approval_request(handle, op.operation_id)
    assert request is not None
    token = sign_decision(request, U1, APPROVAL_KEY, workflow_id=handle.id, approve=True)
    decision = ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=True, token=token)
    first = await handle.execute_update(APPROVE_OPERATION_UPDATE, decision, result_type=dict)
    again = await handle.execute_update(APPROVE_OPERATION_UPDATE, decision, result_type=dict)
    # The answer is the state and when the decision was recorded: the second names the first's time.
    assert first["state"] == "approved" and again["at"] == first["at"] and set(first) == {"state", "at", "next"}
    assert first["next"] is None  # a decision sent without then_wait answers at once
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    [done] = result.operations
    assert done.transitions.count("approved") == 1 and done.state == "verified"


async def test_an_update_before_the_run_starts_is_refused_and_the_run_goes_on(client: Client) -> None:
    stand_ins = StandIns(turns=[[note("n", "w1")], [say("ok")]])
    task_queue = f"standin-{uuid.uuid4().hex[:10]}"
    harness = Harness(client, task_queue, stand_ins)
    handle = await harness.start()  # no worker yet: nothing of the run has happened
    decision = ApprovalDecision(operation_id="op_early", digest="sha256:x", approve=True, token="x")
    early = asyncio.create_task(handle.execute_update(APPROVE_OPERATION_UPDATE, decision))
    await asyncio.sleep(0.5)
    async with standin_worker(client, task_queue, stand_ins):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await early
        assert "unknown operation" in str(refused.value.cause)
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert [op.state for op in result.operations] == ["verified"]


async def test_a_request_whose_input_brings_a_verify_key_fails_at_its_start_and_runs_nothing(
    harness: Harness,
) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    # Even the worker's own key: trust is the worker's configuration, never a request's input.
    handle = await harness.start(Limits(**FAST), verify_key=APPROVAL_VERIFY_KEY)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.UNTRUSTED_INPUT
    assert cause.non_retryable and "never a request's" in cause.message
    assert s.offered == [] and s.sent == []  # not even a model turn ran


async def test_a_worker_without_the_trust_interceptor_takes_no_decision(client: Client) -> None:
    stand_ins = StandIns(turns=[[note("n", "w1")], [say("ok")]])
    task_queue = f"standin-{uuid.uuid4().hex[:10]}"
    async with standin_worker(client, task_queue, stand_ins, trusted=False):
        harness = Harness(client, task_queue, stand_ins)
        handle = await harness.start(Limits(**FAST, approval_ttl_seconds=2))
        op = await waiting_operation(handle)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(handle, op.operation_id)
        assert "no trust interceptor verified" in str(refused.value.cause)
        result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert result.operations[0].state == "expired" and stand_ins.sent == []


# --- Model failures, no answer -------------------------------------------------------------------------------


async def test_model_retries_running_out_stop_with_model_error(harness: Harness) -> None:
    harness.stand_ins.model_error = ApplicationError("503 from the model", type=ErrorType.MODEL_TEMPORARILY_UNAVAILABLE)
    handle = await harness.start(Limits(**FAST, model_max_attempts=2))
    result = await asyncio.wait_for(request_result(handle), timeout=30)

    assert (result.status, result.stop_reason, result.calls) == ("failed", "model_error", [])
    assert result.error is not None and "503 from the model" in result.error
    attempts = [
        e.activity_task_started_event_attributes.attempt
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts == [2]  # the started event records the last attempt


async def test_a_turn_with_neither_text_nor_calls_stops_with_no_answer(harness: Harness) -> None:
    harness.stand_ins.turns = [[]]
    handle = await harness.start()
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert (result.status, result.stop_reason, result.final_text) == ("failed", "no_answer", None)


async def test_nothing_more_to_say_after_the_tools_ran_is_an_answer(harness: Harness) -> None:
    harness.stand_ins.turns = [[read("k", "r1")], []]
    handle = await harness.start()
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert (result.status, result.stop_reason, result.final_text) == ("completed", "final_answer", "")
    assert [c.call_id for c in result.calls] == ["r1"]


# --- The deadline -------------------------------------------------------------------------------------------


async def test_a_write_in_flight_at_the_deadline_is_resolved_before_the_run_reports(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("never asked")]]
    s.writes = [30.0]  # the attempt outlives the deadline; the service did commit it
    s.statuses = [completed()]
    result, handle = await harness.run_approved(
        Limits(deadline_seconds=4, settle_seconds=10, write_timeout_seconds=20, unknown_resolution_seconds=5)
    )

    [op] = result.operations
    assert op.deadline is not None
    # The attempt was cut off at the deadline, then the status settled it, and the read-back ran.
    assert [c.state for c in op.status_checks] == ["completed"] and op.status_checks[0].at >= op.deadline
    assert (op.state, op.attempts) == ("verified", 1) and len(s.read_backs) == 1
    assert result.stop_reason == "deadline"
    assert await tool_outputs(handle) == {}  # stopped at the deadline: the model never read it
    assert op.output is not None and op.output["state"] == "verified"


async def test_an_update_of_another_users_decision_names_no_one(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    handle = await harness.start(Limits(**FAST, approval_ttl_seconds=3))
    op = await waiting_operation(handle)
    u2 = Actor(user_id="u2", tenant_id="acme")
    request = await fetch_approval_request(handle, op.operation_id)
    assert request is not None
    for approve in (True, False):
        # The channel signs nothing for someone who may not decide...
        with pytest.raises(ApprovalRefused, match="u2 may not decide it"):
            await decide(handle, op.operation_id, approve=approve, decider=u2)
        # ...and a token signed anyway (u2's decision on u1's write) is refused as a missing operation is.
        claims = read_approval_claims(sign_decision(request, U1, APPROVAL_KEY, workflow_id=handle.id, approve=approve))
        forged = mint_approval_token(APPROVAL_KEY, claims.model_copy(update={"approved_by": "u2"}))
        decision = ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=approve, token=forged)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(APPROVE_OPERATION_UPDATE, decision)
        assert f"unknown operation {op.operation_id!r}" in str(refused.value.cause)
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert (result.operations[0].state, result.operations[0].approval) == ("expired", None)


# --- When the approval runs out between attempts -------------------------------------------------------------


async def test_a_write_never_received_before_the_deadline_is_not_done(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="not_sent", retry_after_seconds=1.0)] * 10  # every attempt refused at connect
    result, handle = await harness.run_approved(Limits(**FAST, deadline_seconds=4, max_write_attempts=10))

    [op] = result.operations
    assert op.state == "failed" and 1 <= op.attempts < 10 and op.status_checks == []
    assert op.note is not None and "could not be reached before the request's deadline" in op.note
    assert op.output is not None and op.output["code"] == "TEMPORARY_UNAVAILABLE"


@pytest.mark.parametrize(
    ("token_ttl", "code", "why"),
    [(600.0, "LIMIT_REACHED", "the request's deadline passed"), (2.0, "CONFIRMATION_REQUIRED", "the approval expired")],
    ids=["deadline_first", "token_first"],
)
async def test_a_doubtful_attempt_is_settled_by_one_more_status_once_the_approval_ran_out(
    harness: Harness, token_ttl: float, code: str, why: str
) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    # A 429 asking for a pause longer than the approval has left: no second attempt can be sent.
    s.writes = [WriteOutcome(kind="unknown", retry_after_seconds=30.0)]
    s.statuses = [status("not_found")]
    handle = await harness.start(Limits(**FAST, deadline_seconds=5, settle_seconds=10))
    async with approving(handle, ttl=token_ttl):
        result = await asyncio.wait_for(request_result(handle), timeout=60)

    [op] = result.operations
    # Asked after the doubtful attempt, and once more when nothing could be sent any more: not there.
    assert (op.state, op.attempts, [c.state for c in op.status_checks]) == ("failed", 1, ["not_found", "not_found"])
    assert op.note is not None and why in op.note and "no record of it" in op.note
    assert op.output is not None and op.output["code"] == code
    assert len(s.sent) == 1


async def test_a_doubtful_attempt_found_done_after_the_approval_ran_out_is_verified(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [WriteOutcome(kind="unknown", retry_after_seconds=30.0)]
    s.statuses = [status("not_found"), completed()]
    result, _ = await harness.run_approved(Limits(**FAST, deadline_seconds=5, settle_seconds=10))

    [op] = result.operations
    assert (op.state, op.attempts, [c.state for c in op.status_checks]) == ("verified", 1, ["not_found", "completed"])
    assert len(s.read_backs) == 1


# --- Cancellation (FAULTS.md C4, C5) ------------------------------------------------------------------------


async def _event_types(handle: WorkflowHandle[Any, AgentResult]) -> list[int]:
    return [e.event_type async for e in handle.fetch_history_events()]


async def _model_turns_scheduled(handle: WorkflowHandle[Any, AgentResult]) -> int:
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    return scheduled.count(MODEL_TURN_ACTIVITY)


async def test_a_request_cancelled_during_the_approval_wait_sends_nothing_even_if_approved_then(
    harness: Harness,
) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    handle = await harness.start()
    op = await waiting_operation(handle)
    request = await fetch_approval_request(handle, op.operation_id)
    assert request is not None
    token = sign_decision(request, U1, APPROVAL_KEY, workflow_id=handle.id, approve=True)
    await handle.cancel()
    # The approval arrives while the cancellation is being handled: refused (by the validator, or because the
    # run has closed), or recorded just before it - and in no case sent.
    decision = ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=True, token=token)
    with contextlib.suppress(WorkflowUpdateFailedError, RPCError):
        await handle.execute_update(APPROVE_OPERATION_UPDATE, decision, result_type=dict)
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert (result.stop_reason, result.status) == ("cancelled", "stopped")
    [done] = result.operations
    # Cancelled in the approval wait, or - when the approval was handled first - while its attempt was only
    # scheduled: never started, so certainly not sent. Either way not done, and nothing ran.
    if done.state == "expired":
        assert "cancelled before this was sent" in (done.note or "")
    else:
        assert (done.state, done.attempts) == ("failed", 1), done
        assert "no attempt reached the service" in (done.note or "")
    assert s.sent == [] and s.asked == [] and await _model_turns_scheduled(handle) == 1


async def test_a_write_in_flight_when_the_request_is_cancelled_is_waited_for_and_settled_by_its_status(
    harness: Harness,
) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [1.5]  # in flight for 1.5 s, then an unclear answer
    s.statuses = [completed()]
    handle = await harness.start()
    op = await waiting_operation(handle)
    request = await fetch_approval_request(handle, op.operation_id)
    assert request is not None
    await decide(handle, op.operation_id)

    async def sent() -> bool:
        return len(s.sent) == 1

    await assert_eventually(sent, what="the attempt is in flight")
    await handle.cancel()

    async def cancel_handled() -> bool:
        return EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in await _event_types(handle)

    await assert_eventually(cancel_handled, what="the workflow asked to cancel the attempt")
    # Once cancelled, no decision is taken any more.
    token = sign_decision(request, U1, APPROVAL_KEY, workflow_id=handle.id, approve=False)
    rejection = ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=False, token=token)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(APPROVE_OPERATION_UPDATE, rejection)
    assert "the request was cancelled" in str(refused.value.cause)

    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert (result.stop_reason, result.status) == ("cancelled", "stopped")
    [done] = result.operations
    # The attempt was waited for (not abandoned), its unclear answer settled by the status, then verified.
    assert done.state == "verified" and done.attempts == 1
    assert (len(s.sent), len(s.asked), len(s.read_backs)) == (1, 1, 1)
    assert await _model_turns_scheduled(handle) == 1  # the model is not asked again


async def test_a_cancelled_write_the_service_has_no_record_of_stays_unknown_never_resent(harness: Harness) -> None:
    s = harness.stand_ins
    s.turns = [[note("n", "w1")], [say("ok")]]
    s.writes = [1.5]
    s.statuses = [status("not_found")]
    handle = await harness.start()
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id)

    async def sent() -> bool:
        return len(s.sent) == 1

    await assert_eventually(sent, what="the attempt is in flight")
    await handle.cancel()
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    [done] = result.operations
    # Its approval is still valid, so the attempt could still arrive: unknown, neither done nor not done.
    assert (result.stop_reason, done.state) == ("cancelled", "unknown")
    assert "the request was cancelled; the service has no record of it yet" in (done.note or "")
    assert len(s.sent) == 1 and len(s.asked) >= 1 and s.read_backs == []


async def test_a_write_this_request_may_not_use_is_forbidden_and_never_sent(harness: Harness) -> None:
    # FAULTS.md M4: the model (or text it read) asks for a tool the request was not given.
    s = harness.stand_ins
    s.turns = [[read("k", "r1"), note("n", "w1")], [say("ok")]]
    handle = await harness.client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request="stand-in",
            actor=U1,
            model=ModelSpec(provider="script", script=[]),
            limits=Limits(**FAST),
            allowed_tools=["read"],
        ),
        id=f"standin-{uuid.uuid4().hex[:12]}",
        task_queue=harness.task_queue,
        result_type=AgentResult,
    )
    result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert [(c.call_id, c.ok, c.code) for c in result.calls] == [("r1", True, None), ("w1", False, "FORBIDDEN")]
    assert result.operations == [] and s.sent == [] and [r.call_id for r in s.reads] == ["r1"]
    assert s.offered == [["read"], ["read"]]  # every turn offered the allowed tools only
    outputs = await tool_outputs(handle)
    assert outputs["w1"]["code"] == "FORBIDDEN" and outputs["r1"]["ok"] is True


async def test_an_approval_and_a_cancel_in_one_task_never_send_and_report_not_done(client: Client) -> None:
    # Both reach the workflow in one workflow task (no worker while they arrive): the approval is handled
    # first and its attempt scheduled, then the cancellation lands before the attempt could start.
    stand_ins = StandIns(turns=[[note("n", "w1")], [say("ok")]])
    task_queue = f"standin-{uuid.uuid4().hex[:10]}"
    harness = Harness(client, task_queue, stand_ins)
    handle = await harness.start()
    async with standin_worker(client, task_queue, stand_ins):
        op = await waiting_operation(handle)
        request = await fetch_approval_request(handle, op.operation_id)
        assert request is not None
    token = sign_decision(request, U1, APPROVAL_KEY, workflow_id=handle.id, approve=True)
    decision = ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=True, token=token)
    await handle.cancel()
    update = asyncio.create_task(handle.execute_update(APPROVE_OPERATION_UPDATE, decision, result_type=dict))
    await asyncio.sleep(0.5)
    async with standin_worker(client, task_queue, stand_ins):
        recorded = await update  # handled before the cancellation, in the same task
        result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert recorded["state"] == "approved"
    [done] = result.operations
    # The attempt was scheduled, then cancelled before any worker started it: certainly not sent, so not
    # done - no status question needed, nothing resent.
    assert result.stop_reason == "cancelled"
    assert (done.state, done.transitions[-3:], done.attempts) == ("failed", ["approved", "sent", "failed"], 1)
    assert done.note == "the request was cancelled; no attempt reached the service, so it was not done."
    assert stand_ins.sent == [] and stand_ins.asked == []


async def admitted(client: Client, handle: WorkflowHandle[Any, Any], update_id: str) -> None:
    """Returns once the server holds the Update (admitted), before any worker has seen it."""
    request = PollWorkflowExecutionUpdateRequest(
        namespace=client.namespace,
        update_ref=UpdateRef(
            workflow_execution=WorkflowExecution(workflow_id=handle.id, run_id=handle.result_run_id or ""),
            update_id=update_id,
        ),
        wait_policy=WaitPolicy(
            lifecycle_stage=UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
        ),
    )
    for _ in range(200):
        try:
            await client.workflow_service.poll_workflow_execution_update(request)
            return
        except RPCError:  # not there yet: the client's Update call has not reached the server
            await asyncio.sleep(0.01)
    raise AssertionError(f"update {update_id} was never admitted")


async def test_an_approval_that_arrives_after_its_window_is_refused_whatever_the_timers_state(client: Client) -> None:
    """The approval was signed inside the window but reaches the workflow after it, in the same task as the
    window's timer firing (no worker ran in between): it is refused and nothing is sent."""
    stand_ins = StandIns(turns=[[note("n", "w1")], [say("ok")]])
    task_queue = f"standin-{uuid.uuid4().hex[:10]}"
    harness = Harness(client, task_queue, stand_ins)
    handle = await harness.start(Limits(**FAST, approval_ttl_seconds=2))
    async with standin_worker(client, task_queue, stand_ins):
        op = await waiting_operation(handle)
        request = await fetch_approval_request(handle, op.operation_id)
        assert request is not None and request.approval_expires_at is not None
        token = sign_decision(request, U1, APPROVAL_KEY, workflow_id=handle.id, approve=True)
    # No worker now: wait on the wall clock until the window has closed, then send the decision.
    await asyncio.sleep(max(0.0, request.approval_expires_at.timestamp() - time.time()) + 0.05)
    decision = ApprovalDecision(operation_id=op.operation_id, digest=op.digest, approve=True, token=token)
    update_id = f"late-{uuid.uuid4().hex[:8]}"
    late = asyncio.create_task(handle.execute_update(APPROVE_OPERATION_UPDATE, decision, id=update_id))
    await admitted(client, handle, update_id)
    async with standin_worker(client, task_queue, stand_ins):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await late
        result = await asyncio.wait_for(request_result(handle), timeout=30)
    assert "approval window has closed" in str(refused.value.cause)
    [done] = result.operations
    assert done.state == "expired" and "approved" not in done.transitions
    assert stand_ins.sent == []


def test_the_channel_will_not_sign_once_the_window_has_closed_and_says_so() -> None:
    now = datetime.now(UTC)
    request = ApprovalRequest(
        operation_id="op_1",
        tool="append_ticket_note",
        arguments={"text": "x"},
        digest=payload_digest("append_ticket_note", {"text": "x"}),
        state="awaiting_approval",
        actor=U1,
        approval_expires_at=now - timedelta(milliseconds=1),
        audience="bizservice",
    )
    with pytest.raises(ApprovalRefused, match="approval window has closed"):
        sign_decision(request, U1, APPROVAL_KEY, workflow_id="test-request", approve=True)
    # Inside the window, the token names it: the workflow and the service refuse a decision made after it.
    token = sign_decision(
        request.model_copy(update={"approval_expires_at": now + timedelta(seconds=30)}),
        U1,
        APPROVAL_KEY,
        workflow_id="test-request",
        approve=True,
    )
    claims = read_approval_claims(token)
    assert claims.decide_by == pytest.approx((now + timedelta(seconds=30)).timestamp())
