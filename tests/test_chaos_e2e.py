"""End to end: `starter.py chaos` as a user runs it - its own stack, real faults, the verdict in its exit
status and its JSON results - the CI subset of the matrix (every family, a few seeds), and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devstack.processes import pid_alive
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
    scenarios = (
        "svc-lost-reply,svc-status-down,wire-reset-write,wire-flaky-reads,model-injection,model-endpoint-errors,"
        "model-stream-faults,proc-worker-after-commit,svc-429-after-commit,svc-503-after-commit,svc-429-before-commit,"
        # Two thread scenarios, seconds each (tests/test_chaos_threads_e2e.py runs all three and their histories).
        "thread-unknown-reproposed,thread-temporal-restart-queued"
    )
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
        ("model-endpoint-errors", "verified", 1),
        ("model-stream-faults", "verified", 1),
        ("proc-worker-after-commit", "verified", 1),
        ("svc-429-after-commit", "verified", 1),
        ("svc-503-after-commit", "verified", 1),
        ("svc-429-before-commit", "verified", 1),
        # A thread's writes: message 1's left unknown, verified by message 2; both messages' writes verified.
        ("thread-unknown-reproposed", "verified", 1),
        ("thread-temporal-restart-queued", "verified", 2),
    }
    # Every run was also judged on the service's own log: the verified write read back, one key per payload,
    # the status asked before any resend.
    on_log = ("verified means read back", "no resend with a new key", "status asked before every resend")
    assert all({c["name"]: c["ok"] for c in r["checks"]}.keys() >= set(on_log) for r in runs)
    # A run where a fault with a time fired has a recovery time (the first fault to the result); the script's
    # planted injection has none.
    timed = [r for r in runs if sum(r["fired"].values()) and r["scenario"] != "model-injection"]
    assert len(timed) >= 23 and all(r["recovery_seconds"] > 0 for r in timed)  # 22 Nth-call runs, 1+ seeded
    assert all(r["recovery_seconds"] is None for r in runs if r["scenario"] == "model-injection")
    # The refund the model was talked into was rejected at the approval channel and left no effect.
    assert all(
        r["honesty"] == [["done", "done"], ["not_done", "not_done"]] for r in runs if r["scenario"] == "model-injection"
    )
    headline = results["headline"]
    assert headline["runs"] == 26 and headline["duplicate effects"] == headline["false done"] == 0
    # Streams broken in the middle of a call's arguments: every turn asked again, no call taken from a part.
    assert headline["calls from partial arguments"] == 0
    stream_runs = [r for r in runs if r["scenario"] == "model-stream-faults"]
    assert all(sorted(r["fired"].values()) == [1, 1, 1] for r in stream_runs)
    assert all({c["name"]: c["ok"] for c in r["checks"]}["calls only from whole answers"] for r in stream_runs)
    assert headline["false not-done"] == headline["stuck requests"] == headline["pairing breaks"] == 0
    assert headline["blind resends"] == headline["resends with a new key"] == 0
    assert headline["verified without read-back"] == headline["runs not judged"] == 0
    assert headline["overlapping messages"] == headline["writes shown done, not verified"] == 0
    assert "what broke: Nothing" in err
    report = (tmp_path / "results" / "chaos.md").read_text()
    assert "svc-status-down | T8" in report
    # The charts are real PNG files the report shows.
    for chart in ("recovery.png", "outcomes.png"):
        assert f"]({chart})" in report
        assert (tmp_path / "results" / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Any run replays alone with the command it names.
    replay = next(r for r in runs if r["scenario"] == "wire-flaky-reads" and sum(r["fired"].values()))
    seed = str(replay["seed"])
    assert replay["replay"] == f"python starter.py chaos --scenarios wire-flaky-reads --seed {seed}"
    code, err, again = chaos(tmp_path, "--scenarios", "wire-flaky-reads", "--seed", seed)
    assert code == 0, err
    assert again is not None and [r["fired"] for r in again["runs"]] == [replay["fired"]]


def activity_events(history: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(event type, activity type, attempt) of each activity event of a saved history, in order; a retried
    attempt shows only in its start event's attempt number."""
    found = []
    scheduled: dict[str, str] = {}
    for event in history["history"]["events"]:
        kind = event["eventType"].removeprefix("EVENT_TYPE_ACTIVITY_TASK_")
        if not event["eventType"].startswith("EVENT_TYPE_ACTIVITY_TASK_"):
            continue
        attributes = next(v for k, v in event.items() if k.endswith("EventAttributes"))
        if kind == "SCHEDULED":
            scheduled[event["eventId"]] = attributes["activityType"]["name"]
        name = scheduled.get(attributes.get("scheduledEventId", event["eventId"]), "")
        found.append((kind, name, int(attributes.get("attempt", 1))))
    return found


