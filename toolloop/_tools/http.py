"""I/O: HTTP tool sources - one client per source (base URL, auth, timeouts), the mapping of a service's
answers to result codes, and the ready-made write contract for services that follow the IETF
Idempotency-Key draft (toolloop.servicekit is one): its executor, status query and read-back, built from a
short declaration.

The outcome of a write is sorted here, once, for every such tool: completed (also when replayed), a definite
refusal, in progress, certainly not sent, or unknown - anything that may have happened after the request
left. Only a definite refusal or a connection that never opened says "not done".
"""

from __future__ import annotations

import string
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolloop._core.approvals import (
    APPROVAL_EXPIRED,
    APPROVAL_UNKNOWN_KEY,
    APPROVAL_WRONG_AUDIENCE,
    POLICY_DECISION_INVALID,
    POLICY_DECISION_REQUIRED,
    http_subject,
)
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import Actor, error_output, ok_output
from toolloop._core.problems import APPROVAL_REQUIRED, IN_PROGRESS, KEY_REQUIRED, KEY_REUSED, MAX_DETAIL_CHARS
from toolloop._core.redaction import internal_text
from toolloop._core.registry import (
    Evidence,
    EvidenceNotYetVisible,
    OperationStatus,
    ToolContext,
    ToolError,
    ToolTemporaryError,
    WriteInProgress,
    WriteNotSent,
    WriteOutcomeUnknown,
)

R = TypeVar("R", bound=BaseModel)

_MAX_RETRY_AFTER_SECONDS = 300.0
# Failures that happen before a single byte of the request is sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

_APPROVAL_REFUSALS = (
    APPROVAL_EXPIRED,
    APPROVAL_WRONG_AUDIENCE,
    APPROVAL_UNKNOWN_KEY,
    POLICY_DECISION_REQUIRED,
    POLICY_DECISION_INVALID,
)


def default_actor_headers(actor: Actor) -> dict[str, str]:
    """How the session's actor travels to a service by default: plain headers, which only a local demo should
    believe (toolloop.servicekit's insecure_actor_from_headers); give `actor_headers=` a signed token otherwise."""
    return {"X-Actor-User": actor.user_id, "X-Actor-Tenant": actor.tenant_id}


@dataclass
class HttpSource:
    """A service the tools talk to over HTTP, with a client of its own, opened with the worker.

    `headers` are sent with every request (an API key, say: held by the worker, never in history);
    `actor_headers` says how the session's actor is carried; `problem_codes` maps the service's own
    problem codes to the result codes the model reads (by HTTP status otherwise). `audience` is the `aud`
    of its writes' approval tokens, the name the service accepts (toolloop.servicekit's `audience=`);
    default: the source's name."""

    name: str
    base_url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    actor_headers: Callable[[Actor], Mapping[str, str]] = default_actor_headers
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 3.0
    problem_codes: Mapping[str, ResultCode] = field(default_factory=dict)
    audience: str | None = None
    # For tests: an httpx transport (MockTransport, ASGITransport) instead of the network.
    transport: httpx.AsyncBaseTransport | None = None
    # The source's own client while it is open (the `http` property); None while closed.
    _open_client: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    @property
    def http(self) -> httpx.AsyncClient:
        if self._open_client is None:
            raise RuntimeError(f"tool source {self.name!r} is not open (the worker opens its sources)")
        return self._open_client

    async def open(self) -> None:
        if self._open_client is None:
            # No transport retries: Temporal's retry policy is the only retry loop.
            self._open_client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=dict(self.headers),
                timeout=httpx.Timeout(self.timeout_seconds, connect=self.connect_timeout_seconds),
                transport=self.transport or httpx.AsyncHTTPTransport(retries=0),
                trust_env=False,
            )

    async def close(self) -> None:
        if self._open_client is not None:
            await self._open_client.aclose()
            self._open_client = None

    def full_path(self, path: str) -> str:
        """`path` as the service receives it: under the base URL's own path, decoded."""
        prefix = httpx.URL(self.base_url).path.rstrip("/")
        return urllib.parse.unquote(prefix + path)

    async def get(
        self,
        ctx: ToolContext,
        path: str,
        result: type[R],
        *,
        not_available: str,
        params: Mapping[str, Any] | None = None,
    ) -> R:
        """GET `path` as the session's actor: the parsed 200 body, or the ToolError / ToolTemporaryError
        the answer stands for. `not_available` is the one message for "does not exist" and "not yours"."""
        request = request_under_base(ctx.http, "GET", path, params=params, headers=dict(ctx.headers))
        try:
            response = await ctx.http.send(request)
        except httpx.TransportError:
            # Refused, reset, timed out: for a read, safe to try again.
            raise ToolTemporaryError(f"{self.name} could not be reached") from None
        return read_answer(response, result, not_available=not_available, codes=self.problem_codes)


