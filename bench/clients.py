"""I/O: one benchmark request on each stack, from the client's side - (a) toolloop's AgentWorkflow started and
approved through toolloop's client (toolloop.ToolloopClient, what the CLI and the API use), (b) the floor
started and approved by its one Update, (c) the plain asyncio loop making the same HTTP calls with no Temporal
at all - and what a finished run's history holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench.actions import actions_of
from bench.floor_types import operation_key
from bench.floor_workflow import APPROVE_UPDATE, FLOOR_WORKFLOW
from bench.scenarios import (
    ANSWER,
    CALENDAR,
    REPORT_TOOL,
    WRITE_TOOL,
    Call,
    Scenario,
    calls_for_turn,
    report_output,
    write_body,
    write_call,
)
from demo.bizservice.writes import AUDIENCE as DEMO_AUDIENCE
from toolloop import testing
from toolloop._core.contracts import Actor, AgentResult, ApprovalRequest, Limits, ModelSpec
from toolloop._core.names import SEND_MESSAGE_UPDATE as SEND_MESSAGE
from toolloop._temporal.client import ToolloopClient, ToolloopRequest
from toolloop._temporal.following import changes

ACTOR = Actor(user_id="u1", tenant_id="acme")
ACTOR_HEADERS = {"X-Actor-User": ACTOR.user_id, "X-Actor-Tenant": ACTOR.tenant_id}
WRITE_PATH = f"/calendars/{CALENDAR}/events"
REQUEST_TIMEOUT_S = 120.0
_APPROVAL_TTL_S = 600.0


@dataclass
class Outcome:
    """One request as its client saw it."""

    stack: str
    request_id: str
    latency_s: float
    ok: bool
    calls_answered: int
    error: str | None = None
    workflow_id: str | None = None
    # Unix time at which the client had the approval request in hand ((a)'s writes), and (when traced) at
    # which its long poll delivered the wait's TimerStarted event.
    approval_known_at: float | None = None
    timer_seen_at: float | None = None
    operation_id: str | None = None
    final_state: str | None = None
    # Who approved the write, as the report says ((a) only): "rule <id>" when its policy decided it.
    approved_by: str | None = None


@dataclass
class History:
    events: int
    bytes: int
    completed_activities: Counter[str] = field(default_factory=Counter)
    # Unix time of the first TimerStarted event ((a)'s approval wait).
    first_timer_at: float | None = None
    # Temporal Cloud's billable actions the history shows (bench/actions.py), and its timers started.
    actions: int = 0
    timers: int = 0
    # Workflow tasks completed, and the bytes of each event type (the threads phase says where bytes go).
    workflow_tasks: int = 0
    bytes_by_type: Counter[str] = field(default_factory=Counter)
    # Unix times of the first and the last event (the run's start and, once closed, its end).
    started_at: float | None = None
    closed_at: float | None = None
    # A thread's workflow: when each send_message Update was accepted, in order, and per child workflow id when
    # its start was initiated.
    sends_accepted_at: list[float] = field(default_factory=list)
    # Unix time of the first TimerCanceled event ((a)'s approval wait ended by the decision).
    first_timer_canceled_at: float | None = None
    child_initiated_at: dict[str, float] = field(default_factory=dict)
    # Per activity type: seconds from each completed activity's scheduling to its completion, summed.
    activity_s: dict[str, float] = field(default_factory=dict)


class Stack(Protocol):
    name: str

    async def run(self, scenario: Scenario, request_id: str) -> Outcome: ...


Run = Callable[[Scenario, str], Coroutine[Any, Any, Outcome]]


def limits_for(scenario: Scenario) -> Limits:
    """toolloop's limits, raised where a scenario needs more than the defaults allow, so that (a) makes the
    same calls as the floor: all reads of a round in one parallel wave, every round, and whole outputs."""
    defaults = Limits()
    return Limits(
        max_rounds=max(defaults.max_rounds, scenario.model_turns),
        max_calls_per_round=max(defaults.max_calls_per_round, scenario.reads),
        max_parallel_reads=max(defaults.max_parallel_reads, scenario.reads),
        max_total_calls=max(defaults.max_total_calls, scenario.calls),
        max_tool_output_bytes=max(defaults.max_tool_output_bytes, 2 * scenario.output_bytes),
        # The floor has no deadline; with 5,000 requests started at once the last ones start about ten minutes
        # after the first on this machine, which the default deadline (600 s) would stop.
        deadline_seconds=max(defaults.deadline_seconds, 3600.0),
    )


def approval_token(signing_key: str, operation_id: str, body: dict[str, Any], request: str) -> str:
    """What the approval channel signs for a write the client sends itself ((b) and (c)): the user's approval
    of exactly this POST's body under this operation id, given in `request` (as toolloop's channel names it)."""
    return testing.approval_token(
        signing_key,
        actor=ACTOR,
        operation_id=operation_id,
        payload=body,
        path=WRITE_PATH,
        audience=DEMO_AUDIENCE,
        ttl_seconds=_APPROVAL_TTL_S,
        request=request,
    )


def _failed(stack: str, request_id: str, started: float, exc: BaseException, workflow_id: str | None) -> Outcome:
    return Outcome(
        stack, request_id, time.perf_counter() - started, False, 0, f"{type(exc).__name__}: {exc}", workflow_id
    )


# --- (a) toolloop -------------------------------------------------------------------------------------------


class OursStack:
    name = "ours"

    def __init__(
        self,
        client: Client,
        task_queue: str,
        signing_key: str,
        model: ModelSpec | None = None,
        answer: str = ANSWER,
        approve: bool = True,
    ) -> None:
        self.client = client
        # toolloop's client: starts the requests and is their approval channel ("u1 via bench").
        self.requests = ToolloopClient(client, task_queue=task_queue, signing_key=signing_key, channel="bench")
        # The benchmark's own model by default (bench.agent); the streaming phase's worker call one over HTTP.
        self.model = model or ModelSpec(provider="bench")
        # What a request's answer must be to count as answered.
        self.answer = answer
        # False: no person in the loop (the policy phase: its writes are decided by rule).
        self.approve = approve

    async def begin(self, scenario: Scenario, request_id: str) -> ToolloopRequest:
        """Start one request through toolloop's client: its workflow id scoped to the user, the search
        attributes, a summary, as `starter.py ask` and the API start theirs."""
        return await self.requests.start(
            scenario.request_text(),
            actor=ACTOR,
            request_id=request_id,
            model=self.model,
            limits=limits_for(scenario),
        )

    async def start(self, scenario: Scenario, request_id: str) -> WorkflowHandle[Any, AgentResult]:
        """Start one request (the scale phase): its workflow's handle."""
        return (await self.begin(scenario, request_id)).handle

    async def run(self, scenario: Scenario, request_id: str, *, trace: bool = False) -> Outcome:
        """One request, its writes approved as soon as they wait. `trace` also follows the run's history on
        its own, to tell when the approval wait's TimerStarted event reached the client."""
        started = time.perf_counter()
        request: ToolloopRequest | None = None
        approvals: list[float] = []
        timers: list[float] = []
        helpers: list[asyncio.Task[Any]] = []
        try:
            if not trace:
                # One call, as a client application runs a request with writes (its first approval wait
                # starts with the request).
                approver = _approve_at_once(approvals) if scenario.write and self.approve else None
                result = await asyncio.wait_for(
                    self.requests.run(
                        scenario.request_text(),
                        actor=ACTOR,
                        request_id=request_id,
                        model=self.model,
                        limits=limits_for(scenario),
                        approver=approver,
                    ),
                    REQUEST_TIMEOUT_S,
                )
            else:
                request = await self.begin(scenario, request_id)
                if scenario.write and self.approve:
                    helpers.append(asyncio.create_task(request.decide_each(_approve_at_once(approvals))))
                    helpers.append(asyncio.create_task(_first_timer(request.handle, timers)))
                result = await asyncio.wait_for(request.result(), REQUEST_TIMEOUT_S)
        except Exception as exc:
            return _failed(self.name, request_id, started, exc, request.workflow_id if request else None)
        finally:
            for helper in helpers:
                helper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
        latency = time.perf_counter() - started
        outcome = outcome_of_result(result, scenario, request_id, latency, self.answer)
        outcome.approval_known_at = approvals[0] if approvals else None
        outcome.timer_seen_at = timers[0] if timers else None
        return outcome


