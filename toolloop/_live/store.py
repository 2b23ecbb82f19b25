"""I/O: the live text store - one Redis stream per workflow run, written by the model activity while a turn
streams and read by the clients that show it (the CLI, the API's event stream and through it the web page).

Why outside history: a streamed answer arrives in hundreds of pieces, and history must stay linear in the
conversation (each piece as a signal or an Update would multiply it), while heartbeats are billed actions and
throttled. The store holds display text only; what the turn decides is its activity's result, in history.
Several workers write to one store and any client reads it; a retried attempt writes again under its own
attempt number (toolloop._core.live_text says what a reader shows). Entries expire with their stream
(`ttl_seconds` after an attempt's first write) and a stream keeps about its last `max_entries` (trimmed
approximately, as Redis does cheaply).

Writing never fails a turn: the first write of an attempt that fails (a store down, or not answering within its
socket and pool timeouts, a few seconds) is logged, and the attempt goes on without live text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Self, cast
from urllib.parse import urlsplit

import redis.asyncio as redis
from redis.exceptions import RedisError

from toolloop._core.live_text import LiveText, LiveTextKind

logger = logging.getLogger(__name__)

START = "0-0"
# Entries a read gives at most.
_PAGE = 1000
# A piece of text waits at most this long, with the next ones, before it is written (fewer, larger entries).
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
        max_connections: int = 1000,
    ) -> None:
        scheme = urlsplit(url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"a live text store is a Redis URL (redis://host:port/0), not a {scheme or 'bare'} one")
        self.url = url
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self.wait_seconds = wait_seconds
        # Each reader holds a connection while it waits (up to wait_seconds), so the pool must hold as many as
        # the readers of a process (the API's event streams); past it, a reader waits for one rather than fail.
        # A read's socket timeout outlasts its wait on the server. A piece of text that is not valid UTF-8
        # (a lone surrogate) is written with a replacement character rather than failing the write.
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_seconds,
            socket_timeout=timeout_seconds + wait_seconds,
            socket_connect_timeout=timeout_seconds,
            encoding_errors="replace",
        )
        self._redis = redis.Redis.from_pool(pool)

    def __repr__(self) -> str:
        # Never a password: neither redis://user:pw@host nor ?password=.
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        return f"LiveTextStore({parts.scheme}://{parts.hostname or ''}{port}{parts.path})"

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def writer(self, workflow_id: str, run_id: str, turn: int, attempt: int) -> LiveTextWriter:
        return LiveTextWriter(self, stream_key(workflow_id, run_id), turn, attempt)

    async def append(self, key: str, entries: list[dict[Any, Any]], *, renew: bool = False) -> None:
        """Add `entries` to the stream at `key` in one round trip (and with `renew`, start its time to live
        again)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for fields in entries:
                pipe.xadd(key, fields, maxlen=self.max_entries, approximate=True)
            if renew:
                pipe.expire(key, self.ttl_seconds)
            await pipe.execute()

    async def read(self, workflow_id: str, run_id: str, after: str = START, *, wait: bool = False) -> list[LiveText]:
        """The entries after position `after` (at most _PAGE), waiting up to `wait_seconds` for the first
        when there is none yet and `wait` says so. LiveTextUnavailable when the store does not answer."""
        key = stream_key(workflow_id, run_id)
        block = int(self.wait_seconds * 1000) if wait else None
        try:
            answer = cast(_XRead, await self._redis.xread({key: after}, count=_PAGE, block=block))
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
            page = await self.read(workflow_id, run_id, after, wait=not last)
            for entry in page:
                after = entry.position
                yield entry
            if last and len(page) < _PAGE:
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
    complete (or `abandon` when the attempt failed). A piece waits with the next ones for at most FLUSH_SECONDS
    (a fast stream makes few entries, an answer written faster than that one entry with its end, and a pause
    shows what came before it). Entries are written in order, one round trip each time.

    A turn's first attempt writes nothing until it has text (a reader opens the attempt with its first entry),
    and nothing at all when it has none (a turn of tool calls only); a later attempt writes `start` at once, so
    readers drop what the earlier one showed even when this one writes no text."""

    def __init__(self, store: LiveTextStore, key: str, turn: int, attempt: int) -> None:
        self._store = store
        self._key = key
        self._turn = turn
        self._attempt = attempt
        self._pending: list[str] = []
        self._broken = False
        self._renewed = False
        self._order = asyncio.Lock()
        # The flush waiting for its moment (at most one), and every flush not finished (abandon stops them).
        self._later: asyncio.Task[None] | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self.wrote_text = False

    async def start(self) -> None:
        if self._attempt > 1:
            await self._write([self._entry("start")])

    async def text(self, piece: str) -> None:
        if not piece or self._broken:
            return
        self._pending.append(piece)
        self.wrote_text = True
        if self._later is None:
            self._later = asyncio.create_task(self._flush_after(FLUSH_SECONDS))
            self._flushes.add(self._later)
            self._later.add_done_callback(self._flushes.discard)

    async def end(self, whole_text: str | None = None) -> None:
        """The answer is complete: what is held back, and `end`, in one write. `whole_text`: the answer's text,
        written here when no piece came (a model that does not stream: the same events, at once)."""
        later, self._later = self._later, None
        if later is not None:
            later.cancel()
        if not self.wrote_text and whole_text:
            self._pending, self.wrote_text = [whole_text], True
        entries = self._taken()
        if self.wrote_text or self._attempt > 1:
            entries.append(self._entry("end"))
        await self._write(entries)

    async def abandon(self) -> None:
        """The attempt failed or was cancelled: nothing more of it is written - what is held back is dropped and
        a write under way is stopped (the next attempt's `start` tells readers the turn restarted)."""
        self._broken = True
        self._pending = []
        self._later = None
        flushes = list(self._flushes)
        for flush in flushes:
            flush.cancel()
        await asyncio.gather(*flushes, return_exceptions=True)

    async def _flush_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._later = None
        await self._write(self._taken())

    def _taken(self) -> list[dict[str, Any]]:
        if not self._pending:
            return []
        text, self._pending = "".join(self._pending), []
        return [self._entry("text", text)]

    def _entry(self, kind: LiveTextKind, text: str = "") -> dict[str, Any]:
        return {"turn": self._turn, "attempt": self._attempt, "kind": kind, "text": text}

    async def _write(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        async with self._order:
            if self._broken:
                return
            try:
                # The stream's time to live starts again with each attempt's first write.
                await self._store.append(self._key, entries, renew=not self._renewed)
                self._renewed = True
            except Exception as exc:
                # Display only: whatever fails here, the turn goes on, its answer in history as ever.
                self._broken = True
                logger.warning(
                    "live text store unavailable; this turn goes on without live text",
                    extra={"store": repr(self._store), "error": type(exc).__name__},
                )
