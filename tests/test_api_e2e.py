"""End to end over real HTTP: the API process (`starter.py serve`) against the real stack (the session's dev
server and business service, a worker with the demo's tools). Judged by what a client sees (status codes,
problem+json codes, events) and by the service's own effect table."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from temporalio.client import Client

import toolloop
from demo.agent import build as build_demo
from devstack.processes import free_port, start_api
from tests.agent_helpers import assert_eventually, effects, service_requests
from tests.api_helpers import (
    U1,
    U1_GLOBEX,
    U2,
    Api,
    assert_problem,
    demo_tool_names,
    pending_operation,
    running_api,
    worker_settings,
)
from tests.conftest import APPROVAL_KEY, REPO_ROOT, BusinessService, TemporalServer
from toolloop import Actor
from toolloop._api.app import ApiConfig, create_app
from toolloop._api.limits import ApiLimits
from toolloop._api.tokens import TokenMap
from toolloop._core.contracts import AgentInput, ApprovalRequest, ModelSpec
from toolloop._core.names import AGENT_WORKFLOW
from toolloop._temporal.client import ToolloopClient, ToolloopRequest
from toolloop._temporal.requests import request_search_attributes, request_workflow_id
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

READ = "Where is my order A100?"
WRITE = "Refund 5 EUR on order A100 because it arrived late"


@pytest.fixture(scope="module")
async def api(
    temporal_server: TemporalServer, business_service: BusinessService, client: Client, tmp_path_factory: Any
) -> AsyncIterator[Api]:
    """One API process and one worker for this module's requests, on a task queue of their own."""
    async with running_api(temporal_server, business_service, client, tmp_path_factory) as started:
        yield started


@pytest.fixture
async def http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as c:
        yield c


def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


async def submit(
    http: httpx.AsyncClient, question: str, headers: dict[str, str], idem: str | None = None
) -> httpx.Response:
    extra = {"Idempotency-Key": idem} if idem is not None else {}
    return await http.post("/v1/requests", json={"question": question}, headers={**headers, **extra})


async def finished(http: httpx.AsyncClient, request_id: str, headers: dict[str, str] = U1) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def done() -> bool:
        found.update((await http.get(f"/v1/requests/{request_id}", headers=headers)).json())
        return found.get("status") not in (None, "running")

    await assert_eventually(done, within=60, what=f"request {request_id} finished")
    return found


# --- Auth and scoping ----------------------------------------------------------------------------------------


async def test_a_missing_or_wrong_token_is_401_and_a_valid_one_says_who(http: httpx.AsyncClient) -> None:
    assert_problem(await http.get("/v1/me"), 401, "UNAUTHORIZED")
    assert_problem(
        await http.get("/v1/me", headers={"Authorization": "Bearer not-a-token-at-all"}), 401, "UNAUTHORIZED"
    )
    assert_problem(await http.get("/v1/requests", headers={"Authorization": "Basic dTE6eA=="}), 401, "UNAUTHORIZED")
    # The demo's tokens list no models: every model the API knows is theirs, and its default.
    models = {"models": ["offline", "script"], "default_model": "offline", "roles": []}
    assert (await http.get("/v1/me", headers=U1)).json() == {"user_id": "u1", "tenant_id": "acme", **models}
    assert (await http.get("/v1/me", headers=U1_GLOBEX)).json() == {"user_id": "u1", "tenant_id": "globex", **models}
    # A manager's token carries its role (config/api_tokens.json): what an approval policy may let decide.
    manager = (await http.get("/v1/me", headers={"Authorization": "Bearer demo-token-m1-acme-0005"})).json()
    assert (manager["user_id"], manager["roles"]) == ("m1", ["manager"])


