"""Pure: the pydantic models that cross a boundary (workflow, activities, starter, model adapters).

Fields are added with defaults and never retyped, so stored histories still decode. A field renamed for
clarity still reads under its old name (AliasChoices), so an activity of this version reads what a workflow
of the one before wrote; the other way round, upgrade workers together (README, "Upgrading").
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    computed_field,
    model_validator,
)

from toolloop._core.approvals import MAX_GRANT_USES, Deciders, read_approval_claims
from toolloop._core.usage import RequestUsage, TokenUsage

# --- Conversation items (OpenAI Responses shape) -------------------------------------------------
# Output items keep every field the provider sent (extra="allow"), so reasoning and other items go back
# to the model unchanged; we never store the provider's raw response envelope.


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str


class MessageItem(BaseModel):
    """An assistant message (`content` holds `output_text` parts) or a user message (`content` a string)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["message"] = "message"
    role: str = "assistant"
    content: str | list[dict[str, Any]] = Field(default_factory=list)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(
            str(part.get("text", "")) for part in self.content if part.get("type") in ("output_text", "text")
        )


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


class OtherItem(BaseModel):
    """Any other item (`reasoning`, ...): opaque to us, kept and sent back unchanged."""

    model_config = ConfigDict(extra="allow")

    type: str


def _item_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function_call", "message", "function_call_output") else "other"


ConversationItem = Annotated[
    Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


def user_message(text: str) -> MessageItem:
    return MessageItem(role="user", content=text)


def item_to_wire(item: BaseModel) -> dict[str, Any]:
    """The item as the Responses API expects it in `input`: every field the provider sent, nulls
    included (our models add no optional fields of their own)."""
    return item.model_dump(mode="json")


# --- Identity, limits, model choice ------------------------------------------------------------


# ASCII only: an identity is never spelled with look-alike or invisible characters.
ACTOR_ID = r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$"


class Actor(BaseModel):
    """Who the request acts for. Set by the starter from the session; tools never take it from arguments."""

    model_config = ConfigDict(frozen=True)

    user_id: str = Field(min_length=1, max_length=64, pattern=ACTOR_ID)
    tenant_id: str = Field(default="acme", min_length=1, max_length=64, pattern=ACTOR_ID)


# A request's deadline is at most a day, so every approval of it (which expires by the deadline) is too.
LONGEST_DEADLINE_SECONDS = 86_400


class Limits(BaseModel):
    """A request's limits (every one is written into the request's input, so a stored input keeps its
    meaning whatever the defaults become)."""

    max_rounds: int = Field(default=8, ge=1, le=100)
    max_calls_per_round: int = Field(default=8, ge=1, le=128)
    max_total_calls: int = Field(default=32, ge=1, le=1000)
    # The per-round cap: the reads of one round run as one parallel wave.
    max_parallel_reads: int = Field(default=8, ge=1, le=64)
    max_tool_output_bytes: int = Field(default=16_384, ge=256, le=1_000_000)
    tool_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    tool_max_attempts: int = Field(default=3, ge=1, le=20)
    model_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    model_max_attempts: int = Field(default=5, ge=1, le=20)
    deadline_seconds: float = Field(default=600.0, gt=0, le=LONGEST_DEADLINE_SECONDS)
    # The write protocol (side-effecting calls).
    approval_ttl_seconds: float = Field(default=300.0, gt=0, le=LONGEST_DEADLINE_SECONDS)
    write_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    max_write_attempts: int = Field(default=3, ge=1, le=10)
    status_max_attempts: int = Field(default=4, ge=1, le=20)
    unknown_resolution_seconds: float = Field(default=60.0, gt=0, le=3600)
    readback_max_attempts: int = Field(default=3, ge=1, le=20)
    # Ignored: kept only so stored inputs still decode. How long the service keeps operation ids is a fact
    # the service declares (its status answer) or the worker's configuration, never a per-request setting.
    idempotency_retention_seconds: float = Field(default=86_400.0, gt=0)
    # After the deadline nothing is sent; a write already in flight is still settled (status queries,
    # read-back) for at most this long before the run reports.
    settle_seconds: float = Field(default=30.0, gt=0, le=600)
    # The request's budget (None: none), checked before each model turn against the totals the provider
    # reported so far (toolloop._core.usage): once reached, the loop stops with `budget`. A turn whose provider
    # reports no usage counts 0 tokens, and a model without a price in the worker's table costs nothing, so a
    # budget holds only with a model that reports usage (and, for max_cost, has a price).
    max_total_tokens: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    max_cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # A message of a thread: how many of the thread's earlier messages the model is shown (the newest ones;
    # docs/DESIGN.md, "Threads"). An operation an older message left unknown is always shown.
    thread_turns: int = Field(default=20, ge=0, le=200)


# The name a worker registered a model adapter under ("script", "openai", the demo's "offline", ...). It was
# a Literal of the three bundled models; any stored value still validates.
MODEL_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
ModelProvider = Annotated[str, Field(pattern=MODEL_NAME)]


class ModelSpec(BaseModel):
    provider: ModelProvider = "offline"
    # Provider model name (openai); ignored offline.
    name: str | None = None
    # Script mode: turn N is what the model returns on its N-th call.
    script: list[list[ConversationItem]] | None = None

    @classmethod
    def named(cls, text: str) -> ModelSpec:
        """`NAME` or `NAME:MODEL`: a worker's model by the name it serves it under, and optionally the provider's
        model name ("openai:gpt-4.1-mini"). The one parser of a model name, for the CLI and the API; a
        ValueError says what is expected."""
        provider, _, name = text.partition(":")
        if not re.fullmatch(MODEL_NAME, provider):
            raise ValueError(f"{text!r}: a model is NAME or NAME:MODEL, NAME matching {MODEL_NAME}")
        return cls(provider=provider, name=name or None)


class AgentInput(BaseModel):
    request: str = Field(min_length=1, max_length=20_000)
    actor: Actor
    model: ModelSpec = Field(default_factory=ModelSpec)
    limits: Limits = Field(default_factory=Limits)
    # Never set: the keys that verify decisions are the worker's own configuration. Kept so stored inputs still
    # decode, and so that an input that brings one is refused at the run's start (UntrustedInput) rather than
    # silently ignored (docs/DESIGN.md, "The trust boundary").
    approval_verify_key: str | None = None
    # The model's instructions for this request; None: the worker's configured instructions.
    instructions: str | None = Field(default=None, max_length=20_000)
    # The only tools this request may use, set by the trusted starter (None: every tool of the worker). The
    # model is offered no other, and a call to another is answered FORBIDDEN without running.
    allowed_tools: list[str] | None = Field(default=None, max_length=500)
    # The starter's own labels for this request (a benchmark's task id, a ticket number): given to the model
    # adapter with every turn (ModelRequest.metadata), never used to decide anything.
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=500)]] = Field(
        default_factory=dict, max_length=32
    )
    # Set by a thread's workflow when this request is one of its messages: what happened earlier in the thread.
    thread: ThreadContext | None = None


