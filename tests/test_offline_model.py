"""Tests (pure, plus temp files): the offline demo model's two turns and the script loader's errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from demo.offline_model import CAN_TEXT, OfflineDemoModel
from toolloop._core.contracts import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
    item_to_wire,
    user_message,
)
from toolloop._models.errors import ScriptError
from toolloop._models.script import load_script, parse_script

MODEL = OfflineDemoModel()


def calls_of(items: list[ConversationItem]) -> list[tuple[str, dict[str, Any], str]]:
    result = []
    for item in items:
        assert isinstance(item, FunctionCallItem), item
        result.append((item.name, json.loads(item.arguments), item.call_id))
    return result


def only_text(items: list[ConversationItem]) -> str:
    (item,) = items
    assert isinstance(item, MessageItem) and item.role == "assistant"
    text = item.text()
    assert text.startswith("[offline model] ")
    return text


def answer(request: str, outputs: list[dict[str, Any]], actor: str = "u1") -> str:
    """Turn 1, then turn 2 with one output per call (in call order)."""
    conversation: list[ConversationItem] = [user_message(request)]
    calls = MODEL.answer(conversation, actor)
    conversation += calls
    for call, output in zip(calls, outputs, strict=True):
        assert isinstance(call, FunctionCallItem)
        conversation.append(FunctionCallOutputItem(call_id=call.call_id, output=json.dumps(output)))
    return only_text(MODEL.answer(conversation, actor))


# --- turn 1: the calls ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("Where is my order A100?", [("get_order_status", {"orderId": "A100"})]),
        (
            "Where are my orders A100 and a200?",
            [("get_order_status", {"orderId": "A100"}), ("get_order_status", {"orderId": "A200"})],
        ),
        ("list my orders", [("list_my_orders", {"page": None, "pageSize": None})]),
        ("Show my orders", [("list_my_orders", {"page": None, "pageSize": None})]),
        ("What about ticket T1001?", [("get_ticket", {"ticketId": "T1001"})]),
        (
            "When am I free?",
            [
                (
                    "find_free_slots",
                    {"calendarId": "cal-u1", "from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z"},
                )
            ],
        ),
        (
            "free slots on cal-u2 on 2026-12-31",
            [
                (
                    "find_free_slots",
                    {"calendarId": "cal-u2", "from": "2026-12-31T00:00:00Z", "to": "2027-01-01T00:00:00Z"},
                )
            ],
        ),
    ],
)
def test_turn_one_asks_for_the_right_calls(request_text: str, expected: list[tuple[str, dict[str, Any]]]) -> None:
    calls = calls_of(MODEL.answer([user_message(request_text)], "u1"))

    assert [(name, args) for name, args, _ in calls] == expected
    assert [call_id for _, _, call_id in calls] == [f"call_1_{i}" for i in range(1, len(expected) + 1)]


def test_unknown_request_gets_a_labelled_help_message() -> None:
    text = only_text(MODEL.answer([user_message("Book me a flight to Rome")], "u1"))
    assert "order" in text and "ticket" in text


def test_call_ids_stay_unique_across_requests_in_one_conversation() -> None:
    conversation: list[ConversationItem] = [user_message("Where is my order A100?")]
    first = MODEL.answer(conversation, "u1")
    conversation += first
    conversation.append(FunctionCallOutputItem(call_id="call_1_1", output='{"ok":true,"status":"shipped"}'))
    conversation += MODEL.answer(conversation, "u1")
    conversation.append(user_message("and order A200?"))

    ((name, args, call_id),) = calls_of(MODEL.answer(conversation, "u1"))

    assert (name, args, call_id) == ("get_order_status", {"orderId": "A200"}, "call_3_1")


def test_same_conversation_gives_the_same_output() -> None:
    conversation: list[ConversationItem] = [user_message("orders A1 and A2, ticket T9, free time 2026-12-05")]
    runs = [[item_to_wire(i) for i in MODEL.answer(conversation, "u3")] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


# --- turn 2: the answer, from the outputs only ---------------------------------------------------------


def test_order_answer_uses_the_carrier_from_the_output() -> None:
    text = answer(
        "Where is my order A100?",
        [
            {
                "ok": True,
                "order_id": "A100",
                "status": "shipped",
                "carrier": "ZZ-Carrier",
                "tracking_number": "ZZ123",
                "shipped_at": None,
                "items": [],
            }
        ],
    )
    assert text == "[offline model] Order A100: status shipped, carrier ZZ-Carrier, tracking ZZ123."


def test_order_answer_reads_a_nested_order_too() -> None:
    text = answer("Where is my order A100?", [{"ok": True, "order": {"orderId": "A100", "carrier": "ZZ-Carrier"}}])
    assert text == "[offline model] Order A100: carrier ZZ-Carrier."


def test_order_answer_leaves_out_what_the_output_lacks() -> None:
    text = answer("Where is my order A100?", [{"ok": True, "orderId": "A100", "status": "processing"}])
    assert text == "[offline model] Order A100: status processing."
    assert "carrier" not in text and "tracking" not in text


def test_not_available_gets_the_honest_sentence() -> None:
    text = answer("Where is my order A100?", [{"ok": False, "code": "NOT_AVAILABLE", "message": "no such order"}])
    assert text == "[offline model] I can't find an order A100 that is available to you."


def test_temporary_unavailable_says_the_service_did_not_answer() -> None:
    text = answer("ticket T1001", [{"ok": False, "code": "TEMPORARY_UNAVAILABLE", "message": "try later"}])
    assert "the ticket service did not answer" in text


def test_order_list_answer_has_count_and_more() -> None:
    text = answer(
        "list my orders",
        [
            {
                "ok": True,
                "orders": [{"order_id": "A100", "status": "shipped"}, {"order_id": "A101", "status": "new"}],
                "page": 1,
                "total": 7,
                "has_more": True,
            }
        ],
    )
    assert text == (
        "[offline model] You have 2 orders on this page: A100 (shipped), A101 (new). 7 in total."
        " There are more orders on the next page."
    )


def test_ticket_answer_has_subject_status_and_note_count() -> None:
    text = answer(
        "ticket T1001",
        [
            {
                "ok": True,
                "ticket_id": "T1001",
                "subject": "Broken lid",
                "status": "open",
                "notes": [{"note_id": "n1"}, {"note_id": "n2"}, {"note_id": "n3"}],
            }
        ],
    )
    assert text == '[offline model] Ticket T1001: "Broken lid", status open, 3 notes.'


def test_free_slots_answer_lists_the_slots() -> None:
    text = answer(
        "when am I free",
        [
            {
                "ok": True,
                "calendar_id": "cal-u1",
                "from": "2026-12-01T00:00:00Z",
                "to": "2026-12-02T00:00:00Z",
                "slots": [{"start": "2026-12-01T09:00:00Z", "end": "2026-12-01T10:00:00Z"}],
                "truncated": True,
            }
        ],
    )
    assert text == (
        "[offline model] Free slots on cal-u1 between 2026-12-01T00:00:00Z and 2026-12-02T00:00:00Z:"
        " 2026-12-01T09:00:00Z to 2026-12-01T10:00:00Z. The list was cut short; there may be more."
    )


def test_mixed_results_each_get_a_sentence() -> None:
    text = answer(
        "orders A1 and A2",
        [{"ok": True, "status": "delivered"}, {"ok": False, "code": "FORBIDDEN", "message": "no"}],
    )
    assert text == "[offline model] Order A1: status delivered. I am not allowed to look at order A2."


def test_second_turn_always_answers_even_with_missing_or_fixable_outputs() -> None:
    conversation: list[ConversationItem] = [user_message("orders A1 and A2")]
    conversation += MODEL.answer(conversation, "u1")
    conversation.append(
        FunctionCallOutputItem(
            call_id="call_1_1", output='{"ok":false,"code":"BAD_ARGUMENTS","message":"orderId: too short"}'
        )
    )

    text = only_text(MODEL.answer(conversation, "u1"))

    assert text == (
        "[offline model] My request for order A1 was not valid (orderId: too short). No result arrived for order A2."
    )


def test_no_user_message_gets_help() -> None:
    text = only_text(MODEL.answer([], "u1"))
    assert "order" in text and "ticket" in text


# --- writes: a ticket note (get_ticket, then append_ticket_note, then the answer) -----------------------

TICKET_OUTPUT: dict[str, Any] = {
    "ok": True,
    "ticket_id": "T1001",
    "subject": "Broken lid",
    "status": "open",
    "priority": "normal",
    "created_at": "2026-11-01T10:00:00Z",
    "updated_at": "2026-11-02T10:00:00Z",
    "version": 7,
    "notes": [{"note_id": "n1", "text": "first", "author": "u1", "created_at": "2026-11-01T10:00:00Z"}],
}
NOTE_RESULT = {
    "note_id": "n2",
    "ticket_id": "T1001",
    "text": "called the customer",
    "author": "u1",
    "created_at": "2026-12-01T10:00:00Z",
    "ticket_version": 8,
}


def call_item(call_id: str, name: str, args: dict[str, Any]) -> FunctionCallItem:
    return FunctionCallItem(call_id=call_id, name=name, arguments=json.dumps(args, separators=(",", ":")))


def output_item(call_id: str, output: dict[str, Any]) -> FunctionCallOutputItem:
    return FunctionCallOutputItem(call_id=call_id, output=json.dumps(output))


def note_conversation(
    ticket_output: dict[str, Any], note_output: dict[str, Any] | None = None, request: str | None = None
) -> list[ConversationItem]:
    """A hand-made note conversation up to the ticket output, or to the note output when one is given."""
    conversation: list[ConversationItem] = [
        user_message(request or "Add a note to ticket T1001: called the customer"),
        call_item("call_1_1", "get_ticket", {"ticketId": "T1001"}),
        output_item("call_1_1", ticket_output),
    ]
    if note_output is not None:
        args = {"ticketId": "T1001", "text": "called the customer", "expectedVersion": 7}
        conversation += [call_item("call_2_1", "append_ticket_note", args), output_item("call_2_1", note_output)]
    return conversation


@pytest.mark.parametrize(
    ("request_text", "text"),
    [
        ("Add a note to ticket T1001: called the customer", "called the customer"),
        ('add a note to ticket t1001: "Called the customer."', "Called the customer."),
        ("Please put a note on ticket T1001 saying the lid was replaced", "the lid was replaced"),
        ("note on ticket T1001 saying 'call back on Monday'", "call back on Monday"),
        ("Add a note to ticket T1001: see order A100: it says: ok", "see order A100: it says: ok"),
        ("Where is order A100? Also add a note to ticket T1001: checked", "checked"),
    ],
)
def test_note_turn_one_reads_the_ticket_only(request_text: str, text: str) -> None:
    calls = calls_of(MODEL.answer([user_message(request_text)], "u1"))
    assert calls == [("get_ticket", {"ticketId": "T1001"}, "call_1_1")]

    conversation = note_conversation(TICKET_OUTPUT, request=request_text)
    (append,) = calls_of(MODEL.answer(conversation, "u1"))
    assert append == (
        "append_ticket_note",
        {"ticketId": "T1001", "text": text, "expectedVersion": 7},
        "call_2_1",
    )


def test_note_turn_two_uses_the_version_from_the_ticket_output() -> None:
    conversation = note_conversation({**TICKET_OUTPUT, "version": 42})
    ((name, args, call_id),) = calls_of(MODEL.answer(conversation, "u1"))
    assert (name, args["expectedVersion"], call_id) == ("append_ticket_note", 42, "call_2_1")

    nested = note_conversation({"ok": True, "ticket": {"ticket_id": "T1001", "version": 3}})
    ((_, args, _),) = calls_of(MODEL.answer(nested, "u1"))
    assert args["expectedVersion"] == 3


@pytest.mark.parametrize(
    ("ticket_output", "expected"),
    [
        (
            {"ok": False, "code": "NOT_AVAILABLE", "message": "no such ticket"},
            "I can't find a ticket T1001 that is available to you. I did not add the note.",
        ),
        (
            {"ok": False, "code": "TEMPORARY_UNAVAILABLE", "message": "later"},
            "I could not get ticket T1001: the ticket service did not answer. Please try again later."
            " I did not add the note.",
        ),
        (
            {"ok": True, "ticket_id": "T1001", "notes": []},
            "I could not read the version of ticket T1001, so I did not add the note.",
        ),
        (
            {"ok": True, "ticket_id": "T1001", "version": "7"},
            "I could not read the version of ticket T1001, so I did not add the note.",
        ),
    ],
)
def test_note_is_not_written_when_the_ticket_read_fails(ticket_output: dict[str, Any], expected: str) -> None:
    assert only_text(MODEL.answer(note_conversation(ticket_output), "u1")) == "[offline model] " + expected


def test_note_is_not_written_when_the_ticket_output_is_missing() -> None:
    conversation: list[ConversationItem] = [
        user_message("Add a note to ticket T1001: called the customer"),
        call_item("call_1_1", "get_ticket", {"ticketId": "T1001"}),
    ]
    text = only_text(MODEL.answer(conversation, "u1"))
    assert text == "[offline model] No result arrived for ticket T1001. I did not add the note."


@pytest.mark.parametrize(
    ("note_output", "expected"),
    [
        (
            {"ok": True, "operation_id": "op-1", "state": "verified", "result": NOTE_RESULT},
            "I added the note to ticket T1001 (verified by reading the ticket back).",
        ),
        (
            {
                "ok": True,
                "operation_id": "op-1",
                "state": "completed",
                "verified": False,
                "message": "the service reports it done, but it is not verified: x. Do not repeat it.",
                "result": NOTE_RESULT,
            },
            "The ticket service reported the note on ticket T1001 as added, but I could not confirm it by reading"
            " the ticket back (operation op-1). I did not repeat it.",
        ),
        (
            {"ok": False, "code": "OUTCOME_UNKNOWN", "operation_id": "op-1", "message": "could not establish"},
            "I could not establish whether the note was added to ticket T1001 (operation op-1). I did not retry it.",
        ),
        (
            {"ok": False, "code": "CONFIRMATION_REQUIRED", "operation_id": "op-1", "message": "no approval"},
            "The note was not added: it was not approved.",
        ),
        (
            {"ok": False, "code": "REJECTED", "operation_id": "op-1", "message": "the user rejected it"},
            "The note was not added: you rejected it.",
        ),
        (
            {"ok": False, "code": "VERSION_CONFLICT", "message": "the ticket changed"},
            "The note was not added: ticket T1001 changed since I read it (VERSION_CONFLICT); ask again and I will"
            " read it afresh.",
        ),
        (
            {"ok": False, "code": "BAD_ARGUMENTS", "message": "text: too long"},
            "The note was not added: the request was not valid (BAD_ARGUMENTS: text: too long).",
        ),
        (
            {"ok": False, "code": "FORBIDDEN", "message": "no"},
            "The note was not added: I am not allowed to do that (FORBIDDEN).",
        ),
        (
            {"ok": False, "code": "SOMETHING_NEW", "message": "?"},
            "The note was not added: the ticket service refused it (SOMETHING_NEW).",
        ),
    ],
)
def test_note_answer_follows_the_write_output_only(note_output: dict[str, Any], expected: str) -> None:
    text = only_text(MODEL.answer(note_conversation(TICKET_OUTPUT, note_output), "u1"))
    assert text == "[offline model] " + expected


@pytest.mark.parametrize(
    "note_output",
    [
        # "verified" only counts when the output says so without a contradiction.
        {"ok": True, "operation_id": "op-1", "state": "verified", "verified": False},
        {"ok": True, "operation_id": "op-1", "state": "completed"},
    ],
)
def test_note_without_verification_is_never_reported_done(note_output: dict[str, Any]) -> None:
    text = only_text(MODEL.answer(note_conversation(TICKET_OUTPUT, note_output), "u1"))
    assert "I added" not in text and "could not confirm" in text


def test_note_answer_with_a_missing_or_unreadable_output_is_unknown() -> None:
    conversation = note_conversation(TICKET_OUTPUT, {"ok": True})
    conversation[-1] = FunctionCallOutputItem(call_id="call_2_1", output="not json")
    unreadable = only_text(MODEL.answer(conversation, "u1"))
    missing = only_text(MODEL.answer(conversation[:-1], "u1"))
    expected = "[offline model] I could not establish whether the note was added to ticket T1001. I did not retry it."
    assert unreadable == missing == expected


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("Add a note to ticket T1001", 'What should the note on ticket T1001 say? Please write it like "Add a note'),
        ('Add a note to ticket T1001: ""', "What should the note on ticket T1001 say?"),
        ("Add a note: called the customer", "Which ticket should the note go on?"),
        ("Add a note to ticket T1 and ticket T2: hello", "I add a note to one ticket at a time; please name just one"),
    ],
)
def test_incomplete_note_request_asks_and_calls_nothing(request_text: str, expected: str) -> None:
    assert only_text(MODEL.answer([user_message(request_text)], "u1")).startswith("[offline model] " + expected)


def test_note_reads_stay_reads() -> None:
    calls = calls_of(MODEL.answer([user_message("What is the latest note on ticket T1001?")], "u1"))
    assert calls == [("get_ticket", {"ticketId": "T1001"}, "call_1_1")]
    conversation: list[ConversationItem] = [
        user_message("What is the latest note on ticket T1001?"),
        call_item("call_1_1", "get_ticket", {"ticketId": "T1001"}),
        output_item("call_1_1", TICKET_OUTPUT),
    ]
    assert (
        only_text(MODEL.answer(conversation, "u1"))
        == '[offline model] Ticket T1001: "Broken lid", status open, 1 note.'
    )


def test_note_call_ids_follow_earlier_requests() -> None:
    conversation: list[ConversationItem] = [
        user_message("Where is my order A100?"),
        call_item("call_1_1", "get_order_status", {"orderId": "A100"}),
        output_item("call_1_1", {"ok": True, "status": "shipped"}),
        MessageItem(role="assistant", content=[{"type": "output_text", "text": "[offline model] Order A100."}]),
        user_message("Add a note to ticket T1001: called the customer"),
    ]
    ((_, _, first),) = calls_of(MODEL.answer(conversation, "u1"))
    conversation += [call_item(first, "get_ticket", {"ticketId": "T1001"}), output_item(first, TICKET_OUTPUT)]
    ((_, _, second),) = calls_of(MODEL.answer(conversation, "u1"))
    assert (first, second) == ("call_3_1", "call_4_1")


# --- writes: a refund (refund_order, then the answer) ---------------------------------------------------


@pytest.mark.parametrize(
    ("request_text", "args"),
    [
        (
            "Refund 5.00 EUR on order A100 because the lid was broken.",
            {"orderId": "A100", "amountCents": 500, "reason": "the lid was broken"},
        ),
        ("refund 500 cents for order A100", {"orderId": "A100", "amountCents": 500, "reason": "requested by customer"}),
        (
            "Please refund €5.5 on order a100",
            {"orderId": "A100", "amountCents": 550, "reason": "requested by customer"},
        ),
        (
            "Could you refund 5 EUR for order A100?",
            {"orderId": "A100", "amountCents": 500, "reason": "requested by customer"},
        ),
        (
            "refund 12,34 euros on order A100",
            {"orderId": "A100", "amountCents": 1234, "reason": "requested by customer"},
        ),
        (
            "Refund 1 cent on order A100 because 'order A200 was 3 EUR cheaper'",
            {"orderId": "A100", "amountCents": 1, "reason": "order A200 was 3 EUR cheaper"},
        ),
        (
            "Refund 5 EUR on order A100 and check ticket T1001",
            {"orderId": "A100", "amountCents": 500, "reason": "requested by customer"},
        ),
    ],
)
def test_refund_turn_one_calls_refund_order(request_text: str, args: dict[str, Any]) -> None:
    assert calls_of(MODEL.answer([user_message(request_text)], "u1")) == [("refund_order", args, "call_1_1")]


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("Refund order A100", "How much should I refund on order A100? I never refund the full amount by default"),
        ("Refund order A100 because it was 5 EUR too much", "How much should I refund on order A100?"),
        ("refund 0 cents on order A100", "A refund must be more than zero"),
        ("refund 5 EUR and 700 cents on order A100", "I found more than one amount (700 cents, 500 cents)"),
        ("refund 5 EUR", "Which order should I refund?"),
        ("refund 5 EUR on order A100 and order A200", "I refund one order at a time"),
        ("refund 1,000 EUR on order A100", "How much should I refund on order A100?"),
    ],
)
def test_refund_without_a_clear_amount_or_order_asks_and_calls_nothing(request_text: str, expected: str) -> None:
    assert only_text(MODEL.answer([user_message(request_text)], "u1")).startswith("[offline model] " + expected)


def refund_answer(output: dict[str, Any] | None) -> str:
    conversation: list[ConversationItem] = [
        user_message("Refund 5.00 EUR on order A100 because it arrived broken"),
        call_item("call_1_1", "refund_order", {"orderId": "A100", "amountCents": 500, "reason": "it arrived broken"}),
    ]
    if output is not None:
        conversation.append(output_item("call_1_1", output))
    return only_text(MODEL.answer(conversation, "u1"))


@pytest.mark.parametrize(
    ("refund_output", "expected"),
    [
        (
            {
                "ok": True,
                "operation_id": "op-9",
                "state": "verified",
                "result": {"refund_id": "R1", "amount_cents": 500},
            },
            "I refunded 500 cents on order A100 (verified by reading the order's refunds back).",
        ),
        (
            {"ok": True, "operation_id": "op-9", "state": "completed", "verified": False, "message": "not seen"},
            "The order service reported the refund of 500 cents on order A100 as made, but I could not confirm it by"
            " reading the order's refunds back (operation op-9). I did not repeat it.",
        ),
        (
            {"ok": False, "code": "OUTCOME_UNKNOWN", "operation_id": "op-9", "message": "lost reply"},
            "I could not establish whether the refund of 500 cents on order A100 was made (operation op-9)."
            " I did not retry it.",
        ),
        (
            {"ok": False, "code": "CONFIRMATION_REQUIRED", "operation_id": "op-9", "message": "no approval in time"},
            "The refund was not made: it was not approved.",
        ),
        (
            {"ok": False, "code": "BAD_ARGUMENTS", "message": "amountCents: at most 300 cents are refundable"},
            "The refund was not made: the request was not valid"
            " (BAD_ARGUMENTS: amountCents: at most 300 cents are refundable).",
        ),
        (
            {"ok": False, "code": "NOT_AVAILABLE", "message": "no such order"},
            "The refund was not made: order A100 is not available to you (NOT_AVAILABLE).",
        ),
        (
            {"ok": False, "code": "IDEMPOTENCY_CONFLICT", "message": "key reused"},
            "The refund was not made: the same operation was already requested with different details"
            " (IDEMPOTENCY_CONFLICT).",
        ),
        (
            {"ok": False, "code": "TEMPORARY_UNAVAILABLE", "message": "busy"},
            "The refund was not made: the order service was not available (TEMPORARY_UNAVAILABLE);"
            " please try again later.",
        ),
        (
            {"ok": False, "code": "CONFLICT", "message": "order cancelled"},
            "The refund was not made: it conflicts with the current state of order A100 (CONFLICT).",
        ),
        (None, "I could not establish whether the refund of 500 cents on order A100 was made. I did not retry it."),
    ],
)
def test_refund_answer_follows_the_write_output_only(refund_output: dict[str, Any] | None, expected: str) -> None:
    assert refund_answer(refund_output) == "[offline model] " + expected


@pytest.mark.parametrize(
    ("request_text", "args"),
    [
        ("Refund 5 EUR on A100", {"orderId": "A100", "amountCents": 500, "reason": "requested by customer"}),
        (
            "please refund 300 cents for A101",
            {"orderId": "A101", "amountCents": 300, "reason": "requested by customer"},
        ),
        (
            "Refund 5 EUR on A100 and show ticket T1001",
            {"orderId": "A100", "amountCents": 500, "reason": "requested by customer"},
        ),
    ],
)
def test_refund_finds_the_order_id_without_the_word_order(request_text: str, args: dict[str, Any]) -> None:
    assert calls_of(MODEL.answer([user_message(request_text)], "u1")) == [("refund_order", args, "call_1_1")]


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("refund everything on A100", "How much should I refund on order A100? I never refund the full amount"),
        ("refund 5 EUR on A100 and A101", "I refund one order at a time; please name just one of A100, A101."),
    ],
)
def test_refund_asks_about_the_order_it_found_without_the_word_order(request_text: str, expected: str) -> None:
    assert only_text(MODEL.answer([user_message(request_text)], "u1")).startswith("[offline model] " + expected)


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("I don't want you to refund 5 EUR on order A100", "I will not refund anything on order A100"),
        ("I don\u2019t want you to refund 5 EUR on order A100", "I will not refund anything on order A100"),
        ("Please do not refund 5 EUR on order A100", "I will not refund anything on order A100"),
        ("Please don't refund order A100.", "I will not refund anything on order A100"),
        ("Never refund anything on A100", "I will not refund anything on order A100"),
        ("Do not add a note to ticket T1001: customer called", "I will not add a note to ticket T1001"),
    ],
)
def test_a_write_asked_not_to_be_done_is_not_proposed_and_the_answer_says_so(request_text: str, expected: str) -> None:
    text = only_text(MODEL.answer([user_message(request_text)], "u1"))
    assert text.startswith(f"[offline model] As you asked, {expected}: "), text
    assert "status" not in text  # nothing was read either: nothing else was asked


def test_a_write_asked_not_to_be_done_serves_the_rest_of_the_message() -> None:
    request = "I don't want you to refund order A100, where is it?"
    calls = calls_of(MODEL.answer([user_message(request)], "u1"))
    assert [(name, args) for name, args, _ in calls] == [("get_order_status", {"orderId": "A100"})]
    text = answer(request, [{"ok": True, "order_id": "A100", "status": "shipped"}])
    assert text == (
        "[offline model] As you asked, I will not refund anything on order A100: I made no refund and proposed none."
        " Order A100: status shipped."
    )


def test_a_refund_named_as_a_noun_after_a_negation_is_a_question_not_a_refusal() -> None:
    calls = calls_of(MODEL.answer([user_message("Why did I not get a refund on order A100?")], "u1"))
    assert [(name, args) for name, args, _ in calls] == [("get_order_status", {"orderId": "A100"})]


def test_write_requests_never_call_more_than_twice() -> None:
    """After the write's output the model always answers, so a write request cannot loop."""
    for note_output in (
        {"ok": False, "code": "VERSION_CONFLICT", "message": "x"},
        {"ok": True, "state": "verified"},
    ):
        response = MODEL.answer(note_conversation(TICKET_OUTPUT, note_output), "u1")
        assert not any(isinstance(item, FunctionCallItem) for item in response)
        only_text(response)


