"""Entry point: the CLI. `ask` runs one request as a workflow (starting or reusing the local stack),
shows live progress, asks for approvals, and prints the answer with a receipt and its link in the
Temporal UI; `approve`/`reject` decide from another shell; `up`/`down`/`status` manage the local stack."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import TerminatedError
from temporalio.exceptions import TimeoutError as WorkflowTimeoutError
from temporalio.service import RPCError, RPCStatusCode

# typer carries its own copy of click; its usage errors are these (pyproject pins the typer range).
from devstack.processes import StackError
from devstack.stack import LocalStack, StackStatus, demo_model_names, demo_tool_names
from toolloop._api.tokens import TokenMap, TokensFileError
from toolloop._core.approvals import OPERATION_ID, generate_signing_key, verify_key_for
from toolloop._core.contracts import (
    EXIT_CODES,
    NOT_DONE_STATES,
    Actor,
    AgentInput,
    AgentProgress,
    AgentResult,
    ApprovalRequest,
    CallRecord,
    DecisionReceipt,
    Limits,
    ModelSpec,
    OperationRecord,
    RunStatus,
    left_mid_way,
    outcome_of,
    outcome_without_report,
)
from toolloop._core.live_text import Shown
from toolloop._core.named_models import named_model_refusal
from toolloop._core.request_naming import THREAD_ID
from toolloop._core.threads import MessageRecord
from toolloop._core.usage import usage_line
from toolloop._live.store import LiveTextStore
from toolloop._models.errors import ScriptError
from toolloop._models.script import load_script
from toolloop._temporal.approval_channel import ApprovalRefused
from toolloop._temporal.client import (
    MessageRefused,
    RequestIdReused,
    RequestNotFound,
    ThreadBusy,
    ThreadClosed,
    ThreadNotFound,
    ToolloopClient,
    ToolloopRequest,
    ToolloopThread,
)
from toolloop._temporal.converter import data_converter
from toolloop._temporal.following import RunFollower
from toolloop._temporal.logs import configure_logging
from toolloop._temporal.requests import (
    REQUEST_ID,
    UNREADABLE_REQUEST,
    missing_search_attributes,
    readable_request_id,
)
from toolloop._temporal.settings import ApiSettings, Settings, settings_error
from toolloop._temporal.telemetry import configure_otlp_tracing, metrics_runtime, tracing_interceptor

REPO_ROOT = Path(__file__).resolve().parent

# Exit codes of `ask` (README, "Exit codes"): a finished request's come from its outcome (EXIT_CODES, the
# library's one rule); these two are the CLI's own.
EXIT_USAGE = 2  # bad input (one line on stderr), or no such request for this user
EXIT_INTERRUPTED = 130  # Ctrl-C: the request keeps running (and waiting for any approval) in the background

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err_console.print(Text.assemble(("error: ", "bold red"), message))
    raise typer.Exit(code)


def _one_line(exc: ValidationError, options: Mapping[str, str]) -> str:
    """The first problem of a pydantic error, named by its CLI option, on one line."""
    err = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    field_name = str(err["loc"][0]) if err["loc"] else ""
    message = str(err["msg"])
    if err["type"] == "string_pattern_mismatch":
        message = "use only ASCII letters, digits and _ . @ - (starting with a letter or digit)"
    elif err["type"] == "string_too_short":
        message = "must not be empty"
    return f"{options.get(field_name, field_name)}: {message}"


# Where this command's stack is, for the commands it prints (set once per command: see _printed_for).
_PRINTED_ENV: dict[str, str] = {}
_PRINTED_FLAGS: list[str] = []
# Where the stack is and what its commands read: a printed `approve` from a clean shell must reach the same
# namespace and queue, and take the session's roles from the same tokens file.
_LOCAL_STACK_SETTINGS = (
    "TOOLLOOP_DATA_DIR",
    "TOOLLOOP_TEMPORAL_PORT",
    "TOOLLOOP_SERVICE_PORT",
    "TOOLLOOP_API_PORT",
    "TOOLLOOP_UI_PORT",
    "TEMPORAL_NAMESPACE",
    "TOOLLOOP_TASK_QUEUE",
    "TOOLLOOP_API_TOKENS",
)
_OTHER_TEMPORAL_SETTINGS = ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TOOLLOOP_TASK_QUEUE")


def _printed_for(settings: Settings, local_stack: bool) -> None:
    """The commands this process prints run from any shell: they name the settings that locate its stack
    (those that differ from the defaults: the local stack's data dir and ports, or another Temporal)."""
    fields = {str(f.validation_alias): name for name, f in Settings.model_fields.items()}
    wanted = _LOCAL_STACK_SETTINGS if local_stack else _OTHER_TEMPORAL_SETTINGS
    for variable in wanted:
        name = fields[variable]
        value = getattr(settings, name)
        if variable == "TOOLLOOP_DATA_DIR":  # relative to this shell's directory: named absolute, always
            _PRINTED_ENV[variable] = str(value.resolve())
        elif value != Settings.model_fields[name].default:
            _PRINTED_ENV[variable] = str(value)
    if not local_stack:
        _PRINTED_FLAGS.append("--no-local-stack")


def _cli_command() -> str:
    """How to run this CLI again from a plain shell: this venv's python with this file (both absolute, so
    neither PATH nor the current directory matters), after the settings that locate this command's stack."""
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(REPO_ROOT / 'starter.py'))}"
    if _PRINTED_ENV:
        command = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in _PRINTED_ENV.items()) + " " + command
    return command


def _settings_for_local_stack(settings: Settings) -> Settings:
    """The local stack listens on its configured ports; point the client and worker there."""
    return settings.model_copy(
        update={
            "temporal_address": f"127.0.0.1:{settings.temporal_port}",
            "service_url": f"http://127.0.0.1:{settings.service_port}",
        }
    )


def _actor(user: str | None, tenant: str) -> Actor:
    if user is None:
        _fail("--user is required: whom this session acts for")
    try:
        return Actor(user_id=user, tenant_id=tenant)
    except ValidationError as exc:
        _fail(_one_line(exc, {"user_id": "--user", "tenant_id": "--tenant"}))


def _why_failed(exc: WorkflowFailureError) -> str:
    """Why a run ended without a report, in Temporal's words: terminated (with the operator's reason), timed
    out, or its failure's message."""
    cause = exc.cause
    if isinstance(cause, TerminatedError):
        return f"terminated ({cause.message or 'no reason given'})"
    if isinstance(cause, WorkflowTimeoutError):
        return f"timed out ({cause.message})"
    return str(cause or exc)


def _model_spec(model: str | None, settings: Settings) -> ModelSpec:
    if model is None:
        return ModelSpec(provider="openai") if settings.openai_api_key else ModelSpec(provider="offline")
    if model.startswith("script:"):
        path = model.partition(":")[2]
        try:
            return ModelSpec(provider="script", script=load_script(path))
        except ScriptError as exc:
            _fail(f"model script {path}: {exc}")
    try:
        # offline, openai[:NAME], or a model adapter the worker registered under its name (its tools module
        # chooses them): the library's one parser.
        return ModelSpec.named(model)
    except ValueError:
        _fail(
            f"unknown --model {model!r}; use offline, openai[:NAME], script:FILE, or NAME[:MODEL] of a worker's model"
        )


def _check_local_worker_has(spec: ModelSpec, allow_tool: list[str] | None, settings: Settings) -> None:
    """The local stack's worker runs the demo's tools and models: a tool or a model it does not have is bad
    input, refused before anything starts (a deployment's worker is not known here: it answers for itself)."""
    tools = set(demo_tool_names())
    for name in allow_tool or []:
        if name not in tools:
            _fail(
                f"--allow-tool {name!r}: the local stack's worker has no such tool; it has {', '.join(sorted(tools))}"
            )
    # The CLI acts for the local stack's operator, who may use every model of its worker (an API caller's
    # token may list fewer).
    models = set(demo_model_names(settings.openai_api_key is not None, settings.named_models))
    if spec.provider not in models:
        _fail(
            f"--model {spec.provider!r}: the local stack's worker has no such model; it has {', '.join(sorted(models))}"
        )
    why = named_model_refusal(spec, settings.named_models)
    if why is not None:
        _fail(f"--model {spec.provider}:{spec.name}: {why}")


