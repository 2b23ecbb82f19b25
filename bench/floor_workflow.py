"""Workflow (deterministic): the benchmark's floor - the smallest hand-written Temporal loop that makes the
same business calls as toolloop: a model activity per turn, one activity per read (in parallel), and for
the write one Update as its approval (none for a write decided by rule: its write activity signs the rule's
decision), the write with its idempotency key, and the read-back GET, each its own activity. No validation, no
ledger and no status machinery."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from bench.floor_types import FloorCall, FloorReadBack, FloorTurn, FloorWrite, Plan, operation_key

FLOOR_WORKFLOW = "FloorLoop"
APPROVE_UPDATE = "approve"
_TIMEOUT = timedelta(seconds=10)


@workflow.defn(name=FLOOR_WORKFLOW)
class FloorLoop:
    def __init__(self) -> None:
        self._token: str | None = None

    @workflow.update(name=APPROVE_UPDATE)
    def approve(self, token: str) -> None:
        self._token = token

    @workflow.run
    async def run(self, request: str) -> str:
        outputs: list[str] = []
        turn = 0
        while True:
            turn += 1
            # Activities are named by string, so each result's type is given (a dataclass, not a dict).
            plan: Plan = await workflow.execute_activity(
                "floor_model",
                FloorTurn(request=request, turn=turn, outputs=outputs),
                result_type=Plan,
                start_to_close_timeout=_TIMEOUT,
            )
            if plan.answer is not None:
                return plan.answer
            reads = [c for c in plan.calls if not c.write]
            outputs = list(
                await asyncio.gather(
                    *(
                        workflow.execute_activity("floor_read", c, result_type=str, start_to_close_timeout=_TIMEOUT)
                        for c in reads
                    )
                )
            )
            for call in (c for c in plan.calls if c.write):
                outputs.append(await self._write(call))

    async def _write(self, call: FloorCall) -> str:
        if not call.by_rule:
            await workflow.wait_condition(lambda: self._token is not None)
            assert self._token is not None
        event_id: str = await workflow.execute_activity(
            "floor_write",
            FloorWrite(
                key=operation_key(workflow.info().workflow_id, call.call_id),
                arguments=call.arguments,
                token=None if call.by_rule else self._token,
            ),
            result_type=str,
            start_to_close_timeout=_TIMEOUT,
        )
        seen: str = await workflow.execute_activity(
            "floor_read_back", FloorReadBack(event_id=event_id), result_type=str, start_to_close_timeout=_TIMEOUT
        )
        return seen
