"""I/O: the idempotency ledger - completed outcomes and in-flight claims per (tenant, user, operation id).

A completed record is written in the same BEGIN IMMEDIATE transaction as the effect and is unique per
key, so at most one effect per key commits, also across processes sharing the database file. A claim
only makes an attempt in flight visible (409 for a concurrent retry); its lease frees the key of a
process that died holding it.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from demo.bizservice.holds import Hold, no_hold
from demo.bizservice.store import Store


@dataclass(frozen=True)
class OperationKey:
    tenant_id: str
    user_id: str
    operation_id: str

    def params(self) -> tuple[str, str, str]:
        return (self.tenant_id, self.user_id, self.operation_id)


@dataclass(frozen=True)
class Record:
    """The stored outcome of a key: the payload digest it was made for, and the reply it got."""

    digest: str
    status: int
    body: dict[str, Any]


Pending = Literal["in_progress", "not_found"]


class ClaimTaken(Exception):
    """Another attempt with this key holds an unexpired claim."""


_KEY = "tenant_id = ? AND user_id = ? AND operation_id = ?"


def _completed(conn: sqlite3.Connection, key: OperationKey, not_before: float) -> Record | None:
    row = conn.execute(
        f"SELECT digest, status, body FROM idempotency_records WHERE {_KEY} AND created_at >= ?",
        (*key.params(), not_before),
    ).fetchone()
    return None if row is None else Record(row["digest"], int(row["status"]), json.loads(row["body"]))


def _in_flight(conn: sqlite3.Connection, key: OperationKey, now: float) -> bool:
    row = conn.execute(
        f"SELECT 1 FROM idempotency_claims WHERE {_KEY} AND lease_until > ?", (*key.params(), now)
    ).fetchone()
    return row is not None


def purge(store: Store, older_than: float) -> None:
    with store.connect() as conn:
        conn.execute("DELETE FROM idempotency_records WHERE created_at < ?", (older_than,))


def lookup(store: Store, key: OperationKey, now: float, not_before: float) -> Record | Pending:
    """The completed record of `key` (records older than `not_before` count as gone); otherwise whether
    an attempt is in flight."""
    with store.connect() as conn:
        record = _completed(conn, key, not_before)
        if record is not None:
            return record
        return "in_progress" if _in_flight(conn, key, now) else "not_found"


def claim(
    store: Store,
    key: OperationKey,
    now: float,
    not_before: float,
    lease_seconds: float,
    hold: Hold = no_hold,
) -> Record | str:
    """Claim `key` for one attempt: the claim id, or the record another attempt completed meanwhile.
    Raises ClaimTaken while another attempt's claim is unexpired. The check and the insert share one
    BEGIN IMMEDIATE transaction, so two attempts can never both find the key free."""
    claim_id = uuid.uuid4().hex
    with store.transaction() as conn:
        record = _completed(conn, key, not_before)
        if record is not None:
            return record
        conn.execute(f"DELETE FROM idempotency_claims WHERE {_KEY} AND lease_until <= ?", (*key.params(), now))
        hold("claim_checked")
        try:
            conn.execute(
                "INSERT INTO idempotency_claims (tenant_id, user_id, operation_id, claim_id, lease_until)"
                " VALUES (?, ?, ?, ?, ?)",
                (*key.params(), claim_id, now + lease_seconds),
            )
        except sqlite3.IntegrityError:
            raise ClaimTaken from None
    return claim_id


def release(store: Store, key: OperationKey, claim_id: str) -> None:
    # By claim id: after a lease ran out another attempt may hold the key, and its claim must stay.
    with store.connect() as conn:
        conn.execute(f"DELETE FROM idempotency_claims WHERE {_KEY} AND claim_id = ?", (*key.params(), claim_id))


def complete(
    store: Store,
    key: OperationKey,
    digest: str,
    effect: Callable[[sqlite3.Connection], tuple[int, dict[str, Any]]],
    now: float,
    not_before: float,
    hold: Hold = no_hold,
) -> tuple[Record, bool]:
    """Run `effect` and store its (status, body) under `key` in one transaction; or, when a record
    already exists (another process finished first), return that one untouched. The flag says whether
    this call made the record. An effect never stands without its record: if the record cannot be
    written, the effect's rows roll back with it."""
    with store.transaction() as conn:
        existing = _completed(conn, key, not_before)
        if existing is not None:
            return existing, False
        # A record past retention that the purge has not removed yet must not block the new one.
        conn.execute(f"DELETE FROM idempotency_records WHERE {_KEY}", key.params())
        status, body = effect(conn)
        hold("effect_written")
        conn.execute(
            "INSERT INTO idempotency_records (tenant_id, user_id, operation_id, digest, status, body, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*key.params(), digest, status, json.dumps(body), now),
        )
    return Record(digest, status, body), True
