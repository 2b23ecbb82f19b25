"""I/O: the idempotency ledger on PostgreSQL (psycopg 3). The record's primary key decides: an attempt whose
record insert finds the key taken rolls back its own effect with it and returns the record that won, so at
most one effect per key commits, whichever process or connection it came from."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from toolloop.servicekit._ledger import ClaimTaken, Hold, LedgerKey, LedgerRecord, Pending, StoredEffect, no_hold

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_records (
    tenant_id    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    digest       TEXT NOT NULL,
    status       INTEGER NOT NULL,
    body         TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant_id, user_id, operation_id)
);
CREATE INDEX IF NOT EXISTS idempotency_records_by_age ON idempotency_records (created_at);
CREATE TABLE IF NOT EXISTS idempotency_claims (
    tenant_id    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    claim_id     TEXT NOT NULL,
    lease_until  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant_id, user_id, operation_id)
);
"""

_KEY = "tenant_id = %s AND user_id = %s AND operation_id = %s"
# Serialises schema creation when several service processes start on one database at once.
_SCHEMA_LOCK = 7_422_001


class _LostTheRace(Exception):
    """Another attempt recorded this key first: roll this attempt's effect back."""


class PostgresLedger:
    """The ledger in the PostgreSQL database at `dsn` - the service's own database, so an effect's rows and
    its record commit together. The effect gets the transaction's `psycopg.Connection` (rows as dicts)."""

    def __init__(self, dsn: str, connect_timeout_seconds: int = 5) -> None:
        self.dsn = dsn
        self._connect_timeout = connect_timeout_seconds

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with psycopg.connect(
            self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=self._connect_timeout
        ) as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with self.connect() as conn, conn.transaction():
            yield conn

    def init(self) -> None:
        with self.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(SCHEMA)

    @staticmethod
    def _completed(conn: psycopg.Connection[dict[str, Any]], key: LedgerKey, not_before: float) -> LedgerRecord | None:
        row = conn.execute(
            f"SELECT digest, status, body FROM idempotency_records WHERE {_KEY} AND created_at >= %s",
            (*key.params(), not_before),
        ).fetchone()
        return None if row is None else LedgerRecord(row["digest"], int(row["status"]), json.loads(row["body"]))

    def purge(self, older_than: float) -> None:
        with self.connect() as conn:
            conn.execute("DELETE FROM idempotency_records WHERE created_at < %s", (older_than,))

    def lookup(self, key: LedgerKey, now: float, not_before: float) -> LedgerRecord | Pending:
        # Both reads from one snapshot: read one by one (READ COMMITTED), an attempt that commits its record
        # and then releases its claim between them would look "not_found" - a false "never happened".
        with self.connect() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            with conn.transaction():
                record = self._completed(conn, key, not_before)
                if record is not None:
                    return record
                row = conn.execute(
                    f"SELECT 1 AS live FROM idempotency_claims WHERE {_KEY} AND lease_until > %s",
                    (*key.params(), now),
                ).fetchone()
        return "in_progress" if row is not None else "not_found"

    def claim(
        self, key: LedgerKey, now: float, not_before: float, lease_seconds: float, hold: Hold = no_hold
    ) -> LedgerRecord | str:
        claim_id = uuid.uuid4().hex
        with self.transaction() as conn:
            record = self._completed(conn, key, not_before)
            if record is not None:
                return record
            conn.execute(f"DELETE FROM idempotency_claims WHERE {_KEY} AND lease_until <= %s", (*key.params(), now))
            hold("claim_checked")
            # A concurrent insert of the same key waits for the other transaction, then inserts nothing.
            inserted = conn.execute(
                "INSERT INTO idempotency_claims (tenant_id, user_id, operation_id, claim_id, lease_until)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (*key.params(), claim_id, now + lease_seconds),
            ).rowcount
            if inserted != 1:
                raise ClaimTaken
        return claim_id

    def release(self, key: LedgerKey, claim_id: str) -> None:
        # By claim id: after a lease ran out another attempt may hold the key, and its claim must stay.
        with self.connect() as conn:
            conn.execute(f"DELETE FROM idempotency_claims WHERE {_KEY} AND claim_id = %s", (*key.params(), claim_id))

    def complete(
        self,
        key: LedgerKey,
        digest: str,
        effect: StoredEffect,
        now: float,
        not_before: float,
        hold: Hold = no_hold,
    ) -> tuple[LedgerRecord, bool]:
        try:
            with self.transaction() as conn:
                existing = self._completed(conn, key, not_before)
                if existing is not None:
                    return existing, False
                # A record past retention that the purge has not removed yet must not block the new one.
                conn.execute(
                    f"DELETE FROM idempotency_records WHERE {_KEY} AND created_at < %s", (*key.params(), not_before)
                )
                status, body = effect(conn)
                hold("effect_written")
                inserted = conn.execute(
                    "INSERT INTO idempotency_records"
                    " (tenant_id, user_id, operation_id, digest, status, body, created_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (*key.params(), digest, status, json.dumps(body), now),
                ).rowcount
                if inserted != 1:
                    raise _LostTheRace  # rolls back this attempt's effect
        except _LostTheRace:
            with self.connect() as conn:
                winner = self._completed(conn, key, not_before)
            if winner is None:  # pragma: no cover - the winner's record is committed before our insert returns
                raise RuntimeError("the idempotency record that won the race is gone") from None
            return winner, False
        return LedgerRecord(digest, status, body), True
