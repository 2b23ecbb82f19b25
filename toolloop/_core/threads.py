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
    ThreadContext,
    ThreadOperation,
    ThreadTurn,
    output_json,
    user_message,
)

# How many finished messages a thread keeps for its context (Limits.thread_turns is at most this), and how many
# message records for its list and its idempotency (a request id older than that is not recognised again).
KEPT_TURNS = 200
KEPT_MESSAGES = 1000
# A thread's workflow continues as new after this many messages (or sooner, when Temporal suggests it), once
# no message is running: its history stays bounded however long the conversation.
MESSAGES_PER_RUN = 50
# At most this many messages wait in a thread (its queue travels in its state from one run to the next).
MAX_QUEUED = 100

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
    before it that have not finished (0: it starts at once, and the answer comes once its request has started:
    `state` running); `attached` is True for a retry of a message the thread already has."""

    number: int
    request_id: str
    workflow_id: str
    ahead: int
    attached: bool = False
    state: MessageState = "queued"


class ThreadState(BaseModel):
    """What a thread carries from one run of its workflow to the next (continue-as-new)."""

    messages: list[MessageRecord] = Field(default_factory=list)
    queue: list[ThreadMessage] = Field(default_factory=list)
    turns: list[ThreadTurn] = Field(default_factory=list)
    # Writes of turns no longer kept that were left unknown: a later proposal must still meet them.
    older_unknown: list[ThreadOperation] = Field(default_factory=list)
    last_number: int = 0


class ThreadInput(BaseModel):
    thread_id: str
    actor: Actor
    # Set by the thread's own continue-as-new; None for a new thread.
    carried: ThreadState | None = None


class ThreadView(BaseModel):
    """The `get_thread` query's answer: the thread's messages, oldest first (at most KEPT_MESSAGES)."""

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


def turn_of(record: MessageRecord, question: str, report: AgentResult | None, why: str | None) -> ThreadTurn:
    """What later messages are told of a finished one: its writes as its ledger recorded them at its end. No
    report (the request was terminated or timed out): no answer, and `why`."""
    if report is None:
        return ThreadTurn(number=record.number, request_id=record.request_id, question=question, stop_reason=why)
    return ThreadTurn(
        number=record.number,
        request_id=record.request_id,
        question=question,
        answer=report.final_text,
        status=report.status,
        stop_reason=report.stop_reason,
        operations=[
            ThreadOperation(
                operation_id=op.operation_id,
                tool=op.tool,
                call_id=op.call_ids[0] if op.call_ids else op.operation_id,
                arguments=dict(op.arguments),
                state=op.state,
                output=_told_later(op.output),
                request_id=record.request_id,
                first_sent_at=op.first_sent_at,
                retention_seconds=op.retention_seconds,
            )
            for op in report.operations
        ],
    )


def _told_later(output: dict[str, Any] | None) -> dict[str, Any] | None:
    """What later messages are told of a write's output: what the model was told, without the service's whole
    answer (`result`), which the request's own answer put into words. Every later message's input holds it, so
    it is kept small; the state, the code and the message say what happened."""
    if output is None:
        return None
    return {k: v for k, v in output.items() if k != "result"}


def keep_turn(state: ThreadState, turn: ThreadTurn) -> None:
    """Add a finished message's turn; the oldest turns past KEPT_TURNS go, their unknown writes stay known."""
    state.turns.append(turn)
    while len(state.turns) > KEPT_TURNS:
        dropped = state.turns.pop(0)
        state.older_unknown.extend(op for op in dropped.operations if op.state == "unknown")
    del state.messages[: max(len(state.messages) - KEPT_MESSAGES, 0)]


def context_for(state: ThreadState, thread_id: str, scope: str, shown_turns: int) -> ThreadContext:
    """What the next message's request is given: the newest `shown_turns` turns, and every earlier write a new
    proposal must meet (those of the shown turns, and the unknown ones of any older turn)."""
    shown = state.turns[-shown_turns:] if shown_turns else []
    hidden = state.turns[: len(state.turns) - len(shown)]
    operations = [
        *state.older_unknown,
        *(op for turn in hidden for op in turn.operations if op.state == "unknown"),
        *(op for turn in shown for op in turn.operations),
    ]
    return ThreadContext(thread_id=thread_id, scope=scope, turns=shown, operations=operations)


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
