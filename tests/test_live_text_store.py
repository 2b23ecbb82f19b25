"""Tests (I/O): the live text store on a real redis-server - what a turn's attempt writes, what a reader reads
and follows, pieces gathered into few entries, the stream's expiry, and a store that does not answer never
failing the turn that writes to it."""

from __future__ import annotations

import asyncio

import pytest
import redis

from toolloop._core.live_text import LiveText, LiveTextView
from toolloop._live import store as store_module
from toolloop._live.store import LiveTextStore, stream_key


async def test_an_attempt_writes_start_text_and_end_and_a_reader_reads_them(live_text_url: str) -> None:
    async with LiveTextStore(live_text_url, ttl_seconds=600) as store:
        writer = store.writer("wf-1", "run-1", turn=2, attempt=1)
        await writer.start()
        await writer.text("Hello")
        await writer.end()

        entries = await store.read("wf-1", "run-1")
        # Another run's text is another stream.
        assert await store.read("wf-1", "run-2") == []

    # A first attempt opens with its first text (no start entry of its own).
    assert [(e.turn, e.attempt, e.kind, e.text) for e in entries] == [(2, 1, "text", "Hello"), (2, 1, "end", "")]
    assert all(e.position for e in entries)
    with redis.Redis.from_url(live_text_url) as plain:
        ttl = plain.ttl(stream_key("wf-1", "run-1"))
    assert 0 < ttl <= 600


