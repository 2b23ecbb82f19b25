"""The business service's idempotency ledger, one layer at a time, with the interleavings forced rather than
hoped for (issue 11, bug 2): two claims for one key that meet while the database is locked; a ledger record
that cannot be written after the effect; and, across two real service processes on one database file, hold
points that stop an attempt between the claim's check and its insert, and between the effect and its
record, while the test sends the other attempt or kills the process. Each layer is judged by its own rows
(claims, records, effect rows), so one layer cannot hide a bug in the other."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo.bizservice.app import create_app
from devstack.processes import ManagedProcess, business_service_command, free_port, wait_for_http_ok
from tests.agent_helpers import assert_eventually
from tests.conftest import APPROVAL_VERIFY_KEY, REPO_ROOT, approval_token
from toolloop.servicekit import ClaimTaken, LedgerKey, LedgerRecord, SqliteLedger, reached

U1 = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
ADMIN = {"X-Admin-Token": "t"}
NOTE = {"ticketId": "T1001", "text": "exactly once", "expectedVersion": 1}
REFUND = {"orderId": "A112", "amountCents": 100, "reason": "exactly once"}


async def post_refund(http: httpx.AsyncClient, operation_id: str) -> httpx.Response:
    headers = {
        **U1,
        "Idempotency-Key": operation_id,
        "X-Approval-Token": approval_token(operation_id, "refund_order", REFUND),
    }
    return await http.post("/orders/A112/refunds", json=REFUND, headers=headers, timeout=30)


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [tuple(r) for r in conn.execute(sql, params)]


def effects_of(db: Path, operation_id: str) -> list[tuple[Any, ...]]:
    """Effect rows made under one operation id, straight from the effect tables."""
    return rows(db, "SELECT refund_id FROM refunds WHERE operation_id = ?", operation_id) + rows(
        db, "SELECT note_id FROM ticket_notes WHERE operation_id = ?", operation_id
    )


# --- One layer at a time, in process -------------------------------------------------------------------------


def test_two_claims_meeting_while_the_database_is_locked_give_one_claim_and_one_refusal(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = SqliteLedger(db)
    ledger.init()
    key = LedgerKey("acme", "u1", "op-locked")
    now = time.time()
    results: list[str] = []

    def attempt() -> None:
        try:
            claimed = ledger.claim(key, now, now - 3600, 30.0)
            results.append(claimed if isinstance(claimed, str) else "record")
        except ClaimTaken:
            results.append("refused")

    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another writer holds the database
    threads = [threading.Thread(target=attempt) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both attempts are now waiting for the write lock
        assert results == []
    finally:
        locker.execute("COMMIT")
        locker.close()
        for thread in threads:
            thread.join(timeout=10)

    claim_ids = [r for r in results if r not in ("refused", "record")]
    assert len(claim_ids) == 1 and results.count("refused") == 1
    assert rows(db, "SELECT claim_id FROM idempotency_claims") == [(claim_ids[0],)]


@contextmanager
def record_writes_fail(db: Path) -> Iterator[None]:
    """A trigger makes every insert of a ledger record fail until the block ends."""
    with sqlite3.connect(db) as conn:
        conn.executescript(
            "CREATE TRIGGER fail_records BEFORE INSERT ON idempotency_records"
            " BEGIN SELECT RAISE(ABORT, 'the ledger record could not be written'); END;"
        )
    try:
        yield
    finally:
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER fail_records")


async def test_an_effect_never_stands_without_its_record_and_the_same_key_then_makes_one(tmp_path: Path) -> None:
    db = tmp_path / "biz.db"
    app = create_app(db, admin_token="t", approval_verify_key=APPROVAL_VERIFY_KEY)
    headers = {
        **U1,
        "Idempotency-Key": "op-record",
        "X-Approval-Token": approval_token("op-record", "append_ticket_note", NOTE),
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as http:
        with record_writes_fail(db):
            failed = await http.post("/tickets/T1001/notes", json=NOTE, headers=headers)
            assert failed.status_code == 500 and failed.json()["code"] == "SERVER_ERROR"
            assert "record could not" not in failed.text  # no SQL detail leaks
        # The note was written in the same transaction as the record: it rolled back with it.
        assert effects_of(db, "op-record") == []
        assert rows(db, "SELECT version FROM tickets WHERE ticket_id = 'T1001'") == [(1,)]
        assert rows(db, "SELECT * FROM idempotency_claims") == []  # the claim was released

        again = await http.post("/tickets/T1001/notes", json=NOTE, headers=headers)
        assert again.status_code == 201 and "idempotent-replayed" not in again.headers
    assert len(effects_of(db, "op-record")) == 1
    assert rows(db, "SELECT operation_id FROM idempotency_records") == [("op-record",)]


# --- Two real processes, hold points driven by the test ----------------------------------------------------


class Service:
    def __init__(self, process: ManagedProcess, url: str) -> None:
        self.process = process
        self.url = url


@pytest.fixture
async def two_services(tmp_path: Path) -> AsyncIterator[tuple[Service, Service, Path, Path]]:
    """Two service processes on one database file, with hold points armed by files in one directory."""
    db = tmp_path / "shared.db"
    holds = tmp_path / "holds"
    holds.mkdir()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "BIZSERVICE_ADMIN_TOKEN": "t",
        "BIZSERVICE_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY,
        "BIZSERVICE_HOLD_DIR": str(holds),
    }
    started: list[Service] = []
    try:
        for name in ("a", "b"):
            port = free_port()
            cmd = [*business_service_command(db, port), "--claim-lease-seconds", "2"]
            proc = ManagedProcess.spawn(f"service-{name}", cmd, tmp_path / f"{name}.log", env=env, cwd=REPO_ROOT)
            started.append(Service(proc, f"http://127.0.0.1:{port}"))
            await asyncio.to_thread(wait_for_http_ok, f"{started[-1].url}/healthz", 30, proc)
        yield started[0], started[1], db, holds
    finally:
        for service in started:
            service.process.stop()


@pytest.mark.e2e
async def test_two_attempts_meeting_between_check_and_insert_make_one_claim_and_one_effect(
    two_services: tuple[Service, Service, Path, Path],
) -> None:
    a, b, db, holds = two_services
    async with httpx.AsyncClient(base_url=a.url) as first, httpx.AsyncClient(base_url=b.url) as second:
        # After its claim, A's attempt stays in flight a while, so B's must find it in progress.
        rule = {"method": "POST", "path_regex": "/refunds$", "when": "after_claim", "latency_ms": 1500, "times": 1}
        (await first.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)).raise_for_status()
        (holds / "claim_checked.armed").touch()
        attempt_a = asyncio.create_task(post_refund(first, "op-meet"))

        async def a_is_held() -> bool:
            return len(reached(holds, "claim_checked")) == 1

        await assert_eventually(a_is_held, what="A's attempt stopped between check and insert")
        attempt_b = asyncio.create_task(post_refund(second, "op-meet"))
        await asyncio.sleep(1.0)  # time enough for B to reach the same point, were it let in
        # A checks and inserts inside one write transaction: B cannot even look while A is in between.
        assert len(reached(holds, "claim_checked")) == 1
        (holds / "claim_checked.release").touch()
        answer_a, answer_b = await attempt_a, await attempt_b

    assert answer_a.status_code == 201 and "idempotent-replayed" not in answer_a.headers
    assert answer_b.status_code == 409 and answer_b.json()["code"] == "IN_PROGRESS"
    assert len(reached(holds, "claim_checked")) == 1  # only one attempt ever claimed the key
    assert len(effects_of(db, "op-meet")) == 1
    assert rows(db, "SELECT operation_id FROM idempotency_records") == [("op-meet",)]
    assert rows(db, "SELECT * FROM idempotency_claims") == []


@pytest.mark.e2e
async def test_a_process_killed_between_effect_and_record_leaves_no_effect_and_the_key_then_makes_one(
    two_services: tuple[Service, Service, Path, Path],
) -> None:
    a, b, db, holds = two_services
    (holds / "effect_written.armed").touch()
    async with httpx.AsyncClient(base_url=a.url) as first, httpx.AsyncClient(base_url=b.url) as second:
        attempt_a = asyncio.create_task(post_refund(first, "op-killed"))

        async def a_is_held() -> bool:
            return len(reached(holds, "effect_written")) == 1

        await assert_eventually(a_is_held, what="A wrote the refund and stopped before its record")
        a.process.kill9()
        with pytest.raises(httpx.TransportError):
            await attempt_a
        # A died inside the commit's transaction: neither the refund nor its record stands.
        assert effects_of(db, "op-killed") == []
        assert rows(db, "SELECT * FROM idempotency_records") == []
        (holds / "effect_written.armed").unlink()

        # A's claim keeps the key in progress until its lease (2 s) runs out; then one retry, one effect.
        async def key_free() -> bool:
            status = await second.get("/operations/op-killed", headers=U1)
            return bool(status.json()["state"] == "not_found")

        await assert_eventually(key_free, within=15, what="the dead attempt's claim expired")
        retried = await post_refund(second, "op-killed")

    assert retried.status_code == 201
    assert len(effects_of(db, "op-killed")) == 1
    assert rows(db, "SELECT refunded_cents FROM orders WHERE order_id = 'A112'") == [(REFUND["amountCents"],)]


# --- The ledger's functions on their own ---------------------------------------------------------------------


def test_claim_returns_a_record_completed_meanwhile_and_complete_never_writes_twice(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.init()
    key = LedgerKey("acme", "u1", "op-direct")
    now = time.time()
    effects: list[str] = []

    def effect(conn: sqlite3.Connection) -> tuple[int, dict[str, Any]]:
        effects.append("ran")
        return 201, {"made": len(effects)}

    claimed = ledger.claim(key, now, now - 3600, 30.0)
    assert isinstance(claimed, str)
    record, made = ledger.complete(key, "sha256:a", effect, now, now - 3600)
    assert (record.digest, record.status, record.body, made) == ("sha256:a", 201, {"made": 1}, True)
    # Another attempt that got as far as claiming or completing finds that record and changes nothing.
    again = ledger.claim(key, now, now - 3600, 30.0)
    assert isinstance(again, LedgerRecord) and again == record
    second, made_again = ledger.complete(key, "sha256:b", effect, now, now - 3600)
    assert (second, made_again) == (record, False) and effects == ["ran"]
    ledger.release(key, claimed)
    assert ledger.lookup(key, now, now - 3600) == record
    # Past retention the record no longer counts (and a new one may replace it).
    assert ledger.lookup(key, now, now + 1) == "not_found"


async def test_an_attempt_whose_claim_expired_while_it_stalled_replays_the_record_of_the_one_that_took_over(
    tmp_path: Path,
) -> None:
    # A claims and stalls past its lease; B takes the key over and commits; A then finds B's record at
    # commit and answers with it as a replay: one effect, and both answers agree.
    db = tmp_path / "lease.db"
    app = create_app(db, admin_token="t", approval_verify_key=APPROVAL_VERIFY_KEY, claim_lease_seconds=0.5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as http:
        rule = {"method": "POST", "path_regex": "/refunds$", "when": "after_claim", "latency_ms": 1500, "times": 1}
        (await http.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)).raise_for_status()
        stalled = asyncio.create_task(post_refund(http, "op-lease"))
        await asyncio.sleep(0.8)  # A holds an expired claim now
        took_over = await post_refund(http, "op-lease")
        late = await stalled

    assert took_over.status_code == 201 and "idempotent-replayed" not in took_over.headers
    assert took_over.headers["content-type"] == "application/json"
    assert late.status_code == 201 and late.headers["idempotent-replayed"] == "true"
    assert late.json() == took_over.json()
    assert len(effects_of(db, "op-lease")) == 1


def test_a_status_read_while_an_attempt_commits_and_releases_never_says_not_found(tmp_path: Path) -> None:
    # The lookup reads the record, then the claim. Here the attempt commits its record and releases its claim
    # exactly between those two reads (another connection, while the lookup's read is open: WAL lets it). Read
    # one by one, the lookup would find neither and answer "not_found" for a write that happened.
    db = tmp_path / "lookup.db"
    key = LedgerKey("acme", "u1", "op-between")
    now = time.time()
    writer = SqliteLedger(db)
    writer.init()
    claim_id = writer.claim(key, now, now - 3600, 30.0)
    assert isinstance(claim_id, str)

    class Interleaved(SqliteLedger):
        def _completed(self, conn: sqlite3.Connection, k: LedgerKey, not_before: float) -> LedgerRecord | None:
            found = super()._completed(conn, k, not_before)
            writer.complete(k, "sha256:a", lambda c: (201, {"done": True}), now, now - 3600)
            writer.release(k, claim_id)
            return found

    seen = Interleaved(db).lookup(key, now, now - 3600)
    # One snapshot: the attempt was still in flight then, so "in progress", never "not found".
    assert seen == "in_progress"
    assert isinstance(writer.lookup(key, now, now - 3600), LedgerRecord)
