"""Pure: a tool's arguments - the strict JSON schema the model is sent, the check of what the model sends
against it, and the canonical form that is approved, digested, sent and checked again by the activity.

Two kinds: a pydantic model (tools declared in Python) and a plain JSON schema (tools an MCP server
describes). Both are refused at registration when strict mode cannot honour them, with the reason.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Annotated, Any, Protocol, TypeVar

import jsonschema
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, PlainSerializer, ValidationError

_MAX_ERRORS_SHOWN = 5


class ArgumentsRejected(ValueError):
    """Arguments that do not match the tool's schema; the message names fields, never echoes values."""


class ArgumentSchema(Protocol):
    """How one tool's arguments are described to the model and checked."""

    def parameters(self) -> dict[str, Any]:
        """The strict JSON schema sent to the model (every object closed, every property required)."""
        ...

    def problems(self, sent: Mapping[str, Any]) -> list[str]:
        """Every reason registration refuses this schema; `sent` is what the model would be sent."""
        ...

    def check(self, text: str) -> Any:
        """The validated arguments from the model's JSON text (already known to be a JSON object)."""
        ...

    def dump(self, args: Any) -> dict[str, Any]:
        """The canonical form: JSON under the names the model sees."""
        ...

    def load(self, data: Mapping[str, Any]) -> Any:
        """The arguments again from their canonical form (in the activity, before the executor runs)."""
        ...


# --- Strict JSON schema ---------------------------------------------------------------------------

# Keywords the Responses strict mode does not take; they carry no constraint the model needs.
_DROP_KEYS = ("title", "default", "examples")
# Shorthands that match every Unicode digit or letter in Python's `re` and in pydantic's regex engine:
# "A\d{3}" accepts "A١٠٠". Identifiers must spell out their ASCII classes.
_UNICODE_CLASSES = re.compile(r"(?<!\\)\\[dDwW]")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
# Keywords strict mode cannot express (or that say "any other field is fine"): a schema using them is
# refused rather than silently narrowed.
_UNSUPPORTED_KEYWORDS = (
    "patternProperties",
    "propertyNames",
    "unevaluatedProperties",
    "dependentRequired",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "not",
)


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


@functools.cache
def defaulted_arguments(model: type[BaseModel]) -> frozenset[str]:
    """The top-level arguments (as the model sees them) that have a default and do not take null: strict mode
    has no optional properties, so the model is sent them nullable, and a null it gives is dropped before
    validation so the default applies."""
    schema = model.model_json_schema(by_alias=True)
    required = set(schema.get("required", []))
    return frozenset(
        name for name, sub in schema.get("properties", {}).items() if name not in required and not _allows_null(sub)
    )


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Every object closed (`additionalProperties: false`) with every property required; a top-level
    argument with a default is sent nullable (defaulted_arguments); a nested field with a default must be
    nullable in the model."""
    schema = copy.deepcopy(model.model_json_schema(by_alias=True))
    defaulted = defaulted_arguments(model)
    _make_strict(schema)
    properties = schema.get("properties", {})
    for name in defaulted:
        properties[name] = _nullable(properties[name])
    return schema


def conversion_problems(schema: Mapping[str, Any]) -> list[str]:
    """Where making `schema` strict would change what it means: a free-form map would only accept `{}`,
    and a nested optional property that is not nullable would become required (a top-level one is sent
    nullable and defaulted: defaulted_arguments)."""
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
                if name not in required and not _allows_null(sub) and path != "$":
                    problems.append(f"{path}.{name}: optional but not nullable")
        for sub_path, sub in _subschemas(node):
            walk(sub, f"{path}.{sub_path}")

    walk(schema, "$")
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
        for key in _UNSUPPORTED_KEYWORDS:
            if key in node:
                problems.append(f"{path}: keyword {key!r} cannot be expressed in strict mode")
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
    """Every reason registration refuses this argument model; `sent` is the schema the model is sent
    (by default the one generated from it)."""
    return [
        *conversion_problems(model.model_json_schema(by_alias=True)),
        *sent_schema_problems(strict_json_schema(model) if sent is None else sent),
        *round_trip_problems(model),
    ]


# --- Messages -------------------------------------------------------------------------------------------


def _shorten(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_validation_error(exc: ValidationError) -> str:
    """Field-by-field hints without echoing the (possibly huge or hostile) input values."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False)[:_MAX_ERRORS_SHOWN]:
        loc = ".".join(str(p) for p in err["loc"]) or "arguments"
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "is not an accepted field"
        elif kind == "missing":
            msg = "is required"
        else:
            msg = err["msg"]
        parts.append(f"{_shorten(loc)}: {msg}")
    more = len(exc.errors()) - _MAX_ERRORS_SHOWN
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


