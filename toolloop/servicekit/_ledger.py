"""I/O interface: the idempotency ledger's storage - completed outcomes and in-flight claims per (tenant,
user, operation id) - and the types both implementations (SQLite, PostgreSQL) share.

The contract every storage keeps:
- `complete` runs the effect and writes its record in one transaction, and the record is unique per key:
  at most one effect per key commits, also across processes; if the record cannot be written the effect
  rolls back with it; if another attempt recorded the key first, this effect rolls back and that record
  is returned.
- `claim` makes an attempt in flight visible (a concurrent attempt gets 409); checking and inserting the
  claim is atomic; its lease frees the key of a process that died holding it.
- records older than the retention count as gone (`not_before`).
- `complete` given a claim id and a time to commit by checks both last, just before the commit: past that
  time, or with its claim no longer there (another attempt took the key over once its lease ran out), the
  effect rolls back and nothing is recorded (CommitTooLate, ClaimLost).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class LedgerKey:
    tenant_id: str
    user_id: str
    operation_id: str

    def params(self) -> tuple[str, str, str]:
        return (self.tenant_id, self.user_id, self.operation_id)


@dataclass(frozen=True)
class LedgerRecord:
    """The stored outcome of a key: the payload digest it was made for, and the reply it got."""

    digest: str
    status: int
    body: dict[str, Any]


Pending = Literal["in_progress", "not_found"]

# claim_checked: inside the claim's transaction, after "no record, no live claim", before the claim row.
# effect_written: inside the commit's transaction, after the effect's rows, before the ledger record.
HoldPoint = Literal["claim_checked", "effect_written"]
Hold = Callable[[HoldPoint], None]

# The effect as the ledger runs it: on the transaction's connection, answering (status, body).
StoredEffect = Callable[[Any], tuple[int, dict[str, Any]]]


def no_hold(point: HoldPoint) -> None:
    """The production default: every hold point passes at once."""


class ClaimTaken(Exception):
    """Another attempt with this key holds an unexpired claim."""


class CommitTooLate(Exception):
    """`complete` reached its commit at or after its `commit_by`: the effect was rolled back."""


class ClaimLost(Exception):
    """`complete` found at its commit that its claim no longer holds the key (another attempt took it over
    once the lease ran out): the effect was rolled back."""


class Ledger(Protocol):
    """Where the kit keeps its records; every method blocks (the kit runs them in a worker thread)."""

    def init(self) -> None:
        """Create the tables if missing."""
        ...

    def purge(self, older_than: float) -> None: ...

    def lookup(self, key: LedgerKey, now: float, not_before: float) -> LedgerRecord | Pending:
        """The completed record of `key`; otherwise whether an attempt is in flight."""
        ...

    def claim(
        self, key: LedgerKey, now: float, not_before: float, lease_seconds: float, hold: Hold = no_hold
    ) -> LedgerRecord | str:
        """The claim id, or the record another attempt completed meanwhile; raises ClaimTaken while another
        attempt's claim is unexpired."""
        ...

    def release(self, key: LedgerKey, claim_id: str) -> None: ...

    def complete(
        self,
        key: LedgerKey,
        digest: str,
        effect: StoredEffect,
        now: float,
        not_before: float,
        hold: Hold = no_hold,
        *,
        claim_id: str | None = None,
        commit_by: float = math.inf,
    ) -> tuple[LedgerRecord, bool]:
        """Run `effect` and store its (status, body) under `key` in one transaction, or return the record
        another attempt stored first (untouched). The flag says whether this call made the record. Raises
        CommitTooLate when the commit comes at or after `commit_by` (time.time()), ClaimLost when `claim_id`
        no longer holds `key`; either leaves nothing."""
        ...
