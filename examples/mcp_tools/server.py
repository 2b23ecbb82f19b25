"""A tiny MCP server (FastMCP, stdio): a to-do list kept in a JSON-lines file, one read tool and one write."""

import json
import os
from pathlib import Path

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

TODO_FILE = Path(os.environ.get("TODO_FILE", "todos.jsonl"))
server = FastMCP("todos", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def list_todos() -> list[str]:
    """The open to-dos."""
    lines = TODO_FILE.read_text().splitlines() if TODO_FILE.exists() else []
    return [json.loads(line)["text"] for line in lines]


@server.tool()
def add_todo(text: str) -> str:
    """Add a to-do."""
    with TODO_FILE.open("a") as todos:
        todos.write(json.dumps({"text": text}) + "\n")
    return f"added: {text}"


if __name__ == "__main__":
    server.run("stdio")
