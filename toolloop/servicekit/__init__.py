"""The idempotency kit: the service's half of toolloop's write protocol, for a user's own FastAPI service.

It stores keys, claims them atomically, answers replays, exposes status and verifies approval tokens:
- a unique (actor, Idempotency-Key), written in the same transaction as the effect;
- a claim with a lease: a concurrent attempt with the same key gets 409;
- the same key and payload: the stored reply with `Idempotent-Replayed: true`; another payload: 422;
- no key: 400;
- `GET /operations/{operation_id}`: completed (with the stored reply), in progress or not found, and the
  retention, declared on every answer;
- the approval token (an EdDSA JWT from toolloop's trusted approval channel, verified with the key its `kid`
  names among the kit's, for the kit's own `audience`) bound to the actor, the key, the method, the path and
  the body as received - the service needs no tool names and no argument models. Refused: 403
  APPROVAL_EXPIRED, APPROVAL_WRONG_AUDIENCE, APPROVAL_UNKNOWN_KEY, else APPROVAL_REQUIRED.

Whom a request acts for is the service's to establish: `actor=` is required, a dependency that takes the caller
from a credential the service verifies (docs/SERVICEKIT.md); `insecure_actor_from_headers` believes anyone's
headers and is for local demos only.

Storage: SqlLedger, one algorithm on SQLite (SqliteLedger) or PostgreSQL (PostgresLedger, pooled): the service's own
database, so effects and records commit together.
"""

from typing import TYPE_CHECKING

from toolloop._core.approvals import (
    APPROVAL_EXPIRED,
    APPROVAL_UNKNOWN_KEY,
    APPROVAL_WRONG_AUDIENCE,
    POLICY_DECISION_INVALID,
    POLICY_DECISION_REQUIRED,
    check_verify_key,
)
from toolloop._core.problems import (
    APPROVAL_REQUIRED,
    IN_PROGRESS,
    INVALID_BODY,
    KEY_REQUIRED,
    KEY_REUSED,
    PROBLEM_MEDIA_TYPE,
    describe_errors,
)
from toolloop.servicekit._holds import FileHolds, reached
from toolloop.servicekit._kit import (
    COMMITTED_FLAG,
    MAX_BODY_BYTES,
    IdempotencyKit,
    IdempotentWrite,
    KitActor,
    KitProblem,
    OperationState,
    Refusal,
    insecure_actor_from_headers,
)
from toolloop.servicekit._ledger import (
    ClaimLost,
    ClaimTaken,
    CommitTooLate,
    Hold,
    HoldPoint,
    Ledger,
    LedgerKey,
    LedgerRecord,
    no_hold,
)
from toolloop.servicekit._sql import SqlLedger
from toolloop.servicekit._sqlite import SqliteLedger

if TYPE_CHECKING:
    from toolloop._core.policies import PolicyRuleIds, policy_rule_ids
    from toolloop.servicekit._postgres import PostgresLedger

__all__ = [
    "IdempotencyKit",
    "IdempotentWrite",
    "KitActor",
    "KitProblem",
    "Refusal",
    "OperationState",
    "insecure_actor_from_headers",
    "describe_errors",
    "check_verify_key",
    "Ledger",
    "LedgerKey",
    "LedgerRecord",
    "ClaimTaken",
    "ClaimLost",
    "CommitTooLate",
    "SqlLedger",
    "SqliteLedger",
    "PostgresLedger",
    "Hold",
    "HoldPoint",
    "FileHolds",
    "reached",
    "no_hold",
    "PROBLEM_MEDIA_TYPE",
    "MAX_BODY_BYTES",
    "COMMITTED_FLAG",
    "KEY_REQUIRED",
    "KEY_REUSED",
    "IN_PROGRESS",
    "APPROVAL_REQUIRED",
    "APPROVAL_EXPIRED",
    "APPROVAL_WRONG_AUDIENCE",
    "APPROVAL_UNKNOWN_KEY",
    "POLICY_DECISION_REQUIRED",
    "POLICY_DECISION_INVALID",
    "policy_rule_ids",
    "PolicyRuleIds",
    "INVALID_BODY",
]


if not TYPE_CHECKING:  # type checkers see the import above, and still flag a name that does not exist

    def __getattr__(name: str) -> object:
        # The PostgreSQL ledger imports psycopg: a service on SQLite needs neither installed nor imported.
        if name == "PostgresLedger":
            from toolloop.servicekit._postgres import PostgresLedger

            return PostgresLedger
        # Reading a Cedar policy's rules imports cedarpy: only a service that checks policy decisions needs it.
        if name in ("policy_rule_ids", "PolicyRuleIds"):
            from toolloop._core import policies

            return getattr(policies, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
