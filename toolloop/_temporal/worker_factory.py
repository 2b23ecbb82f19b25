"""Wiring: build the worker (workflows + activities with their injected clients) for worker.py and tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.model_turn import ModelActivities
from activities.tool_calls import ToolActivities
from activities.write_operations import WriteActivities
from demo.tools.reads import build_demo_registry
from toolloop._core.registry import ToolRegistry
from toolloop._models.responses import ResponsesClient
from toolloop._temporal.converter import data_converter
from toolloop._temporal.settings import Settings
from workflows.agent import AgentWorkflow


async def connect(settings: Settings) -> Client:
    return await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace, data_converter=data_converter()
    )


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox AgentWorkflow runs in, for workers and replayers alike. `cryptography` is passed through:
    the approval validator verifies Ed25519 signatures, and cryptography imports its OpenSSL backend lazily,
    on first use; inside the sandbox that import would run again and be refused (it creates a lock)."""
    return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("cryptography"))


def service_http_client(settings: Settings) -> httpx.AsyncClient:
    # No transport retries: Temporal's retry policy is the only retry loop.
    return httpx.AsyncClient(
        base_url=settings.service_url,
        timeout=httpx.Timeout(10.0, connect=3.0),
        transport=httpx.AsyncHTTPTransport(retries=0),
    )


@asynccontextmanager
async def running_worker(
    client: Client,
    settings: Settings,
    *,
    task_queue: str | None = None,
    registry: ToolRegistry | None = None,
    **worker_options: Any,
) -> AsyncIterator[Worker]:
    """A started worker, shut down explicitly on exit (an implicit shutdown at interpreter exit can
    abort the process in temporalio 1.35)."""
    registry = registry or build_demo_registry()
    async with AsyncExitStack() as clients:
        http = await clients.enter_async_context(service_http_client(settings))
        responses = None
        if settings.openai_api_key is not None:
            responses = await clients.enter_async_context(
                ResponsesClient(
                    api_key=settings.openai_api_key.get_secret_value(),
                    base_url=settings.openai_base_url,
                    model=settings.openai_model,
                )
            )
        writes = WriteActivities(registry, http, settings.idempotency_retention_seconds)
        worker = Worker(
            client,
            task_queue=task_queue or settings.task_queue,
            workflows=[AgentWorkflow],
            workflow_runner=workflow_runner(),
            activities=[
                ModelActivities(registry, client, responses).model_turn,
                ToolActivities(registry, http).run_tool,
                writes.execute_write,
                writes.query_operation_status,
                writes.read_back_operation,
            ],
            **worker_options,
        )
        async with worker:
            yield worker
