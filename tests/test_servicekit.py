"""The idempotency kit (toolloop.servicekit) on SQLite and on PostgreSQL, judged by the service's own rows:
the notes each operation id made, the ledger's records and its claims.

In process (the kit service as an ASGI app): keys, replays, refusals, approvals, status and retention. Then
two real service processes on one database, with hold points that make two attempts meet at the worst
moment, and a process killed inside the commit. Last, the Ledger's methods on their own, including two
`complete` calls for one key that run at once, and (PostgreSQL) a status read that an attempt's commit and
release overtake between its two reads."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from starlette.requests import Request

from tests.agent_helpers import assert_eventually
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY
from tests.kit_service import (
    NOTE_REFUSED,
    KitServiceProcess,
    NotesStorage,
    PostgresNotes,
    SqliteNotes,
    create_app,
    note_digest,
    note_token,
    start_kit_service,
)
from tests.pg import PgServer, pg_server  # noqa: F401 - the fixture, for the PostgreSQL storage
from toolloop._core.approvals import (
    CLOCK_TOLERANCE_SECONDS,
    http_subject,
    payload_digest,
    read_approval_claims,
    verify_key_for,
)
from toolloop.servicekit import (
    PROBLEM_MEDIA_TYPE,
    ClaimTaken,
    HoldPoint,
    IdempotencyKit,
    IdempotentWrite,
    KitActor,
    KitProblem,
    LedgerKey,
    LedgerRecord,
    SqliteLedger,
    insecure_actor_from_headers,
    reached,
)

U1 = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
U2 = {"X-Actor-User": "u2", "X-Actor-Tenant": "acme"}
U1_ELSEWHERE = {"X-Actor-User": "u1", "X-Actor-Tenant": "globex"}
NOTE = {"text": "exactly once"}
OTHER_NOTE = {"text": "something else"}
NO_TOKEN = ""
RETENTION = 120.0


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NotesStorage]:
    """The service's database: a fresh SQLite file, or a fresh database on the session's PostgreSQL."""
    if request.param == "sqlite":
        yield SqliteNotes(tmp_path / "kit.db")
        return
    server: PgServer = request.getfixturevalue("pg_server")
    with server.database() as dsn:
        storage = PostgresNotes(dsn)
        yield storage
        storage.close()


# --- The service's rows ----------------------------------------------------------------------------------------


def notes_of(storage: NotesStorage, operation_id: str) -> list[tuple[Any, ...]]:
    return storage.rows("SELECT user_id, tenant_id, text FROM notes WHERE operation_id = ?", operation_id)


def all_notes(storage: NotesStorage) -> list[tuple[Any, ...]]:
    return storage.rows("SELECT operation_id, text FROM notes ORDER BY operation_id")


def records(storage: NotesStorage) -> list[tuple[Any, ...]]:
    return storage.rows(
        "SELECT tenant_id, user_id, operation_id, status FROM idempotency_records"
        " ORDER BY tenant_id, user_id, operation_id"
    )


def claims(storage: NotesStorage) -> list[tuple[Any, ...]]:
    return storage.rows("SELECT tenant_id, user_id, operation_id FROM idempotency_claims")


# --- In process -----------------------------------------------------------------------------------------------


@asynccontextmanager
async def kit_app(storage: NotesStorage, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(storage, approval_verify_key=options.pop("approval_verify_key", APPROVAL_VERIFY_KEY), **options)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://kit") as http:
        yield http


async def post_note(
    http: httpx.AsyncClient,
    operation_id: str | None,
    body: dict[str, Any],
    *,
    actor: dict[str, str] = U1,
    token: str | None = None,
) -> httpx.Response:
    """POST /notes as `actor` under `operation_id`, with an approval of exactly that (unless `token` is given;
    NO_TOKEN sends none)."""
    headers = dict(actor)
    if operation_id is not None:
        headers["Idempotency-Key"] = operation_id
        if token is None:
            # Shorter than every retention used here: an approval may not outlive the record it makes.
            token = note_token(
                APPROVAL_KEY,
                operation_id,
                body,
                user=actor["X-Actor-User"],
                tenant=actor["X-Actor-Tenant"],
                expires_in=RETENTION / 2,
            )
    if token:
        headers["X-Approval-Token"] = token
    return await http.post("/notes", json=body, headers=headers, timeout=30)


async def status_of(http: httpx.AsyncClient, operation_id: str, actor: dict[str, str] = U1) -> dict[str, Any]:
    response = await http.get(f"/operations/{operation_id}", headers=actor, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def problem_code(response: httpx.Response) -> str:
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE
    return str(response.json()["code"])


async def test_the_same_key_and_payload_get_the_stored_reply_and_make_one_effect(storage: NotesStorage) -> None:
    async with kit_app(storage) as http:
        first = await post_note(http, "op-replay", NOTE)
        again = await post_note(http, "op-replay", NOTE)

    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    assert first.headers["content-type"] == "application/json"
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json() and first.json()["text"] == NOTE["text"]
    assert notes_of(storage, "op-replay") == [("u1", "acme", NOTE["text"])]
    assert records(storage) == [("acme", "u1", "op-replay", 201)]
    assert storage.rows("SELECT digest FROM idempotency_records") == [(note_digest(NOTE),)]
    assert claims(storage) == []


async def test_a_key_is_unique_per_actor_not_across_actors(storage: NotesStorage) -> None:
    async with kit_app(storage) as http:
        answers = [await post_note(http, "op-shared", NOTE, actor=actor) for actor in (U1, U2, U1_ELSEWHERE)]

    assert [a.status_code for a in answers] == [201, 201, 201]
    assert not any("idempotent-replayed" in a.headers for a in answers)
    assert len({a.json()["note_id"] for a in answers}) == 3
    assert sorted(notes_of(storage, "op-shared")) == [
        ("u1", "acme", NOTE["text"]),
        ("u1", "globex", NOTE["text"]),
        ("u2", "acme", NOTE["text"]),
    ]
    assert records(storage) == [
        ("acme", "u1", "op-shared", 201),
        ("acme", "u2", "op-shared", 201),
        ("globex", "u1", "op-shared", 201),
    ]


async def test_the_same_key_with_another_payload_is_refused_and_changes_nothing(storage: NotesStorage) -> None:
    async with kit_app(storage) as http:
        first = await post_note(http, "op-reuse", NOTE)
        # Properly approved for the other payload: the key, not the approval, is what refuses it.
        reused = await post_note(http, "op-reuse", OTHER_NOTE)

    assert first.status_code == 201
    assert reused.status_code == 422 and problem_code(reused) == "IDEMPOTENCY_KEY_REUSED"
    assert notes_of(storage, "op-reuse") == [("u1", "acme", NOTE["text"])]
    assert storage.rows("SELECT digest, status FROM idempotency_records") == [(note_digest(NOTE), 201)]


@pytest.mark.parametrize("key", [None, "", "has space", "x" * 101], ids=["missing", "empty", "bad-chars", "too-long"])
async def test_a_write_without_a_valid_key_is_refused_before_anything(storage: NotesStorage, key: str | None) -> None:
    async with kit_app(storage) as http:
        headers = {**U1, "X-Approval-Token": note_token(APPROVAL_KEY, "op-any", NOTE)}
        if key is not None:
            headers["Idempotency-Key"] = key
        answer = await http.post("/notes", json=NOTE, headers=headers)

    assert answer.status_code == 400 and problem_code(answer) == "IDEMPOTENCY_KEY_REQUIRED"
    assert all_notes(storage) == [] and records(storage) == [] and claims(storage) == []


async def wait_for(event: threading.Event, what: str) -> None:
    async def is_set() -> bool:
        return event.is_set()

    await assert_eventually(is_set, within=10, what=what)


async def test_an_attempt_in_flight_makes_another_one_with_its_key_wait_409(storage: NotesStorage) -> None:
    claimed, go = threading.Event(), threading.Event()

    def hold_the_first(write: IdempotentWrite) -> None:
        if not claimed.is_set():
            claimed.set()
            go.wait(timeout=15)

    async with kit_app(storage, after_claim=hold_the_first) as http:
        try:
            first = asyncio.create_task(post_note(http, "op-flight", NOTE))
            await wait_for(claimed, "the first attempt claimed the key")
            assert claims(storage) == [("acme", "u1", "op-flight")]
            second = await post_note(http, "op-flight", NOTE)
            in_flight = await status_of(http, "op-flight")
        finally:
            go.set()
        done = await first

    assert second.status_code == 409 and problem_code(second) == "IN_PROGRESS"
    assert in_flight == {
        "operation_id": "op-flight",
        "state": "in_progress",
        "status_code": None,
        "body": None,
        "retention_seconds": 86_400.0,
    }
    assert done.status_code == 201 and "idempotent-replayed" not in done.headers
    assert len(notes_of(storage, "op-flight")) == 1
    assert records(storage) == [("acme", "u1", "op-flight", 201)] and claims(storage) == []


# Each forgery and its problem code: expired, another channel's key (its kid unknown here) and another
# service's token each have their own.
FORGERIES = {
    "none": "APPROVAL_REQUIRED",
    "forged": "APPROVAL_UNKNOWN_KEY",
    "expired": "APPROVAL_EXPIRED",
    "other_digest": "APPROVAL_REQUIRED",
    "other_actor": "APPROVAL_REQUIRED",
    "other_key": "APPROVAL_REQUIRED",
    "rejected": "APPROVAL_REQUIRED",
    "no_verify_key": "APPROVAL_REQUIRED",
    "other_service": "APPROVAL_WRONG_AUDIENCE",
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
async def test_a_write_without_a_valid_approval_is_refused_403_and_makes_no_effect(
    storage: NotesStorage, forgery: str
) -> None:
    op = "op-approval"
    token = {
        "none": NO_TOKEN,
        "forged": note_token(OTHER_SIGNING_KEY, op, NOTE),
        "expired": note_token(APPROVAL_KEY, op, NOTE, expires_in=-1),
        "other_digest": note_token(APPROVAL_KEY, op, OTHER_NOTE),
        "other_actor": note_token(APPROVAL_KEY, op, NOTE, user="u2"),
        "other_key": note_token(APPROVAL_KEY, "op-elsewhere", NOTE),
        "rejected": note_token(APPROVAL_KEY, op, NOTE, decision="reject"),
        "no_verify_key": note_token(APPROVAL_KEY, op, NOTE),
        "other_service": note_token(APPROVAL_KEY, op, NOTE, audience="bizservice"),
    }[forgery]
    verify_key = None if forgery == "no_verify_key" else APPROVAL_VERIFY_KEY
    async with kit_app(storage, approval_verify_key=verify_key) as http:
        answer = await post_note(http, op, NOTE, token=token)
        status = await status_of(http, op)

    assert answer.status_code == 403 and problem_code(answer) == FORGERIES[forgery]
    assert status["state"] == "not_found"
    assert all_notes(storage) == [] and records(storage) == [] and claims(storage) == []


async def test_during_a_key_rotation_both_keys_are_accepted_and_the_old_one_is_refused_once_removed(
    storage: NotesStorage,
) -> None:
    new_key = OTHER_SIGNING_KEY
    both = f"{APPROVAL_VERIFY_KEY},{verify_key_for(new_key)}"
    async with kit_app(storage, approval_verify_key=both) as http:
        old = await post_note(http, "op-old", NOTE, token=note_token(APPROVAL_KEY, "op-old", NOTE))
        new = await post_note(http, "op-new", OTHER_NOTE, token=note_token(new_key, "op-new", OTHER_NOTE))
    assert (old.status_code, new.status_code) == (201, 201)
    async with kit_app(storage, approval_verify_key=verify_key_for(new_key)) as http:
        retired = await post_note(http, "op-retired", NOTE, token=note_token(APPROVAL_KEY, "op-retired", NOTE))
        current = await post_note(http, "op-current", NOTE, token=note_token(new_key, "op-current", NOTE))
    assert retired.status_code == 403 and problem_code(retired) == "APPROVAL_UNKNOWN_KEY"
    assert current.status_code == 201
    assert sorted(op for _, _, op, _ in records(storage)) == ["op-current", "op-new", "op-old"]


async def test_a_refusal_is_stored_and_replayed_and_what_the_effect_wrote_before_it_is_rolled_back(
    storage: NotesStorage,
) -> None:
    refused = {"text": "REFUSE: the effect writes a note, then says no"}
    async with kit_app(storage) as http:
        first = await post_note(http, "op-refused", refused)
        again = await post_note(http, "op-refused", refused)
        status = await status_of(http, "op-refused")

    assert first.status_code == 409 and problem_code(first) == NOTE_REFUSED
    assert "idempotent-replayed" not in first.headers
    assert again.status_code == 409 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert (status["state"], status["status_code"], status["body"]["code"]) == ("completed", 409, NOTE_REFUSED)
    # The note the effect inserted before refusing went back with the savepoint; the refusal is recorded.
    assert all_notes(storage) == []
    assert records(storage) == [("acme", "u1", "op-refused", 409)] and claims(storage) == []


async def test_the_status_declares_the_retention_and_is_scoped_per_actor(storage: NotesStorage) -> None:
    async with kit_app(storage, retention_seconds=RETENTION) as http:
        before = await status_of(http, "op-status")
        made = await post_note(http, "op-status", NOTE)
        mine = await status_of(http, "op-status")
        # Another actor's key of the same name is not theirs to see: it looks unknown.
        theirs = await status_of(http, "op-status", actor=U2)
        elsewhere = await status_of(http, "op-status", actor=U1_ELSEWHERE)
        anonymous = await http.get("/operations/op-status")
        bad_id = await http.get("/operations/has%20space", headers=U1)

    assert before == {
        "operation_id": "op-status",
        "state": "not_found",
        "status_code": None,
        "body": None,
        "retention_seconds": RETENTION,
    }
    assert made.status_code == 201
    assert mine == {
        "operation_id": "op-status",
        "state": "completed",
        "status_code": 201,
        "body": made.json(),
        "retention_seconds": RETENTION,
    }
    assert theirs == elsewhere == before
    assert anonymous.status_code == 401 and problem_code(anonymous) == "ACTOR_REQUIRED"
    assert bad_id.status_code == 422


async def test_a_record_past_retention_no_longer_counts(storage: NotesStorage) -> None:
    async with kit_app(storage, retention_seconds=RETENTION) as http:
        first = await post_note(http, "op-old", NOTE)
        # The record grows older than the retention (its clock, not ours, moved).
        storage.execute("UPDATE idempotency_records SET created_at = created_at - ?", 2 * RETENTION)
        forgotten = await status_of(http, "op-old")
        # Forgotten means forgotten: the key is free again, even for another payload.
        second = await post_note(http, "op-old", OTHER_NOTE)
        remembered = await status_of(http, "op-old")

    assert first.status_code == 201
    assert (forgotten["state"], forgotten["retention_seconds"]) == ("not_found", RETENTION)
    assert second.status_code == 201 and "idempotent-replayed" not in second.headers
    assert remembered["state"] == "completed" and remembered["body"] == second.json()
    assert sorted(t for _, _, t in notes_of(storage, "op-old")) == sorted([NOTE["text"], OTHER_NOTE["text"]])
    # Only the new record is kept under the key (the old one was purged).
    assert storage.rows("SELECT digest FROM idempotency_records") == [(note_digest(OTHER_NOTE),)]


async def test_the_approvals_expiry_is_checked_again_inside_the_commit(storage: NotesStorage) -> None:
    # More than the clocks' tolerance left when it arrives (the check before the claim wants that).
    token = note_token(APPROVAL_KEY, "op-late", NOTE, expires_in=CLOCK_TOLERANCE_SECONDS + 1.0)
    expires_at = read_approval_claims(token).expires_at
    stalled = threading.Event()

    def stall_past_the_expiry(write: IdempotentWrite) -> None:
        # Valid when checked before the claim; the attempt then stalls until the approval has run out.
        stalled.set()
        deadline = time.monotonic() + 5
        while time.time() <= expires_at + 0.05 and time.monotonic() < deadline:
            time.sleep(0.02)

    async with kit_app(storage, after_claim=stall_past_the_expiry) as http:
        late = await post_note(http, "op-late", NOTE, token=token)
        status = await status_of(http, "op-late")

    assert stalled.is_set()  # it did get past the first check and claim the key
    assert late.status_code == 403 and problem_code(late) == "APPROVAL_EXPIRED"
    assert "expired before the write could be committed" in late.json()["detail"]
    assert status["state"] == "not_found"
    assert all_notes(storage) == [] and records(storage) == [] and claims(storage) == []


async def passed(moment: float, what: str) -> None:
    """Wait until the clock is past `moment` (an approval's expiry, say)."""

    async def is_past() -> bool:
        return time.time() > moment

    await assert_eventually(is_past, within=10, what=what)


async def test_an_attempt_stalled_in_its_commit_past_its_lease_and_expiry_commits_nothing(
    storage: NotesStorage,
) -> None:
    # Every check before the effect passes; then the attempt stalls inside its commit (its note written, its
    # record not yet) past its lease and its approval's expiry. The status says not_found meanwhile, which the
    # workflow takes for "not done" once the approval has expired: the stalled commit must not make it untrue.
    token = note_token(APPROVAL_KEY, "op-stall", NOTE, expires_in=CLOCK_TOLERANCE_SECONDS + 1)
    expires_at = read_approval_claims(token).expires_at
    stall = MeetingPoint("effect_written")
    async with kit_app(storage, claim_lease_seconds=0.5, hold=stall) as http:
        try:
            attempt = asyncio.create_task(post_note(http, "op-stall", NOTE, token=token))
            await stall.until(1, "the attempt wrote its note and stopped before its record")
            await passed(expires_at, "the approval expired")
            meanwhile = await status_of(http, "op-stall")
        finally:
            stall.go.set()
        late = await attempt
        after = await status_of(http, "op-stall")

    assert meanwhile["state"] == "not_found"
    assert late.status_code == 403 and problem_code(late) == "APPROVAL_EXPIRED"
    assert "expired before the write could be committed" in late.json()["detail"]
    assert after["state"] == "not_found"
    assert all_notes(storage) == [] and records(storage) == [] and claims(storage) == []


async def test_a_commit_within_the_clock_tolerance_before_the_expiry_is_refused(storage: NotesStorage) -> None:
    # The workflow reads the expiry by its own clock, which may run ahead of the service's: the service stops
    # committing the tolerance before the expiry, not at it.
    # Enough left to start (the check before the claim wants more than the tolerance), not to commit after a wait.
    token = note_token(APPROVAL_KEY, "op-edge", NOTE, expires_in=CLOCK_TOLERANCE_SECONDS + 3)
    expires_at = read_approval_claims(token).expires_at
    stall = MeetingPoint("effect_written")
    async with kit_app(storage, hold=stall) as http:
        try:
            attempt = asyncio.create_task(post_note(http, "op-edge", NOTE, token=token))
            await stall.until(1, "the attempt wrote its note and stopped before its record")
            await passed(expires_at - CLOCK_TOLERANCE_SECONDS, "the tolerance before the expiry began")
            released_at = time.time()
        finally:
            stall.go.set()
        late = await attempt

    assert released_at < expires_at  # still valid by the service's own clock when it went on
    assert late.status_code == 403 and problem_code(late) == "APPROVAL_EXPIRED"
    assert all_notes(storage) == [] and records(storage) == [] and claims(storage) == []


async def test_an_approval_with_less_than_the_tolerance_left_starts_nothing(storage: NotesStorage) -> None:
    # It could not commit (above): it is refused before its claim, and its effect never runs.
    token = note_token(APPROVAL_KEY, "op-short", NOTE, expires_in=CLOCK_TOLERANCE_SECONDS - 1)
    reached = MeetingPoint("effect_written")
    reached.go.set()
    async with kit_app(storage, hold=reached) as http:
        short = await post_note(http, "op-short", NOTE, token=token)
    assert short.status_code == 403 and problem_code(short) == "APPROVAL_EXPIRED"
    assert reached.arrived == [] and all_notes(storage) == [] and records(storage) == [] and claims(storage) == []


async def test_an_attempt_whose_claim_was_taken_over_commits_nothing_and_the_one_holding_it_decides(
    storage: NotesStorage,
) -> None:
    # A stalls after its claim past the lease; B takes the key over and stalls too; A goes on first. A's claim
    # is no longer its own, so A commits nothing (409, ask again) and B, which holds the key, makes the note.
    claimed = [threading.Event(), threading.Event()]
    go = [threading.Event(), threading.Event()]
    arrived: list[int] = []

    def stall_each(write: IdempotentWrite) -> None:
        turn = len(arrived)
        arrived.append(turn)
        claimed[turn].set()
        go[turn].wait(timeout=15)

    async with kit_app(storage, claim_lease_seconds=0.5, after_claim=stall_each) as http:
        try:
            attempt_a = asyncio.create_task(post_note(http, "op-over", NOTE))
            await wait_for(claimed[0], "A claimed the key and stalled")

            async def lease_ran_out() -> bool:
                return bool((await status_of(http, "op-over"))["state"] == "not_found")

            await assert_eventually(lease_ran_out, within=10, what="A's lease ran out")
            attempt_b = asyncio.create_task(post_note(http, "op-over", NOTE))
            await wait_for(claimed[1], "B took the key over and stalled")
            go[0].set()
            late = await attempt_a
            left_by_a = (all_notes(storage), records(storage), len(claims(storage)))
        finally:
            go[0].set()
            go[1].set()
        made = await attempt_b
        after = await status_of(http, "op-over")

    assert late.status_code == 409 and problem_code(late) == "IN_PROGRESS"
    assert left_by_a == ([], [], 1)  # nothing of A's; B's claim stays
    assert made.status_code == 201 and "idempotent-replayed" not in made.headers
    assert notes_of(storage, "op-over") == [("u1", "acme", NOTE["text"])]
    assert records(storage) == [("acme", "u1", "op-over", 201)] and claims(storage) == []
    assert after["state"] == "completed" and after["body"] == made.json()


# --- Two real processes racing one key ------------------------------------------------------------------------


@pytest.fixture
async def two_services(
    storage: NotesStorage, tmp_path: Path
) -> AsyncIterator[tuple[KitServiceProcess, KitServiceProcess, Path]]:
    """Two kit service processes on one database (started at once: their schema set-ups meet too), with
    hold points armed by files in one directory and a claim lease of 2 s."""
    holds = tmp_path / "holds"
    holds.mkdir()

    def start(name: str) -> KitServiceProcess:
        return start_kit_service(
            storage, tmp_path / f"{name}.log", verify_key=APPROVAL_VERIFY_KEY, hold_dir=holds, claim_lease_seconds=2
        )

    results = await asyncio.gather(asyncio.to_thread(start, "a"), asyncio.to_thread(start, "b"), return_exceptions=True)
    started = [r for r in results if isinstance(r, KitServiceProcess)]
    try:
        for result in results:
            if isinstance(result, BaseException):
                raise result
        yield started[0], started[1], holds
    finally:
        for service in started:
            service.stop()


async def arrivals(holds: Path, point: HoldPoint, count: int, what: str) -> None:
    async def there() -> bool:
        return len(reached(holds, point)) == count

    await assert_eventually(there, within=15, what=what)


@pytest.mark.e2e
async def test_two_processes_meeting_between_check_and_insert_make_one_claim_and_one_effect(
    storage: NotesStorage, two_services: tuple[KitServiceProcess, KitServiceProcess, Path]
) -> None:
    a, b, holds = two_services
    async with httpx.AsyncClient(base_url=a.url) as first, httpx.AsyncClient(base_url=b.url) as second:
        # Whichever attempt claims the key then stays in flight until the test lets it go.
        for http in (first, second):
            (await http.put("/admin/fault", json={"kind": "stall_after_claim"})).raise_for_status()
        (holds / "claim_checked.armed").touch()
        attempt_a = asyncio.create_task(post_note(first, "op-meet", NOTE))
        await arrivals(holds, "claim_checked", 1, "A found the key free and stopped before its claim")
        attempt_b = asyncio.create_task(post_note(second, "op-meet", NOTE))
        if storage.kind == "postgres":
            # Nothing locks a key that has no row yet: B finds it free too, and both stand before the insert.
            await arrivals(holds, "claim_checked", 2, "B met A between check and insert")
        else:
            # SQLite's single writer: B waits for A's write transaction and never gets in between.
            await asyncio.sleep(1.0)  # time enough for B to get there, were it let in
            assert len(reached(holds, "claim_checked")) == 1
        (holds / "claim_checked.release").touch()

        done, _ = await asyncio.wait({attempt_a, attempt_b}, return_when=asyncio.FIRST_COMPLETED, timeout=20)
        [loser] = done
        loser_answer = loser.result()
        # The loser is answered while the winner still holds its claim, before any effect.
        assert loser_answer.status_code == 409 and problem_code(loser_answer) == "IN_PROGRESS"
        assert claims(storage) == [("acme", "u1", "op-meet")] and notes_of(storage, "op-meet") == []
        if storage.kind == "sqlite":
            assert loser is attempt_b
        for http in (first, second):
            (await http.post("/admin/fault/release")).raise_for_status()
        winner_answer = await (attempt_b if loser is attempt_a else attempt_a)

    assert winner_answer.status_code == 201 and "idempotent-replayed" not in winner_answer.headers
    assert notes_of(storage, "op-meet") == [("u1", "acme", NOTE["text"])]
    assert records(storage) == [("acme", "u1", "op-meet", 201)]
    assert claims(storage) == []


def idle_transactions(storage: NotesStorage) -> int:
    [(count,)] = storage.rows(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state IN ('idle in transaction', 'idle in transaction (aborted)')"
    )
    return int(count)


@pytest.mark.e2e
async def test_a_process_killed_between_effect_and_record_leaves_neither_and_the_key_then_makes_one(
    storage: NotesStorage, two_services: tuple[KitServiceProcess, KitServiceProcess, Path]
) -> None:
    a, b, holds = two_services
    (holds / "effect_written.armed").touch()
    async with httpx.AsyncClient(base_url=a.url) as first, httpx.AsyncClient(base_url=b.url) as second:
        attempt_a = asyncio.create_task(post_note(first, "op-killed", NOTE))
        await arrivals(holds, "effect_written", 1, "A wrote its note and stopped before the record")
        a.process.kill9()
        with pytest.raises(httpx.TransportError):
            await attempt_a
        if storage.kind == "postgres":

            async def rolled_back() -> bool:
                return idle_transactions(storage) == 0

            await assert_eventually(rolled_back, within=10, what="the server rolled back the dead attempt")
        # A died inside the commit's transaction: neither its note nor its record stands.
        assert notes_of(storage, "op-killed") == [] and records(storage) == []
        # Its claim keeps the key in progress until the lease (2 s) runs out.
        assert claims(storage) == [("acme", "u1", "op-killed")]
        assert (await status_of(second, "op-killed"))["state"] == "in_progress"
        (holds / "effect_written.armed").unlink()

        async def key_free() -> bool:
            return bool((await status_of(second, "op-killed"))["state"] == "not_found")

        await assert_eventually(key_free, within=15, what="the dead attempt's claim expired")
        retried = await post_note(second, "op-killed", NOTE)
        replayed = await post_note(second, "op-killed", NOTE)

    assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers
    assert replayed.status_code == 201 and replayed.headers["idempotent-replayed"] == "true"
    assert notes_of(storage, "op-killed") == [("u1", "acme", NOTE["text"])]
    assert records(storage) == [("acme", "u1", "op-killed", 201)] and claims(storage) == []


# --- The Ledger's methods on their own -------------------------------------------------------------------------

KEY = LedgerKey("acme", "u1", "op-ledger")
LEASE = 30.0


def ready(storage: NotesStorage) -> NotesStorage:
    storage.ledger.init()
    storage.create_schema()
    return storage


def note_effect(storage: NotesStorage, key: LedgerKey, runs: list[str], text: str = "direct") -> Any:
    """An effect that writes one note under `key` and answers 201 with it."""

    def effect(tx: Any) -> tuple[int, dict[str, Any]]:
        note_id = f"N{uuid.uuid4().hex[:16]}"
        runs.append(note_id)
        actor = KitActor(tenant_id=key.tenant_id, user_id=key.user_id)
        storage.insert_note(tx, note_id, actor, key.operation_id, text)
        return 201, {"note_id": note_id, "text": text}

    return effect


def test_claims_are_atomic_scoped_leased_and_released_by_their_own_id(storage: NotesStorage) -> None:
    ledger = ready(storage).ledger
    now = time.time()
    not_before = now - 3600
    assert ledger.lookup(KEY, now, not_before) == "not_found"

    first = ledger.claim(KEY, now, not_before, LEASE)
    assert isinstance(first, str)
    assert ledger.lookup(KEY, now, not_before) == "in_progress"
    with pytest.raises(ClaimTaken):
        ledger.claim(KEY, now + 1, not_before, LEASE)
    # The same operation id of another actor is another key.
    other = LedgerKey("acme", "u2", KEY.operation_id)
    theirs = ledger.claim(other, now, not_before, LEASE)
    assert isinstance(theirs, str) and theirs != first
    ledger.release(other, theirs)

    ledger.release(KEY, "not-the-claim-id")
    assert claims(storage) == [("acme", "u1", "op-ledger")]
    # Past its lease the claim frees the key; a late release of the old claim leaves the new one alone.
    later = now + LEASE + 1
    assert ledger.lookup(KEY, later, not_before) == "not_found"
    second = ledger.claim(KEY, later, not_before, LEASE)
    assert isinstance(second, str) and second != first
    ledger.release(KEY, first)
    assert storage.rows("SELECT claim_id FROM idempotency_claims") == [(second,)]
    ledger.release(KEY, second)
    assert claims(storage) == [] and ledger.lookup(KEY, later, not_before) == "not_found"


def test_complete_writes_once_and_the_record_answers_lookup_and_claim_until_purged(storage: NotesStorage) -> None:
    ledger = ready(storage).ledger
    now = time.time()
    not_before = now - 3600
    runs: list[str] = []

    record, made = ledger.complete(KEY, "sha256:a", note_effect(storage, KEY, runs), now, not_before)
    assert made is True and record == LedgerRecord("sha256:a", 201, {"note_id": runs[0], "text": "direct"})
    # Another attempt that gets as far as completing (or claiming) finds that record and changes nothing.
    again, made_again = ledger.complete(KEY, "sha256:b", note_effect(storage, KEY, runs), now, not_before)
    assert (again, made_again) == (record, False)
    assert ledger.claim(KEY, now, not_before, LEASE) == record
    assert ledger.lookup(KEY, now, not_before) == record
    assert runs == [record.body["note_id"]] and len(notes_of(storage, KEY.operation_id)) == 1
    assert claims(storage) == []

    # Past retention the record no longer counts, and a new one may take its place.
    assert ledger.lookup(KEY, now, now + 1) == "not_found"
    newer, made_newer = ledger.complete(KEY, "sha256:c", note_effect(storage, KEY, runs, "newer"), now + 2, now + 1)
    assert made_newer is True and newer.digest == "sha256:c"
    assert storage.rows("SELECT digest FROM idempotency_records") == [("sha256:c",)]

    ledger.purge(now + 1)  # keeps what is not older than that
    assert ledger.lookup(KEY, now + 2, now + 1) == newer
    ledger.purge(now + 3)
    assert records(storage) == [] and ledger.lookup(KEY, now + 2, 0) == "not_found"


def test_an_effect_that_fails_leaves_no_rows_and_no_record(storage: NotesStorage) -> None:
    ledger = ready(storage).ledger
    now = time.time()
    runs: list[str] = []
    write_note = note_effect(storage, KEY, runs)

    def effect_then_fail(tx: Any) -> tuple[int, dict[str, Any]]:
        write_note(tx)
        raise RuntimeError("the effect broke after writing")

    with pytest.raises(RuntimeError):
        ledger.complete(KEY, "sha256:a", effect_then_fail, now, now - 3600)
    assert len(runs) == 1
    assert all_notes(storage) == [] and records(storage) == []


class MeetingPoint:
    """A hold for in-process threads: every arrival at `point` is counted and waits until `go`."""

    def __init__(self, point: HoldPoint) -> None:
        self.point = point
        self.arrived: list[str] = []
        self.go = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, point: HoldPoint) -> None:
        if point != self.point:
            return
        with self._lock:
            self.arrived.append(threading.current_thread().name)
        self.go.wait(timeout=15)

    async def until(self, count: int, what: str) -> None:
        async def there() -> bool:
            return len(self.arrived) == count

        await assert_eventually(there, within=10, what=what)


