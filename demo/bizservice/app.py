"""I/O: the business service's HTTP app - owner-scoped reads and read-backs, request log, before-handler
fault injection and the admin API; the writes live in demo.bizservice.writes."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from demo.bizservice import faults
from demo.bizservice.boundary import FaultBoundary
from demo.bizservice.seed import seed
from demo.bizservice.store import Owner, Store, iso_utc
from demo.bizservice.web import (
    CALENDAR_ID,
    ORDER_ID,
    TICKET_ID,
    Actor,
    Problem,
    ServiceCode,
    not_available,
    problem_response,
    request_errors,
    status_code_for,
)
from demo.bizservice.writes import CLAIM_LEASE_SECONDS, add_write_routes, write_kit
from toolloop.servicekit import COMMITTED_FLAG, Hold, no_hold

OPERATION_ID = r"^[A-Za-z0-9_-]{1,100}$"

logger = logging.getLogger("bizservice")

EVENT_ID = r"^E[A-Za-z0-9-]{0,40}$"
MAX_SLOT_RANGE = timedelta(days=14)
MAX_SLOTS = 50
WORK_START, WORK_END = clock(9, 0), clock(17, 0)


# --- Response models (the service's contract) ------------------------------------------------------


class User(BaseModel):
    user_id: str
    tenant_id: str
    name: str


class OrderItem(BaseModel):
    sku: str
    name: str
    quantity: int


class Order(BaseModel):
    order_id: str
    status: Literal["placed", "shipped", "delivered", "cancelled"]
    carrier: str | None
    tracking_number: str | None
    placed_at: str
    shipped_at: str | None
    delivered_at: str | None
    items: list[OrderItem]
    total_cents: int
    refunded_cents: int
    refundable_cents: int
    currency: str
    version: int
    paid_from: str
    promised_by: str
    late: bool


class OrderSummary(BaseModel):
    order_id: str
    status: str
    placed_at: str
    total_cents: int
    currency: str


class OrderPage(BaseModel):
    orders: list[OrderSummary]
    page: int
    page_size: int
    total: int
    has_more: bool


class TicketNote(BaseModel):
    note_id: str
    text: str
    author: str
    created_at: str


class Ticket(BaseModel):
    ticket_id: str
    owner: str  # the owner's user id (only the owner can read it)
    subject: str
    status: str
    priority: str
    created_at: str
    updated_at: str
    version: int
    notes: list[TicketNote]


class CalendarEvent(BaseModel):
    event_id: str
    calendar_id: str
    title: str
    start: str
    end: str
    attendees: list[str]


class Refund(BaseModel):
    refund_id: str
    amount_cents: int
    reason: str
    to_account: str
    created_at: str


class OrderRefunds(BaseModel):
    order_id: str
    refunds: list[Refund]
    refunded_cents: int
    total_cents: int
    paid_from: str


class Slot(BaseModel):
    start: str
    end: str


class FreeSlots(BaseModel):
    calendar_id: str
    from_: str = Field(serialization_alias="from")  # "from" is a Python keyword
    to: str
    slots: list[Slot]
    truncated: bool


# --- Free-slot arithmetic (pure) -------------------------------------------------------------------


def free_slots(
    busy: list[tuple[datetime, datetime]], start: datetime, end: datetime, limit: int = MAX_SLOTS
) -> tuple[list[tuple[datetime, datetime]], bool]:
    """Maximal free intervals inside working hours (Mon-Fri 09:00-17:00 UTC), clipped to [start, end);
    at most `limit`, and whether more were cut off."""
    busy = sorted(busy)
    slots: list[tuple[datetime, datetime]] = []
    day: date = start.astimezone(UTC).date()
    while datetime.combine(day, WORK_START, UTC) < end:
        lo = max(start, datetime.combine(day, WORK_START, UTC))
        hi = min(end, datetime.combine(day, WORK_END, UTC))
        if day.weekday() < 5 and lo < hi:
            cursor = lo
            for b_start, b_end in busy:
                if b_end <= cursor:
                    continue
                if b_start >= hi:
                    break
                if b_start > cursor:
                    slots.append((cursor, b_start))
                cursor = max(cursor, b_end)
            if cursor < hi:
                slots.append((cursor, hi))
        day += timedelta(days=1)
    return slots[:limit], len(slots) > limit


def _require_offset(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise PydanticCustomError("utc_offset", "needs an explicit UTC offset")
    return value.astimezone(UTC)


AwareQueryTime = Annotated[datetime, AfterValidator(_require_offset)]


# --- The app ----------------------------------------------------------------------------------------


class RevokedUser(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=64)
    tenant_id: str = Field(min_length=1, max_length=64)


def body_digest(body: bytes) -> str:
    """SHA-256 of a request body, of its canonical JSON when it is JSON: the same payload sent twice (however
    its keys were ordered) has one digest. A body too large or too deep to parse is digested as it is."""
    canonical = body
    if len(body) <= _PARSED_BODY_BYTES:
        try:
            canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
        except (ValueError, RecursionError):
            pass
    return hashlib.sha256(canonical).hexdigest()


# Bodies up to this size are parsed for their digest (a write's is far smaller; the kit refuses larger ones).
_PARSED_BODY_BYTES = 256 * 1024


def create_app(
    db_path: str | Path,
    admin_token: str | None = None,
    approval_verify_key: str | None = None,
    idempotency_retention_seconds: float = 86400.0,
    claim_lease_seconds: float = CLAIM_LEASE_SECONDS,
    hold: Hold = no_hold,
    policy_verify_key: str | None = None,
    policy_rules: Iterable[str] | Callable[[], Iterable[str]] | None = None,
) -> FaultBoundary:
    """The service on `db_path` (schema created and demo data seeded if missing), as an ASGI app. With no
    `admin_token` the /admin API does not exist; with no `approval_verify_key` (the approval channel's public
    key) every write is refused (403).
    Completed idempotency records are kept `idempotency_retention_seconds`. With `policy_verify_key` (the
    policy evaluator's public key) writes are decided by policy, and a decision naming a rule outside
    `policy_rules` is refused."""
    store = Store(db_path)
    store.init()
    seed(store)

    # No interactive docs: every path outside /healthz and /admin is a business endpoint.
    app = FastAPI(title="bizservice", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(Problem)
    async def on_problem(_: Request, exc: Problem) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> Response:
        return problem_response(422, ServiceCode.INVALID_REQUEST, request_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> Response:
        # Framework errors (unknown route, wrong method): the status decides; the framework's text is not sent.
        status = exc.status_code
        detail = "no such resource" if status == 404 else HTTPStatus(status).phrase.lower()
        return problem_response(status, status_code_for(status), detail)

    @app.middleware("http")
    async def around_request(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        is_admin = path == "/admin" or path.startswith("/admin/")
        if is_admin and admin_token is None:
            return problem_response(404, ServiceCode.NOT_FOUND, "no such resource")
        logged = not is_admin and path != "/healthz"
        started_at = time.time()  # before any injected latency: the log shows when the request arrived
        log_id: int | None = None
        response: Response | None = None
        try:
            if logged:
                key = request.headers.get("idempotency-key")
                # Every write's payload, with or without a key: a resend without one is a finding too.
                writes = request.method not in ("GET", "HEAD", "OPTIONS")
                log_id = await run_in_threadpool(
                    store.log_request_start,
                    request.method,
                    path,
                    request.url.query,
                    request.headers.get("x-actor-user"),
                    started_at,
                    key,
                    body_digest(await request.body()) if writes else None,
                )
                user, tenant = request.headers.get("x-actor-user"), request.headers.get("x-actor-tenant")
                if user and tenant and not await run_in_threadpool(store.user_exists, Owner(user, tenant)):
                    # Not "empty results": a caller the service does not know is told so.
                    response = problem_response(401, ServiceCode.UNKNOWN_USER, "unknown user or tenant")
            if logged and response is None:
                rule = await run_in_threadpool(faults.claim, store, request.method, path)
                if rule is not None:
                    if rule.latency_ms:
                        await asyncio.sleep(rule.latency_ms / 1000)
                    if rule.status is not None:
                        response = faults.fault_problem(rule.status).response()
            if response is None:
                response = await call_next(request)
        except Exception:
            # Logged here with its traceback; the client only learns that something broke.
            logger.exception("unhandled error on %s %s", request.method, path)
            response = problem_response(500, ServiceCode.SERVER_ERROR, "the service failed to answer this request")
        if log_id is not None:
            await run_in_threadpool(store.log_request_end, log_id, time.time(), response.status_code)
            logger.info(
                "request",
                extra={
                    "method": request.method,
                    "path": path,
                    "status": response.status_code,
                    "duration_ms": int((time.time() - started_at) * 1000),
                    "user_id": request.headers.get("x-actor-user"),
                    "tenant_id": request.headers.get("x-actor-tenant"),
                    "operation_id": request.headers.get("idempotency-key"),
                    # Whether this request committed a write's effect (the kit's flag).
                    "side_effect": bool(getattr(request.state, COMMITTED_FLAG, False)),
                },
            )
        return response

    async def require_admin(x_admin_token: Annotated[str | None, Header()] = None) -> None:
        assert admin_token is not None  # the middleware answers 404 for /admin when no token is configured
        if x_admin_token is None or not hmac.compare_digest(x_admin_token.encode(), admin_token.encode()):
            raise Problem(401, ServiceCode.ADMIN_ONLY, "a valid X-Admin-Token header is required")

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/me", response_model=User)
    def me(owner: Actor) -> dict[str, Any]:
        """Who the caller is (the middleware has already refused an unknown one)."""
        user = store.get_user(owner)
        if user is None:  # removed since the middleware looked
            raise Problem(401, ServiceCode.UNKNOWN_USER, "unknown user or tenant")
        return user

    # Business endpoints are plain `def`: FastAPI runs them in a thread, so blocking SQLite calls never
    # hold up other requests (or their injected latency).

    @app.get("/orders/{order_id}", response_model=Order)
    def get_order(owner: Actor, order_id: Annotated[str, PathParam(pattern=ORDER_ID)]) -> dict[str, Any]:
        order = store.get_order(owner, order_id)
        if order is None:
            raise not_available("order", order_id)
        return order

    @app.get("/orders", response_model=OrderPage)
    def list_orders(
        owner: Actor,
        page: Annotated[int, Query(ge=1, le=1000)] = 1,
        page_size: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        orders, total = store.list_orders(owner, page, page_size)
        return {
            "orders": orders,
            "page": page,
            "page_size": page_size,
            "total": total,
            "has_more": page * page_size < total,
        }

    @app.get("/tickets/{ticket_id}", response_model=Ticket)
    def get_ticket(owner: Actor, ticket_id: Annotated[str, PathParam(pattern=TICKET_ID)]) -> dict[str, Any]:
        ticket = store.get_ticket(owner, ticket_id)
        if ticket is None:
            raise not_available("ticket", ticket_id)
        return ticket

    @app.get("/calendars/{calendar_id}/free-slots", response_model=FreeSlots)
    def get_free_slots(
        owner: Actor,
        calendar_id: Annotated[str, PathParam(pattern=CALENDAR_ID)],
        from_: Annotated[AwareQueryTime, Query(alias="from")],
        to: Annotated[AwareQueryTime, Query()],
    ) -> FreeSlots:
        if to <= from_:
            raise Problem(422, ServiceCode.INVALID_REQUEST, "to: must be later than from")
        if to - from_ > MAX_SLOT_RANGE:
            raise Problem(422, ServiceCode.INVALID_REQUEST, "to: the range may span at most 14 days")
        busy = store.calendar_events(owner, calendar_id, from_, to)
        if busy is None:
            raise not_available("calendar", calendar_id)
        slots, truncated = free_slots(busy, from_, to)
        return FreeSlots(
            calendar_id=calendar_id,
            from_=iso_utc(from_),
            to=iso_utc(to),
            slots=[Slot(start=iso_utc(s), end=iso_utc(e)) for s, e in slots],
            truncated=truncated,
        )

    @app.get("/calendars/{calendar_id}/events/{event_id}", response_model=CalendarEvent)
    def get_calendar_event(
        owner: Actor,
        calendar_id: Annotated[str, PathParam(pattern=CALENDAR_ID)],
        event_id: Annotated[str, PathParam(pattern=EVENT_ID)],
    ) -> dict[str, Any]:
        event = store.get_event(owner, calendar_id, event_id)
        if event is None:
            raise not_available("event", event_id)
        return event

    @app.get("/orders/{order_id}/refunds", response_model=OrderRefunds)
    def list_refunds(owner: Actor, order_id: Annotated[str, PathParam(pattern=ORDER_ID)]) -> dict[str, Any]:
        refunds = store.list_refunds(owner, order_id)
        if refunds is None:
            raise not_available("order", order_id)
        return refunds

    kit = write_kit(
        store,
        approval_verify_key,
        idempotency_retention_seconds,
        claim_lease_seconds,
        hold,
        policy_verify_key=policy_verify_key,
        policy_rules=policy_rules,
    )
    add_write_routes(app, kit)

    # --- Admin (test bed controls) ---

    admin = [Depends(require_admin)]

    @app.get("/admin/requests", dependencies=admin)
    def admin_requests(path_prefix: Annotated[str, Query(max_length=200)] = "") -> dict[str, Any]:
        return {"requests": store.list_requests(path_prefix)}

    @app.get("/admin/effects", dependencies=admin)
    def admin_effects(
        operation_id: Annotated[str | None, Query(pattern=OPERATION_ID)] = None,
    ) -> dict[str, Any]:
        # The oracle for "at most one effect per operation id", read from the effect tables themselves.
        return {"effects": store.list_effects(operation_id)}

    @app.get("/admin/faults", dependencies=admin)
    def admin_list_faults() -> dict[str, Any]:
        return {"rules": [r.model_dump() for r in faults.list_rules(store)]}

    @app.put("/admin/faults", dependencies=admin)
    def admin_put_faults(rule_set: faults.FaultRuleSet) -> dict[str, Any]:
        faults.replace_rules(store, rule_set.rules)
        return {"rules": [r.model_dump() for r in faults.list_rules(store)]}

    @app.delete("/admin/faults", dependencies=admin)
    def admin_clear_faults() -> dict[str, bool]:
        faults.clear_rules(store)
        return {"ok": True}

    @app.post("/admin/revoke", dependencies=admin)
    def admin_revoke(owner: RevokedUser) -> dict[str, bool]:
        """Take away a user's access (the user is removed): from now on the service refuses their calls."""
        return {"revoked": store.remove_user(Owner(owner.user_id, owner.tenant_id))}

    @app.post("/admin/reset", dependencies=admin)
    def admin_reset() -> dict[str, bool]:
        faults.clear_rules(store)
        store.clear_request_log()
        return {"ok": True}

    # Outermost: only the callable the server calls can hang up without a reply (after_commit faults).
    return FaultBoundary(app, store)
