"""I/O: the demo service's read-only tools, and the registry of all demo tools (read-only and, from
demo.tools.writes, side-effecting), registered through the public plug-in API (toolloop._core.registry).

Executors call the business service with the session's actor in headers (never an argument) and turn
every answer into a tool output or a ToolError / ToolTemporaryError (demo.tools.common).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, Field, model_validator
from pydantic_core import PydanticCustomError

from demo.tools.common import CALENDAR_ID, ORDER_ID, TICKET_ID, Arguments, Response, get, map_response
from demo.tools.writes import write_tool_specs
from toolloop._core.contracts import ok_output
from toolloop._core.registry import ToolContext, ToolRegistry, ToolSpec

__all__ = ["build_demo_registry", "map_response"]

MAX_SLOT_RANGE = timedelta(days=14)

# --- Argument models (what the model sees, camelCase) ----------------------------------------------


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


# --- Response models (the fields a tool passes on; anything else the service sends is dropped) ------


class _OrderItem(Response):
    sku: str
    name: str
    quantity: int


class _Order(Response):
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
    currency: str
    version: int


class _OrderSummary(Response):
    order_id: str
    status: str
    placed_at: str
    total_cents: int
    currency: str


class _OrderPage(Response):
    orders: list[_OrderSummary]
    page: int
    page_size: int
    total: int
    has_more: bool


class _TicketNote(Response):
    note_id: str
    text: str
    author: str
    created_at: str


class _Ticket(Response):
    ticket_id: str
    subject: str
    status: str
    priority: str
    created_at: str
    updated_at: str
    version: int
    notes: list[_TicketNote]


class _Slot(Response):
    start: str
    end: str


class _FreeSlots(Response):
    calendar_id: str
    from_: str = Field(alias="from")
    to: str
    slots: list[_Slot]
    truncated: bool


# --- Executors ----------------------------------------------------------------------------------------


async def get_order_status(ctx: ToolContext, args: GetOrderStatusArgs) -> dict[str, Any]:
    response = await get(ctx, f"/orders/{args.order_id}")
    order = map_response(response, _Order, f"order {args.order_id} is not available")
    return ok_output(**order.model_dump(mode="json"))


async def list_my_orders(ctx: ToolContext, args: ListMyOrdersArgs) -> dict[str, Any]:
    params = {"page": args.page or 1, "page_size": args.page_size or 20}
    response = await get(ctx, "/orders", params)
    page = map_response(response, _OrderPage, "the order list is not available")
    return ok_output(**page.model_dump(mode="json"))


async def get_ticket(ctx: ToolContext, args: GetTicketArgs) -> dict[str, Any]:
    response = await get(ctx, f"/tickets/{args.ticket_id}")
    ticket = map_response(response, _Ticket, f"ticket {args.ticket_id} is not available")
    return ok_output(**ticket.model_dump(mode="json"))


async def find_free_slots(ctx: ToolContext, args: FindFreeSlotsArgs) -> dict[str, Any]:
    # httpx percent-encodes "+" in the offset, so the service reads the time unchanged.
    params = {"from": args.from_.isoformat(), "to": args.to.isoformat()}
    response = await get(ctx, f"/calendars/{args.calendar_id}/free-slots", params)
    slots = map_response(response, _FreeSlots, f"calendar {args.calendar_id} is not available")
    return ok_output(**slots.model_dump(mode="json", by_alias=True))


# --- Registration -----------------------------------------------------------------------------------

_READ_ONLY: Literal["read_only"] = "read_only"


def build_demo_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(
        ToolSpec(
            name="get_order_status",
            description="Status, carrier, tracking number, items and totals of one of the current user's orders.",
            arguments=GetOrderStatusArgs,
            effect=_READ_ONLY,
            execute=get_order_status,
            summarize=lambda a: f"get_order_status {a.order_id}",
        )
    )
    registry.register(
        ToolSpec(
            name="list_my_orders",
            description="The current user's orders, newest first, one page at a time.",
            arguments=ListMyOrdersArgs,
            effect=_READ_ONLY,
            execute=list_my_orders,
            summarize=lambda a: f"list_my_orders page {a.page or 1}",
        )
    )
    registry.register(
        ToolSpec(
            name="get_ticket",
            description="One of the current user's support tickets with its notes and version.",
            arguments=GetTicketArgs,
            effect=_READ_ONLY,
            execute=get_ticket,
            summarize=lambda a: f"get_ticket {a.ticket_id}",
        )
    )
    registry.register(
        ToolSpec(
            name="find_free_slots",
            description=(
                "Free intervals in one of the current user's calendars within working hours "
                "(Mon-Fri 09:00-17:00 UTC) between from and to (at most 14 days)."
            ),
            arguments=FindFreeSlotsArgs,
            effect=_READ_ONLY,
            execute=find_free_slots,
            summarize=lambda a: f"find_free_slots {a.calendar_id} {a.from_:%Y-%m-%d}",
        )
    )
    for spec in write_tool_specs():
        registry.register(spec)
    return registry
