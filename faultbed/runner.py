"""I/O: the chaos runner - a scenario x seed matrix driven through the real workflow on a stack of its own
(the Temporal dev server, the business service, the fault proxy in front of it, a worker whose tools go
through the proxy), every run judged by faultbed.invariants on the service's tables and the history.

Each run: the plan's service faults become the service's rules and its wire faults go to the proxy, both
seeded with the run's seed; a scripted request (faultbed.scenarios.workload) runs with its write approved as
soon as it asks; once the result is in (or a bound passes) the faults are cleared, and what happened is read
from the service (effects, rule counts), the proxy (what fired) and the run's history (call pairing)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client, WorkflowHandle

from devstack.processes import (
    DEMO_TOOLS,
    ManagedProcess,
    free_port,
    start_business_service,
    start_temporal_dev_server,
    start_worker,
)
from faultbed.invariants import Check, Effect, OperationFacts, RunFacts, honesty_cell, judge
from faultbed.plan import FaultPlan, ServiceFaultSpec, WireFaultSpec, service_rules
from faultbed.proxy import FaultProxy, WireFault
from faultbed.scenarios import CHAOS_LIMITS, Scenario, intended_title, with_model_faults, workload
from toolloop._core.approvals import generate_signing_key, verify_key_for
from toolloop._core.contracts import Actor, AgentInput, AgentResult, FunctionCallItem, FunctionCallOutputItem, Limits
from toolloop._core.names import AGENT_WORKFLOW
from toolloop._temporal.approval_channel import send_decision
from toolloop._temporal.converter import data_converter
from toolloop._temporal.following import approvals_as_they_come
from toolloop._temporal.requests import request_search_attributes, request_workflow_id
from toolloop._temporal.results import request_result
from toolloop.testing import model_turns, script

REPO_ROOT = Path(__file__).resolve().parent.parent
ACTOR = Actor(user_id="u1", tenant_id="acme")
# A run's result is awaited this long with its faults on, then this long more once they are cleared.
RUN_SECONDS = 90.0
SETTLE_SECONDS = 45.0


@dataclass
class RunOutcome:
    scenario: str
    seed: int
    workflow_id: str
    seconds: float
    checks: list[Check]
    # Per fault index of the plan: how often it fired in this run.
    fired: dict[int, int]
    # The final state of the run's write (None: it never became an operation).
    write_state: str | None
    honesty: list[tuple[str, str]] = field(default_factory=list)
    # Effects the service's own tables hold for this run's write (any key).
    effects: int = 0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass
class ChaosStack:
    client: Client
    admin: httpx.AsyncClient
    proxy: FaultProxy
    task_queue: str
    signing_key: str
    verify_key: str
    processes: list[ManagedProcess]


@contextlib.asynccontextmanager
async def chaos_stack(root: Path | None = None, tools: str = DEMO_TOOLS) -> AsyncIterator[ChaosStack]:
    """Everything a chaos run needs, on free loopback ports, stopped (by PID) when the block ends."""
    with contextlib.ExitStack() as undo:
        base = root or Path(undo.enter_context(tempfile.TemporaryDirectory(prefix="toolloop-chaos-")))
        port = free_port()
        temporal = start_temporal_dev_server(base / "temporal", port, ui_port=None)
        undo.callback(temporal.stop)
        signing_key = generate_signing_key()
        admin_token = secrets.token_urlsafe(16)
        service_port = free_port()
        service = start_business_service(
            base / "service" / "service.sqlite",
            service_port,
            admin_token,
            approval_verify_key=verify_key_for(signing_key),
            cwd=REPO_ROOT,
        )
        undo.callback(service.stop)
        proxy = FaultProxy("127.0.0.1", service_port, [])
        await proxy.start()
        queue = f"chaos-{uuid.uuid4().hex[:8]}"
        env = {
            "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
            "TOOLLOOP_TASK_QUEUE": queue,
            # The worker's tools reach the service through the proxy: wire faults happen on that socket.
            "TOOLLOOP_SERVICE_URL": f"http://127.0.0.1:{proxy.port}",
        }
        try:
            worker = await asyncio.to_thread(start_worker, REPO_ROOT, env, base / "logs" / "worker.log", tools=tools)
            undo.callback(worker.stop)
            client = await Client.connect(f"127.0.0.1:{port}", data_converter=data_converter())
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{service_port}",
                headers={"X-Admin-Token": admin_token},
                timeout=30,
                trust_env=False,
            ) as admin:
                yield ChaosStack(
                    client=client,
                    admin=admin,
                    proxy=proxy,
                    task_queue=queue,
                    signing_key=signing_key,
                    verify_key=verify_key_for(signing_key),
                    processes=[temporal, service, worker],
                )
        finally:
            await proxy.stop()


def wire_faults(plan: FaultPlan) -> list[WireFault]:
    return [WireFault(i, f) for i, f in enumerate(plan.faults) if isinstance(f, WireFaultSpec)]


async def run_one(stack: ChaosStack, scenario: Scenario, seed: int) -> RunOutcome:
    plan = scenario.plan
    tag = f"{scenario.name}-{seed}-{uuid.uuid4().hex[:6]}"
    (await stack.admin.post("/admin/reset")).raise_for_status()
    (await stack.admin.put("/admin/faults", json={"rules": service_rules(plan, seed)})).raise_for_status()
    stack.proxy.faults, stack.proxy.seed = wire_faults(plan), seed
    stack.proxy.matched.clear()
    stack.proxy.fired.clear()
    limits = Limits(**CHAOS_LIMITS)
    turns, model_fired = with_model_faults(plan, workload(tag))
    handle: WorkflowHandle[Any, AgentResult] = await stack.client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request=f"chaos run {tag}",
            actor=ACTOR,
            model=script(*turns),
            limits=limits,
            approval_verify_key=stack.verify_key,
        ),
        id=request_workflow_id(ACTOR, tag),
        task_queue=stack.task_queue,
        result_type=AgentResult,
        search_attributes=request_search_attributes(ACTOR),
    )
    began = time.monotonic()
    approver = asyncio.create_task(_decide_each(stack, handle, intended_title(tag)))
    result: AgentResult | None = None
    try:
        with contextlib.suppress(TimeoutError):
            result = await asyncio.wait_for(request_result(handle), RUN_SECONDS)
        fired = await _fired(stack, plan)
        fired |= model_fired
        await _clear_faults(stack)
        if result is None:
            with contextlib.suppress(TimeoutError):
                result = await asyncio.wait_for(request_result(handle), SETTLE_SECONDS)
    finally:
        approver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await approver
    seconds = time.monotonic() - began
    if result is None:
        with contextlib.suppress(Exception):
            await handle.terminate("chaos run: no result once the faults cleared")
    facts = await _facts(stack, scenario, seed, handle, result, tag, limits)
    title = intended_title(tag)
    write = next((op for op in (result.operations if result else []) if op.arguments.get("title") == title), None)
    return RunOutcome(
        scenario=scenario.name,
        seed=seed,
        workflow_id=handle.id,
        seconds=seconds,
        checks=judge(facts),
        fired=fired,
        write_state=write.state if write else None,
        honesty=[honesty_cell(facts, op) for op in facts.operations],
        effects=len(facts.effects),
    )


async def _decide_each(stack: ChaosStack, handle: WorkflowHandle[Any, AgentResult], intended: str) -> None:
    """The run's user at the approval channel: approves the write they asked for as soon as it waits, and
    rejects anything else (a write the model was talked into)."""
    async for request in approvals_as_they_come(handle):
        approve = request.arguments.get("title") == intended
        await send_decision(handle, request, approve=approve, decider=ACTOR, key=stack.signing_key, channel="chaos")


async def _fired(stack: ChaosStack, plan: FaultPlan) -> dict[int, int]:
    """How often each fault of the plan fired: service faults by the service's own counts, in the order
    service_rules wrote them; wire faults by the proxy's."""
    rules = (await stack.admin.get("/admin/faults")).json()["rules"]
    service_indexes = [i for i, f in enumerate(plan.faults) if isinstance(f, ServiceFaultSpec)]
    fired = {index: int(rule["fired"]) for index, rule in zip(service_indexes, rules, strict=False)}
    for index, count in stack.proxy.fired.items():
        fired[index] = count
    return {i: fired.get(i, 0) for i in range(len(plan.faults))}