async def test_another_users_or_tenants_request_is_answered_like_a_missing_one(http: httpx.AsyncClient) -> None:
    request_id, missing_id = key(), key()
    mine = await submit(http, READ, U1, request_id)
    assert mine.status_code == 201
    await finished(http, request_id)
    answers = [await http.get(f"/v1/requests/{request_id}", headers=who) for who in (U2, U1_GLOBEX)]
    missing = await http.get(f"/v1/requests/{missing_id}", headers=U2)
    for answer in [*answers, missing]:
        assert_problem(answer, 404, "NOT_FOUND")
    # Byte for byte the same answer once the asked-for id is swapped: nothing tells "someone else's" apart.
    swapped = missing.content.replace(missing_id.encode(), request_id.encode())
    assert answers[0].content == answers[1].content == swapped
    events = await http.get(f"/v1/requests/{request_id}/events", headers=U2)
    assert_problem(events, 404, "NOT_FOUND")
    # The same id from another tenant is another request: it starts its own workflow.
    other = await submit(http, READ, U1_GLOBEX, request_id)
    assert other.status_code == 201 and other.json()["id"] == request_id
    assert other.json()["workflow_id"] != mine.json()["workflow_id"]
    listed = (await http.get("/v1/requests", headers=U2)).json()["requests"]
    assert request_id not in [r["id"] for r in listed]


# --- Idempotent submission -------------------------------------------------------------------------------------


async def test_the_same_key_and_body_is_the_same_request_also_after_it_finished(
    http: httpx.AsyncClient, client: Client
) -> None:
    request_id = key()
    first = await submit(http, READ, U1, request_id)
    assert first.status_code == 201 and first.headers["location"] == f"/v1/requests/{request_id}"
    again = await submit(http, READ, U1, request_id)
    assert again.status_code == 200 and again.json()["workflow_id"] == first.json()["workflow_id"]
    # The answer that attached names the request as the first did, and created nothing: no Location.
    assert again.json()["id"] == request_id and "location" not in again.headers
    assert again.json()["started_at"] == first.json()["started_at"]
    view = await finished(http, request_id)
    after = await submit(http, READ, U1, request_id)
    assert after.status_code == 200 and after.json()["workflow_id"] == first.json()["workflow_id"]
    assert after.json()["status"] == "completed" and view["stop_reason"] == "final_answer"
    other = await submit(http, "Where is my order A101?", U1, request_id)
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{first.json()["workflow_id"]}"')]
    assert len(runs) == 1


async def test_two_identical_posts_at_once_make_one_workflow(http: httpx.AsyncClient, client: Client) -> None:
    request_id = key()
    answers = await asyncio.gather(*(submit(http, READ, U1, request_id) for _ in range(4)))
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201]
    assert len({a.json()["workflow_id"] for a in answers}) == 1
    workflow_id = request_workflow_id(Actor(user_id="u1", tenant_id="acme"), request_id)
    await finished(http, request_id)
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id}"')]
    assert len(runs) == 1


async def test_the_callers_requests_are_listed_with_paging(http: httpx.AsyncClient) -> None:
    ids = [key() for _ in range(3)]
    for request_id in ids:
        assert (await submit(http, READ, U2, request_id)).status_code == 201

    async def all_listed() -> bool:
        seen: list[str] = []
        token = None
        for _ in range(10):
            params = {"page_size": 2, **({"page_token": token} if token else {})}
            page = (await http.get("/v1/requests", headers=U2, params=params)).json()
            assert len(page["requests"]) <= 2
            seen += [r["id"] for r in page["requests"]]
            token = page["next_page_token"]
            if token is None:
                break
        return set(ids) <= set(seen)

    await assert_eventually(all_listed, within=30, what="the three requests are listed (visibility is eventual)")


