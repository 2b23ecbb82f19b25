"""Entry point: the CLI. `ask` runs one request as a workflow (starting or reusing the local stack),
shows live progress, and prints the answer with its link in the Temporal UI; `up`/`down`/`status`
manage the local stack."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)
from temporalio.service import RPCError

from agentcore.contracts import Actor, AgentInput, AgentProgress, AgentResult, Limits, ModelSpec, OperationRecord
from agentcore.names import AGENT_WORKFLOW, GET_PROGRESS_QUERY, USER_SEARCH_ATTRIBUTE
from devstack.processes import StackError
from devstack.stack import LocalStack
from modeladapters.errors import ScriptError
from modeladapters.script import load_script
from orchestrator.approval_channel import ApprovalRefused, send_decision
from orchestrator.converter import data_converter
from orchestrator.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent
USER_KEY = SearchAttributeKey.for_keyword(USER_SEARCH_ATTRIBUTE)

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
err_console = Console(stderr=True, soft_wrap=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(Text.assemble(("error: ", "bold red"), message))
    raise typer.Exit(code)


def _settings_for_local_stack(settings: Settings) -> Settings:
    """The local stack listens on its configured ports; point the client and worker there."""
    return settings.model_copy(
        update={
            "temporal_address": f"127.0.0.1:{settings.temporal_port}",
            "service_url": f"http://127.0.0.1:{settings.service_port}",
        }
    )


def _model_spec(model: str | None, settings: Settings) -> ModelSpec:
    if model is None:
        return ModelSpec(provider="openai") if settings.openai_api_key else ModelSpec(provider="offline")
    if model == "offline":
        return ModelSpec(provider="offline")
    if model == "openai" or model.startswith("openai:"):
        name = model.partition(":")[2] or None
        return ModelSpec(provider="openai", name=name)
    if model.startswith("script:"):
        path = model.partition(":")[2]
        try:
            return ModelSpec(provider="script", script=load_script(path))
        except ScriptError as exc:
            _fail(f"model script {path}: {exc}")
    _fail(f"unknown --model {model!r}; use offline, openai[:NAME] or script:FILE")


def _up(settings: Settings, quiet: bool) -> None:
    stack = LocalStack(settings, REPO_ROOT)
    try:
        if quiet:
            stack.up()
        else:
            with err_console.status("starting the local stack...") as status:
                stack.up(on_step=lambda step: status.update(step))
    except StackError as exc:
        _fail(str(exc))


def _progress_view(progress: AgentProgress | None, workflow_id: str) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_row(Text("request", style="dim"), Text(workflow_id))
    if progress is None:
        table.add_row(Text("phase", style="dim"), Text("starting"))
        return table
    table.add_row(Text("phase", style="dim"), Text(progress.phase, style="bold cyan"))
    for call in progress.calls:
        mark = Text("ok", style="green") if call.ok else Text(call.code or "failed", style="yellow")
        table.add_row(
            Text(f"round {call.round}", style="dim"), Text.assemble(f"{call.tool} ", mark, f" {call.duration_ms} ms")
        )
    for summary in progress.running:
        table.add_row(Text("running", style="dim"), Text(summary, style="cyan"))
    return table


@dataclass
class ApprovalMode:
    """How `ask` answers approval requests: automatically (demos, tests), by asking on the terminal,
    or not at all (another shell runs `starter.py approve`)."""

    auto: bool
    interactive: bool
    key: str | None
    actor: Actor


def _show_operation(op: OperationRecord) -> None:
    err_console.print(Text.assemble(("Approval needed", "bold yellow"), f" for {op.operation_id}"))
    err_console.print(Text(f"  tool:      {op.tool}"))
    err_console.print(Text(f"  arguments: {json.dumps(op.arguments, ensure_ascii=False, sort_keys=True)}"))
    err_console.print(Text(f"  digest:    {op.digest}"))
    if op.approval_expires_at is not None:
        err_console.print(Text(f"  waits until {op.approval_expires_at.isoformat()}"))


async def _answer_approval(
    handle: WorkflowHandle[Any, AgentResult], op: OperationRecord, mode: ApprovalMode, live: Live | None
) -> None:
    if live is not None:
        live.stop()
    _show_operation(op)
    try:
        if mode.auto:
            err_console.print(Text("  --auto-approve: approving without asking (demo/test mode)", style="magenta"))
            approve = True
        elif mode.interactive:
            approve = await asyncio.to_thread(typer.confirm, "  Approve this exact operation?", default=False)
        else:
            err_console.print(
                Text(
                    f"  approve:  python starter.py approve {handle.id} {op.operation_id}\n"
                    f"  reject:   python starter.py reject {handle.id} {op.operation_id}",
                    style="dim",
                )
            )
            return
        await send_decision(handle, op, approve=approve, approver=mode.actor, key=mode.key)
        err_console.print(Text(f"  {'approved' if approve else 'rejected'}", style="green" if approve else "yellow"))
    except (ApprovalRefused, WorkflowUpdateFailedError) as exc:
        cause = exc.cause if isinstance(exc, WorkflowUpdateFailedError) else exc
        err_console.print(Text(f"  not recorded: {cause}", style="red"))
    finally:
        if live is not None:
            live.start()


async def _watch(handle: WorkflowHandle[Any, AgentResult], show: bool, mode: ApprovalMode) -> AgentResult:
    result_task = asyncio.ensure_future(handle.result())
    asked: set[str] = set()
    with Live(
        _progress_view(None, handle.id), console=err_console, transient=True, refresh_per_second=8, auto_refresh=show
    ) as live:
        if not show:
            live.stop()
        while not result_task.done():
            try:
                progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
            except RPCError:
                progress = None  # no worker has picked the workflow up yet; keep waiting
            if progress is not None:
                if show:
                    live.update(_progress_view(progress, handle.id))
                for op in progress.operations:
                    if op.state == "awaiting_approval" and op.operation_id not in asked:
                        asked.add(op.operation_id)
                        await _answer_approval(handle, op, mode, live if show else None)
            await asyncio.wait({result_task}, timeout=0.3)
    return await result_task


async def _ask(
    request: str,
    actor: Actor,
    spec: ModelSpec,
    limits: Limits,
    settings: Settings,
    request_id: str | None,
    show: bool,
    mode: ApprovalMode,
) -> tuple[AgentResult | None, str, str | None]:
    client = await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace, data_converter=data_converter()
    )
    workflow_id = f"ask-{actor.user_id}-{request_id or uuid.uuid4().hex[:12]}"
    handle: WorkflowHandle[Any, AgentResult] = await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(request=request, actor=actor, model=spec, limits=limits),
        id=workflow_id,
        task_queue=settings.task_queue,
        result_type=AgentResult,
        search_attributes=TypedSearchAttributes([SearchAttributePair(USER_KEY, actor.user_id)]),
        static_summary=f"{actor.user_id}: {request[:80]}",
        # With an explicit request id, submitting the same request again attaches to the first run.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING if request_id else WorkflowIDConflictPolicy.FAIL,
    )
    try:
        return await _watch(handle, show, mode), workflow_id, None
    except WorkflowFailureError as exc:
        return None, workflow_id, str(exc.cause or exc)


def _print_result(result: AgentResult, settings: Settings) -> None:
    console = Console(soft_wrap=True)
    if result.final_text:
        # The model's text is data: never interpret it as rich markup ("[offline model]" is not a tag).
        console.print(result.final_text, markup=False, highlight=False)
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
    if result.operations:
        _print_receipt(result.operations)
    err_console.print(f"Temporal UI: {settings.ui_url(result.workflow_id)}")


_STATE_WORDS = {
    "verified": ("done, verified by read-back", "green"),
    "completed": ("done per the service, NOT verified", "yellow"),
    "unknown": ("UNKNOWN whether it happened", "bold red"),
    "failed": ("refused by the service, not done", "yellow"),
    "denied": ("rejected by the user, not sent", "yellow"),
    "expired": ("no approval in time, not sent", "yellow"),
}


def _print_receipt(operations: list[OperationRecord]) -> None:
    """What really happened, from the workflow's ledger, whatever the model's text says."""
    table = Table(title="Receipt")
    table.add_column("operation", overflow="fold")
    for name in ("tool", "arguments", "outcome", "approval", "attempts", "status checks"):
        table.add_column(name)
    for op in operations:
        words, style = _STATE_WORDS.get(op.state, (op.state, "white"))
        approval = f"{op.approval.decision} by {op.approval.by}" if op.approval else "-"
        checks = ", ".join(c.state for c in op.status_checks) or "-"
        table.add_row(
            op.operation_id,
            op.tool,
            Text(json.dumps(op.arguments, ensure_ascii=False, sort_keys=True)),
            Text(words + (f" ({op.note})" if op.note else ""), style=style),
            approval,
            str(op.attempts),
            checks,
        )
    err_console.print(table)


def _approval_key(settings: Settings, local_stack: bool) -> str | None:
    if settings.approval_key is not None:
        return settings.approval_key.get_secret_value()
    if local_stack:
        return LocalStack(settings, REPO_ROOT).approval_key()
    return None


@app.command()
def ask(
    request: Annotated[str, typer.Argument(help="What the user asks, e.g. 'Where is my order A100?'")],
    user: Annotated[str, typer.Option(help="The session's user (identity comes from here, never the model).")],
    tenant: Annotated[str, typer.Option(help="The session's tenant.")] = "acme",
    model: Annotated[
        str | None,
        typer.Option(help="offline | openai[:MODEL] | script:FILE (default: openai if OPENAI_API_KEY is set)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
    request_id: Annotated[
        str | None, typer.Option(help="Idempotent request id: the same id never starts a second workflow.")
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
    auto_approve: Annotated[
        bool, typer.Option(help="Approve every side effect without asking. For demos and tests only.")
    ] = False,
) -> None:
    """Run one request as a durable workflow and print the answer."""
    settings = Settings()
    if local_stack:
        settings = _settings_for_local_stack(settings)
        _up(settings, quiet=as_json)
    overrides = {
        "max_rounds": max_rounds,
        "max_calls_per_round": max_calls_per_round,
        "max_total_calls": max_total_calls,
        "deadline_seconds": deadline_seconds,
        "approval_ttl_seconds": approval_ttl_seconds,
    }
    try:
        limits = Limits(**{k: v for k, v in overrides.items() if v is not None})
        actor = Actor(user_id=user, tenant_id=tenant)
    except ValueError as exc:
        _fail(str(exc))
    spec = _model_spec(model, settings)
    show = not as_json and sys.stderr.isatty()
    mode = ApprovalMode(
        auto=auto_approve,
        interactive=sys.stdin.isatty() and sys.stderr.isatty(),
        key=_approval_key(settings, local_stack),
        actor=actor,
    )
    try:
        result, workflow_id, failure = asyncio.run(_ask(request, actor, spec, limits, settings, request_id, show, mode))
    except RuntimeError as exc:  # connection problems from the Temporal client
        _fail(f"cannot reach Temporal at {settings.temporal_address}: {exc}")
    if result is None:
        if as_json:
            print(
                json.dumps(
                    {
                        "workflow_id": workflow_id,
                        "status": "failed",
                        "stop_reason": None,
                        "final_text": None,
                        "rounds": 0,
                        "calls": [],
                        "error": failure,
                    }
                )
            )
        else:
            err_console.print(Text.assemble(("The workflow failed: ", "red"), str(failure)))
            err_console.print(f"Temporal UI: {settings.ui_url(workflow_id)}")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
    else:
        _print_result(result, settings)
    raise typer.Exit(_exit_code(result))


# Exit codes of `ask`: 0 answered with every side effect settled; 1 stopped or failed; 3 answered, but a
# side effect's outcome is unknown or unverified (the model's text may say "done"; the receipt does not).
EXIT_UNSETTLED = 3


def _exit_code(result: AgentResult) -> int:
    if result.status != "completed":
        return 1
    if any(op.state in ("unknown", "completed") for op in result.operations):
        return EXIT_UNSETTLED
    return 0


async def _decide_from_shell(
    workflow_id: str, operation_id: str, approve: bool, approver: str | None, settings: Settings, key: str | None
) -> OperationRecord:
    client = await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace, data_converter=data_converter()
    )
    handle: WorkflowHandle[Any, AgentResult] = client.get_workflow_handle(workflow_id, result_type=AgentResult)
    progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
    ops = {op.operation_id: op for op in progress.operations}
    if operation_id not in ops:
        _fail(f"workflow {workflow_id} has no operation {operation_id}; it has: {', '.join(ops) or 'none'}")
    if progress.actor is None:
        _fail(f"workflow {workflow_id} does not say whom it acts for")
    op = ops[operation_id]
    _show_operation(op)
    who = Actor(user_id=approver or progress.actor.user_id, tenant_id=progress.actor.tenant_id)
    return await send_decision(handle, op, approve=approve, approver=who, key=key)


def _decide(workflow_id: str, operation_id: str, approve: bool, approver: str | None, local_stack: bool) -> None:
    settings = Settings()
    if local_stack:
        settings = _settings_for_local_stack(settings)
    key = _approval_key(settings, local_stack) if approve else None
    try:
        op = asyncio.run(_decide_from_shell(workflow_id, operation_id, approve, approver, settings, key))
    except WorkflowUpdateFailedError as exc:
        _fail(f"the workflow refused it: {exc.cause}", code=1)
    except (ApprovalRefused, RPCError) as exc:
        _fail(str(exc), code=1)
    err_console.print(Text(f"{op.operation_id} is now {op.state}", style="green"))


@app.command()
def approve(
    workflow_id: Annotated[str, typer.Argument(help="The request's workflow id (printed by ask).")],
    operation_id: Annotated[str, typer.Argument(help="The operation waiting for approval (op_...).")],
    as_user: Annotated[str | None, typer.Option("--as", help="Who approves (default: the request's user).")] = None,
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address and approval key.")] = True,
) -> None:
    """Approve one side effect of a running request: shows it, signs exactly it, sends the approval."""
    _decide(workflow_id, operation_id, True, as_user, local_stack)


@app.command()
def reject(
    workflow_id: Annotated[str, typer.Argument(help="The request's workflow id (printed by ask).")],
    operation_id: Annotated[str, typer.Argument(help="The operation waiting for approval (op_...).")],
    as_user: Annotated[str | None, typer.Option("--as", help="Who rejects (default: the request's user).")] = None,
    local_stack: Annotated[bool, typer.Option(help="Use the local stack's address.")] = True,
) -> None:
    """Reject one side effect of a running request: nothing is sent."""
    _decide(workflow_id, operation_id, False, as_user, local_stack)


@app.command()
def up() -> None:
    """Start (or reuse) the local stack: Temporal dev server with UI, business service, worker."""
    settings = _settings_for_local_stack(Settings())
    _up(settings, quiet=False)
    status()


@app.command()
def down() -> None:
    """Stop the local stack's processes (data is kept)."""
    LocalStack(_settings_for_local_stack(Settings()), REPO_ROOT).down()
    status()


@app.command()
def status() -> None:
    """Show which parts of the local stack run."""
    settings = _settings_for_local_stack(Settings())
    report = LocalStack(settings, REPO_ROOT).status()
    table = Table("component", "state", "pid", "address")
    for component in report.components:
        state = "[green]running[/]" if component.running else "[dim]stopped[/]"
        table.add_row(component.name, state, str(component.pid or "-"), component.address)
    Console().print(table)
    Console().print(f"Temporal UI: {settings.ui_url()}")


def main() -> None:
    try:
        app()  # typer/click always end with SystemExit
        code: int = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    # temporalio 1.35 can abort during interpreter teardown ("PyGILState_Release") once a client has
    # run; everything is done and flushed here, so leave with the command's own exit code.
    os._exit(code)


if __name__ == "__main__":
    main()
