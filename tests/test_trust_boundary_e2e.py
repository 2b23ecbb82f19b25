"""End to end: who decides what is trusted. A worker verifies decisions only with the approval key its own
configuration names (ToolloopPlugin(approval_verify_key=...), TOOLLOOP_APPROVAL_VERIFY_KEY): a request whose
input brings another key - anyone who can start a workflow on the task queue could otherwise script a write,
approve it with a key pair of their own and have it sent - is refused before anything runs."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from demo.agent import build as build_demo
from tests.agent_helpers import call, decide, say, script_spec, service_requests, start_agent
from tests.conftest import APPROVAL_VERIFY_KEY
from toolloop._core.approvals import generate_signing_key, verify_key_for
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import AgentResult
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

NOTE = {"ticketId": "T1001", "text": "planted by attacker", "expectedVersion": 1}


async def refused_before_anything(handle: WorkflowHandle[Any, AgentResult]) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), timeout=60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.UNTRUSTED_APPROVAL_KEY
    scheduled = [
        e async for e in handle.fetch_history_events() if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == []  # no model turn, no tool, no write
    return cause


async def test_a_request_that_brings_its_own_approval_key_is_refused_and_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    attacker = generate_signing_key()
    handle = await start_agent(
        client,
        settings,
        "x",
        model=script_spec([call("append_ticket_note", NOTE, "w1")], [say("done")]),
        verify_key=verify_key_for(attacker),
    )
    cause = await refused_before_anything(handle)
    assert "TOOLLOOP_APPROVAL_VERIFY_KEY" in cause.message and verify_key_for(attacker) not in cause.message
    # Approving with the attacker's own key gets nowhere either: the request is over.
    with pytest.raises(Exception):  # noqa: B017 - whichever way the closed workflow refuses the Update
        await decide(handle, "op_any", key=attacker)
    assert await service_requests(admin) == []


async def test_a_worker_without_a_configured_key_refuses_requests_that_bring_one(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    keyless = settings.model_copy(update={"approval_verify_key": None, "task_queue": f"keyless-{uuid.uuid4().hex[:8]}"})
    async with running_worker(client, keyless, build_demo(settings.service_url)):
        handle = await start_agent(client, keyless, "x", verify_key=APPROVAL_VERIFY_KEY)
        await refused_before_anything(handle)
        # A request without a key still runs (it can read, and takes no decisions).
        reads = await start_agent(client, keyless, "Where is my order A100?", verify_key=None)
        result = await asyncio.wait_for(reads.result(), timeout=60)
    assert result.status == "completed"
    assert [r["path"] for r in await service_requests(admin)] == ["/orders/A100"]
