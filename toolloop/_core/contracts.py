"""Pure: the pydantic models that cross a boundary (workflow, activities, starter, model adapters).

Fields are only ever added with defaults, never renamed or retyped, so stored histories still decode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)

from toolloop._core.approvals import ApprovalInvalid, canonical_json, read_approval_claims

# --- Conversation items (OpenAI Responses shape) -------------------------------------------------
# Output items keep every field the provider sent (extra="allow"), so reasoning and other items go back
# to the model unchanged; we never store the provider's raw response envelope.


# The serialization context toolloop's payload converter passes (toolloop._temporal.converter): what goes
# into Temporal payloads, so into history.
PAYLOAD_CONTEXT = {"toolloop_payload": True}


class Compact(BaseModel):
    """A model whose Temporal payloads leave out the fields that hold their empty default (None, "", or an
    empty list or dict): it decodes to the same value, and history stores only what carries information.
    Only empty defaults are left out, so changing a real default later can never change what a stored
    payload means. Elsewhere (the API, `--json`) every field is written, unless the class says
    `compact_always` (activity payloads, never shown)."""

    compact_always: ClassVar[bool] = False
    # Fields whose default is fixed for good (never to change, since a stored payload that leaves one out
    # means that default): left out too when they hold it.
    fixed_defaults: ClassVar[frozenset[str]] = frozenset()
    # Every field's default is fixed so.
    every_default_fixed: ClassVar[bool] = False

    @model_serializer(mode="wrap")
    def _without_empty_defaults(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        context = info.context
        if not isinstance(data, dict) or not (
            self.compact_always or (isinstance(context, dict) and context.get("toolloop_payload"))
        ):
            return data
        for name, field in type(self).model_fields.items():
            key = name if name in data else field.alias
            if key not in data:
                continue
            value = data[key]
            if value is None and field.default is None and field.default_factory is None:
                del data[key]
            elif value in ([], {}) and field.default_factory in (list, dict):
                del data[key]
            elif value == "" and field.default == "":
                del data[key]
            elif (self.every_default_fixed or name in self.fixed_defaults) and value == field.default:
                del data[key]
        return self._without_repeats(data)

    def _without_repeats(self, data: dict[str, Any]) -> dict[str, Any]:
        """A subclass's payload may also leave out what it holds twice (and restore it when validated)."""
        return data


class ActivityPayload(Compact):
    """An activity's input or result: compact wherever it is written."""

    compact_always: ClassVar[bool] = True


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


class Limits(Compact):
    """A request's limits. A payload holds only those that differ from these defaults, so each default is
    fixed for good (a stored input that leaves one out means it): a starter that wants other values sets
    them (tests/test_core_contracts.py pins them)."""

    every_default_fixed: ClassVar[bool] = True

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
    deadline_seconds: float = Field(default=600.0, gt=0, le=86_400)
    # The write protocol (side-effecting calls).
    approval_ttl_seconds: float = Field(default=300.0, gt=0, le=86_400)
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


# The name a worker registered a model adapter under ("script", "openai", the demo's "offline", ...). It was
# a Literal of the three bundled models; any stored value still validates.
MODEL_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
ModelProvider = Annotated[str, Field(pattern=MODEL_NAME)]


class ModelSpec(Compact):
    provider: ModelProvider = "offline"
    # Provider model name (openai); ignored offline.
    name: str | None = None
    # Script mode: turn N is what the model returns on its N-th call.
    script: list[list[ConversationItem]] | None = None


class AgentInput(Compact):
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


# --- Model turn activity ------------------------------------------------------------------------


class ModelTurnInput(ActivityPayload):
    """One model call. Carries only what is new since the previous turn: the activity rebuilds the
    conversation from earlier turns (its cache, or this workflow's history), so history stays linear."""

    turn: int = Field(ge=1)
    new_items: list[ConversationItem]
    provider: ModelProvider
    model_name: str | None = None
    actor: Actor | None = None
    # The request's own instructions: on turn 1 (later turns find them in the conversation state).
    instructions: str | None = None
    # Call ids whose function_call_output in new_items is exactly the run_tool activity's result of the
    # previous round: sent empty and filled in by the activity (stored in history once, as that result).
    output_refs: list[str] = Field(default_factory=list)
    # The request's allowed tools (AgentInput.allowed_tools): the only ones offered to the model.
    offered_tools: list[str] | None = None


