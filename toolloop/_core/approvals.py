"""Pure: what an approval binds and how it travels - one module, shared by both sides of the wire (the
workflow and the approval channel on one side, the service kit on the other).

- The digest: sha256 of the canonical JSON (sorted keys, no whitespace) of what is approved: the payload and
  its subject (the tool's name, or for an HTTP write the method and path the service receives). A service
  computes it from the request it receives, knowing no tool names and no argument models.
- The token: the trusted approval channel signs a human's decision (approve or reject) with an Ed25519 private
  key that only it holds; the workflow's Update validator and the service verify the signature with the
  public key. So nobody else (the model, a worker, anyone with a Temporal client) can approve or reject, and
  the public key can sit in workflow input and service configuration.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict, ValidationError

Decision = Literal["approve", "reject"]


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 as is: the same payload always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def payload_digest(subject: str, payload: Mapping[str, Any]) -> str:
    """What an approval is bound to and what a service compares under one idempotency key. `subject` is the
    tool's name, or for an HTTP write "METHOD /path" as the service receives it (the JSON keys keep their
    first names, so digests made before HTTP subjects existed are unchanged)."""
    text = canonical_json({"tool": subject, "arguments": dict(payload)})
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def http_subject(method: str, path: str) -> str:
    """The subject of an HTTP write: its method and its (decoded) path, as both sides see them."""
    return f"{method.upper()} {path}"


def derive_operation_id(request_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """Stable for the same intended operation within one request: the same tool and payload proposed
    again (with a new call_id) is the same operation, so it can never make a second effect."""
    text = canonical_json({"request": request_id, "tool": tool, "arguments": dict(arguments)})
    return "op_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def short_operation_id(operation_id: str) -> str:
    """An operation id as the Temporal UI shows it in summaries (a prefix, still unique in one request)."""
    return operation_id[:14] + "…" if len(operation_id) > 15 else operation_id


_WAIT_PREFIX = "waiting for approval of "
_WAIT_SUMMARY = re.compile(r"^waiting for approval of (?P<tool>\S+) (?P<operation>\S+) until ")


def approval_wait_summary(tool: str, operation_id: str, until: str) -> str:
    """The summary of the timer an operation's approval wait starts: the UI shows it, and a client that
    follows the run's history reads from it which operation waits (`approval_wait_of`)."""
    return f"{_WAIT_PREFIX}{tool} {short_operation_id(operation_id)} until {until}"


def approval_wait_of(summary: str) -> tuple[str, str] | None:
    """(tool, short operation id) of an approval wait's timer summary; None for any other timer."""
    found = _WAIT_SUMMARY.match(summary)
    return None if found is None else (found["tool"], found["operation"])


class ApprovalClaims(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = 1
    user_id: str
    tenant_id: str
    operation_id: str
    digest: str
    approved_by: str  # who decided (kept under its first name: stored tokens still decode)
    approved_at: float  # unix seconds
    expires_at: float  # unix seconds
    # Added later, with defaults so older tokens still decode.
    decision: Decision = "approve"
    channel: str = ""
    # The end of the operation's approval window (unix seconds): a decision made after it counts for nothing,
    # for the workflow and for the service alike. None: the channel named no window.
    decide_by: float | None = None

    @property
    def decided_by(self) -> str:
        """Who decided, through which channel: what a record of the decision names."""
        return self.approved_by + (f" via {self.channel}" if self.channel else "")


class ApprovalInvalid(ValueError):
    """The token is missing, malformed, forged, expired or bound to something else."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def generate_signing_key() -> str:
    """A new private key for an approval channel (base64url of the 32-byte Ed25519 seed)."""
    return _b64(Ed25519PrivateKey.generate().private_bytes_raw())


# Parsed once per key: an approval channel signs every decision with the same key (py-spy: parsing it was
# about 4% of the approving client's CPU per decision).
@functools.lru_cache(maxsize=16)
def _private_key(signing_key: str) -> Ed25519PrivateKey:
    try:
        return Ed25519PrivateKey.from_private_bytes(_unb64(signing_key.strip()))
    except ValueError as exc:
        raise ValueError("the approval signing key is not a base64url Ed25519 key of 32 bytes") from exc


def verify_key_for(signing_key: str) -> str:
    """The public key (base64url, 32 bytes) that verifies what `signing_key` signs."""
    public = _private_key(signing_key).public_key()
    return _b64(public.public_bytes(Encoding.Raw, PublicFormat.Raw))


def check_verify_key(verify_key: str) -> str:
    """`verify_key` if it is a usable public key; raises ValueError otherwise (for configuration checks)."""
    _public_key(verify_key)
    return verify_key


@functools.lru_cache(maxsize=16)
def _public_key(verify_key: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(_unb64(verify_key.strip()))
    except ValueError as exc:
        raise ValueError("the approval verify key is not a base64url Ed25519 public key of 32 bytes") from exc


def mint_approval_token(signing_key: str, claims: ApprovalClaims) -> str:
    body = _b64(canonical_json(claims.model_dump()).encode("utf-8"))
    return f"{body}.{_b64(_private_key(signing_key).sign(body.encode('ascii')))}"


def read_approval_claims(token: str) -> ApprovalClaims:
    """The claims without checking the signature (to record an already verified decision)."""
    try:
        body, _, _sig = token.partition(".")
        data: Any = json.loads(_unb64(body))
        return ApprovalClaims.model_validate(data)
    except (ValueError, ValidationError) as exc:
        raise ApprovalInvalid("the approval token is malformed") from exc


def verify_approval_token(
    verify_key: str, token: str | None, *, now: float, expected: Mapping[str, str]
) -> ApprovalClaims:
    """Check the signature, the expiry and that every `expected` claim (user_id, tenant_id, operation_id,
    digest, decision) matches. Raises ApprovalInvalid with a short reason."""
    if not token:
        raise ApprovalInvalid("no approval token")
    body, dot, sig = token.partition(".")
    try:
        _public_key(verify_key).verify(_unb64(sig), body.encode("ascii"))
    except (InvalidSignature, ValueError, UnicodeEncodeError):
        raise ApprovalInvalid("the approval token's signature is not valid") from None
    if not dot:
        raise ApprovalInvalid("the approval token's signature is not valid")
    claims = read_approval_claims(token)
    if claims.expires_at <= now:
        raise ApprovalInvalid("the approval has expired")
    if claims.decide_by is not None and claims.approved_at >= claims.decide_by:
        raise ApprovalInvalid("the decision was made after the operation's approval window closed")
    for name, value in expected.items():
        if getattr(claims, name) != value:
            if name == "decision":
                raise ApprovalInvalid(f"the token records a decision to {claims.decision}, not to {value}")
            raise ApprovalInvalid(f"the approval is for another {name.replace('_id', '').replace('_', ' ')}")
    return claims
