"""End to end over real HTTP: the API's limits per caller (`starter.py serve` with tight TOOLLOOP_API_* values,
the session's dev server and business service, a worker with the demo's tools). Each test runs an API of its
own, so one test's slots, rate window and running requests are not another's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from devstack.processes import free_port
from tests.agent_helpers import assert_eventually
from tests.api_helpers import (
    U1,
    U1_GLOBEX,
    U2,
    assert_problem,
    pending_operation,
    running_api,
    users_of_their_own,
)
from tests.conftest import APPROVAL_KEY, REPO_ROOT, BusinessService, TemporalServer

pytestmark = pytest.mark.e2e

READ = "Where is my order A100?"
U1_WRITE = "Refund 5 EUR on order A100 because it arrived late"
U2_WRITE = "Refund 5 EUR on order A101 because it arrived late"


def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def api_client(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
    **limits: str,
) -> AsyncIterator[httpx.AsyncClient]:
    """An API of the test's own with these TOOLLOOP_API_* values (the others roomy), and a client of it."""
    async with running_api(temporal_server, business_service, client, tmp_path_factory, env=limits) as api:
        async with httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as http:
            yield http


async def start(http: httpx.AsyncClient, question: str, headers: dict[str, str], request_id: str) -> httpx.Response:
    return await http.post(
        "/v1/requests", json={"question": question}, headers={**headers, "Idempotency-Key": request_id}
    )


async def open_stream(
    stack: contextlib.AsyncExitStack, http: httpx.AsyncClient, request_id: str, headers: dict[str, str]
) -> httpx.Response:
    """A stream of the request's events, held open until `stack` closes (its status and headers have arrived)."""
    response = await stack.enter_async_context(http.stream("GET", f"/v1/requests/{request_id}/events", headers=headers))
    if response.status_code != 200:
        await response.aread()
    return response


