"""I/O: SQLite storage of the business service - schema, owner-scoped reads, the write effects and the
request log.

Every operation opens its own connection: several service processes may share one database file, so
nothing that matters lives in memory. Timestamps are stored as ISO 8601 UTC text ending in "Z"
(fixed width, so they sort as text); the request log uses `time.time()` floats.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from toolloop.servicekit import SqliteLedger

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    user_id   TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    name      TEXT NOT NULL,
    PRIMARY KEY (tenant_id, user_id)
);
-- An order's paid_from is the account it was paid from (a refund goes there unless told otherwise), its
-- promised_by when its delivery was promised by (whether it is late is computed when it is read).
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
    version         INTEGER NOT NULL DEFAULT 1,
    paid_from       TEXT,
    promised_by     TEXT
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
-- Effect rows (notes, events, refunds) carry the operation id and actor that made them (NULL for seed
-- data): the test oracle counts effects per operation id from these tables, independently of the ledger.
CREATE TABLE IF NOT EXISTS ticket_notes (
    note_id      TEXT PRIMARY KEY,
    ticket_id    TEXT NOT NULL REFERENCES tickets (ticket_id),
    text         TEXT NOT NULL,
    author       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    operation_id TEXT,
    actor_user   TEXT,
    actor_tenant TEXT
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
    operation_id TEXT,
    actor_user   TEXT,
    actor_tenant TEXT,
    CHECK (end_at > start_at)
);
CREATE INDEX IF NOT EXISTS events_by_calendar ON calendar_events (calendar_id, start_at);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id    TEXT PRIMARY KEY,
    order_id     TEXT NOT NULL REFERENCES orders (order_id),
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
    reason       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    operation_id TEXT,
    actor_user   TEXT,
    actor_tenant TEXT,
    to_account   TEXT
);
CREATE INDEX IF NOT EXISTS refunds_by_order ON refunds (order_id, created_at, refund_id);
CREATE TABLE IF NOT EXISTS request_log (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    method     TEXT NOT NULL,
    path       TEXT NOT NULL,
    query      TEXT NOT NULL,
    actor_user TEXT,
    started_at REAL NOT NULL,
    ended_at   REAL,
    status     INTEGER,
    -- A write's Idempotency-Key, and the SHA-256 of its body (canonical JSON): the test bed tells two
    -- attempts of one payload apart from two payloads by it.
    idempotency_key TEXT,
    body_digest     TEXT
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

# Columns added after the first release: databases created earlier get them by ALTER TABLE.
_ADDED_COLUMNS = [
    (table, column, "TEXT")
    for table in ("ticket_notes", "calendar_events")
    for column in ("operation_id", "actor_user", "actor_tenant")
] + [
    # How many requests a fault rule matched, and how often it fired (the Nth-call and seeded rules).
    ("fault_rules", "matched", "INTEGER NOT NULL DEFAULT 0"),
    ("fault_rules", "fired", "INTEGER NOT NULL DEFAULT 0"),
    ("fault_rules", "first_fired_at", "REAL"),
    ("request_log", "idempotency_key", "TEXT"),
    ("request_log", "body_digest", "TEXT"),
    # Filled in for existing rows by _backfill (an order's paid_from and promised_by follow the seed's rule;
    # a refund made before destinations were recorded went to the order's paid_from).
    ("orders", "paid_from", "TEXT"),
    ("orders", "promised_by", "TEXT"),
    ("refunds", "to_account", "TEXT"),
]
# How long after it was placed a seeded order's delivery is promised by.
PROMISED_AFTER = timedelta(days=4)
_EFFECT_INDEXES = """
CREATE INDEX IF NOT EXISTS notes_by_operation ON ticket_notes (operation_id);
CREATE INDEX IF NOT EXISTS events_by_operation ON calendar_events (operation_id);
CREATE INDEX IF NOT EXISTS refunds_by_operation ON refunds (operation_id);
"""


def iso_utc(moment: datetime) -> str:
    """The stored and returned form of a timestamp: UTC, second precision, "Z" suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def default_paid_from(user_id: str, order_id: str) -> str:
    """The account an order was paid from, as the demo data has it: acct-<user>-0001 for even order
    numbers, acct-<user>-0002 for odd ones."""
    return f"acct-{user_id}-{'0001' if int(order_id[1:]) % 2 == 0 else '0002'}"


def default_promised_by(placed_at: str) -> str:
    """When an order's delivery was promised by, as the demo data has it: 4 days after it was placed."""
    return iso_utc(parse_utc(placed_at) + PROMISED_AFTER)