# --- Pydantic argument models ------------------------------------------------------------------------------


class Arguments(BaseModel):
    """A convenient base for argument models: unknown fields are refused (strict mode's
    `additionalProperties: false`), and dumps use the aliases the model sees, so the checked arguments
    validate again unchanged."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)


@dataclass(frozen=True)
class PydanticArguments:
    model: type[BaseModel]

    def parameters(self) -> dict[str, Any]:
        return strict_json_schema(self.model)

    def problems(self, sent: Mapping[str, Any]) -> list[str]:
        if self.model.model_config.get("extra") != "forbid":
            return ["its argument model must set extra='forbid'"]
        return strict_schema_problems(self.model, sent=sent)

    def check(self, text: str) -> BaseModel:
        defaulted = defaulted_arguments(self.model)
        if defaulted:
            text = _without_nulls(text, defaulted)
        try:
            return self.model.model_validate_json(text, strict=True)
        except ValidationError as exc:
            raise ArgumentsRejected(describe_validation_error(exc)) from None

    def dump(self, args: Any) -> dict[str, Any]:
        """The validated arguments as JSON under the names the model sees (its aliases). The model declares
        the canonical form through its types (Instant, PlainText, sorted_unique), so two spellings of one
        intended call give one dict (Amount for a decimal: 5.10 and 5.1 are one amount)."""
        dumped: dict[str, Any] = args.model_dump(mode="json", by_alias=True)
        return dumped

    def load(self, data: Mapping[str, Any]) -> BaseModel:
        try:
            return self.model.model_validate(dict(data))
        except ValidationError as exc:
            raise ArgumentsRejected(describe_validation_error(exc)) from None


def _without_nulls(text: str, names: frozenset[str]) -> str:
    """The call's arguments without the given top-level ones where the model sent null (so their defaults
    apply); the text unchanged when it is not a JSON object (validation then says what is wrong)."""
    try:
        given = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if not isinstance(given, dict):
        return text
    return json.dumps({name: value for name, value in given.items() if not (value is None and name in names)})


# --- Plain JSON schemas (MCP tools) -------------------------------------------------------------------


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if _allows_null(schema):
        return schema
    kind = schema.get("type")
    if isinstance(kind, str) and set(schema) <= {"type", "description", "format"}:
        return {**schema, "type": [kind, "null"]}
    return {
        "anyOf": [schema, {"type": "null"}],
        **({"description": schema["description"]} if "description" in schema else {}),
    }


def _strict_copy(node: Any, path: str, problems: list[str]) -> Any:
    """`node` made strict: objects closed, optional properties nullable (sent as null, dropped before the
    call); refuses what would change meaning (an open map, an object without properties)."""
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k not in _DROP_KEYS}
    if _is_object(out):
        extra = out.get("additionalProperties")
        properties = out.get("properties")
        if extra is not None and extra is not False:
            problems.append(f"{path}: a free-form map (additionalProperties) cannot be expressed in strict mode")
        elif not isinstance(properties, dict) or (not properties and path != "$"):
            problems.append(f"{path}: an object without declared properties would only accept {{}} in strict mode")
        properties = properties if isinstance(properties, dict) else {}
        required = set(out.get("required", []))
        strict_properties = {}
        for name, sub in properties.items():
            converted = _strict_copy(sub, f"{path}.{name}", problems)
            strict_properties[name] = converted if name in required else _nullable(converted)
        out.update(type="object", properties=strict_properties, required=list(strict_properties))
        out["additionalProperties"] = False
    for key in ("items",):
        if isinstance(out.get(key), dict):
            out[key] = _strict_copy(out[key], f"{path}.{key}", problems)
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {n: _strict_copy(s, f"{path}.{key}.{n}", problems) for n, s in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_strict_copy(s, f"{path}.{key}[{i}]", problems) for i, s in enumerate(out[key])]
    if "oneOf" in out:
        problems.append(f"{path}: oneOf cannot be checked in strict mode; use anyOf")
    return out


_JSON_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def _schema_error_message(err: jsonschema.ValidationError) -> str:
    """A hint that names the field and the rule, never the value the model sent."""
    loc = ".".join(str(p) for p in err.absolute_path) or "arguments"
    rule, expected = err.validator, err.validator_value
    if rule == "required":
        missing = [name for name in expected if isinstance(err.instance, dict) and name not in err.instance]
        return (
            f"{_shorten('.'.join([*(str(p) for p in err.absolute_path), missing[0]]) if missing else loc)}: is required"
        )
    if rule == "additionalProperties":
        return f"{_shorten(loc)}: has a field that is not accepted"
    if rule == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        return f"{_shorten(loc)}: must be {' or '.join(_JSON_TYPE_WORDS.get(str(k), str(k)) for k in kinds)}"
    if rule == "enum":
        return f"{_shorten(loc)}: must be one of {', '.join(_shorten(repr(v), 40) for v in list(expected)[:10])}"
    if rule in ("minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{_shorten(loc)}: breaks {rule} {expected}"
    if rule in ("minItems", "maxItems", "uniqueItems", "pattern", "format", "const", "multipleOf"):
        return f"{_shorten(loc)}: breaks {rule}"
    return f"{_shorten(loc)}: does not match the schema ({rule})"


@dataclass(frozen=True)
class JsonSchemaArguments:
    """Arguments described by a plain JSON schema (an MCP tool's inputSchema). Optional properties become
    nullable for the model and are dropped again when null, so the server sees what its schema allows."""

    schema: Mapping[str, Any]

    def _converted(self) -> tuple[dict[str, Any], list[str]]:
        problems: list[str] = []
        strict = _strict_copy(copy.deepcopy(dict(self.schema)), "$", problems)
        return strict, problems

    def parameters(self) -> dict[str, Any]:
        strict, _ = self._converted()
        return strict

    def problems(self, sent: Mapping[str, Any]) -> list[str]:
        _, problems = self._converted()
        problems = [*problems, *sent_schema_problems(sent)]
        try:
            jsonschema.Draft202012Validator.check_schema(dict(sent))
        except jsonschema.SchemaError as exc:
            problems.append(f"not a valid JSON schema ({_shorten(str(exc.message), 120)})")
        return problems

    def _validator(self) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(self.parameters())

    def _validate(self, data: Any) -> dict[str, Any]:
        # Canonical first (whole numbers as ints, text in NFC): the schema checks what is sent and digested.
        data = _canonical_values(data)
        errors = sorted(self._validator().iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            parts = [_schema_error_message(e) for e in errors[:_MAX_ERRORS_SHOWN]]
            if len(errors) > _MAX_ERRORS_SHOWN:
                parts.append(f"and {len(errors) - _MAX_ERRORS_SHOWN} more")
            raise ArgumentsRejected("; ".join(parts))
        canonical: dict[str, Any] = dict(data)
        return canonical

    def check(self, text: str) -> dict[str, Any]:
        return self._validate(json.loads(text))

    def dump(self, args: Any) -> dict[str, Any]:
        return dict(args)

    def load(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return self._validate(dict(data))

    def without_nulls(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments as the server's own schema expects them: optional properties sent as null are left out,
        at any depth (in array items and in `$ref` definitions too)."""
        dropped: dict[str, Any] = _drop_optional_nulls(dict(args), self.schema, self.schema)
        return dropped


def _canonical_values(value: Any) -> Any:
    """5.0 as 5 and text in NFC, at any depth: JSON has one number type and Unicode two spellings of "é", and the
    same payload must give one operation id and one digest however the model wrote it (a tool with a pydantic
    model declares this through its types)."""
    if isinstance(value, dict):
        return {name: _canonical_values(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_canonical_values(item) for item in value]
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _drop_optional_nulls(value: Any, schema: Any, root: Mapping[str, Any]) -> Any:
    schema = _resolved(schema, root)
    if isinstance(value, list) and isinstance(schema, dict):
        return [_drop_optional_nulls(item, schema.get("items"), root) for item in value]
    if not isinstance(value, dict) or not isinstance(schema, dict):
        return value
    properties = schema.get("properties", {}) if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required", []))
    out = {}
    for name, item in value.items():
        if item is None and name not in required:
            continue
        out[name] = _drop_optional_nulls(item, properties.get(name), root)
    return out


def _resolved(schema: Any, root: Mapping[str, Any]) -> Any:
    """A local `$ref` ("#/$defs/Name", "#/definitions/Name") as the schema it names; a nullable property's
    non-null branch (strict mode writes optional properties as anyOf [X, null])."""
    for _ in range(32):  # a chain of references, never a cycle
        if not isinstance(schema, dict):
            return schema
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, dict) else None
            schema = target
            continue
        options = schema.get("anyOf")
        if isinstance(options, list):
            branches = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            if len(branches) == 1:
                schema = branches[0]
                continue
        return schema
    return schema


def argument_schema(arguments: type[BaseModel] | ArgumentSchema) -> ArgumentSchema:
    if isinstance(arguments, type) and issubclass(arguments, BaseModel):
        return PydanticArguments(arguments)
    return arguments


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


_AMOUNT_DIGITS = 40


def _amount(value: Decimal) -> Decimal:
    """A finite decimal of at most 40 digits either side of the point, by its value: 5.10, "5.1" and 51e-1 are
    one amount (a bare Decimal keeps its exponent, so they would be three operations)."""
    if not value.is_finite():
        raise ValueError("must be a finite number")
    if value.is_zero():
        return Decimal(0)
    # Checked before normalising (1e999999 is never written out), and normalised with room for every digit: the
    # default context would round a long amount to 28 digits and send another value than the one proposed.
    if value.adjusted() >= _AMOUNT_DIGITS or value.adjusted() < -_AMOUNT_DIGITS:
        raise ValueError(f"must have at most {_AMOUNT_DIGITS} digits before and after the point")
    with localcontext(prec=len(value.as_tuple().digits) + 2):
        normal = value.normalize()
    exponent = normal.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -_AMOUNT_DIGITS:
        raise ValueError(f"must have at most {_AMOUNT_DIGITS} digits before and after the point")
    return normal


PlainText = Annotated[str, AfterValidator(_plain_text)]
# A decimal amount by its value, sent as plain digits ("5.1", "100", never "1E+2").
Amount = Annotated[
    Decimal, AfterValidator(_amount), PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json")
]
# An instant with an explicit offset, kept in UTC: "12:00+02:00" and "10:00Z" are one value.
Instant = Annotated[AwareDatetime, AfterValidator(_utc)]

T = TypeVar("T")


def sorted_unique(values: list[T]) -> list[T]:
    """For a list that means a set (attendees, tags): one order and no repeats, so that two spellings of
    one set are one payload. Use as AfterValidator(sorted_unique)."""
    return sorted(set(values))  # type: ignore[type-var]