# --- requests it has no tool for: refused whole, no call ------------------------------------------------


@pytest.mark.parametrize(
    ("request_text", "action"),
    [
        ("cancel my order A100", "cancel orders"),
        ("please delete ticket T1001", "delete tickets"),
        ("change my order A101 to express shipping", "change orders"),
        ("reschedule my meeting on cal-u1", "reschedule meetings"),
        ("Can you close ticket T1001?", "close tickets"),
        ("How do I cancel my order A100?", "cancel orders"),
        ("I want to return my order A100", "return orders"),
        ("I’d like to change order A100", "change orders"),
        ("I want my order A100 cancelled", "cancel orders"),
        ("Help me move my 10:00 meeting on cal-u1", "move meetings"),
        ("remove an item from order A100", "remove items"),
        ("pay for order A100", "pay for orders"),
        ("order a new lamp like order A100", "place new orders"),
        ("Book a meeting on cal-u1 when I am free", "book meetings"),
    ],
)
def test_unsupported_action_is_refused_without_calling_tools(request_text: str, action: str) -> None:
    text = only_text(MODEL.answer([user_message(request_text)], "u1"))
    assert text == f"[offline model] I can't {action}, so I did nothing with this request. {CAN_TEXT}"


@pytest.mark.parametrize(
    ("request_text", "action"),
    [
        ("cancel order A100 and show ticket T1001", "cancel orders"),
        ("Show ticket T1001 and cancel order A100", "cancel orders"),
        ("Show ticket T1001, then delete it", "delete tickets"),
        ("Where is order A100? I'd like to return it.", "return orders"),
        ("free slots on cal-u1, and cancel my 3pm appointment", "cancel appointments"),
        ("cancel order A100 and delete ticket T1001", "cancel orders or delete tickets"),
    ],
)
def test_mixed_request_is_refused_whole_when_one_part_is_unsupported(request_text: str, action: str) -> None:
    text = only_text(MODEL.answer([user_message(request_text)], "u1"))
    assert text.startswith(f"[offline model] I can't {action}, so I did nothing with this request.")


