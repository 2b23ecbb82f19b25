"""Pure tests: dispatch planning, limits, output capping."""

from __future__ import annotations

import json

from toolloop._core.contracts import CheckedCall, Limits, error_output, output_json
from toolloop._core.outputs import CAPPED_KEY, TRUNCATION_MARKER, cap_output, output_size
from toolloop._core.planning import plan_round


def read(call_id: str) -> CheckedCall:
    return CheckedCall(call_id=call_id, name="get_x", read_only=True, summary=call_id, arguments={})


def write(call_id: str) -> CheckedCall:
    return CheckedCall(call_id=call_id, name="set_x", read_only=False, summary=call_id, arguments={})


def rejected(call_id: str) -> CheckedCall:
    return CheckedCall(call_id=call_id, name="nope", summary=call_id, rejection=error_output("UNKNOWN_TOOL", "no"))


def group_ids(plan) -> list[tuple[list[str], bool]]:
    return [([c.call_id for c in g.calls], g.parallel) for g in plan.groups]


def test_consecutive_reads_form_one_parallel_group_and_writes_are_barriers() -> None:
    plan = plan_round([read("a"), read("b"), write("w"), read("c"), write("v"), write("u")], Limits(), 0)
    assert group_ids(plan) == [(["a", "b"], True), (["w"], False), (["c"], True), (["v"], False), (["u"], False)]
    assert plan.immediate == {}
    assert plan.limit_hit is None
    assert plan.runnable_count == 6


def test_rejected_calls_are_answered_at_once_and_do_not_split_groups() -> None:
    plan = plan_round([read("a"), rejected("x"), read("b")], Limits(), 0)
    assert group_ids(plan) == [(["a", "b"], True)]
    assert plan.immediate["x"]["code"] == "UNKNOWN_TOOL"


def test_calls_over_the_round_limit_get_limit_reached_each() -> None:
    calls = [read(f"c{i}") for i in range(5)]
    plan = plan_round(calls, Limits(max_calls_per_round=3), 0)
    assert group_ids(plan) == [(["c0", "c1", "c2"], True)]
    assert {k: v["code"] for k, v in plan.immediate.items()} == {"c3": "LIMIT_REACHED", "c4": "LIMIT_REACHED"}
    assert plan.limit_hit == "max_calls_per_round"


def test_total_call_budget_counts_earlier_rounds() -> None:
    plan = plan_round([read("a"), read("b"), read("c")], Limits(max_total_calls=10), 9)
    assert group_ids(plan) == [(["a"], True)]
    assert set(plan.immediate) == {"b", "c"}
    assert plan.limit_hit == "max_total_calls"


def test_small_output_is_unchanged() -> None:
    out = {"ok": True, "x": 1}
    assert cap_output(out, 1000) is out


def test_large_output_is_capped_to_valid_json_with_marker() -> None:
    out = {"ok": True, "text": 'é"<' * 50_000}
    capped = cap_output(out, 2048)
    assert output_size(capped) <= 2048
    assert capped["ok"] is True and capped[CAPPED_KEY] == {"original_bytes": output_size(out)}
    assert capped["text"].endswith(TRUNCATION_MARKER)
    json.loads(output_json(capped))


def test_capped_error_keeps_its_code() -> None:
    capped = cap_output(error_output("NOT_AVAILABLE", "x" * 5000), 512)
    assert capped["ok"] is False and capped["code"] == "NOT_AVAILABLE"


def test_over_the_total_budget_each_call_is_answered_with_the_limit_and_writes_spend_it_too() -> None:
    plan = plan_round([write("w1"), read("a"), write("w2"), read("b")], Limits(max_total_calls=5), 2)
    # Three left: w1, a and w2 run (writes count like reads); b is over the budget.
    assert group_ids(plan) == [(["w1"], False), (["a"], True), (["w2"], False)]
    assert plan.immediate == {
        "b": {
            "ok": False,
            "code": "LIMIT_REACHED",
            "message": "at most 5 tool calls per request; this call was not run.",
        }
    }
    assert (plan.runnable_count, plan.limit_hit) == (3, "max_total_calls")


def test_the_round_limit_message_names_the_limit_and_comes_before_validation() -> None:
    plan = plan_round([read("a"), rejected("x"), rejected("y")], Limits(max_calls_per_round=2), 0)
    assert plan.immediate == {
        "x": rejected("x").rejection,
        "y": {"ok": False, "code": "LIMIT_REACHED", "message": "at most 2 calls per round; this call was not run."},
    }
