"""Temporal activities: model turns and tool calls (all I/O lives here)."""