def _approve_at_once(known_at: list[float]) -> Callable[[ApprovalRequest], bool]:
    """A user who approves each operation as soon as it waits; `known_at` gets when each reached the client."""

    def approve(_: ApprovalRequest) -> bool:
        known_at.append(time.time())
        return True

    return approve


async def _first_timer(handle: WorkflowHandle[Any, AgentResult], seen_at: list[float]) -> None:
    async for change in changes(handle):
        if change.timer_started:
            seen_at.append(time.time())
            return


def outcome_of_result(
    result: AgentResult, scenario: Scenario, request_id: str, latency_s: float, answer: str = ANSWER
) -> Outcome:
    answered = len({c.call_id for c in result.calls if c.ok})
    op = result.operations[0] if result.operations else None
    ok = (
        result.status == "completed"
        and result.stop_reason == "final_answer"
        and result.final_text == answer
        and answered == scenario.calls
        and (not scenario.write or (op is not None and op.state == "verified"))
    )
    error = None if ok else f"{result.status}/{result.stop_reason}: {result.error or ''} ({answered} calls ok)"
    return Outcome(
        "ours",
        request_id,
        latency_s,
        ok,
        answered,
        error,
        result.workflow_id,
        operation_id=op.operation_id if op else None,
        final_state=op.state if op else None,
        approved_by=op.approval.by if op and op.approval else None,
    )


