"""Pure (asyncio, no processes): a process strike that has begun its restart finishes it, even when the run
ends meanwhile and the runner cancels what is left of its strikes. Before, the cancellation left the runner
using a service that was not back yet (a raw ConnectError ended the chaos run) and let the restart start a
process after the stack had been stopped (an orphan)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from faultbed.plan import ProcessFaultSpec
from faultbed.proxy import FaultProxy
from faultbed.runner import _settled
from faultbed.strikes import ApprovalGate, ProcessFault, Restart, Strike, StrikeContext, strike


def strike_on_model_call(
    fault: str, point: asyncio.Event, crash_and_restart: Callable[[str], Awaitable[Restart]]
) -> asyncio.Task[Strike | None]:
    """A strike of `fault` at the first held model call, whose point is `point`."""
    context = StrikeContext(
        proxy=FaultProxy("127.0.0.1", 1, []),
        admin=None,
        plan_rules=0,
        pause_model_call=lambda nth: point,
        release_model_call=lambda: None,
        gate=ApprovalGate(),
        crash_and_restart=crash_and_restart,
    )
    spec: Any = ProcessFaultSpec.model_validate(
        {"boundary": "process", "fault": fault, "at": "during_model_turn", "when": {"nth": 1}}
    )
    return asyncio.create_task(strike(context, ProcessFault(0, spec), 0))


async def test_a_restart_begun_is_finished_when_the_run_cancels_its_strike() -> None:
    point = asyncio.Event()
    killed = asyncio.Event()
    back = asyncio.Event()
    restarted: list[str] = []

    async def crash_and_restart(name: str) -> Restart:
        killed.set()
        await back.wait()  # the new process is still starting
        restarted.append(name)
        return Restart(old_pid=1, new_pid=2, seconds=0.1)

    task = strike_on_model_call("kill_service", point, crash_and_restart)
    point.set()
    await killed.wait()
    # The run ends now: the runner settles its strikes, cancelling those not done.
    settling = asyncio.create_task(_settled(task))
    await asyncio.sleep(0)
    assert not settling.done()  # it waits for the restart
    back.set()
    struck = await settling
    assert restarted == ["service"]
    assert struck is not None and (struck.process, struck.restart.new_pid) == ("service", 2)


async def test_a_strike_still_waiting_for_its_point_is_cancelled_and_counts_as_never_fired() -> None:
    async def crash_and_restart(name: str) -> Restart:
        raise AssertionError("never struck")

    task = strike_on_model_call("kill_worker", asyncio.Event(), crash_and_restart)
    await asyncio.sleep(0)
    assert await _settled(task) is None
