"""Pure: what an approval binds and how it travels - one module, shared by both sides of the wire (the
workflow and the approval channel on one side, the service kit on the other).

- The digest: sha256 of the canonical JSON (sorted keys, no whitespace) of what is approved: the payload and
  its subject (the tool's name, or for an HTTP write the method and path the service receives). A service
  computes it from the request it receives, knowing no tool names and no argument models.
- The token: the trusted approval channel signs a human's decision (approve or reject) as a JWT (EdDSA JWS,
  made and read by PyJWT) with an Ed25519 private key that only it holds. Its header names the key's id
  (`kid`, the key's RFC 7638 thumbprint), its `aud` the service or tool source it is for. A worker's trust
  interceptor and a service verify the signature with the public keys their own configuration holds (a set
  by kid, so two are valid during a rotation); the claims are then checked where they are judged (the
  workflow does that deterministically, without a key). So nobody else (the model, a worker, anyone with a
  Temporal client) can approve or reject.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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


def run_binding(workflow_id: str, run_id: str) -> str:
    """What a decision names as the request it was made in: the request's workflow id and its run. A run is
    never started twice, while a workflow id can be used again once its run has closed (by anyone who may start
    workflows), and the same operation id and digest with it."""
    return f"{workflow_id}/{run_id}"


# How every operation id is spelled (derive_operation_id): what a person types back is checked against it.
OPERATION_ID = re.compile(r"^op_[0-9a-f]{32}$")


def derive_operation_id(request_id: str, tool: str, arguments: Mapping[str, Any], occurrence: int | None = None) -> str:
    """Stable for the same intended operation within one request: the same tool and payload proposed
    again (with a new call_id) is the same operation, so it can never make a second effect. For a tool whose
    identical calls are distinct, `occurrence` (0, 1, ...: how many identical proposals came before) makes
    each one its own operation."""
    subject: dict[str, Any] = {"request": request_id, "tool": tool, "arguments": dict(arguments)}
    if occurrence is not None:
        subject["occurrence"] = occurrence
    text = canonical_json(subject)
    return "op_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def short_operation_id(operation_id: str) -> str:
    """An operation id as the Temporal UI shows it in summaries (a prefix, still unique in one request)."""
    return operation_id[:14] + "…" if len(operation_id) > 15 else operation_id


def approval_wait_summary(tool: str, operation_id: str, until: str) -> str:
    """The summary of the timer an operation's approval wait starts, as the Temporal UI shows it."""
    return f"waiting for approval of {tool} {short_operation_id(operation_id)} until {until}"


# A grant approves a few writes in advance, never a blank cheque.
MAX_GRANT_USES = 20


class GrantClaims(BaseModel):
    """A per-request grant a person gives with an approval: "approve this and the next `uses` writes of the same
    tool in this request, within these bounds". Signed with the approval it comes with; honoured only by the
    policy evaluator, only in the request it names (so it ends with the request), only for writes the policy
    would ask this person about (never four eyes, never against a forbid)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request: str = Field(min_length=1, max_length=300)  # the request's run (run_binding)
    tool: str = Field(min_length=1, max_length=200)
    uses: int = Field(ge=1, le=MAX_GRANT_USES)
    # Each named argument at most this number.
    max: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(default_factory=dict, max_length=20)
    # Each named argument exactly this value (the approved write's, e.g. the same order).
    same: dict[str, Any] = Field(default_factory=dict, max_length=20)

    @model_validator(mode="after")
    def _bounded(self) -> GrantClaims:
        if not self.max and not self.same:
            raise ValueError("a grant needs bounds")
        return self

    def covers(self, tool: str, arguments: Mapping[str, Any]) -> bool:
        """True if a write of `tool` with `arguments` is within this grant's bounds (its uses are counted apart)."""
        if tool != self.tool:
            return False
        for name, most in self.max.items():
            value = arguments.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value > most:
                return False
        return all(name in arguments and arguments[name] == value for name, value in self.same.items())


