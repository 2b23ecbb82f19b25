"""Example 2: an MCP server's tools (FastMCP over stdio) behind the same gates as any other tool."""