# --- Model turn activity ------------------------------------------------------------------------


class ModelTurnInput(BaseModel):
    """One model call. Carries only what is new since the previous turn: the activity rebuilds the
    conversation from earlier turns (its cache, or this workflow's history), so history stays linear."""

    turn: int = Field(ge=1)
    new_items: list[ConversationItem]
    provider: ModelProvider
    model_name: str | None = None
    actor: Actor | None = None
    # The request's own instructions: on turn 1 (later turns find them in the conversation state).
    instructions: str | None = None
    # Call ids whose function_call_output in new_items is sent empty because history holds it already (a
    # run_tool activity's result of the previous round, or a write attempt that holds its whole output): the
    # model activity fills it in, so each output is stored in history once.
    outputs_in_history: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("outputs_in_history", "output_refs")
    )
    # The request's allowed tools (AgentInput.allowed_tools): the only ones offered to the model.
    offered_tools: list[str] | None = None
    # A scripted request's (ModelSpec.script): this turn's items (None once the script has run out) and the
    # script's length, so the activity needs nothing but its input.
    script_turn: list[ConversationItem] | None = None
    script_length: int = 0
    # The request's own labels (AgentInput.metadata), for the adapter.
    metadata: dict[str, str] = Field(default_factory=dict)
    # What history holds of the previous turn's items and of each output in `outputs_in_history` (text_digest,
    # items_digest): a worker's own copy is used only when it matches. A model turn or a tool that timed out
    # goes on running on its worker and may finish after its retry was recorded, leaving another answer there.
    previous_turn_digest: str | None = None
    output_digests: dict[str, str] = Field(default_factory=dict)


