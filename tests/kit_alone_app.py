"""A notes service on toolloop.servicekit alone, for tests/test_servicekit_alone_e2e.py, which runs it in a venv
that has only the kit's own dependencies (pyproject's `servicekit` extra) and the repository's `toolloop` folder:
no temporalio, mcp, typer or httpx. It imports nothing else from the repository.

`python tests/kit_alone_app.py DB VERIFY_KEY TOKEN` builds the service on a SQLite ledger in DB, sends it a few
requests straight through ASGI (no HTTP client library is installed there), and prints one JSON line: each
answer's status, code and replay header, the notes the service stored, and which of the libraries the kit must
not need could be imported at all.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sqlite3
import sys
from typing import Any

from fastapi import Depends, FastAPI, Header
from fastapi.responses import Response

from toolloop.servicekit import IdempotencyKit, IdempotentWrite, KitActor, KitProblem, SqliteLedger

MUST_BE_ABSENT = ("temporalio", "mcp", "typer", "httpx", "psycopg", "workflows", "activities")
NOTE = {"text": "written by a service that has only the kit"}


async def caller(x_test_user: str = Header()) -> KitActor:
    """This test's callers are its own code; a real service takes the actor from a credential it verifies."""
    if not x_test_user:
        raise KitProblem(401, "ACTOR_REQUIRED", "who is calling?")
    return KitActor(tenant_id="acme", user_id=x_test_user)


def create_app(db: str, verify_key: str) -> FastAPI:
    kit = IdempotencyKit(SqliteLedger(db), approval_verify_key=verify_key, audience="notes", actor=caller)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS notes (operation_id TEXT PRIMARY KEY, user_id TEXT, text TEXT)")
    app = FastAPI()
    kit.install(app)

    @app.post("/notes", status_code=201)
    async def add_note(write: IdempotentWrite = Depends(kit.write)) -> Response:
        text = str(write.json()["text"])

        def effect(tx: Any) -> dict[str, Any]:
            tx.execute("INSERT INTO notes VALUES (?, ?, ?)", (write.operation_id, write.actor.user_id, text))
            return {"text": text}

        return await write.commit(effect)

    return app


async def call(app: FastAPI, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> dict[str, Any]:
    """One request through the app's ASGI interface; the answer's status, code and replay header."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("kit", 80),
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    answer = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    replayed = dict(start["headers"]).get(b"idempotent-replayed", b"").decode()
    return {"status": start["status"], "code": answer.get("code"), "state": answer.get("state"), "replayed": replayed}


async def exercise(db: str, verify_key: str, token: str) -> dict[str, Any]:
    app = create_app(db, verify_key)
    body = json.dumps(NOTE).encode()
    user = {"X-Test-User": "u1", "Content-Type": "application/json"}
    approved = {**user, "Idempotency-Key": "op1", "X-Approval-Token": token}
    answers = {
        "no_key": await call(app, "POST", "/notes", user, body),
        "no_token": await call(app, "POST", "/notes", {**user, "Idempotency-Key": "op1"}, body),
        "first": await call(app, "POST", "/notes", approved, body),
        "again": await call(app, "POST", "/notes", approved, body),
        "status": await call(app, "GET", "/operations/op1", user),
    }
    with sqlite3.connect(db) as conn:
        notes = [list(row) for row in conn.execute("SELECT operation_id, user_id, text FROM notes")]
    return {
        "answers": answers,
        "notes": notes,
        "importable": [name for name in MUST_BE_ABSENT if importlib.util.find_spec(name) is not None],
        "imported": sorted({name.split(".")[0] for name in sys.modules} & set(MUST_BE_ABSENT)),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(exercise(*sys.argv[1:4]))))
