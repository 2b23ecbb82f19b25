"""I/O: the write endpoints (ticket notes, calendar events, refunds), built on toolloop's idempotency kit: the
kit checks the key, the approval and the payload, claims the key, and commits each effect with its ledger
record in one transaction; this module only says what each effect does."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

from demo.bizservice import faults, store
from demo.bizservice.store import Owner, Provenance, Refused, Store
from demo.bizservice.web import Problem, ServiceCode, kit_actor
from demo.rules import ACCOUNT, CALENDAR_ID, MAX_SAFE_INTEGER, ORDER_ID, TICKET_ID, Email, event_end, whole_second
from toolloop import PlainText, sorted_unique
from toolloop.servicekit import INVALID_BODY, Hold, IdempotencyKit, IdempotentWrite, Refusal, SqliteLedger, no_hold

CLAIM_LEASE_SECONDS = 30.0


# --- Request bodies (camelCase, exactly the tools' arguments) ---------------------------------------


class _Body(BaseModel):
    # Text is trimmed before its length is checked; the digest is still taken over the body as received.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class NoteBody(_Body):
    ticket_id: str = Field(alias="ticketId", pattern=TICKET_ID)
    text: PlainText = Field(min_length=1, max_length=500)
    expected_version: int = Field(alias="expectedVersion", ge=1, le=MAX_SAFE_INTEGER)


class EventBody(_Body):
    calendar_id: str = Field(alias="calendarId", pattern=CALENDAR_ID)
    title: PlainText = Field(min_length=1, max_length=200)
    start: AwareDatetime
    end: AwareDatetime
    # A set: stored sorted, as the orchestrator sends it.
    attendees: Annotated[list[Email], AfterValidator(sorted_unique)] = Field(default_factory=list, max_length=20)

    _whole_seconds = field_validator("start", "end")(whole_second)
    _after_start = field_validator("end")(event_end)


class RefundBody(_Body):
    order_id: str = Field(alias="orderId", pattern=ORDER_ID)
    amount_cents: int = Field(alias="amountCents", ge=1, le=MAX_SAFE_INTEGER)
    reason: PlainText = Field(min_length=1, max_length=200)
    # None (or left out): the account the order was paid from.
    to_account: str | None = Field(default=None, alias="toAccount", pattern=ACCOUNT)


def _same_id(field: str, in_body: str, in_path: str) -> None:
    if in_body != in_path:
        raise Problem(422, INVALID_BODY, f"{field}: must equal the id in the path")


def _refusal(refused: Refused) -> Refusal:
    """A business "no" as the kit stores it (recorded under the key, replayed to a retry)."""
    if isinstance(refused, store.NotOwned):
        return Refusal(404, ServiceCode.NOT_FOUND, f"{refused.kind} {refused.object_id} is not available")
    if isinstance(refused, store.StaleVersion):
        return Refusal(
            409,
            ServiceCode.STALE_VERSION,
            f"expectedVersion: the object is at version {refused.current_version}; read it again",
            current_version=refused.current_version,
        )
    if isinstance(refused, store.NotRefundable):
        return Refusal(
            422, ServiceCode.NOT_REFUNDABLE, f"amountCents: at most {refused.refundable_cents} cents are refundable"
        )
    raise TypeError(f"unhandled refusal {type(refused).__name__}")


def _provenance(write: IdempotentWrite) -> Provenance:
    owner = Owner(user_id=write.actor.user_id, tenant_id=write.actor.tenant_id)
    return Provenance(owner=owner, operation_id=write.operation_id, at=datetime.now(UTC))


def _after_claim_fault(db: Store) -> Any:
    def fault(write: IdempotentWrite) -> None:
        rule = faults.claim(db, write.method, write.path, "after_claim")
        if rule is None:
            return
        time.sleep(rule.latency_ms / 1000)  # a worker thread: the event loop keeps serving meanwhile
        if rule.status is not None:
            raise faults.fault_problem(rule.status)

    return fault


# The `aud` this service accepts in approval tokens: the demo tools' source has the same name (demo/tools.py),
# which is its tokens' audience by default.
AUDIENCE = "bizservice"


def write_kit(
    db: Store,
    approval_verify_key: str | None,
    retention_seconds: float,
    claim_lease_seconds: float = CLAIM_LEASE_SECONDS,
    hold: Hold = no_hold,
    policy_verify_key: str | None = None,
    policy_rules: Iterable[str] | Callable[[], Iterable[str]] | None = None,
) -> IdempotencyKit:
    """The kit on the service's own database file (the ledger's tables beside the business tables). With a
    policy verify key, writes are decided by policy (the policy's signed decision first)."""
    return IdempotencyKit(
        SqliteLedger(db.db_path),
        approval_verify_key=approval_verify_key,
        audience=AUDIENCE,
        retention_seconds=retention_seconds,
        claim_lease_seconds=claim_lease_seconds,
        actor=kit_actor,
        hold=hold,
        after_claim=_after_claim_fault(db),
        policy_verify_key=policy_verify_key,
        policy_rules=policy_rules,
    )


def add_write_routes(app: FastAPI, kit: IdempotencyKit) -> None:
    kit.install(app)

    def effect_of(write: IdempotentWrite, run: Any) -> Any:
        def effect(conn: sqlite3.Connection) -> dict[str, Any]:
            try:
                result: dict[str, Any] = run(conn, _provenance(write))
            except Refused as refused:
                raise _refusal(refused) from None
            return result

        return effect

    @app.post("/tickets/{ticket_id}/notes", status_code=201)
    async def append_ticket_note(
        ticket_id: Annotated[str, PathParam(pattern=TICKET_ID)],
        write: IdempotentWrite = Depends(kit.write),
    ) -> Response:
        body = write.parse(NoteBody)
        _same_id("ticketId", body.ticket_id, ticket_id)
        return await write.commit(
            effect_of(write, lambda c, by: store.append_note(c, by, body.ticket_id, body.text, body.expected_version))
        )

    @app.post("/calendars/{calendar_id}/events", status_code=201)
    async def create_calendar_event(
        calendar_id: Annotated[str, PathParam(pattern=CALENDAR_ID)],
        write: IdempotentWrite = Depends(kit.write),
    ) -> Response:
        body = write.parse(EventBody)
        _same_id("calendarId", body.calendar_id, calendar_id)
        return await write.commit(
            effect_of(
                write,
                lambda c, by: store.create_event(
                    c, by, body.calendar_id, body.title, body.start, body.end, body.attendees
                ),
            )
        )

    @app.post("/orders/{order_id}/refunds", status_code=201)
    async def refund_order(
        order_id: Annotated[str, PathParam(pattern=ORDER_ID)],
        write: IdempotentWrite = Depends(kit.write),
    ) -> Response:
        body = write.parse(RefundBody)
        _same_id("orderId", body.order_id, order_id)
        return await write.commit(
            effect_of(
                write,
                lambda c, by: store.refund_order(c, by, body.order_id, body.amount_cents, body.reason, body.to_account),
            )
        )
