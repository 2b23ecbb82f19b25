"""Tests (real processes): the local stack's process helpers, the Temporal dev server and LocalStack's guards."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import stat
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus

from devstack import (
    LocalStack,
    ManagedProcess,
    ProcessStartError,
    StackError,
    free_port,
    port_in_use,
    start_temporal_dev_server,
    temporal_dev_server_command,
    wait_for_log_line,
    wait_for_port,
)
from devstack.processes import log_tail, pid_alive
from toolloop._temporal.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _settings(data_dir: Path, **ports: int) -> Settings:
    temporal_port = ports.get("temporal", free_port())
    return Settings(
        TEMPORAL_ADDRESS=f"127.0.0.1:{temporal_port}",
        TOOLLOOP_DATA_DIR=data_dir,
        TOOLLOOP_TEMPORAL_PORT=temporal_port,
        TOOLLOOP_UI_PORT=ports.get("ui", free_port()),
        TOOLLOOP_SERVICE_PORT=ports.get("service", free_port()),
        TOOLLOOP_API_PORT=ports.get("api", free_port()),
        TOOLLOOP_TASK_QUEUE=f"tq-{uuid.uuid4().hex[:8]}",
    )


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port held by a plain listening socket: "another program"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# --- ManagedProcess -------------------------------------------------------------------------------


def test_stop_terminates_process_and_reaps_it(tmp_path: Path) -> None:
    proc = ManagedProcess.spawn("sleeper", SLEEPER, tmp_path / "sleeper.log")
    assert proc.alive()
    proc.stop(timeout=5)
    assert not proc.alive()
    assert proc.popen is not None and proc.popen.returncode == -15
    assert not pid_alive(proc.pid)


def test_kill9_kills_process(tmp_path: Path) -> None:
    proc = ManagedProcess.spawn("sleeper", SLEEPER, tmp_path / "sleeper.log")
    proc.kill9()
    assert proc.popen is not None and proc.popen.returncode == -9


def test_stop_by_recorded_pid_stops_detached_process(tmp_path: Path) -> None:
    started = ManagedProcess.spawn("sleeper", SLEEPER, tmp_path / "sleeper.log", detached=True)
    # What a later CLI invocation has: only the PID from state.json, no Popen.
    found = ManagedProcess(name="sleeper", pid=started.pid, popen=None, log_path=started.log_path)
    assert found.alive()
    found.stop(timeout=5)
    assert not found.alive()
    assert not started.alive()


def test_wait_fails_fast_with_log_tail_when_process_exits(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "print('boom: bad config', flush=True); raise SystemExit(3)"]
    proc = ManagedProcess.spawn("crasher", cmd, tmp_path / "crasher.log")
    with pytest.raises(ProcessStartError, match="boom: bad config"):
        wait_for_port(free_port(), timeout=20, proc=proc)


def test_wait_for_log_line_ignores_earlier_runs(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("worker ready (from an earlier run)\n")
    cmd = [sys.executable, "-c", "import time; time.sleep(0.3); print('worker ready', flush=True); time.sleep(60)"]
    proc = ManagedProcess.spawn("worker", cmd, log)
    try:
        assert proc.log_offset > 0
        wait_for_log_line(log, "worker ready", timeout=10, proc=proc, start_offset=proc.log_offset)
        assert log.read_text().count("worker ready") == 2
    finally:
        proc.stop()


def test_port_in_use_detects_listener(listening_port: int) -> None:
    assert port_in_use(listening_port)
    assert not port_in_use(free_port())


def test_free_port_is_held_back_from_other_picks_but_binds_by_number() -> None:
    """A CI run lost its chaos stack when the dev server's own pick of an internal port was a port picked here and
    bound by another test first. A picked port is now held in TIME_WAIT: another program's bind without
    SO_REUSEADDR (which is how the OS decides what port 0 may get) is refused, while a server binding it by number
    with SO_REUSEADDR, as uvicorn, Go and PostgreSQL do, gets it."""
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        with pytest.raises(OSError) as refused:
            other.bind(("127.0.0.1", port))
        assert refused.value.errno == errno.EADDRINUSE
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        assert port_in_use(port)


def test_log_tail_keeps_the_cause_of_a_panic_whose_stack_outgrows_it(tmp_path: Path) -> None:
    """The dev server logs an error, then panics with a long Go stack: the tail alone showed only the stack."""
    log = tmp_path / "temporal.log"
    error = 'time=2026-12-04 level=ERROR msg="Failed to start ringpop listener" error="bind: address already in use"'
    stack = [f"\t/go/pkg/mod/example.go:{n} +0x{n:x}" for n in range(200)]
    log.write_text("\n".join(["time=2026-12-04 level=WARN msg=ignored", error, "panic: nil pointer", *stack]) + "\n")
    shown = log_tail(log).splitlines()
    assert shown[:3] == [error, "panic: nil pointer", "..."]
    assert shown[3:] == stack[-40:]
    assert log_tail(tmp_path / "missing.log") == "(no log)"


# --- Temporal dev server --------------------------------------------------------------------------


async def test_dev_server_keeps_workflows_across_restart(tmp_path: Path) -> None:
    port = free_port()
    server = await asyncio.to_thread(start_temporal_dev_server, tmp_path, port, None)
    workflow_id = f"persist-{uuid.uuid4()}"
    try:
        client = await Client.connect(f"127.0.0.1:{port}")
        # No worker polls this queue, so the run stays open and must survive the restart.
        await client.start_workflow("NoSuchWorkflow", id=workflow_id, task_queue=f"tq-{uuid.uuid4()}")
        attrs = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace="default"))
        assert attrs.custom_attributes["ToolloopUser"] == IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    finally:
        await asyncio.to_thread(server.stop)
    assert not pid_alive(server.pid)
    assert (tmp_path / "temporal.sqlite").stat().st_size > 0

    server = await asyncio.to_thread(start_temporal_dev_server, tmp_path, port, None)
    try:
        client = await Client.connect(f"127.0.0.1:{port}")
        description = await client.get_workflow_handle(workflow_id).describe()
        assert description.status == WorkflowExecutionStatus.RUNNING
        listed = [wf.id async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
        assert listed == [workflow_id]
        await client.get_workflow_handle(workflow_id).terminate("test done")
    finally:
        await asyncio.to_thread(server.stop)


def test_dev_server_reads_its_one_shards_tasks_without_the_default_throttle(tmp_path: Path) -> None:
    """The dev server has one history shard: at the default 20 reads a second its transfer tasks waited up to
    50 ms a step (the benchmark measures it). Every stack devstack starts raises it: the local stack's, the
    tests' and the benchmark's (they all build the command here)."""
    cmd = temporal_dev_server_command(tmp_path / "t.sqlite", free_port(), None)
    settings = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--dynamic-config-value"]
    assert settings == ["history.transferProcessorMaxPollRPS=1000"]


# --- LocalStack guards ----------------------------------------------------------------------------


@pytest.mark.parametrize(("component", "env_var"), [("temporal", "TOOLLOOP_TEMPORAL_PORT"), ("ui", "TOOLLOOP_UI_PORT")])
def test_up_refuses_port_held_by_another_program(
    tmp_path: Path, listening_port: int, component: str, env_var: str
) -> None:
    stack = LocalStack(_settings(tmp_path / "data", **{component: listening_port}), REPO_ROOT)
    with pytest.raises(StackError, match=rf"port {listening_port} .*in use by another program.*{env_var}"):
        stack.up()
    assert not any(c.running for c in stack.status().components)


def test_admin_token_is_generated_once_and_private(tmp_path: Path) -> None:
    stack = LocalStack(_settings(tmp_path / "data"), REPO_ROOT)
    token = stack.admin_token()
    assert len(token) >= 32
    assert LocalStack(_settings(tmp_path / "data"), REPO_ROOT).admin_token() == token
    assert stat.S_IMODE(stack.state_path.stat().st_mode) == 0o600


def test_recycled_pid_is_never_treated_as_ours(tmp_path: Path) -> None:
    stranger = ManagedProcess.spawn("stranger", SLEEPER, tmp_path / "stranger.log")
    try:
        stack = LocalStack(_settings(tmp_path / "data"), REPO_ROOT)
        stack.admin_token()  # creates state.json
        state = json.loads(stack.state_path.read_text())
        # The recorded PID is alive but now runs a different command line.
        state["components"]["worker"] = {
            "pid": stranger.pid,
            "cmd": [sys.executable, str(REPO_ROOT / "worker.py")],
            "log_path": str(tmp_path / "worker.log"),
            "address": "task queue 'x'",
        }
        stack.state_path.write_text(json.dumps(state))
        assert not stack.status().worker.running
        assert stack.status().worker.recorded_pid == stranger.pid
        report = stack.down()
        assert stranger.alive()
        # Not ours: down says the recorded process is gone, and stops nothing.
        assert [(c.name, c.outcome) for c in report.components if c.outcome != "none recorded"] == [
            ("worker", "exited")
        ]
        assert report.stopped == ()
    finally:
        stranger.stop()


def test_down_where_nothing_was_started_stops_nothing_and_creates_nothing(tmp_path: Path, listening_port: int) -> None:
    stack = LocalStack(_settings(tmp_path / "data", service=listening_port), REPO_ROOT)
    report = stack.down()
    assert [c.outcome for c in report.components] == ["none recorded"] * 4 and report.stopped == ()
    assert not (tmp_path / "data").exists()
    # What it can say about a stack of other settings: which of its ports another program holds.
    assert stack.ports_held() == [f"{listening_port} (business service, TOOLLOOP_SERVICE_PORT)"]


# --- LocalStack up / reuse / down (real Temporal; stand-ins for the service and worker) -----------

FAKE_SERVICE = """
import argparse, http.server, json
parser = argparse.ArgumentParser()
for flag in ("--db", "--host", "--port", "--admin-token"):
    parser.add_argument(flag)
