"""Pure: the fault plan - which faults to inject at which boundary, and when each one fires.

A plan is a YAML or JSON file a user writes (or a built-in scenario's). Every fault names its boundary, what
it does there, the calls it applies to, and when it fires: on the Nth matching call (and the `times` after
it), or on each matching call with a probability drawn from the run's seed. The same plan and seed fire the
same faults: a decision is a hash of (seed, fault, call number), never a process-wide random state.

    name: lost-reply
    faults:
      - boundary: service
        fault: commit_then_drop
        match: {method: POST, path: "^/orders/[^/]+/refunds$"}
        when: {nth: 1}
      - boundary: wire
        fault: latency
        latency_ms: 300
        match: {method: GET}
        when: {probability: 0.5}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from demo.bizservice.firing import fires

# What each boundary can do. Service faults act inside the business service (before or after its commit);
# wire faults on the socket between the tools and the service (the fault proxy); model faults in the
# model's answers; process faults with real signals on real PIDs.
ServiceFault = Literal[
    "unavailable_before_commit",  # 503 before anything is claimed or committed
    "commit_then_drop",  # committed, then the connection closes without a reply
    "commit_then_500",  # committed, then a 500 in place of the reply
    "commit_then_cut_reply",  # committed, then the reply stops mid-body
    "commit_then_429",  # committed, then 429 Too Many Requests (with Retry-After) in place of the reply
    "commit_then_503",  # committed, then 503 in place of the reply
    "busy_before_commit",  # 429 (with Retry-After) before anything is claimed or committed
    "stall_after_claim",  # the idempotency key claimed, nothing committed yet, for `latency_ms`
    "status_down",  # the operation-status endpoint answers 503
    "latency",  # `latency_ms` before the call is handled
]
WireFault = Literal["latency", "refused", "reset", "timeout", "cut_reply", "down", "plant", "forge_token"]
ModelFault = Literal[
    "status_429",
    "status_500",
    "timeout",
    "reset",
    "malformed_output",
    "injection",
    # A streamed answer broken in the middle of its first call's arguments (or of its text, without a call):
    "stream_cut",  # the connection drops
    "stream_stall",  # nothing more is sent (the model turn's timeout ends the attempt)
    "stream_garbage",  # a chunk that is not JSON, then the connection drops
]
# Model faults the scripted model endpoint injects on the HTTP exchange; the others are in the script's turns.
ENDPOINT_FAULTS = frozenset(
    {"status_429", "status_500", "timeout", "reset", "stream_cut", "stream_stall", "stream_garbage"}
)
STREAM_FAULTS = frozenset({"stream_cut", "stream_stall", "stream_garbage"})
ProcessFault = Literal["kill_worker", "kill_service", "restart_temporal"]
# Named points of a request where a process fault strikes (the runner waits for the point, then signals).
ProcessPoint = Literal[
    "during_model_turn",
    "before_write_sent",
    "after_service_commit",  # the service committed the write; the activity has not completed
    "during_approval_wait",
    # A thread scenario's points (faultbed.thread_runs): after a message's request closed, before the next
    # message is sent; and while a message waits in the thread's queue behind one that waits for approval.
    "between_messages",
    "while_message_queued",
]
# The points only a thread scenario reaches.
THREAD_POINTS = frozenset({"between_messages", "while_message_queued"})

_METHOD = r"^(\*|GET|POST|PUT|PATCH|DELETE)$"


class Match(BaseModel):
    """Which calls a fault applies to: an HTTP method and a regular expression searched in the path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field(default="*", pattern=_METHOD, description="GET, POST, ... or * for any")
    path: str = Field(default="", max_length=500, description="searched in the request path; empty: any path")

    @field_validator("path")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc.msg})") from None
        return value

    def matches(self, method: str, path: str) -> bool:
        return self.method in ("*", method) and re.search(self.path, path) is not None


