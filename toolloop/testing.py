"""Testing helpers for users' own tools and agents: scripted model turns, running one tool without Temporal,
a worker for a test, starting a request, approving like the trusted channel does, and reading back what the
model was shown - including the check that every call was answered exactly once.

    tools = my_tools()
    out = await toolloop.testing.run_tool(tools, "get_order", {"orderId": "A100"}, actor=Actor(user_id="u1"))

    async with toolloop.testing.worker(client, tools, task_queue="t1", approval_verify_key=verify_key):
        handle = await toolloop.testing.start_request(
            client, "Refund A100", actor=Actor(user_id="u1"), task_queue="t1", model=script(
                [call("refund", {"orderId": "A100"}, "c1")], [say("Refunded.")]))
        async with approve_all(handle, signing_key=key, approver=Actor(user_id="u1")):
            result = await toolloop.request_result(handle)
        outputs = await answered_once(handle)   # call_id -> the output the model read

Starting, following and deciding go through toolloop's client (toolloop.ToolloopClient): these helpers are thin
shortcuts over it for a test that holds a workflow handle. Their decisions are recorded as "<user> via test".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

import httpx
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.worker import Worker

from toolloop._core.approvals import (
    ApprovalClaims,
    generate_signing_key,
    http_subject,
    mint_approval_token,
    payload_digest,
    verify_key_for,
)
from toolloop._core.contracts import (
    Actor,
    AgentResult,
    ConversationItem,
    DecisionReceipt,
    FunctionCallItem,
    FunctionCallOutputItem,
    GrantTerms,
    Limits,
    ModelSpec,
    ModelTurnInput,
    ModelTurnResult,
    OperationRecord,
)
from toolloop._core.registry import ResultRejected, ToolContext, ToolError
from toolloop._core.validation import check_call
from toolloop._models.adapter import ModelAdapter
from toolloop._temporal.approval_channel import DEFAULT_APPROVAL_TTL_SECONDS
from toolloop._temporal.client import ToolloopClient, ToolloopRequest
from toolloop._temporal.plugin import ToolloopPlugin
from toolloop._temporal.results import request_result
from toolloop._temporal.search_attributes import OUTCOME_KEY, TENANT_KEY, UNSETTLED_KEY, USER_KEY
from toolloop._tools.http import default_actor_headers
from toolloop._tools.toolset import AgentSpec, Toolset
from toolloop.activities.conversation import recorded_turns

__all__ = [
    "TEST_CHANNEL",
    "RequestEnded",
    "answered_once",
    "approval_token",
    "approve_all",
    "call",
    "conversation",
    "decide",
    "eventually",
    "generate_signing_key",
    "model_turns",
    "run_tool",
    "say",
    "script",
    "search_attributes",
    "start_request",
    "verify_key_for",
    "waiting_operation",
    "worker",
]

# --- Scripted model turns ---------------------------------------------------------------------------------


def call(name: str, arguments: Mapping[str, Any] | str, call_id: str) -> dict[str, Any]:
    """A scripted `function_call` item; a str is sent verbatim (malformed JSON included)."""
    args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return {"type": "function_call", "name": name, "arguments": args, "call_id": call_id}


def say(text: str) -> dict[str, Any]:
    """A scripted assistant message (the model's answer)."""
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def script(*turns: list[dict[str, Any]]) -> ModelSpec:
    """The script model: turn N answers with the N-th list of items."""
    return ModelSpec.model_validate({"provider": "script", "script": [list(t) for t in turns]})


# --- One tool, without Temporal ----------------------------------------------------------------------------


async def run_tool(
    tools: Toolset,
    name: str,
    arguments: Mapping[str, Any] | str,
    *,
    actor: Actor,
    http: httpx.AsyncClient | None = None,
    operation_id: str | None = None,
    approval_token: str | None = None,
) -> dict[str, Any]:
    """Check `arguments` as the loop does and run the tool's executor once: the output the model would read
    (a rejection included). `http` replaces the tool source's client (an ASGI or mock transport, say); without
    it the toolset must be open (`async with tools.opened():`). A temporary failure raises ToolTemporaryError,
    which the loop would retry; a write's outcome exceptions (WriteOutcomeUnknown, ...) propagate too."""
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    checked = check_call(tools.registry, FunctionCallItem(call_id="test-call", name=name, arguments=text))
    if checked.rejection is not None or checked.arguments is None:
        return dict(checked.rejection or {})
    spec = tools.registry.get(name)
    assert spec is not None  # check_call found it
    source = spec.source
    client = http or (source.http if source is not None else None)
    if client is None:
        raise ValueError(f"tool {name!r} has no source: pass http=")
    headers = getattr(source, "actor_headers", default_actor_headers)(actor)
    digest = None if spec.read_only else payload_digest(checked.target or spec.name, checked.arguments)
    ctx = ToolContext(
        actor=actor,
        http=client,
        workflow_id="test",
        call_id="test-call",
        operation_id=operation_id,
        approval_token=approval_token,
        headers=dict(headers),
        approval_digest=digest,
    )
    try:
        return spec.output_of(await spec.execute(ctx, spec.schema.load(checked.arguments)))
    except ToolError as err:
        return {"ok": False, "code": str(err.code), "message": err.message}
    except ResultRejected:
        return {"ok": False, "code": "INTERNAL", "message": "the tool gave an answer it does not declare"}


# --- An approval token, to test a service directly ------------------------------------------------------------


def approval_token(
    signing_key: str,
    *,
    actor: Actor,
    operation_id: str,
    payload: Mapping[str, Any],
    method: str = "POST",
    path: str | None = None,
    tool: str | None = None,
    audience: str,
    ttl_seconds: float = 60.0,
    decision: Literal["approve", "reject"] = "approve",
    request: str | None = None,
) -> str:
    """The token the approval channel would send with a write, for testing your service (toolloop.servicekit)
    without a workflow: `actor`'s decision on exactly `payload` under `operation_id`, for `method` `path` as
    your service receives it (or, for a tool that is not an HTTP write, for the tool's name), addressed to
    `audience` (the service's own, its kit's `audience=`). `request`: the request it is given in, as the channel
    names it (`f"{workflow_id}/{first run id}"`; a service does not check it; a workflow takes no decision
    without it)."""
    if (path is None) == (tool is None):
        raise ValueError("give the path your service receives, or the tool's name")
    subject = http_subject(method, path) if path is not None else str(tool)
    now = time.time()
    claims = ApprovalClaims(
        audience=audience,
        user_id=actor.user_id,
        tenant_id=actor.tenant_id,
        operation_id=operation_id,
        digest=payload_digest(subject, payload),
        approved_by=actor.user_id,
        approved_at=now,
        expires_at=now + ttl_seconds,
        decision=decision,
        channel="test",
        request=request,
    )
    return mint_approval_token(signing_key, claims)


# --- A worker, a request, approvals ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker(
    client: Client,
    tools: Toolset | AgentSpec,
    *,
    task_queue: str,
    models: Mapping[str, ModelAdapter] | None = None,
    instructions: str | None = None,
    approval_verify_key: str | None = None,
    allow_scripted_models: bool = True,
    **worker_options: Any,
) -> AsyncIterator[Worker]:
    """A started worker with the toolloop plugin for `tools`, shut down explicitly at the end of the block.
    `approval_verify_key`: the approval channel's public key(s) it verifies decisions with (its own
    configuration, as a deployment's worker has it). It serves the scripted models (script(), ...): it is a
    worker for tests."""
    plugin = ToolloopPlugin(
        tools,
        models=models,
        instructions=instructions,
        approval_verify_key=approval_verify_key,
        allow_scripted_models=allow_scripted_models,
    )
    async with Worker(client, task_queue=task_queue, plugins=[plugin], **worker_options) as running:
        yield running


