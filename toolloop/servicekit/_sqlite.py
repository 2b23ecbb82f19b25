"""I/O: the idempotency ledger on SQLite. A completed record is written in the same BEGIN IMMEDIATE
transaction as the effect, and SQLite's single writer makes check-then-write atomic across every process
on the database file (WAL lets readers run beside it)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toolloop.servicekit._ledger import ClaimTaken, Hold, LedgerKey, LedgerRecord, Pending, StoredEffect, no_hold

BUSY_TIMEOUT_MS = 5000

SCHEMA = """
-- One completed outcome per (actor, operation id), written in the same transaction as the effect;
-- created_at is time.time() so the retention purge is one comparison.
CREATE TABLE IF NOT EXISTS idempotency_records (
    tenant_id    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    digest       TEXT NOT NULL,
    status       INTEGER NOT NULL,
    body         TEXT NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (tenant_id, user_id, operation_id)
);
CREATE INDEX IF NOT EXISTS idempotency_records_by_age ON idempotency_records (created_at);
-- Attempts in flight: the primary key makes the claim atomic; the lease frees the key of a crashed process.
CREATE TABLE IF NOT EXISTS idempotency_claims (
    tenant_id    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    claim_id     TEXT NOT NULL,
    lease_until  REAL NOT NULL,
    PRIMARY KEY (tenant_id, user_id, operation_id)
);
"""

_KEY = "tenant_id = ? AND user_id = ? AND operation_id = ?"


class SqliteLedger:
    """The ledger in the SQLite file `path` - the service's own database, so an effect's rows and its
    record commit together. The effect gets the transaction's `sqlite3.Connection`."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        # Autocommit mode: transactions are opened explicitly (BEGIN IMMEDIATE) where they matter.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front, so read-then-write is atomic across
        processes."""
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def init(self) -> None:
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)

    @staticmethod
    def _completed(conn: sqlite3.Connection, key: LedgerKey, not_before: float) -> LedgerRecord | None:
        row = conn.execute(
            f"SELECT digest, status, body FROM idempotency_records WHERE {_KEY} AND created_at >= ?",
            (*key.params(), not_before),
        ).fetchone()
        return None if row is None else LedgerRecord(row["digest"], int(row["status"]), json.loads(row["body"]))

    def purge(self, older_than: float) -> None:
        with self.connect() as conn:
            conn.execute("DELETE FROM idempotency_records WHERE created_at < ?", (older_than,))

    def lookup(self, key: LedgerKey, now: float, not_before: float) -> LedgerRecord | Pending:
        # Both reads in one read transaction, so one snapshot: read one by one, an attempt that commits its record
        # and releases its claim between them would look "not_found" - a false "never happened".
        with self.connect() as conn:
            conn.execute("BEGIN")
            try:
                record = self._completed(conn, key, not_before)
                row = conn.execute(
                    f"SELECT 1 FROM idempotency_claims WHERE {_KEY} AND lease_until > ?", (*key.params(), now)
                ).fetchone()
            finally:
                conn.execute("COMMIT")
        if record is not None:
            return record
        return "in_progress" if row is not None else "not_found"

    def claim(
        self, key: LedgerKey, now: float, not_before: float, lease_seconds: float, hold: Hold = no_hold
    ) -> LedgerRecord | str:
        claim_id = uuid.uuid4().hex
        # The check and the insert share one BEGIN IMMEDIATE transaction: two attempts never both find the key free.
        with self.transaction() as conn:
            record = self._completed(conn, key, not_before)
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

    def release(self, key: LedgerKey, claim_id: str) -> None:
        # By claim id: after a lease ran out another attempt may hold the key, and its claim must stay.
        with self.connect() as conn:
            conn.execute(f"DELETE FROM idempotency_claims WHERE {_KEY} AND claim_id = ?", (*key.params(), claim_id))

    def complete(
        self,
        key: LedgerKey,
        digest: str,
        effect: StoredEffect,
        now: float,
        not_before: float,
        hold: Hold = no_hold,
    ) -> tuple[LedgerRecord, bool]:
        with self.transaction() as conn:
            existing = self._completed(conn, key, not_before)
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
        return LedgerRecord(digest, status, body), True
