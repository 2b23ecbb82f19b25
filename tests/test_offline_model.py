"""Tests (pure, plus temp files): the offline demo model's two turns and the script loader's errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentcore.contracts import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
    item_to_wire,
    user_message,
)
from modeladapters import OFFLINE_LABEL, OfflineDemoModel, ScriptError, load_script, parse_script

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
    calls = MODEL.respond(conversation, actor)
    conversation += calls
    for call, output in zip(calls, outputs, strict=True):
        assert isinstance(call, FunctionCallItem)
        conversation.append(FunctionCallOutputItem(call_id=call.call_id, output=json.dumps(output)))
    return only_text(MODEL.respond(conversation, actor))


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
    calls = calls_of(MODEL.respond([user_message(request_text)], "u1"))

    assert [(name, args) for name, args, _ in calls] == expected
    assert [call_id for _, _, call_id in calls] == [f"call_1_{i}" for i in range(1, len(expected) + 1)]


def test_unknown_request_gets_a_labelled_help_message() -> None:
    text = only_text(MODEL.respond([user_message("Book me a flight to Rome")], "u1"))
    assert "order" in text and "ticket" in text
    assert OFFLINE_LABEL == "offline"


def test_call_ids_stay_unique_across_requests_in_one_conversation() -> None:
    conversation: list[ConversationItem] = [user_message("Where is my order A100?")]
    first = MODEL.respond(conversation, "u1")
    conversation += first
    conversation.append(FunctionCallOutputItem(call_id="call_1_1", output='{"ok":true,"status":"shipped"}'))
    conversation += MODEL.respond(conversation, "u1")
    conversation.append(user_message("and order A200?"))

    ((name, args, call_id),) = calls_of(MODEL.respond(conversation, "u1"))

    assert (name, args, call_id) == ("get_order_status", {"orderId": "A200"}, "call_3_1")


def test_same_conversation_gives_the_same_output() -> None:
    conversation: list[ConversationItem] = [user_message("orders A1 and A2, ticket T9, free time 2026-12-05")]
    runs = [[item_to_wire(i) for i in MODEL.respond(conversation, "u3")] for _ in range(3)]
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
    conversation += MODEL.respond(conversation, "u1")
    conversation.append(
        FunctionCallOutputItem(
            call_id="call_1_1", output='{"ok":false,"code":"BAD_ARGUMENTS","message":"orderId: too short"}'
        )
    )

    text = only_text(MODEL.respond(conversation, "u1"))

    assert text == (
        "[offline model] My request for order A1 was not valid (orderId: too short). No result arrived for order A2."
    )


def test_no_user_message_gets_help() -> None:
    only_text(MODEL.respond([], "u1"))


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
