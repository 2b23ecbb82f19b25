"""I/O: fault-injection rules kept in the service's SQLite database, so every process on one file obeys them.

A rule names a request (method, path regex), a point in the request where it fires (`when`), and what
it does there: latency, then optionally a status answered instead of the real one, or (after commit
only) an `action` on the reply. Points:
- `before_handler`: before any endpoint code runs (the middleware);
- `after_claim`: a write holds its idempotency claim but has not committed (the in-flight window);
- `after_commit`: a write's effect and ledger record are committed; the rule acts on the reply
  (stall it, replace it by a status, `drop` it without a byte, or `truncate` it mid-body).
"""

from __future__ import annotations

import re
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from demo.bizservice.firing import fires
from demo.bizservice.store import Store
from demo.bizservice.web import Problem, ServiceCode

FaultPoint = Literal["before_handler", "after_claim", "after_commit"]
FaultAction = Literal["drop", "truncate"]

# Statuses a rule may answer with, and the code the problem body carries.
FAULT_STATUS_CODES: dict[int, ServiceCode] = {
    429: ServiceCode.TOO_MANY_REQUESTS,
    500: ServiceCode.SERVER_ERROR,
    502: ServiceCode.UNAVAILABLE,
    503: ServiceCode.UNAVAILABLE,
    504: ServiceCode.UNAVAILABLE,
}


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field(default="*", pattern=r"^(\*|[A-Z]{3,7})$", description="HTTP method, or * for any")
    path_regex: str = Field(min_length=1, max_length=500, description="re.search against the request path")
    when: FaultPoint = "before_handler"
    latency_ms: int = Field(default=0, ge=0, le=120_000)
    status: int | None = Field(default=None, description="answer with this status instead of the real reply")
    action: FaultAction | None = Field(
        default=None, description="after_commit only: drop the reply (no bytes) or truncate its body"
    )
    times: int | None = Field(default=None, ge=1, description="how many matching requests it applies to; null: all")
    skip: int = Field(default=0, ge=0, le=100_000, description="let this many matching requests pass first")
    probability: float | None = Field(
        default=None, gt=0, le=1, description="fire on each matching request with this probability (seeded)"
    )
    seed: int = Field(default=0, ge=0, description="with probability: the seed of the draws")
    label: str = Field(default="", max_length=100, description="with probability: the rule's name in the draws")

    @field_validator("path_regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc.msg})") from None
        return value

    @field_validator("status")
    @classmethod
    def _known_status(cls, value: int | None) -> int | None:
        if value is not None and value not in FAULT_STATUS_CODES:
            raise ValueError(f"must be one of {sorted(FAULT_STATUS_CODES)} or null")
        return value

    @model_validator(mode="after")
    def _one_outcome(self) -> FaultRule:
        if self.action is not None and self.when != "after_commit":
            raise ValueError("action needs when: after_commit (before it there is no reply to act on)")
        if self.action is not None and self.status is not None:
            raise ValueError("give either status or action, not both")
        return self

    def matches(self, method: str, path: str, when: FaultPoint) -> bool:
        return self.when == when and self.method in ("*", method) and re.search(self.path_regex, path) is not None


class FaultRuleSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[FaultRule] = Field(default_factory=list, max_length=100)


class StoredFaultRule(FaultRule):
    """A rule as listed by the admin API: `remaining` counts down from `times` (null: unlimited);
    `matched` and `fired` count the requests it matched and those it acted on; `first_fired_at` is when
    it first acted (Unix seconds; null: not yet)."""

    remaining: int | None = None
    matched: int = 0
    fired: int = 0
    first_fired_at: float | None = None


def fault_problem(status: int) -> Problem:
    """The answer a rule's `status` gives in place of the real one."""
    headers = {"Retry-After": "1"} if status == 429 else None
    detail = "too many requests; retry later" if status == 429 else "the service is temporarily unavailable"
    if status == 500:
        detail = "the service failed to answer this request"
    return Problem(status, FAULT_STATUS_CODES[status], detail, headers)


def replace_rules(store: Store, rules: list[FaultRule]) -> None:
    with store.transaction() as conn:
        conn.execute("DELETE FROM fault_rules")
        conn.executemany(
            "INSERT INTO fault_rules (position, rule_json, times_left) VALUES (?, ?, ?)",
            [(i, rule.model_dump_json(), rule.times) for i, rule in enumerate(rules)],
        )


def clear_rules(store: Store) -> None:
    with store.connect() as conn:
        conn.execute("DELETE FROM fault_rules")


def list_rules(store: Store) -> list[StoredFaultRule]:
    with store.connect() as conn:
        rows = conn.execute(
            "SELECT rule_json, matched, fired, first_fired_at FROM fault_rules ORDER BY position"
        ).fetchall()
    listed = []
    for row in rows:
        rule = FaultRule.model_validate_json(row["rule_json"])
        remaining = None if rule.times is None else max(rule.times - row["fired"], 0)
        listed.append(
            StoredFaultRule(
                **rule.model_dump(),
                remaining=remaining,
                matched=row["matched"],
                fired=row["fired"],
                first_fired_at=row["first_fired_at"],
            )
        )
    return listed


def claim(store: Store, method: str, path: str, when: FaultPoint = "before_handler") -> FaultRule | None:
    """The first rule that applies to this request at this point, counting the request as matched.

    The common case (no rules) is a single read. Each matching rule numbers the request with one atomic
    UPDATE (so concurrent requests get distinct numbers, in every process on the file); whether it fires
    on that number is `demo.bizservice.firing.fires` - the Nth request and the `times` after it, or a seeded draw -
    and a firing is counted by a conditional UPDATE, so a rule never fires more than `times` times."""
    with store.connect() as conn:
        rows = conn.execute("SELECT id, rule_json FROM fault_rules ORDER BY position").fetchall()
    for row in rows:
        rule = FaultRule.model_validate_json(row["rule_json"])
        if not rule.matches(method, path, when):
            continue
        with store.connect() as conn:
            numbered = conn.execute(
                "UPDATE fault_rules SET matched = matched + 1 WHERE id = ? RETURNING matched, fired", (row["id"],)
            ).fetchone()
        if numbered is None:  # the rules were replaced meanwhile
            continue
        if not fires(
            numbered["matched"],
            skip=rule.skip,
            times=rule.times,
            fired_before=numbered["fired"],
            probability=rule.probability,
            seed=rule.seed,
            label=rule.label,
        ):
            continue
        with store.connect() as conn:
            counted = conn.execute(
                "UPDATE fault_rules SET fired = fired + 1, first_fired_at = coalesce(first_fired_at, ?)"
                " WHERE id = ? AND (? IS NULL OR fired < ?)",
                (time.time(), row["id"], rule.times, rule.times),
            ).rowcount
        if counted == 1:
            return rule
    return None
