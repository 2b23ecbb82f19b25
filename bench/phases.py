"""I/O: the benchmark's phases - each drives requests through the stacks, measures them (latency at the client,
CPU and memory per process, history from the server) and returns its figures. Every loop is bounded; a
request that fails outside the scale phase is recorded as a problem (the run then exits 1)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from temporalio.client import Client, WorkflowExecutionStatus

from bench.clients import (
    FloorStack,
    History,
    OursStack,
    Outcome,
    PlainStack,
    Run,
    Stack,
    floor_answered,
    history_of,
    new_request_id,
    outcome_of_result,
)
from bench.floor_workflow import FLOOR_WORKFLOW
from bench.meter import CLIENT, ProcessMeter
from bench.policy import policy
from bench.report import (
    FLOOR,
    MIB,
    OURS,
    PLAIN,
    READS,
    STACKS,
    WRITE,
    Cpu,
    GrowthPoint,
    Handoff,
    ParallelPoint,
    Recovery,
    Results,
    ScaleRun,
    Sizes,
    StackRun,
    add_round,
    latency_of,
    per_request_ms,
)
from bench.scenarios import ANSWER, CALENDAR, Scenario, content_bytes
from bench.stack import BenchStack, effects, reset_service, slow_write_rule, write_in_flight
from bench.streaming import streaming
from bench.threads import threads
from toolloop._core.contracts import AgentResult
from toolloop._core.names import AGENT_WORKFLOW
from toolloop._temporal.results import request_result

TEMPORAL, SERVICE = "temporal", "service"
WORKER = {OURS: "worker-ours", FLOOR: "worker-floor"}
SCENARIOS = {WRITE: Scenario(reads=3, write=True), READS: Scenario(reads=3)}
# Recovery: the write's POST waits this long at the service, so the worker can be killed while it is in flight.
SLOW_WRITE_MS = 3000
_HISTORY_FETCHES_IN_FLIGHT = 20
_SCALE_POLL_S = 0.5


@dataclass
class Bench:
    stack: BenchStack
    sizes: Sizes
    meter: ProcessMeter
    ours: OursStack
    floor: FloorStack
    plain: PlainStack
    admin: httpx.AsyncClient
    results: Results
    say: Callable[[str], None]

    def by_name(self, name: str) -> Stack:
        stacks: dict[str, Stack] = {OURS: self.ours, FLOOR: self.floor, PLAIN: self.plain}
        return stacks[name]

    def watch_processes(self) -> None:
        self.meter.watch(TEMPORAL, self.stack.temporal.pid)
        self.meter.watch(SERVICE, self.stack.service.pid)
        for name, proc in ((OURS, self.stack.ours_worker), (FLOOR, self.stack.floor_worker)):
            if proc is not None:
                self.meter.watch(WORKER[name], proc.pid)

    def check(self, where: str, outcomes: Sequence[Outcome]) -> int:
        """Record failed requests as a problem; returns how many failed."""
        failed = [o for o in outcomes if not o.ok]
        if failed:
            self.results.problems.append(
                f"{where}: {len(failed)} of {len(outcomes)} requests failed (first: {failed[0].error})"
            )
        return len(failed)


# --- Driving requests ---------------------------------------------------------------------------------------


async def spaced(run: Run, scenario: Scenario, n: int, spacing_s: float, phase: str) -> list[Outcome]:
    """`n` requests, each started `spacing_s` after the one before (whether or not it has finished)."""
    began = time.perf_counter()
    tasks: list[asyncio.Task[Outcome]] = []
    for i in range(n):
        await asyncio.sleep(max(0.0, began + i * spacing_s - time.perf_counter()))
        tasks.append(asyncio.create_task(run(scenario, new_request_id(phase, i))))
    return list(await asyncio.gather(*tasks))


async def closed_loop(stack: Stack, scenario: Scenario, n: int, in_flight: int, phase: str) -> list[Outcome]:
    """`n` requests, `in_flight` at a time."""
    gate = asyncio.Semaphore(max(1, in_flight))

    async def one(i: int) -> Outcome:
        async with gate:
            return await stack.run(scenario, new_request_id(phase, i))

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def histories(bench: Bench, outcomes: Sequence[Outcome], scenario: Scenario) -> dict[str, History]:
    """The history of every Temporal request; the floor's answered calls are counted from it."""
    gate = asyncio.Semaphore(_HISTORY_FETCHES_IN_FLIGHT)

    async def one(outcome: Outcome) -> tuple[str, History] | None:
        if outcome.workflow_id is None or outcome.stack == PLAIN:
            return None
        client = bench.ours.client if outcome.stack == OURS else bench.floor.client
        async with gate:
            found = await history_of(client, outcome.workflow_id)
        if outcome.stack == FLOOR and outcome.ok:
            outcome.calls_answered = floor_answered(found)
            if outcome.calls_answered != scenario.calls:
                outcome.ok = False
                outcome.error = f"{outcome.calls_answered} of {scenario.calls} calls answered"
        return outcome.workflow_id, found

    pairs = await asyncio.gather(*(one(o) for o in outcomes))
    return dict(p for p in pairs if p is not None)