# --- Answers ------------------------------------------------------------------------------------------------


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
    # A service writes its details for callers (field names and rules, no input values); still only a
    # short string is passed on.
    if not isinstance(value, str) or not value.strip() or internal_text(value):
        return fallback
    return value.strip()[:MAX_DETAIL_CHARS]


def definite_refusal(
    status: int, body: Any, codes: Mapping[str, ResultCode] | None = None, not_available: str | None = None
) -> ToolError | None:
    """The ToolError a definite refusal (400, 401, 403, 404, 409, 422) stands for; None for any other
    status. The service's own problem codes are mapped by `codes`, then by status."""
    problem: Mapping[str, Any] = body if isinstance(body, dict) else {}
    code = problem.get("code")
    detail = problem.get("detail")
    if status not in (400, 401, 403, 404, 409, 422):
        return None
    if status == 400 and code == KEY_REQUIRED:
        return ToolError(ResultCode.INTERNAL, "the write was sent without a valid operation id")
    if status == 422 and code == KEY_REUSED:
        return ToolError(ResultCode.IDEMPOTENCY_CONFLICT, "this operation id was already used with a different payload")
    if status == 403 and code == APPROVAL_REQUIRED:
        return ToolError(ResultCode.CONFIRMATION_REQUIRED, f"not approved: {safe_detail(detail, 'no valid approval')}")
    if status == 403 and code in _APPROVAL_REFUSALS:
        # Which refusal it was stays in the message (the model can do nothing different about any of them).
        why = safe_detail(detail, "no valid approval")
        return ToolError(ResultCode.CONFIRMATION_REQUIRED, f"not approved ({code}): {why}")
    mapped = (codes or {}).get(code) if isinstance(code, str) else None
    if mapped == ResultCode.NOT_AVAILABLE:
        return ToolError(mapped, not_available or safe_detail(detail, "the object is not available"))
    if mapped is not None:
        return ToolError(mapped, safe_detail(detail, "the service refused it"))
    if status in (400, 422):
        return ToolError(ResultCode.BAD_ARGUMENTS, safe_detail(detail, "the service rejected the arguments"))
    if status in (401, 403):
        return ToolError(ResultCode.FORBIDDEN, "this request is not allowed for the current user")
    if status == 404:
        return ToolError(ResultCode.NOT_AVAILABLE, not_available or "the object is not available")
    return ToolError(ResultCode.CONFLICT, "the request conflicts with the object's current state; read it again")


def read_answer(
    response: httpx.Response, result: type[R], *, not_available: str, codes: Mapping[str, ResultCode] | None = None
) -> R:
    """The parsed 200 body of a read, or the error it stands for (a definite refusal, or temporary)."""
    status = response.status_code
    if status == 200:
        try:
            return result.model_validate_json(response.content)
        except ValidationError:
            raise ToolError(ResultCode.INTERNAL, "the service gave an answer this tool does not understand") from None
    error = definite_refusal(status, json_body(response), codes, not_available)
    if error is not None:
        raise error
    if status in (408, 429) or status >= 500:
        raise ToolTemporaryError(f"the service is temporarily unavailable (HTTP {status})", retry_after(response))
    raise ToolError(ResultCode.INTERNAL, f"the service gave an unexpected answer (HTTP {status})")


