"""Pure: what of a tool's arguments may appear in logs, decided per field from the strict schema the model is
sent. Identifiers (a pattern, an enum, a date-time) and plain counts stay readable; free text, amounts, email
addresses, lists and objects are masked, and so is every field the tool names in `redact`. Ledgers and
receipts keep the arguments whole (the user approved them); only logs are masked."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
# Names that say money or a secret, whatever their type.
_SENSITIVE = re.compile(r"amount|cents|price|total|balance|salary|iban|card|token|secret|password|email", re.I)
_KEPT_FORMATS = {"date-time", "date", "time", "uuid"}


def _branch(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The non-null branch of a nullable property."""
    for option in schema.get("anyOf", []):
        if isinstance(option, Mapping) and option.get("type") != "null":
            return option
    return schema


def _kind(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def field_is_loggable(name: str, schema: Mapping[str, Any]) -> bool:
    if _SENSITIVE.search(name):
        return False
    branch = _branch(schema)
    kind = _kind(branch)
    if kind == "string":
        # Text with a shape (an id, a choice, a timestamp) is kept; free text is not.
        return "pattern" in branch or "enum" in branch or branch.get("format") in _KEPT_FORMATS
    return kind in ("integer", "number", "boolean", "null")


def log_rules(parameters: Mapping[str, Any], redact: Iterable[str] = ()) -> dict[str, bool]:
    """Field name -> whether its value may be logged, for the top-level properties of `parameters`."""
    hidden = set(redact)
    properties = parameters.get("properties", {})
    return {
        name: name not in hidden and isinstance(schema, Mapping) and field_is_loggable(name, schema)
        for name, schema in properties.items()
    }


def for_logs(arguments: Mapping[str, Any], rules: Mapping[str, bool]) -> dict[str, Any]:
    """The arguments with every field that may not be logged (or that the schema does not know) masked."""
    return {name: (value if rules.get(name, False) else MASK) for name, value in arguments.items()}
