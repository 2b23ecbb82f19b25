"""Pure: the HTTP API's error answers as its OpenAPI document shows them - one table of problem codes and their
statuses, the problem+json schema, and the `responses` entry of each route."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

PROBLEM_MEDIA_TYPE = "application/problem+json"

# Every code the API answers with, and its status (README and docs/API.md say when each is given).
PROBLEM_STATUS: dict[str, int] = {
    "INVALID_IDEMPOTENCY_KEY": 400,
    "UNAUTHORIZED": 401,
    "NOT_FOUND": 404,
    "DIGEST_MISMATCH": 409,
    "NOT_PENDING": 409,
    "DECISION_REFUSED": 409,
    "REQUEST_FINISHED": 409,
    "THREAD_CLOSED": 409,
    "BODY_TOO_LARGE": 413,
    "INVALID_REQUEST": 422,
    "IDEMPOTENCY_KEY_REUSED": 422,
    "UNKNOWN_TOOL": 422,
    "UNKNOWN_MODEL": 422,
    "RATE_LIMITED": 429,
    "TOO_MANY_ACTIVE_REQUESTS": 429,
    "TOO_MANY_STREAMS": 429,
    "THREAD_BUSY": 429,
    "TOO_MANY_THREADS": 429,
    "TEMPORAL_UNAVAILABLE": 503,
    "REQUEST_UNREADABLE": 503,
    "UNCONFIRMED": 503,
    "NO_APPROVAL_KEY": 503,
}

# Said only inside an event stream that has started (an `error` event, then the end): the request's run closed
# without its report (terminated or timed out), so its final event will never come.
ENDED_WITHOUT_REPORT = "ENDED_WITHOUT_REPORT"

# What every route that reads or starts a request can answer besides its own codes.
CALLER_CODES = ("UNAUTHORIZED", "INVALID_REQUEST", "TEMPORAL_UNAVAILABLE")


class ProblemBody(BaseModel):
    """An error (RFC 9457): `code` is the stable, machine-readable part; `detail` says it in words."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = Field(default="about:blank")
    title: str = Field(description="The HTTP status's phrase.")
    status: int
    code: str = Field(description="Stable: " + ", ".join(PROBLEM_STATUS) + ".")
    detail: str = Field(description="What is wrong, in words; never a stack trace.")


def problems(*codes: str) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route that can answer these codes: one problem+json response per status."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(PROBLEM_STATUS[code], []).append(code)
    responses: dict[int | str, dict[str, Any]] = {}
    for status, named in sorted(by_status.items()):
        response: dict[str, Any] = {
            "description": "code " + " | ".join(named),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if status == 429 and "RATE_LIMITED" in named:
            response["headers"] = {
                "Retry-After": {
                    "description": "With RATE_LIMITED: seconds until the caller may create a request again.",
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
        responses[status] = response
    return responses


def use_problem_schema(app: FastAPI) -> None:
    """The app's OpenAPI document holds the Problem schema the routes' error responses refer to."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas["Problem"] = ProblemBody.model_json_schema(ref_template="#/components/schemas/{model}")
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
