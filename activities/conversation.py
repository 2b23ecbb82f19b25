"""Activity side (I/O): the conversation state of the model turns - what the model has seen so far in one
workflow run, behind a small interface.

A model turn's input carries only the items new since the previous turn (so each item is stored in history
once and history grows linearly with the rounds). The state before a turn comes from a bounded per-worker
cache; on a miss (another worker ran the earlier turns, or this one restarted) it is rebuilt from the run's
own history: turn N's new items and its output items, for every earlier N, and the instructions of turn 1.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from toolloop._core.contracts import ConversationItem, ModelTurnInput, ModelTurnResult
from toolloop._core.names import MODEL_TURN_ACTIVITY

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunKey:
    workflow_id: str
    run_id: str


@dataclass
class Conversation:
    """Everything the model has been shown in one run: the request's own instructions (None: the worker's)
    and the items, in order."""

    instructions: str | None = None
    items: list[ConversationItem] = field(default_factory=list)

    def extended(self, items: Sequence[ConversationItem]) -> Conversation:
        return Conversation(self.instructions, [*self.items, *items])


class MissingTurn(Exception):
    """The run's history lacks an earlier turn (retrying cannot fix that)."""


class TurnHistory(Protocol):
    """Where earlier turns are read back from: each finished model turn's input and output items."""

    def turns(self, run: RunKey, before: int) -> AsyncIterator[tuple[ModelTurnInput, list[ConversationItem]]]: ...


class TemporalTurnHistory:
    """Earlier turns decoded from the workflow run's own history."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def turns(self, run: RunKey, before: int) -> AsyncIterator[tuple[ModelTurnInput, list[ConversationItem]]]:
        handle = self._client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        converter = self._client.data_converter
        scheduled: dict[int, ModelTurnInput] = {}
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name != MODEL_TURN_ACTIVITY:
                    continue
                [turn_input] = await converter.decode(attrs.input.payloads, [ModelTurnInput])
                if turn_input.turn < before:
                    scheduled[event.event_id] = turn_input
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                done = event.activity_task_completed_event_attributes
                turn_input = scheduled.get(done.scheduled_event_id)
                if turn_input is not None:
                    [result] = await converter.decode(done.result.payloads, [ModelTurnResult])
                    yield turn_input, list(result.items)


class ConversationState:
    """The conversation before each model turn: from the cache, else rebuilt from the turn history."""

    def __init__(self, history: TurnHistory, capacity: int = 256) -> None:
        self._history = history
        self._capacity = capacity
        self._entries: OrderedDict[RunKey, tuple[int, Conversation]] = OrderedDict()

    async def before(self, run: RunKey, inp: ModelTurnInput) -> Conversation:
        """The conversation through this turn's new items."""
        if inp.turn == 1:
            earlier = Conversation(instructions=inp.instructions)
        else:
            earlier = self._cached(run, inp.turn - 1) or await self._rebuild(run, inp.turn)
        return earlier.extended(inp.new_items)

    def after(self, run: RunKey, turn: int, conversation: Conversation) -> None:
        """Remember the conversation through this turn's output."""
        self._entries[run] = (turn, conversation)
        self._entries.move_to_end(run)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def _cached(self, run: RunKey, turn: int) -> Conversation | None:
        entry = self._entries.get(run)
        if entry is None or entry[0] != turn:
            return None
        self._entries.move_to_end(run)
        return Conversation(entry[1].instructions, list(entry[1].items))

    async def _rebuild(self, run: RunKey, turn: int) -> Conversation:
        found: dict[int, tuple[ModelTurnInput, list[ConversationItem]]] = {}
        async for turn_input, output in self._history.turns(run, before=turn):
            found[turn_input.turn] = (turn_input, output)
        conversation = Conversation(instructions=found[1][0].instructions if 1 in found else None)
        for number in range(1, turn):
            if number not in found:
                raise MissingTurn(f"cannot rebuild the conversation: turn {number} is missing from history")
            turn_input, output = found[number]
            conversation.items += [*turn_input.new_items, *output]
        logger.info("conversation rebuilt from history", extra={"turns": turn - 1})
        return conversation
