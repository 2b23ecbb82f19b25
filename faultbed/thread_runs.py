"""I/O: a thread scenario's run (issue 26) - a thread of scripted messages sent through toolloop's public thread
API (`ToolloopClient.thread`), with the plan's faults on, and process faults struck between messages or while a
message waits in the thread's queue; then judged twice: each message's request by every invariant of a single
run (faultbed.invariants.judge, merged per invariant), and the thread by its own (judge_thread: messages never
overlap and run in acceptance order, no model shown a write done that its ledger did not verify, a done write
never redone, every history replays).

The thread's messages are the demo's (faultbed.scenarios.message_turns): calendar events titled by each
message's tag, so a run's writes are its own; a thread scenario runs on the bundled service only."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError
from temporalio.worker import Replayer

from faultbed.invariants import (
    MessageFacts,
    RunFacts,
    ThreadFacts,
    Told,
    honesty_cell,
    judge,
    judge_thread,
    merge_checks,
)
from faultbed.plan import service_rules
from faultbed.runner import (
    RUN_SECONDS,
    SETTLE_SECONDS,
    ChaosStack,
    RunOutcome,
    _clear_faults,
    _decide_each,
    _facts,
    _fired,
    _first_fault_at,
    _received,
    _result_within,
    _settled,
    start_strikes,
    wire_faults,
)
from faultbed.scenarios import CHAOS_LIMITS, Scenario, intended_title, message_tag, message_turns
from faultbed.strikes import (
    POINT_SECONDS,
    ApprovalGate,
    ProcessFault,
    Strike,
    StrikeContext,
    process_faults,
    service_holds,
    wire_holds,
)
from toolloop._core.contracts import AgentResult, FunctionCallOutputItem, Limits
from toolloop._core.threads import MessageAccepted
from toolloop._temporal.client import ToolloopRequest, ToolloopThread
from toolloop._temporal.converter import data_converter
from toolloop._temporal.worker_factory import workflow_runner
from toolloop.testing import model_turns, script
from toolloop.workflows.agent import AgentWorkflow
from toolloop.workflows.thread import ThreadWorkflow

T = TypeVar("T")
# What a call to the server raises while the Temporal server restarts.
PASSING = (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError)
# A call id the thread gives an earlier message's write when it shows it again: m<number>_<call id>.
EARLIER_CALL = re.compile(r"^m(\d+)_")


@dataclass
class _Message:
    sent: int
    request_id: str
    turns: list[list[dict[str, Any]]]
    accepted: MessageAccepted | None = None
    request: ToolloopRequest | None = None
    result: AgentResult | None = None
    shown: dict[str, str] = field(default_factory=dict)


async def _retrying(call: Callable[[], Awaitable[T]], seconds: float = 60.0) -> T:
    """`call()`, again while the server is away (a Temporal restart), for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except PASSING:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _reach(context: StrikeContext, striking: dict[ProcessFault, asyncio.Task[Strike | None]], at: str) -> None:
    """The runner is at a thread point: the strikes due there happen now, and the run goes on once they are over
    (the process they killed is running again)."""
    context.reached[at] += 1
    due = [task for f, task in striking.items() if f.spec.at == at and (f.spec.when.nth or 1) == context.reached[at]]
    if due:
        await asyncio.wait(due, timeout=POINT_SECONDS + 60)


