"""I/O: the demo service's read-only tools, registered through the public plug-in API (agentcore.registry).

Executors call the business service with the session's actor in headers (never an argument) and turn
every answer into a tool output or a ToolError / ToolTemporaryError. Outputs are built from known fields
of a parsed response: a raw body or exception text never reaches the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal, TypeVar

import httpx
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from agentcore.codes import ResultCode
from agentcore.contracts import ok_output
from agentcore.registry import ToolContext, ToolError, ToolRegistry, ToolSpec, ToolTemporaryError

MAX_SLOT_RANGE = timedelta(days=14)
_MAX_DETAIL_CHARS = 200
_MAX_RETRY_AFTER_SECONDS = 300.0

# --- Argument models (what the model sees, camelCase) ----------------------------------------------


class _Arguments(BaseModel):
    # Dumped by alias so the checked arguments (CheckedCall.arguments) validate again unchanged.
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)


class GetOrderStatusArgs(_Arguments):
    order_id: str = Field(alias="orderId", pattern=r"^A\d{3}$", description="Order id, e.g. A100.")


class ListMyOrdersArgs(_Arguments):
    page: int | None = Field(default=None, ge=1, le=1000, description="Page number from 1; null for the first page.")
    page_size: int | None = Field(
        default=None, alias="pageSize", ge=1, le=100, description="Orders per page (1-100); null for 20."
    )


class GetTicketArgs(_Arguments):
    ticket_id: str = Field(alias="ticketId", pattern=r"^T\d{4}$", description="Support ticket id, e.g. T1001.")


class FindFreeSlotsArgs(_Arguments):
    calendar_id: str = Field(
        alias="calendarId", pattern=r"^cal-[a-z0-9-]{1,32}$", description="Calendar id, e.g. cal-u1."
    )
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


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _OrderItem(_Response):
    sku: str
    name: str
    quantity: int


class _Order(_Response):
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


class _OrderSummary(_Response):
    order_id: str
    status: str
    placed_at: str
    total_cents: int
    currency: str


class _OrderPage(_Response):
    orders: list[_OrderSummary]
    page: int
    page_size: int
    total: int
    has_more: bool


class _TicketNote(_Response):
    note_id: str
    text: str
    author: str
    created_at: str


class _Ticket(_Response):
    ticket_id: str
    subject: str
    status: str
    priority: str
    created_at: str
    updated_at: str
    version: int
    notes: list[_TicketNote]


class _Slot(_Response):
    start: str
    end: str


class _FreeSlots(_Response):
    calendar_id: str
    from_: str = Field(alias="from")
    to: str
    slots: list[_Slot]
    truncated: bool


# --- The one place HTTP answers become tool results ---------------------------------------------------

R = TypeVar("R", bound=BaseModel)


def _actor_headers(ctx: ToolContext) -> dict[str, str]:
    return {"X-Actor-User": ctx.actor.user_id, "X-Actor-Tenant": ctx.actor.tenant_id}


def _retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (the activity's own backoff applies)."""
    value = response.headers.get("Retry-After", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_SECONDS)


def _problem(response: httpx.Response) -> Mapping[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _safe_detail(value: Any, fallback: str) -> str:
    # The service writes its 422 details for callers (field names and rules, no input values); still
    # only a short string is passed on.
    if not isinstance(value, str) or not value.strip():
        return fallback
    return value.strip()[:_MAX_DETAIL_CHARS]


async def _get(ctx: ToolContext, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
    try:
        return await ctx.http.get(path, params=params, headers=_actor_headers(ctx))
    except httpx.TransportError:
        # Refused, reset, timed out: for a read, safe to try again.
        raise ToolTemporaryError("the business service could not be reached") from None


def map_response(response: httpx.Response, model: type[R], not_available: str) -> R:
    """The parsed 200 body, or the matching tool error. `not_available` is the one message for
    "does not exist" and "not yours", built by the caller from the arguments alone."""
    status = response.status_code
    if status == 200:
        try:
            return model.model_validate_json(response.content)
        except ValidationError:
            raise ToolError(ResultCode.INTERNAL, "the service gave an answer this tool does not understand") from None
    if status == 404:
        raise ToolError(ResultCode.NOT_AVAILABLE, not_available)
    if status in (400, 422):
        detail = _safe_detail(_problem(response).get("detail"), "the service rejected the arguments")
        raise ToolError(ResultCode.BAD_ARGUMENTS, detail)
    if status in (401, 403):
        raise ToolError(ResultCode.FORBIDDEN, "this request is not allowed for the current user")
    if status == 409:
        if _problem(response).get("code") == ResultCode.VERSION_CONFLICT:
            raise ToolError(ResultCode.VERSION_CONFLICT, "the object has changed; read it again before retrying")
        raise ToolError(ResultCode.CONFLICT, "the request conflicts with the object's current state; read it again")
    if status == 429 or status >= 500:
        raise ToolTemporaryError(
            f"the business service is temporarily unavailable (HTTP {status})", _retry_after(response)
        )
    raise ToolError(ResultCode.INTERNAL, f"the service gave an unexpected answer (HTTP {status})")


# --- Executors ----------------------------------------------------------------------------------------


async def get_order_status(ctx: ToolContext, args: GetOrderStatusArgs) -> dict[str, Any]:
    response = await _get(ctx, f"/orders/{args.order_id}")
    order = map_response(response, _Order, f"order {args.order_id} is not available")
    return ok_output(**order.model_dump(mode="json"))


async def list_my_orders(ctx: ToolContext, args: ListMyOrdersArgs) -> dict[str, Any]:
    params = {"page": args.page or 1, "page_size": args.page_size or 20}
    response = await _get(ctx, "/orders", params)
    page = map_response(response, _OrderPage, "the order list is not available")
    return ok_output(**page.model_dump(mode="json"))


async def get_ticket(ctx: ToolContext, args: GetTicketArgs) -> dict[str, Any]:
    response = await _get(ctx, f"/tickets/{args.ticket_id}")
    ticket = map_response(response, _Ticket, f"ticket {args.ticket_id} is not available")
    return ok_output(**ticket.model_dump(mode="json"))


async def find_free_slots(ctx: ToolContext, args: FindFreeSlotsArgs) -> dict[str, Any]:
    # httpx percent-encodes "+" in the offset, so the service reads the time unchanged.
    params = {"from": args.from_.isoformat(), "to": args.to.isoformat()}
    response = await _get(ctx, f"/calendars/{args.calendar_id}/free-slots", params)
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
    return registry
