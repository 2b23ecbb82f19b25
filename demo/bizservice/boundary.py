"""I/O: the outermost ASGI layer - applies `after_commit` fault rules to the reply of a write whose effect
is already stored (stall it, replace it, drop it without a byte, or cut it short).

It must wrap the whole FastAPI app: only the callable the server calls directly can make the server
close the connection without a reply (see `_close_without_reply`).
"""

from __future__ import annotations

import asyncio

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from demo.bizservice import faults
from demo.bizservice.store import Store
from toolloop.servicekit import COMMITTED_FLAG

# Key in the request state (scope["state"]) the idempotency kit sets once a write has committed.
_COMMITTED = COMMITTED_FLAG


def _close_without_reply(reason: str) -> str:
    # uvicorn closes the transport when the app returns anything but None, without sending its usual 500
    # (it does send one when the app returns None before starting a response). Returning a value is the
    # only portable way an ASGI app has to hang up; the value is only logged by the server.
    return f"fault injected: {reason}"


class FaultBoundary:
    """Passes every request to `app`; holds back the reply of a committed write when a rule matches."""

    def __init__(self, app: ASGIApp, store: Store) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> str | None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return None
        # The same dict the endpoint's request.state writes to (the server may not provide one).
        state = scope.setdefault("state", {})
        rule: faults.FaultRule | None = None
        held: list[Message] = []

        async def send_or_hold(message: Message) -> None:
            nonlocal rule
            # The response starts only after the endpoint returned, so the commit mark is final here.
            if message["type"] == "http.response.start" and state.get(_COMMITTED):
                rule = await run_in_threadpool(faults.claim, self.store, scope["method"], scope["path"], "after_commit")
            if rule is None:
                await send(message)
            else:
                held.append(message)

        await self.app(scope, receive, send_or_hold)
        if rule is None:
            return None
        return await self._misbehave(rule, held, scope, receive, send)

    async def _misbehave(
        self, rule: faults.FaultRule, held: list[Message], scope: Scope, receive: Receive, send: Send
    ) -> str | None:
        if rule.latency_ms:
            await asyncio.sleep(rule.latency_ms / 1000)
        if rule.action == "drop":
            return _close_without_reply("reply dropped after commit")
        if rule.status is not None:
            await faults.fault_problem(rule.status).response()(scope, receive, send)
            return None
        if rule.action == "truncate":
            body = b"".join(m.get("body", b"") for m in held[1:])
            await send(held[0])  # headers, with the full Content-Length
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            return _close_without_reply("reply cut short after commit")
        for message in held:
            await send(message)
        return None