class CheckedCall(ActivityPayload):
    """A function call after validation: either runnable (`arguments` set) or `rejection` set."""

    fixed_defaults: ClassVar[frozenset[str]] = frozenset({"read_only", "has_status", "has_read_back"})

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
    # The tool's own timeout per attempt and number of attempts; None: the request's limits.
    timeout_seconds: float | None = None
    max_attempts: int | None = None
    # False for a write declared without a status query (an unclear outcome stays unknown, never resent)
    # or without a read-back (a completed write stays unverified).
    has_status: bool = True
    has_read_back: bool = True


class ModelTurnResult(ActivityPayload):
    """The model's items and its calls as checked. In a payload a checked call leaves out its `name`, and
    of its `arguments` what is its item's own, parsed: both are in the call's item already, and are
    restored from it when the payload is read. Arguments that validation changed or added (a default, say)
    are kept as `arguments_changed`, the rest read from the item."""

    items: list[ConversationItem]
    calls: list[CheckedCall]
    # Set by older workers only; the answer's text is read from the items (answer_text), not stored twice.
    final_text: str | None = None
    model_label: str = ""
    # Set when the turn itself broke the protocol (e.g. one call_id twice): nothing in it runs.
    protocol_error: str | None = None

    def _without_repeats(self, data: dict[str, Any]) -> dict[str, Any]:
        items = _function_calls(data.get("items"))
        for call in data.get("calls") or []:
            item = items.get(str(call.get("call_id")))
            if item is None:
                continue
            if call.get("name") == item.get("name"):
                del call["name"]
            arguments, parsed = call.get("arguments"), _parsed(item)
            if "rejection" in call or not isinstance(arguments, dict) or not isinstance(parsed, dict):
                continue
            if set(parsed) <= set(arguments):
                # The same JSON, not just equal values (1 == 1.0 == True in Python).
                changed = {
                    name: value
                    for name, value in arguments.items()
                    if name not in parsed or canonical_json(value) != canonical_json(parsed[name])
                }
                if changed:
                    call["arguments_changed"] = changed
                del call["arguments"]
        return data

    @model_validator(mode="before")
    @classmethod
    def _with_repeats(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("calls"), list):
            return data

        def shortened(call: Any) -> bool:
            return isinstance(call, dict) and ("name" not in call or not {"arguments", "rejection"} & set(call))

        if not any(shortened(call) for call in data["calls"]):
            return data
        items = _function_calls(data.get("items"))
        calls = []
        for call in data["calls"]:
            item = items.get(str(call.get("call_id"))) if shortened(call) else None
            if item is not None:
                call = dict(call)
                call.setdefault("name", item.get("name"))
                if "arguments" not in call and "rejection" not in call:
                    parsed, changed = _parsed(item), call.pop("arguments_changed", None)
                    call["arguments"] = {**parsed, **changed} if isinstance(changed, dict) else parsed
            calls.append(call)
        return {**data, "calls": calls}


def _function_calls(items: Any) -> dict[str, dict[str, Any]]:
    """The first function_call item of each call_id (as serialized dicts, or models)."""
    found: dict[str, dict[str, Any]] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, BaseModel):
            item = item.model_dump()
        if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(item.get("call_id"), str):
            found.setdefault(item["call_id"], item)
    return found


def _parsed(item: dict[str, Any]) -> Any:
    try:
        return json.loads(item.get("arguments") or "")
    except (ValueError, RecursionError):
        return None


# --- Tool call activity -------------------------------------------------------------------------


class ToolCallInput(ActivityPayload):
    round: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    actor: Actor
    max_output_bytes: int


class ToolCallResult(Compact):
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


class ApprovalRecord(Compact):
    decision: Literal["approved", "rejected"]
    by: str
    at: datetime
    expires_at: datetime | None = None


class StatusCheck(Compact):
    at: datetime
    state: Literal["completed", "in_progress", "not_found", "unavailable"]