async def _until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def run_thread(stack: ChaosStack, scenario: Scenario, seed: int) -> RunOutcome:
    plan, spec = scenario.plan, scenario.thread
    assert spec is not None and stack.admin is not None  # a thread scenario; refused for another service
    tag = f"{scenario.name}-{seed}-{uuid.uuid4().hex[:6]}"
    strikes = process_faults(plan)
    rules = service_rules(plan, seed)
    (await stack.admin.post("/admin/reset")).raise_for_status()
    (await stack.admin.put("/admin/faults", json={"rules": rules + service_holds(strikes)})).raise_for_status()
    stack.proxy.faults, stack.proxy.seed = wire_faults(plan) + wire_holds(strikes), seed
    stack.proxy.matched.clear()
    stack.proxy.fired.clear()
    stack.proxy.first_fired_at.clear()
    limits = Limits(**CHAOS_LIMITS)
    titles = {intended_title(message_tag(tag, n)) for n in range(1, len(spec.messages) + 1)}

    def wanted(tool: str, arguments: dict[str, Any]) -> bool:
        return arguments.get("title") in titles

    # The thread's id is the run's tag: its workflow id is thread_workflow_id(actor, tag).
    thread = stack.requests.thread(tag, actor=stack.target.actor)
    messages = [_Message(n, message_tag(tag, n), message_turns(tag, spec, n)) for n in range(1, len(spec.messages) + 1)]
    opened = ApprovalGate()
    opened.open.set()
    context, striking = start_strikes(stack, len(rules), strikes, opened)
    began = time.monotonic()
    admin = stack.admin
    # The service's rules as they were when the faults were cleared (their counts say what fired).
    seen: list[list[dict[str, Any]]] = []

    async def clear() -> None:
        if not seen:
            seen.append((await admin.get("/admin/faults")).json()["rules"])
        await _clear_faults(stack)

    ended_at = time.time()
    try:
        await _send(thread, messages[0], limits)
        for n, message in enumerate(messages, start=1):
            following = messages[n] if n < len(messages) else None
            queued = following is not None and spec.messages[n].queued
            done = await _run_message(clear, context, striking, thread, message, following if queued else None, wanted)
            ended_at = time.time()
            if not done:
                break  # no result even once the faults cleared: the messages after it are not sent
            if spec.clear_faults_after == n:
                await clear()
            if following is not None and not queued:
                await _reach(context, striking, "between_messages")
                await _send(thread, following, limits)
    finally:
        struck = [s for s in await asyncio.gather(*(_settled(t) for t in striking.values())) if s is not None]
    await clear()
    fired = _fired(stack, plan, seen[0], {}, struck)
    first_fault = _first_fault_at(stack, seen[0], struck)
    seconds = time.monotonic() - began
    per_message: list[RunFacts] = []
    for message in messages:
        if message.request is None:
            per_message.append(RunFacts(scenario=scenario.name, seed=seed, finished=False))
            continue
        per_message.append(
            await _facts(
                stack,
                scenario,
                seed,
                message.request,
                message.result,
                message.request_id,
                limits,
                message.shown,
                message.turns,
            )
        )
    _approved_earlier(per_message)
    thread_facts = await _thread_facts(stack, thread, messages)
    checks = [*merge_checks([judge(f) for f in per_message]), *judge_thread(thread_facts)]
    effects = {e for f in per_message for e in f.effects}
    finished = all(m.result is not None for m in messages)
    return RunOutcome(
        scenario=scenario.name,
        seed=seed,
        workflow_id=thread.workflow_id,
        seconds=seconds,
        checks=checks,
        fired=fired,
        write_state=_write_state(messages, titles),
        honesty=[honesty_cell(f, op) for f in per_message for op in f.operations],
        effects=len(effects),
        recovery_seconds=round(ended_at - first_fault, 2) if finished and first_fault else None,
        strikes=[{"fault": s.index, "process": s.process, **dataclasses.asdict(s.restart)} for s in struck],
        requests=[m.request.workflow_id for m in messages if m.request is not None],
    )


def _approved_earlier(per_message: Sequence[RunFacts]) -> None:
    """An operation approved in one message is approved for the later ones: the thread's same operation (its id is
    the thread's) proposed again is settled by its status, never asked again, so its effect is the approved one."""
    approved: set[str] = set()
    for facts in per_message:
        approved |= {op.operation_id for op in facts.operations if op.approved}
        facts.operations = [dataclasses.replace(op, approved=op.operation_id in approved) for op in facts.operations]


async def _send(thread: ToolloopThread, message: _Message, limits: Limits) -> None:
    """Send a message (again after a restart: the same request id and submission is the same message)."""
    message.accepted = await _retrying(
        lambda: thread.send(
            f"chaos thread message {message.sent}",
            request_id=message.request_id,
            model=script(*message.turns),
            limits=limits,
        )
    )


