"""Pure: threads - a conversation of several requests, one after another (docs/DESIGN.md, "Threads").

A thread's workflow (`workflows/thread.py`) keeps the messages it accepted in order, starts each message's
request once the one before it has ended, and hands it what happened before: each earlier message's question,
its writes with the outcome its ledger recorded (never a proposal as if it had been done) and its answer. This
module holds the payloads of that workflow and the rules it applies, so they are tested without a server."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from toolloop._core.contracts import (
    Actor,
    AgentInput,
    AgentResult,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OperationRecord,
    ThreadContext,
    ThreadOperation,
    ThreadTurn,
    output_json,
    state_left_mid_way,
    user_message,
)

# What a thread keeps, bounded in count and in bytes: its state travels whole in each continue-as-new (and what
# a message is given, in its request's input), and Temporal refuses a payload over 2 MB. Worst cases: turns
# 400 KB, the operation index 200 KB, the queue 600 KB, the message records about 250 KB.
KEPT_TURNS = 200
TURNS_BYTES = 400_000
# What a turn keeps of a question and of an answer (the rest is cut, and marked so).
QUESTION_CHARS = 2_000
ANSWER_CHARS = 4_000
# A turn at most this big: one request may make 32 writes of 64 KB each, and a turn over the bounds below would
# push every other turn out (or the state over 2 MB). Past it, the largest writes' arguments, then outputs, are
# left out (marked so); the operation ids and states, what a later proposal meets, always stay.
TURN_BYTES = 100_000
# What a message is shown of the earlier turns, at most (the newest that fit, up to Limits.thread_turns).
CONTEXT_BYTES = 200_000
# The thread's writes by operation id (newest state), at most this big: the oldest settled ones go first, and
# one left unknown goes only when nothing else is left to drop.
OPERATIONS_BYTES = 200_000
# Message records for the thread's list and its idempotency (a request id older than that is not recognised).
# Far more than one run takes (MESSAGES_PER_RUN): a run never forgets a message it started itself, which is what
# lets a client trust a request this run started under its message's id (ToolloopThread.request).
KEPT_MESSAGES = 500
# A thread's workflow continues as new after this many messages (or sooner, when Temporal suggests it), between
# two messages: its history stays bounded however long the conversation.
MESSAGES_PER_RUN = 50
# At most this many messages wait in a thread, and at most this many bytes of them.
MAX_QUEUED = 20
QUEUE_BYTES = 600_000
_CUT = " [...]"
_LEFT_OUT = "[left out]"

MessageState = Literal["queued", "running", "finished", "refused"]


class ThreadMessage(BaseModel):
    """The `send_message` Update's input: one user message, as the request it becomes. `submission` is what
    the request id is bound to (the client's digest of `request`): the same id with the same submission is a
    retry, with another one a refusal."""

    request_id: str
    submission: str
    request: AgentInput


class MessageRecord(BaseModel):
    """One message of a thread as the thread's list shows it."""

    number: int
    request_id: str
    workflow_id: str
    submission: str
    question: str  # its first 200 characters
    state: MessageState = "queued"
    outcome: str | None = None
    # Why a message was refused (its request could not start).
    note: str | None = None


class MessageAccepted(BaseModel):
    """The `send_message` Update's answer: the message's place in the thread. `ahead` counts the messages
    before it that have not finished (0: it starts at once); the answer comes at once (`state` queued, in runs
    from before: running when nothing was ahead); `attached` is True for a retry of a message the thread already
    has. `submission` (the message's submission digest, which its request's memo holds) and `thread_run_id` (the
    thread's run that accepted it) let a client tell its request from any other under the same workflow id; both
    are empty in answers from workers of an earlier version."""

    number: int
    request_id: str
    workflow_id: str
    ahead: int
    attached: bool = False
    state: MessageState = "queued"
    submission: str = ""
    thread_run_id: str = ""


class ThreadState(BaseModel):
    """What a thread carries from one run of its workflow to the next (continue-as-new)."""

    messages: list[MessageRecord] = Field(default_factory=list)
    queue: list[ThreadMessage] = Field(default_factory=list)
    turns: list[ThreadTurn] = Field(default_factory=list)
    # Every write of the thread by operation id, as the newest message that had it left it (without its
    # arguments: the turns show those): what a later proposal of the same payload meets, however old.
    operations: dict[str, ThreadOperation] = Field(default_factory=dict)
    last_number: int = 0
    # Closed by its user: it takes no new message, runs those it accepted, then its workflow ends.
    closed: bool = False


class ThreadInput(BaseModel):
    thread_id: str
    actor: Actor
    # Set by the thread's own continue-as-new; None for a new thread.
    carried: ThreadState | None = None


class LedgerOfRequest(BaseModel):
    """The `request_ledger` activity's input: the request whose ledger the thread reads."""

    workflow_id: str


class ThreadView(BaseModel):
    """The `get_thread` query's answer (and `close_thread`'s): the thread's messages, oldest first (at most
    KEPT_MESSAGES)."""

    thread_id: str
    actor: Actor
    messages: list[MessageRecord]


def ahead_of(state: ThreadState, request_id: str) -> int:
    """How many messages before this one have not finished."""
    ahead = 0
    for record in state.messages:
        if record.request_id == request_id:
            return ahead
        if record.state in ("queued", "running"):
            ahead += 1
    return ahead


def turn_of(
    record: MessageRecord,
    question: str,
    report: AgentResult | None,
    why: str | None,
    ledger: list[OperationRecord] | None = None,
) -> ThreadTurn:
    """What later messages are told of a finished one: its writes as its ledger recorded them at its end. No
    report (the request was terminated or timed out): no answer, `why`, and its writes as its last `ledger`
    shows them, every one not settled then counted unknown (nothing proves it did not happen)."""
    if report is None:
        return _within_bounds(
            ThreadTurn(
                number=record.number,
                request_id=record.request_id,
                question=_cut(question, QUESTION_CHARS),
                stop_reason=why,
                operations=[_thread_operation(op, record.request_id, ended=False) for op in ledger or []],
            )
        )
    return _within_bounds(
        ThreadTurn(
            number=record.number,
            request_id=record.request_id,
            question=_cut(question, QUESTION_CHARS),
            answer=_cut(report.final_text, ANSWER_CHARS) if report.final_text is not None else None,
            status=report.status,
            stop_reason=report.stop_reason,
            operations=[_thread_operation(op, record.request_id, ended=True) for op in report.operations],
        )
    )


def _within_bounds(turn: ThreadTurn) -> ThreadTurn:
    """The turn at most TURN_BYTES: the largest writes' arguments, then the large fields of their outputs, left
    out with a mark saying how much, until it fits. An output keeps its small fields (ok, code, ids), which is
    what a later proposal of the same write is told."""
    size = _size(turn)
    for part in ("arguments", "output"):
        by_size = sorted(turn.operations, key=lambda op: -len(json.dumps(getattr(op, part), default=str)))
        for op in by_size:
            if size <= TURN_BYTES:
                return turn
            value: dict[str, Any] | None = getattr(op, part)
            if not value:
                continue
            kept = (
                {k: v for k, v in value.items() if len(json.dumps(v, default=str)) <= 200} if part == "output" else {}
            )
            left_out = len(json.dumps(value, default=str)) - len(json.dumps(kept, default=str))
            marked = {**kept, _LEFT_OUT: f"{left_out} bytes left out: this write's {part} made the thread too long"}
            at = turn.operations.index(op)
            turn.operations[at] = op.model_copy(update={part: marked})
            size = _size(turn)
    return turn


def _thread_operation(op: OperationRecord, request_id: str, *, ended: bool) -> ThreadOperation:
    state = op.state if ended else state_left_mid_way(op)
    return ThreadOperation(
        operation_id=op.operation_id,
        tool=op.tool,
        call_id=op.call_ids[0] if op.call_ids else op.operation_id,
        arguments=dict(op.arguments),
        state=state,
        output=_told_later(op.output),
        request_id=request_id,
        first_sent_at=op.first_sent_at,
        retention_seconds=op.retention_seconds,
        may_commit_until=op.may_commit_until,
    )


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - len(_CUT)] + _CUT


