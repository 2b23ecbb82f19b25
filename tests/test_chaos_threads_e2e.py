"""End to end: the chaos runner's thread scenarios (issue 26) as a user runs them - `starter.py chaos` on a stack
of its own, threads sent through the client's thread API, real worker kills between messages and while a message
waits in the queue, a real Temporal restart while one is queued, a write left unknown by one message and proposed
again by the next - every invariant held, the threads' own included, and the saved histories showing what each
fault did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack.processes import pid_alive
from faultbed.scenarios import BUILT_IN
from tests.test_chaos_e2e import activity_events, chaos

pytestmark = pytest.mark.e2e

THREAD_SCENARIOS = [s.name for s in BUILT_IN if s.thread is not None]
THREAD_FIGURES = (
    "overlapping messages",
    "messages out of order",
    "writes shown done, not verified",
    "done writes redone",
    "histories not replaying",
)
THREAD_CHECKS = {
    "messages never overlap",
    "messages run in acceptance order",
    "no write shown done that the ledger did not verify",
    "a done write is never redone",
    "every history replays",
}


def test_thread_scenarios_hold_every_invariant_with_every_fault_fired(tmp_path: Path) -> None:
    assert sorted(THREAD_SCENARIOS) == [
        "thread-temporal-restart-queued",
        "thread-unknown-reproposed",
        "thread-worker-kills",
    ]
    saved = tmp_path / "histories"
    code, err, results = chaos(tmp_path, "--scenarios", ",".join(THREAD_SCENARIOS), "--save-histories", str(saved))
    assert code == 0, err
    assert results is not None and results["problems"] == []
    runs = {r["scenario"]: r for r in results["runs"]}
    assert sorted(runs) == sorted(THREAD_SCENARIOS)
    for run in runs.values():
        checks = {c["name"]: c["ok"] for c in run["checks"]}
        # Each message's request judged by every invariant of a single run (on the service's own log too), and
        # the thread by its own.
        assert checks.keys() >= THREAD_CHECKS | {"at most one effect", "every call_id answered once"}
        assert checks.keys() >= {"status asked before every resend", "verified means read back"}
        assert all(checks.values()), run["checks"]
    headline = results["headline"]
    assert all(headline[figure] == 0 for figure in THREAD_FIGURES), headline
    assert headline["duplicate effects"] == headline["pairing breaks"] == headline["false done"] == 0
    assert headline["stuck requests"] == headline["runs not judged"] == headline["blind resends"] == 0

    # Every fault fired; each process one was a real SIGKILL of a real PID, a new process in its place.
    assert {n: r["fired"] for n, r in runs.items() if n != "thread-unknown-reproposed"} == {
        "thread-worker-kills": {"0": 1, "1": 1},
        "thread-temporal-restart-queued": {"0": 1},
    }
    unknown = runs["thread-unknown-reproposed"]
    assert unknown["fired"]["0"] == 1 and unknown["fired"]["1"] >= 1
    for name, processes in (
        ("thread-worker-kills", ["worker", "worker"]),
        ("thread-temporal-restart-queued", ["temporal"]),
    ):
        strikes = runs[name]["strikes"]
        assert [s["process"] for s in strikes] == processes
        assert all(s["old_pid"] != s["new_pid"] and not pid_alive(s["old_pid"]) for s in strikes)
    # Every write of every thread verified, one effect each in the service's own table; message 1's write in the
    # unknown scenario was reported unknown by message 1 (the service had it) and done by message 2.
    assert {n: (r["write_state"], r["effects"], len(r["requests"])) for n, r in runs.items()} == {
        "thread-worker-kills": ("verified", 3, 3),
        "thread-temporal-restart-queued": ("verified", 2, 2),
        "thread-unknown-reproposed": ("verified", 1, 2),
    }
    assert unknown["honesty"] == [["unknown", "done"], ["done", "done"]]
    assert runs["thread-worker-kills"]["honesty"] == [["done", "done"]] * 3

    # The saved histories: a thread's workflow and each message's request, one after another.
    def events(name: str, file: str) -> list[tuple[str, str, int]]:
        return activity_events(json.loads((saved / name / f"{file}.json").read_text()))

    def kinds(name: str, file: str, activity: str) -> list[str]:
        return [kind for kind, a, _ in events(name, file) if a == activity]

    for name, run in runs.items():
        thread = json.loads((saved / name / "thread.json").read_text())
        assert thread["workflow_id"] == run["workflow_id"]
        started = [
            e["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowId"]
            for e in thread["history"]["events"]
            if "startChildWorkflowExecutionInitiatedEventAttributes" in e
        ]
        assert started == run["requests"]
    # Message 3 proposed message 1's write again: told done, never sent again - its one write is its own.
    for file in ("m1", "m2", "m3"):
        assert kinds("thread-worker-kills", file, "execute_write") == ["SCHEDULED", "STARTED", "COMPLETED"]
    # The unknown write: sent once by message 1 (its reply lost, its status down), then in message 2 settled by
    # its status and read back, never approved nor sent.
    assert kinds("thread-unknown-reproposed", "m1", "execute_write")[:2] == ["SCHEDULED", "STARTED"]
    assert kinds("thread-unknown-reproposed", "m2", "execute_write") == []
    assert kinds("thread-unknown-reproposed", "m2", "query_operation_status") == ["SCHEDULED", "STARTED", "COMPLETED"]
    assert kinds("thread-unknown-reproposed", "m2", "read_back_operation") == ["SCHEDULED", "STARTED", "COMPLETED"]

    report = (tmp_path / "results" / "chaos.md").read_text()
    assert "| thread-worker-kills | W4 |" in report and "| overlapping messages | 0 |" in report
