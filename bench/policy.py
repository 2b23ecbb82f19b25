"""I/O: the policy phase (issue 27) - what a write decided by an approval policy's rule costs, against a
reads-only request, on toolloop and on the floor, in one run on one stack that decides writes by policy.

The stack, started here on the run's Temporal dev server: a business service in policy mode (it takes a write
only with the policy's signed decision, naming a rule of `bench/policy.cedar`), the policy evaluator
(`python worker.py --policy`, the one process holding the policy's signing key), toolloop's worker naming the
evaluator's task queue (TOOLLOOP_POLICY_TASK_QUEUE), and the floor's worker, which signs the rule's decision
in its write activity (the baseline evaluates no policy). No person is in the loop: neither client approves.

The two requests: reads only (3 reads of orders, then the answer) and the same request with one write - the
benchmark's calendar event, which the bench policy allows by rule - in the same model turn as the reads, after
them (a side effect is a barrier), then its read-back and the answer. Both take two model turns; the second
differs only by the write. (The demo's own rule, a small refund of a late order, needs the order read first as
its fact, so its write cannot share the reads' turn: a third model turn; and its read-back lists every refund
of the order, which grows with each request.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from bench.clients import FloorStack, History, OursStack, Outcome, new_request_id
from bench.floor_worker import POLICY_KEY_ENV, POLICY_RULE_ENV
from bench.report import (
    BY_RULE,
    FLOOR,
    OURS,
    POLICY_KINDS,
    POLICY_READS,
    POLICY_STACKS,
    PolicyBench,
    PolicyRound,
    PolicyRun,
    latency_of,
)
from bench.scenarios import Scenario
from bench.stack import OURS_TOOLS, REPO_ROOT, BenchStack, reset_service, spawn_floor_worker
from devstack.processes import ManagedProcess, free_port, start_business_service, start_worker, wait_for_log_line
from toolloop._core.approvals import generate_signing_key, verify_key_for

if TYPE_CHECKING:
    from bench.phases import Bench

RULE = "bench-calendar-by-rule"
POLICY_FILE = Path(__file__).resolve().with_name("policy.cedar")
SCHEMA_FILE = REPO_ROOT / "config" / "policies" / "demo.cedarschema"
KINDS = {POLICY_READS: Scenario(reads=3), BY_RULE: Scenario(reads=3, write=True, write_in_round=True)}
POLICY_READY_LINE = "policy worker ready"
WORKERS = {OURS: "worker-ours-policy", FLOOR: "worker-floor-policy"}
EVALUATOR = "worker-policy"


@dataclass
class PolicyStacks:
    ours: OursStack
    floor: FloorStack
    admin: httpx.AsyncClient
    pids: dict[str, int]

    def by_name(self, name: str) -> OursStack | FloorStack:
        return self.ours if name == OURS else self.floor


def _start_evaluator(stack: BenchStack, signing_key: str, queue: str) -> ManagedProcess:
    log = stack.root / "logs" / f"{EVALUATOR}.log"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TEMPORAL_ADDRESS": stack.temporal_address,
        "TOOLLOOP_POLICY_FILE": str(POLICY_FILE),
        "TOOLLOOP_POLICY_SCHEMA": str(SCHEMA_FILE),
        "TOOLLOOP_POLICY_SIGNING_KEY": signing_key,
        "TOOLLOOP_POLICY_TASK_QUEUE": queue,
        # As a deployment runs it: the grants people give are honoured (none are given here).
        "TOOLLOOP_APPROVAL_VERIFY_KEY": stack.verify_key,
    }
    command = [sys.executable, str(REPO_ROOT / "worker.py"), "--policy"]
    proc = ManagedProcess.spawn("policy-worker", command, log, env=env, cwd=REPO_ROOT)
    try:
        wait_for_log_line(log, POLICY_READY_LINE, 60.0, proc, start_offset=proc.log_offset)
    except BaseException:
        proc.stop(timeout=5.0)
        raise
    return proc


@contextlib.asynccontextmanager
async def policy_stacks(bench: Bench) -> AsyncIterator[PolicyStacks]:
    """The service in policy mode, the evaluator, and a worker of each stack for it; stopped on exit."""
    stack = bench.stack
    policy_key = generate_signing_key()
    evaluator_queue = f"{stack.ours_queue}-policy-evaluator"
    queues = {OURS: f"{stack.ours_queue}-policy", FLOOR: f"{stack.floor_queue}-policy"}
    with contextlib.ExitStack() as running:
        port, admin_token = free_port(), secrets.token_urlsafe(16)
        service = await asyncio.to_thread(
            start_business_service,
            stack.root / "service-policy" / "service.sqlite",
            port,
            admin_token,
            approval_verify_key=stack.verify_key,
            policy_verify_key=verify_key_for(policy_key),
            policy_file=POLICY_FILE,
            log_path=stack.root / "logs" / "service-policy.log",
            cwd=REPO_ROOT,
        )
        running.callback(service.stop)
        url = f"http://127.0.0.1:{port}"
        evaluator = await asyncio.to_thread(_start_evaluator, stack, policy_key, evaluator_queue)
        running.callback(evaluator.stop)
        env = {
            "TEMPORAL_ADDRESS": stack.temporal_address,
            "TOOLLOOP_SERVICE_URL": url,
            "TOOLLOOP_APPROVAL_VERIFY_KEY": stack.verify_key,
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
        }
        ours_env = {
            **env,
            "TOOLLOOP_TASK_QUEUE": queues[OURS],
            "TOOLLOOP_POLICY_TASK_QUEUE": evaluator_queue,
            "TOOLLOOP_POLICY_VERIFY_KEY": verify_key_for(policy_key),
        }
        ours = await asyncio.to_thread(
            start_worker, REPO_ROOT, ours_env, stack.root / "logs" / f"{WORKERS[OURS]}.log", tools=OURS_TOOLS
        )
        running.callback(ours.stop)
        floor_env = {**env, "TOOLLOOP_TASK_QUEUE": queues[FLOOR], POLICY_KEY_ENV: policy_key, POLICY_RULE_ENV: RULE}
        floor = await asyncio.to_thread(spawn_floor_worker, floor_env, stack.root / "logs" / f"{WORKERS[FLOOR]}.log")
        running.callback(floor.stop)
        async with httpx.AsyncClient(
            base_url=url, headers={"X-Admin-Token": admin_token}, timeout=30, trust_env=False
        ) as admin:
            yield PolicyStacks(
                ours=OursStack(bench.ours.client, queues[OURS], stack.signing_key, approve=False),
                floor=FloorStack(bench.floor.client, queues[FLOOR], stack.signing_key, approve=False),
                admin=admin,
                pids={WORKERS[OURS]: ours.pid, WORKERS[FLOOR]: floor.pid, EVALUATOR: evaluator.pid},
            )


async def policy(bench: Bench) -> None:
    """Rounds of one window per stack (the order reversed every other round), each window the two kinds of
    request interleaved; each figure is the median of the rounds'."""
    sizes = bench.sizes
    found = PolicyBench(rule=RULE)
    bench.results.policy = found
    async with policy_stacks(bench) as stacks:
        for name, pid in stacks.pids.items():
            bench.meter.watch(name, pid)
        for number in range(sizes.policy_rounds):
            order = POLICY_STACKS if number % 2 == 0 else POLICY_STACKS[::-1]
            kinds = POLICY_KINDS if number % 2 == 0 else POLICY_KINDS[::-1]
            measured = PolicyRound()
            for name in order:
                bench.say(f"policy, round {number + 1} of {sizes.policy_rounds}: {name}")
                await reset_service(stacks.admin)
                await _window(bench, stacks, name, kinds, measured)
            found.rounds.append(measured)