def _up(settings: Settings, quiet: bool, policy: bool | None = None) -> StackStatus:
    stack = LocalStack(settings, REPO_ROOT)
    try:
        if quiet:
            return stack.up(policy=policy)
        with err_console.status("starting the local stack...") as status:
            return stack.up(on_step=lambda step: status.update(step), policy=policy)
    except StackError as exc:
        _fail(str(exc))


def _check_user(settings: Settings, actor: Actor, local_stack: bool) -> None:
    """On the local stack the session's user must exist there (an unknown one gets one line, not empty
    results). A deployment's starter identifies its users itself."""
    if not local_stack:
        return
    try:
        LocalStack(settings, REPO_ROOT).check_user(actor)
    except StackError as exc:
        _fail(str(exc))


def _session_roles(settings: Settings, actor: Actor, local_stack: bool) -> tuple[str, ...]:
    """The session's roles in its tenant (an approval policy may leave a write to a role, e.g. manager): on the
    local stack, those its API tokens file gives this tenant's user; never from the command line. A deployment's
    starter passes its users' roles to the library itself (roles=)."""
    if not local_stack:
        return ()
    try:
        return tuple(sorted(LocalStack(settings, REPO_ROOT).roles_of(actor)))
    except StackError as exc:
        _fail(str(exc))


def _approval_key(settings: Settings, local_stack: bool) -> str | None:
    if settings.approval_key is not None:
        return settings.approval_key.get_secret_value()
    if local_stack:
        return LocalStack(settings, REPO_ROOT).approval_key()
    return None


def _check_signing_key(signing_key: str | None) -> None:
    """A malformed TOOLLOOP_APPROVAL_KEY is one line before anything starts. (Requests carry no key: the
    worker's own configuration verifies decisions.)"""
    if signing_key is not None:
        try:
            verify_key_for(signing_key)
        except ValueError as exc:
            _fail(f"TOOLLOOP_APPROVAL_KEY: {exc}")


_SettingsT = TypeVar("_SettingsT", Settings, ApiSettings)


def _read(kind: type[_SettingsT]) -> _SettingsT:
    """The process's settings from its environment; a bad value is one line naming the variable, exit 2."""
    try:
        return kind()
    except ValidationError as exc:
        _fail(settings_error(exc))


def _not_found(workflow_id: str, actor: Actor) -> NoReturn:
    # The same words whether the request is missing or belongs to someone else.
    _fail(f"no request {workflow_id} for user {actor.user_id!r} in tenant {actor.tenant_id!r}")


async def _connect(
    settings: Settings, signing_key: str | None = None, live_text: LiveTextStore | None = None
) -> ToolloopClient:
    """toolloop's client, as the approval channel "cli": its decisions are recorded as "<user> via cli"."""
    return await ToolloopClient.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        task_queue=settings.task_queue,
        signing_key=signing_key,
        channel="cli",
        live_text=live_text,
    )


async def _own_request(client: ToolloopClient, workflow_id: str, actor: Actor) -> ToolloopRequest:
    """The session's own request; another user's looks exactly like a missing one (the client reads whom a
    workflow acts for from its own start event)."""
    try:
        return await client.request_of_workflow(workflow_id, actor=actor)
    except RequestNotFound:
        _not_found(workflow_id, actor)


# --- Approvals --------------------------------------------------------------------------------------


class _StdinLines:
    """Lines from stdin read without blocking the event loop, so a prompt can be abandoned the moment its
    operation is decided elsewhere, and Ctrl-C is never swallowed by a thread blocked in input()."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = sys.stdin.fileno()
        self._buffer = b""
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        chunk = os.read(self._fd, 4096)
        if not chunk:
            self._loop.remove_reader(self._fd)
            self._lines.put_nowait(None)
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._lines.put_nowait(line.decode("utf-8", errors="replace"))

    def discard_typed_ahead(self) -> None:
        # A "y" typed before the prompt appeared must not approve what it shows.
        while not self._lines.empty():
            if self._lines.get_nowait() is None:
                self._lines.put_nowait(None)
                return

    async def readline(self) -> str | None:
        """The next line; None at end of input."""
        return await self._lines.get()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)


@dataclass
class ApprovalMode:
    """How `ask` answers approval requests: automatically (demos, tests), by asking on the terminal, or
    not at all (another shell runs `approve`/`reject`). The client's key signs what is decided here."""

    auto: bool
    interactive: bool
    stdin: _StdinLines | None = None
    # The session's roles (_session_roles): an operation the policy leaves to others is not asked about here.
    roles: tuple[str, ...] = ()


@dataclass
class _Session:
    """What a Ctrl-C needs to say: which request keeps running, and what waits for approval."""

    workflow_id: str | None = None
    pending: set[str] = field(default_factory=set)
    # Set while a thread's message waits for its turn (its request does not exist yet): the command that
    # follows it again (the same submission attaches to it).
    queued_resume: str | None = None


def _decide_commands(workflow_id: str, operation_id: str, actor: Actor) -> tuple[str, str]:
    tail = " ".join([workflow_id, operation_id, "--user", actor.user_id, "--tenant", actor.tenant_id, *_PRINTED_FLAGS])
    cli = _cli_command()
    return f"{cli} approve {tail}", f"{cli} reject {tail}"


def _show_request(request: ApprovalRequest, workflow_id: str, actor: Actor) -> None:
    err_console.print(Text.assemble(("Approval needed", "bold yellow"), f" in request {workflow_id}"))
    err_console.print(Text(f"  operation: {request.operation_id}"))
    err_console.print(Text(f"  tool:      {request.tool}"))
    if request.target is not None:
        # What the digest binds besides the arguments: the request the service will receive.
        err_console.print(Text(f"  request:   {request.target}"))
    err_console.print(Text(f"  arguments: {json.dumps(request.arguments, ensure_ascii=False, sort_keys=True)}"))
    err_console.print(Text(f"  digest:    {request.digest}"))
    if request.approval_expires_at is not None:
        err_console.print(Text(f"  waits until {request.approval_expires_at.isoformat()}"))
    if request.policy is not None:
        err_console.print(Text(f"  policy:    {request.policy.decided()}"))
        if request.policy.approved_by:
            err_console.print(Text(f"  approved so far by: {', '.join(request.policy.approved_by)}"))
    approve, reject = _decide_commands(workflow_id, request.operation_id, actor)
    # Unstyled: these lines are meant to be copied into another shell as they are.
    err_console.print(Text(f"  approve:   {approve}\n  reject:    {reject}"))


def _show_left_to_others(request: ApprovalRequest, workflow_id: str) -> None:
    """An operation of the session's request that its approval policy leaves to other people (a manager, a
    second person): said once, with no prompt and no command the session could not use."""
    err_console.print(Text.assemble(("Approval needed", "bold yellow"), f" in request {workflow_id}"))
    err_console.print(Text(f"  operation: {request.operation_id} ({request.tool}) waits for others"))
    if request.policy is not None:
        err_console.print(Text(f"  policy:    {request.policy.decided()}"))
        if request.policy.approved_by:
            err_console.print(Text(f"  approved so far by: {', '.join(request.policy.approved_by)}"))
    if request.approval_expires_at is not None:
        err_console.print(Text(f"  waits until {request.approval_expires_at.isoformat()}"))


def _not_yours(request: ApprovalRequest, user: str) -> str:
    """Why the session's own request's operation is not the session's to decide, in one line."""
    if request.policy is not None and user in request.policy.approved_by:
        return f"operation {request.operation_id}: {user} has approved it already; it waits for another person"
    decided = request.policy.decided() if request.policy is not None else "no policy"
    return f"operation {request.operation_id}: {user} may not decide it ({decided})"


_DECIDED_ELSEWHERE = {
    "denied": "was rejected elsewhere",
    "expired": "was not approved in time (expired); nothing was sent",
}


def _decided_elsewhere(operation_id: str, request: ApprovalRequest | None) -> str:
    """What ended an approval prompt without an answer typed here, as the line that stays on screen."""
    if request is None:
        return f"{operation_id} is no longer part of the request"
    # Any other state is past the approval: it was approved (and may have been sent since).
    return f"{operation_id} {_DECIDED_ELSEWHERE.get(request.state, 'was approved elsewhere')}"