def test_process_faults_kill_real_processes_at_their_points_and_every_request_recovers(tmp_path: Path) -> None:
    scenarios = [
        "proc-worker-model-turn",
        "proc-worker-before-send",
        "proc-worker-approval-wait",
        "proc-service-after-commit",
        "proc-temporal-restart",
        "model-timeout",
        "wire-planted-protocol-text",
    ]
    saved = tmp_path / "histories"
    code, err, results = chaos(tmp_path, "--scenarios", ",".join(scenarios), "--save-histories", str(saved))
    assert code == 0, err
    assert results is not None and results["problems"] == []
    runs = {r["scenario"]: r for r in results["runs"]}
    assert sorted(runs) == sorted(scenarios) and all(r["ok"] for r in runs.values())
    # Each strike happened once, and the service's own table holds exactly one effect for each run.
    assert {n: (r["fired"], r["write_state"], r["effects"]) for n, r in runs.items()} == {
        n: ({"0": 1}, "verified", 1) for n in scenarios
    }
    # A real SIGKILL of a real PID, and a new process in its place.
    killed = {
        "proc-worker-model-turn": "worker",
        "proc-worker-before-send": "worker",
        "proc-worker-approval-wait": "worker",
        "proc-service-after-commit": "service",
        "proc-temporal-restart": "temporal",
    }
    for name, process in killed.items():
        [struck] = runs[name]["strikes"]
        assert struck["process"] == process and struck["old_pid"] != struck["new_pid"]
        assert not pid_alive(struck["old_pid"])
    assert runs["model-timeout"]["strikes"] == runs["wire-planted-protocol-text"]["strikes"] == []
    # The fake function call planted in a read's reply reached the model as that tool's output, and only so.
    checks = runs["wire-planted-protocol-text"]["checks"]
    [planted] = [c for c in checks if c["name"] == "planted text stays tool output"]
    assert planted["ok"] is True
    history = {n: activity_events(json.loads((saved / f"{n}.json").read_text())) for n in scenarios}

    def kinds(name: str, activity: str) -> list[str]:
        return [kind for kind, a, _ in history[name] if a == activity]

    def attempts(name: str, activity: str) -> list[int]:
        return [n for kind, a, n in history[name] if a == activity and kind == "STARTED"]

    # The history shows what each fault did to the run: a model turn lost (with its worker, or to a call
    # that never answered) and asked again on a second attempt...
    assert attempts("proc-worker-model-turn", "model_turn") == [1, 2, 1]
    assert attempts("model-timeout", "model_turn") == [1, 2, 1]
    # ...a write that never reached the service: timed out, its status asked, then sent again (same key)...
    assert kinds("proc-worker-before-send", "execute_write") == ["SCHEDULED", "STARTED", "TIMED_OUT"] + [
        "SCHEDULED",
        "STARTED",
        "COMPLETED",
    ]
    assert kinds("proc-worker-before-send", "query_operation_status") == ["SCHEDULED", "STARTED", "COMPLETED"]
    # ...a reply lost with the service, settled by its status once it was back, never sent again...
    assert kinds("proc-service-after-commit", "execute_write") == ["SCHEDULED", "STARTED", "FAILED"]
    assert kinds("proc-service-after-commit", "query_operation_status") == ["SCHEDULED", "STARTED", "COMPLETED"]
    # ...while a worker lost during the approval wait leaves nothing to redo: one send once approved.
    assert kinds("proc-worker-approval-wait", "execute_write") == ["SCHEDULED", "STARTED", "COMPLETED"]


