"""Example 2 end to end, with one command: `python -m examples.mcp_tools`.

It starts a Temporal dev server (the installed `temporal` CLI) and a worker whose tools come from an MCP server
(examples/mcp_tools/server.py, started over stdio by the worker), then runs one request whose scripted model adds
a to-do and lists them. This process is the trusted approval channel and approves the one write. An MCP server
has no status query and no read-back, so the write ends "completed, not verified": exit 0 when that is so and
the server's to-do file holds exactly the one new entry.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import toolloop
from examples.common import leave, temporal_cli
from examples.mcp_tools.tools import build
from toolloop.testing import call, generate_signing_key, say, script, search_attributes, verify_key_for

ACTOR = toolloop.Actor(user_id="ada", tenant_id="example")
TASK_QUEUE = "todos-example"


def approve(approval: toolloop.ApprovalRequest) -> bool:
    """The person at the approval channel: shown the exact payload the signature will cover, says yes."""
    print(f"approving {approval.tool} {approval.arguments} ({approval.digest[:19]}...)")
    return True


async def run(todo_file: Path) -> toolloop.AgentResult:
    signing_key = generate_signing_key()
    os.environ["TODO_FILE"] = str(todo_file)  # what tools.build() passes to the server
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
        return await client.run(
            "Remind me to water the plants, then show my to-dos.",
            actor=ACTOR,
            model=script(
                [call("add_todo", {"text": "Water the plants."}, "c1")],
                [call("list_todos", {}, "c2")],
                [say("Added: Water the plants.")],
            ),
            approver=approve,
        )


def report(result: toolloop.AgentResult, todo_file: Path) -> int:
    print(f"answer: {result.final_text}")
    for record in result.calls:
        print(f"call {record.call_id} {record.tool}: {'ok' if record.ok else record.code}")
    [operation] = result.operations
    todos = [json.loads(line)["text"] for line in todo_file.read_text().splitlines()] if todo_file.exists() else []
    print(f"operation {operation.operation_id} ({operation.tool}): {operation.state}; to-dos on file: {todos}")
    ok = operation.state == "completed" and todos == ["Water the plants."] and all(c.ok for c in result.calls)
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.mcp_tools", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="where the to-do file goes (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data_dir or Path(scratch)
        data_dir.mkdir(parents=True, exist_ok=True)
        todo_file = data_dir / "todos.jsonl"
        code = report(asyncio.run(run(todo_file)), todo_file)
    leave(code)


if __name__ == "__main__":
    main()
