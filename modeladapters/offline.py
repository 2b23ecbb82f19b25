"""Pure: the offline demo model - a deterministic stand-in for an LLM that understands a few demo requests.

It reads the latest user message, asks for the matching read-only tools in its first turn, and in its
second turn answers from the `function_call_output` items it received and from nothing else. It never
calls tools twice for one request, so it cannot loop. Every text it writes starts with "[offline model] ".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from typing import Any

from agentcore.contracts import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
)

OFFLINE_LABEL = "offline"
PREFIX = "[offline model] "
DEFAULT_DATE = date(2026, 12, 1)

HELP_TEXT = (
    "I am the offline demo model, not a language model. I understand: the status of an order "
    '("Where is my order A100?"), a list of your orders ("list my orders"), a ticket ("ticket T1001") and '
    'free calendar time ("free slots on cal-u1 on 2026-12-01").'
)

# Values copied from tool outputs are cut so one huge field cannot swamp the answer.
_MAX_VALUE_CHARS = 200

_TICKET = re.compile(r"\btickets?\s*#?\s*([A-Za-z]{1,3}-?\d+)\b", re.IGNORECASE)
# Not after "-" or a word character, so "cal-u1" is never read as an order id.
_ID = re.compile(r"(?<![-\w])([A-Za-z]{1,3}-?\d+)\b")
_LIST_ORDERS = re.compile(r"\b(?:my|list|show|all)\s+(?:my\s+)?orders\b", re.IGNORECASE)
_FREE = re.compile(r"\bfree\s+(?:slots?|time)\b|\bwhen\s+am\s+i\s+free\b", re.IGNORECASE)
_CALENDAR = re.compile(r"\b(cal-[A-Za-z0-9_-]+)")
_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


class OfflineDemoModel:
    """`respond` is a pure function of the conversation and the actor: same input, same output."""

    label = OFFLINE_LABEL

    def respond(self, conversation: Sequence[ConversationItem], actor_user: str) -> list[ConversationItem]:
        found = _latest_user_message(conversation)
        if found is None:
            return [_say(HELP_TEXT)]
        start, request = found
        since = conversation[start + 1 :]
        calls = [item for item in since if isinstance(item, FunctionCallItem)]
        if calls:
            # Second turn for this request: always answer, whatever arrived, so the loop ends here.
            outputs = {item.call_id: item.output for item in since if isinstance(item, FunctionCallOutputItem)}
            return [_say(_compose(calls, outputs))]
        return _plan(request.text(), actor_user, turn=_model_turns(conversation) + 1)


# --- turn 1: which tools to call ---------------------------------------------------------------------


def _plan(text: str, actor_user: str, turn: int) -> list[ConversationItem]:
    wanted: list[tuple[str, dict[str, Any]]] = []
    tickets = _unique(m.upper() for m in _TICKET.findall(text))
    lowered = text.lower()
    if "order" in lowered:
        orders = [i for i in _unique(m.upper() for m in _ID.findall(text)) if i not in tickets]
        wanted += [("get_order_status", {"orderId": order}) for order in orders]
        if not orders and _LIST_ORDERS.search(text):
            wanted.append(("list_my_orders", {"page": None, "pageSize": None}))
    wanted += [("get_ticket", {"ticketId": ticket}) for ticket in tickets]
    if _FREE.search(text):
        calendar = _found(_CALENDAR, text, default=f"cal-{actor_user}")
        day_text = _found(_DATE, text, default=DEFAULT_DATE.isoformat())
        try:
            day = date.fromisoformat(day_text)
        except ValueError:
            return [_say(f"{day_text} is not a date I can read; please write it as YYYY-MM-DD.")]
        span = {"from": f"{day.isoformat()}T00:00:00Z", "to": f"{(day + timedelta(days=1)).isoformat()}T00:00:00Z"}
        wanted.append(("find_free_slots", {"calendarId": calendar, **span}))
    if not wanted:
        return [_say(HELP_TEXT)]
    return [
        FunctionCallItem(call_id=f"call_{turn}_{index}", name=name, arguments=json.dumps(args, separators=(",", ":")))
        for index, (name, args) in enumerate(wanted, start=1)
    ]


# --- turn 2: the answer, composed only from the outputs ------------------------------------------------


def _compose(calls: list[FunctionCallItem], outputs: dict[str, str]) -> str:
    sentences = []
    for call in calls:
        args = _json_object(call.arguments) or {}
        raw = outputs.get(call.call_id)
        if raw is None:
            sentences.append(f"No result arrived for {_describe(call.name, args)}.")
            continue
        result = _json_object(raw)
        if result is None:
            sentences.append(f"The result for {_describe(call.name, args)} could not be read.")
        elif result.get("ok") is False:
            sentences.append(_failure(call.name, args, result))
        else:
            sentences.append(_RENDERERS.get(call.name, _render_generic)(args, result))
    return " ".join(sentences)


_SERVICE = {
    "get_order_status": "the order service",
    "list_my_orders": "the order service",
    "get_ticket": "the ticket service",
    "find_free_slots": "the calendar service",
}


def _describe(tool: str, args: dict[str, Any]) -> str:
    if tool == "get_order_status":
        return f"order {_v(args.get('orderId'))}"
    if tool == "list_my_orders":
        return "your orders"
    if tool == "get_ticket":
        return f"ticket {_v(args.get('ticketId'))}"
    if tool == "find_free_slots":
        return f"free slots on {_v(args.get('calendarId'))}"
    return f"the {tool} call"


def _failure(tool: str, args: dict[str, Any], result: dict[str, Any]) -> str:
    code = str(result.get("code", "unknown"))
    what = _describe(tool, args)
    if code == "NOT_AVAILABLE":
        if tool == "list_my_orders":
            return "Your orders are not available to me."
        # "available to you": the service gives the same answer for missing and for not-yours.
        return f"I can't find {_thing(tool, args)} that is available to you."
    if code == "TEMPORARY_UNAVAILABLE":
        return f"I could not get {what}: {_SERVICE.get(tool, 'the service')} did not answer. Please try again later."
    if code == "FORBIDDEN":
        return f"I am not allowed to look at {what}."
    if code in ("BAD_ARGUMENTS", "BAD_JSON"):
        hint = result.get("message")
        return f"My request for {what} was not valid" + (f" ({_v(hint)})." if isinstance(hint, str) and hint else ".")
    if code == "LIMIT_REACHED":
        return f"I did not get {what}: a limit on tool calls was reached."
    if code == "UNKNOWN_TOOL":
        return f"The tool {tool} is not available, so I have nothing on {what}."
    if code == "OUTCOME_UNKNOWN":
        return f"It is unknown what happened with {what}."
    return f"The request for {what} failed ({_v(code)})."


def _render_order(args: dict[str, Any], result: dict[str, Any]) -> str:
    order = _nested(result, "order")
    order_id = _first(order, "order_id", "orderId", "id") or args.get("orderId")
    facts = _facts(
        order,
        ("status", "status"),
        ("carrier", "carrier"),
        ("tracking", "trackingNumber", "tracking_number", "trackingId", "tracking"),
        ("shipped at", "shipped_at", "shippedAt"),
        ("delivered at", "delivered_at", "deliveredAt"),
    )
    return f"Order {_v(order_id)}: {facts}." if facts else _render_generic(args, result, f"Order {_v(order_id)}")


def _render_orders(args: dict[str, Any], result: dict[str, Any]) -> str:
    orders = _first(result, "orders", "items")
    if not isinstance(orders, list):
        return _render_generic(args, result, "Your orders")
    entries = []
    for order in orders:
        if isinstance(order, dict):
            order_id, status = _first(order, "order_id", "orderId", "id"), order.get("status")
            entries.append(f"{_v(order_id)} ({_v(status)})" if status is not None else _v(order_id))
    count = len(orders)
    text = f"You have {count} order{'s' if count != 1 else ''} on this page"
    text += f": {', '.join(entries)}." if entries else "."
    total = _first(result, "total", "totalCount", "total_count")
    if isinstance(total, int) and not isinstance(total, bool):
        text += f" {total} in total."
    more = _first(result, "hasMore", "has_more")
    if more is None and any(k in result for k in ("nextPage", "next_page")):
        more = _first(result, "nextPage", "next_page") is not None
    if more is True:
        text += " There are more orders on the next page."
    elif more is False:
        text += " There are no more orders."
    return text


def _render_ticket(args: dict[str, Any], result: dict[str, Any]) -> str:
    ticket = _nested(result, "ticket")
    ticket_id = _first(ticket, "ticket_id", "ticketId", "id") or args.get("ticketId")
    parts = []
    if ticket.get("subject") is not None:
        parts.append(f'"{_v(ticket["subject"])}"')
    if ticket.get("status") is not None:
        parts.append(f"status {_v(ticket['status'])}")
    notes = ticket.get("notes")
    if isinstance(notes, list):
        parts.append(f"{len(notes)} note{'s' if len(notes) != 1 else ''}")
    return (
        f"Ticket {_v(ticket_id)}: {', '.join(parts)}."
        if parts
        else _render_generic(args, result, f"Ticket {_v(ticket_id)}")
    )


def _render_slots(args: dict[str, Any], result: dict[str, Any]) -> str:
    slots = _first(result, "slots", "freeSlots", "free")
    where = _v(_first(result, "calendar_id", "calendarId") or args.get("calendarId"))
    span = f"between {_v(_first(result, 'from') or args.get('from'))} and {_v(_first(result, 'to') or args.get('to'))}"
    if not isinstance(slots, list):
        return _render_generic(args, result, f"Free slots on {where}")
    if not slots:
        return f"There are no free slots on {where} {span}."
    shown = []
    for slot in slots:
        if isinstance(slot, dict):
            start, end = _first(slot, "start", "from"), _first(slot, "end", "to")
            shown.append(f"{_v(start)} to {_v(end)}")
        else:
            shown.append(_v(slot))
    # Say so when the service cut the list: "these are all" would be a claim the output does not make.
    more = " The list was cut short; there may be more." if result.get("truncated") is True else ""
    return f"Free slots on {where} {span}: {'; '.join(shown)}.{more}"


def _render_generic(args: dict[str, Any], result: dict[str, Any], title: str | None = None) -> str:
    """Any other result: its plain top-level fields, as given."""
    scalars = [f"{k} {_v(v)}" for k, v in result.items() if k != "ok" and isinstance(v, (str, int, float, bool))]
    head = title or "The result"
    return f"{head}: {', '.join(scalars)}." if scalars else f"{head}: the service answered with no details."


_RENDERERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], str]] = {
    "get_order_status": _render_order,
    "list_my_orders": _render_orders,
    "get_ticket": _render_ticket,
    "find_free_slots": _render_slots,
}


# --- helpers -------------------------------------------------------------------------------------------


def _say(text: str) -> MessageItem:
    return MessageItem(role="assistant", content=[{"type": "output_text", "text": PREFIX + text}])


def _latest_user_message(conversation: Sequence[ConversationItem]) -> tuple[int, MessageItem] | None:
    for index in range(len(conversation) - 1, -1, -1):
        item = conversation[index]
        if isinstance(item, MessageItem) and item.role == "user":
            return index, item
    return None


def _model_turns(conversation: Sequence[ConversationItem]) -> int:
    """How many model turns the conversation holds: runs of model output between inputs."""
    turns, in_turn = 0, False
    for item in conversation:
        is_output = isinstance(item, (FunctionCallItem, OtherItem)) or (
            isinstance(item, MessageItem) and item.role == "assistant"
        )
        if is_output and not in_turn:
            turns += 1
        in_turn = is_output
    return turns


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _nested(result: dict[str, Any], key: str) -> dict[str, Any]:
    inner = result.get(key)
    return inner if isinstance(inner, dict) else result


def _first(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return None


def _facts(data: dict[str, Any], *fields: tuple[str, ...]) -> str:
    found = []
    for label, *keys in fields:
        value = _first(data, *keys)
        if value is not None:
            found.append(f"{label} {_v(value)}")
    return ", ".join(found)


def _v(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


def _thing(tool: str, args: dict[str, Any]) -> str:
    if tool == "get_order_status":
        return f"an order {_v(args.get('orderId'))}"
    if tool == "get_ticket":
        return f"a ticket {_v(args.get('ticketId'))}"
    if tool == "find_free_slots":
        return f"a calendar {_v(args.get('calendarId'))}"
    return f"a result for {_describe(tool, args)}"


def _found(pattern: re.Pattern[str], text: str, default: str) -> str:
    match = pattern.search(text)
    return match.group(1) if match else default


def _unique(values: Any) -> list[str]:
    return list(dict.fromkeys(values))
