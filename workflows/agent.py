"""Workflow (deterministic): one user request = one tool loop. Model turns and tool calls are activities;
this code only decides what runs, in which order, and when the loop stops."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from toolloop._core.codes import ErrorType, ResultCode
    from toolloop._core.contracts import (
        SETTLED_STATES,
        AgentInput,
        AgentProgress,
        AgentResult,
        ApprovalDecision,
        ApprovalRequest,
        ApprovalWait,
        CallRecord,
        CheckedCall,
        ConversationItem,
        DecisionAnswer,
        EventsPage,
        FinishedRequest,
        FunctionCallOutputItem,
        ModelTurnInput,
        ModelTurnResult,
        NextApproval,
        OperationRecord,
        StopReason,
        ToolCallInput,
        ToolCallResult,
        answer_text,
        error_output,
        items_digest,
        output_json,
        status_of,
        text_digest,
        user_message,
    )
    from toolloop._core.names import (
        AGENT_WORKFLOW,
        APPROVE_OPERATION_UPDATE,
        GET_APPROVAL_REQUEST_QUERY,
        GET_EVENTS_QUERY,
        GET_LEDGER_QUERY,
        GET_PENDING_APPROVALS_QUERY,
        GET_PROGRESS_QUERY,
        MODEL_TURN_ACTIVITY,
        NEXT_APPROVAL_UPDATE,
        OPERATIONS_METRIC,
        REQUEST_ENDED_ACTIVITY,
        REQUESTS_FINISHED_METRIC,
        RUN_TOOL_ACTIVITY,
    )
    from toolloop._core.planning import CallGroup, plan_round
    from toolloop._core.threads import earlier_items
    from toolloop._core.usage import budget_reached
    from toolloop._core.validation import forbid_not_allowed
    from toolloop._temporal.search_attributes import OUTCOME_KEY, UNSETTLED_KEY, USER_KEY
    from toolloop.workflows.narration import Narrator
    from toolloop.workflows.operations import OperationStateMachine

    # The workflow's own stateless helper module (the plugin's runner passes the whole package through).
    from toolloop.workflows.retries import io_retry_policy

_MIN_TIMEOUT = timedelta(seconds=1)
_END_HOOK_PATCH = "request-end-hook"
# A turn that is only the model's refusal is its answer (runs that started before it ended "no_answer").
_REFUSAL_ANSWERS_PATCH = "a-refusal-is-the-answer"
# A request with max_cost stops once a turn had no price (runs that started before it kept going).
_UNPRICED_TURNS_STOP = "unpriced-turn-stops-a-cost-budget"
_MAX_EVENTS_PER_QUERY = 500


def _failure_message(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return cause.message
    if isinstance(cause, ActivityTimeoutError):
        return f"timed out ({cause.type.name.lower() if cause.type else 'timeout'})"
    return str(cause or err)


def _untrusted_input(inp: AgentInput) -> str | None:
    """Why the request is refused for what its input tried to bring; None if it brought nothing of the kind."""
    if inp.approval_verify_key is not None:
        return (
            "this request's input brings an approval verify key; the keys that verify decisions are the worker's "
            "own configuration (TOOLLOOP_APPROVAL_VERIFY_KEY), never a request's: refused, nothing was run"
        )
    parent = workflow.info().parent
    if inp.thread is not None and (parent is None or parent.workflow_id != inp.thread.scope):
        # What earlier messages did is what the thread's own workflow says, never what a starter claims.
        return "this request brings a thread's history but was not started by that thread: refused, nothing was run"
    return None


@workflow.defn(name=AGENT_WORKFLOW)
class AgentWorkflow:
    @workflow.init
    def __init__(self, inp: AgentInput) -> None:
        self._progress = AgentProgress(phase="starting", round=0, actor=inp.actor)
        self._deadline = workflow.now() + timedelta(seconds=inp.limits.deadline_seconds)
        # The live ledger, read (never copied) each time the UI's details are drawn.
        self._narrator = Narrator(lambda: self._writes.ledger.values(), lambda: self._progress.usage)
        # Built here, not in run(): an approval update may arrive before run() has started.
        self._writes = OperationStateMachine(
            inp.actor,
            inp.limits,
            self._deadline,
            self._set_phase,
            self._narrator,
            _untrusted_input(inp),
            thread=inp.thread,
        )
        # This round's calls whose output is a tool activity's result (so already in history).
        self._outputs_in_history: set[str] = set()
        # What the next model turn is told history holds (ModelTurnInput.previous_turn_digest, output_digests).
        self._previous_turn_digest: str | None = None
        self._output_digests: dict[str, str] = {}
        # A model turn's worker has an end-of-request hook (ModelTurnResult.end_hook).
        self._end_hook = False

    @workflow.query(name=GET_PROGRESS_QUERY)
    def get_progress(self) -> AgentProgress:
        return self._progress.model_copy(
            update={"operations": self._writes.snapshot(), "events": len(self._narrator.events)}
        )

    @workflow.query(name=GET_EVENTS_QUERY)
    def get_events(self, after: int) -> EventsPage:
        """The events after event number `after` (at most 500 at a time), for a client following the request."""
        events = self._narrator.events[max(after, 0) : max(after, 0) + _MAX_EVENTS_PER_QUERY]
        return EventsPage(events=[e.model_copy() for e in events], done=self._progress.done)

    @workflow.query(name=GET_LEDGER_QUERY)
    def get_ledger(self) -> list[OperationRecord]:
        return self._writes.snapshot()

    @workflow.query(name=GET_APPROVAL_REQUEST_QUERY)
    def get_approval_request(self, operation_id: str) -> ApprovalRequest | None:
        """The whole payload of one operation, for the approval channel to show and sign."""
        return self._writes.approval_request(operation_id)

    @workflow.query(name=GET_PENDING_APPROVALS_QUERY)
    def get_pending_approvals(self) -> list[ApprovalRequest]:
        """Every operation waiting for approval, with its whole payload (one query for a waiting channel)."""
        return self._writes.pending_approvals()

    @workflow.update(name=NEXT_APPROVAL_UPDATE)
    async def next_approval(self, wait: ApprovalWait) -> NextApproval:
        """The first operation waiting for approval that the caller has not been given, as soon as one waits;
        None once the request has finished. An approver's way to learn what to decide without following the
        run's history: the answer comes in the workflow task that starts the wait."""
        return await self._next_unseen_approval(wait)

    @next_approval.validator
    def _check_next_approval(self, wait: ApprovalWait) -> None:
        # Refused, not accepted: a finished request has nothing more to decide, and a refusal stays out of
        # its history.
        if self._progress.done:
            raise ApplicationError("the request has finished", type=ErrorType.REQUEST_FINISHED)

    def _unseen_approval(self, wait: ApprovalWait) -> str | None:
        return next((op_id for op_id in self._writes.awaiting_approval() if op_id not in wait.seen), None)

    async def _next_unseen_approval(self, wait: ApprovalWait) -> NextApproval:
        await workflow.wait_condition(lambda: self._progress.done or self._unseen_approval(wait) is not None)
        unseen = self._unseen_approval(wait)
        return NextApproval(approval=self._writes.approval_request(unseen) if unseen is not None else None)

    @workflow.update(name=APPROVE_OPERATION_UPDATE)
    async def approve_operation(self, decision: ApprovalDecision) -> DecisionAnswer:
        # Recorded before anything awaits: in the workflow task that accepts the decision, as when this handler
        # was synchronous (a decision without then_wait answers in that same task).
        answer = self._writes.record_decision(decision).decision_answer()
        if decision.then_wait is None:
            return answer
        return answer.model_copy(update={"next": await self._next_unseen_approval(decision.then_wait)})

    @approve_operation.validator
    def _check_approval(self, decision: ApprovalDecision) -> None:
        self._writes.validate_decision(decision)

    def approval_signature_checked(self, token: str | None, refusal: tuple[str, str] | None) -> None:
        """Called by the worker's trust interceptor (toolloop._temporal.trust) right before the validator, once
        it checked `token`'s signature with the worker's own keys (refusal: None, or why it did not verify); the
        validator takes no decision whose signature was not checked so, or did not verify."""
        self._writes.signature_checked(token, refusal)

    def _set_phase(self, phase: str) -> None:
        self._progress.phase = phase
        self._narrator.set_phase(phase)

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        untrusted = _untrusted_input(inp)
        if untrusted is not None:
            raise ApplicationError(untrusted, type=ErrorType.UNTRUSTED_INPUT, non_retryable=True)
        limits = inp.limits
        deadline = self._deadline
        # A thread's message: the model is shown the earlier messages first (what happened, not what was proposed).
        new_items: list[ConversationItem] = [*earlier_items(inp.thread), user_message(inp.request)]
        outputs_in_history: list[str] = []
        records = self._progress.calls
        executed = 0
        rounds = 0
        final_text: str | None = None
        error: str | None = None
        model_label = ""
        stop: StopReason

        while True:
            if self._writes.cancel_requested():
                stop = "cancelled"
                break
            if rounds >= limits.max_rounds:
                stop = "max_rounds"
                break
            # Like max_rounds, checked before a turn: the turn that reached the budget had its calls run and
            # answered. Without a budget (stored inputs) this decides nothing.
            usage = self._progress.usage
            if usage.reached(limits.max_total_tokens, limits.max_cost):
                stop = "budget"
                error = budget_reached(usage, limits.max_total_tokens, limits.max_cost)
                break
            if limits.max_cost is not None and usage.unpriced_turns and workflow.patched(_UNPRICED_TURNS_STOP):
                # The worker has no price for this model: the cost cannot be counted, so the budget cannot be kept.
                stop = "budget"
                error = f"max_cost {limits.max_cost:g} cannot be kept: the worker has no price for this model"
                break
            if workflow.now() >= deadline:
                stop = "deadline"
                break
            rounds += 1
            self._progress.round = rounds
            self._set_phase(f"round {rounds}: waiting for the model")
            try:
                turn = await self._model_turn(inp, rounds, new_items, outputs_in_history, deadline)
            except asyncio.CancelledError as cancelled:
                self._writes.absorb_cancel(cancelled)
                stop = "cancelled"
                break
            except ActivityError as err:
                if self._writes.cancel_requested():
                    stop = "cancelled"
                    break
                stop = "deadline" if workflow.now() >= deadline else "model_error"
                error = f"model turn {rounds} failed: {_failure_message(err)}"
                break
            model_label = turn.model_label or model_label
            self._end_hook |= turn.end_hook
            # Once a turn's worker named a policy evaluator, the request keeps it: a worker of the pool that lacks
            # the setting does not turn policies off for the rest of the request.
            if turn.policy_task_queue is not None:
                self._writes.policy_task_queue = turn.policy_task_queue
                # A worker of an older version names the queue but no key: the request keeps the key it has.
                self._writes.policy_verify_key = turn.policy_verify_key or self._writes.policy_verify_key
            self._progress.usage = self._progress.usage.plus(turn.usage, turn.cost)

            if not turn.calls:
                answer = answer_text(turn.items, refusals=False)
                refusal = None if answer else answer_text(turn.items)
                if refusal and workflow.patched(_REFUSAL_ANSWERS_PATCH):
                    answer = refusal  # a refusal, never an empty "answered"
                if answer or records:
                    # Nothing more to say after its tools ran is an answer too (the calls carry the results).
                    final_text = answer or ""
                    stop = "final_answer"
                else:
                    stop = "no_answer"
                    error = f"model turn {rounds} returned neither a message nor a tool call"
                break

            self._outputs_in_history.clear()
            # Checked here too, whatever the turn returned: a tool this request may not use never runs.
            calls = forbid_not_allowed(turn.calls, inp.allowed_tools)
            plan = plan_round(calls, limits, executed)
            results: dict[str, ToolCallResult] = {
                call_id: ToolCallResult(call_id=call_id, output=output, duration_ms=0)
                for call_id, output in plan.immediate.items()
            }
            for group in plan.groups:
                for result in await self._run_group(group, inp, rounds, deadline):
                    results[result.call_id] = result
            executed += plan.runnable_count

            # Stage 5: one output per call_id, in the model's order. A tool activity's result is already in
            # history: the next model turn refers to it instead of storing it again.
            new_items = []
            outputs_in_history = []
            self._output_digests = {}
            for call in calls:
                result = results[call.call_id]
                in_history = call.call_id in self._outputs_in_history
                output = output_json(result.output)
                if in_history:
                    outputs_in_history.append(call.call_id)
                    self._output_digests[call.call_id] = text_digest(output)
                new_items.append(FunctionCallOutputItem(call_id=call.call_id, output="" if in_history else output))
                record = CallRecord(
                    call_id=call.call_id,
                    tool=call.name,
                    round=rounds,
                    ok=bool(result.output.get("ok")),
                    code=result.output.get("code"),
                    duration_ms=result.duration_ms,
                )
                records.append(record)
                self._narrator.tool_finished(record, rejected=call.call_id in plan.immediate)
            if plan.limit_hit is not None:
                stop = plan.limit_hit
                break
            if self._writes.cancel_requested():
                stop = "cancelled"
                break
            if workflow.now() >= deadline:
                stop = "deadline"
                break

        status = status_of(stop)
        report = AgentResult(
            workflow_id=workflow.info().workflow_id,
            status=status,
            stop_reason=stop,
            final_text=final_text,
            rounds=rounds,
            calls=list(records),
            model_label=model_label,
            error=error,
            operations=self._writes.snapshot(),
            usage=self._progress.usage,
        )
        self._mark_outcome(report)
        self._count(report)
        self._set_phase(f"finished: {stop}")
        self._narrator.final(
            status=status,
            stop_reason=stop,
            final_text=final_text,
            error=error,
            outcome=report.outcome,
            usage=report.usage.model_dump(mode="json"),
        )
        self._progress.done = True
        # Approvers waiting in next_approval (or in a decision's then_wait) are answered (nothing more) before
        # the run ends. Awaited only when one waits: a run without one takes no new step here.
        if not workflow.all_handlers_finished():
            try:
                await workflow.wait_condition(workflow.all_handlers_finished)
            except asyncio.CancelledError as cancelled:
                self._writes.absorb_cancel(cancelled)
        # Patched: a run whose turn came from a worker with a hook but whose workflow code had none (a rolling
        # deploy) ended without this step, and replays without it. Called only with a hook, so runs without
        # one record no marker.
        if self._end_hook and workflow.patched(_END_HOOK_PATCH):
            await self._request_ended(inp, report)
        if status == "failed":
            # Failed is failed in Temporal too (red in the UI's list); the whole report travels in the
            # failure's details (toolloop.request_result reads it there).
            raise ApplicationError(
                error or f"the request failed: {stop}", report, type=ErrorType.REQUEST_FAILED, non_retryable=True
            )
        return report

    async def _request_ended(self, inp: AgentInput, report: AgentResult) -> None:
        """The worker's end-of-request hook, once the report is final. Its failure changes nothing the request
        did: the report stands, and the worker's log says why the hook failed."""
        finished = FinishedRequest(
            workflow_id=workflow.info().workflow_id,
            run_id=workflow.info().run_id,
            actor=inp.actor,
            metadata=dict(inp.metadata),
            status=report.status,
            stop_reason=report.stop_reason,
            outcome=report.outcome,
        )
        try:
            # Bounded: the run completes (and its result is given) only after this step.
            await workflow.execute_activity(
                REQUEST_ENDED_ACTIVITY,
                finished,
                start_to_close_timeout=timedelta(seconds=10),
                schedule_to_close_timeout=timedelta(seconds=30),
                retry_policy=io_retry_policy(3),
            )
        except asyncio.CancelledError as cancelled:
            self._writes.absorb_cancel(cancelled)
        except ActivityError:
            pass

    @staticmethod
    def _count(report: AgentResult) -> None:
        """Operation outcomes and request outcomes, for the worker's metrics (not counted again on replay)."""
        meter = workflow.metric_meter()
        meter.create_counter(REQUESTS_FINISHED_METRIC, "requests finished by outcome").add(
            1, {"outcome": report.status}
        )
        for op in report.operations:
            meter.create_counter(OPERATIONS_METRIC, "operations by final state").add(
                1, {"tool": op.tool, "state": op.state}
            )

    def _mark_outcome(self, result: AgentResult) -> None:
        """The search attributes that find this request in the UI's list: how it ended, and whether a side
        effect is unknown or done but not verified. Set only on requests started with toolloop's attributes
        (a namespace without them registered would refuse the upsert)."""
        if workflow.info().typed_search_attributes.get(USER_KEY) is None:
            return
        # Unsettled is set only when true (a filter asks `ToolloopUnsettled = true`): less to store per request.
        unsettled = any(op.state not in SETTLED_STATES for op in result.operations)
        outcome = result.outcome
        workflow.upsert_search_attributes(
            [OUTCOME_KEY.value_set(outcome), *([UNSETTLED_KEY.value_set(True)] if unsettled else [])]
        )

    async def _model_turn(
        self,
        inp: AgentInput,
        turn: int,
        new_items: list[ConversationItem],
        outputs_in_history: list[str],
        deadline: datetime,
    ) -> ModelTurnResult:
        limits = inp.limits
        turn_input = ModelTurnInput(
            turn=turn,
            new_items=new_items,
            provider=inp.model.provider,
            model_name=inp.model.name,
            actor=inp.actor,
            # Sent once: later turns find them in the conversation state.
            instructions=inp.instructions if turn == 1 else None,
            outputs_in_history=outputs_in_history,
            offered_tools=inp.allowed_tools,
            previous_turn_digest=self._previous_turn_digest,
            output_digests=self._output_digests,
        )
        turn_input.metadata = dict(inp.metadata)
        script = inp.model.script
        if script is not None:
            turn_input.script_turn = script[turn - 1] if turn <= len(script) else None
            turn_input.script_length = len(script)
        # Always an activity, never a local activity: sdk-core (temporalio 1.35) can record a local activity's
        # marker in one workflow task and hand its result to the workflow only in the next one when a query
        # arrives meanwhile. A replay resolves it a task earlier, so whatever the code does next (a patch
        # check, the time, an update handled in between) may no longer match the history (docs/DESIGN.md).
        result: ModelTurnResult = await workflow.execute_activity(
            MODEL_TURN_ACTIVITY,
            turn_input,
            result_type=ModelTurnResult,
            start_to_close_timeout=timedelta(seconds=limits.model_timeout_seconds),
            schedule_to_close_timeout=max(deadline - workflow.now(), _MIN_TIMEOUT),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=limits.model_max_attempts,
                # No list of final error types: the activity raises those as non-retryable itself.
            ),
            summary=f"model turn {turn}",
        )
        self._previous_turn_digest = items_digest(result.items)
        return result

    async def _run_group(
        self, group: CallGroup, inp: AgentInput, turn: int, deadline: datetime
    ) -> list[ToolCallResult]:
        if not group.parallel:
            # A side-effecting call is a barrier: alone, after everything before it, in the model's order.
            results = []
            for call in group.calls:
                self._narrator.tool_started(call, turn)
                results.append(await self._writes.run(call, turn))
                if self._writes.output_in_history(call.call_id):
                    self._outputs_in_history.add(call.call_id)
            return results
        gate = asyncio.Semaphore(inp.limits.max_parallel_reads)
        done: dict[str, ToolCallResult] = {}

        async def run_one(call: CheckedCall) -> None:
            try:
                async with gate:
                    done[call.call_id] = await self._run_tool(call, inp, turn, deadline)
            except asyncio.CancelledError as cancelled:
                # Still waiting for its turn when the request was cancelled: never started.
                self._writes.absorb_cancel(cancelled)
                why = "the request was cancelled before this call ran; it was not run."
                done[call.call_id] = ToolCallResult(
                    call_id=call.call_id, output=error_output(ResultCode.LIMIT_REACHED, why), duration_ms=0
                )

        try:
            await asyncio.gather(*(run_one(call) for call in group.calls))
        except asyncio.CancelledError as cancelled:
            # The reads started finish (they are waited for); gather reports the cancellation all the same.
            self._writes.absorb_cancel(cancelled)
        return [done[call.call_id] for call in group.calls]

    async def _run_tool(self, call: CheckedCall, inp: AgentInput, turn: int, deadline: datetime) -> ToolCallResult:
        limits = inp.limits
        assert call.arguments is not None  # the planner only schedules validated calls
        started = workflow.now()
        self._narrator.tool_started(call, turn)
        self._progress.running.append(call.summary)
        self._set_phase(f"round {turn}: running {', '.join(self._progress.running)}")
        tool_input = ToolCallInput(
            round=turn,
            call_id=call.call_id,
            tool=call.name,
            arguments=call.arguments,
            actor=inp.actor,
            max_output_bytes=limits.max_tool_output_bytes,
        )
        # The tool's own timeout and attempts where it declares them, else the request's.
        start_to_close = timedelta(seconds=call.timeout_seconds or limits.tool_timeout_seconds)
        schedule_to_close = max(deadline - workflow.now(), _MIN_TIMEOUT)
        retry_policy = io_retry_policy(call.max_attempts or limits.tool_max_attempts)
        try:
            result: ToolCallResult = await workflow.execute_activity(
                RUN_TOOL_ACTIVITY,
                tool_input,
                result_type=ToolCallResult,
                start_to_close_timeout=start_to_close,
                schedule_to_close_timeout=schedule_to_close,
                retry_policy=retry_policy,
                # A read started is finished even if the request is cancelled: its call gets its output.
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=call.summary,
            )
            self._outputs_in_history.add(call.call_id)
            self._writes.read_done(call, result.output)
            return result
        except ActivityError as err:
            workflow.logger.warning(
                "tool call gave up", extra={"call_id": call.call_id, "tool": call.name, "why": _failure_message(err)}
            )
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == ErrorType.TOOL_MISCONFIGURED:
                output = error_output(ResultCode.INTERNAL, "this tool is not available right now.")
            elif workflow.now() >= deadline:
                output = error_output(ResultCode.LIMIT_REACHED, "the request's deadline passed before this call ended.")
            else:
                output = error_output(
                    ResultCode.TEMPORARY_UNAVAILABLE, "the service did not answer within the retry budget; try later."
                )
            elapsed = workflow.now() - started
            return ToolCallResult(call_id=call.call_id, output=output, duration_ms=int(elapsed.total_seconds() * 1000))
        finally:
            self._progress.running.remove(call.summary)
            if self._progress.running:
                self._set_phase(f"round {turn}: running {', '.join(self._progress.running)}")
