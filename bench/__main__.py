"""Entry point: the benchmark of issue 9 - toolloop (a) against the floor (b) and a plain asyncio loop (c),
side by side in one run on one machine; results as JSON, a Markdown report and PNG plots.

    python -m bench [--quick] [--out DIR] [--only PHASES]

PHASES: a comma list of stacks, parallel, growth, handoff, scale, recovery, streaming, threads, policy (all by
default).

It asserts nothing about the figures: each target is printed with its measured value and "met" or "not met".
Exit 0, or 1 when something broke (a request failed outside the scale phase, a recovery did not count one
effect, a phase raised)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from temporalio.client import Client

from bench.clients import FloorStack, OursStack, PlainStack, plain_http
from bench.meter import ProcessMeter
from bench.phases import PHASES, Bench
from bench.plots import draw_all
from bench.report import QUICK, Results, Sizes, render_markdown, target_lines, to_json
from bench.stack import LATENCY_MS, BenchStack
from devstack.processes import DEV_SERVER_DYNAMIC_CONFIG
from toolloop._temporal.converter import data_converter

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
LIBRARY_PATHS = ("toolloop", "workflows", "activities", "worker.py")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run of every phase)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where the results go (default {DEFAULT_OUT})")
    parser.add_argument(
        "--only", default=",".join(PHASES), help=f"comma list of phases (default: all: {','.join(PHASES)})"
    )
    parser.add_argument("--scale", default=None, help="comma list of request counts for the scale phase")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the servers' data and logs here")
    parser.add_argument(
        "--dev-server-defaults",
        action="store_true",
        help="the dev server with Temporal's default task reads (20 a second on its one shard), as before stop 36",
    )
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    args.phases = [p for p in PHASES if p in phases]
    return args


def source_state() -> str:
    """The commit measured, and whether the library's files differ from it (the figures are of the tree)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (no git)"
    changed = git("status", "--porcelain", "--", *LIBRARY_PATHS)
    return f"{commit}{' with uncommitted library changes' if changed else ''}"


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


async def run(
    sizes: Sizes,
    phases: list[str],
    data_dir: Path,
    quick: bool,
    dev_server_config: Sequence[str] = DEV_SERVER_DYNAMIC_CONFIG,
) -> Results:
    results = Results(
        meta={
            "started_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "temporalio": version("temporalio"),
            "source": source_state(),
            "quick": quick,
            "phases": ",".join(phases),
            "latency_ms": LATENCY_MS,
            "sizes": asdict(sizes),
            "dev_server_config": ", ".join(dev_server_config) or "Temporal's defaults",
        }
    )
    say(f"starting the dev server, the service and both workers under {data_dir}")
    stack = await asyncio.to_thread(BenchStack.start, data_dir, dev_server_config)
    try:
        ours_client = await Client.connect(stack.temporal_address, data_converter=data_converter())
        floor_client = await Client.connect(stack.temporal_address)
        async with plain_http(stack.service_url) as http, stack.admin() as admin:
            with ProcessMeter() as meter:
                bench = Bench(
                    stack=stack,
                    sizes=sizes,
                    meter=meter,
                    ours=OursStack(ours_client, stack.ours_queue, stack.signing_key),
                    floor=FloorStack(floor_client, stack.floor_queue, stack.signing_key),
                    plain=PlainStack(http, stack.signing_key),
                    admin=admin,
                    results=results,
                    say=say,
                )
                bench.watch_processes()
                for name in phases:
                    began = time.perf_counter()
                    try:
                        await PHASES[name](bench)
                    except Exception as exc:
                        traceback.print_exc()
                        results.problems.append(f"phase {name} broke: {type(exc).__name__}: {exc}")
                    say(f"phase {name} took {time.perf_counter() - began:.0f} s")
    finally:
        # Not awaited in a thread: on Ctrl-C this task is being cancelled, and an awaited stop was cut
        # short, leaving the dev server, the service and both workers running.
        stack.stop()
        results.meta["worker_log_counts"] = worker_log_counts(data_dir / "logs")
    return results


# Lines in the workers' logs that point at wasted work: a model turn that had to rebuild its conversation
# from the run's history (toolloop's per-worker cache missed), and a workflow task over 5 s (the SDK warns).
_LOG_MARKERS = {"conversation_rebuilds": "conversation rebuilt from history", "slow_workflow_tasks": "TMPRL1104"}


def worker_log_counts(logs: Path) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for log in sorted(logs.glob("worker-*.log")):
        text = log.read_text(errors="replace")
        counts[log.stem] = {name: text.count(marker) for name, marker in _LOG_MARKERS.items()}
    return counts


def write_outputs(results: Results, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    plots = draw_all(results, out)
    (out / "latest.json").write_text(json.dumps(to_json(results), indent=1) + "\n")
    (out / "latest.md").write_text(render_markdown(results, plots))
    return [out / "latest.json", out / "latest.md", *(out / p for p in plots)]


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    if args.scale:
        sizes = Sizes(**{**asdict(sizes), "scale": tuple(int(n) for n in args.scale.split(","))})
    config = () if args.dev_server_defaults else DEV_SERVER_DYNAMIC_CONFIG
    began = time.perf_counter()
    if args.data_dir is not None:
        results = asyncio.run(run(sizes, args.phases, args.data_dir.resolve(), args.quick, config))
    else:
        with tempfile.TemporaryDirectory(prefix="toolloop-bench-") as tmp:
            results = asyncio.run(run(sizes, args.phases, Path(tmp), args.quick, config))
    results.meta["duration_s"] = round(time.perf_counter() - began)
    written = write_outputs(results, args.out)
    for line in target_lines(results):
        print(line)
    for problem in results.problems:
        print(f"PROBLEM  {problem}")
    print("wrote " + ", ".join(str(p) for p in written))
    return 1 if results.problems else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown, where temporalio 1.35 can abort once its clients are gone.
    os._exit(code)