async def start_request(
    client: Client,
    request: str,
    *,
    actor: Actor,
    task_queue: str,
    model: ModelSpec | None = None,
    limits: Limits | None = None,
    instructions: str | None = None,
    request_id: str | None = None,
    tools: Sequence[str] | None = None,
) -> WorkflowHandle[Any, AgentResult]:
    """Start one request (an AgentWorkflow run) through toolloop's client (ToolloopClient.start: its workflow
    id scoped to `actor`, `request_id` or a new one); `model` defaults to the script model with no turns. The
    namespace needs toolloop's search attributes (`search_attributes()`)."""
    started = await ToolloopClient(client, task_queue=task_queue).start(
        request,
        actor=actor,
        request_id=request_id,
        model=model or script(),
        limits=limits,
        instructions=instructions,
        tools=tools,
    )
    return started.handle


def search_attributes() -> list[SearchAttributeKey[Any]]:
    """toolloop's search attributes, for a test server of your own: every request is started with them
    (`WorkflowEnvironment.start_local(search_attributes=toolloop.testing.search_attributes())`)."""
    return [USER_KEY, TENANT_KEY, OUTCOME_KEY, UNSETTLED_KEY]


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30.0, what: str = "") -> None:
    """Poll `check` every 0.1 s until it is true; AssertionError after `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not true within {within} s: {what}")


class RequestEnded(LookupError):
    """The request ended without what was waited for (no operation waited for approval)."""


# The approval channel the helpers decide through: their decisions are recorded as "<user> via test".
TEST_CHANNEL = "test"


def _request(
    handle: WorkflowHandle[Any, Any],
    actor: Actor,
    *,
    signing_key: str | None = None,
    ttl: float = DEFAULT_APPROVAL_TTL_SECONDS,
) -> ToolloopRequest:
    """toolloop's client's view of the run a test holds `handle` of, deciding as the test's channel."""
    return ToolloopRequest.of_handle(
        handle, actor=actor, signing_key=signing_key, channel=TEST_CHANNEL, approval_ttl_seconds=ttl
    )


# Whom a request acts for, where a helper decides nothing (the client's request needs one).
_NOBODY = Actor(user_id="nobody", tenant_id="nobody")


