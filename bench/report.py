"""Pure: the benchmark's figures - the sizes a run measures at, latency statistics, per-request costs, the
targets with the measured ratio and whether each is met, the JSON document and the Markdown report. No I/O:
the harness measures, this module computes and renders."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

OURS, FLOOR, PLAIN = "ours", "floor", "plain"
STACKS = (OURS, FLOOR, PLAIN)
STACK_LABELS = {OURS: "(a) toolloop", FLOOR: "(b) floor", PLAIN: "(c) plain asyncio"}
WRITE, READS = "write", "reads"
SCENARIO_LABELS = {
    WRITE: "write request (3 reads, then an approved write and its read-back)",
    READS: "reads only (3 reads)",
}
MIB = 1024 * 1024


# --- Sizes ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much each phase measures."""

    warmup: int = 5
    # The per-stack windows are measured this many times, the stacks in alternating order; each ratio is
    # the median of the rounds' ratios (one window's ratio moves by a fifth or more on a shared machine).
    stack_rounds: int = 3
    spaced: int = 30
    spacing_s: float = 0.3
    throughput: int = 100
    in_flight: int = 20
    parallel_reads: tuple[int, ...] = (1, 2, 4, 8, 16)
    parallel_spaced: int = 20
    growth_rounds: tuple[int, ...] = (1, 5, 10, 20, 40)
    growth_output_bytes: int = 50_000
    growth_requests: int = 2
    scale: tuple[int, ...] = (1000, 5000)
    scale_start_concurrency: int = 200
    handoff: int = 20
    # The threads phase: chains of this many messages (a thread) or single requests (the same work); this many
    # chains at once for CPU and history (the positions in step), fewer, started spacing_s apart, for latency.
    thread_messages: int = 5
    thread_chains: int = 20
    thread_latency_chains: int = 4
    thread_warmup_chains: int = 1
    # The policy phase: rounds of one window per stack, each `spaced` requests of each kind, interleaved.
    policy_rounds: int = 5


QUICK = Sizes(
    warmup=1,
    stack_rounds=2,
    spaced=3,
    throughput=6,
    in_flight=3,
    parallel_reads=(1, 8),
    parallel_spaced=2,
    growth_rounds=(1, 3),
    growth_requests=1,
    scale=(20,),
    scale_start_concurrency=20,
    handoff=3,
    thread_messages=2,
    thread_chains=3,
    thread_latency_chains=1,
    thread_warmup_chains=0,
    policy_rounds=2,
)


# --- Statistics -------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linearly interpolated between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Latency:
    median_ms: float
    p95_ms: float
    max_ms: float
    samples: int


def latency_of(seconds: Sequence[float]) -> Latency | None:
    """Median, p95 and max in milliseconds; None without samples."""
    if not seconds:
        return None
    ms = [s * 1000 for s in seconds]
    return Latency(median_ms=percentile(ms, 50), p95_ms=percentile(ms, 95), max_ms=max(ms), samples=len(ms))


def ratio(ours: float | None, base: float | None) -> float | None:
    if ours is None or base is None or base == 0:
        return None
    return ours / base


def per_request_ms(cpu_seconds: Mapping[str, float], name: str, requests: int) -> float | None:
    value = cpu_seconds.get(name)
    if value is None or requests <= 0:
        return None
    return 1000 * value / requests


# --- Figures ----------------------------------------------------------------------------------------------


@dataclass
class Cpu:
    """CPU milliseconds (user + system) per request, by process."""

    worker_ms: float | None
    server_ms: float | None
    client_ms: float | None
    service_ms: float | None


@dataclass
class StackRun:
    stack: str
    scenario: str
    requests: int
    errors: int
    calls_expected: int
    calls_answered: int
    latency: Latency | None
    throughput_rps: float | None
    cpu: Cpu
    history_events: float | None
    history_bytes: float | None
    worker_peak_rss_mib: float | None
    # Temporal Cloud's billable actions per request, counted from history (bench/actions.py).
    actions: float | None = None
    # Cores kept busy by processes outside the benchmark during the throughput run (a shared machine).
    other_load_cores: float | None = None


@dataclass
class ParallelPoint:
    reads: int
    latency: dict[str, Latency | None]
    other_load_cores: float | None = None


@dataclass
class GrowthPoint:
    rounds: int
    content_bytes: int
    history_bytes: dict[str, float]
    history_events: dict[str, float]
    latency_s: dict[str, float]
    ratio_to_content: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.ratio_to_content = {s: b / self.content_bytes for s, b in self.history_bytes.items()}


@dataclass
class ScaleRun:
    stack: str
    requests: int
    completed: int
    errors: int
    drain_s: float | None
    peak_open: int
    idle_rss_mib: float | None
    peak_rss_mib: float | None
    cpu: Cpu
    # [seconds since the first start, open requests, worker RSS MiB]
    timeline: list[list[float]] = field(default_factory=list)
    # Why requests did not complete with an answer: how many for each reason.
    failures: dict[str, int] = field(default_factory=dict)
    other_load_cores: float | None = None
    mib_per_open_request: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.mib_per_open_request = None
        if self.peak_rss_mib is not None and self.idle_rss_mib is not None and self.peak_open > 0:
            self.mib_per_open_request = max(self.peak_rss_mib - self.idle_rss_mib, 0.0) / self.peak_open


@dataclass
class Recovery:
    stack: str
    operation_id: str
    completed: bool
    final_state: str
    # From the write's POST being seen in flight at the service to the SIGKILL.
    kill_after_post_s: float
    restart_to_ready_s: float
    ready_to_done_s: float | None
    restart_to_done_s: float | None
    effects: int


@dataclass
class Handoff:
    """How long after an operation's approval wait started (its TimerStarted event) a waiting client had the
    approval request in hand."""

    spaced: Latency | None
    loaded: Latency | None = None
    # When a second client, following the run's history with a long poll, had the TimerStarted event itself
    # (for comparison: the approver's Update answers without it).
    event_delivered: Latency | None = None


# The streaming phase's two modes (bench/streaming.py).
STREAMED, PLAIN_ANSWERS = "streamed", "plain"


@dataclass
class StreamingRound:
    """One round: per mode, worker CPU per request (ms) and history per request (bytes)."""

    worker_ms: dict[str, float] = field(default_factory=dict)
    history_bytes: dict[str, float] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)

    def ratio(self, what: str) -> float | None:
        values = self.worker_ms if what == "worker_ms" else self.history_bytes
        plain, streamed = values.get(PLAIN_ANSWERS), values.get(STREAMED)
        return streamed / plain if plain and streamed is not None else None


