"""Replay of the histories committed under tests/histories/ (one per scenario family) with today's workflow
code: an incompatible workflow change fails here, in CI (FAULTS W8). A deliberately non-deterministic change
must fail the same replay (the negative control). Refresh: `python -m tests.record_histories`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from faultbed.scenarios import BUILT_IN
from tests.drifted_workflow import DriftedAgentWorkflow
from tests.record_histories import HISTORIES, SCENARIOS
from toolloop._core.approvals import payload_digest
from toolloop._core.contracts import AgentResult
from toolloop._temporal.converter import data_converter
from toolloop._temporal.results import completed_from
from toolloop._temporal.worker_factory import workflow_runner
from workflows.agent import AgentWorkflow

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


@pytest.mark.parametrize("name", ["report_refers_to_history", "write_told_by_reference"])
async def test_a_stored_report_is_read_back_whole_from_its_history(name: str) -> None:
    """The reader of a report that refers to history, on histories recorded by earlier code too: the
    decision answered with the whole approval (report_refers_to_history) or with its time only, and the
    write's output told in the next turn's input or by reference to its attempt."""
    history = load(HISTORIES / f"{name}.json")
    converter = data_converter()
    [done] = [e for e in history.events if e.HasField("workflow_execution_completed_event_attributes")]
    payloads = done.workflow_execution_completed_event_attributes.result.payloads
    [stored] = await converter.decode(payloads, [AgentResult])
    assert not stored.complete

    async def events() -> AsyncIterator[HistoryEvent]:
        for event in history.events:
            yield event

    report = await completed_from(events(), converter, stored)
    assert report.complete
    [op] = report.operations
    assert op.approval is not None and (op.approval.decision, op.approval.by) == ("approved", "u1 via cli")
    assert op.approval.expires_at is not None and op.approval.expires_at > op.approval.at
    assert op.first_sent_at is not None and op.first_sent_at >= op.approval.at
    assert op.digest == payload_digest(op.target or op.tool, op.arguments)
    assert op.evidence is not None and op.evidence["verified"] is True
    assert op.output is not None and (op.output["state"], op.output["operation_id"]) == ("verified", op.operation_id)
    assert report.status == "completed" and report.final_text == "ok"
