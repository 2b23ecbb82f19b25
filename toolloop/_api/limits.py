"""Pure (plus the API's settings model, read by the entry point): what one caller may hold and do on the HTTP
API - concurrent event streams (per caller and in all), how fast it creates requests, how many of its requests
run at once, the longest deadline and approval wait it may ask for - the tools and the models the workers serve,
and which of those models each caller may use.

Every limit is keyed by the actor of the bearer token, never by anything the request says. The stream slots
and the creation rate are counted in this process (each API replica counts its own); active requests are
counted by Temporal's visibility, so they hold across replicas.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections import Counter
from typing import Annotated, Any

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from toolloop._core.contracts import MODEL_NAME, Actor, Limits, ModelSpec
from toolloop._core.named_models import NamedModels, check_model_names, named_model_refusal, read_named_models
from toolloop._core.registry import TOOL_NAME

# A day is the most a request's own limits allow (toolloop.Limits); the API's caps may only lower it.
_A_DAY = 86_400.0
_MODEL = re.compile(MODEL_NAME)


def _names(value: object, pattern: re.Pattern[str], what: str) -> object:
    """A comma-separated list of names (or a list) as a set, each matching `pattern`; empty: None (unset)."""
    if isinstance(value, str):
        value = [name.strip() for name in value.split(",") if name.strip()]
    if isinstance(value, list | tuple | set | frozenset):
        bad = sorted(str(name) for name in value if not pattern.fullmatch(str(name)))
        if bad:
            raise ValueError(f"{what} names must match {pattern.pattern}: {', '.join(bad)}")
        return frozenset(value) or None
    return value


class ApiLimits(BaseSettings):
    """The API's limits per caller, from TOOLLOOP_API_* variables (docs/API.md lists them)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True, env_ignore_empty=True)

    # Event streams held at once: a stream is a history long poll for up to an hour. The web page opens at
    # most 3 per tab.
    max_streams_per_caller: int = Field(default=10, ge=1, validation_alias="TOOLLOOP_API_MAX_STREAMS_PER_CALLER")
    max_streams: int = Field(default=500, ge=1, validation_alias="TOOLLOOP_API_MAX_STREAMS")
    # New requests per caller, as the `limits` library writes a rate: "30/minute", "500/hour", "5/second".
    create_rate: str = Field(default="30/minute", validation_alias="TOOLLOOP_API_CREATE_RATE")
    # A caller's requests running at once (started by the API or elsewhere).
    max_active_requests: int = Field(default=20, ge=1, validation_alias="TOOLLOOP_API_MAX_ACTIVE_REQUESTS")
    # The running requests GET /v1/approvals reads (the newest first); past it the answer says it is incomplete.
    approvals_scan: int = Field(default=50, ge=1, le=1000, validation_alias="TOOLLOOP_API_APPROVALS_SCAN")
    # A caller's open threads (a thread's workflow runs until the thread is closed and its messages have run).
    max_open_threads: int = Field(default=100, ge=1, validation_alias="TOOLLOOP_API_MAX_OPEN_THREADS")
    # How long a decision, a message or a close waits for a worker to confirm it (none may be running: a deploy)
    # before the answer is 503 UNCONFIRMED: Temporal holds it, so it may still be applied.
    change_wait_seconds: float = Field(default=30.0, gt=0, le=600, validation_alias="TOOLLOOP_API_CHANGE_WAIT_SECONDS")
    # The longest deadline and approval wait a request may ask for in its "limits".
    max_deadline_seconds: float = Field(
        default=3600.0, gt=0, le=_A_DAY, validation_alias="TOOLLOOP_API_MAX_DEADLINE_SECONDS"
    )
    max_approval_ttl_seconds: float = Field(
        default=3600.0, gt=0, le=_A_DAY, validation_alias="TOOLLOOP_API_MAX_APPROVAL_TTL_SECONDS"
    )
    # The names of the tools the worker serves, comma-separated: a request's "tools" naming another is refused.
    # The API cannot ask the worker; unset, the names are not checked (the workflow offers only tools it has).
    tools: Annotated[frozenset[str] | None, NoDecode] = Field(default=None, validation_alias="TOOLLOOP_API_TOOLS")
    # The models the worker serves (the names a request's "model" starts with: offline, openai, ...),
    # comma-separated: a request naming another is refused before anything starts. Unset: not checked (a
    # worker refuses a model it does not have, or a scripted one it is not configured for, as a failed run).
    models: Annotated[frozenset[str] | None, NoDecode] = Field(default=None, validation_alias="TOOLLOOP_API_MODELS")
    # The workers' named models (TOOLLOOP_MODELS, the same value the workers read; docs/MODELS.md): they are
    # among the models above without being listed there, and each takes no ":MODEL". The API reads only
    # their names and settings, never a key (the table holds none).
    named_models: Annotated[NamedModels, NoDecode] = Field(default_factory=dict, validation_alias="TOOLLOOP_MODELS")

    @field_validator("create_rate")
    @classmethod
    def _a_rate(cls, value: str) -> str:
        try:
            parse(value)
        except ValueError:
            raise ValueError('a rate such as "30/minute", "500/hour" or "5/second"') from None
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_names(cls, value: object) -> object:
        return _names(value, TOOL_NAME, "tool")

    @field_validator("models", mode="before")
    @classmethod
    def _model_names(cls, value: object) -> object:
        return _names(value, _MODEL, "model")

    @field_validator("named_models", mode="before")
    @classmethod
    def _a_model_table(cls, value: object) -> object:
        return read_named_models(value)

    @field_validator("named_models")
    @classmethod
    def _free_names(cls, value: NamedModels) -> NamedModels:
        check_model_names(value)
        return value

    def limits_problem(self, deadline_seconds: float | None, approval_ttl_seconds: float | None) -> str | None:
        """Why a request's own limits ask for more than the API allows, or None."""
        if deadline_seconds is not None and deadline_seconds > self.max_deadline_seconds:
            return f"limits.deadline_seconds: at most {self.max_deadline_seconds:g}"
        if approval_ttl_seconds is not None and approval_ttl_seconds > self.max_approval_ttl_seconds:
            return f"limits.approval_ttl_seconds: at most {self.max_approval_ttl_seconds:g}"
        return None

    def request_limits(self, given: dict[str, Any]) -> Limits:
        """A request's limits: what it gave (checked by `limits_problem` first), and for what it left out
        toolloop's defaults, lowered to the API's caps where they are above them."""
        defaults = Limits()
        capped = {
            "deadline_seconds": min(defaults.deadline_seconds, self.max_deadline_seconds),
            "approval_ttl_seconds": min(defaults.approval_ttl_seconds, self.max_approval_ttl_seconds),
        }
        return Limits(**{**capped, **given})

    @property
    def known_models(self) -> frozenset[str] | None:
        """The models the workers serve, as far as the API is told: TOOLLOOP_API_MODELS and the named models;
        None when TOOLLOOP_API_MODELS is unset (then a model is not checked against the workers' list)."""
        if self.models is None:
            return None
        return self.models | frozenset(self.named_models)

    def unknown_model(self, provider: str) -> bool:
        """Whether the worker does not serve this model (never, when the API is not told its models)."""
        known = self.known_models
        return known is not None and provider not in known

    def usable_models(self, granted: frozenset[str] | None) -> frozenset[str] | None:
        """The models a caller may use: its token's list ("models"), or without one every model the API knows;
        None when neither says (any model the workers serve)."""
        return granted if granted is not None else self.known_models

    def model_refusal(
        self, spec: ModelSpec, granted: frozenset[str] | None, *, defaulted: bool = False
    ) -> tuple[str, list[str] | None] | None:
        """Why a caller whose token grants `granted` may not start a request on `spec` (`defaulted`: the API's
        default, the request named none), with the models it may use; or None.

        A model the caller may not use gets the same words as one that does not exist, listing only the
        caller's models: the answer says nothing of what other callers may use."""
        usable = self.usable_models(granted)
        listed = sorted(usable) if usable is not None else None
        if usable is not None and spec.provider not in usable:
            yours = ", ".join(listed or []) or "none"
            if defaulted:
                return f"model: this API's default model is not one you may use; name one: you may use {yours}", listed
            return f"model: the worker has no model {spec.provider!r} you may use; you may use {yours}", listed
        why = named_model_refusal(spec, self.named_models)
        if why is not None:
            return f"model: {why}", listed
        return None

    def unknown_tools(self, names: list[str] | None) -> list[str]:
        """The names in a request's "tools" that the worker does not serve (none when the API is not told)."""
        if names is None or self.tools is None:
            return []
        return sorted({name for name in names if name not in self.tools})


