"""I/O: the demo service's side-effecting tools (ticket note, calendar event, refund): executors that send
the approved arguments under the operation id, the shared status query, and one read-back per tool.

A write answer is sorted into exactly one of: the created object (ok output, also when replayed), a
definite refusal (ToolError), in progress (WriteInProgress), certainly not sent (WriteNotSent), or
unknown (WriteOutcomeUnknown) - anything that may have happened after the request left.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

import httpx
from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from demo.tools.common import (
    CALENDAR_ID,
    ORDER_ID,
    TICKET_ID,
    Arguments,
    Response,
    actor_headers,
    definite_error,
    get,
    json_body,
    map_response,
    retry_after,
)
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import error_output, ok_output
from toolloop._core.registry import (
    Evidence,
    EvidenceNotYetVisible,
    Instant,
    OperationStatus,
    PlainText,
    ToolContext,
    ToolError,
    ToolSpec,
    ToolTemporaryError,
    WriteInProgress,
    WriteNotSent,
    WriteOutcomeUnknown,
    sorted_unique,
)

MAX_SAFE_INTEGER = 2**53 - 1
MAX_EVENT_DURATION = timedelta(hours=8)
# local@domain.tld, ASCII only: no look-alike or invisible characters in an address.
EMAIL = r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$"
# Failures that happen before a single byte of the request is sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

# --- Argument models (what the model sees, camelCase) ----------------------------------------------


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


Email = Annotated[str, StringConstraints(max_length=254, pattern=EMAIL)]


class CreateCalendarEventArgs(_WriteArguments):
    calendar_id: str = Field(alias="calendarId", pattern=CALENDAR_ID, description="Calendar id, e.g. cal-u1.")
    title: PlainText = Field(min_length=1, max_length=200, description="Event title, plain text (1-200 characters).")
    # Instants are kept in UTC and attendees as a sorted set: one intended event, one operation id.
    start: Instant = Field(description="Start, ISO 8601 with a UTC offset and whole seconds.")
    end: Instant = Field(description="End, ISO 8601 with a UTC offset; after start, at most 8 hours later.")
    attendees: Annotated[list[Email], Field(max_length=20), AfterValidator(sorted_unique)] | None = Field(
        default=None,
        description="Up to 20 attendee email addresses (a set: order and repeats do not matter); null for none.",
    )

    @field_validator("start", "end")
    @classmethod
    def _whole_seconds(cls, value: datetime) -> datetime:
        # The service keeps second precision; a fraction would make the read-back differ.
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


# --- Response models ------------------------------------------------------------------------------------


class _NoteAppended(Response):
    note_id: str
    ticket_id: str
    text: str
    author: str
    created_at: str
    ticket_version: int


class _EventCreated(Response):
    event_id: str = Field(pattern=r"^E[A-Za-z0-9-]{0,40}$")  # it goes into a read-back path
    calendar_id: str
    title: str
    start: AwareDatetime
    end: AwareDatetime
    attendees: list[str]


class _RefundCreated(Response):
    refund_id: str
    order_id: str
    amount_cents: int
    reason: str
    refunded_cents: int
    refundable_cents: int
    created_at: str


class _Note(Response):
    note_id: str
    text: str


class _TicketNotes(Response):
    notes: list[_Note]


class _Refund(Response):
    refund_id: str
    amount_cents: int
    reason: str


class _OrderRefunds(Response):
    refunds: list[_Refund]


class _OperationState(Response):
    state: Literal["completed", "in_progress", "not_found"]
    status_code: int | None
    body: Any
    # How long the service keeps operation ids (it declares it on every status answer).
    retention_seconds: float | None = Field(default=None, gt=0)


R = TypeVar("R", bound=Response)

# --- Answers to outputs -----------------------------------------------------------------------------------


def write_output(
    status: int, body: Any, result: type[Response], retry_after_seconds: float | None = None
) -> dict[str, Any]:
    """The tool output for a write's answer (fresh or replayed: the same), or the exception it stands for."""
    if 200 <= status < 300:
        try:
            return ok_output(**result.model_validate(body).model_dump(mode="json"))
        except ValidationError:
            # The effect may well exist; only its reply is unreadable.
            raise WriteOutcomeUnknown("the reply to this write could not be read") from None
    if status == 409 and isinstance(body, dict) and body.get("code") == "IN_PROGRESS":
        raise WriteInProgress("another attempt of this operation is still running")
    # Only a definite refusal (400, 401, 403, 404, 409, 422) says nothing was done. A 429, a 5xx or
    # anything else may come after the service committed: the workflow asks the status before any resend.
    error = definite_error(status, body)
    if error is not None:
        raise error
    raise WriteOutcomeUnknown(f"the business service gave no definite answer (HTTP {status})", retry_after_seconds)


