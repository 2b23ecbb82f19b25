"""Pure (plus one file read): bearer tokens and whom they stand for. The actor of every request the API starts
comes from here and nowhere else.

The tokens file is JSON: {"tokens": [{"token": "...", "tenant_id": "acme", "user_id": "u1"}, ...]}. An entry
may give "token_sha256" (the hex SHA-256 of the token) instead of the token itself, so a deployment's file
holds no usable secret. An entry may give "models", the only models its caller may start requests on (absent:
every model the API knows). Tokens are compared by their digests in constant time."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolloop._core.contracts import MODEL_NAME, Actor


class TokensFileError(ValueError):
    """The tokens file is missing or malformed (one line for the operator)."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str | None = Field(default=None, min_length=16)
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    tenant_id: str
    user_id: str
    # The models this token's caller may use (an empty list: none, for a caller that only reads and decides).
    models: list[Annotated[str, Field(pattern=MODEL_NAME)]] | None = Field(default=None, max_length=100)
    # The caller's roles in its tenant (e.g. "manager"), as approval policies name them.
    roles: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,39}$")]] = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _one_secret(self) -> _Entry:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token and token_sha256")
        return self


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str = Field(default="", alias="_comment")
    tokens: list[_Entry]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


# The demo's tokens (config/api_tokens.json), published in the README: anyone can use them. An API holding
# the approval key must not accept them unless it is told that it runs a local demo.
PUBLISHED_DEMO_TOKENS = frozenset(
    _digest(token)
    for token in (
        "demo-token-u1-acme-0001",
        "demo-token-u2-acme-0002",
        "demo-token-u3-globex-0003",
        "demo-token-u1-globex-0004",
        "demo-token-m1-acme-0005",
        "demo-token-m1-globex-0006",
    )
)


@dataclass(frozen=True)
class Grant:
    """What a token stands for: whom, the models it may use (None: every model the API knows), and its roles in
    its tenant (what an approval policy may let decide an operation: docs/POLICIES.md)."""

    actor: Actor
    models: frozenset[str] | None = None
    roles: frozenset[str] = frozenset()


class TokenMap:
    def __init__(self, entries: list[tuple[bytes, Grant]]) -> None:
        self._entries = entries

    @classmethod
    def load(cls, path: str | Path) -> TokenMap:
        file = Path(path)
        try:
            data = _File.model_validate(json.loads(file.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise TokensFileError(f"tokens file not found: {file}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokensFileError(f"tokens file {file} cannot be read as JSON ({type(exc).__name__})") from None
        except ValidationError as exc:
            first = exc.errors(include_input=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise TokensFileError(f"tokens file {file}: {where}: {first['msg']}") from None
        entries: list[tuple[bytes, Grant]] = []
        for entry in data.tokens:
            try:
                actor = Actor(user_id=entry.user_id, tenant_id=entry.tenant_id)
            except ValidationError:
                raise TokensFileError(
                    f"tokens file {file}: {entry.user_id!r}/{entry.tenant_id!r} is not an actor"
                ) from None
            digest = bytes.fromhex(entry.token_sha256) if entry.token_sha256 else _digest(entry.token or "")
            models = frozenset(entry.models) if entry.models is not None else None
            entries.append((digest, Grant(actor, models, frozenset(entry.roles))))
        return cls(entries)

    def grants(self) -> Iterator[Grant]:
        """Every entry's grant, in the file's order (for the checks at start)."""
        return (grant for _, grant in self._entries)

    def holds_published_demo_tokens(self) -> bool:
        return any(digest in PUBLISHED_DEMO_TOKENS for digest, _ in self._entries)

    def actor_for(self, token: str) -> Actor | None:
        grant = self.grant_for(token)
        return grant.actor if grant is not None else None

    def grant_for(self, token: str) -> Grant | None:
        digest = _digest(token)
        found = None
        for known, grant in self._entries:
            # Every entry is compared, so the time taken says nothing about which one matched.
            if hmac.compare_digest(known, digest):
                found = grant
        return found
