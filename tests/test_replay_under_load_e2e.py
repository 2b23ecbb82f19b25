"""Stress, end to end: 300 write requests, each followed while it runs the way clients follow one - the API's
event stream, a client polling the API, Temporal queries in a tight loop - and approved through the API. Then
every run's history is replayed with today's workflow code: none may fail. Queries that arrive while a workflow
task is open are what once split a local activity's marker from its result and left histories that no longer
replayed (a finished request then failed every query, and a running one would be stuck after a restart).

TOOLLOOP_SAVE_LOAD_HISTORIES=DIR saves every history the test replays (tests/histories/under_load holds some)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.worker import Replayer

from tests.agent_helpers import effects
from tests.api_helpers import Api, running_api
from tests.conftest import BusinessService, TemporalServer
from toolloop._core.names import GET_EVENTS_QUERY, GET_PROGRESS_QUERY
from toolloop._temporal.converter import data_converter
from toolloop._temporal.worker_factory import workflow_runner
from toolloop.workflows.agent import AgentWorkflow

pytestmark = pytest.mark.e2e

REQUESTS = 300
AT_ONCE = 16
# A user no other test lists requests for: 300 requests would push theirs off the first page.
U3 = {"Authorization": "Bearer demo-token-u3-globex-0003"}
# Every request's own loops end by themselves: at the request's end, or after this long.
PER_REQUEST_SECONDS = 240.0


@pytest.fixture(scope="module")
async def api(
    temporal_server: TemporalServer, business_service: BusinessService, client: Client, tmp_path_factory: Any
) -> AsyncIterator[Api]:
    async with running_api(temporal_server, business_service, client, tmp_path_factory) as started:
        yield started


async def follow_stream(http: httpx.AsyncClient, request_id: str) -> list[str]:
    """The event stream's event kinds, until its final event; after an error event (Temporal did not answer
    in time) it reconnects from the last event seen, as a browser's EventSource does."""
    kinds: list[str] = []
    last = "0"
    while not kinds or kinds[-1] != "final":
        headers = {**U3, "Last-Event-ID": last}
        async with aconnect_sse(http, "GET", f"/v1/requests/{request_id}/events", headers=headers) as source:
            if source.response.status_code == 503:
                await asyncio.sleep(0.05)
                continue
            assert source.response.status_code == 200, await source.response.aread()
            async for sse in source.aiter_sse():
                if sse.event == "error":
                    assert json.loads(sse.data)["code"] == "TEMPORAL_UNAVAILABLE", sse.data
                    await asyncio.sleep(0.05)
                    break
                kinds.append(sse.event)
                last = sse.id or last
                if sse.event == "final":
                    break
    return kinds


async def poll_until_finished(http: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    """What a polling client sees, asked again as soon as it has an answer; approves what waits. A 503
    (Temporal did not answer in time, under this load) is asked again."""
    while True:
        view = await http.get(f"/v1/requests/{request_id}", headers=U3)
        if busy(view):
            await asyncio.sleep(0.05)
            continue
        assert view.status_code == 200, view.text
        body: dict[str, Any] = view.json()
        if body["status"] != "running":
            return body
        for op in body.get("operations", []):
            if op["state"] == "awaiting_approval":
                path = f"/v1/requests/{request_id}/operations/{op['operation_id']}"
                payload = await http.get(path, headers=U3)
                if busy(payload):
                    continue
                assert payload.status_code == 200, payload.text
                decision = {"decision": "approve", "digest": payload.json()["digest"]}
                answer = await http.post(f"{path}/decision", json=decision, headers=U3)
                # Another look may already have decided it; anything else is a defect.
                assert busy(answer) or answer.status_code in (200, 409), answer.text


def busy(response: httpx.Response) -> bool:
    """Temporal did not answer the API in time: a client asks again (and this one counts nothing else)."""
    return response.status_code == 503 and response.json()["code"] == "TEMPORAL_UNAVAILABLE"


async def query_until(handle: WorkflowHandle[Any, Any], finished: asyncio.Event) -> int:
    """Queries in a tight loop while the request runs; how many were answered."""
    answered = 0
    while not finished.is_set():
        try:
            await handle.query(GET_PROGRESS_QUERY)
            await handle.query(GET_EVENTS_QUERY, 0)
            answered += 1
        except RPCError:
            await asyncio.sleep(0.01)  # the server was busy: a client would ask again
    return answered


async def followed_write(http: httpx.AsyncClient, client: Client, n: int) -> tuple[str, dict[str, Any], list[str]]:
    request_id = f"load-{n}-{uuid.uuid4().hex[:8]}"
    question = f"Refund 1 cent on order A134 because load test {n} needs it"
    started = await http.post(
        "/v1/requests", json={"question": question}, headers={**U3, "Idempotency-Key": request_id}
    )
    assert started.status_code == 201, started.text
    handle = client.get_workflow_handle(started.json()["workflow_id"])
    finished = asyncio.Event()
    stream = asyncio.create_task(follow_stream(http, request_id))
    queries = asyncio.create_task(query_until(handle, finished))
    try:
        view = await poll_until_finished(http, request_id)
    finally:
        finished.set()
    kinds = await stream
    await queries
    return handle.id, view, kinds


async def test_followed_write_requests_under_load_all_replay(
    api: Api, client: Client, admin: httpx.AsyncClient
) -> None:
    gate = asyncio.Semaphore(AT_ONCE)
    limits = httpx.Limits(max_connections=AT_ONCE * 3)
    async with httpx.AsyncClient(base_url=api.url, timeout=60, trust_env=False, limits=limits) as http:

        async def one(n: int) -> tuple[str, dict[str, Any], list[str]]:
            async with gate:
                return await asyncio.wait_for(followed_write(http, client, n), PER_REQUEST_SECONDS)

        runs = await asyncio.gather(*(one(n) for n in range(REQUESTS)))

    # Every request answered, its refund approved, made once and read back; every stream ended with it.
    for workflow_id, view, kinds in runs:
        assert (view["status"], view["stop_reason"]) == ("completed", "final_answer"), (workflow_id, view)
        [op] = view["operations"]
        assert op["state"] == "verified", (workflow_id, op)
        assert len(await effects(admin, op["operation_id"])) == 1
        assert kinds[-1] == "final", (workflow_id, kinds)

    # Every history replays with today's code.
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    save = os.environ.get("TOOLLOOP_SAVE_LOAD_HISTORIES")
    failures: list[str] = []
    for workflow_id, _, _ in runs:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if replayed.replay_failure is not None:
            failures.append(f"{workflow_id}: {replayed.replay_failure}")
        if save:
            stored = {"workflow_id": workflow_id, "history": json.loads(history.to_json())}
            (Path(save) / f"{workflow_id.replace('/', '_')}.json").write_text(json.dumps(stored, indent=1) + "\n")
    assert failures == [], f"{len(failures)} of {REQUESTS} histories do not replay:\n" + "\n".join(failures[:5])
