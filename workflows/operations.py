"""Workflow (deterministic): the operation state machine - the workflow's half of the write protocol of
DESIGN.md, for one request's side-effecting calls (the service's half is the idempotency kit,
toolloop.servicekit).

    validated -> awaiting_approval -> approved -> sent -> completed -> verified
                      |                            |
               expired / denied                 unknown -> status -> completed | not_found -> resent (same key)
                                                                    | unavailable -> stays unknown

Temporal never resends a write on its own (one attempt per activity): every resend is decided here,
after the service's status said the operation is not there, and always with the same operation id.
The request's deadline bounds everything: the approval wait, every send (an approval token never outlives
it, and the service checks the token again at commit), the status resolution and the read-back (these
two get `settle_seconds` past it, so a write in flight at the deadline is still resolved before the run
reports). "Not done" is said only after a definite refusal, a refused connection, or a status answer of
not found that no earlier attempt can still overtake.

A cancelled request (the Temporal run's cancellation) sends nothing more and takes no more decisions: an
operation waiting for approval ends unsent, an attempt in flight is waited for (never abandoned), and an
unclear one is settled by the status; since its approval may still be valid, a status of not found then
leaves it unknown rather than not done."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from toolloop._core.approvals import (
        CLOCK_TOLERANCE_SECONDS,
        ApprovalInvalid,
        GrantClaims,
        PolicyClaims,
        approval_wait_summary,
        check_approval_claims,
        counted_approvers,
        derive_operation_id,
        join_tokens,
        payload_digest,
        read_approval_claims,
        read_policy_claims,
        run_binding,
        short_operation_id,
        verify_key_set,
        verify_policy_token,
    )
    from toolloop._core.codes import ErrorType, ResultCode
    from toolloop._core.contracts import (
        LONGEST_DEADLINE_SECONDS,
        Actor,
        ApprovalDecision,
        ApprovalRecord,
        ApprovalRequest,
        CheckedCall,
        Limits,
        OperationQuery,
        OperationRecord,
        OperationState,
        PolicyDecision,
        PolicyFact,
        PolicyInput,
        PolicyRecord,
        ReadBackInput,
        StatusCheck,
        ThreadContext,
        ThreadOperation,
        ToolCallResult,
        WriteInput,
        WriteOutcome,
        approval_record,
        error_output,
        may_decide,
        verified_write_output,
    )
    from toolloop._core.facts import Read, policy_facts, unchanged_by
    from toolloop._core.names import (
        DECIDE_BY_POLICY_ACTIVITY,
        EXECUTE_WRITE_ACTIVITY,
        QUERY_OPERATION_STATUS_ACTIVITY,
        READ_BACK_ACTIVITY,
    )
    from toolloop._core.registry import Evidence, OperationStatus
    from toolloop._core.threads import earlier_operations
    from toolloop._temporal.search_attributes import DECIDERS_KEY, POLICY_RULES_KEY

from toolloop.workflows.narration import Narrator
from toolloop.workflows.retries import io_retry_policy

_ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
# A cancelled request waits for its attempts, status queries and read-backs to finish: an abandoned attempt
# could still take effect unseen.
_FINISH = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
_MIN_TIMEOUT = timedelta(seconds=1)
# Runs from before an earlier message's attempt that may still commit kept its write unknown go on as they did
# (they asked for a new approval): their histories replay (tests/histories/recorded_before).
_EARLIER_MAY_COMMIT = "earlier-attempt-may-still-commit"
# Runs from before a refused resend after an unclear attempt stayed unknown recorded it as not done; they replay.
_REFUSED_AFTER_DOUBT = "a-refused-resend-after-an-unclear-attempt-is-unknown"
# Runs from before policy decisions named the run (not only the workflow id) keep checking the workflow id.
_RUN_BOUND = "policy-decisions-name-the-run"


def _this_request() -> str:
    """What a decision given in this request names (approvals.run_binding): its workflow id and its first run,
    which a reset keeps and a new start under the same workflow id does not."""
    info = workflow.info()
    return run_binding(info.workflow_id, info.first_execution_run_id)


class OperationStateMachine:
    def __init__(
        self,
        actor: Actor,
        limits: Limits,
        deadline: datetime,
        set_phase: Callable[[str], None],
        narrator: Narrator | None = None,
        no_decisions: str | None = None,
        *,
        thread: ThreadContext | None = None,
    ) -> None:
        self._actor = actor
        # A thread's message: operation ids are the thread's (the same payload in the same thread is the same
        # operation), and what earlier messages did with one is known (the newest record of each).
        self._scope = thread.scope if thread is not None else None
        self._earlier: dict[str, ThreadOperation] = earlier_operations(thread)
        self._limits = limits
        self._deadline = deadline
        # Why this request takes no decisions at all (its input tried to bring trust); None: it takes them.
        self._no_decisions = no_decisions
        # The token whose signature the worker's trust interceptor has just checked with the worker's own keys
        # (toolloop._temporal.trust), and its refusal (code, reason) if it did not verify, for the validator
        # that runs right after it: a decision it did not check is refused, so a worker without the interceptor
        # takes no decisions (fail closed).
        self._signature: tuple[str | None, tuple[str, str] | None] | None = None
        self._set_phase = set_phase
        self._narrator = narrator
        self.ledger: dict[str, OperationRecord] = {}
        # Kept out of the ledger: queries and results never show decision tokens. Per operation, the people's
        # decisions (two for four eyes) and the policy's.
        self._tokens: dict[str, list[str]] = {}
        self._policy_tokens: dict[str, str] = {}
        # The worker's policy evaluator (ModelTurnResult.policy_task_queue): set, each write is decided there
        # first; None, every write asks its requester.
        self.policy_task_queue: str | None = None
        # ...and its public keys, from the same turn's result: what a policy decision must verify with.
        self.policy_verify_key: str | None = None
        # This request's successful reads, which a write's policy facts are taken from (only with a policy).
        self.reads: list[Read] = []
        # Per write sent: its policy facts (what it may change, for the writes after it; none: anything).
        self._facts_of: dict[str, list[PolicyFact]] = {}
        # Grants people gave with their approvals in this request: [token, how many writes it has approved since].
        self._grants: list[tuple[str, GrantClaims, list[int]]] = []
        # What the search attributes say now (with a policy): who may decide what waits, which rules decided.
        self._published: tuple[list[str], list[str]] = ([], [])
        # Per payload of a tool whose identical calls are distinct: how many proposals of it came so far.
        self._occurrences: dict[str, int] = {}
        self._arguments: dict[str, dict[str, Any]] = {}
        # Evidence an attempt read back right after it completed, for the read-back step to use.
        self._read_in_attempt: dict[str, Evidence] = {}
        # Calls whose output is what their completing attempt establishes alone (write_output_in_attempt): a model
        # turn refers to it rather than storing it again.
        self._output_in_attempt: set[str] = set()
        # Per operation, the round whose next model turn takes its output from the worker's
        # output store.
        self._round_of: dict[str, int] = {}

    @staticmethod
    def cancel_requested() -> bool:
        """The request was cancelled: nothing more is sent, no more decisions are taken."""
        return workflow.cancellation_reason() is not None

    @staticmethod
    def absorb_cancel(error: BaseException) -> None:
        """Go on after the cancellation arrived at an await (re-raise anything else): what the request
        does once cancelled is decided at each step, by cancel_requested()."""
        if not OperationStateMachine.cancel_requested():
            raise error
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()

    # --- Decisions (the Temporal Update's validator and handler, and what the channel is shown) ----

    def approval_request(self, operation_id: str) -> ApprovalRequest | None:
        op = self.ledger.get(operation_id)
        if op is None:
            return None
        return ApprovalRequest(
            operation_id=op.operation_id,
            tool=op.tool,
            arguments=dict(self._arguments[op.operation_id]),
            digest=op.digest,
            state=op.state,
            actor=self._actor,
            approval_expires_at=op.approval_expires_at,
            deadline=op.deadline,
            target=op.target,
            audience=op.audience,
            policy=op.policy.model_copy(deep=True) if op.policy is not None else None,
            run_id=workflow.info().first_execution_run_id,
        )

    def read_done(self, call: CheckedCall, output: dict[str, Any]) -> None:
        """A read of this request answered: kept for the facts a later write's policy decides on."""
        if self.policy_task_queue is not None and call.arguments is not None and output.get("ok") is True:
            self.reads.append(Read(call.name, call.arguments, output))

    def signature_checked(self, token: str | None, refusal: tuple[str, str] | None) -> None:
        """The worker's trust interceptor checked `token`'s signature with the worker's configured keys: None if
        it verified, else (code, reason)."""
        self._signature = (token, refusal)

    def pending_approvals(self) -> list[ApprovalRequest]:
        requests = (self.approval_request(op_id) for op_id in self.awaiting_approval())
        return [r for r in requests if r is not None]

    def awaiting_approval(self) -> list[str]:
        """The operations waiting for approval, in the order they were proposed."""
        return [op_id for op_id, op in self.ledger.items() if op.state == "awaiting_approval"]

    def validate_decision(self, decision: ApprovalDecision) -> None:
        """Runs before the update is accepted; raising rejects it and nothing is recorded. An approval and
        a rejection are checked alike: a token the approval channel signed for this request's own user,
        this operation, this payload and this decision."""
        op = self.ledger.get(decision.operation_id)
        if op is None:
            raise ValueError(f"unknown operation {decision.operation_id!r} in this request")
        if self.cancel_requested():
            raise ValueError("the request was cancelled; it takes no more decisions")
        if decision.token is None:
            raise ValueError("a decision needs a token signed by the approval channel")
        if self._no_decisions is not None:
            raise ApplicationError(self._no_decisions, type=ErrorType.UNTRUSTED_INPUT, non_retryable=True)
        checked, self._signature = self._signature, None
        if checked is None or checked[0] != decision.token:
            raise ValueError(
                "no trust interceptor verified this decision's signature (register AgentWorkflow through "
                "ToolloopPlugin); nothing was recorded"
            )
        if checked[1] is not None:
            code, reason = checked[1]
            raise ApplicationError(f"{reason}; nothing was recorded", type=code, non_retryable=True)
        if decision.token in self._tokens.get(op.operation_id, []):
            return  # the same decision again: accepted, recorded once
        # Read (its signature verified above) before anything about the operation is told: someone the policy does
        # not name (or the requester as a second approver) is told exactly what a missing operation is told.
        signed = read_approval_claims(decision.token)
        if not may_decide(op.policy, self._actor.user_id, signed.approved_by, signed.roles):
            raise ValueError(f"unknown operation {decision.operation_id!r} in this request")
        if decision.digest != op.digest:
            raise ValueError("the decision is for another payload (digest mismatch)")
        if op.state != "awaiting_approval":
            raise ValueError(f"operation {op.operation_id} is not waiting for approval (state: {op.state})")
        # Whatever the approval timer's state: a decision that arrives once the window has closed sends nothing.
        window_end = op.approval_expires_at
        if window_end is not None and workflow.now() >= window_end:
            raise ValueError(f"operation {op.operation_id}'s approval window has closed")
        expected = {
            "user_id": self._actor.user_id,
            "tenant_id": self._actor.tenant_id,
            "operation_id": op.operation_id,
            "digest": op.digest,
            "decision": "approve" if decision.approve else "reject",
        }
        try:
            # The signature was verified with the worker's keys (above); the claims are judged here, against
            # this run's own state and clock only, so the same decision is judged alike by every worker. Only
            # here (validators never run on replay): histories recorded before tokens named their request replay.
            claims = check_approval_claims(
                read_approval_claims(decision.token),
                now=workflow.now().timestamp(),
                audience=op.audience or "",
                expected=expected,
                request=_this_request(),
            )
        except ApprovalInvalid as exc:
            raise ApplicationError(str(exc), type=exc.code, non_retryable=True) from None
        if claims.grant is not None and (
            not decision.approve
            or op.policy is None
            or claims.grant.request != _this_request()
            or claims.grant.tool != op.tool
        ):
            raise ValueError("a grant comes with an approval of a write its policy asked about, for its own tool")
        if decision.approve and claims.expires_at > self._deadline.timestamp() + CLOCK_TOLERANCE_SECONDS:
            raise ValueError("the approval would outlive the request's deadline; it must expire by then")
        if window_end is not None and (
            claims.decide_by is None or claims.decide_by > window_end.timestamp() + CLOCK_TOLERANCE_SECONDS
        ):
            raise ValueError("the decision must name the operation's approval window (decide_by) and keep to it")

    def record_decision(self, decision: ApprovalDecision) -> OperationRecord:
        op = self.ledger[decision.operation_id]
        if op.state != "awaiting_approval":
            return op  # a repeated decision changes nothing
        # The validator admitted only a decision with a verified token: who decided, and until when an approval
        # holds, come from it.
        assert decision.token is not None
        tokens = self._tokens.setdefault(op.operation_id, [])
        if decision.token in tokens:
            return op  # the same decision again
        tokens.append(decision.token)
        if not decision.approve:
            op.approval = approval_record(decision.token, workflow.now())
            self._move(op, "denied")
            return op
        policy = op.policy
        if policy is None or policy.deciders is None:
            op.approval = approval_record(decision.token, workflow.now())
            self._move(op, "approved")
            return op
        approvals = [read_approval_claims(token) for token in tokens]
        policy.approved_by = counted_approvers(policy.deciders, self._actor.user_id, approvals)
        if len(policy.approved_by) < policy.deciders.approvals:
            if self._narrator is not None:
                self._narrator.operation(op)
            if self.policy_task_queue is not None:
                self._publish_policy()
            return op  # four eyes: the second person has yet to decide
        counted = [claims for claims in approvals if claims.approved_by in policy.approved_by]
        # A grant holds from the approval of the write it came with, and only from an approval that counts.
        for token, claims in zip(tokens, approvals, strict=True):
            if claims.grant is not None and claims.approved_by in policy.approved_by:
                self._grants.append((token, claims.grant, [0]))
        expires_at = min([c.expires_at for c in counted] + [self._policy_expiry(op)])
        op.approval = ApprovalRecord(
            decision="approved",
            by=" and ".join(c.decided_by for c in counted),
            at=workflow.now(),
            expires_at=datetime.fromtimestamp(expires_at, tz=UTC),
        )
        self._move(op, "approved")
        return op

    def _verified(self, token: str | None, op: OperationRecord) -> PolicyClaims | None:
        """The policy's signed decision on this very write, if `token` is one: its signature verifies with the
        public keys the turn's worker named, and it is bound to this audience, actor, operation, payload and
        request. Anyone else answering on the policy's task queue is not believed (a tool that checks no token
        relies on this check alone). Deterministic: the keys come from history, the clock is the workflow's."""
        try:
            claims = verify_policy_token(
                verify_key_set(self.policy_verify_key),
                token,
                now=workflow.now().timestamp(),
                audience=op.audience or "",
                expected={
                    "user_id": self._actor.user_id,
                    "tenant_id": self._actor.tenant_id,
                    "operation_id": op.operation_id,
                    "digest": op.digest,
                },
            )
        except (ApprovalInvalid, ValueError):
            return None
        info = workflow.info()
        # The evaluator names the run Temporal gave it: this run, or (in a run made by a reset, replaying what
        # came before it) the first. Runs from before named the workflow id alone; one that was running when
        # its worker was upgraded meets both.
        this_run = run_binding(info.workflow_id, info.run_id)
        if workflow.patched(_RUN_BOUND):
            accepted = {this_run, _this_request()}
        else:
            accepted = {this_run, info.workflow_id}
        if claims.request not in accepted:
            return None
        return claims

    def _policy_expiry(self, op: OperationRecord) -> float:
        token = self._policy_tokens.get(op.operation_id)
        return read_policy_claims(token).expires_at if token is not None else float("inf")

    async def _decide_by_policy(self, op: OperationRecord, call: CheckedCall) -> dict[str, Any] | None:
        """Ask the deployment's policy evaluator first. Allow: the operation is approved by its rule. Deny: it is
        never sent (the model's output). Ask: it waits for the people the policy names. No evaluator answer
        within the approval window: nothing is sent (fail closed)."""
        assert self.policy_task_queue is not None and op.approval_expires_at is not None
        # A read an earlier write may have changed, and whose outcome is not known yet (sent, unknown), is no fact:
        # a read made while that write is in flight may show the state before it. A write with no facts recorded
        # here (left unknown by an earlier message of the thread, here or not proposed again) may have changed
        # anything: no read is a fact while it is unknown.
        unsettled: list[tuple[list[PolicyFact], dict[str, Any]]] = [
            (self._facts_of.get(other.operation_id, []), self._arguments[other.operation_id])
            for other in self.ledger.values()
            if other.state in ("sent", "unknown")
        ]
        unsettled += [
            ([], {})
            for earlier in self._earlier.values()
            if earlier.state == "unknown" and earlier.operation_id not in self.ledger
        ]
        facts = policy_facts(call.policy_facts, self._arguments[op.operation_id], unchanged_by(unsettled, self.reads))
        grants = [(token, used) for token, grant, used in self._grants if grant.tool == op.tool]
        window = max(op.approval_expires_at - workflow.now(), _MIN_TIMEOUT)
        try:
            decision: PolicyDecision = await workflow.execute_activity(
                DECIDE_BY_POLICY_ACTIVITY,
                PolicyInput(
                    operation_id=op.operation_id,
                    tool=op.tool,
                    arguments=self._arguments[op.operation_id],
                    digest=op.digest,
                    target=op.target,
                    audience=op.audience or "",
                    actor=self._actor,
                    facts=facts,
                    expires_at=self._deadline,
                    grants=[token for token, _ in grants],
                    grant_uses=[used[0] for _, used in grants],
                ),
                result_type=PolicyDecision,
                task_queue=self.policy_task_queue,
                start_to_close_timeout=timedelta(seconds=10),
                schedule_to_close_timeout=window,
                retry_policy=io_retry_policy(0),  # until the approval window ends
                summary=f"policy decides {call.summary}",
            )
        except ActivityError:
            self._move(op, "expired")
            return self._refusal(op, "the approval policy gave no decision in time; nothing was sent.")
        except asyncio.CancelledError as cancelled:
            self.absorb_cancel(cancelled)
            self._move(op, "expired")
            return self._refusal(op, "the request was cancelled before this was sent; nothing was sent.")
        if decision.record.verdict != "deny":
            # What the workflow acts on is what the policy signed, never the unsigned record beside it; an answer
            # that is not the policy's decision on this very write is a denial (nothing is sent).
            signed = self._verified(decision.token, op)
            if signed is None:
                decision = PolicyDecision(
                    record=PolicyRecord(verdict="deny", reason="the policy's answer is not valid")
                )
            else:
                record = PolicyRecord(
                    verdict=signed.verdict,
                    rules=signed.rules,
                    version=signed.policy_version,
                    deciders=signed.deciders,
                    granted_by=signed.granted_by,
                )
                decision = PolicyDecision(record=record, token=decision.token, grant=decision.grant)
        op.policy = decision.record
        if decision.record.verdict == "deny":
            # A decision like a person's rejection, named for what made it: the rules (or the policy's failure).
            rules = ", ".join(decision.record.rules)
            by = f"rule {rules}" if rules else f"the approval policy ({decision.record.reason or 'no rule'})"
            op.approval = ApprovalRecord(decision="rejected", by=by, at=workflow.now())
            self._move(op, "denied")
            why = f"the approval policy does not allow this ({decision.record.decided()}); nothing was sent."
            return self._op_error(op, ResultCode.POLICY_DENIED, why)
        assert decision.token is not None
        self._policy_tokens[op.operation_id] = decision.token
        if decision.grant is not None and 0 <= decision.grant < len(grants):
            grants[decision.grant][1][0] += 1  # one use of that grant
        if decision.record.verdict == "allow":
            granted_by = decision.record.granted_by
            op.approval = ApprovalRecord(
                decision="approved",
                by=f"{granted_by}'s grant" if granted_by else f"rule {', '.join(decision.record.rules)}",
                at=workflow.now(),
                expires_at=datetime.fromtimestamp(self._policy_expiry(op), tz=UTC),
            )
            self._move(op, "approved")
        return None

    # --- One side-effecting call ----------------------------------------------------------------

    def _operation_id(self, call: CheckedCall) -> str:
        """The same payload proposed again is the same operation - in the request, or in its thread for a
        thread's message - unless the tool says identical calls are distinct: then each proposal is the next
        occurrence in this request (counted in the model's order, so a replay counts the same)."""
        assert call.arguments is not None
        request_id = workflow.info().workflow_id
        if not call.each_call_distinct:
            return derive_operation_id(self._scope or request_id, call.name, call.arguments)
        key = derive_operation_id(request_id, call.name, call.arguments)
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        return derive_operation_id(request_id, call.name, call.arguments, occurrence=occurrence)

    async def run(self, call: CheckedCall, turn: int) -> ToolCallResult:
        """Drive one side-effecting call to its output for the model. The next model turn can take the
        output from the worker's store (output_in_history)."""
        assert call.arguments is not None  # the planner only schedules validated calls
        started = workflow.now()
        # A model may use a call id again in a later round: until this call's own attempt completes, its output
        # travels in this round's result, never by reference to an earlier round's attempt.
        self._output_in_attempt.discard(call.call_id)
        operation_id = self._operation_id(call)
        op = self.ledger.get(operation_id)
        if op is not None:
            # The model proposed the same operation again (new call_id): same operation, stored result.
            op.call_ids.append(call.call_id)
            output = dict(op.output or {})
            output["same_operation_as_call"] = op.call_ids[0]
            return ToolCallResult(call_id=call.call_id, output=output, duration_ms=0)
        earlier = self._earlier.get(operation_id)
        if earlier is not None and earlier.state in ("verified", "completed"):
            # Done by an earlier message of the thread: told again, never done again.
            output = {**(earlier.output or {}), "done_by_earlier_request": earlier.request_id}
            return ToolCallResult(call_id=call.call_id, output=output, duration_ms=0)

        op = OperationRecord(
            operation_id=operation_id,
            tool=call.name,
            call_ids=[call.call_id],
            arguments={k: ("***" if k in call.redact else v) for k, v in call.arguments.items()},
            digest=payload_digest(call.target or call.name, call.arguments),
            state="validated",
            transitions=["proposed", "validated"],
            deadline=self._deadline,
            target=call.target,
            audience=call.audience,
        )
        self.ledger[operation_id] = op
        self._arguments[operation_id] = call.arguments
        self._round_of[operation_id] = turn
        output = await self._drive(op, call, turn, earlier)
        op.output = output
        return ToolCallResult(call_id=call.call_id, output=output, duration_ms=_ms_since(started))

    async def _drive(
        self, op: OperationRecord, call: CheckedCall, turn: int, earlier: ThreadOperation | None = None
    ) -> dict[str, Any]:
        if earlier is not None and earlier.state not in ("failed", "denied", "expired"):
            # An earlier message of the thread left this very operation unknown: its status is asked before
            # anything else, and only a service with no record of it lets it be approved and sent (same key).
            settled = await self._settle_earlier_unknown(op, call, earlier)
            if settled is not None:
                return settled
        limits = self._limits
        now = workflow.now()
        op.approval_expires_at = min(now + timedelta(seconds=limits.approval_ttl_seconds), self._deadline)
        if self.policy_task_queue is not None:
            denied = await self._decide_by_policy(op, call)
            if denied is not None:
                return denied
            now = workflow.now()
        if op.state != "approved":
            self._move(op, "awaiting_approval")
        until = f"{op.approval_expires_at:%H:%M:%S} UTC"
        self._set_phase(f"round {turn}: waiting for approval of {op.operation_id} ({call.summary}) until {until}")
        if op.state == "awaiting_approval" and op.approval_expires_at > now:
            try:
                await workflow.wait_condition(
                    lambda: op.state != "awaiting_approval",
                    timeout=op.approval_expires_at - now,
                    timeout_summary=approval_wait_summary(op.tool, op.operation_id, until),
                )
            except TimeoutError:
                pass
            except asyncio.CancelledError as cancelled:
                self.absorb_cancel(cancelled)
        if self.cancel_requested() and op.state in ("awaiting_approval", "approved"):
            self._move(op, "expired")
            return self._refusal(op, "the request was cancelled before this was sent; nothing was sent.")
        if op.state == "awaiting_approval":
            self._move(op, "expired")
            if op.approval_expires_at >= self._deadline:
                return self._refusal(op, "the request's deadline came before an approval; nothing was sent.")
            return self._refusal(op, f"no approval arrived within {limits.approval_ttl_seconds:g} s; nothing was sent.")
        if op.state == "denied":
            return self._op_error(op, ResultCode.REJECTED, "the user rejected this operation; nothing was sent.")

        self._set_phase(f"round {turn}: running {call.summary} ({op.operation_id})")
        completed, payload = await self._send_until_settled(op, call)
        if not completed:
            return payload
        if not call.has_read_back:
            return self._unverified(op, payload, "this tool has no read-back")
        return await self._verify(op, payload)

    async def _settle_earlier_unknown(
        self, op: OperationRecord, call: CheckedCall, earlier: ThreadOperation
    ) -> dict[str, Any] | None:
        """The output for a proposal of an operation an earlier message left unknown, once its status settles
        it; None when the service has no record of it (it may be approved and sent, with the same key)."""
        # The earlier attempts are this operation's: a resend must keep to what they imply (the service's
        # retention counts from the first of them).
        op.first_sent_at = earlier.first_sent_at
        op.retention_seconds = earlier.retention_seconds
        op.may_commit_until = earlier.may_commit_until
        op.note = f"left {earlier.state} by request {earlier.request_id} of this thread"
        self._move(op, "unknown")
        # It may have taken effect at any moment, after this request's reads too.
        self._may_take_effect(op, call)
        if not call.has_status:
            return self._unknown(op, "an earlier message left it unknown and this tool has no status query.")
        self._set_phase(f"status of {op.tool} {op.operation_id} (left unknown by an earlier message)")
        settled = self._settled_by_status(op, await self._resolve(op))
        if settled is None and self._past_retention(op):
            # Not found, but the service may have forgotten the operation id since an earlier attempt: a resend
            # could be a second effect. Fail closed, as a request does after its own unclear attempt.
            return self._unknown(op, "the service may no longer remember an earlier attempt; it was not resent.")
        may_commit_until = self._earlier_attempt_may_commit_until(op)
        if settled is None and may_commit_until is not None and workflow.patched(_EARLIER_MAY_COMMIT):
            # Not found, but an earlier attempt may still be on its way and commit (its approval holds until
            # then): asking for a new approval now could end in "not done" for a write that then happens.
            why = f"an earlier attempt may still take effect until {may_commit_until:%Y-%m-%d %H:%M:%S} UTC"
            return self._unknown(op, f"{why}; it was not sent again (ask again after that).")
        if settled is None:
            return None
        completed, payload = settled
        if not completed:
            return payload
        if not call.has_read_back:
            return self._unverified(op, payload, "this tool has no read-back")
        return await self._verify(op, payload)

    def _earlier_attempt_may_commit_until(self, op: OperationRecord) -> datetime | None:
        """Until when an earlier message's attempt of `op` may still commit, if that is still ahead (with the
        clocks' tolerance); None once no attempt can. Unrecorded (a thread from before this was kept): a day, the
        longest an approval lives."""
        if op.first_sent_at is None:
            return None
        until = op.may_commit_until or op.first_sent_at + timedelta(seconds=LONGEST_DEADLINE_SECONDS)
        until += timedelta(seconds=CLOCK_TOLERANCE_SECONDS)
        return until if workflow.now() < until else None

    def _send_until(self, op: OperationRecord) -> datetime:
        """After this no attempt is sent: the service would refuse it, and must refuse to commit it."""
        assert op.approval is not None and op.approval.expires_at is not None  # approved with a token
        return min(self._deadline, op.approval.expires_at)

    async def _send_until_settled(self, op: OperationRecord, call: CheckedCall) -> tuple[bool, dict[str, Any]]:
        """Send, and after any doubt ask the status before anything else. Returns (True, the service's
        result) once the operation completed, else (False, the final output for the model)."""
        limits = self._limits
        # Stays False while every attempt certainly never reached the service (a refused connection). True from
        # the start for an operation an earlier message of the thread sent.
        maybe_received = op.first_sent_at is not None
        # An attempt of this request had an unclear answer: until its approval runs out it may still take effect.
        # (An earlier message's attempt is resent only once it can no longer: _settle_earlier_unknown.)
        unclear_here = False
        while True:
            if self.cancel_requested():
                return await self._settle_unsent(op, call, maybe_received, "cancelled")
            if maybe_received and self._past_retention(op):
                # The service may have forgotten the key: a resend could be a second effect. Fail closed.
                return False, self._unknown(op, "the idempotency record may have expired; it was not resent.")
            if workflow.now() >= self._send_until(op):
                return await self._settle_unsent(op, call, maybe_received, "expired")
            if op.attempts >= limits.max_write_attempts:
                if not maybe_received:
                    self._move(op, "failed")
                    why = f"the service could not be reached in {op.attempts} attempt(s); it was not done."
                    return False, self._op_error(op, ResultCode.TEMPORARY_UNAVAILABLE, why)
                # The last not_found cannot rule out an earlier attempt that is still on its way.
                return False, self._unknown(op, f"no definite answer after {op.attempts} attempt(s) with the same key.")
            outcome = await self._send(op, call)
            if outcome.kind == "completed":
                self._move(op, "completed")
                if outcome.evidence is not None:
                    self._read_in_attempt[op.operation_id] = Evidence.model_validate(outcome.evidence)
                return True, dict(outcome.output or {})
            if outcome.kind == "refused":
                if unclear_here and workflow.patched(_REFUSED_AFTER_DOUBT):
                    # This attempt was refused (a worker or a service replica of another version, say), but an
                    # earlier one may have reached the service: "not found" cannot rule out one still on its way.
                    code = (outcome.output or {}).get("code") or "refused"
                    why = f"this attempt was refused ({code}) after an earlier one that may still take effect"
                    return False, self._unknown(op, f"{why}; it was not sent again.")
                self._move(op, "failed")
                return False, dict(outcome.output or error_output(ResultCode.CONFLICT, "the service refused it."))
            if outcome.kind == "not_sent":
                # Certainly not received: the same key again after a pause (none once cancelled: not resent).
                if not self.cancel_requested():
                    await self._pause_before_resend(op, outcome.retry_after_seconds or 1.0)
                continue
            maybe_received = unclear_here = True
            # unknown or in progress (a 409, a 429 or a 5xx included): the service decides what happened.
            self._move(op, "unknown")
            if not call.has_status:
                # Nobody can be asked what happened, so it is never sent again.
                return False, self._unknown(op, "this tool has no status query, so it was not resent.")
            status = await self._resolve(op)
            settled = self._settled_by_status(op, status)
            if settled is not None:
                return settled
            # not_found: the attempt did not take effect (yet); a resend with the same key is safe, after
            # the pause the service asked for (a 429's Retry-After).
            if outcome.retry_after_seconds:
                await self._pause_before_resend(op, outcome.retry_after_seconds)

    def _settled_by_status(
        self, op: OperationRecord, status: OperationStatus | None
    ) -> tuple[bool, dict[str, Any]] | None:
        """What a status answer settles; None for not_found (the caller decides whether to resend)."""
        if status is None:
            return False, self._unknown(op, "its status could not be established.")
        if status.state == "completed":
            stored = dict(status.output or {})
            self._move(op, "completed" if stored.get("ok") else "failed")
            return bool(stored.get("ok")), stored
        if status.state == "in_progress":
            return False, self._unknown(op, "the service was still working on it when this request stopped.")
        return None

    async def _settle_unsent(
        self, op: OperationRecord, call: CheckedCall, maybe_received: bool, why: Literal["cancelled", "expired"]
    ) -> tuple[bool, dict[str, Any]]:
        """Nothing more will be sent: the request was cancelled between attempts, or the approval (and so the
        deadline) ran out before an attempt could be sent. What an earlier attempt may have done is settled by
        the status; only what the service has no record of differs."""
        before_any, none_arrived, no_status = _NOTHING_MORE_SENT[why]
        if op.attempts == 0:
            self._move(op, "expired")
            return False, self._refusal(op, before_any)
        if not maybe_received:
            self._move(op, "failed")
            return False, self._op_error(op, ResultCode.TEMPORARY_UNAVAILABLE, none_arrived)
        if not call.has_status:
            return False, self._unknown(op, no_status)
        settled = self._settled_by_status(op, await self._resolve(op))
        if settled is not None:
            return settled
        if why == "cancelled":
            # Not found, but the approval is still valid: an attempt still on its way could take effect.
            return False, self._unknown(op, "the request was cancelled; the service has no record of it yet.")
        # An earlier attempt may have reached the service. Its approval has expired now, and the service
        # checks that at commit, so no attempt can take effect any more: the status is final.
        self._move(op, "failed")
        no_record = "and the service has no record of it."
        if self._send_until(op) < self._deadline:
            failed = f"it was not done: the approval expired before it could be sent again, {no_record}"
            return False, self._op_error(op, ResultCode.CONFIRMATION_REQUIRED, failed)
        failed = f"it was not done: the request's deadline passed before it could be sent again, {no_record}"
        return False, self._op_error(op, ResultCode.LIMIT_REACHED, failed)

    async def _pause_before_resend(self, op: OperationRecord, seconds: float) -> None:
        left = (self._send_until(op) - workflow.now()).total_seconds()
        if left > 0:
            summary = f"pause before resending {op.tool} {short_operation_id(op.operation_id)} (same key)"
            try:
                await workflow.sleep(timedelta(seconds=min(seconds, left)), summary=summary)
            except asyncio.CancelledError as cancelled:
                self.absorb_cancel(cancelled)

    def _may_take_effect(self, op: OperationRecord, call: CheckedCall) -> None:
        """`op` may take effect from now on (sent, or sent by an earlier message): what it may change is no longer
        a fact for a later write (two small refunds are not each judged on the order as it was before both; a
        write that names no facts may change any), which is decided on a new read, or asks."""
        self._facts_of[op.operation_id] = call.policy_facts
        self.reads = unchanged_by([(call.policy_facts, self._arguments[op.operation_id])], self.reads)

    async def _send(self, op: OperationRecord, call: CheckedCall) -> WriteOutcome:
        op.attempts += 1
        if op.attempts == 1:
            self._may_take_effect(op, call)
        if op.first_sent_at is None:
            op.first_sent_at = workflow.now()
        until = self._send_until(op)
        op.may_commit_until = until if op.may_commit_until is None else max(op.may_commit_until, until)
        self._move(op, "sent")
        # No longer than the approval lives: the service refuses to commit after that anyway.
        left = self._send_until(op) - workflow.now()
        per_attempt = timedelta(seconds=call.timeout_seconds or self._limits.write_timeout_seconds)
        timeout = max(min(per_attempt, left), _MIN_TIMEOUT)
        try:
            outcome: WriteOutcome = await workflow.execute_activity(
                EXECUTE_WRITE_ACTIVITY,
                WriteInput(
                    operation_id=op.operation_id,
                    tool=op.tool,
                    arguments=self._arguments[op.operation_id],
                    actor=self._actor,
                    approval_token=self._approval_header(op),
                    attempt=op.attempts,
                    call_id=call.call_id,
                    round=self._round_of.get(op.operation_id),
                ),
                result_type=WriteOutcome,
                start_to_close_timeout=timeout,
                retry_policy=_ONE_ATTEMPT,
                cancellation_type=_FINISH,
                summary=f"{call.summary} attempt {op.attempts}",
            )
            return outcome
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, CancelledError):
                # Waited for (_FINISH), an attempt that started can only complete or time out: the write
                # activity never heartbeats, so it cannot learn of the cancel. Cancelled means never started.
                return WriteOutcome(kind="not_sent", detail="the request was cancelled before the attempt started")
            if isinstance(cause, ApplicationError) and cause.type == ErrorType.WRITE_OUTCOME_UNKNOWN and cause.details:
                # The attempt reported an unclear outcome by failing (so it stands out in the UI).
                try:
                    return WriteOutcome.model_validate(cause.details[0])
                except ValidationError:
                    pass
            # A timeout or a lost worker after the request may have left: not "not executed".
            return WriteOutcome(kind="unknown", detail="the attempt ended without an answer")

    def _approval_header(self, op: OperationRecord) -> str:
        """What the service checks (X-Approval-Token): the policy's decision first, then the people's approvals
        that count (all of them where no policy names people)."""
        policy_token = self._policy_tokens.get(op.operation_id)
        people = self._tokens.get(op.operation_id, [])
        if op.policy is not None and op.policy.deciders is not None:
            counted = set(op.policy.approved_by)
            people = [t for t in people if read_approval_claims(t).approved_by in counted]
        return join_tokens([*([policy_token] if policy_token else []), *people])

    def _settle_until(self) -> datetime:
        return self._deadline + timedelta(seconds=self._limits.settle_seconds)

    async def _resolve(self, op: OperationRecord) -> OperationStatus | None:
        """Ask the service until it says completed or not found, or the resolution window ends (never
        later than `settle_seconds` past the deadline; always at least one question).
        None: the status could not be established."""
        limits = self._limits
        now = workflow.now()
        until = min(now + timedelta(seconds=limits.unknown_resolution_seconds), max(self._settle_until(), now))
        pause = 0.5
        while True:
            try:
                status: OperationStatus = await workflow.execute_activity(
                    QUERY_OPERATION_STATUS_ACTIVITY,
                    OperationQuery(operation_id=op.operation_id, tool=op.tool, actor=self._actor),
                    result_type=OperationStatus,
                    start_to_close_timeout=timedelta(seconds=limits.write_timeout_seconds),
                    schedule_to_close_timeout=max(until - workflow.now(), _MIN_TIMEOUT),
                    retry_policy=io_retry_policy(limits.status_max_attempts),
                    cancellation_type=_FINISH,
                    summary=f"status of {op.tool} {op.operation_id} (after an unclear outcome)",
                )
            except ActivityError:
                op.status_checks.append(StatusCheck(at=workflow.now(), state="unavailable"))
                return None
            op.status_checks.append(StatusCheck(at=workflow.now(), state=status.state))
            op.retention_seconds = status.retention_seconds
            if status.state != "in_progress" or workflow.now() + timedelta(seconds=pause) >= until:
                return status
            summary = f"pause before status query of {op.tool} {short_operation_id(op.operation_id)} (in progress)"
            try:
                await workflow.sleep(timedelta(seconds=pause), summary=summary)
            except asyncio.CancelledError as cancelled:
                self.absorb_cancel(cancelled)
            pause = min(pause * 2, 5.0)

    async def _verify(self, op: OperationRecord, result: dict[str, Any]) -> dict[str, Any]:
        # The attempt that completed read the effect back itself (the happy path); otherwise the read-back
        # activity reads it, retrying a read that does not see it yet.
        in_attempt = self._read_in_attempt.pop(op.operation_id, None)
        evidence = in_attempt or await self._read_back(op, result)
        op.evidence = evidence.model_dump(mode="json")
        if evidence.verified:
            self._move(op, "verified")
            if in_attempt is not None:
                # The completing attempt's input and result hold this output (write_output_in_attempt).
                self._output_in_attempt.add(op.call_ids[0])
            return verified_write_output(op.operation_id, result)
        return self._unverified(op, result, evidence.detail)

    async def _read_back(self, op: OperationRecord, result: dict[str, Any]) -> Evidence:
        try:
            evidence: Evidence = await workflow.execute_activity(
                READ_BACK_ACTIVITY,
                ReadBackInput(
                    operation_id=op.operation_id,
                    tool=op.tool,
                    arguments=self._arguments[op.operation_id],
                    actor=self._actor,
                    output=result,
                ),
                result_type=Evidence,
                start_to_close_timeout=timedelta(seconds=self._limits.tool_timeout_seconds),
                schedule_to_close_timeout=max(self._settle_until() - workflow.now(), _MIN_TIMEOUT),
                retry_policy=io_retry_policy(self._limits.readback_max_attempts),
                cancellation_type=_FINISH,
                summary=f"read back {op.tool} {op.operation_id}",
            )
        except ActivityError:
            evidence = _NOT_READ_BACK
        return evidence

    def _unverified(self, op: OperationRecord, result: dict[str, Any], why: str) -> dict[str, Any]:
        op.note = why
        return {
            "ok": True,
            "operation_id": op.operation_id,
            "state": "completed",
            "verified": False,
            "message": f"the service reports it done, but it is not verified: {why}. Do not repeat it.",
            "result": result,
        }

    # --- Helpers ------------------------------------------------------------------------------

    def _past_retention(self, op: OperationRecord) -> bool:
        """True when a resend may come after the service forgot the key. The retention is what the
        service declared (or the worker's configuration), never a per-request setting; not knowing it
        counts as past it."""
        if op.first_sent_at is None:
            return False
        if op.retention_seconds is None:
            return True
        return (workflow.now() - op.first_sent_at).total_seconds() >= op.retention_seconds

    def _move(self, op: OperationRecord, state: OperationState) -> None:
        if op.state == state and op.transitions[-1:] == [state]:
            return
        op.state = state
        op.transitions.append(state)
        if self._narrator is not None:
            self._narrator.operation(op)
        if self.policy_task_queue is not None:
            self._publish_policy()

    def _publish_policy(self) -> None:
        """With a policy, as search attributes: who may decide the operations waiting now (what a manager's
        list of approvals asks for) and the rules that decided this request's writes (what an operator filters
        on: ToolloopPolicyRules = "small-late-refund"). Upserted only when they change."""
        deciders: set[str] = set()
        for waiting in self.ledger.values():
            if waiting.state == "awaiting_approval":
                deciders.update(decider_entries(waiting, self._actor))
        rules = {rule for op in self.ledger.values() if op.policy is not None for rule in op.policy.rules}
        published = (sorted(deciders), sorted(rules))
        if published != self._published:
            self._published = published
            workflow.upsert_search_attributes(
                [DECIDERS_KEY.value_set(published[0]), POLICY_RULES_KEY.value_set(published[1])]
            )

    def _op_error(self, op: OperationRecord, code: ResultCode, why: str, message: str | None = None) -> dict[str, Any]:
        """Record why on the operation and tell the model (message defaults to why)."""
        op.note = why
        output = error_output(code, message or why)
        output["operation_id"] = op.operation_id
        return output

    def _refusal(self, op: OperationRecord, why: str) -> dict[str, Any]:
        return self._op_error(op, ResultCode.CONFIRMATION_REQUIRED, why)

    def _unknown(self, op: OperationRecord, why: str) -> dict[str, Any]:
        self._move(op, "unknown")
        message = f"it could not be established whether this happened: {why} Do not repeat it; tell the user."
        return self._op_error(op, ResultCode.OUTCOME_UNKNOWN, why, message)

    def output_in_history(self, call_id: str) -> bool:
        """True when the output of this call is what its completing attempt establishes alone: history
        holds it there (write_output_in_attempt), so a model turn may refer to it."""
        return call_id in self._output_in_attempt

    def snapshot(self) -> list[OperationRecord]:
        return [op.model_copy(deep=True) for op in self.ledger.values()]


