"""I/O: the write endpoints (ticket notes, calendar events, refunds) and the operation status endpoint,
behind the idempotency ledger and the approval check (DESIGN.md, "the write protocol").

Order of checks for a write: identity -> Idempotency-Key -> body -> (purge expired records) -> a
completed record (other payload: 422; same payload: replay) -> an attempt in flight (409) -> approval
(403) -> claim -> effect and record in one transaction -> release the claim.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Header, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool

from demo.bizservice import faults, ledger, store
from demo.bizservice.boundary import mark_committed
from demo.bizservice.holds import Hold, no_hold
from demo.bizservice.ledger import OperationKey, Record
from demo.bizservice.store import Owner, Provenance, Refusal, Store
from demo.bizservice.web import (
    CALENDAR_ID,
    ORDER_ID,
    PROBLEM_MEDIA_TYPE,
    TICKET_ID,
    Actor,
    Problem,
    ServiceCode,
    describe_errors,
    not_available,
)
from toolloop._core.approvals import ApprovalClaims, ApprovalInvalid, verify_approval_token
from toolloop._core.codes import ResultCode
from toolloop._core.digests import payload_digest
from toolloop._core.registry import PlainText, sorted_unique

MAX_SAFE_INTEGER = 2**53 - 1
MAX_EVENT_DURATION = timedelta(hours=8)
MAX_BODY_BYTES = 16_384
OPERATION_ID = r"^[A-Za-z0-9_-]{1,100}$"
CLAIM_LEASE_SECONDS = 30.0
# A deliberately plain shape: local@domain.tld, ASCII only (no look-alike or invisible characters).
EMAIL = r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$"


@dataclass(frozen=True)
class WriteSettings:
    # The approval channel's public key: the service verifies approvals, it cannot sign them.
    approval_verify_key: str | None
    retention_seconds: float
    claim_lease_seconds: float = CLAIM_LEASE_SECONDS
    # Test-bed hold points in the ledger (demo.bizservice.holds); the default passes at once.
    hold: Hold = no_hold


# --- Request bodies (camelCase, exactly the tools' arguments) ---------------------------------------


class _Body(BaseModel):
    # Text is trimmed before its length is checked; the digest is still taken over the body as received.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class NoteBody(_Body):
    ticket_id: str = Field(alias="ticketId", pattern=TICKET_ID)
    text: PlainText = Field(min_length=1, max_length=500)
    expected_version: int = Field(alias="expectedVersion", ge=1, le=MAX_SAFE_INTEGER)


Email = Annotated[str, StringConstraints(max_length=254, pattern=EMAIL)]


class EventBody(_Body):
    calendar_id: str = Field(alias="calendarId", pattern=CALENDAR_ID)
    title: PlainText = Field(min_length=1, max_length=200)
    start: AwareDatetime
    end: AwareDatetime
    # A set: stored sorted, as the orchestrator sends it.
    attendees: Annotated[list[Email], AfterValidator(sorted_unique)] = Field(default_factory=list, max_length=20)

    @field_validator("start", "end")
    @classmethod
    def _whole_seconds(cls, value: datetime) -> datetime:
        # Times are stored at second precision; a fraction would make the read-back differ.
        if value.microsecond:
            raise PydanticCustomError("whole_seconds", "must be a whole second")
        return value

    @field_validator("end")
    @classmethod
    def _after_start(cls, end: datetime, info: ValidationInfo) -> datetime:
        start = info.data.get("start")
        if start is not None and end <= start:
            raise PydanticCustomError("time_range", "must be later than start")
        if start is not None and end - start > MAX_EVENT_DURATION:
            raise PydanticCustomError("time_range", "an event may last at most 8 hours")
        return end


class RefundBody(_Body):
    order_id: str = Field(alias="orderId", pattern=ORDER_ID)
    amount_cents: int = Field(alias="amountCents", ge=1, le=MAX_SAFE_INTEGER)
    reason: PlainText = Field(min_length=1, max_length=200)


class OperationState(BaseModel):
    operation_id: str
    state: Literal["completed", "in_progress", "not_found"]
    status_code: int | None
    body: dict[str, Any] | None
    # Declared on every answer: after this long a "not_found" no longer proves the key was never used.
    retention_seconds: float


B = TypeVar("B", bound=_Body)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def _parse_body(request: Request, model: type[B]) -> tuple[dict[str, Any], B]:
    """The body as received (what the digest is taken over) and its validated form."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise Problem(413, ResultCode.BAD_ARGUMENTS, f"the body may be at most {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise Problem(422, ResultCode.BAD_ARGUMENTS, "the body must be a JSON object")
    try:
        return data, model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise Problem(422, ResultCode.BAD_ARGUMENTS, describe_errors(exc.errors(include_input=False))) from None


def _same_id(field: str, in_body: str, in_path: str) -> None:
    if in_body != in_path:
        raise Problem(422, ResultCode.BAD_ARGUMENTS, f"{field}: must equal the id in the path")


# --- Headers ----------------------------------------------------------------------------------------


async def idempotency_key(idempotency_key: Annotated[str | None, Header()] = None) -> str:
    if not idempotency_key:
        raise Problem(400, ServiceCode.IDEMPOTENCY_KEY_REQUIRED, "an Idempotency-Key header is required")
    if not re.fullmatch(OPERATION_ID, idempotency_key):
        raise Problem(
            400, ServiceCode.IDEMPOTENCY_KEY_REQUIRED, "Idempotency-Key must be 1-100 characters of A-Z a-z 0-9 _ -"
        )
    return idempotency_key


IdempotencyKey = Annotated[str, Depends(idempotency_key)]
# The parameter is named x_approval_token, so FastAPI reads the X-Approval-Token header.
ApprovalToken = Annotated[str | None, Header(max_length=4096)]


# --- The protocol -----------------------------------------------------------------------------------

Effect = Callable[[sqlite3.Connection, Provenance], dict[str, Any]]


@dataclass(frozen=True)
class Write:
    """One write attempt as the protocol sees it."""

    owner: Owner
    key: OperationKey
    digest: str
    approval_token: str | None
    method: str
    path: str


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    replayed: bool = False
    # True when this attempt committed the record (after_commit faults apply only then).
    committed: bool = False

    def response(self) -> JSONResponse:
        headers = {"Idempotent-Replayed": "true"} if self.replayed else None
        media_type = PROBLEM_MEDIA_TYPE if self.status >= 400 else "application/json"
        return JSONResponse(self.body, status_code=self.status, headers=headers, media_type=media_type)


def _refusal_problem(refusal: Refusal) -> Problem:
    if isinstance(refusal, store.NotOwned):
        return not_available(refusal.kind, refusal.object_id)
    if isinstance(refusal, store.StaleVersion):
        return Problem(
            409,
            ResultCode.VERSION_CONFLICT,
            f"expectedVersion: the object is at version {refusal.current_version}; read it again",
            extra={"current_version": refusal.current_version},
        )
    if isinstance(refusal, store.NotRefundable):
        return Problem(
            422, ResultCode.BAD_ARGUMENTS, f"amountCents: at most {refusal.refundable_cents} cents are refundable"
        )
    raise TypeError(f"unhandled refusal {type(refusal).__name__}")


def _in_progress() -> Problem:
    return Problem(409, ServiceCode.IN_PROGRESS, "an attempt with this Idempotency-Key is still in progress")


def _replay(record: Record, digest: str) -> Reply:
    if record.digest != digest:
        raise Problem(
            422, ResultCode.IDEMPOTENCY_CONFLICT, "this Idempotency-Key was already used with a different payload"
        )
    return Reply(record.status, record.body, replayed=True)


class WriteProtocol:
    """The write protocol over one database; every method blocks (run it in a worker thread)."""

    def __init__(self, store: Store, settings: WriteSettings) -> None:
        self.store = store
        self.settings = settings

    def _not_before(self, now: float) -> float:
        return now - self.settings.retention_seconds

    def run(self, write: Write, effect: Effect) -> Reply:
        now = time.time()
        not_before = self._not_before(now)
        ledger.purge(self.store, not_before)
        found = ledger.lookup(self.store, write.key, now, not_before)
        if isinstance(found, Record):
            return _replay(found, write.digest)
        if found == "in_progress":
            raise _in_progress()
        approval = self._check_approval(write, now)
        try:
            claimed = ledger.claim(
                self.store, write.key, now, not_before, self.settings.claim_lease_seconds, self.settings.hold
            )
        except ledger.ClaimTaken:
            raise _in_progress() from None
        if isinstance(claimed, Record):  # another attempt finished between the lookup and the claim
            return _replay(claimed, write.digest)
        try:
            self._after_claim_fault(write)
            outcome = self._outcome(write, effect, approval.expires_at)
            record, made = ledger.complete(
                self.store, write.key, write.digest, outcome, time.time(), not_before, self.settings.hold
            )
        finally:
            ledger.release(self.store, write.key, claimed)
        return Reply(record.status, record.body, committed=True) if made else _replay(record, write.digest)

    def status(self, key: OperationKey) -> OperationState:
        now = time.time()
        found = ledger.lookup(self.store, key, now, self._not_before(now))
        if isinstance(found, Record):
            return OperationState(
                operation_id=key.operation_id,
                state="completed",
                status_code=found.status,
                body=found.body,
                retention_seconds=self.settings.retention_seconds,
            )
        return OperationState(
            operation_id=key.operation_id,
            state=found,
            status_code=None,
            body=None,
            retention_seconds=self.settings.retention_seconds,
        )

    def _check_approval(self, write: Write, now: float) -> ApprovalClaims:
        if self.settings.approval_verify_key is None:
            raise Problem(403, ResultCode.CONFIRMATION_REQUIRED, "this service has no approval key configured")
        expected = {
            "user_id": write.owner.user_id,
            "tenant_id": write.owner.tenant_id,
            "operation_id": write.key.operation_id,
            "digest": write.digest,
            "decision": "approve",
        }
        try:
            return verify_approval_token(
                self.settings.approval_verify_key, write.approval_token, now=now, expected=expected
            )
        except ApprovalInvalid as exc:
            # The reasons are our own short sentences ("the approval has expired", ...).
            raise Problem(403, ResultCode.CONFIRMATION_REQUIRED, str(exc)) from None

    def _after_claim_fault(self, write: Write) -> None:
        rule = faults.claim(self.store, write.method, write.path, "after_claim")
        if rule is None:
            return
        time.sleep(rule.latency_ms / 1000)  # a worker thread: the event loop keeps serving meanwhile
        if rule.status is not None:
            raise faults.fault_problem(rule.status)

    @staticmethod
    def _outcome(
        write: Write, effect: Effect, approval_expires_at: float
    ) -> Callable[[sqlite3.Connection], tuple[int, dict[str, Any]]]:
        """The effect as the ledger stores it: 201 and the created object, or a definite refusal."""

        def run(conn: sqlite3.Connection) -> tuple[int, dict[str, Any]]:
            # Checked again here, inside the commit's transaction: an attempt that stalled with the request
            # in hand (after the claim, say) must not commit once its approval, and so the request's
            # deadline, has passed. Raising rolls back; nothing is recorded for the key.
            if time.time() >= approval_expires_at:
                raise Problem(
                    403, ResultCode.CONFIRMATION_REQUIRED, "the approval expired before the write could be committed"
                )
            by = Provenance(owner=write.owner, operation_id=write.key.operation_id, at=datetime.now(UTC))
            try:
                return 201, effect(conn, by)
            except Refusal as refusal:
                problem = _refusal_problem(refusal)
                return problem.status, problem.body()

        return run


# --- Routes -----------------------------------------------------------------------------------------


def add_write_routes(app: FastAPI, db: Store, settings: WriteSettings) -> None:
    protocol = WriteProtocol(db, settings)

    async def perform(
        request: Request,
        owner: Owner,
        operation_id: str,
        token: str | None,
        tool: str,
        body: dict[str, Any],
        effect: Effect,
    ) -> Response:
        write = Write(
            owner=owner,
            key=OperationKey(owner.tenant_id, owner.user_id, operation_id),
            digest=payload_digest(tool, body),
            approval_token=token,
            method=request.method,
            path=request.url.path,
        )
        reply = await run_in_threadpool(protocol.run, write, effect)
        if reply.committed:
            mark_committed(request)
        return reply.response()

    @app.post("/tickets/{ticket_id}/notes", status_code=201)
    async def append_ticket_note(
        request: Request,
        owner: Actor,
        operation_id: IdempotencyKey,
        ticket_id: Annotated[str, PathParam(pattern=TICKET_ID)],
        x_approval_token: ApprovalToken = None,
    ) -> Response:
        raw, body = await _parse_body(request, NoteBody)
        _same_id("ticketId", body.ticket_id, ticket_id)

        def effect(conn: sqlite3.Connection, by: Provenance) -> dict[str, Any]:
            return store.append_note(conn, by, body.ticket_id, body.text, body.expected_version)

        return await perform(request, owner, operation_id, x_approval_token, "append_ticket_note", raw, effect)

    @app.post("/calendars/{calendar_id}/events", status_code=201)
    async def create_calendar_event(
        request: Request,
        owner: Actor,
        operation_id: IdempotencyKey,
        calendar_id: Annotated[str, PathParam(pattern=CALENDAR_ID)],
        x_approval_token: ApprovalToken = None,
    ) -> Response:
        raw, body = await _parse_body(request, EventBody)
        _same_id("calendarId", body.calendar_id, calendar_id)

        def effect(conn: sqlite3.Connection, by: Provenance) -> dict[str, Any]:
            return store.create_event(conn, by, body.calendar_id, body.title, body.start, body.end, body.attendees)

        return await perform(request, owner, operation_id, x_approval_token, "create_calendar_event", raw, effect)

    @app.post("/orders/{order_id}/refunds", status_code=201)
    async def refund_order(
        request: Request,
        owner: Actor,
        operation_id: IdempotencyKey,
        order_id: Annotated[str, PathParam(pattern=ORDER_ID)],
        x_approval_token: ApprovalToken = None,
    ) -> Response:
        raw, body = await _parse_body(request, RefundBody)
        _same_id("orderId", body.order_id, order_id)

        def effect(conn: sqlite3.Connection, by: Provenance) -> dict[str, Any]:
            return store.refund_order(conn, by, body.order_id, body.amount_cents, body.reason)

        return await perform(request, owner, operation_id, x_approval_token, "refund_order", raw, effect)

    @app.get("/operations/{operation_id}", response_model=OperationState)
    def operation_status(owner: Actor, operation_id: Annotated[str, PathParam(pattern=OPERATION_ID)]) -> OperationState:
        return protocol.status(OperationKey(owner.tenant_id, owner.user_id, operation_id))
