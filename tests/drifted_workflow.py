"""Workflow (deterministic, on purpose wrong): AgentWorkflow with one incompatible change, registered under the
real name, so the replay test can show that a change like it fails the replay of stored histories."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from toolloop._core.contracts import AgentInput, AgentResult
    from toolloop._core.names import AGENT_WORKFLOW

from toolloop.workflows.agent import AgentWorkflow


@workflow.defn(name=AGENT_WORKFLOW)
class DriftedAgentWorkflow(AgentWorkflow):
    """A "harmless" pause before the loop: a new timer command that no stored history has."""

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        await workflow.sleep(timedelta(milliseconds=10))
        return await super().run(inp)
