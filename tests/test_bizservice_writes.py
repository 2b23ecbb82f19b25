"""Tests of the business service's write side: idempotency ledger, approvals, business refusals, the
status endpoint, and after-commit faults (ASGI on a temporary database; real uvicorn processes where a
real socket or a second process matters)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo.bizservice.app import create_app
from demo.bizservice.seed import SEED_FACTS
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY, approval_token
from toolloop._core.approvals import CLOCK_TOLERANCE_SECONDS

REPO = Path(__file__).resolve().parents[1]
ADMIN = {"X-Admin-Token": "t"}
U1 = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
U2 = {"X-Actor-User": "u2", "X-Actor-Tenant": "acme"}

LEAK_MARKERS = ("Traceback", "sqlite", "SELECT", 'File "', ".py", "/tmp", APPROVAL_KEY)

NOTE = {"ticketId": "T1001", "text": "Replacement shipped.", "expectedVersion": 1}
EVENT = {
    "calendarId": "cal-u1",
    "title": "Call with supplier",
    "start": "2026-12-03T10:00:00Z",
    "end": "2026-12-03T11:00:00+00:00",
    "attendees": ["ops@example.com"],
}
REFUND = {"orderId": "A100", "amountCents": 500, "reason": "damaged box"}
WRITES = {
    "append_ticket_note": "/tickets/T1001/notes",
    "create_calendar_event": "/calendars/cal-u1/events",
    "refund_order": "/orders/A100/refunds",
}


# --- Helpers ------------------------------------------------------------------------------------------


def write_headers(operation_id: str | None, token: str | None, actor: Mapping[str, str] = U1) -> dict[str, str]:
    headers = dict(actor)
    if operation_id is not None:
        headers["Idempotency-Key"] = operation_id
    if token is not None:
        headers["X-Approval-Token"] = token
    return headers


async def write(
    client: httpx.AsyncClient,
    tool: str,
    body: Mapping[str, Any],
    operation_id: str,
    *,
    path: str | None = None,
    token: str | None = None,
    actor: Mapping[str, str] = U1,
    expires_in: float = 30.0,
) -> httpx.Response:
    """POST an approved write (approval minted for exactly this body unless `token` is given). The approval
    expires before any retention used here: the service refuses one that outlives its records."""
    token = token if token is not None else approval_token(operation_id, tool, body, expires_in=expires_in)
    return await client.post(
        path or WRITES[tool], json=dict(body), headers=write_headers(operation_id, token, actor), timeout=10
    )


async def effects(client: httpx.AsyncClient, operation_id: str | None = None) -> list[dict[str, Any]]:
    params = {"operation_id": operation_id} if operation_id is not None else {}
    r = await client.get("/admin/effects", params=params, headers=ADMIN)
    assert r.status_code == 200
    found: list[dict[str, Any]] = r.json()["effects"]
    return found


async def status_of(client: httpx.AsyncClient, operation_id: str, actor: Mapping[str, str] = U1) -> dict[str, Any]:
    r = await client.get(f"/operations/{operation_id}", headers=actor)
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    assert set(body) == {"operation_id", "state", "status_code", "body", "retention_seconds"}
    return body


async def set_faults(client: httpx.AsyncClient, *rules: Mapping[str, Any]) -> None:
    r = await client.put("/admin/faults", json={"rules": list(rules)}, headers=ADMIN)
    assert r.status_code == 200, r.text


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert (body["type"], body["status"], body["code"]) == ("about:blank", status, code)
    for marker in LEAK_MARKERS:
        assert marker not in response.text
    return body


def asgi_client(db: Path, **options: Any) -> httpx.AsyncClient:
    options.setdefault("approval_verify_key", APPROVAL_VERIFY_KEY)
    app = create_app(db, admin_token="t", **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "biz.db"


@pytest.fixture
async def client(db: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(db) as c:
        yield c


# --- Real processes --------------------------------------------------------------------------------------


@asynccontextmanager
async def service_process(db: Path, *args: str) -> AsyncIterator[tuple[str, list[str]]]:
    """`python -m demo.bizservice` on `db` (approval key in the environment); yields its URL and its log lines."""
    env = {**os.environ, "BIZSERVICE_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "demo.bizservice", "--db", str(db), "--port", "0", "--admin-token", "t", *args),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def drain(stream: asyncio.StreamReader) -> None:
        # Read to the end so the server never blocks on a full pipe (it logs every dropped reply).
        while line := (await stream.readline()).decode():
            lines.append(line)
            if "bizservice listening on " in line and not ready.done():
                ready.set_result(line.split("bizservice listening on ", 1)[1].strip())
        if not ready.done():
            ready.set_exception(AssertionError(f"server exited early: {lines}"))

    drainer = asyncio.create_task(drain(proc.stderr))
    try:
        yield await asyncio.wait_for(ready, timeout=30), lines
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=20)
        await drainer


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """One real service for the socket-level fault tests (each test uses its own operation ids)."""
    async with service_process(tmp_path_factory.mktemp("real") / "biz.db") as (url, _):
        yield url


@pytest.fixture
async def real(server: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server, timeout=10) as c:
        await c.delete("/admin/faults", headers=ADMIN)
        yield c
        await c.delete("/admin/faults", headers=ADMIN)


# --- The happy path and replays ---------------------------------------------------------------------------


async def test_approved_note_is_written_once_and_bumps_the_version(client: httpx.AsyncClient) -> None:
    r = await write(client, "append_ticket_note", {**NOTE, "text": "  Replacement shipped.  "}, "op-note-1")
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers
    body = r.json()
    assert set(body) == {"note_id", "ticket_id", "text", "author", "created_at", "ticket_version"}
    assert (body["ticket_id"], body["text"], body["author"], body["ticket_version"]) == (
        "T1001",
        "Replacement shipped.",
        "u1",
        2,
    )
    ticket = (await client.get("/tickets/T1001", headers=U1)).json()
    assert ticket["version"] == 2
    assert ticket["notes"][-1] == {k: body[k] for k in ("note_id", "text", "author", "created_at")}
    [effect] = await effects(client, "op-note-1")
    assert (effect["kind"], effect["id"], effect["operation_id"], effect["actor_user"]) == (
        "note",
        body["note_id"],
        "op-note-1",
        "u1",
    )


async def test_same_key_and_payload_replays_even_after_the_version_moved(client: httpx.AsyncClient) -> None:
    first = await write(client, "append_ticket_note", NOTE, "op-a")
    assert first.status_code == 201
    second = await write(client, "append_ticket_note", {**NOTE, "text": "later", "expectedVersion": 2}, "op-b")
    assert second.status_code == 201
    again = await write(client, "append_ticket_note", NOTE, "op-a")
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert len(await effects(client, "op-a")) == 1
    assert len(await effects(client)) == 2


async def test_replay_needs_the_approval_but_not_that_it_is_still_valid(client: httpx.AsyncClient) -> None:
    first = await write(client, "refund_order", REFUND, "op-r")
    expired = approval_token("op-r", "refund_order", REFUND, expires_in=-1)
    late = await write(client, "refund_order", REFUND, "op-r", token=expired)
    assert (late.status_code, late.json()) == (201, first.json())
    assert late.headers["idempotent-replayed"] == "true"
    # Without the approval, the stored reply (refund id, amounts, reason) is not given back.
    stranger = await write(client, "refund_order", REFUND, "op-r", token="not-a-token")
    assert_problem(stranger, 403, "APPROVAL_REQUIRED")
    assert first.json()["refund_id"] not in stranger.text


async def test_same_key_other_payload_is_an_idempotency_conflict(client: httpx.AsyncClient) -> None:
    assert (await write(client, "append_ticket_note", NOTE, "op-c")).status_code == 201
    other = {**NOTE, "text": "something else"}
    body = assert_problem(await write(client, "append_ticket_note", other, "op-c"), 422, "IDEMPOTENCY_KEY_REUSED")
    assert "different payload" in body["detail"]
    # Another tool under the same key is another payload too.
    assert_problem(await write(client, "refund_order", REFUND, "op-c"), 422, "IDEMPOTENCY_KEY_REUSED")
    assert len(await effects(client)) == 1


async def test_keys_are_scoped_to_the_actor(client: httpx.AsyncClient) -> None:
    mine = await write(client, "append_ticket_note", NOTE, "op-shared")
    note_u2 = {"ticketId": "T1002", "text": "u2's note", "expectedVersion": 1}
    token = approval_token("op-shared", "append_ticket_note", note_u2, user="u2")
    theirs = await write(
        client, "append_ticket_note", note_u2, "op-shared", path="/tickets/T1002/notes", token=token, actor=U2
    )
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert (await status_of(client, "op-shared", U2))["body"]["ticket_id"] == "T1002"
    assert {e["actor_user"] for e in await effects(client, "op-shared")} == {"u1", "u2"}


# --- Header and approval checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "", "has space", "x" * 101, "semi;colon"])
async def test_a_missing_or_malformed_key_is_400(client: httpx.AsyncClient, key: str | None) -> None:
    token = approval_token("op-k", "append_ticket_note", NOTE)
    r = await client.post("/tickets/T1001/notes", json=NOTE, headers=write_headers(key, token))
    assert_problem(r, 400, "IDEMPOTENCY_KEY_REQUIRED")
    assert await effects(client) == []


async def test_identity_is_checked_before_the_key_and_the_key_before_the_body(client: httpx.AsyncClient) -> None:
    assert_problem(await client.post("/tickets/T1001/notes", content=b"{"), 401, "ACTOR_REQUIRED")
    assert_problem(await client.post("/tickets/T1001/notes", content=b"{", headers=U1), 400, "IDEMPOTENCY_KEY_REQUIRED")
    r = await client.post("/tickets/T1001/notes", content=b"{", headers=write_headers("op-x", None))
    assert_problem(r, 422, "INVALID_BODY")


def _bad_tokens() -> dict[str, str | None]:
    other_digest = approval_token("op-z", "append_ticket_note", {**NOTE, "text": "not what was approved"})
    return {
        "missing": None,
        "garbage": "not-a-token",
        "expired": approval_token("op-z", "append_ticket_note", NOTE, expires_in=-1),
        "decided after its window": approval_token("op-z", "append_ticket_note", NOTE, decide_by=-0.001),
        "forged": approval_token("op-z", "append_ticket_note", NOTE, key=OTHER_SIGNING_KEY),
        "a rejection": approval_token("op-z", "append_ticket_note", NOTE, decision="reject"),
        "other actor": approval_token("op-z", "append_ticket_note", NOTE, user="u2"),
        "other tenant": approval_token("op-z", "append_ticket_note", NOTE, tenant="globex"),
        "other digest": other_digest,
        "other operation": approval_token("op-other", "append_ticket_note", NOTE),
        "other tool": approval_token("op-z", "refund_order", NOTE),
        "other service": approval_token("op-z", "append_ticket_note", NOTE, audience="notes"),
    }


# Each case and the code it is refused with: expired, for another service and signed with a key this service
# does not hold (another channel's: its kid is unknown here) each have their own.
BAD_TOKENS = {
    "missing": "APPROVAL_REQUIRED",
    "garbage": "APPROVAL_REQUIRED",
    "expired": "APPROVAL_EXPIRED",
    "decided after its window": "APPROVAL_EXPIRED",
    "forged": "APPROVAL_UNKNOWN_KEY",
    "a rejection": "APPROVAL_REQUIRED",
    "other actor": "APPROVAL_REQUIRED",
    "other tenant": "APPROVAL_REQUIRED",
    "other digest": "APPROVAL_REQUIRED",
    "other operation": "APPROVAL_REQUIRED",
    "other tool": "APPROVAL_REQUIRED",
    "other service": "APPROVAL_WRONG_AUDIENCE",
}


def test_every_bad_token_case_is_tried() -> None:
    assert list(_bad_tokens()) == list(BAD_TOKENS)


@pytest.mark.parametrize("case", list(BAD_TOKENS))
async def test_without_a_valid_approval_nothing_happens(client: httpx.AsyncClient, case: str) -> None:
    token = _bad_tokens()[case]
    r = await client.post("/tickets/T1001/notes", json=NOTE, headers=write_headers("op-z", token))
    assert_problem(r, 403, BAD_TOKENS[case])
    assert await effects(client) == []
    assert (await status_of(client, "op-z"))["state"] == "not_found"
    assert (await client.get("/tickets/T1001", headers=U1)).json()["version"] == 1


async def test_without_an_approval_key_every_write_is_refused(db: Path) -> None:
    async with asgi_client(db, approval_verify_key=None) as c:
        for tool, body in [("append_ticket_note", NOTE), ("create_calendar_event", EVENT), ("refund_order", REFUND)]:
            r = await write(c, tool, body, f"op-{tool}")
            assert assert_problem(r, 403, "APPROVAL_REQUIRED")["detail"] == (
                "this service has no approval key configured"
            )
        assert await effects(c) == []


# --- Business refusals -------------------------------------------------------------------------------------


async def test_stale_version_is_a_stored_conflict(client: httpx.AsyncClient) -> None:
    assert (await write(client, "append_ticket_note", NOTE, "op-v1")).status_code == 201
    first = await write(client, "append_ticket_note", {**NOTE, "text": "second"}, "op-v2")
    body = assert_problem(first, 409, "STALE_VERSION")
    assert body["current_version"] == 2
    # The refusal is the key's outcome: the same request again gets the same answer, marked as a replay.
    again = await write(client, "append_ticket_note", {**NOTE, "text": "second"}, "op-v2")
    assert (again.status_code, again.json(), again.headers["idempotent-replayed"]) == (409, body, "true")
    assert (await status_of(client, "op-v2"))["status_code"] == 409
    assert await effects(client, "op-v2") == []


async def test_refund_is_bounded_by_the_refundable_amount(client: httpx.AsyncClient) -> None:
    total = SEED_FACTS["order_a100"]["total_cents"]
    ok = await write(client, "refund_order", {**REFUND, "amountCents": total - 100}, "op-r1")
    assert ok.status_code == 201
    assert (ok.json()["refunded_cents"], ok.json()["refundable_cents"]) == (total - 100, 100)
    over = await write(client, "refund_order", {**REFUND, "amountCents": 101}, "op-r2")
    assert assert_problem(over, 422, "NOT_REFUNDABLE")["detail"] == "amountCents: at most 100 cents are refundable"
    refunds = (await client.get("/orders/A100/refunds", headers=U1)).json()
    assert (refunds["refunded_cents"], refunds["total_cents"]) == (total - 100, total)
    assert [r["refund_id"] for r in refunds["refunds"]] == [ok.json()["refund_id"]]
    order = (await client.get("/orders/A100", headers=U1)).json()
    assert (order["refunded_cents"], order["refundable_cents"], order["version"]) == (total - 100, 100, 2)
    assert len(await effects(client)) == 1


async def test_a_refund_goes_to_the_paying_account_unless_another_is_named(client: httpx.AsyncClient) -> None:
    paid_from = SEED_FACTS["order_a100"]["paid_from"]
    to_payer = await write(client, "refund_order", {**REFUND, "toAccount": None}, "op-payer")
    assert (to_payer.status_code, to_payer.json()["to_account"]) == (201, paid_from)
    # The service records where the money went; whether that account may get it is the approval policy's call.
    elsewhere = await write(client, "refund_order", {**REFUND, "toAccount": "acct-u1-0002"}, "op-other")
    assert (elsewhere.status_code, elsewhere.json()["to_account"]) == (201, "acct-u1-0002")
    refunds = (await client.get("/orders/A100/refunds", headers=U1)).json()
    expected = {to_payer.json()["refund_id"]: paid_from, elsewhere.json()["refund_id"]: "acct-u1-0002"}
    assert {r["refund_id"]: r["to_account"] for r in refunds["refunds"]} == expected
    assert refunds["paid_from"] == paid_from
    assert {e["id"]: e["to_account"] for e in await effects(client)} == expected


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amountCents": None}, "amountCents"),
        ({"amountCents": 0}, "amountCents"),
        ({"amountCents": -5}, "amountCents"),
        ({"amountCents": 2**53}, "amountCents"),
        ({"amountCents": 5.0}, "amountCents"),
        ({"amountCents": "500"}, "amountCents"),
        ({"reason": "   "}, "reason"),
        ({"reason": "ok\u200b"}, "reason"),
        ({"orderId": "A102"}, "orderId"),
        ({"userId": "u2"}, "userId"),
        ({"toAccount": "ACCT-U1-0001"}, "toAccount"),
        ({"toAccount": "acct-"}, "toAccount"),
        ({"toAccount": 1}, "toAccount"),
    ],
)
async def test_bad_refund_bodies_are_rejected(client: httpx.AsyncClient, change: dict[str, Any], field: str) -> None:
    r = await write(client, "refund_order", {**REFUND, **change}, "op-bad")
    assert assert_problem(r, 422, "INVALID_BODY")["detail"].startswith(f"{field}:")
    assert await effects(client) == []
    assert (await status_of(client, "op-bad"))["state"] == "not_found"


async def test_refund_without_amount_never_defaults_to_the_full_amount(client: httpx.AsyncClient) -> None:
    body = {"orderId": "A100", "reason": "refund everything"}
    r = await write(client, "refund_order", body, "op-all")
    assert assert_problem(r, 422, "INVALID_BODY")["detail"] == "amountCents: is required"
    assert await effects(client) == []


async def test_writes_on_objects_of_others_are_not_available(client: httpx.AsyncClient) -> None:
    r = await write(client, "refund_order", {**REFUND, "orderId": "A101"}, "op-na", path="/orders/A101/refunds")
    assert assert_problem(r, 404, "NOT_FOUND")["detail"] == "order A101 is not available"
    assert (await status_of(client, "op-na"))["status_code"] == 404
    assert await effects(client) == []


async def test_calendar_event_is_created_and_read_back(client: httpx.AsyncClient) -> None:
    r = await write(client, "create_calendar_event", EVENT, "op-e")
    assert r.status_code == 201
    event = r.json()
    assert event == {
        "event_id": event["event_id"],
        "calendar_id": "cal-u1",
        "title": "Call with supplier",
        "start": "2026-12-03T10:00:00Z",
        "end": "2026-12-03T11:00:00Z",
        "attendees": ["ops@example.com"],
    }
    [effect] = await effects(client, "op-e")
    assert (effect["kind"], effect["id"]) == ("event", event["event_id"])
    got = await client.get(f"/calendars/cal-u1/events/{event['event_id']}", headers=U1)
    assert (got.status_code, got.json()) == (200, event)
    assert_problem(await client.get(f"/calendars/cal-u1/events/{event['event_id']}", headers=U2), 404, "NOT_FOUND")
    no_attendees = {k: v for k, v in EVENT.items() if k != "attendees"}
    r = await write(client, "create_calendar_event", no_attendees, "op-e2")
    assert (r.status_code, r.json()["attendees"]) == (201, [])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"start": "2026-12-03T10:00:00"}, "start"),
        ({"end": "2026-12-03T09:00:00Z"}, "end"),
        ({"end": "2026-12-03T10:00:00Z"}, "end"),
        ({"end": "2026-12-03T18:00:01Z"}, "end"),
        ({"start": "2026-12-03T10:00:00.500Z"}, "start"),
        ({"recurrence": "RRULE:FREQ=DAILY"}, "recurrence"),
        ({"attendees": ["not-an-email"]}, "attendees.0"),
        ({"attendees": [f"a{i}@example.com" for i in range(21)]}, "attendees"),
        ({"title": ""}, "title"),
        ({"title": "x" * 201}, "title"),
        ({"calendarId": "cal-u2"}, "calendarId"),
    ],
)
async def test_bad_event_bodies_are_rejected(client: httpx.AsyncClient, change: dict[str, Any], field: str) -> None:
    r = await write(client, "create_calendar_event", {**EVENT, **change}, "op-bad-e")
    assert assert_problem(r, 422, "INVALID_BODY")["detail"].startswith(f"{field}:")
    assert await effects(client) == []


@pytest.mark.parametrize("text", ["   ", "", "x" * 501, "zero\u200bwidth", "bell\x07"])
async def test_bad_note_text_is_rejected(client: httpx.AsyncClient, text: str) -> None:
    r = await write(client, "append_ticket_note", {**NOTE, "text": text}, "op-bad-n")
    assert assert_problem(r, 422, "INVALID_BODY")["detail"].startswith("text:")
    assert await effects(client) == []


@pytest.mark.parametrize("raw", [b"[1]", b"not json", b'{"amountCents": NaN}', b""])
async def test_a_body_that_is_not_a_json_object_is_rejected(client: httpx.AsyncClient, raw: bytes) -> None:
    r = await client.post("/orders/A100/refunds", content=raw, headers=write_headers("op-j", "t"))
    assert assert_problem(r, 422, "INVALID_BODY")["detail"] == "the body must be a JSON object"
    assert await effects(client) == []


# --- The status endpoint ------------------------------------------------------------------------------------


async def test_status_reports_completed_and_not_found_per_actor(client: httpx.AsyncClient) -> None:
    assert await status_of(client, "op-s") == {
        "operation_id": "op-s",
        "state": "not_found",
        "status_code": None,
        "body": None,
        "retention_seconds": 86400.0,
    }
    created = await write(client, "refund_order", REFUND, "op-s")
    done = await status_of(client, "op-s")
    assert (done["state"], done["status_code"], done["body"]) == ("completed", 201, created.json())
    assert (await status_of(client, "op-s", U2))["state"] == "not_found"
    assert_problem(await client.get("/operations/op-s"), 401, "ACTOR_REQUIRED")
    assert_problem(await client.get("/operations/bad%20id", headers=U1), 422, "INVALID_REQUEST")


async def test_records_expire_after_the_retention_window(db: Path) -> None:
    # An approval may not outlive the retention, and commits only until the clock tolerance before its expiry.
    # (2.5 s left to commit after the tolerance: room for a busy machine.)
    async with asgi_client(db, idempotency_retention_seconds=5.0) as c:
        assert (await write(c, "append_ticket_note", NOTE, "op-old", expires_in=4.5)).status_code == 201
        assert (await status_of(c, "op-old"))["state"] == "completed"
        await asyncio.sleep(5.2)  # past the retention: the record's age, a known instant
        assert (await status_of(c, "op-old"))["state"] == "not_found"
        # A later write purges the expired rows from the ledger table itself.
        assert (await write(c, "refund_order", REFUND, "op-new", expires_in=4.5)).status_code == 201
    with sqlite3.connect(db) as conn:
        keys = [r[0] for r in conn.execute("SELECT operation_id FROM idempotency_records")]
    assert keys == ["op-new"]


async def test_a_retry_while_the_first_attempt_is_in_flight_is_409(client: httpx.AsyncClient) -> None:
    await set_faults(
        client,
        {
            "method": "POST",
            "path_regex": "^/orders/A100/refunds$",
            "when": "after_claim",
            "latency_ms": 800,
            "times": 1,
        },
    )
    first = asyncio.create_task(write(client, "refund_order", REFUND, "op-f"))
    for _ in range(200):
        if (await status_of(client, "op-f"))["state"] == "in_progress":
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the first attempt never showed as in progress")
    retry = await write(client, "refund_order", REFUND, "op-f")
    assert_problem(retry, 409, "IN_PROGRESS")
    assert (await first).status_code == 201
    assert len(await effects(client, "op-f")) == 1
    assert (await status_of(client, "op-f"))["state"] == "completed"


async def test_503_before_commit_leaves_nothing_and_the_same_key_then_succeeds(client: httpx.AsyncClient) -> None:
    await set_faults(client, {"method": "POST", "path_regex": "/refunds$", "status": 503, "times": 1})
    assert_problem(await write(client, "refund_order", REFUND, "op-503"), 503, "UNAVAILABLE")
    assert (await status_of(client, "op-503"))["state"] == "not_found"
    assert (await write(client, "refund_order", REFUND, "op-503")).status_code == 201
    assert len(await effects(client, "op-503")) == 1


async def test_a_failure_after_the_claim_releases_it(client: httpx.AsyncClient) -> None:
    await set_faults(client, {"path_regex": "/notes$", "when": "after_claim", "status": 503, "times": 1})
    assert_problem(await write(client, "append_ticket_note", NOTE, "op-ac"), 503, "UNAVAILABLE")
    assert (await status_of(client, "op-ac"))["state"] == "not_found"
    assert (await write(client, "append_ticket_note", NOTE, "op-ac")).status_code == 201
    assert len(await effects(client, "op-ac")) == 1


async def test_status_endpoint_can_be_made_unavailable(client: httpx.AsyncClient) -> None:
    await set_faults(client, {"method": "GET", "path_regex": "^/operations/", "status": 503})
    assert_problem(await client.get("/operations/op-any", headers=U1), 503, "UNAVAILABLE")


@pytest.mark.parametrize(
    "rule",
    [
        {"path_regex": "x", "when": "before_handler", "action": "drop"},
        {"path_regex": "x", "when": "after_claim", "action": "truncate"},
        {"path_regex": "x", "when": "after_commit", "action": "drop", "status": 500},
        {"path_regex": "x", "when": "after_commit", "action": "explode"},
        {"path_regex": "x", "when": "sometime"},
    ],
)
async def test_inconsistent_fault_rules_are_rejected(client: httpx.AsyncClient, rule: dict[str, Any]) -> None:
    assert_problem(await client.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN), 422, "INVALID_REQUEST")


# --- After-commit faults on a real socket -------------------------------------------------------------------


async def assert_committed_once(c: httpx.AsyncClient, operation_id: str, tool: str, body: Mapping[str, Any]) -> None:
    """Exactly one effect; the status endpoint and a retry with the same key both give the stored reply."""
    assert len(await effects(c, operation_id)) == 1
    status = await status_of(c, operation_id)
    assert (status["state"], status["status_code"]) == ("completed", 201)
    retry = await write(c, tool, body, operation_id)
    assert (retry.status_code, retry.json(), retry.headers["idempotent-replayed"]) == (201, status["body"], "true")
    assert len(await effects(c, operation_id)) == 1


async def test_drop_after_commit_closes_without_a_reply(real: httpx.AsyncClient) -> None:
    await set_faults(
        real, {"method": "POST", "path_regex": "/notes$", "when": "after_commit", "action": "drop", "times": 1}
    )
    ticket = (await real.get("/tickets/T1001", headers=U1)).json()
    body = {**NOTE, "expectedVersion": ticket["version"]}
    # Not a byte of a reply: httpx sees the connection closed before any status line.
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        await write(real, "append_ticket_note", body, "op-drop")
    await assert_committed_once(real, "op-drop", "append_ticket_note", body)


async def test_truncate_after_commit_cuts_the_body(real: httpx.AsyncClient) -> None:
    await set_faults(real, {"path_regex": "/refunds$", "when": "after_commit", "action": "truncate", "times": 1})
    body = {**REFUND, "amountCents": 1}
    with pytest.raises(httpx.RemoteProtocolError, match="without sending complete message body"):
        await write(real, "refund_order", body, "op-cut")
    await assert_committed_once(real, "op-cut", "refund_order", body)


async def test_500_after_commit_replaces_the_reply(real: httpx.AsyncClient) -> None:
    await set_faults(real, {"path_regex": "/events$", "when": "after_commit", "status": 500, "times": 1})
    body = {**EVENT, "start": "2026-12-08T10:00:00Z", "end": "2026-12-08T11:00:00Z"}
    assert_problem(await write(real, "create_calendar_event", body, "op-500"), 500, "SERVER_ERROR")
    await assert_committed_once(real, "op-500", "create_calendar_event", body)


async def test_latency_after_commit_outlasts_the_caller(real: httpx.AsyncClient) -> None:
    await set_faults(real, {"path_regex": "/refunds$", "when": "after_commit", "latency_ms": 1500, "times": 1})
    body = {**REFUND, "amountCents": 2}
    token = approval_token("op-slow", "refund_order", body)
    with pytest.raises(httpx.ReadTimeout):
        await real.post("/orders/A100/refunds", json=body, headers=write_headers("op-slow", token), timeout=0.5)
    await assert_committed_once(real, "op-slow", "refund_order", body)


async def test_replays_are_not_hit_by_after_commit_faults(real: httpx.AsyncClient) -> None:
    body = {**REFUND, "amountCents": 3}
    first = await write(real, "refund_order", body, "op-rp")
    await set_faults(real, {"path_regex": "/refunds$", "when": "after_commit", "action": "drop"})
    again = await write(real, "refund_order", body, "op-rp")
    assert (again.status_code, again.json()) == (201, first.json())


# --- Two processes on one database -------------------------------------------------------------------------


@pytest.mark.parametrize("in_flight_ms", [0, 300])
async def test_two_processes_racing_on_one_key_make_one_effect(tmp_path: Path, in_flight_ms: int) -> None:
    db = tmp_path / "shared.db"
    async with service_process(db) as (url_a, _), service_process(db) as (url_b, _):
        async with (
            httpx.AsyncClient(base_url=url_a, timeout=15) as a,
            httpx.AsyncClient(base_url=url_b, timeout=15) as b,
        ):
            if in_flight_ms:
                await set_faults(
                    a, {"path_regex": "/refunds$", "when": "after_claim", "latency_ms": in_flight_ms, "times": 1}
                )
            token = approval_token("op-race", "refund_order", REFUND)
            answers = await asyncio.gather(
                *(write(c, "refund_order", REFUND, "op-race", token=token) for c in [a, b] * 5)
            )
            assert len(await effects(a, "op-race")) == 1
            created = [r for r in answers if r.status_code == 201]
            assert created and {r.content for r in created} == {created[0].content}
            assert all(r.status_code in (201, 409) for r in answers)
            for r in answers:
                if r.status_code == 409:
                    assert_problem(r, 409, "IN_PROGRESS")
            if in_flight_ms:
                assert any(r.status_code == 409 for r in answers)
            assert (await status_of(b, "op-race"))["body"] == created[0].json()


async def test_the_approval_verify_key_comes_from_the_environment_and_no_key_is_logged(tmp_path: Path) -> None:
    async with service_process(tmp_path / "p.db", "--idempotency-retention-seconds", "60") as (url, lines):
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            assert (await write(c, "refund_order", REFUND, "op-env")).status_code == 201
    output = "".join(lines)
    assert "approval verify key set" in output
    assert APPROVAL_KEY not in output


# --- Issue 6: expiry at commit, ASCII ids, NFC text, declared retention ------------------------------------


async def test_an_approval_that_expires_while_the_service_stalls_after_the_claim_commits_nothing(
    client: httpx.AsyncClient,
) -> None:
    # Valid when the request arrives (more than the clocks' tolerance left); the service holds the claim until
    # less than the tolerance is left before committing.
    await set_faults(client, {"method": "POST", "path_regex": "/notes$", "when": "after_claim", "latency_ms": 1500})
    token = approval_token("op-late", "append_ticket_note", NOTE, expires_in=CLOCK_TOLERANCE_SECONDS + 1.0)
    r = await write(client, "append_ticket_note", NOTE, "op-late", token=token)
    body = assert_problem(r, 403, "APPROVAL_EXPIRED")
    assert body["detail"] == "the approval expired before the write could be committed"
    assert await effects(client) == []
    # Nothing was recorded for the key and its claim is gone: the status says not there.
    assert (await status_of(client, "op-late"))["state"] == "not_found"
    assert (await client.get("/tickets/T1001", headers=U1)).json()["version"] == 1


@pytest.mark.parametrize("order_id", ["A\u0661\u0660\u0660", "A\uff11\uff10\uff10", "\u0410100"])
async def test_ids_with_non_ascii_digits_or_letters_are_rejected(client: httpx.AsyncClient, order_id: str) -> None:
    assert_problem(await client.get(f"/orders/{order_id}", headers=U1), 422, "INVALID_REQUEST")
    r = await write(
        client, "refund_order", {**REFUND, "orderId": order_id}, "op-ascii", path=f"/orders/{order_id}/refunds"
    )
    assert_problem(r, 422, "INVALID_REQUEST")
    assert await effects(client) == []


async def test_text_is_stored_in_nfc(client: httpx.AsyncClient) -> None:
    decomposed = {**NOTE, "text": "Cafe\u0301 called"}
    assert (await write(client, "append_ticket_note", decomposed, "op-nfc")).status_code == 201
    [effect] = await effects(client, "op-nfc")
    assert effect["text"] == "Caf\u00e9 called"


async def test_the_status_declares_the_configured_retention(db: Path) -> None:
    async with asgi_client(db, idempotency_retention_seconds=123.0) as c:
        assert (await status_of(c, "op-any"))["retention_seconds"] == 123.0


async def test_a_body_at_the_size_limit_is_read_and_one_byte_more_is_413(client: httpx.AsyncClient) -> None:
    from toolloop.servicekit import MAX_BODY_BYTES

    reason = "r" * 100
    body = json.dumps({**REFUND, "reason": reason})
    padded = body + " " * (MAX_BODY_BYTES - len(body))  # whitespace: the same JSON, exactly at the limit
    headers = {**write_headers("op-size", approval_token("op-size", "refund_order", {**REFUND, "reason": reason}))}
    headers["content-type"] = "application/json"
    at_limit = await client.post("/orders/A100/refunds", content=padded.encode(), headers=headers)
    assert at_limit.status_code == 201
    over = await client.post("/orders/A100/refunds", content=(padded + " ").encode(), headers=headers)
    assert assert_problem(over, 413, "BODY_TOO_LARGE")["detail"] == f"the body may be at most {MAX_BODY_BYTES} bytes"


async def test_the_request_log_holds_each_writes_key_and_the_digest_of_its_payload(client: httpx.AsyncClient) -> None:
    # The test bed tells a resend (one payload) from a second payload by these, whatever key each came with.
    op, other = "op_" + "1" * 32, "op_" + "2" * 32
    await write(client, "create_calendar_event", EVENT, op)
    reordered = json.dumps(dict(reversed(list(EVENT.items()))))
    token = approval_token(other, "create_calendar_event", EVENT)
    await client.post(WRITES["create_calendar_event"], content=reordered, headers=write_headers(other, token))
    await write(client, "refund_order", REFUND, op)  # another payload under the first key: refused, logged
    await client.get(f"/operations/{op}", headers=U1)
    log = (await client.get("/admin/requests", headers=ADMIN)).json()["requests"]
    sent = [(e["method"], e["idempotency_key"], e["body_digest"]) for e in log]
    assert [s[:2] for s in sent] == [("POST", op), ("POST", other), ("POST", op), ("GET", None)]
    event, reordered_event, refund = (s[2] for s in sent[:3])
    assert event == reordered_event and len(event) == 64 and refund != event and sent[3][2] is None
