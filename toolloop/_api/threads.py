"""I/O: the HTTP API's threads (docs/API.md, "Threads") - what the thread routes answer, and the thread's event
stream: its messages accepted, started, refused and finished, and the running message's own request events in
between, each tagged with its request id, so one stream follows the whole conversation.

The stream is sequential, as the thread is: its messages run one after another, in the order accepted. Its
place is three numbers, `A.N.S` (the id of each numbered event): the newest message announced (A), the message
being followed (N) and how far into it (S: 0 nothing yet, 1 started, 1 + k its request's event k). A message
accepted while another runs is announced at once, and its place is still one position of one sequence, so a
client that reconnects with Last-Event-ID gets exactly what comes after the last event it saw."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

from toolloop._api.openapi import ENDED_WITHOUT_REPORT
from toolloop._core.threads import MessageRecord, MessageState
from toolloop._temporal.client import ThreadNotFound, ToolloopRequest, ToolloopThread
from toolloop._temporal.requests import UNREADABLE_REQUEST

# A message's request events, as the request's own stream gives them (after event number `after`).
RequestEvents = Callable[[ToolloopRequest, int], AsyncGenerator[dict[str, str], None]]


class MessageView(BaseModel):
    """One message of a thread. Its request (`request_url`, the request routes) exists once the message has
    started: while it is `queued` the request routes answer 404, and this view is the message's word."""

    number: int
    request_id: str
    workflow_id: str
    state: MessageState
    # The request's outcome once the message has finished (AgentResult.outcome; without a report, the ledger's:
    # contracts.outcome_without_report).
    outcome: str | None = None
    question: str  # its first 200 characters
    # Messages before it that have not finished (0 once it runs).
    ahead: int = 0
    # Why it was refused (its request could not start).
    note: str | None = None
    url: str
    request_url: str


class MessageAnswer(BaseModel):
    """`POST /v1/threads/{thread_id}/messages`: the message's place in the thread. `queued` is True when a message
    before it has not finished (`ahead` of them): its request starts after them."""

    thread_id: str
    number: int
    request_id: str
    workflow_id: str
    ahead: int
    queued: bool
    url: str
    request_url: str


class ThreadView(BaseModel):
    """`GET /v1/threads/{thread_id}`: the messages, oldest first. `last_event_id` is where the thread's event
    stream continues from this view (as Last-Event-ID): messages accepted after it, and every event of its first
    message that has not finished."""

    thread_id: str
    workflow_id: str
    messages: list[MessageView]
    last_event_id: str


class ThreadSummary(BaseModel):
    id: str
    workflow_id: str
    started_at: datetime | None = None


class ThreadPage(BaseModel):
    threads: list[ThreadSummary]
    next_page_token: str | None = None


def thread_path(thread_id: str) -> str:
    return f"/v1/threads/{thread_id}"


def message_view(thread_id: str, records: list[MessageRecord], record: MessageRecord) -> MessageView:
    ahead = 0
    for earlier in records:
        if earlier.number >= record.number:
            break
        if earlier.state in ("queued", "running"):
            ahead += 1
    return MessageView(
        number=record.number,
        request_id=record.request_id,
        workflow_id=record.workflow_id,
        state=record.state,
        outcome=record.outcome,
        question=record.question,
        ahead=ahead if record.state == "queued" else 0,
        note=record.note,
        url=f"{thread_path(thread_id)}/messages/{record.request_id}",
        request_url=f"/v1/requests/{record.request_id}",
    )


def thread_view(thread: ToolloopThread, records: list[MessageRecord]) -> ThreadView:
    unfinished = [r.number for r in records if r.state in ("queued", "running")]
    last = records[-1].number if records else 0
    # From here: nothing announced again, and the first unfinished message from its start.
    cursor = Cursor(accepted=last, number=unfinished[0] if unfinished else last + 1, step=0)
    return ThreadView(
        thread_id=thread.thread_id,
        workflow_id=thread.workflow_id,
        messages=[message_view(thread.thread_id, records, r) for r in records],
        last_event_id=cursor.text(),
    )


@dataclass
class Cursor:
    """A place in a thread's event stream (the module's docstring)."""

    accepted: int = 0
    number: int = 1
    step: int = 0

    def text(self) -> str:
        return f"{self.accepted}.{self.number}.{self.step}"

    @classmethod
    def read(cls, text: str | None) -> Cursor | None:
        """None for text that is not a cursor this API gave."""
        if not text:
            return cls()
        parts = text.split(".")
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts):
            return None
        accepted, number, step = (int(p) for p in parts)
        return cls(accepted, max(number, 1), step)


def _event(kind: str, data: dict[str, Any], cursor: Cursor | None) -> dict[str, str]:
    event = {"event": kind, "data": json.dumps(data)}
    if cursor is not None:
        event["id"] = cursor.text()
    return event


