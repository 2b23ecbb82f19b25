"""Workflow (deterministic): the retry policy shared by short I/O activities (tool calls, status
queries, read-backs; model turns and write attempts have their own, on purpose), and how a local
activity's failure reaches the workflow."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError


def io_retry_policy(maximum_attempts: int) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=maximum_attempts,
    )


def local_activity_error(err: ApplicationError, activity_type: str) -> ActivityError:
    """The ActivityError an activity's failure raises, for a local activity's: temporalio 1.35 raises the
    activity's ApplicationError itself when a local activity fails (a timeout does come as an ActivityError),
    so both kinds are handled alike once this wraps it (raise it `from err`: `cause` is then `err`)."""
    return ActivityError(
        err.message,
        scheduled_event_id=0,
        started_event_id=0,
        identity="",
        activity_type=activity_type,
        activity_id="",
        retry_state=None,
    )
