"""I/O: the idempotency ledger on a SQL database - one algorithm (claim, commit with the effect in the same
transaction, replay, status, retention purge) over a dialect that says how this database connects, locks,
takes a snapshot and writes its placeholders. SQLite and PostgreSQL are the two dialects (`_sqlite.py`,
`_postgres.py`).

Both tables have a primary key per (tenant, user, operation id), and every insert is `ON CONFLICT DO
NOTHING` (SQLite 3.24+ and PostgreSQL alike): an insert that finds the key taken inserts nothing, so the
algorithm never depends on how a database reports a conflict. What makes check-then-insert safe differs and
is the dialect's: SQLite's write transaction takes the single write lock up front; PostgreSQL waits on the
other transaction's uncommitted row, then inserts nothing.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from contextlib import AbstractContextManager
from typing import Any, Protocol

from toolloop.servicekit._ledger import (
    ClaimLost,
    ClaimTaken,
    CommitTooLate,
    Hold,
    LedgerKey,
    LedgerRecord,
    Pending,
    StoredEffect,
    no_hold,
)

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
    created_at   {real} NOT NULL,
    PRIMARY KEY (tenant_id, user_id, operation_id)
);
CREATE INDEX IF NOT EXISTS idempotency_records_by_age ON idempotency_records (created_at);
-- Attempts in flight: the primary key makes the claim atomic; the lease frees the key of a crashed process.
CREATE TABLE IF NOT EXISTS idempotency_claims (
    tenant_id    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    claim_id     TEXT NOT NULL,
    lease_until  {real} NOT NULL,
    PRIMARY KEY (tenant_id, user_id, operation_id)
);
"""

