"""Pure: what a thread hands its next message (toolloop._core.threads), without a server."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pydantic import BaseModel

from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentResult,
    CallRecord,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OperationRecord,
    outcome_without_report,
)
from toolloop._core.threads import (
    ANSWER_CHARS,
    KEPT_MESSAGES,
    KEPT_TURNS,
    MAX_QUEUED,
    QUESTION_CHARS,
    TURN_BYTES,
    MessageRecord,
    ThreadInput,
    ThreadMessage,
    ThreadState,
    ahead_of,
    context_for,
    earlier_items,
    earlier_operations,
    keep_turn,
    queue_has_room,
    turn_of,
)

U1 = Actor(user_id="u1", tenant_id="acme")


def _record(number: int, state: str = "finished") -> MessageRecord:
    return MessageRecord(
        number=number,
        request_id=f"r{number}",
        workflow_id=f"ask-acme-u1-r{number}-x",
        submission="sha256:x",
        question=f"question {number}",
        state=state,  # type: ignore[arg-type]
    )


def _report(*operations: OperationRecord, answer: str | None = "done") -> AgentResult:
    return AgentResult(
        status="completed" if answer else "failed",
        stop_reason="final_answer" if answer else "model_error",
        final_text=answer,
        rounds=2,
        calls=[CallRecord(call_id=op.call_ids[0], tool=op.tool, round=1, ok=True) for op in operations],
        operations=list(operations),
    )


def _op(op_id: str, state: str, call_id: str = "w1") -> OperationRecord:
    return OperationRecord(
        operation_id=op_id,
        tool="refund_order",
        call_ids=[call_id],
        arguments={"orderId": "A100", "amount": 5, "card": "***"},
        state=state,  # type: ignore[arg-type]
        output={"ok": True, "state": "verified", "result": {"refundId": "R1", "amount": 5}}
        if state == "verified"
        else {"ok": False, "code": "OUTCOME_UNKNOWN"},
        deadline=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_ahead_counts_only_the_earlier_messages_that_have_not_finished() -> None:
    state = ThreadState(messages=[_record(1), _record(2, "running"), _record(3, "queued"), _record(4, "queued")])
    assert [ahead_of(state, f"r{n}") for n in (1, 2, 3, 4)] == [0, 0, 1, 2]


def test_a_turn_holds_each_write_as_its_ledger_recorded_it_and_no_report_says_why() -> None:
    turn = turn_of(_record(1), "refund A100", _report(_op("op_a", "verified"), _op("op_b", "unknown", "w2")), None)
    assert (turn.number, turn.request_id, turn.answer, turn.status) == (1, "r1", "done", "completed")
    assert [(o.operation_id, o.state, o.call_id, o.request_id) for o in turn.operations] == [
        ("op_a", "verified", "w1", "r1"),
        ("op_b", "unknown", "w2", "r1"),
    ]
    assert turn.operations[0].arguments["card"] == "***"  # redacted, as in the ledger
    # Later messages are told the state, not the service's whole answer (every later input holds it).
    assert turn.operations[0].output == {"ok": True, "state": "verified"}
    terminated = turn_of(_record(2), "hello", None, "terminated")
    assert (terminated.answer, terminated.stop_reason, terminated.operations) == (None, "terminated", [])


def test_the_model_is_shown_the_question_each_write_with_its_outcome_and_the_answer_in_order() -> None:
    state = ThreadState()
    keep_turn(state, turn_of(_record(1), "refund A100", _report(_op("op_a", "unknown")), None))
    keep_turn(state, turn_of(_record(2), "hello", None, "terminated"))
    items = earlier_items(context_for(state, "t1", "thread-acme-u1-t1-x", shown_turns=20))
    assert [type(i).__name__ for i in items] == [
        "MessageItem",
        "FunctionCallItem",
        "FunctionCallOutputItem",
        "MessageItem",
        "MessageItem",
        "MessageItem",
    ]
    asked, proposed, told, answer, hello, no_answer = items
    assert isinstance(asked, MessageItem) and (asked.role, asked.text()) == ("user", "refund A100")
    assert isinstance(proposed, FunctionCallItem) and proposed.call_id == "m1_w1" and proposed.name == "refund_order"
    assert json.loads(proposed.arguments) == {"orderId": "A100", "amount": 5, "card": "***"}
    assert isinstance(told, FunctionCallOutputItem) and told.call_id == "m1_w1"
    assert json.loads(told.output) == {
        "ok": False,
        "code": "OUTCOME_UNKNOWN",
        "operation_id": "op_a",
        "state": "unknown",
    }
    assert isinstance(answer, MessageItem) and (answer.role, answer.text()) == ("assistant", "done")
    assert isinstance(hello, MessageItem) and hello.text() == "hello"
    assert isinstance(no_answer, MessageItem) and no_answer.text() == "(no answer: this request ended with terminated)"
    assert earlier_items(None) == []


def test_only_the_newest_turns_are_shown_and_every_write_of_the_thread_is_met_with_its_newest_state() -> None:
    state = ThreadState()
    keep_turn(state, turn_of(_record(1), "q1", _report(_op("op_x", "unknown")), None))
    keep_turn(state, turn_of(_record(2), "q2", _report(_op("op_old_done", "verified")), None))
    keep_turn(state, turn_of(_record(3), "q3", _report(_op("op_x", "verified"), _op("op_new", "verified")), None))
    context = context_for(state, "t1", "scope", shown_turns=1)
    assert [t.number for t in context.turns] == [3]
    # Every write the thread had, however old, with the state the newest message left it in (op_x was
    # unknown, then settled: it is never met as unknown again). Without arguments: the turns show those.
    assert {o.operation_id: o.state for o in earlier_operations(context).values()} == {
        "op_old_done": "verified",
        "op_x": "verified",
        "op_new": "verified",
    }
    # Handed once: the shown turn holds its own writes (with their arguments), the rest come without them.
    assert [o.operation_id for o in context.operations] == ["op_old_done"]
    assert all(o.arguments == {} for o in context.operations)
    assert earlier_operations(None) == {}
    assert context_for(state, "t1", "scope", shown_turns=0).turns == []


def _encoded(value: BaseModel) -> int:
    return len(value.model_dump_json().encode())


def test_what_a_thread_carries_and_hands_on_stays_far_under_temporals_payload_limit() -> None:
    # The largest questions a request takes, long answers, and a write with an unknown outcome in each turn.
    state = ThreadState()
    for number in range(1, 301):
        record = _record(number)
        state.messages.append(record)
        report = _report(_op(f"op_{number}", "unknown" if number % 2 else "verified"), answer="y" * 20_000)
        keep_turn(state, turn_of(record, "x" * 20_000, report, None))
    message = ThreadMessage(
        request_id="m", submission="s", request=AgentInput(request="z" * 20_000, actor=U1, instructions="i" * 20_000)
    )
    while queue_has_room(state, message):
        state.queue.append(message)
    assert 0 < len(state.queue) <= MAX_QUEUED
    carried = ThreadInput(thread_id="t", actor=U1, carried=state)
    assert _encoded(carried) < 1_600_000
    child = message.request.model_copy(update={"thread": context_for(state, "t", "scope", 200)})
    assert _encoded(child) < 500_000
    # Cut and marked so, never silently.
    assert state.turns[-1].question.endswith(" [...]") and len(state.turns[-1].question) == QUESTION_CHARS
    assert state.turns[-1].answer is not None and len(state.turns[-1].answer) == ANSWER_CHARS
    # The newest unknown writes are all still known.
    assert {f"op_{n}" for n in range(291, 301, 2)} <= set(state.operations)


def test_one_message_with_many_large_writes_is_cut_to_a_turn_and_keeps_the_thread_and_its_writes() -> None:
    # Ten small turns, then one request's report of 28 writes of 60 KB each (each argument may be 64 KB, and a
    # request may make 32 calls): the turn is cut, the earlier turns stay, and the state handed on stays small.
    state = ThreadState()
    for number in range(1, 11):
        state.messages.append(_record(number))
        keep_turn(state, turn_of(_record(number), f"q{number}", _report(_op(f"op_{number}", "verified")), None))
    big = [
        _op(f"op_big_{n}", "unknown" if n % 2 else "verified", f"w{n}").model_copy(
            update={"arguments": {"orderId": "A100", "note": "n" * 60_000}, "output": {"ok": False, "e": "e" * 9_000}}
        )
        for n in range(28)
    ]
    turn = turn_of(_record(11), "q11", _report(*big), None)
    assert len(turn.model_dump_json()) <= TURN_BYTES
    keep_turn(state, turn)
    assert [t.number for t in state.turns] == list(range(1, 12))
    shown = context_for(state, "t", "scope", 20)
    assert [t.number for t in shown.turns] == list(range(1, 12))
    assert _encoded(ThreadInput(thread_id="t", actor=U1, carried=state)) < 600_000
    # Every write is still known by its id and state (what a later proposal of it meets), its arguments marked.
    assert {op.operation_id: op.state for op in turn.operations} == {op.operation_id: op.state for op in big}
    assert {f"op_big_{n}" for n in range(28)} <= set(state.operations)
    cut = [op for op in turn.operations if "[left out]" in op.arguments]
    assert cut and "bytes left out" in cut[0].arguments["[left out]"]
    # An output cut keeps its small fields: what a later proposal of the write is told.
    told = [op.output for op in turn.operations if op.output and "[left out]" in op.output]
    assert told and all(o["ok"] is False and "e" not in o for o in told)
    # A small turn is kept whole.
    assert (
        turn_of(_record(12), "q", _report(_op("op_s", "verified")), None).operations[0].arguments["orderId"] == "A100"
    )


def test_a_request_that_ended_without_a_report_leaves_what_it_sent_unknown_and_what_it_did_not_not_done() -> None:
    sent = _op("op_sent", "sent").model_copy(update={"attempts": 1, "first_sent_at": datetime(2026, 1, 1, tzinfo=UTC)})
    waiting = _op("op_waiting", "awaiting_approval")
    done = _op("op_done", "verified")
    turn = turn_of(_record(1), "q", None, "terminated", ledger=[sent, waiting, done])
    assert [(o.operation_id, o.state) for o in turn.operations] == [
        ("op_sent", "unknown"),
        ("op_waiting", "expired"),
        ("op_done", "verified"),
    ]
    assert turn.answer is None and turn.stop_reason == "terminated"


def test_a_request_without_a_report_is_unknown_if_it_may_have_written_or_nobody_can_read_its_ledger() -> None:
    # One rule for the thread's record of the message, ask's and result's exit codes.
    sent = _op("op_sent", "approved").model_copy(update={"attempts": 1})
    waiting, done = _op("op_waiting", "awaiting_approval"), _op("op_done", "verified")
    assert outcome_without_report([waiting, done]) == "failed"
    assert outcome_without_report([]) == "failed"
    assert outcome_without_report([waiting, sent]) == "unknown"
    assert outcome_without_report([_op("op_unverified", "completed")]) == "unknown"
    assert outcome_without_report(None) == "unknown"


def test_a_thread_keeps_a_bounded_number_of_turns_and_messages() -> None:
    state = ThreadState()
    for number in range(1, KEPT_TURNS + 10):
        keep_turn(state, turn_of(_record(number), f"q{number}", _report(), None))
    assert len(state.turns) == KEPT_TURNS and state.turns[0].number == 10
    state.messages = [_record(n) for n in range(1, KEPT_MESSAGES + 6)]
    keep_turn(state, turn_of(_record(KEPT_MESSAGES + 6), "q", _report(), None))
    assert len(state.messages) == KEPT_MESSAGES and state.messages[0].number == 6