async def _clear_faults(stack: ChaosStack) -> None:
    (await stack.admin.delete("/admin/faults")).raise_for_status()
    stack.proxy.faults = []


async def _facts(
    stack: ChaosStack,
    scenario: Scenario,
    seed: int,
    handle: WorkflowHandle[Any, AgentResult],
    result: AgentResult | None,
    tag: str,
    limits: Limits,
) -> RunFacts:
    rows = (await stack.admin.get("/admin/effects")).json()["effects"]
    ledger = {op.operation_id for op in (result.operations if result else [])}
    # This run's effects: its intended write's (whatever key it came with) and any of its operations'.
    effects = [
        Effect(str(r["operation_id"]), str(r["actor_user"]), str(r["actor_tenant"]))
        for r in rows
        if r.get("title") == intended_title(tag) or r.get("operation_id") in ledger
    ]
    turns = await model_turns(handle)
    calls: list[str] = []
    outputs_sent: list[tuple[list[str], list[str]]] = []
    previous: list[str] | None = None
    for turn_input, turn_result in turns:
        if previous is not None:
            sent = [i.call_id for i in turn_input.new_items if isinstance(i, FunctionCallOutputItem)]
            outputs_sent.append((sent, previous))
        made = [i.call_id for i in (turn_result.items if turn_result else []) if isinstance(i, FunctionCallItem)]
        calls += made
        previous = made
    return RunFacts(
        scenario=scenario.name,
        seed=seed,
        finished=result is not None,
        stop_reason=result.stop_reason if result else None,
        operations=[
            OperationFacts(
                operation_id=op.operation_id,
                state=op.state,
                approved=op.approval is not None and op.approval.decision == "approved",
            )
            for op in (result.operations if result else [])
        ],
        effects=effects,
        calls=calls,
        answered=[c.call_id for c in (result.calls if result else [])],
        outputs_sent=outputs_sent,
        actor=(ACTOR.user_id, ACTOR.tenant_id),
        rounds=result.rounds if result else 0,
        max_rounds=limits.max_rounds,
    )


