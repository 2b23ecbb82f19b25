"""Wiring (worker side): the trust anchor. A worker takes a decision only when the request's verify key is
the one its own configuration names: anyone who can start a workflow on the task queue chooses its input,
so the input cannot decide trust. Checked in the decision Update's validator, which runs when a decision
arrives and never on replay: a worker whose key changed (a rotation) still replays every run, and a run
that brought another key takes no decision, so none of its writes is ever sent."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.worker import (
    ExecuteWorkflowInput,
    HandleUpdateInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from toolloop._core.names import AGENT_WORKFLOW, APPROVE_OPERATION_UPDATE


def untrusted_key_problem(configured: str | None, brought: str | None) -> str | None:
    """Why a decision may not be taken in a request that brought `brought` on a worker configured with
    `configured`; None if it may (the request brought exactly the configured key)."""
    if configured is None:
        return (
            "this worker has no approval verify key configured (TOOLLOOP_APPROVAL_VERIFY_KEY), so it takes no "
            "decisions; nothing was recorded"
        )
    if brought != configured:
        return "this request's approval key is not the one this worker trusts; nothing was recorded"
    return None


class TrustedApprovalKey(Interceptor):
    """A worker interceptor: in AgentWorkflow, a decision is taken only when the request's verify key is the
    configured one."""

    def __init__(self, verify_key: str | None) -> None:
        self.verify_key = verify_key

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        configured = self.verify_key

        class _DecideOnlyWithTheTrustedKey(WorkflowInboundInterceptor):
            # The request's key, as its input brought it; unset until the run has started (a decision that
            # arrives before is refused: fail closed).
            brought: str | None = None
            started = False

            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                if input.args:
                    # Read by name: inside the sandbox the input is of the sandbox's own AgentInput class.
                    self.brought = getattr(input.args[0], "approval_verify_key", None)
                self.started = True
                return await super().execute_workflow(input)

            def handle_update_validator(self, input: HandleUpdateInput) -> None:
                if workflow.info().workflow_type == AGENT_WORKFLOW and input.update == APPROVE_OPERATION_UPDATE:
                    if not self.started:
                        raise ValueError("the request has not started yet; nothing was recorded")
                    problem = untrusted_key_problem(configured, self.brought)
                    if problem is not None:
                        raise ValueError(problem)
                super().handle_update_validator(input)

        return _DecideOnlyWithTheTrustedKey
