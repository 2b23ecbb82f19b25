"""Pure: the tool plug-in API (a tool is a name, an argument model, an effect class and an executor)
and the strict JSON schema the model sees, generated from the argument model."""

from __future__ import annotations

import copy
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, Field

from toolloop._core.codes import ResultCode
from toolloop._core.contracts import Actor

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

    def canonical_arguments(self, args: BaseModel) -> dict[str, Any]:
        """The validated arguments as JSON under the names the model sees (its aliases): what is approved,
        digested, sent, and validated again by the activity. The argument model declares the canonical
        form through its types (Instant, PlainText, sorted_unique), so two spellings of one intended
        call give one dict."""
        return args.model_dump(mode="json", by_alias=True)

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
    # Built once at registration: exactly what is checked is what the model is sent.
    _definitions: dict[str, dict[str, Any]] = field(default_factory=dict)

    def register(self, spec: ToolSpec) -> None:
        if not TOOL_NAME.match(spec.name):
            raise ValueError(f"tool name {spec.name!r} must match {TOOL_NAME.pattern}")
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} is registered twice")
        if spec.effect == "side_effecting" and (spec.status is None or spec.read_back is None):
            raise ValueError(f"side-effecting tool {spec.name!r} needs a status query and a read-back")
        if spec.arguments.model_config.get("extra") != "forbid":
            raise ValueError(f"tool {spec.name!r}: its argument model must set extra='forbid'")
        definition = spec.definition()
        problems = strict_schema_problems(spec.arguments, sent=definition["parameters"])
        if problems:
            raise ValueError(f"tool {spec.name!r} breaks strict-mode rules: {'; '.join(problems)}")
        self._tools[spec.name] = spec
        self._definitions[spec.name] = definition

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def names(self) -> list[str]:
        return list(self._tools)

    def definitions(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(d) for d in self._definitions.values()]


# --- Strict JSON schema ---------------------------------------------------------------------------

