"""Benchmark: worker CPU and history size per small request, AgentWorkflow against a bare hand-written
loop doing the same work (two model turns, one tool call over HTTP), both measured in this run on the
same Temporal dev server and business service. Prints ratios, asserts nothing (shared, noisy machines).

    .venv/bin/python -m bench.request_cost --requests 40
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from bench.bare_workflow import BareLoop
from demo.agent import build as build_demo
from devstack.processes import free_port, start_business_service, start_temporal_dev_server
from toolloop._core.contracts import Actor, AgentInput, AgentResult, Limits, ModelSpec
from toolloop._core.names import AGENT_WORKFLOW
from toolloop._temporal.converter import data_converter
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

REPO_ROOT = Path(__file__).resolve().parent.parent

# --- The baseline: the smallest loop that does the same work ------------------------------------------


@activity.defn(name="bare_model")
async def bare_model(turn: int) -> dict[str, Any]:
    if turn == 1:
        return {"call": {"name": "get_order_status", "arguments": {"orderId": "A100"}, "call_id": "c1"}}
    return {"text": "Order A100 has shipped."}


class BareTool:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    @activity.defn(name="bare_tool")
    async def bare_tool(self, order_id: str) -> dict[str, Any]:
        response = await self._http.get(f"/orders/{order_id}", headers={"X-Actor-User": "u1", "X-Actor-Tenant": "acme"})
        body: dict[str, Any] = response.json()
        return {"ok": response.status_code == 200, "status": body.get("status"), "carrier": body.get("carrier")}


# --- Measurement -----------------------------------------------------------------------------------------


@dataclass
class Cost:
    name: str
    requests: int
    cpu_seconds: float
    wall_seconds: float
    history_bytes: int
    history_events: int

    def per_request(self) -> tuple[float, float, float, float]:
        n = self.requests
        return (
            1000 * self.cpu_seconds / n,
            1000 * self.wall_seconds / n,
            self.history_bytes / n / 1024,
            self.history_events / n,
        )


async def measure(
    name: str, client: Client, requests: int, concurrency: int, start: Callable[[int], Awaitable[str]]
) -> Cost:
    gate = asyncio.Semaphore(concurrency)
    ids: list[str] = []

    async def one(i: int) -> None:
        async with gate:
            ids.append(await start(i))

    await one(-1)  # warm-up, not counted
    ids.clear()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    size = events = 0
    for workflow_id in ids:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        size += sum(event.ByteSize() for event in history.events)
        events += len(history.events)
    return Cost(name, requests, cpu, wall, size, events)


async def run(requests: int, concurrency: int) -> list[Cost]:
    with tempfile.TemporaryDirectory(prefix="toolloop-bench-") as tmp:
        data = Path(tmp)
        temporal = start_temporal_dev_server(data / "temporal", free_port(), ui_port=None)
        service_port = free_port()
        service = start_business_service(data / "service.sqlite", service_port, secrets.token_urlsafe(8), cwd=REPO_ROOT)
        try:
            client = await Client.connect(f"127.0.0.1:{temporal_port(temporal.cmd)}", data_converter=data_converter())
            settings = Settings.model_validate(
                {
                    "TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port(temporal.cmd)}",
                    "TOOLLOOP_TASK_QUEUE": f"bench-{uuid.uuid4().hex[:8]}",
                    "TOOLLOOP_SERVICE_URL": f"http://127.0.0.1:{service_port}",
                }
            )
            async with httpx.AsyncClient(base_url=settings.service_url) as http:
                bare_queue = f"bare-{uuid.uuid4().hex[:8]}"
                async with Worker(
                    client,
                    task_queue=bare_queue,
                    workflows=[BareLoop],
                    activities=[bare_model, BareTool(http).bare_tool],
                ):

                    async def start_bare(i: int) -> str:
                        wid = f"bare-{uuid.uuid4().hex}"
                        await client.execute_workflow(BareLoop.run, "Where is A100?", id=wid, task_queue=bare_queue)
                        return wid

                    baseline = await measure("bare loop (baseline)", client, requests, concurrency, start_bare)

            script = ModelSpec.model_validate(
                {
                    "provider": "script",
                    "script": [
                        [
                            {
                                "type": "function_call",
                                "name": "get_order_status",
                                "arguments": '{"orderId": "A100"}',
                                "call_id": "c1",
                            }
                        ],
                        [
                            {
                                "type": "message",
                                "role": "assistant",
                                "content": [{"type": "output_text", "text": "Order A100 has shipped."}],
                            }
                        ],
                    ],
                }
            )
            async with running_worker(client, settings, build_demo(settings.service_url)):

                async def start_agent(i: int) -> str:
                    wid = f"agent-{uuid.uuid4().hex}"
                    await client.execute_workflow(
                        AGENT_WORKFLOW,
                        AgentInput(request="Where is A100?", actor=Actor(user_id="u1"), model=script, limits=Limits()),
                        id=wid,
                        task_queue=settings.task_queue,
                        result_type=AgentResult,
                    )
                    return wid

                ours = await measure("AgentWorkflow (script model)", client, requests, concurrency, start_agent)
            return [baseline, ours]
        finally:
            service.stop()
            temporal.stop()


def temporal_port(cmd: list[str]) -> int:
    return int(cmd[cmd.index("--port") + 1])


def report(costs: list[Cost]) -> None:
    base = costs[0].per_request()
    print(f"{'':32} {'CPU ms/req':>11} {'wall ms/req':>12} {'history KiB/req':>16} {'events/req':>11}")
    for cost in costs:
        cpu, wall, kib, events = cost.per_request()
        print(f"{cost.name:32} {cpu:11.1f} {wall:12.1f} {kib:16.2f} {events:11.1f}")
    cpu, wall, kib, events = costs[-1].per_request()
    print(
        f"{'ratio ours / baseline':32} {cpu / base[0]:11.2f} {wall / base[1]:12.2f} "
        f"{kib / base[2]:16.2f} {events / base[3]:11.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    report(asyncio.run(run(args.requests, args.concurrency)))


if __name__ == "__main__":
    import os
    import sys

    main()
    sys.stdout.flush()
    # Workers are shut down; skip the interpreter teardown where temporalio 1.35 can abort.
    os._exit(0)
