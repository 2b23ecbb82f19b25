"""I/O: the chaos report's charts, PNG files drawn with matplotlib's Agg backend (no display) - recovery
time per fault point, and how the runs' writes ended per fault point.

matplotlib comes with the `chaos` extra (`pip install -e '.[local,chaos]'`); without it the report says
how to get the charts and the tables carry the same figures."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from faultbed.invariants import reported
from faultbed.runner import RunOutcome
from faultbed.scenarios import Scenario

# How a run's write ended, in the order the bars stack.
ENDINGS = ("done", "unknown", "not_done", "no write")
_COLORS = {"done": "#2ca02c", "unknown": "#ff7f0e", "not_done": "#7f7f7f", "no write": "#d62728"}
MISSING = "charts need matplotlib: pip install -e '.[chaos]'"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def ending(outcome: RunOutcome) -> str:
    return "no write" if outcome.write_state is None else reported(outcome.write_state)


def draw_all(scenarios: Sequence[Scenario], outcomes: Sequence[RunOutcome], out: Path) -> list[str]:
    """The charts the outcomes have data for; returns the file names written (relative to `out`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = [s.name for s in scenarios if any(o.scenario == s.name for o in outcomes)]
    if not names:
        return []
    written = []
    height = 1.2 + 0.32 * len(names)

    recovered = {
        n: [o.recovery_seconds for o in outcomes if o.scenario == n and o.recovery_seconds is not None] for n in names
    }
    if any(recovered.values()):
        fig, ax = plt.subplots(figsize=(8, height))
        for row, name in enumerate(names):
            times = recovered[name]
            ax.scatter(times, [row] * len(times), color="#1f77b4", alpha=0.7, zorder=3)
            if times:
                ax.plot([min(times), max(times)], [row, row], color="#1f77b4", alpha=0.4, zorder=2)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("seconds from the first fault to the request's result")
        ax.set_title("Recovery time per fault point (one dot per seed)")
        ax.set_xlim(left=0)
        ax.grid(axis="x", alpha=0.3)
        fig.savefig(out / "recovery.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append("recovery.png")

    counts = {n: Counter(ending(o) for o in outcomes if o.scenario == n) for n in names}
    fig, ax = plt.subplots(figsize=(8, height))
    left = [0] * len(names)
    for kind in ENDINGS:
        widths = [counts[n][kind] for n in names]
        if any(widths):
            ax.barh(range(len(names)), widths, left=left, color=_COLORS[kind], label=kind.replace("_", " "))
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("runs (seeds)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("How the write ended, as the request reported it")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(out / "outcomes.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append("outcomes.png")
    return written