async def thread_stream(
    thread: ToolloopThread,
    first: list[MessageRecord],
    cursor: Cursor,
    request_of: Callable[[str], ToolloopRequest],
    request_events: RequestEvents,
    disconnected: Callable[[], Any],
    *,
    until_idle: bool,
    stream_seconds: float,
    check_seconds: float,
) -> AsyncIterator[dict[str, str]]:
    """The thread's events after `cursor` (module docstring); `first` is its messages, already read. Open until
    the client goes away or `stream_seconds` pass; with `until_idle`, it ends once every message it has shown
    has finished and none is queued or running."""
    ends = time.monotonic() + stream_seconds
    inbox: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue(maxsize=1000)
    records = first

    async def watch() -> None:
        seen: list[MessageRecord] | None = first
        try:
            async with contextlib.aclosing(thread.follow()) as views:
                async for now in views:
                    if now != seen:
                        seen = now
                        await inbox.put(("view", 0, now))
            # The thread's workflow has ended (closed by its user once its messages ran, or terminated): nothing it
            # shows will change again, so the stream ends rather than wait for a message that will never be
            # recorded as finished (and after the last one's events, when every message did finish).
            await inbox.put(("closed", 0, None))
        except (RPCError, ThreadNotFound):
            await inbox.put(("error", 0, ("TEMPORAL_UNAVAILABLE", "the thread could not be read; retry")))
        except WorkflowQueryFailedError:
            await inbox.put(("error", 0, ("REQUEST_UNREADABLE", UNREADABLE_REQUEST)))

    async def forward(number: int, request_id: str, after: int) -> None:
        try:
            async with contextlib.aclosing(request_events(request_of(request_id), after)) as events:
                async for item in events:
                    await inbox.put(("event", number, item))
        except RPCError:
            await inbox.put(("error", 0, ("TEMPORAL_UNAVAILABLE", "the request's events could not be read; retry")))
            return
        except WorkflowQueryFailedError:
            await inbox.put(("error", 0, ("REQUEST_UNREADABLE", UNREADABLE_REQUEST)))
            return
        await inbox.put(("done", number, None))

    tasks = [asyncio.create_task(watch())]
    runner: asyncio.Task[None] | None = None
    request_over = False
    thread_closed = False
    try:
        while True:
            for new in records:
                if new.number > cursor.accepted:
                    cursor.accepted = new.number
                    yield _event("message_accepted", _accepted(thread, records, new), cursor)
            while True:
                record = next((r for r in records if r.number >= cursor.number), None)
                if record is None or record.state == "queued":
                    break
                if record.number != cursor.number:  # an older message no longer kept
                    cursor.number, cursor.step = record.number, 0
                tag = {"number": record.number, "request_id": record.request_id}
                if record.state == "refused":
                    cursor.number, cursor.step = record.number + 1, 0
                    yield _event("message_refused", {**tag, "note": record.note}, cursor)
                    continue
                if cursor.step == 0:
                    cursor.step = 1
                    yield _event("message_started", {**tag, "workflow_id": record.workflow_id}, cursor)
                if runner is None:
                    request_over = False
                    runner = asyncio.create_task(forward(record.number, record.request_id, cursor.step - 1))
                    tasks.append(runner)
                if not (request_over and record.state == "finished"):
                    break
                # Its request's last event given, and the thread recorded how it ended.
                runner = None
                cursor.number, cursor.step = record.number + 1, 0
                yield _event("message_finished", {**tag, "outcome": record.outcome}, cursor)
            settled = all(r.state in ("finished", "refused") for r in records)
            if until_idle and settled and runner is None:
                return
            if thread_closed and (runner is None or not settled):
                detail = "the thread has been closed; it takes no more messages"
                yield _event("error", {"code": "THREAD_CLOSED", "detail": detail}, None)
                return
            if time.monotonic() >= ends or await disconnected():
                return
            try:
                kind, number, payload = await asyncio.wait_for(
                    inbox.get(), min(check_seconds, max(0.0, ends - time.monotonic()))
                )
            except TimeoutError:
                continue
            if kind == "view":
                records = payload
            elif kind == "closed":
                thread_closed = True
            elif kind == "error":
                code, detail = payload
                yield _event("error", {"code": code, "detail": detail}, None)
                return
            elif number == cursor.number and kind == "done":
                request_over = True
            elif number == cursor.number and kind == "event":
                event: dict[str, str] = payload
                data = json.loads(event["data"])
                data = {**data, "number": number, "request_id": _request_id(records, number)}
                if event["event"] == "error" and data.get("code") == ENDED_WITHOUT_REPORT:
                    # Its run was terminated: the thread records how the message ended (message_finished).
                    request_over = True
                    continue
                if event["event"] == "error":
                    # The request's events could not be read: said once, and the stream ends (reconnect).
                    yield _event("error", data, None)
                    return
                numbered = "id" in event
                if numbered:
                    cursor.step = 1 + int(event["id"])
                yield _event(event["event"], data, cursor if numbered else None)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _request_id(records: list[MessageRecord], number: int) -> str:
    return next((r.request_id for r in records if r.number == number), "")


def _accepted(thread: ToolloopThread, records: list[MessageRecord], record: MessageRecord) -> dict[str, Any]:
    view = message_view(thread.thread_id, records, record)
    return view.model_dump(include={"number", "request_id", "workflow_id", "question", "state", "ahead", "url"})
