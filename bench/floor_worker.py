"""Entry point: the floor's worker process (the benchmark's stack (b)), configured like worker.py - the same
environment variables, Temporal's default worker options but for the same workflow cache size, and the
default sandbox - so the two workers differ only in the workflow and activities they run.

    TEMPORAL_ADDRESS=127.0.0.1:7233 TOOLLOOP_TASK_QUEUE=floor TOOLLOOP_SERVICE_URL=http://127.0.0.1:8701 \\
        python -m bench.floor_worker

With BENCH_FLOOR_POLICY_KEY (a policy's signing key) and BENCH_FLOOR_POLICY_RULE (the rule its decisions name)
its writes are decided by rule, signed in the write activity (the policy phase, bench/policy.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from bench.floor_activities import FloorActivities
from bench.floor_workflow import FloorLoop
from devstack.processes import WORKER_READY_LINE
from toolloop._temporal.settings import Settings

POLICY_KEY_ENV, POLICY_RULE_ENV = "BENCH_FLOOR_POLICY_KEY", "BENCH_FLOOR_POLICY_RULE"


async def _run(settings: Settings) -> None:
    client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The same client settings as toolloop's tool sources: no transport retries (Temporal retries).
    async with httpx.AsyncClient(
        base_url=settings.service_url,
        timeout=httpx.Timeout(10.0, connect=3.0),
        transport=httpx.AsyncHTTPTransport(retries=0),
        trust_env=False,
    ) as http:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[FloorLoop],
            activities=FloorActivities(http, _policy()).all(),
            # The same workflow cache as toolloop's worker (TOOLLOOP_MAX_CACHED_WORKFLOWS), so at scale the
            # two differ in their code, not in how many runs they keep in memory.
            max_cached_workflows=settings.max_cached_workflows,
        )
        async with worker:
            print(f"{WORKER_READY_LINE} task_queue={settings.task_queue} (floor)", flush=True)
            await stop.wait()
        # Leaving the block shut the worker down explicitly, before the interpreter exits.
    print("worker stopped", flush=True)


def _policy() -> tuple[str, str] | None:
    key, rule = os.environ.get(POLICY_KEY_ENV), os.environ.get(POLICY_RULE_ENV)
    return (key, rule) if key and rule else None


def main() -> int:
    asyncio.run(_run(Settings()))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown, where temporalio 1.35 can abort after a worker stopped.
    os._exit(code)
