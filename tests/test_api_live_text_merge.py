"""Unit tests (concurrency, no server): the API's event stream merges the request's events with the model's
live text, and however the stream ends - the last event, or a client that goes away while both sources are
busy and the merge is full - both readers stop and the events' own generator is closed (ending its long poll
on the run's history)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, cast

from toolloop._api.app import _with_live_text
from toolloop._core.live_text import Shown
from toolloop._temporal.client import ToolloopRequest


class Followed:
    """What the merge reads of a request: its live text, as fast as asked, until told to stop."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    async def live_text(self, until: Callable[[], bool] | None = None) -> AsyncIterator[Shown]:
        n = 0
        try:
            while until is None or not until():
                n += 1
                yield Shown("text", 1, 1, f"piece {n} ")
                await asyncio.sleep(0)
        finally:
            self.stopped.set()


async def test_events_and_text_arrive_merged_and_the_stream_ends_with_the_last_event() -> None:
    closed = asyncio.Event()

    async def events() -> AsyncGenerator[dict[str, str], None]:
        try:
            for n in range(1, 4):
                yield {"id": str(n), "event": "phase", "data": "{}"}
                await asyncio.sleep(0.01)
            yield {"id": "4", "event": "final", "data": "{}"}
        finally:
            closed.set()

    followed = Followed()
    got = [item async for item in _with_live_text(cast(ToolloopRequest, followed), events(), live=True)]

    numbered = [item["event"] for item in got if item["event"] != "model_text"]
    assert numbered == ["phase", "phase", "phase", "final"]
    assert got[-1]["event"] == "final"  # no text after the request's last event
    assert any(item["event"] == "model_text" for item in got)
    assert json.loads(next(i for i in got if i["event"] == "model_text")["data"])["kind"] == "text"
    assert closed.is_set() and followed.stopped.is_set()


async def test_a_client_gone_while_the_merge_is_full_leaves_nothing_running() -> None:
    closed = asyncio.Event()
    waiting = asyncio.Event()

    async def events() -> AsyncGenerator[dict[str, str], None]:
        try:
            yield {"id": "1", "event": "phase", "data": "{}"}
            waiting.set()
            await asyncio.Event().wait()  # a long poll that never returns on its own
            yield {"id": "2", "event": "final", "data": "{}"}
        finally:
            closed.set()

    followed = Followed()
    stream = cast(Any, _with_live_text(cast(ToolloopRequest, followed), events(), live=True))
    await stream.__anext__()
    await waiting.wait()
    # The text reader fills the merge (its bound) while nobody reads: the client has gone.
    await asyncio.sleep(0.2)
    before = asyncio.all_tasks()
    await stream.aclose()

    assert closed.is_set() and followed.stopped.is_set()
    leftover = [t for t in asyncio.all_tasks() if t in before and t is not asyncio.current_task() and not t.done()]
    assert [t for t in leftover if "pass_" in repr(t) or "wait" in repr(t.get_coro())] == []