class PolicyFact(BaseModel):
    """One fact a write's policy decides on: `fields` of the newest output of the read `tool` whose arguments
    agree with the write's on `match` ({read's argument: write's argument}), as facts[`name`]."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")
    tool: str
    match: dict[str, str]
    fields: list[str] = Field(min_length=1)


class CheckedCall(BaseModel):
    """A function call after validation: either runnable (`arguments` set) or `rejection` set."""

    call_id: str
    name: str
    read_only: bool = True
    summary: str
    arguments: dict[str, Any] | None = None
    rejection: dict[str, Any] | None = None
    # Argument names to hide in ledgers and receipts (ToolSpec.redact).
    redact: list[str] = Field(default_factory=list)
    # Added with the public tool API (defaults keep stored histories decoding):
    # what a write's digest binds besides the payload (an HTTP write's "POST /path"); None: the tool's name.
    target: str | None = None
    # A write's approval audience: the service or tool source its decision tokens are for (ToolSpec).
    audience: str | None = None
    # A write whose identical calls are distinct operations (ToolSpec.each_call_distinct).
    each_call_distinct: bool = False
    # The tool's own timeout per attempt and number of attempts; None: the request's limits.
    timeout_seconds: float | None = None
    max_attempts: int | None = None
    # False for a write declared without a status query (an unclear outcome stays unknown, never resent)
    # or without a read-back (a completed write stays unverified).
    has_status: bool = True
    has_read_back: bool = True
    # The facts a policy decides this write on, from the request's earlier reads (ToolSpec.policy_facts).
    policy_facts: list[PolicyFact] = Field(default_factory=list)


class ModelTurnResult(BaseModel):
    """The model's items (as the provider gave them) and its calls as checked (arguments parsed and
    validated, defaults filled in). The answer's text is read from the items (answer_text)."""

    items: list[ConversationItem]
    calls: list[CheckedCall]
    model_label: str = ""
    # Set when the turn itself broke the protocol (e.g. one call_id twice): nothing in it runs.
    protocol_error: str | None = None
    # The worker that ran the turn has a hook for the request's end (ToolloopPlugin(on_request_end=...)):
    # the workflow runs the request_ended activity once it has its report. Told by the turn's result, so a
    # request on workers without a hook has no such step, and a replay decides as the run did.
    end_hook: bool = False
    # The worker's policy evaluator (its task queue), where a write is decided by policy before any person
    # is asked (ToolloopPlugin(policy_task_queue=...)); None: every write waits for its requester's approval.
    # Told by the turn's result, as end_hook: the worker's configuration, never the request's input.
    policy_task_queue: str | None = None
    # ...and its public keys (ToolloopPlugin(policy_verify_key=...)): a decision that does not verify with one of
    # them is a denial. Kept in history with the turn, so a replay judges with the keys the run had.
    policy_verify_key: str | None = None
    # The tokens the turn used as the provider reported them (None: it reported none, as the script and
    # offline models), and their cost by the worker's price table (None: no price for this model).
    usage: TokenUsage | None = None
    cost: float | None = None


# --- Tool call activity -------------------------------------------------------------------------


class ToolCallInput(BaseModel):
    round: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    actor: Actor
    max_output_bytes: int


class ToolCallResult(BaseModel):
    call_id: str
    output: dict[str, Any]
    duration_ms: int


# --- Side-effecting calls: the operation ledger --------------------------------------------------

OperationState = Literal[
    "validated",
    "awaiting_approval",
    "approved",
    "sent",
    "completed",
    "verified",
    "expired",
    "denied",
    "failed",
    "unknown",
]


class ApprovalRecord(BaseModel):
    decision: Literal["approved", "rejected"]
    by: str
    at: datetime
    expires_at: datetime | None = None