def handoff_seconds(outcomes: Sequence[Outcome], found: dict[str, History], *, event_only: bool = False) -> list[float]:
    """From each approval wait's TimerStarted (server time) to the client having the approval request, or
    (`event_only`) having the event itself."""
    out = []
    for o in outcomes:
        history = found.get(o.workflow_id or "")
        known = o.timer_seen_at if event_only else o.approval_known_at
        if known is not None and history is not None and history.first_timer_at is not None:
            out.append(known - history.first_timer_at)
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# --- Per stack ----------------------------------------------------------------------------------------------


async def per_stack(bench: Bench) -> None:
    """Every scenario on every stack, in rounds: the stacks in one order and then the reverse, so a slow
    spell of a shared machine falls on each stack alike; the report takes the medians."""
    loaded_handoffs: list[float] = []
    rounds = bench.sizes.stack_rounds
    for number in range(rounds):
        order = STACKS if number % 2 == 0 else STACKS[::-1]
        for key, scenario in SCENARIOS.items():
            runs: dict[str, StackRun] = {}
            for name in order:
                bench.say(f"per stack, round {number + 1} of {rounds}: {key} on {name}")
                await reset_service(bench.admin)
                runs[name], handoffs = await _measure_stack(bench, name, key, scenario)
                loaded_handoffs += handoffs
            add_round(bench.results, key, runs)
    if loaded_handoffs:
        handoff = bench.results.handoff or Handoff(spaced=None)
        handoff.loaded = latency_of(loaded_handoffs)
        bench.results.handoff = handoff


async def _measure_stack(bench: Bench, name: str, key: str, scenario: Scenario) -> tuple[StackRun, list[float]]:
    sizes = bench.sizes
    stack = bench.by_name(name)
    phase = f"{key}-{name}"
    warm = await closed_loop(stack, scenario, sizes.warmup, sizes.in_flight, f"warm-{phase}")
    bench.meter.reset_peaks()
    spaced_out = await spaced(stack.run, scenario, sizes.spaced, sizes.spacing_s, f"spaced-{phase}")
    with bench.meter.window() as window:
        loaded = await closed_loop(stack, scenario, sizes.throughput, sizes.in_flight, f"loaded-{phase}")
    worker = WORKER.get(name)
    peak = bench.meter.peak(worker) if worker else None
    found = await histories(bench, [*warm, *spaced_out, *loaded], scenario)
    everything = [*warm, *spaced_out, *loaded]
    errors = bench.check(f"per stack {key}/{name}", everything)
    loaded_histories = [found[o.workflow_id] for o in loaded if o.workflow_id in found]
    n = len(loaded)
    cpu = window.cpu
    run = StackRun(
        stack=name,
        scenario=key,
        requests=len(everything),
        errors=errors,
        calls_expected=scenario.calls * len(everything),
        calls_answered=sum(o.calls_answered for o in everything),
        latency=latency_of([o.latency_s for o in spaced_out if o.ok]),
        throughput_rps=n / window.wall_s if window.wall_s > 0 else None,
        cpu=Cpu(
            # (c) has no worker: its loop runs in this process, so that is its "worker".
            worker_ms=per_request_ms(cpu, worker or CLIENT, n),
            server_ms=per_request_ms(cpu, TEMPORAL, n),
            client_ms=per_request_ms(cpu, CLIENT, n) if worker else None,
            service_ms=per_request_ms(cpu, SERVICE, n),
        ),
        history_events=_mean([h.events for h in loaded_histories]),
        history_bytes=_mean([h.bytes for h in loaded_histories]),
        # Every action of both stacks is in history: neither client asks a query ((a)'s approver learns what
        # waits from the workflow's next_approval Update, an action history records).
        actions=_mean([h.actions for h in loaded_histories]),
        worker_peak_rss_mib=peak / MIB if peak else None,
        other_load_cores=window.other_load_cores,
    )
    return run, handoff_seconds(loaded, found) if name == OURS else []