class BoundClaims(BaseModel):
    """What every decision token (a person's, a policy's) is bound to: the service it is for, the person the
    write acts for, the operation and its payload's digest. On the wire a JWT (RFC 7519) signed with EdDSA
    (Ed25519): the standard claims under their registered names (`aud`, `exp`, `iat`), toolloop's own under
    theirs."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    v: int = 1
    # The service or tool source the decision is for (the operation's audience): a service accepts only its own.
    audience: str = Field(alias="aud", min_length=1, max_length=200)
    user_id: str
    tenant_id: str
    operation_id: str
    digest: str


class ApprovalClaims(BoundClaims):
    """What a person's decision token claims."""

    approved_by: str  # who decided
    approved_at: float = Field(alias="iat")  # unix seconds
    expires_at: float = Field(alias="exp")  # unix seconds
    decision: Decision = "approve"
    channel: str = ""
    # The end of the operation's approval window (unix seconds): a decision made after it counts for nothing,
    # for the workflow and for the service alike. None: the channel named no window.
    decide_by: float | None = None
    # The decider's roles, as the channel's identity (an API token, a CLI session) gives them: what a policy's
    # Deciders admit besides the requester. `user_id` is the person the write acts for, `approved_by` the
    # person who decided (the same person where no policy names others).
    roles: list[str] = Field(default_factory=list, max_length=20)
    # With an approval only: the next writes of the same tool this person approves in advance (GrantClaims).
    grant: GrantClaims | None = None
    # The request's run the decision was given in (run_binding): a thread's later message proposes the same
    # operation and digest again, and a new run may be started under a closed request's workflow id; neither
    # may take this decision from history. None: an older channel.
    request: str | None = None

    @property
    def decided_by(self) -> str:
        """Who decided, through which channel: what a record of the decision names."""
        return self.approved_by + (f" via {self.channel}" if self.channel else "")


# Approval tokens are minted by one machine's clock and checked by others (the workflow's, the service's): how
# far apart those clocks may be.
CLOCK_TOLERANCE_SECONDS = 2.0

# The refusals' codes: a service's problem code, the workflow's Update failure type. Distinct where the
# remedy differs: an expired decision needs a new one, a wrong audience another channel setting, an unknown
# key id a key this side has not been given (yet, during a rotation).
APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
APPROVAL_WRONG_AUDIENCE = "APPROVAL_WRONG_AUDIENCE"
APPROVAL_UNKNOWN_KEY = "APPROVAL_UNKNOWN_KEY"
APPROVAL_WRONG_REQUEST = "APPROVAL_WRONG_REQUEST"


class ApprovalInvalid(ValueError):
    """The token is missing, malformed, forged or bound to something else."""

    code = APPROVAL_REQUIRED


class ApprovalExpired(ApprovalInvalid):
    """The decision has expired, or was made after the operation's approval window closed."""

    code = APPROVAL_EXPIRED


class ApprovalWrongAudience(ApprovalInvalid):
    """The decision is for another service or tool source."""

    code = APPROVAL_WRONG_AUDIENCE


class ApprovalUnknownKey(ApprovalInvalid):
    """The token names a key id this side does not hold."""

    code = APPROVAL_UNKNOWN_KEY


class ApprovalWrongRequest(ApprovalInvalid):
    """The decision was given in another request (or names none): the workflow's refusal, never a service's."""

    code = APPROVAL_WRONG_REQUEST


_ALGORITHM = "EdDSA"


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
    """`verify_key` if it is a usable public key, or several separated by commas or whitespace (during a
    rotation); raises ValueError otherwise (for configuration checks)."""
    if not verify_key_set(verify_key):
        raise ValueError("the approval verify key is empty")
    return verify_key


