"""I/O: the SQLite dialect of the idempotency ledger (toolloop/servicekit/_sql.py has the algorithm). A write
transaction is BEGIN IMMEDIATE: it takes SQLite's single write lock up front, so check-then-insert is atomic
across every process on the database file; WAL lets readers run beside it, and a read transaction sees one
snapshot. A connection per operation: opening one is a file open, cheaper than sharing one across threads."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from toolloop.servicekit._sql import SqlLedger

BUSY_TIMEOUT_MS = 5000
# What SQLite answers when another connection holds the lock a statement needs.
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SqliteDialect:
    real_type = "REAL"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        # Autocommit mode: transactions are opened explicitly where they matter.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _begun(self, begin: str) -> Iterator[sqlite3.Connection]:
        with self.connect() as conn:
            conn.execute(begin)
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._begun("BEGIN IMMEDIATE")

    def snapshot(self) -> AbstractContextManager[sqlite3.Connection]:
        # A deferred transaction: its first read starts one read transaction that the later reads share.
        return self._begun("BEGIN")

    def sql(self, text: str) -> str:
        return text

    def create_schema(self, schema: str) -> None:
        with self.connect() as conn:
            # Two processes opening a new file at once (a service's replicas starting): the switch to WAL needs
            # the database alone, and SQLite may answer "locked" at once instead of waiting its busy timeout.
            # Asked again for as long as that timeout, then the error stands.
            deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
            while True:
                try:
                    conn.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError as exc:
                    # The primary code (the low byte): extended ones (SQLITE_BUSY_RECOVERY, ...) are busy too.
                    if exc.sqlite_errorcode & 0xFF not in _BUSY or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.05)
            conn.executescript(schema)

    def close(self) -> None:
        """Nothing is kept open between operations."""


class SqliteLedger(SqlLedger):
    """The ledger in the SQLite file `path` - the service's own database, so an effect's rows and its record
    commit together. The effect gets the transaction's `sqlite3.Connection`."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(SqliteDialect(path))
        self.path = str(path)
