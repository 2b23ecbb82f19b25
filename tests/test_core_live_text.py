"""Unit tests (pure): what a reader shows of a run's live text - the newest attempt of each turn only, a restart
said as such, and an older attempt's late text never mixed into the newer one's."""

from __future__ import annotations

from toolloop._core.live_text import LiveText, LiveTextView, Shown


def shown(view: LiveTextView, *entries: LiveText) -> list[Shown]:
    return [s for entry in entries for s in view.add(entry)]


def test_one_attempt_shows_its_text_and_completes() -> None:
    view = LiveTextView()
    got = shown(
        view,
        LiveText(1, 1, "start"),
        LiveText(1, 1, "text", "Hel"),
        LiveText(1, 1, "text", "lo"),
        LiveText(1, 1, "end"),
    )
    assert got == [Shown("text", 1, 1, "Hel"), Shown("text", 1, 1, "lo"), Shown("complete", 1, 1)]
    assert view.text_of(1) == "Hello"


def test_a_retried_turn_restarts_and_its_earlier_text_is_void() -> None:
    view = LiveTextView()
    got = shown(
        view,
        LiveText(2, 1, "start"),
        LiveText(2, 1, "text", "The answer is 4"),
        LiveText(2, 2, "start"),
        LiveText(2, 2, "text", "The answer is 42."),
        LiveText(2, 2, "end"),
    )
    assert got == [
        Shown("text", 2, 1, "The answer is 4"),
        Shown("restarted", 2, 2),
        Shown("text", 2, 2, "The answer is 42."),
        Shown("complete", 2, 2),
    ]
    assert view.text_of(2) == "The answer is 42."


def test_an_older_attempt_still_writing_is_dropped() -> None:
    # Attempt 1 timed out but its worker kept streaming while attempt 2 ran elsewhere.
    view = LiveTextView()
    got = shown(
        view,
        LiveText(1, 1, "start"),
        LiveText(1, 1, "text", "aaa"),
        LiveText(1, 2, "start"),
        LiveText(1, 1, "text", "AAA late"),
        LiveText(1, 2, "text", "bbb"),
        LiveText(1, 1, "end"),
        LiveText(1, 2, "end"),
    )
    assert got == [
        Shown("text", 1, 1, "aaa"),
        Shown("restarted", 1, 2),
        Shown("text", 1, 2, "bbb"),
        Shown("complete", 1, 2),
    ]
    assert view.text_of(1) == "bbb"


def test_a_reader_that_joins_late_starts_with_what_it_sees() -> None:
    # The start entry was trimmed or read before: the first entry seen opens the attempt, no restart.
    view = LiveTextView()
    assert shown(view, LiveText(3, 2, "text", "late")) == [Shown("text", 3, 2, "late")]
    # Turns are independent.
    assert shown(view, LiveText(4, 1, "start"), LiveText(4, 1, "text", "x")) == [Shown("text", 4, 1, "x")]
    assert view.text_of(3) == "late" and view.text_of(4) == "x" and view.text_of(5) == ""
