"""The thread's event stream (toolloop/_api/threads.py) in one forced interleaving, without a server: the thread's
workflow ends (closed by its user once its messages ran) before the last message's request has given its last
event. The stream gives that event and the message's end first, and only then says the thread is closed.
(End to end, tests/test_api_threads_e2e.py; there the thread's end usually comes later by itself.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any, cast

from toolloop._api.threads import Cursor, thread_stream
from toolloop._core.threads import MessageRecord
from toolloop._temporal.client import ToolloopRequest, ToolloopThread

FINISHED = MessageRecord(
    number=1, request_id="m1", workflow_id="w1", submission="s", question="q", state="finished", outcome="answered"
)


class EndedThread:
    """A thread whose workflow has ended: its list once, then nothing more; `ended` is set when following stops."""

    thread_id = "t1"
    workflow_id = "thread-t1"

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    async def follow(self) -> AsyncGenerator[list[MessageRecord], None]:
        try:
            yield [FINISHED]
        finally:
            self.ended.set()


async def test_a_closed_threads_stream_gives_the_last_messages_end_before_it_says_closed() -> None:
    thread = EndedThread()

    async def request_events(_: ToolloopRequest, after: int) -> AsyncGenerator[dict[str, str], None]:
        # The request's last event arrives only once the thread's end has been seen.
        await thread.ended.wait()
        yield {"event": "final", "id": "1", "data": json.dumps({"status": "completed"})}

    async def connected() -> bool:
        return False

    stream = thread_stream(
        cast(ToolloopThread, thread),
        [FINISHED],
        Cursor(),
        lambda _: cast(ToolloopRequest, None),
        request_events,
        connected,
        until_idle=False,
        stream_seconds=60,
        check_seconds=5,
    )
    events: list[dict[str, Any]] = [{"event": e["event"], **json.loads(e["data"])} async for e in stream]
    assert [e["event"] for e in events] == [
        "message_accepted",
        "message_started",
        "final",
        "message_finished",
        "error",
    ]
    assert events[-1]["code"] == "THREAD_CLOSED" and events[3]["outcome"] == "answered"