def write_answer(
    status: int,
    body: Any,
    result: type[BaseModel],
    codes: Mapping[str, ResultCode] | None = None,
    retry_after_seconds: float | None = None,
) -> dict[str, Any]:
    """The tool output for a write's answer (fresh or replayed: the same), or the exception it stands for:
    WriteInProgress, a ToolError for a definite refusal, WriteOutcomeUnknown for anything else."""
    if 200 <= status < 300:
        try:
            return ok_output(**result.model_validate(body).model_dump(mode="json"))
        except ValidationError:
            # The effect may well exist; only its reply is unreadable.
            raise WriteOutcomeUnknown("the reply to this write could not be read") from None
    if status == 409 and isinstance(body, dict) and body.get("code") == IN_PROGRESS:
        raise WriteInProgress("another attempt of this operation is still running")
    # Only a definite refusal says nothing was done. A 429, a 5xx or anything else may come after the
    # service committed: the workflow asks the status before any resend.
    error = definite_refusal(status, body, codes)
    if error is not None:
        raise error
    raise WriteOutcomeUnknown(f"the service gave no definite answer (HTTP {status})", retry_after_seconds)


# --- Paths ----------------------------------------------------------------------------------------------------


def path_fields(template: str) -> list[str]:
    """The names in a path template ("/tickets/{ticketId}/notes" -> ["ticketId"])."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def fill_path(template: str, values: Mapping[str, Any]) -> str:
    """The template with each value percent-encoded as one path segment (an id can never add a segment). A
    value that is no segment at all ("", ".", "..": an HTTP client removes dot segments, so ".." would climb
    out of the base path) is BAD_ARGUMENTS."""
    filled: dict[str, str] = {}
    for name in path_fields(template):
        text = str(values[name])
        if text in ("", ".", ".."):
            raise ToolError(ResultCode.BAD_ARGUMENTS, f"{name} may not be {text!r}: it names no path segment")
        filled[name] = urllib.parse.quote(text, safe="")
    return template.format_map(filled)


def request_under_base(client: httpx.AsyncClient, method: str, path: str, **options: Any) -> httpx.Request:
    """The request for `path` under the client's base URL, refused (BAD_ARGUMENTS, nothing sent) when the URL
    the client would send is not exactly that path: dot segments removed, or a path that climbs out of the
    base. The digest of a write binds the path as given, so it must be the path that is sent."""
    refused = ToolError(ResultCode.BAD_ARGUMENTS, "the path would leave the service's base path; nothing was sent")
    raw = path.split("?", 1)[0]
    # A dot segment, encoded or not ("%2e%2e", "..%2F"): a server that decodes before it normalises climbs too.
    if any(part in (".", "..") for segment in raw.split("/") for part in urllib.parse.unquote(segment).split("/")):
        raise refused
    request = client.build_request(method, path, **options)
    # httpx joins a relative path and an absolute one alike: under the base path.
    intended = client.base_url.raw_path.decode("ascii").split("?", 1)[0].rstrip("/") + "/" + raw.lstrip("/")
    if urllib.parse.unquote(request.url.raw_path.decode("ascii").split("?", 1)[0]) != urllib.parse.unquote(intended):
        raise refused
    return request


# --- The write contract ------------------------------------------------------------------------------------


class KitOperationState(BaseModel):
    """The status answer of an operation id (toolloop.servicekit's `GET /operations/{operation_id}`)."""

    model_config = ConfigDict(extra="ignore")

    state: Literal["completed", "in_progress", "not_found"]
    status_code: int | None = None
    body: Any = None
    # How long the service keeps operation ids (it declares it on every status answer).
    retention_seconds: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class ReadBack:
    """How to read a completed write back as evidence: GET `path` (filled from the arguments, under the names
    the model sees, and the created object's fields), parse it as `result`, and `matches(args, created,
    found)` names each check (True when it agrees); None means the effect is not visible yet (read again)."""

    path: str
    result: type[BaseModel]
    matches: Callable[[Any, Any, Any], Mapping[str, bool] | None]


@dataclass(frozen=True)
class HttpWriteContract:
    """The executor, status query and read-back of one write tool against an Idempotency-Key service."""

    source: HttpSource
    method: str
    path: str
    result: type[BaseModel]
    status_path: str
    read_back_spec: ReadBack | None
    dump: Callable[[Any], dict[str, Any]]
    not_available: str = "the object is not available"

    def target(self, args: Any) -> str:
        """What the approval digest binds besides the payload: the method and the path the service receives."""
        return http_subject(self.method, self.source.full_path(fill_path(self.path, self.dump(args))))

    async def execute(self, ctx: ToolContext, args: Any) -> dict[str, Any]:
        if not ctx.operation_id:
            raise ToolError(ResultCode.INTERNAL, "this write was started without an operation id")
        body = self.dump(args)  # exactly the payload the approval's digest was taken over
        headers = {**ctx.headers, "Idempotency-Key": ctx.operation_id}
        if ctx.approval_token:
            headers["X-Approval-Token"] = ctx.approval_token
        request = request_under_base(ctx.http, self.method, fill_path(self.path, body), json=body, headers=headers)
        try:
            response = await ctx.http.send(request)
        except _NOT_SENT:
            raise WriteNotSent(f"{self.source.name} could not be reached; nothing was sent") from None
        except httpx.HTTPError:
            raise WriteOutcomeUnknown("the connection failed after the write was sent") from None
        return write_answer(
            response.status_code, json_body(response), self.result, self.source.problem_codes, retry_after(response)
        )

    async def status(self, ctx: ToolContext, operation_id: str) -> OperationStatus:
        """The service's word on `operation_id`; for a completed one, the output the executor would have given
        for the stored reply. Raises ToolTemporaryError when the status cannot be read."""
        try:
            response = await ctx.http.get(
                fill_path(self.status_path, {"operation_id": operation_id}), headers=dict(ctx.headers)
            )
        except httpx.TransportError:
            raise ToolTemporaryError(f"{self.source.name} could not be reached for the status") from None
        if response.status_code != 200:
            raise ToolTemporaryError(
                f"the operation status is unavailable (HTTP {response.status_code})", retry_after(response)
            )
        try:
            found = KitOperationState.model_validate_json(response.content)
        except ValidationError:
            raise ToolTemporaryError("the operation status could not be read") from None
        retention = found.retention_seconds
        if found.state != "completed":
            return OperationStatus(state=found.state, retention_seconds=retention)
        if found.status_code is None:
            # The service says it completed: never "not found" (nothing done), only unreadable for now.
            raise ToolTemporaryError("the operation completed but its stored outcome could not be read")
        try:
            output = write_answer(found.status_code, found.body, self.result, self.source.problem_codes)
        except ToolError as refusal:
            output = error_output(refusal.code, refusal.message)
        except (WriteInProgress, WriteNotSent, WriteOutcomeUnknown):
            # A stored outcome is always an object or a definite refusal; anything else is not trusted.
            raise ToolTemporaryError("the stored outcome could not be read") from None
        return OperationStatus(state="completed", output=output, retention_seconds=retention)

    async def read_back(self, ctx: ToolContext, args: Any, output: Mapping[str, Any]) -> Evidence:
        spec = self.read_back_spec
        assert spec is not None  # registered only with a read-back
        try:
            created = self.result.model_validate({k: v for k, v in output.items() if k != "ok"})
        except ValidationError:
            return Evidence(verified=False, detail="the write's output names no created object")
        values = {**created.model_dump(mode="json"), **self.dump(args)}
        try:
            path = fill_path(spec.path, values)
        except KeyError as missing:
            return Evidence(
                verified=False, detail=f"the read-back path needs {missing}, which the write did not return"
            )
        try:
            found = await self.source.get(ctx, path, spec.result, not_available="not visible")
        except ToolError as refusal:
            if refusal.code == ResultCode.NOT_AVAILABLE:
                raise EvidenceNotYetVisible(f"{path} is not visible yet") from None
            # A read-back the service refuses (e.g. authority revoked since) proves nothing: not verified.
            return Evidence(verified=False, detail=f"the read-back could not check the effect ({refusal.code})")
        checks = spec.matches(args, created, found)
        if checks is None:
            raise EvidenceNotYetVisible(f"the effect is not visible at {path} yet")
        differing = [name for name, same in checks.items() if not same]
        seen = f"GET {path}{_created_id(created, path)}"
        detail = f"{seen} matches the approved operation"
        if differing:
            detail = f"{seen} differs from the approved operation: {', '.join(differing)}"
        return Evidence(verified=not differing, detail=detail, checks=dict(checks))


def _created_id(created: BaseModel, path: str) -> str:
    """The created object's id, for the evidence's wording: its first field whose name ends in "id"; nothing
    when the path read names it already."""
    for name, value in created.model_dump(mode="json").items():
        if name == "id" or name.endswith("_id"):
            return "" if str(value) in path.split("/") else f" for {name} {value}"
    return " for the created object"


Executor = Callable[[ToolContext, Any], Awaitable[Mapping[str, Any]]]