async def test_two_completes_for_one_key_at_once_make_one_effect_and_return_the_same_record(
    storage: NotesStorage,
) -> None:
    ledger = ready(storage).ledger
    now = time.time()
    meeting = MeetingPoint("effect_written")
    runs: list[str] = []
    results: dict[str, tuple[LedgerRecord, bool]] = {}
    failures: list[BaseException] = []

    def attempt(name: str) -> Callable[[], None]:
        def run() -> None:
            try:
                results[name] = ledger.complete(
                    KEY, "sha256:same", note_effect(storage, KEY, runs, name), now, now - 3600, meeting
                )
            except BaseException as exc:
                failures.append(exc)

        return run

    threads = [threading.Thread(target=attempt(name), name=name) for name in ("a", "b")]
    try:
        threads[0].start()
        await meeting.until(1, "A wrote its note and stopped before its record")
        threads[1].start()
        if storage.kind == "postgres":
            # Two transactions, each with its own uncommitted note: the record's primary key must decide.
            await meeting.until(2, "B wrote its note too")
        else:
            await asyncio.sleep(0.5)  # time enough for B to get there, were it let in
            assert meeting.arrived == ["a"]  # B waits for A's write transaction
    finally:
        meeting.go.set()
        for thread in threads:
            await asyncio.to_thread(thread.join, 20)

    assert failures == []
    (record_a, made_a), (record_b, made_b) = results["a"], results["b"]
    assert record_a == record_b and sorted([made_a, made_b]) == [False, True]
    [(note_id, text)] = storage.rows("SELECT note_id, text FROM notes WHERE operation_id = ?", KEY.operation_id)
    assert record_a.body == {"note_id": note_id, "text": text}
    assert records(storage) == [("acme", "u1", "op-ledger", 201)]
    assert len(runs) == (2 if storage.kind == "postgres" else 1)


