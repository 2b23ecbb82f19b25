"""I/O: what the demo tools share - id formats, the argument base model, and the exchange with the business
service (actor headers, GETs, and the one mapping from a definite HTTP refusal to a ToolError).

Outputs are built from known fields of a parsed response: a raw body or exception text never reaches the
model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from toolloop._core.codes import ResultCode
from toolloop._core.registry import ToolContext, ToolError, ToolTemporaryError

ORDER_ID = r"^A[0-9]{3}$"
TICKET_ID = r"^T[0-9]{4}$"
CALENDAR_ID = r"^cal-[a-z0-9-]{1,32}$"
_MAX_DETAIL_CHARS = 200
_MAX_RETRY_AFTER_SECONDS = 300.0

R = TypeVar("R", bound=BaseModel)


class Arguments(BaseModel):
    # Dumped by alias so the checked arguments (CheckedCall.arguments) validate again unchanged.
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)


class Response(BaseModel):
    """The fields a tool passes on; anything else the service sends is dropped."""

    model_config = ConfigDict(extra="ignore")


def actor_headers(ctx: ToolContext) -> dict[str, str]:
    return {"X-Actor-User": ctx.actor.user_id, "X-Actor-Tenant": ctx.actor.tenant_id}


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (the activity's own backoff applies)."""
    value = response.headers.get("Retry-After", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_SECONDS)


def json_body(response: httpx.Response) -> Any:
    """The parsed body, or None when it is not JSON (cut short, an HTML error page, ...)."""
    try:
        return response.json()
    except ValueError:
        return None


def safe_detail(value: Any, fallback: str) -> str:
    # The service writes its details for callers (field names and rules, no input values); still only a
    # short string is passed on.
    if not isinstance(value, str) or not value.strip():
        return fallback
    return value.strip()[:_MAX_DETAIL_CHARS]


async def get(ctx: ToolContext, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
    try:
        return await ctx.http.get(path, params=params, headers=actor_headers(ctx))
    except httpx.TransportError:
        # Refused, reset, timed out: for a read, safe to try again.
        raise ToolTemporaryError("the business service could not be reached") from None


def definite_error(status: int, body: Any, not_available: str | None = None) -> ToolError | None:
    """The ToolError a definite refusal (400, 401, 403, 404, 409, 422) stands for; None for any other
    status. `not_available` replaces the service's 404 detail where the caller can name the object."""
    problem: Mapping[str, Any] = body if isinstance(body, dict) else {}
    code = problem.get("code")
    if status == 400 and code == "IDEMPOTENCY_KEY_REQUIRED":
        return ToolError(ResultCode.INTERNAL, "the write was sent without a valid operation id")
    if status == 422 and code == ResultCode.IDEMPOTENCY_CONFLICT:
        return ToolError(ResultCode.IDEMPOTENCY_CONFLICT, "this operation id was already used with a different payload")
    if status in (400, 422):
        return ToolError(
            ResultCode.BAD_ARGUMENTS, safe_detail(problem.get("detail"), "the service rejected the arguments")
        )
    if status == 403 and code == ResultCode.CONFIRMATION_REQUIRED:
        detail = safe_detail(problem.get("detail"), "there is no valid approval")
        return ToolError(ResultCode.CONFIRMATION_REQUIRED, f"not approved: {detail}")
    if status in (401, 403):
        return ToolError(ResultCode.FORBIDDEN, "this request is not allowed for the current user")
    if status == 404:
        message = not_available or safe_detail(problem.get("detail"), "the object is not available")
        return ToolError(ResultCode.NOT_AVAILABLE, message)
    if status == 409 and code == ResultCode.VERSION_CONFLICT:
        current = problem.get("current_version")
        now = f" (it is at version {current})" if type(current) is int else ""
        return ToolError(ResultCode.VERSION_CONFLICT, f"the object has changed{now}; read it again before retrying")
    if status == 409:
        return ToolError(ResultCode.CONFLICT, "the request conflicts with the object's current state; read it again")
    return None


def map_response(response: httpx.Response, model: type[R], not_available: str) -> R:
    """The parsed 200 body of a read, or the matching tool error. `not_available` is the one message for
    "does not exist" and "not yours", built by the caller from the arguments alone."""
    status = response.status_code
    if status == 200:
        try:
            return model.model_validate_json(response.content)
        except ValidationError:
            raise ToolError(ResultCode.INTERNAL, "the service gave an answer this tool does not understand") from None
    error = definite_error(status, json_body(response), not_available)
    if error is not None:
        raise error
    if status == 429 or status >= 500:
        raise ToolTemporaryError(
            f"the business service is temporarily unavailable (HTTP {status})", retry_after(response)
        )
    raise ToolError(ResultCode.INTERNAL, f"the service gave an unexpected answer (HTTP {status})")