# What a finished request's report may leave out of its payload, each because one record in the run's
# history holds it (toolloop._temporal.results.complete_report reads it back from there):
# - "arguments": the write attempts' input (when nothing was redacted), and with them "digest" (computed from
#   them, as the workflow did);
# - "evidence": the read-back, done in the completing attempt or by the read-back activity;
# - "approval": the decision Update's input (its token) and answer (its time);
# - "first_sent_at": the approval's time, when the first attempt went out in the same workflow task (as it
#   does once an approval arrives while the operation waits);
# - "output": what the model was told, in the next model turn.
# The answer (final_text) stays in the report although the last turn holds it too: it is what someone opening
# the request in the Temporal UI looks for first. So do the call records: they are small, and a report that
# refers to nothing (a request without side effects) is read without reading its history.
HistoryField = Literal["arguments", "digest", "evidence", "approval", "first_sent_at", "output"]
HISTORY_FIELDS: tuple[HistoryField, ...] = get_args(HistoryField)
# How a payload says "every HistoryField" (the happy path's case): fixed for good.
_EVERY_HISTORY_FIELD = "*"


# The transitions of an operation that went the happy path; fixed for good (a stored record that leaves them
# out means these).
VERIFIED_PATH = ("proposed", "validated", "awaiting_approval", "approved", "sent", "completed", "verified")


