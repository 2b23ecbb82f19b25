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

    async def events() -> AsyncGenerator[dict[str, str], None]:
        # More events than the merge holds: its reader ends up waiting to put one, the generator suspended.
        try:
            for n in range(1, 5000):
                yield {"id": str(n), "event": "phase", "data": "{}"}
            yield {"id": "5000", "event": "final", "data": "{}"}
        finally:
            closed.set()

    followed = Followed()
    before = set(asyncio.all_tasks())
    # Held here, as the API's own reader holds it: only an explicit close ends it, never the garbage collector.
    source = events()
    stream = cast(Any, _with_live_text(cast(ToolloopRequest, followed), source, live=True))
    await stream.__anext__()
    # Nobody reads on: the merge fills up (both readers waiting to put), then the client goes away.
    for _ in range(50):
        await asyncio.sleep(0)
    await stream.aclose()
    for _ in range(5):
        await asyncio.sleep(0)

    # The events' generator was closed (its long poll ends), the text reader stopped, and no task is left.
    assert closed.is_set() and followed.stopped.is_set()
    assert set(asyncio.all_tasks()) - before == set()