@dataclass
class Streaming:
    rounds: list[StreamingRound] = field(default_factory=list)

    def median_ratio(self, what: str) -> float | None:
        ratios = [r for r in (run.ratio(what) for run in self.rounds) if r is not None]
        return _median(ratios)


# The threads phase's two modes (bench/threads.py): messages of threads, and single requests of the same work.
THREAD, SINGLE = "thread", "single"
THREAD_MODES = (THREAD, SINGLE)
MODE_LABELS = {THREAD: "a message in a thread", SINGLE: "a single request"}


@dataclass
class ThreadsPosition:
    """The figures of the messages (or requests) at one position of their chains (1: the first)."""

    position: int
    # Median latency (ms) in the latency pass, and with every chain at once (the loaded pass).
    latency_ms: float | None
    loaded_latency_ms: float | None
    # Worker CPU per request (ms) over this position's window of the loaded pass.
    worker_ms: float | None
    # The request's own history (bytes), and its first event (the input: a message's holds the thread's context).
    request_history_bytes: float | None
    input_bytes: float | None


@dataclass
class ThreadsRun:
    """One mode of one scenario in one round. Per request: a thread's own workflow is shared by its messages."""

    mode: str
    scenario: str
    requests: int
    errors: int
    latency: Latency | None
    loaded_latency: Latency | None
    worker_ms: float | None
    server_ms: float | None
    client_ms: float | None
    # The request's own history, the thread workflow's bytes divided by its messages (0 for a single request),
    # and their sum: what a message costs.
    request_history_bytes: float | None
    thread_history_bytes: float
    history_bytes: float | None
    history_events: float | None
    workflow_tasks: float | None
    actions: float | None
    # A message's client steps (None for a single request): the send_message Update (with the thread's start
    # for the first), and the wait for the message's request to start (following the thread, for a queued message).
    send_ms: float | None = None
    start_wait_ms: float | None = None
    # Where a request's latency goes (the latency pass, medians; server times against the client's clock on
    # the same machine): from the send to its workflow's start, its run, and from its end to the client.
    to_start_ms: float | None = None
    # A message's time to its request's start, in steps: from the send to the thread accepting the message (its
    # Update accepted), from there to the child's start initiated, and from there to the child's first event.
    to_accepted_ms: float | None = None
    accepted_to_initiated_ms: float | None = None
    initiated_to_start_ms: float | None = None
    # A write's approval wait in its request's run: from its timer's start to its cancel (the decision).
    approval_wait_ms: float | None = None
    run_ms: float | None = None
    after_end_ms: float | None = None
    # The workflow tasks of the request's own run, and its share of its thread workflow's.
    request_workflow_tasks: float | None = None
    thread_workflow_tasks: float = 0.0
    positions: list[ThreadsPosition] = field(default_factory=list)
    # Bytes per request by history event type: the request's own, and the thread workflow's share.
    request_bytes_by_event: dict[str, float] = field(default_factory=dict)
    thread_bytes_by_event: dict[str, float] = field(default_factory=dict)
    other_load_cores: float | None = None


def threads_value(run: ThreadsRun | None, what: str) -> float | None:
    if run is None:
        return None
    if what == "latency":
        return run.latency.median_ms if run.latency else None
    if what == "loaded_latency":
        return run.loaded_latency.median_ms if run.loaded_latency else None
    value = getattr(run, what)
    return float(value) if value is not None else None


@dataclass
class Threads:
    messages: int = 0
    # Every round: per scenario, per mode.
    rounds: list[dict[str, dict[str, ThreadsRun]]] = field(default_factory=list)

    def scenarios(self) -> list[str]:
        return [key for key in (WRITE, READS) if any(key in r for r in self.rounds)]

    def runs(self, scenario: str, mode: str) -> list[ThreadsRun]:
        return [r[scenario][mode] for r in self.rounds if mode in r.get(scenario, {})]

    def round_ratios(self, scenario: str, what: str) -> list[float]:
        """A message against a single request, in each round that measured both."""
        out = []
        for measured in self.rounds:
            runs = measured.get(scenario, {})
            value = ratio(threads_value(runs.get(THREAD), what), threads_value(runs.get(SINGLE), what))
            if value is not None:
                out.append(value)
        return out

    def median_ratio(self, scenario: str, what: str) -> float | None:
        return _median(self.round_ratios(scenario, what))

    def median(self, scenario: str, mode: str, what: str) -> float | None:
        return _median(threads_value(r, what) for r in self.runs(scenario, mode))


# The policy phase's two requests (bench/policy.py), on a stack that decides writes by policy: reads only, and the
# same request with one write in the same model turn that the policy allows by rule (no person in the loop).
POLICY_READS, BY_RULE = "reads", "by_rule"
POLICY_KINDS = (POLICY_READS, BY_RULE)
POLICY_STACKS = (OURS, FLOOR)
POLICY_KIND_LABELS = {POLICY_READS: "reads only", BY_RULE: "write by rule"}


@dataclass
class PolicyRun:
    """One stack's requests of one kind in one round of the policy phase; per request, means."""

    stack: str
    kind: str
    requests: int
    errors: int
    latency: Latency | None
    history_events: float | None = None
    history_bytes: float | None = None
    workflow_tasks: float | None = None
    actions: float | None = None
    # Per activity type: how many completed, and the milliseconds from scheduling to completion (summed).
    activities: dict[str, float] = field(default_factory=dict)
    activity_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class PolicyRound:
    # Per stack, per kind.
    runs: dict[str, dict[str, PolicyRun]] = field(default_factory=dict)
    # Per stack's window: the cores other processes kept busy, and the 1-minute load average at its start and end.
    other_load_cores: dict[str, float | None] = field(default_factory=dict)
    load_average: dict[str, list[float]] = field(default_factory=dict)

    def latency(self, stack: str, kind: str) -> float | None:
        run = self.runs.get(stack, {}).get(kind)
        return run.latency.median_ms if run is not None and run.latency is not None else None

    def value(self, what: str) -> float | None:
        """One of POLICY_FIGURES, from this round's median latencies."""
        ours_reads, ours_rule = self.latency(OURS, POLICY_READS), self.latency(OURS, BY_RULE)
        floor_reads, floor_rule = self.latency(FLOOR, POLICY_READS), self.latency(FLOOR, BY_RULE)
        if what == "ours_rule_over_reads":
            return ratio(ours_rule, ours_reads)
        if what == "floor_rule_over_reads":
            return ratio(floor_rule, floor_reads)
        if what == "reads_over_floor":
            return ratio(ours_reads, floor_reads)
        if what == "rule_over_floor":
            return ratio(ours_rule, floor_rule)
        if what == "overhead_over_floor":
            return ratio(ratio(ours_rule, ours_reads), ratio(floor_rule, floor_reads))
        if what == "write_ms_ours":
            return None if ours_rule is None or ours_reads is None else ours_rule - ours_reads
        if what == "write_ms_floor":
            return None if floor_rule is None or floor_reads is None else floor_rule - floor_reads
        if what == "added_over_floor":
            return ratio(self.value("write_ms_ours"), self.value("write_ms_floor"))
        raise ValueError(what)


