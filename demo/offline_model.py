"""Pure: the offline demo model - a deterministic stand-in for an LLM that understands a few demo requests.

It reads the latest user message, asks for the matching read-only tools in its first turn, and in its
second turn answers from the `function_call_output` items it received and from nothing else. It never
calls tools twice for one request, so it cannot loop. Every text it writes starts with "[offline model] ".

Two write requests show the write protocol; a write request wins over any read in the same message:
- a ticket note: get_ticket, then append_ticket_note with the version it read, then the answer;
- a refund: refund_order (only with an explicit amount, never a default), then the answer.
The answer to a write is worded from the write's output alone: "done" only when it says verified, unknown
stays unknown (and is not retried), and a refusal says it was not done and why. At most two call turns.

A request for an action it has no tool for ("cancel my order A100", "please delete ticket T1001") is refused
as a whole, naming the action, with no tool call, even when other parts of the message could be served.

A write the message asks NOT to be done ("Please do not refund 5 EUR on order A100", "I don't want you to refund
...") is never proposed: the answer says it will not be done, and only the rest of the message, if any, is served.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from toolloop import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ModelRequest,
    OtherItem,
)

OFFLINE_LABEL = "offline"
PREFIX = "[offline model] "
DEFAULT_DATE = date(2026, 12, 1)

HELP_TEXT = (
    "I am the offline demo model, not a language model. I understand: the status of an order "
    '("Where is my order A100?"), a list of your orders ("list my orders"), a ticket ("ticket T1001") and '
    'free calendar time ("free slots on cal-u1 on 2026-12-01"). With your approval I can also add a note '
    '("Add a note to ticket T1001: called the customer") and refund an order '
    '("Refund 5.00 EUR on order A100 because it arrived broken").'
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

# Writes. A note's text follows the first ":" or "saying"; what comes before it (the head) names the ticket.
_NOTE_TEXT_START = re.compile(r":|\bsaying\b\s*:?", re.IGNORECASE)
_NOTE_VERB = re.compile(r"\b(?:add|append|write|leave|put|post|attach)\b.*?\bnotes?\b", re.IGNORECASE)
_NOTE_WORD = re.compile(r"\bnotes?\b", re.IGNORECASE)
# "refund" as a request: at a sentence start or after please / you / to ("could you refund", "want to refund").
_REFUND = re.compile(r"(?:^|[.!?;:]\s*|\b(?:please|you|to)\s+)(?P<verb>refund)\b", re.IGNORECASE)
# "refund" as a verb anywhere ("do not refund"), not the noun after a determiner ("I did not get a refund").
_REFUND_VERB = re.compile(
    r"(?P<det>\b(?:a|an|the|any|my|your|this|that|its|his|her|their|our|another|one|each|every|some|full|partial)"
    r"\s+)?\brefund\b",
    re.IGNORECASE,
)
# Before a write's verb in its clause: the user asks for it NOT to be done ("please do not refund", "I don't want
# you to refund", "never add a note").
_NEGATION_WORDS = r"not|never|no|without|nor"
_NEGATION = re.compile(rf"\b(?:{_NEGATION_WORDS})\b|n't\b", re.IGNORECASE)
# Ids that are amounts, not orders ("EUR5").
_AMOUNT_ID = re.compile(r"^(?:EUR|CTS?|CENTS?)\d", re.IGNORECASE)
_BECAUSE = re.compile(r"\bbecause\b", re.IGNORECASE)
_ORDER = re.compile(r"\border\s*#?\s*([A-Za-z]{1,3}-?\d+)\b", re.IGNORECASE)
_CENTS = re.compile(r"(?<![\d.,])(\d{1,15})\s*(?:cents?|ct)\b", re.IGNORECASE)
_DECIMAL = r"(\d{1,13}(?:[.,]\d{1,2})?)(?![\d.,]*\d)"
_EUROS = re.compile(rf"(?:€|\bEUR\b)\s*{_DECIMAL}|(?<![\d.,]){_DECIMAL}\s*(?:€|\bEUR\b|\beuros?\b)", re.IGNORECASE)
_QUOTED = re.compile(r"^([\"'“‘`])(.*)([\"'”’`])[.!]?$", re.DOTALL)
_QUOTE_PAIRS = {'"': '"', "'": "'", "“": "”", "‘": "’", "`": "`"}
DEFAULT_REFUND_REASON = "requested by customer"
NOTE_TOOL = "append_ticket_note"
REFUND_TOOL = "refund_order"
NOTE_EXAMPLE = '"Add a note to ticket T1001: called the customer"'
REFUND_EXAMPLE = '"Refund 5.00 EUR on order A100 because it arrived broken" or "refund 500 cents for order A100"'


@dataclass(frozen=True)
class _NoteRequest:
    ticket: str
    text: str


@dataclass(frozen=True)
class _RefundRequest:
    order: str
    cents: int
    reason: str


# A parsed write request, or the question to ask back when it lacks something (no call is made then).
_WriteRequest = _NoteRequest | _RefundRequest | str


class OfflineDemoModel:
    """A model adapter (toolloop.ModelAdapter) registered by the demo as "offline". `answer` is a pure
    function of the conversation and the actor: same input, same output."""

    needs_conversation = True
    # A canned model for demos and tests: a worker serves it only when its configuration allows scripted models.
    scripted = True

    def label(self, model_name: str | None) -> str:
        return OFFLINE_LABEL

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        return self.answer(request.conversation, request.actor.user_id)

    def answer(self, conversation: Sequence[ConversationItem], actor_user: str) -> list[ConversationItem]:
        found = _latest_user_message(conversation)
        if found is None:
            return [_say(HELP_TEXT)]
        start, request = found
        since = conversation[start + 1 :]
        calls = [item for item in since if isinstance(item, FunctionCallItem)]
        outputs = {item.call_id: item.output for item in since if isinstance(item, FunctionCallOutputItem)}
        turn = _model_turns(conversation) + 1
        text = request.text()
        refusal = _refusal(text)
        if refusal is not None:
            return [_say(refusal)]
        write = _write_request(text)
        if write is not None:
            return _write_turn(write, calls, outputs, turn)
        declined = _declined(text)
        if declined is not None:
            return _declined_turn(*declined, text, actor_user, calls, outputs, turn)
        if calls:
            # Second turn for this request: always answer, whatever arrived, so the loop ends here.
            return [_say(_compose(calls, outputs))]
        return _plan(request.text(), actor_user, turn=turn)


def _declined_turn(
    sentence: str,
    rest: str,
    text: str,
    actor_user: str,
    calls: list[FunctionCallItem],
    outputs: dict[str, str],
    turn: int,
) -> list[ConversationItem]:
    """A message that asks for a write NOT to be done proposes none: it says so, and serves the reads the rest of
    the message asks for ("I don't want you to refund order A100, where is it?")."""
    if calls:
        return [_say(f"{sentence} {_compose(calls, outputs)}")]
    if re.search(r"\w", rest) is None:
        return [_say(sentence)]
    planned = _plan(text, actor_user, turn=turn)
    return planned if all(isinstance(item, FunctionCallItem) for item in planned) else [_say(sentence)]


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
    return _calls(wanted, turn)


def _calls(wanted: list[tuple[str, dict[str, Any]]], turn: int) -> list[ConversationItem]:
    return [
        FunctionCallItem(call_id=f"call_{turn}_{index}", name=name, arguments=json.dumps(args, separators=(",", ":")))
        for index, (name, args) in enumerate(wanted, start=1)
    ]


# --- requests it has no tool for: refused whole, before any call ---------------------------------------

CAN_TEXT = (
    "I can look up the status of an order, list your orders, show a ticket and find free calendar time, and with "
    "your approval add a note to a ticket or refund an amount on an order."
)
# Verbs that are (almost) never nouns: a request wherever they stand in a request position.
_ACTION_VERBS = (
    r"cancel|delete|remove|modify|reschedule|reopen|postpone|rebook|re-?order|erase|withdraw|escalate|reassign"
    r"|unassign|unsubscribe|undo|revoke|void|resend|rename|resolve|pay|buy"
)
# Verbs that are nouns too ("update on order A100?", "return status"): a request only when an object follows.
_OBJECT_VERBS = (
    r"change|update|edit|amend|close|return|exchange|replace|move|ship|book|schedule|add|create|set|mark|place"
    r"|purchase|approve|reject|decline|accept|transfer|split|merge|upgrade|downgrade|renew|submit|switch|assign"
    r"|archive|delay"
)
# What an action applies to, by the start of the word, and how the refusal names it.
_THINGS = {
    "order": "orders",
    "ticket": "tickets",
    "note": "notes",
    "refund": "refunds",
    "meeting": "meetings",
    "event": "events",
    "appointment": "appointments",
    "booking": "bookings",
    "reservation": "reservations",
    "calendar": "calendar events",
    "cal-": "calendar events",
    "slot": "calendar slots",
    "payment": "payments",
    "subscription": "subscriptions",
    "account": "accounts",
    "address": "addresses",
    "shipping": "shipping",
    "deliver": "deliveries",
    "item": "items",
    "product": "products",
    "invoice": "invoices",
}
_THING_WORD = (
    r"(?:(?:orders?|tickets?|notes?|refunds?|meetings?|events?|appointments?|bookings?|reservations?|calendars?"
    r"|slots?|payments?|subscriptions?|accounts?|address(?:es)?|shipping|deliver(?:y|ies)|items?|products?"
    r"|invoices?)\b|cal-[A-Za-z0-9_-]+)"
)
_THING = re.compile(rf"(?<![-\w]){_THING_WORD}", re.IGNORECASE)
_ID_WORD = r"#?[A-Za-z]{1,3}-?\d+\b"
_OBJECT_AFTER = (
    r"\s+(?:(?:my|the|this|that|these|those|it|them|our|your|his|her|their|all|both|every|each|a|an|another|some"
    rf"|one|two|three)\b|{_THING_WORD}|{_ID_WORD})"
)
_NEW_ORDER_AFTER = r"\s+(?:a|an|another|some|more|new|something|one|two|three|again|the\s+same)\b"
_VERB = rf"\b(?P<verb>(?:{_ACTION_VERBS})\b|(?:{_OBJECT_VERBS})(?={_OBJECT_AFTER})|order(?={_NEW_ORDER_AFTER}))"
_POLITE = r"(?:(?:please|pls|plz|kindly|just|also|now|then|first|quickly|simply|go\s+ahead\s+and)\s+)*"
_CLAUSE_START = r"(?:^|[.!?;:,(]|\b(?:and|then|also|but|or|so|now|first|next|finally|plus|instead)\b)\s*"
# Request positions: a command ("cancel ...", "... and cancel ...", "please cancel ..."), a question to the model
# ("can you cancel ..."), a question about doing it ("can I cancel ...", "how do I cancel ..."), a wish ("I want to
# cancel ...", "help me cancel ...") or a wish for a result ("I want my order A100 cancelled").
_COMMAND = re.compile(rf"(?:{_CLAUSE_START}|\b(?:please|pls|plz|kindly)\s+){_POLITE}{_VERB}", re.IGNORECASE)
_ASK_YOU = re.compile(rf"\b(?:can|could|would|will)\s+(?:you|u)\s+{_POLITE}{_VERB}", re.IGNORECASE)
_ASK_I = re.compile(rf"\b(?:can|could|may|might|should|shall|do|must)\s+(?:i|we)\s+{_POLITE}{_VERB}", re.IGNORECASE)
_WISH = re.compile(
    r"\b(?:(?:want|like|love|need|wish|try|trying|hoping|hope|planning|plan|ready|able|allowed|possible|how|way"
    rf"|you|me|us)\s+to|wanna|help\s+me|let\s+me|let's|lets|let\s+us)\s+{_POLITE}{_VERB}",
    re.IGNORECASE,
)
_DONE = {
    "cancelled": "cancel",
    "canceled": "cancel",
    "deleted": "delete",
    "removed": "remove",
    "changed": "change",
    "modified": "modify",
    "updated": "update",
    "edited": "edit",
    "closed": "close",
    "reopened": "reopen",
    "returned": "return",
    "exchanged": "exchange",
    "replaced": "replace",
    "rescheduled": "reschedule",
    "moved": "move",
    "postponed": "postpone",
    "resolved": "resolve",
    "escalated": "escalate",
}
_WISH_DONE = re.compile(
    r"\b(?:want|wanna|need|like)\s+(?:(?:my|the|this|that|these|those|it|them|our|both|all|and|on|in|of|for"
    rf"|{_THING_WORD}|{_ID_WORD})\s+){{1,6}}(?P<verb>{'|'.join(_DONE)})\b",
    re.IGNORECASE,
)
# A clause ends at a sentence mark, a ":" or "," before a space (not "10:00" or "1,000"), or "and" / "but" / "then".
_CLAUSE_END = re.compile(r"[!?;]|[.:,](?=\s|$)|\b(?:and|but|then)\b", re.IGNORECASE)
# Before the verb in its clause: a negation or someone else's wish is not a request ("I don't want to cancel",
# "the customer wants to return it"); a question word makes "will you ship" a question ("when will you ship?").
_NOT_ASKED = re.compile(rf"\b(?:{_NEGATION_WORDS}|customer|client|he|she|they|someone|somebody)\b|n't\b", re.I)
_QUESTION_WORD = re.compile(r"\b(?:when|why|where|whether|what|which|who)\b", re.IGNORECASE)
# In a write request only commands count: its wording ("the customer wants to cancel") is not one.
_REQUEST_FORMS = ((_COMMAND, False), (_ASK_YOU, True), (_ASK_I, False), (_WISH, False), (_WISH_DONE, False))
_WRITE_FORMS = ((_COMMAND, False), (_ASK_YOU, True))


def _refusal(text: str) -> str | None:
    """What the message asks for that no tool can do, as the whole answer; None when it asks for nothing like that.

    A recognised write is judged by its instruction alone (a note's text and a refund's reason are not requests).
    """
    text = text.replace("\u2019", "'")
    write = _write_kind(text)
    actions = _unsupported(text, _REQUEST_FORMS) if write is None else _unsupported(write[1], _WRITE_FORMS)
    if not actions:
        return None
    return f"I can't {_either(actions)}, so I did nothing with this request. {CAN_TEXT}"


def _unsupported(text: str, forms: tuple[tuple[re.Pattern[str], bool], ...]) -> list[str]:
    found: dict[int, str] = {}
    for pattern, question_ends_it in forms:
        for match in pattern.finditer(text):
            start, end = match.span("verb")
            before = text[_clause_start(text, start) : start]
            if _NOT_ASKED.search(before) or (question_ends_it and _QUESTION_WORD.search(before)):
                continue
            word = match.group("verb").lower()
            verb = _DONE.get(word, word)
            if word in _DONE:  # "I want my order A100 cancelled": the object stands between the wish and the verb
                thing = _object_of(match.group(0), text[: match.start()])
            else:
                stop = _CLAUSE_END.search(text, end)
                thing = _object_of(text[end : stop.start() if stop else len(text)], text[:start])
            if verb == "add" and thing == "notes":
                continue  # a note request, worded differently from the ones it understands: not a refusal
            found.setdefault(start, _action(verb, thing))
    return _unique(found[start] for start in sorted(found))


def _clause_start(text: str, at: int) -> int:
    """Where the clause that holds position `at` starts."""
    ends = [m.end() for m in _CLAUSE_END.finditer(text, 0, at)]
    return ends[-1] if ends else 0


def _negated(text: str, at: int) -> bool:
    """Whether the verb at `at` is asked NOT to be done: a negation stands before it in its clause."""
    return _NEGATION.search(text, _clause_start(text, at), at) is not None


def _object_of(after: str, before: str) -> str | None:
    """What a verb applies to: named in its clause after it, else the last thing named before it, else an id."""
    named = _THING.search(after) or next(reversed(list(_THING.finditer(before))), None)
    if named is not None:
        word = named.group(0).lower()
        return next((plural for stem, plural in _THINGS.items() if word.startswith(stem)), word)
    ident = _ID.search(after)
    return ident.group(1).upper() if ident else None


def _action(verb: str, thing: str | None) -> str:
    if verb in ("order", "reorder", "re-order"):
        return "place new orders"
    if verb in ("buy", "purchase"):
        return f"{verb} anything"
    if verb == "pay":
        return f"pay for {thing}" if thing else "make payments"
    if verb in ("set", "mark"):  # "set ticket T1001 to closed"
        verb = "change"
    return f"{verb} {thing or 'that'}"


def _either(actions: list[str]) -> str:
    return actions[0] if len(actions) == 1 else f"{', '.join(actions[:-1])} or {actions[-1]}"


# --- turn 2: the answer, composed only from the outputs ------------------------------------------------


def _compose(calls: list[FunctionCallItem], outputs: dict[str, str]) -> str:
    return " ".join(_sentence(call, outputs) for call in calls)


def _sentence(call: FunctionCallItem, outputs: dict[str, str]) -> str:
    args = _json_object(call.arguments) or {}
    raw = outputs.get(call.call_id)
    if raw is None:
        return f"No result arrived for {_describe(call.name, args)}."
    result = _json_object(raw)
    if result is None:
        return f"The result for {_describe(call.name, args)} could not be read."
    if result.get("ok") is False:
        return _failure(call.name, args, result)
    return _RENDERERS.get(call.name, _render_generic)(args, result)


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


# --- writes: parsing the request ------------------------------------------------------------------------


def _write_request(text: str) -> _WriteRequest | None:
    """The write this message asks for, if any; when both kinds are named, the one named first wins."""
    found = _write_kind(text)
    if found is None:
        return None
    kind, head, body = found
    return _note_request(head, body) if kind == "note" else _refund_request(text)


def _write_kind(text: str) -> tuple[str, str, str | None] | None:
    """("note", head, note text) or ("refund", text before "because", None): which write the message names."""
    text = text.replace("\u2019", "'")
    marker = _NOTE_TEXT_START.search(text)
    head = text[: marker.start()] if marker else text
    note = _NOTE_VERB.search(head)
    if note is None and marker is not None and marker.group(0).lower().startswith("saying"):
        note = _NOTE_WORD.search(head)  # "note on ticket T1001 saying ..."
    if note is not None and _negated(head, note.start()):
        note = None  # "don't add a note ...": not asked for (see _declined)
    refund = next((m for m in _REFUND.finditer(text) if not _negated(text, m.start("verb"))), None)
    if note is not None and (refund is None or note.start() <= refund.start()):
        return "note", head, text[marker.end() :] if marker else None
    if refund is not None:
        because = _BECAUSE.search(text)
        return "refund", text[: because.start()] if because else text, None
    return None


def _note_request(head: str, body: str | None) -> _WriteRequest:
    tickets = _unique(m.upper() for m in _TICKET.findall(head))
    if not tickets:
        return f"Which ticket should the note go on? Please write it like {NOTE_EXAMPLE}."
    if len(tickets) > 1:
        return f"I add a note to one ticket at a time; please name just one of {', '.join(tickets)}."
    text = _unquote(body.lstrip(":") if body else "")
    if not text:
        return f"What should the note on ticket {tickets[0]} say? Please write it like {NOTE_EXAMPLE}."
    return _NoteRequest(ticket=tickets[0], text=text)


def _refund_request(text: str) -> _WriteRequest:
    because = _BECAUSE.search(text)
    head = text[: because.start()] if because else text
    reason = _unquote(text[because.end() :]).rstrip(".!").strip() if because else ""
    orders = _order_ids(head)
    if not orders:
        return f"Which order should I refund? Please write it like {REFUND_EXAMPLE}."
    if len(orders) > 1:
        return f"I refund one order at a time; please name just one of {', '.join(orders)}."
    amounts = _unique([str(int(c)) for c in _CENTS.findall(head)] + [str(_euro_cents(e)) for e in _euros(head)])
    if not amounts:
        return (
            f"How much should I refund on order {orders[0]}? I never refund the full amount by default; "
            f"please give the amount, like {REFUND_EXAMPLE}."
        )
    if len(amounts) > 1:
        return f"I found more than one amount ({', '.join(a + ' cents' for a in amounts)}); please give just one."
    cents = int(amounts[0])
    if cents < 1:
        return f"A refund must be more than zero; how much should I refund on order {orders[0]}?"
    return _RefundRequest(order=orders[0], cents=cents, reason=reason or DEFAULT_REFUND_REASON)


def _order_ids(text: str) -> list[str]:
    """The order ids a refund request names, wherever they stand ("refund everything on A100"), except tickets."""
    tickets = set(_unique(m.upper() for m in _TICKET.findall(text)))
    ids = _unique(m.upper() for m in _ID.findall(text))
    return [i for i in ids if i not in tickets and not _AMOUNT_ID.match(i)]


def _declined(text: str) -> tuple[str, str] | None:
    """A write the message asks not to be done, when it asks for no write: the sentence saying it will not be
    done, and the rest of the message (without that clause)."""
    text = text.replace("\u2019", "'")
    for match in _REFUND_VERB.finditer(text):
        if match.group("det") is None and _negated(text, match.start()):
            start, end = _clause_span(text, match.start())
            orders = _order_ids(text[start:end])
            where = f" on order {orders[0]}" if len(orders) == 1 else ""
            sentence = f"As you asked, I will not refund anything{where}: I made no refund and proposed none."
            return sentence, text[:start] + text[end:]
    note = _NOTE_VERB.search(text)
    if note is not None and _negated(text, note.start()):
        # The rest of the message is the note's ticket and text, part of what was declined.
        start = _clause_start(text, note.start())
        tickets = _unique(m.upper() for m in _TICKET.findall(text[start:]))
        where = f" to ticket {tickets[0]}" if tickets else ""
        sentence = f"As you asked, I will not add a note{where}: I added none and proposed none."
        return sentence, text[:start]
    return None


def _clause_span(text: str, at: int) -> tuple[int, int]:
    stop = _CLAUSE_END.search(text, at)
    return _clause_start(text, at), stop.start() if stop else len(text)


def _euros(text: str) -> list[str]:
    return [before or after for before, after in _EUROS.findall(text)]


def _euro_cents(amount: str) -> int:
    return int(Decimal(amount.replace(",", ".")) * 100)


def _unquote(text: str) -> str:
    text = text.strip()
    quoted = _QUOTED.match(text)
    if quoted and _QUOTE_PAIRS[quoted.group(1)] == quoted.group(3):
        text = quoted.group(2).strip()
    return text


# --- writes: the turns and the answer --------------------------------------------------------------------


@dataclass(frozen=True)
class _WriteWords:
    """How one kind of write is reported; every sentence is chosen by the write output alone."""

    done: str  # after a verified read-back
    unverified: str  # the service says done, the read-back could not confirm it
    unknown: str  # nobody knows whether it happened
    not_done: str  # "The note was not added" / "The refund ... was not made"
    thing: str  # what a version conflict is about
    service: str


def _note_words(request: _NoteRequest) -> _WriteWords:
    ticket = _v(request.ticket)
    return _WriteWords(
        done=f"I added the note to ticket {ticket} (verified by reading the ticket back).",
        unverified=(
            f"The ticket service reported the note on ticket {ticket} as added, but I could not confirm it by"
            " reading the ticket back{op}. I did not repeat it."
        ),
        unknown=f"I could not establish whether the note was added to ticket {ticket}{{op}}. I did not retry it.",
        not_done="The note was not added",
        thing=f"ticket {ticket}",
        service="the ticket service",
    )


def _refund_words(request: _RefundRequest) -> _WriteWords:
    what = f"{request.cents} cents on order {_v(request.order)}"
    return _WriteWords(
        done=f"I refunded {what} (verified by reading the order's refunds back).",
        unverified=(
            f"The order service reported the refund of {what} as made, but I could not confirm it by"
            " reading the order's refunds back{op}. I did not repeat it."
        ),
        unknown=f"I could not establish whether the refund of {what} was made{{op}}. I did not retry it.",
        not_done="The refund was not made",
        thing=f"order {_v(request.order)}",
        service="the order service",
    )


def _write_turn(
    request: _WriteRequest, calls: list[FunctionCallItem], outputs: dict[str, str], turn: int
) -> list[ConversationItem]:
    if isinstance(request, str):
        return [_say(request)]
    if isinstance(request, _RefundRequest):
        refund = _last_call(calls, REFUND_TOOL)
        if refund is not None:
            return [_say(_write_answer(refund, outputs, _refund_words(request)))]
        if calls:
            return [_say(_compose(calls, outputs))]
        args = {"orderId": request.order, "amountCents": request.cents, "reason": request.reason}
        return _calls([(REFUND_TOOL, args)], turn)
    append = _last_call(calls, NOTE_TOOL)
    if append is not None:
        return [_say(_write_answer(append, outputs, _note_words(request)))]
    read = _last_call(calls, "get_ticket")
    if read is None:
        if calls:
            return [_say(_compose(calls, outputs))]
        return _calls([("get_ticket", {"ticketId": request.ticket})], turn)
    # Second turn: write only on a readable ticket, with the version just read.
    raw = outputs.get(read.call_id)
    result = _json_object(raw) if raw is not None else None
    if result is None or result.get("ok") is not True:
        return [_say(f"{_sentence(read, outputs)} I did not add the note.")]
    version = _nested(result, "ticket").get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return [_say(f"I could not read the version of ticket {_v(request.ticket)}, so I did not add the note.")]
    args = {"ticketId": request.ticket, "text": request.text, "expectedVersion": version}
    return _calls([(NOTE_TOOL, args)], turn)


def _write_answer(call: FunctionCallItem, outputs: dict[str, str], words: _WriteWords) -> str:
    raw = outputs.get(call.call_id)
    result = _json_object(raw) if raw is not None else None
    if result is None:
        # No readable answer is no evidence either way: unknown, never "done" and never "not done".
        return words.unknown.replace("{op}", "")
    operation = result.get("operation_id")
    op = f" (operation {_v(operation)})" if isinstance(operation, str) and operation else ""
    if result.get("ok") is True:
        if result.get("state") == "verified" and result.get("verified") is not False:
            return words.done
        return words.unverified.replace("{op}", op)
    code = str(result.get("code", "unknown"))
    if code == "OUTCOME_UNKNOWN" or result.get("ok") is not False:
        return words.unknown.replace("{op}", op)
    if code == "CONFIRMATION_REQUIRED":
        return f"{words.not_done}: it was not approved."
    if code == "REJECTED":
        return f"{words.not_done}: you rejected it."
    return f"{words.not_done}: {_write_refusal(code, result, words)}."


def _write_refusal(code: str, result: dict[str, Any], words: _WriteWords) -> str:
    if code == "VERSION_CONFLICT":
        return f"{words.thing} changed since I read it ({code}); ask again and I will read it afresh"
    if code == "CONFLICT":
        return f"it conflicts with the current state of {words.thing} ({code})"
    if code == "NOT_AVAILABLE":
        return f"{words.thing} is not available to you ({code})"
    if code == "FORBIDDEN":
        return f"I am not allowed to do that ({code})"
    if code == "IDEMPOTENCY_CONFLICT":
        return f"the same operation was already requested with different details ({code})"
    if code == "TEMPORARY_UNAVAILABLE":
        return f"{words.service} was not available ({code}); please try again later"
    if code == "LIMIT_REACHED":
        return f"a limit on tool calls was reached ({code})"
    if code in ("BAD_ARGUMENTS", "BAD_JSON"):
        hint = result.get("message")
        return f"the request was not valid ({code}" + (f": {_v(hint)})" if isinstance(hint, str) and hint else ")")
    return f"{words.service} refused it ({_v(code)})"


def _last_call(calls: list[FunctionCallItem], name: str) -> FunctionCallItem | None:
    found = [call for call in calls if call.name == name]
    return found[-1] if found else None


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
