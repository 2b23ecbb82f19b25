"""I/O: the threads phase - what a message in a thread costs against a single request of the same work, measured
in one run on the same worker and business service (issue 26: at most 1.1x in latency, worker CPU and history).

(a) Threads of `thread_messages` messages (`ToolloopClient.thread(...)`: send the message, wait for its request
to start, approve its write, read its report), each message the benchmark's request with a write of its own;
(b) chains of as many single requests (`ToolloopClient.run` with an approver, as the per-stack phase runs them),
one after another, the same requests. A chain's requests run one after another in both modes (a thread's
messages must). Per round and scenario, each mode in turn, the order reversed every other round:

- warm-up chains, not measured;
- latency: a few chains started `spacing_s` apart, each request's latency from its send to its report;
- load: `thread_chains` chains at once, position by position (every chain's k-th request sent together, the
  next once all have ended), one CPU window per position and one over them all; then every request's history,
  and each thread workflow's, whose bytes, events, workflow tasks and actions are shared by its messages."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bench.clients import (
    ACTOR,
    REQUEST_TIMEOUT_S,
    History,
    OursStack,
    Outcome,
    _approve_at_once,
    history_of,
    limits_for,
    new_request_id,
    outcome_of_result,
)
from bench.meter import CLIENT
from bench.report import (
    OURS,
    READS,
    SINGLE,
    THREAD,
    WRITE,
    Threads,
    ThreadsPosition,
    ThreadsRun,
    latency_of,
    per_request_ms,
)
from bench.scenarios import Scenario
from bench.stack import reset_service

if TYPE_CHECKING:
    from bench.phases import Bench

SCENARIOS = {WRITE: Scenario(reads=3, write=True), READS: Scenario(reads=3)}
WORKER, TEMPORAL = "worker-ours", "temporal"
# After the last position: the thread workflows' last task (the child's completion) runs after the client has
# the report; the load window waits this long for it, in both modes alike.
_SETTLE_S = 1.0
_HISTORY_FETCHES_IN_FLIGHT = 20


@dataclass
class Sample:
    """One request of a chain, as its client saw it."""

    position: int
    outcome: Outcome
    thread_workflow_id: str | None = None
    send_s: float | None = None
    start_wait_s: float | None = None
    # Unix times: the send, and the report in hand.
    sent_at: float = 0.0
    done_at: float = 0.0


class Chain:
    """`messages` requests one after another: the messages of one thread, or single requests."""

    def __init__(self, ours: OursStack, mode: str, scenario: Scenario, label: str) -> None:
        self.ours = ours
        self.mode = mode
        self.scenario = scenario
        self.label = label
        self.thread = ours.requests.thread(f"{label}-{uuid.uuid4().hex[:8]}", actor=ACTOR) if mode == THREAD else None

    async def request(self, position: int) -> Sample:
        # Each message writes its own event: the same write in a later message of a thread is the same
        # operation, told again and not done again - not the same work.
        scenario = replace(self.scenario, tag=f"m{position}")
        request_id = new_request_id(f"{self.label}-{position}", 0)
        sent_at = time.time()
        if self.thread is None:
            sample = Sample(position, await self.ours.run(scenario, request_id))
        else:
            sample = await self._message(position, scenario, request_id)
        sample.sent_at, sample.done_at = sent_at, time.time()
        return sample

    async def _message(self, position: int, scenario: Scenario, request_id: str) -> Sample:
        """What `ToolloopThread.run(question, approver=...)` does, timed step by step: send, wait for the
        request's start, approve its write as it waits, read its report."""
        assert self.thread is not None
        ours = self.ours
        sample = Sample(position, _failed(request_id, 0.0, "not sent"), self.thread.workflow_id)
        started = time.perf_counter()
        helper: asyncio.Task[Any] | None = None
        try:
            accepted = await self.thread.send(
                scenario.request_text(), request_id=request_id, model=ours.model, limits=limits_for(scenario)
            )
            sent = time.perf_counter()
            request = await self.thread.request(accepted)
            begun = time.perf_counter()
            if scenario.write:
                helper = asyncio.create_task(request.decide_each(_approve_at_once([])))
            result = await asyncio.wait_for(request.result(), REQUEST_TIMEOUT_S)
        except Exception as exc:
            sample.outcome = _failed(request_id, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
            return sample
        finally:
            if helper is not None:
                helper.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await helper
        sample.outcome = outcome_of_result(result, scenario, request_id, time.perf_counter() - started, ours.answer)
        sample.send_s, sample.start_wait_s = sent - started, begun - sent
        return sample

    async def run(self, positions: int) -> list[Sample]:
        return [await self.request(k) for k in range(1, positions + 1)]


def _failed(request_id: str, latency_s: float, error: str) -> Outcome:
    return Outcome(OURS, request_id, latency_s, False, 0, error)


# --- the phase ----------------------------------------------------------------------------------------------


async def threads(bench: Bench) -> None:
    """Both scenarios in both modes, in rounds; the ratios are the medians of the rounds' ratios."""
    sizes = bench.sizes
    found = Threads(messages=sizes.thread_messages)
    bench.results.threads = found
    for number in range(sizes.stack_rounds):
        modes = (SINGLE, THREAD) if number % 2 == 0 else (THREAD, SINGLE)
        measured: dict[str, dict[str, ThreadsRun]] = {}
        found.rounds.append(measured)
        for key, scenario in SCENARIOS.items():
            for mode in modes:
                bench.say(f"threads, round {number + 1} of {sizes.stack_rounds}: {key}, {mode}")
                await reset_service(bench.admin)
                measured.setdefault(key, {})[mode] = await _measure(bench, key, scenario, mode, number)


async def _measure(bench: Bench, key: str, scenario: Scenario, mode: str, number: int) -> ThreadsRun:
    sizes = bench.sizes
    n = sizes.thread_messages
    tag = f"th{number}-{key}-{mode}"

    def chains(what: str, count: int) -> list[Chain]:
        return [Chain(bench.ours, mode, scenario, f"{tag}-{what}{c}") for c in range(count)]

    warm = await asyncio.gather(*(c.run(n) for c in chains("w", sizes.thread_warmup_chains)))

    async def spaced_chain(c: int, chain: Chain) -> list[Sample]:
        await asyncio.sleep(c * sizes.spacing_s)
        return await chain.run(n)

    spaced = await asyncio.gather(
        *(spaced_chain(c, ch) for c, ch in enumerate(chains("s", sizes.thread_latency_chains)))
    )
    loaded_chains = chains("l", sizes.thread_chains)
    loaded: list[Sample] = []
    position_cpu: list[dict[str, float]] = []
    with bench.meter.window() as window:
        for k in range(1, n + 1):
            with bench.meter.window() as at_k:
                loaded += await asyncio.gather(*(chain.request(k) for chain in loaded_chains))
            position_cpu.append(at_k.cpu)
        await asyncio.sleep(_SETTLE_S)

    everything = [s for chain in (*warm, *spaced) for s in chain] + loaded
    errors = bench.check(f"threads {key}/{mode}", [s.outcome for s in everything])
    spaced_samples = [s for chain in spaced for s in chain]
    requests, thread_histories = await _histories(bench, [*loaded, *spaced_samples])
    loaded_threads = {s.thread_workflow_id for s in loaded}
    measured = len(loaded)

    def own(sample: Sample) -> History | None:
        return requests.get(sample.outcome.workflow_id or "")

    found = [h for h in (own(s) for s in loaded) if h is not None]
    # The thread workflows' bytes, events, tasks and actions, shared by their messages.
    shared = [h for w, h in thread_histories.items() if w in loaded_threads]
    share = measured if shared else 1
    thread_bytes = sum(h.bytes for h in shared) / share
    request_bytes = _mean([h.bytes for h in found])
    positions = []
    for k in range(1, n + 1):
        at = [s for s in loaded if s.position == k]
        histories_at = [h for h in (own(s) for s in at) if h is not None]
        positions.append(
            ThreadsPosition(
                position=k,
                latency_ms=_median_ms(
                    [s.outcome.latency_s for s in spaced_samples if s.position == k and s.outcome.ok]
                ),
                loaded_latency_ms=_median_ms([s.outcome.latency_s for s in at if s.outcome.ok]),
                worker_ms=per_request_ms(position_cpu[k - 1], WORKER, len(at)),
                request_history_bytes=_mean([h.bytes for h in histories_at]),
                input_bytes=_mean([h.bytes_by_type["EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"] for h in histories_at]),
            )
        )
    thread_samples = [s for s in [*spaced_samples, *loaded] if s.send_s is not None]
    timed = [(s, own(s)) for s in spaced_samples if s.outcome.ok]
    timed_runs = [(s, h) for s, h in timed if h is not None and h.started_at and h.closed_at]
    steps = [_steps(s, h, thread_histories.get(s.thread_workflow_id or "")) for s, h in timed_runs]
    own_tasks = _mean([h.workflow_tasks for h in found])
    thread_tasks = sum(h.workflow_tasks for h in shared) / share
    return ThreadsRun(
        mode=mode,
        scenario=key,
        requests=measured,
        errors=errors,
        latency=latency_of([s.outcome.latency_s for s in spaced_samples if s.outcome.ok]),
        loaded_latency=latency_of([s.outcome.latency_s for s in loaded if s.outcome.ok]),
        worker_ms=per_request_ms(window.cpu, WORKER, measured),
        server_ms=per_request_ms(window.cpu, TEMPORAL, measured),
        client_ms=per_request_ms(window.cpu, CLIENT, measured),
        request_history_bytes=request_bytes,
        thread_history_bytes=thread_bytes,
        history_bytes=request_bytes + thread_bytes if request_bytes is not None else None,
        history_events=_plus(_mean([h.events for h in found]), sum(h.events for h in shared) / share),
        workflow_tasks=_plus(own_tasks, thread_tasks),
        request_workflow_tasks=own_tasks,
        thread_workflow_tasks=thread_tasks,
        to_start_ms=_median_ms([h.started_at - s.sent_at for s, h in timed_runs if h.started_at]),
        run_ms=_median_ms([h.closed_at - h.started_at for s, h in timed_runs if h.closed_at and h.started_at]),
        after_end_ms=_median_ms([s.done_at - h.closed_at for s, h in timed_runs if h.closed_at]),
        approval_wait_ms=_median_ms(
            [
                h.first_timer_canceled_at - h.first_timer_at
                for _, h in timed_runs
                if h.first_timer_canceled_at and h.first_timer_at
            ]
        ),
        to_accepted_ms=_median_ms([step[0] for step in steps if step is not None]),
        accepted_to_initiated_ms=_median_ms([step[1] for step in steps if step is not None]),
        initiated_to_start_ms=_median_ms([step[2] for step in steps if step is not None]),
        actions=_plus(_mean([h.actions for h in found]), sum(h.actions for h in shared) / share),
        send_ms=_median_ms([s.send_s for s in thread_samples if s.send_s is not None]),
        start_wait_ms=_median_ms([s.start_wait_s for s in thread_samples if s.start_wait_s is not None]),
        positions=positions,
        request_bytes_by_event=_per_request([h.bytes_by_type for h in found], len(found)),
        thread_bytes_by_event=_per_request([h.bytes_by_type for h in shared], share) if shared else {},
        other_load_cores=window.other_load_cores,
    )


async def _histories(bench: Bench, samples: Sequence[Sample]) -> tuple[dict[str, History], dict[str, History]]:
    """Each request's history, and each thread workflow's (its latest run: a thread of a few messages does not
    continue as new)."""
    gate = asyncio.Semaphore(_HISTORY_FETCHES_IN_FLIGHT)
    client = bench.ours.client

    async def one(workflow_id: str) -> tuple[str, History]:
        async with gate:
            return workflow_id, await history_of(client, workflow_id)

    request_ids = {s.outcome.workflow_id for s in samples if s.outcome.workflow_id}
    thread_ids = {s.thread_workflow_id for s in samples if s.thread_workflow_id}
    requests = dict(await asyncio.gather(*(one(w) for w in request_ids if w)))
    thread_histories = dict(await asyncio.gather(*(one(w) for w in thread_ids if w)))
    return requests, thread_histories


def _steps(sample: Sample, request: History, thread: History | None) -> tuple[float, float, float] | None:
    """A message's way to its request's start: the send to the thread's accepting it (its chain's messages are
    sent one after another, so the k-th accepted send is message k), to the child's start initiated, to the
    child's first event (seconds)."""
    if thread is None or len(thread.sends_accepted_at) < sample.position or request.started_at is None:
        return None
    initiated = thread.child_initiated_at.get(sample.outcome.workflow_id or "")
    if initiated is None:
        return None
    accepted = thread.sends_accepted_at[sample.position - 1]
    return accepted - sample.sent_at, initiated - accepted, request.started_at - initiated


def _per_request(counters: Sequence[Counter[str]], requests: int) -> dict[str, float]:
    total: Counter[str] = Counter()
    for counter in counters:
        total.update(counter)
    return {kind: value / requests for kind, value in sorted(total.items())} if requests else {}


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median_ms(seconds: Sequence[float]) -> float | None:
    return statistics.median(seconds) * 1000 if seconds else None


def _plus(value: float | None, more: float) -> float | None:
    return None if value is None else value + more
