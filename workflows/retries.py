"""Workflow (deterministic): the retry policy shared by short I/O activities (tool calls, status
queries, read-backs; model turns and write attempts have their own, on purpose)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy


def io_retry_policy(maximum_attempts: int) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=maximum_attempts,
    )
