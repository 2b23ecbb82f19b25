"""Pure: approval tokens. Only the trusted approval channel holds the key that signs them; the business
service verifies them at execution time. The model and the workflow's inputs never see the key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from agentcore.digests import canonical_json


class ApprovalClaims(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = 1
    user_id: str
    tenant_id: str
    operation_id: str
    digest: str
    approved_by: str
    approved_at: float  # unix seconds
    expires_at: float  # unix seconds


class ApprovalInvalid(ValueError):
    """The token is missing, malformed, forged, expired or bound to something else."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: bytes, body: str) -> str:
    return _b64(hmac.new(key, body.encode("ascii"), hashlib.sha256).digest())


def mint_approval_token(key: bytes, claims: ApprovalClaims) -> str:
    body = _b64(canonical_json(claims.model_dump()).encode("utf-8"))
    return f"{body}.{_signature(key, body)}"


def read_approval_claims(token: str) -> ApprovalClaims:
    """The claims without checking the signature (for the workflow's validator, which has no key)."""
    try:
        body, _, _sig = token.partition(".")
        data: Any = json.loads(_unb64(body))
        return ApprovalClaims.model_validate(data)
    except (ValueError, ValidationError) as exc:
        raise ApprovalInvalid("the approval token is malformed") from exc


def verify_approval_token(key: bytes, token: str | None, *, now: float, expected: Mapping[str, str]) -> ApprovalClaims:
    """Check signature, expiry and that every `expected` claim (user_id, tenant_id, operation_id,
    digest) matches. Raises ApprovalInvalid with a short reason."""
    if not token:
        raise ApprovalInvalid("no approval token")
    body, dot, sig = token.partition(".")
    if not dot or not hmac.compare_digest(_signature(key, body), sig):
        raise ApprovalInvalid("the approval token's signature is not valid")
    claims = read_approval_claims(token)
    if claims.expires_at <= now:
        raise ApprovalInvalid("the approval has expired")
    for name, value in expected.items():
        if getattr(claims, name) != value:
            raise ApprovalInvalid(f"the approval is for another {name.replace('_id', '').replace('_', ' ')}")
    return claims
