"""A user's own tools, declared with toolloop's public API only, for `python worker.py --tools tests.user_tools:build`
(tests/test_user_tools_e2e.py). The other functions are the mistakes a user makes, each refused in one line."""

from __future__ import annotations

from pydantic import BaseModel, Field

import toolloop


class AddArgs(toolloop.Arguments):
    a: int = Field(ge=-1000, le=1000, description="The first number.")
    b: int = Field(ge=-1000, le=1000, description="The second number.")


class Sum(BaseModel):
    total: int


class Lookup(toolloop.Arguments):
    tags: dict[str, str] = Field(description="A free-form map, which strict mode cannot express.")


def build() -> toolloop.Toolset:
    tools = toolloop.Toolset()

    @tools.read(timeout=5, attempts=2)
    async def add(ctx: toolloop.ToolContext, args: AddArgs) -> Sum:
        """Add two integers."""
        return Sum(total=args.a + args.b)

    return tools


def refused() -> toolloop.Toolset:
    tools = toolloop.Toolset()

    @tools.read
    async def lookup(ctx: toolloop.ToolContext, args: Lookup) -> Sum:
        """Look something up."""
        return Sum(total=0)

    return tools


def not_a_toolset() -> int:
    return 3


def unopenable() -> toolloop.Toolset:
    """An MCP server whose command does not exist: the worker cannot open its tools."""
    tools = toolloop.Toolset()
    tools.include(toolloop.McpSource.stdio("gone", ["/nonexistent/mcp-server"], connect_timeout_seconds=5))
    return tools


def needs_a_setting() -> toolloop.Toolset:
    """A builder that reads a setting the README's example reads (os.environ["SHOP_URL"]), here never set."""
    import os

    return build_for(os.environ["TOOLLOOP_TEST_SETTING_NEVER_SET"])


def build_for(url: str) -> toolloop.Toolset:
    return build()


class Entry(toolloop.Arguments):
    text: str = Field(description="what to write down")


def in_process_ledger(written: list[str], *, keys: str, audience: str) -> toolloop.Toolset:
    """One write that takes effect in this process (it appends to `written`), checking its approval token
    itself with `keys` for `audience`, as a service would; no status query, no read-back."""
    tools = toolloop.Toolset()

    async def add_entry(ctx: toolloop.ToolContext, args: Entry) -> dict[str, int]:
        """Write an entry in the ledger this process keeps."""
        toolloop.verify_approval(ctx, keys=keys, audience=audience)
        written.append(args.text)
        return {"entries": len(written)}

    tools.write(add_entry, status=None, read_back=None)
    return tools