async def test_a_status_read_while_an_attempt_commits_and_releases_never_says_not_found(
    pg_server: PgServer,  # noqa: F811 - the fixture imported above
) -> None:
    # PostgreSQL only: a lock on the claims table stops the lookup between its two reads, while the attempt
    # commits its record and then releases its claim (the order the kit always keeps).
    with pg_server.database() as dsn:
        storage = ready(PostgresNotes(dsn))
        ledger = storage.ledger
        now = time.time()
        claim_id = ledger.claim(KEY, now, now - 3600, LEASE)
        assert isinstance(claim_id, str)
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE idempotency_claims IN ACCESS EXCLUSIVE MODE")
            reading = asyncio.create_task(asyncio.to_thread(ledger.lookup, KEY, now, now - 3600))
            try:

                async def waiting_for_claims() -> bool:
                    return bool(
                        storage.rows(
                            "SELECT 1 FROM pg_locks WHERE NOT granted AND relation = 'idempotency_claims'::regclass"
                        )
                    )

                await assert_eventually(waiting_for_claims, within=10, what="the lookup waits to read the claims")
                _, made = ledger.complete(KEY, "sha256:a", note_effect(storage, KEY, []), now, now - 3600)
                assert made
                locker.execute("DELETE FROM idempotency_claims WHERE claim_id = %s", (claim_id,))
            finally:
                locker.commit()
            found = await asyncio.wait_for(reading, timeout=10)
        storage.close()

    # What the lookup saw was one moment, and then the attempt was in flight: never "not_found".
    assert found == "in_progress"


