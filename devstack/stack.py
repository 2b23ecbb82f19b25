"""I/O: the CLI's local stack (Temporal dev server, business service, worker) - start or reuse, stop, report."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, Field, ValidationError

from toolloop._api.tokens import TokenMap, TokensFileError
from toolloop._core.approvals import generate_signing_key, verify_key_for
from toolloop._core.contracts import Actor
from toolloop._temporal.settings import Settings

from .processes import (
    DEMO_TOOLS,
    ManagedProcess,
    ProcessStartError,
    StackError,
    api_command,
    business_service_command,
    cmdline_matches,
    http_ok,
    pid_alive,
    policy_worker_command,
    port_accepts,
    port_in_use,
    run_coroutine_blocking,
    start_api,
    start_business_service,
    start_policy_worker,
    start_temporal_dev_server,
    start_worker,
    temporal_dev_server_command,
    temporal_ready,
    worker_command,
)

ComponentName = Literal["temporal", "service", "policy", "worker", "api"]
# The policy worker runs only in a stack started with `up --policy` (StackState.policy).
_START_ORDER: tuple[ComponentName, ...] = ("temporal", "service", "policy", "worker", "api")
_LABELS: dict[ComponentName, str] = {
    "temporal": "Temporal dev server",
    "service": "business service",
    "policy": "policy worker",
    "worker": "worker",
    "api": "HTTP API",
}
# The demo's approval policy (README, "Approval policies"), relative to the repository.
DEMO_POLICY_FILE = Path("config/policies/demo.cedar")
DEMO_POLICY_SCHEMA = Path("config/policies/demo.cedarschema")
DEFAULT_POLICY_TASK_QUEUE = "toolloop-policy"
_LOCK_TIMEOUT = 120.0  # another `up` may legitimately take a while on a cold start


class _ComponentRecord(BaseModel):
    pid: int
    cmd: list[str]
    log_path: str
    address: str
    # Digest of the settings a component was started with that are not visible in its argv (worker env).
    config_digest: str = ""
    started_at: float = 0.0


class _StateFile(BaseModel):
    admin_token: str | None = None
    approval_key: str | None = None
    # The approval policy's signing key (only the policy worker gets it), generated once like the approval key.
    policy_key: str | None = None
    # Whether this stack decides writes by the demo policy: set by `up --policy` / `up --no-policy`, kept until
    # changed (so `ask`, which reuses the stack, keeps it).
    policy: bool = False
    components: dict[str, _ComponentRecord] = Field(default_factory=dict)


def demo_tool_names() -> list[str]:
    """The tools the local stack's worker serves (the demo's), sorted."""
    # Here, not at the top: loading the demo's tools imports the demo, which only the stack needs.
    from toolloop._temporal.worker_factory import load_tools

    return sorted(load_tools(DEMO_TOOLS).tools.registry.names())


def demo_model_names(openai: bool, named: Iterable[str] = ()) -> list[str]:
    """The models the local stack's worker serves: the script model, the demo's own (the offline model), the
    `openai` model when it has an OpenAI key, and the named models of its TOOLLOOP_MODELS; sorted."""
    from toolloop._temporal.worker_factory import load_tools

    return sorted({"script", *load_tools(DEMO_TOOLS).models, *(["openai"] if openai else []), *named})


def _named_models_json(settings: Settings) -> str:
    table = {name: config.model_dump(exclude_defaults=True) for name, config in settings.named_models.items()}
    return json.dumps(table, sort_keys=True)


@dataclass(frozen=True)
class StackSecrets:
    """Generated once per data dir. The approval key is the approval channel's private key (the CLI signs
    decisions with it); the service and the workflows get only its public half, the worker nothing."""

    admin_token: str
    approval_key: str
    # The policy's signing key: the policy worker's alone; the service gets its public half.
    policy_key: str = ""

    @property
    def approval_verify_key(self) -> str:
        return verify_key_for(self.approval_key)

    @property
    def policy_verify_key(self) -> str:
        return verify_key_for(self.policy_key)


@dataclass(frozen=True)
class ComponentStatus:
    name: ComponentName
    label: str
    running: bool
    healthy: bool
    pid: int | None
    address: str
    log_path: Path
    # The pid this data dir's state records for it (None: nothing recorded); `running` says whether it is
    # still that process.
    recorded_pid: int | None = None


@dataclass(frozen=True)
class ComponentStop:
    """What `down` did about one component: stopped its recorded process, found that process gone already,
    or found nothing recorded for it in this data dir."""

    name: ComponentName
    label: str
    outcome: Literal["stopped", "exited", "none recorded"]
    pid: int | None
    address: str


@dataclass(frozen=True)
class DownReport:
    data_dir: Path
    components: tuple[ComponentStop, ...]

    @property
    def stopped(self) -> tuple[ComponentStop, ...]:
        return tuple(c for c in self.components if c.outcome == "stopped")


@dataclass(frozen=True)
class StackStatus:
    temporal: ComponentStatus
    service: ComponentStatus
    worker: ComponentStatus
    api: ComponentStatus
    ui_url: str
    data_dir: Path
    # The components the `up` call that produced this status started (the others were reused).
    started: tuple[ComponentName, ...] = ()
    # The policy worker: None for a stack without policies that records none.
    policy: ComponentStatus | None = None
    # Whether the stack decides writes by the demo policy (`up --policy`), and that policy's file.
    policy_on: bool = False
    policy_file: Path | None = None

    @property
    def components(self) -> tuple[ComponentStatus, ...]:
        policy = (self.policy,) if self.policy is not None else ()
        return (self.temporal, self.service, *policy, self.worker, self.api)

    @property
    def all_running(self) -> bool:
        return all(c.running for c in self.components)


class LocalStack:
    """Starts, reuses and stops our three processes; state lives in settings.data_dir (relative to repo_root)."""

    def __init__(self, settings: Settings, repo_root: Path) -> None:
        self._settings = settings
        self._repo_root = repo_root.resolve()
        data_dir = settings.data_dir if settings.data_dir.is_absolute() else self._repo_root / settings.data_dir
        self.data_dir = data_dir.resolve()
        self.logs_dir = self.data_dir / "logs"
        self.state_path = self.data_dir / "state.json"
        self._lock_path = self.data_dir / "stack.lock"

    # -- the demo's users -------------------------------------------------------------------------

    def check_user(self, actor: Actor) -> None:
        """The session's user must exist: the demo's users live in its business service (GET /me)."""
        try:
            response = httpx.get(
                f"{self.service_url}/me",
                headers={"X-Actor-User": actor.user_id, "X-Actor-Tenant": actor.tenant_id},
                timeout=5.0,
                trust_env=False,
            )
        except httpx.HTTPError:
            raise StackError(
                f"cannot check the user: the business service at {self.service_url} does not answer"
            ) from None
        if response.status_code in (401, 403):
            raise StackError(f"unknown user {actor.user_id!r} in tenant {actor.tenant_id!r}")
        if response.status_code != 200:
            raise StackError(f"cannot check the user: the business service answered HTTP {response.status_code}")

    def roles_of(self, actor: Actor) -> frozenset[str]:
        """The session's roles in its tenant, as the stack's API tokens file gives them (TOOLLOOP_API_TOKENS,
        config/api_tokens.json): the roles of that file's entries for this tenant and user, as the API gives
        them to the holder of any of those tokens. Never from the command line."""
        s = self._settings
        path = s.api_tokens if s.api_tokens.is_absolute() else self._repo_root / s.api_tokens
        try:
            tokens = TokenMap.load(path)
        except TokensFileError as exc:
            raise StackError(str(exc)) from None
        return frozenset(role for grant in tokens.grants() if grant.actor == actor for role in grant.roles)

    # -- addresses ------------------------------------------------------------------------------

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self._settings.temporal_port}"

    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self._settings.service_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self._settings.ui_port}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self._settings.api_port}"

    def _address(self, name: ComponentName) -> str:
        if name == "temporal":
            return self.temporal_address
        if name == "service":
            return self.service_url
        if name == "api":
            return self.api_url
        if name == "policy":
            return f"task queue {self.policy_task_queue!r}"
        return f"task queue {self._settings.task_queue!r}"

    @property
    def policy_task_queue(self) -> str:
        return self._settings.policy_task_queue or DEFAULT_POLICY_TASK_QUEUE

    @property
    def policy_file(self) -> Path:
        return self._repo_root / DEMO_POLICY_FILE

    @property
    def policy_schema(self) -> Path:
        return self._repo_root / DEMO_POLICY_SCHEMA

    def _log_path(self, name: ComponentName) -> Path:
        return self.logs_dir / f"{name}.log"

    # -- public operations ----------------------------------------------------------------------

    def admin_token(self) -> str:
        """The service admin token: TOOLLOOP_SERVICE_ADMIN_TOKEN if set, else one generated once and kept."""
        return self.secrets().admin_token

    def approval_key(self) -> str:
        """The approval signing key: TOOLLOOP_APPROVAL_KEY if set, else one generated once and kept."""
        return self.secrets().approval_key

    def secrets(self) -> StackSecrets:
        with self._locked():
            state = self._load()
            creds = self._ensure_token(state)
            self._save(state)
            return creds

    def up(self, on_step: Callable[[str], None] | None = None, *, policy: bool | None = None) -> StackStatus:
        """Reuse each healthy component we started before; start the missing ones (detached). If one
        cannot start, the ones this call started are stopped again: a failed `up` leaves nothing behind.
        `policy` True/False turns the demo's approval policy on or off for this stack (kept in its state);
        None keeps what the stack had (off for a new one)."""
        step = on_step if on_step is not None else (lambda _msg: None)
        with self._locked():
            state = self._load()
            token = self._ensure_token(state)
            if policy is not None:
                state.policy = policy
            self._save(state)
            started: list[ComponentName] = []
            try:
                for name in _START_ORDER:
                    if name == "policy" and not state.policy:
                        self._stop_recorded(name, state, step)
                        continue
                    if self._ensure_component(name, state, token, step, state.policy):
                        started.append(name)
            except StackError:
                for name in reversed(started):
                    record = state.components.pop(name, None)
                    if record is not None and self._is_ours(record):
                        step(f"stopping {_LABELS[name]} (pid {record.pid}) again...")
                        self._as_process(name, record).stop()
                self._save(state)
                raise
            return dataclasses.replace(self._status_from(state), started=tuple(started))

    def _stop_recorded(self, name: ComponentName, state: _StateFile, step: Callable[[str], None]) -> None:
        """Stop `name`'s recorded process, if it is still ours, and forget it (a policy worker turned off)."""
        record = state.components.pop(name, None)
        if record is None:
            return
        if self._is_ours(record):
            step(f"stopping {_LABELS[name]} (pid {record.pid})...")
            self._as_process(name, record).stop()
        self._save(state)

    def down(self, on_step: Callable[[str], None] | None = None) -> DownReport:
        """Stop our recorded processes, worker first; data files and logs are kept. Says, per component, what
        it did: only a process this data dir recorded, and that still runs its recorded command, is stopped."""
        step = on_step if on_step is not None else (lambda _msg: None)
        done: dict[ComponentName, ComponentStop] = {
            name: ComponentStop(name, _LABELS[name], "none recorded", None, self._address(name))
            for name in _START_ORDER
            if name != "policy"  # reported only when recorded: a stack without policies has none
        }
        if not self.state_path.exists():
            return DownReport(self.data_dir, tuple(done.values()))  # creates nothing where nothing was
        with self._locked():
            state = self._load()
            for name in reversed(_START_ORDER):
                record = state.components.get(name)
                if record is None:
                    continue
                outcome: Literal["stopped", "exited"] = "exited"
                if self._is_ours(record):
                    step(f"stopping {_LABELS[name]} (pid {record.pid})...")
                    self._as_process(name, record).stop()
                    outcome = "stopped"
                done[name] = ComponentStop(name, _LABELS[name], outcome, record.pid, record.address)
                del state.components[name]
                self._save(state)
        return DownReport(self.data_dir, tuple(done[name] for name in _START_ORDER if name in done))

    def ports_held(self) -> list[str]:
        """The ports these settings name that something listens on or holds, e.g. "7233 (Temporal gRPC,
        TOOLLOOP_TEMPORAL_PORT)"."""
        return [f"{port} ({what}, {env_var})" for port, what, env_var in self._ports() if port_in_use(port)]

    def status(self) -> StackStatus:
        # No lock: state.json is replaced atomically, and status must not wait behind a slow `up`.
        return self._status_from(self._load())

    # -- per component --------------------------------------------------------------------------

    def _desired(self, name: ComponentName, token: StackSecrets, policy: bool) -> tuple[list[str], str]:
        s = self._settings
        if name == "temporal":
            cmd = temporal_dev_server_command(
                self.data_dir / "temporal.sqlite", s.temporal_port, s.ui_port, namespaces=[s.temporal_namespace]
            )
            return cmd, ""
        if name == "service":
            cmd = business_service_command(self.data_dir / "service.sqlite", s.service_port)
            values = {"admin_token": token.admin_token, "approval_key": token.approval_verify_key}
            if policy:  # only then: a stack without policies keeps its service's configuration digest
                values |= {"policy_key": token.policy_verify_key, "policy_file": str(self.policy_file)}
            return cmd, _digest(values)
        if name == "api":
            return api_command(self._repo_root, s.api_port), _digest(self._api_env(token))
        if name == "policy":
            return policy_worker_command(self._repo_root), _digest(self._policy_env(token))
        return worker_command(self._repo_root), _digest(self._worker_env(token, policy))

    def _ensure_component(
        self, name: ComponentName, state: _StateFile, token: StackSecrets, step: Callable[[str], None], policy: bool
    ) -> bool:
        """Make `name` run; True when a process was started for it (not reused)."""
        label = _LABELS[name]
        cmd, digest = self._desired(name, token, policy)
        record = state.components.get(name)
        if record is not None and self._is_ours(record):
            if record.cmd == cmd and record.config_digest == digest and self._healthy(name, record, grace=5.0):
                step(f"reusing {label} (pid {record.pid})")
                return False
            # Ours but stale (settings changed) or unhealthy: replace it rather than run two.
            step(f"restarting {label} (pid {record.pid})...")
            self._as_process(name, record).stop()
        if record is not None:
            del state.components[name]
            self._save(state)

        self._check_ports_free(name)
        step(f"starting {label} on {self._address(name)}...")
        proc = self._start(name, token, policy)
        state.components[name] = _ComponentRecord(
            pid=proc.pid,
            cmd=proc.cmd,
            log_path=str(proc.log_path),
            address=self._address(name),
            config_digest=digest,
            started_at=time.time(),
        )
        self._save(state)
        return True

    def _start(self, name: ComponentName, token: StackSecrets, policy: bool) -> ManagedProcess:
        s = self._settings
        try:
            if name == "temporal":
                return start_temporal_dev_server(
                    self.data_dir,
                    s.temporal_port,
                    s.ui_port,
                    detached=True,
                    namespace=s.temporal_namespace,
                    log_path=self._log_path(name),
                )
            if name == "service":
                return start_business_service(
                    self.data_dir / "service.sqlite",
                    s.service_port,
                    token.admin_token,
                    detached=True,
                    approval_verify_key=token.approval_verify_key,
                    log_path=self._log_path(name),
                    cwd=self._repo_root,
                    policy_verify_key=token.policy_verify_key if policy else None,
                    policy_file=self.policy_file if policy else None,
                )
            if name == "api":
                env = self._api_env(token)
                return start_api(self._repo_root, env, s.api_port, self._log_path(name), detached=True)
            if name == "policy":
                env = self._policy_env(token)
                return start_policy_worker(self._repo_root, env, self._log_path(name), detached=True)
            env = self._worker_env(token, policy)
            return start_worker(self._repo_root, env, self._log_path(name), detached=True)
        except ProcessStartError as exc:
            raise StackError(f"could not start the {_LABELS[name]}: {exc}") from exc

    def _policy_env(self, token: StackSecrets) -> dict[str, str]:
        """The policy evaluator's: the only process that holds the policy's signing key."""
        s = self._settings
        return {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": s.temporal_namespace,
            "TOOLLOOP_POLICY_FILE": str(self.policy_file),
            "TOOLLOOP_POLICY_SCHEMA": str(self.policy_schema),
            "TOOLLOOP_POLICY_SIGNING_KEY": token.policy_key,
            "TOOLLOOP_POLICY_TASK_QUEUE": self.policy_task_queue,
            # The approval channel's public key: the grants people give are honoured.
            "TOOLLOOP_APPROVAL_VERIFY_KEY": token.approval_verify_key,
        }

    def _worker_env(self, token: StackSecrets, policy: bool = False) -> dict[str, str]:
        s = self._settings
        env = {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": s.temporal_namespace,
            "TOOLLOOP_TASK_QUEUE": s.task_queue,
            "TOOLLOOP_SERVICE_URL": self.service_url,
            "TOOLLOOP_SERVICE_ADMIN_TOKEN": token.admin_token,
            # The approval channel's public key: the only one the worker verifies decisions with.
            "TOOLLOOP_APPROVAL_VERIFY_KEY": token.approval_verify_key,
            # The local demo stack serves the offline and script models (a deployment's worker does not).
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
            "OPENAI_BASE_URL": s.openai_base_url,
            "OPENAI_MODEL": s.openai_model,
        }
        # Settings may come from more than the environment; the worker must see the same model config.
        if s.openai_api_key is not None:
            env["OPENAI_API_KEY"] = s.openai_api_key.get_secret_value()
        # Only when set (a stack started without them keeps its worker's configuration digest): where the
        # model's text goes as it is written, and a model endpoint that cannot stream.
        if s.live_text_url is not None:
            env["TOOLLOOP_LIVE_TEXT_URL"] = s.live_text_url
        if not s.openai_stream:
            env["OPENAI_STREAM"] = "false"
        # Only when set (a stack started without them keeps its worker's configuration digest): the named models,
        # and the keys and headers their variables hold (laid over the environment the worker inherits anyway,
        # so a changed key restarts it).
        if s.named_models:
            env["TOOLLOOP_MODELS"] = _named_models_json(s)
            for name, endpoint in s.model_endpoints().items():
                config = s.named_models.get(name)
                if config is not None and config.api_key_env != "OPENAI_API_KEY":
                    env[config.api_key_env] = endpoint.api_key.get_secret_value()
                if config is not None and config.extra_headers_env != "OPENAI_EXTRA_HEADERS":
                    headers = {k: v.get_secret_value() for k, v in endpoint.extra_headers.items()}
                    env[config.extra_headers_env] = json.dumps(headers, sort_keys=True)
        # Only when set: a stack started without prices keeps its worker's configuration digest.
        if s.model_prices:
            prices = {name: price.model_dump(exclude_none=True) for name, price in s.model_prices.items()}
            env["TOOLLOOP_MODEL_PRICES"] = json.dumps(prices, sort_keys=True)
        # Only with policies on: where the policy worker decides (the worker holds no key of it).
        if policy:
            env["TOOLLOOP_POLICY_TASK_QUEUE"] = self.policy_task_queue
            env["TOOLLOOP_POLICY_VERIFY_KEY"] = token.policy_verify_key
        return env

    def _api_env(self, token: StackSecrets) -> dict[str, str]:
        """The API is a trusted approval channel: it, and not the worker, holds the signing key."""
        s = self._settings
        tokens = s.api_tokens if s.api_tokens.is_absolute() else self._repo_root / s.api_tokens
        return {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": s.temporal_namespace,
            "TOOLLOOP_TASK_QUEUE": s.task_queue,
            "TOOLLOOP_APPROVAL_KEY": token.approval_key,
            # The local stack is the demo: its API may take the published demo tokens.
            "TOOLLOOP_API_ALLOW_DEMO_TOKENS": "true",
            "TOOLLOOP_API_TOKENS": str(tokens),
            "TOOLLOOP_API_MODEL": s.api_default_model,
            # The worker's tools, so the API refuses an unknown one in a request's "tools" before it starts.
            "TOOLLOOP_API_TOOLS": ",".join(demo_tool_names()),
            # And its models: a request naming another is refused at once.
            "TOOLLOOP_API_MODELS": ",".join(demo_model_names(s.openai_api_key is not None, s.named_models)),
            # Its named models (names and settings, no key): a request giving one a ":MODEL" is refused too.
            **({"TOOLLOOP_MODELS": _named_models_json(s)} if s.named_models else {}),
            # Where the worker writes the model's text as it is written: the event stream passes it on.
            **({"TOOLLOOP_LIVE_TEXT_URL": s.live_text_url} if s.live_text_url is not None else {}),
        }

    def _ports(self, name: ComponentName | None = None) -> list[tuple[int, str, str]]:
        """(port, what, setting) of one component, or of all of them."""
        s = self._settings
        ports: dict[ComponentName, list[tuple[int, str, str]]] = {
            "temporal": [
                (s.temporal_port, "Temporal gRPC", "TOOLLOOP_TEMPORAL_PORT"),
                (s.ui_port, "Temporal UI", "TOOLLOOP_UI_PORT"),
            ],
            "service": [(s.service_port, "business service", "TOOLLOOP_SERVICE_PORT")],
            "policy": [],
            "worker": [],
            "api": [(s.api_port, "HTTP API", "TOOLLOOP_API_PORT")],
        }
        return ports[name] if name is not None else [p for n in _START_ORDER for p in ports[n]]

    def _check_ports_free(self, name: ComponentName) -> None:
        for port, what, env_var in self._ports(name):
            # Only called once our own process on it is gone, so whoever holds it is someone else.
            if port_in_use(port):
                raise StackError(f"port {port} ({what}) is already in use by another program; stop it or set {env_var}")

    def _healthy(self, name: ComponentName, record: _ComponentRecord, grace: float = 0.0) -> bool:
        deadline = time.monotonic() + grace
        while True:
            if name == "temporal":
                ok = run_coroutine_blocking(
                    lambda: temporal_ready(self.temporal_address, self._settings.temporal_namespace, 3.0)
                )
            elif name == "service":
                ok = http_ok(f"{self.service_url}/healthz")
            elif name == "api":
                ok = http_ok(f"{self.api_url}/healthz")
            else:
                ok = self._is_ours(record)  # a worker (model or policy) has no probe: alive and ours is all we know
            if ok or time.monotonic() >= deadline or not self._is_ours(record):
                return ok
            time.sleep(0.3)

    @staticmethod
    def _is_ours(record: _ComponentRecord) -> bool:
        # A recycled PID runs some other command line, so it is never mistaken for ours.
        return pid_alive(record.pid) and cmdline_matches(record.pid, record.cmd)

    @staticmethod
    def _as_process(name: ComponentName, record: _ComponentRecord) -> ManagedProcess:
        return ManagedProcess(name=name, pid=record.pid, popen=None, log_path=Path(record.log_path), cmd=record.cmd)

    def _status_from(self, state: _StateFile) -> StackStatus:
        def one(name: ComponentName) -> ComponentStatus:
            record = state.components.get(name)
            running = record is not None and self._is_ours(record)
            if record is None or not running:
                healthy = False
            elif name == "temporal":
                healthy = port_accepts(self._settings.temporal_port)
            elif name == "service":
                healthy = http_ok(f"{self.service_url}/healthz", timeout=1.0)
            elif name == "api":
                healthy = http_ok(f"{self.api_url}/healthz", timeout=1.0)
            else:
                healthy = True
            return ComponentStatus(
                name=name,
                label=_LABELS[name],
                running=running,
                healthy=healthy,
                pid=record.pid if record is not None and running else None,
                address=record.address if record is not None else self._address(name),
                log_path=Path(record.log_path) if record is not None else self._log_path(name),
                recorded_pid=record.pid if record is not None else None,
            )

        return StackStatus(
            temporal=one("temporal"),
            service=one("service"),
            worker=one("worker"),
            api=one("api"),
            ui_url=self.ui_url,
            data_dir=self.data_dir,
            policy=one("policy") if state.policy or "policy" in state.components else None,
            policy_on=state.policy,
            policy_file=self.policy_file if state.policy else None,
        )

    # -- state and lock -------------------------------------------------------------------------

    def _ensure_token(self, state: _StateFile) -> StackSecrets:
        if state.admin_token is None:
            state.admin_token = secrets.token_urlsafe(32)
        if state.approval_key is None:
            state.approval_key = generate_signing_key()
        if state.policy_key is None:
            state.policy_key = generate_signing_key()
        admin = self._settings.service_admin_token
        approval = self._settings.approval_key
        return StackSecrets(
            admin_token=admin.get_secret_value() if admin is not None else state.admin_token,
            approval_key=approval.get_secret_value() if approval is not None else state.approval_key,
            policy_key=state.policy_key,
        )

    def _load(self) -> _StateFile:
        try:
            return _StateFile.model_validate_json(self.state_path.read_bytes())
        except FileNotFoundError:
            return _StateFile()
        except (ValidationError, ValueError) as exc:
            raise StackError(
                f"{self.state_path} is unreadable ({exc.__class__.__name__}); "
                "stop any toolloop processes and delete the file"
            ) from exc

    def _save(self, state: _StateFile) -> None:
        self._ensure_dirs()
        tmp = self.state_path.with_suffix(".json.tmp")
        # 0600 from creation: the file holds the admin token.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state.model_dump(mode="json"), fh, indent=2)
        os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a leftover tmp file
        os.replace(tmp, self.state_path)

    def _ensure_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One `up`/`down` at a time across processes, so two `ask` commands never start two stacks."""
        self._ensure_dirs()
        with self._lock_path.open("a") as fh:
            deadline = time.monotonic() + _LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StackError(
                            f"another toolloop command holds {self._lock_path} for over {_LOCK_TIMEOUT:.0f}s"
                        ) from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _digest(values: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(values.items())).encode()).hexdigest()
