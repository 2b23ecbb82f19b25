"""toolloop: a durable tool-calling loop on Temporal. An LLM proposes tool calls; toolloop checks each one,
runs reads in parallel and writes one at a time, only after a person approves exactly their payload, with an
idempotency key, an unknown-outcome branch that asks the service before any resend, and a read-back before
anything is called done.

Declare tools on a Toolset, run them with the ToolloopPlugin on a Temporal worker:

    tools = toolloop.Toolset()
    shop = toolloop.HttpSource("shop", base_url="http://127.0.0.1:8000")

    @tools.read(source=shop)
    async def get_order(ctx: toolloop.ToolContext, args: GetOrder) -> Order:
        \"\"\"Status of one of the current user's orders.\"\"\"
        return await shop.get(ctx, f"/orders/{args.order_id}", Order, not_available="no such order")

    tools.http_write("add_note", source=shop, path="/notes", arguments=AddNote, result=Note,
                     description="Add a note.", read_back=toolloop.ReadBack(...))

    client = await Client.connect(address, plugins=[toolloop.ToolloopPlugin(tools)])

Everything not named here is private. The service side (the idempotency kit) is toolloop.servicekit; the
testing helpers are toolloop.testing.
"""

from toolloop._core.arguments import Arguments, Instant, PlainText, sorted_unique
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentResult,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    Limits,
    MessageItem,
    ModelSpec,
    OperationRecord,
    OtherItem,
)
from toolloop._core.registry import (
    Evidence,
    EvidenceNotYetVisible,
    OperationStatus,
    ToolContext,
    ToolError,
    ToolTemporaryError,
    WriteInProgress,
    WriteNotSent,
    WriteOutcomeUnknown,
)
from toolloop._models.adapter import ModelAdapter, ModelRequest
from toolloop._models.errors import ModelCallError
from toolloop._models.responses import ResponsesClient, ResponsesModel
from toolloop._models.script import ScriptModel
from toolloop._temporal.logs import configure_logging
from toolloop._temporal.plugin import ToolloopPlugin
from toolloop._temporal.results import request_result
from toolloop._tools.http import HttpSource, ReadBack
from toolloop._tools.mcp import McpSource
from toolloop._tools.toolset import AgentSpec, Toolset
from workflows.agent import AgentWorkflow

__all__ = [
    # declaring tools
    "Toolset",
    "ToolContext",
    "Arguments",
    "PlainText",
    "Instant",
    "sorted_unique",
    "ToolError",
    "ToolTemporaryError",
    # the write contract
    "HttpSource",
    "ReadBack",
    "McpSource",
    "OperationStatus",
    "Evidence",
    "EvidenceNotYetVisible",
    "WriteNotSent",
    "WriteOutcomeUnknown",
    "WriteInProgress",
    # the agent on a worker
    "AgentSpec",
    "ToolloopPlugin",
    "AgentWorkflow",
    "Limits",
    "ResultCode",
    "configure_logging",
    # requests and their results
    "Actor",
    "AgentInput",
    "ModelSpec",
    "AgentResult",
    "OperationRecord",
    "request_result",
    # models
    "ModelAdapter",
    "ModelRequest",
    "ModelCallError",
    "ResponsesClient",
    "ResponsesModel",
    "ScriptModel",
    "ConversationItem",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "MessageItem",
    "OtherItem",
]