POLICY_FIGURES = {
    "ours_rule_over_reads": "toolloop: write by rule / reads only",
    "floor_rule_over_reads": "floor: write by rule / reads only",
    "reads_over_floor": "reads only: toolloop / floor",
    "rule_over_floor": "write by rule: toolloop / floor",
    "overhead_over_floor": "(toolloop write by rule / reads only) / (floor's)",
    "added_over_floor": "what the write adds: toolloop / floor",
    "write_ms_ours": "what the write adds, toolloop (ms)",
    "write_ms_floor": "what the write adds, floor (ms)",
}
# Issue 27: a write decided by rule costs no more than 1.1x a reads-only request's latency, against the floor in
# one run. Three readings, each judged: toolloop's own ratio, toolloop's write by rule against the floor's, and
# toolloop's ratio against the floor's ratio (what the floor pays for the same write is not toolloop's cost).
_POLICY_TARGETS = ("ours_rule_over_reads", "rule_over_floor", "overhead_over_floor")


@dataclass
class PolicyBench:
    rule: str = ""
    rounds: list[PolicyRound] = field(default_factory=list)

    def round_values(self, what: str) -> list[float]:
        return [v for v in (r.value(what) for r in self.rounds) if v is not None]

    def median_value(self, what: str) -> float | None:
        return _median(self.round_values(what))

    def runs(self, stack: str, kind: str) -> list[PolicyRun]:
        return [r.runs[stack][kind] for r in self.rounds if kind in r.runs.get(stack, {})]

    def median(self, stack: str, kind: str, what: str) -> float | None:
        """The median over the rounds of one figure of a PolicyRun ("latency": its median ms)."""
        runs = self.runs(stack, kind)
        if what == "latency":
            return _median(r.latency.median_ms if r.latency else None for r in runs)
        if what.startswith("activities:") or what.startswith("activity_ms:"):
            field_name, activity = what.split(":", 1)
            return _median(getattr(r, field_name).get(activity, 0.0) for r in runs)
        return _median(getattr(r, what) for r in runs)


Comparison = Literal["max", "min", "eq"]


@dataclass
class Target:
    area: str
    name: str
    measured: float | None
    limit: float
    comparison: Comparison
    unit: str
    met: bool | None = field(init=False)

    def __post_init__(self) -> None:
        if self.measured is None:
            self.met = None
        elif self.comparison == "max":
            self.met = self.measured <= self.limit
        elif self.comparison == "min":
            self.met = self.measured >= self.limit
        else:
            self.met = self.measured == self.limit


@dataclass
class Results:
    meta: dict[str, Any]
    # Per scenario and stack: the median over the rounds (each figure on its own; see stack_rounds).
    stacks: dict[str, dict[str, StackRun]] = field(default_factory=dict)
    # Per scenario: every round's runs, in the order measured.
    stack_rounds: dict[str, list[dict[str, StackRun]]] = field(default_factory=dict)
    parallel: list[ParallelPoint] = field(default_factory=list)
    growth: list[GrowthPoint] = field(default_factory=list)
    scale: list[ScaleRun] = field(default_factory=list)
    recovery: list[Recovery] = field(default_factory=list)
    handoff: Handoff | None = None
    streaming: Streaming | None = None
    threads: Threads | None = None
    policy: PolicyBench | None = None
    # Anything that broke (a request that failed outside the scale phase, a recovery with != 1 effect).
    problems: list[str] = field(default_factory=list)


# --- Targets ----------------------------------------------------------------------------------------------


def _run_value(run: StackRun | None, what: str) -> float | None:
    if run is None:
        return None
    if what == "latency":
        return run.latency.median_ms if run.latency else None
    if what == "throughput":
        return run.throughput_rps
    if what == "worker_cpu":
        return run.cpu.worker_ms
    if what == "history":
        return run.history_bytes
    if what == "actions":
        return run.actions
    if what == "client_cpu":
        return run.cpu.client_ms
    raise ValueError(what)


def _ours_to_floor(runs: Mapping[str, StackRun], what: str) -> float | None:
    return ratio(_run_value(runs.get(OURS), what), _run_value(runs.get(FLOOR), what))


def _round_ratios(results: Results, scenario: str, what: str) -> list[float]:
    """(a) / (b) in each round that measured both."""
    found = (_ours_to_floor(runs, what) for runs in results.stack_rounds.get(scenario, []))
    return [value for value in found if value is not None]


def _versus_floor(results: Results, scenario: str, what: str) -> float | None:
    """The median of the rounds' ratios; without rounds, the ratio of the two stacks' figures."""
    rounds = _round_ratios(results, scenario, what)
    if rounds:
        return percentile(rounds, 50)
    return _ours_to_floor(results.stacks.get(scenario, {}), what)


