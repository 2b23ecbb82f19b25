"""Entry point: run a worker for any user's tools against TEMPORAL_ADDRESS.

    python worker.py --tools package.module:build

`build()` returns a toolloop.Toolset or a toolloop.AgentSpec (tools, models, instructions); the bundled demo
is `--tools demo.agent:build`. TOOLLOOP_TOOLS sets the default."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from pydantic import ValidationError

from toolloop._core.approvals import check_verify_key, verify_key_set
from toolloop._temporal.logs import configure_logging
from toolloop._temporal.settings import WorkerSettings, settings_error
from toolloop._temporal.telemetry import configure_otlp_tracing, metrics_runtime
from toolloop._temporal.worker_factory import (
    ToolsLoadError,
    check_model_names_free,
    connect,
    load_tools,
    running_worker,
)
from toolloop._tools.toolset import AgentSpec

TOOLS_ENV = "TOOLLOOP_TOOLS"


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # Bad input is one line and exit 2, never a usage screen.
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _OneLineParser(prog="python worker.py", description="Run a toolloop worker.")
    parser.add_argument(
        "--tools",
        default=os.environ.get(TOOLS_ENV) or None,
        help=f"package.module:function building the tools (default: ${TOOLS_ENV}); the demo: demo.agent:build",
    )
    return parser.parse_args(argv)


async def _run(settings: WorkerSettings, spec: AgentSpec, target: str) -> None:
    # Temporal's runtime serves the Prometheus endpoint: its own metrics and toolloop's counts.
    client = await connect(settings, metrics_runtime(settings.metrics_address))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_worker(client, settings, spec):
        print(
            f"worker ready task_queue={settings.task_queue} temporal={settings.temporal_address} tools={target} "
            f"({len(spec.tools.registry)} tools) openai={'set' if settings.openai_api_key else 'unset'} "
            f"named_models={','.join(sorted(settings.named_models)) or 'none'} "
            f"metrics={settings.metrics_address or 'off'} tracing={'on' if settings.otel else 'off'} "
            f"approval_verify_keys={len(verify_key_set(settings.approval_verify_key)) or 'unset'} "
            f"scripted_models={'on' if settings.allow_scripted_models else 'off'}",
            flush=True,
        )
        await stop.wait()
    print("worker stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if not args.tools:
        print(
            f"error: --tools is required (or ${TOOLS_ENV}); the bundled demo is --tools demo.agent:build",
            file=sys.stderr,
        )
        return 2
    try:
        settings = WorkerSettings()
    except ValidationError as exc:
        print(f"error: {settings_error(exc)}", file=sys.stderr)
        return 2
    configure_logging("worker")
    if settings.approval_verify_key is not None:
        try:
            check_verify_key(settings.approval_verify_key)
        except ValueError as exc:
            print(f"error: TOOLLOOP_APPROVAL_VERIFY_KEY: {exc}", file=sys.stderr)
            return 2
    if settings.otel:
        try:
            configure_otlp_tracing("toolloop-worker")
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        spec = load_tools(args.tools)
    except ToolsLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        # A named model may not take the name of a model the tools module brings (the demo's offline model).
        check_model_names_free(settings, spec.models)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(settings, spec, args.tools))
    except OSError as exc:  # a tool source that cannot open (an MCP server that does not start, ...)
        print(f"error: a tool source could not be opened: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # the Temporal client's connection errors
        print(
            f"error: cannot reach Temporal at {settings.temporal_address}: {str(exc).splitlines()[0]}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The worker is already shut down; skip interpreter teardown, where temporalio 1.35 can abort
    # with "PyGILState_Release" and turn a clean stop into a crash exit code.
    os._exit(code)
