"""I/O: SQLite storage of the business service - schema, owner-scoped reads and the request log.

Every operation opens its own connection: several service processes may share one database file, so
nothing that matters lives in memory. Timestamps are stored as ISO 8601 UTC text ending in "Z"
(fixed width, so they sort as text); the request log uses `time.time()` floats.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_MS = 5000

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    user_id   TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    name      TEXT NOT NULL,
    PRIMARY KEY (tenant_id, user_id)
);
CREATE TABLE IF NOT EXISTS orders (
    order_id        TEXT PRIMARY KEY,
    user_id         TEXT NOT NULL,
    tenant_id       TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('placed', 'shipped', 'delivered', 'cancelled')),
    carrier         TEXT,
    tracking_number TEXT,
    placed_at       TEXT NOT NULL,
    shipped_at      TEXT,
    delivered_at    TEXT,
    total_cents     INTEGER NOT NULL CHECK (total_cents >= 0),
    refunded_cents  INTEGER NOT NULL DEFAULT 0 CHECK (refunded_cents >= 0 AND refunded_cents <= total_cents),
    currency        TEXT NOT NULL,
    version         INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS orders_by_owner ON orders (tenant_id, user_id, placed_at DESC, order_id);
CREATE TABLE IF NOT EXISTS order_items (
    order_id TEXT NOT NULL REFERENCES orders (order_id),
    line_no  INTEGER NOT NULL,
    sku      TEXT NOT NULL,
    name     TEXT NOT NULL,
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE IF NOT EXISTS tickets (
    ticket_id  TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    subject    TEXT NOT NULL,
    status     TEXT NOT NULL,
    priority   TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    version    INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS ticket_notes (
    note_id    TEXT PRIMARY KEY,
    ticket_id  TEXT NOT NULL REFERENCES tickets (ticket_id),
    text       TEXT NOT NULL,
    author     TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_by_ticket ON ticket_notes (ticket_id, created_at, note_id);
CREATE TABLE IF NOT EXISTS calendars (
    calendar_id TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    name        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS calendar_events (
    event_id    TEXT PRIMARY KEY,
    calendar_id TEXT NOT NULL REFERENCES calendars (calendar_id),
    title       TEXT NOT NULL,
    start_at    TEXT NOT NULL,
    end_at      TEXT NOT NULL,
    attendees   TEXT NOT NULL DEFAULT '[]',
    version     INTEGER NOT NULL DEFAULT 1,
    CHECK (end_at > start_at)
);
CREATE INDEX IF NOT EXISTS events_by_calendar ON calendar_events (calendar_id, start_at);
CREATE TABLE IF NOT EXISTS request_log (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    method     TEXT NOT NULL,
    path       TEXT NOT NULL,
    query      TEXT NOT NULL,
    actor_user TEXT,
    started_at REAL NOT NULL,
    ended_at   REAL,
    status     INTEGER
);
-- The whole rule is kept as JSON so new fault kinds need no migration; only the counter is a column,
-- because it is decremented atomically.
CREATE TABLE IF NOT EXISTS fault_rules (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    position   INTEGER NOT NULL,
    rule_json  TEXT NOT NULL,
    times_left INTEGER
);
"""


