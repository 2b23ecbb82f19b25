"""Pure: the live text of a request's model turns - what the model activity writes while a turn streams, and
what a reader shows of it.

A turn's attempt writes `start`, its text in pieces, and `end` once its answer is complete (the answer the
workflow records; the pieces are for display only). A retried turn's next attempt writes `start` again. A
reader shows only the newest attempt of each turn: a newer attempt's `start` tells it the turn restarted
(what it showed of the earlier one is void), and whatever an older attempt still writes afterwards (a worker
that kept running after its attempt timed out) is dropped, so two attempts' text never merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LiveTextKind = Literal["start", "text", "end"]


@dataclass(frozen=True)
class LiveText:
    """One entry of a run's live text, in the order written. `position` is where it stands in the run's
    stream (the store's entry id): a reader resumes after the last one it read."""

    turn: int
    attempt: int
    kind: LiveTextKind
    text: str = ""
    position: str = ""


@dataclass(frozen=True)
class Shown:
    """What a reader shows: `text` of a turn, a turn `restarted` (attempt N: forget what was shown of it), or
    a turn's text `complete`."""

    kind: Literal["text", "restarted", "complete"]
    turn: int
    attempt: int
    text: str = ""


@dataclass
class LiveTextView:
    """Reads a run's live text in order and says what to show: the newest attempt of each turn only."""

    _attempts: dict[int, int] = field(default_factory=dict)
    _texts: dict[int, list[str]] = field(default_factory=dict)

    def add(self, entry: LiveText) -> list[Shown]:
        current = self._attempts.get(entry.turn)
        if current is not None and entry.attempt < current:
            return []  # an older attempt still writing: never mixed with the newer one
        shown: list[Shown] = []
        if current is not None and entry.attempt > current:
            shown.append(Shown("restarted", entry.turn, entry.attempt))
        if current is None or entry.attempt > current:
            self._attempts[entry.turn] = entry.attempt
            self._texts[entry.turn] = []
        if entry.kind == "text" and entry.text:
            self._texts[entry.turn].append(entry.text)
            shown.append(Shown("text", entry.turn, entry.attempt, entry.text))
        elif entry.kind == "end":
            shown.append(Shown("complete", entry.turn, entry.attempt))
        return shown

    def text_of(self, turn: int) -> str:
        """The text shown so far of `turn`'s newest attempt."""
        return "".join(self._texts.get(turn, []))
