"""I/O: the idempotency kit - the service's half of the write protocol, as FastAPI pieces over a ledger.

Order of checks for a write: identity -> Idempotency-Key (400) -> body size (413) -> the body (422, where the
endpoint parses it) -> purge expired records -> a completed record (another payload: 422; the same payload:
the stored reply, `Idempotent-Replayed: true`) -> an attempt in flight (409) -> the approval token (403) ->
claim -> the effect and its record in one transaction, which commits only while the approval has not expired
and the claim is still the attempt's (both checked again last inside it) -> release the claim.
`GET /operations/{operation_id}` answers what became of a key, and declares how long keys are kept.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from toolloop._core.approvals import (
    APPROVAL_EXPIRED,
    CLOCK_TOLERANCE_SECONDS,
    ApprovalInvalid,
    http_subject,
    payload_digest,
    verify_key_set,
    verify_write_decisions,
)
from toolloop._core.problems import (
    ACTOR_REQUIRED,
    APPROVAL_REQUIRED,
    BODY_TOO_LARGE,
    IN_PROGRESS,
    INVALID_BODY,
    KEY_REQUIRED,
    KEY_REUSED,
    PROBLEM_MEDIA_TYPE,
    describe_errors,
)
from toolloop.servicekit._ledger import (
    ClaimLost,
    ClaimTaken,
    CommitTooLate,
    Hold,
    Ledger,
    LedgerKey,
    LedgerRecord,
    no_hold,
)

OPERATION_ID = r"^[A-Za-z0-9_-]{1,100}$"
CLAIM_LEASE_SECONDS = 30.0
MAX_BODY_BYTES = 16_384

# The kit's problem codes are the write protocol's, written once (toolloop/_core/problems.py, imported above)
# and read by toolloop's HTTP write contract.
# A token refused for a reason of its own (each 403, toolloop._core.approvals' codes): APPROVAL_EXPIRED,
# APPROVAL_WRONG_AUDIENCE (for another service), APPROVAL_UNKNOWN_KEY (a key id this service does not hold).
# Any other fault (none, forged, bound to something else) is APPROVAL_REQUIRED.

# The request-state flag a committed write sets (request.state.idempotency_committed), for middleware that
# acts after the effect is stored (logging, the demo's after-commit faults).
COMMITTED_FLAG = "idempotency_committed"

B = TypeVar("B", bound=BaseModel)


class KitProblem(Exception):
    """An answer the service means to give as application/problem+json: status, a machine-readable code, a
    detail safe to show (field names and rules, never input values), and extension members."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {
            "type": "about:blank",
            "title": HTTPStatus(self.status).phrase,
            "status": self.status,
            "code": self.code,
            "detail": self.detail,
            **self.extra,
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers, media_type=PROBLEM_MEDIA_TYPE)


