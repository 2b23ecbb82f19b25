"""Diagnostic: where a thread's message spends the worker's time, by workflow type - not part of a benchmark run.

    python -m bench.threads_probe [--chains 4] [--messages 5] [--reads-only]

Starts the benchmark's stack and one more toolloop worker whose Temporal runtime serves Prometheus metrics, then
runs chains of write (or reads-only) requests one at a time (nothing else in flight), as single requests and
then as the messages of threads. For each mode it prints, per request: the worker's CPU (psutil), and from the
SDK's own metrics the workflow tasks and their execution time by workflow type
(`temporal_workflow_task_execution_latency`: from the activation's start to its completion in the worker, so
about the worker's CPU for a task when one runs at a time), and the activities' execution time (by the
workflow type that ran them)."""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
from collections import defaultdict
from pathlib import Path

import httpx
import psutil
from temporalio.client import Client

from bench.clients import OursStack
from bench.report import SINGLE, THREAD
from bench.scenarios import Scenario
from bench.stack import OURS_TOOLS, REPO_ROOT, BenchStack, reset_service
from bench.threads import Chain
from devstack.processes import free_port, start_worker
from toolloop._temporal.converter import data_converter

_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+-]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_WANTED = (
    "temporal_workflow_task_execution_latency_sum",
    "temporal_workflow_task_execution_latency_count",
    "temporal_activity_execution_latency_sum",
)


async def _scrape(http: httpx.AsyncClient, url: str) -> dict[tuple[str, str], float]:
    """The wanted series summed by (metric, workflow or activity type)."""
    text = (await http.get(url)).text
    out: dict[tuple[str, str], float] = defaultdict(float)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in _WANTED:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        kind = labels.get("workflow_type") or "?"
        out[(match["name"], kind)] += float(match["value"])
    return out


async def probe(chains: int, messages: int, write: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="toolloop-probe-") as tmp:
        stack = await asyncio.to_thread(BenchStack.start, Path(tmp))
        try:
            port = free_port()
            queue = f"{stack.ours_queue}-probe"
            env = {
                "TEMPORAL_ADDRESS": stack.temporal_address,
                "TOOLLOOP_TASK_QUEUE": queue,
                "TOOLLOOP_SERVICE_URL": stack.service_url,
                "TOOLLOOP_APPROVAL_VERIFY_KEY": stack.verify_key,
                "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
                "TOOLLOOP_METRICS_ADDRESS": f"127.0.0.1:{port}",
            }
            log = Path(tmp) / "logs" / "worker-probe.log"
            worker = await asyncio.to_thread(start_worker, REPO_ROOT, env, log, tools=OURS_TOOLS)
            try:
                client = await Client.connect(stack.temporal_address, data_converter=data_converter())
                ours = OursStack(client, queue, stack.signing_key)
                proc = psutil.Process(worker.pid)
                url = f"http://127.0.0.1:{port}/metrics"
                async with httpx.AsyncClient(trust_env=False) as http, stack.admin() as admin:
                    scenario = Scenario(reads=3, write=write)
                    for mode in (SINGLE, THREAD):
                        await reset_service(admin)
                        await Chain(ours, mode, scenario, f"probe-warm-{mode}").run(messages)
                        before, cpu_before = await _scrape(http, url), proc.cpu_times()
                        for c in range(chains):
                            await Chain(ours, mode, scenario, f"probe-{mode}{c}").run(messages)
                        after, cpu_after = await _scrape(http, url), proc.cpu_times()
                        n = chains * messages
                        cpu = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) * 1000 / n
                        kind = "write" if write else "reads-only"
                        print(f"{mode}: {n} {kind} requests one at a time; worker CPU {cpu:.1f} ms per request")
                        for key in sorted(set(after) | set(before)):
                            value = (after.get(key, 0.0) - before.get(key, 0.0)) / n
                            if value:
                                print(f"  {key[0]} [{key[1]}]: {value:.2f} per request")
            finally:
                worker.stop()
        finally:
            stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.threads_probe", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--reads-only", action="store_true", help="reads-only requests instead of write requests")
    args = parser.parse_args()
    asyncio.run(probe(args.chains, args.messages, not args.reads_only))


if __name__ == "__main__":
    main()
