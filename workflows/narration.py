"""Workflow (deterministic): what a request tells the people watching it - the numbered event log a client
follows (phase changes, tools started and finished with their result codes, approvals needed, operations'
states, the final answer with the token totals) and the current details the Temporal UI shows: the phase,
the model's token totals, each call with its result code (calls rejected before they ran included), and each
operation's state."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from toolloop._core.approvals import short_operation_id
    from toolloop._core.contracts import (
        CallRecord,
        CheckedCall,
        OperationRecord,
        RequestEvent,
        RequestEventKind,
    )
    from toolloop._core.text import markdown_literal
    from toolloop._core.usage import RequestUsage, usage_line

# The UI's details stay readable: the last calls only.
_DETAIL_CALLS = 30
_MARK = {"verified": "✅", "completed": "⚠️ not verified", "unknown": "❗ UNKNOWN", "failed": "✖", "denied": "✖"}


class Narrator:
    def __init__(
        self, operations: Callable[[], Iterable[OperationRecord]], usage: Callable[[], RequestUsage] = RequestUsage
    ) -> None:
        self.events: list[RequestEvent] = []
        self.phase = "starting"
        self.calls: list[CallRecord] = []
        self.rejected: set[str] = set()
        self._operations = operations
        # The request's token totals so far, read each time the details are drawn.
        self._usage = usage

    def emit(self, kind: RequestEventKind, **data: Any) -> None:
        self.events.append(RequestEvent(seq=len(self.events) + 1, at=workflow.now(), kind=kind, data=data))

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.emit("phase", phase=phase)
        self.show()

    def tool_started(self, call: CheckedCall, turn: int) -> None:
        self.emit("tool_started", call_id=call.call_id, tool=call.name, summary=call.summary, round=turn)

    def tool_finished(self, record: CallRecord, rejected: bool) -> None:
        self.calls.append(record)
        if rejected:
            self.rejected.add(record.call_id)
        self.emit(
            "tool_finished",
            call_id=record.call_id,
            tool=record.tool,
            round=record.round,
            ok=record.ok,
            code=record.code,
            duration_ms=record.duration_ms,
            rejected=rejected,
        )

    def operation(self, op: OperationRecord) -> None:
        decided: dict[str, Any] = {"decided_by": op.approval.by} if op.approval is not None else {}
        if op.policy is not None:  # what the approval policy decided, by which rules and version
            decided["policy"] = op.policy.model_dump(mode="json")
        self.emit("operation", operation_id=op.operation_id, tool=op.tool, state=op.state, **decided)
        if op.state == "awaiting_approval":
            asked = {"policy": decided["policy"]} if op.policy is not None else {}
            self.emit(
                "approval_needed",
                operation_id=op.operation_id,
                tool=op.tool,
                target=op.target,
                arguments=op.arguments,  # redacted; the approver fetches the whole payload
                digest=op.digest,
                expires_at=op.approval_expires_at.isoformat() if op.approval_expires_at else None,
                **asked,
            )
        self.show()

    def final(self, **data: Any) -> None:
        self.emit("final", **data)

    def show(self) -> None:
        """The Temporal UI's current details (markdown): readable without opening any JSON."""
        # Everything here may come from the model (a made-up tool name, a call id): shown literally, never as markup.
        lines = [f"**{markdown_literal(self.phase)}**"]
        tokens = usage_line(self._usage())
        if tokens is not None:
            lines += ["", markdown_literal(tokens)]
        if self.calls:
            lines += ["", "| round | call | result |", "|---|---|---|"]
            for record in self.calls[-_DETAIL_CALLS:]:
                result = "ok" if record.ok else (record.code or "failed")
                if record.call_id in self.rejected:
                    result += " (rejected, not run)"
                call = f"{markdown_literal(record.tool)} {markdown_literal(record.call_id)}"
                lines.append(f"| {record.round} | {call} | {markdown_literal(result)} |")
        operations = list(self._operations())
        if operations:
            lines += ["", "**side effects**"]
            for op in operations:
                mark = _MARK.get(op.state, "")
                short = markdown_literal(short_operation_id(op.operation_id))
                line = f"- {markdown_literal(op.tool)} {short}: {op.state} {mark}".rstrip()
                if op.approval is not None:  # who decided, from the verified token
                    line += f" ({op.approval.decision} by {markdown_literal(op.approval.by)})"
                if op.policy is not None:  # by which rules, under which version of the policy
                    version = op.policy.version.removeprefix("sha256:")[:12]
                    line += f"; policy {markdown_literal(version)}: {markdown_literal(op.policy.decided())}"
                lines.append(line)
        workflow.set_current_details("\n".join(lines))
