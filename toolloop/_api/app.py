"""I/O: the HTTP API (FastAPI) - start a request, list and read the caller's requests, follow one as
server-sent events, and decide its pending approvals. It is a trusted approval channel: it holds the approval
signing key, and its decisions are recorded as "<user> via api". Starting (or attaching to) a request,
reading its progress, its result and an operation's payload, and signing and sending a decision all go
through toolloop's one client (toolloop.ToolloopClient), as the CLI's do; what is the API's own is HTTP,
who the caller is, the limits per caller, the list and the event stream.

Identity comes from the bearer token and nowhere else. A request id is scoped to the token's tenant and user
(the workflow id is derived from all three), so another user's or tenant's request is simply not found: the
same 404 as a request that does not exist.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import MetricMeter
from temporalio.service import RPCError, RPCStatusCode

from toolloop._api.limits import ApiLimits, CreationRate, StreamSlots, limits_from_environment
from toolloop._api.openapi import CALLER_CODES, ENDED_WITHOUT_REPORT, problems, use_problem_schema
from toolloop._api.threads import (
    Cursor,
    MessageAnswer,
    MessageView,
    ThreadPage,
    ThreadSummary,
    ThreadView,
    message_view,
    thread_stream,
    thread_view,
)
from toolloop._api.tokens import Grant, TokenMap
from toolloop._core.contracts import (
    MODEL_NAME,
    Actor,
    AgentResult,
    ApprovalRequest,
    CallRecord,
    DecisionReceipt,
    EventsPage,
    GrantTerms,
    Limits,
    ModelSpec,
    OperationRecord,
    Outcome,
    left_mid_way,
    outcome_without_report,
)
from toolloop._core.registry import TOOL_NAME
from toolloop._core.request_naming import THREAD_ID
from toolloop._core.threads import MessageRecord
from toolloop._core.usage import RequestUsage
from toolloop._live.store import LiveTextStore
from toolloop._temporal.approval_channel import ApprovalRefused, RequestFinished
from toolloop._temporal.client import (
    RequestIdReused,
    RequestNotFound,
    ThreadBusy,
    ThreadClosed,
    ThreadNotFound,
    ToolloopClient,
    ToolloopRequest,
    ToolloopThread,
)
from toolloop._temporal.following import RunFollower
from toolloop._temporal.requests import (
    REQUEST_ID,
    UNREADABLE_REQUEST,
    list_query,
    readable_request_id,
    request_id_of,
    thread_list_query,
)
from toolloop._temporal.search_attributes import OUTCOME_KEY, TENANT_KEY, THREAD_KEY, USER_KEY
from toolloop._temporal.telemetry import API_DECISIONS, API_RESPONSES
from toolloop.servicekit import KitProblem, describe_errors

T = TypeVar("T")

logger = logging.getLogger("toolloop.api")

MAX_BODY_BYTES = 65_536
# The approval channel's name in each decision's record: "u1 via api".
CHANNEL = "api"
_DISCONNECT_CHECK_SECONDS = 5.0
# A stream ends by itself at the latest after this long (the client reconnects with Last-Event-ID).
_STREAM_SECONDS = 3600.0
_STATIC = Path(__file__).resolve().parent / "static"

Problem = KitProblem


# --- Bodies and views --------------------------------------------------------------------------------------


class LimitsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_rounds: int | None = Field(default=None, ge=1, le=100)
    max_total_calls: int | None = Field(default=None, ge=1, le=1000)
    deadline_seconds: float | None = Field(default=None, gt=0, le=86_400)
    approval_ttl_seconds: float | None = Field(default=None, gt=0, le=86_400)
    # The request's budget: no model turn once the turns so far reached it (Limits).
    max_total_tokens: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    max_cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class RequestBody(BaseModel):
    """What a client asks: the question, and optionally the model (a name the worker has, `provider[:model]`),
    instructions, limits, and the only tools the request may use."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=20_000, pattern=r"\S")
    model: str | None = Field(default=None, max_length=100)
    instructions: str | None = Field(default=None, max_length=20_000)
    limits: LimitsBody | None = None
    tools: list[Annotated[str, Field(pattern=TOOL_NAME.pattern)]] | None = Field(default=None, max_length=500)


class DecisionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    digest: str = Field(min_length=1, max_length=200)
    # With an approval, where a policy asked: the next writes of the same tool in this request approved in
    # advance (docs/POLICIES.md, "Grants").
    grant: GrantTerms | None = None


class RequestSummary(BaseModel):
    id: str
    workflow_id: str
    status: str
    outcome: str | None = None
    question: str | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None


class RequestPage(BaseModel):
    requests: list[RequestSummary]
    next_page_token: str | None = None


class RequestView(BaseModel):
    id: str
    workflow_id: str
    status: str  # running, or the result's status (completed | stopped | failed), or Temporal's (terminated, ...)
    phase: str
    rounds: int
    calls: list[CallRecord]
    operations: list[OperationRecord]
    final_text: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    events: int = 0
    # A finished request's outcome (AgentResult.outcome: the rule of the CLI's exit code and the UI's list).
    outcome: Outcome | None = None
    # The model's token totals and their cost so far (AgentResult.usage); zeros when the model reports none.
    usage: RequestUsage = Field(default_factory=RequestUsage)


class Me(BaseModel):
    user_id: str
    tenant_id: str
    # The models the caller may start requests on (its token's list, else every model the API knows); None when
    # the API is not told the workers' models and the token has no list: any model the workers serve.
    models: list[str] | None = None
    # The model a request that names none gets, when the caller may use it (else it must name one).
    default_model: str | None = None
    # The caller's roles in its tenant, as its token gives them (an approval policy may let a role decide).
    roles: list[str] = Field(default_factory=list)


class Decidable(BaseModel):
    """An operation waiting now that the caller may decide: in one of their own requests, or in another's of
    their tenant whose approval policy names them or one of their roles."""

    workflow_id: str
    requester: str  # the user the write acts for
    operation: ApprovalRequest


class DecidablePage(BaseModel):
    approvals: list[Decidable]
    # False when the list may leave something out: more requests matched than the API reads
    # (TOOLLOOP_API_APPROVALS_SCAN), or one of them could not be asked now.
    complete: bool


