"""Tests of the business service over ASGI on a temporary database (and once as a real process)."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo.bizservice.app import create_app, free_slots
from demo.bizservice.seed import SEED_FACTS
from demo.bizservice.store import is_late, parse_utc

REPO = Path(__file__).resolve().parents[1]
ADMIN = {"X-Admin-Token": "t"}
U1 = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
U2 = {"X-Actor-User": "u2", "X-Actor-Tenant": "acme"}
U3_OTHER_TENANT = {"X-Actor-User": "u3", "X-Actor-Tenant": "globex"}
UNKNOWN = {"X-Actor-User": "u2", "X-Actor-Tenant": "globex"}
U1_GLOBEX = {"X-Actor-User": "u1", "X-Actor-Tenant": "globex"}
LEAK_MARKERS = ("Traceback", "sqlite", "SELECT", 'File "', ".py", str(REPO), "/tmp", "bizservice/")


def _client(db: Path, admin_token: str | None = "t") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(db, admin_token=admin_token)), base_url="http://svc"
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "biz.db"


@pytest.fixture
async def client(db: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(db) as c:
        yield c


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert set(body) == {"type", "title", "status", "code", "detail"}
    assert (body["type"], body["status"], body["code"]) == ("about:blank", status, code)
    assert_clean(response)
    return body


def assert_clean(response: httpx.Response) -> None:
    for marker in LEAK_MARKERS:
        assert marker not in response.text, f"{marker!r} leaked into a response"


async def wait_until_logged(client: httpx.AsyncClient, path: str) -> None:
    """Poll the request log (bounded) until a request to `path` has arrived."""
    for _ in range(500):
        log = (await client.get("/admin/requests", params={"path_prefix": path}, headers=ADMIN)).json()
        if log["requests"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no request to {path} was logged")


def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"])


# --- Reads, identity, ownership ---------------------------------------------------------------------


async def test_get_order_returns_owner_order(client: httpx.AsyncClient) -> None:
    r = await client.get("/orders/A100", headers=U1)
    assert r.status_code == 200
    body = r.json()
    facts = SEED_FACTS["order_a100"]
    assert body["order_id"] == "A100"
    assert body["status"] == facts["status"]
    assert body["carrier"] == facts["carrier"]
    assert body["tracking_number"] == facts["tracking_number"]
    assert (body["total_cents"], body["refunded_cents"], body["currency"]) == (facts["total_cents"], 0, "EUR")
    assert body["version"] == 1
    assert len(body["items"]) == facts["items"]
    assert set(body["items"][0]) == {"sku", "name", "quantity"}
    assert datetime.fromisoformat(body["placed_at"]).tzinfo is not None
    assert body["delivered_at"] is None
    assert (body["paid_from"], body["promised_by"]) == (facts["paid_from"], facts["promised_by"])
    assert (body["late"], body["refundable_cents"]) == (True, facts["total_cents"])


async def test_an_order_delivered_in_time_is_not_late(client: httpx.AsyncClient) -> None:
    body = (await client.get("/orders/A102", headers=U1)).json()
    facts = SEED_FACTS["order_a102"]
    assert (body["status"], body["late"], body["paid_from"]) == ("delivered", False, facts["paid_from"])
    assert body["delivered_at"] < body["promised_by"] == facts["promised_by"]
    assert body["refundable_cents"] == facts["total_cents"]
    assert (await client.get("/orders/A101", headers=U2)).json()["paid_from"] == SEED_FACTS["order_a101"]["paid_from"]


@pytest.mark.parametrize(
    ("status", "delivered_at", "now", "late"),
    [
        ("shipped", None, "2026-01-09T11:00:00Z", False),  # at the promised time: not yet
        ("shipped", None, "2026-01-09T11:00:01Z", True),
        ("placed", None, "2026-01-10T00:00:00Z", True),
        ("delivered", "2026-01-09T11:00:00Z", "2026-12-01T00:00:00Z", False),
        ("delivered", "2026-01-09T11:00:01Z", "2026-12-01T00:00:00Z", True),
        ("cancelled", None, "2026-12-01T00:00:00Z", False),  # never to be delivered: never late
    ],
)
def test_late_is_decided_when_read(status: str, delivered_at: str | None, now: str, late: bool) -> None:
    assert is_late(status, delivered_at, "2026-01-09T11:00:00Z", parse_utc(now)) is late


async def test_order_of_another_user_is_answered_like_a_missing_one(client: httpx.AsyncClient) -> None:
    missing = await client.get("/orders/A999", headers=U1)
    not_yours = await client.get("/orders/A100", headers=U2)
    other_tenant = await client.get("/orders/A100", headers=U3_OTHER_TENANT)
    body = assert_problem(missing, 404, "NOT_FOUND")
    assert body["detail"] == "order A999 is not available"
    for r in (not_yours, other_tenant):
        assert r.status_code == missing.status_code
        assert r.headers["content-type"] == missing.headers["content-type"]
        # Byte-identical once the requested id is swapped.
        assert r.content.replace(b"A100", b"A999") == missing.content


async def test_ticket_and_calendar_of_another_user_are_not_available(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/tickets/T1002", headers=U1), 404, "NOT_FOUND")
    r = await client.get("/calendars/cal-u2/free-slots?from=2026-12-01T00:00:00Z&to=2026-12-02T00:00:00Z", headers=U1)
    assert assert_problem(r, 404, "NOT_FOUND")["detail"] == "calendar cal-u2 is not available"


@pytest.mark.parametrize("headers", [{}, {"X-Actor-User": "u1"}, {"X-Actor-Tenant": "acme"}])
async def test_missing_identity_is_forbidden(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    assert_problem(await client.get("/orders/A100", headers=headers), 401, "ACTOR_REQUIRED")


async def test_healthz_needs_no_identity(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"ok": True})


async def test_list_orders_pages_through_the_actor_orders(client: httpx.AsyncClient) -> None:
    first = (await client.get("/orders", headers=U1)).json()
    second = (await client.get("/orders", params={"page": 2, "page_size": 20}, headers=U1)).json()
    total = SEED_FACTS["order_counts"]["u1"]
    assert (len(first["orders"]), first["page"], first["page_size"], first["total"], first["has_more"]) == (
        20,
        1,
        20,
        total,
        True,
    )
    assert (len(second["orders"]), second["has_more"]) == (total - 20, False)
    ids = [o["order_id"] for o in first["orders"] + second["orders"]]
    assert len(set(ids)) == total and {"A100", "A102"} <= set(ids) and "A101" not in ids
    keys = [(o["placed_at"], o["order_id"]) for o in first["orders"] + second["orders"]]
    assert [k[0] for k in keys] == sorted((k[0] for k in keys), reverse=True)
    assert set(first["orders"][0]) == {"order_id", "status", "placed_at", "total_cents", "currency"}


async def test_list_orders_rejects_page_size_over_100(client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.get("/orders?page_size=101", headers=U1), 422, "INVALID_REQUEST")
    assert body["detail"] == "page_size: Input should be less than or equal to 100"


async def test_validation_detail_does_not_echo_input(client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.get("/orders?page=evil-value-123", headers=U1), 422, "INVALID_REQUEST")
    assert body["detail"].startswith("page:") and "evil-value-123" not in body["detail"]


@pytest.mark.parametrize("path", ["/orders/B100", "/orders/A1000", "/orders/a100", "/tickets/T12", "/tickets/1001"])
async def test_bad_id_pattern_is_bad_arguments(client: httpx.AsyncClient, path: str) -> None:
    body = assert_problem(await client.get(path, headers=U1), 422, "INVALID_REQUEST")
    assert body["detail"].split(":")[0] in ("order_id", "ticket_id")


async def test_get_ticket_returns_notes_and_version(client: httpx.AsyncClient) -> None:
    r = await client.get("/tickets/T1001", headers=U1)
    assert r.status_code == 200
    body = r.json()
    facts = SEED_FACTS["ticket_t1001"]
    assert (body["subject"], body["status"], body["version"]) == (facts["subject"], facts["status"], facts["version"])
    assert len(body["notes"]) == facts["notes"]
    assert set(body["notes"][0]) == {"note_id", "text", "author", "created_at"}
    assert body["owner"] == facts["owner"][0]


async def test_unknown_route_is_a_problem(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/nothing-here", headers=U1), 404, "NOT_FOUND")


# --- Free slots -----------------------------------------------------------------------------------------


async def test_free_slots_exclude_seeded_events_exactly(client: httpx.AsyncClient) -> None:
    params = {"from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00+00:00"}
    r = await client.get("/calendars/cal-u1/free-slots", params=params, headers=U1)
    assert r.status_code == 200
    body = r.json()
    assert (body["calendar_id"], body["from"], body["to"], body["truncated"]) == (
        "cal-u1",
        "2026-12-01T00:00:00Z",
        "2026-12-02T00:00:00Z",
        False,
    )
    assert [(s["start"], s["end"]) for s in body["slots"]] == [tuple(s) for s in SEED_FACTS["cal_u1_free_2026_12_01"]]


async def test_free_slots_are_clipped_to_the_range_and_skip_weekends(client: httpx.AsyncClient) -> None:
    # Friday 2026-12-04 16:00 (+01:00 is 15:00Z) to Monday 2026-12-07 10:00Z.
    params = {"from": "2026-12-04T16:00:00+01:00", "to": "2026-12-07T10:00:00Z"}
    body = (await client.get("/calendars/cal-u1/free-slots", params=params, headers=U1)).json()
    assert body["slots"] == [
        {"start": "2026-12-04T15:00:00Z", "end": "2026-12-04T17:00:00Z"},
        {"start": "2026-12-07T09:00:00Z", "end": "2026-12-07T10:00:00Z"},
    ]


async def test_free_slots_reject_a_naive_time(client: httpx.AsyncClient) -> None:
    params = {"from": "2026-12-01T00:00:00", "to": "2026-12-02T00:00:00Z"}
    r = await client.get("/calendars/cal-u1/free-slots", params=params, headers=U1)
    assert assert_problem(r, 422, "INVALID_REQUEST")["detail"] == "from: needs an explicit UTC offset"


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [
        ("2026-12-01T00:00:00Z", "2026-12-15T00:00:01Z", "to"),
        ("2026-12-02T00:00:00Z", "2026-12-01T00:00:00Z", "to"),
        ("2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", "to"),
    ],
)
async def test_free_slots_reject_bad_ranges(client: httpx.AsyncClient, start: str, end: str, field: str) -> None:
    r = await client.get("/calendars/cal-u1/free-slots", params={"from": start, "to": end}, headers=U1)
    assert assert_problem(r, 422, "INVALID_REQUEST")["detail"].startswith(f"{field}:")


def test_free_slots_truncates_at_the_limit() -> None:
    start, end = datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 15, tzinfo=UTC)
    busy = [
        (datetime(2026, 12, d, h, 0, tzinfo=UTC), datetime(2026, 12, d, h, 30, tzinfo=UTC))
        for d in range(1, 15)
        for h in range(9, 17)
    ]
    slots, truncated = free_slots(busy, start, end, limit=50)
    assert len(slots) == 50 and truncated
    assert slots[0] == (datetime(2026, 12, 1, 9, 30, tzinfo=UTC), datetime(2026, 12, 1, 10, 0, tzinfo=UTC))


# --- Request log and faults ---------------------------------------------------------------------------


async def test_latency_fault_lets_two_reads_overlap(client: httpx.AsyncClient) -> None:
    rule = {"method": "GET", "path_regex": "^/orders/A10[02]$", "latency_ms": 300, "status": None, "times": None}
    assert (await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)).status_code == 200
    a, b = await asyncio.gather(client.get("/orders/A100", headers=U1), client.get("/orders/A102", headers=U1))
    assert (a.status_code, b.status_code) == (200, 200)
    log = (await client.get("/admin/requests", params={"path_prefix": "/orders"}, headers=ADMIN)).json()["requests"]
    assert sorted(e["path"] for e in log) == ["/orders/A100", "/orders/A102"]
    assert all(e["status"] == 200 and e["actor_user"] == "u1" for e in log)
    assert overlaps(log[0], log[1])


async def test_latency_fault_does_not_block_other_requests(client: httpx.AsyncClient) -> None:
    # The request log alone cannot tell a blocking sleep from a non-blocking one (both requests log their
    # start before sleeping), so check that another request completes while the slow one still waits.
    rule = {"path_regex": "^/orders/A100$", "latency_ms": 1500}
    await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
    slow = asyncio.create_task(client.get("/orders/A100", headers=U1))
    await wait_until_logged(client, "/orders/A100")
    assert (await client.get("/tickets/T1001", headers=U1)).status_code == 200
    assert not slow.done()
    assert (await slow).status_code == 200


async def test_status_fault_with_times_applies_once(client: httpx.AsyncClient) -> None:
    rule = {"method": "GET", "path_regex": "^/orders/A100$", "status": 503, "times": 1}
    await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
    first = await client.get("/orders/A100", headers=U1)
    second = await client.get("/orders/A100", headers=U1)
    assert_problem(first, 503, "UNAVAILABLE")
    assert second.status_code == 200
    listed = (await client.get("/admin/faults", headers=ADMIN)).json()["rules"]
    assert listed[0]["remaining"] == 0
    log = (await client.get("/admin/requests", headers=ADMIN)).json()["requests"]
    assert [e["status"] for e in log] == [503, 200]


async def test_a_fault_on_the_nth_matching_request_fires_there_and_is_counted(client: httpx.AsyncClient) -> None:
    # The 3rd and 4th GETs of A100 fail; other paths neither count nor fail.
    rule = {"method": "GET", "path_regex": "^/orders/A100$", "status": 503, "skip": 2, "times": 2}
    await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
    statuses = []
    for _ in range(6):
        statuses.append((await client.get("/orders/A100", headers=U1)).status_code)
        assert (await client.get("/orders/A102", headers=U1)).status_code == 200
    assert statuses == [200, 200, 503, 503, 200, 200]
    [listed] = (await client.get("/admin/faults", headers=ADMIN)).json()["rules"]
    assert (listed["matched"], listed["fired"], listed["remaining"]) == (6, 2, 0)


async def test_a_rule_records_when_it_first_fired_for_the_recovery_time(client: httpx.AsyncClient) -> None:
    rule = {"method": "GET", "path_regex": "^/orders/A100$", "status": 503, "skip": 1, "times": 2}
    await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
    assert (await client.get("/orders/A100", headers=U1)).status_code == 200
    [listed] = (await client.get("/admin/faults", headers=ADMIN)).json()["rules"]
    assert listed["first_fired_at"] is None  # matched, not fired yet
    before = time.time()
    assert (await client.get("/orders/A100", headers=U1)).status_code == 503
    [listed] = (await client.get("/admin/faults", headers=ADMIN)).json()["rules"]
    first = listed["first_fired_at"]
    assert before - 1 <= first <= time.time() + 1
    assert (await client.get("/orders/A100", headers=U1)).status_code == 503
    [listed] = (await client.get("/admin/faults", headers=ADMIN)).json()["rules"]
    assert (listed["fired"], listed["first_fired_at"]) == (2, first)  # the first firing's time, kept


async def test_a_seeded_fault_fires_on_the_same_requests_for_the_same_seed(db: Path, tmp_path: Path) -> None:
    from demo.bizservice.firing import draw

    async def statuses(path: Path, seed: int) -> list[int]:
        rule = {"path_regex": "^/orders/A100$", "status": 500, "probability": 0.5, "seed": seed, "label": "f0"}
        async with _client(path) as c:
            await c.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
            return [(await c.get("/orders/A100", headers=U1)).status_code for _ in range(24)]

    first, again, other = await statuses(db, 7), await statuses(tmp_path / "other.db", 7), await statuses(db, 8)
    assert first == again
    # Exactly where the shared draw says, and neither never nor always.
    assert first == [500 if draw(7, "f0", n) < 0.5 else 200 for n in range(1, 25)]
    assert 0 < first.count(500) < 24 and first != other


async def test_429_fault_sends_retry_after(client: httpx.AsyncClient) -> None:
    await client.put("/admin/faults", json={"rules": [{"path_regex": "^/tickets/", "status": 429}]}, headers=ADMIN)
    r = await client.get("/tickets/T1001", headers=U1)
    assert_problem(r, 429, "TOO_MANY_REQUESTS")
    assert r.headers["retry-after"] == "1"
    assert (await client.get("/orders/A100", headers=U1)).status_code == 200


async def test_reset_and_delete_clear_faults_and_log(client: httpx.AsyncClient) -> None:
    await client.put("/admin/faults", json={"rules": [{"path_regex": "^/orders", "status": 500}]}, headers=ADMIN)
    assert_problem(await client.get("/orders/A100", headers=U1), 500, "SERVER_ERROR")
    assert (await client.delete("/admin/faults", headers=ADMIN)).status_code == 200
    assert (await client.get("/orders/A100", headers=U1)).status_code == 200
    await client.put("/admin/faults", json={"rules": [{"path_regex": "^/orders", "status": 503}]}, headers=ADMIN)
    assert (await client.post("/admin/reset", headers=ADMIN)).status_code == 200
    assert (await client.get("/admin/faults", headers=ADMIN)).json() == {"rules": []}
    assert (await client.get("/admin/requests", headers=ADMIN)).json() == {"requests": []}
    assert (await client.get("/orders/A100", headers=U1)).status_code == 200


async def test_bad_fault_rules_are_rejected(client: httpx.AsyncClient) -> None:
    for rule in ({"path_regex": "("}, {"path_regex": "x", "status": 418}, {"path_regex": "x", "kind": "explode"}):
        assert_problem(await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN), 422, "INVALID_REQUEST")


async def test_faults_are_shared_by_apps_on_one_database(db: Path) -> None:
    async with _client(db) as one, _client(db) as two:
        rule = {"path_regex": "^/orders/A100$", "status": 503, "times": 1}
        await one.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
        assert (await two.get("/orders/A100", headers=U1)).status_code == 503
        assert (await one.get("/orders/A100", headers=U1)).status_code == 200
        assert len((await one.get("/admin/requests", headers=ADMIN)).json()["requests"]) == 2


async def test_admin_needs_the_token(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/admin/faults"), 401, "ADMIN_ONLY")
    assert_problem(await client.get("/admin/requests", headers={"X-Admin-Token": "wrong"}), 401, "ADMIN_ONLY")
    assert_problem(await client.post("/admin/reset", headers={"X-Admin-Token": ""}), 401, "ADMIN_ONLY")


async def test_admin_does_not_exist_without_a_configured_token(db: Path) -> None:
    async with _client(db, admin_token=None) as c:
        for method, path in [
            ("GET", "/admin/faults"),
            ("PUT", "/admin/faults"),
            ("POST", "/admin/reset"),
            ("GET", "/admin/requests"),
            ("GET", "/admin/other"),
        ]:
            assert_problem(await c.request(method, path, headers=ADMIN), 404, "NOT_FOUND")


# --- Storage and robustness -----------------------------------------------------------------------------


async def test_seeding_is_idempotent_and_db_uses_wal(db: Path) -> None:
    create_app(db)
    create_app(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == sum(SEED_FACTS["order_counts"].values())
        assert conn.execute("SELECT COUNT(*) FROM tickets").fetchone()[0] == 3


async def test_a_database_made_before_paid_from_and_refund_accounts_is_upgraded_at_startup(db: Path) -> None:
    create_app(db)
    with sqlite3.connect(db) as conn:  # as an older release left it: no such columns, one refund made
        conn.execute(
            "INSERT INTO refunds (refund_id, order_id, amount_cents, reason, created_at)"
            " VALUES ('R-old', 'A100', 100, 'old', '2026-02-01T00:00:00Z')"
        )
        conn.execute("UPDATE orders SET refunded_cents = 100 WHERE order_id = 'A100'")
        for table, column in (("orders", "paid_from"), ("orders", "promised_by"), ("refunds", "to_account")):
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    async with _client(db) as c:
        order = (await c.get("/orders/A100", headers=U1)).json()
        refunds = (await c.get("/orders/A100/refunds", headers=U1)).json()
    facts = SEED_FACTS["order_a100"]
    assert (order["paid_from"], order["promised_by"], order["late"]) == (facts["paid_from"], facts["promised_by"], True)
    assert order["refundable_cents"] == facts["total_cents"] - 100
    assert [r["to_account"] for r in refunds["refunds"]] == [facts["paid_from"]]
    assert refunds["paid_from"] == facts["paid_from"]


async def test_each_tenant_has_a_manager_the_service_knows(client: httpx.AsyncClient) -> None:
    for tenant, (user_id, name) in SEED_FACTS["managers"].items():
        me = await client.get("/me", headers={"X-Actor-User": user_id, "X-Actor-Tenant": tenant})
        assert me.json() == {"user_id": user_id, "tenant_id": tenant, "name": name}
    assert SEED_FACTS["managers"] == {"acme": ("m1", "Margaret Hamilton"), "globex": ("m1", "Katherine Johnson")}


async def test_unhandled_error_is_a_generic_500(db: Path) -> None:
    async with _client(db) as c:
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE order_items")
        r = await c.get("/orders/A100", headers=U1)
        body = assert_problem(r, 500, "SERVER_ERROR")
        assert "order_items" not in body["detail"]
        log = (await c.get("/admin/requests", headers=ADMIN)).json()["requests"]
        assert log[-1]["status"] == 500


async def test_no_response_leaks_internals(client: httpx.AsyncClient) -> None:
    requests = [
        ("GET", "/orders/A100", U1),
        ("GET", "/orders/A999", U1),
        ("GET", "/orders/A100", U2),
        ("GET", "/orders/%27%3B--", U1),
        ("GET", "/orders?page=0", U1),
        ("GET", "/orders?page_size=abc", U1),
        ("GET", "/tickets/T1001", U1),
        ("GET", "/tickets/T9999", U1),
        ("POST", "/orders/A100", U1),
        ("GET", "/calendars/cal-u1/free-slots?from=yesterday&to=now", U1),
        ("GET", "/orders/A100", {}),
        ("GET", "/admin/faults", {}),
        ("DELETE", "/healthz", {}),
    ]
    for method, path, headers in requests:
        assert_clean(await client.request(method, path, headers=headers))


# --- The real process ------------------------------------------------------------------------------------


async def test_module_runs_as_a_server_and_never_prints_the_token(tmp_path: Path) -> None:
    secret = "s3cret-admin-token"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "demo.bizservice",
        "--db",
        str(tmp_path / "p.db"),
        "--port",
        "0",
        "--admin-token",
        secret,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), timeout=20)).decode()
            assert line, f"server exited early: {lines}"
            lines.append(line)
            if "bizservice listening on " in line:
                url = line.split("bizservice listening on ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url, timeout=5) as c:
            assert (await c.get("/healthz")).json() == {"ok": True}
            assert (await c.get("/orders/A100", headers=U1)).json()["order_id"] == "A100"
            assert (await c.get("/admin/faults", headers={"X-Admin-Token": secret})).status_code == 200
    finally:
        proc.terminate()
        _, rest = await asyncio.wait_for(proc.communicate(), timeout=20)
    output = "".join(lines) + rest.decode()
    assert secret not in output


async def test_an_unknown_user_or_tenant_is_told_so_not_given_empty_results(client: httpx.AsyncClient) -> None:
    for headers in (UNKNOWN, {"X-Actor-User": "nobody", "X-Actor-Tenant": "acme"}):
        for path in ("/me", "/orders", "/orders/A100", "/operations/op-1"):
            body = assert_problem(await client.get(path, headers=headers), 401, "UNKNOWN_USER")
            assert body["detail"] == "unknown user or tenant"
    me = await client.get("/me", headers=U3_OTHER_TENANT)
    assert me.status_code == 200 and me.json() == {"user_id": "u3", "tenant_id": "globex", "name": "Hank Scorpio"}


async def test_the_same_user_id_in_another_tenant_is_another_person(client: httpx.AsyncClient) -> None:
    assert (await client.get("/me", headers=U1_GLOBEX)).json()["name"] == "Ulla Eins"
    assert_problem(await client.get("/orders/A100", headers=U1_GLOBEX), 404, "NOT_FOUND")
    assert (await client.get("/orders", headers=U1_GLOBEX)).json()["total"] == 0