async def waiting_operation(handle: WorkflowHandle[Any, Any], within: float = 30.0) -> OperationRecord:
    """The first operation waiting for approval, as soon as the workflow has one (the client's approvals:
    the workflow's next_approval Update, no polling), with its ledger record. An operation decided elsewhere before
    its record was read is not returned: the next one that waits is. Raises RequestEnded if the request ends
    first, TimeoutError after `within` s."""
    request = _request(handle, _NOBODY)

    async def first() -> OperationRecord:
        async for approval in request.approvals():
            records = await request.operations()
            record = next((op for op in records if op.operation_id == approval.operation_id), None)
            if record is not None and record.state == "awaiting_approval":
                return record
        raise RequestEnded("the request ended without any operation waiting for approval")

    try:
        return await asyncio.wait_for(first(), within)
    except TimeoutError:
        raise TimeoutError(f"no operation waited for approval within {within} s") from None


async def decide(
    handle: WorkflowHandle[Any, Any],
    operation_id: str,
    *,
    signing_key: str,
    decider: Actor,
    approve: bool = True,
    ttl: float = 600,
    roles: Sequence[str] = (),
    grant: GrantTerms | None = None,
) -> DecisionReceipt:
    """What the trusted approval channel does, through toolloop's client: fetch the whole payload, check its
    digest, sign `decider`'s decision (with their `roles`), send it (recorded as "<decider> via test")."""
    request = _request(handle, decider, signing_key=signing_key, ttl=ttl)
    approval = await request.approval(operation_id)
    if approval is None:
        raise LookupError(f"no operation {operation_id}")
    return await request.decide(approval, approve=approve, roles=roles, grant=grant)


@contextlib.asynccontextmanager
async def approve_all(
    handle: WorkflowHandle[Any, Any],
    *,
    signing_key: str,
    approver: Actor,
    ttl: float = 600,
    roles: Sequence[str] = (),
) -> AsyncIterator[list[str]]:
    """Approve every operation the request asks `approver` (with `roles`) about while the block runs, through
    toolloop's client (each recorded as "<approver> via test"); one its policy leaves to others is left to them.
    Yields the operation ids approved so far. A decision the workflow refuses is raised when the block ends."""
    request = _request(handle, approver, signing_key=signing_key, ttl=ttl)
    approved: list[str] = []

    async def loop() -> None:
        async for approval in request.approvals():
            # Without a policy the approver must be the requester: the channel refuses anyone else, loudly.
            if approval.policy is None or approval.may_decide(approver.user_id, roles):
                await request.decide(approval, approve=True, roles=roles)
                approved.append(approval.operation_id)

    task = asyncio.create_task(loop())
    try:
        yield approved
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- What the model was shown ------------------------------------------------------------------------------


async def model_turns(handle: WorkflowHandle[Any, Any]) -> list[tuple[ModelTurnInput, ModelTurnResult | None]]:
    """Every model turn's input (the tool outputs it refers to filled in) and result, decoded from the
    workflow's history."""
    return await recorded_turns(handle)


async def conversation(handle: WorkflowHandle[Any, Any]) -> list[ConversationItem]:
    """Every item the model was shown and answered, in order."""
    items: list[ConversationItem] = []
    for turn_input, turn_result in await model_turns(handle):
        items += turn_input.new_items
        if turn_result is not None:
            items += turn_result.items
    return items


async def answered_once(handle: WorkflowHandle[Any, AgentResult]) -> dict[str, dict[str, Any]]:
    """call_id -> the output the model read. Asserts that every function_call of the finished run was answered
    exactly once: calls followed by another model turn in that turn's input, the calls of the last turn (a
    limit stopped the loop before the model saw their outputs) by exactly one record in the result."""
    turns = await model_turns(handle)
    result = await request_result(handle)
    outputs: list[FunctionCallOutputItem] = []
    calls: list[str] = []
    # From turn 2 on: turn 1 answers none of this request's calls (a thread's message shows the earlier
    # messages' writes there, as calls with their outputs).
    for turn_input, _ in turns[1:]:
        outputs += [i for i in turn_input.new_items if isinstance(i, FunctionCallOutputItem)]
    for number, (_, turn_result) in enumerate(turns):
        if turn_result is None:
            continue
        turn_calls = [i.call_id for i in turn_result.items if isinstance(i, FunctionCallItem)]
        calls += turn_calls
        if number + 1 < len(turns):
            answered = [o.call_id for o in turns[number + 1][0].new_items if isinstance(o, FunctionCallOutputItem)]
            assert sorted(answered) == sorted(set(turn_calls)), (
                f"turn {number + 1}: calls {turn_calls}, outputs {answered}"
            )
    answered = [o.call_id for o in outputs]
    assert len(answered) == len(set(answered)), f"a call_id was answered twice: {answered}"
    assert set(answered) <= set(calls), "an output answers no call"
    recorded = [c.call_id for c in result.calls]
    assert len(recorded) == len(set(recorded)), f"a call_id was recorded twice: {recorded}"
    assert set(recorded) == set(calls), f"calls {calls} but records {recorded}"
    return {o.call_id: json.loads(o.output) for o in outputs}
