"""Test helpers: the HTTP API process (`starter.py serve`) with a worker of its own, on a task queue of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from demo.agent import build as build_demo
from devstack.processes import ManagedProcess, free_port, start_api
from tests.agent_helpers import assert_eventually
from tests.conftest import APPROVAL_KEY, REPO_ROOT, BusinessService, TemporalServer
from toolloop._core.approvals import verify_key_for
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

# The demo's tokens (config/api_tokens.json) as request headers: u1 and u2 of acme, u1 of globex.
U1 = {"Authorization": "Bearer demo-token-u1-acme-0001"}
U2 = {"Authorization": "Bearer demo-token-u2-acme-0002"}
U1_GLOBEX = {"Authorization": "Bearer demo-token-u1-globex-0004"}


@dataclass(frozen=True)
class Api:
    url: str
    task_queue: str
    process: ManagedProcess


def demo_tool_names() -> str:
    """The names of the tools the tests' workers serve (the demo's), as TOOLLOOP_API_TOOLS gives them."""
    return ",".join(sorted(build_demo("http://127.0.0.1:1").tools.registry.names()))


# Room for the load the tests put on one caller (hundreds of requests and streams): the limits are tested
# with tight values of their own (tests/test_api_limits_e2e.py).
ROOMY_LIMITS = {
    "TOOLLOOP_API_CREATE_RATE": "100000/minute",
    "TOOLLOOP_API_MAX_ACTIVE_REQUESTS": "100000",
    "TOOLLOOP_API_MAX_STREAMS_PER_CALLER": "100000",
    "TOOLLOOP_API_MAX_STREAMS": "100000",
}


def api_env(temporal_server: TemporalServer, task_queue: str, **overrides: str) -> dict[str, str]:
    """What `starter.py serve` is given: the approval channel's key, the demo's tokens and tool names, the
    test workers' models (the offline one by default), and limits with room for load tests (unless
    `overrides` says otherwise)."""
    return {
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_TASK_QUEUE": task_queue,
        "TOOLLOOP_APPROVAL_KEY": APPROVAL_KEY,
        "TOOLLOOP_API_TOKENS": str(REPO_ROOT / "config" / "api_tokens.json"),
        "TOOLLOOP_API_ALLOW_DEMO_TOKENS": "true",
        "TOOLLOOP_API_MODEL": "offline",
        "TOOLLOOP_API_TOOLS": demo_tool_names(),
        "TOOLLOOP_API_MODELS": "offline,script",
        **ROOMY_LIMITS,
        **overrides,
    }


def worker_settings(temporal_server: TemporalServer, task_queue: str, **overrides: Any) -> Settings:
    """A worker's for the same queue, trusting the channel's public key (and `overrides`, by variable)."""
    return Settings.model_validate(
        {
            "TEMPORAL_ADDRESS": temporal_server.address,
            "TOOLLOOP_TASK_QUEUE": task_queue,
            "TOOLLOOP_APPROVAL_VERIFY_KEY": verify_key_for(APPROVAL_KEY),
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
            **overrides,
        }
    )


@dataclass(frozen=True)
class OwnUser:
    """A user of tenant acme that only one test knows (users_of_their_own)."""

    user_id: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def users_of_their_own(folder: Path, *names: str, roles: Sequence[str] = ()) -> tuple[Path, list[OwnUser]]:
    """A tokens file for new users of tenant acme (one per name, with a fresh suffix, each with `roles`): the
    session's other tests leave the demo users' requests running, waiting for approvals nobody gives."""
    ids = [f"{name}-{uuid.uuid4().hex[:8]}" for name in names]
    users = [OwnUser(user_id, f"token-of-{user_id}") for user_id in ids]
    entries = [{"token": u.token, "tenant_id": "acme", "user_id": u.user_id, "roles": list(roles)} for u in users]
    tokens_file = folder / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": entries}))
    return tokens_file, users


@contextlib.asynccontextmanager
async def running_api(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
    env: Mapping[str, str] | None = None,
    worker_env: Mapping[str, Any] | None = None,
    **worker_options: Any,
) -> AsyncIterator[Api]:
    """The API process with the demo's tokens and the offline model (and `env` laid over `api_env`), and a worker
    with the demo's tools (and `worker_env` laid over `worker_settings`)."""
    task_queue = f"api-{uuid.uuid4().hex[:8]}"
    port = free_port()
    log = Path(tmp_path_factory.mktemp("api")) / "api.log"
    api_environment = api_env(temporal_server, task_queue, **(env or {}))
    process = await asyncio.to_thread(start_api, REPO_ROOT, api_environment, port, log)
    try:
        settings = worker_settings(temporal_server, task_queue, **(worker_env or {}))
        async with running_worker(client, settings, build_demo(business_service.url), **worker_options):
            yield Api(url=f"http://127.0.0.1:{port}", task_queue=task_queue, process=process)
    finally:
        process.stop()


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is one problem+json with this status and code, and shows nothing of the server's insides."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert (body["status"], body["code"]) == (status, code)
    for leak in ("Traceback", 'File "', "/work/", "sqlite"):
        assert leak not in response.text
    return body


async def pending_operation(http: httpx.AsyncClient, request_id: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The request's first operation waiting for approval, as the API shows it, once there is one."""
    found: list[dict[str, Any]] = []

    async def waiting() -> bool:
        view = (await http.get(f"/v1/requests/{request_id}", headers=headers)).json()
        found[:] = [op for op in view.get("operations", []) if op["state"] == "awaiting_approval"]
        return bool(found)

    await assert_eventually(waiting, within=60, what=f"request {request_id} waits for approval")
    return found[0]
