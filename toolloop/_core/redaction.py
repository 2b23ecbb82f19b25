"""Pure: what of a tool's arguments may appear in logs, decided per field from the strict schema the model is
sent. Identifiers (a pattern, an enum, a date-time) and plain counts stay readable; free text, amounts, email
addresses, lists and objects are masked, and so is every field the tool names in `redact`. Ledgers and
receipts keep the arguments whole (the user approved them); only logs are masked."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
# Names that say a secret: never shown, not even in a call's one-line summary. Compound names are read with their
# separators and case dropped (apikey, accessToken, card_number); a few short words only as words of the name
# (cardPin, otp_code: not "shipping" or "author").
_SECRET_PARTS = re.compile(
    r"token|secret|password|passwd|passphrase|(?:api|private|access|signing|ssh|secret)key|authoriz|credential"
    r"|cookie|session|signature|cardnumber|iban|cvv|cvc"
)
_SECRET_WORDS = frozenset({"pin", "otp", "auth"})


def secret_name(name: str) -> bool:
    """True when a field's name says it holds a secret (a password, a key, a card's number or PIN)."""
    if _SECRET_PARTS.search(re.sub(r"[^a-z0-9]", "", name.lower())):
        return True
    words = [w.lower() for w in re.findall(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+|[0-9]+", name)]
    return any(w in _SECRET_WORDS for w in words)


# Names that say money, a card, an address or a key, whatever their type: masked in logs (as secrets are).
_SENSITIVE = re.compile(r"amount|cents|price|total|balance|salary|card|email|key|auth", re.I)
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
    if _SENSITIVE.search(name) or secret_name(name):
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


# What a service's or a tool server's error text must not carry to the model: a stack trace, a file path, SQL,
# an OS error or a credential (FastMCP passes the text of any exception a tool raises on). SQL counts as a
# statement (SELECT ... FROM x WHERE, INSERT INTO x), so "Select a date from the list" passes, and a path by
# its root, so /users/42 passes.
_INTERNAL = re.compile(
    r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+|\[Errno \d+\]"
    r"|(?<![\w.])/(?:usr|home|etc|var|tmp|opt|srv|root|proc|mnt|app|work|data|Users|private)/"
    r"|(?<![\w/])\.\.?/[\w.-]+/|\b[A-Za-z]:[\\/][\w.-]"
    r"|(?i:\bselect\b.{1,200}?\bfrom\s+\w+\s+where\b|\binsert\s+into\s+\w+|\bupdate\s+\w+\s+set\s+\w+\s*="
    r"|\bdelete\s+from\s+\w+\s+where\b|sqlstate|syntax error at or near|password authentication failed"
    r"|\b(?:sqlite3|psycopg2?|asyncpg|sqlalchemy|pymysql)\b|\w+://[^/\s:@]+:[^@\s]+@"
    r"|(?:api_?key|access_?token|secret|password|passwd)=)",
    re.DOTALL,
)


def internal_text(text: str) -> bool:
    """True when `text` looks like it shows a program's insides (it is then not passed on)."""
    return _INTERNAL.search(text) is not None
