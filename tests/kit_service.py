"""A tiny FastAPI service built on toolloop's idempotency kit, for the kit's own tests: one notes table, one
write (`POST /notes`) and one read (`GET /notes/{note_id}`), on SQLite or PostgreSQL, with the kit's hold
points and a fault switch at its boundary.

Run it as a real process (`python -m tests.kit_service --sqlite FILE --port N`, or `--postgres DSN`); it
prints a ready line with its URL and answers `GET /healthz` with {"ok": true}. The approval channel's public
key comes from $KIT_SERVICE_APPROVAL_VERIFY_KEY (without it every write is refused); `--hold-dir DIR` arms
FileHolds in DIR; `--fault KIND` sets a fault at start-up, and `PUT /admin/fault` sets one later:

- drop_after_commit: the write commits, then the connection is closed without a reply;
- 503_before_commit: the write is answered 503 before the kit sees it (nothing is claimed or stored);
- 429_after_commit: the write commits, then its reply is replaced by 429 with Retry-After;
- stall_after_claim: the attempt stops after its claim (the kit's `after_claim` hook) until
  `POST /admin/fault/release`, or `stall_seconds`;
- hide_reads: `GET /notes/{id}` answers 404 as if the note were not visible yet (a lagging replica).

A fault applies to the next `times` requests it matches. A note whose text starts with "REFUSE" is written
and then refused by the effect (409 NOTE_REFUSED), so a test can see the savepoint take the note back.

The second half of the module is for the tests that drive the service: the storage's rows, the process, and
approval tokens for its writes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg
import uvicorn
from fastapi import Depends, FastAPI
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from devstack.processes import ManagedProcess, wait_for_http_ok, wait_for_log_line
from toolloop._core.approvals import ApprovalClaims, http_subject, mint_approval_token, payload_digest
from toolloop.servicekit import (
    COMMITTED_FLAG,
    FileHolds,
    Hold,
    IdempotencyKit,
    IdempotentWrite,
    KitActor,
    KitProblem,
    Ledger,
    PostgresLedger,
    Refusal,
    SqliteLedger,
    check_verify_key,
    insecure_actor_from_headers,
    no_hold,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
APPROVAL_VERIFY_KEY_ENV = "KIT_SERVICE_APPROVAL_VERIFY_KEY"
# The `aud` this service accepts (a tool source for it names the same audience).
AUDIENCE = "notes"
READY_LINE = "kit_service listening on"
NOTES_PATH = "/notes"
NOTE_ID = r"^N[0-9a-f]{16}$"
REFUSE_PREFIX = "REFUSE"
NOTE_REFUSED = "NOTE_REFUSED"
NOT_FOUND = "NOT_FOUND"
UNAVAILABLE = "UNAVAILABLE"
RATE_LIMITED = "RATE_LIMITED"

FaultKind = Literal[
    "none", "drop_after_commit", "503_before_commit", "429_after_commit", "stall_after_claim", "hide_reads"
]
FAULT_KINDS: tuple[str, ...] = typing.get_args(FaultKind)


# --- Storage: the ledger and the notes table in one database ------------------------------------------------


class NoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=500)


class Note(BaseModel):
    note_id: str
    text: str


class NotesStorage:
    """The service's database: the kit's ledger and the notes beside it. `rows` is for the tests, which
    judge the service by these rows (SQL written with `?` placeholders for both storages)."""

    kind: Literal["sqlite", "postgres"]
    ledger: Ledger

    def create_schema(self) -> None:
        raise NotImplementedError

    def insert_note(self, tx: Any, note_id: str, actor: KitActor, operation_id: str, text: str) -> None:
        tx.execute(
            self._sql(
                "INSERT INTO notes (note_id, tenant_id, user_id, operation_id, text, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)"
            ),
            (note_id, actor.tenant_id, actor.user_id, operation_id, text, time.time()),
        )

    def find_note(self, actor: KitActor, note_id: str) -> Note | None:
        found = self.rows(
            "SELECT note_id, text FROM notes WHERE note_id = ? AND tenant_id = ? AND user_id = ?",
            note_id,
            actor.tenant_id,
            actor.user_id,
        )
        return Note(note_id=found[0][0], text=found[0][1]) if found else None

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def execute(self, sql: str, *params: Any) -> None:
        """One statement in its own transaction (the tests use it to age or edit rows)."""
        raise NotImplementedError

    def argv(self) -> list[str]:
        """How `python -m tests.kit_service` is told to use this storage."""
        raise NotImplementedError

    def close(self) -> None:
        """Close what the ledger keeps open between operations (nothing, on SQLite)."""

    def _sql(self, sql: str) -> str:
        return sql


_NOTES_COLUMNS = """
    note_id      TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    text         TEXT NOT NULL,
    created_at   {real} NOT NULL