def is_late(status: str, delivered_at: str | None, promised_by: str | None, now: datetime) -> bool:
    """Late: delivered after the promised time, or not delivered (nor cancelled) and the time has passed."""
    if promised_by is None or status == "cancelled":
        return False
    promised = parse_utc(promised_by)
    if delivered_at is not None:
        return parse_utc(delivered_at) > promised
    return now > promised


def _backfill(conn: sqlite3.Connection) -> None:
    """Rows of a database made before these columns existed get the values the demo data would have."""
    orders = conn.execute(
        "SELECT order_id, user_id, placed_at, paid_from, promised_by FROM orders"
        " WHERE paid_from IS NULL OR promised_by IS NULL"
    ).fetchall()
    for row in orders:
        conn.execute(
            "UPDATE orders SET paid_from = ?, promised_by = ? WHERE order_id = ?",
            (
                row["paid_from"] or default_paid_from(row["user_id"], row["order_id"]),
                row["promised_by"] or default_promised_by(row["placed_at"]),
                row["order_id"],
            ),
        )
    conn.execute(
        "UPDATE refunds SET to_account = (SELECT paid_from FROM orders WHERE orders.order_id = refunds.order_id)"
        " WHERE to_account IS NULL"
    )


@dataclass(frozen=True)
class Owner:
    """The actor as the service sees it: every business read is scoped to it."""

    user_id: str
    tenant_id: str


