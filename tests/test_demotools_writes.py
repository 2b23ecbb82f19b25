"""Tests of the demo write tools: strict schemas, argument validation, the executor's sorting of every
answer (ASGI service and httpx.MockTransport), the status query and the read-backs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from demo.bizservice.app import create_app
from demo.bizservice.seed import SEED_FACTS
from demo.tools import demo_tools
from tests.conftest import APPROVAL_VERIFY_KEY, approval_token
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import Actor, FunctionCallItem, error_output
from toolloop._core.registry import (
    Evidence,
    EvidenceNotYetVisible,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
    ToolTemporaryError,
    WriteInProgress,
    WriteNotSent,
    WriteOutcomeUnknown,
    strict_schema_problems,
)
from toolloop._core.validation import check_call
from toolloop._tools.http import default_actor_headers

ADMIN = {"X-Admin-Token": "t"}
LEAK_MARKERS = ("Traceback", "sqlite", "SELECT", ".py", "/tmp", "/work", "secret")
WRITE_TOOLS = ["append_ticket_note", "create_calendar_event", "refund_order"]

NOTE = {"ticketId": "T1001", "text": "Replacement shipped.", "expectedVersion": 1}
EVENT = {
    "calendarId": "cal-u1",
    "title": "Supplier call",
    "start": "2026-12-03T12:00:00+02:00",
    "end": "2026-12-03T11:00:00Z",
    "attendees": ["ops@example.com", "ada@example.org"],
}
REFUND = {"orderId": "A100", "amountCents": 500, "reason": "damaged box"}


@pytest.fixture
def registry() -> ToolRegistry:
    return demo_tools("http://svc").registry


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(tmp_path / "biz.db", admin_token="t", approval_verify_key=APPROVAL_VERIFY_KEY)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as client:
        yield client


def spec_of(registry: ToolRegistry, name: str) -> ToolSpec:
    spec = registry.get(name)
    assert spec is not None
    return spec


def checked(registry: ToolRegistry, name: str, arguments: dict[str, Any]) -> tuple[BaseModel, dict[str, Any]]:
    """Validate like the loop does: the parsed arguments and the dict the workflow digests."""
    result = check_call(registry, FunctionCallItem(call_id="c1", name=name, arguments=json.dumps(arguments)))
    assert result.rejection is None and result.arguments is not None, result.rejection
    return spec_of(registry, name).schema.load(result.arguments), result.arguments


def rejection(registry: ToolRegistry, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = check_call(registry, FunctionCallItem(call_id="c1", name=name, arguments=json.dumps(arguments)))
    assert result.rejection is not None
    return result.rejection


def write_ctx(
    http: httpx.AsyncClient, operation_id: str | None, token: str | None, user: str = "u1", tenant: str = "acme"
) -> ToolContext:
    actor = Actor(user_id=user, tenant_id=tenant)
    return ToolContext(
        actor=actor,
        http=http,
        workflow_id="wf-1",
        call_id="c1",
        operation_id=operation_id,
        approval_token=token,
        headers=default_actor_headers(actor),
    )


async def run_write(
    registry: ToolRegistry,
    http: httpx.AsyncClient,
    name: str,
    arguments: dict[str, Any],
    operation_id: str,
    *,
    token: str | None = None,
) -> tuple[BaseModel, dict[str, Any]]:
    """Check, approve (unless a token is given) and execute one write; the parsed args and the output."""
    args, digested = checked(registry, name, arguments)
    token = token if token is not None else approval_token(operation_id, name, digested)
    spec = spec_of(registry, name)
    return args, spec.output_of(await spec.execute(write_ctx(http, operation_id, token), args))


def assert_clean(text: str) -> None:
    for marker in LEAK_MARKERS:
        assert marker not in text, f"{marker!r} leaked"


async def effect_count(service: httpx.AsyncClient, operation_id: str) -> int:
    r = await service.get("/admin/effects", params={"operation_id": operation_id}, headers=ADMIN)
    return len(r.json()["effects"])


# --- Schemas and argument validation ---------------------------------------------------------------------


def test_write_tools_are_side_effecting_with_strict_schemas(registry: ToolRegistry) -> None:
    assert registry.names()[4:] == WRITE_TOOLS
    expected_props = {
        "append_ticket_note": ["ticketId", "text", "expectedVersion"],
        "create_calendar_event": ["calendarId", "title", "start", "end", "attendees"],
        "refund_order": ["orderId", "amountCents", "reason", "toAccount"],
    }
    for name in WRITE_TOOLS:
        spec = spec_of(registry, name)
        assert spec.effect == "side_effecting" and not spec.read_only
        assert spec.status is not None and spec.read_back is not None and spec.redact == ()
        assert isinstance(spec.arguments, type) and strict_schema_problems(spec.arguments) == []
        params = spec.definition()["parameters"]
        assert params["additionalProperties"] is False
        assert list(params["properties"]) == expected_props[name] == params["required"]
        assert all("description" in prop for prop in params["properties"].values())
    refund = spec_of(registry, "refund_order").definition()["parameters"]["properties"]["amountCents"]
    assert (refund["type"], refund["minimum"], refund["maximum"]) == ("integer", 1, 2**53 - 1)


@pytest.mark.parametrize(
    ("name", "arguments", "needle"),
    [
        ("refund_order", {"orderId": "A100", "reason": "r"}, "amountCents: is required"),
        ("refund_order", {**REFUND, "amountCents": None}, "amountCents"),
        ("refund_order", {**REFUND, "amountCents": -1}, "amountCents"),
        ("refund_order", {**REFUND, "amountCents": 0}, "amountCents"),
        ("refund_order", {**REFUND, "amountCents": 2**53}, "amountCents"),
        ("refund_order", {**REFUND, "amountCents": 5.5}, "amountCents"),
        ("refund_order", {**REFUND, "amountCents": "500"}, "amountCents"),
        ("refund_order", {**REFUND, "userId": "u2"}, "userId: is not an accepted field"),
        ("refund_order", {**REFUND, "reason": "x" * 201}, "reason"),
        ("append_ticket_note", {**NOTE, "text": "     "}, "text"),
        ("append_ticket_note", {**NOTE, "text": "hi\u200bthere"}, "text"),
        ("append_ticket_note", {**NOTE, "text": "bell\x07"}, "text"),
        ("append_ticket_note", {**NOTE, "text": "x" * 501}, "text"),
        ("append_ticket_note", {"ticketId": "T1001", "text": "x"}, "expectedVersion: is required"),
        ("create_calendar_event", {**EVENT, "attendees": ["not-an-email"]}, "attendees.0"),
        ("create_calendar_event", {**EVENT, "attendees": ["a\u200b@example.com"]}, "attendees.0"),
        ("create_calendar_event", {**EVENT, "attendees": [f"p{i}@example.com" for i in range(21)]}, "attendees"),
        ("create_calendar_event", {**EVENT, "start": "2026-12-03T10:00:00"}, "start"),
        ("create_calendar_event", {**EVENT, "end": "2026-12-03T09:00:00Z"}, "end: must be later than start"),
        ("create_calendar_event", {**EVENT, "end": "2026-12-03T18:00:01Z"}, "end: an event may last at most 8 hours"),
        ("create_calendar_event", {**EVENT, "start": "2026-12-03T10:00:00.25Z"}, "start: must be a whole second"),
        ("create_calendar_event", {**EVENT, "recurrence": "FREQ=DAILY"}, "recurrence: is not an accepted field"),
    ],
)
def test_bad_write_arguments_are_rejected(
    registry: ToolRegistry, name: str, arguments: dict[str, Any], needle: str
) -> None:
    out = rejection(registry, name, arguments)
    assert out["code"] == ResultCode.BAD_ARGUMENTS
    assert needle in out["message"]
    assert "\u200b" not in out["message"] and "not-an-email" not in out["message"]


def test_checked_arguments_are_trimmed_and_attendees_normalized(registry: ToolRegistry) -> None:
    _, note = checked(registry, "append_ticket_note", {**NOTE, "text": "  Replacement shipped. \n"})
    assert note == NOTE
    _, event = checked(registry, "create_calendar_event", {**EVENT, "attendees": None})
    assert event["attendees"] == []
    assert event["start"] == "2026-12-03T10:00:00Z"  # in UTC: this is what gets digested and sent
    # The checked arguments validate again unchanged (the workflow re-parses them for the activity).
    args, again = checked(registry, "create_calendar_event", event)
    assert again == event == args.model_dump(mode="json", by_alias=True)


def test_summaries(registry: ToolRegistry) -> None:
    def summary(name: str, arguments: dict[str, Any]) -> str:
        return check_call(registry, FunctionCallItem(call_id="c", name=name, arguments=json.dumps(arguments))).summary

    assert summary("refund_order", REFUND) == "refund_order A100 500"
    assert summary("append_ticket_note", NOTE) == "append_ticket_note T1001"
    assert summary("create_calendar_event", EVENT) == "create_calendar_event cal-u1 2026-12-03T10:00:00Z"


# --- Executors against the service -------------------------------------------------------------------------


async def test_note_is_written_and_a_retry_gets_the_same_output(
    registry: ToolRegistry, service: httpx.AsyncClient
) -> None:
    _, out = await run_write(registry, service, "append_ticket_note", NOTE, "op-n")
    assert out["ok"] is True
    assert (out["ticket_id"], out["text"], out["ticket_version"], out["author"]) == ("T1001", NOTE["text"], 2, "u1")
    assert set(out) == {"ok", "note_id", "ticket_id", "text", "author", "created_at", "ticket_version"}
    _, again = await run_write(registry, service, "append_ticket_note", NOTE, "op-n")
    assert again == out
    assert await effect_count(service, "op-n") == 1


async def test_event_and_refund_outputs(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    _, event = await run_write(registry, service, "create_calendar_event", EVENT, "op-e")
    assert (event["calendar_id"], event["start"], event["end"]) == (
        "cal-u1",
        "2026-12-03T10:00:00Z",
        "2026-12-03T11:00:00Z",
    )
    assert event["attendees"] == sorted(EVENT["attendees"])  # a set, stored in one order
    _, refund = await run_write(registry, service, "refund_order", REFUND, "op-r")
    total = SEED_FACTS["order_a100"]["total_cents"]
    assert (refund["amount_cents"], refund["refunded_cents"], refund["refundable_cents"]) == (500, 500, total - 500)
    assert refund["to_account"] == SEED_FACTS["order_a100"]["paid_from"]


@pytest.mark.parametrize("attendees", ["omitted", None, []], ids=["omitted", "null", "empty"])
async def test_an_event_without_attendees_is_approved_and_created_whichever_way_the_model_says_none(
    registry: ToolRegistry, service: httpx.AsyncClient, attendees: Any
) -> None:
    # The approved payload, the sent body and the read-back all say [] for "none", also when the model leaves
    # the optional field out (the service digests the body it receives, so anything else is refused).
    arguments = {k: v for k, v in EVENT.items() if k != "attendees"}
    if attendees != "omitted":
        arguments["attendees"] = attendees
    _, digested = checked(registry, "create_calendar_event", arguments)
    assert digested["attendees"] == []
    operation_id = f"op-none-{len(arguments)}-{attendees is None}"
    _, event = await run_write(registry, service, "create_calendar_event", arguments, operation_id)
    assert event["ok"] is True and event["attendees"] == []
    assert await effect_count(service, operation_id) == 1


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("no approval", ResultCode.CONFIRMATION_REQUIRED),
        ("expired approval", ResultCode.CONFIRMATION_REQUIRED),
        ("other payload under one key", ResultCode.IDEMPOTENCY_CONFLICT),
        ("stale version", ResultCode.VERSION_CONFLICT),
        ("not yours", ResultCode.NOT_AVAILABLE),
        ("over refundable", ResultCode.BAD_ARGUMENTS),
    ],
)
async def test_definite_refusals_are_tool_errors(
    registry: ToolRegistry, service: httpx.AsyncClient, case: str, code: ResultCode
) -> None:
    name, arguments, token = "refund_order", dict(REFUND), None
    if case == "no approval":
        token = ""
    elif case == "expired approval":
        token = approval_token("op-x", name, checked(registry, name, arguments)[1], expires_in=-1)
    elif case == "other payload under one key":
        await run_write(registry, service, name, arguments, "op-x")
        arguments["amountCents"] = 600
    elif case == "stale version":
        name, arguments = "append_ticket_note", {**NOTE, "expectedVersion": 7}
    elif case == "not yours":
        arguments["orderId"] = "A101"
    elif case == "over refundable":
        arguments["amountCents"] = SEED_FACTS["order_a100"]["total_cents"] + 1
    with pytest.raises(ToolError) as info:
        await run_write(registry, service, name, arguments, "op-x", token=token)
    assert info.value.code == code
    assert_clean(info.value.message)
    assert await effect_count(service, "op-x") == (1 if case == "other payload under one key" else 0)
    if case == "stale version":
        assert "version 1" in info.value.message
    if case == "over refundable":
        assert "refundable" in info.value.message


async def test_a_write_without_an_operation_id_is_not_sent(registry: ToolRegistry) -> None:
    seen: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={})

    args, _ = checked(registry, "refund_order", REFUND)
    async with mock_client(capture) as http:
        with pytest.raises(ToolError) as info:
            await spec_of(registry, "refund_order").execute(write_ctx(http, None, "tok"), args)
    assert info.value.code == ResultCode.INTERNAL and seen == []


async def test_in_flight_retry_is_write_in_progress(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    rule = {"path_regex": "/refunds$", "when": "after_claim", "latency_ms": 600, "times": 1}
    await service.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
    first = asyncio.create_task(run_write(registry, service, "refund_order", REFUND, "op-f"))
    status = spec_of(registry, "refund_order").status
    assert status is not None
    for _ in range(200):
        if (await status(write_ctx(service, None, None), "op-f")).state == "in_progress":
            break
        await asyncio.sleep(0.01)
    with pytest.raises(WriteInProgress):
        await run_write(registry, service, "refund_order", REFUND, "op-f")
    assert (await first)[1]["ok"] is True
    assert await effect_count(service, "op-f") == 1


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"status": 429}, WriteOutcomeUnknown),
        ({"status": 503}, WriteOutcomeUnknown),
        ({"when": "after_commit", "status": 500}, WriteOutcomeUnknown),
        # A "busy" answer may come after the commit too: never "not sent", the status must be asked.
        ({"when": "after_commit", "status": 429}, WriteOutcomeUnknown),
    ],
)
async def test_service_faults_are_sorted(
    registry: ToolRegistry, service: httpx.AsyncClient, rule: dict[str, Any], expected: type[Exception]
) -> None:
    await service.put("/admin/faults", json={"rules": [{"path_regex": "/refunds$", "times": 1, **rule}]}, headers=ADMIN)
    with pytest.raises(expected) as info:
        await run_write(registry, service, "refund_order", REFUND, "op-fault")
    if rule["status"] == 429:
        assert isinstance(info.value, WriteOutcomeUnknown) and info.value.retry_after_seconds == 1.0
    assert_clean(str(info.value))
    committed = rule.get("when") == "after_commit"
    assert await effect_count(service, "op-fault") == (1 if committed else 0)


# --- Executors at the seam (httpx.MockTransport) -------------------------------------------------------------


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://svc")


def problem(status: int, code: str, detail: str = "x", **extra: Any) -> httpx.Response:
    body = {"type": "about:blank", "title": "x", "status": status, "code": code, "detail": detail, **extra}
    return httpx.Response(status, json=body, headers={"Retry-After": "4"} if status == 429 else None)


async def run_mocked(registry: ToolRegistry, handler: Callable[[httpx.Request], httpx.Response]) -> dict[str, Any]:
    args, _ = checked(registry, "refund_order", REFUND)
    async with mock_client(handler) as http:
        return dict(await spec_of(registry, "refund_order").execute(write_ctx(http, "op-m", "tok"), args))


async def test_executor_sends_the_digested_arguments_with_key_and_approval(registry: ToolRegistry) -> None:
    seen: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        created = {"event_id": "E-1", "calendar_id": "cal-u1", "title": "Call", "attendees": []}
        return httpx.Response(201, json={**created, "start": "2026-12-03T10:00:00Z", "end": "2026-12-03T11:00:00Z"})

    args, digested = checked(registry, "create_calendar_event", {**EVENT, "attendees": None, "title": " Call "})
    async with mock_client(capture) as http:
        await spec_of(registry, "create_calendar_event").execute(write_ctx(http, "op-1", "tok-1", "u3", "globex"), args)
    request = seen[0]
    assert (request.method, request.url.path) == ("POST", "/calendars/cal-u1/events")
    # The body is exactly the canonical arguments the approval's digest was taken over.
    assert (
        json.loads(request.content)
        == digested
        == {**EVENT, "start": "2026-12-03T10:00:00Z", "attendees": [], "title": "Call"}
    )
    headers = request.headers
    assert (headers["idempotency-key"], headers["x-approval-token"]) == ("op-1", "tok-1")
    assert (headers["x-actor-user"], headers["x-actor-tenant"]) == ("u3", "globex")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.ConnectError, WriteNotSent),
        (httpx.ConnectTimeout, WriteNotSent),
        (httpx.PoolTimeout, WriteNotSent),
        (httpx.ReadTimeout, WriteOutcomeUnknown),
        (httpx.WriteTimeout, WriteOutcomeUnknown),
        (httpx.RemoteProtocolError, WriteOutcomeUnknown),
        (httpx.ReadError, WriteOutcomeUnknown),
        (httpx.WriteError, WriteOutcomeUnknown),
    ],
)
async def test_transport_failures_are_not_sent_or_unknown(
    registry: ToolRegistry, error: type[httpx.TransportError], expected: type[Exception]
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise error("secret detail from /srv/app.py", request=request)

    with pytest.raises(expected) as info:
        await run_mocked(registry, fail)
    assert_clean(str(info.value))


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (problem(400, "IDEMPOTENCY_KEY_REQUIRED"), (ToolError, ResultCode.INTERNAL)),
        (problem(401, "ACTOR_REQUIRED"), (ToolError, ResultCode.FORBIDDEN)),
        (problem(403, "APPROVAL_REQUIRED", "the approval has expired"), (ToolError, "CONFIRMATION_REQUIRED")),
        (problem(404, "NOT_FOUND", "order A100 is not available"), (ToolError, ResultCode.NOT_AVAILABLE)),
        (problem(409, "STALE_VERSION", current_version=4), (ToolError, ResultCode.VERSION_CONFLICT)),
        (problem(409, "IN_PROGRESS"), (WriteInProgress, None)),
        (problem(409, "SOMETHING_ELSE"), (ToolError, ResultCode.CONFLICT)),
        (problem(422, "IDEMPOTENCY_KEY_REUSED"), (ToolError, ResultCode.IDEMPOTENCY_CONFLICT)),
        (problem(422, "NOT_REFUNDABLE", "amountCents: at most 1 cents are refundable"), (ToolError, "BAD_ARGUMENTS")),
        (problem(429, "TOO_MANY_REQUESTS"), (WriteOutcomeUnknown, None)),
        (httpx.Response(500, text="Traceback sqlite secret"), (WriteOutcomeUnknown, None)),
        (httpx.Response(502, text="bad gateway"), (WriteOutcomeUnknown, None)),
        (problem(503, "UNAVAILABLE"), (WriteOutcomeUnknown, None)),
        (httpx.Response(504, text=""), (WriteOutcomeUnknown, None)),
        (httpx.Response(418, text="Traceback /tmp/secret"), (WriteOutcomeUnknown, None)),
        (httpx.Response(201, text='{"refund_id": "R-1", "order_id'), (WriteOutcomeUnknown, None)),
        (httpx.Response(201, json={"refund_id": "sqlite secret"}), (WriteOutcomeUnknown, None)),
    ],
)
async def test_answers_are_sorted_without_passing_raw_bodies(
    registry: ToolRegistry, response: httpx.Response, expected: tuple[type[Exception], str | None]
) -> None:
    kind, code = expected
    with pytest.raises(kind) as info:
        await run_mocked(registry, lambda _: response)
    if code is not None:
        assert isinstance(info.value, ToolError) and info.value.code == code
    assert_clean(str(info.value))
    if response.status_code == 429:
        assert isinstance(info.value, WriteOutcomeUnknown) and info.value.retry_after_seconds == 4.0


# --- Status -------------------------------------------------------------------------------------------------


async def test_status_gives_the_executor_output_or_the_stored_refusal(
    registry: ToolRegistry, service: httpx.AsyncClient
) -> None:
    ctx = write_ctx(service, None, None)
    status = spec_of(registry, "append_ticket_note").status
    assert status is not None
    retention = {"retention_seconds": 86400.0}  # what the service declares
    assert (await status(ctx, "op-s")).model_dump() == {"state": "not_found", "output": None, **retention}
    _, out = await run_write(registry, service, "append_ticket_note", NOTE, "op-s")
    assert (await status(ctx, "op-s")).model_dump() == {"state": "completed", "output": out, **retention}
    with pytest.raises(ToolError) as refused:
        await run_write(registry, service, "append_ticket_note", {**NOTE, "text": "late"}, "op-stale")
    stored = await status(ctx, "op-stale")
    assert stored.state == "completed"
    assert stored.output == error_output(refused.value.code, refused.value.message)
    assert stored.output["code"] == ResultCode.VERSION_CONFLICT
    # Scoped to the actor: another user's status query does not see it.
    assert (await status(write_ctx(service, None, None, "u2"), "op-s")).state == "not_found"


@pytest.mark.parametrize(
    "handler",
    [
        lambda r: problem(503, "UNAVAILABLE"),
        lambda r: httpx.Response(500, text="Traceback"),
        lambda r: httpx.Response(200, text="{not json"),
        lambda r: httpx.Response(200, json={"state": "completed", "status_code": 409, "body": {"code": "IN_PROGRESS"}}),
        # Completed, but without the reply's status: unreadable, never "not found" (which says nothing was done).
        lambda r: httpx.Response(200, json={"state": "completed", "body": {"id": "N1"}, "retention_seconds": 86400}),
    ],
)
async def test_status_that_cannot_be_read_is_temporary(
    registry: ToolRegistry, handler: Callable[[httpx.Request], httpx.Response]
) -> None:
    status = spec_of(registry, "refund_order").status
    assert status is not None
    async with mock_client(handler) as http:
        with pytest.raises(ToolTemporaryError) as info:
            await status(write_ctx(http, None, None), "op-1")
    assert_clean(str(info.value))


async def test_status_transport_error_is_temporary(registry: ToolRegistry) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    status = spec_of(registry, "refund_order").status
    assert status is not None
    async with mock_client(refuse) as http:
        with pytest.raises(ToolTemporaryError):
            await status(write_ctx(http, None, None), "op-1")


# --- Read-backs ---------------------------------------------------------------------------------------------


async def read_back(
    registry: ToolRegistry, http: httpx.AsyncClient, name: str, args: BaseModel, output: dict[str, Any]
) -> Evidence:
    check = spec_of(registry, name).read_back
    assert check is not None
    return await check(write_ctx(http, None, None), args, output)


@pytest.mark.parametrize(
    ("name", "arguments", "id_field", "compared"),
    [
        ("append_ticket_note", NOTE, "note_id", {"text"}),
        ("create_calendar_event", EVENT, "event_id", {"calendar", "title", "start", "end", "attendees"}),
        ("refund_order", REFUND, "refund_id", {"amount", "reason", "to_account"}),
        ("refund_order", {**REFUND, "toAccount": "acct-u1-0002"}, "refund_id", {"amount", "reason", "to_account"}),
    ],
)
async def test_read_back_verifies_the_approved_state(
    registry: ToolRegistry,
    service: httpx.AsyncClient,
    name: str,
    arguments: dict[str, Any],
    id_field: str,
    compared: set[str],
) -> None:
    args, out = await run_write(registry, service, name, arguments, "op-rb")
    evidence = await read_back(registry, service, name, args, out)
    assert evidence.verified, evidence.detail
    assert set(evidence.checks) == compared
    assert all(evidence.checks[k] is True for k in compared)
    # The detail says where the effect was seen.
    assert evidence.detail.startswith("GET /") and out[id_field] in evidence.detail


@pytest.mark.parametrize(
    ("name", "arguments", "change", "differs"),
    [
        ("append_ticket_note", NOTE, {"text": "something else"}, "text"),
        ("create_calendar_event", EVENT, {"start": "2026-12-03T10:30:00Z"}, "start"),
        ("create_calendar_event", EVENT, {"attendees": ["ops@example.com"]}, "attendees"),
        ("create_calendar_event", EVENT, {"title": "Other"}, "title"),
        ("refund_order", REFUND, {"amountCents": 499}, "amount"),
        # No toAccount approved means the paying account: a refund that went elsewhere is not that one.
        ("refund_order", {**REFUND, "toAccount": "acct-u1-0002"}, {"toAccount": None}, "to_account"),
        ("refund_order", REFUND, {"toAccount": "acct-u1-0002"}, "to_account"),
    ],
)
async def test_read_back_of_a_different_state_is_not_verified(
    registry: ToolRegistry,
    service: httpx.AsyncClient,
    name: str,
    arguments: dict[str, Any],
    change: dict[str, Any],
    differs: str,
) -> None:
    _, out = await run_write(registry, service, name, arguments, "op-diff")
    approved, _ = checked(registry, name, {**arguments, **change})
    evidence = await read_back(registry, service, name, approved, out)
    assert not evidence.verified
    assert evidence.checks[differs] is False and differs in evidence.detail


async def test_attendees_compare_as_a_set_and_times_as_instants(
    registry: ToolRegistry, service: httpx.AsyncClient
) -> None:
    _, out = await run_write(registry, service, "create_calendar_event", EVENT, "op-set")
    same = {**EVENT, "attendees": list(reversed(EVENT["attendees"])), "start": "2026-12-03T10:00:00Z"}
    approved, _ = checked(registry, "create_calendar_event", same)
    assert (await read_back(registry, service, "create_calendar_event", approved, out)).verified


@pytest.mark.parametrize(
    ("name", "arguments", "fake"),
    [
        ("append_ticket_note", NOTE, {"note_id": "N-missing"}),
        ("create_calendar_event", EVENT, {"event_id": "E-missing"}),
        ("refund_order", REFUND, {"refund_id": "R-missing"}),
    ],
)
async def test_an_effect_not_visible_yet_is_evidence_not_yet_visible(
    registry: ToolRegistry, service: httpx.AsyncClient, name: str, arguments: dict[str, Any], fake: dict[str, str]
) -> None:
    args, out = await run_write(registry, service, name, arguments, "op-nv")
    with pytest.raises(EvidenceNotYetVisible):
        await read_back(registry, service, name, args, {**out, **fake})


async def test_read_back_failures(registry: ToolRegistry) -> None:
    args, _ = checked(registry, "refund_order", REFUND)
    output = {"ok": True, "refund_id": "R-1", "order_id": "A100", "amount_cents": 500, "reason": "damaged box"}
    output |= {"refunded_cents": 500, "refundable_cents": 1, "created_at": "2026-01-01T00:00:00Z"}
    output |= {"to_account": "acct-u1-0001"}

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("reset", request=request)

    for handler in (reset, lambda r: httpx.Response(503, text="x")):
        async with mock_client(handler) as http:
            with pytest.raises(ToolTemporaryError):
                await read_back(registry, http, "refund_order", args, output)
    async with mock_client(lambda r: problem(401, "ACTOR_REQUIRED")) as http:
        refused = await read_back(registry, http, "refund_order", args, output)
    assert not refused.verified and "FORBIDDEN" in refused.detail
    async with mock_client(lambda r: httpx.Response(200, json={"refunds": []})) as http:
        unreadable = await read_back(registry, http, "refund_order", args, {"ok": True})
    assert not unreadable.verified
