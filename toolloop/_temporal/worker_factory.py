"""Wiring: a running worker for worker.py and the tests - the plugin around a user's tools, plus the models
the worker's settings configure (`openai` when OPENAI_API_KEY is set, and the named models of TOOLLOOP_MODELS,
each on the Responses or the Chat Completions API) - and the loading of a user's `package.module:function` that
builds the tools."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from toolloop._core.contracts import ConversationItem
from toolloop._core.named_models import RESERVED_MODEL_NAMES, check_model_names
from toolloop._models.adapter import ModelAdapter, ModelRequest
from toolloop._models.chat import ChatCompletionsClient, ChatCompletionsModel
from toolloop._models.errors import ModelCallError
from toolloop._models.openai_sdk import OpenAIEndpoint, OpenAIModel
from toolloop._models.responses import ResponsesClient, ResponsesModel
from toolloop._temporal.converter import data_converter
from toolloop._temporal.plugin import ToolloopPlugin, workflow_runner
from toolloop._temporal.settings import ModelEndpoint, TemporalSettings, WorkerSettings
from toolloop._tools.toolset import AgentSpec, Toolset

__all__ = ["ToolsLoadError", "connect", "load_tools", "running_worker", "workflow_runner"]

_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")


async def connect(settings: TemporalSettings, runtime: Runtime | None = None) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=data_converter(),
        runtime=runtime,
    )


class ToolsLoadError(Exception):
    """`--tools` names nothing usable (one line for the user, no traceback)."""


def call_named_function(target: str) -> object:
    """Import `package.module:function` and call it (ToolsLoadError, one line, if it names nothing usable
    or its registrations are refused)."""
    if not _TARGET.fullmatch(target):
        raise ToolsLoadError(f"--tools {target!r}: expected package.module:function")
    module_name, _, function_name = target.partition(":")
    # The folder it runs from holds the user's package (`python worker.py --tools mypkg.tools:build` in the
    # project): importable, as `python -m` would make it.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolsLoadError(f"--tools {target!r}: cannot import {module_name} ({exc})") from None
    build = getattr(module, function_name, None)
    if not callable(build):
        raise ToolsLoadError(f"--tools {target!r}: {module_name} has no function {function_name}")
    if inspect.iscoroutinefunction(build):
        raise ToolsLoadError(f"--tools {target!r}: {function_name} must be a plain function, not async")
    try:
        built: object = build()
    except ValueError as exc:  # a registration the registry refused
        raise ToolsLoadError(f"--tools {target!r}: {exc}") from None
    except Exception as exc:  # the user's own builder broke (a setting it reads is missing, say)
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise ToolsLoadError(
            f"--tools {target!r}: {function_name}() failed: {type(exc).__name__}" + (f": {detail}" if detail else "")
        ) from None
    return built


def load_tools(target: str) -> AgentSpec:
    """Import `package.module:function`, call it, and check that it built a Toolset or an AgentSpec."""
    built = call_named_function(target)
    function_name = target.partition(":")[2]
    if isinstance(built, Toolset):
        return AgentSpec(tools=built)
    if isinstance(built, AgentSpec):
        return built
    raise ToolsLoadError(
        f"--tools {target!r}: {function_name}() returned {type(built).__name__}, not a Toolset or AgentSpec"
    )


class NamedModel:
    """A model of TOOLLOOP_MODELS: an `openai` adapter under a name of its own that serves its configured
    provider model only. A request that names another (`large:other-model`, started by something that did not
    check it first, as the CLI and the API do) is rejected at its first turn: the name decides which model,
    endpoint and key a request gets, so it cannot be stretched to others."""

    needs_conversation = True

    def __init__(self, name: str, adapter: OpenAIModel) -> None:
        self.name = name
        self.adapter = adapter

    @property
    def model(self) -> str:
        return self.adapter.client.model

    def label(self, model_name: str | None) -> str:
        # Not "large:gpt-4.1": that reads as a name a request could give, and a named model takes no :MODEL.
        return f"{self.name} ({self.model})"

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        if request.model_name is not None and request.model_name != self.model:
            raise ModelCallError(
                "rejected",
                f"model {self.name!r} serves {self.model!r} only; this request asked for {request.model_name!r}",
            )
        return await self.adapter.respond(request)


def check_model_names_free(settings: WorkerSettings, taken: Iterable[str]) -> None:
    """A ValueError (one line, naming TOOLLOOP_MODELS) when a named model has the name of a model the tools
    module brings."""
    try:
        check_model_names(settings.named_models, RESERVED_MODEL_NAMES | frozenset(taken))
    except ValueError as exc:
        raise ValueError(f"TOOLLOOP_MODELS: {exc}") from None


def _endpoint_client(endpoint: ModelEndpoint) -> OpenAIEndpoint:
    options: dict[str, Any] = {
        "api_key": endpoint.api_key.get_secret_value(),
        "base_url": endpoint.base_url,
        "model": endpoint.model,
        "timeout_seconds": endpoint.timeout_seconds,
        "extra_headers": {name: v.get_secret_value() for name, v in endpoint.extra_headers.items()},
        "stream": endpoint.stream,
    }
    return ChatCompletionsClient(**options) if endpoint.api == "chat" else ResponsesClient(**options)


def _adapter(client: OpenAIEndpoint) -> OpenAIModel:
    if isinstance(client, ChatCompletionsClient):
        return ChatCompletionsModel(client)
    assert isinstance(client, ResponsesClient)
    return ResponsesModel(client)


@asynccontextmanager
async def settings_models(settings: WorkerSettings) -> AsyncIterator[dict[str, ModelAdapter]]:
    """The models a worker's settings configure, open for the block: `openai` and the named models, each on a
    client of its own (its endpoint, key, headers, timeout and default model)."""
    async with AsyncExitStack() as stack:
        models: dict[str, ModelAdapter] = {}
        for name, endpoint in settings.model_endpoints().items():
            adapter = _adapter(await stack.enter_async_context(_endpoint_client(endpoint)))
            # One name, `openai`, whichever API the endpoint speaks: requests need not know.
            models[name] = adapter if name == "openai" else NamedModel(name, adapter)
        yield models


@asynccontextmanager
async def running_worker(
    client: Client,
    settings: WorkerSettings,
    tools: Toolset | AgentSpec,
    *,
    task_queue: str | None = None,
    **worker_options: Any,
) -> AsyncIterator[Worker]:
    """A started worker, shut down explicitly on exit (an implicit shutdown at interpreter exit can
    abort the process in temporalio 1.35)."""
    spec = tools if isinstance(tools, AgentSpec) else AgentSpec(tools=tools)
    check_model_names_free(settings, spec.models)
    async with settings_models(settings) as models:
        plugin = ToolloopPlugin(
            spec,
            models=models,
            retention_seconds=settings.idempotency_retention_seconds,
            tracing=settings.otel,
            approval_verify_key=settings.approval_verify_key,
            allow_scripted_models=settings.allow_scripted_models,
            model_prices=settings.model_prices,
            live_text=settings.live_text_url,
            policy_task_queue=settings.policy_task_queue,
            policy_verify_key=settings.policy_verify_key,
        )
        # Opened before the worker starts, so a source that cannot open (an MCP server that does not start)
        # is reported at once and no worker is left half-started; the plugin's own opening nests in this one.
        async with plugin.toolset.opened():
            options = {"max_cached_workflows": settings.max_cached_workflows, **worker_options}
            worker = Worker(client, task_queue=task_queue or settings.task_queue, plugins=[plugin], **options)
            async with worker:
                yield worker