def test_a_plan_whose_fault_never_fires_fails_the_run(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: never\nfaults:\n  - boundary: service\n    fault: commit_then_drop\n"
        "    match: {method: POST, path: '^/tickets/'}\n"
    )
    code, err, results = chaos(tmp_path, "--plan", str(plan))
    assert code == 1
    assert "never: expected fault 0 (commit_then_drop) to fire in every run; it never fired with seeds [0]" in err
    assert results is not None and results["runs"][0]["ok"] is True  # nothing broke: nothing was tested


def test_a_bad_plan_is_refused_with_a_line_per_bad_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: bad\nfaults:\n  - boundary: wire\n    fault: melt\n  - boundary: process\n    fault: kill_worker\n"
    )
    code, err, results = chaos(tmp_path, "--plan", str(plan))
    assert code == 2 and results is None
    assert err.splitlines() == [
        f"error: {plan}: faults[0].fault: Input should be 'latency', 'refused', 'reset', 'timeout', 'cut_reply', "
        "'down', 'plant' or 'forge_token'",
        f"error: {plan}: faults[1].at: Field required",
    ]
    assert "Traceback" not in err


def test_an_unknown_scenario_is_one_line(tmp_path: Path) -> None:
    code, err, _ = chaos(tmp_path, "--scenarios", "svc-lost-reply,nope")
    assert code == 2 and len(err.splitlines()) == 1 and "unknown scenario(s) nope" in err


USER_PLAN = """\
name: user-notes
description: the note refused on the wire, its resend held and the worker killed, and a busy model
faults:
  - boundary: wire
    fault: refused
    match: {method: POST, path: "^/notes$"}
  - boundary: process
    fault: kill_worker
    at: before_write_sent
    when: {nth: 2}
  - boundary: model
    fault: status_429
"""


def test_a_users_own_agent_and_service_are_broken_with_their_plan(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(USER_PLAN)
    code, err, results = chaos(tmp_path, "--tools", "tests.user_chaos:target", "--plan", str(plan), "--seeds", "2")
    assert code == 0, err
    assert results is not None and results["problems"] == []
    runs = results["runs"]
    assert [r["seed"] for r in runs] == [0, 1] and all(r["ok"] for r in runs)
    for run in runs:
        # Every fault fired: the refusal, the kill of the worker holding the resend, the 429.
        assert run["fired"] == {"0": 1, "1": 1, "2": 1}
        [struck] = run["strikes"]
        assert struck["process"] == "worker" and not pid_alive(struck["old_pid"])
        # One note in the user's own service's table (their oracle read it), reported done and verified.
        assert (run["write_state"], run["effects"], run["honesty"]) == ("verified", 1, [["done", "done"]])
        # Replayed alone from the same plan and target.
        assert (
            run["replay"]
            == f"python starter.py chaos --plan {plan} --tools tests.user_chaos:target --seed {run['seed']}"
        )


def test_a_users_target_refuses_what_only_the_bundled_service_can_do(tmp_path: Path) -> None:
    code, err, results = chaos(
        tmp_path, "--tools", "tests.user_chaos:target", "--scenarios", "svc-lost-reply,proc-worker-after-commit"
    )
    assert code == 2 and results is None and "Traceback" not in err
    assert err.splitlines() == [
        "error: svc-lost-reply: faults[0]: a service fault (commit_then_drop) needs the bundled service's fault "
        "rules; with --tools use wire, model and process faults",
        "error: proc-worker-after-commit: faults[0]: after_service_commit needs the bundled service, which holds the "
        "reply of a committed write; with --tools strike before_write_sent, during_model_turn or during_approval_wait",
    ]
    for target, says in (
        ("tests.user_chaos:not_a_target", "not_a_target() returned Toolset, not a faultbed.ChaosTarget"),
        ("tests.nowhere:target", "cannot import tests.nowhere"),
        ("nonsense", "expected package.module:function"),
    ):
        code, err, _ = chaos(tmp_path, "--tools", target)
        assert code == 2 and len(err.splitlines()) == 1 and says in err, err
