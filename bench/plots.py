"""I/O: the benchmark's plots, as PNG files drawn with matplotlib's Agg backend (no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from bench.report import FLOOR, OURS, PLAIN, READS, SCENARIO_LABELS, STACK_LABELS, STACKS, WRITE, Results

COLORS = {OURS: "#1f77b4", FLOOR: "#ff7f0e", PLAIN: "#2ca02c"}


def draw_all(results: Results, out: Path) -> list[str]:
    """Every plot the results have data for; returns the file names written (relative to `out`)."""
    written = []
    for name, draw in (
        ("growth.png", _growth),
        ("latency.png", _latency),
        ("parallel_reads.png", _parallel),
        ("scale.png", _scale),
    ):
        fig = draw(results)
        if fig is None:
            continue
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(name)
    return written


def _growth(results: Results) -> Figure | None:
    points = results.growth
    if not points:
        return None
    rounds = [p.rounds for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(rounds, [p.content_bytes / 1024 for p in points], "k--", marker="o", label="content produced")
    for stack in (OURS, FLOOR):
        left.plot(
            rounds,
            [p.history_bytes[stack] / 1024 for p in points],
            marker="o",
            color=COLORS[stack],
            label=f"{STACK_LABELS[stack]} history",
        )
        right.plot(
            rounds,
            [p.ratio_to_content[stack] for p in points],
            marker="o",
            color=COLORS[stack],
            label=STACK_LABELS[stack],
        )
    right.axhline(1.2, color="red", linestyle=":", label="target ≤ 1.2x")
    left.set(xlabel="rounds (one 50 KB tool output each)", ylabel="KiB per request", title="History against content")
    right.set(xlabel="rounds", ylabel="history / content", title="Ratio to the content produced", ylim=(0, None))
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def _latency(results: Results) -> Figure | None:
    if not results.stacks:
        return None
    scenarios = [s for s in (WRITE, READS) if s in results.stacks]
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5.5 * len(scenarios), 4.2), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        runs = results.stacks[scenario]
        names = [s for s in STACKS if s in runs and runs[s].latency is not None]
        x = range(len(names))
        medians = [runs[s].latency.median_ms for s in names]  # type: ignore[union-attr]
        p95s = [runs[s].latency.p95_ms for s in names]  # type: ignore[union-attr]
        colors = [COLORS[s] for s in names]
        ax.bar([i - 0.2 for i in x], medians, 0.4, color=colors)
        ax.bar([i + 0.2 for i in x], p95s, 0.4, color=colors, alpha=0.45)
        for i, (median, p95) in enumerate(zip(medians, p95s, strict=True)):
            ax.annotate(f"{median:.0f}", (i - 0.2, median), ha="center", va="bottom", fontsize=8)
            ax.annotate(f"{p95:.0f}", (i + 0.2, p95), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), [STACK_LABELS[s] for s in names])
        ax.set(ylabel="ms", title=SCENARIO_LABELS[scenario].split(" (")[0] + ": latency (median, p95)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(handles=[Patch(color="gray", label="median"), Patch(color="gray", alpha=0.45, label="p95")])
    return fig


def _parallel(results: Results) -> Figure | None:
    points = results.parallel
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    reads = [p.reads for p in points]
    for stack in STACKS:
        values = [(p.reads, lat.median_ms) for p in points if (lat := p.latency.get(stack)) is not None]
        if values:
            ax.plot(
                [v[0] for v in values],
                [v[1] for v in values],
                marker="o",
                color=COLORS[stack],
                label=STACK_LABELS[stack],
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(reads, [str(r) for r in reads])
    ax.set(xlabel="reads in one round", ylabel="median latency ms", title="Parallel reads", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _scale(results: Results) -> Figure | None:
    runs = [r for r in results.scale if r.timeline]
    if not runs:
        return None
    largest = max(r.requests for r in runs)
    shown = [r for r in runs if r.requests == largest]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for run in shown:
        t = [p[0] for p in run.timeline]
        top.plot(t, [p[1] for p in run.timeline], color=COLORS[run.stack], label=STACK_LABELS[run.stack])
        bottom.plot(t, [p[2] for p in run.timeline], color=COLORS[run.stack], label=STACK_LABELS[run.stack])
    top.set(ylabel="open requests", title=f"{largest:,} requests started at once")
    bottom.set(xlabel="seconds since the first start", ylabel="worker RSS MiB")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    return fig