async def test_pieces_written_quickly_are_gathered_into_one_entry_with_the_end(
    live_text_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A flush window no test run can outlast: an answer written faster than it is one entry, with its end.
    monkeypatch.setattr(store_module, "FLUSH_SECONDS", 3600.0)
    async with LiveTextStore(live_text_url) as store:
        writer = store.writer("wf-2", "run-1", turn=1, attempt=1)
        await writer.start()
        for piece in ["a", "b", "c", "d"]:
            await writer.text(piece)
        assert writer.wrote_text
        before_end = await store.read("wf-2", "run-1")
        await writer.end()
        entries = await store.read("wf-2", "run-1")

    assert before_end == []
    assert [(e.kind, e.text) for e in entries] == [("text", "abcd"), ("end", "")]


async def test_a_follower_sees_a_restart_and_the_newest_attempts_text_only(
    live_text_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "FLUSH_SECONDS", 0.0)  # each piece written on its own, at once
    async with LiveTextStore(live_text_url, wait_seconds=0.2) as store:
        done = asyncio.Event()
        seen: list[LiveText] = []
        arrived: dict[str, asyncio.Event] = {t: asyncio.Event() for t in ("half of an ans", "start", "wer, late")}

        async def follow() -> None:
            async for entry in store.follow("wf-3", "run-1", until=done.is_set):
                seen.append(entry)
                arrived.get(entry.text or entry.kind, asyncio.Event()).set()
                if entry.kind == "end" and entry.attempt == 2:
                    done.set()

        async def written(what: str) -> None:
            await asyncio.wait_for(arrived[what].wait(), timeout=30)

        follower = asyncio.create_task(follow())
        first = store.writer("wf-3", "run-1", turn=1, attempt=1)
        await first.start()
        await first.text("half of an ans")
        await written("half of an ans")
        second = store.writer("wf-3", "run-1", turn=1, attempt=2)
        await second.start()
        await written("start")
        await first.text("wer, late")  # the first attempt's worker is still going
        await written("wer, late")
        await second.text("The whole answer.")
        await second.end()
        await asyncio.wait_for(follower, timeout=30)

    # The late piece of attempt 1 is in the stream, after attempt 2 started; the view drops it.
    assert [(e.attempt, e.kind, e.text) for e in seen] == [
        (1, "text", "half of an ans"),
        (2, "start", ""),
        (1, "text", "wer, late"),
        (2, "text", "The whole answer."),
        (2, "end", ""),
    ]
    view = LiveTextView()
    shown = [s for entry in seen for s in view.add(entry)]
    assert [s.kind for s in shown] == ["text", "restarted", "text", "complete"]
    assert view.text_of(1) == "The whole answer."


async def test_reading_resumes_after_a_position(live_text_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "FLUSH_SECONDS", 0.0)
    async with LiveTextStore(live_text_url, wait_seconds=0.5) as store:
        writer = store.writer("wf-4", "run-1", turn=1, attempt=1)
        await writer.start()
        await writer.text("one")
        got: list[LiveText] = []
        async for entry in store.follow("wf-4", "run-1", until=lambda: bool(got)):
            got.append(entry)
        await writer.end()
        rest = await store.read("wf-4", "run-1", got[-1].position)
    assert [e.text for e in got] == ["one"]
    assert [e.kind for e in rest] == ["end"]


async def test_a_store_that_does_not_answer_never_fails_the_writer(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens on this port: every write fails at once, and the writer goes quiet after the first.
    store = LiveTextStore("redis://127.0.0.1:9/0", timeout_seconds=0.5)
    try:
        writer = store.writer("wf-5", "run-1", turn=1, attempt=1)
        await writer.start()
        await writer.text("text nobody will see")
        await writer.end()
    finally:
        await store.aclose()
    warnings = [r for r in caplog.records if "live text store unavailable" in r.getMessage()]
    assert len(warnings) == 1


def test_a_store_is_a_redis_url_and_its_password_is_never_shown() -> None:
    with pytest.raises(ValueError, match="a live text store is a Redis URL"):
        LiveTextStore("postgresql://db/x")
    assert "hunter2" not in repr(LiveTextStore("redis://:hunter2@cache.internal:6379/0"))
    assert "hunter2" not in repr(LiveTextStore("redis://cache.internal:6379/0?password=hunter2"))
    with pytest.raises(ValueError) as refused:
        LiveTextStore("cache.internal:6379?password=hunter2")
    assert "hunter2" not in str(refused.value)


async def test_pieces_held_back_are_written_even_when_no_more_come(live_text_url: str) -> None:
    # A model that pauses after a burst: what it wrote before the pause is shown without waiting for more.
    async with LiveTextStore(live_text_url, wait_seconds=0.5) as store:
        writer = store.writer("wf-6", "run-1", turn=1, attempt=1)
        await writer.start()
        await writer.text("Your")
        await writer.text(" order")  # within the flush window: held back with the first, then written
        found: list[str] = []
        seen = asyncio.Event()

        async def read() -> None:
            async for entry in store.follow("wf-6", "run-1", until=seen.is_set):
                found.append(entry.text)
                seen.set()

        await asyncio.wait_for(read(), timeout=30)
        await writer.end()
    assert found == ["Your order"]


async def test_a_turn_without_text_writes_nothing_but_a_retry_says_it_restarted(live_text_url: str) -> None:
    async with LiveTextStore(live_text_url) as store:
        # Tool calls only, first attempt: nothing to show, nothing written.
        calls_only = store.writer("wf-7", "run-1", turn=1, attempt=1)
        await calls_only.start()
        await calls_only.end(whole_text=None)
        assert await store.read("wf-7", "run-1") == []
        # Its retry writes start at once (what the first showed is void) even with no text of its own.
        retry = store.writer("wf-7", "run-1", turn=1, attempt=2)
        await retry.start()
        await retry.end(whole_text=None)
        # A model that does not stream: its whole text and the end in one write.
        plain = store.writer("wf-7", "run-1", turn=2, attempt=1)
        await plain.start()
        await plain.end(whole_text="The whole answer.")
        entries = await store.read("wf-7", "run-1")
    assert [(e.turn, e.attempt, e.kind, e.text) for e in entries] == [
        (1, 2, "start", ""),
        (1, 2, "end", ""),
        (2, 1, "text", "The whole answer."),
        (2, 1, "end", ""),
    ]


async def test_an_abandoned_attempt_writes_nothing_more(live_text_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "FLUSH_SECONDS", 3600.0)
    async with LiveTextStore(live_text_url) as store:
        writer = store.writer("wf-8", "run-1", turn=1, attempt=1)
        await writer.start()
        await writer.text("held back")  # waiting for the flush window
        await writer.abandon()  # the call failed
        await writer.end()
        entries = await store.read("wf-8", "run-1")
    assert entries == []
