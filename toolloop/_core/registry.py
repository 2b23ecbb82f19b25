"""Pure: the tool plug-in API - a tool is a name, its arguments (a pydantic model or a JSON schema), an
effect class and an executor; a side-effecting one also has a status query and a read-back. The strict JSON
schema the model sees and the checks that refuse what strict mode cannot honour live in
toolloop._core.arguments."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import to_jsonable_python

from toolloop._core.arguments import (  # noqa: F401  (re-exported: the canonical types and schema helpers)
    ArgumentSchema,
    ArgumentsRejected,
    Instant,
    PlainText,
    argument_schema,
    sorted_unique,
    strict_json_schema,
    strict_schema_problems,
)
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import Actor, PolicyFact
from toolloop._core.redaction import secret_name

if TYPE_CHECKING:
    import httpx

Effect = Literal["read_only", "side_effecting"]

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolContext:
    """What an executor may use: the session's actor (never the model's word), its source's HTTP client and
    the headers that carry the actor to that source. For a side-effecting call also its operation id (the
    idempotency key) and approval token."""

    actor: Actor
    http: httpx.AsyncClient
    workflow_id: str
    call_id: str
    operation_id: str | None = None
    approval_token: str | None = None
    # The actor as the tool's source expects it (HttpSource.actor_headers); send them with every request.
    headers: Mapping[str, str] = field(default_factory=dict)
    # A side-effecting call's approval digest (what the token is bound to), for a write that takes effect in
    # this process and so checks the token itself (toolloop.verify_approval).
    approval_digest: str | None = None


class ToolError(Exception):
    """A definite answer from the tool (not found, conflict, ...): returned to the model, not retried."""

    def __init__(self, code: ResultCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ToolTemporaryError(Exception):
    """The tool could not answer now (connection refused, 503, 429): the activity retries it."""

    def __init__(self, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class WriteNotSent(Exception):
    """A write that certainly did not reach the service (connection refused before a byte was sent):
    safe to send again with the same key, and "not done" if it never gets through."""

    def __init__(self, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class WriteOutcomeUnknown(Exception):
    """A write that may or may not have taken effect (timeout, reset, lost or cut reply, 5xx, and also a
    429 or any other "busy" answer: the service may have committed before answering it): the caller must
    ask the operation's status before anything else. `retry_after_seconds` is the pause the service asked
    for before a resend, should the status say the operation is not there."""

    def __init__(self, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class ResultRejected(Exception):
    """An executor's answer is not its declared result (the tool's bug: INTERNAL, never shown in detail)."""


class WriteInProgress(Exception):
    """The service is still working on this operation id (another attempt holds it)."""


class OperationStatus(BaseModel):
    """The service's word on an operation id: finished (with its stored outcome), running, or unknown to it."""

    state: Literal["completed", "in_progress", "not_found"]
    # For completed: the stored outcome, as the executor would have returned it (ok or a definite error).
    output: dict[str, Any] | None = None
    # How long the service keeps an operation id (as it declares; else the worker's configuration fills it
    # in). A resend later than this after the first send could make a second effect, so it fails closed.
    retention_seconds: float | None = None


class Evidence(BaseModel):
    """What a read-back found: `verified` only when the final state matches what was approved."""

    verified: bool
    detail: str
    checks: dict[str, Any] = Field(default_factory=dict)


class EvidenceNotYetVisible(Exception):
    """The read-back does not see the effect yet (stale read): worth reading again, never re-writing."""


# An executor answers with its result model, a mapping of the result's fields, or a finished tool output
# (ok_output / error_output).
Executor = Callable[[ToolContext, Any], Awaitable[Mapping[str, Any] | BaseModel]]
# Side-effecting tools: status of an operation id, and the read-back of a completed one.
StatusQuery = Callable[[ToolContext, str], Awaitable[OperationStatus]]
ReadBack = Callable[[ToolContext, Any, Mapping[str, Any]], Awaitable[Evidence]]