@functools.lru_cache(maxsize=16)
def _public_key(verify_key: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(_unb64(verify_key.strip()))
    except ValueError as exc:
        raise ValueError("the approval verify key is not a base64url Ed25519 public key of 32 bytes") from exc


@functools.lru_cache(maxsize=16)
def key_id(verify_key: str) -> str:
    """The key id (`kid`) of a public key: its JWK thumbprint (RFC 7638), so a key pair names itself and no
    side configures ids by hand."""
    jwk = {
        "crv": "Ed25519",
        "kty": "OKP",
        "x": _b64(_public_key(verify_key).public_bytes(Encoding.Raw, PublicFormat.Raw)),
    }
    return _b64(hashlib.sha256(canonical_json(jwk).encode("ascii")).digest())


def verify_key_set(keys: str | Iterable[str] | None) -> dict[str, str]:
    """The public keys a worker or a service verifies decisions with, by key id. Several are valid at once
    during a rotation: a str may name several, separated by commas or whitespace. Raises ValueError for a key
    that is not an Ed25519 public key."""
    if keys is None:
        return {}
    listed = keys.replace(",", " ").split() if isinstance(keys, str) else [k.strip() for k in keys if k.strip()]
    return {key_id(key): key for key in listed}


def mint_approval_token(signing_key: str, claims: ApprovalClaims | PolicyClaims) -> str:
    """A compact JWS (a JWT) of `claims` (a person's or a policy's decision), signed with `signing_key`; its
    header names the key's id."""
    kid = key_id(verify_key_for(signing_key))
    payload = claims.model_dump(by_alias=True)
    # Claims at their defaults are left out, so a decision made where no policy is has the claims it always had
    # (an older verifier, which forbids claims it does not know, still reads it).
    for optional in ("roles", "grant", "granted_by", "request"):
        if optional in payload and not payload[optional]:
            del payload[optional]
    return jwt.encode(payload, _private_key(signing_key), algorithm=_ALGORITHM, headers={"kid": kid})


def read_approval_claims(token: str) -> ApprovalClaims:
    """The claims without checking the signature (to record a decision whose signature was verified, or to
    check its claims once it was)."""
    try:
        data: Any = jwt.decode(token, options={"verify_signature": False})
        return ApprovalClaims.model_validate(data)
    except (jwt.PyJWTError, ValueError, ValidationError) as exc:
        raise ApprovalInvalid("the approval token is malformed") from exc


def verify_token_signature(keys: Mapping[str, str], token: str | None) -> ApprovalClaims:
    """The token's claims once its signature is verified with the key its header names (`kid`) among `keys`
    (verify_key_set). Checks nothing else: check_approval_claims does, where the claims are judged."""
    data = _verified_payload(keys, token, ApprovalInvalid, ApprovalUnknownKey, "approval")
    try:
        return ApprovalClaims.model_validate(data)
    except ValidationError:
        raise ApprovalInvalid("the approval token is malformed") from None


def _verified_payload(
    keys: Mapping[str, str],
    token: str | None,
    invalid: type[ApprovalInvalid],
    unknown_key: type[ApprovalInvalid],
    what: str,
) -> Any:
    """The payload of a JWT whose signature verifies with the key its `kid` names among `keys`."""
    if not token:
        raise invalid(f"no {what} token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise invalid(f"the {what} token is malformed") from None
    if not keys:
        raise unknown_key(f"no {what} verify key is configured here, so no decision is taken")
    kid = header.get("kid")
    verify_key = keys.get(kid) if isinstance(kid, str) else None
    if verify_key is None:
        raise unknown_key(f"the {what} token is signed with a key this side does not hold (kid {kid!r})")
    options: Any = {"verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_aud": False}
    try:
        return jwt.decode(token, _public_key(verify_key), algorithms=[_ALGORITHM], options=options)
    except jwt.InvalidSignatureError:
        raise invalid(f"the {what} token's signature is not valid") from None
    except jwt.PyJWTError:
        raise invalid(f"the {what} token is malformed") from None


def check_approval_claims(
    claims: ApprovalClaims,
    *,
    now: float,
    audience: str,
    expected: Mapping[str, str],
    request: str | None = None,
) -> ApprovalClaims:
    """Deterministic (no key, no clock of its own): the decision is for `audience`, not expired at `now`, made
    within its approval window, every `expected` claim (user_id, tenant_id, operation_id, digest, decision)
    matches, and, when `request` is given (the workflow gives its id; a service knows no request), it was
    given in that request. Raises ApprovalInvalid (a subclass per distinct code) with a short reason."""
    if claims.audience != audience:
        raise ApprovalWrongAudience(f"the approval is for {claims.audience!r}, not for {audience!r}")
    # Before the clock: another request's decision is refused as such, expired or not.
    if request is not None and claims.request != request:
        if claims.request is None:
            raise ApprovalWrongRequest("the decision names no request it was given in; it must be signed again")
        raise ApprovalWrongRequest(f"the decision was given in request {claims.request!r}, not in this one")
    if claims.expires_at <= now:
        raise ApprovalExpired("the approval has expired")
    if claims.decide_by is not None and claims.approved_at >= claims.decide_by:
        raise ApprovalExpired("the decision was made after the operation's approval window closed")
    for name, value in expected.items():
        if getattr(claims, name) != value:
            if name == "decision":
                raise ApprovalInvalid(f"the token records a decision to {claims.decision}, not to {value}")
            raise ApprovalInvalid(f"the approval is for another {name.replace('_id', '').replace('_', ' ')}")
    return claims


def verify_approval_token(
    keys: Mapping[str, str], token: str | None, *, now: float, audience: str, expected: Mapping[str, str]
) -> ApprovalClaims:
    """What a service checks: the signature (with the key the token's `kid` names among `keys`), the
    audience, the expiry and every `expected` claim. Raises ApprovalInvalid (a subclass per distinct code)."""
    return check_approval_claims(verify_token_signature(keys, token), now=now, audience=audience, expected=expected)


# --- Decisions by policy (toolloop._core.policies decides them; docs/POLICIES.md) -----------------------------


class Deciders(BaseModel):
    """Who may decide an operation a policy asks people about, in a form every side checks without the policy
    itself: the requester, members of roles (in the requester's tenant), and how many distinct people must
    approve (2: four eyes, where the requester counts only as the first)."""

    model_config = ConfigDict(frozen=True)

    requester: bool = False
    roles: list[str] = Field(default_factory=list, max_length=20)
    approvals: int = Field(default=1, ge=1, le=2)

    def admits(self, requester: str, decider: str, roles: Iterable[str]) -> bool:
        """True if `decider` (holding `roles`) may decide an operation `requester` asked for. The requester is
        admitted as the requester only, whatever roles they hold: a write the policy leaves to managers is never
        decided by the manager who asked for it."""
        if decider == requester:
            return self.requester
        return bool(set(self.roles) & set(roles))

    def describe(self) -> str:
        who = (["the requester"] if self.requester else []) + [f"a {role}" for role in self.roles]
        text = " or ".join(who) or "nobody"
        return text if self.approvals == 1 else f"two people ({text}; the requester never second)"


def counted_approvers(deciders: Deciders, requester: str, approvals: Iterable[ApprovalClaims]) -> list[str]:
    """The people whose approvals count, in the order they decided: each admitted by `deciders`, each once,
    and the requester only as the first (never as the second of four eyes)."""
    people: list[str] = []
    for claims in sorted(approvals, key=lambda c: c.approved_at):
        if claims.decision != "approve" or claims.approved_by in people:
            continue
        if not deciders.admits(requester, claims.approved_by, claims.roles):
            continue
        if claims.approved_by == requester and people:
            continue
        people.append(claims.approved_by)
    return people


class PolicyClaims(BoundClaims):
    """What a policy's decision token claims: signed by the policy evaluator's own key (never the approval
    channel's, never a model worker's), bound like a person's to the audience, the actor, the operation and
    its digest, and naming the rules and the policy's version. `allow` is enough on its own; `ask` names the
    people (Deciders) whose approvals must come with it."""

    verdict: Literal["allow", "ask"]
    rules: list[str] = Field(max_length=50)
    policy_version: str = Field(max_length=100)
    deciders: Deciders | None = None
    decided_at: float = Field(alias="iat")
    expires_at: float = Field(alias="exp")
    # An allow that rests on a person's grant in this request (GrantClaims): who gave it.
    granted_by: str | None = None
    # The request's run (run_binding, as Temporal told the evaluator) the decision was made for: the workflow
    # takes no decision made for another run, under the same workflow id or not.
    request: str | None = None


POLICY_DECISION_REQUIRED = "POLICY_DECISION_REQUIRED"
POLICY_DECISION_INVALID = "POLICY_DECISION_INVALID"


class PolicyDecisionRequired(ApprovalInvalid):
    """This side decides writes by policy, and the write brings no policy decision."""

    code = POLICY_DECISION_REQUIRED


class PolicyDecisionInvalid(ApprovalInvalid):
    """The policy decision is forged or bound to something else: another key, digest, operation or actor, a
    rule or version this side does not know, or it has expired."""

    code = POLICY_DECISION_INVALID


def split_tokens(header: str | None) -> list[str]:
    """The decision tokens of one `X-Approval-Token` header: a policy's first, then people's, comma-separated
    (a JWT has no comma)."""
    return [part.strip() for part in (header or "").split(",") if part.strip()]


def join_tokens(tokens: Iterable[str]) -> str:
    return ",".join(tokens)


def read_policy_claims(token: str) -> PolicyClaims:
    """The claims without checking the signature (to record a decision whose signature was verified)."""
    try:
        return PolicyClaims.model_validate(jwt.decode(token, options={"verify_signature": False}))
    except (jwt.PyJWTError, ValueError, ValidationError) as exc:
        raise PolicyDecisionInvalid("the policy token is malformed") from exc


def verify_policy_token(
    keys: Mapping[str, str],
    token: str | None,
    *,
    now: float,
    audience: str,
    expected: Mapping[str, str],
    known_rules: Iterable[str] | None = None,
) -> PolicyClaims:
    """What a service checks of a policy's decision: the signature (with the policy keys), the audience, the
    expiry, every `expected` claim, and, when `known_rules` is given, that every rule it names is one of them.
    Raises PolicyDecisionInvalid (PolicyDecisionRequired without a token)."""
    if not token:
        raise PolicyDecisionRequired("this write needs a policy's decision, and none came with it")
    data = _verified_payload(keys, token, PolicyDecisionInvalid, PolicyDecisionInvalid, "policy")
    try:
        claims = PolicyClaims.model_validate(data)
    except ValidationError:
        raise PolicyDecisionInvalid("the policy token is malformed") from None
    if claims.audience != audience:
        raise PolicyDecisionInvalid(f"the policy decision is for {claims.audience!r}, not for {audience!r}")
    if claims.expires_at <= now:
        raise PolicyDecisionInvalid("the policy decision has expired")
    for name, value in expected.items():
        if getattr(claims, name) != value:
            raise PolicyDecisionInvalid(f"the policy decision is for another {name.replace('_id', '')}")
    if known_rules is not None:
        unknown = sorted(set(claims.rules) - set(known_rules))
        if unknown or not claims.rules:
            raise PolicyDecisionInvalid(f"the policy decision names a rule this side does not know: {unknown}")
    if claims.verdict == "ask" and claims.deciders is None:
        raise PolicyDecisionInvalid("the policy decision asks people but names none")
    return claims


def verify_write_decisions(
    approval_keys: Mapping[str, str],
    policy_keys: Mapping[str, str],
    header: str | None,
    *,
    now: float,
    audience: str,
    expected: Mapping[str, str],
    known_rules: Iterable[str] | None = None,
) -> float:
    """What a service checks of one write's `X-Approval-Token` (user_id, tenant_id, operation_id and digest
    `expected`); returns when the earliest decision it rests on expires. Raises ApprovalInvalid (a subclass per
    code).

    - Without policy keys: one approval, by the person the write acts for.
    - With policy keys: the policy's decision first. `allow` suffices; `ask` needs the approvals of the people
      it admits (Deciders), as many distinct ones as it names, the requester only as the first."""
    tokens = split_tokens(header)
    people_expected = {**expected, "decision": "approve"}
    if not policy_keys:
        if len(tokens) > 1:
            raise ApprovalInvalid("this service takes one approval per write")
        claims = verify_approval_token(
            approval_keys, tokens[0] if tokens else None, now=now, audience=audience, expected=people_expected
        )
        if claims.approved_by != claims.user_id:
            raise ApprovalInvalid("the approval was not made by the person the write acts for")
        return claims.expires_at
    policy = verify_policy_token(
        policy_keys,
        tokens[0] if tokens else None,
        now=now,
        audience=audience,
        expected=expected,
        known_rules=known_rules,
    )
    if policy.verdict == "allow":
        return policy.expires_at
    assert policy.deciders is not None
    approvals = [
        verify_approval_token(approval_keys, token, now=now, audience=audience, expected=people_expected)
        for token in tokens[1:]
    ]
    counted = counted_approvers(policy.deciders, expected["user_id"], approvals)
    if len(counted) < policy.deciders.approvals:
        raise ApprovalInvalid(f"the policy asks for {policy.deciders.describe()}; {len(counted)} approved")
    return min([policy.expires_at, *(a.expires_at for a in approvals if a.approved_by in counted)])
