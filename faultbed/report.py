"""Pure: the chaos runner's results - what each run held and broke, the faults that must have fired and did
not, the headline figures, and the JSON and Markdown a user reads (with a command to replay any run)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from faultbed.catalog import CoveredByTest, coverage
from faultbed.invariants import (
    EFFECT_DENIED,
    IN_ORDER,
    NEVER_OVERLAP,
    NEVER_REDONE,
    PARTIAL_CALLS,
    REPLAYS,
    SHOWN_AS_RECORDED,
    UNENTITLED_DECISIONS,
)
from faultbed.runner import RunOutcome
from faultbed.scenarios import Scenario

REPORTED = ("done", "not_done", "unknown")
ACTUAL = ("done", "not_done", "unknown")


def unfired(scenarios: Sequence[Scenario], outcomes: Sequence[RunOutcome]) -> list[str]:
    """The faults a scenario needs that never fired: an Nth-call fault in any run of it, a seeded one in
    all its runs together. '0 duplicates' from faults that never happened counts for nothing."""
    problems = []
    for scenario in scenarios:
        runs = [o for o in outcomes if o.scenario == scenario.name]
        for index, fault in enumerate(scenario.plan.faults):
            if fault.when.nth is not None:
                missed = [o.seed for o in runs if o.fired.get(index, 0) == 0]
                if missed:
                    problems.append(
                        f"{scenario.name}: expected fault {index} ({fault.fault}) to fire in every run; "
                        f"it never fired with seeds {missed}"
                    )
            elif runs and not any(o.fired.get(index, 0) for o in runs):
                problems.append(
                    f"{scenario.name}: expected fault {index} ({fault.fault}) to fire in some run; it fired in none"
                )
    return problems


def headline(outcomes: Sequence[RunOutcome]) -> dict[str, int]:
    broken = Counter(c.name for o in outcomes for c in o.checks if not c.ok)
    cells = Counter(cell for o in outcomes for cell in o.honesty)
    return {
        "scenarios": len({o.scenario for o in outcomes}),
        "runs": len(outcomes),
        # A fault point: one fault of one scenario's plan, counted once it fired in some run.
        "fault points": len({(o.scenario, i) for o in outcomes for i, n in o.fired.items() if n}),
        "faults fired": sum(sum(o.fired.values()) for o in outcomes),
        "duplicate effects": broken["at most one effect"],
        "lost acknowledged writes": cells[("done", "not_done")],
        "unapproved effects": broken["no effect without approval"],
        "false done": cells[("done", "not_done")],
        "false not-done": cells[("not_done", "done")],
        "resends with a new key": broken["no resend with a new key"],
        "blind resends": broken["status asked before every resend"],
        "verified without read-back": broken["verified means read back"],
        "pairing breaks": broken["every call_id answered once"],
        "calls from partial arguments": broken[PARTIAL_CALLS],
        # A thread scenario's (0 in a run of single requests, which has none of these checks).
        "overlapping messages": broken[NEVER_OVERLAP],
        "messages out of order": broken[IN_ORDER],
        "writes shown done, not verified": broken[SHOWN_AS_RECORDED],
        "done writes redone": broken[NEVER_REDONE],
        "histories not replaying": broken[REPLAYS],
        "stuck requests": broken["no stuck request"],
        "runs not judged": broken["the run could be judged"],
        # With policies on (0 in a run without them, which has none of these checks).
        "effects a rule denied": broken[EFFECT_DENIED],
        "decisions by someone who may not decide": broken[UNENTITLED_DECISIONS],
        "decisions by rule": sum(1 for o in outcomes for d in o.decisions if d.startswith("rule ")),
        "decisions by people": sum(1 for o in outcomes for d in o.decisions if d.startswith("person ")),
        "decisions refused at the approval channel": sum(len(o.refused) for o in outcomes),
    }


def decision_counts(outcomes: Sequence[RunOutcome]) -> dict[str, int]:
    """How many decisions each rule and each person took over the runs ("rule small-late-refund: allow" -> 3)."""
    return dict(sorted(Counter(d for o in outcomes for d in o.decisions).items()))


def replay_command(outcome: RunOutcome, source: str = "") -> str:
    """The one command that runs this run again. `source`: how the run's scenarios were chosen when not
    by name (`--plan FILE`, and `--tools TARGET` for a user's own target)."""
    chosen = source if "--plan" in source else f"--scenarios {outcome.scenario} {source}".rstrip()
    return f"python starter.py chaos {chosen} --seed {outcome.seed}"


def to_json(
    meta: dict[str, Any],
    scenarios: Sequence[Scenario],
    outcomes: Sequence[RunOutcome],
    problems: Sequence[str],
    replay_source: str = "",
) -> dict[str, Any]:
    return {
        "meta": meta,
        "headline": headline(outcomes),
        "decisions": decision_counts(outcomes),
        "problems": list(problems),
        "catalog": [dict(zip(("id", "covered_by", "note"), row, strict=True)) for row in catalog_rows(scenarios)],
        "scenarios": [
            {
                "name": s.name,
                "family": s.family,
                "covers": list(s.covers),
                "plan": s.plan.model_dump(mode="json"),
            }
            for s in scenarios
        ],
        "runs": [
            {
                **{k: v for k, v in asdict(o).items() if k not in ("checks", "honesty")},
                "ok": o.ok,
                "checks": [asdict(c) for c in o.checks],
                "honesty": [list(cell) for cell in o.honesty],
                "replay": replay_command(o, replay_source),
            }
            for o in outcomes
        ],
    }


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def catalog_rows(scenarios: Sequence[Scenario]) -> list[list[str]]:
    """Each catalog id: the scenarios of this run that cover it, else the test that does, else the gap."""
    rows = []
    in_run = {s.name for s in scenarios}
    for case in coverage():
        ran = [name for name in case.scenarios if name in in_run]
        if ran:
            rows.append([case.case, "scenario " + ", ".join(ran), ""])
        elif case.scenarios:
            rows.append([case.case, "scenario " + ", ".join(case.scenarios), "(not in this run)"])
        elif isinstance(case.elsewhere, CoveredByTest):
            missing = f" Not checked: {case.elsewhere.missing}." if case.elsewhere.missing else ""
            rows.append([case.case, f"`{case.elsewhere.node}`", case.elsewhere.why + missing])
        else:
            why = case.elsewhere.why if case.elsewhere is not None else "nothing names it"
            rows.append([case.case, "**not covered yet**", why])
    return rows


def _fault_label(scenario: Scenario, index: int) -> str:
    faults = scenario.plan.faults
    return faults[index].fault if 0 <= index < len(faults) else f"fault {index}"


def _median_max(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1f} / {max(values):.1f}" if values else "-"


def render_markdown(
    meta: dict[str, Any],
    scenarios: Sequence[Scenario],
    outcomes: Sequence[RunOutcome],
    problems: Sequence[str],
    charts: Sequence[str] = (),
    chart_note: str | None = None,
    replay_source: str = "",
) -> str:
    lines = ["# Chaos run", "", ", ".join(f"{k}: {v}" for k, v in meta.items()), ""]
    lines += ["## What broke", "", *(what_broke(outcomes, problems, replay_source) or [NOTHING_BROKE]), ""]
    lines += ["## Headline", ""]
    figures = headline(outcomes)
    lines += _table(["figure", "value"], [[k, f"**{v}**" if v and k in BAD else str(v)] for k, v in figures.items()])
    if not checked_on_service_log(outcomes):
        lines += ["", NOT_ON_LOG]
    lines += ["", "## Per scenario", ""]
    rows = []
    for s in scenarios:
        runs = [o for o in outcomes if o.scenario == s.name]
        fired = sum(sum(o.fired.values()) for o in runs)
        broken = sorted({c.name for o in runs for c in o.checks if not c.ok})
        seconds = [o.seconds for o in runs]
        recovery = [o.recovery_seconds for o in runs if o.recovery_seconds is not None]
        states = Counter(o.write_state or "-" for o in runs)
        rows.append(
            [
                s.name,
                ", ".join(s.covers),
                str(len(runs)),
                str(fired),
                "all held" if not broken else "**broken: " + ", ".join(broken) + "**",
                ", ".join(f"{k} x{v}" for k, v in sorted(states.items())),
                _median_max(seconds),
                _median_max(recovery),
            ]
        )
    lines += _table(
        [
            "scenario",
            "covers",
            "seeds",
            "faults fired",
            "invariants",
            "write ended",
            "run s (median / max)",
            "recovery s (median / max)",
        ],
        rows,
    )
    lines += ["", "Recovery: from the run's first fault to the request's result (none for faults in the script)."]
    lines += ["", "## Each scenario, seed by seed"]
    for s in scenarios:
        runs = [o for o in outcomes if o.scenario == s.name]
        if not runs:
            continue
        lines += ["", f"### {s.name}", "", s.plan.description or "", ""]
        lines += _table(
            ["seed", "faults fired", "invariants", "write ended", "effects", "recovery s", "replay"],
            [
                [
                    str(o.seed),
                    ", ".join(f"{_fault_label(s, i)} x{n}" for i, n in sorted(o.fired.items()) if n) or "none",
                    "all held" if o.ok else "**broken: " + ", ".join(c.name for c in o.checks if not c.ok) + "**",
                    o.write_state or "-",
                    str(o.effects),
                    "-" if o.recovery_seconds is None else f"{o.recovery_seconds:.1f}",
                    f"`{replay_command(o, replay_source)}`",
                ]
                for o in runs
            ],
        )
    counts = decision_counts(outcomes)
    if counts:
        lines += ["", "## Decisions by rule and by person", ""]
        rows = [[*d.split(": ", 1), str(n)] for d, n in counts.items()]
        lines += _table(["decided by", "decision", "count"], rows)
        refused = [f"- {o.scenario} seed {o.seed}: {r}" for o in outcomes for r in o.refused]
        if refused:
            lines += ["", "Decisions the approval channel refused to sign (never sent to the workflow):", "", *refused]
    cells = Counter(cell for o in outcomes for cell in o.honesty)
    lines += ["", "## What was reported against what the service holds", ""]
    lines += _table(
        ["reported \\ service", *ACTUAL],
        [[said, *(str(cells[(said, actual)]) for actual in ACTUAL)] for said in REPORTED],
    )
    if charts:
        lines += ["", "## Charts", ""]
        lines += [f"![{name.removesuffix('.png')}]({name})" for name in charts]
    elif chart_note:
        lines += ["", f"({chart_note})"]
    lines += ["", "## The fault catalog (docs/FAULTS.md)", ""]
    lines += _table(["id", "covered by", "why not a scenario, or what is missing"], catalog_rows(scenarios))
    return "\n".join(lines) + "\n"


NOTHING_BROKE = "Nothing: every invariant held in every run, and every fault a scenario needs fired."
NOT_ON_LOG = (
    "Not checked in this run: read-back evidence, keys per payload and the status before a resend are judged on "
    "the bundled service's own request log, which another service does not give the runner."
)
# The headline figures that must be 0 (the others count what ran).
BAD = frozenset(
    {
        "duplicate effects",
        "lost acknowledged writes",
        "unapproved effects",
        "false done",
        "false not-done",
        "resends with a new key",
        "blind resends",
        "verified without read-back",
        "pairing breaks",
        "calls from partial arguments",
        "overlapping messages",
        "messages out of order",
        "writes shown done, not verified",
        "done writes redone",
        "histories not replaying",
        "stuck requests",
        "runs not judged",
        "effects a rule denied",
        "decisions by someone who may not decide",
    }
)


def checked_on_service_log(outcomes: Sequence[RunOutcome]) -> bool:
    return any(c.name == "status asked before every resend" for o in outcomes for c in o.checks)


def what_broke(outcomes: Sequence[RunOutcome], problems: Sequence[str], replay_source: str = "") -> list[str]:
    """One Markdown bullet per broken figure of the headline, per problem and per broken run (with the
    command that runs it again); empty when nothing broke."""
    figures = headline(outcomes)
    lines = [f"- **{name}: {figures[name]}**" for name in figures if name in BAD and figures[name]]
    lines += [f"- {p}" for p in problems]
    for o in outcomes:
        if not o.ok:
            why = "; ".join(f"{c.name}: {c.detail}" for c in o.checks if not c.ok)
            lines.append(
                f"- {o.scenario} seed {o.seed} ({o.workflow_id}): {why}. Replay: `{replay_command(o, replay_source)}`"
            )
    return lines
