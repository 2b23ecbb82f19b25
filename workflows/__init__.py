"""Temporal workflows (deterministic code only)."""
