"""The notes service's tools, declared with toolloop's public API.

Run them on a worker: `python worker.py --tools examples.http_tools.tools:build` (NOTES_URL: the service)."""

import os

from pydantic import BaseModel, Field

import toolloop


class GetNote(toolloop.Arguments):
    note_id: int = Field(alias="noteId", ge=1, description="The note's id.")


class AddNote(toolloop.Arguments):
    text: toolloop.PlainText = Field(min_length=1, max_length=200, description="The note, plain text.")


class Note(BaseModel):
    note_id: int
    text: str


def build() -> toolloop.Toolset:
    notes = toolloop.HttpSource("notes", base_url=os.environ.get("NOTES_URL", "http://127.0.0.1:8800"))
    tools = toolloop.Toolset()
    tools.http_read(
        "get_note",
        source=notes,
        path="/notes/{noteId}",
        arguments=GetNote,
        result=Note,
        description="One of the current user's notes.",
        not_available="note {noteId} is not available",
    )
    tools.http_write(
        "add_note",
        source=notes,
        path="/notes",
        arguments=AddNote,
        result=Note,
        description="Add a note for the current user. Runs only after a person approves it.",
        read_back=toolloop.ReadBack(
            "/notes/{note_id}", Note, lambda args, created, found: {"text": found.text == args.text}
        ),
    )
    return tools
