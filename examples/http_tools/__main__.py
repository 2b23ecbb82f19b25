"""Example 1 end to end, with one command: `python -m examples.http_tools`.

It starts a Temporal dev server (the installed `temporal` CLI), the notes service (examples/http_tools/service.py)
and a worker with the notes tools (examples/http_tools/tools.py), then runs one request whose scripted model adds
a note and reads it back. This process is the trusted approval channel: it holds the signing key and approves
the one write. Exit 0 when the write is verified by its read-back and the service holds exactly one note for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import toolloop
from examples.common import leave, temporal_cli
from examples.http_tools.tools import build, caller_keys
from toolloop.testing import call, generate_signing_key, say, script, search_attributes, verify_key_for

ACTOR = toolloop.Actor(user_id="ada", tenant_id="example")
TASK_QUEUE = "notes-example"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, process: subprocess.Popen[bytes], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: the notes service exited with code {process.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"error: the notes service did not answer at {url}")


def approve(approval: toolloop.ApprovalRequest) -> bool:
    """The person at the approval channel: shown the exact payload the signature will cover, says yes."""
    print(f"approving {approval.tool} {approval.arguments} ({approval.digest[:19]}...)")
    return True


async def run(signing_key: str, db: Path) -> int:
    # The example scripts its model, so its worker allows scripted models (a deployment's worker does not).
    plugin = toolloop.ToolloopPlugin(
        build(), approval_verify_key=verify_key_for(signing_key), allow_scripted_models=True
    )
    async with (
        await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli(), plugins=[plugin], search_attributes=search_attributes()
        ) as temporal,
        Worker(temporal.client, task_queue=TASK_QUEUE),
    ):
        # toolloop's client: it starts the request and is the approval channel (it holds the signing key).
        client = toolloop.ToolloopClient(
            temporal.client, task_queue=TASK_QUEUE, signing_key=signing_key, channel="example"
        )
        result = await client.run(
            "Note that the supplier called, then show me the note.",
            actor=ACTOR,
            model=script(
                [call("add_note", {"text": "The supplier called."}, "c1")],
                [call("get_note", {"noteId": 1}, "c2")],
                [say("Added note 1: The supplier called.")],
            ),
            approver=approve,
        )

    print(f"answer: {result.final_text}")
    for record in result.calls:
        print(f"call {record.call_id} {record.tool}: {'ok' if record.ok else record.code}")
    [operation] = result.operations
    with sqlite3.connect(db) as conn:
        [(effects,)] = conn.execute("SELECT count(*) FROM notes WHERE op = ?", (operation.operation_id,))
    print(f"operation {operation.operation_id} ({operation.tool}): {operation.state}; notes stored for it: {effects}")
    ok = operation.state == "verified" and effects == 1 and all(c.ok for c in result.calls)
    return 0 if ok else 1


def serve_and_run(data_dir: Path) -> int:
    """The notes service as its own process for the length of the request."""
    signing_key = generate_signing_key()
    # The worker signs a bearer token naming the user for each call; the service verifies it with the public half.
    caller_key, caller_verify_key = caller_keys()
    port = _free_port()
    db = data_dir / "notes.db"
    env = {**os.environ, "APPROVAL_VERIFY_KEY": verify_key_for(signing_key), "NOTES_DB": str(db)}
    env["NOTES_CALLER_VERIFY_KEY"] = caller_verify_key
    command = [sys.executable, "-m", "uvicorn", "examples.http_tools.service:app", "--port", str(port)]
    service = subprocess.Popen([*command, "--log-level", "warning"], env=env)
    try:
        _wait_for(f"http://127.0.0.1:{port}/openapi.json", service)
        os.environ["NOTES_URL"] = f"http://127.0.0.1:{port}"  # what tools.build() reads
        os.environ["NOTES_CALLER_KEY"] = caller_key
        return asyncio.run(run(signing_key, db))
    finally:
        service.terminate()
        service.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.http_tools", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="where the notes database goes (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data_dir or Path(scratch)
        data_dir.mkdir(parents=True, exist_ok=True)
        code = serve_and_run(data_dir)
    leave(code)


if __name__ == "__main__":
    main()
