"""I/O: the PostgreSQL dialect of the idempotency ledger (toolloop/servicekit/_sql.py has the algorithm), on
psycopg 3 with a connection pool. Writes run at READ COMMITTED: an insert whose key another transaction has
just inserted waits for it, then inserts nothing (ON CONFLICT DO NOTHING), so that attempt rolls back its own
effect with it and at most one effect per key commits, whichever process or connection it came from. A status
read is one REPEATABLE READ, READ ONLY transaction: one snapshot."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from toolloop.servicekit._sql import SqlLedger

# Serialises schema creation when several service processes start on one database at once.
_SCHEMA_LOCK = 7_422_001

Connection = psycopg.Connection[dict[str, Any]]


class PostgresDialect:
    real_type = "DOUBLE PRECISION"

    def __init__(
        self, dsn: str, *, connect_timeout_seconds: int, max_connections: int, pool_timeout_seconds: float
    ) -> None:
        self.dsn = dsn
        self._connect_timeout = connect_timeout_seconds
        self._max_connections = max_connections
        self._pool_timeout = pool_timeout_seconds
        self._pool: ConnectionPool[Connection] | None = None
        self._lock = threading.Lock()

    def _opened(self) -> ConnectionPool[Connection]:
        # Opened on first use (the kit's worker threads may get there at once), not in the constructor: building
        # a service must not need its database to answer yet.
        with self._lock:
            if self._pool is None:
                pool: ConnectionPool[Connection] = ConnectionPool(
                    self.dsn,
                    kwargs={"autocommit": True, "row_factory": dict_row, "connect_timeout": self._connect_timeout},
                    min_size=1,
                    max_size=self._max_connections,
                    timeout=self._pool_timeout,
                    # A connection the server dropped (a restart, an idle timeout) is replaced, not handed out.
                    check=ConnectionPool.check_connection,
                    open=False,
                )
                pool.open(wait=False)
                self._pool = pool
            return self._pool

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._opened().connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.connect() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        with self.transaction() as conn:
            # Set per transaction, never on the pooled connection, so the next user gets the defaults.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn

    def snapshot(self) -> AbstractContextManager[Connection]:
        return self._snapshot()

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def create_schema(self, schema: str) -> None:
        with self.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(schema)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class PostgresLedger(SqlLedger):
    """The ledger in the PostgreSQL database at `dsn` - the service's own database, so an effect's rows and
    its record commit together. The effect gets the transaction's `psycopg.Connection` (rows as dicts). The
    connections come from a pool of at most `max_connections` (the kit runs each step in one of Starlette's
    worker threads, 40 by default); `close()` closes it."""

    def __init__(
        self,
        dsn: str,
        connect_timeout_seconds: int = 5,
        *,
        max_connections: int = 10,
        pool_timeout_seconds: float = 10.0,
    ) -> None:
        super().__init__(
            PostgresDialect(
                dsn,
                connect_timeout_seconds=connect_timeout_seconds,
                max_connections=max_connections,
                pool_timeout_seconds=pool_timeout_seconds,
            )
        )
        self.dsn = dsn