def _told_later(output: dict[str, Any] | None) -> dict[str, Any] | None:
    """What later messages are told of a write's output: what the model was told, without the service's whole
    answer (`result`), which the request's own answer put into words. Every later message's input holds it, so
    it is kept small; the state, the code and the message say what happened."""
    if output is None:
        return None
    return {k: v for k, v in output.items() if k != "result"}


def _size(model: BaseModel) -> int:
    return len(model.model_dump_json())


def keep_turn(state: ThreadState, turn: ThreadTurn) -> None:
    """Add a finished message's turn and its writes (newest state per operation); then drop what is past the
    bounds: the oldest turns, the oldest settled writes (an unknown one last), the oldest message records."""
    state.turns.append(turn)
    for op in turn.operations:
        state.operations.pop(op.operation_id, None)  # re-inserted: the index stays oldest first
        state.operations[op.operation_id] = op.model_copy(update={"arguments": {}})
    sizes = [_size(t) for t in state.turns]
    while len(state.turns) > 1 and (len(state.turns) > KEPT_TURNS or sum(sizes) > TURNS_BYTES):
        state.turns.pop(0)
        sizes.pop(0)
    op_sizes = {op_id: _size(op) for op_id, op in state.operations.items()}
    while sum(op_sizes.values()) > OPERATIONS_BYTES:
        settled = [op_id for op_id, op in state.operations.items() if op.state != "unknown"]
        dropped = settled[0] if settled else next(iter(state.operations))
        del state.operations[dropped]
        del op_sizes[dropped]
    del state.messages[: max(len(state.messages) - KEPT_MESSAGES, 0)]


