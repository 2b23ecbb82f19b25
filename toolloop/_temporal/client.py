"""I/O (client side): one client for everything a program does with requests - start one or attach to it,
follow it, see and decide its approvals, cancel it, read its result. The CLI, the HTTP API, the test bed, the
benchmark and the testing helpers all go through it, so starting a request, its idempotency and the approval
channel are written once.

    client = await toolloop.ToolloopClient.connect("127.0.0.1:7233", signing_key=key, channel="my-app")
    result = await client.run("Refund order A100", actor=actor, approver=ask_a_person)

`approver` sees each operation's exact payload (toolloop.ApprovalRequest: tool, arguments, digest) before
anything is signed, and says approve (True), reject (False) or leave it to someone else (None)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from toolloop._core.approvals import canonical_json
from toolloop._core.codes import ErrorType
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentProgress,
    AgentResult,
    ApprovalRequest,
    ApprovalWait,
    DecisionReceipt,
    EventsPage,
    GrantTerms,
    Limits,
    ModelSpec,
    NextApproval,
    OperationRecord,
)
from toolloop._core.live_text import LiveTextView, Shown
from toolloop._core.names import (
    AGENT_WORKFLOW,
    CLOSE_THREAD_UPDATE,
    GET_EVENTS_QUERY,
    GET_LEDGER_QUERY,
    GET_PENDING_APPROVALS_QUERY,
    GET_PROGRESS_QUERY,
    GET_THREAD_QUERY,
    NEXT_APPROVAL_UPDATE,
    SEND_MESSAGE_UPDATE,
    THREAD_WORKFLOW,
)
from toolloop._core.request_naming import request_memo
from toolloop._core.threads import MessageAccepted, MessageRecord, ThreadInput, ThreadMessage, ThreadView
from toolloop._live.store import START, LiveTextStore, LiveTextUnavailable
from toolloop._temporal.approval_channel import (
    DEFAULT_APPROVAL_TTL_SECONDS,
    ApprovalRefused,
    RequestFinished,
    check_shown_payload,
    fetch_approval_request,
    raise_if_finished,
    send_decision,
    send_decision_then_wait,
)
from toolloop._temporal.converter import data_converter
from toolloop._temporal.following import (
    CLOSED_EVENTS,
    NO_WORKER_YET,
    RunFollower,
    approvals_as_they_come,
    next_approval,
    pending_once_answered,
    raise_if_cancelling,
)
from toolloop._temporal.requests import (
    acts_for,
    decidable_query,
    readable_request_id,
    request_id_of,
    request_search_attributes,
    request_summary,
    request_workflow_id,
    thread_workflow_id,
)
from toolloop._temporal.results import request_result
from toolloop._temporal.search_attributes import thread_search_attributes

logger = logging.getLogger(__name__)
# RPC failures that pass: Temporal restarting or overloaded.
_TRANSIENT = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.RESOURCE_EXHAUSTED})
# How many failures other than Temporal's transient ones in a row a follower asks again after.
_UNEXPECTED_FAILURES = 3
# A thread's messages change only in a workflow task (and its run may close: continue-as-new).
_THREAD_CHANGED = CLOSED_EVENTS | {EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED}

DEFAULT_TASK_QUEUE = "toolloop"
# How long a decider's list waits for one request's answer (a run whose workers are gone answers nothing).
_DECIDABLE_QUERY_TIMEOUT = timedelta(seconds=5)
NO_SIGNING_KEY = "this client holds no approval signing key: it cannot decide"

# What an approver answers for one operation it was shown: approve, reject, or leave it to someone else.
Approver = Callable[[ApprovalRequest], Awaitable[bool | None] | bool | None]


class RequestNotFound(LookupError):
    """No such request for this actor. Another user's request looks exactly like one that does not exist."""


class RequestIdReused(ValueError):
    """The request id names a request that was started with another question, model, limits or tools."""


class ThreadNotFound(LookupError):
    """No such thread for this actor. Another user's thread looks exactly like one that does not exist."""


class MessageRefused(RuntimeError):
    """A thread's message whose request could not start (its request id names another request)."""


class ThreadClosed(RuntimeError):
    """The thread has been closed (by its user, `ToolloopThread.close`, or its workflow by an operator): it takes
    no more messages, and is never started again empty under its id (what its earlier messages did would be
    forgotten)."""


class ThreadBusy(RuntimeError):
    """The thread has as many messages waiting as it takes (toolloop._core.threads.MAX_QUEUED): send again
    once some have run."""


