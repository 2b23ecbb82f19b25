"""Pure: what the chaos runner breaks - a `ChaosTarget`: the tools a worker runs, the service they talk to
(which the runner starts, puts its fault proxy in front of, and kills for process faults), the scripted
request each run drives, and the oracle that reads the service's own records of what the run's writes did.

The bundled demo is one target (faultbed.scenarios.DEMO); a user points `starter.py chaos --tools
package.module:function` at a function that returns their own:

    def target() -> ChaosTarget:
        return ChaosTarget(
            tools="my_agent.tools:build",           # what `worker.py --tools` runs
            service=ServiceProcess(
                command=lambda port, data: ["python", "-m", "my_service", "--port", str(port), "--dir", str(data)],
                verify_key_env="MY_SERVICE_APPROVAL_VERIFY_KEY",
            ),
            service_url_env="MY_SERVICE_URL",       # where the tools read the service's base URL
            workload=my_workload,                   # tag -> Workload (turns + which writes the user wants)
            effects=my_effects,                     # EffectQuery -> the service's records of the run's writes
        )

Only the bundled service takes service faults (its fault rules) and holds a reply after its commit; with
another service a plan uses wire, model and process faults."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from faultbed.invariants import Effect
from toolloop._core.contracts import Actor
from toolloop._temporal.worker_factory import ToolsLoadError, call_named_function


@dataclass(frozen=True)
class ServiceProcess:
    """How the runner starts the target's service: `command(port, data_dir)` is its argv (the runner picks a
    free loopback port and a directory of its own); the service reads the approval channel's public key
    from `verify_key_env`, and answers GET `health_path` once it serves."""

    command: Callable[[int, Path], list[str]]
    verify_key_env: str
    health_path: str = "/healthz"
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """One run's scripted request: the model's turns (toolloop.testing.call and say), which proposed writes
    the run's user approves (every other one is rejected), and optionally a write the model can be talked
    into by planted text (a plan's `injection` model fault adds it)."""

    turns: list[list[dict[str, Any]]]
    wanted: Callable[[str, dict[str, Any]], bool]
    # The planted text -> the call the model makes of it.
    injected: Callable[[str], dict[str, Any]] | None = None


@dataclass(frozen=True)
class EffectQuery:
    """What the effects oracle gets to find a run's effects in the service's own records."""

    tag: str  # unique to the run; a workload puts it in its write's payload
    operation_ids: Sequence[str]  # the run's operations, from its ledger
    data_dir: Path  # the service's directory (the runner gave it to `command`)
    service_url: str  # the service itself, not the proxy
    admin: httpx.AsyncClient | None = None  # the bundled service's admin API


@dataclass(frozen=True)
class ChaosTarget:
    tools: str  # package.module:function, as `worker.py --tools` takes it
    workload: Callable[[str], Workload]
    # Every effect the service holds for the run's writes, whatever key they came with.
    effects: Callable[[EffectQuery], Awaitable[list[Effect]]]
    service: ServiceProcess | None  # None: the bundled business service
    service_url_env: str = "TOOLLOOP_SERVICE_URL"
    actor: Actor = field(default_factory=lambda: Actor(user_id="u1", tenant_id="acme"))

    @property
    def bundled(self) -> bool:
        """The bundled business service: it takes service faults and holds replies after its commit."""
        return self.service is None


class TargetError(ValueError):
    """`--tools` names nothing usable: one line for the user."""


def load_target(spec: str) -> ChaosTarget:
    """Import `package.module:function` and call it for the target (as `worker.py --tools` does)."""
    try:
        target = call_named_function(spec)
    except ToolsLoadError as exc:
        raise TargetError(str(exc)) from None
    name = spec.partition(":")[2]
    if not isinstance(target, ChaosTarget):
        raise TargetError(
            f"--tools {spec!r}: {name}() returned {type(target).__name__}, not a faultbed.ChaosTarget "
            "(for the worker alone, use worker.py --tools)"
        )
    return target
