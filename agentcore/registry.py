"""Pure: the tool plug-in API (a tool is a name, an argument model, an effect class and an executor)
and the strict JSON schema the model sees, generated from the argument model."""

from __future__ import annotations

import copy
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from agentcore.codes import ResultCode
from agentcore.contracts import Actor

if TYPE_CHECKING:
    import httpx

Effect = Literal["read_only", "side_effecting"]

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolContext:
    """What an executor may use: the session's actor (never the model's word) and an HTTP client.
    For a side-effecting call also its operation id (the idempotency key) and approval token."""

    actor: Actor
    http: httpx.AsyncClient
    workflow_id: str
    call_id: str
    operation_id: str | None = None
    approval_token: str | None = None


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
    """A write that certainly did not reach the service (connection refused, 429): safe to send again
    with the same key."""

    def __init__(self, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class WriteOutcomeUnknown(Exception):
    """A write that may or may not have taken effect (timeout, reset, lost or cut reply, 5xx): the
    caller must ask the operation's status before anything else."""


class WriteInProgress(Exception):
    """The service is still working on this operation id (another attempt holds it)."""


class OperationStatus(BaseModel):
    """The service's word on an operation id: finished (with its stored outcome), running, or unknown to it."""

    state: Literal["completed", "in_progress", "not_found"]
    # For completed: the stored outcome, as the executor would have returned it (ok or a definite error).
    output: dict[str, Any] | None = None


class Evidence(BaseModel):
    """What a read-back found: `verified` only when the final state matches what was approved."""

    verified: bool
    detail: str
    checks: dict[str, Any] = Field(default_factory=dict)


class EvidenceNotYetVisible(Exception):
    """The read-back does not see the effect yet (stale read): worth reading again, never re-writing."""


Executor = Callable[[ToolContext, Any], Awaitable[Mapping[str, Any]]]
# Side-effecting tools: status of an operation id, and the read-back of a completed one.
StatusQuery = Callable[[ToolContext, str], Awaitable[OperationStatus]]
ReadBack = Callable[[ToolContext, Any, Mapping[str, Any]], Awaitable[Evidence]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    arguments: type[BaseModel]
    effect: Effect
    execute: Executor
    # A short label for the Temporal UI and progress display, e.g. "get_order_status A100".
    summarize: Callable[[Any], str] | None = None
    # Required for side-effecting tools (DESIGN.md, "the write protocol").
    status: StatusQuery | None = None
    read_back: ReadBack | None = None
    # Argument names whose values are replaced by "***" in ledgers, logs and the UI.
    redact: tuple[str, ...] = ()

    @property
    def read_only(self) -> bool:
        return self.effect == "read_only"

    def summary(self, args: BaseModel) -> str:
        if self.summarize is not None:
            text = self.summarize(args)
        else:
            values = [str(v) for v in args.model_dump(mode="json").values() if v is not None]
            text = " ".join([self.name, *values])
        return text[:120]

    def definition(self) -> dict[str, Any]:
        """The Responses API `tools` entry, strict mode."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": strict_json_schema(self.arguments),
            "strict": True,
        }


@dataclass
class ToolRegistry:
    _tools: dict[str, ToolSpec] = field(default_factory=dict)

    def register(self, spec: ToolSpec) -> None:
        if not TOOL_NAME.match(spec.name):
            raise ValueError(f"tool name {spec.name!r} must match {TOOL_NAME.pattern}")
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} is registered twice")
        if spec.effect == "side_effecting" and (spec.status is None or spec.read_back is None):
            raise ValueError(f"side-effecting tool {spec.name!r} needs a status query and a read-back")
        if spec.arguments.model_config.get("extra") != "forbid":
            raise ValueError(f"tool {spec.name!r}: its argument model must set extra='forbid'")
        problems = strict_schema_problems(spec.arguments)
        if problems:
            raise ValueError(f"tool {spec.name!r} breaks strict-mode rules: {'; '.join(problems)}")
        self._tools[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def names(self) -> list[str]:
        return list(self._tools)

    def definitions(self) -> list[dict[str, Any]]:
        return [spec.definition() for spec in self._tools.values()]


# --- Strict JSON schema ---------------------------------------------------------------------------

# Keywords the Responses strict mode does not take; they carry no constraint the model needs.
_DROP_KEYS = ("title", "default", "examples")


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Every object closed (`additionalProperties: false`) with every property required; a field with
    a default must be nullable in the model (strict mode has no optional properties)."""
    schema = copy.deepcopy(model.model_json_schema())
    _make_strict(schema)
    return schema


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _subschemas(node: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """Child schemas of a schema node (never the `properties` mapping itself: a property may be
    called `title`)."""
    for key, sub in node.get("properties", {}).items():
        yield f"properties.{key}", sub
    for key in ("$defs", "definitions"):
        for name, sub in node.get(key, {}).items():
            yield f"{key}.{name}", sub
    if isinstance(node.get("items"), dict):
        yield "items", node["items"]
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(node.get(key, [])):
            yield f"{key}[{i}]", sub


def _make_strict(node: Any) -> None:
    if not isinstance(node, dict):
        return
    for key in _DROP_KEYS:
        node.pop(key, None)
    if node.get("type") == "object" or "properties" in node:
        node["type"] = "object"
        node["additionalProperties"] = False
        node["required"] = list(node.get("properties", {}))
    for _, sub in _subschemas(node):
        _make_strict(sub)


def _allows_null(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") == "null" or (isinstance(schema.get("type"), list) and "null" in schema["type"]):
        return True
    return any(_allows_null(s) for s in schema.get("anyOf", []))


def strict_schema_problems(model: type[BaseModel]) -> list[str]:
    """What keeps `model`'s generated schema from meeting the Responses strict-mode rules."""
    problems: list[str] = []
    schema = strict_json_schema(model)
    raw_props = model.model_json_schema().get("properties", {})

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        if node.get("type") == "object":
            if node.get("additionalProperties") is not False:
                problems.append(f"{path}: additionalProperties is not false")
            if sorted(node.get("required", [])) != sorted(node.get("properties", {})):
                problems.append(f"{path}: not every property is required")
        for key in _DROP_KEYS:
            if key in node:
                problems.append(f"{path}: keyword {key!r} is not allowed")
        for sub_path, sub in _subschemas(node):
            walk(sub, f"{path}.{sub_path}")

    if schema.get("type") != "object":
        problems.append("top level is not an object")
    walk(schema, "$")
    for name, info in model.model_fields.items():
        key = info.alias or name
        if not info.is_required() and not _allows_null(raw_props.get(key, {})):
            problems.append(f"{key}: optional but not nullable")
    return problems


# --- Reusable argument types ----------------------------------------------------------------------

_FORBIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn"}


def _plain_text(value: str) -> str:
    """Reject control, format (zero-width, bidi) and unassigned characters; keep newlines and tabs."""
    for ch in value:
        if ch in "\n\t":
            continue
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise ValueError(f"contains a disallowed character U+{ord(ch):04X}")
    return value


PlainText = Annotated[str, AfterValidator(_plain_text)]