async def run_matrix(
    stack: ChaosStack, scenarios: Sequence[Scenario], seeds: Sequence[int], say: Callable[[str], None]
) -> list[RunOutcome]:
    outcomes = []
    total = len(scenarios) * len(seeds)
    for scenario in scenarios:
        for seed in seeds:
            outcome = await run_one(stack, scenario, seed)
            outcomes.append(outcome)
            broken = [c.name for c in outcome.checks if not c.ok]
            fired = sum(outcome.fired.values())
            say(
                f"[{len(outcomes)}/{total}] {scenario.name} seed {seed}: "
                f"{'ok' if not broken else 'BROKEN ' + ', '.join(broken)} "
                f"(write {outcome.write_state or '-'}, {fired} fault(s) fired, {outcome.seconds:.1f} s)"
            )
    return outcomes


async def save_histories(stack: ChaosStack, outcomes: Sequence[RunOutcome], directory: Path) -> list[Path]:
    """The history of each scenario's first run, as tests/test_replay_histories.py replays them: a change
    to the workflow that these runs' histories cannot survive then fails CI."""
    texts = {}
    for outcome in {o.scenario: o for o in reversed(outcomes)}.values():
        history = await stack.client.get_workflow_handle(outcome.workflow_id).fetch_history()
        # The workflow id is part of what replays: operation ids are derived from it.
        stored = {"workflow_id": outcome.workflow_id, "history": json.loads(history.to_json())}
        texts[outcome.scenario] = json.dumps(stored, indent=1, sort_keys=True) + "\n"
    return await asyncio.to_thread(_write_all, directory, texts)


def _write_all(directory: Path, texts: dict[str, str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (directory / f"{name}.json").write_text(text)
    return sorted(directory / f"{name}.json" for name in texts)
