"""Wiring (client side): a request's result, whether its run completed or failed. The workflow's result is
the whole report; a request that failed (a model error, no answer) is a failed run in Temporal, so it is
visibly failed in the UI, and its whole report travels in the failure's details."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from toolloop._core.codes import ErrorType
from toolloop._core.contracts import AgentResult


def failed_result(exc: WorkflowFailureError) -> AgentResult | None:
    """The report a failed request carries; None for a run that failed for another reason."""
    cause = exc.cause
    if not (isinstance(cause, ApplicationError) and cause.type == ErrorType.REQUEST_FAILED and cause.details):
        return None
    try:
        return AgentResult.model_validate(cause.details[0])
    except ValidationError:
        return None


async def request_result(handle: WorkflowHandle[Any, Any]) -> AgentResult:
    """The request's AgentResult once it finished: answered, stopped at a limit, or failed. Raises
    WorkflowFailureError only for a run that failed without a report (terminated, say)."""
    try:
        result = await handle.result()
    except WorkflowFailureError as exc:
        report = failed_result(exc)
        if report is None:
            raise
        return report
    return result if isinstance(result, AgentResult) else AgentResult.model_validate(result)