def _median(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return percentile(found, 50) if found else None


def median_run(runs: Sequence[StackRun]) -> StackRun:
    """One stack's rounds as one run: each figure the median of the rounds' (counts summed, peaks the
    highest), so no single perturbed window decides a figure."""
    lats = [r.latency for r in runs if r.latency is not None]
    median_ms, p95_ms = _median(x.median_ms for x in lats), _median(x.p95_ms for x in lats)
    latency = (
        Latency(median_ms, p95_ms, max(x.max_ms for x in lats), sum(x.samples for x in lats))
        if lats and median_ms is not None and p95_ms is not None
        else None
    )
    peaks = [r.worker_peak_rss_mib for r in runs if r.worker_peak_rss_mib is not None]
    return StackRun(
        stack=runs[0].stack,
        scenario=runs[0].scenario,
        requests=sum(r.requests for r in runs),
        errors=sum(r.errors for r in runs),
        calls_expected=sum(r.calls_expected for r in runs),
        calls_answered=sum(r.calls_answered for r in runs),
        latency=latency,
        throughput_rps=_median(r.throughput_rps for r in runs),
        cpu=Cpu(
            worker_ms=_median(r.cpu.worker_ms for r in runs),
            server_ms=_median(r.cpu.server_ms for r in runs),
            client_ms=_median(r.cpu.client_ms for r in runs),
            service_ms=_median(r.cpu.service_ms for r in runs),
        ),
        history_events=_median(r.history_events for r in runs),
        history_bytes=_median(r.history_bytes for r in runs),
        actions=_median(r.actions for r in runs),
        worker_peak_rss_mib=max(peaks) if peaks else None,
        other_load_cores=_median(r.other_load_cores for r in runs),
    )


def add_round(results: Results, scenario: str, runs: Mapping[str, StackRun]) -> None:
    """Record one round of a scenario's runs and refresh the medians."""
    rounds = results.stack_rounds.setdefault(scenario, [])
    rounds.append(dict(runs))
    stacks = {name for r in rounds for name in r}
    results.stacks[scenario] = {
        name: median_run([r[name] for r in rounds if name in r]) for name in STACKS if name in stacks
    }


# Issue 24's targets: (a) against the floor (b) in the same run. The floor's client stands for a peer
# framework's client (it starts, approves and reads a result, following no history).
_STACK_TARGETS: dict[str, list[tuple[str, float, Comparison]]] = {
    WRITE: [
        ("latency", 0.7, "max"),
        ("throughput", 1.0, "min"),
        ("worker_cpu", 1.0, "max"),
        ("history", 1.3, "max"),
        ("actions", 1.0, "max"),
        ("client_cpu", 3.0, "max"),
    ],
    READS: [("latency", 0.95, "max"), ("throughput", 1.0, "min"), ("worker_cpu", 1.1, "max"), ("actions", 1.0, "max")],
}
_MEASURE_NAMES = {
    "latency": "median latency",
    "throughput": "throughput",
    "worker_cpu": "worker CPU per request",
    "history": "history bytes per request",
    "actions": "billable actions per request",
    "client_cpu": "client CPU per request",
}


# Issue 26: a message in a thread costs at most 1.1x a single request of the same work.
_THREADS_TARGETS = [("latency", 1.1), ("worker_ms", 1.1), ("history_bytes", 1.1)]
_THREADS_NAMES = {
    "latency": "median latency",
    "loaded_latency": "median latency, every chain at once",
    "worker_ms": "worker CPU per request",
    "server_ms": "server CPU per request",
    "client_ms": "client CPU per request",
    "history_bytes": "history per request",
    "workflow_tasks": "workflow tasks per request",
    "actions": "billable actions per request",
}


def targets(results: Results) -> list[Target]:
    """Every target of the issue with the measured value: a ratio of (a) against the floor (b) unless the
    unit says otherwise. A figure that was not measured (a phase left out) is None: neither met nor not."""
    out: list[Target] = []
    for scenario, rows in _STACK_TARGETS.items():
        area = SCENARIO_LABELS[scenario].split(" (")[0]
        for what, limit, comparison in rows:
            measured = _versus_floor(results, scenario, what)
            out.append(Target(area, f"{_MEASURE_NAMES[what]} vs floor", measured, limit, comparison, "x"))
    eight = next((p for p in results.parallel if p.reads == 8), None)
    if eight is not None:
        ours, floor = eight.latency.get(OURS), eight.latency.get(FLOOR)
        measured = ratio(ours.median_ms if ours else None, floor.median_ms if floor else None)
        out.append(Target("parallel reads", "8 reads in one turn: median latency vs floor", measured, 1.05, "max", "x"))
    for point in results.growth:
        measured = point.ratio_to_content.get(OURS)
        out.append(Target("growth", f"history vs content produced, {point.rounds} rounds", measured, 1.2, "max", "x"))
    base_cpu = _run_value(results.stacks.get(READS, {}).get(OURS), "worker_cpu")
    for run in results.scale:
        if run.stack != OURS:
            continue
        n = f"{run.requests:,} at once"
        out += [
            Target("scale", f"{n}: requests not completed or failed", float(run.requests - run.completed), 0, "eq", ""),
            Target(
                "scale",
                f"{n}: worker CPU per request vs the throughput run",
                ratio(run.cpu.worker_ms, base_cpu),
                1.1,
                "max",
                "x",
            ),
            Target("scale", f"{n}: memory per open request", run.mib_per_open_request, 0.1, "max", "MiB"),
        ]
    for rec in results.recovery:
        if rec.stack == OURS:
            out.append(Target("recovery", "effects after a SIGKILL mid-write", float(rec.effects), 1, "eq", ""))
    if results.streaming is not None:
        for what, name, limit in (
            ("worker_ms", "worker CPU per request, streamed vs plain answers", 1.05),
            ("history_bytes", "history per request, streamed vs plain answers", 1.1),
        ):
            measured = results.streaming.median_ratio(what)
            out.append(Target("streaming", name, measured, limit, "max", "x"))
    if results.threads is not None:
        for scenario in results.threads.scenarios():
            area = f"threads, {SCENARIO_LABELS[scenario].split(' (')[0]}"
            for what, limit in _THREADS_TARGETS:
                measured = results.threads.median_ratio(scenario, what)
                name = f"{_THREADS_NAMES[what]}: a message vs a single request"
                out.append(Target(area, name, measured, limit, "max", "x"))
    if results.policy is not None:
        for what in _POLICY_TARGETS:
            measured = results.policy.median_value(what)
            out.append(Target("policy, latency", POLICY_FIGURES[what], measured, 1.1, "max", "x"))
    if results.handoff is not None:
        spaced = results.handoff.spaced
        measured = spaced.p95_ms if spaced else None
        out.append(
            Target("approval hand-off", "p95 from the wait's start to the client knowing", measured, 20, "max", "ms")
        )
    return out


# --- JSON ---------------------------------------------------------------------------------------------------


def to_json(results: Results) -> dict[str, Any]:
    """The whole run as one JSON document: every figure, the ratios against the floor, and the targets."""
    doc = asdict(results)
    doc["ratios_vs_floor"] = {
        scenario: {what: _versus_floor(results, scenario, what) for what in _MEASURE_NAMES}
        for scenario in results.stacks
    }
    doc["ratios_by_round"] = {
        scenario: {what: _round_ratios(results, scenario, what) for what in _MEASURE_NAMES}
        for scenario in results.stack_rounds
    }
    if results.threads is not None:
        doc["threads_ratios"] = {
            scenario: {
                what: {
                    "median": results.threads.median_ratio(scenario, what),
                    "rounds": results.threads.round_ratios(scenario, what),
                }
                for what in _THREADS_NAMES
            }
            for scenario in results.threads.scenarios()
        }
    if results.policy is not None:
        doc["policy_figures"] = {
            what: {"median": results.policy.median_value(what), "rounds": results.policy.round_values(what)}
            for what in POLICY_FIGURES
        }
    doc["targets"] = [asdict(t) for t in targets(results)]
    return doc


# --- Markdown -----------------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _kib(value: float | None) -> float | None:
    return None if value is None else value / 1024


def _per_stack_rows(results: Results, scenario: str) -> list[list[str]]:
    runs = results.stacks[scenario]
    rows = []
    for stack in STACKS:
        run = runs.get(stack)
        if run is None:
            continue
        lat = run.latency
        rows.append(
            [
                STACK_LABELS[stack],
                fmt(lat.median_ms if lat else None),
                fmt(lat.p95_ms if lat else None),
                fmt(run.throughput_rps),
                fmt(run.cpu.worker_ms),
                fmt(run.cpu.server_ms),
                fmt(run.cpu.client_ms),
                fmt(run.cpu.service_ms),
                fmt(_kib(run.history_bytes), 2),
                fmt(run.history_events),
                fmt(run.actions),
                fmt(run.worker_peak_rss_mib),
                f"{run.calls_answered}/{run.calls_expected}",
                str(run.errors),
                fmt(run.other_load_cores, 2),
            ]
        )
    ours, floor = runs.get(OURS), runs.get(FLOOR)
    if ours is not None and floor is not None:

        def r(a: float | None, b: float | None) -> str:
            return fmt_ratio(ratio(a, b))

        def target(what: str) -> str:
            return fmt_ratio(_versus_floor(results, scenario, what))

        rows.append(
            [
                "**(a) / (b)**",
                target("latency"),
                r(ours.latency.p95_ms if ours.latency else None, floor.latency.p95_ms if floor.latency else None),
                target("throughput"),
                target("worker_cpu"),
                r(ours.cpu.server_ms, floor.cpu.server_ms),
                target("client_cpu"),
                r(ours.cpu.service_ms, floor.cpu.service_ms),
                target("history"),
                r(ours.history_events, floor.history_events),
                target("actions"),
                r(ours.worker_peak_rss_mib, floor.worker_peak_rss_mib),
                "",
                "",
                "",
            ]
        )
    return rows


def _met(target: Target) -> str:
    return {True: "met", False: "**not met**", None: "n/a"}[target.met]


def _limit(target: Target) -> str:
    sign = {"max": "≤", "min": "≥", "eq": "="}[target.comparison]
    return f"{sign} {target.limit:g}{target.unit and ' ' + target.unit if target.unit != 'x' else 'x'}"


def _measured(target: Target) -> str:
    if target.measured is None:
        return "n/a"
    if target.unit == "x":
        return fmt_ratio(target.measured)
    if target.unit == "MiB":
        return f"{target.measured:.4f} MiB"
    if target.unit == "ms":
        return f"{target.measured:.1f} ms"
    return f"{target.measured:g}"


def target_lines(results: Results) -> list[str]:
    """One line per target, for the console."""
    return [f"{_met(t).strip('*'):8} {t.area}: {t.name}: {_measured(t)} (target {_limit(t)})" for t in targets(results)]


def render_markdown(results: Results, plots: Sequence[str] = ()) -> str:
    meta = results.meta
    lines = ["# toolloop benchmark", ""]
    lines.append(
        "Measured side by side in one run on one machine: one Temporal dev server (SQLite, WAL), one business "
        f"service with {meta.get('latency_ms', 50)} ms of injected latency per business call. (a) is toolloop's "
        "AgentWorkflow, (b) the floor (a minimal hand-written workflow making the same business calls), (c) a "
        "plain asyncio loop with no durability. Ratios are (a) / (b)."
    )
    lines.append("")
    facts = [f"{k}: {v}" for k, v in meta.items() if not isinstance(v, dict) and k != "latency_ms"]
    if facts:
        lines += ["- " + "; ".join(facts)]
    for worker, counts in meta.get("worker_log_counts", {}).items():
        lines.append(
            f"- {worker} log: {counts.get('conversation_rebuilds', 0)} conversations rebuilt from history, "
            f"{counts.get('slow_workflow_tasks', 0)} workflow tasks over 5 s"
        )
    lines.append("")
    if results.problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in results.problems] + [""]

    if results.stacks:
        lines += ["## Per stack", ""]
        sizes = meta.get("sizes", {})
        lines.append(
            f"Latency: {sizes.get('spaced', '?')} requests started {sizes.get('spacing_s', '?')} s apart (after "
            f"{sizes.get('warmup', '?')} warm-up requests). Throughput, CPU and history: "
            f"{sizes.get('throughput', '?')} requests with {sizes.get('in_flight', '?')} in flight. CPU is user + "
            "system of each process: the worker (for (c) the loop's own process), the Temporal server, the "
            "benchmark's client and the business service. Other load: the cores that processes outside the "
            "benchmark kept busy meanwhile (the machine may be shared; well above 0 means perturbed figures). "
            "(a)'s client approves each write as soon as the workflow asks (`ToolloopClient.run` with an approver: "
            "the workflow's next_approval Update, sent with the start, answers when the write waits); "
            "(b)'s client sends its approval Update right after the start."
        )
        lines.append("")
        for scenario in results.stacks:
            lines += [f"### {SCENARIO_LABELS.get(scenario, scenario)}", ""]
            lines += _table(
                [
                    "stack",
                    "median ms",
                    "p95 ms",
                    "req/s",
                    "worker CPU ms/req",
                    "server CPU ms/req",
                    "client CPU ms/req",
                    "service CPU ms/req",
                    "history KiB/req",
                    "events/req",
                    "actions/req",
                    "worker peak RSS MiB",
                    "calls answered",
                    "errors",
                    "other load (cores)",
                ],
                _per_stack_rows(results, scenario),
            )
            rounds = len(results.stack_rounds.get(scenario, []))
            if rounds > 1:
                lines += ["", f"Each figure is the median of {rounds} rounds (stack order reversed every other round); "
                          "the (a) / (b) latency, throughput, worker CPU and history are the medians of the rounds' "
                          "ratios, which were:", ""]  # fmt: skip
                lines += [
                    f"- {_MEASURE_NAMES[what]}: "
                    + ", ".join(fmt_ratio(v) for v in _round_ratios(results, scenario, what))
                    for what in _MEASURE_NAMES
                ]
            lines.append("")
        lines += [p for p in (f"![latency]({p})" for p in plots if "latency" in p)] + [""]

    if results.parallel:
        lines += [
            "## Parallel reads",
            "",
            "Median latency of a request with N reads in one round (then the answer); the spaced requests in two "
            "passes, the stacks in one order and then the reverse.",
            "",
        ]
        rows = []
        for point in results.parallel:
            med = {s: (lat.median_ms if lat else None) for s, lat in point.latency.items()}
            rows.append(
                [
                    str(point.reads),
                    *(fmt(med.get(s)) for s in STACKS),
                    fmt_ratio(ratio(med.get(OURS), med.get(FLOOR))),
                    fmt(point.other_load_cores, 2),
                ]
            )
        header = ["reads", *(f"{STACK_LABELS[s]} ms" for s in STACKS), "(a) / (b)", "other load (cores)"]
        lines += _table(header, rows)
        lines += [""] + [f"![parallel reads]({p})" for p in plots if "parallel" in p] + [""]

    if results.growth:
        out_kb = meta.get("sizes", {}).get("growth_output_bytes", 0) / 1000
        lines += [
            "## Growth with rounds",
            "",
            f"One read per round returning {out_kb:g} KB. Content produced: the model's calls and answer and the "
            "tools' outputs, as compact JSON. History: the sum of the events' sizes.",
            "",
        ]
        rows = [
            [
                str(p.rounds),
                fmt(p.content_bytes / 1024),
                fmt(_kib(p.history_bytes.get(OURS))),
                fmt(_kib(p.history_bytes.get(FLOOR))),
                fmt_ratio(p.ratio_to_content.get(OURS)),
                fmt_ratio(p.ratio_to_content.get(FLOOR)),
                fmt(p.history_events.get(OURS), 0),
                fmt(p.history_events.get(FLOOR), 0),
                fmt(p.latency_s.get(OURS), 2),
                fmt(p.latency_s.get(FLOOR), 2),
            ]
            for p in results.growth
        ]
        lines += _table(
            [
                "rounds",
                "content KiB",
                "(a) history KiB",
                "(b) history KiB",
                "(a) / content",
                "(b) / content",
                "(a) events",
                "(b) events",
                "(a) s",
                "(b) s",
            ],
            rows,
        )
        lines += [""] + [f"![growth]({p})" for p in plots if "growth" in p] + [""]

    if results.scale:
        lines += [
            "## Scale",
            "",
            "N reads-only requests started at once (the start calls bounded in flight); drain: from the first "
            "start to the last completion; memory per open request: (worker peak RSS - idle RSS) / peak open "
            "requests; worker CPU per request against the same stack's reads-only throughput run above.",
            "",
        ]
        base = {s: (results.stacks.get(READS, {}).get(s)) for s in (OURS, FLOOR)}
        rows = []
        for run in results.scale:
            ref = base.get(run.stack)
            rows.append(
                [
                    STACK_LABELS[run.stack],
                    f"{run.requests:,}",
                    f"{run.completed:,}",
                    str(run.errors),
                    fmt(run.drain_s),
                    f"{run.peak_open:,}",
                    fmt(run.mib_per_open_request, 4),
                    fmt(run.cpu.worker_ms),
                    fmt_ratio(ratio(run.cpu.worker_ms, ref.cpu.worker_ms if ref else None)),
                    fmt(run.cpu.server_ms),
                    fmt(run.peak_rss_mib),
                    fmt(run.other_load_cores, 2),
                ]
            )
        lines += _table(
            [
                "stack",
                "requests",
                "completed",
                "errors",
                "drain s",
                "peak open",
                "MiB / open request",
                "worker CPU ms/req",
                "vs throughput run",
                "server CPU ms/req",
                "worker peak RSS MiB",
                "other load (cores)",
            ],
            rows,
        )
        for run in results.scale:
            for why, count in run.failures.items():
                lines += ["", f"- {STACK_LABELS[run.stack]}, {run.requests:,}: {count} not answered: {why}"]
        lines += [""] + [f"![scale]({p})" for p in plots if "scale" in p] + [""]

    if results.recovery:
        lines += [
            "## Recovery",
            "",
            "The write's POST made slow at the service; the worker SIGKILLed while it is in flight, then a new "
            "worker started. Effects: rows the service holds for the operation id.",
            "",
        ]
        rows = [
            [
                STACK_LABELS[r.stack],
                fmt(r.kill_after_post_s, 2),
                fmt(r.restart_to_ready_s, 2),
                fmt(r.ready_to_done_s, 2),
                fmt(r.restart_to_done_s, 2),
                r.final_state,
                str(r.effects),
            ]
            for r in results.recovery
        ]
        lines += _table(
            [
                "stack",
                "POST in flight → kill s",
                "restart → worker ready s",
                "ready → done s",
                "restart → done s",
                "final state",
                "effects",
            ],
            rows,
        )
        lines.append("")

    if results.handoff is not None:
        lines += [
            "## Approval hand-off",
            "",
            "From the TimerStarted event of an operation's approval wait (server time) to the moment a client "
            "deciding each write (`decide_each`: the workflow's next_approval Update answers in the workflow task "
            "that starts the wait) has the approval request in hand (same clock).",
            "",
        ]
        rows = []
        handoff = results.handoff
        for label, lat in (
            ("spaced", handoff.spaced),
            ("spaced: a history long poll's TimerStarted event, for comparison", handoff.event_delivered),
            (f"under load ({meta.get('sizes', {}).get('in_flight', '?')} in flight)", handoff.loaded),
        ):
            if lat is not None:
                rows.append([label, str(lat.samples), fmt(lat.median_ms), fmt(lat.p95_ms), fmt(lat.max_ms)])
        lines += _table(["requests", "samples", "median ms", "p95 ms", "max ms"], rows)
        lines.append("")

    if results.streaming is not None and results.streaming.rounds:
        lines += [
            "## Streaming",
            "",
            "Write requests (3 reads, the write, the answer of 800 characters) on two workers calling the `openai` "
            "model over HTTP: streamed answers written to a live text store (Redis), against plain answers and no "
            "store. Per round and mode: worker CPU per request (ms) and history per request (KiB); the ratios are "
            "streamed / plain.",
            "",
        ]
        rows = []
        for number, streamed_round in enumerate(results.streaming.rounds, start=1):
            rows.append(
                [
                    str(number),
                    fmt(streamed_round.worker_ms.get(STREAMED)),
                    fmt(streamed_round.worker_ms.get(PLAIN_ANSWERS)),
                    fmt_ratio(streamed_round.ratio("worker_ms")),
                    fmt(_kib(streamed_round.history_bytes.get(STREAMED)), 2),
                    fmt(_kib(streamed_round.history_bytes.get(PLAIN_ANSWERS)), 2),
                    fmt_ratio(streamed_round.ratio("history_bytes")),
                ]
            )
        lines += _table(
            ["round", "CPU streamed", "CPU plain", "ratio", "KiB streamed", "KiB plain", "ratio"],
            rows,
        )
        lines.append("")

    if results.threads is not None and results.threads.rounds:
        lines += _threads_section(results.threads, meta.get("sizes", {}))

    if results.policy is not None and results.policy.rounds:
        lines += _policy_section(results.policy, meta.get("sizes", {}))

    found = targets(results)
    if found:
        lines += ["## Targets", ""]
        lines += _table(
            ["area", "target", "measured", "limit", ""],
            [[t.area, t.name, _measured(t), _limit(t), _met(t)] for t in found],
        )
        lines.append("")
    return "\n".join(lines)


