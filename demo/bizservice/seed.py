"""I/O: fixed, deterministic demo data, inserted once into an empty database (no "now"-relative dates)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from demo.bizservice.store import Store, default_paid_from, default_promised_by, iso_utc

SEED_FACTS: Final[dict[str, Any]] = {
    # Who exists: tenant -> users. "u1" exists in both tenants as two different people (and owns nothing
    # in globex): identity is always the (tenant, user) pair.
    "tenants": {"acme": ["u1", "u2"], "globex": ["u3", "u1"]},
    # One manager per tenant (a user of the service too; config/api_tokens.json gives them the role).
    "managers": {"acme": ("m1", "Margaret Hamilton"), "globex": ("m1", "Katherine Johnson")},
    "order_a100": {
        "order_id": "A100",
        "owner": ("u1", "acme"),
        "status": "shipped",
        "carrier": "DHL",
        "tracking_number": "JJD000390012345678",
        "total_cents": 12999,
        "currency": "EUR",
        "items": 2,
        "paid_from": "acct-u1-0001",
        # Shipped, not delivered, and promised by 2026-01-09: late from then on.
        "promised_by": "2026-01-09T11:00:00Z",
        "late": True,
    },
    "order_a101": {"order_id": "A101", "owner": ("u2", "acme"), "status": "placed", "paid_from": "acct-u2-0002"},
    # Delivered a day before its promised time: not late.
    "order_a102": {
        "order_id": "A102",
        "owner": ("u1", "acme"),
        "status": "delivered",
        "paid_from": "acct-u1-0001",
        "total_cents": 2599,
        "promised_by": "2026-01-11T13:00:00Z",
        "late": False,
    },
    # Orders per user (u1 has 25, so page_size 20 gives pages of 20 and 5).
    "order_counts": {"u1": 25, "u2": 9, "u3": 7},
    "missing_order_id": "A999",
    "ticket_t1001": {
        "ticket_id": "T1001",
        "owner": ("u1", "acme"),
        "subject": "Package arrived damaged",
        "status": "open",
        "version": 1,
        "notes": 1,
    },
    "ticket_t1002": {"ticket_id": "T1002", "owner": ("u2", "acme"), "status": "open"},
    "ticket_t1003": {"ticket_id": "T1003", "owner": ("u1", "acme"), "status": "closed"},
    "calendars": {"cal-u1": ("u1", "acme"), "cal-u2": ("u2", "acme"), "cal-u3": ("u3", "globex")},
    # cal-u1 busy times (2026-12-01 is a Tuesday); working hours are 09:00-17:00 UTC, Monday-Friday.
    "cal_u1_events": [
        ("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"),
        ("2026-12-01T14:00:00Z", "2026-12-01T15:30:00Z"),
        ("2026-12-02T09:00:00Z", "2026-12-02T12:00:00Z"),
    ],
    "cal_u1_free_2026_12_01": [
        ("2026-12-01T09:00:00Z", "2026-12-01T10:00:00Z"),
        ("2026-12-01T11:00:00Z", "2026-12-01T14:00:00Z"),
        ("2026-12-01T15:30:00Z", "2026-12-01T17:00:00Z"),
    ],
}

_USERS = [
    ("u1", "acme", "Ada Lovelace"),
    ("u2", "acme", "Grace Hopper"),
    ("u3", "globex", "Hank Scorpio"),
    ("u1", "globex", "Ulla Eins"),
    *((user_id, tenant_id, name) for tenant_id, (user_id, name) in SEED_FACTS["managers"].items()),
]
_BASE = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
_STATUS_CYCLE = ("delivered", "shipped", "placed", "cancelled")
_CATALOG = [
    ("SKU-HP-200", "Wireless headphones"),
    ("SKU-CBL-USB", "USB-C cable"),
    ("SKU-MUG-01", "Coffee mug"),
    ("SKU-BAG-15", "Laptop sleeve 15in"),
    ("SKU-LMP-07", "Desk lamp"),
]


def _order_owner(n: int) -> tuple[str, str]:
    """A100..A140: A100/A102 and A103-A125 are u1's, A101 and A126-A133 u2's, A134-A140 u3's."""
    if n in (100, 102) or 103 <= n <= 125:
        return "u1", "acme"
    if n == 101 or 126 <= n <= 133:
        return "u2", "acme"
    return "u3", "globex"