async def test_a_page_token_the_api_did_not_give_the_caller_is_422_at_once(http: httpx.AsyncClient) -> None:
    for _ in range(2):
        assert (await submit(http, READ, U2, key())).status_code == 201
    first: dict[str, Any] = {}

    async def two_pages() -> bool:
        first.update((await http.get("/v1/requests", headers=U2, params={"page_size": 1})).json())
        return first.get("next_page_token") is not None

    await assert_eventually(two_pages, within=30, what="two requests listed")
    token = first["next_page_token"]
    # The page holds what it says: one request, and a token for the next page.
    assert len(first["requests"]) == 1
    assert (await http.get("/v1/requests", headers=U2, params={"page_token": token})).status_code == 200
    # (A forged value that happens to be the token itself - its last two characters "AA" - is not a forgery.)
    for forged in {"7b7d", "00", token[:-2] + "AA", token.split(".")[0], "not a token"} - {token}:
        answer = await http.get("/v1/requests", headers=U2, params={"page_token": forged})
        assert_problem(answer, 422, "INVALID_REQUEST")
    # Another caller's token is not theirs to use.
    assert_problem(await http.get("/v1/requests", headers=U1, params={"page_token": token}), 422, "INVALID_REQUEST")


async def test_requests_started_elsewhere_are_listed_and_a_fresh_post_says_when_it_started(
    http: httpx.AsyncClient, client: Client, api: Api
) -> None:
    request_id = key()
    created = await submit(http, READ, U1_GLOBEX, request_id)
    assert created.status_code == 201 and created.json()["started_at"] is not None
    # Without an Idempotency-Key, the request's id shows the question in the UI's default list.
    unnamed = (await submit(http, READ, U1_GLOBEX)).json()
    assert unnamed["id"].startswith("where-is-my-order-a100-") and unnamed["id"] in unnamed["workflow_id"]
    # A request started by a client that records no memo (as the chaos runner does): listed all the same.
    actor = Actor(user_id="u1", tenant_id="globex")
    other = key()
    await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(request=READ, actor=actor, model=ModelSpec(provider="offline")),
        id=request_workflow_id(actor, other),
        task_queue=api.task_queue,
        search_attributes=request_search_attributes(actor),
    )

    async def both_listed() -> bool:
        page = (await http.get("/v1/requests", headers=U1_GLOBEX, params={"page_size": 100})).json()
        return {request_id, other} <= {r["id"] for r in page["requests"]}

    await assert_eventually(both_listed, within=30, what="both requests listed")


# --- Decisions -----------------------------------------------------------------------------------------------