async def test_event_streams_are_capped_per_caller_and_in_all_and_a_slot_comes_back(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    limits = {"TOOLLOOP_API_MAX_STREAMS_PER_CALLER": "2", "TOOLLOOP_API_MAX_STREAMS": "3"}
    async with api_client(temporal_server, business_service, client, tmp_path_factory, **limits) as http:
        mine, theirs, finished = key(), key(), key()
        assert (await start(http, U1_WRITE, U1, mine)).status_code == 201
        assert (await start(http, U2_WRITE, U2, theirs)).status_code == 201
        assert (await start(http, READ, U1_GLOBEX, finished)).status_code == 201
        op = await pending_operation(http, mine, U1)
        await pending_operation(http, theirs, U2)
        first, held = contextlib.AsyncExitStack(), contextlib.AsyncExitStack()
        async with held:
            held.push_async_callback(first.aclose)  # should the test fail before it closes the first on purpose
            assert (await open_stream(first, http, mine, U1)).status_code == 200
            assert (await open_stream(held, http, mine, U1)).status_code == 200
            # A third of u1's: refused, by the token's identity (another caller still gets its own).
            third = await open_stream(held, http, mine, U1)
            assert "close one first" in assert_problem(third, 429, "TOO_MANY_STREAMS")["detail"]
            assert (await open_stream(held, http, theirs, U2)).status_code == 200
            # Three held in all: the API's most, whoever asks next.
            for request_id, headers in ((theirs, U2), (finished, U1_GLOBEX)):
                refused = await open_stream(held, http, request_id, headers)
                assert "the API holds its most" in assert_problem(refused, 429, "TOO_MANY_STREAMS")["detail"]
            # The client of the first stream goes away: its slot comes back.
            await first.aclose()
            reopened: list[httpx.Response] = []

            async def opens_again() -> bool:
                response = await open_stream(held, http, mine, U1)
                reopened.extend([response] if response.status_code == 200 else [])
                return bool(reopened)

            await assert_eventually(opens_again, within=30, what="u1 may open a stream again")
            # The request ends: its streams end with it (read to their end), and their slots come back.
            [another] = reopened
            path = f"/v1/requests/{mine}/operations/{op['operation_id']}/decision"
            rejected = await http.post(path, json={"decision": "reject", "digest": op["digest"]}, headers=U1)
            assert rejected.status_code == 200
            events = [line async for line in another.aiter_lines() if line.startswith("event:")]
            assert events[-1] == "event: final"

            async def both_back() -> bool:
                async with contextlib.AsyncExitStack() as two:
                    return all([(await open_stream(two, http, mine, U1)).status_code == 200 for _ in range(2)])

            await assert_eventually(both_back, within=30, what="both of u1's slots are back")


async def test_request_creation_is_rate_limited_per_caller_and_a_repeated_post_still_answers(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    async with api_client(
        temporal_server, business_service, client, tmp_path_factory, TOOLLOOP_API_CREATE_RATE="3/hour"
    ) as http:
        ids = [key() for _ in range(3)]
        created = [await start(http, READ, U1_GLOBEX, request_id) for request_id in ids]
        assert [c.status_code for c in created] == [201, 201, 201]
        limited = await start(http, READ, U1_GLOBEX, key())
        assert "3 per 1 hour" in assert_problem(limited, 429, "RATE_LIMITED")["detail"]
        assert 1 <= int(limited.headers["Retry-After"]) <= 3600
        no_key = await http.post("/v1/requests", json={"question": READ}, headers=U1_GLOBEX)
        assert_problem(no_key, 429, "RATE_LIMITED")
        # The same Idempotency-Key again is the request it was, not a new one: answered as before.
        again = await start(http, READ, U1_GLOBEX, ids[0])
        assert again.status_code == 200 and again.json()["workflow_id"] == created[0].json()["workflow_id"]
        # The window is the caller's: the same user id in another tenant has its own.
        assert (await start(http, READ, U1, key())).status_code == 201
        # Bad input is still bad input (422), whatever the rate.
        blank = await http.post("/v1/requests", json={"question": " "}, headers=U1_GLOBEX)
        assert_problem(blank, 422, "INVALID_REQUEST")


async def test_a_users_active_requests_are_capped_and_a_repeated_post_still_answers(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    # Users of this test's own: running requests are counted in the whole namespace, and the session's other
    # tests leave the demo users' requests running (waiting for approvals nobody gives).
    tokens_file, (me, other) = users_of_their_own(tmp_path, "busy", "idle")
    mine, theirs = me.headers, other.headers
    limits = {"TOOLLOOP_API_MAX_ACTIVE_REQUESTS": "1", "TOOLLOOP_API_TOKENS": str(tokens_file)}
    async with api_client(temporal_server, business_service, client, tmp_path_factory, **limits) as http:
        waiting = key()
        first = await start(http, U1_WRITE, mine, waiting)
        assert first.status_code == 201
        op = await pending_operation(http, waiting, mine)

        async def listed_running() -> bool:
            page = (await http.get("/v1/requests", headers=mine, params={"page_size": 100})).json()
            return any(r["id"] == waiting and r["status"] == "running" for r in page["requests"])

        await assert_eventually(listed_running, within=30, what="the waiting request is listed as running")
        refused = await start(http, READ, mine, key())
        body = assert_problem(refused, 429, "TOO_MANY_ACTIVE_REQUESTS")
        assert "1 requests running" in body["detail"] and "Retry-After" not in refused.headers
        again = await start(http, U1_WRITE, mine, waiting)
        assert again.status_code == 200 and again.json()["workflow_id"] == first.json()["workflow_id"]
        assert again.json()["status"] == "running"
        # Another user's running requests are their own.
        assert (await start(http, READ, theirs, key())).status_code == 201
        # Once the request has finished, its user may start another.
        path = f"/v1/requests/{waiting}/operations/{op['operation_id']}/decision"
        rejected = await http.post(path, json={"decision": "reject", "digest": op["digest"]}, headers=mine)
        assert rejected.status_code == 200

        async def admitted() -> bool:
            answer = await start(http, READ, mine, key())
            assert answer.status_code in (201, 429), answer.text
            return answer.status_code == 201

        await assert_eventually(admitted, within=30, what="the user may start a request again")


def serve_env(temporal_server: TemporalServer, folder: Path) -> dict[str, str]:
    """The environment `starter.py serve` is started with here: the session's server, a tokens file of its own."""
    own = folder / "tokens.json"
    own.write_text(json.dumps({"tokens": [{"token": "a-token-of-our-own-0001", "tenant_id": "acme", "user_id": "u1"}]}))
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_APPROVAL_KEY": APPROVAL_KEY,
        "TOOLLOOP_API_TOKENS": str(own),
    }


def refused_serve(env: dict[str, str], *args: str) -> str:
    """`starter.py serve ARGS` that does not start: exit 2, one line on stderr (returned), never a traceback."""
    done = subprocess.run(
        [sys.executable, "starter.py", "serve", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_bad_limit_setting_stops_the_api_with_one_line(temporal_server: TemporalServer, tmp_path: Path) -> None:
    env = {**serve_env(temporal_server, tmp_path), "TOOLLOOP_API_CREATE_RATE": "as fast as you like"}
    port = str(free_port())
    assert refused_serve(env, "--port", port).startswith("error: TOOLLOOP_API_CREATE_RATE: ")
    # A default model the workers do not serve would fail every request that names none: it does not start.
    env = {
        **env,
        "TOOLLOOP_API_CREATE_RATE": "30/minute",
        "TOOLLOOP_API_MODEL": "offline",
        "TOOLLOOP_API_MODELS": "openai",
    }
    assert refused_serve(env, "--port", port) == (
        "error: TOOLLOOP_API_MODEL 'offline' is not among the worker's models (TOOLLOOP_API_MODELS: openai)"
    )


def test_an_address_the_api_cannot_listen_on_is_one_line_with_exit_2(
    temporal_server: TemporalServer, tmp_path: Path
) -> None:
    # Before: a port out of range was a traceback (OverflowError), a host that does not resolve three log lines
    # and exit 3, a port in use the same.
    env = serve_env(temporal_server, tmp_path)
    assert refused_serve(env, "--port", "70000").startswith("error: Invalid value for '--port': ")
    assert refused_serve({**env, "TOOLLOOP_API_PORT": "70000"}).startswith("error: TOOLLOOP_API_PORT: ")
    line = refused_serve(env, "--host", "no-such-host.invalid", "--port", str(free_port()))
    assert line.startswith("error: cannot listen on no-such-host.invalid:"), line
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = refused_serve(env, "--port", str(port))
    assert line == f"error: cannot listen on 127.0.0.1:{port}: Address already in use", line


async def test_the_approvals_list_says_when_it_read_fewer_requests_than_run_and_is_complete_once_it_read_them_all(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    # A user of this test's own: the session's other tests leave the demo users' requests waiting.
    tokens_file, (me,) = users_of_their_own(tmp_path, "many")
    mine = me.headers
    limits = {"TOOLLOOP_API_APPROVALS_SCAN": "1", "TOOLLOOP_API_TOKENS": str(tokens_file)}
    async with api_client(temporal_server, business_service, client, tmp_path_factory, **limits) as http:
        first, second = key(), key()
        assert (await start(http, U1_WRITE, mine, first)).status_code == 201
        assert (await start(http, U2_WRITE, mine, second)).status_code == 201
        ops = {request_id: await pending_operation(http, request_id, mine) for request_id in (first, second)}

        async def page() -> dict[str, object]:
            answer = await http.get("/v1/approvals", headers=mine)
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        async def both_running_seen() -> bool:
            return (await page())["complete"] is False

        # Two requests wait and the API reads one: what it lists waits, and it says it may leave one out.
        await assert_eventually(both_running_seen, within=60, what="the list says it read fewer than run")
        listed = (await page())["approvals"]
        assert isinstance(listed, list) and len(listed) == 1
        assert listed[0]["operation"]["operation_id"] in {op["operation_id"] for op in ops.values()}
        # One of them decided and finished, the one left is read: the list is the whole of it.
        op = ops[first]
        decision = {"decision": "reject", "digest": op["digest"]}
        path = f"/v1/requests/{first}/operations/{op['operation_id']}/decision"
        assert (await http.post(path, json=decision, headers=mine)).status_code == 200

        async def complete() -> bool:
            return (await page())["complete"] is True

        await assert_eventually(complete, within=60, what="the list is complete once one request runs")
        [left] = (await page())["approvals"]
        assert left["operation"]["operation_id"] == ops[second]["operation_id"]
        decision = {"decision": "reject", "digest": ops[second]["digest"]}
        path = f"/v1/requests/{second}/operations/{ops[second]['operation_id']}/decision"
        assert (await http.post(path, json=decision, headers=mine)).status_code == 200
