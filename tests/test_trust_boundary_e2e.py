"""End to end: who decides what is trusted. The keys that verify a decision are the worker's own configuration
(ToolloopPlugin(approval_verify_key=...), TOOLLOOP_APPROVAL_VERIFY_KEY), never a request's input; the scripted
models are off unless the worker's configuration turns them on; a decision token names the service it is for
(aud) and the key that signed it (kid). Anyone who can start a workflow on the task queue could otherwise
script a write, approve it with a key pair of their own and have it sent. The signature is checked in the
decision's validator, so it never changes a replay: a worker whose keys changed still replays every run."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Replayer, Worker

from demo.agent import build as build_demo
from demo.bizservice.writes import AUDIENCE as DEMO_AUDIENCE
from devstack.processes import free_port, start_business_service
from tests.agent_helpers import (
    U1,
    activity_steps,
    call,
    decide,
    effects,
    say,
    script_spec,
    service_requests,
    start_agent,
    waiting_operation,
)
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY, REPO_ROOT, approval_token
from tests.kit_service import AUDIENCE as KIT_AUDIENCE
from tests.kit_service import SqliteNotes, note_token, start_kit_service
from toolloop import ToolloopPlugin, request_result
from toolloop._core.approvals import (
    APPROVAL_UNKNOWN_KEY,
    APPROVAL_WRONG_AUDIENCE,
    ApprovalClaims,
    generate_signing_key,
    mint_approval_token,
    run_binding,
    verify_key_for,
)
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import AgentInput, AgentResult, ApprovalDecision, Limits, ModelSpec, OperationRecord
from toolloop._core.names import AGENT_WORKFLOW, APPROVE_OPERATION_UPDATE
from toolloop._temporal.approval_channel import fetch_approval_request
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

NOTE = {"ticketId": "T1001", "text": "planted by attacker", "expectedVersion": 1}


def _update_code(refused: pytest.ExceptionInfo[WorkflowUpdateFailedError]) -> str | None:
    cause = refused.value.cause
    return cause.type if isinstance(cause, ApplicationError) else None


async def test_a_request_whose_input_brings_a_forged_verify_key_is_refused_at_start_and_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    # Started directly on the task queue, as anyone with a Temporal client could: a script that writes, and
    # the attacker's own key pair in the input.
    attacker = generate_signing_key()
    handle = await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request="x",
            actor=U1,
            model=script_spec([call("append_ticket_note", NOTE, "w1")], [say("done")]),
            approval_verify_key=verify_key_for(attacker),
        ),
        id=f"test-{uuid.uuid4().hex[:12]}",
        task_queue=settings.task_queue,
        result_type=AgentResult,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), timeout=60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.UNTRUSTED_INPUT and cause.non_retryable
    # The attacker approves with that key all the same: the request takes nothing.
    decision = _decision("op_forged", "sha256:forged", attacker, audience=DEMO_AUDIENCE)
    with pytest.raises(RPCError, match="already completed"):
        await handle.execute_update(APPROVE_OPERATION_UPDATE, decision)
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []  # nothing was sent
    assert await effects(admin, "op_forged") == []
    assert await activity_steps(handle) == []  # not even a model turn ran


async def test_a_scripted_write_approved_with_a_key_the_worker_does_not_hold_is_refused_and_sends_nothing(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    handle, op = await _waiting_note(client, settings)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await decide(handle, op.operation_id, key=generate_signing_key())
    assert _update_code(refused) == APPROVAL_UNKNOWN_KEY
    assert "nothing was recorded" in str(refused.value.cause)
    result = await asyncio.wait_for(request_result(handle), timeout=60)
    [done] = result.operations
    assert done.state == "expired" and done.approval is None
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []
    assert await effects(admin, op.operation_id) == []


async def test_a_decision_signed_for_another_audience_is_refused_by_the_workflow(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    handle, op = await _waiting_note(client, settings)
    request = await fetch_approval_request(handle, op.operation_id)
    assert request is not None and request.audience == DEMO_AUDIENCE  # the channel learns it from the workflow
    # The channel's own key, a real decision on this exact payload, but addressed to another service.
    window = request.approval_expires_at
    decision = _decision(
        op.operation_id,
        op.digest,
        APPROVAL_KEY,
        audience=KIT_AUDIENCE,
        decide_by=window,
        request=run_binding(handle.id, request.run_id or ""),
    )
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(APPROVE_OPERATION_UPDATE, decision)
    assert _update_code(refused) == APPROVAL_WRONG_AUDIENCE
    result = await asyncio.wait_for(request_result(handle), timeout=60)
    assert [o.state for o in result.operations] == ["expired"]
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []


async def test_a_token_for_one_service_is_refused_by_another_with_the_wrong_audience_code(
    tmp_path: Path, admin: httpx.AsyncClient
) -> None:
    kit = start_kit_service(
        SqliteNotes(str(tmp_path / "notes.db")), tmp_path / "kit.log", verify_key=APPROVAL_VERIFY_KEY
    )
    try:
        body = {"text": "for the notes service only"}
        async with httpx.AsyncClient(base_url=kit.url, trust_env=False) as http:
            headers = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme", "Idempotency-Key": "op-aud"}
            # Signed by the trusted channel for exactly this write, but for the demo service (service A).
            for_a = note_token(APPROVAL_KEY, "op-aud", body, audience=DEMO_AUDIENCE)
            refused = await http.post("/notes", json=body, headers={**headers, "X-Approval-Token": for_a})
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == APPROVAL_WRONG_AUDIENCE
            assert (await http.get("/operations/op-aud", headers=headers)).json()["state"] == "not_found"
            # The same decision addressed to this service (B) is taken: only the audience differed.
            for_b = note_token(APPROVAL_KEY, "op-aud", body, audience=KIT_AUDIENCE)
            taken = await http.post("/notes", json=body, headers={**headers, "X-Approval-Token": for_b})
            assert taken.status_code == 201, taken.text
    finally:
        kit.stop()
    # And the other way round: the notes service's token at the demo service.
    note = {**NOTE, "text": "for the demo service only"}
    token = approval_token("op-aud-b", "append_ticket_note", note, audience=KIT_AUDIENCE)
    answer = await admin.post(
        "/tickets/T1001/notes",
        json=note,
        headers={
            "X-Actor-User": "u1",
            "X-Actor-Tenant": "acme",
            "Idempotency-Key": "op-aud-b",
            "X-Approval-Token": token,
        },
    )
    assert answer.status_code == 403 and answer.json()["code"] == APPROVAL_WRONG_AUDIENCE
    assert await effects(admin, "op-aud-b") == []


async def test_during_a_key_rotation_a_worker_and_a_service_holding_both_keys_take_decisions_signed_with_either(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    old, new = APPROVAL_KEY, OTHER_SIGNING_KEY
    both = f"{verify_key_for(old)},{verify_key_for(new)}"
    port, admin_token = free_port(), secrets.token_urlsafe(16)
    service = start_business_service(
        tmp_path / "service.sqlite", port, admin_token, approval_verify_key=both, cwd=REPO_ROOT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, headers={"X-Admin-Token": admin_token}, timeout=10) as admin:
            rotating = _worker_settings(settings, url, both)
            async with running_worker(client, rotating, build_demo(url)):
                for key, text in ((old, "approved with the old key"), (new, "approved with the new key")):
                    note = {**NOTE, "text": text, "expectedVersion": await _ticket_version(url)}
                    result = await _approved_note(client, rotating, note, key)
                    assert [o.state for o in result.operations] == ["verified"], result.operations
            # The old key removed from the worker's configuration: a decision it signed is refused.
            rotated = _worker_settings(settings, url, verify_key_for(new))
            async with running_worker(client, rotated, build_demo(url)):
                handle, op = await _waiting_note(client, rotated)
                with pytest.raises(WorkflowUpdateFailedError) as refused:
                    await decide(handle, op.operation_id, key=old)
                assert _update_code(refused) == APPROVAL_UNKNOWN_KEY
                assert [o.state for o in (await asyncio.wait_for(request_result(handle), 60)).operations] == ["expired"]
            assert await effects(admin, op.operation_id) == []
            assert len([r for r in await service_requests(admin) if r["method"] == "POST"]) == 2
    finally:
        service.stop()


async def test_a_worker_without_scripted_models_refuses_a_scripted_request_clearly_and_sends_nothing(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    deployment = settings.model_copy(
        update={"allow_scripted_models": False, "task_queue": f"deploy-{uuid.uuid4().hex[:8]}"}
    )
    async with running_worker(client, deployment, build_demo(settings.service_url)):
        for model in (
            script_spec([call("append_ticket_note", NOTE, "w1")], [say("done")]),
            ModelSpec(provider="offline"),
        ):
            handle = await start_agent(client, deployment, "Add a note to ticket T1001: hello", model=model)
            result = await asyncio.wait_for(request_result(handle), timeout=60)
            assert (result.status, result.stop_reason, result.calls) == ("failed", "model_error", [])
            assert result.error is not None and "TOOLLOOP_ALLOW_SCRIPTED_MODELS" in result.error, result.error
            assert f"model {model.provider!r} is a scripted model" in result.error
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []


async def test_a_worker_without_a_configured_key_takes_no_decision_and_replays_every_run(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    keyless = settings.model_copy(update={"approval_verify_key": None, "task_queue": f"keyless-{uuid.uuid4().hex[:8]}"})
    async with running_worker(client, keyless, build_demo(settings.service_url)):
        handle, op = await _waiting_note(client, keyless)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await decide(handle, op.operation_id, key=APPROVAL_KEY)
        assert _update_code(refused) == APPROVAL_UNKNOWN_KEY
        assert "no approval verify key is configured" in str(refused.value.cause)
        result = await asyncio.wait_for(request_result(handle), timeout=60)
    assert [o.state for o in result.operations] == ["expired"]
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []
    # The run replays whatever keys the replaying worker holds (a rotation never leaves a run stuck).
    history = await handle.fetch_history()
    for key in (None, APPROVAL_VERIFY_KEY, verify_key_for(generate_signing_key())):
        plugin = ToolloopPlugin(build_demo(settings.service_url), approval_verify_key=key)
        replayed = await Replayer(workflows=[], plugins=[plugin]).replay_workflow(history)
        assert replayed.replay_failure is None


# --- Helpers ----------------------------------------------------------------------------------------------------


async def _waiting_note(client: Client, settings: Settings) -> tuple[WorkflowHandle[Any, AgentResult], OperationRecord]:
    """A scripted note (approval window: 3 s), once its operation waits for approval."""
    handle = await start_agent(
        client,
        settings,
        "x",
        model=script_spec([call("append_ticket_note", NOTE, "w1")], [say("done")]),
        limits=Limits(approval_ttl_seconds=3),
    )
    return handle, await waiting_operation(handle)


def _worker_settings(settings: Settings, service_url: str, verify_keys: str) -> Settings:
    return settings.model_copy(
        update={
            "approval_verify_key": verify_keys,
            "service_url": service_url,
            "task_queue": f"rotation-{uuid.uuid4().hex[:8]}",
        }
    )


async def _ticket_version(service_url: str) -> int:
    async with httpx.AsyncClient(base_url=service_url, trust_env=False) as http:
        response = await http.get("/tickets/T1001", headers={"X-Actor-User": "u1", "X-Actor-Tenant": "acme"})
        response.raise_for_status()
        return int(response.json()["version"])


async def _approved_note(client: Client, settings: Settings, note: dict[str, object], key: str) -> AgentResult:
    handle = await start_agent(
        client, settings, "x", model=script_spec([call("append_ticket_note", note, "w1")], [say("ok")])
    )
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id, key=key)
    return await asyncio.wait_for(request_result(handle), timeout=60)


def _decision(
    operation_id: str,
    digest: str,
    signing_key: str,
    *,
    audience: str,
    decide_by: datetime | None = None,
    request: str | None = None,
) -> ApprovalDecision:
    """A decision signed by hand with `signing_key` for `audience` in the request `request` (what a channel of
    one's own would send)."""
    now = time.time()
    claims = ApprovalClaims(
        audience=audience,
        user_id="u1",
        tenant_id="acme",
        operation_id=operation_id,
        digest=digest,
        approved_by="u1",
        approved_at=now,
        expires_at=now + 60,
        decide_by=decide_by.timestamp() if decide_by is not None else None,
        request=request,
    )
    token = mint_approval_token(signing_key, claims)
    return ApprovalDecision(operation_id=operation_id, digest=digest, approve=True, token=token, by="u1")


async def test_the_cli_against_a_deployment_worker_says_in_one_line_that_the_offline_model_is_off(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    deployment = settings.model_copy(
        update={"allow_scripted_models": False, "task_queue": f"deploy-{uuid.uuid4().hex[:8]}"}
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_", "OPENAI_"))},
        "TEMPORAL_ADDRESS": settings.temporal_address,
        "TOOLLOOP_TASK_QUEUE": deployment.task_queue,
    }
    command = [sys.executable, "starter.py", "ask", "--user", "u1", "--no-local-stack", "Add a note to T1001: hi"]
    async with running_worker(client, deployment, build_demo(settings.service_url)):
        done = await asyncio.to_thread(
            subprocess.run, command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180
        )
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output, output
    [line] = [line for line in output.splitlines() if "TOOLLOOP_ALLOW_SCRIPTED_MODELS" in line]
    assert "model 'offline' is a scripted model, which this worker does not serve" in line
    assert [r for r in await service_requests(admin) if r["method"] == "POST"] == []