async def _send(ctx: ToolContext, path: str, args: Arguments, result: type[Response]) -> dict[str, Any]:
    if not ctx.operation_id:
        raise ToolError(ResultCode.INTERNAL, "this write was started without an operation id")
    headers = {**actor_headers(ctx), "Idempotency-Key": ctx.operation_id}
    if ctx.approval_token:
        headers["X-Approval-Token"] = ctx.approval_token
    try:
        # Exactly the arguments the approval's digest was taken over.
        response = await ctx.http.post(path, json=args.model_dump(mode="json", by_alias=True), headers=headers)
    except _NOT_SENT:
        raise WriteNotSent("the business service could not be reached; nothing was sent") from None
    except httpx.HTTPError:
        raise WriteOutcomeUnknown("the connection failed after the write was sent") from None
    return write_output(response.status_code, json_body(response), result, retry_after(response))


async def append_ticket_note(ctx: ToolContext, args: AppendTicketNoteArgs) -> dict[str, Any]:
    return await _send(ctx, f"/tickets/{args.ticket_id}/notes", args, _NoteAppended)


async def create_calendar_event(ctx: ToolContext, args: CreateCalendarEventArgs) -> dict[str, Any]:
    return await _send(ctx, f"/calendars/{args.calendar_id}/events", args, _EventCreated)


async def refund_order(ctx: ToolContext, args: RefundOrderArgs) -> dict[str, Any]:
    return await _send(ctx, f"/orders/{args.order_id}/refunds", args, _RefundCreated)


# --- Status (one query for every write tool) ---------------------------------------------------------------


async def operation_status(ctx: ToolContext, operation_id: str, *, result: type[Response]) -> OperationStatus:
    """The service's word on `operation_id`; for a completed one, the output the executor would have
    given for the stored reply. Raises ToolTemporaryError when the status cannot be read."""
    response = await get(ctx, f"/operations/{operation_id}")
    if response.status_code != 200:
        raise ToolTemporaryError(
            f"the operation status is unavailable (HTTP {response.status_code})", retry_after(response)
        )
    try:
        found = _OperationState.model_validate_json(response.content)
    except ValidationError:
        raise ToolTemporaryError("the operation status could not be read") from None
    retention = found.retention_seconds
    if found.state != "completed" or found.status_code is None:
        state: Literal["in_progress", "not_found"] = "in_progress" if found.state == "in_progress" else "not_found"
        return OperationStatus(state=state, retention_seconds=retention)
    try:
        output = write_output(found.status_code, found.body, result)
    except ToolError as refusal:
        output = error_output(refusal.code, refusal.message)
    except (WriteInProgress, WriteNotSent, WriteOutcomeUnknown):
        # A stored outcome is always an object or a definite refusal; anything else is not trusted.
        raise ToolTemporaryError("the stored outcome could not be read") from None
    return OperationStatus(state="completed", output=output, retention_seconds=retention)


# --- Read-backs ---------------------------------------------------------------------------------------------

ReadBackCheck = Callable[[ToolContext, Any, Mapping[str, Any]], Awaitable[Evidence]]


def _refusal_is_unverified(check: ReadBackCheck) -> ReadBackCheck:
    """A read-back the service refuses (e.g. authority revoked since) proves nothing: not verified."""

    @functools.wraps(check)
    async def run(ctx: ToolContext, args: Any, output: Mapping[str, Any]) -> Evidence:
        try:
            return await check(ctx, args, output)
        except ToolError as refusal:
            return Evidence(verified=False, detail=f"the read-back could not check the effect ({refusal.code})")

    return run


async def _fetch(ctx: ToolContext, path: str, model: type[R], what: str) -> R:
    try:
        return map_response(await get(ctx, path), model, f"{what} is not available")
    except ToolError as error:
        if error.code == ResultCode.NOT_AVAILABLE:
            raise EvidenceNotYetVisible(f"{what} is not visible yet") from None
        raise