@runtime_checkable
class ToolSource(Protocol):
    """Where a tool's I/O goes: its own HTTP client (base URL, auth, timeouts), opened with the worker."""

    name: str

    @property
    def http(self) -> httpx.AsyncClient: ...


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    # A pydantic model (tools declared in Python) or a plain JSON schema (an MCP server's tools).
    arguments: type[BaseModel] | ArgumentSchema
    effect: Effect
    execute: Executor
    # A short label for the Temporal UI and progress display, e.g. "get_order A100".
    summarize: Callable[[Any], str] | None = None
    # Side-effecting tools (DESIGN.md, "the write protocol"): how to ask the status of an operation id, and
    # how to read a completed one back. Both are required unless declared absent on purpose below.
    status: StatusQuery | None = None
    read_back: ReadBack | None = None
    # Argument names whose values are replaced by "***" in ledgers, logs and the UI.
    redact: tuple[str, ...] = ()
    # Added with the public tool API (all optional):
    # the result model an executor's answer is checked against (and dumped with); None: any JSON object.
    result: type[BaseModel] | None = None
    # Per-tool timeout of one attempt and number of attempts (reads; a write's timeout per attempt).
    timeout_seconds: float | None = None
    max_attempts: int | None = None
    # What a write's approval digest is bound to besides the payload: by default the tool's name; an HTTP
    # write contract binds its method and path ("POST /tickets/T1001/notes"), as the service sees them.
    target: Callable[[Any], str] | None = None
    # The canonical form of the arguments (the digest and the operation id are computed over it); by
    # default the validated arguments as they are. Returns arguments of the same kind.
    canonical: Callable[[Any], Any] | None = None
    # The tool's source: its HTTP client. None: the worker's shared client.
    source: ToolSource | None = None
    # A write that has, on purpose, no status query (an unclear outcome then stays unknown and is never
    # resent) or no read-back (a completed write then stays unverified). MCP tools are such writes.
    without_status: bool = False
    without_read_back: bool = False
    # The audience of this write's approval tokens (the service or tool source they are for, which accepts
    # only its own); None: the source's audience (its `audience`, else its name), or the tool's own name.
    audience: str | None = None
    # Identical calls of this write are distinct operations ("pay Bob 10 EUR", twice): each proposal gets an
    # operation id of its own (keyed by its occurrence in the request), and so its own approval and effect.
    # False (the default): the same payload proposed again is the same operation, done at most once.
    each_call_distinct: bool = False
    # What an approval policy decides this write on besides its arguments: facts from the request's earlier
    # reads (toolloop._core.facts).
    policy_facts: tuple[PolicyFact, ...] = ()

    @property
    def read_only(self) -> bool:
        return self.effect == "read_only"

    @property
    def approval_audience(self) -> str:
        if self.audience:
            return self.audience
        if self.source is not None:
            return getattr(self.source, "audience", None) or self.source.name
        return self.name

    @functools.cached_property
    def schema(self) -> ArgumentSchema:
        return argument_schema(self.arguments)

    @functools.cached_property
    def unshown_arguments(self) -> frozenset[str]:
        """What a call's summary leaves out (the Temporal UI, the progress and the live views show it): the
        arguments the tool redacts, and any whose name says a secret."""
        named = self.schema.parameters().get("properties", {})
        return frozenset(self.redact) | {name for name in named if secret_name(name)}

    def summary(self, args: Any) -> str:
        if self.summarize is not None:
            text = self.summarize(args)
        else:
            # The canonical arguments' plain values: no nested object, nothing redacted or secret.
            values = [
                str(value)
                for name, value in self.schema.dump(args).items()
                if value is not None and not isinstance(value, dict | list) and name not in self.unshown_arguments
            ]
            text = " ".join([self.name, *values])
        return text[:120]

    def canonical_arguments(self, args: Any) -> dict[str, Any]:
        """The validated arguments as JSON under the names the model sees (its aliases): what is approved,
        digested, sent, and validated again by the activity. The argument model declares the canonical
        form through its types (Instant, PlainText, sorted_unique), so two spellings of one intended
        call give one dict; `canonical` may normalise further."""
        if self.canonical is None:
            return self.schema.dump(args)
        dumped = self.schema.dump(self.canonical(args))
        # The canonical form must survive the activity's second validation unchanged, or the executor would
        # run something other than what was approved.
        if self.schema.dump(self.canonical(self.schema.load(dumped))) != dumped:
            raise ArgumentsRejected("the tool's canonical form does not validate back to itself")
        return dumped

    def output_of(self, data: Any) -> dict[str, Any]:
        """The tool output for what the executor answered; ResultRejected when it is not the declared result."""
        if isinstance(data, BaseModel):
            if self.result is not None and not isinstance(data, self.result):
                raise ResultRejected(f"answered a {type(data).__name__}, not a {self.result.__name__}")
            return {"ok": True, **data.model_dump(mode="json", by_alias=True)}
        if isinstance(data, list | tuple | str | int | float | bool) or data is None:
            # A plain value (a list of rows, a count, a text): the model is given it as the output's result.
            return {"ok": True, "result": to_jsonable_python(data)}
        if not isinstance(data, Mapping):
            raise ResultRejected(f"answered a {type(data).__name__}, not a result object")
        if "ok" in data:
            return dict(data)  # already a tool output
        if self.result is None:
            return {"ok": True, **data}
        try:
            checked = self.result.model_validate(dict(data))
        except ValidationError:
            raise ResultRejected(f"answered fields that do not make a {self.result.__name__}") from None
        return {"ok": True, **checked.model_dump(mode="json", by_alias=True)}

    def digest_target(self, args: Any) -> str | None:
        return None if self.target is None else self.target(args)

    def definition(self) -> dict[str, Any]:
        """The Responses API `tools` entry, strict mode."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.schema.parameters(),
            "strict": True,
        }


@dataclass
class ToolRegistry:
    _tools: dict[str, ToolSpec] = field(default_factory=dict)
    # Built once at registration: exactly what is checked is what the model is sent.
    _definitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    _definitions_json: str | None = None

    def register(self, spec: ToolSpec) -> None:
        problems = registration_problems(spec)
        if spec.name in self._tools:
            problems.insert(0, "it is registered twice")
        if problems:
            raise ValueError(f"tool {spec.name!r}: {'; '.join(problems)}")
        self._tools[spec.name] = spec
        self._definitions[spec.name] = spec.definition()
        self._definitions_json = None

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def definitions(self, only: Collection[str] | None = None) -> list[dict[str, Any]]:
        """A fresh copy for each model call (an adapter may change it): decoded from JSON kept since the
        last registration, several times cheaper than a deep copy on every turn. `only`: just these tools."""
        if self._definitions_json is None:
            self._definitions_json = json.dumps(list(self._definitions.values()))
        copied: list[dict[str, Any]] = json.loads(self._definitions_json)
        if only is not None:
            wanted = set(only)
            copied = [d for d in copied if d.get("name") in wanted]
        return copied


def registration_problems(spec: ToolSpec) -> list[str]:
    """Every reason `register` refuses `spec`, in words a tool author can act on."""
    if not TOOL_NAME.match(spec.name):
        return [f"the name must match {TOOL_NAME.pattern}"]
    problems: list[str] = []
    if not spec.description.strip():
        problems.append("it needs a description (the model reads it to decide when to call the tool)")
    if spec.effect not in ("read_only", "side_effecting"):
        problems.append("its effect must be read_only or side_effecting")
    if spec.effect == "side_effecting":
        if spec.status is None and not spec.without_status:
            problems.append("a side-effecting tool needs a status query and a read-back (no status query given)")
        if spec.read_back is None and not spec.without_read_back:
            problems.append("a side-effecting tool needs a status query and a read-back (no read-back given)")
    elif spec.status is not None or spec.read_back is not None or spec.target is not None:
        problems.append("a read-only tool takes no status query, read-back or digest target")
    if spec.timeout_seconds is not None and not 0 < spec.timeout_seconds <= 600:
        problems.append("timeout_seconds must be more than 0 and at most 600")
    if spec.max_attempts is not None and not 1 <= spec.max_attempts <= 20:
        problems.append("max_attempts must be between 1 and 20")
    if spec.result is not None and not (isinstance(spec.result, type) and issubclass(spec.result, BaseModel)):
        problems.append("its result must be a pydantic model")
    definition = spec.definition()
    strict = spec.schema.problems(definition["parameters"])
    if strict:
        problems.append(f"breaks strict-mode rules: {'; '.join(strict)}")
    return problems
