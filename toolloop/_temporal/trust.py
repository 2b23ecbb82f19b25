"""Wiring (worker side): the trust anchor. The keys that verify an approval decision's signature are the
worker's own configuration (ToolloopPlugin(approval_verify_key=...), TOOLLOOP_APPROVAL_VERIFY_KEY; a set by
key id, so two are valid during a rotation), never a request's input: anyone who can start a workflow on the
task queue chooses that input. The signature is verified in the decision Update's validator, through a
workflow interceptor: validators run when a decision arrives and never on replay, so a worker whose keys
changed (a rotation) still replays every run. The workflow then judges the token's claims deterministically
(audience, operation, digest, actor, verdict, expiry, window), and takes no decision this interceptor did not
verify."""

from __future__ import annotations

from collections.abc import Iterable

from temporalio import workflow
from temporalio.worker import HandleUpdateInput, Interceptor, WorkflowInboundInterceptor, WorkflowInterceptorClassInput

from toolloop._core.approvals import ApprovalInvalid, verify_key_set, verify_token_signature
from toolloop._core.names import AGENT_WORKFLOW, APPROVE_OPERATION_UPDATE


class TrustedApprovalKeys(Interceptor):
    """A worker interceptor: in AgentWorkflow, a decision is taken only when its token's signature verifies
    with one of the worker's configured keys (the one its `kid` names)."""

    def __init__(self, verify_keys: str | Iterable[str] | None) -> None:
        self.keys = verify_key_set(verify_keys)

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        keys = self.keys

        class _VerifyWithTheWorkersKeys(WorkflowInboundInterceptor):
            def handle_update_validator(self, input: HandleUpdateInput) -> None:
                if workflow.info().workflow_type == AGENT_WORKFLOW and input.update == APPROVE_OPERATION_UPDATE:
                    # Read by name: inside the sandbox the decision is of the sandbox's own ApprovalDecision class.
                    token = getattr(input.args[0], "token", None) if input.args else None
                    refusal: tuple[str, str] | None = None
                    if token:  # a decision without one is refused by the workflow's own validator
                        try:
                            verify_token_signature(keys, token)
                        except ApprovalInvalid as exc:
                            refusal = (exc.code, str(exc))
                    # The workflow's validator raises the refusal in its own order of checks (an unknown
                    # operation is told as such first) and refuses any decision not checked here.
                    workflow.instance().approval_signature_checked(token, refusal)
                super().handle_update_validator(input)

        return _VerifyWithTheWorkersKeys