class Store:
    """The service's database. Its connections follow the idempotency kit's SQLite rules (one connection per
    operation, autocommit, BEGIN IMMEDIATE for writes), since the kit's ledger lives in the same file and the
    write effects run inside the ledger's transactions."""

    def __init__(self, db_path: str | Path) -> None:
        self.db_path = str(db_path)
        self._sqlite = SqliteLedger(self.db_path)

    def connect(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._sqlite.connect()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction that takes the write lock up front, so read-then-write is atomic across processes."""
        return self._sqlite.transaction()

    def init(self) -> None:
        """Create the schema if missing; WAL lets readers in other processes run beside a writer."""
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
        # Check and ALTER in one write transaction: several processes may start on one file at once.
        with self.transaction() as conn:
            for table, column, decl in _ADDED_COLUMNS:
                present = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
                if column not in present:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            _backfill(conn)
        with self.connect() as conn:
            conn.executescript(_EFFECT_INDEXES)

    # --- Users ----------------------------------------------------------------------------------

    def get_user(self, owner: Owner) -> dict[str, Any] | None:
        with self.connect() as conn:
            row = conn.execute(
                "SELECT user_id, tenant_id, name FROM users WHERE user_id = ? AND tenant_id = ?",
                (owner.user_id, owner.tenant_id),
            ).fetchone()
        return None if row is None else dict(row)

    def remove_user(self, owner: Owner) -> bool:
        with self.transaction() as conn:
            removed = conn.execute(
                "DELETE FROM users WHERE user_id = ? AND tenant_id = ?", (owner.user_id, owner.tenant_id)
            ).rowcount
        return removed == 1

    def user_exists(self, owner: Owner) -> bool:
        return self.get_user(owner) is not None

    # --- Orders ---------------------------------------------------------------------------------

    def get_order(self, owner: Owner, order_id: str, now: datetime | None = None) -> dict[str, Any] | None:
        """The order if it exists and belongs to `owner`; None otherwise (the caller cannot tell which).
        Whether it is late is decided at `now` (the current time by default)."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT order_id, status, carrier, tracking_number, placed_at, shipped_at, delivered_at,"
                " total_cents, refunded_cents, currency, version, paid_from, promised_by"
                " FROM orders WHERE order_id = ? AND user_id = ? AND tenant_id = ?",
                (order_id, owner.user_id, owner.tenant_id),
            ).fetchone()
            if row is None:
                return None
            items = conn.execute(
                "SELECT sku, name, quantity FROM order_items WHERE order_id = ? ORDER BY line_no",
                (order_id,),
            ).fetchall()
        late = is_late(row["status"], row["delivered_at"], row["promised_by"], now or datetime.now(UTC))
        refundable = row["total_cents"] - row["refunded_cents"]
        return {**dict(row), "late": late, "refundable_cents": refundable, "items": [dict(item) for item in items]}

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
                "SELECT ticket_id, user_id AS owner, subject, status, priority, created_at, updated_at, version"
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

    def get_event(self, owner: Owner, calendar_id: str, event_id: str) -> dict[str, Any] | None:
        with self.connect() as conn:
            row = conn.execute(
                "SELECT e.event_id, e.calendar_id, e.title, e.start_at, e.end_at, e.attendees"
                " FROM calendar_events e JOIN calendars c ON c.calendar_id = e.calendar_id"
                " WHERE e.event_id = ? AND e.calendar_id = ? AND c.user_id = ? AND c.tenant_id = ?",
                (event_id, calendar_id, owner.user_id, owner.tenant_id),
            ).fetchone()
        return None if row is None else _event(row)

    # --- Refunds --------------------------------------------------------------------------------

    def list_refunds(self, owner: Owner, order_id: str) -> dict[str, Any] | None:
        with self.connect() as conn:
            order = conn.execute(
                "SELECT total_cents, refunded_cents, paid_from FROM orders"
                " WHERE order_id = ? AND user_id = ? AND tenant_id = ?",
                (order_id, owner.user_id, owner.tenant_id),
            ).fetchone()
            if order is None:
                return None
            rows = conn.execute(
                "SELECT refund_id, amount_cents, reason, to_account, created_at FROM refunds"
                " WHERE order_id = ? ORDER BY created_at, refund_id",
                (order_id,),
            ).fetchall()
        return {
            "order_id": order_id,
            "refunds": [dict(r) for r in rows],
            "refunded_cents": order["refunded_cents"],
            "total_cents": order["total_cents"],
            "paid_from": order["paid_from"],
        }

    # --- Effects as the test oracle sees them -----------------------------------------------------

    def list_effects(self, operation_id: str | None) -> list[dict[str, Any]]:
        """Every effect made by a write (seed data has no operation id), optionally of one operation id."""
        where = "operation_id = ?" if operation_id is not None else "operation_id IS NOT NULL"
        params = (operation_id,) if operation_id is not None else ()
        queries = [
            ("note", "SELECT note_id AS id, ticket_id, text, created_at, {cols} FROM ticket_notes"),
            (
                "event",
                "SELECT event_id AS id, calendar_id, title, start_at AS start, end_at AS end, attendees, {cols}"
                " FROM calendar_events",
            ),
            (
                "refund",
                "SELECT refund_id AS id, order_id, amount_cents, reason, to_account, created_at, {cols} FROM refunds",
            ),
        ]
        effects: list[dict[str, Any]] = []
        with self.connect() as conn:
            for kind, query in queries:
                sql = query.format(cols="operation_id, actor_user, actor_tenant") + f" WHERE {where} ORDER BY rowid"
                for row in conn.execute(sql, params):
                    effect = {"kind": kind, **dict(row)}
                    if kind == "event":
                        effect["attendees"] = json.loads(effect["attendees"])
                    effects.append(effect)
        return effects

    # --- Request log ----------------------------------------------------------------------------

    def log_request_start(
        self,
        method: str,
        path: str,
        query: str,
        actor_user: str | None,
        started_at: float,
        idempotency_key: str | None = None,
        body_digest: str | None = None,
    ) -> int:
        with self.connect() as conn:
            cur = conn.execute(
                "INSERT INTO request_log (method, path, query, actor_user, started_at, idempotency_key, body_digest)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (method, path, query, actor_user, started_at, idempotency_key, body_digest),
            )
            return int(cur.lastrowid or 0)

    def log_request_end(self, request_id: int, ended_at: float, status: int) -> None:
        with self.connect() as conn:
            conn.execute("UPDATE request_log SET ended_at = ?, status = ? WHERE id = ?", (ended_at, status, request_id))

    def list_requests(self, path_prefix: str = "") -> list[dict[str, Any]]:
        with self.connect() as conn:
            # substr instead of LIKE: a prefix with % or _ must match literally.
            rows = conn.execute(
                "SELECT id, method, path, query, actor_user, started_at, ended_at, status, idempotency_key,"
                " body_digest FROM request_log"
                " WHERE substr(path, 1, ?) = ? ORDER BY id",
                (len(path_prefix), path_prefix),
            ).fetchall()
        return [dict(r) for r in rows]

    def clear_request_log(self) -> None:
        with self.connect() as conn:
            conn.execute("DELETE FROM request_log")


def _event(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "event_id": row["event_id"],
        "calendar_id": row["calendar_id"],
        "title": row["title"],
        "start": row["start_at"],
        "end": row["end_at"],
        "attendees": json.loads(row["attendees"]),
    }


# --- Write effects ----------------------------------------------------------------------------------
# Each runs on the connection of the ledger's write transaction (BEGIN IMMEDIATE), so its checks, its
# rows and the ledger record commit together or not at all. A Refused is raised before anything is written.


class Refused(Exception):
    """A definite business "no" (not available, stale version, not refundable) decided by an effect."""


class NotOwned(Refused):
    def __init__(self, kind: str, object_id: str) -> None:
        super().__init__(f"{kind} {object_id} is not available")
        self.kind = kind
        self.object_id = object_id