def _threads_section(threads: Threads, sizes: Mapping[str, Any]) -> list[str]:
    n = threads.messages
    lines = [
        "## Threads",
        "",
        f"(a) threads of {n} messages, each message the scenario's request with its own write; (b) chains of {n} "
        "single requests of the same work, one after another; the same worker and business service, the mode "
        "order reversed every other round. Latency: from the send to the report, at the client, "
        f"{sizes.get('thread_latency_chains', '?')} chains started {sizes.get('spacing_s', '?')} s apart "
        f"(after {sizes.get('thread_warmup_chains', '?')} warm-up chain); CPU, history and actions: "
        f"{sizes.get('thread_chains', '?')} chains at once, every chain's message k sent together (one CPU window "
        "per position). A message's history is its request's history plus its thread workflow's history divided "
        f"by the thread's {n} messages. Each figure is the median of the rounds; each ratio the median of the "
        "rounds' ratios.",
        "",
    ]
    for scenario in threads.scenarios():
        lines += _threads_scenario(threads, scenario)
    return lines


_THREADS_COLUMNS = ["latency", "loaded_latency", "worker_ms", "server_ms", "client_ms"]


def _threads_scenario(threads: Threads, scenario: str) -> list[str]:
    n = threads.messages
    columns = _THREADS_COLUMNS
    lines = [f"### {SCENARIO_LABELS.get(scenario, scenario)}", ""]
    rows = []
    for mode in THREAD_MODES:
        med = {what: threads.median(scenario, mode, what) for what in _THREADS_NAMES}
        rows.append(
            [
                MODE_LABELS[mode],
                *(fmt(med[what]) for what in columns),
                fmt(_kib(threads.median(scenario, mode, "request_history_bytes")), 2),
                fmt(_kib(threads.median(scenario, mode, "thread_history_bytes")), 2),
                fmt(_kib(med["history_bytes"]), 2),
                fmt(threads.median(scenario, mode, "history_events")),
                fmt(med["workflow_tasks"]),
                fmt(med["actions"]),
                str(sum(r.errors for r in threads.runs(scenario, mode))),
                fmt(threads.median(scenario, mode, "other_load_cores"), 2),
            ]
        )
    rows.append(
        [
            "**message / request**",
            *(fmt_ratio(threads.median_ratio(scenario, what)) for what in columns),
            fmt_ratio(threads.median_ratio(scenario, "request_history_bytes")),
            "",
            fmt_ratio(threads.median_ratio(scenario, "history_bytes")),
            fmt_ratio(threads.median_ratio(scenario, "history_events")),
            fmt_ratio(threads.median_ratio(scenario, "workflow_tasks")),
            fmt_ratio(threads.median_ratio(scenario, "actions")),
            "",
            "",
        ]
    )
    lines += _table(
        [
            "",
            "median ms",
            "median ms, all at once",
            "worker CPU ms/req",
            "server CPU ms/req",
            "client CPU ms/req",
            "request's history KiB",
            "thread's share KiB",
            "history KiB/req",
            "events/req",
            "workflow tasks/req",
            "actions/req",
            "errors",
            "other load (cores)",
        ],
        rows,
    )
    lines += ["", "The rounds' ratios (message / request):", ""]
    lines += [
        f"- {_THREADS_NAMES[what]}: " + ", ".join(fmt_ratio(v) for v in threads.round_ratios(scenario, what))
        for what in _THREADS_NAMES
    ]
    send = threads.median(scenario, THREAD, "send_ms")
    wait = threads.median(scenario, THREAD, "start_wait_ms")

    def split(mode: str) -> str:
        parts = [threads.median(scenario, mode, w) for w in ("to_start_ms", "run_ms", "after_end_ms")]
        return " + ".join(f"{fmt(v)} ms" for v in parts)

    def tasks(mode: str) -> str:
        own = threads.median(scenario, mode, "request_workflow_tasks")
        return f"{fmt(own)} of its request and {fmt(threads.median(scenario, mode, 'thread_workflow_tasks'))}"

    lines += [
        "",
        f"A message's client steps before it follows its request (median): the send (the send_message Update) "
        f"{fmt(send)} ms, the wait for its request's start (following the thread if queued) {fmt(wait)} ms. "
        "Latency split into the time from the send to the request's workflow start, its run (first to last "
        f"event) and from its end to the client having the report: a message {split(THREAD)}, a single "
        f"request {split(SINGLE)}. A message's time to its request's start in steps: to the thread accepting the "
        f"message {fmt(threads.median(scenario, THREAD, 'to_accepted_ms'))} ms, to the child's start initiated "
        f"{fmt(threads.median(scenario, THREAD, 'accepted_to_initiated_ms'))} ms, to the child's first event "
        f"{fmt(threads.median(scenario, THREAD, 'initiated_to_start_ms'))} ms. "
        + (
            f"The write's approval wait in the run (its timer's start to its cancel): a message "
            f"{fmt(threads.median(scenario, THREAD, 'approval_wait_ms'))} ms, a single request "
            f"{fmt(threads.median(scenario, SINGLE, 'approval_wait_ms'))} ms. "
            if scenario == WRITE
            else ""
        )
        + f"Workflow tasks per request: a message {tasks(THREAD)} of its thread's, a "
        f"single request {fmt(threads.median(scenario, SINGLE, 'request_workflow_tasks'))}.",
        "",
        "By position in the chain (medians of the rounds): a message's input holds the earlier messages "
        "(bounded by Limits.thread_turns).",
        "",
    ]
    position_rows = []
    for k in range(1, n + 1):

        def at(mode: str, what: str, k: int = k) -> float | None:
            values = [r.positions[k - 1] for r in threads.runs(scenario, mode) if len(r.positions) >= k]
            return _median(getattr(p, what) for p in values)

        position_rows.append(
            [
                str(k),
                fmt(at(THREAD, "latency_ms")),
                fmt(at(SINGLE, "latency_ms")),
                fmt(at(THREAD, "loaded_latency_ms")),
                fmt(at(SINGLE, "loaded_latency_ms")),
                fmt(at(THREAD, "worker_ms")),
                fmt(at(SINGLE, "worker_ms")),
                fmt(_kib(at(THREAD, "request_history_bytes")), 2),
                fmt(_kib(at(SINGLE, "request_history_bytes")), 2),
                fmt(_kib(at(THREAD, "input_bytes")), 2),
                fmt(_kib(at(SINGLE, "input_bytes")), 2),
            ]
        )
    lines += _table(
        [
            "position",
            "message ms",
            "request ms",
            "message ms, all at once",
            "request ms, all at once",
            "message worker CPU ms",
            "request worker CPU ms",
            "message's request history KiB",
            "request history KiB",
            "message input KiB",
            "request input KiB",
        ],
        position_rows,
    )
    lines += ["", "Where the bytes are (KiB per request, by history event type; medians of the rounds):", ""]
    kinds: dict[str, None] = {}
    for mode in THREAD_MODES:
        for r in threads.runs(scenario, mode):
            kinds.update(dict.fromkeys(r.request_bytes_by_event))
            kinds.update(dict.fromkeys(r.thread_bytes_by_event))

    def by_event(mode: str, kind: str, own: bool) -> float | None:
        runs = threads.runs(scenario, mode)
        return _median((r.request_bytes_by_event if own else r.thread_bytes_by_event).get(kind, 0.0) for r in runs)

    event_rows = []
    for kind in sorted(kinds, key=lambda k: -abs(_event_difference(threads, scenario, k))):
        single = by_event(SINGLE, kind, True)
        own = by_event(THREAD, kind, True)
        share = by_event(THREAD, kind, False)
        difference = (own or 0.0) + (share or 0.0) - (single or 0.0)
        event_rows.append(
            [
                kind.removeprefix("EVENT_TYPE_"),
                fmt(_kib(single), 2),
                fmt(_kib(own), 2),
                fmt(_kib(share), 2),
                f"{difference / 1024:+,.2f}",
            ]
        )
    lines += _table(
        ["event type", "single request", "message's request", "thread's share", "message - request"],
        event_rows,
    )
    lines.append("")
    return lines