# --- Parallel reads -----------------------------------------------------------------------------------------


async def parallel_reads(bench: Bench) -> None:
    """Each size's spaced requests in two passes, the stacks in one order and then the other, so a slow
    spell of a shared machine falls on every stack alike."""
    sizes = bench.sizes
    await reset_service(bench.admin)
    for reads in sizes.parallel_reads:
        scenario = Scenario(reads=reads)
        samples: dict[str, list[float]] = {name: [] for name in STACKS}
        with bench.meter.window() as window:
            for order in (STACKS, STACKS[::-1]):
                for name in order:
                    bench.say(f"parallel reads: {reads} on {name}")
                    stack = bench.by_name(name)
                    phase = f"par{reads}-{name}"
                    warm = await closed_loop(stack, scenario, 1, 1, f"warm-{phase}")
                    n = (sizes.parallel_spaced + 1) // 2
                    out = await spaced(stack.run, scenario, n, sizes.spacing_s, phase)
                    await histories(bench, [*warm, *out], scenario)
                    bench.check(f"parallel reads {reads}/{name}", [*warm, *out])
                    samples[name] += [o.latency_s for o in out if o.ok]
        latency = {name: latency_of(values) for name, values in samples.items()}
        bench.results.parallel.append(
            ParallelPoint(reads=reads, latency=latency, other_load_cores=window.other_load_cores)
        )


# --- Growth -------------------------------------------------------------------------------------------------


async def growth(bench: Bench) -> None:
    sizes = bench.sizes
    await reset_service(bench.admin)
    for rounds in sizes.growth_rounds:
        scenario = Scenario(reads=1, rounds=rounds, output_bytes=sizes.growth_output_bytes)
        sizes_by_stack: dict[str, float] = {}
        events: dict[str, float] = {}
        latency: dict[str, float] = {}
        for name in (OURS, FLOOR):
            bench.say(f"growth: {rounds} rounds on {name}")
            stack = bench.by_name(name)
            out = [
                await stack.run(scenario, new_request_id(f"growth{rounds}-{name}", i))
                for i in range(sizes.growth_requests)
            ]
            found = await histories(bench, out, scenario)
            bench.check(f"growth {rounds}/{name}", out)
            measured = [found[o.workflow_id] for o in out if o.workflow_id in found]
            sizes_by_stack[name] = _mean([h.bytes for h in measured]) or 0.0
            events[name] = _mean([h.events for h in measured]) or 0.0
            latency[name] = _mean([o.latency_s for o in out]) or 0.0
        bench.results.growth.append(
            GrowthPoint(
                rounds=rounds,
                content_bytes=content_bytes(scenario),
                history_bytes=sizes_by_stack,
                history_events=events,
                latency_s=latency,
            )
        )


# --- Approval hand-off --------------------------------------------------------------------------------------


async def handoff(bench: Bench) -> None:
    bench.say("approval hand-off")
    await reset_service(bench.admin)
    scenario = SCENARIOS[WRITE]
    warm = await closed_loop(bench.ours, scenario, 1, 1, "warm-handoff")
    traced = functools.partial(bench.ours.run, trace=True)
    out = await spaced(traced, scenario, bench.sizes.handoff, bench.sizes.spacing_s, "handoff")
    found = await histories(bench, [*warm, *out], scenario)
    bench.check("approval hand-off", [*warm, *out])
    found_handoff = bench.results.handoff or Handoff(spaced=None)
    found_handoff.spaced = latency_of(handoff_seconds(out, found))
    found_handoff.event_delivered = latency_of(handoff_seconds(out, found, event_only=True))
    bench.results.handoff = found_handoff