async def test_a_stored_reply_is_given_back_only_with_a_valid_approval_for_it(storage: NotesStorage) -> None:
    """A replay answers only a caller whose approval (actor, operation, payload, signature) a fresh write would
    need: without one, the key's existence, its payload and its stored reply stay hidden."""
    token = note_token(APPROVAL_KEY, "op-kept", NOTE)
    async with kit_app(storage) as http:
        first = await post_note(http, "op-kept", NOTE, token=token)
        probes = {
            "no token": await post_note(http, "op-kept", NOTE, token=NO_TOKEN),
            "no token, other body": await post_note(http, "op-kept", OTHER_NOTE, token=NO_TOKEN),
            "forged": await post_note(http, "op-kept", NOTE, token=note_token(OTHER_SIGNING_KEY, "op-kept", NOTE)),
            "other operation's": await post_note(
                http, "op-kept", NOTE, token=note_token(APPROVAL_KEY, "op-other", NOTE)
            ),
            "other payload's": await post_note(
                http, "op-kept", NOTE, token=note_token(APPROVAL_KEY, "op-kept", OTHER_NOTE)
            ),
        }
        missing = await post_note(http, "op-never-used", NOTE, token=NO_TOKEN)
        # The approval that made it, even once expired, still reads its own reply: nothing new is made.
        expired = note_token(APPROVAL_KEY, "op-kept", NOTE, expires_in=-1)
        again = await post_note(http, "op-kept", NOTE, token=expired)

    assert first.status_code == 201
    for case, answer in probes.items():
        code = "APPROVAL_UNKNOWN_KEY" if case == "forged" else "APPROVAL_REQUIRED"
        assert (answer.status_code, problem_code(answer)) == (403, code), case
        assert NOTE["text"] not in answer.text and str(first.json()["note_id"]) not in answer.text, case
    # The same answer as for a key never used: nothing tells that the key exists.
    assert probes["no token"].json() == missing.json()
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert notes_of(storage, "op-kept") == [("u1", "acme", NOTE["text"])]


