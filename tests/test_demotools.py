"""Tests of the demo tools: strict schemas, call validation, and executors against the service over ASGI."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from demo.bizservice.app import create_app
from demo.bizservice.seed import SEED_FACTS
from demo.tools import PROBLEM_CODES, demo_tools
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import Actor, FunctionCallItem
from toolloop._core.registry import ToolContext, ToolError, ToolRegistry, ToolTemporaryError, strict_schema_problems
from toolloop._core.validation import check_call
from toolloop._tools.http import default_actor_headers, read_answer

ADMIN = {"X-Admin-Token": "t"}
FREE_SLOTS_ARGS = '{"calendarId":"cal-u1","from":"2026-12-01T00:00:00Z","to":"2026-12-02T00:00:00+00:00"}'
LEAK_MARKERS = ("Traceback", "sqlite", "SELECT", ".py", "/tmp", "/work", "secret")


@pytest.fixture
def registry() -> ToolRegistry:
    return demo_tools("http://svc").registry


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(tmp_path / "biz.db", admin_token="t")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as client:
        yield client


def ctx_for(http: httpx.AsyncClient, user_id: str = "u1", tenant_id: str = "acme") -> ToolContext:
    actor = Actor(user_id=user_id, tenant_id=tenant_id)
    return ToolContext(actor=actor, http=http, workflow_id="wf-1", call_id="c1", headers=default_actor_headers(actor))


def call(name: str, arguments: str) -> FunctionCallItem:
    return FunctionCallItem(call_id="c1", name=name, arguments=arguments)


async def run(registry: ToolRegistry, ctx: ToolContext, name: str, arguments: str) -> dict[str, Any]:
    """Validate like the loop does, then run the executor on the parsed arguments."""
    spec = registry.get(name)
    assert spec is not None
    args = spec.schema.check(arguments)
    return spec.output_of(await spec.execute(ctx, args))


def assert_clean(text: str) -> None:
    for marker in LEAK_MARKERS:
        assert marker not in text


# --- Schemas and validation ------------------------------------------------------------------------------


def test_every_tool_has_a_strict_schema(registry: ToolRegistry) -> None:
    # The side-effecting tools follow the read-only ones (tests/test_demotools_writes.py covers them).
    assert registry.names()[:4] == ["get_order_status", "list_my_orders", "get_ticket", "find_free_slots"]
    for name in registry.names():
        spec = registry.get(name)
        assert spec is not None and spec.read_only == (name in registry.names()[:4])
        assert isinstance(spec.arguments, type) and strict_schema_problems(spec.arguments) == []
        params = spec.definition()["parameters"]
        assert params["additionalProperties"] is False
        assert all("description" in prop for prop in params["properties"].values())
    props = registry.get("find_free_slots").definition()["parameters"]["properties"]  # type: ignore[union-attr]
    assert list(props) == ["calendarId", "from", "to"]


@pytest.mark.parametrize(
    ("name", "arguments", "code", "needle"),
    [
        ("list_my_orders", '{"page":1,"pageSize":5,"userId":"u2"}', "BAD_ARGUMENTS", "userId"),
        ("get_order_status", '{"orderId":"A100","userId":"u2"}', "BAD_ARGUMENTS", "userId"),
        ("list_my_orders", '{"page":null,"pageSize":"20"}', "BAD_ARGUMENTS", "pageSize"),
        ("list_my_orders", '{"page":null,"pageSize":101}', "BAD_ARGUMENTS", "pageSize"),
        ("list_my_orders", '{"page":0,"pageSize":null}', "BAD_ARGUMENTS", "page"),
        ("get_order_status", "{}", "BAD_ARGUMENTS", "orderId: is required"),
        ("get_order_status", '{"orderId":"B100"}', "BAD_ARGUMENTS", "orderId"),
        ("get_ticket", '{"ticketId":"T12"}', "BAD_ARGUMENTS", "ticketId"),
        (
            "find_free_slots",
            '{"calendarId":"cal-u1","from_":"2026-12-01T00:00:00Z","to":"2026-12-02T00:00:00Z"}',
            "BAD_ARGUMENTS",
            "from_",
        ),
        ("get_order_status", "null", "BAD_JSON", "null"),
        ("get_order_status", "[]", "BAD_JSON", "array"),
        ("get_order_status", "42", "BAD_JSON", "number"),
        ("get_order_status", '{"orderId":', "BAD_JSON", "not valid JSON"),
    ],
)
def test_check_call_rejects_bad_arguments(
    registry: ToolRegistry, name: str, arguments: str, code: str, needle: str
) -> None:
    checked = check_call(registry, call(name, arguments))
    assert checked.arguments is None and checked.rejection is not None
    assert checked.rejection["code"] == code
    assert needle in checked.rejection["message"]


def test_find_free_slots_arguments_validate_strictly_by_alias(registry: ToolRegistry) -> None:
    spec = registry.get("find_free_slots")
    assert spec is not None
    args = spec.schema.check(FREE_SLOTS_ARGS)
    checked = check_call(registry, call("find_free_slots", FREE_SLOTS_ARGS))
    assert checked.rejection is None
    assert checked.summary == "find_free_slots cal-u1 2026-12-01"
    # The checked arguments keep the model's names, so they validate again unchanged.
    assert checked.arguments == {"calendarId": "cal-u1", "from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z"}
    assert spec.schema.load(checked.arguments) == args


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ('{"calendarId":"cal-u1","from":"2026-12-01T00:00:00","to":"2026-12-02T00:00:00Z"}', "from"),
        ('{"calendarId":"cal-u1","from":"2026-12-01T00:00:00Z","to":"2026-12-15T00:00:01Z"}', "14 days"),
        ('{"calendarId":"cal-u1","from":"2026-12-02T00:00:00Z","to":"2026-12-01T00:00:00Z"}', "later than"),
        ('{"calendarId":"cal_u1","from":"2026-12-01T00:00:00Z","to":"2026-12-02T00:00:00Z"}', "calendarId"),
    ],
)
def test_find_free_slots_rejects_naive_times_and_bad_ranges(
    registry: ToolRegistry, arguments: str, needle: str
) -> None:
    checked = check_call(registry, call("find_free_slots", arguments))
    assert checked.rejection is not None and checked.rejection["code"] == "BAD_ARGUMENTS"
    assert needle in checked.rejection["message"]


def test_summaries_are_short_labels(registry: ToolRegistry) -> None:
    assert check_call(registry, call("get_order_status", '{"orderId":"A100"}')).summary == "get_order_status A100"
    assert check_call(registry, call("list_my_orders", '{"page":null,"pageSize":null}')).summary == (
        "list_my_orders page 1"
    )


# --- Executors against the real service (ASGI) -------------------------------------------------------


async def test_get_order_status_returns_selected_fields(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    out = await run(registry, ctx_for(service), "get_order_status", '{"orderId":"A100"}')
    facts = SEED_FACTS["order_a100"]
    assert out["ok"] is True
    assert (out["order_id"], out["status"], out["carrier"], out["tracking_number"]) == (
        "A100",
        facts["status"],
        facts["carrier"],
        facts["tracking_number"],
    )
    assert (out["total_cents"], out["currency"], len(out["items"])) == (facts["total_cents"], "EUR", facts["items"])
    # What an approval policy reads of it (config/policies/demo.cedar).
    assert (out["paid_from"], out["late"], out["refundable_cents"]) == (facts["paid_from"], True, facts["total_cents"])
    assert out["promised_by"] == facts["promised_by"]


async def test_not_yours_and_missing_give_the_same_not_available(
    registry: ToolRegistry, service: httpx.AsyncClient
) -> None:
    errors = []
    for user, order_id in [("u1", "A999"), ("u2", "A100"), ("u3", "A100")]:
        with pytest.raises(ToolError) as info:
            await run(
                registry,
                ctx_for(service, user, "globex" if user == "u3" else "acme"),
                "get_order_status",
                json.dumps({"orderId": order_id}),
            )
        errors.append((info.value.code, info.value.message.replace(order_id, "<id>")))
    assert errors[0][0] == ResultCode.NOT_AVAILABLE
    assert errors[0] == errors[1] == errors[2]


async def test_identity_comes_from_the_context(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    out = await run(registry, ctx_for(service, "u2"), "get_order_status", '{"orderId":"A101"}')
    assert out["order_id"] == "A101"
    with pytest.raises(ToolError):
        await run(registry, ctx_for(service, "u1"), "get_order_status", '{"orderId":"A101"}')


async def test_list_my_orders_applies_defaults(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    first = await run(registry, ctx_for(service), "list_my_orders", '{"page":null,"pageSize":null}')
    second = await run(registry, ctx_for(service), "list_my_orders", '{"page":2,"pageSize":null}')
    assert (first["page"], first["page_size"], len(first["orders"]), first["has_more"]) == (1, 20, 20, True)
    assert (len(second["orders"]), second["has_more"]) == (SEED_FACTS["order_counts"]["u1"] - 20, False)


async def test_get_ticket_and_find_free_slots(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    ticket = await run(registry, ctx_for(service), "get_ticket", '{"ticketId":"T1001"}')
    assert (ticket["subject"], ticket["version"], len(ticket["notes"])) == ("Package arrived damaged", 1, 1)
    assert ticket["owner"] == "u1"  # only its owner can read it
    slots = await run(registry, ctx_for(service), "find_free_slots", FREE_SLOTS_ARGS)
    assert [(s["start"], s["end"]) for s in slots["slots"]] == [tuple(s) for s in SEED_FACTS["cal_u1_free_2026_12_01"]]
    assert (slots["from"], slots["to"], slots["truncated"]) == ("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z", False)
    with pytest.raises(ToolError) as info:
        await run(registry, ctx_for(service), "find_free_slots", FREE_SLOTS_ARGS.replace("cal-u1", "cal-u2"))
    assert info.value.code == ResultCode.NOT_AVAILABLE


async def test_503_fault_is_a_temporary_error(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    rule = {"method": "GET", "path_regex": "^/orders/A100$", "status": 503, "times": 1}
    await service.put("/admin/faults", json={"rules": [rule]}, headers=ADMIN)
    with pytest.raises(ToolTemporaryError):
        await run(registry, ctx_for(service), "get_order_status", '{"orderId":"A100"}')
    assert (await run(registry, ctx_for(service), "get_order_status", '{"orderId":"A100"}'))["ok"] is True


async def test_429_fault_carries_retry_after(registry: ToolRegistry, service: httpx.AsyncClient) -> None:
    await service.put("/admin/faults", json={"rules": [{"path_regex": "^/tickets/", "status": 429}]}, headers=ADMIN)
    with pytest.raises(ToolTemporaryError) as info:
        await run(registry, ctx_for(service), "get_ticket", '{"ticketId":"T1001"}')
    assert info.value.retry_after_seconds == 1.0


# --- Response mapping at the seam (httpx.MockTransport) ------------------------------------------------


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://svc")


def problem(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"type": "about:blank", "title": "x", "status": status, "code": code, "detail": detail}
    return httpx.Response(status, json=body, headers=headers)


async def test_transport_errors_are_temporary(registry: ToolRegistry) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused to /srv/secret", request=request)

    def time_out(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    for handler in (refuse, time_out):
        async with mock_client(handler) as http:
            with pytest.raises(ToolTemporaryError) as info:
                await run(registry, ctx_for(http), "get_order_status", '{"orderId":"A100"}')
            assert_clean(str(info.value))


async def test_executor_sends_actor_headers_only(registry: ToolRegistry) -> None:
    seen: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return problem(404, "NOT_FOUND", "order A100 is not available")

    async with mock_client(capture) as http:
        with pytest.raises(ToolError):
            await run(registry, ctx_for(http, "u3", "globex"), "get_order_status", '{"orderId":"A100"}')
    [request] = seen
    assert (request.headers["x-actor-user"], request.headers["x-actor-tenant"]) == ("u3", "globex")
    assert request.url.path == "/orders/A100"
    # Identity travels in the two actor headers only: not in the URL, not in any other header.
    query = request.url.query.decode()
    assert not any(word in query for word in ("u3", "globex", "user", "tenant")), query
    assert {k for k, v in request.headers.items() if "u3" in v or "globex" in v} == {"x-actor-user", "x-actor-tenant"}
    # A read carries no write headers.
    assert "idempotency-key" not in request.headers and "x-approval-token" not in request.headers


class _Echo(BaseModel):
    value: int


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            problem(422, "INVALID_REQUEST", "page_size: Input should be less than or equal to 100"),
            (ToolError, ResultCode.BAD_ARGUMENTS),
        ),
        (problem(401, "ACTOR_REQUIRED", "headers required"), (ToolError, ResultCode.FORBIDDEN)),
        (problem(403, "ADMIN_ONLY", "no"), (ToolError, ResultCode.FORBIDDEN)),
        (problem(409, "STALE_VERSION", "v"), (ToolError, ResultCode.VERSION_CONFLICT)),
        (problem(409, "CONFLICT", "c"), (ToolError, ResultCode.CONFLICT)),
        (
            problem(404, "NOT_FOUND", "SELECT * FROM orders /work/main/secret"),
            (ToolError, ResultCode.NOT_AVAILABLE),
        ),
        (
            httpx.Response(500, text='Traceback (most recent call last): File "/work/app.py" sqlite3 secret'),
            (ToolTemporaryError, None),
        ),
        (httpx.Response(502, text="bad gateway"), (ToolTemporaryError, None)),
        (httpx.Response(418, text="Traceback /tmp/secret"), (ToolError, ResultCode.INTERNAL)),
        (httpx.Response(200, text="Traceback /tmp/secret.py"), (ToolError, ResultCode.INTERNAL)),
        (httpx.Response(200, json={"value": "sqlite secret"}), (ToolError, ResultCode.INTERNAL)),
    ],
)
def test_read_answer_never_passes_raw_bodies(
    response: httpx.Response, expected: tuple[type, ResultCode | None]
) -> None:
    kind, code = expected
    with pytest.raises(kind) as info:
        read_answer(response, _Echo, not_available="thing X is not available", codes=PROBLEM_CODES)
    if code is not None:
        assert isinstance(info.value, ToolError) and info.value.code == code
    assert_clean(str(info.value))


def test_read_answer_passes_validation_detail_and_retry_after() -> None:
    with pytest.raises(ToolError) as bad:
        read_answer(
            problem(422, "INVALID_REQUEST", "page_size: Input should be less than or equal to 100"),
            _Echo,
            not_available="n/a",
        )
    assert bad.value.message == "page_size: Input should be less than or equal to 100"
    with pytest.raises(ToolTemporaryError) as busy:
        read_answer(problem(429, "TOO_MANY_REQUESTS", "slow down", {"Retry-After": "7"}), _Echo, not_available="n/a")
    assert busy.value.retry_after_seconds == 7.0
    with pytest.raises(ToolTemporaryError) as dated:
        read_answer(
            problem(503, "UNAVAILABLE", "x", {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}),
            _Echo,
            not_available="n/a",
        )
    assert dated.value.retry_after_seconds is None
    ok = read_answer(httpx.Response(200, json={"value": 3, "extra": "dropped"}), _Echo, not_available="n/a")
    assert ok == _Echo(value=3)
