"""End to end: `starter.py chaos` as a user runs it - its own stack, real faults, the verdict in its exit
status and its JSON results - the CI subset of the matrix (every family, a few seeds), and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e


def chaos(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any] | None]:
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "starter.py"), "chaos", "--out", str(out), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results = out / "chaos.json"
    return done.returncode, done.stderr, json.loads(results.read_text()) if results.exists() else None


def test_the_quick_matrix_holds_every_invariant_with_every_fault_fired(tmp_path: Path) -> None:
    scenarios = "svc-lost-reply,svc-status-down,wire-reset-write,wire-flaky-reads,model-injection"
    code, err, results = chaos(tmp_path, "--scenarios", scenarios, "--seeds", "2")
    assert code == 0, err
    assert results is not None and results["problems"] == []
    runs = results["runs"]
    assert sorted((r["scenario"], r["seed"]) for r in runs) == sorted(
        (s, seed) for s in scenarios.split(",") for seed in (0, 1)
    )
    assert all(r["ok"] for r in runs)
    # An Nth-call fault fired in every run; the seeded one somewhere among its seeds.
    assert all(sum(r["fired"].values()) >= 1 for r in runs if r["scenario"] != "wire-flaky-reads")
    assert sum(sum(r["fired"].values()) for r in runs if r["scenario"] == "wire-flaky-reads") >= 1
    # The service's own table holds exactly one effect per run, also where the report stays unknown.
    assert {(r["scenario"], r["write_state"], r["effects"]) for r in runs} == {
        ("svc-lost-reply", "verified", 1),
        ("svc-status-down", "unknown", 1),
        ("wire-reset-write", "verified", 1),
        ("wire-flaky-reads", "verified", 1),
        ("model-injection", "verified", 1),
    }
    # The refund the model was talked into was rejected at the approval channel and left no effect.
    assert all(
        r["honesty"] == [["done", "done"], ["not_done", "not_done"]] for r in runs if r["scenario"] == "model-injection"
    )
    headline = results["headline"]
    assert headline["runs"] == 10 and headline["duplicate effects"] == headline["false done"] == 0
    assert headline["false not-done"] == headline["stuck requests"] == headline["pairing breaks"] == 0
    assert "svc-status-down | T8" in (tmp_path / "results" / "chaos.md").read_text()
    # Any run replays alone with the command it names.
    replay = next(r for r in runs if r["scenario"] == "wire-flaky-reads" and sum(r["fired"].values()))
    seed = str(replay["seed"])
    assert replay["replay"] == f"python starter.py chaos --scenarios wire-flaky-reads --seed {seed}"
    code, err, again = chaos(tmp_path, "--scenarios", "wire-flaky-reads", "--seed", seed)
    assert code == 0, err
    assert again is not None and [r["fired"] for r in again["runs"]] == [replay["fired"]]


def test_a_plan_whose_fault_never_fires_fails_the_run(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: never\nfaults:\n  - boundary: service\n    fault: commit_then_drop\n"
        "    match: {method: POST, path: '^/tickets/'}\n"
    )
    code, err, results = chaos(tmp_path, "--plan", str(plan))
    assert code == 1
    assert "problem: never: fault 0 (commit_then_drop) never fired with seeds [0]" in err
    assert results is not None and results["runs"][0]["ok"] is True  # nothing broke: nothing was tested


def test_a_bad_plan_is_refused_with_a_line_per_bad_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: bad\nfaults:\n  - boundary: wire\n    fault: melt\n  - boundary: process\n    fault: kill_worker\n"
    )
    code, err, results = chaos(tmp_path, "--plan", str(plan))
    assert code == 2 and results is None
    assert err.splitlines() == [
        f"error: {plan}: faults[0].fault: Input should be 'latency', 'refused', 'reset', 'timeout', 'cut_reply' or "
        "'down'",
        f"error: {plan}: faults[1].at: Field required",
    ]
    assert "Traceback" not in err


def test_an_unknown_scenario_is_one_line(tmp_path: Path) -> None:
    code, err, _ = chaos(tmp_path, "--scenarios", "svc-lost-reply,nope")
    assert code == 2 and len(err.splitlines()) == 1 and "unknown scenario(s) nope" in err
