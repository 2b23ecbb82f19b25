"""Workflow (deterministic): the benchmark's baseline, the smallest hand-written tool loop."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow


@workflow.defn(name="BareLoop")
class BareLoop:
    @workflow.run
    async def run(self, request: str) -> str:
        turn = 0
        while True:
            turn += 1
            out: dict[str, Any] = await workflow.execute_activity(
                "bare_model", turn, start_to_close_timeout=timedelta(seconds=30)
            )
            if "text" in out:
                return str(out["text"])
            await workflow.execute_activity(
                "bare_tool", out["call"]["arguments"]["orderId"], start_to_close_timeout=timedelta(seconds=10)
            )
