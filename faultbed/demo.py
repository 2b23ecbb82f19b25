"""I/O: the bundled demo as a chaos target - the demo's tools, the bundled business service (which takes
service faults), the built-in workload (faultbed.scenarios.workload), and its effects read from the
service's own tables through its admin API."""

from __future__ import annotations

from typing import Any

from devstack.processes import DEMO_TOOLS
from faultbed.invariants import Effect
from faultbed.scenarios import intended_title, refund_talked_into, workload
from faultbed.target import ChaosTarget, EffectQuery, Workload


def demo_workload(tag: str) -> Workload:
    title = intended_title(tag)

    def wanted(tool: str, arguments: dict[str, Any]) -> bool:
        return arguments.get("title") == title

    return Workload(turns=workload(tag), wanted=wanted, injected=refund_talked_into)


async def demo_effects(query: EffectQuery) -> list[Effect]:
    """The run's effects: its intended write's (whatever key it came with) and any of its operations'."""
    assert query.admin is not None  # the bundled service
    rows = (await query.admin.get("/admin/effects")).json()["effects"]
    ledger = set(query.operation_ids)
    return [
        Effect(str(r["operation_id"]), str(r["actor_user"]), str(r["actor_tenant"]), read_at=_read_at(r))
        for r in rows
        if r.get("title") == intended_title(query.tag) or r.get("operation_id") in ledger
    ]


def _read_at(row: dict[str, Any]) -> str | None:
    """Where the service shows an effect: the path the demo tool's read-back GETs for it."""
    if row["kind"] == "event":
        return f"/calendars/{row['calendar_id']}/events/{row['id']}"
    if row["kind"] == "refund":
        return f"/orders/{row['order_id']}/refunds"
    if row["kind"] == "note":
        return f"/tickets/{row['ticket_id']}"
    return None


DEMO = ChaosTarget(tools=DEMO_TOOLS, workload=demo_workload, effects=demo_effects, service=None)
