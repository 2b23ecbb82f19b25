"""I/O: following one request as it runs, without a polling loop - a long poll on the run's own history
(the server answers as soon as an event is appended), and the queries that read what changed.

The workflow's queryable state changes only in a workflow task, and every workflow task ends with an event,
so a client that reads its queries after each `WorkflowTaskCompleted` (and after the run closes) misses
nothing. An operation that starts waiting for approval starts a timer in that same task, so its
`TimerStarted` event is when to look for pending approvals, and it says which one waits: the approval
request is then read from the history the long poll has already handed over (the payload is in the
model turn that proposed it, as an activity's result or a local activity's marker), with no query and no
sleeping in between."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError

from toolloop._core.approvals import approval_wait_of, derive_operation_id, payload_digest, short_operation_id
from toolloop._core.contracts import AgentInput, ApprovalRequest, ModelTurnResult
from toolloop._core.names import GET_PENDING_APPROVALS_QUERY, MODEL_TURN_ACTIVITY
from toolloop._temporal.converter import data_converter

_CLOSED = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)


# Events per history page a client asks for when it reads approvals (the server's own default).
_PAGE_SIZE = 1000


@dataclass(frozen=True)
class Change:
    """A point after which the request's queries may answer differently."""

    # A timer started: an operation may have started waiting for approval.
    timer_started: bool
    closed: bool
    # When the server appended the event.
    at: datetime


async def changes(handle: WorkflowHandle[Any, Any]) -> AsyncIterator[Change]:
    """Every completed workflow task of the run and every timer it started (those already in its history
    first), then its close; ends when the run has closed."""
    event: HistoryEvent
    async for event in handle.fetch_history_events(wait_new_event=True):
        kind = event.event_type
        # A task's commands (its timers among them) are appended right after its WorkflowTaskCompleted, in
        # the same write, so the long poll hands them over together.
        timer = kind == EventType.EVENT_TYPE_TIMER_STARTED
        closed = kind in _CLOSED
        if timer or closed or kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            yield Change(timer_started=timer, closed=closed, at=event.event_time.ToDatetime())
            if closed:
                return


async def pending_approvals(handle: WorkflowHandle[Any, Any]) -> list[ApprovalRequest]:
    """Every operation of the request waiting for approval, with the whole payload its digest covers."""
    found: list[ApprovalRequest] = await handle.query(
        GET_PENDING_APPROVALS_QUERY,
        result_type=list[ApprovalRequest],
    )
    return found


async def approvals_as_they_come(
    handle: WorkflowHandle[Any, Any], *, page_size: int = _PAGE_SIZE
) -> AsyncIterator[ApprovalRequest]:
    """Each operation once, as soon as it starts waiting for approval (an operation already waiting comes
    first); ends when the run closes. Each request is read from the run's history; if the history does not
    say (a timer without the summary this client knows), from one query instead."""
    seen: set[str] = set()
    history = _ApprovalHistory(handle)
    events = handle.fetch_history_events(wait_new_event=True, page_size=page_size)
    event: HistoryEvent
    async for event in events:
        if event.event_type in _CLOSED:
            return
        await history.read(event)
        # A wait that started may have ended later in the history (a client that joins late): decide at the
        # end of what the server has handed over, before the long poll waits for more.
        page = events.current_page
        if page is not None and events.current_page_index < len(page):
            continue
        requests = history.pending()
        # A full page may have more history behind it (the long poll would wait for a new event first).
        if requests is None or (requests and page is not None and len(page) >= page_size):
            requests = await pending_approvals(handle)
        for request in requests:
            if request.operation_id not in seen:
                seen.add(request.operation_id)
                yield request


def _workflow_time(event: HistoryEvent) -> datetime:
    """`workflow.now()` in the task this event started, as the SDK computes it."""
    return datetime.fromtimestamp(event.event_time.ToNanoseconds() / 1e9, UTC)