async def _prompt_until_decided(request: ToolloopRequest, operation_id: str, stdin: _StdinLines) -> bool | str | None:
    """y/N on the terminal, abandoned at once when the operation is decided elsewhere. True/False: the
    answer; a str: what happened elsewhere; None: end of input (nothing decided here)."""
    stdin.discard_typed_ahead()
    err_console.print(Text("  Approve this exact operation? [y/N] "), end="")
    answer = asyncio.ensure_future(stdin.readline())
    try:
        async with RunFollower(request.handle) as follower:
            while True:
                changed = asyncio.ensure_future(follower.wait())
                done, _ = await asyncio.wait({answer, changed}, return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                if answer in done:
                    line = answer.result()
                    return None if line is None else line.strip().lower() in ("y", "yes")
                now = await request.approval(operation_id)
                if now is None or now.state != "awaiting_approval":
                    err_console.print()
                    return _decided_elsewhere(operation_id, now)
    finally:
        answer.cancel()


class _LiveView:
    """The live progress lines under everything `ask` prints, and the model's text as it is written. Stopped
    while an approval is shown and asked, so the prompt and what ended it stay on screen; started again as a
    new display below them (a stopped rich Live started again first erases as many lines above it as it was
    tall: the prompt's outcome). Transient: the answer is printed once, after it."""

    def __init__(self, workflow_id: str, show: bool) -> None:
        self._workflow_id = workflow_id
        self._show = show
        self._live: Live | None = None
        self._progress: AgentProgress | None = None
        # The text of the turn being written (the newest attempt's only), and a restart to say.
        self._writing: tuple[int, list[str]] | None = None
        self._note: str | None = None

    def start(self) -> None:
        if self._show and self._live is None:
            self._live = Live(self._render(), console=err_console, transient=True, refresh_per_second=8)
            self._live.start(refresh=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def show_progress(self, progress: AgentProgress) -> None:
        self._progress = progress
        self._refresh()

    def show_text(self, shown: Shown) -> None:
        if shown.kind == "restarted":
            self._writing = (shown.turn, [])
            self._note = f"model turn {shown.turn} restarted (attempt {shown.attempt}): its text so far is void"
        elif shown.kind == "text":
            if self._writing is None or self._writing[0] != shown.turn:
                self._writing, self._note = (shown.turn, []), None
            self._writing[1].append(shown.text)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Table:
        table = _progress_view(self._progress, self._workflow_id)
        if self._note is not None:
            table.add_row(Text("model", style="dim"), Text(self._note, style="yellow"))
        if self._writing is not None and self._writing[1]:
            # The end of what is written so far: the whole answer is printed once, when the request ends.
            written = "".join(self._writing[1])
            tail = written if len(written) <= _LIVE_TEXT_TAIL else "..." + written[-_LIVE_TEXT_TAIL:]
            table.add_row(Text("writing", style="dim"), Text(tail))
        return table


# How much of a turn's text the live view shows while it is written.
_LIVE_TEXT_TAIL = 600


async def _answer_approval(
    request: ToolloopRequest, operation_id: str, mode: ApprovalMode, view: _LiveView, session: _Session
) -> None:
    # Read again: while an earlier operation was shown, this one may have been decided elsewhere.
    approval = await request.approval(operation_id)
    if approval is None or approval.state != "awaiting_approval":
        return
    if not approval.may_decide(request.actor.user_id, mode.roles):
        # Left to others by the approval policy: the request waits for them; nothing to ask or sign here.
        view.stop()
        _show_left_to_others(approval, request.workflow_id)
        view.start()
        return
    view.stop()
    # A Ctrl-C here leaves it waiting, and the interrupt's message says how to decide it later.
    session.pending.add(operation_id)
    await _decide_shown(request, approval, mode)
    session.pending.discard(operation_id)
    view.start()


async def _decide_shown(request: ToolloopRequest, approval: ApprovalRequest, mode: ApprovalMode) -> None:
    """Show the operation's exact payload, ask (or --auto-approve), and have the client sign and send exactly
    what was shown."""
    operation_id = approval.operation_id
    _show_request(approval, request.workflow_id, request.actor)
    try:
        request.check_signable(approval)  # never ask a person about a payload the channel will not sign
    except ApprovalRefused as exc:
        err_console.print(Text(f"  refused to sign: {exc}", style="red"))
        return
    if mode.auto:
        err_console.print(Text("  --auto-approve: approving without asking (demo/test mode)", style="magenta"))
        approve = True
    elif mode.interactive and mode.stdin is not None:
        answer = await _prompt_until_decided(request, operation_id, mode.stdin)
        if answer is None:
            err_console.print(Text("  no answer: it keeps waiting; use the commands above", style="yellow"))
            return
        if isinstance(answer, str):
            err_console.print(Text(f"  {answer}", style="yellow"))
            return
        approve = answer
    else:
        return
    try:
        receipt = await request.decide(approval, approve=approve, roles=mode.roles)
    except WorkflowUpdateFailedError as exc:
        now = await request.approval(operation_id)
        if now is not None and now.state != "awaiting_approval":
            err_console.print(Text(f"  {_decided_elsewhere(operation_id, now)}", style="yellow"))
        else:
            err_console.print(Text(f"  not recorded: {exc.cause}", style="red"))
        return
    except (ApprovalRefused, RPCError) as exc:
        err_console.print(Text(f"  not recorded: {exc}", style="red"))
        return
    waits = "; it waits for another person" if receipt.state == "awaiting_approval" else ""
    err_console.print(Text(f"  {'approved' if approve else 'rejected'}{waits}", style="green" if approve else "yellow"))


# --- ask ----------------------------------------------------------------------------------------------


def _progress_view(progress: AgentProgress | None, workflow_id: str) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_row(Text("request", style="dim"), Text(workflow_id))
    if progress is None:
        table.add_row(Text("phase", style="dim"), Text("starting"))
        return table
    table.add_row(Text("phase", style="dim"), Text(progress.phase, style="bold cyan"))
    tokens = usage_line(progress.usage)
    if tokens is not None:
        table.add_row(Text("model", style="dim"), Text(tokens))
    for call in progress.calls:
        mark = Text("ok", style="green") if call.ok else Text(call.code or "failed", style="yellow")
        table.add_row(
            Text(f"round {call.round}", style="dim"), Text.assemble(f"{call.tool} ", mark, f" {call.duration_ms} ms")
        )
    for summary in progress.running:
        table.add_row(Text("running", style="dim"), Text(summary, style="cyan"))
    return table


async def _show_progress(request: ToolloopRequest, view: _LiveView) -> None:
    """Keep the live view current: the progress is read each time the run's history says it may have changed
    (a long poll, no polling interval), until cancelled. A progress no worker answers for yet (not picked up,
    a restart) is read again at the next change."""
    with contextlib.suppress(RPCError):  # a run its worker cannot read: ask's own result says so
        async for progress in request.follow():
            view.show_progress(progress)


async def _show_live_text(request: ToolloopRequest, view: _LiveView) -> None:
    """The model's text in the live view as it is written, until cancelled (the answer is printed at the end
    either way)."""
    async for shown in request.live_text():
        view.show_text(shown)


async def _watch(request: ToolloopRequest, show: bool, mode: ApprovalMode, session: _Session) -> AgentResult:
    if mode.interactive and not mode.auto:
        mode.stdin = _StdinLines()
    view = _LiveView(request.workflow_id, show)
    following = asyncio.ensure_future(_show_progress(request, view)) if show else None
    writing = asyncio.ensure_future(_show_live_text(request, view)) if show else None
    try:
        view.start()
        # Each operation once, the moment it starts waiting for approval, until the run closes.
        async for approval in request.approvals():
            await _answer_approval(request, approval.operation_id, mode, view, session)
        return await request.result()
    finally:
        view.stop()
        for task in (following, writing):
            if task is not None:
                task.cancel()
        if mode.stdin is not None:
            mode.stdin.close()


@dataclass
class _Outcome:
    workflow_id: str
    result: AgentResult | None = None
    failure: str | None = None
    # For a workflow that failed without a report: its ledger (None: it could not be read now).
    operations: list[OperationRecord] | None = None


async def _ask(
    question: str,
    actor: Actor,
    spec: ModelSpec,
    limits: Limits,
    settings: Settings,
    request_id: str | None,
    show: bool,
    mode: ApprovalMode,
    session: _Session,
    signing_key: str | None,
    allowed_tools: list[str] | None = None,
    thread_id: str | None = None,
) -> _Outcome:
    async with contextlib.AsyncExitStack() as opened:
        # The model's text as it is written, shown in the live view on a terminal (TOOLLOOP_LIVE_TEXT_URL).
        live = None
        if show and settings.live_text_url:
            live = await opened.enter_async_context(LiveTextStore(settings.live_text_url))
        client = await _connect(settings, signing_key, live_text=live)
        register = await missing_search_attributes(client.temporal)
        if register is not None:
            _fail(
                f"Temporal at {settings.temporal_address} has no toolloop search attributes in namespace "
                f"{settings.temporal_namespace}; register them once with: {register}"
            )
        # Without an id of the user's, the new one starts with the question's first words: the UI's default list
        # shows the workflow id, so each request there says what it asked. Chosen here, before anything is sent,
        # so that a Ctrl-C during the start can still name the request.
        request_id = request_id or readable_request_id(question)
        session.workflow_id = client.request(request_id, actor=actor).workflow_id
        outcome = _Outcome(session.workflow_id)
        try:
            if thread_id is not None:
                request, attached = await _send_to_thread(
                    client.thread(thread_id, actor=actor), question, request_id, spec, limits, allowed_tools, session
                )
            else:
                # A request id is never used twice: while its history is kept, the same id gives back its run.
                request = await client.start(
                    question, actor=actor, request_id=request_id, model=spec, limits=limits, tools=allowed_tools
                )
                attached = request.attached
        except RequestNotFound:
            _not_found(session.workflow_id, actor)
        except RequestIdReused:
            # The same id with another question (or model, limits, tools): never the earlier run shown as this
            # one's answer, nor its waiting writes decided as if they were this question's.
            tail = f"{session.workflow_id} --user {actor.user_id} --tenant {actor.tenant_id}"
            _fail(
                f"request {request_id} was started with another question; ask this one with another --request-id, "
                f"or see that one with `{' '.join([_cli_command(), 'result', tail, *_PRINTED_FLAGS])}`"
            )
        if attached:
            err_console.print(
                Text(f"request {request_id} exists already: showing its run (the same question, not asked again)")
            )
        try:
            outcome.result = await _watch(request, show, mode, session)
        except WorkflowFailureError as exc:
            # A run that failed without a report (terminated, say); a failed request's report is its result.
            outcome.failure = _why_failed(exc)
            outcome.operations = await _ledger_left(request)
        return outcome


async def _ledger_left(request: ToolloopRequest) -> list[OperationRecord] | None:
    """The ledger a run that ended without its report left (a closed run answers the query: its worker replays
    it); None when no worker can read it now - never an empty list passed off as "no writes"."""
    try:
        return await request.operations()
    except (RPCError, WorkflowQueryFailedError):
        return None


async def _send_to_thread(
    thread: ToolloopThread,
    question: str,
    request_id: str,
    spec: ModelSpec,
    limits: Limits,
    allowed_tools: list[str] | None,
    session: _Session,
) -> tuple[ToolloopRequest, bool]:
    """Send the question as the thread's next message and wait for its turn: (its request, whether the message
    was there already)."""
    try:
        accepted = await thread.send(question, request_id=request_id, model=spec, limits=limits, tools=allowed_tools)
    except (ThreadBusy, ThreadClosed) as exc:
        # Not a connection problem, and nothing was sent: one line, and the thread as it was.
        _fail(str(exc), code=1)
    err_console.print(Text(f"thread {thread.thread_id}, message {accepted.number}"))
    if accepted.ahead:
        err_console.print(Text(f"queued: {accepted.ahead} earlier message(s) of this thread run first"))
        session.queued_resume = _resume_command(thread.thread_id, request_id)
    try:
        request = await thread.request(accepted)
    except MessageRefused as exc:
        _fail(f"thread {thread.thread_id}: {exc}", code=1)
    session.queued_resume = None  # started: a Ctrl-C from now on leaves a request that `result` finds
    return request, accepted.attached


def _resume_command(thread_id: str, request_id: str) -> str:
    """This very `ask`, as a command that follows its message again: its arguments, with the thread's id for
    `--thread new` and the message's request id (the same submission attaches to the message)."""
    args = sys.argv[1:]
    resumed: list[str] = []
    skip = False
    for before, arg in zip(["", *args], args, strict=False):
        if skip:
            skip = False
            continue
        if arg in ("--thread", "--request-id"):
            skip = True
            continue
        if arg.startswith(("--thread=", "--request-id=")):
            continue
        if before == "--model" or arg.startswith("--model="):
            arg = _script_named_absolute(arg)
        resumed.append(arg)
    at = resumed.index("ask") + 1 if "ask" in resumed else 0
    resumed[at:at] = ["--thread", thread_id, "--request-id", request_id]
    return " ".join([_cli_command(), *(shlex.quote(a) for a in resumed)])


def _script_named_absolute(model: str) -> str:
    """`script:FILE` (or `--model=script:FILE`) with FILE absolute: the printed command runs from any directory."""
    prefix, _, value = model.partition("=") if model.startswith("--model=") else ("", "", model)
    if not value.startswith("script:"):
        return model
    named = f"script:{Path(value.removeprefix('script:')).resolve()}"
    return f"{prefix}={named}" if prefix else named


def _show_run_without_report(
    workflow_id: str,
    failure: str | None,
    operations: list[OperationRecord] | None,
    settings: Settings,
    *,
    as_json: bool,
    thread: str | None = None,
) -> int:
    """Print a run that ended without its report (terminated, timed out) as ask and result do, with the writes
    its ledger shows; returns the exit code, by the same rule as a report's (outcome_without_report): a write
    it may have sent, or a ledger nobody can read now, is unknown."""
    outcome = outcome_without_report(operations)
    # As they were left: a stopped run waits for no approval and sends nothing more.
    operations = left_mid_way(operations) if operations is not None else None
    unknown_until_read = "treat them as unknown until they are"
    if as_json:
        failed = {
            "workflow_id": workflow_id,
            "status": "failed",
            "outcome": outcome,
            "stop_reason": None,
            "final_text": None,
            "rounds": 0,
            "calls": [],
            "error": failure
            if operations is not None
            else f"{failure}; its writes could not be read now: {unknown_until_read}",
            # null, not []: nobody can say now that it made no write.
            "operations": [op.model_dump(mode="json") for op in operations] if operations is not None else None,
            **({"thread_id": thread} if thread is not None else {}),
        }
        print(json.dumps(failed))
    else:
        err_console.print(Text.assemble(("The workflow failed: ", "red"), str(failure)))
        if operations is None:
            err_console.print(Text(f"Its writes could not be read now: {unknown_until_read}.", style="yellow"))
        elif operations:
            _print_receipt(operations)
        err_console.print(f"Temporal UI: {settings.ui_url(workflow_id)}")
    return EXIT_CODES[outcome]


def _exit_code(status: RunStatus, operations: list[OperationRecord], calls: Sequence[CallRecord] = ()) -> int:
    """The table in the README, from the library's one rule (toolloop's outcome_of)."""
    return EXIT_CODES[outcome_of(status, operations, calls)]


def _print_result(result: AgentResult, settings: Settings) -> None:
    console = Console(soft_wrap=True)
    if result.final_text:
        # The model's text is data: never interpret it as rich markup ("[offline model]" is not a tag).
        console.print(result.final_text, markup=False, highlight=False)
    elif any(op.state not in NOT_DONE_STATES for op in result.operations):
        console.print(
            f"[yellow]No answer:[/] the request stopped ({result.stop_reason}) after side effects were made or "
            "attempted: see the receipt."
        )
    else:
        console.print(f"[yellow]No answer:[/] the request stopped ({result.stop_reason}).")
    if result.error:
        err_console.print(Text(result.error, style="red"))
    calls = ", ".join(f"{c.tool}={'ok' if c.ok else c.code}" for c in result.calls) or "none"
    err_console.print(
        Text(
            f"status {result.status}, stop {result.stop_reason}, rounds {result.rounds}, "
            f"model {result.model_label}, calls: {calls}",
            style="dim",
        )
    )
    tokens = usage_line(result.usage)  # None when the model reported no usage (the offline and script models)
    if tokens is not None:
        err_console.print(Text(tokens, style="dim"))
    if result.operations:
        _print_receipt(result.operations)
    err_console.print(f"Temporal UI: {settings.ui_url(result.workflow_id)}")


_STATE_WORDS = {
    "verified": ("done, verified by read-back", "green"),
    "completed": ("done per the service, NOT verified", "yellow"),
    "unknown": ("UNKNOWN whether it happened", "bold red"),
    "failed": ("not done (refused, or the service could not be reached)", "yellow"),
    "denied": ("rejected by the user, not sent", "yellow"),
    "expired": ("no approval in time, not sent", "yellow"),
}


def _print_receipt(operations: list[OperationRecord]) -> None:
    """What really happened, from the workflow's ledger, whatever the model's text says. Plain lines,
    never a table: piped or logged, every tool name, argument and state is kept whole."""
    err_console.print(Text("Receipt", style="bold"))
    for op in operations:
        words, style = _STATE_WORDS.get(op.state, (f"{op.state} (not settled)", "bold red"))
        err_console.print(Text.assemble("  ", (op.tool, "bold"), f" {op.operation_id}: ", (words, style)))
        err_console.print(Text(f"    arguments: {json.dumps(op.arguments, ensure_ascii=False, sort_keys=True)}"))
        if op.note:
            err_console.print(Text(f"    note: {op.note}"))
        approval = f"{op.approval.decision} by {op.approval.by}" if op.approval else "none"
        checks = ", ".join(c.state for c in op.status_checks) or "none"
        err_console.print(Text(f"    approval: {approval}; attempts: {op.attempts}; status checks: {checks}"))
        line = _policy_line(op)
        if line is not None:
            err_console.print(Text(f"    {line}"))


def _short_version(version: str) -> str:
    """A policy version as the receipt shows it: its digest's first 12 hex digits ("sha256:1a2b3c4d5e6f")."""
    kind, sep, digest = version.partition(":")
    return f"{kind}:{digest[:12]}" if sep else version[:12]


def _policy_line(op: OperationRecord) -> str | None:
    """For a write decided by the approval policy: which rule decided it, or which people did under which
    rule, and the policy's version (short). None without a policy."""
    policy = op.policy
    if policy is None:
        return None
    rules = ", ".join(policy.rules) or "no rule"
    if policy.verdict == "allow":
        decided = f"approved by rule {rules}"
    elif policy.verdict == "deny":
        decided = f"denied by rule {rules}" + (f" ({policy.reason})" if policy.reason else "")
    elif op.approval is not None and op.approval.decision == "approved":
        # The people whose approvals counted (four eyes: both, in order).
        decided = f"approved by {', '.join(policy.approved_by) or op.approval.by} under rule {rules}"
    elif op.approval is not None:
        decided = f"rejected by {op.approval.by} under rule {rules}"
    else:
        asked = policy.deciders.describe() if policy.deciders is not None else "nobody"
        so_far = f"; approved so far by {', '.join(policy.approved_by)}" if policy.approved_by else ""
        decided = f"left to {asked} by rule {rules}, not decided{so_far}"
    return f"policy: {decided}; version {_short_version(policy.version)}"


def _interrupted(session: _Session, actor: Actor) -> NoReturn:
    err_console.print()
    if session.workflow_id is None:
        err_console.print("interrupted before the request started")
        raise typer.Exit(EXIT_INTERRUPTED)
    if session.queued_resume is not None:
        err_console.print(
            "interrupted: the message stays queued in its thread and runs when its turn comes; follow it again "
            f"with `{session.queued_resume}`"
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    message = f"interrupted: request {session.workflow_id} keeps running in the background"
    tail = f"{session.workflow_id} --user {actor.user_id} --tenant {actor.tenant_id}"
    message += f"; get its result with `{' '.join([_cli_command(), 'result', tail, *_PRINTED_FLAGS])}`"
    for operation_id in sorted(session.pending):
        approve, reject = _decide_commands(session.workflow_id, operation_id, actor)
        message += f"; it waits for approval of {operation_id}: approve with `{approve}`, reject with `{reject}`"
    err_console.print(message)
    raise typer.Exit(EXIT_INTERRUPTED)


_LIMIT_OPTIONS = {
    "max_rounds": "--max-rounds",
    "max_calls_per_round": "--max-calls-per-round",
    "max_total_calls": "--max-total-calls",
    "deadline_seconds": "--deadline-seconds",
    "approval_ttl_seconds": "--approval-ttl-seconds",
    "max_total_tokens": "--max-total-tokens",
    "max_cost": "--max-cost",
}


@app.command()
def ask(
    request: Annotated[str, typer.Argument(help="What the user asks, e.g. 'Where is my order A100?'")],
    user: Annotated[str, typer.Option(help="The session's user (identity comes from here, never the model).")],
    tenant: Annotated[str, typer.Option(help="The session's tenant.")] = "acme",
    model: Annotated[
        str | None,
        typer.Option(
            help="offline | openai[:MODEL] | script:FILE | NAME[:MODEL] of a model the worker has "
            "(default: openai if OPENAI_API_KEY is set)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
    request_id: Annotated[
        str | None,
        typer.Option(
            help="Idempotent request id, scoped to this user and tenant: the same id never starts a "
            "second run and gives back the first run's result."
        ),
    ] = None,
    local_stack: Annotated[
        bool, typer.Option(help="Start or reuse the local stack; --no-local-stack uses TEMPORAL_ADDRESS as is.")
    ] = True,
    max_rounds: Annotated[int | None, typer.Option(help="Model rounds limit (default 8).")] = None,
    max_calls_per_round: Annotated[int | None, typer.Option(help="Tool calls per round limit (default 8).")] = None,
    max_total_calls: Annotated[int | None, typer.Option(help="Tool calls per request limit (default 32).")] = None,
    deadline_seconds: Annotated[float | None, typer.Option(help="Overall deadline in seconds (default 600).")] = None,
    approval_ttl_seconds: Annotated[
        float | None, typer.Option(help="How long a side effect waits for approval (default 300).")
    ] = None,
    max_total_tokens: Annotated[
        int | None,
        typer.Option(help="Token budget: no model turn once the turns so far used this many (default: none)."),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option(help="Cost budget, in the unit of the worker's TOOLLOOP_MODEL_PRICES (default: none)."),
    ] = None,
    auto_approve: Annotated[
        bool, typer.Option(help="Approve every side effect without asking. For demos and tests only.")
    ] = False,
    allow_tool: Annotated[
        list[str] | None,
        typer.Option(help="Only this tool for this request (repeat it for several); default: every tool."),
    ] = None,
    thread: Annotated[
        str | None,
        typer.Option(
            help="Ask in this thread (a conversation, scoped to this user and tenant): the request is shown the "
            "thread's earlier messages, and runs after them. 'new' starts a thread and prints its id."
        ),
    ] = None,
) -> None:
    """Run one request as a durable workflow and print the answer."""
    # Every input is checked before anything starts: bad input is one line and exit 2.
    request = request.strip()
    if not request:
        _fail("the question is empty")
    actor = _actor(user, tenant)
    overrides = {
        "max_rounds": max_rounds,
        "max_calls_per_round": max_calls_per_round,
        "max_total_calls": max_total_calls,
        "deadline_seconds": deadline_seconds,
        "approval_ttl_seconds": approval_ttl_seconds,
        "max_total_tokens": max_total_tokens,
        "max_cost": max_cost,
    }
    try:
        limits = Limits(**{k: v for k, v in overrides.items() if v is not None})
        AgentInput(request=request, actor=actor, allowed_tools=allow_tool)
    except ValidationError as exc:
        _fail(_one_line(exc, {**_LIMIT_OPTIONS, "request": "the question"}))
    if request_id is not None and not REQUEST_ID.fullmatch(request_id):
        _fail("--request-id: use 1-64 ASCII letters, digits and _ . - (starting with a letter or digit)")
    if thread == "new":
        thread = readable_request_id(request)
    elif thread is not None and not THREAD_ID.fullmatch(thread):
        _fail("--thread: 'new', or 1-64 ASCII letters, digits and _ . - (starting with a letter or digit)")
    settings = _read(Settings)
    spec = _model_spec(model, settings)
    if not local_stack and auto_approve and settings.approval_key is None:
        _fail("--auto-approve needs the approval channel's key: set TOOLLOOP_APPROVAL_KEY, or use the local stack")

    _printed_for(settings, local_stack)
    status: StackStatus | None = None
    if local_stack:
        settings = _settings_for_local_stack(settings)
        _check_local_worker_has(spec, allow_tool, settings)
        status = _up(settings, quiet=as_json)
    key = _approval_key(settings, local_stack)
    _check_signing_key(key)
    _check_user(settings, actor, local_stack)
    show = not as_json and sys.stderr.isatty()
    mode = ApprovalMode(
        auto=auto_approve,
        interactive=sys.stdin.isatty() and sys.stderr.isatty(),
        roles=_session_roles(settings, actor, local_stack),
    )
    session = _Session()
    try:
        outcome = asyncio.run(
            _ask(request, actor, spec, limits, settings, request_id, show, mode, session, key, allow_tool, thread)
        )
    except KeyboardInterrupt:
        _interrupted(session, actor)
    except typer.Exit:
        raise
    except RPCError as exc:  # a namespace that does not exist, say
        _fail(f"Temporal at {settings.temporal_address} refused it: {exc.message}", code=1)
    except RuntimeError as exc:  # connection problems from the Temporal client
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {exc}")
    if outcome.result is None:
        code = _show_run_without_report(
            outcome.workflow_id, outcome.failure, outcome.operations, settings, as_json=as_json, thread=thread
        )
    else:
        if as_json:
            shown = outcome.result.model_dump(mode="json")
            print(json.dumps({**shown, "thread_id": thread} if thread is not None else shown))
        else:
            _print_result(outcome.result, settings)
        code = _exit_code(outcome.result.status, outcome.result.operations, outcome.result.calls)
    if thread is not None and not as_json:
        follow_up = [_cli_command(), "ask", "--user", actor.user_id, "--tenant", actor.tenant_id, "--thread", thread]
        err_console.print(Text(f"Continue this thread with: {' '.join([*follow_up, *_PRINTED_FLAGS])} QUESTION"))
    if status is not None and status.started:
        err_console.print(
            f"The local stack keeps running in the background (Temporal UI: {settings.ui_url()}). "
            f"Stop it with: {_cli_command()} down"
        )
    raise typer.Exit(code)


# --- approve / reject ------------------------------------------------------------------------------


async def _decide_from_shell(
    workflow_id: str,
    operation_id: str,
    approve: bool,
    actor: Actor,
    roles: tuple[str, ...],
    settings: Settings,
    key: str,
) -> DecisionReceipt:
    client = await _connect(settings, signing_key=key)
    # Whose request it is, and whether the session may decide the operation, is checked before anything is shown.
    request = await client.request_to_decide(workflow_id, actor)
    if request is None:  # none, or another tenant's
        _not_found(workflow_id, actor)
    if request.actor != actor:
        # Another user's request of the tenant: only an operation its policy leaves to this session (by name or
        # role); anything else gets exactly the answer a missing request gets, and nothing of it is shown.
        # One that cannot be asked now gets the missing request's answer too: nothing of it is told.
        approval = await request.approval_if_askable(operation_id)
        if approval is None or not approval.may_decide(actor.user_id, roles):
            _not_found(workflow_id, actor)
        await request.raise_if_finished()
    else:
        await request.raise_if_finished()
        approval = await request.approval(operation_id)
        if approval is None:
            names = ", ".join(op.operation_id for op in await request.operations()) or "none"
            _fail(f"request {workflow_id} has no operation {operation_id}; it has: {names}")
        if approval.state == "awaiting_approval" and not approval.may_decide(actor.user_id, roles):
            _fail(_not_yours(approval, actor.user_id), code=1)
    _show_request(approval, workflow_id, actor)
    return await request.decide(approval, approve=approve, decider=actor, roles=roles)


def _decide(
    workflow_id: str, operation_id: str, approve: bool, user: str | None, tenant: str, local_stack: bool
) -> None:
    actor = _actor(user, tenant)
    if not OPERATION_ID.match(operation_id):
        _fail(f"{operation_id!r} is not an operation id: op_ and 32 hex digits, as ask and approvals print it")
    raw = _read(Settings)
    _printed_for(raw, local_stack)
    settings = _settings_for_local_stack(raw) if local_stack else raw
    key = _approval_key(settings, local_stack)
    if key is None:
        _fail("no approval key: set TOOLLOOP_APPROVAL_KEY, or use the local stack")
    _check_signing_key(key)
    _check_user(settings, actor, local_stack)
    roles = _session_roles(settings, actor, local_stack)
    try:
        op = asyncio.run(_decide_from_shell(workflow_id, operation_id, approve, actor, roles, settings, key))
    except WorkflowUpdateFailedError as exc:
        _fail(f"the workflow refused it: {exc.cause}", code=1)
    except ApprovalRefused as exc:
        _fail(str(exc), code=1)
    except RPCError as exc:
        _fail(f"Temporal refused it: {exc}", code=1)
    except typer.Exit:
        raise
    except RuntimeError as exc:
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {exc}")
    waits = "; it waits for another person" if op.state == "awaiting_approval" else ""
    err_console.print(Text(f"{op.operation_id} is now {op.state}{waits}", style="green"))


_DecideUser = Annotated[
    str | None,
    typer.Option(
        "--user",
        "--as",
        help="The session's user: the request's own user decides, or whom its approval policy names (by name, or "
        "by a role the local stack's tokens file gives them).",
    ),
]
_DecideTenant = Annotated[str, typer.Option(help="The session's tenant.")]


@app.command()
def approve(
    workflow_id: Annotated[str, typer.Argument(help="The request's workflow id (printed by ask).")],
    operation_id: Annotated[str, typer.Argument(help="The operation waiting for approval (op_...).")],
    user: _DecideUser = None,
    tenant: _DecideTenant = "acme",
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address and approval key.")] = True,
) -> None:
    """Approve one side effect of your running request, or one an approval policy leaves to you (see
    `approvals`): shows it whole, signs exactly it, sends it."""
    _decide(workflow_id, operation_id, True, user, tenant, local_stack)


@app.command()
def reject(
    workflow_id: Annotated[str, typer.Argument(help="The request's workflow id (printed by ask).")],
    operation_id: Annotated[str, typer.Argument(help="The operation waiting for approval (op_...).")],
    user: _DecideUser = None,
    tenant: _DecideTenant = "acme",
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address and approval key.")] = True,
) -> None:
    """Reject one side effect of your running request, or one an approval policy leaves to you (signed like an
    approval): nothing is sent."""
    _decide(workflow_id, operation_id, False, user, tenant, local_stack)


@app.command()
def approvals(
    user: Annotated[str | None, typer.Option("--user", "--as", help="The session's user: the decider.")] = None,
    tenant: _DecideTenant = "acme",
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address and tokens file.")] = True,
) -> None:
    """List the side effects waiting now that you may decide across your tenant's running requests: your own,
    and those whose approval policy names you or a role of yours (on the local stack, the roles its tokens
    file gives you). Each with its request, requester, tool, the rule that asked, who approved it so far, and
    the exact approve/reject commands."""
    actor = _actor(user, tenant)
    raw = _read(Settings)
    _printed_for(raw, local_stack)
    settings = _settings_for_local_stack(raw) if local_stack else raw
    _check_user(settings, actor, local_stack)
    roles = _session_roles(settings, actor, local_stack)
    try:
        found = asyncio.run(_to_decide(actor, roles, settings))
    except RPCError as exc:
        _fail(f"Temporal refused it: {exc}", code=1)
    except RuntimeError as exc:
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {exc}")
    listed, complete = found
    as_whom = f"{actor.user_id} in tenant {actor.tenant_id}" + (f" (roles: {', '.join(roles)})" if roles else "")
    incomplete = "this list may leave some out: more requests run than were read, or one could not be asked just now"
    if not listed:
        print(f"nothing waits for a decision of {as_whom}" if complete else f"none found for {as_whom}; {incomplete}")
        return
    print(f"{len(listed)} operation(s) wait for a decision of {as_whom}:")
    if not complete:
        print(incomplete)
    for workflow_id, requester, approval in listed:
        print(f"request {workflow_id} (requested by {requester})")
        print(f"  operation: {approval.operation_id}")
        print(f"  tool:      {approval.tool}")
        print(f"  arguments: {json.dumps(approval.arguments, ensure_ascii=False, sort_keys=True)}")
        if approval.policy is not None:
            asked = approval.policy.deciders.describe() if approval.policy.deciders is not None else "nobody"
            print(f"  rules:     {', '.join(approval.policy.rules) or 'none'} (it waits for {asked})")
            if approval.policy.approved_by:
                print(f"  approved so far by: {', '.join(approval.policy.approved_by)}")
        if approval.approval_expires_at is not None:
            print(f"  waits until {approval.approval_expires_at.isoformat()}")
        approve_command, reject_command = _decide_commands(workflow_id, approval.operation_id, actor)
        print(f"  approve:   {approve_command}\n  reject:    {reject_command}")


async def _to_decide(
    actor: Actor, roles: tuple[str, ...], settings: Settings
) -> tuple[list[tuple[str, str, ApprovalRequest]], bool]:
    """(workflow id, requester, operation) of each operation waiting for the session's decision, and whether
    that is all (ToolloopClient.to_decide)."""
    client = await _connect(settings)
    found = await client.to_decide(actor, roles)
    return [
        (request.workflow_id, request.actor.user_id, approval) for request, approval in found.approvals
    ], found.complete


@app.command()
def cancel(
    workflow_id: Annotated[str, typer.Argument(help="The request's workflow id (printed by ask).")],
    user: _DecideUser = None,
    tenant: _DecideTenant = "acme",
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address.")] = True,
) -> None:
    """Cancel your running request: it sends nothing more, settles what is in flight, and reports; prints
    its receipt, with the exit status ask would have given."""
    _report_of_own_request(workflow_id, user, tenant, local_stack, as_json=False, cancel=True)


@app.command()
def result(
    workflow_id: Annotated[str, typer.Argument(help="The request's workflow id (printed by ask).")],
    user: _DecideUser = None,
    tenant: _DecideTenant = "acme",
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Wait for your request's result (after Ctrl-C in ask, say) and print its receipt, with the exit status
    ask would have given."""
    _report_of_own_request(workflow_id, user, tenant, local_stack, as_json=as_json, cancel=False)


def _report_of_own_request(
    workflow_id: str, user: str | None, tenant: str, local_stack: bool, *, as_json: bool, cancel: bool
) -> NoReturn:
    """The session's own request's report (cancelled first if asked), printed as ask prints it, and exit as
    ask would have; another user's request looks like a missing one."""
    actor, settings = _session_of(user, tenant, local_stack)
    try:
        report = asyncio.run(_own_report(workflow_id, actor, settings, cancel=cancel))
    except typer.Exit:
        raise
    except RPCError as exc:
        _fail(f"Temporal refused it: {exc}", code=1)
    except RuntimeError as exc:
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {exc}")
    if isinstance(report, _Outcome):
        # A run that ended without a report (terminated, say): what its ledger shows, as ask shows it.
        raise typer.Exit(
            _show_run_without_report(workflow_id, report.failure, report.operations, settings, as_json=as_json)
        )
    if as_json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        _print_result(report, settings)
    raise typer.Exit(_exit_code(report.status, report.operations, report.calls))


async def _own_report(workflow_id: str, actor: Actor, settings: Settings, *, cancel: bool) -> AgentResult | _Outcome:
    request = await _own_request(await _connect(settings), workflow_id, actor)
    if cancel:
        await request.cancel()
    try:
        return await request.result()
    except WorkflowFailureError as exc:
        return _Outcome(workflow_id, failure=_why_failed(exc), operations=await _ledger_left(request))


@app.command("close-thread")
def close_thread(
    thread_id: Annotated[str, typer.Argument(help="Your thread's id (ask --thread printed it).")],
    user: _DecideUser = None,
    tenant: _DecideTenant = "acme",
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address.")] = True,
) -> None:
    """Close your thread: it takes no new message; the messages it accepted still run, one after another, and
    then it ends. Another user's thread looks like a missing one."""
    if not THREAD_ID.fullmatch(thread_id):
        _fail("THREAD_ID: 1-64 ASCII letters, digits and _ . - (starting with a letter or digit)")
    actor, settings = _session_of(user, tenant, local_stack)
    try:
        messages, was_running = asyncio.run(_close_thread(thread_id, actor, settings))
    except ThreadNotFound:
        _fail(f"no thread {thread_id} for user {actor.user_id!r} in tenant {actor.tenant_id!r}")
    except WorkflowUpdateFailedError as exc:
        _fail(f"thread {thread_id} was not closed: {exc.cause or exc}", code=1)
    except RPCError as exc:
        _fail(f"Temporal refused it: {exc}", code=1)
    except RuntimeError as exc:
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {exc}")
    if not was_running:
        print(f"Thread {thread_id} had already ended: {len(messages)} messages.")
        return
    left = sum(1 for m in messages if m.state in ("queued", "running"))
    then = f"{left} still to run, then it ends" if left else "it ends now"
    print(f"Closed thread {thread_id}: {len(messages)} messages; {then}.")


async def _close_thread(thread_id: str, actor: Actor, settings: Settings) -> tuple[list[MessageRecord], bool]:
    """The thread's messages once closed, and whether its workflow was still running (closed by this)."""
    thread = (await _connect(settings)).thread(thread_id, actor=actor)
    try:
        running = (await thread.handle.describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise ThreadNotFound(thread_id) from None
        raise
    return await thread.close(), running


def _session_of(user: str | None, tenant: str, local_stack: bool) -> tuple[Actor, Settings]:
    """The session's actor and settings (the local stack's address unless told otherwise), the user checked."""
    actor = _actor(user, tenant)
    settings = _read(Settings)
    if local_stack:
        settings = _settings_for_local_stack(settings)
    _check_user(settings, actor, local_stack)
    return actor, settings


# --- the local stack -----------------------------------------------------------------------------------


@app.command()
def up(
    policy: Annotated[
        bool | None,
        typer.Option(
            "--policy/--no-policy",
            help="Decide writes by the demo's approval policy (config/policies/demo.cedar): also runs its policy "
            "worker, with a policy key kept in the data dir, and gives the service and the worker the policy. The "
            "choice is kept in the data dir (ask keeps it) until --no-policy. Default: as the stack was (off).",
        ),
    ] = None,
) -> None:
    """Start (or reuse) the local stack: Temporal dev server with UI, business service, worker, HTTP API (and
    with --policy the approval policy's worker)."""
    raw = _read(Settings)
    _printed_for(raw, local_stack=True)
    settings = _settings_for_local_stack(raw)
    _up(settings, quiet=False, policy=policy)
    _print_status(settings)


@app.command()
def down() -> None:
    """Stop the processes this data dir's state recorded (data is kept), and say exactly what it stopped;
    exit 1 when it stopped nothing."""
    stack = LocalStack(_settings_for_local_stack(_read(Settings)), REPO_ROOT)
    try:
        report = stack.down()
    except StackError as exc:
        _fail(str(exc), code=1)
    if not report.stopped:
        gone = [c for c in report.components if c.outcome == "exited"]
        found = (
            f"the processes it recorded ({', '.join(f'{c.label} pid {c.pid}' for c in gone)}) had exited"
            if gone
            else "it records none"
        )
        _fail(f"stopped nothing: no process of data dir {report.data_dir} runs ({found}){_held(stack)}", code=1)
    for c in report.components:
        if c.outcome == "stopped":
            print(f"stopped {c.label} (pid {c.pid}, {c.address})")
        elif c.outcome == "exited":
            print(f"{c.label}: not running (its recorded pid {c.pid} had exited)")
        else:
            print(f"{c.label}: none recorded in data dir {report.data_dir}")


def _held(stack: LocalStack) -> str:
    """What else holds the ports these settings name: a stack started with other settings, say."""
    held = stack.ports_held()
    if not held:
        return "; nothing listens on the ports these settings name"
    return (
        f"; port {', '.join(held)} is held by a process this data dir did not start (to stop a stack started with "
        "other TOOLLOOP_* settings, run down with those settings)"
    )


@app.command()
def status() -> None:
    """Show which processes of this data dir's stack run, as checked now: each recorded process (alive and
    still running its recorded command), its address (answering or not), and any port held by another program."""
    raw = _read(Settings)
    _printed_for(raw, local_stack=True)
    _print_status(_settings_for_local_stack(raw))


def _print_status(settings: Settings) -> None:
    stack = LocalStack(settings, REPO_ROOT)
    try:
        report = stack.status()
    except StackError as exc:
        _fail(str(exc), code=1)
    for c in report.components:
        if c.running:
            answering = "" if c.healthy else f"; it does not answer at {c.address}"
            print(f"{c.label}: running (pid {c.pid}, {c.address}){answering}")
        elif c.recorded_pid is not None:
            print(f"{c.label}: not running (its recorded pid {c.recorded_pid} has exited)")
        else:
            print(f"{c.label}: none recorded in data dir {report.data_dir}")
    if not any(c.running for c in report.components):
        print(f"no process of data dir {report.data_dir} runs{_held(stack)}")
    elif report.temporal.running:
        print(f"Temporal UI: {settings.ui_url()}")
    if report.policy_on:
        print(f"approval policy: on ({report.policy_file})")
    else:
        print(f"approval policy: off; turn it on with: {_cli_command()} up --policy")


# --- the HTTP API ---------------------------------------------------------------------------------------


def _listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on host:port, one per address the host resolves to, as asyncio's create_server binds
    them (uvicorn's own way): OSError (strerror says why) if one cannot be had, and none is left open."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


async def _serve_api(settings: ApiSettings, host: str, port: int, tokens: TokenMap, signing_key: str | None) -> None:
    import uvicorn

    from toolloop._api.app import ApiConfig, create_app

    runtime = metrics_runtime(settings.api_metrics_address)
    try:
        client = await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            data_converter=data_converter(),
            runtime=runtime,
            interceptors=[tracing_interceptor()] if settings.otel else [],
        )
    except RuntimeError as exc:
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {str(exc).splitlines()[0]}", code=1)
    config = ApiConfig(
        task_queue=settings.task_queue,
        tokens=tokens,
        signing_key=signing_key,
        default_model=settings.api_default_model,
        meter=runtime.metric_meter if runtime is not None else None,
        live_text=LiveTextStore(settings.live_text_url) if settings.live_text_url else None,
    )
    try:
        default = ModelSpec.named(settings.api_default_model)
    except ValueError as exc:
        _fail(f"TOOLLOOP_API_MODEL: {exc}")
    known = config.limits.known_models
    if config.limits.unknown_model(default.provider):
        # Every request that names no model would fail: refuse to start instead.
        _fail(
            f"TOOLLOOP_API_MODEL {settings.api_default_model!r} is not among the worker's models "
            f"(TOOLLOOP_API_MODELS: {', '.join(sorted(known or ()))})"
        )
    refusal = config.limits.model_refusal(default, None)
    if refusal is not None:
        _fail(f"TOOLLOOP_API_MODEL {settings.api_default_model!r}: {refusal[0].removeprefix('model: ')}")
    for grant in tokens.grants():
        # A caller's list naming a model the workers do not serve is a typo that would only show as refusals.
        unknown = sorted((grant.models or frozenset()) - known) if known is not None else []
        if unknown:
            _fail(
                f"tokens file: the token of {grant.actor.user_id}/{grant.actor.tenant_id} names model "
                f"{unknown[0]!r}, which is not among the worker's models ({', '.join(sorted(known or ()))})"
            )
    # log_config=None: uvicorn's records go through the JSON logs; each request has its own line.
    uvicorn_config = uvicorn.Config(
        create_app(client, config), host=host, port=port, log_config=None, access_log=False, log_level="info"
    )
    server = uvicorn.Server(uvicorn_config)
    try:
        # Bound here, so an address that cannot be had (a name that does not resolve, a port in use) is one line.
        listening = _listening_sockets(host, port)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    err_console.print(
        f"api on http://{host}:{port} (docs /docs, page /), temporal {settings.temporal_address}, "
        f"approval key {'set' if signing_key else 'unset: it cannot decide'}"
    )
    try:
        await server.serve(sockets=listening)
    finally:
        if config.live_text is not None:
            await config.live_text.aclose()


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default: TOOLLOOP_API_PORT, 8702).")] = None,
) -> None:
    """Run the HTTP API and its web page: start requests, follow them live, decide their side effects.
    Bearer tokens (TOOLLOOP_API_TOKENS, a JSON file) say whom each caller is; it signs decisions with
    TOOLLOOP_APPROVAL_KEY, as the CLI does."""
    settings = _read(ApiSettings)
    configure_logging("api")
    if settings.otel:
        try:
            configure_otlp_tracing("toolloop-api")
        except RuntimeError as exc:
            _fail(str(exc))
    tokens_path = settings.api_tokens if settings.api_tokens.is_absolute() else REPO_ROOT / settings.api_tokens
    try:
        tokens = TokenMap.load(tokens_path)
    except TokensFileError as exc:
        _fail(str(exc))
    if tokens.holds_published_demo_tokens() and not settings.api_allow_demo_tokens:
        _fail(
            f"{tokens_path} holds the published demo tokens, which anyone can use: give TOOLLOOP_API_TOKENS a "
            "tokens file of your own, or set TOOLLOOP_API_ALLOW_DEMO_TOKENS=true for a local demo"
        )
    signing_key = settings.approval_key.get_secret_value() if settings.approval_key is not None else None
    _check_signing_key(signing_key)
    asyncio.run(_serve_api(settings, host, port or settings.api_port, tokens, signing_key))


@app.command()
def chaos(
    scenarios: Annotated[str, typer.Option(help="Comma list of built-in scenarios (default: all of them).")] = "",
    seeds: Annotated[int, typer.Option(help="How many seeds per scenario (0, 1, ... or from the plan's seed).")] = 1,
    seed: Annotated[int | None, typer.Option(help="Run this one seed (replays a run of the results).")] = None,
    plan: Annotated[Path | None, typer.Option(help="A fault plan of your own (YAML or JSON).")] = None,
    out: Annotated[Path, typer.Option(help="Where chaos.json and chaos.md go.")] = Path("chaos-results"),
    save_histories: Annotated[
        Path | None, typer.Option(help="Save each scenario's first run's history here (tests/histories/chaos).")
    ] = None,
    tools: Annotated[
        str | None,
        typer.Option(help="Your own chaos target, package.module:function returning a faultbed.ChaosTarget."),
    ] = None,
    policies: Annotated[
        bool,
        typer.Option(
            "--policies",
            help="Decide the writes by the demo's approval policy (a policy evaluator, the service checking its "
            "decisions); adds the policy scenarios to the default matrix. Naming a policy scenario turns it on.",
        ),
    ] = False,
) -> None:
    """Break the agent on purpose: run fault scenarios x seeds through the real workflow on a stack of its
    own, check every invariant from the service's records and the histories, and exit non-zero if one broke
    or a fault a scenario needs never fired."""
    from faultbed import cli as chaos_cli
    from faultbed.plan import PlanError
    from faultbed.target import TargetError

    try:
        choice = chaos_cli.choose(scenarios, seeds, seed, plan, out, save_histories, tools, policies)
    except (chaos_cli.ChaosUsageError, PlanError, TargetError) as exc:
        # One line per problem (a plan may have several bad fields), then exit 2.
        *first, last = str(exc).splitlines()
        for line in first:
            err_console.print(Text.assemble(("error: ", "bold red"), line))
        _fail(last)
    try:
        code = chaos_cli.main(choice, lambda line: err_console.print(line))
    except StackError as exc:
        _fail(f"the chaos stack did not start: {exc}", code=1)
    raise typer.Exit(code)


@app.command()
def keygen() -> None:
    """Print a new approval key pair for a deployment: the private key for the approval channel only
    (TOOLLOOP_APPROVAL_KEY), the public one for the business service and starters."""
    signing = generate_signing_key()
    print(f"TOOLLOOP_APPROVAL_KEY={signing}")
    print(f"TOOLLOOP_APPROVAL_VERIFY_KEY={verify_key_for(signing)}")


def main() -> None:
    try:
        result = app(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except typer.TyperException as exc:
        # Usage mistakes (typer's public base of them: a usage error's exit code is 2) get one line too, not a
        # framed help screen.
        err_console.print(Text.assemble(("error: ", "bold red"), exc.format_message(), " (see --help)"))
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        err_console.print("\ninterrupted")
        code = EXIT_INTERRUPTED
    except WorkflowQueryFailedError:
        # Any command that reads a request: one line, whichever step asked.
        err_console.print(Text.assemble(("error: ", "bold red"), UNREADABLE_REQUEST))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # temporalio 1.35 can abort during interpreter teardown ("PyGILState_Release") once a client has
    # run; everything is done and flushed here, so leave with the command's own exit code.
    os._exit(code)


if __name__ == "__main__":
    main()