# --- Scale --------------------------------------------------------------------------------------------------


async def scale(bench: Bench) -> None:
    for n in bench.sizes.scale:
        for name in (OURS, FLOOR):
            bench.say(f"scale: {n:,} at once on {name}")
            await reset_service(bench.admin)
            bench.results.scale.append(await _scale_run(bench, name, n))


def _visibility_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def _scale_run(bench: Bench, name: str, n: int) -> ScaleRun:
    stack: OursStack | FloorStack = bench.ours if name == OURS else bench.floor
    client = stack.client
    worker = WORKER[name]
    scenario = SCENARIOS[READS]
    await asyncio.sleep(1.0)  # let the previous phase's stragglers settle before the idle figure
    idle = bench.meter.rss(worker)
    bench.meter.reset_peaks()
    since = datetime.now(UTC)
    workflow_type = AGENT_WORKFLOW if name == OURS else FLOOR_WORKFLOW
    query = f"WorkflowType = '{workflow_type}' AND StartTime >= '{_visibility_time(since)}'"
    gate = asyncio.Semaphore(bench.sizes.scale_start_concurrency)
    started: list[str] = []
    start_errors: list[str] = []

    async def start_one(i: int) -> None:
        async with gate:
            try:
                handle = await stack.start(scenario, new_request_id(f"scale{n}-{name}", i))
            except Exception as exc:
                start_errors.append(f"{type(exc).__name__}: {exc}")
                return
            started.append(handle.id)

    timeline: list[list[float]] = [[0.0, 0.0, (idle or 0) / MIB]]
    peak_open = 0
    # Generous, and bounded: a worker that cannot keep up is reported, not waited for forever.
    give_up_at = time.perf_counter() + 120 + n * 0.2
    with bench.meter.window() as window:
        first_start = time.time()
        starter = asyncio.ensure_future(asyncio.gather(*(start_one(i) for i in range(n))))
        while time.perf_counter() < give_up_at:
            await asyncio.sleep(_SCALE_POLL_S)
            closed = (await client.count_workflows(f"{query} AND ExecutionStatus != 'Running'")).count
            open_now = max(len(started) - closed, 0)
            peak_open = max(peak_open, open_now)
            rss = bench.meter.rss(worker)
            timeline.append([time.time() - first_start, float(open_now), (rss or 0) / MIB])
            if starter.done() and closed >= len(started):
                break
        if not starter.done():
            starter.cancel()
    peak = bench.meter.peak(worker)

    close_times: list[float] = []
    completed_ids: list[str] = []
    unfinished: list[str] = []
    async for execution in client.list_workflows(query, page_size=1000):
        if execution.status == WorkflowExecutionStatus.COMPLETED:
            completed_ids.append(execution.id)
            if execution.close_time is not None:
                close_times.append(execution.close_time.timestamp())
        elif execution.status == WorkflowExecutionStatus.RUNNING:
            unfinished.append(execution.id)
    answered, why = await _answered(bench, name, completed_ids, scenario)
    why.update(f"start failed: {e}" for e in start_errors)
    if unfinished:
        why["not finished in time (terminated)"] += len(unfinished)
    await _terminate(client, unfinished)
    return ScaleRun(
        stack=name,
        requests=n,
        completed=answered,
        errors=len(start_errors) + (len(started) - len(unfinished) - answered),
        drain_s=(max(close_times) - first_start) if close_times else None,
        peak_open=peak_open,
        idle_rss_mib=idle / MIB if idle else None,
        peak_rss_mib=peak / MIB if peak else None,
        cpu=Cpu(
            worker_ms=per_request_ms(window.cpu, worker, n),
            server_ms=per_request_ms(window.cpu, TEMPORAL, n),
            client_ms=per_request_ms(window.cpu, CLIENT, n),
            service_ms=per_request_ms(window.cpu, SERVICE, n),
        ),
        timeline=timeline,
        failures=dict(why),
        other_load_cores=window.other_load_cores,
    )


