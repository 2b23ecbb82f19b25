"""I/O: following one request as it runs, without a polling loop - a long poll on the run's own history
(the server answers as soon as an event is appended) and the queries that read what changed; and, for an
approver, the workflow's `next_approval` Update, which answers when an operation starts waiting.

The workflow's queryable state changes only in a workflow task, and every workflow task ends with an event,
so a client that reads its queries after each `WorkflowTaskCompleted` (and after the run closes) misses
nothing. An operation that starts waiting for approval starts a timer in that same task, so its
`TimerStarted` event is when to ask for the pending approvals."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from toolloop._core.codes import ErrorType
from toolloop._core.contracts import ApprovalRequest, ApprovalWait, NextApproval
from toolloop._core.names import GET_PENDING_APPROVALS_QUERY, NEXT_APPROVAL_UPDATE

# Every event that closes a run (continue-as-new included).
CLOSED_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)


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
        closed = kind in CLOSED_EVENTS
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


async def approvals_as_they_come(handle: WorkflowHandle[Any, Any]) -> AsyncIterator[ApprovalRequest]:
    """Each operation once, as soon as it starts waiting for approval (an operation already waiting comes
    first); ends when the run closes. Each comes from `next_approval` (below): no history to follow and no
    query. An operation another approver decided before this follower asked is not yielded: it no longer
    waits."""
    seen: list[str] = []
    while (request := await next_approval(handle, seen)) is not None:
        seen.append(request.operation_id)
        yield request


async def next_approval(
    handle: WorkflowHandle[Any, Any], seen: list[str], *, sent: WorkflowUpdateHandle[NextApproval] | None = None
) -> ApprovalRequest | None:
    """The first operation waiting for approval that is not in `seen`, as soon as one waits; None once the run
    has finished. It is the answer of the workflow's `next_approval` Update, which waits in the workflow and
    answers in the workflow task that starts the wait, with the whole payload its digest covers. While no
    worker runs, the Update waits on the server until one does. `sent`: that Update, already sent (with the
    start) for this `seen`. The server holds a bounded number of Updates in flight per run (10 by default,
    decisions and waits alike); while it refuses one for that, it is sent again after a growing pause, as
    long as the run is open."""
    pause = 0.5
    while True:
        try:
            if sent is not None:
                answer = await sent.result()
            else:
                answer = await handle.execute_update(
                    NEXT_APPROVAL_UPDATE, ApprovalWait(seen=seen), result_type=NextApproval
                )
        except RPCError as err:
            if err.status == RPCStatusCode.RESOURCE_EXHAUSTED and await _still_running(handle):
                sent = None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            await _raise_unless_ended(handle, err)
            return None
        except (WorkflowUpdateRPCTimeoutOrCancelledError, WorkflowUpdateFailedError) as err:
            await _raise_unless_ended(handle, err)
            return None
        return answer.approval


async def _raise_unless_ended(handle: WorkflowHandle[Any, Any], err: Exception) -> None:
    """Returns when the Update failed because the request finished, or its run closed under it (terminated,
    timed out) or before it; raises `err` otherwise. A cancelled caller stays cancelled."""
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        raise_if_cancelling()
        raise err
    if isinstance(err, WorkflowUpdateFailedError):
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == ErrorType.REQUEST_FINISHED:
            return
    if await _still_running(handle):
        raise err


def raise_if_cancelling() -> None:
    """temporalio turns the cancellation of a call that waits for an Update into
    WorkflowUpdateRPCTimeoutOrCancelledError; a cancelled task stays cancelled for its caller."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _still_running(handle: WorkflowHandle[Any, Any]) -> bool:
    return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING


# What a query answers while no worker polls the run's task queue (a restart, a deploy): "no poller seen for
# task queue recently" (FAILED_PRECONDITION), or a timeout - the server's (DEADLINE_EXCEEDED) or the client's
# own ("Timeout expired", which the SDK's gRPC layer reports as CANCELLED). Worth asking again.
NO_WORKER_YET = frozenset(
    {
        RPCStatusCode.FAILED_PRECONDITION,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.CANCELLED,
    }
)


async def pending_once_answered(handle: WorkflowHandle[Any, Any]) -> list[ApprovalRequest]:
    """The pending approvals, once a worker answers the query. While none runs the query fails, and
    nothing in the run's history would say when to ask again, so it is asked again after a growing pause,
    as long as the run is open (a closed run has nothing pending: the caller's history then ends it). Any
    other failure (no such run, no permission) is raised."""
    pause = 0.5
    while True:
        try:
            return await pending_approvals(handle)
        except RPCError as err:
            if err.status not in NO_WORKER_YET:
                raise
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return []
        await asyncio.sleep(pause)
        pause = min(pause * 2, 5.0)


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
        self._closed = False
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
                self._closed |= change.closed
                self._changed.set()
        except RPCError:
            self._failed = True
        self._changed.set()

    @property
    def closed(self) -> bool:
        """True once the run's history has shown its close: whatever is read after this is all there will be."""
        return self._closed

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