class When(BaseModel):
    """When a fault fires among its matching calls: the Nth one (and the ones after it, `times` in all), or
    each one with `probability` (seeded), at most `times` times if given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nth: int | None = Field(default=None, ge=1, le=10_000, description="the first matching call it fires on")
    times: int | None = Field(
        default=None, ge=1, le=10_000, description="how many times it fires at most; null: once with nth, no cap"
    )
    probability: float | None = Field(default=None, gt=0, le=1, description="each matching call, seeded")

    @model_validator(mode="after")
    def _one_way(self) -> When:
        if (self.nth is None) == (self.probability is None):
            raise ValueError("give exactly one of nth or probability")
        return self

    @property
    def most_times(self) -> int | None:
        """How many times the fault fires at most (None: no cap)."""
        return self.times if self.times is not None or self.nth is None else 1


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    when: When = Field(default_factory=lambda: When(nth=1))
    note: str = Field(default="", max_length=500, description="what this fault is for, shown in the report")


class ServiceFaultSpec(_Fault):
    boundary: Literal["service"]
    fault: ServiceFault
    match: Match = Field(default_factory=Match)
    latency_ms: int = Field(default=0, ge=0, le=120_000)

    @model_validator(mode="after")
    def _needs_latency(self) -> ServiceFaultSpec:
        if self.fault in ("latency", "stall_after_claim") and self.latency_ms == 0:
            raise ValueError(f"{self.fault} needs latency_ms > 0")
        return self


class WireFaultSpec(_Fault):
    boundary: Literal["wire"]
    fault: WireFault
    match: Match = Field(default_factory=Match)
    latency_ms: int = Field(default=0, ge=0, le=120_000, description="latency: the delay; down: how long")
    # plant: the text written into the reply's JSON, at `field` (a dotted path; list items by index).
    text: str = Field(default="", max_length=100_000)
    field: str = Field(default="", max_length=200, pattern=r"^([A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*)?$")

    @model_validator(mode="after")
    def _needs_latency(self) -> WireFaultSpec:
        if self.fault in ("latency", "down") and self.latency_ms == 0:
            raise ValueError(f"{self.fault} needs latency_ms > 0 (the delay, or how long the service is away)")
        if self.fault == "plant" and not (self.text and self.field):
            raise ValueError("plant needs the text to plant and the reply's field to plant it in")
        return self


class ModelFaultSpec(_Fault):
    boundary: Literal["model"]
    fault: ModelFault
    # malformed_output: the text that replaces the call's arguments; injection: the text planted.
    text: str = Field(default="", max_length=10_000)


class ProcessFaultSpec(_Fault):
    boundary: Literal["process"]
    fault: ProcessFault
    at: ProcessPoint

    @model_validator(mode="after")
    def _nth_only(self) -> ProcessFaultSpec:
        if self.when.nth is None:
            raise ValueError("a process fault strikes the Nth time its point is reached: give when.nth")
        return self


FaultSpec = Annotated[
    ServiceFaultSpec | WireFaultSpec | ModelFaultSpec | ProcessFaultSpec, Field(discriminator="boundary")
]


class FaultPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$", description="a short id, used in reports")
    description: str = Field(default="", max_length=2_000)
    seed: int | None = Field(default=None, ge=0, description="the default seed; the runner's --seeds override it")
    faults: list[FaultSpec] = Field(min_length=1, max_length=50)


class PlanError(ValueError):
    """A plan that cannot be used; the message has one line per problem, each naming the field."""


def parse_plan(data: Any, source: str = "plan") -> FaultPlan:
    try:
        return FaultPlan.model_validate(data)
    except ValidationError as exc:
        raise PlanError("\n".join(_problem_lines(exc, source))) from None


def load_plan(path: Path) -> FaultPlan:
    """A plan from a .yaml/.yml or .json file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise PlanError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}{line}") from None
    return parse_plan(data, str(path))


def _problem_lines(exc: ValidationError, source: str) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        # Drop the union's tag from the location (faults.0.service.fault -> faults[0].fault).
        parts: list[str] = []
        for part in error["loc"]:
            if isinstance(part, int):
                parts.append(f"[{part}]")
            elif part in ("service", "wire", "model", "process") and parts and parts[-1].startswith("["):
                continue
            else:
                parts.append(("." if parts else "") + str(part))
        where = "".join(parts) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {where}: {message}")
    return lines


# --- When a fault fires ----------------------------------------------------------------------------------


def fault_fires(when: When, seed: int, fault_index: int, call_number: int, fired_before: int = 0) -> bool:
    """Whether fault number `fault_index` of a plan fires on its `call_number`-th matching call."""
    if when.nth is not None:
        # Every matching call from the Nth on fires until `times` have: they are the calls N .. N+times-1.
        return fires(call_number, skip=when.nth - 1, times=when.most_times, fired_before=call_number - when.nth)
    return fires(
        call_number,
        times=when.most_times,
        fired_before=fired_before,
        probability=when.probability,
        seed=seed,
        label=str(fault_index),
    )


# --- Service faults as the business service's own fault rules ---------------------------------------------

# Where in the service each fault acts, and how (demo.bizservice.faults: `when`, and `status` or `action`).
_SERVICE_RULES: dict[str, dict[str, Any]] = {
    "unavailable_before_commit": {"when": "before_handler", "status": 503},
    "commit_then_drop": {"when": "after_commit", "action": "drop"},
    "commit_then_500": {"when": "after_commit", "status": 500},
    "commit_then_cut_reply": {"when": "after_commit", "action": "truncate"},
    "commit_then_429": {"when": "after_commit", "status": 429},
    "commit_then_503": {"when": "after_commit", "status": 503},
    "busy_before_commit": {"when": "before_handler", "status": 429},
    "stall_after_claim": {"when": "after_claim"},
    "status_down": {"when": "before_handler", "status": 503},
    "latency": {"when": "before_handler"},
}
# A status fault with no match of its own hits the operation-status endpoint (Toolset.http_write's default).
_STATUS_MATCH = Match(method="GET", path=r"^/operations/")


def service_rules(plan: FaultPlan, seed: int) -> list[dict[str, Any]]:
    """The plan's service faults as rules for the service's `PUT /admin/faults`, in the plan's order (the
    first rule that applies to a request wins there). Each seeded rule draws with the run's seed and its
    index in the plan, as `fault_fires` does."""
    rules = []
    for index, fault in enumerate(plan.faults):
        if not isinstance(fault, ServiceFaultSpec):
            continue
        match = _STATUS_MATCH if fault.fault == "status_down" and fault.match == Match() else fault.match
        rule: dict[str, Any] = {
            "method": match.method,
            "path_regex": match.path or "^/",
            **_SERVICE_RULES[fault.fault],
            "latency_ms": fault.latency_ms,
            "times": fault.when.most_times,
        }
        if fault.when.nth is not None:
            rule["skip"] = fault.when.nth - 1
        else:
            rule |= {"probability": fault.when.probability, "seed": seed, "label": str(index)}
        rules.append(rule)
    return rules