def _event_difference(threads: Threads, scenario: str, kind: str) -> float:
    """A message's bytes of one event type (its request's and its thread's share) less a single request's."""

    def median(mode: str, own: bool) -> float:
        runs = threads.runs(scenario, mode)
        return (
            _median((r.request_bytes_by_event if own else r.thread_bytes_by_event).get(kind, 0.0) for r in runs) or 0.0
        )

    return median(THREAD, True) + median(THREAD, False) - median(SINGLE, True)


def _policy_section(policy: PolicyBench, sizes: Mapping[str, Any]) -> list[str]:
    lines = [
        "## Approval policies: a write decided by rule",
        "",
        "One stack that decides writes by policy: a business service in policy mode, a policy evaluator "
        f"(`python worker.py --policy`, rule `{policy.rule}`), toolloop's worker naming its task queue, and the "
        "floor's worker, which signs the rule's decision in its write activity (it evaluates no policy). Two "
        "requests: reads only (3 reads, then the answer) and the same with one write in the reads' model turn, "
        "after them, that the policy allows by rule (no person in the loop), and its read-back. Per round and "
        f"stack, one window of {sizes.get('spaced', '?')} requests of each kind, the kinds alternating, "
        f"{sizes.get('spacing_s', '?')} s apart, after {sizes.get('warmup', '?')} warm-up requests of each; the "
        "stack order reversed every other round. Latency from the start to the result, at the client; medians.",
        "",
    ]
    rows = []
    for number, measured in enumerate(policy.rounds, start=1):
        load = [
            f"{fmt(measured.other_load_cores.get(stack), 2)} "
            f"({'-'.join(fmt(v, 2) for v in measured.load_average.get(stack, []))})"
            for stack in POLICY_STACKS
        ]
        rows.append(
            [
                str(number),
                *(fmt(measured.latency(stack, kind)) for stack in POLICY_STACKS for kind in POLICY_KINDS),
                *(fmt_ratio(measured.value(what)) for what in _POLICY_RATIO_COLUMNS),
                *load,
            ]
        )
    rows.append(
        [
            "**median**",
            *(fmt(policy.median(stack, kind, "latency")) for stack in POLICY_STACKS for kind in POLICY_KINDS),
            *(f"**{fmt_ratio(policy.median_value(what))}**" for what in _POLICY_RATIO_COLUMNS),
            "",
            "",
        ]
    )
    lines += _table(
        [
            "round",
            "toolloop reads ms",
            "toolloop by rule ms",
            "floor reads ms",
            "floor by rule ms",
            "toolloop by rule / reads",
            "floor by rule / reads",
            "reads: toolloop / floor",
            "by rule: toolloop / floor",
            "overheads: toolloop / floor",
            "added ms: toolloop / floor",
            "other load, toolloop window (load avg)",
            "other load, floor window (load avg)",
        ],
        rows,
    )
    ours_ms, floor_ms = policy.median_value("write_ms_ours"), policy.median_value("write_ms_floor")
    lines += [
        "",
        f"The write adds {fmt(ours_ms)} ms to toolloop's request and {fmt(floor_ms)} ms to the floor's (medians of "
        "the rounds' differences). Ratios are the medians of the rounds' ratios; load: the cores processes outside "
        "the benchmark kept busy during the window, and the 1-minute load average at its start and end.",
        "",
        "Per request, from the histories (medians of the rounds' means): activities by type, as count x ms from "
        "scheduling to completion.",
        "",
    ]
    rows = []
    for stack in POLICY_STACKS:
        for kind in POLICY_KINDS:
            runs = policy.runs(stack, kind)
            types = sorted({t for r in runs for t in r.activities})
            done = ", ".join(
                f"{t} {fmt(policy.median(stack, kind, 'activities:' + t))} x "
                f"{fmt(_per_activity_ms(policy, stack, kind, t))} ms"
                for t in types
            )
            rows.append(
                [
                    f"{STACK_LABELS[stack]}, {POLICY_KIND_LABELS[kind]}",
                    fmt(policy.median(stack, kind, "workflow_tasks")),
                    fmt(policy.median(stack, kind, "history_events")),
                    fmt(_kib(policy.median(stack, kind, "history_bytes")), 2),
                    fmt(policy.median(stack, kind, "actions")),
                    done,
                ]
            )
    lines += _table(["requests", "workflow tasks", "events", "history KiB", "actions", "activities"], rows)
    lines.append("")
    return lines


_POLICY_RATIO_COLUMNS = (
    "ours_rule_over_reads",
    "floor_rule_over_reads",
    "reads_over_floor",
    "rule_over_floor",
    "overhead_over_floor",
    "added_over_floor",
)


def _per_activity_ms(policy: PolicyBench, stack: str, kind: str, activity: str) -> float | None:
    count, total = (
        policy.median(stack, kind, "activities:" + activity),
        policy.median(stack, kind, "activity_ms:" + activity),
    )
    return total / count if count and total is not None else None