def iso_utc(moment: datetime) -> str:
    """The stored and returned form of a timestamp: UTC, second precision, "Z" suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


@dataclass(frozen=True)
class Owner:
    """The actor as the service sees it: every business read is scoped to it."""

    user_id: str
    tenant_id: str


class Store:
    def __init__(self, db_path: str | Path) -> None:
        self.db_path = str(db_path)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        # Autocommit mode: transactions are opened explicitly (BEGIN IMMEDIATE) where they matter.
        conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front, so read-then-write is atomic
        across processes."""
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def init(self) -> None:
        """Create the schema if missing; WAL lets readers in other processes run beside a writer."""
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)

    # --- Orders ---------------------------------------------------------------------------------

    def get_order(self, owner: Owner, order_id: str) -> dict[str, Any] | None:
        """The order if it exists and belongs to `owner`; None otherwise (the caller cannot tell which)."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT order_id, status, carrier, tracking_number, placed_at, shipped_at, delivered_at,"
                " total_cents, refunded_cents, currency, version"
                " FROM orders WHERE order_id = ? AND user_id = ? AND tenant_id = ?",
                (order_id, owner.user_id, owner.tenant_id),
            ).fetchone()
            if row is None:
                return None
            items = conn.execute(
                "SELECT sku, name, quantity FROM order_items WHERE order_id = ? ORDER BY line_no",
                (order_id,),
            ).fetchall()
        return {**dict(row), "items": [dict(item) for item in items]}

    def list_orders(self, owner: Owner, page: int, page_size: int) -> tuple[list[dict[str, Any]], int]:
        with self.connect() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM orders WHERE user_id = ? AND tenant_id = ?",
                (owner.user_id, owner.tenant_id),
            ).fetchone()[0]
            rows = conn.execute(
                "SELECT order_id, status, placed_at, total_cents, currency FROM orders"
                " WHERE user_id = ? AND tenant_id = ? ORDER BY placed_at DESC, order_id LIMIT ? OFFSET ?",
                (owner.user_id, owner.tenant_id, page_size, (page - 1) * page_size),
            ).fetchall()
        return [dict(r) for r in rows], int(total)

    # --- Tickets --------------------------------------------------------------------------------

    def get_ticket(self, owner: Owner, ticket_id: str) -> dict[str, Any] | None:
        with self.connect() as conn:
            row = conn.execute(
                "SELECT ticket_id, subject, status, priority, created_at, updated_at, version"
                " FROM tickets WHERE ticket_id = ? AND user_id = ? AND tenant_id = ?",
                (ticket_id, owner.user_id, owner.tenant_id),
            ).fetchone()
            if row is None:
                return None
            notes = conn.execute(
                "SELECT note_id, text, author, created_at FROM ticket_notes"
                " WHERE ticket_id = ? ORDER BY created_at, note_id",
                (ticket_id,),
            ).fetchall()
        return {**dict(row), "notes": [dict(n) for n in notes]}

    # --- Calendars ------------------------------------------------------------------------------

    def calendar_events(
        self, owner: Owner, calendar_id: str, start: datetime, end: datetime
    ) -> list[tuple[datetime, datetime]] | None:
        """Busy intervals of the calendar overlapping [start, end); None when it is not the owner's."""
        with self.connect() as conn:
            owned = conn.execute(
                "SELECT 1 FROM calendars WHERE calendar_id = ? AND user_id = ? AND tenant_id = ?",
                (calendar_id, owner.user_id, owner.tenant_id),
            ).fetchone()
            if owned is None:
                return None
            # Text comparison at second precision; the exact overlap test is done on datetimes below.
            rows = conn.execute(
                "SELECT start_at, end_at FROM calendar_events"
                " WHERE calendar_id = ? AND start_at <= ? AND end_at >= ? ORDER BY start_at",
                (calendar_id, iso_utc(end), iso_utc(start)),
            ).fetchall()
        intervals = [(parse_utc(r["start_at"]), parse_utc(r["end_at"])) for r in rows]
        return [(s, e) for s, e in intervals if s < end and e > start]

    # --- Request log ----------------------------------------------------------------------------

    def log_request_start(self, method: str, path: str, query: str, actor_user: str | None, started_at: float) -> int:
        with self.connect() as conn:
            cur = conn.execute(
                "INSERT INTO request_log (method, path, query, actor_user, started_at) VALUES (?, ?, ?, ?, ?)",
                (method, path, query, actor_user, started_at),
            )
            return int(cur.lastrowid or 0)

    def log_request_end(self, request_id: int, ended_at: float, status: int) -> None:
        with self.connect() as conn:
            conn.execute("UPDATE request_log SET ended_at = ?, status = ? WHERE id = ?", (ended_at, status, request_id))

    def list_requests(self, path_prefix: str = "") -> list[dict[str, Any]]:
        with self.connect() as conn:
            # substr instead of LIKE: a prefix with % or _ must match literally.
            rows = conn.execute(
                "SELECT id, method, path, query, actor_user, started_at, ended_at, status FROM request_log"
                " WHERE substr(path, 1, ?) = ? ORDER BY id",
                (len(path_prefix), path_prefix),
            ).fetchall()
        return [dict(r) for r in rows]

    def clear_request_log(self) -> None:
        with self.connect() as conn:
            conn.execute("DELETE FROM request_log")
