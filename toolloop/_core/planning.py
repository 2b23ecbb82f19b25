"""Pure: stage 4 planning - which checked calls run, in which groups, and which are answered at once.

Consecutive read-only calls form one parallel group; a side-effecting call is a barrier (a group of its
own, after everything before it). Outputs are always appended in the model's order, by call_id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolloop._core.codes import ResultCode
from toolloop._core.contracts import CheckedCall, Limits, StopReason, error_output


@dataclass(frozen=True)
class CallGroup:
    calls: tuple[CheckedCall, ...]
    parallel: bool


@dataclass
class RoundPlan:
    # Calls answered without running anything: rejected by validation or over a limit.
    immediate: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: list[CallGroup] = field(default_factory=list)
    limit_hit: StopReason | None = None

    @property
    def runnable_count(self) -> int:
        return sum(len(g.calls) for g in self.groups)


def plan_round(calls: Sequence[CheckedCall], limits: Limits, calls_so_far: int) -> RoundPlan:
    plan = RoundPlan()
    pending: list[CheckedCall] = []
    budget_left = limits.max_total_calls - calls_so_far

    def flush() -> None:
        if pending:
            plan.groups.append(CallGroup(tuple(pending), parallel=True))
            pending.clear()

    for position, call in enumerate(calls):
        if position >= limits.max_calls_per_round:
            plan.immediate[call.call_id] = error_output(
                ResultCode.LIMIT_REACHED,
                f"at most {limits.max_calls_per_round} calls per round; this call was not run.",
            )
            plan.limit_hit = plan.limit_hit or "max_calls_per_round"
            continue
        if call.rejection is not None:
            plan.immediate[call.call_id] = call.rejection
            continue
        if budget_left <= 0:
            plan.immediate[call.call_id] = error_output(
                ResultCode.LIMIT_REACHED,
                f"at most {limits.max_total_calls} tool calls per request; this call was not run.",
            )
            plan.limit_hit = plan.limit_hit or "max_total_calls"
            continue
        budget_left -= 1
        if call.read_only:
            pending.append(call)
        else:
            flush()
            plan.groups.append(CallGroup((call,), parallel=False))
    flush()
    return plan