def _created(output: Mapping[str, Any], result: type[R]) -> R:
    try:
        return result.model_validate(dict(output))
    except ValidationError:
        raise ToolError(ResultCode.INTERNAL, "the write's output names no created object") from None


def _compare(what: str, object_id: str, **matches: bool) -> Evidence:
    differing = [name for name, same in matches.items() if not same]
    detail = f"{what} matches the approved operation"
    if differing:
        detail = f"{what} differs from the approved operation: {', '.join(differing)}"
    return Evidence(verified=not differing, detail=detail, checks={"id": object_id, **matches})


@_refusal_is_unverified
async def read_back_note(ctx: ToolContext, args: AppendTicketNoteArgs, output: Mapping[str, Any]) -> Evidence:
    created = _created(output, _NoteAppended)
    ticket = await _fetch(ctx, f"/tickets/{args.ticket_id}", _TicketNotes, f"ticket {args.ticket_id}")
    note = next((n for n in ticket.notes if n.note_id == created.note_id), None)
    if note is None:
        raise EvidenceNotYetVisible(f"note {created.note_id} is not on ticket {args.ticket_id} yet")
    return _compare(f"note {note.note_id}", note.note_id, text=note.text == args.text)


@_refusal_is_unverified
async def read_back_event(ctx: ToolContext, args: CreateCalendarEventArgs, output: Mapping[str, Any]) -> Evidence:
    created = _created(output, _EventCreated)
    path = f"/calendars/{args.calendar_id}/events/{created.event_id}"
    event = await _fetch(ctx, path, _EventCreated, f"event {created.event_id}")
    return _compare(
        f"event {event.event_id}",
        event.event_id,
        calendar=event.calendar_id == args.calendar_id,
        title=event.title == args.title,
        start=event.start == args.start,  # aware datetimes compare as instants
        end=event.end == args.end,
        attendees=set(event.attendees) == set(args.attendees or ()),
    )


@_refusal_is_unverified
async def read_back_refund(ctx: ToolContext, args: RefundOrderArgs, output: Mapping[str, Any]) -> Evidence:
    created = _created(output, _RefundCreated)
    refunds = await _fetch(ctx, f"/orders/{args.order_id}/refunds", _OrderRefunds, f"order {args.order_id}")
    refund = next((r for r in refunds.refunds if r.refund_id == created.refund_id), None)
    if refund is None:
        raise EvidenceNotYetVisible(f"refund {created.refund_id} is not on order {args.order_id} yet")
    return _compare(
        f"refund {refund.refund_id}",
        refund.refund_id,
        amount=refund.amount_cents == args.amount_cents,
        reason=refund.reason == args.reason,
    )


# --- Registration -----------------------------------------------------------------------------------------

_SIDE_EFFECTING: Literal["side_effecting"] = "side_effecting"


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_tool_specs() -> list[ToolSpec]:
    return [
        ToolSpec(
            name="append_ticket_note",
            description=(
                "Append a note to one of the current user's support tickets. Needs the ticket's current "
                "version (read it with get_ticket). Runs only after a person approves it."
            ),
            arguments=AppendTicketNoteArgs,
            effect=_SIDE_EFFECTING,
            execute=append_ticket_note,
            summarize=lambda a: f"append_ticket_note {a.ticket_id}",
            status=functools.partial(operation_status, result=_NoteAppended),
            read_back=read_back_note,
        ),
        ToolSpec(
            name="create_calendar_event",
            description=(
                "Create a one-off event (no recurrence) in one of the current user's calendars, at most "
                "8 hours long. Runs only after a person approves it."
            ),
            arguments=CreateCalendarEventArgs,
            effect=_SIDE_EFFECTING,
            execute=create_calendar_event,
            summarize=lambda a: f"create_calendar_event {a.calendar_id} {_utc(a.start)}",
            status=functools.partial(operation_status, result=_EventCreated),
            read_back=read_back_event,
        ),
        ToolSpec(
            name="refund_order",
            description=(
                "Refund part or all of one of the current user's orders; amountCents must be given and at "
                "most what is still refundable. Runs only after a person approves it."
            ),
            arguments=RefundOrderArgs,
            effect=_SIDE_EFFECTING,
            execute=refund_order,
            summarize=lambda a: f"refund_order {a.order_id} {a.amount_cents}",
            status=functools.partial(operation_status, result=_RefundCreated),
            read_back=read_back_refund,
        ),
    ]
