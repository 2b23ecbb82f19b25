"""Wiring (client side): a request's result, whether its run completed or failed. A request that failed (a
model error, no answer) is a failed run in Temporal, so it is visibly failed in the UI; its whole report
travels in the failure's details.

A report's payload leaves out what the run's history holds already (OperationRecord.in_history): each
operation's arguments and digest, evidence, approval and the output the model was told. complete_report reads
them back from that history, in one pass; a report that refers to nothing is returned without reading it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from typing import Any

from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from toolloop._core.approvals import ApprovalInvalid, payload_digest
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import (
    AgentResult,
    ApprovalDecision,
    ApprovalRecord,
    DecisionAnswer,
    DecisionReceipt,
    OperationRecord,
    WriteInput,
    WriteOutcome,
    approval_record,
    told_of_attempt,
)
from toolloop._core.names import (
    APPROVE_OPERATION_UPDATE,
    EXECUTE_WRITE_ACTIVITY,
    MODEL_TURN_ACTIVITY,
    READ_BACK_ACTIVITY,
)
from toolloop._core.registry import Evidence
from toolloop._temporal.converter import data_converter


def _approval_of(decision: ApprovalDecision, answer: dict[str, Any]) -> ApprovalRecord | None:
    """The approval a decision Update recorded: from its token and the answer's time (DecisionAnswer), or as
    the answer held it whole (histories from before)."""
    if isinstance(answer.get("approval"), dict):
        return DecisionReceipt.model_validate(answer).approval
    recorded = DecisionAnswer.model_validate(answer)
    if recorded.at is None or not decision.token:
        return None
    try:
        return approval_record(decision.token, recorded.at)
    except ApprovalInvalid:  # the workflow verified it: only a tampered history gets here
        return None


def failed_result(exc: WorkflowFailureError) -> AgentResult | None:
    """The report a failed request carries (as stored: see complete_report); None for a run that failed
    for another reason."""
    cause = exc.cause
    if not (isinstance(cause, ApplicationError) and cause.type == ErrorType.REQUEST_FAILED and cause.details):
        return None
    try:
        return AgentResult.model_validate(cause.details[0])
    except ValidationError:
        return None


async def request_result(handle: WorkflowHandle[Any, Any]) -> AgentResult:
    """The request's whole AgentResult once it finished: answered, stopped at a limit, or failed. Raises
    WorkflowFailureError only for a run that failed without a report (terminated, say)."""
    try:
        result = await handle.result()
    except WorkflowFailureError as exc:
        report = failed_result(exc)
        if report is None:
            raise
        result = report
    report = result if isinstance(result, AgentResult) else AgentResult.model_validate(result)
    return await complete_report(handle, report)


async def complete_report(handle: WorkflowHandle[Any, Any], report: AgentResult) -> AgentResult:
    """`report` with every field its payload left out read back from the run's history. A field history
    does not hold (it cannot, unless the history was tampered with) stays listed in `in_history`."""
    if not report.workflow_id:
        report = report.model_copy(update={"workflow_id": handle.id})
    if report.complete:
        return report
    return await completed_from(handle.fetch_history_events(), data_converter(), report)


async def completed_from(
    events: AsyncIterable[HistoryEvent], converter: DataConverter, report: AgentResult
) -> AgentResult:
    """A copy of `report` with what its payload left out read back from `events`, the run's history."""
    report = report.model_copy(deep=True)
    told = {op.call_ids[0] for op in report.operations if "output" in op.in_history}
    reader = _HistoryFacts(converter, told)
    async for event in events:
        await reader.read(event)
    for op in report.operations:
        op.in_history = [name for name in op.in_history if not reader.fill(op, name)]
    return report


