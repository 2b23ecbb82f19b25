"""Wiring (Temporal face): the worker plugin - registers the agent workflow, its activities built around the
user's tools and models, the pydantic data converter and the sandbox pass-throughs, and opens the tool
sources (HTTP clients, MCP connections) while the worker runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from typing import Any

import httpx
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    Worker,
    WorkerConfig,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from toolloop._core.approvals import verify_key_set
from toolloop._core.usage import ModelPrice, price_table
from toolloop._live.store import LiveTextStore
from toolloop._models.adapter import ModelAdapter
from toolloop._models.script import ScriptModel
from toolloop._temporal.converter import data_converter
from toolloop._temporal.telemetry import tracing_interceptor
from toolloop._temporal.trust import TrustedApprovalKeys
from toolloop._tools.toolset import AgentSpec, Toolset
from toolloop.activities.conversation import ConversationState, TemporalTurnHistory, ToolOutputStore
from toolloop.activities.model_turn import ModelActivities
from toolloop.activities.request_end import RequestEndActivities, RequestEndHook
from toolloop.activities.threads import request_ledger
from toolloop.activities.tool_calls import ToolActivities
from toolloop.activities.write_operations import WriteActivities
from toolloop.workflows.agent import AgentWorkflow
from toolloop.workflows.thread import ThreadWorkflow

PLUGIN_NAME = "toolloop.ToolloopPlugin"


def workflow_runner(existing: object = None) -> SandboxedWorkflowRunner:
    """The sandbox AgentWorkflow runs in, for workers and replayers alike. `cryptography` is passed through:
    the approval validator verifies Ed25519 signatures, and cryptography imports its OpenSSL backend lazily,
    on first use; inside the sandbox that import would run again and be refused (it creates a lock).
    `toolloop.workflows` (the workflow and its helpers, which keep no module state) is passed through too: the
    sandbox would otherwise import and run the workflow module again for every run, several ms of worker
    CPU per request (measured with py-spy). Determinism is still checked by replaying recorded histories
    (tests/test_replay_histories.py), which a non-deterministic change fails."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules("cryptography", "toolloop.workflows")
    return SandboxedWorkflowRunner(restrictions=restrictions)