async def _window(bench: Bench, stacks: PolicyStacks, name: str, kinds: Sequence[str], into: PolicyRound) -> None:
    sizes = bench.sizes
    stack = stacks.by_name(name)
    for kind in kinds:
        warm = [
            await stack.run(KINDS[kind], new_request_id(f"warm-policy-{kind}-{name}", i)) for i in range(sizes.warmup)
        ]
        if bench.check(f"policy warm-up {kind}/{name}", warm) or _not_by_rule(warm, name, kind):
            raise RuntimeError(f"policy {kind}/{name}: the warm-up failed ({_first_problem(warm, name, kind)})")
    schedule = [kinds[i % 2] for i in range(2 * sizes.spaced)]
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    tasks: list[asyncio.Task[Outcome]] = []
    with bench.meter.window() as window:
        for i, kind in enumerate(schedule):
            await asyncio.sleep(max(0.0, began + i * sizes.spacing_s - time.perf_counter()))
            tasks.append(asyncio.create_task(stack.run(KINDS[kind], new_request_id(f"policy-{kind}-{name}", i))))
        outcomes = list(await asyncio.gather(*tasks))
    into.other_load_cores[name] = window.other_load_cores
    into.load_average[name] = [load_before, os.getloadavg()[0]]
    into.runs[name] = {}
    for kind in kinds:
        mine = [o for o, k in zip(outcomes, schedule, strict=True) if k == kind]
        into.runs[name][kind] = await _run_of(bench, stack, name, kind, mine)


def _not_by_rule(outcomes: Sequence[Outcome], name: str, kind: str) -> list[Outcome]:
    """toolloop's writes that were not approved by the bench's rule (none may be: no person is asked)."""
    if name != OURS or kind != BY_RULE:
        return []
    return [o for o in outcomes if o.approved_by != f"rule {RULE}"]


def _first_problem(outcomes: Sequence[Outcome], name: str, kind: str) -> str:
    failed = [o for o in outcomes if not o.ok]
    if failed:
        return str(failed[0].error)
    odd = _not_by_rule(outcomes, name, kind)
    return f"approved by {odd[0].approved_by!r}, not by rule {RULE}" if odd else "?"


async def _run_of(bench: Bench, stack: OursStack | FloorStack, name: str, kind: str, outs: list[Outcome]) -> PolicyRun:
    from bench.phases import histories  # the phases module imports this one

    found = await histories(bench, outs, KINDS[kind])
    errors = bench.check(f"policy {kind}/{name}", outs)
    odd = _not_by_rule(outs, name, kind)
    if odd:
        bench.results.problems.append(f"policy {kind}/{name}: {len(odd)} writes not approved by rule {RULE}")
    measured: list[History] = [found[o.workflow_id] for o in outs if o.ok and o.workflow_id in found]
    n = len(measured)
    types = sorted({t for h in measured for t in h.completed_activities})

    def mean(values: Sequence[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return PolicyRun(
        stack=name,
        kind=kind,
        requests=len(outs),
        errors=errors + len(odd),
        latency=latency_of([o.latency_s for o in outs if o.ok]),
        history_events=mean([h.events for h in measured]),
        history_bytes=mean([h.bytes for h in measured]),
        workflow_tasks=mean([h.workflow_tasks for h in measured]),
        actions=mean([h.actions for h in measured]),
        activities={t: sum(h.completed_activities[t] for h in measured) / n for t in types},
        activity_ms={t: 1000 * sum(h.activity_s[t] for h in measured) / n for t in types},
    )
