"""The failure-injection test bed: fault plans (faultbed.plan), a seeded fault proxy on the tools' wire, a
scripted model endpoint, process faults on real PIDs, and the chaos runner (`python starter.py chaos`) that
judges each run by the invariants, from the service's records and the workflow histories.

The public face, for breaking your own agent (`starter.py chaos --tools package.module:function`):
ChaosTarget and what it is made of. Everything else is the runner's own."""

from faultbed.invariants import Effect
from faultbed.plan import FaultPlan, PlanError, load_plan
from faultbed.target import ChaosTarget, EffectQuery, ServiceProcess, Workload

__all__ = [
    "ChaosTarget",
    "Effect",
    "EffectQuery",
    "FaultPlan",
    "PlanError",
    "ServiceProcess",
    "Workload",
    "load_plan",
]