def submission_digest(inp: AgentInput) -> str:
    """What a request id is bound to: the request as it was started (its actor is in its workflow id)."""
    submitted: dict[str, Any] = {
        "question": inp.request,
        "model": inp.model.model_dump(mode="json"),
        "instructions": inp.instructions,
        # Unset budgets (None) left out, as the other optional parts below: the same digest as before they existed.
        "limits": inp.limits.model_dump(mode="json", exclude_none=True),
    }
    # Only when given: a request started before these existed is bound to the same digest as it always was.
    if inp.allowed_tools is not None:
        submitted["tools"] = inp.allowed_tools
    if inp.metadata:
        submitted["metadata"] = inp.metadata
    return "sha256:" + hashlib.sha256(canonical_json(submitted).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class _Channel:
    """The approval channel a request decides through: its signing key, its name, a decision's lifetime."""

    signing_key: str | None
    name: str
    ttl_seconds: float

    def require_key(self) -> str:
        if self.signing_key is None:
            raise ApprovalRefused(NO_SIGNING_KEY)
        return self.signing_key


class ToolloopRequest:
    """One request (one AgentWorkflow run) as its client sees it. `attached` is True when `start` found the
    request already started with the same submission (a retry), False when this call started it."""

    def __init__(
        self,
        channel: _Channel,
        handle: WorkflowHandle[Any, AgentResult],
        actor: Actor,
        request_id: str,
        live_text: LiveTextStore | None = None,
    ) -> None:
        self._channel = channel
        self._live_text = live_text
        self.handle = handle
        self.actor = actor
        self.request_id = request_id
        self.attached = False
        # The first next_approval wait, when it was sent with the start (ToolloopClient.run): it rides the
        # run's first workflow task instead of needing one of its own.
        self._first_wait: WorkflowUpdateHandle[NextApproval] | None = None

    @classmethod
    def of_handle(
        cls,
        handle: WorkflowHandle[Any, Any],
        *,
        actor: Actor,
        signing_key: str | None = None,
        channel: str = "client",
        approval_ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
        live_text: LiveTextStore | None = None,
    ) -> ToolloopRequest:
        """The request a Temporal handle you already hold names (a test's, a parent's), acting for `actor`
        (whose it is was decided where the handle came from), deciding through `channel` with `signing_key`."""
        request_id = request_id_of(actor, handle.id)
        return cls(_Channel(signing_key, channel, approval_ttl_seconds), handle, actor, request_id, live_text)

    @property
    def workflow_id(self) -> str:
        return self.handle.id

    # --- following ---------------------------------------------------------------------------------------

    async def progress(self) -> AgentProgress:
        """Where the request stands: phase, round, calls so far, operations (a query)."""
        progress: AgentProgress = await self.handle.query(GET_PROGRESS_QUERY, result_type=AgentProgress)
        return progress

    async def operations(self) -> list[OperationRecord]:
        """The request's operations (its writes) with their states, as the workflow records them."""
        ledger: list[OperationRecord] = await self.handle.query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
        return ledger

    async def events(self, after: int = 0) -> EventsPage:
        """The request's numbered events after number `after` (phase, tool started/finished, approval needed,
        operation, final: at most 500), and whether the last one has been given: what a client that resumes
        a stream after event N asks for."""
        page: EventsPage = await self.handle.query(GET_EVENTS_QUERY, after, result_type=EventsPage)
        return page

    async def follow(self) -> AsyncIterator[AgentProgress]:
        """The request's progress each time it may have changed (a long poll on its history, no polling
        interval), from now until its run closes; the last one is read after the close."""
        pause: float | None = None
        async with RunFollower(self.handle) as follower:
            while True:
                await follower.wait(at_most=pause)
                running = (await self.handle.describe()).status == WorkflowExecutionStatus.RUNNING
                try:
                    progress = await self.progress()
                except RPCError as err:
                    # No worker answers yet (not picked up, a restart), and the run may append nothing for a
                    # long time (an approval wait): read again at the next change or after a growing pause.
                    if err.status not in NO_WORKER_YET or not running:
                        raise
                    pause = min(pause * 2, 5.0) if pause else 0.5
                    continue
                pause = None
                yield progress
                if not running:
                    return

    async def live_text(self, until: Callable[[], bool] | None = None) -> AsyncIterator[Shown]:
        """The model's text as it is written, turn by turn (docs/DESIGN.md, "Live text"): `text` pieces of the
        newest attempt of each turn, `restarted` when a retried turn starts again (what was shown of it is void),
        `complete` when a turn's answer is whole. Until `until()` is true, by default until the run closes.
        Display only: the request's answer is its result. Nothing without a live text store; a store or a
        Temporal that does not answer for a while is asked again, with a growing pause, while the run is open."""
        if self._live_text is None:
            return
        try:
            run_id = self.handle.run_id or (await self.handle.describe()).run_id
        except RPCError:
            return  # no run to follow: result() says why
        closed = asyncio.Event()
        watcher = asyncio.create_task(self._set_when_closed(closed)) if until is None else None
        stop = until or closed.is_set
        view = LiveTextView()
        after, pause = START, 0.0
        try:
            while True:
                try:
                    async for entry in self._live_text.follow(self.workflow_id, run_id, stop, after):
                        after, pause = entry.position, 0.0
                        for shown in view.add(entry):
                            yield shown
                    return
                except LiveTextUnavailable:
                    if stop():
                        return
                    pause = min(pause * 2, 5.0) if pause else 0.5
                    await asyncio.sleep(pause)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def _set_when_closed(self, closed: asyncio.Event) -> None:
        """Set `closed` once the run has closed, however (a long poll on its result). A Temporal that does not
        answer for a moment is asked again: the run may well be open."""
        pause = 0.0
        while True:
            try:
                await self.handle.result()
            except RPCError as err:
                if err.status not in _TRANSIENT:
                    closed.set()  # not found (the run is gone), not allowed, ...: nothing more to follow
                    return
                pause = min(pause * 2, 5.0) if pause else 0.5
                await asyncio.sleep(pause)
                continue
            except WorkflowFailureError:
                pass  # closed otherwise than answered: failed, cancelled, terminated, timed out
            except Exception as exc:
                # A result this client cannot read: the run has closed all the same.
                logger.debug("live text: the run's result is unreadable (%s)", type(exc).__name__)
            closed.set()
            return

    async def raise_if_finished(self) -> None:
        """RequestFinished if the request has ended: it takes no more decisions."""
        await raise_if_finished(self.handle)

    # --- approvals ---------------------------------------------------------------------------------------

    async def pending_approvals(self) -> list[ApprovalRequest]:
        """Every operation waiting for approval now, each with the exact payload its digest covers."""
        return await pending_once_answered(self.handle)

    async def approval(self, operation_id: str) -> ApprovalRequest | None:
        """One operation's exact payload (waiting or not); None if the request has no such operation."""
        return await fetch_approval_request(self.handle, operation_id)

    async def approval_if_askable(self, operation_id: str) -> ApprovalRequest | None:
        """As `approval`, and None too when no worker answers within a few seconds: for someone else's request,
        which must then look like one that does not exist (never a 503 or a wait that says it does)."""
        try:
            return await fetch_approval_request(self.handle, operation_id, rpc_timeout=_DECIDABLE_QUERY_TIMEOUT)
        except (RPCError, WorkflowQueryFailedError):
            return None

    def approvals(self) -> AsyncIterator[ApprovalRequest]:
        """Each operation once, as soon as it starts waiting for approval (one already waiting first), until
        the run closes. One another approver decided before this one looked is not given."""
        return approvals_as_they_come(self.handle)

    def check_signable(self, approval: ApprovalRequest) -> None:
        """ApprovalRefused if this client would not sign a decision on `approval` (no key, a payload that does
        not match its digest): checked before a person is asked, so nobody decides what cannot be sent."""
        self._channel.require_key()
        check_shown_payload(approval)

    async def decide(
        self,
        approval: ApprovalRequest,
        *,
        approve: bool,
        decider: Actor | None = None,
        roles: Sequence[str] = (),
        grant: GrantTerms | None = None,
    ) -> DecisionReceipt:
        """Approve or reject exactly the payload in `approval` (what the approver was shown): the client's
        approval channel checks its digest, signs it for `decider` (default: the request's own user) and
        sends it. `roles` are the decider's, as their identity gives them: an operation a policy leaves to a role
        (docs/POLICIES.md) is decided by its members. The workflow checks the signature, that the digest is still
        the operation's and that the decider may decide it. `grant` (with an approval, where a policy asked):
        the next writes of the same tool in this request the decider approves in advance (GrantTerms). Raises
        ApprovalRefused (nothing signed: no key, a payload that does not match its digest, a closed window),
        RequestFinished, or temporalio's WorkflowUpdateFailedError when the workflow refuses the decision."""
        return await send_decision(
            self.handle,
            approval,
            approve=approve,
            decider=decider or self.actor,
            key=self._channel.signing_key,
            channel=self._channel.name,
            ttl_seconds=self._channel.ttl_seconds,
            roles=roles,
            grant=grant,
        )

    async def decide_each(
        self, approver: Approver, *, decider: Actor | None = None, roles: Sequence[str] = ()
    ) -> list[DecisionReceipt]:
        """Show `approver` each operation as it starts waiting and send its verdict (None: left to someone
        else), until the run closes; the receipts of the decisions taken. An operation that stopped waiting
        meanwhile (decided elsewhere, expired) is passed over: its state says what happened. Any other refusal
        (a payload that does not match its digest, a token the workers do not accept) is raised: the
        operation still waits, and only a person or a fixed configuration can settle it."""
        self._channel.require_key()  # before waiting for anything
        receipts: list[DecisionReceipt] = []
        seen: list[str] = []
        first_wait, self._first_wait = self._first_wait, None
        approval = await next_approval(self.handle, seen, sent=first_wait)
        me = decider or self.actor
        while approval is not None:
            seen.append(approval.operation_id)
            if not approval.may_decide(me.user_id, roles) or me.tenant_id != approval.actor.tenant_id:
                # Left to the people its policy names (a manager, a second person): they decide elsewhere.
                approval = await next_approval(self.handle, seen)
                continue
            self.check_signable(approval)  # never show an approver what cannot be signed
            verdict = approver(approval)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if verdict is None:
                approval = await next_approval(self.handle, seen)
                continue
            try:
                # The decision's Update also waits for the next operation: one Update per decision.
                receipt, approval = await send_decision_then_wait(
                    self.handle,
                    approval,
                    approve=bool(verdict),
                    decider=decider or self.actor,
                    key=self._channel.signing_key,
                    seen=seen,
                    channel=self._channel.name,
                    ttl_seconds=self._channel.ttl_seconds,
                    roles=roles,
                )
            except RequestFinished:
                break
            except (WorkflowUpdateFailedError, ApprovalRefused):
                now = await self.approval(seen[-1])
                if now is not None and now.state == "awaiting_approval":
                    raise
                approval = await next_approval(self.handle, seen)
                continue
            receipts.append(receipt)
        return receipts

    # --- the end -------------------------------------------------------------------------------------------

    async def cancel(self) -> None:
        """Ask the request to stop: it sends nothing more and settles what is in flight."""
        await self.handle.cancel()

    async def result(self) -> AgentResult:
        """The request's report once it finished: answered, stopped at a limit, cancelled, or failed (a
        failed request's report too). Raises temporalio's WorkflowFailureError only for a run that ended
        without one (terminated, say)."""
        return await request_result(self.handle)


@dataclass(frozen=True)
class ToDecide:
    """What `ToolloopClient.to_decide` found: each operation waiting for the decider, with its request, and
    whether the search saw everything (False: more requests matched than it read, or one of them could not be
    asked now). An incomplete answer is never "nothing waits"."""

    approvals: list[tuple[ToolloopRequest, ApprovalRequest]]
    complete: bool


class ToolloopClient:
    """toolloop's client: requests started, followed, decided and read through one object.

    `signing_key` is the approval channel's private key (the channel is this client: whoever runs it decides
    for the users it serves); without one the client can do everything but decide. `channel` names it in
    each decision's record ("alice via my-app"). The Temporal client must use toolloop's data converter:
    `connect` makes one that does."""

    def __init__(
        self,
        temporal: Client,
        *,
        task_queue: str = DEFAULT_TASK_QUEUE,
        signing_key: str | None = None,
        channel: str = "client",
        approval_ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
        live_text: LiveTextStore | None = None,
    ) -> None:
        self.temporal = temporal
        self.task_queue = task_queue
        self._channel = _Channel(signing_key, channel, approval_ttl_seconds)
        # Where workers write the model's text as it streams (ToolloopRequest.live_text reads it).
        self.live_text = live_text

    @property
    def signing_key(self) -> str | None:
        return self._channel.signing_key

    @property
    def channel(self) -> str:
        return self._channel.name

    @classmethod
    async def connect(
        cls,
        target: str,
        *,
        namespace: str = "default",
        task_queue: str = DEFAULT_TASK_QUEUE,
        signing_key: str | None = None,
        channel: str = "client",
        approval_ttl_seconds: float = DEFAULT_APPROVAL_TTL_SECONDS,
        live_text: LiveTextStore | None = None,
        **connect_options: Any,
    ) -> ToolloopClient:
        """A client of the Temporal service at `target`, with toolloop's data converter."""
        temporal = await Client.connect(target, namespace=namespace, data_converter=data_converter(), **connect_options)
        return cls(
            temporal,
            task_queue=task_queue,
            signing_key=signing_key,
            channel=channel,
            approval_ttl_seconds=approval_ttl_seconds,
            live_text=live_text,
        )

    async def start(
        self,
        question: str,
        *,
        actor: Actor,
        request_id: str | None = None,
        model: ModelSpec | None = None,
        limits: Limits | None = None,
        instructions: str | None = None,
        tools: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ToolloopRequest:
        """Start a request for `actor`, or attach to it: a request id names one request of that actor for as
        long as its history is kept, so starting it again with the same submission (a retry after a lost
        answer) gives back the same run (`attached` True), never a second one. The same id with another
        question, model, limits, instructions, tools or metadata raises RequestIdReused. Without an id, a new
        one that starts with the question's first words (the Temporal UI lists workflow ids)."""
        return await self._start(
            question,
            actor=actor,
            request_id=request_id,
            model=model,
            limits=limits,
            instructions=instructions,
            tools=tools,
            metadata=metadata,
            wait_for_approval=False,
        )

    async def _start(
        self,
        question: str,
        *,
        actor: Actor,
        wait_for_approval: bool,
        request_id: str | None = None,
        model: ModelSpec | None = None,
        limits: Limits | None = None,
        instructions: str | None = None,
        tools: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ToolloopRequest:
        """`start`; with `wait_for_approval`, the run starts with an approver's first next_approval wait in the
        same call (update-with-start), which its first workflow task accepts."""
        inp = _request_input(question, actor, model, limits, instructions, tools, metadata)
        request_id = request_id or readable_request_id(question)
        workflow_id = request_workflow_id(actor, request_id)
        digest = submission_digest(inp)
        options: dict[str, Any] = {
            "id": workflow_id,
            "task_queue": self.task_queue,
            "result_type": AgentResult,
            "search_attributes": request_search_attributes(actor),
            "memo": request_memo(request_id, question, submission=digest),
            "static_summary": request_summary(actor, question),
            "id_conflict_policy": WorkflowIDConflictPolicy.FAIL,
            "id_reuse_policy": WorkflowIDReusePolicy.REJECT_DUPLICATE,
        }
        first_wait: WorkflowUpdateHandle[NextApproval] | None = None
        handle: WorkflowHandle[Any, AgentResult]
        start: WithStartWorkflowOperation[Any, AgentResult] | None = None
        try:
            if wait_for_approval:
                start = WithStartWorkflowOperation(AGENT_WORKFLOW, inp, **options)
                first_wait = await self.temporal.start_update_with_start_workflow(
                    NEXT_APPROVAL_UPDATE,
                    ApprovalWait(),
                    start_workflow_operation=start,
                    wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    result_type=NextApproval,
                )
                handle = await start.workflow_handle()
            else:
                handle = await self.temporal.start_workflow(AGENT_WORKFLOW, inp, **options)
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            raise_if_cancelling()
            raise
        except WorkflowAlreadyStartedError:
            if start is not None:
                # The start operation holds the same error; read it, so asyncio does not log it as unread.
                with contextlib.suppress(WorkflowAlreadyStartedError):
                    await start.workflow_handle()
            handle = await self._owned(workflow_id, actor)
            description = await handle.describe()
            if await description.memo_value("submission", default=None, type_hint=str) != digest:
                raise RequestIdReused(f"request id {request_id} was already used for another request") from None
            attached = ToolloopRequest(self._channel, handle, actor, request_id, self.live_text)
            attached.attached = True
            return attached
        started = ToolloopRequest(self._channel, handle, actor, request_id, self.live_text)
        started._first_wait = first_wait
        return started

    def request(self, request_id: str, *, actor: Actor) -> ToolloopRequest:
        """`actor`'s request `request_id` (request ids are scoped to their actor: another user's id names
        another workflow). Nothing is asked of the server until it is used."""
        handle = self.temporal.get_workflow_handle(request_workflow_id(actor, request_id), result_type=AgentResult)
        return ToolloopRequest(self._channel, handle, actor, request_id, self.live_text)

    async def request_of_workflow(self, workflow_id: str, *, actor: Actor) -> ToolloopRequest:
        """The request a workflow id names, if it acts for `actor` (read from the run's own start event);
        RequestNotFound otherwise, the same for another user's request as for none."""
        handle = await self._owned(workflow_id, actor)
        description = await handle.describe()
        request_id = await description.memo_value("request_id", default=workflow_id, type_hint=str)
        return ToolloopRequest(self._channel, handle, actor, request_id, self.live_text)

    async def to_decide(self, decider: Actor, roles: Sequence[str] = (), *, limit: int = 50) -> ToDecide:
        """The operations waiting now that `decider` (holding `roles`, as their identity gives them) may decide,
        across the running requests of their tenant (the newest `limit` of them): their own, and those whose
        approval policy names them or one of their roles. Each with its request, to decide it through
        (`request.decide(approval, decider=decider, roles=roles)`). `complete` says whether that is all: not
        when more requests matched than `limit`, or a request's worker did not answer in time."""
        executions = [
            execution
            async for execution in self.temporal.list_workflows(decidable_query(decider, roles), limit=limit + 1)
        ]
        requests = [
            request
            for execution in executions[:limit]
            if (request := await self.request_to_decide(execution.id, decider)) is not None
        ]
        # Asked together, each for a short while: a run no worker serves now (its workers are gone) is left out
        # of this answer, and says so, rather than holding up everyone else's.
        pending = await asyncio.gather(*(_pending_now(request) for request in requests))
        return ToDecide(
            approvals=[
                (request, approval)
                for request, approvals in zip(requests, pending, strict=True)
                for approval in approvals or []
                if approval.may_decide(decider.user_id, roles)
            ],
            complete=len(executions) <= limit and all(approvals is not None for approvals in pending),
        )

    async def request_to_decide(self, workflow_id: str, decider: Actor) -> ToolloopRequest | None:
        """The request a workflow id names if it is one of `decider`'s tenant (read from the run's own start
        event); None otherwise. Whether they may decide one of its operations is the operation's to say
        (ApprovalRequest.may_decide), and the workflow checks it again."""
        handle = self.temporal.get_workflow_handle(workflow_id, result_type=AgentResult)
        requester = await acts_for(self.temporal, handle)
        if requester is None or requester.tenant_id != decider.tenant_id:
            return None
        return ToolloopRequest(self._channel, handle, requester, request_id_of(requester, workflow_id), self.live_text)

    async def _owned(self, workflow_id: str, actor: Actor) -> WorkflowHandle[Any, AgentResult]:
        """The workflow's handle if it acts for `actor` (its start event says so); RequestNotFound otherwise."""
        handle = self.temporal.get_workflow_handle(workflow_id, result_type=AgentResult)
        if await acts_for(self.temporal, handle) != actor:
            raise RequestNotFound(f"no request {workflow_id}")
        return handle

    async def run(
        self,
        question: str,
        *,
        actor: Actor,
        approver: Approver | None = None,
        decider: Actor | None = None,
        **start_options: Any,
    ) -> AgentResult:
        """One call: start the request (see `start`), show `approver` each operation that waits for approval
        and send its verdict, and return the report once the request finished. Without an approver the
        request's writes wait for a decision from elsewhere (the web page, the CLI), or expire."""
        if approver is not None:
            self._channel.require_key()  # before anything starts
        request = await self._start(question, actor=actor, wait_for_approval=approver is not None, **start_options)
        return await _finish(request, approver, decider)

    def thread(self, thread_id: str, *, actor: Actor) -> ToolloopThread:
        """`actor`'s thread `thread_id` (scoped like request ids: another user's thread id names another
        thread). Its first message starts it; nothing is asked of the server until it is used."""
        return ToolloopThread(self, thread_id, actor)


def _request_input(
    question: str,
    actor: Actor,
    model: ModelSpec | None,
    limits: Limits | None,
    instructions: str | None,
    tools: Sequence[str] | None,
    metadata: Mapping[str, str] | None,
) -> AgentInput:
    return AgentInput(
        request=question,
        actor=actor,
        model=model or ModelSpec(),
        limits=limits or Limits(),
        instructions=instructions,
        allowed_tools=list(tools) if tools is not None else None,
        metadata=dict(metadata or {}),
    )


async def _pending_now(request: ToolloopRequest) -> list[ApprovalRequest] | None:
    """The run's operations waiting now, if a worker answers within a few seconds; None (not known) otherwise."""
    try:
        found: list[ApprovalRequest] = await request.handle.query(
            GET_PENDING_APPROVALS_QUERY, result_type=list[ApprovalRequest], rpc_timeout=_DECIDABLE_QUERY_TIMEOUT
        )
    except (RPCError, WorkflowQueryFailedError) as exc:
        why = {"workflow_id": request.handle.id, "why": str(exc)}
        logger.warning("a request's pending approvals are not known now", extra=why)
        return None
    return found


async def _finish(request: ToolloopRequest, approver: Approver | None, decider: Actor | None) -> AgentResult:
    """The request's report, once `approver` (if any) has been shown each operation that waited for approval."""
    if approver is None:
        return await request.result()
    deciding = asyncio.create_task(request.decide_each(approver, decider=decider))
    finishing = asyncio.create_task(request.result())
    try:
        await asyncio.wait({deciding, finishing}, return_when=asyncio.FIRST_COMPLETED)
        if deciding.done() and not finishing.done() and deciding.exception() is not None:
            raise deciding.exception()  # type: ignore[misc]  # the approver itself failed
        return await finishing
    finally:
        for task in (deciding, finishing):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class ToolloopThread:
    """One thread of one actor: a conversation whose messages run one after another, each one request that is
    shown what happened before it (docs/DESIGN.md, "Threads"). Its workflow starts with its first message."""

    def __init__(self, client: ToolloopClient, thread_id: str, actor: Actor) -> None:
        # The client it was made by: its Temporal client, task queue and approval channel.
        self.client = client
        self.thread_id = thread_id
        self.actor = actor
        self.handle: WorkflowHandle[Any, Any] = client.temporal.get_workflow_handle(
            thread_workflow_id(actor, thread_id)
        )

    @property
    def workflow_id(self) -> str:
        return self.handle.id

    async def send(
        self,
        question: str,
        *,
        request_id: str | None = None,
        model: ModelSpec | None = None,
        limits: Limits | None = None,
        instructions: str | None = None,
        tools: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> MessageAccepted:
        """Add a message to the thread (starting the thread with its first): it runs once every message accepted
        before it has ended (`ahead` says how many have not). A request id names one message, as it names one
        request: sent again with the same submission (a retry) it is the same message (`attached`), with
        another it raises RequestIdReused."""
        inp = _request_input(question, self.actor, model, limits, instructions, tools, metadata)
        request_id = request_id or readable_request_id(question)
        message = ThreadMessage(request_id=request_id, submission=submission_digest(inp), request=inp)
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            THREAD_WORKFLOW,
            ThreadInput(thread_id=self.thread_id, actor=self.actor),
            id=self.workflow_id,
            task_queue=self.client.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # A closed thread is not started again empty: its earlier messages' writes would be forgotten.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=thread_search_attributes(self.actor, self.thread_id),
            static_summary=f"thread {self.thread_id} of {self.actor.user_id}@{self.actor.tenant_id}",
        )
        try:
            accepted: MessageAccepted = await self.client.temporal.execute_update_with_start_workflow(
                SEND_MESSAGE_UPDATE, message, start_workflow_operation=start, result_type=MessageAccepted
            )
        except WorkflowAlreadyStartedError:
            with contextlib.suppress(WorkflowAlreadyStartedError):
                await start.workflow_handle()  # the start operation holds the same error: read, not logged
            # The thread's workflow has ended: a message it took is still that message (a retry), never new.
            earlier = await self._taken_before(message)
            if earlier is not None:
                return earlier
            raise ThreadClosed(f"thread {self.thread_id} has been closed; start another thread") from None
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == ErrorType.REQUEST_ID_REUSED:
                raise RequestIdReused(cause.message) from None
            if isinstance(cause, ApplicationError) and cause.type == ErrorType.THREAD_FULL:
                raise ThreadBusy(cause.message) from None
            if isinstance(cause, ApplicationError) and cause.type == ErrorType.THREAD_CLOSED:
                raise ThreadClosed(cause.message) from None
            raise
        return accepted

    async def _taken_before(self, message: ThreadMessage) -> MessageAccepted | None:
        """The answer to a message its thread took before its workflow ended, as a retry is answered; None if it
        has no message under this id. RequestIdReused if it has, with another submission."""
        record = next((m for m in await self.messages() if m.request_id == message.request_id), None)
        if record is None:
            return None
        if record.submission != message.submission:
            raise RequestIdReused(f"request id {message.request_id} was already used for another message")
        return MessageAccepted(
            number=record.number,
            request_id=record.request_id,
            workflow_id=record.workflow_id,
            ahead=0,
            attached=True,
            state=record.state,
            submission=record.submission,
        )

    async def close(self) -> list[MessageRecord]:
        """Close the thread: it takes no new message (`send` raises ThreadClosed); the messages it accepted still
        run, one after another, and then its workflow ends. Closing a closed thread is no error. Its messages as
        they are now; ThreadNotFound if there is no such thread of this actor."""
        try:
            view: ThreadView = await self.handle.execute_update(CLOSE_THREAD_UPDATE, result_type=ThreadView)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            # No such thread, or its workflow has ended already (closed before, or by an operator).
            return await self.messages()
        return view.messages

    async def request(self, message: str | MessageAccepted) -> ToolloopRequest:
        """The request of a message (its request id, or what `send` answered), once it has started: a queued
        message waits here for the ones before it (following the thread, no Update held open). MessageRefused
        if it could not start; ThreadNotFound if the thread has no such message."""
        if isinstance(message, MessageAccepted):
            if message.state in ("running", "finished") or await self._started(message):
                return self.client.request(message.request_id, actor=self.actor)
            message = message.request_id
        request_id = message
        async with contextlib.aclosing(self.follow()) as views:
            async for messages in views:
                record = next((m for m in messages if m.request_id == request_id), None)
                if record is None:
                    raise ThreadNotFound(f"no message {request_id} in thread {self.thread_id}")
                if record.state == "refused":
                    raise MessageRefused(record.note or f"message {request_id} could not start")
                if record.state != "queued":
                    return self.client.request(request_id, actor=self.actor)
        raise MessageRefused(f"thread {self.thread_id} ended before message {request_id} started")

    async def _started(self, accepted: MessageAccepted) -> bool:
        """Whether a message with nothing ahead of it has started, told by its request's own workflow: started by
        the very run of this thread that accepted the message (a run never forgets a message it started, so no
        other message's request can be that run's child under this id), with the message's submission in its
        memo. The thread starts it in the task that accepted the message, so it has almost always started by the
        time the answer arrives; one describe then replaces following the thread (a describe, a query and a
        history long poll for each change). Any doubt - not started yet, started by a later run, another request
        under that id, an answer from a worker of an earlier version - is left to following the thread."""
        if accepted.ahead or not accepted.submission or not accepted.thread_run_id:
            return False
        try:
            description = await self.client.temporal.get_workflow_handle(accepted.workflow_id).describe()
            if (description.parent_id, description.parent_run_id) != (self.workflow_id, accepted.thread_run_id):
                return False
            submission = await description.memo_value("submission", default="", type_hint=str)
        except (RPCError, ValueError):
            return False
        return submission == accepted.submission

    async def follow(self) -> AsyncGenerator[list[MessageRecord], None]:
        """The thread's messages now, then again each time they change, for as long as the thread's workflow
        runs (across its continue-as-new): a long poll on its history - every change is a workflow task, and
        every task ends with an event. Each run's history is read once, then long-polled from where it was
        left. A Temporal that does not answer for a while is asked again. ThreadNotFound if there is no such
        thread of this actor."""
        seen: list[MessageRecord] | None = None
        pause = 0.0
        unexpected = 0
        while True:
            try:
                # The run and its length first, then the messages: a change after this read is an event after it.
                description = await self.handle.describe()
                messages = await self.messages()
                if messages != seen:
                    seen = messages
                    yield messages
                if description.status != WorkflowExecutionStatus.RUNNING:
                    return
                length = description.raw_description.workflow_execution_info.history_length
                run = self.client.temporal.get_workflow_handle(self.workflow_id, run_id=description.run_id)
                async for event in run.fetch_history_events(wait_new_event=True):
                    if event.event_id <= length or event.event_type not in _THREAD_CHANGED:
                        continue
                    if event.event_type in CLOSED_EVENTS:
                        break  # continued as new (the next run is described above) or ended
                    messages = await self.messages()
                    if messages != seen:
                        seen = messages
                        yield messages
                    pause, unexpected = 0.0, 0
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    raise ThreadNotFound(f"no thread {self.thread_id}") from None
                # Another failure is asked again a few times (messages() does so for its own query): a describe
                # or a long poll that meets the run the moment it closes.
                unexpected += err.status not in _TRANSIENT
                if unexpected > _UNEXPECTED_FAILURES:
                    raise
                pause = min(pause * 2, 5.0) if pause else 0.5
                await asyncio.sleep(pause)

    async def messages(self) -> list[MessageRecord]:
        """The thread's messages, oldest first, with their states and outcomes. ThreadNotFound if there is no such
        thread of this actor."""
        failures = 0
        while True:
            try:
                view: ThreadView = await self.handle.query(GET_THREAD_QUERY, result_type=ThreadView)
                return view.messages
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    raise ThreadNotFound(f"no thread {self.thread_id}") from None
                # A query that meets the run the moment it closes (its worker evicting it) fails once, and is
                # answered from the closed run after: asked again a few times (a CI run's GET met it as a 503).
                failures += 1
                if failures > _UNEXPECTED_FAILURES:
                    raise
                await asyncio.sleep(0.25 * 2 ** (failures - 1))

    async def run(
        self,
        question: str,
        *,
        approver: Approver | None = None,
        decider: Actor | None = None,
        **send_options: Any,
    ) -> AgentResult:
        """One call: send the message, wait for its turn, show `approver` each operation that waits for
        approval, and return the report once the message's request has finished."""
        if approver is not None and self.client.signing_key is None:
            raise ApprovalRefused(NO_SIGNING_KEY)  # before anything is sent
        request = await self.request(await self.send(question, **send_options))
        return await _finish(request, approver, decider)