# --- (b) the floor ------------------------------------------------------------------------------------------


class FloorStack:
    name = "floor"

    def __init__(self, client: Client, task_queue: str, signing_key: str, approve: bool = True) -> None:
        self.client = client
        self._queue = task_queue
        self._signing_key = signing_key
        # False: no person in the loop (the policy phase: its worker signs the rule's decision itself).
        self._approve = approve

    def workflow_id(self, request_id: str) -> str:
        return f"floor-{request_id}"

    async def start(self, scenario: Scenario, request_id: str) -> WorkflowHandle[Any, str]:
        handle: WorkflowHandle[Any, str] = await self.client.start_workflow(
            FLOOR_WORKFLOW,
            scenario.request_text(),
            id=self.workflow_id(request_id),
            task_queue=self._queue,
            result_type=str,
        )
        if scenario.write and self._approve:
            # The user approves up front; the workflow holds the token until its write.
            call = write_call(scenario)
            key = operation_key(handle.id, call.call_id)
            await handle.execute_update(
                APPROVE_UPDATE, approval_token(self._signing_key, key, write_body(call.arguments), handle.id)
            )
        return handle

    async def run(self, scenario: Scenario, request_id: str) -> Outcome:
        started = time.perf_counter()
        handle: WorkflowHandle[Any, str] | None = None
        try:
            handle = await self.start(scenario, request_id)
            answer = await asyncio.wait_for(handle.result(), REQUEST_TIMEOUT_S)
        except Exception as exc:
            return _failed(self.name, request_id, started, exc, handle.id if handle else None)
        latency = time.perf_counter() - started
        ok = answer == ANSWER
        # The calls answered are counted from its history afterwards (floor_answered); none until then.
        operation_id = operation_key(handle.id, write_call(scenario).call_id) if scenario.write else None
        return Outcome(
            self.name,
            request_id,
            latency,
            ok,
            calls_answered=0,
            error=None if ok else f"answer {answer!r}",
            workflow_id=handle.id,
            operation_id=operation_id,
        )


def floor_answered(history: History) -> int:
    """Calls the floor answered: each read, and each write once read back."""
    return history.completed_activities["floor_read"] + history.completed_activities["floor_read_back"]


# --- (c) the plain asyncio loop -----------------------------------------------------------------------------