class StaleVersion(Refused):
    def __init__(self, current_version: int) -> None:
        super().__init__(f"the current version is {current_version}")
        self.current_version = current_version


class NotRefundable(Refused):
    def __init__(self, refundable_cents: int) -> None:
        super().__init__(f"at most {refundable_cents} cents are refundable")
        self.refundable_cents = refundable_cents


@dataclass(frozen=True)
class Provenance:
    """Who made an effect under which operation id: stored on every effect row."""

    owner: Owner
    operation_id: str
    at: datetime

    def columns(self) -> tuple[str, str, str]:
        return (self.operation_id, self.owner.user_id, self.owner.tenant_id)


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def append_note(
    conn: sqlite3.Connection, by: Provenance, ticket_id: str, text: str, expected_version: int
) -> dict[str, Any]:
    owner = by.owner
    row = conn.execute(
        "SELECT version FROM tickets WHERE ticket_id = ? AND user_id = ? AND tenant_id = ?",
        (ticket_id, owner.user_id, owner.tenant_id),
    ).fetchone()
    if row is None:
        raise NotOwned("ticket", ticket_id)
    if row["version"] != expected_version:
        raise StaleVersion(int(row["version"]))
    note_id, created_at = _new_id("N"), iso_utc(by.at)
    conn.execute(
        "INSERT INTO ticket_notes (note_id, ticket_id, text, author, created_at, operation_id, actor_user,"
        " actor_tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (note_id, ticket_id, text, owner.user_id, created_at, *by.columns()),
    )
    conn.execute(
        "UPDATE tickets SET version = version + 1, updated_at = ? WHERE ticket_id = ?", (created_at, ticket_id)
    )
    return {
        "note_id": note_id,
        "ticket_id": ticket_id,
        "text": text,
        "author": owner.user_id,
        "created_at": created_at,
        "ticket_version": expected_version + 1,
    }


def create_event(
    conn: sqlite3.Connection,
    by: Provenance,
    calendar_id: str,
    title: str,
    start: datetime,
    end: datetime,
    attendees: Sequence[str],
) -> dict[str, Any]:
    owned = conn.execute(
        "SELECT 1 FROM calendars WHERE calendar_id = ? AND user_id = ? AND tenant_id = ?",
        (calendar_id, by.owner.user_id, by.owner.tenant_id),
    ).fetchone()
    if owned is None:
        raise NotOwned("calendar", calendar_id)
    event_id = _new_id("E")
    conn.execute(
        "INSERT INTO calendar_events (event_id, calendar_id, title, start_at, end_at, attendees, operation_id,"
        " actor_user, actor_tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (event_id, calendar_id, title, iso_utc(start), iso_utc(end), json.dumps(list(attendees)), *by.columns()),
    )
    row = conn.execute(
        "SELECT event_id, calendar_id, title, start_at, end_at, attendees FROM calendar_events WHERE event_id = ?",
        (event_id,),
    ).fetchone()
    return _event(row)


def refund_order(
    conn: sqlite3.Connection,
    by: Provenance,
    order_id: str,
    amount_cents: int,
    reason: str,
    to_account: str | None = None,
) -> dict[str, Any]:
    """Refund `amount_cents` of the order to `to_account` (None: the account it was paid from). Whether another
    account may receive it is the approval policy's question, not the service's."""
    owner = by.owner
    order = conn.execute(
        "SELECT total_cents, refunded_cents, paid_from FROM orders"
        " WHERE order_id = ? AND user_id = ? AND tenant_id = ?",
        (order_id, owner.user_id, owner.tenant_id),
    ).fetchone()
    if order is None:
        raise NotOwned("order", order_id)
    refundable = order["total_cents"] - order["refunded_cents"]
    if amount_cents > refundable:
        raise NotRefundable(int(refundable))
    refund_id, created_at = _new_id("R"), iso_utc(by.at)
    destination = to_account if to_account is not None else order["paid_from"]
    conn.execute(
        "INSERT INTO refunds (refund_id, order_id, amount_cents, reason, to_account, created_at, operation_id,"
        " actor_user, actor_tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (refund_id, order_id, amount_cents, reason, destination, created_at, *by.columns()),
    )
    conn.execute(
        "UPDATE orders SET refunded_cents = refunded_cents + ?, version = version + 1 WHERE order_id = ?",
        (amount_cents, order_id),
    )
    refunded = order["refunded_cents"] + amount_cents
    return {
        "refund_id": refund_id,
        "order_id": order_id,
        "amount_cents": amount_cents,
        "reason": reason,
        "to_account": destination,
        "refunded_cents": refunded,
        "refundable_cents": order["total_cents"] - refunded,
        "created_at": created_at,
    }