@pytest.mark.parametrize(
    ("request_text", "orders"),
    [
        ("Where is my order A100?", ["A100"]),
        ("status of order A100", ["A100"]),
        ("What about orders A100 and A101?", ["A100", "A101"]),
        ("Why was my order A100 cancelled?", ["A100"]),
        ("Is order A100 cancelled?", ["A100"]),
        ("Did you cancel my order A100?", ["A100"]),
        ("Was order A100 returned?", ["A100"]),
        ("When will order A100 ship?", ["A100"]),
        ("When will you ship order A100?", ["A100"]),
        ("Any update on my order A100?", ["A100"]),
        ("Update on order A100?", ["A100"]),
        ("Return status of order A100", ["A100"]),
        ("I need to know why order A100 was cancelled", ["A100"]),
        ("I don't want to cancel order A100, where is it?", ["A100"]),
        ("The customer wants to cancel, where is order A100?", ["A100"]),
    ],
)
def test_status_question_reads_the_order_when_it_only_mentions_an_action(request_text: str, orders: list[str]) -> None:
    calls = calls_of(MODEL.answer([user_message(request_text)], "u1"))
    assert [(name, args) for name, args, _ in calls] == [("get_order_status", {"orderId": o}) for o in orders]


def test_ticket_question_reads_the_ticket_when_it_asks_about_a_past_action() -> None:
    calls = calls_of(MODEL.answer([user_message("Has ticket T1001 been closed?")], "u1"))
    assert calls == [("get_ticket", {"ticketId": "T1001"}, "call_1_1")]


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("Add a note to ticket T1001: customer wants to cancel", ("get_ticket", {"ticketId": "T1001"})),
        ("Add a note to ticket T1001 saying please cancel order A100", ("get_ticket", {"ticketId": "T1001"})),
        (
            "Refund 5 EUR on order A100 because the customer wants to cancel",
            ("refund_order", {"orderId": "A100", "amountCents": 500, "reason": "the customer wants to cancel"}),
        ),
        (
            "Please refund 5 EUR on order A100, the customer wants to return it",
            ("refund_order", {"orderId": "A100", "amountCents": 500, "reason": "requested by customer"}),
        ),
    ],
)
def test_write_request_wins_when_its_text_or_reason_names_an_unsupported_action(
    request_text: str, expected: tuple[str, dict[str, Any]]
) -> None:
    calls = calls_of(MODEL.answer([user_message(request_text)], "u1"))
    assert [(name, args) for name, args, _ in calls] == [expected]