class OperationRecord(Compact):
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
    # In a finished request's report: the fields its payload leaves out because the run's history holds them
    # already (see HistoryField).
    in_history: list[HistoryField] = Field(default_factory=list)

    def _without_repeats(self, data: dict[str, Any]) -> dict[str, Any]:
        # The happy path's transitions are implied by its final state.
        if self.state == "verified" and self.transitions == list(VERIFIED_PATH):
            del data["transitions"]
        for name in self.in_history:
            data.pop(name, None)
        if tuple(self.in_history) == HISTORY_FIELDS:
            data["in_history"] = [_EVERY_HISTORY_FIELD]
        return data

    @model_validator(mode="before")
    @classmethod
    def _with_repeats(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("state") == "verified" and "transitions" not in data:
            data = {**data, "transitions": list(VERIFIED_PATH)}
        if data.get("in_history") == [_EVERY_HISTORY_FIELD]:
            data = {**data, "in_history": list(HISTORY_FIELDS)}
        return data

    def decision_answer(self) -> DecisionAnswer:
        return DecisionAnswer(state=self.state, at=self.approval.at if self.approval else None)


class DecisionAnswer(Compact):
    """The `approve_operation` Update's answer, as history stores it: the operation's state right after the
    decision, and when the workflow recorded that decision. Everything else of the approval is in the
    decision's signed token, once (approval_record); the channel makes the DecisionReceipt from both."""

    state: OperationState
    at: datetime | None = None


class DecisionReceipt(Compact):
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
    redaction is for logs and history, never for the approver). Answer of the `get_approval_request` query."""

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

    @property
    def digest_subject(self) -> str:
        return self.target or self.tool


class ApprovalDecision(Compact):
    """The trusted channel's answer for one operation (Temporal Update `approve_operation`). In a payload the
    operation, digest and decision are left out when the token's claims say the same: history holds them
    once, signed, and they are read back from the claims (the validator still verifies the signature)."""

    operation_id: str
    digest: str
    approve: bool
    # Signed by the approval channel (toolloop._core.approvals); required to approve and to reject. Who
    # decided is read from its verified claims, never from `by`.
    token: str | None = None
    by: str = Field(default="", max_length=128)  # informational only

    def _without_repeats(self, data: dict[str, Any]) -> dict[str, Any]:
        claimed = _token_claims(self.token)
        for name, value in claimed.items():
            if data.get(name) == value:
                del data[name]
        return data

    @model_validator(mode="before")
    @classmethod
    def _with_repeats(cls, data: Any) -> Any:
        if not isinstance(data, dict) or {"operation_id", "digest", "approve", "by"} <= set(data):
            return data
        return {**_token_claims(data.get("token")), **data}


def _token_claims(token: Any) -> dict[str, Any]:
    """What a decision's token claims (unverified): its operation, digest, decision and who decided through
    which channel; {} when unreadable."""
    if not isinstance(token, str) or not token:
        return {}
    try:
        claims = read_approval_claims(token)
    except ApprovalInvalid:
        return {}
    return {
        "operation_id": claims.operation_id,
        "digest": claims.digest,
        "approve": claims.decision == "approve",
        "by": claims.decided_by,
    }


class WriteInput(ActivityPayload):
    fixed_defaults: ClassVar[frozenset[str]] = frozenset({"attempt"})

    operation_id: str
    tool: str
    arguments: dict[str, Any]
    actor: Actor
    # The approval's signed token; "" when approval_update_id is set instead: the id of the decision Update
    # whose input, in this run's history, holds it. The attempt reads it from there, so history stores each
    # token once.
    approval_token: str = ""
    attempt: int = 1
    call_id: str
    approval_update_id: str | None = None
    # Set when the request's model turns are activities: the round whose next turn is told this write's
    # output. A completed attempt that read its effect back keeps that output in the worker's output store
    # for it (the turn refers to the output instead of carrying it).
    keep_output_round: int | None = None


class WriteOutcome(ActivityPayload):
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


class OperationQuery(Compact):
    operation_id: str
    tool: str
    actor: Actor


class ReadBackInput(Compact):
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


def outcome_of(status: RunStatus, states: Iterable[str]) -> str:
    """How a finished request is found in the UI's list (ToolloopOutcome): "failed"; "unknown" when a side
    effect is unknown or done but not verified; "stopped" at a limit; "not_done" when it answered but a write
    it proposed was not done (rejected, expired, refused); else "answered" (every write done and verified)."""
    seen = set(states)
    if status == "failed":
        return "failed"
    if seen - SETTLED_STATES:
        return "unknown"
    if status == "stopped":
        return "stopped"
    return "not_done" if seen & NOT_DONE_STATES else "answered"


class CallRecord(Compact):
    call_id: str
    tool: str
    round: int
    ok: bool
    code: str | None = None
    duration_ms: int = 0


class AgentResult(Compact):
    """A finished request's report. Its payload in history leaves out what the run's history holds already
    (each operation lists it in its `in_history`): read it with toolloop.request_result, which fills it in
    from that history."""

    # Left out of the payload: it is the run's own id (request_result fills it in).
    workflow_id: str = ""
    status: RunStatus
    stop_reason: StopReason
    final_text: str | None = None
    rounds: int
    calls: list[CallRecord]
    model_label: str = ""
    error: str | None = None
    operations: list[OperationRecord] = Field(default_factory=list)

    def _without_repeats(self, data: dict[str, Any]) -> dict[str, Any]:
        data.pop("workflow_id", None)
        if self.status == status_of(self.stop_reason):
            del data["status"]  # implied by the stop reason
        return data

    @model_validator(mode="before")
    @classmethod
    def _with_repeats(cls, data: Any) -> Any:
        if isinstance(data, dict) and "status" not in data and isinstance(data.get("stop_reason"), str):
            return {**data, "status": status_of(data["stop_reason"])}
        return data

    @property
    def complete(self) -> bool:
        """False while some operation's field is still only in the run's history (its in_history)."""
        return not any(op.in_history for op in self.operations)


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


def told_of_attempt(attempt: WriteInput, outcome: WriteOutcome) -> str | None:
    """The JSON the model is told of the write `attempt` that ended in `outcome`, when the attempt alone
    establishes it (completed, and its own read-back verified the effect); None otherwise."""
    if outcome.kind != "completed" or not (outcome.evidence or {}).get("verified"):
        return None
    return output_json(verified_write_output(attempt.operation_id, dict(outcome.output or {})))


def answer_text(items: Sequence[ConversationItem]) -> str | None:
    """The text of the assistant's messages in a turn's items; None when there is none."""
    texts = [i.text() for i in items if isinstance(i, MessageItem) and i.role == "assistant"]
    return "\n".join(t for t in texts if t.strip()).strip() or None


def output_json(output: dict[str, Any]) -> str:
    return json.dumps(output, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
