"""Pure tests: the invariants of a thread run (faultbed.invariants.judge_thread), each shown holding and broken,
the per-message checks merged per invariant, the thread scenarios' scripts, and the headline figures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from faultbed.cli import ChaosUsageError, choose
from faultbed.invariants import (
    IN_ORDER,
    NEVER_OVERLAP,
    NEVER_REDONE,
    REPLAYS,
    SHOWN_AS_RECORDED,
    Check,
    MessageFacts,
    Received,
    ThreadFacts,
    Told,
    judge_thread,
    merge_checks,
)
from faultbed.plan import ProcessFaultSpec
from faultbed.report import BAD, headline
from faultbed.runner import RunOutcome
from faultbed.scenarios import BUILT_IN, ThreadPlan, find, message_tag, message_turns, write_arguments

A = "op_" + "a" * 32
B = "op_" + "b" * 32


def good() -> ThreadFacts:
    """Message 1 did A; message 2 (shown A as verified) proposed A again (told done by message 1) and did B."""
    return ThreadFacts(
        messages=[
            MessageFacts(1, 1, "t-m1", started_at=10.0, closed_at=20.0, ledger={A: "verified"}, asked=[A]),
            MessageFacts(
                2,
                2,
                "t-m2",
                started_at=20.5,
                closed_at=30.0,
                ledger={B: "verified"},
                told=[Told(A, "verified", "earlier", number=1), Told(A, "verified", "again", request_id="t-m1")],
                asked=[B],
            ),
        ],
        received=[Received("POST", "/calendars/cal-u1/events", 12.0, 201, A, "d" * 64)],
        replayed=3,
    )


def broken(facts: ThreadFacts) -> dict[str, str]:
    return {c.name: c.detail for c in judge_thread(facts) if not c.ok}


def test_a_clean_thread_holds_every_thread_invariant() -> None:
    checks = judge_thread(good())
    assert [c.name for c in checks] == [NEVER_OVERLAP, IN_ORDER, SHOWN_AS_RECORDED, NEVER_REDONE, REPLAYS]
    assert all(c.ok for c in checks)


def test_a_message_that_starts_before_the_one_before_it_closed_overlaps() -> None:
    facts = good()
    facts.messages[1].started_at = 19.0
    assert broken(facts) == {
        NEVER_OVERLAP: "message 2 (t-m2) started 1.000 s before message 1 (t-m1) closed: expected it to wait for "
        "its end"
    }
    # A message that never ran cannot be placed after the one before it.
    facts.messages[1].started_at = None
    assert "expected both requests to have run" in broken(facts)[NEVER_OVERLAP]


def test_messages_numbered_or_started_out_of_the_order_they_were_sent_break_the_order() -> None:
    facts = good()
    facts.messages[0].number, facts.messages[1].number = 2, 1
    assert "the messages were numbered [2, 1]" in broken(facts)[IN_ORDER]
    later = good()
    later.messages.append(MessageFacts(3, 3, "t-m3", started_at=15.0, closed_at=40.0))
    assert "started in the order [1, 3, 2]" in broken(later)[IN_ORDER]
    never = good()
    never.messages[1].number = None
    assert "messages never accepted: ['t-m2']" in broken(never)[IN_ORDER]


def test_a_write_shown_done_that_the_ledger_left_unknown_breaks_the_thread() -> None:
    facts = good()
    facts.messages[0].ledger = {A: "unknown"}
    detail = broken(facts)[SHOWN_AS_RECORDED]
    assert (
        f"message 2's model was shown {A} verified (earlier), but message 1's ledger recorded it unknown: a write "
        "shown done that the ledger did not verify"
    ) in detail
    assert f"{A} verified (again)" in detail
    # Shown otherwise than recorded (not done, but still not what the ledger says) breaks it too.
    facts = good()
    facts.messages[1].told = [Told(A, "unknown", "earlier", number=1)]
    assert "shown done" not in broken(facts)[SHOWN_AS_RECORDED]
    # An earlier write never shown at all, or told as coming from a later message.
    unshown = good()
    unshown.messages[1].told = []
    assert broken(unshown) == {SHOWN_AS_RECORDED: f"message 2's model was never shown {A} of message 1"}
    later = good()
    later.messages[1].told = [*later.messages[1].told, Told(B, "verified", "earlier", number=2)]
    assert "not an earlier one of the thread" in broken(later)[SHOWN_AS_RECORDED]


def test_a_done_write_asked_for_again_or_sent_again_in_a_later_message_is_redone() -> None:
    facts = good()
    facts.messages[1].asked = [A, B]
    assert broken(facts) == {NEVER_REDONE: f"{A}, done in message 1, was asked for approval again in [2]"}
    sent = good()
    assert sent.received is not None
    sent.received.append(Received("POST", "/calendars/cal-u1/events", 21.0, 200, A, "d" * 64))
    assert broken(sent) == {
        NEVER_REDONE: f"{A}, done in message 1, reached the service again 1 time(s) in a later message"
    }
    # One sent before the next message started is the first message's own (a retry of its attempt).
    own = good()
    assert own.received is not None
    own.received.append(Received("POST", "/calendars/cal-u1/events", 13.0, 200, A, "d" * 64))
    assert NEVER_REDONE not in broken(own)


def test_a_history_that_does_not_replay_or_none_replayed_breaks_the_thread() -> None:
    facts = replace(good(), unreplayable=[("thread-x", "NondeterminismError: boom")])
    assert broken(facts) == {REPLAYS: "thread-x: NondeterminismError: boom"}
    assert broken(replace(good(), replayed=0)) == {REPLAYS: "no history was replayed"}


def test_each_messages_checks_merge_into_one_per_invariant_naming_the_message() -> None:
    merged = merge_checks([[Check("x", True), Check("y", True)], [Check("x", False, "bad"), Check("y", True)]])
    assert merged == [Check("x", False, "message 2: bad"), Check("y", True, "")]


def test_the_headline_counts_each_thread_figure_and_each_must_be_zero() -> None:
    names = {
        NEVER_OVERLAP: "overlapping messages",
        IN_ORDER: "messages out of order",
        SHOWN_AS_RECORDED: "writes shown done, not verified",
        NEVER_REDONE: "done writes redone",
        REPLAYS: "histories not replaying",
    }
    for check, figure in names.items():
        run = RunOutcome("thread-worker-kills", 0, "w", 1.0, [Check(check, False, "x")], {0: 1}, "verified")
        assert headline([run])[figure] == 1 and figure in BAD


def test_the_thread_scenarios_script_each_message_and_propose_earlier_writes_again_with_the_same_payload() -> None:
    [kills] = find(["thread-worker-kills"])
    assert kills.thread is not None and [m.queued for m in kills.thread.messages] == [False, False, True]
    assert {f.at for f in kills.plan.faults if isinstance(f, ProcessFaultSpec)} == {
        "between_messages",
        "while_message_queued",
    }
    third = message_turns("t", kills.thread, 3)
    again, own, answer = third
    assert again[0]["call_id"] == "again1" and again[0]["arguments"] == own[0]["arguments"].replace("t-m3", "t-m1")
    assert own[0]["arguments"].count(message_tag("t", 3)) == 1 and answer[0]["type"] == "message"
    first = message_turns("t", kills.thread, 1)
    assert [c["call_id"] for c in first[0]] == ["r0", "r1"] and len(first) == 3
    [unknown] = find(["thread-unknown-reproposed"])
    assert unknown.thread is not None
    assert unknown.thread == ThreadPlan(unknown.thread.messages, clear_faults_after=1)
    assert write_arguments("t-m1")["title"] == "chaos t-m1"
    assert {s.family for s in BUILT_IN if s.thread is not None} == {"thread"}


def test_thread_scenarios_and_thread_points_are_refused_where_they_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ChaosUsageError, match="thread-worker-kills: a thread scenario runs the demo's messages"):
        choose("thread-worker-kills", 1, None, None, tmp_path, tools="tests.user_chaos:target")
    # By default, another target runs no thread scenario.
    chosen = choose("", 1, None, None, tmp_path, tools="tests.user_chaos:target")
    assert chosen.scenarios and all(s.thread is None for s in chosen.scenarios)
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: p\nfaults:\n  - boundary: process\n    fault: kill_worker\n    at: between_messages\n")
    with pytest.raises(ChaosUsageError, match="between_messages is a point of a thread scenario"):
        choose("", 1, None, plan, tmp_path)
