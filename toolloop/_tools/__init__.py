"""I/O: tool sources and declarations - the Toolset, HTTP sources with the ready-made write contract, MCP."""