class StreamSlots:
    """The event streams held now, per caller and in all. `take` before a stream starts, `give_back` exactly once
    when it ends however it ends (finished, the client went away, an error)."""

    def __init__(self, per_caller: int, total: int) -> None:
        self.per_caller = per_caller
        self.total = total
        self._held: Counter[Actor] = Counter()

    def held(self, actor: Actor | None = None) -> int:
        return self._held[actor] if actor is not None else self._held.total()

    def take(self, actor: Actor) -> str | None:
        """Takes a slot for the actor; or says why not (and takes nothing)."""
        if self._held[actor] >= self.per_caller:
            return f"you hold {self._held[actor]} event streams, the most one caller may; close one first"
        if self._held.total() >= self.total:
            return f"the API holds its most event streams ({self.total}); try again later"
        self._held[actor] += 1
        return None

    def give_back(self, actor: Actor) -> None:
        self._held[actor] -= 1
        if self._held[actor] <= 0:
            del self._held[actor]


class CreationRate:
    """How fast each caller may create requests: a moving window (the `limits` library, in memory)."""

    def __init__(self, rate: str) -> None:
        self.item: RateLimitItem = parse(rate)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def take(self, actor: Actor) -> int | None:
        """Counts one creation for the actor; None if it is within the rate, else the seconds to wait (at least 1)
        before the next one would be."""
        if self._limiter.hit(self.item, actor.tenant_id, actor.user_id):
            return None
        stats = self._limiter.get_window_stats(self.item, actor.tenant_id, actor.user_id)
        return max(1, math.ceil(stats.reset_time - time.time()))


def limits_from_environment() -> ApiLimits:
    """The API's limits from its environment; a bad value ends the process with one line and exit 2 (this runs
    only where the entry point builds the API's configuration)."""
    try:
        return ApiLimits()
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        name = str(first["loc"][0]) if first["loc"] else "TOOLLOOP_API_*"
        print(f"error: {name}: {first['msg']}", file=sys.stderr)
        raise SystemExit(2) from None
