"""Test fixtures: the real Temporal dev server and the real business service as processes on free
loopback ports (once per session), a fresh task queue and in-process worker per test."""

from __future__ import annotations

import os
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from demo.agent import build as build_demo
from demo.bizservice.writes import AUDIENCE as DEMO_AUDIENCE
from devstack.processes import ManagedProcess, free_port, start_business_service, start_temporal_dev_server
from tests.redis_server import live_text_url, redis_server  # noqa: F401 - fixtures for every test module
from toolloop._core.approvals import ApprovalClaims, http_subject, mint_approval_token, payload_digest
from toolloop._temporal.converter import data_converter
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

REPO_ROOT = Path(__file__).resolve().parent.parent
# One approval key pair for every test: the tests act as the approval channel (private key); services and
# workflows get the public key. A constant, because this module is imported twice (as conftest by pytest
# and as tests.conftest by the test modules) and both must hold the same key. For tests only.
# Written out rather than derived at import, so importing the tests calls no code under test (mutation
# testing makes every such call fail on purpose); test_core_approvals checks that the pair belongs together.
APPROVAL_KEY = "FJFlXXTbPLQFyj5oPPLRjlHDRrP3kAZIYc6uBscc8Bo"
APPROVAL_VERIFY_KEY = "r-ZzUAK0jc8iWOev7UuHREQBCW3H65vrIjglJ0vuI10"
# Another channel's key pair: what it signs is a forgery to everyone holding APPROVAL_VERIFY_KEY.
OTHER_SIGNING_KEY = "RJS9Ueqxa--_EFVvavFy1UJHXRitc7AKnboFw6ADIb8"


SHARED_TEMPORAL_ENV = "TOOLLOOP_TEST_TEMPORAL_ADDRESS"

# The demo's write endpoints, by tool: an approval binds the method and path the service receives.
DEMO_WRITE_PATHS = {
    "append_ticket_note": ("/tickets/{}/notes", "ticketId"),
    "create_calendar_event": ("/calendars/{}/events", "calendarId"),
    "refund_order": ("/orders/{}/refunds", "orderId"),
}


def demo_subject(tool: str, body: Mapping[str, Any]) -> str:
    """What the demo service digests besides the body: "POST /tickets/T1001/notes" for a note."""
    if tool not in DEMO_WRITE_PATHS:
        return tool
    template, field = DEMO_WRITE_PATHS[tool]
    return http_subject("POST", template.format(body.get(field, "X")))


def approval_token(
    operation_id: str,
    tool: str,
    body: Mapping[str, Any],
    *,
    user: str = "u1",
    tenant: str = "acme",
    expires_in: float = 300.0,
    key: str = APPROVAL_KEY,
    decision: Literal["approve", "reject"] = "approve",
    decide_by: float | None = None,
    audience: str = DEMO_AUDIENCE,
    request: str | None = None,
) -> str:
    """A decision token made by hand (the channel's job), for exactly `tool` (a demo write's name stands for its
    method and path) and `body` unless told otherwise. `decide_by`: the approval window's end, in seconds from
    now (None: the token names no window). `request`: the request it is given in, run_binding(workflow id,
    first run id) (None: a token for a service alone, which a workflow refuses)."""
    now = time.time()
    claims = ApprovalClaims(
        audience=audience,
        user_id=user,
        tenant_id=tenant,
        operation_id=operation_id,
        digest=payload_digest(demo_subject(tool, body), body),
        approved_by=user,
        approved_at=now,
        expires_at=now + expires_in,
        decision=decision,
        decide_by=None if decide_by is None else now + decide_by,
        request=request,
    )
    return mint_approval_token(key, claims)


@dataclass(frozen=True)
class TemporalServer:
    address: str
    process: ManagedProcess | None


@dataclass(frozen=True)
class BusinessService:
    url: str
    admin_token: str
    approval_key: str
    db_file: Path
    process: ManagedProcess


def start_service(directory: Path, retention_seconds: float | None = None) -> BusinessService:
    port = free_port()
    token = secrets.token_urlsafe(16)
    db_file = directory / "service.sqlite"
    proc = start_business_service(
        db_file,
        port,
        token,
        approval_verify_key=APPROVAL_VERIFY_KEY,
        retention_seconds=retention_seconds,
        cwd=REPO_ROOT,
    )
    return BusinessService(
        url=f"http://127.0.0.1:{port}", admin_token=token, approval_key=APPROVAL_KEY, db_file=db_file, process=proc
    )


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def temporal_server(stack_dir: Path) -> Iterator[TemporalServer]:
    # A dev server someone else runs (the mutation-testing command shares one across its many test runs).
    shared = os.environ.get(SHARED_TEMPORAL_ENV)
    if shared:
        yield TemporalServer(address=shared, process=None)
        return
    port = free_port()
    proc = start_temporal_dev_server(stack_dir / "temporal", port, ui_port=None)
    yield TemporalServer(address=f"127.0.0.1:{port}", process=proc)
    proc.stop()


@pytest.fixture(scope="session")
def business_service(stack_dir: Path) -> Iterator[BusinessService]:
    service = start_service(stack_dir / "service")
    yield service
    service.process.stop()


@pytest.fixture(scope="session")
async def client(temporal_server: TemporalServer) -> Client:
    return await Client.connect(temporal_server.address, data_converter=data_converter())


@pytest.fixture
def settings(temporal_server: TemporalServer, business_service: BusinessService) -> Settings:
    """Per-test settings: a fresh task queue so no other test's worker takes this test's tasks."""
    return Settings.model_validate(
        {
            "TEMPORAL_ADDRESS": temporal_server.address,
            "TOOLLOOP_TASK_QUEUE": f"test-{uuid.uuid4().hex[:10]}",
            "TOOLLOOP_SERVICE_URL": business_service.url,
            "TOOLLOOP_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY,
            # A worker for tests: its requests are scripted.
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
        }
    )


@pytest.fixture
async def admin(business_service: BusinessService) -> AsyncIterator[httpx.AsyncClient]:
    """The service's admin API (faults, request log), reset before each test."""
    async with httpx.AsyncClient(
        base_url=business_service.url, headers={"X-Admin-Token": business_service.admin_token}, timeout=10
    ) as http:
        (await http.post("/admin/reset")).raise_for_status()
        yield http
        (await http.delete("/admin/faults")).raise_for_status()


@pytest.fixture
async def worker(client: Client, settings: Settings) -> AsyncIterator[Worker]:
    async with running_worker(client, settings, build_demo(settings.service_url)) as w:
        yield w


# --- Process exit -----------------------------------------------------------------------------------
# temporalio 1.35 on CPython 3.11 can abort at interpreter teardown after a worker stopped
# ("Fatal Python error: PyGILState_Release"), which would turn a green run into a crash exit code.
# Every fixture has finished by the time pytest unconfigures, so we leave with pytest's own status.

_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status and os.environ.get("TOOLLOOP_NO_HARD_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