# --- Settings -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiConfig:
    task_queue: str
    tokens: TokenMap
    # The approval channel's private key: it signs decisions (the workers verify them with their own keys).
    signing_key: str | None
    default_model: str = "offline"
    max_body_bytes: int = MAX_BODY_BYTES
    # Temporal's metric meter of the API's runtime (its Prometheus endpoint); None: counts are not kept.
    meter: MetricMeter | None = None
    # What one caller may hold and do. Read from the TOOLLOOP_API_* variables when the entry point builds this
    # configuration, unless it gives them.
    limits: ApiLimits = field(default_factory=limits_from_environment)
    # Where workers write the model's text as it is written: the event stream passes it on (`model_text`).
    live_text: LiveTextStore | None = None


# --- Helpers --------------------------------------------------------------------------------------------------


class BodyLimit:
    """Refuses a body over `max_bytes` with 413 before the app sees it: by Content-Length, or (a chunked body)
    by reading what arrives, at most `max_bytes`, before the app runs."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _problem(413, "BODY_TOO_LARGE", f"the body may be at most {self.max_bytes} bytes")
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        # Read here, not inside the app: a framework that parses the body turns any error raised while it
        # reads into its own 400.
        chunks: list[bytes] = []
        seen = 0
        first: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                first = message  # the client went away: the app hears it
                break
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message = first or {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        delivered = False

        async def replayed() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return body
            return await receive()

        await self.app(scope, replayed, send)


def _problem(status: int, code: str, detail: str) -> JSONResponse:
    return Problem(status, code, detail).response()


def _not_found(request_id: str) -> Problem:
    # The same words whether the request does not exist or belongs to someone else.
    return Problem(404, "NOT_FOUND", f"no request {request_id}")


def _model_spec(name: str | None, default: str) -> ModelSpec:
    try:
        return ModelSpec.named(name or default)
    except ValueError:
        raise Problem(422, "INVALID_REQUEST", f"model: {MODEL_NAME} expected, optionally :MODEL") from None


def _limits(body: LimitsBody | None, allowed: ApiLimits) -> Limits:
    given = body.model_dump(exclude_none=True) if body is not None else {}
    problem = allowed.limits_problem(given.get("deadline_seconds"), given.get("approval_ttl_seconds"))
    if problem is not None:
        raise Problem(422, "INVALID_REQUEST", problem)
    return allowed.request_limits(given)


def _check_tools(names: list[str] | None, allowed: ApiLimits) -> None:
    unknown = allowed.unknown_tools(names)
    if unknown:
        known = sorted(allowed.tools or ())
        raise Problem(
            422,
            "UNKNOWN_TOOL",
            f"tools: the worker has no tool {', '.join(unknown)}; it has {', '.join(known)}",
            extra={"unknown_tools": unknown, "known_tools": known},
        )


def _check_model(model: ModelSpec, allowed: ApiLimits, granted: frozenset[str] | None, *, defaulted: bool) -> None:
    refusal = allowed.model_refusal(model, granted, defaulted=defaulted)
    if refusal is not None:
        detail, usable = refusal
        # The same status, code and fields for a model that does not exist and one the caller may not use;
        # "known_models" lists the caller's own.
        raise Problem(422, "UNKNOWN_MODEL", detail, extra={"known_models": usable} if usable is not None else None)


class PageTokens:
    """The list's page tokens: Temporal's, signed for the caller, so a token this API did not give that caller
    is refused at once (422) instead of reaching Temporal. The key comes from the approval key, so every
    replica of the API reads the others' tokens; without one, from this process alone."""

    def __init__(self, secret: str | None) -> None:
        seed = secret.encode() if secret is not None else secrets.token_bytes(32)
        self._key = hashlib.sha256(b"toolloop page tokens\0" + seed).digest()

    def _mac(self, actor: Actor, token: bytes) -> bytes:
        scope = json.dumps([actor.tenant_id, actor.user_id]).encode()
        return hmac.new(self._key, scope + b"\0" + token, hashlib.sha256).digest()[:16]

    def make(self, actor: Actor, token: bytes) -> str:
        return _b64(token) + "." + _b64(self._mac(actor, token))

    def read(self, actor: Actor, text: str) -> bytes:
        body, _, mac = text.partition(".")
        try:
            token, given = _unb64(body), _unb64(mac)
        except ValueError:
            given, token = b"", b""
        if not token or not hmac.compare_digest(given, self._mac(actor, token)):
            raise Problem(422, "INVALID_REQUEST", "page_token: not a token this API gave you")
        return token


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _no_thread(thread_id: str) -> Problem:
    # The same words whether the thread does not exist or is someone else's (whose id names another thread).
    return Problem(404, "NOT_FOUND", f"no thread {thread_id}")


def _key_reused() -> Problem:
    return Problem(422, "IDEMPOTENCY_KEY_REUSED", "this Idempotency-Key was already used for another request")


def _finished(request_id: str) -> Problem:
    return Problem(409, "REQUEST_FINISHED", f"request {request_id} has finished; it takes no more decisions")


def _listed_outcome(execution: WorkflowExecution) -> str | None:
    """The outcome a listed request's search attribute holds; None for a closed run that never set it (it ended
    without its report: terminated, timed out), whose writes only its own view reads (GET /v1/requests/{id})."""
    outcome = execution.typed_search_attributes.get(OUTCOME_KEY)
    if outcome == "running" and execution.status != WorkflowExecutionStatus.RUNNING:
        return None
    return outcome


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    if status is None:
        return "unknown"
    return status.name.lower()


# --- Who calls ------------------------------------------------------------------------------------------------


# auto_error=False: a missing or malformed header gets this API's own 401 problem+json, not FastAPI's 403.
_bearer = HTTPBearer(
    scheme_name="bearer", description="A token of the API's tokens file (TOOLLOOP_API_TOKENS).", auto_error=False
)


async def caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Actor:
    """The actor of the bearer token; 401 for a missing or unknown token."""
    config: ApiConfig = request.app.state.config
    token = credentials.credentials.strip() if credentials is not None else ""
    found = config.tokens.grant_for(token) if token else None
    if found is None:
        challenge = {"WWW-Authenticate": "Bearer"}
        raise Problem(401, "UNAUTHORIZED", "a valid bearer token is required", headers=challenge)
    request.state.actor = found.actor  # for the request's log line
    request.state.grant = found
    return found.actor