async def test_only_the_requests_user_with_the_right_digest_decides_and_then_it_is_done_once(
    http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    request_id = key()
    assert (await submit(http, WRITE, U1, request_id)).status_code == 201
    op = await pending_operation(http, request_id, U1)
    path = f"/v1/requests/{request_id}/operations/{op['operation_id']}"
    payload = (await http.get(path, headers=U1)).json()  # the whole payload the digest covers
    assert payload["arguments"] == {
        "orderId": "A100",
        "amountCents": 500,
        "reason": "it arrived late",
        "toAccount": None,
    }
    assert payload["target"] == "POST /orders/A100/refunds" and payload["digest"] == op["digest"]
    approve = {"decision": "approve", "digest": op["digest"]}
    assert_problem(await http.post(f"{path}/decision", json=approve, headers=U2), 404, "NOT_FOUND")
    assert_problem(await http.post(f"{path}/decision", json=approve, headers=U1_GLOBEX), 404, "NOT_FOUND")
    wrong = {"decision": "approve", "digest": "sha256:" + "0" * 64}
    assert_problem(await http.post(f"{path}/decision", json=wrong, headers=U1), 409, "DIGEST_MISMATCH")
    decided = await http.post(f"{path}/decision", json=approve, headers=U1)
    assert decided.status_code == 200 and decided.json()["state"] == "approved"
    assert decided.json()["approval"]["by"] == "u1 via api"
    assert_problem(await http.post(f"{path}/decision", json=approve, headers=U1), 409, "NOT_PENDING")
    view = await finished(http, request_id)
    assert [o["state"] for o in view["operations"]] == ["verified"] and view["outcome"] == "answered"
    # The workflow's own record of the decision names the user and the channel that signed it.
    recorded = view["operations"][0]["approval"]
    assert (recorded["decision"], recorded["by"]) == ("approved", "u1 via api")
    assert len(await effects(admin, op["operation_id"])) == 1
    # A decision once the request has ended: 409 at once, never "Temporal unavailable, try again".
    late = await http.post(f"{path}/decision", json=approve, headers=U1)
    assert_problem(late, 409, "REQUEST_FINISHED")


async def test_a_rejection_is_recorded_and_nothing_is_done(http: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
    request_id = key()
    assert (await submit(http, WRITE, U1, request_id)).status_code == 201
    op = await pending_operation(http, request_id, U1)
    path = f"/v1/requests/{request_id}/operations/{op['operation_id']}/decision"
    rejected = await http.post(path, json={"decision": "reject", "digest": op["digest"]}, headers=U1)
    assert rejected.status_code == 200 and rejected.json()["state"] == "denied"
    view = await finished(http, request_id)
    assert [o["state"] for o in view["operations"]] == ["denied"] and view["outcome"] == "not_done"
    recorded = view["operations"][0]["approval"]
    assert (recorded["decision"], recorded["by"]) == ("rejected", "u1 via api")
    assert await effects(admin, op["operation_id"]) == []


async def test_a_request_given_only_some_tools_gets_forbidden_for_the_others(
    http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    # The offline model proposes the refund; this request was given reads only.
    request_id = key()
    body = {"question": WRITE, "tools": ["get_order_status", "list_my_orders"]}
    created = await http.post("/v1/requests", json=body, headers={**U1, "Idempotency-Key": request_id})
    assert created.status_code == 201
    view = await finished(http, request_id)
    assert view["operations"] == []
    assert [(c["tool"], c["ok"], c["code"]) for c in view["calls"]] == [("refund_order", False, "FORBIDDEN")]
    # The same key with another tool list is another request: refused.
    other = {"question": WRITE, "tools": ["get_order_status"]}
    again = await http.post("/v1/requests", json=other, headers={**U1, "Idempotency-Key": request_id})
    assert_problem(again, 422, "IDEMPOTENCY_KEY_REUSED")
    assert await service_requests(admin, "/orders/A100/refunds") == []


# --- Events --------------------------------------------------------------------------------------------------


async def read_events(http: httpx.AsyncClient, request_id: str, last_event_id: str | None = None) -> list[Any]:
    headers = {**U1, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    events = []
    async with aconnect_sse(http, "GET", f"/v1/requests/{request_id}/events", headers=headers) as source:
        async for sse in source.aiter_sse():
            events.append(sse)
            if sse.event == "final":
                break
    return events


async def test_events_are_complete_in_order_and_resumable(http: httpx.AsyncClient) -> None:
    request_id = key()
    assert (await submit(http, WRITE, U1, request_id)).status_code == 201
    op = await pending_operation(http, request_id, U1)
    path = f"/v1/requests/{request_id}/operations/{op['operation_id']}/decision"
    assert (await http.post(path, json={"decision": "approve", "digest": op["digest"]}, headers=U1)).status_code == 200
    events = await read_events(http, request_id)
    seqs = [int(e.id) for e in events]
    assert seqs == list(range(1, len(events) + 1))
    kinds = [e.event for e in events]
    for kind in ("phase", "tool_started", "approval_needed", "operation", "tool_finished", "final"):
        assert kind in kinds, kinds
    states = [json.loads(e.data)["data"]["state"] for e in events if e.event == "operation"]
    assert states[0] == "awaiting_approval" and states[-1] == "verified" and "sent" in states
    finished_tool = next(json.loads(e.data)["data"] for e in events if e.event == "tool_finished")
    assert (finished_tool["tool"], finished_tool["ok"]) == ("refund_order", True)
    final = json.loads(events[-1].data)["data"]
    assert (final["status"], final["stop_reason"]) == ("completed", "final_answer")
    # Reconnecting after event 3 gives exactly what came after it.
    resumed = await read_events(http, request_id, last_event_id="3")
    assert [int(e.id) for e in resumed] == seqs[3:]
    assert [e.data for e in resumed] == [e.data for e in events[3:]]
    # A Last-Event-ID that is a digit to Python but no number ("²", latin-1 in a header) was a 500: it is no id.
    async with aconnect_sse(
        http, "GET", f"/v1/requests/{request_id}/events", headers={**U1, "Last-Event-ID": b"\xb2"}
    ) as odd:
        assert odd.response.status_code == 200
        assert [int(e.id) async for e in odd.aiter_sse()] == seqs


async def test_a_terminated_request_keeps_its_writes_in_view_and_its_stream_says_it_ended(
    http: httpx.AsyncClient, client: Client
) -> None:
    """An operator terminates a request while its refund waits for approval. The request said "terminated" with
    no operations (the report is gone, but the workflow's ledger answers a closed run too), and its event stream
    never ended: it asked again every 0.3 s for an hour, waiting for a final event that cannot come."""
    request_id = key()
    created = await submit(http, WRITE, U1, request_id)
    assert created.status_code == 201
    waiting = await pending_operation(http, request_id, U1)
    await client.get_workflow_handle(created.json()["workflow_id"]).terminate("an operator stops it")
    view = (await http.get(f"/v1/requests/{request_id}", headers=U1)).json()
    # Its refund as it was left (never sent: not done, and no longer waiting), and the outcome by ask's rule.
    assert (view["status"], view["phase"], view["outcome"]) == ("terminated", "finished: terminated", "failed")
    assert [(op["operation_id"], op["state"], op["note"]) for op in view["operations"]] == [
        (waiting["operation_id"], "expired", "the request stopped before it was sent")
    ]
    assert [c["tool"] for c in view["calls"]] == [] and view["rounds"] == 1

    # In the list, its outcome is not "running" (what its search attribute still says): not known there.
    async def listed_closed() -> bool:
        page = (await http.get("/v1/requests", headers=U1, params={"page_size": 100})).json()
        mine = [r for r in page["requests"] if r["id"] == request_id]
        return bool(mine) and mine[0]["status"] == "terminated" and mine[0]["outcome"] is None

    await assert_eventually(listed_closed, within=60, what="the list shows the request closed, outcome not known")

    async def stream() -> list[Any]:
        async with aconnect_sse(http, "GET", f"/v1/requests/{request_id}/events", headers=U1) as source:
            return [sse async for sse in source.aiter_sse()]

    events = await asyncio.wait_for(stream(), 60)
    assert [e.event for e in events].count("error") == 1
    assert events[-1].event == "error" and json.loads(events[-1].data)["code"] == "ENDED_WITHOUT_REPORT"
    assert "approval_needed" in [e.event for e in events]


async def test_a_decision_no_worker_confirms_is_503_unconfirmed_and_sending_it_again_is_the_same_decision(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    admin: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decision whose Update Temporal takes while no worker runs (a deploy): the API waited without end, or
    answered a 500 the web page read as "not recorded" although the approval may still be applied. Forced
    interleaving: the API's check of the pending operation reads it as it was just before the worker stopped.
    The API runs in this process (the same code as `starter.py serve`), with a 2 s wait for a confirmation."""
    task_queue = f"unconfirmed-{uuid.uuid4().hex[:8]}"
    config = ApiConfig(
        task_queue=task_queue,
        tokens=TokenMap.load(REPO_ROOT / "config" / "api_tokens.json"),
        signing_key=APPROVAL_KEY,
        limits=ApiLimits(create_rate="1000/minute", max_active_requests=1000, change_wait_seconds=2),
    )
    transport = httpx.ASGITransport(app=create_app(client, config))
    settings = worker_settings(temporal_server, task_queue)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test", timeout=60) as here:
        request_id = key()
        async with running_worker(client, settings, build_demo(business_service.url)):
            assert (await submit(here, WRITE, U1, request_id)).status_code == 201
            op = await pending_operation(here, request_id, U1)
            mine = ToolloopClient(client, task_queue=task_queue).request(
                request_id, actor=Actor(user_id="u1", tenant_id="acme")
            )
            before = await mine.approval(op["operation_id"])

        async def as_read_before(self: ToolloopRequest, operation_id: str) -> ApprovalRequest | None:
            return before

        monkeypatch.setattr(ToolloopRequest, "approval", as_read_before)
        path = f"/v1/requests/{request_id}/operations/{op['operation_id']}/decision"
        decided = await here.post(path, json={"decision": "approve", "digest": op["digest"]}, headers=U1)
        body = assert_problem(decided, 503, "UNCONFIRMED")
        assert "may still be applied" in body["detail"]
        monkeypatch.undo()
        # A worker again: the decision Temporal held is applied, or the same decision sent again is; once.
        async with running_worker(client, settings, build_demo(business_service.url)):

            async def settled() -> bool:
                view = (await here.get(f"/v1/requests/{request_id}", headers=U1)).json()
                states = [o["state"] for o in view["operations"]]
                if states == ["awaiting_approval"]:
                    again = await here.post(path, json={"decision": "approve", "digest": op["digest"]}, headers=U1)
                    assert again.status_code in (200, 409), again.text
                return bool(view["status"] == "completed")

            await assert_eventually(settled, within=120, what="the approved refund ran")
            view = (await here.get(f"/v1/requests/{request_id}", headers=U1)).json()
    assert [o["state"] for o in view["operations"]] == ["verified"]
    assert len(await effects(admin, op["operation_id"])) == 1


# --- Bad input -----------------------------------------------------------------------------------------------


async def test_bad_input_is_problem_json_with_a_clear_code_never_a_500(http: httpx.AsyncClient) -> None:
    headers = {**U1, "Content-Type": "application/json"}
    bad_json = await http.post("/v1/requests", content=b'{"question": "x",', headers=headers)
    assert "json" in assert_problem(bad_json, 422, "INVALID_REQUEST")["detail"].lower()
    unknown = await http.post("/v1/requests", json={"question": "x", "userId": "u2"}, headers=U1)
    assert "userId: is not an accepted field" in assert_problem(unknown, 422, "INVALID_REQUEST")["detail"]
    empty = await http.post("/v1/requests", json={"question": ""}, headers=U1)
    assert "question" in assert_problem(empty, 422, "INVALID_REQUEST")["detail"]
    huge = await http.post("/v1/requests", content=b"{" + b" " * 70_000 + b"}", headers=headers)
    assert_problem(huge, 413, "BODY_TOO_LARGE")

    async def chunks() -> AsyncIterator[bytes]:
        yield b"{"
        for _ in range(70):
            yield b" " * 1_000
        yield b"}"

    chunked = await http.post("/v1/requests", content=chunks(), headers=headers)  # no Content-Length
    assert_problem(chunked, 413, "BODY_TOO_LARGE")
    blank = await http.post("/v1/requests", json={"question": " \n\t "}, headers=U1)
    assert "question" in assert_problem(blank, 422, "INVALID_REQUEST")["detail"]
    bad_key = await http.post("/v1/requests", json={"question": "x"}, headers={**U1, "Idempotency-Key": "has space"})
    assert_problem(bad_key, 400, "INVALID_IDEMPOTENCY_KEY")
    bad_model = await http.post("/v1/requests", json={"question": "x", "model": "NOT A MODEL"}, headers=U1)
    assert_problem(bad_model, 422, "INVALID_REQUEST")
    assert_problem(await http.get("/v1/requests/bad%20id", headers=U1), 422, "INVALID_REQUEST")
    assert_problem(await http.get("/v1/nothing-here", headers=U1), 404, "NOT_FOUND")
    decision = await http.post(f"/v1/requests/{key()}/operations/op_x/decision", json={"decision": "maybe"}, headers=U1)
    assert_problem(decision, 422, "INVALID_REQUEST")


async def test_the_openapi_document_is_served(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    assert {"/v1/requests", "/v1/requests/{request_id}", "/v1/requests/{request_id}/events"} <= set(document["paths"])
    assert "/v1/requests/{request_id}/operations/{operation_id}/decision" in document["paths"]


async def test_the_openapi_document_says_bearer_problem_json_and_event_stream(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token of the API's tokens file (TOOLLOOP_API_TOKENS).",
    }
    problem = document["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "code", "detail"} <= set(problem["properties"])
    operations = {(path, method): op for path, item in document["paths"].items() for method, op in item.items()}
    # The request routes (7), the thread routes (6, closing one among them) and the approvals for whoever may
    # decide (3).
    assert len(operations) == 16
    for (path, method), op in operations.items():
        # Every route needs the token, and says so, and every error it can give is problem+json.
        assert op["security"] == [{"bearer": []}], (path, method)
        errors = {status: answer for status, answer in op["responses"].items() if int(status) >= 400}
        assert "401" in errors and "HTTPValidationError" not in json.dumps(op), (path, method)
        for answer in errors.values():
            assert answer["content"] == {
                "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
            }
        ok = next(answer for status, answer in op["responses"].items() if int(status) < 300)
        expected = ["text/event-stream"] if path.endswith("/events") else ["application/json"]
        assert list(ok["content"]) == expected, (path, method)
    start = operations[("/v1/requests", "post")]["responses"]
    assert set(start) == {"201", "400", "401", "404", "413", "422", "429", "503"}
    assert "REQUEST_UNREADABLE" in start["503"]["description"]
    assert "RATE_LIMITED" in start["429"]["description"] and "Retry-After" in start["429"]["headers"]
    assert "UNKNOWN_TOOL" in start["422"]["description"]
    events = operations[("/v1/requests/{request_id}/events", "get")]["responses"]
    assert "TOO_MANY_STREAMS" in events["429"]["description"] and "404" in events
    decision = operations[("/v1/requests/{request_id}/operations/{operation_id}/decision", "post")]["responses"]
    assert {"DIGEST_MISMATCH", "NOT_PENDING", "REQUEST_FINISHED"} <= set(decision["409"]["description"].split()[1:])
    message = operations[("/v1/threads/{thread_id}/messages", "post")]["responses"]
    assert set(message) == {"201", "400", "401", "409", "413", "422", "429", "503"}
    assert "THREAD_CLOSED" in message["409"]["description"] and "THREAD_BUSY" in message["429"]["description"]
    assert "IDEMPOTENCY_KEY_REUSED" in message["422"]["description"]
    thread_events = operations[("/v1/threads/{thread_id}/events", "get")]["responses"]
    assert "TOO_MANY_STREAMS" in thread_events["429"]["description"] and "404" in thread_events


async def test_an_unknown_tool_is_refused_naming_it_and_the_workers_tools(http: httpx.AsyncClient) -> None:
    body = {"question": READ, "tools": ["get_order_status", "nosuch", "refund_everything"]}
    answer = await http.post("/v1/requests", json=body, headers={**U1, "Idempotency-Key": key()})
    problem = assert_problem(answer, 422, "UNKNOWN_TOOL")
    assert problem["unknown_tools"] == ["nosuch", "refund_everything"]
    assert problem["known_tools"] == demo_tool_names().split(",")
    assert "no tool nosuch, refund_everything; it has append_ticket_note," in problem["detail"]
    # A name no tool can have (the registry's rule) is refused as a field, without echoing it.
    odd = await http.post("/v1/requests", json={"question": READ, "tools": ["<b>x</b>"]}, headers=U1)
    assert "<b>" not in assert_problem(odd, 422, "INVALID_REQUEST")["detail"]


async def test_a_model_the_workers_do_not_serve_is_refused_before_anything_starts(
    http: httpx.AsyncClient, client: Client
) -> None:
    request_id = key()
    body = {"question": READ, "model": "openai:gpt-x"}
    answer = await http.post("/v1/requests", json=body, headers={**U1, "Idempotency-Key": request_id})
    problem = assert_problem(answer, 422, "UNKNOWN_MODEL")
    assert problem["known_models"] == ["offline", "script"]
    assert problem["detail"] == "model: the worker has no model 'openai' you may use; you may use offline, script"
    # Nothing was started under that id.
    workflow_id = request_workflow_id(Actor(user_id="u1", tenant_id="acme"), request_id)
    assert [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id}"')] == []


async def test_a_deadline_or_approval_wait_beyond_the_apis_caps_is_422(http: httpx.AsyncClient) -> None:
    # The API's caps are an hour each by default (TOOLLOOP_API_MAX_DEADLINE_SECONDS, ..._APPROVAL_TTL_SECONDS).
    for limits, field in (
        ({"deadline_seconds": 86_400}, "deadline_seconds"),
        ({"approval_ttl_seconds": 3601}, "approval_ttl_seconds"),
    ):
        answer = await http.post("/v1/requests", json={"question": READ, "limits": limits}, headers=U1)
        assert assert_problem(answer, 422, "INVALID_REQUEST")["detail"] == f"limits.{field}: at most 3600"


def test_the_api_will_not_start_with_the_published_demo_tokens_unless_told_it_is_a_demo(
    temporal_server: TemporalServer, tmp_path: Path
) -> None:
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_APPROVAL_KEY": APPROVAL_KEY,
        "TOOLLOOP_API_TOKENS": str(REPO_ROOT / "config" / "api_tokens.json"),
    }
    serve = [sys.executable, "starter.py", "serve", "--port", str(free_port())]
    refused = subprocess.run(serve, env=base, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds the published demo tokens" in lines[0] and "Traceback" not in refused.stderr
    # A tokens file of the deployment's own is accepted: the API starts and answers.
    own = tmp_path / "tokens.json"
    own.write_text(json.dumps({"tokens": [{"token": "a-token-of-our-own-0001", "tenant_id": "acme", "user_id": "u1"}]}))
    port = free_port()
    process = start_api(REPO_ROOT, {**base, "TOOLLOOP_API_TOKENS": str(own)}, port, tmp_path / "api.log")
    try:
        me = httpx.get(f"http://127.0.0.1:{port}/v1/me", headers={"Authorization": "Bearer a-token-of-our-own-0001"})
        # Not told the workers' models, and the token lists none: any model, the default included.
        assert me.json() == {
            "user_id": "u1",
            "tenant_id": "acme",
            "models": None,
            "default_model": "offline",
            "roles": [],
        }
    finally:
        process.stop()


async def test_another_persons_request_that_cannot_be_asked_looks_like_a_missing_one_on_the_approvals_routes(
    http: httpx.AsyncClient, client: Client
) -> None:
    # u1's request on a task queue no worker serves: the API cannot ask it for its operations. For u2 (same
    # tenant) that answered 503 where a workflow id that does not exist answers 404, telling u2 that u1 has a
    # request of that id (ids are computed from the tenant, the user and the request id).
    unserved = toolloop.ToolloopClient(client, task_queue=f"nobody-{uuid.uuid4().hex[:8]}", channel="test")
    request = await unserved.start("refund order A100", actor=toolloop.Actor(user_id="u1", tenant_id="acme"))
    operation = "op_" + "0" * 32
    try:
        missing = await http.get(f"/v1/approvals/ask-acme-u1-none-{uuid.uuid4().hex[:12]}/{operation}", headers=U2)
        theirs = await http.get(f"/v1/approvals/{request.workflow_id}/{operation}", headers=U2)
        body = assert_problem(theirs, 404, "NOT_FOUND")
        assert body["detail"].replace(request.workflow_id, "WF") == assert_problem(missing, 404, "NOT_FOUND")[
            "detail"
        ].replace(missing.url.path.split("/")[3], "WF")
        decision = {"decision": "approve", "digest": "sha256:" + "0" * 64}
        refused = await http.post(
            f"/v1/approvals/{request.workflow_id}/{operation}/decision", json=decision, headers=U2
        )
        assert_problem(refused, 404, "NOT_FOUND")
    finally:
        await request.handle.terminate(reason="test over")