class ToolloopPlugin(SimplePlugin):
    """A Temporal plugin for clients, workers and replayers:

        plugin = toolloop.ToolloopPlugin(toolset, models={"mine": MyModel()}, instructions="...")
        client = await Client.connect(address, plugins=[plugin])
        async with Worker(client, task_queue="toolloop"):   # the client's plugin configures the worker
            ...

    `models` adds models by the name a request asks for (an AgentSpec brings its own); the "script" model is
    always registered. Scripted models (the script model, the demo's offline model: an adapter with `scripted =
    True`) are served only with `allow_scripted_models=True` (tests, demos; TOOLLOOP_ALLOW_SCRIPTED_MODELS):
    otherwise whoever starts a request could write its tool calls. A request naming one fails with a
    non-retryable model error that says so. `retention_seconds` is how long the services keep operation ids
    when they do not say so on their status answers (unknown means a resend after a doubtful attempt fails
    closed). `http` is the client of tools that have no source of their own. `tracing` adds Temporal's OpenTelemetry
    interceptor (spans with the globally configured tracer provider). `approval_verify_key` is the approval
    channel's public key, or several (a list, or one string separated by commas) during a rotation: a decision
    is taken only when its token's signature verifies with the one its key id names (with none configured, no
    decision is). It is never a request's input: a request whose input brings a key fails at its start.
    `on_request_end` is called once per request, on one worker, after its report is final (a
    toolloop.FinishedRequest: ids, actor, metadata, how it ended), to free what the worker keeps per request;
    a request whose model never answered a turn (its first model turn failed) has no end step.
    `model_prices` is the price per million tokens of the models it knows by name (`{"gpt-4.1-mini": {"input":
    0.40, "cached_input": 0.10, "output": 1.60}}`, TOOLLOOP_MODEL_PRICES): a turn whose provider reports its
    usage is recorded with its cost, and a request's `max_cost` counts it (a ValueError at construction says
    what is wrong with the table). `policy_task_queue` is where the deployment's policy evaluator runs
    (`python worker.py --policy`, docs/POLICIES.md): each validated write is decided there by rule first (allow,
    deny, or ask the people the policy names) before any person is asked, and `policy_verify_key` (its public
    key, or several) is what its decisions must verify with here (the two go together); None: every write waits
    for its requester's approval. AgentWorkflow runs in Temporal's workflow sandbox (workflow_runner), as the
    SDK runs it."""

    def __init__(
        self,
        tools: Toolset | AgentSpec,
        *,
        models: Mapping[str, ModelAdapter] | None = None,
        instructions: str | None = None,
        retention_seconds: float | None = None,
        http: httpx.AsyncClient | None = None,
        tracing: bool = False,
        approval_verify_key: str | Iterable[str] | None = None,
        allow_scripted_models: bool = False,
        on_request_end: RequestEndHook | None = None,
        model_prices: Mapping[str, ModelPrice | Mapping[str, Any]] | None = None,
        live_text: LiveTextStore | str | None = None,
        policy_task_queue: str | None = None,
        policy_verify_key: str | Iterable[str] | None = None,
    ) -> None:
        spec = tools if isinstance(tools, AgentSpec) else AgentSpec(tools=tools)
        self.toolset = spec.tools
        every: dict[str, ModelAdapter] = {"script": ScriptModel(), **spec.models, **(models or {})}
        self.models = {
            name: m for name, m in every.items() if allow_scripted_models or not getattr(m, "scripted", False)
        }
        # Registered but off: a request naming one is told so rather than "no such model".
        self.disabled_models = sorted(set(every) - set(self.models))
        self.instructions = instructions or spec.instructions
        self.retention_seconds = retention_seconds
        self._http = http
        self._owns_http = http is None
        self.on_request_end = on_request_end
        self.policy_task_queue = policy_task_queue or None
        policy_keys = verify_key_set(policy_verify_key)
        if (self.policy_task_queue is None) != (not policy_keys):
            # Half a policy would fail open (decisions nobody checks here) or shut (a key and nobody to ask).
            raise ValueError("policy_task_queue and policy_verify_key go together: give both or neither")
        self.policy_verify_key = ",".join(policy_keys.values()) or None
        self.model_prices = price_table(model_prices or {})
        # Where model turns write their text as it streams (a Redis URL or a store; None: nowhere).
        self.live_text = LiveTextStore(live_text) if isinstance(live_text, str) else live_text
        self._owns_live_text = isinstance(live_text, str)
        super().__init__(
            PLUGIN_NAME,
            data_converter=data_converter(),
            workflows=[AgentWorkflow, ThreadWorkflow],
            workflow_runner=workflow_runner,
            # The trust anchor: decisions are verified only with this worker's own key. OpenTelemetry spans for
            # workflows and activities, off by default.
            interceptors=[TrustedApprovalKeys(approval_verify_key), *([tracing_interceptor()] if tracing else [])],
        )

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        client = config["client"]
        if not issubclass(client.data_converter.payload_converter_class, PydanticPayloadConverter):
            raise ValueError(
                "the Temporal client needs toolloop's data converter: connect it with plugins=[ToolloopPlugin(...)]"
            )
        registry = self.toolset.registry
        http = self._shared_http()
        # Tool outputs pass from the tool activities to the next model turn on this worker, not through history.
        outputs = ToolOutputStore()
        writes = WriteActivities(registry, http, self.retention_seconds, outputs)
        conversations = ConversationState(TemporalTurnHistory(client), outputs)
        config["activities"] = [
            *config.get("activities", []),
            ModelActivities(
                registry,
                client,
                self.models,
                self.instructions,
                conversations,
                self.disabled_models,
                end_hook=self.on_request_end is not None,
                prices=self.model_prices,
                live_text=self.live_text,
                policy_task_queue=self.policy_task_queue,
                policy_verify_key=self.policy_verify_key,
            ).model_turn,
            RequestEndActivities(self.on_request_end).request_ended,
            ToolActivities(registry, http, outputs).run_tool,
            writes.execute_write,
            writes.query_operation_status,
            writes.read_back_operation,
            request_ledger,
        ]
        return config

    def _shared_http(self) -> httpx.AsyncClient:
        if self._http is None:
            # No transport retries: Temporal's retry policy is the only retry loop.
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(10.0, connect=3.0), transport=httpx.AsyncHTTPTransport(retries=0)
            )
        return self._http

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        # The sources open before the first task and close after the last; a replayer opens nothing.
        async with AsyncExitStack() as stack:
            if self._owns_http and self._http is not None:
                stack.push_async_callback(self._close_shared_http)
            if self._owns_live_text and self.live_text is not None:
                stack.push_async_callback(self.live_text.aclose)
            try:
                await stack.enter_async_context(self.toolset.opened())
            except BaseException:
                # A worker whose run never started waits forever in its shutdown: let it start and stop at
                # once, then say why it could not run.
                stopping = asyncio.ensure_future(worker.shutdown())
                await next(worker)
                await stopping
                raise
            await next(worker)

    async def _close_shared_http(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
