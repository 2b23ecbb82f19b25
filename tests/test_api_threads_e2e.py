"""End to end over real HTTP: threads through the API (`starter.py serve`) against the real stack (the session's
dev server and business service, a worker with the demo's tools). A follow-up is shown the message before it,
messages sent at once run one after another (the later one told it is queued), an Idempotency-Key names one
message, another user's thread is answered like a missing one, and the thread's event stream follows the whole
conversation and resumes exactly. Judged by status codes, problem codes, events and the service's effect table."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse
from temporalio.client import Client

from tests.agent_helpers import assert_eventually, conversation, effects
from tests.api_helpers import U1, U1_GLOBEX, U2, Api, assert_problem, pending_operation, running_api
from tests.conftest import REPO_ROOT, BusinessService, TemporalServer
from toolloop._api.app import ApiConfig, create_app
from toolloop._api.limits import ApiLimits
from toolloop._api.tokens import TokenMap
from toolloop._core.contracts import MessageItem
from toolloop._core.threads import MessageRecord
from toolloop._temporal.client import ToolloopThread

pytestmark = pytest.mark.e2e

READ = "Where is my order A100?"
REFUND_5 = "Refund 5 EUR on order A100 because it arrived late"
REFUND_6 = "Refund 6 EUR on order A100 because it arrived broken"


@pytest.fixture(scope="module")
async def api(
    temporal_server: TemporalServer, business_service: BusinessService, client: Client, tmp_path_factory: Any
) -> AsyncIterator[Api]:
    async with running_api(temporal_server, business_service, client, tmp_path_factory) as started:
        yield started


@pytest.fixture
async def http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=60, trust_env=False) as c:
        yield c


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def send(
    http: httpx.AsyncClient, thread_id: str, question: str, key: str | None = None, headers: dict[str, str] = U1
) -> httpx.Response:
    extra = {"Idempotency-Key": key} if key is not None else {}
    return await http.post(
        f"/v1/threads/{thread_id}/messages", json={"question": question}, headers={**headers, **extra}
    )


async def messages(http: httpx.AsyncClient, thread_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/v1/threads/{thread_id}", headers=U1)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["messages"]
    return found


async def all_finished(http: httpx.AsyncClient, thread_id: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def done() -> bool:
        found[:] = await messages(http, thread_id)
        return len(found) == count and all(m["state"] == "finished" for m in found)

    await assert_eventually(done, within=120, what=f"thread {thread_id}'s {count} messages finished")
    return found


async def decide(http: httpx.AsyncClient, request_id: str, decision: str) -> dict[str, Any]:
    op = await pending_operation(http, request_id, U1)
    path = f"/v1/requests/{request_id}/operations/{op['operation_id']}/decision"
    response = await http.post(path, json={"decision": decision, "digest": op["digest"]}, headers=U1)
    assert response.status_code == 200, response.text
    return op


async def test_a_follow_up_is_shown_the_first_message_and_the_list_says_how_each_ended(
    http: httpx.AsyncClient, client: Client
) -> None:
    thread_id = new_id("t")
    first = await send(http, thread_id, READ, new_id("m"))
    assert first.status_code == 201, first.text
    one = first.json()
    assert (one["number"], one["ahead"], one["queued"]) == (1, 0, False)
    assert first.headers["location"] == one["url"] == f"/v1/threads/{thread_id}/messages/{one['request_id']}"
    assert one["request_url"] == f"/v1/requests/{one['request_id']}"
    await all_finished(http, thread_id, 1)

    second = await send(http, thread_id, "And where is order A102?", new_id("m"))
    assert second.status_code == 201, second.text
    two = second.json()
    assert (two["number"], two["queued"]) == (2, False)
    listed = await all_finished(http, thread_id, 2)
    assert [(m["number"], m["request_id"], m["state"], m["outcome"]) for m in listed] == [
        (1, one["request_id"], "finished", "answered"),
        (2, two["request_id"], "finished", "answered"),
    ]
    assert [m["question"] for m in listed] == [READ, "And where is order A102?"]
    # The message's request is an ordinary request: its routes answer, with the final answer.
    first_view = (await http.get(one["request_url"], headers=U1)).json()
    second_view = (await http.get(two["request_url"], headers=U1)).json()
    assert second_view["status"] == "completed" and "A102" in second_view["final_text"]
    # The follow-up's request was shown the first message: its question and its answer, before its own.
    shown = await conversation(client.get_workflow_handle(two["workflow_id"]))
    said = [(i.role, i.text()) for i in shown if isinstance(i, MessageItem)]
    assert said[:3] == [("user", READ), ("assistant", first_view["final_text"]), ("user", "And where is order A102?")]


async def test_two_messages_sent_at_once_run_one_after_another_and_the_later_is_told_it_is_queued(
    http: httpx.AsyncClient, client: Client, admin: httpx.AsyncClient
) -> None:
    thread_id = new_id("t")
    answers = await asyncio.gather(send(http, thread_id, REFUND_5, new_id("a")), send(http, thread_id, REFUND_6))
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    earlier, later = sorted((a.json() for a in answers), key=lambda a: a["number"])
    assert (earlier["number"], later["number"]) == (1, 2)
    # The first waits for approval, so the second is accepted behind it.
    assert (earlier["ahead"], earlier["queued"]) == (0, False)
    assert (later["ahead"], later["queued"]) == (1, True)

    first_op = await pending_operation(http, earlier["request_id"], U1)
    # While queued: its request does not exist yet (404), and the message says queued, behind one.
    assert_problem(await http.get(later["request_url"], headers=U1), 404, "NOT_FOUND")
    queued = (await http.get(later["url"], headers=U1)).json()
    assert (queued["state"], queued["ahead"], queued["number"]) == ("queued", 1, 2)

    await decide(http, earlier["request_id"], "approve")
    rejected = await decide(http, later["request_id"], "reject")
    listed = await all_finished(http, thread_id, 2)
    assert [(m["number"], m["outcome"]) for m in listed] == [(1, "answered"), (2, "not_done")]
    one = await client.get_workflow_handle(earlier["workflow_id"]).describe()
    two = await client.get_workflow_handle(later["workflow_id"]).describe()
    assert one.close_time is not None and two.start_time >= one.close_time
    assert len(await effects(admin, first_op["operation_id"])) == 1
    assert await effects(admin, rejected["operation_id"]) == []


async def test_the_same_idempotency_key_is_one_message_and_with_another_body_422(http: httpx.AsyncClient) -> None:
    thread_id, key = new_id("t"), new_id("k")
    first = await send(http, thread_id, READ, key)
    again = await send(http, thread_id, READ, key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert "location" not in again.headers
    assert {k: again.json()[k] for k in ("number", "request_id", "workflow_id")} == {
        k: first.json()[k] for k in ("number", "request_id", "workflow_id")
    }
    assert_problem(await send(http, thread_id, "Where is my order A101?", key), 422, "IDEMPOTENCY_KEY_REUSED")
    await all_finished(http, thread_id, 1)
    # Also after it finished: the same message, and still one.
    assert (await send(http, thread_id, READ, key)).status_code == 200
    assert len(await messages(http, thread_id)) == 1
    # A key the caller used for a request of its own is refused as the request route refuses it.
    plain = new_id("k")
    made = await http.post("/v1/requests", json={"question": READ}, headers={**U1, "Idempotency-Key": plain})
    assert made.status_code == 201
    assert_problem(await send(http, thread_id, READ, plain), 422, "IDEMPOTENCY_KEY_REUSED")
    assert_problem(await send(http, thread_id, READ, "-bad key"), 400, "INVALID_IDEMPOTENCY_KEY")
    assert_problem(
        await http.post(f"/v1/threads/{thread_id}/messages", json={"question": READ, "x": 1}, headers=U1),
        422,
        "INVALID_REQUEST",
    )
    assert len(await messages(http, thread_id)) == 1


async def test_a_send_retried_at_once_that_finds_its_own_message_started_is_that_message_never_a_422(
    api: Api, http: httpx.AsyncClient, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client retries a send at once (its answer was lost). Forced interleaving: the retry reads the thread as it
    # was before the first send arrived, and only then looks for a request under its key - the first send's
    # message, started meanwhile. It is the thread's own message: the thread answers the retry, never "key reused".
    # The retry runs through an API in this process (the same code as `starter.py serve`).
    thread_id, key = new_id("t"), new_id("k")
    first_done = asyncio.Event()
    read_thread = ToolloopThread.messages

    async def read_before_the_first_send(self: ToolloopThread) -> list[MessageRecord]:
        await first_done.wait()
        monkeypatch.setattr(ToolloopThread, "messages", read_thread)
        return []

    monkeypatch.setattr(ToolloopThread, "messages", read_before_the_first_send)
    config = ApiConfig(
        task_queue=api.task_queue,
        tokens=TokenMap.load(REPO_ROOT / "config" / "api_tokens.json"),
        signing_key=None,
        limits=ApiLimits(create_rate="1000/minute", max_active_requests=1000),
    )
    transport = httpx.ASGITransport(app=create_app(client, config))
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test", timeout=60) as here:
        retry = asyncio.create_task(send(here, thread_id, READ, key))
        first = await send(http, thread_id, READ, key)
        assert first.status_code == 201, first.text

        async def started() -> bool:
            return (await http.get(first.json()["request_url"], headers=U1)).status_code == 200

        await assert_eventually(started, what="the first send's message started")
        first_done.set()
        again = await asyncio.wait_for(retry, 60)
    assert again.status_code == 200, again.text
    assert (again.json()["number"], again.json()["request_id"]) == (1, key)
    assert len(await all_finished(http, thread_id, 1)) == 1


async def test_another_users_thread_is_answered_like_a_missing_one_on_every_route(http: httpx.AsyncClient) -> None:
    thread_id, missing = new_id("t"), new_id("t")
    sent = await send(http, thread_id, READ)
    assert sent.status_code == 201
    request_id = sent.json()["request_id"]
    await all_finished(http, thread_id, 1)
    for path in ("", f"/messages/{request_id}", "/events"):
        for who in (U2, U1_GLOBEX):
            theirs = await http.get(f"/v1/threads/{thread_id}{path}", headers=who)
            none = await http.get(f"/v1/threads/{missing}{path}", headers=who)
            assert_problem(theirs, 404, "NOT_FOUND")
            assert_problem(none, 404, "NOT_FOUND")
            # Byte for byte the same once the asked-for id is swapped.
            assert theirs.content == none.content.replace(missing.encode(), thread_id.encode())
    assert_problem(await http.get(f"/v1/threads/{thread_id}/messages/nope", headers=U1), 404, "NOT_FOUND")
    assert_problem(await http.get(f"/v1/threads/{thread_id}"), 401, "UNAUTHORIZED")
    listed = (await http.get("/v1/threads", headers=U2)).json()["threads"]
    assert thread_id not in [t["id"] for t in listed]

    async def mine_listed() -> bool:
        return thread_id in [t["id"] for t in (await http.get("/v1/threads", headers=U1)).json()["threads"]]

    await assert_eventually(mine_listed, what="the thread in its owner's list")


async def test_a_closed_thread_runs_what_it_accepted_refuses_new_messages_and_leaves_the_list(
    http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    thread_id = new_id("t")
    first = (await send(http, thread_id, REFUND_5, new_id("c"))).json()
    second = (await send(http, thread_id, READ, new_id("c"))).json()
    op = await pending_operation(http, first["request_id"], U1)
    closed = await http.post(f"/v1/threads/{thread_id}/close", headers=U1)
    assert closed.status_code == 200, closed.text
    assert [m["number"] for m in closed.json()["messages"]] == [1, 2]
    assert closed.json()["messages"][1]["state"] == "queued"
    assert_problem(await send(http, thread_id, READ, new_id("c")), 409, "THREAD_CLOSED")
    # Its stream follows both messages to their ends, and then says the thread is closed.
    stream = asyncio.create_task(
        collect(read_until(http, f"/v1/threads/{thread_id}/events", lambda e: e.event == "error"))
    )
    # The messages it accepted before still run: the write once approved, the read after it.
    await decide(http, first["request_id"], "approve")
    listed = await all_finished(http, thread_id, 2)
    events = await asyncio.wait_for(stream, 60)
    ends = [(e.event, e.json().get("number")) for e in events if e.event in ("final", "message_finished", "error")]
    assert ends == [("final", 1), ("message_finished", 1), ("final", 2), ("message_finished", 2), ("error", None)]
    assert events[-1].json()["code"] == "THREAD_CLOSED"
    assert [(m["request_id"], m["outcome"]) for m in listed] == [
        (first["request_id"], "answered"),
        (second["request_id"], "answered"),
    ]
    assert len(await effects(admin, op["operation_id"])) == 1

    async def left_the_list() -> bool:
        return thread_id not in [t["id"] for t in (await http.get("/v1/threads", headers=U1)).json()["threads"]]

    await assert_eventually(left_the_list, what="the ended thread gone from its owner's list")
    again = await http.post(f"/v1/threads/{thread_id}/close", headers=U1)
    assert again.status_code == 200 and [m["state"] for m in again.json()["messages"]] == ["finished"] * 2
    assert_problem(await send(http, thread_id, READ, new_id("c")), 409, "THREAD_CLOSED")
    # A message it took is still that message when sent again (the same key and body), after the end too.
    retried = await send(http, thread_id, READ, second["request_id"])
    assert retried.status_code == 200 and retried.json()["number"] == 2
    # Another user's thread and a missing one: the same 404.
    missing = new_id("t")
    theirs = await http.post(f"/v1/threads/{thread_id}/close", headers=U2)
    none = await http.post(f"/v1/threads/{missing}/close", headers=U2)
    assert_problem(theirs, 404, "NOT_FOUND")
    assert_problem(none, 404, "NOT_FOUND")
    assert theirs.content == none.content.replace(missing.encode(), thread_id.encode())


async def test_a_caller_with_as_many_open_threads_as_allowed_starts_no_other_until_one_ends(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: Any,
    tmp_path: Any,
) -> None:
    # A user of their own, so that no other test's threads count.
    user = f"cap-{uuid.uuid4().hex[:8]}"
    token = f"token-{user}-0001"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": token, "tenant_id": "acme", "user_id": user}]}))
    env = {"TOOLLOOP_API_TOKENS": str(tokens), "TOOLLOOP_API_MAX_OPEN_THREADS": "2"}
    me = {"Authorization": f"Bearer {token}"}
    async with (
        running_api(temporal_server, business_service, client, tmp_path_factory, env=env) as capped,
        httpx.AsyncClient(base_url=capped.url, timeout=60, trust_env=False) as http,
    ):
        one, two, three = new_id("t"), new_id("t"), new_id("t")

        async def listed(count: int) -> None:
            async def counted() -> bool:
                return len((await http.get("/v1/threads", headers=me)).json()["threads"]) == count

            # Temporal's visibility counts a thread a moment after its start (the creation rate bounds that).
            await assert_eventually(counted, what=f"{count} open threads listed")

        for thread_id in (one, two):
            assert (await send(http, thread_id, READ, headers=me)).status_code == 201
        await listed(2)
        refused = assert_problem(await send(http, three, READ, headers=me), 429, "TOO_MANY_THREADS")
        assert "close one" in refused["detail"]
        # A message to a thread already open is taken.
        assert (await send(http, one, "And where is order A102?", headers=me)).status_code == 201
        assert (await http.post(f"/v1/threads/{two}/close", headers=me)).status_code == 200
        await listed(1)
        assert (await send(http, three, READ, headers=me)).status_code == 201


async def collect(events: AsyncIterator[ServerSentEvent]) -> list[ServerSentEvent]:
    return [event async for event in events]


async def read_until(
    http: httpx.AsyncClient, path: str, stop: Any, last_event_id: str | None = None
) -> AsyncIterator[ServerSentEvent]:
    headers = {**U1, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    async with aconnect_sse(http, "GET", path, headers=headers) as source:
        assert source.response.status_code == 200
        async for sse in source.aiter_sse():
            yield sse
            if stop(sse):
                return


def progress(events: list[ServerSentEvent]) -> list[tuple[str, int, int | None]]:
    """What a stream said of its messages' runs, in order: each message's start, its request's numbered events
    and its end (not the announcements of messages accepted)."""
    return [
        (e.event, e.json()["number"], e.json().get("seq")) for e in events if e.id and e.event != "message_accepted"
    ]


def announced(events: list[ServerSentEvent]) -> list[int]:
    return [e.json()["number"] for e in events if e.event == "message_accepted"]


async def test_the_thread_stream_follows_the_conversation_and_resumes_exactly(
    http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    thread_id = new_id("t")
    one = (await send(http, thread_id, REFUND_5, new_id("m"))).json()
    seen: list[ServerSentEvent] = []
    two: dict[str, Any] = {}
    path = f"/v1/threads/{thread_id}/events"

    def finished_two(sse: ServerSentEvent) -> bool:
        return sse.event == "message_finished" and sse.json()["number"] == 2

    # Open (no `until`): it stays open until this client leaves after message 2 has finished.
    async for sse in read_until(http, path, finished_two):
        seen.append(sse)
        data = sse.json()
        if sse.event == "approval_needed" and data["number"] == 1:
            # Sent while message 1 waits: the stream announces it at once, queued behind message 1.
            two.update((await send(http, thread_id, READ, new_id("m"))).json())
        elif sse.event == "message_accepted" and data["number"] == 2:
            assert (data["state"], data["ahead"], data["request_id"]) == ("queued", 1, two["request_id"])
            await decide(http, one["request_id"], "approve")

    kinds = [(e.event, e.json()["number"]) for e in seen if e.event != "model_text"]
    assert kinds[:2] == [("message_accepted", 1), ("message_started", 1)]
    at_accepted_2 = kinds.index(("message_accepted", 2))
    assert kinds.index(("approval_needed", 1)) < at_accepted_2 < kinds.index(("final", 1))
    assert kinds.index(("final", 1)) + 1 == kinds.index(("message_finished", 1))
    assert kinds[kinds.index(("message_finished", 1)) + 1] == ("message_started", 2)
    assert kinds[-2:] == [("final", 2), ("message_finished", 2)]
    finished = {e.json()["number"]: e.json()["outcome"] for e in seen if e.event == "message_finished"}
    assert finished == {1: "answered", 2: "answered"}
    # Each request event is the request's own, tagged with its message.
    for e in seen:
        if e.event in ("phase", "tool_started", "tool_finished", "approval_needed", "operation", "final"):
            number = e.json()["number"]
            assert e.json()["request_id"] == (one if number == 1 else two)["request_id"]
    own = [e for e in seen if e.json().get("request_id") == one["request_id"] and e.event not in ("message_accepted",)]
    request_events = [e for e in own if not e.event.startswith("message_") and e.event != "model_text"]
    assert [e.json()["seq"] for e in request_events] == list(range(1, len(request_events) + 1))
    op = next(e.json()["data"] for e in seen if e.event == "approval_needed")
    assert len(await effects(admin, op["operation_id"])) == 1

    # Every numbered event resumes exactly: the rest of the conversation, nothing seen again, nothing missed. An
    # id is the stream's place (messages announced . message followed . how far): a resumed stream announces
    # the messages accepted after that place at once, so only the announcements may come earlier than before.
    numbered = [e for e in seen if e.id]
    for at in (numbered[0], next(e for e in numbered if e.event == "message_accepted" and e.json()["number"] == 2)):
        rest = numbered[numbered.index(at) + 1 :]
        resumed = [e async for e in read_until(http, path + "?until=idle", lambda _: False, last_event_id=at.id)]
        assert progress(resumed) == progress(rest)
        assert announced(resumed) == announced(rest)
        assert resumed[-1].id == numbered[-1].id
    # With until=idle, a thread whose messages have all finished: the whole conversation, then the end.
    whole = [e async for e in read_until(http, path + "?until=idle", lambda _: False)]
    assert progress(whole) == progress(numbered) and announced(whole) == [1, 2]
    view = (await http.get(f"/v1/threads/{thread_id}", headers=U1)).json()
    assert [e async for e in read_until(http, path + "?until=idle", lambda _: False, view["last_event_id"])] == []
    bad = await http.get(path, headers={**U1, "Last-Event-ID": "12"})
    assert_problem(bad, 422, "INVALID_REQUEST")


async def test_a_closed_threads_stream_ends_with_thread_closed_and_it_takes_no_more_messages(
    http: httpx.AsyncClient, client: Client
) -> None:
    thread_id = new_id("t")
    # The first message waits for an approval; its thread's workflow is then terminated by an operator.
    first = await send(http, thread_id, REFUND_5, new_id("c"))
    assert first.status_code == 201, first.text
    await pending_operation(http, first.json()["request_id"], U1)
    path = f"/v1/threads/{thread_id}/events?until=idle"
    seen: list[ServerSentEvent] = []

    async def follow() -> None:
        async for event in read_until(http, path, lambda e: e.event == "error"):
            seen.append(event)

    following = asyncio.create_task(follow())

    async def started() -> bool:
        return any(e.event == "message_started" for e in seen)

    await assert_eventually(started, what="the stream shows the first message running")
    workflow_id = (await http.get(f"/v1/threads/{thread_id}", headers=U1)).json()["workflow_id"]
    await client.get_workflow_handle(workflow_id).terminate("an operator closes the thread")
    # The stream ends (never waits an hour for a message the thread will not record as finished).
    await asyncio.wait_for(following, 60)
    assert seen[-1].event == "error" and seen[-1].json()["code"] == "THREAD_CLOSED"
    assert_problem(await send(http, thread_id, READ, new_id("c")), 409, "THREAD_CLOSED")


async def test_a_message_whose_request_was_terminated_finishes_in_the_threads_stream(
    http: httpx.AsyncClient, client: Client
) -> None:
    """An operator terminates a message's request while it waits for approval. Its events never end with a final
    one, so the thread's stream waited for them for an hour: it now ends the message as the thread recorded it,
    and `until=idle` ends once the next message has run."""
    thread_id = new_id("t")
    first = (await send(http, thread_id, REFUND_5, new_id("c"))).json()
    second = await send(http, thread_id, READ, new_id("c"))
    assert second.status_code == 201 and second.json()["queued"]
    await pending_operation(http, first["request_id"], U1)
    await client.get_workflow_handle(first["workflow_id"]).terminate("an operator stops this request")
    path = f"/v1/threads/{thread_id}/events?until=idle"
    seen = await asyncio.wait_for(_collect(read_until(http, path, lambda e: e.event == "error")), 120)
    assert [e.event for e in seen if e.event.startswith("message_")] == [
        "message_accepted",
        "message_accepted",
        "message_started",
        "message_finished",
        "message_started",
        "message_finished",
    ]
    assert "error" not in [e.event for e in seen]
    finished = [e.json() for e in seen if e.event == "message_finished"]
    assert [f["number"] for f in finished] == [1, 2]
    # Terminated before its refund was approved: nothing was sent, so failed (not unknown, and never answered).
    assert finished[0]["outcome"] == "failed" and finished[1]["outcome"] == "answered"


async def _collect(events: AsyncIterator[ServerSentEvent]) -> list[ServerSentEvent]:
    return [e async for e in events]