async def _run_message(
    clear_faults: Callable[[], Awaitable[None]],
    context: StrikeContext,
    striking: dict[ProcessFault, asyncio.Task[Strike | None]],
    thread: ToolloopThread,
    message: _Message,
    queued: _Message | None,
    wanted: Callable[[str, dict[str, Any]], bool],
) -> bool:
    """Follow one message's request to its result, deciding its approvals as the run's user; with `queued`, the
    next message is sent while this one waits for its approval, and the thread point `while_message_queued` is
    reached before the decision. False when no result came, even once the faults cleared."""
    request = await _retrying(lambda: thread.request(message.request_id), RUN_SECONDS)
    message.request = request
    gate = ApprovalGate()
    if queued is None:
        gate.open.set()
    approver = asyncio.create_task(_decide_each(request, wanted, gate, message.shown))
    try:
        if queued is not None:
            # Sent once this message waits for approval (or once it is clear it never will: then it is not queued
            # behind an approval wait, and the point's strike never fires - the report says so).
            await _until(lambda: gate.seen >= 1 or approver.done(), POINT_SECONDS)
            await _send(thread, queued, Limits(**CHAOS_LIMITS))
            if gate.seen >= 1:
                await _reach(context, striking, "while_message_queued")
            gate.open.set()
        message.result = await _result_within(request, RUN_SECONDS)
        if message.result is None:
            await clear_faults()
            message.result = await _result_within(request, SETTLE_SECONDS)
    finally:
        approver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await approver
    if message.result is None:
        with contextlib.suppress(Exception):
            await request.handle.terminate("chaos run: no result once the faults cleared")
    return message.result is not None


def _write_state(messages: Sequence[_Message], titles: set[str]) -> str | None:
    """How the thread's writes ended: each one's state in the last message whose ledger has it; one state when
    they all ended alike, else each state (which the report reads as not one ending)."""
    final: dict[str, str] = {}
    for message in messages:
        for op in message.result.operations if message.result else []:
            if op.arguments.get("title") in titles:
                final[str(op.arguments["title"])] = op.state
    states = sorted(set(final.values()))
    return "/".join(states) if states else None


async def _thread_facts(stack: ChaosStack, thread: ToolloopThread, messages: Sequence[_Message]) -> ThreadFacts:
    facts = ThreadFacts(messages=[], received=await _received(stack))
    for message in messages:
        found = MessageFacts(
            sent=message.sent,
            number=message.accepted.number if message.accepted else None,
            request_id=message.request_id,
            asked=list(message.shown),
            ledger={op.operation_id: op.state for op in (message.result.operations if message.result else [])},
        )
        if message.request is not None:
            described = await _retrying(message.request.handle.describe)
            found.started_at = described.start_time.timestamp()
            found.closed_at = described.close_time.timestamp() if described.close_time else None
            found.told = _told(await model_turns(message.request.handle))
        facts.messages.append(found)
    handles = [thread.handle, *(m.request.handle for m in messages if m.request is not None)]
    replayer = Replayer(
        workflows=[AgentWorkflow, ThreadWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner()
    )
    for handle in handles:
        history = await _retrying(handle.fetch_history)
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        facts.replayed += 1
        if result.replay_failure is not None:
            facts.unreplayable.append((handle.id, f"{type(result.replay_failure).__name__}: {result.replay_failure}"))
    return facts


def _told(turns: Sequence[tuple[Any, Any]]) -> list[Told]:
    """What a message's model was told of earlier messages' writes: the earlier messages' writes shown in its
    first turn (m<number>_<call id>), and any call's output saying an earlier message did it."""
    told: list[Told] = []
    for index, (turn_input, _) in enumerate(turns):
        for item in turn_input.new_items:
            if not isinstance(item, FunctionCallOutputItem):
                continue
            try:
                output = json.loads(item.output)
            except ValueError:
                continue
            if not isinstance(output, dict) or "operation_id" not in output:
                continue
            earlier = EARLIER_CALL.match(item.call_id)
            if index == 0 and earlier:
                told.append(Told(str(output["operation_id"]), str(output.get("state")), "earlier", int(earlier[1])))
            elif output.get("done_by_earlier_request"):
                request_id = str(output["done_by_earlier_request"])
                told.append(Told(str(output["operation_id"]), str(output.get("state")), "again", request_id=request_id))
    return told
