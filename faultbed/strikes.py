"""I/O: process faults - the runner waits until a run reaches a named point, then sends a real SIGKILL to a
real PID (the worker, the business service, or the Temporal dev server), and starts the process again the
way the stack first started it (the same files, the same port).

How each point is reached for real, never guessed from timing:
- `during_model_turn`: the scripted model endpoint holds the Nth model call (a streamed one halfway through
  its answer: text and part of a call's arguments sent); the strike lands while the worker's model activity
  waits for the rest.
- `before_write_sent`: the fault proxy holds the Nth write request before it reaches the service (a
  `latency` wire fault; a client that dies meanwhile never had it sent).
- `after_service_commit`: the service holds the reply of the Nth write it committed (an `after_commit` rule
  with a latency); the strike lands once the service counts that rule as fired, so the effect is stored and
  the activity has not completed.
- `during_approval_wait`: the run's approver has seen the Nth approval request and waits to decide until
  the strike is over.
- `between_messages` and `while_message_queued` (thread scenarios, faultbed.thread_runs): the runner itself
  reaches them - after a message's request closed and before it sends the next one; once a message it sent
  waits in the thread's queue behind one that waits for approval - and goes on only once the strike is over."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from faultbed.plan import THREAD_POINTS, FaultPlan, Match, ProcessFaultSpec, WireFaultSpec
from faultbed.proxy import FaultProxy, WireFault

# How long a point holds the run while the strike happens; the run's own timeouts end the hold earlier for
# the side that was killed.
HOLD_MS = 20_000
# How long a strike waits for its point before it gives up (the fault then counts as never fired); a thread's
# points come after whole messages.
POINT_SECONDS = 60.0
THREAD_POINT_SECONDS = 300.0

_PROCESS_OF = {"kill_worker": "worker", "kill_service": "service", "restart_temporal": "temporal"}


@dataclass(frozen=True)
class ProcessFault:
    index: int  # in the plan
    spec: ProcessFaultSpec

    @property
    def process(self) -> str:
        return _PROCESS_OF[self.spec.fault]


def process_faults(plan: FaultPlan) -> list[ProcessFault]:
    return [ProcessFault(i, f) for i, f in enumerate(plan.faults) if isinstance(f, ProcessFaultSpec)]


def service_holds(faults: Sequence[ProcessFault]) -> list[dict[str, Any]]:
    """Service rules that hold the reply of the Nth committed write, for the faults struck after a commit.
    They go after the plan's own rules: a plan fault on the same reply acts first."""
    return [
        {
            "method": "POST",
            "path_regex": "^/",
            "when": "after_commit",
            "latency_ms": HOLD_MS,
            "times": 1,
            "skip": f.spec.when.nth - 1 if f.spec.when.nth else 0,
        }
        for f in faults
        if f.spec.at == "after_service_commit"
    ]


def wire_holds(faults: Sequence[ProcessFault]) -> list[WireFault]:
    """Proxy faults that hold the Nth write request, for the faults struck before a write is sent; each
    under its process fault's index, so the proxy's counts say when the write is held."""
    return [
        WireFault(
            f.index,
            WireFaultSpec(
                boundary="wire",
                fault="latency",
                latency_ms=HOLD_MS,
                match=Match(method="POST"),
                when=f.spec.when,
            ),
        )
        for f in faults
        if f.spec.at == "before_write_sent"
    ]


@dataclass
class ApprovalGate:
    """Between the run's approver and a strike during the approval wait: the approver counts each request
    it sees and waits for `open` before deciding."""

    seen: int = 0
    open: asyncio.Event = field(default_factory=asyncio.Event)

    def saw_one(self) -> None:
        self.seen += 1


@dataclass(frozen=True)
class Restart:
    old_pid: int  # the one SIGKILLed
    new_pid: int
    seconds: float  # from the signal until the new process answered


@dataclass
class Strike:
    index: int
    process: str
    at: float  # wall-clock time of the signal
    restart: Restart


@dataclass
class StrikeContext:
    """What a strike watches and acts through (the runner's stack, in parts)."""

    proxy: FaultProxy
    admin: httpx.AsyncClient | None  # the bundled service's (None: another service, no holds after commit)
    # How many service rules come before the run's holds (the plan's own).
    plan_rules: int
    pause_model_call: Callable[[int], asyncio.Event]
    release_model_call: Callable[[], None]
    gate: ApprovalGate
    crash_and_restart: Callable[[str], Awaitable[Restart]]
    # How often the runner has reached each thread point (thread scenarios only).
    reached: Counter[str] = field(default_factory=Counter)


async def strike(ctx: StrikeContext, fault: ProcessFault, hold_position: int) -> Strike | None:
    """Wait for the fault's point, then kill and restart its process; None if the point never came.
    `hold_position`: for an after-commit fault, its hold's position among the run's service holds."""
    nth = fault.spec.when.nth or 1
    at = fault.spec.at
    try:
        if at == "during_model_turn":
            await asyncio.wait_for(ctx.pause_model_call(nth).wait(), POINT_SECONDS)
        elif at == "before_write_sent":
            await _until(lambda: _proxy_fired(ctx.proxy, fault.index), POINT_SECONDS)
        elif at == "after_service_commit":
            await _until_async(lambda: _hold_fired(ctx, hold_position), POINT_SECONDS)
        elif at in THREAD_POINTS:
            await _until(lambda: ctx.reached[at] >= nth, THREAD_POINT_SECONDS)
        else:
            await _until(lambda: ctx.gate.seen >= nth, POINT_SECONDS)
    except TimeoutError:
        if at == "during_approval_wait":
            ctx.gate.open.set()
        return None
    struck = time.time()
    restarting = asyncio.ensure_future(ctx.crash_and_restart(fault.process))
    try:
        try:
            restart = await asyncio.shield(restarting)
        except asyncio.CancelledError:
            # A restart begun is finished, even when the run has ended meanwhile: the runner then uses the
            # process (its admin API, the next run) and stops it at the end, never a half-started one.
            restart = await restarting
    finally:
        ctx.release_model_call()
        if at == "during_approval_wait":
            ctx.gate.open.set()
    return Strike(fault.index, fault.process, struck, restart)


def _proxy_fired(proxy: FaultProxy, index: int) -> bool:
    return proxy.fired[index] >= 1


async def _hold_fired(ctx: StrikeContext, position: int) -> bool:
    assert ctx.admin is not None  # refused before the run for a service without holds
    rules = (await ctx.admin.get("/admin/faults")).json()["rules"]
    at = ctx.plan_rules + position
    return len(rules) > at and int(rules[at]["fired"]) >= 1


async def _until(condition: Callable[[], bool], seconds: float) -> None:
    async def check() -> bool:
        return condition()

    await _until_async(check, seconds)


async def _until_async(condition: Callable[[], Awaitable[bool]], seconds: float) -> None:
    """Check every 20 ms until the condition holds; TimeoutError after `seconds`."""
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.02)
