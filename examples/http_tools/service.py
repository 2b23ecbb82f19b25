"""A tiny notes service on toolloop's idempotency kit: one read, one approved write."""

import os
import sqlite3
from typing import Any

from fastapi import Depends, FastAPI, Response
from pydantic import BaseModel, ConfigDict

from toolloop.servicekit import IdempotencyKit, IdempotentWrite, KitActor, KitProblem, SqliteLedger, actor_from_headers

ledger = SqliteLedger(os.environ.get("NOTES_DB", "notes.db"))
ledger.init()
with ledger.connect() as db:
    db.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, tenant TEXT, user TEXT, text TEXT, op TEXT)")
kit = IdempotencyKit(ledger, approval_verify_key=os.environ["APPROVAL_VERIFY_KEY"])
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
def get_note(note_id: int, who: KitActor = Depends(actor_from_headers)) -> dict[str, Any]:
    with ledger.connect() as db:
        found = db.execute(
            "SELECT id, text FROM notes WHERE id = ? AND tenant = ? AND user = ?", (note_id, who.tenant_id, who.user_id)
        ).fetchone()
    if found is None:  # missing and someone else's look the same
        raise KitProblem(404, "NOT_FOUND", f"note {note_id} is not available")
    return {"note_id": found["id"], "text": found["text"]}