class PlainStack:
    """The same calls with no durability: the model's turns are function calls, the reads of a round run
    in parallel, the write carries its idempotency key and approval, and is read back."""

    name = "plain"

    def __init__(self, http: httpx.AsyncClient, signing_key: str) -> None:
        self._http = http
        self._signing_key = signing_key

    async def run(self, scenario: Scenario, request_id: str) -> Outcome:
        started = time.perf_counter()
        answered = 0
        try:
            turn = 0
            while (calls := calls_for_turn(scenario, turn := turn + 1)) is not None:
                reads = [c for c in calls if c.name != WRITE_TOOL]
                outputs = list(await asyncio.gather(*(self._read(c) for c in reads)))
                for call in (c for c in calls if c.name == WRITE_TOOL):
                    outputs.append(await self._write(call, f"plain-{request_id}-{call.call_id}", request_id))
                answered += len(outputs)
        except Exception as exc:
            outcome = _failed(self.name, request_id, started, exc, None)
            outcome.calls_answered = answered
            return outcome
        return Outcome(self.name, request_id, time.perf_counter() - started, answered == scenario.calls, answered)

    async def _read(self, call: Call) -> str:
        if call.name == REPORT_TOOL:
            return json.dumps(report_output(call.arguments["reportId"], call.arguments["size"]))
        response = await self._http.get(f"/orders/{call.arguments['orderId']}", headers=ACTOR_HEADERS)
        response.raise_for_status()
        return response.text

    async def _write(self, call: Call, key: str, request_id: str) -> str:
        body = write_body(call.arguments)
        headers = {
            **ACTOR_HEADERS,
            "Idempotency-Key": key,
            "X-Approval-Token": approval_token(self._signing_key, key, body, request_id),
        }
        response = await self._http.post(f"/calendars/{CALENDAR}/events", json=body, headers=headers)
        response.raise_for_status()
        event_id = response.json()["event_id"]
        seen = await self._http.get(f"/calendars/{CALENDAR}/events/{event_id}", headers=ACTOR_HEADERS)
        seen.raise_for_status()
        return seen.text


def plain_http(service_url: str) -> httpx.AsyncClient:
    """The loop's client, set up like toolloop's tool sources (no transport retries, the same timeouts)."""
    return httpx.AsyncClient(
        base_url=service_url,
        timeout=httpx.Timeout(10.0, connect=3.0),
        transport=httpx.AsyncHTTPTransport(retries=0),
        trust_env=False,
    )


# --- Histories ----------------------------------------------------------------------------------------------


async def history_of(client: Client, workflow_id: str) -> History:
    """Events and bytes (each event's serialized size) of a run's history, and its completed activities."""
    handle = client.get_workflow_handle(workflow_id)
    history = History(events=0, bytes=0)
    activity_types: dict[int, str] = {}
    scheduled_at: dict[int, float] = {}
    async for event in handle.fetch_history_events():
        size = event.ByteSize()
        history.events += 1
        history.bytes += size
        history.actions += actions_of(event)
        kind = event.event_type
        history.bytes_by_type[EventType.Name(kind)] += size
        at = event.event_time.ToNanoseconds() / 1e9
        history.started_at = at if history.started_at is None else history.started_at
        history.closed_at = at
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            history.workflow_tasks += 1
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activity_types[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled_at[event.event_id] = at
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
            history.completed_activities[activity_types.get(scheduled, "?")] += 1
            name = activity_types.get(scheduled, "?")
            history.activity_s[name] = history.activity_s.get(name, 0.0) + at - scheduled_at.get(scheduled, at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            if event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == SEND_MESSAGE:
                history.sends_accepted_at.append(at)
        elif kind == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            history.child_initiated_at[event.start_child_workflow_execution_initiated_event_attributes.workflow_id] = at
        elif kind == EventType.EVENT_TYPE_TIMER_CANCELED:
            history.first_timer_canceled_at = history.first_timer_canceled_at or at
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            history.timers += 1
            if history.first_timer_at is None:
                history.first_timer_at = event.event_time.ToNanoseconds() / 1e9
    return history


def new_request_id(phase: str, i: int) -> str:
    return f"{phase}-{i}-{uuid.uuid4().hex[:8]}"