async def test_an_approval_that_outlives_the_retention_is_refused(storage: NotesStorage) -> None:
    """A record kept shorter than its approval lives would let the same key and token commit again once it is
    purged: such an approval is refused before anything is made."""
    async with kit_app(storage, retention_seconds=60.0) as http:
        too_long = await post_note(
            http, "op-long", NOTE, token=note_token(APPROVAL_KEY, "op-long", NOTE, expires_in=90)
        )
        fits = await post_note(http, "op-short", NOTE, token=note_token(APPROVAL_KEY, "op-short", NOTE, expires_in=30))

    assert (too_long.status_code, problem_code(too_long)) == (403, "APPROVAL_REQUIRED")
    assert "retention" in too_long.json()["detail"]
    assert fits.status_code == 201
    assert notes_of(storage, "op-long") == [] and len(notes_of(storage, "op-short")) == 1


# --- PostgreSQL's connection pool ------------------------------------------------------------------------------


def test_postgres_ledger_serves_its_steps_from_a_pool_of_connections(pg_server: PgServer) -> None:  # noqa: F811
    # Each step used to open a connection of its own (a new server process each time); the pool keeps a few.
    with pg_server.database() as dsn:
        storage = ready(PostgresNotes(dsn))
        ledger = storage.ledger
        now = time.time()
        backends: set[int] = set()
        for n in range(20):
            key = LedgerKey("acme", "u1", f"op-pool-{n}")
            claim_id = ledger.claim(key, now, now - 3600, LEASE)
            assert isinstance(claim_id, str)
            assert ledger.lookup(key, now, now - 3600) == "in_progress"
            ledger.release(key, claim_id)
            with storage.postgres.connect() as conn:
                backends.add(conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
        storage.close()

    assert len(backends) == 1


def test_a_pooled_connection_comes_back_as_it_was_lent(pg_server: PgServer) -> None:  # noqa: F811
    # A status read runs REPEATABLE READ, READ ONLY; the next user of its connection must get the defaults,
    # and no transaction left open, also after an effect that failed.
    with pg_server.database() as dsn:
        storage = ready(PostgresNotes(dsn, max_connections=1))
        ledger = storage.ledger
        now = time.time()
        assert ledger.lookup(KEY, now, now - 3600) == "not_found"

        def failing(tx: Any) -> tuple[int, dict[str, Any]]:
            tx.execute("INSERT INTO notes (note_id, tenant_id, user_id, operation_id, text, created_at)"
                       " VALUES ('N1', 'acme', 'u1', 'op-ledger', 'x', 0)")  # fmt: skip
            raise RuntimeError("the effect broke")

        with pytest.raises(RuntimeError):
            ledger.complete(KEY, "sha256:a", failing, now, now - 3600)
        with storage.postgres.connect() as conn:
            isolation = conn.execute("SHOW transaction_isolation").fetchone()
            read_only = conn.execute("SHOW transaction_read_only").fetchone()
            state = conn.info.transaction_status
        storage.close()

    assert (isolation, read_only) == ({"transaction_isolation": "read committed"}, {"transaction_read_only": "off"})
    assert state == psycopg.pq.TransactionStatus.IDLE


def test_a_connection_the_server_dropped_is_replaced_not_handed_out(pg_server: PgServer) -> None:  # noqa: F811
    with pg_server.database() as dsn:
        storage = ready(PostgresNotes(dsn, max_connections=1))
        ledger = storage.ledger
        now = time.time()
        with storage.postgres.connect() as conn:
            pooled = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pooled,))  # waits for it to end

        assert ledger.lookup(KEY, now, now - 3600) == "not_found"
        with storage.postgres.connect() as conn:
            replacement = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        storage.close()

    assert replacement != pooled


