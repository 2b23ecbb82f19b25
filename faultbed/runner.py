"""I/O: the chaos runner - a scenario x seed matrix driven through the real workflow on a stack of its own
(the Temporal dev server, the business service, the fault proxy in front of it, a worker whose tools go
through the proxy), every run judged by faultbed.invariants on the service's tables and the history.

Each run: the plan's service faults become the service's rules and its wire faults go to the proxy, both
seeded with the run's seed; a scripted request (faultbed.scenarios.workload) is started through toolloop's
client and its write decided through the client's approval channel ("chaos") as soon as it asks; once the
result is in (or a bound passes) the faults are cleared, and what happened is read from the service
(effects, rule counts), the proxy (what fired) and the run's history (call pairing)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError

from devstack.processes import (
    WORKER_READY_LINE,
    ManagedProcess,
    free_port,
    start_business_service,
    start_temporal_dev_server,
    start_worker,
    wait_for_http_ok,
    wait_for_log_line,
)
from faultbed.demo import DEMO
from faultbed.invariants import Check, OperationFacts, Received, RunFacts, decisions, honesty_cell, judge
from faultbed.model_endpoint import ScriptedModelEndpoint, endpoint_faults
from faultbed.plan import (
    ENDPOINT_FAULTS,
    FaultPlan,
    ModelFaultSpec,
    ProcessFaultSpec,
    ServiceFaultSpec,
    WireFaultSpec,
    service_rules,
)
from faultbed.proxy import FaultProxy, WireFault
from faultbed.scenarios import (
    CHAOS_LIMITS,
    PEOPLE,
    PolicyPlan,
    Scenario,
    policy_text,
    policy_turns,
    policy_wanted,
    refund_to_attacker,
    with_model_faults,
    withdraw_auto_refunds,
)
from faultbed.strikes import (
    ApprovalGate,
    ProcessFault,
    Restart,
    Strike,
    StrikeContext,
    process_faults,
    service_holds,
    strike,
    wire_holds,
)
from faultbed.target import ChaosTarget, EffectQuery, Workload
from toolloop import ApprovalRefused
from toolloop._core.approvals import generate_signing_key, payload_digest, verify_key_for
from toolloop._core.contracts import (
    Actor,
    AgentResult,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    Limits,
    ModelSpec,
    OperationRecord,
)
from toolloop._temporal.client import ToolloopClient, ToolloopRequest
from toolloop._temporal.converter import data_converter
from toolloop.testing import model_turns, script

REPO_ROOT = Path(__file__).resolve().parent.parent
logger = logging.getLogger(__name__)
# A run's result is awaited this long with its faults on, then this long more once they are cleared.
RUN_SECONDS = 90.0
SETTLE_SECONDS = 45.0
# The approval channel the runner's user decides through: each decision is recorded "<user> via chaos".
CHAOS_CHANNEL = "chaos"
# The demo's approval policy (docs/POLICIES.md), which a stack with policies on copies and decides by.
DEMO_POLICY_DIR = REPO_ROOT / "config" / "policies"
POLICY_FILE, POLICY_SCHEMA = "demo.cedar", "demo.cedarschema"


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
    # From the run's first fault to its result (None: no result, or no fault with a time).
    recovery_seconds: float | None = None
    # Each process fault that struck: which process, the PID killed and the one started in its place.
    strikes: list[dict[str, Any]] = field(default_factory=list)
    # A thread run's: the workflow ids of its messages' requests, in order (workflow_id is the thread's).
    requests: list[str] = field(default_factory=list)
    # With policies on: who decided each write ("rule <id>: allow", "person <user>: approve", ...), each
    # decision the approval channel refused to sign ("<user> on <operation id>: <why>"), and each write's
    # (tool, verdict, rules, policy version, final state).
    decisions: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    policy_writes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass
class ChaosStack:
    client: Client
    # toolloop's client on that Temporal client: starts the runs, and is their approval channel (signing_key).
    requests: ToolloopClient
    target: ChaosTarget
    # The service itself (not the proxy), the directory it keeps its data in, and for the bundled service
    # its admin API (fault rules, effects).
    service_url: str
    service_dir: Path
    admin: httpx.AsyncClient | None
    proxy: FaultProxy
    endpoint: ScriptedModelEndpoint
    task_queue: str
    signing_key: str
    verify_key: str
    # "temporal", "service", "worker": the processes of the stack, and how each one is started again.
    processes: dict[str, ManagedProcess]
    starters: dict[str, Callable[[], ManagedProcess]]
    # With policies on: the folder of the policy the evaluator and the service decide by (its copy of the demo's).
    policy_dir: Path | None = None

    @property
    def policy_file(self) -> Path:
        assert self.policy_dir is not None
        return self.policy_dir / POLICY_FILE

    async def crash_and_restart(self, name: str) -> Restart:
        """SIGKILL the process, start it again as before (same files, same port)."""
        began = time.monotonic()
        old = self.processes[name]
        await asyncio.to_thread(old.kill9)
        self.processes[name] = await asyncio.to_thread(self.starters[name])
        return Restart(old.pid, self.processes[name].pid, round(time.monotonic() - began, 2))


@contextlib.asynccontextmanager
async def chaos_stack(
    target: ChaosTarget | None = None, root: Path | None = None, *, policies: bool = False
) -> AsyncIterator[ChaosStack]:
    """Everything a chaos run of `target` (the bundled demo by default) needs, on free loopback ports,
    stopped (by PID) when the block ends. `policies`: the writes are decided by the demo's approval policy -
    the service checks policy decisions (its verify key, the policy's rules), a policy evaluator
    (`worker.py --policy`, the only holder of the policy's signing key) decides on its own task queue, and the
    worker asks it there."""
    target = target or DEMO
    processes: dict[str, ManagedProcess] = {}
    with contextlib.ExitStack() as undo:
        base = root or Path(undo.enter_context(tempfile.TemporaryDirectory(prefix="toolloop-chaos-")))
        # Stopped in reverse order of starting, whichever instance of each runs by then.
        undo.callback(_stop_all, processes)
        port = free_port()
        signing_key = generate_signing_key()
        admin_token = secrets.token_urlsafe(16)
        service_port = free_port()
        service_dir = base / "service"
        proxy = FaultProxy("127.0.0.1", service_port, [])
        endpoint = ScriptedModelEndpoint()
        queue = f"chaos-{uuid.uuid4().hex[:8]}"
        policy_dir = base / "policy" if policies else None
        policy_key = generate_signing_key()
        if policy_dir is not None:
            if not target.bundled:
                raise ValueError("policies on need the bundled service (it checks the policy's decisions)")
            shutil.copytree(DEMO_POLICY_DIR, policy_dir)
        starters: dict[str, Callable[[], ManagedProcess]] = {
            "temporal": lambda: start_temporal_dev_server(base / "temporal", port, ui_port=None),
            "service": lambda: _start_service(
                target, service_dir, service_port, admin_token, signing_key, policy_dir, verify_key_for(policy_key)
            ),
        }
        processes["temporal"] = starters["temporal"]()
        processes["service"] = starters["service"]()
        await proxy.start()
        await endpoint.start()
        env = {
            "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
            "TOOLLOOP_TASK_QUEUE": queue,
            # The worker's tools reach the service through the proxy: wire faults happen on that socket.
            target.service_url_env: f"http://127.0.0.1:{proxy.port}",
            # Its Responses adapter reaches the scripted model endpoint: model endpoint faults happen there.
            "OPENAI_API_KEY": "sk-chaos-not-a-real-key",
            "OPENAI_BASE_URL": endpoint.url,
            # The approval channel's public key: the only one the worker verifies decisions with.
            "TOOLLOOP_APPROVAL_VERIFY_KEY": verify_key_for(signing_key),
            # A test bed: its requests are scripted (the script model, or the scripted model endpoint).
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
        }
        if policy_dir is not None:
            # The worker asks the policy evaluator on its queue; it holds no key of the policy's.
            env["TOOLLOOP_POLICY_TASK_QUEUE"] = f"{queue}-policy"
            env["TOOLLOOP_POLICY_VERIFY_KEY"] = verify_key_for(policy_key)
            policy_env = {
                "TEMPORAL_ADDRESS": env["TEMPORAL_ADDRESS"],
                "TOOLLOOP_POLICY_TASK_QUEUE": env["TOOLLOOP_POLICY_TASK_QUEUE"],
                "TOOLLOOP_POLICY_FILE": str(policy_dir / POLICY_FILE),
                "TOOLLOOP_POLICY_SCHEMA": str(policy_dir / POLICY_SCHEMA),
                "TOOLLOOP_POLICY_SIGNING_KEY": policy_key,
            }
            starters["policy"] = lambda: start_policy_evaluator(policy_env, base / "logs" / "policy.log")
        starters["worker"] = lambda: start_worker(REPO_ROOT, env, base / "logs" / "worker.log", tools=target.tools)
        try:
            if policy_dir is not None:
                processes["policy"] = await asyncio.to_thread(starters["policy"])
            processes["worker"] = await asyncio.to_thread(starters["worker"])
            client = await Client.connect(f"127.0.0.1:{port}", data_converter=data_converter())
            service_url = f"http://127.0.0.1:{service_port}"
            async with contextlib.AsyncExitStack() as clients:
                admin = None
                if target.bundled:
                    admin = await clients.enter_async_context(
                        httpx.AsyncClient(
                            base_url=service_url, headers={"X-Admin-Token": admin_token}, timeout=30, trust_env=False
                        )
                    )
                yield ChaosStack(
                    client=client,
                    requests=ToolloopClient(client, task_queue=queue, signing_key=signing_key, channel=CHAOS_CHANNEL),
                    target=target,
                    service_url=service_url,
                    service_dir=service_dir,
                    admin=admin,
                    proxy=proxy,
                    endpoint=endpoint,
                    task_queue=queue,
                    signing_key=signing_key,
                    verify_key=verify_key_for(signing_key),
                    processes=processes,
                    starters=starters,
                    policy_dir=policy_dir,
                )
        finally:
            await endpoint.stop()
            await proxy.stop()


def _start_service(
    target: ChaosTarget,
    directory: Path,
    port: int,
    admin_token: str,
    signing_key: str,
    policy_dir: Path | None = None,
    policy_verify_key: str | None = None,
) -> ManagedProcess:
    """The target's service on `port` with its data in `directory` (kept across a restart); with `policy_dir`,
    deciding its writes by that policy (the demo's service reads its rules when it starts)."""
    verify_key = verify_key_for(signing_key)
    if target.service is None:
        return start_business_service(
            directory / "service.sqlite",
            port,
            admin_token,
            approval_verify_key=verify_key,
            cwd=REPO_ROOT,
            policy_verify_key=policy_verify_key if policy_dir is not None else None,
            policy_file=policy_dir / POLICY_FILE if policy_dir is not None else None,
        )
    spec = target.service
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env, spec.verify_key_env: verify_key, "PYTHONUNBUFFERED": "1"}
    proc = ManagedProcess.spawn(
        "service", spec.command(port, directory), directory / "service.log", env=env, cwd=REPO_ROOT
    )
    try:
        wait_for_http_ok(f"http://127.0.0.1:{port}{spec.health_path}", 30.0, proc)
    except BaseException:
        proc.stop()
        raise
    return proc


def start_policy_evaluator(env: dict[str, str], log_path: Path) -> ManagedProcess:
    """`python worker.py --policy` (the policy evaluator) with `env` laid over os.environ; returns once it
    logs that it is ready."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    proc = ManagedProcess.spawn(
        "policy", [sys.executable, str(REPO_ROOT / "worker.py"), "--policy"], log_path, env=full_env, cwd=REPO_ROOT
    )
    try:
        wait_for_log_line(log_path, WORKER_READY_LINE, 60.0, proc, start_offset=proc.log_offset)
    except BaseException:
        proc.stop()
        raise
    return proc


def _stop_all(processes: dict[str, ManagedProcess]) -> None:
    for name in ("worker", "policy", "service", "temporal"):
        if name in processes:
            processes[name].stop()


def wire_faults(plan: FaultPlan) -> list[WireFault]:
    return [WireFault(i, f) for i, f in enumerate(plan.faults) if isinstance(f, WireFaultSpec)]


def uses_endpoint(plan: FaultPlan) -> bool:
    """Whether a plan's run needs the scripted model endpoint (the worker's real Responses adapter): for
    faults on the model's HTTP exchange, and to hold a model call while a process is killed. Other runs
    use the script model, which reads its turns from the workflow input."""
    return any(
        (isinstance(f, ModelFaultSpec) and f.fault in ENDPOINT_FAULTS)
        or (isinstance(f, ProcessFaultSpec) and f.at == "during_model_turn")
        for f in plan.faults
    )


async def run_one(stack: ChaosStack, scenario: Scenario, seed: int) -> RunOutcome:
    plan = scenario.plan
    tag = f"{scenario.name}-{seed}-{uuid.uuid4().hex[:6]}"
    strikes = process_faults(plan)
    rules = service_rules(plan, seed)
    if stack.admin is not None:
        (await stack.admin.post("/admin/reset")).raise_for_status()
        put = await stack.admin.put("/admin/faults", json={"rules": rules + service_holds(strikes)})
        put.raise_for_status()
    stack.proxy.faults, stack.proxy.seed = wire_faults(plan) + wire_holds(strikes), seed
    stack.proxy.matched.clear()
    stack.proxy.fired.clear()
    stack.proxy.first_fired_at.clear()
    policy = scenario.policy
    if policy is not None and stack.policy_dir is None:
        raise ValueError(f"{scenario.name} is a policy scenario: the stack must run with policies on")
    if stack.policy_dir is not None:
        await asyncio.to_thread(set_policy, stack.policy_file, policy)
    ttl = {"approval_ttl_seconds": policy.approval_ttl_seconds} if policy and policy.approval_ttl_seconds else {}
    limits = Limits(**CHAOS_LIMITS, **ttl)
    actor = stack.target.actor
    work = policy_workload(tag, policy) if policy is not None else stack.target.workload(tag)
    turns, model_fired = with_model_faults(plan, work.turns, work.injected)
    stack.endpoint.load(turns, endpoint_faults(plan.faults), seed)
    model = ModelSpec(provider="openai", name="chaos-script") if uses_endpoint(plan) else script(*turns)
    # The run's tag is its request id: its workflow id is request_workflow_id(actor, tag), as the reports and
    # the saved histories name it.
    request = await stack.requests.start(
        f"chaos run {tag}", actor=actor, request_id=tag, model=model, limits=limits, tools=scenario.allowed_tools
    )
    began = time.monotonic()
    gate = ApprovalGate()
    if not any(f.spec.at == "during_approval_wait" for f in strikes):
        gate.open.set()
    context, by_fault = start_strikes(stack, len(rules), strikes, gate)
    striking = list(by_fault.values())
    shown: dict[str, str] = {}
    refused: list[str] = []
    if policy is None:
        approver = asyncio.create_task(_decide_each(request, work.wanted, gate, shown))
    else:
        approver = asyncio.create_task(_decide_as_people(stack, request, work.wanted, policy, shown, refused))
    result: AgentResult | None = None
    try:
        result = await _result_within(request, RUN_SECONDS)
        ended_at = time.time()
        # The strikes are over by now, or their point never came (then they count as never fired).
        struck = [s for s in await asyncio.gather(*(_settled(t) for t in striking)) if s is not None]
        # The service's rules once, for what fired and when the first fault did.
        service = [] if stack.admin is None else (await stack.admin.get("/admin/faults")).json()["rules"]
        fired = _fired(stack, plan, service, model_fired, struck)
        first_fault = _first_fault_at(stack, service, struck)
        await _clear_faults(stack)
        if result is None:
            result = await _result_within(request, SETTLE_SECONDS)
            ended_at = time.time()
    finally:
        for task in [approver, *striking]:
            task.cancel()
        await asyncio.gather(approver, *striking, return_exceptions=True)
    seconds = time.monotonic() - began
    if result is None:
        with contextlib.suppress(Exception):
            await request.handle.terminate("chaos run: no result once the faults cleared")
    facts = await _facts(stack, scenario, seed, request, result, tag, limits, shown, turns)
    if policy is not None:
        facts.writes = len(policy.refunds) + int(policy.event)
    operations = result.operations if result else []
    write = next((op for op in operations if work.wanted(op.tool, op.arguments)), None)
    return RunOutcome(
        scenario=scenario.name,
        seed=seed,
        workflow_id=request.workflow_id,
        seconds=seconds,
        checks=judge(facts),
        fired=fired,
        write_state=write.state if write else None,
        honesty=[honesty_cell(facts, op) for op in facts.operations],
        effects=len(facts.effects),
        recovery_seconds=round(ended_at - first_fault, 2) if result is not None and first_fault else None,
        strikes=[{"fault": s.index, "process": s.process, **dataclasses.asdict(s.restart)} for s in struck],
        decisions=decisions(facts.operations) if facts.policies else [],
        refused=refused,
        policy_writes=[policy_write(op) for op in operations if op.policy is not None],
    )


def policy_write(op: OperationRecord) -> dict[str, Any]:
    """What the policy decided of one write and how it ended, for the results (and the scenario's expectations)."""
    assert op.policy is not None
    return {
        "operation_id": op.operation_id,
        "tool": op.tool,
        "verdict": op.policy.verdict,
        "rules": list(op.policy.rules),
        "version": op.policy.version,
        "approved_by": list(op.policy.approved_by),
        "state": op.state,
        "code": (op.output or {}).get("code"),
    }


def set_policy(policy_file: Path, plan: PolicyPlan | None) -> None:
    """The policy a run starts with: the demo's, or the scenario's variant of it (written only when it differs,
    so the evaluator reloads only for a change)."""
    text = policy_text((DEMO_POLICY_DIR / POLICY_FILE).read_text(encoding="utf-8"), plan) if plan else None
    wanted = text if text is not None else (DEMO_POLICY_DIR / POLICY_FILE).read_text(encoding="utf-8")
    if policy_file.read_text(encoding="utf-8") != wanted:
        policy_file.write_text(wanted, encoding="utf-8")


def policy_workload(tag: str, plan: PolicyPlan) -> Workload:
    return Workload(turns=policy_turns(tag, plan), wanted=policy_wanted(tag, plan), injected=refund_to_attacker)


async def _decide_as_people(
    stack: ChaosStack,
    request: ToolloopRequest,
    wanted: Callable[[str, dict[str, Any]], bool],
    plan: PolicyPlan,
    shown: dict[str, str],
    refused: list[str],
) -> None:
    """The people of a policy scenario at the client's approval channel: for the Nth write that waits for
    people, each of `plan.deciders[N]` in turn decides it as they want it (approve what the run's user asked
    for, reject anything else), signed with the roles their identity gives them (PEOPLE), on the approval
    request as it stands just then. A decision the channel or the workflow refuses is recorded in `refused`
    (the invariants judge what the ledger holds). With `change_when_asked`, the policy file changes as soon as
    the first write waits, before anyone decides it."""
    asked: list[str] = []
    while True:
        try:
            async for approval in request.approvals():
                if approval.operation_id in asked:
                    continue
                shown[approval.operation_id] = payload_digest(approval.digest_subject, approval.arguments)
                if not asked and plan.change_when_asked:
                    await asyncio.to_thread(_withdraw_auto_refunds, stack.policy_file)
                people = plan.deciders[len(asked)] if len(asked) < len(plan.deciders) else ()
                asked.append(approval.operation_id)
                for person in people:
                    current = await request.approval(approval.operation_id)
                    if current is None or current.state != "awaiting_approval":
                        break
                    try:
                        await request.decide(
                            current,
                            approve=wanted(current.tool, current.arguments),
                            decider=Actor(user_id=person, tenant_id=request.actor.tenant_id),
                            roles=PEOPLE.get(person, ()),
                        )
                    except (ApprovalRefused, WorkflowUpdateFailedError) as exc:
                        refused.append(f"{person} on {approval.operation_id}: {str(exc).splitlines()[0][:200]}")
            return
        except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError):
            await asyncio.sleep(0.5)


def _withdraw_auto_refunds(policy_file: Path) -> None:
    policy_file.write_text(withdraw_auto_refunds(policy_file.read_text(encoding="utf-8")), encoding="utf-8")


async def _settled(task: asyncio.Task[Strike | None]) -> Strike | None:
    """A strike's record; None for one still waiting for a point that never came (it is cancelled)."""
    if not task.done():
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


async def _result_within(request: ToolloopRequest, seconds: float) -> AgentResult | None:
    """The run's result, or None after `seconds`; waits through a restart of the Temporal server (the
    client's calls fail while it is away)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            return await asyncio.wait_for(request.result(), left)
        except TimeoutError:
            return None
        except RPCError:
            await asyncio.sleep(0.5)
    return None


def _first_fault_at(stack: ChaosStack, rules: Sequence[dict[str, Any]], struck: Sequence[Strike]) -> float | None:
    """When the run's first fault fired (wall clock), from the service's rules, the proxy, the model
    endpoint and the strikes; None if none of them says (a fault in the script's turns has no time)."""
    times = [float(r["first_fired_at"]) for r in rules if r.get("first_fired_at") is not None]
    times += [*stack.proxy.first_fired_at.values(), *stack.endpoint.first_fired_at.values()]
    times += [s.at for s in struck]
    return min(times) if times else None


async def _decide_each(
    request: ToolloopRequest,
    wanted: Callable[[str, dict[str, Any]], bool],
    gate: ApprovalGate,
    shown: dict[str, str],
) -> None:
    """The run's user (the request's own) at the client's approval channel: approves the write they asked for
    as soon as it waits, and rejects anything else (a write the model was talked into). Waits for the gate (a
    strike during the approval wait) before deciding, and follows the run again after a restart of the
    Temporal server. `shown` gets, per operation, the digest of what it was shown (the payload it decides on).
    The client's approvals() and decide() rather than decide_each(), which would skip a decision the workflow
    refuses: here, as before the client, a refusal ends the approver, and the run's invariants judge the rest."""
    decided: set[str] = set()
    while True:
        try:
            async for approval in request.approvals():
                if approval.operation_id in decided:
                    continue
                gate.saw_one()
                shown[approval.operation_id] = payload_digest(approval.digest_subject, approval.arguments)
                await gate.open.wait()
                await request.decide(approval, approve=wanted(approval.tool, approval.arguments))
                decided.add(approval.operation_id)
            return
        except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError):
            await asyncio.sleep(0.5)


def _fired(
    stack: ChaosStack,
    plan: FaultPlan,
    rules: Sequence[dict[str, Any]],
    in_script: dict[int, int],
    struck: Sequence[Strike],
) -> dict[int, int]:
    """How often each fault of the plan fired, by whoever injected it: service faults by the service's own
    counts (its rules, in the order service_rules wrote them), wire faults by the proxy's, model faults by
    the endpoint's or the script's, process faults by their strikes."""
    service_indexes = [i for i, f in enumerate(plan.faults) if isinstance(f, ServiceFaultSpec)]
    fired = {index: int(rule["fired"]) for index, rule in zip(service_indexes, rules, strict=False)}
    fired |= dict(stack.proxy.fired) | in_script | dict(stack.endpoint.fired) | {s.index: 1 for s in struck}
    return {i: fired.get(i, 0) for i in range(len(plan.faults))}


async def _clear_faults(stack: ChaosStack) -> None:
    if stack.admin is not None:
        (await stack.admin.delete("/admin/faults")).raise_for_status()
    stack.proxy.faults = []


async def _in_doubt(stack: ChaosStack, operation_ids: Sequence[str]) -> list[str]:
    """Of the operations without an effect, those the bundled service still holds in progress (its status
    endpoint, asked as the run's user once the faults cleared); another service's records say only effect
    or none."""
    if stack.admin is None or not operation_ids:
        return []
    actor = stack.target.actor
    headers = {"X-Actor-User": actor.user_id, "X-Actor-Tenant": actor.tenant_id}
    doubtful = []
    for operation_id in operation_ids:
        answer = await stack.admin.get(f"/operations/{operation_id}", headers=headers)
        # In progress: claimed, not committed; no answer: the records cannot be read. Either way, not known.
        if answer.status_code != 200 or answer.json().get("state") == "in_progress":
            doubtful.append(operation_id)
    return doubtful


async def _facts(
    stack: ChaosStack,
    scenario: Scenario,
    seed: int,
    request: ToolloopRequest,
    result: AgentResult | None,
    tag: str,
    limits: Limits,
    shown: dict[str, str],
    scripted: list[list[dict[str, Any]]],
) -> RunFacts:
    query = EffectQuery(
        tag=tag,
        operation_ids=[op.operation_id for op in (result.operations if result else [])],
        data_dir=stack.service_dir,
        service_url=stack.service_url,
        admin=stack.admin,
    )
    effects = await stack.target.effects(query)
    received = await _received(stack)
    in_doubt = await _in_doubt(stack, [op for op in query.operation_ids if op not in {e.operation_id for e in effects}])
    ledger = {op.operation_id: op.digest for op in (result.operations if result else [])}
    turns = await model_turns(request.handle)
    planted = [
        f.spec.text for f in wire_faults(scenario.plan) if f.spec.fault == "plant" and stack.proxy.fired[f.index]
    ]
    planted_in = [
        item.type
        for turn_input, turn_result in turns
        for item in [*turn_input.new_items, *(turn_result.items if turn_result else [])]
        if any(_holds(item, text) for text in planted)
    ]
    calls: list[str] = []
    recorded: list[tuple[str, str]] = []
    outputs_sent: list[tuple[list[str], list[str]]] = []
    previous: list[str] | None = None
    for turn_input, turn_result in turns:
        if previous is not None:
            sent = [i.call_id for i in turn_input.new_items if isinstance(i, FunctionCallOutputItem)]
            outputs_sent.append((sent, previous))
        made_items = [i for i in (turn_result.items if turn_result else []) if isinstance(i, FunctionCallItem)]
        made = [i.call_id for i in made_items]
        recorded += [(i.call_id, i.arguments) for i in made_items]
        calls += made
        previous = made
    return RunFacts(
        scenario=scenario.name,
        seed=seed,
        finished=result is not None,
        stop_reason=result.stop_reason if result else None,
        operations=[operation_facts(op) for op in (result.operations if result else [])],
        effects=effects,
        calls=calls,
        answered=[c.call_id for c in (result.calls if result else [])],
        outputs_sent=outputs_sent,
        actor=(stack.target.actor.user_id, stack.target.actor.tenant_id),
        rounds=result.rounds if result else 0,
        max_rounds=limits.max_rounds,
        planted=planted,
        planted_in=planted_in,
        allowed_tools=list(scenario.allowed_tools) if scenario.allowed_tools is not None else None,
        call_codes=[(c.tool, c.code) for c in (result.calls if result else [])],
        operation_tools=[op.tool for op in (result.operations if result else [])],
        approvals_shown=[(op_id, digest == ledger.get(op_id)) for op_id, digest in shown.items()],
        in_doubt=in_doubt,
        received=received,
        scripted_arguments={
            item["call_id"]: item["arguments"]
            for turn in scripted
            for item in turn
            if item.get("type") == "function_call"
        },
        recorded_arguments=recorded,
        policies=stack.policy_dir is not None,
        roles=dict(PEOPLE),
    )


def operation_facts(op: OperationRecord) -> OperationFacts:
    return OperationFacts(
        operation_id=op.operation_id,
        state=op.state,
        approved=op.approval is not None and op.approval.decision == "approved",
        policy=op.policy.verdict if op.policy else None,
        rules=tuple(op.policy.rules) if op.policy else (),
        deciders=op.policy.deciders if op.policy else None,
        approved_by=tuple(op.policy.approved_by) if op.policy else (),
        decided_by=op.approval.by if op.approval else "",
        rejected=op.approval is not None and op.approval.decision == "rejected",
    )


async def _received(stack: ChaosStack) -> list[Received] | None:
    """Every request the bundled service received in this run, from its own log (reset when the run began);
    None for another service (its log is not the runner's to read)."""
    if stack.admin is None:
        return None
    rows = (await stack.admin.get("/admin/requests")).json()["requests"]
    return [
        Received(
            method=str(r["method"]),
            path=str(r["path"]),
            started_at=float(r["started_at"]),
            status=r["status"],
            key=r.get("idempotency_key"),
            payload=r.get("body_digest"),
        )
        for r in rows
    ]


def _holds(item: ConversationItem, text: str) -> bool:
    """Whether a conversation item carries the start of a planted text (a long one is cut by the output
    cap), as it is or as JSON writes it inside a string (a tool's output is JSON text)."""
    if isinstance(item, FunctionCallOutputItem):
        fields = [item.output]
    elif isinstance(item, FunctionCallItem):
        fields = [item.name, item.arguments]
    else:
        fields = [item.model_dump_json()]
    start = text[:40]
    escaped = json.dumps(start)[1:-1]
    return any(start in f or escaped in f for f in fields)


async def run_matrix(
    stack: ChaosStack, scenarios: Sequence[Scenario], seeds: Sequence[int], say: Callable[[str], None]
) -> list[RunOutcome]:
    # Imported here: a thread's run is built on this module's parts.
    from faultbed.thread_runs import run_thread

    outcomes = []
    total = len(scenarios) * len(seeds)
    for scenario in scenarios:
        for seed in seeds:
            began = time.monotonic()
            try:
                run = run_thread if scenario.thread is not None else run_one
                outcome = await run(stack, scenario, seed)
            except Exception as exc:
                # A run the runner could not finish is a broken run in the report, never a traceback instead
                # of one (the traceback goes to the log); the stack is still stopped by its owner.
                logger.exception("chaos run %s seed %s could not be finished", scenario.name, seed)
                outcome = unfinished_run(scenario, seed, exc, time.monotonic() - began)
            outcomes.append(outcome)
            broken = [c.name for c in outcome.checks if not c.ok]
            fired = sum(outcome.fired.values())
            say(
                f"[{len(outcomes)}/{total}] {scenario.name} seed {seed}: "
                f"{'ok' if not broken else 'BROKEN ' + ', '.join(broken)} "
                f"(write {outcome.write_state or '-'}, {fired} fault(s) fired, {outcome.seconds:.1f} s)"
            )
    return outcomes


def unfinished_run(scenario: Scenario, seed: int, error: Exception, seconds: float) -> RunOutcome:
    why = f"expected the runner to finish the run and judge it; it failed with {type(error).__name__}: {error}"
    return RunOutcome(
        scenario=scenario.name,
        seed=seed,
        workflow_id="-",
        seconds=seconds,
        checks=[Check("the run could be judged", False, why[:500])],
        fired={},
        write_state=None,
    )


async def save_histories(stack: ChaosStack, outcomes: Sequence[RunOutcome], directory: Path) -> list[Path]:
    """The history of each scenario's first run, as tests/test_replay_histories.py replays them: a change
    to the workflow that these runs' histories cannot survive then fails CI. A thread scenario's run is a
    directory of its own: the thread's workflow (thread.json) and each message's request (m1.json, ...)."""
    texts = {}
    for outcome in {o.scenario: o for o in reversed(outcomes) if o.workflow_id != "-"}.values():
        if not outcome.requests:
            texts[outcome.scenario] = await _stored_history(stack, outcome.workflow_id)
            continue
        texts[f"{outcome.scenario}/thread"] = await _stored_history(stack, outcome.workflow_id)
        for number, workflow_id in enumerate(outcome.requests, start=1):
            texts[f"{outcome.scenario}/m{number}"] = await _stored_history(stack, workflow_id)
    return await asyncio.to_thread(_write_all, directory, texts)


async def _stored_history(stack: ChaosStack, workflow_id: str) -> str:
    history = await stack.client.get_workflow_handle(workflow_id).fetch_history()
    # The workflow id is part of what replays: operation ids are derived from it.
    stored = {"workflow_id": workflow_id, "history": json.loads(history.to_json())}
    return json.dumps(stored, indent=1, sort_keys=True) + "\n"


def _write_all(directory: Path, texts: dict[str, str]) -> list[Path]:
    for name, text in texts.items():
        path = directory / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(directory / f"{name}.json" for name in texts)


def start_strikes(
    stack: ChaosStack, plan_rules: int, strikes: Sequence[ProcessFault], gate: ApprovalGate
) -> tuple[StrikeContext, dict[ProcessFault, asyncio.Task[Strike | None]]]:
    """The strikes' shared context on `stack`, and each strike started, waiting for its moment (a request run
    and a thread run alike)."""
    context = StrikeContext(
        proxy=stack.proxy,
        admin=stack.admin,
        plan_rules=plan_rules,
        pause_model_call=stack.endpoint.pause,
        release_model_call=stack.endpoint.release,
        gate=gate,
        crash_and_restart=stack.crash_and_restart,
    )
    after_commit = [f for f in strikes if f.spec.at == "after_service_commit"]
    started = {
        f: asyncio.create_task(strike(context, f, after_commit.index(f) if f in after_commit else 0)) for f in strikes
    }
    return context, started