args = parser.parse_args()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"ok": self.path == "/healthz"}).encode()
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer((args.host, int(args.port)), Handler).serve_forever()
"""

FAKE_API = """
import argparse, http.server, json, sys
parser = argparse.ArgumentParser()
parser.add_argument("command")
parser.add_argument("--port", type=int)
args = parser.parse_args()
assert args.command == "serve"

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"ok": self.path == "/healthz"}).encode())

http.server.HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
"""

FAKE_WORKER = """
import os, time
print("worker ready", os.environ["TEMPORAL_ADDRESS"], os.environ["TOOLLOOP_SERVICE_URL"], flush=True)
time.sleep(600)
"""


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """A repo root whose `python -m demo.bizservice` and `worker.py` honour the real contracts."""
    root = tmp_path / "repo"
    (root / "demo" / "bizservice").mkdir(parents=True)
    (root / "demo" / "__init__.py").write_text("")
    (root / "demo" / "bizservice" / "__init__.py").write_text("")
    (root / "demo" / "bizservice" / "__main__.py").write_text(FAKE_SERVICE)
    (root / "worker.py").write_text(FAKE_WORKER)
    (root / "starter.py").write_text(FAKE_API)
    return root


async def test_up_reuses_running_stack_and_down_stops_it(tmp_path: Path, fake_repo: Path) -> None:
    settings = _settings(tmp_path / "data")
    stack = LocalStack(settings, fake_repo)
    steps: list[str] = []
    try:
        first = await asyncio.to_thread(stack.up, steps.append)
        assert first.all_running and all(c.healthy for c in first.components)
        assert any(s.startswith("starting Temporal dev server") for s in steps)
        worker_log = first.worker.log_path.read_text()
        assert f"127.0.0.1:{settings.temporal_port} http://127.0.0.1:{settings.service_port}" in worker_log

        # A crashed worker is replaced; the healthy server and service are reused as they are.
        assert first.worker.pid is not None
        ManagedProcess(name="worker", pid=first.worker.pid, popen=None, log_path=first.worker.log_path).kill9()
        steps.clear()
        second = await asyncio.to_thread(stack.up, steps.append)
        assert (second.temporal.pid, second.service.pid) == (first.temporal.pid, first.service.pid)
        assert second.worker.pid != first.worker.pid
        assert steps[:2] == [
            f"reusing Temporal dev server (pid {first.temporal.pid})",
            f"reusing business service (pid {first.service.pid})",
        ]
    finally:
        down = await asyncio.to_thread(stack.down)
    assert [(c.name, c.outcome, c.pid) for c in down.components] == [
        (c.name, "stopped", c.pid) for c in second.components
    ]
    for component in second.components:
        assert component.pid is not None and not pid_alive(component.pid)
    assert (stack.data_dir / "temporal.sqlite").exists()


def test_the_local_stacks_api_knows_its_workers_tools(tmp_path: Path) -> None:
    # So an unknown tool in a request's "tools" is refused by the local API too (TOOLLOOP_API_TOOLS).
    from devstack.stack import demo_tool_names

    stack = LocalStack(_settings(tmp_path / "data"), REPO_ROOT)
    named = stack._api_env(stack.secrets())["TOOLLOOP_API_TOOLS"].split(",")
    assert named == demo_tool_names() and {"get_order_status", "refund_order"} <= set(named)