async def _answered(bench: Bench, name: str, workflow_ids: list[str], scenario: Scenario) -> tuple[int, Counter[str]]:
    """How many completed runs answered with every call made ((a) from its report, (b) from its answer), and
    why the others did not."""
    gate = asyncio.Semaphore(50)
    why: Counter[str] = Counter()

    async def one(workflow_id: str) -> bool:
        async with gate:
            if name == OURS:
                handle = bench.ours.client.get_workflow_handle(workflow_id, result_type=AgentResult)
                result = await request_result(handle)
                if outcome_of_result(result, scenario, workflow_id, 0.0).ok:
                    return True
                codes = sorted({str(c.code) for c in result.calls if not c.ok})
                why[f"{result.stop_reason}, failed calls: {', '.join(codes) or 'none'}"] += 1
                return False
            answer: str = await bench.floor.client.get_workflow_handle(workflow_id, result_type=str).result()
            if answer != ANSWER:
                why["another answer"] += 1
            return answer == ANSWER

    return sum(await asyncio.gather(*(one(w) for w in workflow_ids))), why


async def _terminate(client: Client, workflow_ids: list[str]) -> None:
    gate = asyncio.Semaphore(50)

    async def one(workflow_id: str) -> None:
        async with gate:
            await client.get_workflow_handle(workflow_id).terminate("benchmark: not finished in time")

    await asyncio.gather(*(one(w) for w in workflow_ids), return_exceptions=True)


# --- Recovery -----------------------------------------------------------------------------------------------


async def recovery(bench: Bench) -> None:
    for name in (OURS, FLOOR):
        bench.say(f"recovery on {name}")
        found = await _recovery_run(bench, name)
        bench.results.recovery.append(found)
        if found.effects != 1 or not found.completed:
            bench.results.problems.append(
                f"recovery {name}: {found.effects} effect(s) for {found.operation_id}, state {found.final_state}"
            )
    await reset_service(bench.admin)


async def _recovery_run(bench: Bench, name: str) -> Recovery:
    stack = bench.by_name(name)
    scenario = SCENARIOS[WRITE]
    await reset_service(bench.admin, slow_write_rule(SLOW_WRITE_MS))
    finished_at: list[float] = []

    async def run() -> Outcome:
        outcome = await stack.run(scenario, new_request_id(f"recovery-{name}", 0))
        finished_at.append(time.perf_counter())
        return outcome

    task = asyncio.create_task(run())
    path = f"/calendars/{CALENDAR}/events"
    deadline = time.perf_counter() + 60
    while not await write_in_flight(bench.admin, path):
        if task.done() or time.perf_counter() > deadline:
            outcome = await task
            raise RuntimeError(f"recovery {name}: the write never was in flight ({outcome.error})")
        await asyncio.sleep(0.02)
    post_seen = time.perf_counter()
    await asyncio.sleep(0.5)  # well inside the POST's wait
    proc = bench.stack.ours_worker if name == OURS else bench.stack.floor_worker
    assert proc is not None
    proc.kill9()
    killed = time.perf_counter()
    restart = bench.stack.start_ours_worker if name == OURS else bench.stack.start_floor_worker
    new_proc = await asyncio.to_thread(restart)
    ready = time.perf_counter()
    bench.meter.watch(WORKER[name], new_proc.pid)
    outcome = await task
    done = finished_at[0] if finished_at and outcome.ok else None
    count = await effects(bench.admin, outcome.operation_id) if outcome.operation_id else 0
    return Recovery(
        stack=name,
        operation_id=outcome.operation_id or "?",
        completed=outcome.ok,
        final_state=outcome.final_state or ("completed" if outcome.ok else (outcome.error or "failed")),
        kill_after_post_s=killed - post_seen,
        restart_to_ready_s=ready - killed,
        ready_to_done_s=(done - ready) if done else None,
        restart_to_done_s=(done - killed) if done else None,
        effects=count,
    )


PHASES: dict[str, Callable[[Bench], Awaitable[None]]] = {
    "stacks": per_stack,
    "parallel": parallel_reads,
    "growth": growth,
    "handoff": handoff,
    "scale": scale,
    "recovery": recovery,
    "streaming": streaming,
    "threads": threads,
    "policy": policy,
}