class _ApprovalHistory:
    """What a run's history says about its approval waits, read event by event. An approval wait's timer
    names its operation; the operation's payload is the write call of an earlier model turn whose
    operation id (derived from the request id, the tool and the arguments, as the workflow derives it)
    matches. The request is what the workflow's query would answer, and the approval a channel signs
    from it binds the digest of exactly the arguments shown: the workflow refuses any other."""

    def __init__(self, handle: WorkflowHandle[Any, Any]) -> None:
        self._handle = handle
        self._converter = data_converter()
        self._input: list[Payload] | None = None
        self._request: AgentInput | None = None
        self._started: datetime | None = None
        self._now: datetime | None = None
        self._model_turns: set[int] = set()
        self._turn_results: list[list[Payload]] = []
        self._turns: list[ModelTurnResult] = []
        # The approval waits whose timer runs, by its TimerStarted event id; None: not readable here.
        self._open: dict[int, ApprovalRequest | None] = {}

    def pending(self) -> list[ApprovalRequest] | None:
        """The requests of the waits open so far; None if one of them cannot be read from the history."""
        requests = list(self._open.values())
        return None if any(r is None for r in requests) else [r for r in requests if r is not None]

    async def read(self, event: HistoryEvent) -> None:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            self._input = list(event.workflow_execution_started_event_attributes.input.payloads)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            self._now = _workflow_time(event)
            self._started = self._started or self._now
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == MODEL_TURN_ACTIVITY:
                self._model_turns.add(event.event_id)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in self._model_turns:
                self._turn_results.append(list(done.result.payloads))
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            if not event.HasField("user_metadata"):
                self._open[event.event_id] = None
                return
            [summary] = await self._converter.decode([event.user_metadata.summary], [str])
            wait = approval_wait_of(summary) if isinstance(summary, str) else None
            if wait is not None:  # not a pause before a resend or a status query
                self._open[event.event_id] = await self._waiting(event, *wait)
        elif kind == EventType.EVENT_TYPE_TIMER_CANCELED:
            self._open.pop(event.timer_canceled_event_attributes.started_event_id, None)
        elif kind == EventType.EVENT_TYPE_TIMER_FIRED:
            self._open.pop(event.timer_fired_event_attributes.started_event_id, None)

    async def _waiting(self, event: HistoryEvent, tool: str, short: str) -> ApprovalRequest | None:
        if self._input is None or self._now is None or self._started is None:
            return None
        if self._request is None:
            [self._request] = await self._converter.decode(self._input, [AgentInput])
        request = self._request
        while len(self._turns) < len(self._turn_results):
            [turn] = await self._converter.decode(self._turn_results[len(self._turns)], [ModelTurnResult])
            self._turns.append(turn)
        for turn in reversed(self._turns):
            for call in turn.calls:
                if call.read_only or call.arguments is None or call.name != tool:
                    continue
                operation_id = derive_operation_id(self._handle.id, call.name, call.arguments)
                if short_operation_id(operation_id) != short:
                    continue
                timer = event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
                return ApprovalRequest(
                    operation_id=operation_id,
                    tool=call.name,
                    arguments=call.arguments,
                    digest=payload_digest(call.target or call.name, call.arguments),
                    state="awaiting_approval",
                    actor=request.actor,
                    # The wait's timer runs from the task's time to the approval's expiry.
                    approval_expires_at=self._now + timer,
                    deadline=self._started + timedelta(seconds=request.limits.deadline_seconds),
                    target=call.target,
                    audience=call.audience,
                )
        return None


class RunFollower:
    """A background long poll on one run's history, for a client loop that reads queries: `wait()`
    returns as soon as the run may have changed since the last `wait()`, with no polling interval. If the
    long poll itself fails (the server is unreachable), `wait()` falls back to a short sleep so the
    caller's own queries say what is wrong and nothing hangs."""

    def __init__(self, handle: WorkflowHandle[Any, Any], *, fallback_seconds: float = 0.3) -> None:
        self._handle = handle
        self._fallback = fallback_seconds
        self._changed = asyncio.Event()
        self._changed.set()
        self._timer_started = True
        self._failed = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RunFollower:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        try:
            async for change in changes(self._handle):
                self._timer_started |= change.timer_started
                self._changed.set()
        except RPCError:
            self._failed = True
        self._changed.set()

    async def wait(self, at_most: float | None = None) -> bool:
        """Until the run may have changed (or `at_most` s); True if a timer started meanwhile, so an
        operation may be waiting for approval. The first call returns at once: read everything once."""
        if self._failed or (self._task is not None and self._task.done() and not self._changed.is_set()):
            await asyncio.sleep(self._fallback if at_most is None else min(at_most, self._fallback))
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), at_most)
        self._changed.clear()
        timer, self._timer_started = self._timer_started, False
        return timer
