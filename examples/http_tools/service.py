"""A tiny notes service on toolloop's idempotency kit: one read, one approved write, each as the caller a bearer
token names that this service verifies (NOTES_CALLER_VERIFY_KEY: the PEM public key of whoever vouches for its
callers, here the worker's tool source, examples/http_tools/tools.py)."""

import os
import sqlite3
from typing import Any

import jwt
from fastapi import Depends, FastAPI, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict

from toolloop.servicekit import IdempotencyKit, IdempotentWrite, KitActor, KitProblem, SqliteLedger

AUDIENCE = "notes"  # this service's name in the tokens it accepts
CALLER_VERIFY_KEY = os.environ["NOTES_CALLER_VERIFY_KEY"]
bearer = HTTPBearer(auto_error=False)


async def caller(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> KitActor:
    """Whom a request acts for: the `sub` and `tenant` of a bearer token whose signature, audience and expiry
    this service checks itself. Never a header anyone could set."""
    if credentials is None:
        raise KitProblem(401, "ACTOR_REQUIRED", "a bearer token is required")
    try:
        claims = jwt.decode(
            credentials.credentials,
            CALLER_VERIFY_KEY,
            algorithms=["EdDSA"],
            audience=AUDIENCE,
            options={"require": ["sub", "aud", "exp"]},
        )
    except jwt.InvalidTokenError:
        raise KitProblem(401, "ACTOR_REQUIRED", "the bearer token is not valid") from None
    if not isinstance(claims.get("tenant"), str) or not claims["tenant"]:
        raise KitProblem(401, "ACTOR_REQUIRED", "the bearer token names no tenant")
    return KitActor(tenant_id=claims["tenant"], user_id=claims["sub"])


ledger = SqliteLedger(os.environ.get("NOTES_DB", "notes.db"))
ledger.init()
with ledger.connect() as db:
    db.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, tenant TEXT, user TEXT, text TEXT, op TEXT)")
# audience: the name its approval tokens carry, the tool source's name (examples/http_tools/tools.py).
kit = IdempotencyKit(ledger, approval_verify_key=os.environ["APPROVAL_VERIFY_KEY"], audience=AUDIENCE, actor=caller)
app = FastAPI()
kit.install(app)


class NewNote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


@app.post("/notes", status_code=201)
async def add_note(write: IdempotentWrite = Depends(kit.write)) -> Response:
    note, who = write.parse(NewNote), write.actor

    def insert(tx: sqlite3.Connection) -> dict[str, Any]:
        row = (who.tenant_id, who.user_id, note.text, write.operation_id)
        created = tx.execute("INSERT INTO notes (tenant, user, text, op) VALUES (?, ?, ?, ?)", row)
        return {"note_id": created.lastrowid, "text": note.text}

    return await write.commit(insert)


@app.get("/notes/{note_id}")
def get_note(note_id: int, who: KitActor = Depends(caller)) -> dict[str, Any]:
    with ledger.connect() as db:
        found = db.execute(
            "SELECT id, text FROM notes WHERE id = ? AND tenant = ? AND user = ?", (note_id, who.tenant_id, who.user_id)
        ).fetchone()
    if found is None:  # missing and someone else's look the same
        raise KitProblem(404, "NOT_FOUND", f"note {note_id} is not available")
    return {"note_id": found["id"], "text": found["text"]}
