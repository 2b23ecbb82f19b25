"""Activity side (I/O): the worker's end-of-request hook (ToolloopPlugin(on_request_end=...)), run once a
request has its report, to free what the worker keeps per request (an adapter's state, a cache)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import activity

from toolloop._core.contracts import FinishedRequest
from toolloop._core.names import REQUEST_ENDED_ACTIVITY

RequestEndHook = Callable[[FinishedRequest], Awaitable[None]]


class RequestEndActivities:
    def __init__(self, hook: RequestEndHook | None) -> None:
        self._hook = hook

    @activity.defn(name=REQUEST_ENDED_ACTIVITY)
    async def request_ended(self, finished: FinishedRequest) -> None:
        # Registered on every worker, hook or not: a request a worker with a hook served may end on one without.
        if self._hook is not None:
            await self._hook(finished)
