"""I/O: the demo service's tools, declared with toolloop's public API only - four reads (two as plain HTTP
reads, two as functions) and three writes on the ready-made HTTP write contract, each with its read-back.

Executors call the business service with the session's actor in headers (never an argument); outputs are
built from known fields of a parsed response, so a raw body or exception text never reaches the model.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

import toolloop
from demo.rules import ACCOUNT, CALENDAR_ID, MAX_SAFE_INTEGER, ORDER_ID, TICKET_ID, Email, event_end, whole_second
from toolloop import Arguments, Instant, PlainText, PolicyFact, ReadBack, ResultCode, ToolContext, sorted_unique

MAX_SLOT_RANGE = timedelta(days=14)

# The service's own problem codes, as the model should read them (others go by HTTP status).
PROBLEM_CODES = {
    "NOT_FOUND": ResultCode.NOT_AVAILABLE,
    "STALE_VERSION": ResultCode.VERSION_CONFLICT,
    "NOT_REFUNDABLE": ResultCode.BAD_ARGUMENTS,
    "UNKNOWN_USER": ResultCode.FORBIDDEN,
}


# --- Arguments (what the model sees, camelCase) -----------------------------------------------------------


class GetOrderStatusArgs(Arguments):
    order_id: str = Field(alias="orderId", pattern=ORDER_ID, description="Order id, e.g. A100.")


class ListMyOrdersArgs(Arguments):
    page: int | None = Field(default=None, ge=1, le=1000, description="Page number from 1; null for the first page.")
    page_size: int | None = Field(
        default=None, alias="pageSize", ge=1, le=100, description="Orders per page (1-100); null for 20."
    )


class GetTicketArgs(Arguments):
    ticket_id: str = Field(alias="ticketId", pattern=TICKET_ID, description="Support ticket id, e.g. T1001.")


class FindFreeSlotsArgs(Arguments):
    calendar_id: str = Field(alias="calendarId", pattern=CALENDAR_ID, description="Calendar id, e.g. cal-u1.")
    from_: AwareDatetime = Field(
        alias="from", description="Start of the range, ISO 8601 with a UTC offset, e.g. 2026-12-01T00:00:00Z."
    )
    to: AwareDatetime = Field(
        description="End of the range (exclusive), ISO 8601 with a UTC offset; at most 14 days after from."
    )

    @model_validator(mode="after")
    def _range(self) -> FindFreeSlotsArgs:
        # PydanticCustomError: the model reads the rule itself, without a "Value error," prefix.
        if self.to <= self.from_:
            raise PydanticCustomError("date_range", "to must be later than from")
        if self.to - self.from_ > MAX_SLOT_RANGE:
            raise PydanticCustomError("date_range", "the range from..to may span at most 14 days")
        return self


class _WriteArguments(Arguments):
    # Text is trimmed before its length is checked, so the approved (digested) payload is the trimmed one.
    model_config = ConfigDict(str_strip_whitespace=True)


class AppendTicketNoteArgs(_WriteArguments):
    ticket_id: str = Field(alias="ticketId", pattern=TICKET_ID, description="Support ticket id, e.g. T1001.")
    text: PlainText = Field(min_length=1, max_length=500, description="The note, plain text (1-500 characters).")
    expected_version: int = Field(
        alias="expectedVersion",
        ge=1,
        le=MAX_SAFE_INTEGER,
        description="The ticket's current version, as read with get_ticket; a stale one is refused.",
    )


class CreateCalendarEventArgs(_WriteArguments):
    calendar_id: str = Field(alias="calendarId", pattern=CALENDAR_ID, description="Calendar id, e.g. cal-u1.")
    title: PlainText = Field(min_length=1, max_length=200, description="Event title, plain text (1-200 characters).")
    # Instants are kept in UTC and attendees as a sorted set: one intended event, one operation id.
    start: Instant = Field(description="Start, ISO 8601 with a UTC offset and whole seconds.")
    end: Instant = Field(description="End, ISO 8601 with a UTC offset; after start, at most 8 hours later.")
    attendees: Annotated[list[Email], Field(max_length=20), AfterValidator(sorted_unique)] | None = Field(
        default=None,
        # Left out by the model, it is [] too (the default goes through _none_is_empty).
        validate_default=True,
        description="Up to 20 attendee email addresses (a set: order and repeats do not matter); null for none.",
    )

    _whole_seconds = field_validator("start", "end")(whole_second)
    _after_start = field_validator("end")(event_end)

    @field_validator("attendees")
    @classmethod
    def _none_is_empty(cls, value: list[str] | None) -> list[str]:
        # Normalized here so the approved payload, the sent body and the read-back all say [] for "none".
        return [] if value is None else value


class RefundOrderArgs(_WriteArguments):
    order_id: str = Field(alias="orderId", pattern=ORDER_ID, description="Order id, e.g. A100.")
    amount_cents: int = Field(
        alias="amountCents",
        ge=1,
        le=MAX_SAFE_INTEGER,
        description="Amount to refund in cents; at most what is still refundable (never defaults to the total).",
    )
    reason: PlainText = Field(min_length=1, max_length=200, description="Why, plain text (1-200 characters).")
    to_account: str | None = Field(
        default=None,
        alias="toAccount",
        pattern=ACCOUNT,
        description="Account to refund to, e.g. acct-u1-0001; null for the account the order was paid from.",
    )


# --- Results (the fields a tool passes on; anything else the service sends is dropped) ----------------------


class _OrderItem(BaseModel):
    sku: str
    name: str
    quantity: int


class Order(BaseModel):
    order_id: str
    status: str
    carrier: str | None
    tracking_number: str | None
    placed_at: str
    shipped_at: str | None
    delivered_at: str | None
    items: list[_OrderItem]
    total_cents: int
    refunded_cents: int
    refundable_cents: int
    currency: str
    version: int
    paid_from: str
    promised_by: str
    late: bool


class _OrderSummary(BaseModel):
    order_id: str
    status: str
    placed_at: str
    total_cents: int
    currency: str


class OrderPage(BaseModel):
    orders: list[_OrderSummary]
    page: int
    page_size: int
    total: int
    has_more: bool


class _TicketNote(BaseModel):
    note_id: str
    text: str
    author: str
    created_at: str


class Ticket(BaseModel):
    ticket_id: str
    owner: str
    subject: str
    status: str
    priority: str
    created_at: str
    updated_at: str
    version: int
    notes: list[_TicketNote]


class _Slot(BaseModel):
    start: str
    end: str


class FreeSlots(BaseModel):
    calendar_id: str
    from_: str = Field(alias="from")
    to: str
    slots: list[_Slot]
    truncated: bool


class NoteAppended(BaseModel):
    note_id: str
    ticket_id: str
    text: str
    author: str
    created_at: str
    ticket_version: int


class EventCreated(BaseModel):
    event_id: str = Field(pattern=r"^E[A-Za-z0-9-]{0,40}$")  # it goes into a read-back path
    calendar_id: str
    title: str
    start: AwareDatetime
    end: AwareDatetime
    attendees: list[str]


class RefundCreated(BaseModel):
    refund_id: str
    order_id: str
    amount_cents: int
    reason: str
    to_account: str
    refunded_cents: int
    refundable_cents: int
    created_at: str


class _Note(BaseModel):
    note_id: str
    text: str


class _TicketNotes(BaseModel):
    notes: list[_Note]


class _Refund(BaseModel):
    refund_id: str
    amount_cents: int
    reason: str
    to_account: str


class _OrderRefunds(BaseModel):
    refunds: list[_Refund]
    paid_from: str


# --- Read-backs: what "done" is checked against ------------------------------------------------------------


def _note_matches(args: AppendTicketNoteArgs, created: NoteAppended, ticket: _TicketNotes) -> dict[str, bool] | None:
    note = next((n for n in ticket.notes if n.note_id == created.note_id), None)
    return None if note is None else {"text": note.text == args.text}


def _event_matches(args: CreateCalendarEventArgs, created: EventCreated, event: EventCreated) -> dict[str, bool]:
    return {
        "calendar": event.calendar_id == args.calendar_id,
        "title": event.title == args.title,
        "start": event.start == args.start,  # aware datetimes compare as instants
        "end": event.end == args.end,
        "attendees": set(event.attendees) == set(args.attendees or ()),
    }


def _refund_matches(args: RefundOrderArgs, created: RefundCreated, order: _OrderRefunds) -> dict[str, bool] | None:
    refund = next((r for r in order.refunds if r.refund_id == created.refund_id), None)
    if refund is None:
        return None
    # No toAccount asked for: the refund must have gone to the account the order was paid from.
    to_account = args.to_account if args.to_account is not None else order.paid_from
    return {
        "amount": refund.amount_cents == args.amount_cents,
        "reason": refund.reason == args.reason,
        "to_account": refund.to_account == to_account,
    }


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- The toolset ------------------------------------------------------------------------------------------


def demo_tools(service_url: str) -> toolloop.Toolset:
    service = toolloop.HttpSource("bizservice", base_url=service_url, problem_codes=PROBLEM_CODES)
    tools = toolloop.Toolset()

    tools.http_read(
        "get_order_status",
        source=service,
        path="/orders/{orderId}",
        arguments=GetOrderStatusArgs,
        result=Order,
        description="Status, carrier, tracking number, items and totals of one of the current user's orders.",
        not_available="order {orderId} is not available",
        summary=lambda a: f"get_order_status {a.order_id}",
    )

    @tools.read(source=service, summary=lambda a: f"list_my_orders page {a.page or 1}")
    async def list_my_orders(ctx: ToolContext, args: ListMyOrdersArgs) -> OrderPage:
        """The current user's orders, newest first, one page at a time."""
        params = {"page": args.page or 1, "page_size": args.page_size or 20}
        return await service.get(
            ctx, "/orders", OrderPage, params=params, not_available="the order list is not available"
        )

    tools.http_read(
        "get_ticket",
        source=service,
        path="/tickets/{ticketId}",
        arguments=GetTicketArgs,
        result=Ticket,
        description="One of the current user's support tickets with its notes and version.",
        not_available="ticket {ticketId} is not available",
        summary=lambda a: f"get_ticket {a.ticket_id}",
    )

    @tools.read(source=service, summary=lambda a: f"find_free_slots {a.calendar_id} {a.from_:%Y-%m-%d}")
    async def find_free_slots(ctx: ToolContext, args: FindFreeSlotsArgs) -> FreeSlots:
        """Free intervals in one of the current user's calendars within working hours (Mon-Fri 09:00-17:00 UTC)
        between from and to (at most 14 days)."""
        # httpx percent-encodes "+" in the offset, so the service reads the time unchanged.
        params = {"from": args.from_.isoformat(), "to": args.to.isoformat()}
        path = f"/calendars/{args.calendar_id}/free-slots"
        return await service.get(
            ctx, path, FreeSlots, params=params, not_available=f"calendar {args.calendar_id} is not available"
        )

    tools.http_write(
        "append_ticket_note",
        source=service,
        path="/tickets/{ticketId}/notes",
        arguments=AppendTicketNoteArgs,
        result=NoteAppended,
        description=(
            "Append a note to one of the current user's support tickets. Needs the ticket's current "
            "version (read it with get_ticket). Runs only after a person approves it."
        ),
        read_back=ReadBack("/tickets/{ticketId}", _TicketNotes, _note_matches),
        summary=lambda a: f"append_ticket_note {a.ticket_id}",
        # What the approval policy may decide it on (config/policies/demo.cedar): the ticket as read earlier.
        policy_facts=[PolicyFact(name="ticket", tool="get_ticket", match={"ticketId": "ticketId"}, fields=["owner"])],
    )
    tools.http_write(
        "create_calendar_event",
        source=service,
        path="/calendars/{calendarId}/events",
        arguments=CreateCalendarEventArgs,
        result=EventCreated,
        description=(
            "Create a one-off event (no recurrence) in one of the current user's calendars, at most "
            "8 hours long. Runs only after a person approves it."
        ),
        read_back=ReadBack("/calendars/{calendarId}/events/{event_id}", EventCreated, _event_matches),
        summary=lambda a: f"create_calendar_event {a.calendar_id} {_utc(a.start)}",
    )
    tools.http_write(
        "refund_order",
        source=service,
        path="/orders/{orderId}/refunds",
        arguments=RefundOrderArgs,
        result=RefundCreated,
        description=(
            "Refund part or all of one of the current user's orders; amountCents must be given and at "
            "most what is still refundable. Runs only after a person approves it."
        ),
        read_back=ReadBack("/orders/{orderId}/refunds", _OrderRefunds, _refund_matches),
        summary=lambda a: f"refund_order {a.order_id} {a.amount_cents}",
        # The order as read earlier: whether it is late, who paid it, and what it can still refund.
        policy_facts=[
            PolicyFact(
                name="order",
                tool="get_order_status",
                match={"orderId": "orderId"},
                fields=["late", "paid_from", "refundable_cents"],
            )
        ],
    )
    return tools
