"""I/O: `starter.py chaos` - pick scenarios (or a user's plan) and seeds, run the matrix on a stack of its own,
print live progress and a table per scenario, write the JSON results and the Markdown report, and say by the
exit status whether every invariant held and every fault a scenario needs fired."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from faultbed.charts import MISSING as CHARTS_MISSING
from faultbed.charts import available as charts_available
from faultbed.charts import draw_all
from faultbed.demo import DEMO
from faultbed.invariants import reported
from faultbed.plan import THREAD_POINTS, FaultPlan, ProcessFaultSpec, ServiceFaultSpec, WireFaultSpec, load_plan
from faultbed.report import (
    NOT_ON_LOG,
    NOTHING_BROKE,
    checked_on_service_log,
    decision_counts,
    headline,
    render_markdown,
    to_json,
    unfired,
    what_broke,
)
from faultbed.runner import RunOutcome, chaos_stack, run_matrix, save_histories
from faultbed.scenarios import BUILT_IN, POLICY_SCENARIOS, Scenario, find, find_any
from faultbed.target import ChaosTarget, load_target

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2


class ChaosUsageError(ValueError):
    """A bad choice of scenarios, seeds or plan: one line for the user, exit 2."""


@dataclass(frozen=True)
class ChaosChoice:
    scenarios: list[Scenario]
    seeds: list[int]
    out: Path
    # Where to save each scenario's first run's history (for the replay test); None: nowhere.
    save_histories: Path | None = None
    target: ChaosTarget = DEMO
    # How the scenarios were chosen when not by name, for the replay commands (`--plan F --tools T`).
    replay_source: str = ""
    # The writes are decided by the demo's approval policy (the stack runs a policy evaluator).
    policies: bool = False


def choose(
    scenarios: str,
    seeds: int,
    seed: int | None,
    plan: Path | None,
    out: Path,
    save_histories: Path | None = None,
    tools: str | None = None,
    policies: bool = False,
) -> ChaosChoice:
    if seeds < 1:
        raise ChaosUsageError("--seeds: must be at least 1")
    target = DEMO if tools is None else load_target(tools)  # TargetError: one line
    if plan is not None:
        user_plan = load_plan(plan)  # PlanError: one line per bad field
        points = [
            f"{plan}: faults[{i}].at: {f.at} is a point of a thread scenario; a plan runs one request"
            for i, f in enumerate(user_plan.faults)
            if isinstance(f, ProcessFaultSpec) and f.at in THREAD_POINTS
        ]
        if points:
            raise ChaosUsageError("\n".join(points))
        chosen = [Scenario(plan=user_plan, family="plan", covers=(), expect="")]
        default_seed = user_plan.seed or 0
    elif not scenarios.strip() and not target.bundled:
        # Against a user's tools by default: the built-in scenarios that name no path of the demo's service.
        chosen = [s for s in BUILT_IN if is_generic(s.plan) and s.thread is None]
        default_seed = 0
    else:
        names = [n.strip() for n in scenarios.split(",") if n.strip()]
        try:
            chosen = find_any(names) if names else [*find([]), *(POLICY_SCENARIOS if policies else ())]
        except KeyError as exc:
            raise ChaosUsageError(f"--scenarios: {exc.args[0]}") from None
        default_seed = 0
    # A policy scenario runs on a stack with policies on: naming one turns them on for the whole run.
    policies = policies or any(s.policy is not None for s in chosen)
    if policies and not target.bundled:
        raise ChaosUsageError(
            "--policies: the policy runs need the bundled service, which checks the policy's decisions"
        )
    picked = [seed] if seed is not None else [default_seed + i for i in range(seeds)]
    if not target.bundled:
        needs = [f"{s.name}: {why}" for s in chosen for why in needs_bundled_service(s.plan)]
        needs += [
            f"{s.name}: a thread scenario runs the demo's messages on the bundled service" for s in chosen if s.thread
        ]
        if needs:
            raise ChaosUsageError("\n".join(needs))
    parts = (f"--plan {plan}" if plan is not None else "", f"--tools {tools}" if tools else "")
    source = " ".join(part for part in (*parts, "--policies" if policies else "") if part)
    return ChaosChoice(
        scenarios=chosen,
        seeds=picked,
        out=out,
        save_histories=save_histories,
        target=target,
        replay_source=source,
        policies=policies,
    )


def is_generic(plan: FaultPlan) -> bool:
    """A plan for any target: it names no path and needs nothing only the bundled service does."""
    paths = [f.match.path for f in plan.faults if isinstance(f, ServiceFaultSpec | WireFaultSpec)]
    return not any(paths) and not needs_bundled_service(plan)


def needs_bundled_service(plan: FaultPlan) -> list[str]:
    """What in a plan only the bundled service can do (its fault rules, a reply held after its commit)."""
    problems = []
    for index, fault in enumerate(plan.faults):
        if isinstance(fault, ServiceFaultSpec):
            problems.append(
                f"faults[{index}]: a service fault ({fault.fault}) needs the bundled service's fault rules; "
                "with --tools use wire, model and process faults"
            )
        elif isinstance(fault, ProcessFaultSpec) and fault.at == "after_service_commit":
            problems.append(
                f"faults[{index}]: after_service_commit needs the bundled service, which holds the reply of a "
                "committed write; with --tools strike before_write_sent, during_model_turn or during_approval_wait"
            )
    return problems


def policy_problems(scenarios: Sequence[Scenario], outcomes: Sequence[RunOutcome]) -> list[str]:
    """Policy runs whose writes were not decided and did not end as their scenario is named for (its verdict
    and final state per write), and a policy changed mid-run that did not decide the later write by its new
    version while the waiting one kept the old."""
    plans = {s.name: s.policy for s in scenarios if s.policy is not None}
    problems = []
    for o in outcomes:
        plan = plans.get(o.scenario)
        if plan is None or o.workflow_id == "-":
            continue
        got = sorted((w["verdict"], w["state"]) for w in o.policy_writes)
        if got != sorted(plan.expect):
            problems.append(
                f"{o.scenario} seed {o.seed}: expected its writes decided and ended as {sorted(plan.expect)} "
                f"(verdict, state); they were {got}"
            )
        versions = [w["version"] for w in o.policy_writes]
        if plan.change_when_asked and (len(versions) < 2 or versions[0] == versions[-1]):
            problems.append(
                f"{o.scenario} seed {o.seed}: expected the write asked after the policy changed to be decided by "
                f"the new version; the versions were {versions}"
            )
    return problems


def branch_problems(scenarios: Sequence[Scenario], outcomes: Sequence[RunOutcome]) -> list[str]:
    """Runs whose write did not end the way its scenario is named for (the fault did not lead there)."""
    expected = {s.name: s.expect for s in scenarios if s.expect}
    return [
        f"{o.scenario} seed {o.seed}: expected its write to end {expected[o.scenario].replace('_', ' ')}; it ended "
        f"{o.write_state or 'without ever becoming an operation'}"
        for o in outcomes
        if o.scenario in expected and (o.write_state is None or reported(o.write_state) != expected[o.scenario])
    ]


async def run_chaos(choice: ChaosChoice, say: Callable[[str], None]) -> int:
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    began = time.monotonic()
    say(f"chaos: {len(choice.scenarios)} scenario(s) x {len(choice.seeds)} seed(s); starting a stack of its own")
    async with chaos_stack(choice.target, policies=choice.policies) as stack:
        outcomes = await run_matrix(stack, choice.scenarios, choice.seeds, say)
        if choice.save_histories is not None:
            for path in await save_histories(stack, outcomes, choice.save_histories):
                say(f"saved {path}")
    problems = unfired(choice.scenarios, outcomes)
    if choice.target.bundled:
        # The endings the built-in scenarios expect are those of the demo's workload.
        problems += branch_problems(choice.scenarios, outcomes)
        problems += policy_problems(choice.scenarios, outcomes)
    meta = {
        "started_at": started,
        "seconds": round(time.monotonic() - began),
        "scenarios": len(choice.scenarios),
        "seeds": ",".join(map(str, choice.seeds)),
        "policies": "on" if choice.policies else "off",
    }
    choice.out.mkdir(parents=True, exist_ok=True)
    (choice.out / "chaos.json").write_text(
        json.dumps(to_json(meta, choice.scenarios, outcomes, problems, choice.replay_source), indent=1) + "\n"
    )
    drawable = charts_available()
    charts = draw_all(choice.scenarios, outcomes, choice.out) if drawable else []
    note = None if drawable else CHARTS_MISSING
    (choice.out / "chaos.md").write_text(
        render_markdown(meta, choice.scenarios, outcomes, problems, charts, note, choice.replay_source)
    )
    # What broke first, then the figures: a problem never hides under a headline of zeros.
    broke = what_broke(outcomes, problems, choice.replay_source)
    say("what broke:" if broke else f"what broke: {NOTHING_BROKE}")
    for line in broke:
        say("  " + line.removeprefix("- ").replace("**", ""))
    say("headline:")
    for name, value in headline(outcomes).items():
        say(f"  {name}: {value}")
    counts = decision_counts(outcomes)
    if counts:
        say("decisions by rule and by person:")
        for decision, n in counts.items():
            say(f"  {decision}: {n}")
    if not checked_on_service_log(outcomes):
        say(NOT_ON_LOG)
    say(f"wrote {choice.out / 'chaos.json'} and {choice.out / 'chaos.md'}")
    return EXIT_OK if not problems and all(o.ok for o in outcomes) else EXIT_BROKEN


def main(choice: ChaosChoice, say: Callable[[str], None]) -> int:
    return asyncio.run(run_chaos(choice, say))