class _HistoryFacts:
    """What a report refers to, read from one pass over the run's history: only the events that can hold
    it are decoded (a write's attempts, read-backs and decisions; the model turns only for what the model
    was told of a write)."""

    def __init__(self, converter: DataConverter, told_calls: set[str]) -> None:
        self._decode = converter.decode
        self._writes: dict[int, str] = {}  # scheduled event id -> operation id, for execute_write and read-back
        self._attempts: dict[int, WriteInput] = {}  # scheduled event id -> a write attempt's input
        # Per operation: what the model was told of it, where its completing attempt establishes it alone (a
        # model turn then refers to it: contracts.told_of_attempt).
        self._told_by_attempt: dict[str, str] = {}
        self._arguments: dict[str, dict[str, Any]] = {}
        self._evidence: dict[str, dict[str, Any]] = {}
        self._decisions: dict[int, ApprovalDecision] = {}  # by the Update's accepted event id
        self._approvals: dict[str, ApprovalRecord] = {}
        self._told_calls = told_calls
        self._told: dict[str, str] = {}

    async def read(self, event: HistoryEvent) -> None:
        decode = self._decode
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == EXECUTE_WRITE_ACTIVITY:
                [write] = await decode(attrs.input.payloads, [WriteInput])
                self._writes[event.event_id] = write.operation_id
                self._attempts[event.event_id] = write
                self._arguments.setdefault(write.operation_id, write.arguments)
            elif attrs.activity_type.name == READ_BACK_ACTIVITY:
                [data] = await decode(attrs.input.payloads, [dict[str, Any]])
                self._writes[event.event_id] = str(data.get("operation_id"))
            elif attrs.activity_type.name == MODEL_TURN_ACTIVITY and self._told_calls:
                [data] = await decode(attrs.input.payloads, [dict[str, Any]])
                for item in data.get("new_items") or []:
                    if isinstance(item, dict) and item.get("type") == "function_call_output":
                        self._tell(str(item.get("call_id")), item.get("output"))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            operation_id = self._writes.get(done.scheduled_event_id)
            if operation_id is None:
                return
            [data] = await decode(done.result.payloads, [dict[str, Any]])
            # A write attempt's result is a WriteOutcome, a read-back's an Evidence.
            evidence = data
            if (attempt := self._attempts.get(done.scheduled_event_id)) is not None:
                outcome = WriteOutcome.model_validate(data)
                evidence = outcome.evidence
                if (told := told_of_attempt(attempt, outcome)) is not None:
                    self._told_by_attempt[operation_id] = told
            if evidence is not None:
                self._evidence[operation_id] = Evidence.model_validate(evidence).model_dump(mode="json")
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            accepted = event.workflow_execution_update_accepted_event_attributes.accepted_request.input
            if accepted.name == APPROVE_OPERATION_UPDATE:
                [decision] = await decode(accepted.args.payloads, [ApprovalDecision])
                self._decisions[event.event_id] = decision
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            completed = event.workflow_execution_update_completed_event_attributes
            decision = self._decisions.get(completed.accepted_event_id)
            if decision is not None and completed.outcome.HasField("success"):
                [answer] = await decode(completed.outcome.success.payloads, [dict[str, Any]])
                approval = _approval_of(decision, answer)
                if approval is not None:
                    self._approvals[decision.operation_id] = approval

    def _tell(self, call_id: str, output: Any) -> None:
        if call_id in self._told_calls and isinstance(output, str) and output:
            self._told.setdefault(call_id, output)  # the first turn given it

    def fill(self, op: OperationRecord, name: str) -> bool:
        if name == "arguments" and op.operation_id in self._arguments:
            op.arguments = dict(self._arguments[op.operation_id])
        elif name == "digest" and op.operation_id in self._arguments:
            op.digest = payload_digest(op.target or op.tool, self._arguments[op.operation_id])
        elif name == "evidence" and op.operation_id in self._evidence:
            op.evidence = self._evidence[op.operation_id]
        elif name == "approval" and op.operation_id in self._approvals:
            op.approval = self._approvals[op.operation_id].model_copy()
        elif name == "first_sent_at" and op.approval is not None:  # filled before it, when in history
            op.first_sent_at = op.approval.at
        elif name == "output" and (told := self._told_output(op)) is not None:
            op.output = told
        else:
            return False
        return True

    def _told_output(self, op: OperationRecord) -> dict[str, Any] | None:
        try:
            told = json.loads(self._told.get(op.call_ids[0]) or self._told_by_attempt.get(op.operation_id, ""))
        except ValueError:
            return None
        return told if isinstance(told, dict) else None