class PolicyRecord(BaseModel):
    """What the deployment's approval policy decided about one write, and who has approved it since."""

    verdict: Literal["allow", "deny", "ask"]
    rules: list[str] = Field(default_factory=list)
    version: str = ""
    deciders: Deciders | None = None  # for "ask"
    reason: str = ""  # for "deny"
    # The people whose approvals count so far (four eyes: the first, until the second decides).
    approved_by: list[str] = Field(default_factory=list)
    # An allow that rests on a person's grant given earlier in this request (GrantTerms): who gave it.
    granted_by: str | None = None

    def decided(self) -> str:
        """One line for receipts and the UI: by which rules, or who may decide."""
        rules = ", ".join(self.rules) or "no rule"
        if self.verdict == "allow" and self.granted_by is not None:
            return f"allowed by {self.granted_by}'s grant (asked by rule {rules})"
        if self.verdict == "allow":
            return f"allowed by rule {rules}"
        if self.verdict == "deny":
            return f"denied by rule {rules}" + (f" ({self.reason})" if self.reason else "")
        asked = self.deciders.describe() if self.deciders is not None else "nobody"
        return f"asked by rule {rules}: {asked}"


class GrantTerms(BaseModel):
    """What a person grants with an approval (docs/POLICIES.md, "Grants"): the next `uses` writes of the same tool
    in this request are approved without asking again, if each argument named in `max` is at most its number and
    each named in `same` equals the approved write's. The policy still decides: a forbid wins, four eyes are
    never granted away, and only a person the policy would ask can grant."""

    model_config = ConfigDict(extra="forbid")

    uses: int = Field(ge=1, le=MAX_GRANT_USES)
    max: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(default_factory=dict, max_length=20)
    same: list[str] = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _bounded(self) -> GrantTerms:
        if not self.max and not self.same:
            raise ValueError("a grant needs bounds: name arguments in max (at most) or same (the approved value)")
        return self


class StatusCheck(BaseModel):
    at: datetime
    state: Literal["completed", "in_progress", "not_found", "unavailable"]


class OperationRecord(BaseModel):
    """One side-effecting operation as the workflow knows it: the receipt the user is shown."""

    operation_id: str
    tool: str
    call_ids: list[str]
    arguments: dict[str, Any] = Field(default_factory=dict)  # redacted
    digest: str = ""
    state: OperationState
    transitions: list[str] = Field(default_factory=list)
    approval: ApprovalRecord | None = None
    approval_expires_at: datetime | None = None  # when waiting for approval stops
    attempts: int = 0
    first_sent_at: datetime | None = None
    status_checks: list[StatusCheck] = Field(default_factory=list)
    evidence: dict[str, Any] | None = None
    output: dict[str, Any] | None = None  # what the model was told
    note: str | None = None
    # Added later (defaults keep stored histories decoding):
    # nothing may be committed after this instant (the request's deadline); approvals expire by then.
    deadline: datetime | None = None
    # How long the service keeps this operation id, as it declared in its last status answer.
    retention_seconds: float | None = None
    # What the digest binds besides the arguments (an HTTP write's "POST /path"); None: the tool's name.
    target: str | None = None
    # The service or tool source its decision tokens are for (their `aud`).
    audience: str | None = None
    # What the deployment's approval policy decided (None: no policy; the requester decides).
    policy: PolicyRecord | None = None
    # The last instant an attempt of it may still commit (the latest sent attempt's approval expiry, at most its
    # request's deadline; an earlier message's attempts count too). None: no attempt sent, or not known.
    may_commit_until: datetime | None = None

    def decision_answer(self) -> DecisionAnswer:
        return DecisionAnswer(state=self.state, at=self.approval.at if self.approval else None)


class DecisionReceipt(BaseModel):
    """The answer to a decision (toolloop.send_decision, the CLI's and the API's decision call): the
    operation's state right after it, not its whole record."""

    operation_id: str
    tool: str
    state: OperationState
    approval: ApprovalRecord | None = None


def approval_record(token: str, at: datetime) -> ApprovalRecord:
    """The approval a decision's (verified) token records, at `at`: who decided comes from its claims, never
    from the caller's words; an approval's lifetime too."""
    claims = read_approval_claims(token)
    if claims.decision == "approve":
        expires_at = datetime.fromtimestamp(claims.expires_at, tz=UTC)
        return ApprovalRecord(decision="approved", by=claims.decided_by, at=at, expires_at=expires_at)
    return ApprovalRecord(decision="rejected", by=claims.decided_by, at=at)


