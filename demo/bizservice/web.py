"""I/O helpers: the HTTP pieces every endpoint shares - the service's own problem codes, problem+json answers,
error hints and the caller's identity. The codes are the service's; the tools map them to the result codes
the model reads (demo/tools.py), as a client of any service would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, Header
from fastapi.responses import JSONResponse

from demo.bizservice.store import Owner
from demo.rules import CALENDAR_ID, ORDER_ID, TICKET_ID
from toolloop.servicekit import KitActor, KitProblem, describe_errors

__all__ = [
    "CALENDAR_ID",
    "ORDER_ID",
    "TICKET_ID",
    "Actor",
    "Problem",
    "ServiceCode",
    "actor",
    "describe_errors",
    "not_available",
    "problem_response",
    "status_code_for",
]

_PARAM_SOURCES = ("path", "query", "header", "body", "cookie")


class ServiceCode(StrEnum):
    """The business service's problem codes (the idempotency kit adds its own: toolloop.servicekit)."""

    ACTOR_REQUIRED = "ACTOR_REQUIRED"
    UNKNOWN_USER = "UNKNOWN_USER"
    ADMIN_ONLY = "ADMIN_ONLY"
    NOT_FOUND = "NOT_FOUND"
    INVALID_REQUEST = "INVALID_REQUEST"
    STALE_VERSION = "STALE_VERSION"
    NOT_REFUNDABLE = "NOT_REFUNDABLE"
    CONFLICT = "CONFLICT"
    TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"
    UNAVAILABLE = "UNAVAILABLE"
    SERVER_ERROR = "SERVER_ERROR"


# One exception type for every problem answer, the kit's and the service's alike.
Problem = KitProblem


def problem_response(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return Problem(status, code, detail, headers).response()


def not_available(kind: str, object_id: str) -> Problem:
    # One answer for "missing" and "someone else's": the detail names only what the caller asked for.
    return Problem(404, ServiceCode.NOT_FOUND, f"{kind} {object_id} is not available")


def request_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """Framework validation hints, without the parameter's source (path, query, ...) in front."""
    trimmed = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] in _PARAM_SOURCES:
            loc = loc[1:]
        trimmed.append({**err, "loc": loc})
    return describe_errors(trimmed) or "request: is invalid"


def status_code_for(status: int) -> ServiceCode:
    """The code of a framework error (unknown route, wrong method), decided by its status alone."""
    if status in (401, 403):
        return ServiceCode.ACTOR_REQUIRED
    if status == 404:
        return ServiceCode.NOT_FOUND
    if status == 409:
        return ServiceCode.CONFLICT
    if status == 429:
        return ServiceCode.TOO_MANY_REQUESTS
    if status in (502, 503, 504):
        return ServiceCode.UNAVAILABLE
    return ServiceCode.SERVER_ERROR if status >= 500 else ServiceCode.INVALID_REQUEST


async def actor(
    x_actor_user: Annotated[str | None, Header()] = None,
    x_actor_tenant: Annotated[str | None, Header()] = None,
) -> Owner:
    """The caller's identity, set by the orchestrator from the session (never from model arguments)."""
    if not x_actor_user or not x_actor_tenant:
        raise Problem(401, ServiceCode.ACTOR_REQUIRED, "X-Actor-User and X-Actor-Tenant headers are required")
    return Owner(user_id=x_actor_user, tenant_id=x_actor_tenant)


async def kit_actor(owner: Annotated[Owner, Depends(actor)]) -> KitActor:
    return KitActor(tenant_id=owner.tenant_id, user_id=owner.user_id)


Actor = Annotated[Owner, Depends(actor)]
