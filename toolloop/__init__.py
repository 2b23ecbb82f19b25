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

A program that starts and decides requests (an API, a script, a test) uses toolloop's client, which brings
the data converter and the approval channel:

    client = await toolloop.ToolloopClient.connect(address, signing_key=key, channel="my-app")
    result = await client.run("Refund order A100", actor=actor, approver=ask_a_person)

Everything not named here is private. The service side (the idempotency kit) is toolloop.servicekit; the
testing helpers are toolloop.testing.
"""

# Public names are imported on first use (PEP 562): `import toolloop.servicekit` in a plain FastAPI service
# runs this module too, and must not pull in temporalio, mcp or typer (issue 24).
import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from toolloop._core.arguments import Amount, Arguments, Instant, PlainText, sorted_unique
    from toolloop._core.codes import ResultCode
    from toolloop._core.contracts import (
        Actor,
        AgentInput,
        AgentProgress,
        AgentResult,
        ApprovalRequest,
        ConversationItem,
        DecisionReceipt,
        FinishedRequest,
        FunctionCallItem,
        FunctionCallOutputItem,
        GrantTerms,
        Limits,
        MessageItem,
        ModelSpec,
        OperationRecord,
        OtherItem,
        PolicyFact,
        PolicyRecord,
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
    from toolloop._core.threads import MessageAccepted, MessageRecord
    from toolloop._core.usage import ModelPrice, RequestUsage, TokenUsage
    from toolloop._models.adapter import ModelAdapter, ModelAnswer, ModelRequest
    from toolloop._models.chat import ChatCompletionsClient, ChatCompletionsModel
    from toolloop._models.errors import ModelCallError
    from toolloop._models.responses import ResponsesClient, ResponsesModel
    from toolloop._models.script import ScriptModel
    from toolloop._temporal.approval_channel import ApprovalRefused, RequestFinished
    from toolloop._temporal.client import (
        Approver,
        MessageRefused,
        RequestIdReused,
        RequestNotFound,
        ThreadBusy,
        ThreadClosed,
        ThreadNotFound,
        ToDecide,
        ToolloopClient,
        ToolloopRequest,
        ToolloopThread,
    )
    from toolloop._temporal.converter import data_converter
    from toolloop._temporal.logs import configure_logging
    from toolloop._temporal.plugin import ToolloopPlugin
    from toolloop._temporal.results import request_result
    from toolloop._tools.http import HttpSource, ReadBack
    from toolloop._tools.in_process import verify_approval
    from toolloop._tools.mcp import McpSource
    from toolloop._tools.toolset import AgentSpec, Toolset
    from toolloop.workflows.agent import AgentWorkflow

__all__ = [
    # declaring tools
    "Toolset",
    "ToolContext",
    "verify_approval",
    "Arguments",
    "PlainText",
    "Instant",
    "Amount",
    "sorted_unique",
    "ToolError",
    "ToolTemporaryError",
    # the write contract
    "HttpSource",
    "ReadBack",
    "PolicyFact",
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
    "FinishedRequest",
    "AgentWorkflow",
    "Limits",
    "ResultCode",
    "configure_logging",
    # requests and their results: the client
    "ToolloopClient",
    "ToolloopRequest",
    "ToDecide",
    "Approver",
    "ApprovalRequest",
    "DecisionReceipt",
    "GrantTerms",
    "AgentProgress",
    "RequestNotFound",
    "RequestIdReused",
    "ApprovalRefused",
    "RequestFinished",
    # threads: conversations of several requests
    "ToolloopThread",
    "MessageAccepted",
    "MessageRecord",
    "ThreadNotFound",
    "ThreadBusy",
    "ThreadClosed",
    "MessageRefused",
    "Actor",
    "AgentInput",
    "ModelSpec",
    "AgentResult",
    "OperationRecord",
    "PolicyRecord",
    "request_result",
    "data_converter",
    # models
    "ModelAdapter",
    "ModelRequest",
    "ModelAnswer",
    "TokenUsage",
    "RequestUsage",
    "ModelPrice",
    "ModelCallError",
    "ResponsesClient",
    "ResponsesModel",
    "ChatCompletionsClient",
    "ChatCompletionsModel",
    "ScriptModel",
    "ConversationItem",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "MessageItem",
    "OtherItem",
]

# Where each public name lives; a name is imported from there the first time it is used.
_HOMES: dict[str, str] = {
    "Arguments": "toolloop._core.arguments",
    "Instant": "toolloop._core.arguments",
    "Amount": "toolloop._core.arguments",
    "PlainText": "toolloop._core.arguments",
    "sorted_unique": "toolloop._core.arguments",
    "ResultCode": "toolloop._core.codes",
    "Actor": "toolloop._core.contracts",
    "AgentInput": "toolloop._core.contracts",
    "AgentProgress": "toolloop._core.contracts",
    "AgentResult": "toolloop._core.contracts",
    "ApprovalRequest": "toolloop._core.contracts",
    "DecisionReceipt": "toolloop._core.contracts",
    "FinishedRequest": "toolloop._core.contracts",
    "ConversationItem": "toolloop._core.contracts",
    "FunctionCallItem": "toolloop._core.contracts",
    "FunctionCallOutputItem": "toolloop._core.contracts",
    "Limits": "toolloop._core.contracts",
    "MessageItem": "toolloop._core.contracts",
    "ModelSpec": "toolloop._core.contracts",
    "OperationRecord": "toolloop._core.contracts",
    "PolicyFact": "toolloop._core.contracts",
    "GrantTerms": "toolloop._core.contracts",
    "PolicyRecord": "toolloop._core.contracts",
    "OtherItem": "toolloop._core.contracts",
    "Evidence": "toolloop._core.registry",
    "EvidenceNotYetVisible": "toolloop._core.registry",
    "OperationStatus": "toolloop._core.registry",
    "ToolContext": "toolloop._core.registry",
    "ToolError": "toolloop._core.registry",
    "ToolTemporaryError": "toolloop._core.registry",
    "WriteInProgress": "toolloop._core.registry",
    "WriteNotSent": "toolloop._core.registry",
    "WriteOutcomeUnknown": "toolloop._core.registry",
    "ModelAdapter": "toolloop._models.adapter",
    "ModelRequest": "toolloop._models.adapter",
    "ModelAnswer": "toolloop._models.adapter",
    "TokenUsage": "toolloop._core.usage",
    "RequestUsage": "toolloop._core.usage",
    "ModelPrice": "toolloop._core.usage",
    "ModelCallError": "toolloop._models.errors",
    "ChatCompletionsClient": "toolloop._models.chat",
    "ChatCompletionsModel": "toolloop._models.chat",
    "ResponsesClient": "toolloop._models.responses",
    "ResponsesModel": "toolloop._models.responses",
    "ScriptModel": "toolloop._models.script",
    "configure_logging": "toolloop._temporal.logs",
    "data_converter": "toolloop._temporal.converter",
    "ApprovalRefused": "toolloop._temporal.approval_channel",
    "RequestFinished": "toolloop._temporal.approval_channel",
    "Approver": "toolloop._temporal.client",
    "RequestIdReused": "toolloop._temporal.client",
    "RequestNotFound": "toolloop._temporal.client",
    "ToolloopClient": "toolloop._temporal.client",
    "ToolloopRequest": "toolloop._temporal.client",
    "ToDecide": "toolloop._temporal.client",
    "ToolloopThread": "toolloop._temporal.client",
    "ThreadNotFound": "toolloop._temporal.client",
    "ThreadBusy": "toolloop._temporal.client",
    "ThreadClosed": "toolloop._temporal.client",
    "MessageRefused": "toolloop._temporal.client",
    "MessageAccepted": "toolloop._core.threads",
    "MessageRecord": "toolloop._core.threads",
    "ToolloopPlugin": "toolloop._temporal.plugin",
    "request_result": "toolloop._temporal.results",
    "HttpSource": "toolloop._tools.http",
    "ReadBack": "toolloop._tools.http",
    "verify_approval": "toolloop._tools.in_process",
    "McpSource": "toolloop._tools.mcp",
    "AgentSpec": "toolloop._tools.toolset",
    "Toolset": "toolloop._tools.toolset",
    "AgentWorkflow": "toolloop.workflows.agent",
}


# Hidden from type checkers: they see the imports above, and still flag a name that does not exist.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_importlib.import_module(home), name)
        globals()[name] = value  # once imported, a plain module attribute
        return value


def __dir__() -> list[str]:
    # The curated names and the subpackages imported so far (servicekit, testing), not the helpers above.
    return sorted({*__all__, *(name for name in globals() if not name.startswith("_"))})