class ApprovalRequest(BaseModel):
    """What the approval channel shows a human and signs: the whole payload the digest covers (unredacted;
    redaction is for logs, ledgers and receipts, never for the approver). Answer of the `get_approval_request`
    query and of the `next_approval` Update (whose answer history keeps, as it keeps the model's turn that
    proposed these arguments)."""

    operation_id: str
    tool: str
    arguments: dict[str, Any]
    digest: str
    state: OperationState
    actor: Actor
    approval_expires_at: datetime | None = None
    deadline: datetime | None = None
    # What the digest binds besides the arguments (an HTTP write's "POST /path"); None: the tool's name.
    target: str | None = None
    # The audience the channel signs the decision for (the token's `aud`): the service or tool source that
    # will check it.
    audience: str | None = None
    # What the policy asked for: who may decide, by which rules, who has approved so far (None: no policy,
    # the requester decides).
    policy: PolicyRecord | None = None
    # The request's first run (a reset keeps it; a new start under the same workflow id does not): a decision
    # names it with the workflow id (approvals.run_binding). None: an older worker.
    run_id: str | None = None

    @property
    def digest_subject(self) -> str:
        return self.target or self.tool

    def may_decide(self, decider: str, roles: Iterable[str] = ()) -> bool:
        """True if `decider` (with `roles`, in the request's tenant) may decide this operation, and has not
        approved it already."""
        return may_decide(self.policy, self.actor.user_id, decider, roles)


def may_decide(policy: PolicyRecord | None, requester: str, decider: str, roles: Iterable[str] = ()) -> bool:
    """Who may decide an operation `requester` asked for: the people its policy names (each once, the requester
    only as the first), else the requester alone. The channel, the workflow and the API ask this."""
    if policy is None or policy.deciders is None:
        return decider == requester
    if decider in policy.approved_by:
        return False
    if decider == requester and policy.approved_by:
        return False  # the requester counts only as the first approval
    return policy.deciders.admits(requester, decider, roles)


class ApprovalWait(BaseModel):
    """The `next_approval` Update's input: the operations the caller has already been given, so each waiting
    operation reaches it once."""

    seen: list[str] = Field(default_factory=list)


class NextApproval(BaseModel):
    """The `next_approval` Update's answer: an operation waiting for approval, or None once the request has
    finished."""

    approval: ApprovalRequest | None = None


class DecisionAnswer(BaseModel):
    """The `approve_operation` Update's answer: the operation's state right after the decision, and when the
    workflow recorded it. The rest of the approval is in the decision's signed token (approval_record); the
    channel makes the DecisionReceipt from both."""

    state: OperationState
    at: datetime | None = None
    # Only for a decision sent with `then_wait`: the next operation waiting for approval that the channel has
    # not been given, or an empty NextApproval once the request finished.
    next: NextApproval | None = None


class ApprovalDecision(BaseModel):
    """The trusted channel's answer for one operation (Temporal Update `approve_operation`): the operation,
    digest and verdict as the channel sent them, and the signed token the validator checks them against."""

    operation_id: str
    digest: str
    approve: bool
    # Signed by the approval channel (toolloop._core.approvals); required to approve and to reject. Who
    # decided is read from its verified claims, never from `by`.
    token: str | None = None
    by: str = Field(default="", max_length=128)  # informational only
    # An approver that decides each operation in turn: after recording this decision, the Update waits for the
    # next operation it has not been given and answers with it (DecisionAnswer.next), so no second Update
    # (and no workflow task of its own) is needed to learn what waits next.
    then_wait: ApprovalWait | None = None


class PolicyInput(BaseModel):
    """The decide_by_policy activity's input: one validated write, as the policy sees it."""

    operation_id: str
    tool: str
    arguments: dict[str, Any]
    digest: str
    # What the digest binds besides the arguments (an HTTP write's "POST /path"); None: the tool's name.
    target: str | None = None
    audience: str
    actor: Actor
    facts: dict[str, Any] = Field(default_factory=dict)
    # The decision's token expires by then (the request's deadline; the evaluator caps it at a day).
    expires_at: datetime
    # Grants people gave earlier in this request for this tool (their signed approvals), and how many writes
    # each has approved since: the evaluator checks them and may allow by one.
    grants: list[str] = Field(default_factory=list)
    grant_uses: list[int] = Field(default_factory=list)


