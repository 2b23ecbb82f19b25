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

from faultbed.scenarios import BUILT_IN
from tests.drifted_workflow import DriftedAgentWorkflow
from tests.record_histories import HISTORIES, SCENARIOS
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import AgentResult, status_of
from toolloop._temporal.converter import data_converter
from toolloop._temporal.worker_factory import workflow_runner
from toolloop.workflows.agent import AgentWorkflow

# The chaos runner's: one run of each built-in scenario (`starter.py chaos --save-histories`).
CHAOS_HISTORIES = HISTORIES / "chaos"
# Write requests followed live under load (tests/test_replay_under_load_e2e.py with
# TOOLLOOP_SAVE_LOAD_HISTORIES): queries arrived while their workflow tasks were open.
LOAD_HISTORIES = HISTORIES / "under_load"
FILES = (
    sorted(HISTORIES.glob("*.json")) + sorted(CHAOS_HISTORIES.glob("*.json")) + sorted(LOAD_HISTORIES.glob("*.json"))
)


def load(path: Path) -> WorkflowHistory:
    stored = json.loads(path.read_text())
    return WorkflowHistory.from_json(stored["workflow_id"], stored["history"])


def test_every_scenario_family_has_a_committed_history() -> None:
    assert {path.stem for path in FILES if path.parent == HISTORIES} == set(SCENARIOS)
    assert {path.stem for path in FILES if path.parent == CHAOS_HISTORIES} == {s.name for s in BUILT_IN}
    assert len([path for path in FILES if path.parent == LOAD_HISTORIES]) >= 4


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in FILES])
async def test_committed_history_replays_with_todays_workflow(path: Path) -> None:
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(load(path))
    assert result.replay_failure is None


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in FILES])
async def test_a_non_deterministic_change_fails_the_replay(path: Path) -> None:
    replayer = Replayer(
        workflows=[DriftedAgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner()
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(load(path))


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
            assert op.evidence is not None and op.evidence["verified"] is True and op.first_sent_at is not None
