"""End to end: a request whose history the worker cannot replay (here: a worker with a deliberately changed
workflow, tests/drifted_workflow.py) is answered with one clear problem - problem+json from the API, one line
and exit 1 from the CLI - never a 500, a plain-text error or a traceback. The request itself stays as it was."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from demo.agent import build as build_demo
from devstack.processes import free_port, start_api
from tests.agent_helpers import assert_eventually
from tests.api_helpers import api_env, worker_settings
from tests.conftest import REPO_ROOT, BusinessService, TemporalServer
from tests.drifted_workflow import DriftedAgentWorkflow
from toolloop._temporal.requests import UNREADABLE_REQUEST
from toolloop._temporal.worker_factory import running_worker, workflow_runner

pytestmark = pytest.mark.e2e

U1 = {"Authorization": "Bearer demo-token-u1-acme-0001"}


def assert_unreadable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert (body["code"], body["detail"]) == ("REQUEST_UNREADABLE", UNREADABLE_REQUEST)
    for leak in ("Traceback", "Nondeterminism", "TMPRL", 'File "', "/work/"):
        assert leak not in response.text


async def test_a_request_the_worker_cannot_replay_is_one_clear_problem_everywhere(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path: Path,
) -> None:
    task_queue = f"unreadable-{uuid.uuid4().hex[:8]}"
    env = api_env(temporal_server, task_queue)
    port = free_port()
    api = await asyncio.to_thread(start_api, REPO_ROOT, env, port, tmp_path / "api.log")
    request_id = f"k-{uuid.uuid4().hex[:12]}"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as http:
            # A refund waits for its approval, run by today's workflow code.
            settings = worker_settings(temporal_server, task_queue)
            async with running_worker(client, settings, build_demo(business_service.url)):
                question = {"question": "Refund 5 EUR on order A100 because it arrived late"}
                started = await http.post("/v1/requests", json=question, headers={**U1, "Idempotency-Key": request_id})
                assert started.status_code == 201, started.text
                workflow_id = started.json()["workflow_id"]
                waiting: list[dict[str, Any]] = []

                async def awaits_approval() -> bool:
                    view = (await http.get(f"/v1/requests/{request_id}", headers=U1)).json()
                    waiting[:] = [op for op in view.get("operations", []) if op["state"] == "awaiting_approval"]
                    return bool(waiting)

                await assert_eventually(awaits_approval, within=60, what="the refund waits for approval")
            operation = waiting[0]["operation_id"]

            # Now only a worker whose workflow code does not replay that history serves the queue.
            drifted = Worker(
                client, task_queue=task_queue, workflows=[DriftedAgentWorkflow], workflow_runner=workflow_runner()
            )
            async with drifted:
                path = f"/v1/requests/{request_id}"
                assert_unreadable(await http.get(f"{path}/events", headers=U1))
                assert_unreadable(await http.get(f"{path}/operations/{operation}", headers=U1))
                decision = {"decision": "approve", "digest": waiting[0]["digest"]}
                assert_unreadable(await http.post(f"{path}/operations/{operation}/decision", json=decision, headers=U1))

                cli_env = {
                    **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
                    **env,
                }
                approve = await asyncio.to_thread(
                    subprocess.run,
                    [
                        sys.executable,
                        "starter.py",
                        "approve",
                        workflow_id,
                        operation,
                        "--user",
                        "u1",
                        "--no-local-stack",
                    ],
                    env=cli_env,
                    cwd=REPO_ROOT,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
            assert approve.returncode == 1, approve.stderr
            assert approve.stderr.strip() == f"error: {UNREADABLE_REQUEST}", approve.stderr
            # Nothing was decided or sent: the request still waits, as it did.
            description = await client.get_workflow_handle(workflow_id).describe()
            assert description.status is not None and description.status.name == "RUNNING"
            await client.get_workflow_handle(workflow_id).terminate("test over")
    finally:
        api.stop()