class PolicyDecision(BaseModel):
    """What the policy decided, and its signed token (for allow and ask: sent with the write, first)."""

    record: PolicyRecord
    token: str | None = None
    # The grant (its index in PolicyInput.grants) an allow rests on; None: a rule's own verdict.
    grant: int | None = None


class WriteInput(BaseModel):
    operation_id: str
    tool: str
    arguments: dict[str, Any]
    actor: Actor
    # The approval's signed token, sent with every attempt (the service checks it again at commit).
    approval_token: str = ""
    attempt: int = 1
    call_id: str
    # The round the write was proposed in. A completed attempt that read its effect back holds the write's
    # whole output (write_output_in_attempt), so the next model turn finds it in history; the worker also
    # keeps it in its output store for that turn, which then need not read history.
    round: int | None = Field(default=None, validation_alias=AliasChoices("round", "keep_output_round"))


class WriteOutcome(BaseModel):
    """What one send attempt established (never raised: the workflow decides what follows)."""

    kind: Literal["completed", "refused", "not_sent", "in_progress", "unknown"]
    output: dict[str, Any] | None = None
    retry_after_seconds: float | None = None
    detail: str = ""
    duration_ms: int = 0
    # A completed attempt's read-back, done in the same activity right after the write (an Evidence dump);
    # None when there was none to do or it could not conclude yet (the workflow then runs the read-back
    # activity, which retries a stale read).
    evidence: dict[str, Any] | None = None


class OperationQuery(BaseModel):
    operation_id: str
    tool: str
    actor: Actor


class ReadBackInput(BaseModel):
    operation_id: str
    tool: str
    arguments: dict[str, Any]
    actor: Actor
    output: dict[str, Any]


# --- Workflow result and progress ----------------------------------------------------------------

StopReason = Literal[
    "final_answer",
    "max_rounds",
    "max_calls_per_round",
    "max_total_calls",
    "deadline",
    "model_error",
    "no_answer",
    # The request's token or cost budget (Limits.max_total_tokens, max_cost) was reached before a model turn.
    "budget",
    # The request was cancelled: nothing more was sent; the operations say what had been done.
    "cancelled",
]
RunStatus = Literal["completed", "stopped", "failed"]


def status_of(stop: StopReason) -> RunStatus:
    """How a request that stopped so ended: answered, stopped at a limit (or cancelled), or failed."""
    if stop == "final_answer":
        return "completed"
    return "failed" if stop in ("model_error", "no_answer") else "stopped"


# Operation states that settle a side effect: done and verified, or certainly not done.
SETTLED_STATES = frozenset({"verified", "failed", "denied", "expired"})
NOT_DONE_STATES = frozenset({"failed", "denied", "expired"})


# A call the service refused (not the user's, not found for them, not allowed): what the request needed of it
# was not done, whatever the model then answered ("Add a note to ticket T1002" when T1002 is someone else's: the
# read the note needs is refused, so no write is even proposed). A model's own mistakes (BAD_ARGUMENTS, ...) are
# not the service's answer and the model may correct them.
REFUSED_CODES = frozenset({"NOT_AVAILABLE", "FORBIDDEN"})

Outcome = Literal["answered", "not_done", "unknown", "stopped", "failed"]
# How each outcome exits `ask` and `result` (the README's table).
EXIT_CODES: dict[Outcome, int] = {"answered": 0, "stopped": 1, "failed": 1, "unknown": 3, "not_done": 4}


def outcome_of(status: RunStatus, operations: Iterable[OperationRecord], calls: Iterable[CallRecord] = ()) -> Outcome:
    """What a finished request came to, one rule for the CLI's exit code, the UI's ToolloopOutcome and the
    API: "unknown" when a side effect is unknown or done but not verified (it outranks everything: someone
    must look); "failed"; "stopped" at a limit; "not_done" when it answered but a write it proposed was not
    done (rejected, expired, refused) or the service refused a call it needed; else "answered"."""
    states = {op.state for op in operations}
    if states - SETTLED_STATES:
        return "unknown"
    if status != "completed":
        return "failed" if status == "failed" else "stopped"
    refused = any(not call.ok and call.code in REFUSED_CODES for call in calls)
    return "not_done" if states & NOT_DONE_STATES or refused else "answered"


