"""A real MCP server for the tests (FastMCP, the official SDK): notes kept in memory, over stdio or streamable
HTTP.

    python -m tests.mcp_notes_server --transport stdio|http [--port N] --effects FILE
        [--seed TEXT ...] [--slow-after-act SECONDS] [--fail-after-act] [--down-file FILE]

Its tools: `list_notes` (readOnlyHint), `get_note` (no hint: a read only when the configuration says so),
`add_note` (a write), `tag_note` (a free-form map argument, which strict mode cannot honour) and
`notes.export` (a name the Responses API does not accept).

The tests' oracle is the effects file, never the model's text: the server appends one JSON line per event,
`{"event": "start", "pid": ...}` when it starts, `{"event": "call", "tool": ...}` when a tool call arrives and
`{"event": "effect", ...}` when `add_note` has changed its state. Server configuration, never a tool argument
(the model controls those): `--slow-after-act` makes `add_note` wait that long after it acted (a timeout after
the effect); `--down-file` makes the server exit at start while that file exists (a server that cannot start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class Note(BaseModel):
    id: int
    text: str


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.mcp_notes_server")
    parser.add_argument("--transport", choices=["stdio", "http"], required=True)
    parser.add_argument("--port", type=int, default=0, help="the HTTP port (127.0.0.1)")
    parser.add_argument("--effects", type=Path, required=True, help="JSON lines: every start, call and effect")
    parser.add_argument("--seed", action="append", default=[], help="a note present from the start")
    parser.add_argument("--slow-after-act", type=float, default=0.0, help="add_note waits this long after acting")
    parser.add_argument("--fail-after-act", action="store_true", help="add_note raises once it has acted")
    parser.add_argument("--down-file", type=Path, default=None, help="exit at start while this file exists")
    args = parser.parse_args(argv)
    if args.transport == "http" and not args.port:
        parser.error("--transport http needs --port")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.down_file is not None and args.down_file.exists():
        print("notes server: not starting (the down file exists)", file=sys.stderr, flush=True)
        return 3
    # Imported after the down check, so a refused start is quick.
    from mcp.server.fastmcp import FastMCP
    from mcp.types import ToolAnnotations

    effects: Path = args.effects
    notes: list[Note] = [Note(id=i + 1, text=text) for i, text in enumerate(args.seed)]

    def record(event: str, **fields: Any) -> None:
        with effects.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")
            fh.flush()

    mcp = FastMCP("notes", host="127.0.0.1", port=args.port or 8000, log_level="WARNING")

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def list_notes(limit: int = 50) -> list[Note]:
        """The notes, oldest first (at most `limit`)."""
        record("call", tool="list_notes")
        return notes[:limit]

    @mcp.tool()
    def get_note(note_id: int) -> Note:
        """One note by its id."""
        record("call", tool="get_note")
        for note in notes:
            if note.id == note_id:
                return note
        raise ValueError(f"there is no note {note_id}")

    @mcp.tool()
    async def add_note(text: str) -> Note:
        """Add a note."""
        record("call", tool="add_note")
        note = Note(id=len(notes) + 1, text=text)
        notes.append(note)
        record("effect", tool="add_note", note_id=note.id, text=text)
        if args.slow_after_act:
            await asyncio.sleep(args.slow_after_act)
        if args.fail_after_act:
            # FastMCP answers isError with this text: the note was added all the same.
            raise OSError(28, "No space left on device", "/var/lib/notes/journal.json")
        return note

    @mcp.tool()
    def tag_note(note_id: int, tags: dict[str, str]) -> Note:
        """Set free-form tags on a note (a map strict mode cannot express)."""
        record("call", tool="tag_note")
        raise ValueError("not implemented")

    @mcp.tool(name="notes.export")
    def export_notes() -> str:
        """All notes as text (its name has a dot, which tool names may not)."""
        record("call", tool="notes.export")
        return "\n".join(n.text for n in notes)

    record("start", transport=args.transport)
    mcp.run(transport="stdio" if args.transport == "stdio" else "streamable-http")
    return 0


if __name__ == "__main__":
    sys.exit(main())
