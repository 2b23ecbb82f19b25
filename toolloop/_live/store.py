"""I/O: the live text store - one Redis stream per workflow run, written by the model activity while a turn
streams and read by the clients that show it (the CLI, the API's event stream and through it the web page).

Why outside history: a streamed answer arrives in hundreds of pieces, and history must stay linear in the
conversation (each piece as a signal or an Update would multiply it), while heartbeats are billed actions and
throttled. The store holds display text only; what the turn decides is its activity's result, in history.
Several workers write to one store and any client reads it; a retried attempt writes again under its own
attempt number (toolloop._core.live_text says what a reader shows). Entries expire with their stream
(`ttl_seconds` after the last turn started) and a stream keeps its last `max_entries`.

Writing never fails a turn: a store that does not answer within `timeout_seconds` is logged once and the turn
goes on without live text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Self, cast

import redis.asyncio as redis
from redis.exceptions import RedisError

from toolloop._core.live_text import LiveText, LiveTextKind

logger = logging.getLogger(__name__)

START = "0-0"
# A piece of text waits at most this long for the next before it is written (fewer, larger entries).
FLUSH_SECONDS = 0.05


# What XREAD answers: per stream, its entries as (id, fields).
_XRead = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None


class LiveTextUnavailable(Exception):
    """The store did not answer a read (down, unreachable, refused)."""


def stream_key(workflow_id: str, run_id: str) -> str:
    return f"toolloop:live:{workflow_id}:{run_id}"


class LiveTextStore:
    """The live text of every run, in the Redis at `url` (`redis://host:port/db`, `rediss://` for TLS)."""

    def __init__(
        self,
        url: str,
        *,
        ttl_seconds: int = 3600,
        max_entries: int = 10_000,
        timeout_seconds: float = 2.0,
        wait_seconds: float = 1.0,
    ) -> None:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"a live text store is a Redis URL (redis://host:port/0), got {url.split('://')[0]!r}")
        self.url = url
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self.wait_seconds = wait_seconds
        # A read waits up to wait_seconds on the server: the socket's own timeout must outlast it.
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout_seconds + wait_seconds, socket_connect_timeout=timeout_seconds
        )

    def __repr__(self) -> str:
        return f"LiveTextStore({self.url.split('@')[-1]!r})"  # never the password of redis://:pw@host

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def writer(self, workflow_id: str, run_id: str, turn: int, attempt: int) -> LiveTextWriter:
        return LiveTextWriter(self, stream_key(workflow_id, run_id), turn, attempt)

    async def append(self, key: str, fields: dict[Any, Any], *, renew: bool = False) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(key, fields, maxlen=self.max_entries, approximate=True)
            if renew:
                pipe.expire(key, self.ttl_seconds)
            await pipe.execute()

    async def read(self, workflow_id: str, run_id: str, after: str = START, *, wait: bool = False) -> list[LiveText]:
        """The entries after position `after` (at most 1,000), waiting up to `wait_seconds` for the first
        when there is none yet and `wait` says so. LiveTextUnavailable when the store does not answer."""
        key = stream_key(workflow_id, run_id)
        block = int(self.wait_seconds * 1000) if wait else None
        try:
            answer = cast(_XRead, await self._redis.xread({key: after}, count=1000, block=block))
        except (RedisError, OSError) as exc:
            raise LiveTextUnavailable(f"the live text store did not answer ({type(exc).__name__})") from None
        return [_entry(position, fields) for _, entries in answer or [] for position, fields in entries]

    async def follow(
        self, workflow_id: str, run_id: str, until: Callable[[], bool], after: str = START
    ) -> AsyncIterator[LiveText]:
        """The run's entries as they are written, from position `after`, until `until()` is true (checked
        after each wait of at most `wait_seconds`; what was written before it became true is still given)."""
        while True:
            last = until()
            for entry in await self.read(workflow_id, run_id, after, wait=not last):
                after = entry.position
                yield entry
            if last:
                return


def _entry(position: bytes | str, fields: dict[bytes, bytes]) -> LiveText:
    def text(name: bytes) -> str:
        return fields.get(name, b"").decode("utf-8", "replace")

    kind = text(b"kind")
    return LiveText(
        turn=int(text(b"turn") or 0),
        attempt=int(text(b"attempt") or 0),
        kind=kind if kind in ("start", "text", "end") else "text",  # type: ignore[arg-type]
        text=text(b"text"),
        position=position.decode() if isinstance(position, bytes) else position,
    )


class LiveTextWriter:
    """One attempt of one turn writing its live text: `start`, `text` for each piece, `end` once the answer is
    complete. A piece is written at once when nothing was written for FLUSH_SECONDS; otherwise it waits with the
    next ones, at most FLUSH_SECONDS (a fast stream makes few entries, and a pause shows what came before it).
    Entries are written one at a time, in order."""

    def __init__(self, store: LiveTextStore, key: str, turn: int, attempt: int) -> None:
        self._store = store
        self._key = key
        self._turn = turn
        self._attempt = attempt
        self._pending: list[str] = []
        self._last_write = 0.0
        self._broken = False
        self._order = asyncio.Lock()
        self._later: asyncio.Task[None] | None = None
        self.wrote_text = False

    async def start(self) -> None:
        await self._write("start", renew=True)

    async def text(self, piece: str) -> None:
        if not piece:
            return
        self._pending.append(piece)
        self.wrote_text = True
        waited = time.monotonic() - self._last_write
        if waited >= FLUSH_SECONDS:
            await self._flush()
        elif self._later is None:
            self._later = asyncio.create_task(self._flush_after(FLUSH_SECONDS - waited))

    async def end(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        await self._flush()
        await self._write("end")

    async def _flush_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._later = None
        await self._flush()

    async def _flush(self) -> None:
        if self._pending:
            text, self._pending = "".join(self._pending), []
            self._last_write = time.monotonic()
            await self._write("text", text)

    async def _write(self, kind: LiveTextKind, text: str = "", *, renew: bool = False) -> None:
        fields = {"turn": self._turn, "attempt": self._attempt, "kind": kind, "text": text}
        async with self._order:
            if self._broken:
                return
            try:
                await self._store.append(self._key, fields, renew=renew)
            except (RedisError, OSError) as exc:
                # Display only: the turn goes on, its answer in history as ever.
                self._broken = True
                logger.warning(
                    "live text store unavailable; this turn goes on without live text",
                    extra={"store": repr(self._store), "error": type(exc).__name__},
                )