# Keywords the Responses strict mode does not take; they carry no constraint the model needs.
_DROP_KEYS = ("title", "default", "examples")
# Shorthands that match every Unicode digit or letter in Python's `re` and in pydantic's regex engine:
# "A\d{3}" accepts "A١٠٠". Identifiers must spell out their ASCII classes.
_UNICODE_CLASSES = re.compile(r"(?<!\\)\\[dDwW]")


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Every object closed (`additionalProperties: false`) with every property required; a field with
    a default must be nullable in the model (strict mode has no optional properties)."""
    schema = copy.deepcopy(model.model_json_schema(by_alias=True))
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
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield key, node[key]
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(node.get(key, [])):
            yield f"{key}[{i}]", sub


def _is_object(node: Mapping[str, Any]) -> bool:
    return node.get("type") == "object" or "properties" in node


def _make_strict(node: Any) -> None:
    if not isinstance(node, dict):
        return
    for key in _DROP_KEYS:
        node.pop(key, None)
    if _is_object(node):
        node["type"] = "object"
        node["additionalProperties"] = False
        node["required"] = list(node.get("properties", {}))
    for _, sub in _subschemas(node):
        _make_strict(sub)


def _allows_null(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") == "null" or (isinstance(schema.get("type"), list) and "null" in schema["type"]):
        return True
    return any(_allows_null(s) for s in schema.get("anyOf", []))


def conversion_problems(model: type[BaseModel]) -> list[str]:
    """Where making `model`'s schema strict would change what it means: a free-form map (a `dict`
    field) would only accept `{}`, and an optional property that is not nullable would become required."""
    problems: list[str] = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        if _is_object(node):
            extra = node.get("additionalProperties")
            if extra is not None and extra is not False:
                problems.append(
                    f"{path}: a free-form map (a dict field) cannot be expressed in strict mode, where it would "
                    "only accept {}; use a list of objects with fixed fields"
                )
            required = set(node.get("required", []))
            for name, sub in node.get("properties", {}).items():
                if name not in required and not _allows_null(sub):
                    problems.append(f"{path}.{name}: optional but not nullable")
        for sub_path, sub in _subschemas(node):
            walk(sub, f"{path}.{sub_path}")

    walk(model.model_json_schema(by_alias=True), "$")
    return problems


def sent_schema_problems(schema: Mapping[str, Any]) -> list[str]:
    """What keeps `schema` (the parameters the model is sent) from meeting the Responses strict-mode
    rules, or lets through identifiers that are not ASCII."""
    problems: list[str] = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        if _is_object(node):
            if node.get("additionalProperties") is not False:
                problems.append(f"{path}: additionalProperties is not false")
            if sorted(node.get("required", [])) != sorted(node.get("properties", {})):
                problems.append(f"{path}: not every property is required")
        for key in _DROP_KEYS:
            if key in node:
                problems.append(f"{path}: keyword {key!r} is not allowed")
        pattern = node.get("pattern")
        if isinstance(pattern, str) and _UNICODE_CLASSES.search(pattern):
            problems.append(
                f"{path}: pattern {pattern!r} uses \\d or \\w, which match non-ASCII digits and letters; "
                "spell out [0-9] or [A-Za-z0-9_]"
            )
        for sub_path, sub in _subschemas(node):
            walk(sub, f"{path}.{sub_path}")

    if schema.get("type") != "object":
        problems.append("top level is not an object")
    walk(schema, "$")
    return problems


def round_trip_problems(model: type[BaseModel]) -> list[str]:
    """Where validated arguments, dumped under the names the model sees, would not validate again in the
    activity: each field must be read and written under one name, and no field may be left out of a dump."""
    problems: list[str] = []
    aliased = False
    for name, info in model.model_fields.items():
        if info.validation_alias is not None and not isinstance(info.validation_alias, str):
            problems.append(f"{name}: AliasPath and AliasChoices are not supported; give one alias")
            continue
        read_as = info.validation_alias or info.alias or name
        written_as = info.serialization_alias or info.alias or name
        aliased = aliased or read_as != name
        if read_as != written_as:
            problems.append(f"{name}: read as {read_as!r} but written as {written_as!r}; use one alias for both")
        if info.exclude:
            problems.append(f"{name}: excluded from dumps, so it would be lost before the tool runs")
    if aliased and model.model_config.get("validate_by_alias") is False:
        problems.append("validate_by_alias=False: arguments under their aliases would not validate again")
    return problems


def strict_schema_problems(model: type[BaseModel], sent: Mapping[str, Any] | None = None) -> list[str]:
    """Every reason `register` refuses this argument model; `sent` is the schema the model is sent
    (by default the one generated from it)."""
    return [
        *conversion_problems(model),
        *sent_schema_problems(strict_json_schema(model) if sent is None else sent),
        *round_trip_problems(model),
    ]


# --- Reusable argument types: they also declare a call's canonical form ------------------------------
# The operation id and the approval digest are taken over the validated arguments, so these types make
# two spellings of one intended write one operation: text in NFC, instants in UTC, sets sorted.

_FORBIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn"}


def _plain_text(value: str) -> str:
    """NFC (the form the service stores and the read-back compares); reject control, format (zero-width,
    bidi) and unassigned characters; keep newlines and tabs."""
    value = unicodedata.normalize("NFC", value)
    for ch in value:
        if ch in "\n\t":
            continue
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise ValueError(f"contains a disallowed character U+{ord(ch):04X}")
    return value


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


PlainText = Annotated[str, AfterValidator(_plain_text)]
# An instant with an explicit offset, kept in UTC: "12:00+02:00" and "10:00Z" are one value.
Instant = Annotated[AwareDatetime, AfterValidator(_utc)]

T = TypeVar("T")


def sorted_unique(values: list[T]) -> list[T]:
    """For a list that means a set (attendees, tags): one order and no repeats, so that two spellings of
    one set are one payload. Use as AfterValidator(sorted_unique)."""
    return sorted(set(values))  # type: ignore[type-var]
