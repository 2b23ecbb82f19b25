"""Entry point: the CLI. `ask` runs one request as a workflow (starting or reusing the local stack),
shows live progress, and prints the answer with its link in the Temporal UI; `up`/`down`/`status`
manage the local stack."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)
from temporalio.service import RPCError

from agentcore.contracts import Actor, AgentInput, AgentProgress, AgentResult, Limits, ModelSpec
from agentcore.names import AGENT_WORKFLOW, GET_PROGRESS_QUERY, USER_SEARCH_ATTRIBUTE
from devstack.processes import StackError
from devstack.stack import LocalStack
from modeladapters.errors import ScriptError
from modeladapters.script import load_script
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


async def _watch(handle: WorkflowHandle[Any, AgentResult], show: bool) -> AgentResult:
    result_task = asyncio.ensure_future(handle.result())
    if not show:
        return await result_task
    with Live(_progress_view(None, handle.id), console=err_console, transient=True, refresh_per_second=8) as live:
        while not result_task.done():
            try:
                progress = await handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
                live.update(_progress_view(progress, handle.id))
            except RPCError:
                pass  # no worker has picked the workflow up yet; keep waiting
            await asyncio.wait({result_task}, timeout=0.3)
    return await result_task


async def _ask(
    request: str, actor: Actor, spec: ModelSpec, limits: Limits, settings: Settings, request_id: str | None, show: bool
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
        return await _watch(handle, show), workflow_id, None
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
    err_console.print(f"Temporal UI: {settings.ui_url(result.workflow_id)}")


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
    }
    try:
        limits = Limits(**{k: v for k, v in overrides.items() if v is not None})
        actor = Actor(user_id=user, tenant_id=tenant)
    except ValueError as exc:
        _fail(str(exc))
    spec = _model_spec(model, settings)
    show = not as_json and sys.stderr.isatty()
    try:
        result, workflow_id, failure = asyncio.run(_ask(request, actor, spec, limits, settings, request_id, show))
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
    raise typer.Exit(0 if result.status == "completed" else 1)


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


if __name__ == "__main__":
    app()
