"""The examples, run as a user runs them (one command each), judged by their services' own records; and the
example tools tested the way a user would test theirs, with toolloop.testing and no Temporal."""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, REPO_ROOT
from toolloop import Actor
from toolloop.testing import approval_token, run_tool

ADA = Actor(user_id="ada", tenant_id="example")


@pytest.mark.e2e
def test_the_http_tools_example_runs_with_one_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.http_tools", "--data-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "call c1 add_note: ok" in done.stdout and "call c2 get_note: ok" in done.stdout
    assert "verified; notes stored for it: 1" in done.stdout
    with sqlite3.connect(tmp_path / "notes.db") as db:
        notes = db.execute("SELECT tenant, user, text FROM notes").fetchall()
        records = db.execute("SELECT status FROM idempotency_records").fetchall()
    assert notes == [("example", "ada", "The supplier called.")]
    assert records == [(201,)]


@pytest.mark.e2e
def test_the_mcp_tools_example_runs_with_one_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.mcp_tools", "--data-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "call c1 add_todo: ok" in done.stdout and "call c2 list_todos: ok" in done.stdout
    # No status query and no read-back over MCP: done per the server, honestly not "verified".
    assert "(add_todo): completed;" in done.stdout
    # The server's own record: exactly one to-do, written once.
    lines = (tmp_path / "todos.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"text": "Water the plants."}]


@pytest.fixture
def notes_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The example service in process (its module reads its database and keys from the environment), and the
    caller key its tools sign bearer tokens with."""
    from examples.http_tools.tools import caller_keys

    caller_key, caller_verify_key = caller_keys()
    monkeypatch.setenv("NOTES_DB", str(tmp_path / "notes.db"))
    monkeypatch.setenv("APPROVAL_VERIFY_KEY", APPROVAL_VERIFY_KEY)
    monkeypatch.setenv("NOTES_CALLER_KEY", caller_key)
    monkeypatch.setenv("NOTES_CALLER_VERIFY_KEY", caller_verify_key)
    sys.modules.pop("examples.http_tools.service", None)
    yield importlib.import_module("examples.http_tools.service").app
    sys.modules.pop("examples.http_tools.service", None)


def token_for(operation_id: str, body: dict[str, object]) -> str:
    # What the approval channel sends, made with the public testing helper (as a user tests their service).
    return approval_token(
        APPROVAL_KEY, actor=ADA, operation_id=operation_id, payload=body, path="/notes", audience="notes"
    )


async def test_the_example_tools_can_be_tested_without_temporal(notes_app: object) -> None:
    from examples.http_tools.tools import build

    tools = build()
    transport = httpx.ASGITransport(app=notes_app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://notes") as http:
        missing = await run_tool(tools, "get_note", {"noteId": 1}, actor=ADA, http=http)
        body = {"text": "Call back."}
        added = await run_tool(
            tools, "add_note", body, actor=ADA, http=http, operation_id="op-1", approval_token=token_for("op-1", body)
        )
        again = await run_tool(
            tools, "add_note", body, actor=ADA, http=http, operation_id="op-1", approval_token=token_for("op-1", body)
        )
        unapproved = await run_tool(tools, "add_note", {"text": "x"}, actor=ADA, http=http, operation_id="op-2")
        read = await run_tool(tools, "get_note", {"noteId": 1}, actor=ADA, http=http)
        other = await run_tool(
            tools, "get_note", {"noteId": 1}, actor=Actor(user_id="bob", tenant_id="example"), http=http
        )
    assert missing == {"ok": False, "code": "NOT_AVAILABLE", "message": "note 1 is not available"}
    assert added == again == {"ok": True, "note_id": 1, "text": "Call back."}  # the retry is the stored reply
    assert unapproved["code"] == "CONFIRMATION_REQUIRED"
    assert read == added and other == {**missing}
    with sqlite3.connect(os.environ["NOTES_DB"]) as db:
        assert db.execute("SELECT count(*) FROM notes").fetchone() == (1,)


async def test_the_example_service_knows_its_caller_only_from_a_token_it_verifies(notes_app: object) -> None:
    from examples.http_tools.tools import bearer_for, caller_keys

    body = {"text": "Call back."}
    approval = {"Idempotency-Key": "op-1", "X-Approval-Token": token_for("op-1", body)}
    forged = bearer_for(caller_keys()[0], audience="notes")(ADA)  # signed with a key the service does not hold
    for_another_service = bearer_for(os.environ["NOTES_CALLER_KEY"], audience="calendar")(ADA)
    expired_claims = {"sub": "ada", "tenant": "example", "aud": "notes", "exp": 1}
    expired = {"Authorization": f"Bearer {jwt.encode(expired_claims, os.environ['NOTES_CALLER_KEY'], 'EdDSA')}"}
    headers_only = {"X-Actor-User": "ada", "X-Actor-Tenant": "example"}
    transport = httpx.ASGITransport(app=notes_app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://notes") as http:
        refused = [
            await http.post("/notes", json=body, headers={**approval, **who})
            for who in (headers_only, forged, for_another_service, expired)
        ]
        read = await http.get("/notes/1", headers=headers_only)
        status = await http.get("/operations/op-1", headers=headers_only)
        verified = await http.post(
            "/notes",
            json=body,
            headers={**approval, **bearer_for(os.environ["NOTES_CALLER_KEY"], audience="notes")(ADA)},
        )

    assert [(r.status_code, r.json()["code"]) for r in [*refused, read, status]] == [(401, "ACTOR_REQUIRED")] * 6
    assert verified.status_code == 201, verified.text
    with sqlite3.connect(os.environ["NOTES_DB"]) as db:
        assert db.execute("SELECT tenant, user, op FROM notes").fetchall() == [("example", "ada", "op-1")]
