"""The benchmark's policy phase (issue 27): its pure figures (the ratios and the three readings of 1.1x, the
report), the request that adds a write to the reads' own model turn, and one quick run of the phase end to end
(`python -m bench --quick --only policy`) whose JSON must hold its figures - not judged here (shared machines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import (
    BY_RULE,
    FLOOR,
    OURS,
    POLICY_READS,
    Latency,
    PolicyBench,
    PolicyRound,
    PolicyRun,
    Results,
    render_markdown,
    targets,
    to_json,
)
from bench.scenarios import READ_TOOL, WRITE_TOOL, Scenario, calls_for_turn, scenario_of, write_call
from tests.conftest import REPO_ROOT

QUICK_RUN_TIMEOUT_S = 240


def _run(stack: str, kind: str, median_ms: float) -> PolicyRun:
    return PolicyRun(
        stack=stack,
        kind=kind,
        requests=3,
        errors=0,
        latency=Latency(median_ms=median_ms, p95_ms=median_ms, max_ms=median_ms, samples=3),
        history_events=40,
        history_bytes=10_000,
        workflow_tasks=6,
        actions=8,
        activities={"run_tool": 3.0},
        activity_ms={"run_tool": 300.0},
    )


def _round(ours_reads: float, ours_rule: float, floor_reads: float, floor_rule: float) -> PolicyRound:
    return PolicyRound(
        runs={
            OURS: {POLICY_READS: _run(OURS, POLICY_READS, ours_reads), BY_RULE: _run(OURS, BY_RULE, ours_rule)},
            FLOOR: {POLICY_READS: _run(FLOOR, POLICY_READS, floor_reads), BY_RULE: _run(FLOOR, BY_RULE, floor_rule)},
        },
        other_load_cores={OURS: 0.1, FLOOR: 0.2},
        load_average={OURS: [1.0, 1.1], FLOOR: [1.1, 1.2]},
    )


def test_a_write_in_the_reads_round_adds_one_call_and_no_model_turn() -> None:
    reads, with_write = Scenario(reads=3), Scenario(reads=3, write=True, write_in_round=True)
    assert (reads.model_turns, with_write.model_turns) == (2, 2) and with_write.calls == reads.calls + 1
    first = calls_for_turn(with_write, 1)
    assert first is not None and [c.name for c in first] == [READ_TOOL] * 3 + [WRITE_TOOL]
    assert calls_for_turn(with_write, 2) is None and write_call(with_write) == first[-1]
    assert scenario_of(with_write.request_text()) == with_write
    # The other phases' requests keep their text (and so their history size).
    assert "write_in_round" not in Scenario(reads=3, write=True).request_text()
    assert write_call(Scenario(reads=3, write=True)).call_id == "c2-w"


def test_the_three_readings_of_1_1x_are_judged_on_the_medians_of_the_rounds() -> None:
    # Round 2 is perturbed for toolloop's write alone: the median of the rounds' ratios decides.
    rounds = [_round(200, 300, 150, 240), _round(200, 900, 150, 240), _round(200, 210, 150, 200)]
    policy = PolicyBench(rule="r", rounds=rounds)
    results = Results(meta={"sizes": {"spaced": 3}}, policy=policy)
    found = {t.name: t for t in targets(results) if t.area == "policy, latency"}
    own = found["toolloop: write by rule / reads only"]
    assert own.measured == pytest.approx(1.5) and own.met is False  # of 1.5, 4.5, 1.05
    versus = found["write by rule: toolloop / floor"]
    assert versus.measured == pytest.approx(1.25) and versus.met is False  # of 1.25, 3.75, 1.05
    overheads = found["(toolloop write by rule / reads only) / (floor's)"]
    assert overheads.measured == pytest.approx(1.5 / 1.6) and overheads.met is True  # of 0.94, 2.81, 0.79
    assert policy.median_value("write_ms_ours") == 100 and policy.median_value("write_ms_floor") == 90
    assert policy.median_value("added_over_floor") == pytest.approx(100 / 90)  # of 1.11, 7.78, 0.2
    doc = json.loads(json.dumps(to_json(results)))
    assert doc["policy_figures"]["ours_rule_over_reads"]["rounds"] == pytest.approx([1.5, 4.5, 1.05])
    text = render_markdown(results)
    assert "## Approval policies: a write decided by rule" in text and "| **median** |" in text
    assert "run_tool 3.0 x 100.0 ms" in text


@pytest.mark.e2e
def test_quick_policy_phase_runs_and_writes_its_figures(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "policy", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=QUICK_RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert doc["problems"] == []
    policy = doc["policy"]
    assert policy["rule"] == "bench-calendar-by-rule" and len(policy["rounds"]) == 2
    for measured in policy["rounds"]:
        for stack in (OURS, FLOOR):
            assert measured["other_load_cores"][stack] is not None and len(measured["load_average"][stack]) == 2
            for kind in (POLICY_READS, BY_RULE):
                run = measured["runs"][stack][kind]
                assert run["errors"] == 0 and run["requests"] == 3 and run["latency"]["median_ms"] > 0
                assert run["history_bytes"] > 0 and run["workflow_tasks"] > 0
        # toolloop's write was decided by the policy's evaluator; the floor's write was sent and read back.
        assert measured["runs"][OURS][BY_RULE]["activities"]["decide_by_policy"] == 1
        assert "decide_by_policy" not in measured["runs"][OURS][POLICY_READS]["activities"]
        assert measured["runs"][FLOOR][BY_RULE]["activities"]["floor_read_back"] == 1
    figures = doc["policy_figures"]
    assert all(len(figures[what]["rounds"]) == 2 for what in figures)
    policy_targets = [t for t in doc["targets"] if t["area"] == "policy, latency"]
    assert len(policy_targets) == 3 and all(t["met"] in (True, False) for t in policy_targets)
    assert "## Approval policies: a write decided by rule" in (tmp_path / "latest.md").read_text()