# What the model is told when nothing more will be sent (cancelled, or the approval ran out): before any
# attempt was sent, when no attempt reached the service, and for a tool that has no status query.
_NOTHING_MORE_SENT = {
    "cancelled": (
        "the request was cancelled before this was sent; nothing was sent.",
        "the request was cancelled; no attempt reached the service, so it was not done.",
        "the request was cancelled, and this tool has no status query.",
    ),
    "expired": (
        "the approval ran out before the write could be sent; nothing was sent.",
        "the service could not be reached before the request's deadline; it was not done.",
        "this tool has no status query, so it was not resent.",
    ),
}

# The evidence of a read-back activity that failed: made up here, so not in history.
_NOT_READ_BACK = Evidence(verified=False, detail="the read-back could not see the effect")


def decider_entries(op: OperationRecord, actor: Actor) -> list[str]:
    """Who may decide `op`, as the ToolloopDeciders search attribute lists it: "user:<id>", "role:<name>"."""
    deciders = op.policy.deciders if op.policy is not None else None
    if deciders is None:
        return [f"user:{actor.user_id}"]
    return ([f"user:{actor.user_id}"] if deciders.requester else []) + [f"role:{role}" for role in deciders.roles]


def _ms_since(started: datetime) -> int:
    return int((workflow.now() - started).total_seconds() * 1000)
