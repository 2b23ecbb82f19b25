"""Entry point: run a worker for any user's tools against TEMPORAL_ADDRESS.

    python worker.py --tools package.module:build
    python worker.py --policy

`build()` returns a toolloop.Toolset or a toolloop.AgentSpec (tools, models, instructions); the bundled demo
is `--tools demo.agent:build`. TOOLLOOP_TOOLS sets the default. `--policy` runs the approval policy's
evaluator instead (TOOLLOOP_POLICY_FILE, TOOLLOOP_POLICY_SCHEMA, TOOLLOOP_POLICY_SIGNING_KEY,
TOOLLOOP_POLICY_TASK_QUEUE; docs/POLICIES.md): the only process that holds the policy's signing key. A policy
that does not load stops it at once, in one line."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from pydantic import ValidationError

from toolloop._core.approvals import check_verify_key, verify_key_for, verify_key_set
from toolloop._core.policies import PolicyError
from toolloop._temporal.logs import configure_logging
from toolloop._temporal.policy_worker import running_policy_worker
from toolloop._temporal.settings import PolicySettings, WorkerSettings, settings_error
from toolloop._temporal.telemetry import configure_otlp_tracing, metrics_runtime
from toolloop._temporal.worker_factory import (
    ToolsLoadError,
    check_model_names_free,
    connect,
    load_tools,
    running_worker,
)
from toolloop._tools.toolset import AgentSpec
from toolloop.activities.policy import PolicySource

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
    parser.add_argument(
        "--policy",
        action="store_true",
        help="run the approval policy's evaluator (TOOLLOOP_POLICY_FILE, _SCHEMA, _SIGNING_KEY, _TASK_QUEUE)",
    )
    return parser.parse_args(argv)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _run_policy(settings: PolicySettings, source: PolicySource, signing_key: str) -> None:
    client = await connect(settings)
    stop = _stop_on_signals()
    async with running_policy_worker(
        client, source, signing_key, settings.policy_task_queue, settings.approval_verify_key
    ):
        print(
            f"policy worker ready task_queue={settings.policy_task_queue} temporal={settings.temporal_address} "
            f"policy={settings.policy_file} version={source.current().version} "
            f"verify_key={verify_key_for(signing_key)} "
            f"grants={'on' if settings.approval_verify_key else 'off (no TOOLLOOP_APPROVAL_VERIFY_KEY)'}",
            flush=True,
        )
        await stop.wait()
    print("policy worker stopped", flush=True)


def _policy_main() -> int:
    try:
        settings = PolicySettings()
    except ValidationError as exc:
        print(f"error: {settings_error(exc)}", file=sys.stderr)
        return 2
    configure_logging("policy")
    signing_key = settings.policy_signing_key.get_secret_value()
    try:
        verify_key_for(signing_key)
        source = PolicySource(settings.policy_file, settings.policy_schema)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError:
        print("error: TOOLLOOP_POLICY_SIGNING_KEY: not a base64url Ed25519 key of 32 bytes", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run_policy(settings, source, signing_key))
    except RuntimeError as exc:  # the Temporal client's connection errors
        print(
            f"error: cannot reach Temporal at {settings.temporal_address}: {str(exc).splitlines()[0]}", file=sys.stderr
        )
        return 1
    return 0


async def _run(settings: WorkerSettings, spec: AgentSpec, target: str) -> None:
    # Temporal's runtime serves the Prometheus endpoint: its own metrics and toolloop's counts.
    client = await connect(settings, metrics_runtime(settings.metrics_address))
    stop = _stop_on_signals()
    async with running_worker(client, settings, spec):
        print(
            f"worker ready task_queue={settings.task_queue} temporal={settings.temporal_address} tools={target} "
            f"({len(spec.tools.registry)} tools) openai={'set' if settings.openai_api_key else 'unset'} "
            f"named_models={','.join(sorted(settings.named_models)) or 'none'} "
            f"metrics={settings.metrics_address or 'off'} tracing={'on' if settings.otel else 'off'} "
            f"approval_verify_keys={len(verify_key_set(settings.approval_verify_key)) or 'unset'} "
            f"scripted_models={'on' if settings.allow_scripted_models else 'off'} "
            f"policy={settings.policy_task_queue or 'off'}",
            flush=True,
        )
        await stop.wait()
    print("worker stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.policy:
        return _policy_main()
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