Caller = Annotated[Actor, Depends(caller)]


async def grant(request: Request, actor: Caller) -> Grant:
    """What the caller's token grants besides who it is (the models it may use). After `caller`, which FastAPI
    answers once per request however many dependencies ask for it, and which keeps the token's grant."""
    found: Grant = request.state.grant
    return found


CallerGrant = Annotated[Grant, Depends(grant)]
RequestId = Annotated[str, PathParam(pattern=REQUEST_ID.pattern, max_length=64)]
ThreadId = Annotated[str, PathParam(pattern=THREAD_ID.pattern, max_length=64)]
OperationId = Annotated[str, PathParam(max_length=100)]
WorkflowId = Annotated[str, PathParam(pattern=r"^[A-Za-z0-9_.@-]{1,255}$")]


# --- The app --------------------------------------------------------------------------------------------------


def create_app(client: Client, config: ApiConfig) -> ASGIApp:
    """The API over a connected Temporal client (with toolloop's data converter). Requests are started,
    read and decided through one toolloop client over it, the approval channel "api"; the Temporal client
    itself serves only the caller's list and the count of their running requests (visibility)."""
    app = FastAPI(
        title="toolloop API",
        version="1",
        description="Start tool-calling requests, follow them live, and decide their side effects.",
    )
    app.state.config = config
    toolloop_client = ToolloopClient(
        client,
        task_queue=config.task_queue,
        signing_key=config.signing_key,
        channel=CHANNEL,
        live_text=config.live_text,
    )
    page_tokens = PageTokens(config.signing_key)
    streams = StreamSlots(config.limits.max_streams_per_caller, config.limits.max_streams)
    creation_rate = CreationRate(config.limits.create_rate)

    @app.middleware("http")
    async def log_and_count(request: Request, call_next: Any) -> Response:
        started = time.monotonic()
        response: Response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        actor = getattr(request.state, "actor", None)
        duration_ms = int((time.monotonic() - started) * 1000)
        if config.meter is not None:
            attributes = {"route": route, "method": request.method, "status": str(response.status_code)}
            config.meter.create_counter(API_RESPONSES, "API responses by route and status").add(1, attributes)
        logger.info(
            "api request",
            extra={
                "method": request.method,
                "route": route,
                "status": response.status_code,
                "duration_ms": duration_ms,
                "user_id": actor.user_id if actor else None,
                "tenant_id": actor.tenant_id if actor else None,
                "request_id": request.path_params.get("request_id"),
                "thread_id": request.path_params.get("thread_id"),
            },
        )
        return response

    @app.exception_handler(Problem)
    async def on_problem(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, Problem)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> Response:
        errors = [{**e, "loc": [str(p) for p in e.get("loc", ())][1:] or ["body"]} for e in exc.errors()]
        return _problem(422, "INVALID_REQUEST", describe_errors(errors) or "the request is invalid")

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "INVALID_REQUEST")
        return _problem(exc.status_code, code, "no such resource" if exc.status_code == 404 else str(exc.detail))

    @app.exception_handler(RPCError)
    async def on_temporal_error(_: Request, exc: Exception) -> Response:
        return _problem(503, "TEMPORAL_UNAVAILABLE", "Temporal did not answer; try again")

    @app.exception_handler(WorkflowUpdateRPCTimeoutOrCancelledError)
    async def on_unconfirmed_change(request: Request, exc: Exception) -> Response:
        # A decision, a message or a close whose Update Temporal gave up waiting for (no worker running, a deploy):
        # it may still be applied, so neither "done" nor "not done" (UNCONFIRMED_CHANGE says what to do).
        logger.warning("an update was not confirmed", extra={"path": request.url.path, "why": str(exc)})
        return _problem(503, "UNCONFIRMED", UNCONFIRMED_CHANGE)

    @app.exception_handler(WorkflowQueryFailedError)
    async def on_unreadable_request(request: Request, exc: Exception) -> Response:
        logger.error("a query failed", extra={"request_id": request.path_params.get("request_id"), "why": str(exc)})
        return _problem(503, "REQUEST_UNREADABLE", UNREADABLE_REQUEST)

    async def confirmed(change: Awaitable[T]) -> T:
        """A change sent as an Update, or 503 UNCONFIRMED once no worker has confirmed it for a while."""
        try:
            async with asyncio.timeout(config.limits.change_wait_seconds):
                return await change
        except TimeoutError:
            raise Problem(503, "UNCONFIRMED", UNCONFIRMED_CHANGE) from None

    async def found(actor: Actor, request_id: str) -> tuple[ToolloopRequest, WorkflowExecutionDescription]:
        """The caller's request and how its workflow stands, if it exists and is theirs (its search attributes
        say so); 404 otherwise, the same answer for another user's request as for none."""
        request = toolloop_client.request(request_id, actor=actor)
        try:
            description = await request.handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise _not_found(request_id) from None
            raise
        attributes = description.typed_search_attributes
        if attributes.get(USER_KEY) != actor.user_id or attributes.get(TENANT_KEY) != actor.tenant_id:
            raise _not_found(request_id)
        return request, description

    def checked_submission(
        body: RequestBody, granted: Grant, idempotency_key: str | None
    ) -> tuple[str, ModelSpec, Limits]:
        """A request's (or a thread message's) id, model and limits, once its body and key are valid for the
        caller; the same checks and problems for both."""
        if idempotency_key is not None and not REQUEST_ID.fullmatch(idempotency_key):
            raise Problem(
                400, "INVALID_IDEMPOTENCY_KEY", "Idempotency-Key: 1-64 of A-Z a-z 0-9 _ . - (first a letter or digit)"
            )
        # Without a key of the caller's: an id that shows the question in the UI's default list.
        request_id = idempotency_key or readable_request_id(body.question)
        model, limits = _model_spec(body.model, config.default_model), _limits(body.limits, config.limits)
        _check_tools(body.tools, config.limits)
        _check_model(model, config.limits, granted.models, defaulted=not body.model)
        return request_id, model, limits

    async def refusal_to_create(actor: Actor) -> Problem | None:
        """Why the actor may not start another request now (the rate, then its running requests), or None."""
        wait = creation_rate.take(actor)
        if wait is not None:
            return Problem(
                429,
                "RATE_LIMITED",
                f"at most {creation_rate.item} new requests per caller; try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        # Temporal's visibility counts them, so every replica of the API sees the same number; it lags a
        # moment behind a start, which the rate above bounds.
        running = await client.count_workflows(f'{list_query(actor)} AND ExecutionStatus = "Running"')
        if running.count >= config.limits.max_active_requests:
            return Problem(
                429,
                "TOO_MANY_ACTIVE_REQUESTS",
                f"you have {running.count} requests running, the most one caller may; wait until one finishes",
            )
        return None

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/v1/me", response_model=Me, responses=problems("UNAUTHORIZED"))
    async def me(actor: Caller, granted: CallerGrant) -> Me:
        usable = config.limits.usable_models(granted.models)
        default = config.default_model.partition(":")[0]
        return Me(
            user_id=actor.user_id,
            tenant_id=actor.tenant_id,
            models=sorted(usable) if usable is not None else None,
            default_model=config.default_model if usable is None or default in usable else None,
            roles=sorted(granted.roles),
        )

    @app.post(
        "/v1/requests",
        response_model=RequestSummary,
        status_code=201,
        responses=problems(
            "INVALID_IDEMPOTENCY_KEY",
            *CALLER_CODES,
            "BODY_TOO_LARGE",
            "IDEMPOTENCY_KEY_REUSED",
            "UNKNOWN_TOOL",
            "UNKNOWN_MODEL",
            "RATE_LIMITED",
            "TOO_MANY_ACTIVE_REQUESTS",
            "NOT_FOUND",
            "REQUEST_UNREADABLE",
        ),  # fmt: skip
    )
    async def start_request(
        body: RequestBody,
        actor: Caller,
        granted: CallerGrant,
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=64)] = None,
    ) -> RequestSummary:
        request_id, model, limits = checked_submission(body, granted, idempotency_key)
        refusal = await refusal_to_create(actor)
        if refusal is not None:
            # The same Idempotency-Key again is not a new request: it answers as it always did.
            if idempotency_key is None:
                raise refusal
            try:
                await found(actor, request_id)
            except Problem:
                raise refusal from None
        try:
            # The same key and body again (also after it finished) attaches to the request it started.
            started = await toolloop_client.start(
                body.question,
                actor=actor,
                request_id=request_id,
                model=model,
                limits=limits,
                instructions=body.instructions,
                tools=body.tools,
            )
        except RequestIdReused:
            raise _key_reused() from None
        except RequestNotFound:
            # The id's workflow exists, and its start event does not say it acts for the caller (a Temporal that
            # did not answer is an RPCError, answered 503 by its handler): 404 if it is not the caller's by its
            # search attributes either, as every other route asks; else its start cannot be read.
            await found(actor, request_id)
            raise Problem(503, "REQUEST_UNREADABLE", UNREADABLE_REQUEST) from None
        summary = RequestSummary(
            id=request_id, workflow_id=started.workflow_id, status="running", question=body.question[:200]
        )
        if started.attached:
            description = await started.handle.describe()
            response.status_code = 200
            summary.status = _status_name(description.status)
            summary.started_at = description.start_time
        else:
            response.headers["Location"] = f"/v1/requests/{request_id}"
            try:
                summary.started_at = (await started.handle.describe()).start_time
            except RPCError:  # it started: a failed look at it must not say otherwise
                summary.started_at = datetime.now(UTC)
        return summary

    @app.get("/v1/requests", response_model=RequestPage, responses=problems(*CALLER_CODES))
    async def list_requests(
        actor: Caller,
        page_size: Annotated[int, Query(ge=1, le=100)] = 20,
        page_token: Annotated[str | None, Query(max_length=2000)] = None,
    ) -> RequestPage:
        token = page_tokens.read(actor, page_token) if page_token else None
        listing = client.list_workflows(list_query(actor), page_size=page_size, next_page_token=token)
        await listing.fetch_next_page()
        summaries = []
        for execution in listing.current_page or []:
            # Every request the search attributes name is listed (the page holds what it says): one started
            # without toolloop's memo is named by its workflow id's readable part.
            request_id = await execution.memo_value("request_id", default=None, type_hint=str)
            summaries.append(
                RequestSummary(
                    id=request_id or request_id_of(actor, execution.id),
                    workflow_id=execution.id,
                    status=_status_name(execution.status),
                    outcome=_listed_outcome(execution),
                    question=await execution.memo_value("question", default=None, type_hint=str),
                    started_at=execution.start_time,
                    closed_at=execution.close_time,
                )
            )
        next_token = page_tokens.make(actor, listing.next_page_token) if listing.next_page_token else None
        return RequestPage(requests=summaries, next_page_token=next_token)

    @app.get(
        "/v1/requests/{request_id}",
        response_model=RequestView,
        responses=problems(*CALLER_CODES, "NOT_FOUND", "REQUEST_UNREADABLE"),
    )
    async def get_request(request_id: RequestId, actor: Caller) -> RequestView:
        request, description = await found(actor, request_id)
        status = _status_name(description.status)
        if description.status != WorkflowExecutionStatus.RUNNING:
            try:
                return _finished_view(request_id, await request.result())
            except WorkflowFailureError:
                pass  # ended without a report (terminated, timed out): what its ledger recorded is below
            except ValueError:  # a result this API cannot read (a pydantic ValidationError among them)
                raise Problem(503, "REQUEST_UNREADABLE", UNREADABLE_REQUEST) from None
        # A closed run answers the query too (its worker replays it), so a terminated request still shows the
        # writes it sent or left unknown. One whose history no longer replays is a 503 REQUEST_UNREADABLE, never a
        # list of no writes passed off as the truth.
        progress = await request.progress()
        running = status == "running"
        return RequestView(
            id=request_id,
            workflow_id=request.workflow_id,
            status=status,
            phase=progress.phase if running else f"finished: {status}",
            rounds=progress.round,
            calls=progress.calls,
            # Ended without a report: each write as it was left (never still "awaiting approval"), and the outcome
            # by the one rule `ask` exits by.
            operations=progress.operations if running else left_mid_way(progress.operations),
            outcome=None if running else outcome_without_report(progress.operations),
            events=progress.events,
            usage=progress.usage,
        )

    @app.get(
        "/v1/requests/{request_id}/events",
        response_class=EventSourceResponse,
        responses={
            200: {
                "description": (
                    "Server-sent events, numbered by `id`: `phase`, `tool_started`, `tool_finished`, "
                    "`approval_needed`, `operation`, `final` (the last), and `error` (a problem's code and detail, "
                    "then the stream ends; reconnect with Last-Event-ID). Each `data` is one JSON event. While the "
                    "request runs, and when the API has a live text store, `model_text` events (no `id`) carry the "
                    "model's text as it is written: `{kind, turn, attempt, text}`, kind `text` (a piece of the "
                    "turn's newest attempt), `restarted` (a retried turn starts again: drop what was shown of it) "
                    "or `complete`; a reconnected stream sends the run's text again from its start."
                ),
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **problems(*CALLER_CODES, "NOT_FOUND", "TOO_MANY_STREAMS", "REQUEST_UNREADABLE"),
        },
    )
    async def request_events(
        request_id: RequestId,
        actor: Caller,
        request: Request,
        last_event_id: Annotated[str | None, Header(max_length=20)] = None,
        after: Annotated[int | None, Query(ge=0)] = None,
    ) -> EventSourceResponse:
        refused = streams.take(actor)
        if refused is not None:
            raise Problem(429, "TOO_MANY_STREAMS", refused)
        try:
            followed, _ = await found(actor, request_id)
            resume = last_event_id or ""
            start = after if after is not None else int(resume) if resume.isascii() and resume.isdigit() else 0
            # Asked once before the response starts, so a request the worker cannot read is a problem+json.
            first = await followed.events(start)
        except BaseException:
            streams.give_back(actor)
            raise
        return SlotHoldingStream(
            _with_live_text(
                followed,
                _event_stream(followed, request, start, first),
                # Merged with the model's text only while there is some to come: a store, a running request.
                live=config.live_text is not None and not first.done,
            ),
            release=lambda: streams.give_back(actor),
            ping=15,
        )

    @app.get(
        "/v1/requests/{request_id}/operations/{operation_id}",
        response_model=ApprovalRequest,
        responses=problems(*CALLER_CODES, "NOT_FOUND", "REQUEST_UNREADABLE"),
    )
    async def get_operation(request_id: RequestId, operation_id: OperationId, actor: Caller) -> ApprovalRequest:
        """The whole payload the operation's digest covers (unredacted: the approver sees what is signed)."""
        request, _ = await found(actor, request_id)
        approval = await request.approval(operation_id)
        if approval is None:
            raise Problem(404, "NOT_FOUND", f"request {request_id} has no operation {operation_id}")
        return approval

    @app.post(
        "/v1/requests/{request_id}/operations/{operation_id}/decision",
        response_model=DecisionReceipt,
        responses=problems(
            *CALLER_CODES,
            "NOT_FOUND",
            "DIGEST_MISMATCH",
            "NOT_PENDING",
            "DECISION_REFUSED",
            "REQUEST_FINISHED",
            "BODY_TOO_LARGE",
            "REQUEST_UNREADABLE",
            "UNCONFIRMED",
            "NO_APPROVAL_KEY",
        ),  # fmt: skip
    )
    async def decide(
        request_id: RequestId,
        operation_id: OperationId,
        body: DecisionBody,
        actor: Caller,
        granted: CallerGrant,
    ) -> DecisionReceipt:
        if toolloop_client.signing_key is None:
            raise Problem(503, "NO_APPROVAL_KEY", "this API holds no approval key; it cannot decide")
        request, description = await found(actor, request_id)
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise _finished(request_id)
        pending = await request.approval(operation_id)
        if pending is None or (
            pending.state == "awaiting_approval" and not pending.may_decide(actor.user_id, granted.roles)
        ):
            # One its policy leaves to others (a manager, a second person) looks like none, to its requester too.
            raise Problem(404, "NOT_FOUND", f"request {request_id} has no operation {operation_id}")
        if pending.state != "awaiting_approval":
            raise Problem(
                409, "NOT_PENDING", f"operation {operation_id} is {pending.state}, not waiting for a decision"
            )
        return await send_decision(request, pending, body, actor, granted, request_id)

    async def send_decision(
        request: ToolloopRequest,
        pending: ApprovalRequest,
        body: DecisionBody,
        actor: Actor,
        granted: Grant,
        named: str,
    ) -> DecisionReceipt:
        """The caller's decision on exactly the payload checked (`pending`), signed for the write's requester as
        decided by the caller with their token's roles: recorded as "<user> via api". The workflow checks the
        signature, the digest and that the caller may decide, again."""
        if body.digest != pending.digest:
            raise Problem(409, "DIGEST_MISMATCH", "the digest is not the pending operation's; fetch it again")
        if config.meter is not None:
            config.meter.create_counter(API_DECISIONS, "decisions sent by the API").add(1, {"decision": body.decision})
        try:
            return await confirmed(
                request.decide(
                    pending,
                    approve=body.decision == "approve",
                    decider=actor,
                    roles=sorted(granted.roles),
                    grant=body.grant,
                )
            )
        except RequestFinished:
            raise _finished(named) from None
        except (ApprovalRefused, WorkflowUpdateFailedError) as exc:
            reason = exc.cause if isinstance(exc, WorkflowUpdateFailedError) else exc
            raise Problem(409, "DECISION_REFUSED", f"the decision was not recorded: {reason}") from None

    # --- Approvals for whoever may decide (docs/API.md, "Approvals"; docs/POLICIES.md) -------------------------

    @app.get("/v1/approvals", response_model=DecidablePage, responses=problems(*CALLER_CODES))
    async def list_approvals(actor: Caller, granted: CallerGrant) -> DecidablePage:
        """Every operation waiting now that the caller may decide, across their tenant's running requests."""
        found = await toolloop_client.to_decide(actor, sorted(granted.roles), limit=config.limits.approvals_scan)
        return DecidablePage(
            approvals=[
                Decidable(workflow_id=request.handle.id, requester=request.actor.user_id, operation=approval)
                for request, approval in found.approvals
            ],
            complete=found.complete,
        )

    async def decidable(
        actor: Actor, roles: frozenset[str], workflow_id: str, operation_id: str
    ) -> tuple[ToolloopRequest, ApprovalRequest]:
        """The operation, if the caller may decide it now; 404 otherwise: the same answer for an operation they
        may not decide, another tenant's request, and none."""
        request = await toolloop_client.request_to_decide(workflow_id, actor)
        if request is None:
            approval = None
        elif request.actor == actor:
            approval = await request.approval(operation_id)
        else:  # someone else's that cannot be asked now looks like a missing one
            approval = await request.approval_if_askable(operation_id)
        if (
            request is None
            or approval is None
            or approval.state != "awaiting_approval"
            or not approval.may_decide(actor.user_id, roles)
        ):
            raise Problem(404, "NOT_FOUND", f"no operation {operation_id} waits for your decision in {workflow_id}")
        return request, approval

    @app.get(
        "/v1/approvals/{workflow_id}/{operation_id}",
        response_model=ApprovalRequest,
        responses=problems(*CALLER_CODES, "NOT_FOUND", "REQUEST_UNREADABLE"),
    )
    async def get_approval(
        workflow_id: WorkflowId, operation_id: OperationId, actor: Caller, granted: CallerGrant
    ) -> ApprovalRequest:
        """The whole payload of an operation the caller may decide (unredacted: the decider sees what is signed)."""
        _, approval = await decidable(actor, granted.roles, workflow_id, operation_id)
        return approval

    @app.post(
        "/v1/approvals/{workflow_id}/{operation_id}/decision",
        response_model=DecisionReceipt,
        responses=problems(
            *CALLER_CODES,
            "NOT_FOUND",
            "DIGEST_MISMATCH",
            "DECISION_REFUSED",
            "REQUEST_FINISHED",
            "BODY_TOO_LARGE",
            "REQUEST_UNREADABLE",
            "UNCONFIRMED",
            "NO_APPROVAL_KEY",
        ),  # fmt: skip
    )
    async def decide_approval(
        workflow_id: WorkflowId, operation_id: OperationId, body: DecisionBody, actor: Caller, granted: CallerGrant
    ) -> DecisionReceipt:
        """Approve or reject an operation the caller may decide: signed for the person the write acts for, as
        decided by the caller with their token's roles; the workflow checks both again."""
        if toolloop_client.signing_key is None:
            raise Problem(503, "NO_APPROVAL_KEY", "this API holds no approval key; it cannot decide")
        request, pending = await decidable(actor, granted.roles, workflow_id, operation_id)
        return await send_decision(request, pending, body, actor, granted, workflow_id)

    # --- Threads (docs/API.md, "Threads") ------------------------------------------------------------------

    async def found_thread(actor: Actor, thread_id: str) -> tuple[ToolloopThread, list[MessageRecord]]:
        """The caller's thread and its messages, if it exists and is theirs; 404 otherwise, the same answer for
        another user's thread (whose id names another workflow) as for none."""
        thread = toolloop_client.thread(thread_id, actor=actor)
        try:
            description = await thread.handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise _no_thread(thread_id) from None
            raise
        attributes = description.typed_search_attributes
        if attributes.get(USER_KEY) != actor.user_id or attributes.get(TENANT_KEY) != actor.tenant_id:
            raise _no_thread(thread_id)
        try:
            return thread, await thread.messages()
        except ThreadNotFound:
            raise _no_thread(thread_id) from None

    async def check_room_for_a_thread(actor: Actor) -> None:
        """429 if the caller has as many open threads as one caller may (a thread's workflow runs until it is
        closed): the message would start another one."""
        open_threads = await client.count_workflows(thread_list_query(actor))
        if open_threads.count >= config.limits.max_open_threads:
            raise Problem(
                429,
                "TOO_MANY_THREADS",
                f"you have {open_threads.count} open threads, the most one caller may; close one "
                "(POST /v1/threads/{thread_id}/close) or send to one of them",
            )

    async def key_used_outside_this_thread(actor: Actor, request_id: str, thread: ToolloopThread) -> bool:
        """Whether the caller has a request under this id that is not a message of `thread`."""
        try:
            _, description = await found(actor, request_id)
        except Problem:
            return False
        return description.parent_id != thread.workflow_id

    @app.post(
        "/v1/threads/{thread_id}/messages",
        response_model=MessageAnswer,
        status_code=201,
        responses=problems(
            "INVALID_IDEMPOTENCY_KEY",
            *CALLER_CODES,
            "BODY_TOO_LARGE",
            "IDEMPOTENCY_KEY_REUSED",
            "UNKNOWN_TOOL",
            "UNKNOWN_MODEL",
            "RATE_LIMITED",
            "TOO_MANY_ACTIVE_REQUESTS",
            "TOO_MANY_THREADS",
            "THREAD_BUSY",
            "THREAD_CLOSED",
            "REQUEST_UNREADABLE",
            "UNCONFIRMED",
        ),  # fmt: skip
    )
    async def send_message(
        thread_id: ThreadId,
        body: RequestBody,
        actor: Caller,
        granted: CallerGrant,
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=64)] = None,
    ) -> MessageAnswer:
        """Add a message to the caller's thread (its first message starts the thread). It runs once every message
        accepted before it has finished: `queued` and `ahead` say whether it waits."""
        request_id, model, limits = checked_submission(body, granted, idempotency_key)
        thread = toolloop_client.thread(thread_id, actor=actor)
        try:
            known = await thread.messages()
        except ThreadNotFound:
            known = []
        if not any(m.request_id == request_id for m in known):
            # The same Idempotency-Key again is not a new message: it answers as it always did (below).
            refusal = await refusal_to_create(actor)
            if refusal is not None:
                raise refusal
            if not known:
                await check_room_for_a_thread(actor)
            # A key the caller used for a request of its own (or another thread's message that started) would
            # leave this message refused when its turn came: refused now, as the request route refuses it. One
            # this thread started is its own message (the same send retried at once): the thread answers it.
            if idempotency_key is not None and await key_used_outside_this_thread(actor, request_id, thread):
                raise _key_reused()
        try:
            accepted = await confirmed(
                thread.send(
                    body.question,
                    request_id=request_id,
                    model=model,
                    limits=limits,
                    instructions=body.instructions,
                    tools=body.tools,
                )
            )
        except RequestIdReused:
            raise _key_reused() from None
        except ThreadBusy as exc:
            raise Problem(429, "THREAD_BUSY", str(exc)) from None
        except ThreadClosed as exc:
            raise Problem(409, "THREAD_CLOSED", str(exc)) from None
        url = f"/v1/threads/{thread_id}/messages/{accepted.request_id}"
        if accepted.attached:
            response.status_code = 200
        else:
            response.headers["Location"] = url
        return MessageAnswer(
            thread_id=thread_id,
            number=accepted.number,
            request_id=accepted.request_id,
            workflow_id=accepted.workflow_id,
            ahead=accepted.ahead,
            queued=accepted.ahead > 0,
            url=url,
            request_url=f"/v1/requests/{accepted.request_id}",
        )

    @app.get("/v1/threads", response_model=ThreadPage, responses=problems(*CALLER_CODES))
    async def list_threads(
        actor: Caller,
        page_size: Annotated[int, Query(ge=1, le=100)] = 20,
        page_token: Annotated[str | None, Query(max_length=2000)] = None,
    ) -> ThreadPage:
        """The caller's threads, newest first."""
        token = page_tokens.read(actor, page_token) if page_token else None
        listing = client.list_workflows(thread_list_query(actor), page_size=page_size, next_page_token=token)
        await listing.fetch_next_page()
        threads = [
            ThreadSummary(
                id=execution.typed_search_attributes.get(THREAD_KEY) or execution.id,
                workflow_id=execution.id,
                started_at=execution.start_time,
            )
            for execution in listing.current_page or []
        ]
        next_token = page_tokens.make(actor, listing.next_page_token) if listing.next_page_token else None
        return ThreadPage(threads=threads, next_page_token=next_token)

    @app.get(
        "/v1/threads/{thread_id}",
        response_model=ThreadView,
        responses=problems(*CALLER_CODES, "NOT_FOUND", "REQUEST_UNREADABLE"),
    )
    async def get_thread(thread_id: ThreadId, actor: Caller) -> ThreadView:
        thread, records = await found_thread(actor, thread_id)
        return thread_view(thread, records)

    @app.post(
        "/v1/threads/{thread_id}/close",
        response_model=ThreadView,
        responses=problems(*CALLER_CODES, "NOT_FOUND", "REQUEST_UNREADABLE", "UNCONFIRMED"),
    )
    async def close_thread(thread_id: ThreadId, actor: Caller) -> ThreadView:
        """Close the caller's thread: it takes no new message (409 THREAD_CLOSED); the messages it accepted still
        run, one after another, and then its workflow ends (it leaves `GET /v1/threads`). Closing again is the same
        close. Its messages as they are now."""
        thread, _ = await found_thread(actor, thread_id)
        try:
            records = await confirmed(thread.close())
        except ThreadNotFound:
            raise _no_thread(thread_id) from None
        return thread_view(thread, records)

    @app.get(
        "/v1/threads/{thread_id}/messages/{request_id}",
        response_model=MessageView,
        responses=problems(*CALLER_CODES, "NOT_FOUND", "REQUEST_UNREADABLE"),
    )
    async def get_message(thread_id: ThreadId, request_id: RequestId, actor: Caller) -> MessageView:
        """One message: `queued` (its request does not exist yet), `running`, `finished` or `refused`."""
        thread, records = await found_thread(actor, thread_id)
        record = next((r for r in records if r.request_id == request_id), None)
        if record is None:
            raise Problem(404, "NOT_FOUND", f"thread {thread_id} has no message {request_id}")
        return message_view(thread_id, records, record)

    @app.get(
        "/v1/threads/{thread_id}/events",
        response_class=EventSourceResponse,
        responses={
            200: {
                "description": (
                    "Server-sent events of the whole conversation, with `id` A.N.S (resume with Last-Event-ID): "
                    "`message_accepted` (a message's number, request_id, state, ahead: queued when ahead > 0), "
                    "`message_started`, then the message's own request events (as `/v1/requests/{id}/events` "
                    "gives them, with `number` and `request_id` added; `model_text` without an id), "
                    "`message_finished` (its outcome) or `message_refused`. Open until the client leaves "
                    "(comments every 15 s) or the API's one-hour bound; with `until=idle` it ends once no "
                    "message is queued or running. `error` (a problem's code and detail) ends it."
                ),
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **problems(*CALLER_CODES, "NOT_FOUND", "TOO_MANY_STREAMS", "REQUEST_UNREADABLE"),
        },
    )
    async def thread_events(
        thread_id: ThreadId,
        actor: Caller,
        request: Request,
        last_event_id: Annotated[str | None, Header(max_length=40)] = None,
        until: Annotated[Literal["idle"] | None, Query()] = None,
    ) -> EventSourceResponse:
        cursor = Cursor.read(last_event_id)
        if cursor is None:
            raise Problem(422, "INVALID_REQUEST", "Last-Event-ID: not an id of this thread's event stream")
        refused = streams.take(actor)
        if refused is not None:
            raise Problem(429, "TOO_MANY_STREAMS", refused)
        try:
            thread, records = await found_thread(actor, thread_id)
        except BaseException:
            streams.give_back(actor)
            raise

        async def message_events(followed: ToolloopRequest, after: int) -> AsyncGenerator[dict[str, str], None]:
            # The request stream's own machinery: its numbered events, and the model's text while it runs.
            first = await followed.events(after)
            live = config.live_text is not None and not first.done
            async for event in _with_live_text(followed, _event_stream(followed, request, after, first), live):
                yield event

        return SlotHoldingStream(
            thread_stream(
                thread,
                records,
                cursor,
                lambda request_id: toolloop_client.request(request_id, actor=actor),
                message_events,
                request.is_disconnected,
                until_idle=until == "idle",
                stream_seconds=_STREAM_SECONDS,
                check_seconds=_DISCONNECT_CHECK_SECONDS,
            ),
            release=lambda: streams.give_back(actor),
            ping=15,
        )

    if _STATIC.is_dir():
        _add_page(app)
    use_problem_schema(app)

    return BodyLimit(app, config.max_body_bytes)


class SlotHoldingStream(EventSourceResponse):
    """An event stream that gives its slot back once the response is over, however it ends: the last event
    sent, the client gone, an error, or a HEAD request that never reads the events."""

    def __init__(self, content: AsyncIterator[dict[str, str]], release: Callable[[], None], ping: int) -> None:
        super().__init__(content, ping=ping)
        self._release: Callable[[], None] | None = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


def _finished_view(request_id: str, result: AgentResult) -> RequestView:
    return RequestView(
        id=request_id,
        workflow_id=result.workflow_id,
        status=result.status,
        phase=f"finished: {result.stop_reason}",
        rounds=result.rounds,
        calls=result.calls,
        operations=result.operations,
        final_text=result.final_text,
        stop_reason=result.stop_reason,
        error=result.error,
        outcome=result.outcome,
        usage=result.usage,
    )


async def _event_stream(
    followed: ToolloopRequest, request: Request, after: int, first: EventsPage
) -> AsyncGenerator[dict[str, str], None]:
    """The request's events after number `after`, as they happen, ending with the final one; `first` is the
    first page, already read. Not the client's `follow()`: that yields the progress as it is each time, and
    a stream gives every event once, numbered, so a client that reconnects misses none."""
    ends = time.monotonic() + _STREAM_SECONDS
    # Read the events each time the run's history says it may have changed (a long poll, no polling
    # interval); the bounded wait lets the stream notice a client that went away.
    async with RunFollower(followed.handle) as follower:
        page: EventsPage | None = first
        while time.monotonic() < ends and not await request.is_disconnected():
            # Taken before reading: a page read after the run's close holds every event it will ever have.
            closed = follower.closed
            try:
                if page is None:
                    page = await followed.events(after)
            except RPCError:
                # The response has started: the failure is said in the stream itself, and the stream ends
                # (the client may reconnect with Last-Event-ID once the workflow answers again).
                problem = {"code": "TEMPORAL_UNAVAILABLE", "detail": "the request's events could not be read; retry"}
                yield {"event": "error", "data": json.dumps(problem)}
                return
            except WorkflowQueryFailedError:
                problem = {"code": "REQUEST_UNREADABLE", "detail": UNREADABLE_REQUEST}
                yield {"event": "error", "data": json.dumps(problem)}
                return
            for event in page.events:
                after = event.seq
                yield {"id": str(event.seq), "event": event.kind, "data": event.model_dump_json()}
            if page.done and not page.events:
                return
            if closed and not page.events:
                # Terminated or timed out: its final event will never come. Said, so no client waits for it.
                yield {"event": "error", "data": json.dumps(_ended_without_report(followed))}
                return
            if not page.events:
                await follower.wait(at_most=min(_DISCONNECT_CHECK_SECONDS, max(0.0, ends - time.monotonic())))
            page = None


UNCONFIRMED_CHANGE = (
    "no worker confirmed it in time (Temporal or every worker may be away): it may have been taken and may still be "
    "applied. Read the request or thread again before anything else; a decision or a close sent again is the same "
    "one, a message only with the same Idempotency-Key"
)


def _ended_without_report(followed: ToolloopRequest) -> dict[str, str]:
    detail = (
        f"request {followed.request_id}'s run ended without its report (terminated or timed out); "
        "GET the request for what it recorded"
    )
    return {"code": ENDED_WITHOUT_REPORT, "detail": detail}


async def _with_live_text(
    followed: ToolloopRequest, events: AsyncGenerator[dict[str, str], None], live: bool
) -> AsyncIterator[dict[str, str]]:
    """The request's `events`, and while they last the model's text as it is written (`model_text`), in the order
    each arrives. A request already done, or a client without a live text store, gets the events alone."""
    if not live:
        async for event in events:
            yield event
        return
    merged: asyncio.Queue[dict[str, str]] = asyncio.Queue(maxsize=1000)
    over = asyncio.Event()

    async def pass_events() -> None:
        try:
            async for event in events:
                await merged.put(event)
        finally:
            over.set()

    async def pass_text() -> None:
        async for shown in followed.live_text(until=over.is_set):
            data = {"kind": shown.kind, "turn": shown.turn, "attempt": shown.attempt, "text": shown.text}
            await merged.put({"event": "model_text", "data": json.dumps(data)})

    request_events = asyncio.create_task(pass_events())
    text = asyncio.create_task(pass_text())
    ended = asyncio.create_task(over.wait())
    last_given = False
    item: asyncio.Task[dict[str, str]] | None = None
    try:
        while True:
            item = asyncio.create_task(merged.get())
            await asyncio.wait({item, ended}, return_when=asyncio.FIRST_COMPLETED)
            if item.done():
                given = item.result()
                if given["event"] == "model_text" and last_given:
                    continue  # text read after the request's last event: the answer is in that event
                last_given = last_given or given["event"] in ("final", "error")
                yield given
                continue
            item.cancel()
            # The request's events are over: what they put in before is still given, text after them is not.
            while not merged.empty():
                queued = merged.get_nowait()
                if queued.get("event") != "model_text":
                    yield queued
            request_events.result()  # a failure of the events' own reader is raised, not swallowed
            return
    finally:
        # However the stream ends (the last event, the client gone): both readers stop, and the events'
        # generator is closed, which ends its long poll on the run's history. Shielded: the server cancels a
        # stream whose client left through a scope that would cut this cleanup short.
        tasks = [t for t in (request_events, text, ended, item) if t is not None]
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
            await events.aclose()


def _add_page(app: FastAPI) -> None:
    """The web page for approvals and live requests (plain HTML and a little JS, no build step)."""
    from fastapi.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=_STATIC), name="static")

    # Only this origin's own script, style and API; no framing (an approval button must not be clickjacked).
    headers = {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        body = (_STATIC / "index.html").read_bytes()
        return Response(body, media_type="text/html; charset=utf-8", headers=headers)
