"""Activity side (I/O): the policy evaluator. It runs on its own task queue, in the one process that holds the
policy's signing key (python worker.py --policy): never on a model worker. For one validated write it
evaluates the deployment's Cedar policy (toolloop._core.policies) and signs what the policy decided - allow,
or ask the people it names - bound to the write's audience, actor, operation and digest, like a person's
decision; a denial is not signed (nothing may be sent).

The policy files are read again for each decision, so a changed policy applies to the writes decided after
the change (an operation already waiting keeps the decision it was asked under). A changed file that does not
load denies every write until it is fixed: it never falls open."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from toolloop._core.approvals import (
    ApprovalInvalid,
    PolicyClaims,
    mint_approval_token,
    payload_digest,
    run_binding,
    verify_key_set,
    verify_token_signature,
)
from toolloop._core.contracts import PolicyDecision, PolicyInput, PolicyRecord
from toolloop._core.names import AGENT_WORKFLOW, DECIDE_BY_POLICY_ACTIVITY
from toolloop._core.policies import Policies, PolicyError, PolicyVerdict, WriteProposal

logger = logging.getLogger("toolloop.policy")

# A decision lives no longer than the request's deadline, and never longer than a day.
MAX_DECISION_SECONDS = 86_400.0


class PolicySource:
    """The policy set in two files, loaded again when they change. Loading fails at construction (the
    evaluator does not start) and, after a change, makes every decision a denial until the files load."""

    def __init__(self, policy_file: str | Path, schema_file: str | Path) -> None:
        self.policy_file = Path(policy_file)
        self.schema_file = Path(schema_file)
        self._loaded: tuple[bytes, bytes, Policies] | None = None
        # Decisions run in a thread pool: one load at a time, and each sees a whole policy set.
        self._lock = threading.Lock()
        self.current()

    def current(self) -> Policies:
        """The policy set as the files now hold it. Raises PolicyError if they no longer load."""
        with self._lock:
            try:
                texts = (self.policy_file.read_bytes(), self.schema_file.read_bytes())
            except OSError as exc:
                raise PolicyError(f"{self.policy_file}: cannot be read ({exc.__class__.__name__})") from None
            if self._loaded is None or texts != self._loaded[:2]:
                try:
                    decoded = [text.decode("utf-8") for text in texts]
                except UnicodeDecodeError:
                    raise PolicyError(f"{self.policy_file}: not UTF-8") from None
                # Built from the very bytes compared: the version names what is evaluated.
                policies = Policies(decoded[0], decoded[1], str(self.policy_file))
                self._loaded = (*texts, policies)
                logger.info("policy loaded", extra={"policy_version": policies.version})
            return self._loaded[2]


class PolicyActivities:
    """`approval_verify_key`: the approval channel's public keys, to honour the grants people give with their
    approvals (docs/POLICIES.md, "Grants"); None: grants are not honoured."""

    def __init__(
        self, source: PolicySource, signing_key: str, approval_verify_key: str | Iterable[str] | None = None
    ) -> None:
        self._source = source
        self._signing_key = signing_key
        self._approval_keys: Mapping[str, str] = verify_key_set(approval_verify_key)

    @activity.defn(name=DECIDE_BY_POLICY_ACTIVITY)
    def decide_by_policy(self, inp: PolicyInput) -> PolicyDecision:
        # The evaluator signs what it evaluated: the digest must be the digest of these very arguments.
        if payload_digest(inp.target or inp.tool, inp.arguments) != inp.digest:
            raise ApplicationError("the digest is not the arguments' digest", non_retryable=True)
        if not inp.audience:
            raise ApplicationError("the write names no audience to sign its decision for", non_retryable=True)
        if activity.info().workflow_type != AGENT_WORKFLOW:
            raise ApplicationError("the policy decides only a request's writes", non_retryable=True)
        try:
            policies = self._source.current()
        except (PolicyError, OSError) as exc:
            logger.error("the policy does not load; every write is denied", extra={"why": str(exc)})
            record = PolicyRecord(verdict="deny", reason="the policy does not load")
            return PolicyDecision(record=record)
        proposal = WriteProposal(
            tool=inp.tool,
            tenant_id=inp.actor.tenant_id,
            user_id=inp.actor.user_id,
            roles=(),  # the requester's roles are not known here: rules about requesters name them by id
            arguments=inp.arguments,
            facts=inp.facts,
        )
        verdict = policies.evaluate(proposal)
        grant, granted_by = self._granted(inp, verdict) if verdict.verdict == "ask" else (None, None)
        record = PolicyRecord(
            verdict="allow" if granted_by is not None else verdict.verdict,
            rules=verdict.rules,
            version=verdict.version,
            deciders=None if granted_by is not None else verdict.deciders,
            reason=verdict.reason,
            granted_by=granted_by,
        )
        if record.verdict == "deny":
            return PolicyDecision(record=record)
        now = time.time()
        claims = PolicyClaims(
            request=_this_run(),
            audience=inp.audience,
            user_id=inp.actor.user_id,
            tenant_id=inp.actor.tenant_id,
            operation_id=inp.operation_id,
            digest=inp.digest,
            verdict=record.verdict,
            rules=record.rules,
            policy_version=record.version,
            deciders=record.deciders,
            decided_at=now,
            expires_at=min(inp.expires_at.timestamp(), now + MAX_DECISION_SECONDS),
            granted_by=granted_by,
        )
        return PolicyDecision(record=record, token=mint_approval_token(self._signing_key, claims), grant=grant)

    def _granted(self, inp: PolicyInput, verdict: PolicyVerdict) -> tuple[int | None, str | None]:
        """The first grant of this request that covers the write (its index, and who gave it), if the policy would
        ask its giver about it and no second person is needed; (None, None) otherwise."""
        deciders = verdict.deciders
        if deciders is None or deciders.approvals != 1 or not self._approval_keys:
            return None, None
        # The request is Temporal's word for whose activity this is, never the workflow's input.
        request = _this_run()
        for index, (token, used) in enumerate(zip(inp.grants, inp.grant_uses, strict=False)):
            try:
                claims = verify_token_signature(self._approval_keys, token)
            except ApprovalInvalid:
                continue
            grant = claims.grant
            if grant is None or claims.decision != "approve" or grant.request != request or used >= grant.uses:
                continue
            if (claims.user_id, claims.tenant_id) != (inp.actor.user_id, inp.actor.tenant_id):
                continue
            if grant.covers(inp.tool, inp.arguments) and deciders.admits(
                inp.actor.user_id, claims.approved_by, claims.roles
            ):
                return index, claims.approved_by
        return None, None


def _this_run() -> str:
    """The run this activity serves, as Temporal says (run_binding): a workflow id may be used again."""
    info = activity.info()
    # decide() answers only activities of AgentWorkflow runs, which always have both.
    return run_binding(info.workflow_id or "", info.workflow_run_id or "")