def _orders() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    orders: list[tuple[Any, ...]] = []
    items: list[tuple[Any, ...]] = []
    for n in range(100, 141):
        order_id = f"A{n}"
        user_id, tenant_id = _order_owner(n)
        placed = _BASE + timedelta(days=n - 100, hours=n % 7)
        if n == 100:
            status, carrier, tracking, total = "shipped", "DHL", "JJD000390012345678", 12999
        elif n == 101:
            status, carrier, tracking, total = "placed", None, None, 4550
        elif n == 102:
            status, carrier, tracking, total = "delivered", "UPS", "1Z999AA10123456784", 2599
        else:
            status = _STATUS_CYCLE[n % len(_STATUS_CYCLE)]
            carrier, tracking = ("DHL", f"JJD0003900{n:08d}") if status in ("shipped", "delivered") else (None, None)
            total = 1000 + (n * 377) % 9000
        shipped = iso_utc(placed + timedelta(days=1)) if status in ("shipped", "delivered") else None
        delivered = iso_utc(placed + timedelta(days=3)) if status == "delivered" else None
        placed_at = iso_utc(placed)
        paid_from, promised_by = default_paid_from(user_id, order_id), default_promised_by(placed_at)
        orders.append(
            (order_id, user_id, tenant_id, status, carrier, tracking, placed_at, shipped, delivered, total, "EUR")
            + (paid_from, promised_by)
        )
        if n == 100:
            items += [
                (order_id, 1, "SKU-HP-200", "Wireless headphones", 1),
                (order_id, 2, "SKU-CBL-USB", "USB-C cable", 2),
            ]
        else:
            sku, name = _CATALOG[n % len(_CATALOG)]
            items.append((order_id, 1, sku, name, 1 + n % 3))
    return orders, items


def seed(store: Store) -> bool:
    """Insert the demo data if the database holds none; True when it did. Safe to run from several
    processes at once: the check and the inserts share one write transaction."""
    with store.transaction() as conn:
        if conn.execute("SELECT COUNT(*) FROM users").fetchone()[0] > 0:
            return False
        conn.executemany("INSERT INTO users (user_id, tenant_id, name) VALUES (?, ?, ?)", _USERS)
        orders, items = _orders()
        conn.executemany(
            "INSERT INTO orders (order_id, user_id, tenant_id, status, carrier, tracking_number, placed_at,"
            " shipped_at, delivered_at, total_cents, currency, paid_from, promised_by)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            orders,
        )
        conn.executemany(
            "INSERT INTO order_items (order_id, line_no, sku, name, quantity) VALUES (?, ?, ?, ?, ?)", items
        )
        conn.executemany(
            "INSERT INTO tickets (ticket_id, user_id, tenant_id, subject, status, priority, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    "T1001",
                    "u1",
                    "acme",
                    "Package arrived damaged",
                    "open",
                    "high",
                    "2026-01-08T10:15:00Z",
                    "2026-01-08T10:20:00Z",
                ),
                (
                    "T1002",
                    "u2",
                    "acme",
                    "Wrong size delivered",
                    "open",
                    "normal",
                    "2026-01-09T08:00:00Z",
                    "2026-01-09T08:00:00Z",
                ),
                (
                    "T1003",
                    "u1",
                    "acme",
                    "Invoice address change",
                    "closed",
                    "low",
                    "2026-01-02T12:00:00Z",
                    "2026-01-03T09:30:00Z",
                ),
            ],
        )
        conn.executemany(
            "INSERT INTO ticket_notes (note_id, ticket_id, text, author, created_at) VALUES (?, ?, ?, ?, ?)",
            [
                ("N1", "T1001", "Customer reports a dented box; photos requested.", "support", "2026-01-08T10:20:00Z"),
                ("N2", "T1002", "Exchange offered.", "support", "2026-01-09T08:00:00Z"),
                ("N3", "T1003", "Address updated, ticket closed.", "support", "2026-01-03T09:30:00Z"),
            ],
        )
        conn.executemany(
            "INSERT INTO calendars (calendar_id, user_id, tenant_id, name) VALUES (?, ?, ?, ?)",
            [
                ("cal-u1", "u1", "acme", "Ada's work"),
                ("cal-u2", "u2", "acme", "Grace's work"),
                ("cal-u3", "u3", "globex", "Hank's work"),
            ],
        )
        conn.executemany(
            "INSERT INTO calendar_events (event_id, calendar_id, title, start_at, end_at) VALUES (?, ?, ?, ?, ?)",
            [
                ("E1", "cal-u1", "Supplier call", *SEED_FACTS["cal_u1_events"][0]),
                ("E2", "cal-u1", "Team review", *SEED_FACTS["cal_u1_events"][1]),
                ("E3", "cal-u1", "Workshop", *SEED_FACTS["cal_u1_events"][2]),
                ("E4", "cal-u2", "Planning", "2026-12-01T09:00:00Z", "2026-12-01T17:00:00Z"),
            ],
        )
    return True