class Refusal(KitProblem):
    """A definite business "no" that an effect decides before it writes anything (stale version, not enough
    stock): stored under the key like a success, so a retry with the same key gets the same answer."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        if not 400 <= status < 500:
            raise ValueError("a refusal is a 4xx answer")
        super().__init__(status, code, detail, extra=extra)


@dataclass(frozen=True)
class KitActor:
    """Whom a request acts for, as the service establishes it (never from the body)."""

    tenant_id: str
    user_id: str


async def insecure_actor_from_headers(
    x_actor_user: str | None = Header(default=None),
    x_actor_tenant: str | None = Header(default=None),
) -> KitActor:
    """INSECURE, for local demos and tests only: believes the X-Actor-User and X-Actor-Tenant headers (what
    toolloop's HTTP sources send by default) from anyone who can reach the service, so anyone can act as
    anyone. A real service passes as `actor` a dependency that takes the caller from a credential it verifies
    (a bearer token, say: docs/SERVICEKIT.md)."""
    if not x_actor_user or not x_actor_tenant:
        raise KitProblem(401, ACTOR_REQUIRED, "X-Actor-User and X-Actor-Tenant headers are required")
    return KitActor(tenant_id=x_actor_tenant, user_id=x_actor_user)


class OperationState(BaseModel):
    operation_id: str
    state: Literal["completed", "in_progress", "not_found"]
    status_code: int | None
    body: dict[str, Any] | None
    # Declared on every answer: after this long a "not_found" no longer proves the key was never used.
    retention_seconds: float


_URL_ESCAPES = re.compile(r"%(?:3F|23|5C)", re.IGNORECASE)


def _finite_float(text: str) -> float:
    # 1e400 is no NaN literal, yet reads as infinity, which no digest can be taken of (a 500 before).
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    replayed: bool = False
    # True when this attempt committed the record now.
    committed: bool = False

    def response(self) -> JSONResponse:
        headers = {"Idempotent-Replayed": "true"} if self.replayed else None
        media_type = PROBLEM_MEDIA_TYPE if self.status >= 400 else "application/json"
        return JSONResponse(self.body, status_code=self.status, headers=headers, media_type=media_type)


class IdempotentWrite:
    """One write attempt, as an endpoint receives it (`write: IdempotentWrite = Depends(kit.write)`): who,
    under which key, with which approval, and the body exactly as received."""

    def __init__(
        self,
        kit: IdempotencyKit,
        request: Request,
        actor: KitActor,
        operation_id: str,
        approval_token: str | None,
        raw_body: bytes,
    ) -> None:
        self.kit = kit
        self.request = request
        self.actor = actor
        self.operation_id = operation_id
        self.approval_token = approval_token
        self.raw_body = raw_body
        self.method = request.method
        # Decoded as the client digests it: the path is decoded already, but url.path escapes ? # and \ again
        # (an id holding one had another digest). Only those are undone: a literal %41 stays %41.
        self.path = _URL_ESCAPES.sub(lambda m: urllib.parse.unquote(m.group()), request.url.path)
        self._json: dict[str, Any] | None = None

    @property
    def key(self) -> LedgerKey:
        return LedgerKey(self.actor.tenant_id, self.actor.user_id, self.operation_id)

    def json(self) -> dict[str, Any]:
        """The body as received (what the digest is taken over); 422 unless it is a JSON object."""
        if self._json is None:
            try:
                data = json.loads(self.raw_body, parse_constant=_reject_constant, parse_float=_finite_float)
            except (ValueError, RecursionError):
                data = None
            if not isinstance(data, dict):
                raise KitProblem(422, INVALID_BODY, "the body must be a JSON object")
            self._json = data
        return self._json

    def parse(self, model: type[B]) -> B:
        """The body validated strictly by `model` (no coercion: "5" is not 5); 422 with field hints otherwise."""
        self.json()
        try:
            return model.model_validate_json(self.raw_body, strict=True)
        except ValidationError as exc:
            raise KitProblem(422, INVALID_BODY, describe_errors(exc.errors(include_input=False))) from None

    @property
    def digest(self) -> str:
        """What the approval must be bound to: this method and path, and the body as received."""
        return payload_digest(http_subject(self.method, self.path), self.json())

    async def commit(self, effect: Callable[[Any], Mapping[str, Any]], status: int = 201) -> JSONResponse:
        """Run `effect(transaction)` once for this key, with its record in the same transaction, and answer
        with its body (`status`), or with the stored reply of an earlier attempt. Raise Refusal in the
        effect for a definite "no" before anything is written."""
        self.json()  # a body that is not an object never reaches the ledger
        reply = await run_in_threadpool(self.kit.run, self, effect, status)
        if reply.committed:
            setattr(self.request.state, COMMITTED_FLAG, True)
        return reply.response()


class IdempotencyKit:
    """Store keys, claim them atomically, answer replays, expose status and verify approval tokens:

        kit = IdempotencyKit(SqliteLedger("app.db"), approval_verify_key=KEY, audience="notes", actor=caller)
        kit.install(app)            # problem+json answers and GET /operations/{operation_id}

        @app.post("/notes", status_code=201)
        async def add_note(write: IdempotentWrite = Depends(kit.write)) -> Response:
            note = write.parse(NoteBody)
            return await write.commit(lambda tx: insert_note(tx, write.actor, note))

    `approval_verify_key` is the approval channel's public key, or several (a list, or one string separated by
    commas) during a rotation: a token is verified with the one its key id names. Without one every write is
    refused (403). `audience` is this service's own name for itself, the `aud` a token must carry (toolloop's
    tool source for this service has it as its audience, by default its name): a token for another service
    is refused (403 APPROVAL_WRONG_AUDIENCE). `retention_seconds` is how long a
    completed key is kept (declared on every status answer); `hold` and `after_claim` are failure-injection
    hooks for a test bed. `actor` is required: the FastAPI dependency that answers whom a request acts for
    (a KitActor), from a credential the service verifies; `insecure_actor_from_headers` is for local demos.

    `policy_verify_key` (the policy evaluator's public key, or several) makes the service decide writes by
    policy (docs/POLICIES.md): each write then needs the policy's signed decision first in `X-Approval-Token`
    (403 POLICY_DECISION_REQUIRED without one, POLICY_DECISION_INVALID for a forged or misbound one) and, for
    a decision that asks people, their approvals after it, comma-separated. `policy_rules`, the rule ids of the
    deployment's policy (policy_rule_ids reads them), makes a decision naming any other rule invalid; a
    callable is asked at each write (PolicyRuleIds follows a policy file as it changes)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        approval_verify_key: str | Iterable[str] | None,
        audience: str,
        retention_seconds: float = 86_400.0,
        claim_lease_seconds: float = CLAIM_LEASE_SECONDS,
        actor: Callable[..., Any],
        max_body_bytes: int = MAX_BODY_BYTES,
        status_path: str = "/operations/{operation_id}",
        hold: Hold = no_hold,
        after_claim: Callable[[IdempotentWrite], None] | None = None,
        policy_verify_key: str | Iterable[str] | None = None,
        policy_rules: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    ) -> None:
        if retention_seconds <= 0 or claim_lease_seconds <= 0:
            raise ValueError("retention_seconds and claim_lease_seconds must be positive")
        if not audience:
            raise ValueError("audience must name this service (the aud its approval tokens carry)")
        self.ledger = ledger
        self.verify_keys = verify_key_set(approval_verify_key)
        self.policy_keys = verify_key_set(policy_verify_key)
        # A callable is asked each time (a policy file the service follows as it changes).
        self.policy_rules = policy_rules if callable(policy_rules) or policy_rules is None else frozenset(policy_rules)
        self.audience = audience
        self.retention_seconds = retention_seconds
        self.claim_lease_seconds = claim_lease_seconds
        self.max_body_bytes = max_body_bytes
        self.status_path = status_path
        self.hold = hold
        self.after_claim = after_claim
        self.actor = actor
        self.write = self._write_dependency(actor)
        ledger.init()

    # --- FastAPI pieces ---------------------------------------------------------------------------------

    def _write_dependency(self, actor_dependency: Callable[..., Any]) -> Callable[..., Any]:
        kit = self

        async def idempotent_write(
            request: Request,
            actor: KitActor = Depends(actor_dependency),
            idempotency_key: str | None = Header(default=None),
            # A policy's decision and up to two people's, comma-separated.
            x_approval_token: str | None = Header(default=None, max_length=8192),
        ) -> IdempotentWrite:
            if not idempotency_key:
                raise KitProblem(400, KEY_REQUIRED, "an Idempotency-Key header is required")
            if not re.fullmatch(OPERATION_ID, idempotency_key):
                raise KitProblem(400, KEY_REQUIRED, "Idempotency-Key must be 1-100 characters of A-Z a-z 0-9 _ -")
            raw = await request.body()
            if len(raw) > kit.max_body_bytes:
                raise KitProblem(413, BODY_TOO_LARGE, f"the body may be at most {kit.max_body_bytes} bytes")
            return IdempotentWrite(kit, request, actor, idempotency_key, x_approval_token, raw)

        return idempotent_write

    def router(self) -> APIRouter:
        """The status endpoint."""
        kit = self
        router = APIRouter()

        async def operation_status(
            operation_id: str = PathParam(pattern=OPERATION_ID),
            actor: KitActor = Depends(kit.actor),
        ) -> OperationState:
            key = LedgerKey(actor.tenant_id, actor.user_id, operation_id)
            return await run_in_threadpool(kit.status, key)

        router.add_api_route(self.status_path, operation_status, methods=["GET"], response_model=OperationState)
        return router

    def install(self, app: FastAPI) -> None:
        """problem+json for the kit's answers, and the status endpoint."""

        async def on_problem(_: Request, exc: Exception) -> JSONResponse:
            assert isinstance(exc, KitProblem)
            return exc.response()

        app.add_exception_handler(KitProblem, on_problem)
        app.include_router(self.router())

    # --- The protocol (blocking: runs in a worker thread) --------------------------------------------

    def _not_before(self, now: float) -> float:
        return now - self.retention_seconds

    def status(self, key: LedgerKey) -> OperationState:
        now = time.time()
        found = self.ledger.lookup(key, now, self._not_before(now))
        if isinstance(found, LedgerRecord):
            return OperationState(
                operation_id=key.operation_id,
                state="completed",
                status_code=found.status,
                body=found.body,
                retention_seconds=self.retention_seconds,
            )
        return OperationState(
            operation_id=key.operation_id,
            state=found,
            status_code=None,
            body=None,
            retention_seconds=self.retention_seconds,
        )

    def run(self, write: IdempotentWrite, effect: Callable[[Any], Mapping[str, Any]], status: int = 201) -> Reply:
        digest = write.digest
        key = write.key
        now = time.time()
        not_before = self._not_before(now)
        self.ledger.purge(not_before)
        found = self.ledger.lookup(key, now, not_before)
        if isinstance(found, LedgerRecord):
            # Only a caller holding the approval a fresh write would need reads the stored reply (one that has
            # expired since still names who may: a replay makes nothing). Anyone else learns nothing, not even
            # that the key exists.
            self._check_approval(write, digest, _NO_EXPIRY)
            return _replay(found, digest)
        # As at the commit (below): nothing starts that could not commit, with the clocks' tolerance.
        expires_at = self._check_approval(write, digest, now + CLOCK_TOLERANCE_SECONDS)
        if expires_at > now + self.retention_seconds:
            # Purged before the approval expires, the key would be free again for the same token: a second effect.
            raise KitProblem(
                403,
                APPROVAL_REQUIRED,
                f"the approval lives longer than this service's retention of operation ids "
                f"({self.retention_seconds:g} s); ask for an approval that expires sooner",
            )
        if found == "in_progress":
            raise _in_progress()
        try:
            claimed = self.ledger.claim(key, now, not_before, self.claim_lease_seconds, self.hold)
        except ClaimTaken:
            raise _in_progress() from None
        if isinstance(claimed, LedgerRecord):  # another attempt finished between the lookup and the claim
            return _replay(claimed, digest)
        # The workflow says "not done" once the expiry has passed by its own clock and the status says not_found,
        # and admits approvals that end up to the tolerance after its deadline; this service's clock may run
        # behind the workflow's. So the tolerance leans towards refusing: nothing commits from that long before.
        commit_by = expires_at - CLOCK_TOLERANCE_SECONDS
        try:
            if self.after_claim is not None:
                self.after_claim(write)
            record, made = self.ledger.complete(
                key,
                digest,
                _stored(effect, status),
                time.time(),
                not_before,
                self.hold,
                claim_id=claimed,
                commit_by=commit_by,
            )
        except CommitTooLate:
            expired = "the approval expired before the write could be committed"
            raise KitProblem(403, APPROVAL_EXPIRED, expired) from None
        except ClaimLost:
            # Its lease ran out and another attempt holds the key now: that one decides; ask again.
            taken = "another attempt took this Idempotency-Key over before this one could commit"
            raise KitProblem(409, IN_PROGRESS, taken) from None
        finally:
            self.ledger.release(key, claimed)
        return Reply(record.status, record.body, committed=True) if made else _replay(record, digest)

    def _check_approval(self, write: IdempotentWrite, digest: str, now: float) -> float:
        """When the decisions the write rests on expire (the earliest), once they verify."""
        if not self.verify_keys and not self.policy_keys:
            raise KitProblem(403, APPROVAL_REQUIRED, "this service has no approval key configured")
        expected = {
            "user_id": write.actor.user_id,
            "tenant_id": write.actor.tenant_id,
            "operation_id": write.operation_id,
            "digest": digest,
        }
        try:
            return verify_write_decisions(
                self.verify_keys,
                self.policy_keys,
                write.approval_token,
                now=now,
                audience=self.audience,
                expected=expected,
                known_rules=self.policy_rules() if callable(self.policy_rules) else self.policy_rules,
            )
        except ApprovalInvalid as exc:
            # The reasons are our own short sentences ("the approval has expired", ...); the code says which.
            raise KitProblem(403, exc.code, str(exc)) from None


# A replay checks everything an approval binds but its expiry.
_NO_EXPIRY = float("-inf")


def _in_progress() -> KitProblem:
    return KitProblem(409, IN_PROGRESS, "an attempt with this Idempotency-Key is still in progress")


def _replay(record: LedgerRecord, digest: str) -> Reply:
    if record.digest != digest:
        raise KitProblem(422, KEY_REUSED, "this Idempotency-Key was already used with a different payload")
    return Reply(record.status, record.body, replayed=True)


def _stored(effect: Callable[[Any], Mapping[str, Any]], status: int) -> Callable[[Any], tuple[int, dict[str, Any]]]:
    """The effect as the ledger stores it: `status` and its body, or a definite refusal."""

    def run(tx: Any) -> tuple[int, dict[str, Any]]:
        # A savepoint around the effect: a refusal is recorded, but nothing the effect wrote before it stays.
        tx.execute("SAVEPOINT kit_effect")
        try:
            body = dict(effect(tx))
        except Refusal as refusal:
            tx.execute("ROLLBACK TO SAVEPOINT kit_effect")
            return refusal.status, refusal.body()
        tx.execute("RELEASE SAVEPOINT kit_effect")
        return status, body

    return run
