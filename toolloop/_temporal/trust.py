"""Wiring (worker side): the trust anchor. A worker verifies approval decisions only with the verify key its
own configuration names; a request whose input brings any other key is refused before anything runs (anyone
who can start a workflow on the task queue chooses its input, so the input cannot decide trust)."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from toolloop._core.codes import ErrorType
from toolloop._core.names import AGENT_WORKFLOW


def untrusted_key_problem(configured: str | None, brought: str | None) -> str | None:
    """Why a request that brings `brought` may not run on a worker configured with `configured`; None if it
    may (it brings no key, and so takes no decisions, or it brings exactly the configured one)."""
    if brought is None or brought == configured:
        return None
    if configured is None:
        return (
            "this worker has no approval verify key configured (TOOLLOOP_APPROVAL_VERIFY_KEY), so it runs no "
            "request that takes decisions; the request was refused before anything ran"
        )
    return (
        "the request's approval verify key is not this worker's (TOOLLOOP_APPROVAL_VERIFY_KEY); the request "
        "was refused before anything ran"
    )


class TrustedApprovalKey(Interceptor):
    """A worker interceptor: AgentWorkflow runs only with the configured verify key (or none)."""

    def __init__(self, verify_key: str | None) -> None:
        self.verify_key = verify_key

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        configured = self.verify_key

        class _RefuseUntrustedKey(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                if workflow.info().workflow_type == AGENT_WORKFLOW and input.args:
                    request = input.args[0]
                    # Read by name: inside the sandbox the input is of the sandbox's own AgentInput class.
                    brought = getattr(request, "approval_verify_key", None)
                    problem = untrusted_key_problem(configured, brought)
                    if problem is not None:
                        raise ApplicationError(problem, type=ErrorType.UNTRUSTED_APPROVAL_KEY, non_retryable=True)
                return await super().execute_workflow(input)

        return _RefuseUntrustedKey
