"""End to end: who decides what is trusted. A worker takes a decision only in a request whose input brought
the approval key its own configuration names (ToolloopPlugin(approval_verify_key=...),
TOOLLOOP_APPROVAL_VERIFY_KEY). Anyone who can start a workflow on the task queue could otherwise script a
write, approve it with a key pair of their own and have it sent. The check is in the decision's validator,
so it never changes a replay: a worker whose key changed still replays every run."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.worker import Replayer, Worker

from demo.agent import build as build_demo
from tests.agent_helpers import call, decide, say, script_spec, service_requests, start_agent, waiting_operation
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY
from toolloop import ToolloopPlugin, request_result
from toolloop._core.approvals import generate_signing_key, verify_key_for
from toolloop._core.contracts import Limits
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

NOTE = {"ticketId": "T1001", "text": "planted by attacker", "expectedVersion": 1}


async def test_a_request_that_brings_its_own_approval_key_takes_no_decision_and_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    attacker = generate_signing_key()
    handle = await start_agent(
        client,
        settings,
        "x",
        model=script_spec([call("append_ticket_note", NOTE, "w1")], [say("done")]),
        verify_key=verify_key_for(attacker),
        limits=Limits(approval_ttl_seconds=3),
    )
    op = await waiting_operation(handle)
    # The attacker approves with the key their own request named: refused, nothing recorded.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await decide(handle, op.operation_id, key=attacker)
    assert "not the one this worker trusts" in str(refused.value.cause)
    result = await asyncio.wait_for(request_result(handle), timeout=60)
    [done] = result.operations
    assert done.state == "expired" and done.approval is None
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []  # nothing was sent


async def test_a_worker_without_a_configured_key_takes_no_decision_and_replays_every_run(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    keyless = settings.model_copy(update={"approval_verify_key": None, "task_queue": f"keyless-{uuid.uuid4().hex[:8]}"})
    async with running_worker(client, keyless, build_demo(settings.service_url)):
        handle = await start_agent(
            client,
            keyless,
            "x",
            model=script_spec([call("append_ticket_note", NOTE, "w1")], [say("done")]),
            limits=Limits(approval_ttl_seconds=3),
        )
        op = await waiting_operation(handle)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(handle, op.operation_id, key=APPROVAL_KEY)
        assert "no approval verify key configured" in str(refused.value.cause)
        result = await asyncio.wait_for(request_result(handle), timeout=60)
    assert [o.state for o in result.operations] == ["expired"]
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []
    # The run replays whatever key the replaying worker holds (a rotation never leaves a run stuck).
    history = await handle.fetch_history()
    for key in (None, APPROVAL_VERIFY_KEY, verify_key_for(generate_signing_key())):
        plugin = ToolloopPlugin(build_demo(settings.service_url), approval_verify_key=key)
        replayed = await Replayer(workflows=[], plugins=[plugin]).replay_workflow(history)
        assert replayed.replay_failure is None
