"""A user's own agent as a chaos target, written with the public APIs only (toolloop and faultbed): a notes
tool on the kit service (tests/kit_service.py, a service built on toolloop.servicekit), for
`python starter.py chaos --tools tests.user_chaos:target` (tests/test_chaos_e2e.py).

The worker runs `build`, which reads the service's address from $USER_NOTES_URL (the runner points it at its
fault proxy); the runner starts the service itself, on a port and a directory it picks, and reads the run's
effects from the service's own notes table."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import toolloop
from faultbed import ChaosTarget, Effect, EffectQuery, ServiceProcess, Workload
from toolloop.testing import call, say

NOTES_URL_ENV = "USER_NOTES_URL"


class AddNote(toolloop.Arguments):
    text: str = Field(min_length=1, max_length=500, description="The note, plain text.")


class Note(BaseModel):
    note_id: str
    text: str


def note_matches(args: AddNote, created: Note, found: Note) -> dict[str, bool]:
    return {"id": found.note_id == created.note_id, "text": found.text == args.text}


def build() -> toolloop.Toolset:
    notes = toolloop.HttpSource("notes", base_url=os.environ.get(NOTES_URL_ENV, "http://127.0.0.1:9"))
    tools = toolloop.Toolset()
    tools.http_write(
        "add_note",
        source=notes,
        path="/notes",
        arguments=AddNote,
        result=Note,
        description="Add a note for the current user. Runs only after a person approves it.",
        read_back=toolloop.ReadBack("/notes/{note_id}", Note, note_matches),
    )
    return tools


def note_text(tag: str) -> str:
    return f"chaos {tag}"


def workload(tag: str) -> Workload:
    def wanted(tool: str, arguments: dict[str, Any]) -> bool:
        return tool == "add_note" and arguments.get("text") == note_text(tag)

    def talked_into(text: str) -> dict[str, Any]:
        return call("add_note", {"text": f"as told: {text[:100]}"}, "injected")

    return Workload(
        turns=[[call("add_note", {"text": note_text(tag)}, "w1")], [say("Noted.")]],
        wanted=wanted,
        injected=talked_into,
    )


def _notes(path: Path, tag: str, operation_ids: list[str]) -> list[Effect]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT operation_id, user_id, tenant_id, text FROM notes").fetchall()
    return [
        Effect(op, user, tenant) for op, user, tenant, text in rows if text == note_text(tag) or op in operation_ids
    ]


async def effects(query: EffectQuery) -> list[Effect]:
    """The service's own notes for the run: its note (whatever key it came with) and its operations'."""
    return await asyncio.to_thread(_notes, query.data_dir / "notes.db", query.tag, list(query.operation_ids))


def target() -> ChaosTarget:
    return ChaosTarget(
        tools="tests.user_chaos:build",
        workload=workload,
        effects=effects,
        service=ServiceProcess(
            command=lambda port, data: [
                sys.executable,
                "-m",
                "tests.kit_service",
                "--sqlite",
                str(data / "notes.db"),
                "--port",
                str(port),
            ],
            verify_key_env="KIT_SERVICE_APPROVAL_VERIFY_KEY",
        ),
        service_url_env=NOTES_URL_ENV,
    )


def not_a_target() -> toolloop.Toolset:
    return build()
