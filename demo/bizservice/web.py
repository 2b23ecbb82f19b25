"""Pure: the HTTP pieces every endpoint shares - problem+json answers, error hints and the caller's identity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, Header
from fastapi.responses import JSONResponse

from demo.bizservice.store import Owner
from toolloop._core.codes import ResultCode

PROBLEM_MEDIA_TYPE = "application/problem+json"
ORDER_ID = r"^A[0-9]{3}$"
TICKET_ID = r"^T[0-9]{4}$"
CALENDAR_ID = r"^cal-[a-z0-9-]{1,32}$"
_MAX_ERRORS_SHOWN = 5
_PARAM_SOURCES = ("path", "query", "header", "body", "cookie")


class ServiceCode(StrEnum):
    """Problem codes of the idempotency protocol itself (not tool results: the tools map them)."""

    IDEMPOTENCY_KEY_REQUIRED = "IDEMPOTENCY_KEY_REQUIRED"
    IN_PROGRESS = "IN_PROGRESS"


ProblemCode = ResultCode | ServiceCode


class Problem(Exception):
    """An answer the service means to give: status, machine-readable code, a detail safe to show, and
    optional extension members (e.g. `current_version`)."""

    def __init__(
        self,
        status: int,
        code: ProblemCode,
        detail: str,
        headers: dict[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {
            "type": "about:blank",
            "title": HTTPStatus(self.status).phrase,
            "status": self.status,
            "code": str(self.code),
            "detail": self.detail,
            **self.extra,
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers, media_type=PROBLEM_MEDIA_TYPE)


def problem_response(
    status: int, code: ProblemCode, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return Problem(status, code, detail, headers).response()


def not_available(kind: str, object_id: str) -> Problem:
    # One answer for "missing" and "someone else's": the detail names only what the caller asked for.
    return Problem(404, ResultCode.NOT_AVAILABLE, f"{kind} {object_id} is not available")


def describe_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """Field-by-field hints; never the input values (they may be huge, hostile or someone's data)."""
    parts = []
    for err in errors[:_MAX_ERRORS_SHOWN]:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] in _PARAM_SOURCES:
            loc = loc[1:]
        kind = err.get("type")
        msg = {"missing": "is required", "extra_forbidden": "is not an accepted field"}.get(
            str(kind), str(err.get("msg", "is invalid"))
        )
        parts.append(f"{'.'.join(loc) or 'request'}: {msg}"[:200])
    if len(errors) > _MAX_ERRORS_SHOWN:
        parts.append(f"and {len(errors) - _MAX_ERRORS_SHOWN} more")
    return "; ".join(parts)


def status_code_for(status: int) -> ResultCode:
    """The code of a framework error (unknown route, wrong method), decided by its status alone."""
    if status in (401, 403):
        return ResultCode.FORBIDDEN
    if status == 404:
        return ResultCode.NOT_AVAILABLE
    if status == 409:
        return ResultCode.CONFLICT
    if status in (429, 502, 503, 504):
        return ResultCode.TEMPORARY_UNAVAILABLE
    return ResultCode.INTERNAL if status >= 500 else ResultCode.BAD_ARGUMENTS


async def actor(
    x_actor_user: Annotated[str | None, Header()] = None,
    x_actor_tenant: Annotated[str | None, Header()] = None,
) -> Owner:
    """The caller's identity, set by the orchestrator from the session (never from model arguments)."""
    if not x_actor_user or not x_actor_tenant:
        raise Problem(401, ResultCode.FORBIDDEN, "X-Actor-User and X-Actor-Tenant headers are required")
    return Owner(user_id=x_actor_user, tenant_id=x_actor_tenant)


Actor = Annotated[Owner, Depends(actor)]
