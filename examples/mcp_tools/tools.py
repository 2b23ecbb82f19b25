"""The MCP server's tools for a worker: `python worker.py --tools examples.mcp_tools.tools:build`.

Only `list_todos` is read-only, because this configuration says so (the server's readOnlyHint is not trusted
by default); `add_todo` is a write: it waits for a person's approval of its exact arguments, and an unclear
outcome is reported unknown, never resent (an MCP server has no status query)."""

import os
import sys

import toolloop


def build() -> toolloop.Toolset:
    tools = toolloop.Toolset()
    server = [sys.executable, "-m", "examples.mcp_tools.server"]
    todo_file = os.environ.get("TODO_FILE", "todos.jsonl")
    tools.include(
        toolloop.McpSource.stdio(
            "todos", server, env={"TODO_FILE": todo_file}, cwd=os.getcwd(), read_only={"list_todos"}
        )
    )
    return tools