def test_the_kit_has_no_default_identity(tmp_path: Path) -> None:
    # Whom a request acts for is the service's to establish from a credential it verifies: the kit guesses nothing.
    ledger = SqliteLedger(tmp_path / "kit.db")
    with pytest.raises(TypeError, match="actor"):
        IdempotencyKit(ledger, approval_verify_key=APPROVAL_VERIFY_KEY, audience="notes")  # type: ignore[call-arg]


def test_a_write_is_digested_on_its_decoded_path_and_an_out_of_range_number_is_a_422(tmp_path: Path) -> None:
    # The client digests the path decoded (an id holding ? or # sent as %3F, %23); url.path kept those escapes,
    # so a correctly approved write was refused as "approval is for another digest". And 1e400, no NaN literal,
    # read as infinity and broke the digest with a bare 500.
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/things/a?b#c/pay",
        "raw_path": b"/things/a%3Fb%23c/pay",
        "query_string": b"",
        "headers": [],
        "root_path": "",
        "scheme": "http",
        "server": ("kit", 80),
    }
    kit = IdempotencyKit(
        SqliteLedger(tmp_path / "kit.db"),
        approval_verify_key=APPROVAL_VERIFY_KEY,
        audience="kit",
        actor=insecure_actor_from_headers,
    )
    write = IdempotentWrite(kit, Request(scope), KitActor(tenant_id="acme", user_id="u1"), "op", None, b"{}")
    assert write.digest == payload_digest(http_subject("POST", "/things/a?b#c/pay"), {})
    # Only those escapes are undone: an id written a%41 (sent a%2541) is a%41, never aA, as the client digests it.
    literal = {**scope, "path": "/things/a%41/pay", "raw_path": b"/things/a%2541/pay"}
    assert IdempotentWrite(kit, Request(literal), write.actor, "op", None, b"{}").path == "/things/a%41/pay"
    huge = IdempotentWrite(write.kit, Request(scope), write.actor, "op", None, b'{"amount": 1e400}')
    with pytest.raises(KitProblem) as refused:
        huge.json()
    assert refused.value.status == 422


def test_two_sqlite_ledgers_opening_one_new_file_at_once_both_start(tmp_path: Path) -> None:
    # A service's replicas starting together on a new SQLite file: the switch to WAL needs the database alone and
    # SQLite may answer "locked" at once rather than wait (the CI dry run of 21b94f9 met it: one kit process
    # exited at start). Two threads on a barrier, many times over: before, about 1 round in 30 failed.
    from toolloop.servicekit import SqliteLedger

    failures: list[Exception] = []
    for round_number in range(300):
        path = tmp_path / f"ledger-{round_number}.sqlite"
        barrier = threading.Barrier(2)

        def open_ledger(path: Path = path, barrier: threading.Barrier = barrier) -> None:
            ledger = SqliteLedger(path)
            barrier.wait()
            try:
                ledger.init()
            except Exception as exc:
                failures.append(exc)

        threads = [threading.Thread(target=open_ledger) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