# Written with `?` placeholders; the dialect rewrites them (`Dialect.sql`).
_KEY = "tenant_id = ? AND user_id = ? AND operation_id = ?"
_COMPLETED = f"SELECT digest, status, body FROM idempotency_records WHERE {_KEY} AND created_at >= ?"
_LIVE_CLAIM = f"SELECT 1 AS live FROM idempotency_claims WHERE {_KEY} AND lease_until > ?"
_EXPIRED_CLAIM = f"DELETE FROM idempotency_claims WHERE {_KEY} AND lease_until <= ?"
_NEW_CLAIM = (
    "INSERT INTO idempotency_claims (tenant_id, user_id, operation_id, claim_id, lease_until)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_RELEASE = f"DELETE FROM idempotency_claims WHERE {_KEY} AND claim_id = ?"
_OWN_CLAIM = f"SELECT 1 AS held FROM idempotency_claims WHERE {_KEY} AND claim_id = ?"
_STALE_RECORD = f"DELETE FROM idempotency_records WHERE {_KEY} AND created_at < ?"
_NEW_RECORD = (
    "INSERT INTO idempotency_records (tenant_id, user_id, operation_id, digest, status, body, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_PURGE = "DELETE FROM idempotency_records WHERE created_at < ?"


class Dialect(Protocol):
    """How one database is reached. Connections run in autocommit mode and give rows by column name; an
    effect gets the connection of the transaction it runs in."""

    # The column type of the times (time.time()) in the ledger's tables.
    real_type: str

    def connect(self) -> AbstractContextManager[Any]:
        """A connection outside any transaction (each statement commits on its own)."""
        ...

    def transaction(self) -> AbstractContextManager[Any]:
        """A write transaction on a connection: committed when the block ends, rolled back if it raises. Under
        it, a read of a key and an insert of that key cannot interleave with another transaction's insert."""
        ...

    def snapshot(self) -> AbstractContextManager[Any]:
        """A read-only transaction in which every read sees the same moment."""
        ...

    def sql(self, text: str) -> str:
        """`text` with this database's placeholders."""
        ...

    def create_schema(self, schema: str) -> None:
        """Run `schema` (the ledger's DDL with this database's types) once, also when processes start at once."""
        ...

    def close(self) -> None: ...


class _LostTheRace(Exception):
    """Another attempt recorded this key first: roll this attempt's effect back."""


class SqlLedger:
    """The ledger in the service's own SQL database (see `Ledger` for the contract), so an effect's rows and
    its record commit together. `SqliteLedger(path)` and `PostgresLedger(dsn)` make one."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    def connect(self) -> AbstractContextManager[Any]:
        """A connection of the service's database, in autocommit mode (for the service's own reads)."""
        return self.dialect.connect()

    def transaction(self) -> AbstractContextManager[Any]:
        """A write transaction of the service's database (for the service's own writes)."""
        return self.dialect.transaction()

    def close(self) -> None:
        """Close the connections the ledger keeps (PostgreSQL's pool); it opens them again when used."""
        self.dialect.close()

    def init(self) -> None:
        self.dialect.create_schema(SCHEMA.format(real=self.dialect.real_type))

    def _completed(self, conn: Any, key: LedgerKey, not_before: float) -> LedgerRecord | None:
        row = conn.execute(self.dialect.sql(_COMPLETED), (*key.params(), not_before)).fetchone()
        return None if row is None else LedgerRecord(row["digest"], int(row["status"]), json.loads(row["body"]))

    def purge(self, older_than: float) -> None:
        with self.dialect.connect() as conn:
            conn.execute(self.dialect.sql(_PURGE), (older_than,))

    def lookup(self, key: LedgerKey, now: float, not_before: float) -> LedgerRecord | Pending:
        # Both reads from one snapshot: read one by one, an attempt that commits its record and releases its
        # claim between them would look "not_found" - a false "never happened".
        with self.dialect.snapshot() as conn:
            record = self._completed(conn, key, not_before)
            live = conn.execute(self.dialect.sql(_LIVE_CLAIM), (*key.params(), now)).fetchone()
        if record is not None:
            return record
        return "in_progress" if live is not None else "not_found"

    def claim(
        self, key: LedgerKey, now: float, not_before: float, lease_seconds: float, hold: Hold = no_hold
    ) -> LedgerRecord | str:
        claim_id = uuid.uuid4().hex
        # The check and the insert share one write transaction: two attempts never both find the key free.
        with self.dialect.transaction() as conn:
            record = self._completed(conn, key, not_before)
            if record is not None:
                return record
            conn.execute(self.dialect.sql(_EXPIRED_CLAIM), (*key.params(), now))
            hold("claim_checked")
            inserted = conn.execute(self.dialect.sql(_NEW_CLAIM), (*key.params(), claim_id, now + lease_seconds))
            if inserted.rowcount != 1:
                raise ClaimTaken
        return claim_id

    def release(self, key: LedgerKey, claim_id: str) -> None:
        # By claim id: after a lease ran out another attempt may hold the key, and its claim must stay.
        with self.dialect.connect() as conn:
            conn.execute(self.dialect.sql(_RELEASE), (*key.params(), claim_id))

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
        try:
            with self.dialect.transaction() as conn:
                existing = self._completed(conn, key, not_before)
                if existing is not None:
                    return existing, False
                # A record past retention that the purge has not removed yet must not block the new one.
                conn.execute(self.dialect.sql(_STALE_RECORD), (*key.params(), not_before))
                status, body = effect(conn)
                hold("effect_written")
                params = (*key.params(), digest, status, json.dumps(body), now)
                if conn.execute(self.dialect.sql(_NEW_RECORD), params).rowcount != 1:
                    raise _LostTheRace  # rolls back this attempt's effect
                # Last, after any stall (a slow effect, a lock wait, a paused process): raising rolls back.
                if time.time() >= commit_by:
                    raise CommitTooLate
                own = (*key.params(), claim_id)
                if claim_id is not None and conn.execute(self.dialect.sql(_OWN_CLAIM), own).fetchone() is None:
                    raise ClaimLost
        except _LostTheRace:
            with self.dialect.connect() as conn:
                winner = self._completed(conn, key, not_before)
            if winner is None:  # pragma: no cover - the winner's record is committed before our insert returns
                raise RuntimeError("the idempotency record that won the race is gone") from None
            return winner, False
        return LedgerRecord(digest, status, body), True
