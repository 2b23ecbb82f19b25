"""I/O: the benchmark's processes - one Temporal dev server (SQLite with the WAL pragmas), one business service
with a fixed latency on every business call, toolloop's worker (a) and the floor's worker (b), each its own
process so each one's CPU and memory can be measured - and the service's admin calls (faults, effects)."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devstack.processes import (
    DEV_SERVER_DYNAMIC_CONFIG,
    WORKER_READY_LINE,
    ManagedProcess,
    free_port,
    start_business_service,
    start_temporal_dev_server,
    start_worker,
    wait_for_log_line,
)
from toolloop._core.approvals import generate_signing_key, verify_key_for

REPO_ROOT = Path(__file__).resolve().parent.parent
OURS_TOOLS = "bench.agent:build"
LATENCY_MS = 50
# The business paths (not /admin, /healthz or /me): every read, write, read-back and status query.
BUSINESS_PATHS = r"^/(orders|calendars|tickets)(/|$)"
WRITE_PATH = r"^/calendars/[^/]+/events$"


def latency_rule(ms: int = LATENCY_MS) -> dict[str, Any]:
    return {"method": "*", "path_regex": BUSINESS_PATHS, "latency_ms": ms}


def slow_write_rule(ms: int) -> dict[str, Any]:
    """The next write's POST waits `ms` before it is handled (the first matching rule applies, alone)."""
    return {"method": "POST", "path_regex": WRITE_PATH, "latency_ms": ms, "times": 1}


@dataclass
class BenchStack:
    root: Path
    temporal: ManagedProcess
    temporal_address: str
    service: ManagedProcess
    service_url: str
    admin_token: str
    # The approval channel's key pair: the benchmark's clients sign; the service and (a)'s input verify.
    signing_key: str
    verify_key: str
    ours_queue: str
    floor_queue: str
    ours_worker: ManagedProcess | None = None
    floor_worker: ManagedProcess | None = None

    @classmethod
    def start(cls, root: Path, dev_server_config: Sequence[str] = DEV_SERVER_DYNAMIC_CONFIG) -> BenchStack:
        """Start everything on free loopback ports under `root`; whatever started is stopped if a later
        part fails. `dev_server_config`: the dev server's dynamic config values (devstack's by default)."""
        with contextlib.ExitStack() as undo:
            port = free_port()
            temporal = start_temporal_dev_server(
                root / "temporal", port, ui_port=None, dynamic_config=dev_server_config
            )
            undo.callback(temporal.stop)
            signing_key = generate_signing_key()
            admin_token = secrets.token_urlsafe(16)
            service_port = free_port()
            service = start_business_service(
                root / "service" / "service.sqlite",
                service_port,
                admin_token,
                approval_verify_key=verify_key_for(signing_key),
                cwd=REPO_ROOT,
            )
            undo.callback(service.stop)
            tag = uuid.uuid4().hex[:8]
            stack = cls(
                root=root,
                temporal=temporal,
                temporal_address=f"127.0.0.1:{port}",
                service=service,
                service_url=f"http://127.0.0.1:{service_port}",
                admin_token=admin_token,
                signing_key=signing_key,
                verify_key=verify_key_for(signing_key),
                ours_queue=f"bench-ours-{tag}",
                floor_queue=f"bench-floor-{tag}",
            )
            stack.ours_worker = stack.start_ours_worker()
            undo.callback(stack.ours_worker.stop)
            stack.floor_worker = stack.start_floor_worker()
            undo.pop_all()
            return stack

    def _worker_env(self, queue: str) -> dict[str, str]:
        return {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TOOLLOOP_TASK_QUEUE": queue,
            "TOOLLOOP_SERVICE_URL": self.service_url,
            "TOOLLOOP_APPROVAL_VERIFY_KEY": self.verify_key,
            # The benchmark's model is canned (bench.agent.BenchModel).
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
        }

    def start_ours_worker(self) -> ManagedProcess:
        """`python worker.py --tools bench.agent:build`, exactly as a deployment runs toolloop's worker."""
        log = self.root / "logs" / "worker-ours.log"
        proc = start_worker(REPO_ROOT, self._worker_env(self.ours_queue), log, tools=OURS_TOOLS)
        self.ours_worker = proc
        return proc

    def start_floor_worker(self) -> ManagedProcess:
        proc = spawn_floor_worker(self._worker_env(self.floor_queue), self.root / "logs" / "worker-floor.log")
        self.floor_worker = proc
        return proc

    def stop(self) -> None:
        for proc in (self.ours_worker, self.floor_worker, self.service, self.temporal):
            if proc is not None:
                proc.stop()

    def admin(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.service_url, headers={"X-Admin-Token": self.admin_token}, timeout=30, trust_env=False
        )


def spawn_floor_worker(env: dict[str, str], log: Path) -> ManagedProcess:
    """`python -m bench.floor_worker` with `env` over this process's environment, once it is ready."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    proc = ManagedProcess.spawn(
        "floor-worker", [sys.executable, "-m", "bench.floor_worker"], log, env=full_env, cwd=REPO_ROOT
    )
    try:
        wait_for_log_line(log, WORKER_READY_LINE, 60.0, proc, start_offset=proc.log_offset)
    except BaseException:
        proc.stop(timeout=5.0)
        raise
    return proc


async def reset_service(admin: httpx.AsyncClient, *first_rules: dict[str, Any]) -> None:
    """Clear the request log and the faults, then the latency on every business call (after `first_rules`,
    which win where they match)."""
    (await admin.post("/admin/reset")).raise_for_status()
    rules = [*first_rules, latency_rule()]
    (await admin.put("/admin/faults", json={"rules": rules})).raise_for_status()


async def effects(admin: httpx.AsyncClient, operation_id: str) -> int:
    """How many effects the service holds for one operation id (its own tables, not the ledger)."""
    response = await admin.get("/admin/effects", params={"operation_id": operation_id})
    response.raise_for_status()
    return len(response.json()["effects"])


async def write_in_flight(admin: httpx.AsyncClient, path: str) -> bool:
    """True once a POST to `path` has arrived at the service and not been answered."""
    response = await admin.get("/admin/requests", params={"path_prefix": path})
    response.raise_for_status()
    return any(r["method"] == "POST" and r["ended_at"] is None for r in response.json()["requests"])
