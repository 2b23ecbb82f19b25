"""Replay of the histories committed under tests/histories/ (one per scenario family) with today's workflow
code: an incompatible workflow change fails here, in CI (FAULTS W8). A deliberately non-deterministic change
must fail the same replay (the negative control). Refresh: `python -m tests.record_histories`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from faultbed.scenarios import BUILT_IN, POLICY_SCENARIOS
from tests.drifted_workflow import DriftedAgentWorkflow
from tests.record_histories import HISTORIES, SCENARIOS
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import AgentResult, status_of
from toolloop._temporal.converter import data_converter
from toolloop._temporal.worker_factory import workflow_runner
from toolloop.workflows.agent import AgentWorkflow
from toolloop.workflows.thread import ThreadWorkflow

# The chaos runner's: one run of each built-in scenario (`starter.py chaos --save-histories`); a thread
# scenario's is a directory: its thread's workflow (thread.json) and each message's request (m1.json, ...).
CHAOS_HISTORIES = HISTORIES / "chaos"
# The chaos runner's policy scenarios (`starter.py chaos --policies --save-histories ...`): writes decided by
# a rule, by a manager, by four eyes, denied, and a policy changed mid-run.
POLICY_HISTORIES = HISTORIES / "chaos_policies"
# Write requests followed live under load (tests/test_replay_under_load_e2e.py with
# TOOLLOOP_SAVE_LOAD_HISTORIES): queries arrived while their workflow tasks were open.
LOAD_HISTORIES = HISTORIES / "under_load"
# Recorded by the code before a change of what a run does (each change guarded by workflow.patched): runs
# started before the change must keep replaying after it.
BEFORE_HISTORIES = HISTORIES / "recorded_before"
THREAD_FILES = sorted(CHAOS_HISTORIES.glob("*/thread.json"))
# Every request's history (AgentWorkflow), a thread's messages' included.
FILES = (
    sorted(HISTORIES.glob("*.json"))
    + sorted(CHAOS_HISTORIES.glob("*.json"))
    + sorted(CHAOS_HISTORIES.glob("*/m*.json"))
    + sorted(POLICY_HISTORIES.glob("*.json"))
    + sorted(LOAD_HISTORIES.glob("*.json"))
    + sorted(BEFORE_HISTORIES.glob("*.json"))
)


def load(path: Path) -> WorkflowHistory:
    stored = json.loads(path.read_text())
    return WorkflowHistory.from_json(stored["workflow_id"], stored["history"])


def test_every_scenario_family_has_a_committed_history() -> None:
    assert {path.stem for path in FILES if path.parent == HISTORIES} == set(SCENARIOS)
    assert {path.stem for path in FILES if path.parent == CHAOS_HISTORIES} == {
        s.name for s in BUILT_IN if s.thread is None
    }
    # A thread scenario's: its thread and each of its messages' requests.
    for scenario in (s for s in BUILT_IN if s.thread is not None):
        saved = {path.name for path in (CHAOS_HISTORIES / scenario.name).glob("*.json")}
        assert saved == {"thread.json", *(f"m{n}.json" for n in range(1, len(scenario.thread.messages) + 1))}
    assert len([path for path in FILES if path.parent == LOAD_HISTORIES]) >= 4
    assert {path.stem for path in FILES if path.parent == POLICY_HISTORIES} == {s.name for s in POLICY_SCENARIOS}


def _replayer(*workflows: type) -> Replayer:
    return Replayer(workflows=list(workflows), data_converter=data_converter(), workflow_runner=workflow_runner())


@pytest.mark.parametrize(
    "path", FILES + THREAD_FILES, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in FILES + THREAD_FILES]
)
async def test_committed_history_replays_with_todays_workflow(path: Path) -> None:
    # Both of toolloop's workflows, as a worker registers them: a thread's history and its requests' alike.
    result = await _replayer(AgentWorkflow, ThreadWorkflow).replay_workflow(load(path))
    assert result.replay_failure is None


@pytest.mark.parametrize("path", THREAD_FILES, ids=[str(p.relative_to(HISTORIES).parent) for p in THREAD_FILES])
async def test_a_threads_history_starts_each_message_as_its_saved_request_one_after_another(path: Path) -> None:
    """The thread's history names, in order, the requests saved beside it, each started once the one before it
    had closed (its child's completion is in the thread's history before the next start)."""
    history = load(path)
    started = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    saved = sorted(path.parent.glob("m*.json"), key=lambda p: int(p.stem[1:]))
    assert started == [json.loads(p.read_text())["workflow_id"] for p in saved]
    kinds = [
        "start" if e.HasField("start_child_workflow_execution_initiated_event_attributes") else "closed"
        for e in history.events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
        or e.HasField("child_workflow_execution_completed_event_attributes")
        or e.HasField("child_workflow_execution_failed_event_attributes")
    ]
    assert kinds == ["start", "closed"] * len(saved)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in FILES])
async def test_a_non_deterministic_change_fails_the_replay(path: Path) -> None:
    with pytest.raises(NondeterminismError):
        await _replayer(DriftedAgentWorkflow).replay_workflow(load(path))


async def stored_report(history: WorkflowHistory) -> AgentResult:
    """The report a finished run's history holds: the workflow's result, or a failed request's failure
    details (ErrorType.REQUEST_FAILED)."""
    last = history.events[-1]
    if last.HasField("workflow_execution_completed_event_attributes"):
        payloads = last.workflow_execution_completed_event_attributes.result.payloads
    else:
        failure = last.workflow_execution_failed_event_attributes.failure
        assert failure.application_failure_info.type == ErrorType.REQUEST_FAILED, failure.message
        payloads = failure.application_failure_info.details.payloads
    [report] = await data_converter().decode(payloads, [AgentResult])
    return report


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in FILES])
async def test_the_workflows_own_result_is_the_whole_report(path: Path) -> None:
    """What handle.result() and the UI's Result panel show is the report the CLI and the API show: nothing
    in it refers elsewhere in the history."""
    history = load(path)
    report = await stored_report(history)
    assert report.workflow_id == history.workflow_id and report.status == status_of(report.stop_reason)
    for op in report.operations:
        assert op.digest.startswith("sha256:") and op.transitions and op.output is not None, op
        decided = {"approved", "denied"} & set(op.transitions)
        assert (op.approval is not None) == bool(decided), op
        if op.approval is not None:
            # Who decided, always; until when, for an approval (a rejection holds nothing to expire).
            assert op.approval.by and (op.approval.expires_at is not None) == (op.approval.decision == "approved")
        if op.state == "verified":
            assert op.evidence is not None and op.evidence["verified"] is True
            # Sent by this request; or, in a thread's message, by an earlier message that left it unknown: then
            # settled here by its status, never sent, and the report names that message.
            settled_from_earlier = op.attempts == 0 and [c.state for c in op.status_checks] == ["completed"]
            assert op.first_sent_at is not None or (settled_from_earlier and "of this thread" in (op.note or "")), op
