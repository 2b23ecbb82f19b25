"""Test helpers: start agent workflows, read their history, build scripted model turns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY
from toolloop import ScriptModel, request_result, testing
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentResult,
    ApprovalDecision,
    ConversationItem,
    DecisionReceipt,
    Limits,
    ModelSpec,
    OperationRecord,
)
from toolloop._core.names import AGENT_WORKFLOW, APPROVE_OPERATION_UPDATE
from toolloop._core.usage import TokenUsage
from toolloop._models.adapter import ModelAnswer, ModelRequest
from toolloop._temporal.settings import Settings

U1 = Actor(user_id="u1", tenant_id="acme")
# The name a test worker registers RemoteScriptModel under.
REMOTE_SCRIPT = "remote_script"


class RemoteScriptModel(ScriptModel):
    """The script model under a name of its own, for a test that gives a worker its own instance of it."""


# The name a test worker registers MeteredScriptModel under, and the usage it reports for every turn.
METERED_SCRIPT = "metered_script"
METERED_TURN = TokenUsage(input_tokens=100, output_tokens=10, total_tokens=110, cached_input_tokens=40)


class MeteredScriptModel(ScriptModel):
    """The script model as if its provider reported usage: every turn used METERED_TURN."""

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        return ModelAnswer(await super().respond(request), usage=METERED_TURN, model="metered")


async def waiting_operation(handle: WorkflowHandle[Any, Any]) -> OperationRecord:
    """The first operation waiting for approval, once the workflow has one."""
    return await testing.waiting_operation(handle)


async def decide(
    handle: WorkflowHandle[Any, Any],
    operation_id: str,
    *,
    approve: bool = True,
    decider: Actor = U1,
    key: str = APPROVAL_KEY,
    ttl: float = 600,
) -> DecisionReceipt:
    """What the approval channel does (toolloop's client, channel "test"): fetch the whole payload, sign the
    decision, send it."""
    return await testing.decide(handle, operation_id, approve=approve, decider=decider, signing_key=key, ttl=ttl)


def approving(
    handle: WorkflowHandle[Any, Any], key: str = APPROVAL_KEY, approver: Actor = U1, ttl: float = 600
) -> contextlib.AbstractAsyncContextManager[list[str]]:
    """Approve every operation the workflow asks about (what `ask --auto-approve` does), as "<user> via test"."""
    return testing.approve_all(handle, signing_key=key, approver=approver, ttl=ttl)


call = testing.call
say = testing.say
script_spec = testing.script
model_turns = testing.model_turns
conversation = testing.conversation
tool_outputs = testing.answered_once
assert_eventually = testing.eventually


async def start_agent(
    client: Client,
    settings: Settings,
    request: str,
    *,
    user: str = "u1",
    tenant: str = "acme",
    model: ModelSpec | None = None,
    limits: Limits | None = None,
    allowed_tools: list[str] | None = None,
    metadata: dict[str, str] | None = None,
) -> WorkflowHandle[Any, AgentResult]:
    return await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request=request,
            actor=Actor(user_id=user, tenant_id=tenant),
            model=model or ModelSpec(provider="offline"),
            limits=limits or Limits(),
            allowed_tools=allowed_tools,
            metadata=metadata or {},
        ),
        id=f"test-{uuid.uuid4().hex[:12]}",
        task_queue=settings.task_queue,
        result_type=AgentResult,
    )


async def run_agent(
    client: Client, settings: Settings, request: str, **kwargs: Any
) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
    handle = await start_agent(client, settings, request, **kwargs)
    return await asyncio.wait_for(request_result(handle), timeout=120), handle


async def service_requests(admin: httpx.AsyncClient, path_prefix: str = "/") -> list[dict[str, Any]]:
    response = await admin.get("/admin/requests", params={"path_prefix": path_prefix})
    response.raise_for_status()
    return list(response.json()["requests"])


async def set_faults(admin: httpx.AsyncClient, *rules: dict[str, Any]) -> None:
    (await admin.put("/admin/faults", json={"rules": list(rules)})).raise_for_status()


async def decisions_in_history(client: Client, handle: WorkflowHandle[Any, Any]) -> list[ApprovalDecision]:
    """The decisions sent to a run, as its history holds them (its approve_operation Updates' inputs): what
    anyone who may read histories can copy."""
    return [
        (await client.data_converter.decode(accepted.input.args.payloads, [ApprovalDecision]))[0]
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        and (accepted := event.workflow_execution_update_accepted_event_attributes.accepted_request).input.name
        == APPROVE_OPERATION_UPDATE
    ]


async def effects(admin: httpx.AsyncClient, operation_id: str) -> list[dict[str, Any]]:
    """The service's own effect rows made under one operation id."""
    response = await admin.get("/admin/effects", params={"operation_id": operation_id})
    response.raise_for_status()
    return list(response.json()["effects"])


def worker_env(settings: Settings, service_url: str | None = None) -> dict[str, str]:
    """The environment of a `python worker.py` process serving this test's task queue."""
    return {
        "TEMPORAL_ADDRESS": settings.temporal_address,
        "TOOLLOOP_TASK_QUEUE": settings.task_queue,
        "TOOLLOOP_SERVICE_URL": service_url or settings.service_url,
        "TOOLLOOP_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY,
        "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
    }


async def ticket_version(service_url: str, ticket_id: str = "T1001", user: str = "u1") -> int:
    """A ticket's current version, as its owner reads it (a note must name it as expectedVersion)."""
    async with httpx.AsyncClient(base_url=service_url, trust_env=False) as http:
        response = await http.get(f"/tickets/{ticket_id}", headers={"X-Actor-User": user, "X-Actor-Tenant": "acme"})
        response.raise_for_status()
        return int(response.json()["version"])


async def activity_steps(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Each model turn, tool call and write in the order history schedules them, by activity type."""
    return [
        event.activity_task_scheduled_event_attributes.activity_type.name
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def marker_count(handle: WorkflowHandle[Any, Any]) -> int:
    """How many markers the run recorded: a local activity, a patch or a side effect each leave one. The
    workflow uses none of them (a local activity's result can reach the workflow a task after its marker)."""
    return len([e async for e in handle.fetch_history_events() if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED])


async def stored_report(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    """The report as the run's last event stores it: its result, or a failed request's failure details."""
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payload = event.workflow_execution_completed_event_attributes.result.payloads[0]
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = event.workflow_execution_failed_event_attributes.failure
            payload = failure.application_failure_info.details.payloads[0]
    report: dict[str, Any] = json.loads(payload.data)
    return report