def test_note_text_naming_an_unsupported_action_is_written_as_given() -> None:
    request = "Add a note to ticket T1001: customer wants to cancel"
    (append,) = calls_of(MODEL.answer(note_conversation(TICKET_OUTPUT, request=request), "u1"))
    assert append == (
        "append_ticket_note",
        {"ticketId": "T1001", "text": "customer wants to cancel", "expectedVersion": 7},
        "call_2_1",
    )


@pytest.mark.parametrize(
    ("request_text", "action"),
    [
        ("Refund 5 EUR on order A100 and cancel order A101", "cancel orders"),
        ("Cancel order A100 and refund 5 EUR on order A100", "cancel orders"),
        ("Add a note to ticket T1001 and close it: called the customer", "close tickets"),
    ],
)
def test_write_request_is_refused_whole_when_it_also_asks_for_an_unsupported_action(
    request_text: str, action: str
) -> None:
    text = only_text(MODEL.answer([user_message(request_text)], "u1"))
    assert text.startswith(f"[offline model] I can't {action}, so I did nothing with this request.")


# --- script loader -------------------------------------------------------------------------------------


def test_script_loads_every_item_type(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {
                "description": "demo",
                "turns": [
                    [
                        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "abc"},
                        {
                            "type": "function_call",
                            "name": "get_order_status",
                            "arguments": '{"orderId": "A1',
                            "call_id": "c1",
                        },
                    ],
                    [{"type": "message", "content": "done"}],
                    [],
                ],
            }
        )
    )

    turns = load_script(path)

    assert len(turns) == 3 and turns[2] == []
    reasoning, call = turns[0]
    assert isinstance(reasoning, OtherItem)
    assert item_to_wire(reasoning) == {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "abc"}
    assert isinstance(call, FunctionCallItem) and call.arguments == '{"orderId": "A1'
    (message,) = turns[1]
    assert isinstance(message, MessageItem)
    assert message.content == [{"type": "output_text", "text": "done"}] and message.role == "assistant"


