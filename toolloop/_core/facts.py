"""Pure: the facts a write's approval policy decides on, taken from what the request itself read earlier.

A write tool names them (ToolSpec.policy_facts, a list of PolicyFact): for "the payment is within what the
invoice still owes", `PolicyFact(name="invoice", tool="get_invoice", match={"invoiceId": "invoiceId"},
fields=["open_cents", "payee"])` makes facts["invoice"] the newest successful output of get_invoice for the
same invoiceId, with those fields only (the policy's schema declares them). A fact
the request has not read is absent, so a rule that needs it does not match: it can only ask, never allow.

The outputs are the tool activities' results, as the workflow holds them: what the service answered this
request's own actor, never the model's words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from toolloop._core.contracts import PolicyFact


@dataclass(frozen=True)
class Read:
    """One successful read of this request: the tool, its validated arguments, and its output."""

    tool: str
    arguments: Mapping[str, Any]
    output: Mapping[str, Any]


def unchanged_by(writes: Iterable[tuple[Iterable[PolicyFact], Mapping[str, Any]]], reads: Iterable[Read]) -> list[Read]:
    """The reads none of `writes` (each a write's policy facts and its arguments) may have made untrue: a write
    changes what its own facts would be taken from (a refund, the order it was decided on). A write whose tool
    names no facts says nothing of what it changes, so it may have changed anything read: none is left. A later
    write is decided on these only; for the others, on a new read."""
    changed = [(list(facts), arguments) for facts, arguments in writes]
    if any(not facts for facts, _ in changed):
        return []
    return [
        read
        for read in reads
        if not any(_read_for(fact, arguments, read) for facts, arguments in changed for fact in facts)
    ]


def policy_facts(wanted: Iterable[PolicyFact], arguments: Mapping[str, Any], reads: Iterable[Read]) -> dict[str, Any]:
    """facts[name] for each wanted fact the request has read (the newest matching read wins)."""
    newest_first = list(reads)[::-1]
    facts: dict[str, Any] = {}
    for fact in wanted:
        for read in newest_first:
            if read.output.get("ok") is True and _read_for(fact, arguments, read):
                facts[fact.name] = {field: read.output[field] for field in fact.fields if field in read.output}
                break
    return facts


def _read_for(fact: PolicyFact, arguments: Mapping[str, Any], read: Read) -> bool:
    """True if `read` is of the fact's tool and agrees with a write's `arguments` on the fact's `match`."""
    return read.tool == fact.tool and all(
        name in read.arguments and read.arguments[name] == arguments.get(write_name)
        for name, write_name in fact.match.items()
    )