"""


class SqliteNotes(NotesStorage):
    kind = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.ledger = self.sqlite = SqliteLedger(self.path)

    def create_schema(self) -> None:
        with self.sqlite.connect() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS notes ({_NOTES_COLUMNS.format(real='REAL')})")

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.sqlite.connect() as conn:
            return [tuple(row) for row in conn.execute(sql, params)]

    def execute(self, sql: str, *params: Any) -> None:
        with self.sqlite.transaction() as conn:
            conn.execute(sql, params)

    def argv(self) -> list[str]:
        return ["--sqlite", self.path]


# Serialises the notes table's creation when several service processes start on one database at once.
_NOTES_SCHEMA_LOCK = 7_422_002


class PostgresNotes(NotesStorage):
    kind = "postgres"

    def __init__(self, dsn: str, max_connections: int = 10) -> None:
        self.dsn = dsn
        self.ledger = self.postgres = PostgresLedger(dsn, max_connections=max_connections)

    def create_schema(self) -> None:
        with self.postgres.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_NOTES_SCHEMA_LOCK,))
            conn.execute(f"CREATE TABLE IF NOT EXISTS notes ({_NOTES_COLUMNS.format(real='DOUBLE PRECISION')})")

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            # No parameters, no placeholders: a literal % stays a % (LIKE patterns, say).
            return [tuple(row) for row in conn.execute(self._sql(sql) if params else sql, params or None)]

    def execute(self, sql: str, *params: Any) -> None:
        with psycopg.connect(self.dsn) as conn:
            conn.execute(self._sql(sql) if params else sql, params or None)

    def argv(self) -> list[str]:
        return ["--postgres", self.dsn]

    def close(self) -> None:
        self.postgres.close()  # its pool, before the test drops the database

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s")


# --- Faults -----------------------------------------------------------------------------------------------


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: FaultKind = "none"
    times: int = Field(default=1, ge=0, le=1000)
    retry_after_seconds: int = Field(default=2, ge=0, le=300)
    stall_seconds: float = Field(default=15.0, gt=0, le=60)


@dataclass
class FaultSwitch:
    """The one fault in force, and how many more requests it applies to (thread-safe: the kit's hooks run in
    worker threads)."""

    spec: FaultSpec = field(default_factory=FaultSpec)
    left: int = 0
    writes_received: int = 0
    stalled: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _release: threading.Event = field(default_factory=threading.Event)

    def set(self, spec: FaultSpec) -> None:
        with self._lock:
            self.spec = spec
            self.left = spec.times if spec.kind != "none" else 0
            self._release = threading.Event()

    def take(self, kind: FaultKind) -> FaultSpec | None:
        """The fault, if `kind` is in force and has requests left (counting this one)."""
        with self._lock:
            if self.spec.kind != kind or self.left <= 0:
                return None
            self.left -= 1
            return self.spec

    def count_write(self) -> None:
        with self._lock:
            self.writes_received += 1

    def stall(self, spec: FaultSpec) -> None:
        with self._lock:
            self.stalled += 1
            release = self._release
        try:
            release.wait(timeout=spec.stall_seconds)
        finally:
            with self._lock:
                self.stalled -= 1

    def release(self) -> None:
        with self._lock:
            self._release.set()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "fault": self.spec.kind,
                "left": self.left,
                "writes_received": self.writes_received,
                "stalled": self.stalled,
            }


def _close_without_reply(reason: str) -> str:
    # uvicorn closes the connection without a reply when the app returns anything but None before starting
    # a response (see demo/bizservice/boundary.py).
    return f"fault injected: {reason}"


class FaultBoundary:
    """The outermost ASGI layer: holds back the reply of a write the kit committed, when a fault says so."""

    def __init__(self, app: ASGIApp, faults: FaultSwitch) -> None:
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> str | None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return None
        state = scope.setdefault("state", {})  # the dict the endpoint's request.state writes to
        action: Literal["drop", "429"] | None = None
        spec: FaultSpec | None = None

        async def send_or_hold(message: Message) -> None:
            nonlocal action, spec
            if message["type"] == "http.response.start" and state.get(COMMITTED_FLAG):
                if (spec := self.faults.take("drop_after_commit")) is not None:
                    action = "drop"
                elif (spec := self.faults.take("429_after_commit")) is not None:
                    action = "429"
            if action is None:
                await send(message)

        await self.app(scope, receive, send_or_hold)
        if action == "drop":
            return _close_without_reply("reply dropped after commit")
        if action == "429" and spec is not None:
            problem = KitProblem(
                429,
                RATE_LIMITED,
                "too many requests",
                headers={"Retry-After": str(spec.retry_after_seconds)},
            )
            await problem.response()(scope, receive, send)
        return None


# --- The app --------------------------------------------------------------------------------------------------


def create_app(
    storage: NotesStorage,
    *,
    approval_verify_key: str | None,
    retention_seconds: float = 86_400.0,
    claim_lease_seconds: float = 30.0,
    hold: Hold = no_hold,
    faults: FaultSwitch | None = None,
    after_claim: Callable[[IdempotentWrite], None] | None = None,
) -> FaultBoundary:
    """The service on `storage` (schema created if missing), as an ASGI app. `after_claim` runs after every
    claim, besides the stall fault (in-process tests pass their own)."""
    switch = faults if faults is not None else FaultSwitch()

    def on_claimed(write: IdempotentWrite) -> None:
        spec = switch.take("stall_after_claim")
        if spec is not None:
            switch.stall(spec)
        if after_claim is not None:
            after_claim(write)

    kit = IdempotencyKit(
        storage.ledger,
        approval_verify_key=approval_verify_key,
        audience=AUDIENCE,
        retention_seconds=retention_seconds,
        claim_lease_seconds=claim_lease_seconds,
        # A test service on loopback: its callers are the tests, which say who they act for in headers.
        actor=insecure_actor_from_headers,
        hold=hold,
        after_claim=on_claimed,
    )
    storage.create_schema()

    app = FastAPI(title="kit_service", docs_url=None, redoc_url=None, openapi_url=None)
    kit.install(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "storage": storage.kind}

    @app.post(NOTES_PATH, status_code=201)
    async def add_note(write: IdempotentWrite = Depends(kit.write)) -> Response:
        switch.count_write()
        body = write.parse(NoteBody)
        if switch.take("503_before_commit") is not None:
            raise KitProblem(503, UNAVAILABLE, "the service is temporarily unavailable")

        def effect(tx: Any) -> dict[str, Any]:
            note_id = f"N{uuid.uuid4().hex[:16]}"
            storage.insert_note(tx, note_id, write.actor, write.operation_id, body.text)
            if body.text.startswith(REFUSE_PREFIX):
                # Decided after a row was written: the kit's savepoint must take the note back.
                raise Refusal(409, NOTE_REFUSED, "this note is refused")
            return {"note_id": note_id, "text": body.text}

        return await write.commit(effect)

    @app.get("/notes/{note_id}")
    async def get_note(note_id: str = PathParam(pattern=NOTE_ID), actor: KitActor = Depends(kit.actor)) -> Note:
        found = await run_in_threadpool(storage.find_note, actor, note_id)
        if found is None or switch.take("hide_reads") is not None:
            raise KitProblem(404, NOT_FOUND, f"note {note_id} is not available")
        return found

    @app.put("/admin/fault")
    async def set_fault(spec: FaultSpec) -> dict[str, Any]:
        switch.set(spec)
        return switch.stats()

    @app.post("/admin/fault/release")
    async def release_stalled() -> dict[str, Any]:
        switch.release()
        return switch.stats()

    @app.get("/admin/stats")
    async def stats() -> dict[str, Any]:
        return switch.stats()

    return FaultBoundary(app, switch)


# --- Entry point ----------------------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.kit_service", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sqlite", metavar="FILE", help="SQLite database file (created if missing)")
    where.add_argument("--postgres", metavar="DSN", help="PostgreSQL connection string (the database must exist)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (the ready line shows it)")
    parser.add_argument("--hold-dir", help="arm the kit's hold points with files in this directory (FileHolds)")
    parser.add_argument("--claim-lease-seconds", type=float, default=30.0)
    parser.add_argument("--retention-seconds", type=float, default=86_400.0)
    parser.add_argument("--fault", choices=FAULT_KINDS, default="none", help="a fault in force from the start")
    parser.add_argument("--fault-times", type=int, default=1)
    return parser.parse_args(argv)


async def _serve(server: uvicorn.Server, host: str) -> None:
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # start-up failed (port taken, ...): surface it
            return
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"{READY_LINE} http://{host}:{port}", flush=True)
    await task


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    verify_key = os.environ.get(APPROVAL_VERIFY_KEY_ENV) or None
    if verify_key is not None:
        try:
            check_verify_key(verify_key)
        except ValueError as exc:
            print(f"error: {APPROVAL_VERIFY_KEY_ENV}: {exc}", file=sys.stderr)
            return 2
    storage: NotesStorage = SqliteNotes(args.sqlite) if args.sqlite else PostgresNotes(args.postgres)
    switch = FaultSwitch()
    switch.set(FaultSpec(kind=args.fault, times=args.fault_times))
    app = create_app(
        storage,
        approval_verify_key=verify_key,
        retention_seconds=args.retention_seconds,
        claim_lease_seconds=args.claim_lease_seconds,
        hold=FileHolds(args.hold_dir) if args.hold_dir else no_hold,
        faults=switch,
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    asyncio.run(_serve(uvicorn.Server(config), args.host))
    return 0


# --- For the tests that drive the service -----------------------------------------------------------------------


def note_digest(body: Mapping[str, Any]) -> str:
    """What the service binds an approval to: POST /notes and the body as sent."""
    return payload_digest(http_subject("POST", NOTES_PATH), body)


def note_token(
    signing_key: str,
    operation_id: str,
    body: Mapping[str, Any],
    *,
    user: str = "u1",
    tenant: str = "acme",
    expires_in: float = 300.0,
    digest: str | None = None,
    decision: Literal["approve", "reject"] = "approve",
    audience: str = AUDIENCE,
) -> str:
    """An approval of exactly this note, signed as the approval channel does (`digest` to bind another)."""
    now = time.time()
    claims = ApprovalClaims(
        audience=audience,
        user_id=user,
        tenant_id=tenant,
        operation_id=operation_id,
        digest=digest or note_digest(body),
        approved_by=user,
        approved_at=now,
        expires_at=now + expires_in,
        decision=decision,
    )
    return mint_approval_token(signing_key, claims)


def storage_of(kind: str, target: str) -> NotesStorage:
    return SqliteNotes(target) if kind == "sqlite" else PostgresNotes(target)


@dataclass
class KitServiceProcess:
    """One `python -m tests.kit_service` process we started, and where it listens."""

    process: ManagedProcess
    url: str

    def stop(self) -> None:
        self.process.stop()


def start_kit_service(
    storage: NotesStorage,
    log_path: Path,
    *,
    verify_key: str | None,
    hold_dir: Path | None = None,
    claim_lease_seconds: float | None = None,
    retention_seconds: float | None = None,
    timeout: float = 30.0,
) -> KitServiceProcess:
    """Start the service on a free loopback port (the OS picks it: --port 0) and return once its ready line
    is out and GET /healthz answers; blocking."""
    cmd = [sys.executable, "-m", "tests.kit_service", *storage.argv(), "--host", "127.0.0.1", "--port", "0"]
    if hold_dir is not None:
        cmd += ["--hold-dir", str(hold_dir)]
    if claim_lease_seconds is not None:
        cmd += ["--claim-lease-seconds", str(claim_lease_seconds)]
    if retention_seconds is not None:
        cmd += ["--retention-seconds", str(retention_seconds)]
    env = {k: v for k, v in os.environ.items() if k != APPROVAL_VERIFY_KEY_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if verify_key is not None:
        env[APPROVAL_VERIFY_KEY_ENV] = verify_key
    name = log_path.stem
    proc = ManagedProcess.spawn(name, cmd, log_path, env=env, cwd=REPO_ROOT)
    try:
        wait_for_log_line(log_path, READY_LINE, timeout, proc, start_offset=proc.log_offset)
        with log_path.open("rb") as log:
            log.seek(proc.log_offset)
            text = log.read().decode("utf-8", errors="replace")
        url = text.split(READY_LINE, 1)[1].split()[0]
        wait_for_http_ok(f"{url}/healthz", timeout, proc)
    except BaseException:
        proc.stop(timeout=5.0)
        raise
    return KitServiceProcess(process=proc, url=url)


if __name__ == "__main__":
    sys.exit(main())