def test_script_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="script file not found"):
        load_script(tmp_path / "missing.json")


def test_script_file_not_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"turns": [')
    with pytest.raises(ScriptError, match="is not valid JSON"):
        load_script(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], 'a script must be a JSON object with a "turns" list'),
        ({"steps": []}, 'a script must be a JSON object with a "turns" list'),
        ({"turns": {"a": 1}}, '"turns" must be a list, got object'),
        ({"turns": [[], "x"]}, "turn 2 is not a list of items, got string"),
        ({"turns": [[7]]}, "turn 1 item 1: an item must be an object, got number"),
        (
            {"turns": [[], [{"type": "function_call", "name": "f", "arguments": {"a": 1}, "call_id": "c"}]]},
            "turn 2 item 1: function_call needs 'arguments' as a JSON string, got object",
        ),
        (
            {"turns": [[{"type": "function_call", "arguments": "{}", "call_id": "c"}]]},
            "turn 1 item 1: function_call needs 'name' as a non-empty string, got nothing",
        ),
        (
            {"turns": [[{"type": "function_call", "name": "f", "arguments": "{}"}]]},
            "turn 1 item 1: function_call needs 'call_id' as a non-empty string, got nothing",
        ),
        ({"turns": [[{"type": "image"}]]}, "turn 1 item 1: unknown item type 'image'"),
        ({"turns": [[{"text": "hi"}]]}, "turn 1 item 1: item has no 'type'"),
        ({"turns": [[{"type": "message", "content": 5}]]}, "turn 1 item 1: message needs 'content' as a string"),
        ({"turns": [[{"type": "message", "role": "user", "content": "x"}]]}, "'role' must be 'assistant'"),
        (
            {"turns": [[{"type": "message", "content": [{"type": "output_text"}]}]]},
            "message content part 1 (output_text) needs 'text' as a string",
        ),
    ],
)
def test_script_shape_errors_are_precise(data: Any, message: str) -> None:
    with pytest.raises(ScriptError) as caught:
        parse_script(data)
    assert message in str(caught.value)


def test_script_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"turns": [[{"type": "bogus"}]]}))
    with pytest.raises(ScriptError, match=r"s\.json: turn 1 item 1: unknown item type 'bogus'"):
        load_script(path)