def state_left_mid_way(op: OperationRecord) -> OperationState:
    """An operation's state once its request stopped mid-way, with no report (terminated, timed out): what it
    had settled stays, never sent is not done (expired), and anything sent is unknown (nothing proves it did not
    happen). The workflow schedules an attempt in the task that counts it, so no attempt means nothing sent."""
    if op.state in SETTLED_STATES or op.state in ("completed", "unknown"):
        return op.state
    return "unknown" if op.attempts or op.first_sent_at is not None else "expired"


def left_mid_way(operations: Iterable[OperationRecord]) -> list[OperationRecord]:
    """The ledger of a request that ended without its report, each operation in the state it was left in
    (state_left_mid_way): none is still "awaiting approval" or "sent" in a run that has stopped."""
    return [_as_left(op, state_left_mid_way(op)) for op in operations]


def _as_left(op: OperationRecord, state: OperationState) -> OperationRecord:
    if state == op.state:
        return op
    why = "sent before the request stopped" if state == "unknown" else "the request stopped before it was sent"
    return op.model_copy(update={"state": state, "note": why})


def outcome_without_report(operations: Iterable[OperationRecord] | None) -> Outcome:
    """What a request that ended without its report came to, by the ledger it left (None: it could not be
    read): unknown when a write may have happened or nobody can tell, failed otherwise."""
    return "unknown" if operations is None else outcome_of("failed", left_mid_way(operations))


class CallRecord(BaseModel):
    call_id: str
    tool: str
    round: int
    ok: bool
    code: str | None = None
    duration_ms: int = 0


class FinishedRequest(BaseModel):
    """What a worker's end-of-request hook is given (ToolloopPlugin(on_request_end=...)): which request
    ended, for whom, with the starter's labels, and how it ended. The whole report is the workflow's result."""

    workflow_id: str
    run_id: str
    actor: Actor
    metadata: dict[str, str] = Field(default_factory=dict)
    status: RunStatus
    stop_reason: StopReason
    outcome: Outcome


class AgentResult(BaseModel):
    """A finished request's whole report: the workflow's own result (what `handle.result()` and the
    Temporal UI's Result panel show), the same the CLI, the API and the web page show."""

    workflow_id: str = ""
    status: RunStatus
    stop_reason: StopReason
    final_text: str | None = None
    rounds: int
    calls: list[CallRecord]
    model_label: str = ""
    error: str | None = None
    operations: list[OperationRecord] = Field(default_factory=list)
    # The model's token totals and their cost (toolloop._core.usage); zeros for a request whose model reported
    # no usage, and for a report stored before usage was recorded.
    usage: RequestUsage = Field(default_factory=RequestUsage)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcome(self) -> Outcome:
        """What the request came to (outcome_of): written with the report, so every reader sees it."""
        return outcome_of(self.status, self.operations, self.calls)


# --- Threads: what a message is told of the earlier ones ------------------------------------------


class ThreadOperation(BaseModel):
    """A write of an earlier message, as its request's ledger recorded it when that request ended."""

    operation_id: str
    tool: str
    call_id: str
    arguments: dict[str, Any] = Field(default_factory=dict)  # redacted, as in the ledger
    state: OperationState
    # What the model was told of it (its tool output).
    output: dict[str, Any] | None = None
    request_id: str = ""
    # When an attempt was first sent (None: never), and how long the service said it keeps the operation id:
    # a later "not found" proves nothing was done only within that time.
    first_sent_at: datetime | None = None
    retention_seconds: float | None = None
    # Until when an attempt already sent may still commit (OperationRecord.may_commit_until): before that, "not found"
    # may be an attempt still on its way.
    may_commit_until: datetime | None = None


class ThreadTurn(BaseModel):
    """An earlier message of a thread and what came of it: the question, the writes with their recorded
    outcomes, and the answer (None: the request ended without one; `stop_reason` says why)."""

    number: int = Field(ge=1)
    request_id: str
    question: str
    answer: str | None = None
    status: RunStatus | None = None
    stop_reason: str | None = None
    operations: list[ThreadOperation] = Field(default_factory=list)


