"""Pure: the floor's activity inputs and outputs, and the key of its write."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FloorCall:
    name: str
    arguments: dict[str, Any]
    call_id: str
    write: bool = False
    # Decided by rule (the policy phase's floor): no person's approval to wait for, the write activity signs.
    by_rule: bool = False


@dataclass
class Plan:
    calls: list[FloorCall] = field(default_factory=list)
    answer: str | None = None


@dataclass
class FloorTurn:
    request: str
    turn: int
    # The previous round's outputs (what a hand-written loop feeds the model).
    outputs: list[str] = field(default_factory=list)


@dataclass
class FloorWrite:
    key: str
    arguments: dict[str, Any]
    # The person's approval; None: the write is decided by rule, and the activity signs the rule's decision.
    token: str | None = None


@dataclass
class FloorReadBack:
    event_id: str


def operation_key(workflow_id: str, call_id: str) -> str:
    """The write's Idempotency-Key, so also the operation id its approval names (the client mints the
    approval for it before the workflow gets there)."""
    return f"{workflow_id}-{call_id}"