def queue_has_room(state: ThreadState, message: ThreadMessage) -> bool:
    """Whether one more message may wait (at most MAX_QUEUED, QUEUE_BYTES in all)."""
    if len(state.queue) >= MAX_QUEUED:
        return False
    return sum(_size(m) for m in state.queue) + _size(message) <= QUEUE_BYTES


def context_for(state: ThreadState, thread_id: str, scope: str, shown_turns: int) -> ThreadContext:
    """What the next message's request is given: the newest `shown_turns` turns that fit CONTEXT_BYTES, and the
    thread's other writes (the newest state of each): with the turns' own, what a new proposal meets."""
    shown: list[ThreadTurn] = []
    budget = CONTEXT_BYTES
    for turn in reversed(state.turns[-shown_turns:] if shown_turns else []):
        budget -= _size(turn)
        if budget < 0:
            break
        shown.insert(0, turn)
    in_turns = {(op.operation_id, op.state) for turn in shown for op in turn.operations}
    # The shown turns hold their own writes already: only the others (and newer states) are added.
    others = [op for op in state.operations.values() if (op.operation_id, op.state) not in in_turns]
    return ThreadContext(thread_id=thread_id, scope=scope, turns=shown, operations=others)


def earlier_operations(context: ThreadContext | None) -> dict[str, ThreadOperation]:
    """Every earlier write of the thread by operation id, with its newest state: those of the shown turns,
    then the others (which hold any newer state)."""
    if context is None:
        return {}
    found = {op.operation_id: op for turn in context.turns for op in turn.operations}
    found.update((op.operation_id, op) for op in context.operations)
    return found


def earlier_items(context: ThreadContext | None) -> list[ConversationItem]:
    """The earlier messages as the model is shown them, before the new question: each question, each write as a
    call with the outcome its ledger recorded as the call's output, and the answer. Reads are not carried (their
    outputs were facts of that moment; the answer says what mattered, and a read can be asked again). Call ids
    are prefixed with the message's number: a model may use the same id in two requests."""
    items: list[ConversationItem] = []
    for turn in context.turns if context is not None else []:
        items.append(user_message(turn.question))
        for op in turn.operations:
            call_id = f"m{turn.number}_{op.call_id}"
            arguments = json.dumps(op.arguments, ensure_ascii=False, sort_keys=True)
            items.append(FunctionCallItem(call_id=call_id, name=op.tool, arguments=arguments))
            told = {**(op.output or {}), "operation_id": op.operation_id, "state": op.state}
            items.append(FunctionCallOutputItem(call_id=call_id, output=output_json(told)))
        answer = (
            turn.answer if turn.answer else f"(no answer: this request ended with {turn.stop_reason or 'no report'})"
        )
        items.append(MessageItem(role="assistant", content=answer))
    return items
