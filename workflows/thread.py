"""Workflow (deterministic): one thread - a conversation of several requests (docs/DESIGN.md, "Threads").

An entity workflow per thread. It accepts messages (the `send_message` Update) in the order Temporal
delivers them, runs them one at a time - each message is one request, an AgentWorkflow started as this
workflow's child once the message before it has ended - and hands each request what happened before it. It
continues as new every MESSAGES_PER_RUN messages, or sooner when Temporal suggests it, once no message runs,
and ends once it has been closed (`close_thread`) and the messages it accepted have run."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from toolloop._core.codes import ErrorType
    from toolloop._core.contracts import AgentResult, OperationRecord, outcome_without_report
    from toolloop._core.names import (
        AGENT_WORKFLOW,
        CLOSE_THREAD_UPDATE,
        GET_THREAD_QUERY,
        REQUEST_LEDGER_ACTIVITY,
        SEND_MESSAGE_UPDATE,
        THREAD_WORKFLOW,
    )
    from toolloop._core.request_naming import REQUEST_ID, request_memo, request_summary, request_workflow_id
    from toolloop._core.threads import (
        MESSAGES_PER_RUN,
        LedgerOfRequest,
        MessageAccepted,
        MessageRecord,
        ThreadInput,
        ThreadMessage,
        ThreadState,
        ThreadView,
        ahead_of,
        context_for,
        keep_turn,
        queue_has_room,
        turn_of,
    )
    from toolloop._temporal.search_attributes import request_search_attributes


# Unlimited attempts (the attempt's failure shows in the UI), at most a minute apart.
_UNTIL_READ = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(minutes=1), maximum_attempts=0
)

# Runs from before it answered every message at once keep their way (replay).
_ANSWER_AT_ONCE = "thread-answers-each-message-at-once"


@workflow.defn(name=THREAD_WORKFLOW)
class ThreadWorkflow:
    @workflow.init
    def __init__(self, inp: ThreadInput) -> None:
        self._inp = inp
        self._state = inp.carried or ThreadState()
        self._messages_this_run = 0
        # Set between two messages when this run hands the thread on to the next (continue-as-new): a waiting
        # send_message answers at once (still queued), and its client follows the thread to the message's start.
        self._continuing = False

    def _record(self, request_id: str) -> MessageRecord | None:
        return next((m for m in self._state.messages if m.request_id == request_id), None)

    @workflow.query(name=GET_THREAD_QUERY)
    def get_thread(self) -> ThreadView:
        return ThreadView(
            thread_id=self._inp.thread_id,
            actor=self._inp.actor,
            messages=[m.model_copy() for m in self._state.messages],
        )

    @workflow.update(name=CLOSE_THREAD_UPDATE)
    def close_thread(self) -> ThreadView:
        """Close the thread: it takes no new message; the messages it accepted still run, one after another,
        and then its workflow ends (a closed thread is never started again under its id). Closing again is
        the same close."""
        self._state.closed = True
        return self.get_thread()

    @workflow.update(name=SEND_MESSAGE_UPDATE)
    async def send_message(self, message: ThreadMessage) -> MessageAccepted:
        """Queue a message (or find it again: a retry with the same request id and submission). The order of the
        messages is the order their Updates were accepted in: everything before the first await runs in the
        accepting task. It is answered at once, with how many messages are ahead of it; its client follows the
        thread to its request's start."""
        record = self._record(message.request_id)
        attached = record is not None
        if record is None:
            self._state.last_number += 1
            request = message.request
            record = MessageRecord(
                number=self._state.last_number,
                request_id=message.request_id,
                workflow_id=request_workflow_id(request.actor.tenant_id, request.actor.user_id, message.request_id),
                submission=message.submission,
                question=request.request[:200],
            )
            self._state.messages.append(record)
            self._state.queue.append(message)
        ahead = ahead_of(self._state, record.request_id)
        # Answered at once, whatever is ahead: a handler that waited for the request to start (when nothing was
        # ahead) completed in a task the replay could order differently - a worker that rebuilt the run from
        # history saw the update before the earlier message's end, answered at once, and its history then did
        # not replay (tests/histories/unreplayable). Clients find the request's start themselves
        # (ToolloopThread.request: the request's own workflow, or the thread's history).
        if ahead == 0 and not workflow.patched(_ANSWER_AT_ONCE):
            await workflow.wait_condition(lambda: record.state != "queued" or self._continuing)
        return MessageAccepted(
            number=record.number,
            request_id=record.request_id,
            workflow_id=record.workflow_id,
            ahead=ahead,
            attached=attached,
            state=record.state,
            submission=record.submission,
            thread_run_id=workflow.info().run_id,
        )

    @send_message.validator
    def _check_message(self, message: ThreadMessage) -> None:
        # Refused, not accepted: a refusal stays out of the thread's history.
        if message.request.actor != self._inp.actor:
            raise ApplicationError("a message of another user's thread", type=ErrorType.NOT_THIS_THREAD)
        if not REQUEST_ID.fullmatch(message.request_id):
            raise ApplicationError(f"not a request id: {message.request_id!r}", type=ErrorType.NOT_THIS_THREAD)
        if message.request.thread is not None:
            raise ApplicationError("a message brings no thread context of its own", type=ErrorType.UNTRUSTED_INPUT)
        record = self._record(message.request_id)
        if record is None and self._state.closed:
            raise ApplicationError(
                f"thread {self._inp.thread_id} has been closed; start another thread", type=ErrorType.THREAD_CLOSED
            )
        if record is not None and record.submission != message.submission:
            raise ApplicationError(
                f"request id {message.request_id} was already used for another message",
                type=ErrorType.REQUEST_ID_REUSED,
            )
        if record is None and not queue_has_room(self._state, message):
            # Bounded: the queue travels in the thread's state from one run to the next.
            raise ApplicationError(
                f"this thread has {len(self._state.queue)} messages waiting already; send this one once they have run",
                type=ErrorType.THREAD_FULL,
            )

    def _time_to_continue(self) -> bool:
        return self._messages_this_run >= MESSAGES_PER_RUN or workflow.info().is_continue_as_new_suggested()

    @workflow.run
    async def run(self, inp: ThreadInput) -> None:
        while True:
            await workflow.wait_condition(
                lambda: bool(self._state.queue) or self._time_to_continue() or self._state.closed
            )
            if self._state.closed and not self._state.queue:
                # Closed, and every message it accepted has run: the thread ends (a send now is refused).
                await workflow.wait_condition(workflow.all_handlers_finished)
                return
            if self._time_to_continue():
                # Between two messages (none runs): the next run carries the thread on, queue and all, with a
                # fresh history. Every Update handler is done first (a waiting send_message answers now).
                self._continuing = True
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(ThreadInput(thread_id=inp.thread_id, actor=inp.actor, carried=self._state))
            message = self._state.queue.pop(0)
            record = self._record(message.request_id)
            assert record is not None
            await self._run_message(inp, message, record)
            self._messages_this_run += 1

    async def _run_message(self, inp: ThreadInput, message: ThreadMessage, record: MessageRecord) -> None:
        request = message.request
        shown = request.limits.thread_turns
        context = context_for(self._state, inp.thread_id, workflow.info().workflow_id, shown)
        try:
            child = await workflow.start_child_workflow(
                AGENT_WORKFLOW,
                request.model_copy(update={"thread": context}),
                id=record.workflow_id,
                result_type=AgentResult,
                search_attributes=request_search_attributes(request.actor, inp.thread_id),
                memo=request_memo(record.request_id, request.request, submission=record.submission),
                static_summary=request_summary(request.actor.user_id, request.actor.tenant_id, request.request),
                # A request is a unit of its own: whatever becomes of the thread's workflow, it runs to its end.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            record.state = "refused"
            record.note = f"request id {record.request_id} is already used by another request"
            return
        record.state = "running"
        report: AgentResult | None = None
        why: str | None = None
        ledger: list[OperationRecord] | None = None
        try:
            report = await child
        except ChildWorkflowError as err:
            report = _report_of_failure(err)
            if report is None:
                why = f"the request ended without a report ({type(err.cause).__name__})"
                ledger = await self._ledger_of(record)
                if ledger is None:
                    why += "; its writes could not be read"
        record.state = "finished"
        # Without a report, by the ledger it left, as the next message is told of it (turn_of) and as `ask` exits.
        record.outcome = report.outcome if report is not None else outcome_without_report(ledger)
        keep_turn(self._state, turn_of(record, request.request, report, why, ledger))

    @staticmethod
    async def _ledger_of(record: MessageRecord) -> list[OperationRecord] | None:
        """The ledger of a request that ended without a report: what it sent must not be forgotten, so it is
        asked until it is read (a busy worker, or one that cannot replay the closed run until a fixed one is
        deployed), and the next message waits: a write forgotten here could be proposed and sent again once the
        service no longer knows its key. None only if the request's history is gone."""
        try:
            ledger: list[OperationRecord] = await workflow.execute_activity(
                REQUEST_LEDGER_ACTIVITY,
                LedgerOfRequest(workflow_id=record.workflow_id),
                result_type=list[OperationRecord],
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_UNTIL_READ,
                summary=f"ledger of {record.request_id} (the next message waits for it)",
            )
        except ActivityError:
            return None
        return ledger


def _report_of_failure(err: ChildWorkflowError) -> AgentResult | None:
    """A failed request's report travels in its failure's details; a terminated or timed-out one has none."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == ErrorType.REQUEST_FAILED and cause.details:
        try:
            return AgentResult.model_validate(cause.details[0])
        except ValidationError:
            return None
    return None