class ThreadContext(BaseModel):
    """What a thread's workflow gives the request of its next message. `scope` names the thread for the
    operation ids (the same payload in the same thread is the same operation, unless its tool says identical
    calls are distinct); `turns` are the earlier messages the model is shown, oldest first; `operations` the
    thread's other earlier writes (and newer states of the turns' ones): with the turns', every write a new
    proposal must meet (toolloop._core.threads.earlier_operations)."""

    thread_id: str
    scope: str
    turns: list[ThreadTurn] = Field(default_factory=list)
    operations: list[ThreadOperation] = Field(default_factory=list)


class AgentProgress(BaseModel):
    phase: str
    round: int
    actor: Actor | None = None
    running: list[str] = Field(default_factory=list)
    calls: list[CallRecord] = Field(default_factory=list)
    done: bool = False
    operations: list[OperationRecord] = Field(default_factory=list)
    # How many events the request has emitted so far (RequestEvent.seq of the last one).
    events: int = 0
    # The model's token totals so far, and their cost.
    usage: RequestUsage = Field(default_factory=RequestUsage)


RequestEventKind = Literal["phase", "tool_started", "tool_finished", "approval_needed", "operation", "final"]


class RequestEvent(BaseModel):
    """One step of a request as a client follows it (the API's server-sent events): numbered from 1 in the
    order they happened, so a client that reconnects after event N asks for what came after N."""

    seq: int
    at: datetime
    kind: RequestEventKind
    data: dict[str, Any] = Field(default_factory=dict)


class EventsPage(BaseModel):
    """Answer of the `get_events` query: the events after the one asked for, and whether the request is done
    (then the last event is the `final` one)."""

    events: list[RequestEvent]
    done: bool


# --- Tool results (the JSON the model reads) -----------------------------------------------------


def ok_output(**data: Any) -> dict[str, Any]:
    return {"ok": True, **data}


def error_output(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": str(code), "message": message}


def verified_write_output(operation_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """What the model is told of a write that completed and was read back: the service's result and the
    verified state. A write attempt that did both holds everything in it, so history need not store this
    again (toolloop reads it back from the attempt's input and result)."""
    return {"ok": True, "operation_id": operation_id, "state": "verified", "result": result}


def write_output_in_attempt(attempt: WriteInput, outcome: WriteOutcome) -> str | None:
    """The JSON the model is told of the write `attempt` that ended in `outcome`, when the attempt alone
    establishes it (completed, and its own read-back verified the effect); None otherwise."""
    if outcome.kind != "completed" or not (outcome.evidence or {}).get("verified"):
        return None
    return output_json(verified_write_output(attempt.operation_id, dict(outcome.output or {})))


def answer_text(items: Sequence[ConversationItem], *, refusals: bool = True) -> str | None:
    """The text of the assistant's messages in a turn's items (with `refusals`, a refusal said as one); None when
    there is none."""
    texts = [_said(i) if refusals else i.text() for i in items if isinstance(i, MessageItem) and i.role == "assistant"]
    return "\n".join(t for t in texts if t.strip()).strip() or None


def _said(message: MessageItem) -> str:
    # A refusal is a content part of its own (Responses) or the message's `refusal` (Chat, as the adapter keeps
    # it): without it, a request the model declined ended "answered" with no text at all.
    if message.text().strip() or isinstance(message.content, str):
        return message.text()
    refused = " ".join(str(p.get("refusal", "")) for p in message.content if p.get("type") == "refusal").strip()
    return f"The model declined: {refused}" if refused else ""


def output_json(output: dict[str, Any]) -> str:
    return json.dumps(output, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def text_digest(text: str) -> str:
    """What the workflow tells the next model turn of an output history holds: a worker-local copy is used only
    when it is that very text (an attempt Temporal had given up on may have left another copy behind)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def items_digest(items: Sequence[ConversationItem]) -> str:
    """The same for a model turn's recorded items (a worker's cached conversation through that turn)."""
    return text_digest(_item_list().dump_json(list(items)).decode())


@functools.cache
def _item_list() -> TypeAdapter[list[ConversationItem]]:
    return TypeAdapter(list[ConversationItem])


AgentInput.model_rebuild()
