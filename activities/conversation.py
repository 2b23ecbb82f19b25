"""Activity side (I/O): the conversation state of the model turns - what the model has seen so far in one
workflow run, behind a small interface.

A model turn's input carries only the items new since the previous turn, and refers to the tool outputs
of the previous round instead of repeating them (so each item is stored in history once and history grows
linearly with the rounds). The state before a turn comes from a bounded per-worker cache, and the outputs
from the worker's output store; on a miss (another worker ran the earlier turns or the tools, or this one
restarted) both are rebuilt from the run's own history: turn N's new items and its output items, for every
earlier N, the instructions of turn 1, and the tool activities' results (and a write's output where its
completing attempt establishes it alone: contracts.write_output_in_attempt).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from toolloop._core.contracts import (
    ConversationItem,
    FunctionCallOutputItem,
    ModelTurnInput,
    ModelTurnResult,
    ToolCallInput,
    ToolCallResult,
    WriteInput,
    WriteOutcome,
    items_digest,
    output_json,
    text_digest,
    write_output_in_attempt,
)
from toolloop._core.names import EXECUTE_WRITE_ACTIVITY, MODEL_TURN_ACTIVITY, RUN_TOOL_ACTIVITY
from toolloop._temporal.converter import data_converter

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
    """The run's history lacks an earlier turn or a tool output (retrying cannot fix that)."""


# A turn as recorded: its input (tool outputs filled in) and its output items, None while it runs.
RecordedTurn = tuple[ModelTurnInput, list[ConversationItem] | None]


def with_outputs(inp: ModelTurnInput, outputs: Mapping[str, str]) -> ModelTurnInput:
    """The turn's input with the tool outputs it refers to filled in (what the model is shown). The
    workflow sends an output by reference when it is exactly a tool activity's result of the previous
    round, so it is stored in history once."""
    if not inp.outputs_in_history:
        return inp
    missing = [call_id for call_id in inp.outputs_in_history if call_id not in outputs]
    if missing:
        raise MissingTurn(f"turn {inp.turn}: no tool output for {', '.join(missing)} in this run")
    refs = set(inp.outputs_in_history)
    items: list[ConversationItem] = [
        FunctionCallOutputItem(call_id=item.call_id, output=outputs[item.call_id])
        if isinstance(item, FunctionCallOutputItem) and item.call_id in refs
        else item
        for item in inp.new_items
    ]
    return inp.model_copy(update={"new_items": items, "outputs_in_history": []})


async def recorded_turns(handle: WorkflowHandle[Any, Any]) -> list[tuple[ModelTurnInput, ModelTurnResult | None]]:
    """Every model turn of the run in order, decoded from its history: its input, the tool outputs it
    refers to filled in, and its result (None while it runs). A turn run as a local activity stored no
    input: its result's record of what it was given stands in for it."""
    converter = data_converter()
    inputs: dict[int, ModelTurnInput] = {}
    results: dict[int, ModelTurnResult] = {}
    tool_calls: dict[int, tuple[int, str]] = {}
    tool_outputs: dict[tuple[int, str], str] = {}
    write_attempts: dict[int, WriteInput] = {}
    # The round of the latest turn with a result: a write's output after it is of that round (the tools of
    # a round run after its turn, and the next turn only after all of them).
    last_round = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == MODEL_TURN_ACTIVITY:
                [turn_input] = await converter.decode(attrs.input.payloads, [ModelTurnInput])
                # The outputs it refers to are results of the previous round, all earlier in history.
                inputs[event.event_id] = with_outputs(turn_input, _outputs_of(tool_outputs, turn_input.turn - 1))
            elif attrs.activity_type.name == RUN_TOOL_ACTIVITY:
                [call] = await converter.decode(attrs.input.payloads, [ToolCallInput])
                tool_calls[event.event_id] = (call.round, call.call_id)
            elif attrs.activity_type.name == EXECUTE_WRITE_ACTIVITY:
                [attempt] = await converter.decode(attrs.input.payloads, [WriteInput])
                write_attempts[event.event_id] = attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in inputs:
                [results[done.scheduled_event_id]] = await converter.decode(done.result.payloads, [ModelTurnResult])
                last_round = inputs[done.scheduled_event_id].turn
            elif done.scheduled_event_id in tool_calls:
                [tool_result] = await converter.decode(done.result.payloads, [ToolCallResult])
                tool_outputs[tool_calls[done.scheduled_event_id]] = output_json(tool_result.output)
            elif (attempt := write_attempts.get(done.scheduled_event_id)) is not None:
                # A write runs after its round's turn (see last_round).
                [outcome] = await converter.decode(done.result.payloads, [WriteOutcome])
                told = write_output_in_attempt(attempt, outcome)
                if told is not None:
                    tool_outputs[(last_round, attempt.call_id)] = told
    return [(inputs[event_id], results.get(event_id)) for event_id in sorted(inputs)]


def _outputs_of(tool_outputs: Mapping[tuple[int, str], str], round_: int) -> dict[str, str]:
    return {call_id: output for (rnd, call_id), output in tool_outputs.items() if rnd == round_}


class TurnHistory(Protocol):
    """Where turns are read back from: each model turn's input (tool outputs filled in) and output items."""

    async def turns(self, run: RunKey) -> list[RecordedTurn]: ...

    async def first_input(self, run: RunKey) -> ModelTurnInput | None:
        """Turn 1's input as history recorded it (the request's instructions ride on it); None before it."""
        ...


class TemporalTurnHistory:
    """Turns decoded from the workflow run's own history."""

    def __init__(self, client: Client) -> None:
        self._temporal = client

    async def turns(self, run: RunKey) -> list[RecordedTurn]:
        handle = self._temporal.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        turns = await recorded_turns(handle)
        return [(turn_input, None if result is None else list(result.items)) for turn_input, result in turns]

    async def first_input(self, run: RunKey) -> ModelTurnInput | None:
        # Read only as far as turn 1's scheduling, a few events into the run: nothing else is decoded.
        handle = self._temporal.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == MODEL_TURN_ACTIVITY:
                    [turn_input] = await data_converter().decode(attrs.input.payloads, [ModelTurnInput])
                    first: ModelTurnInput = turn_input
                    return first
        return None


K = TypeVar("K")
V = TypeVar("V")


class BytesBoundedCache(Generic[K, V]):
    """Worker-local entries with a size each; the least recently used go first once the sizes add up to
    more than `max_bytes` (a count bound would evict at thousands of open requests)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def entry(self, key: K) -> tuple[V, int] | None:
        """The value and its size, as the most recently used."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def get(self, key: K) -> V | None:
        found = self.entry(key)
        return None if found is None else found[0]

    def pop(self, key: K) -> V | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self._bytes -= found[1]
        return found[0]

    def put(self, key: K, value: V, size: int) -> None:
        self.pop(key)
        self._entries[key] = (value, size)
        self._bytes += size
        while self._bytes > self._max_bytes and self._entries:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted


class ToolOutputStore:
    """Worker-local: the outputs this worker's tool activities returned, until the next model turn of the
    same run takes them (the workflow refers to them rather than storing them again). Bounded by bytes; a
    miss (another worker ran the tool, a retry, a restart) is read from the run's history instead."""

    def __init__(self, max_bytes: int = 32 * 1024 * 1024) -> None:
        self._outputs: BytesBoundedCache[tuple[RunKey, int, str], str] = BytesBoundedCache(max_bytes)

    def put(self, run: RunKey, round_: int, call_id: str, output: str) -> None:
        self._outputs.put((run, round_, call_id), output, len(output))

    def take(
        self, run: RunKey, round_: int, call_ids: Sequence[str], digests: Mapping[str, str] | None = None
    ) -> dict[str, str] | None:
        """Those outputs, removed from the store; None unless every one was here and is the text history holds
        (`digests`, by call id: a tool attempt Temporal had given up on may have finished after its retry)."""
        found: dict[str, str] = {}
        for call_id in call_ids:
            output = self._outputs.pop((run, round_, call_id))
            expected = (digests or {}).get(call_id)
            if output is not None and (expected is None or text_digest(output) == expected):
                found[call_id] = output
        return found if len(found) == len(call_ids) else None


# What an item holds besides its JSON text (the objects around it), so many small items count too.
_ITEM_OVERHEAD_BYTES = 512


def bytes_of(items: Sequence[ConversationItem]) -> int:
    """About what `items` hold in memory (a cache's measure)."""
    return sum(len(item.model_dump_json()) + _ITEM_OVERHEAD_BYTES for item in items)


# What a cache entry costs beyond its text (the key, the tuple): so that empty entries still count.
_ENTRY_BYTES = 200


class ConversationState:
    """The conversation before each model turn: from the cache, else rebuilt from the turn history; and
    this turn's tool outputs, from the worker's output store, else from the turn history."""

    def __init__(
        self, history: TurnHistory, outputs: ToolOutputStore | None = None, max_bytes: int = 256 * 1024 * 1024
    ) -> None:
        self._history = history
        self._outputs = outputs or ToolOutputStore()
        # By bytes: with a count bound, a run evicted at thousands of open requests has its next turn
        # read its whole history back (server and worker CPU per request rise with load).
        # Per run: the turn, the digest of that turn's items (items_digest) and the conversation through them.
        self._entries: BytesBoundedCache[RunKey, tuple[int, str, Conversation]] = BytesBoundedCache(max_bytes)
        # Per run, the request's instructions, for adapters that keep no conversation (only turn 1 carries them).
        self._instructions: BytesBoundedCache[RunKey, tuple[str | None]] = BytesBoundedCache(max_bytes // 16)

    @property
    def outputs(self) -> ToolOutputStore:
        return self._outputs

    async def without_conversation(self, run: RunKey, inp: ModelTurnInput) -> Conversation:
        """What an adapter that keeps no conversation is shown: the request's own instructions (only turn 1's
        input holds them: kept per run, else read from history) and this turn's new items, tool outputs filled in."""
        filled = self._from_store(run, inp)
        first: ModelTurnInput | None = None
        if filled is None:
            turns = await self._history.turns(run)
            filled = self._current(turns, inp)
            first = next((turn_input for turn_input, _ in turns if turn_input.turn == 1), None)
        if inp.turn == 1:
            first = inp
        kept = self._instructions.get(run)
        if kept is None:
            if first is None:
                first = await self._history.first_input(run)
            kept = (first.instructions if first is not None else None,)
            # Counted with an entry's own cost, so runs without instructions are bounded too.
            self._instructions.put(run, kept, len(kept[0] or "") + _ENTRY_BYTES)
        return Conversation(kept[0], list(filled.new_items))

    async def before(self, run: RunKey, inp: ModelTurnInput) -> Conversation:
        """The conversation through this turn's new items."""
        filled = self._from_store(run, inp)
        earlier = (
            Conversation(instructions=inp.instructions)
            if inp.turn == 1
            else self._cached(run, inp.turn - 1, inp.previous_turn_digest)
        )
        if filled is None or earlier is None:
            turns = await self._history.turns(run)
            if filled is None:
                filled = self._current(turns, inp)
            if earlier is None:
                earlier = self._rebuild(turns, inp.turn)
        return earlier.extended(filled.new_items)

    def after(self, run: RunKey, turn: int, conversation: Conversation, output: Sequence[ConversationItem]) -> None:
        """Remember the conversation through this turn's `output` (its items, as the turn returns them)."""
        size = None
        cached = self._entries.entry(run)
        if cached is not None:
            (before, _, earlier), earlier_size = cached
            # It extends the one cached before its turn: only the new items are measured.
            if before == turn - 1 and len(earlier.items) <= len(conversation.items):
                size = earlier_size + bytes_of(conversation.items[len(earlier.items) :])
        if size is None:
            size = bytes_of(conversation.items)
        self._entries.put(run, (turn, items_digest(output), conversation), size)

    def _from_store(self, run: RunKey, inp: ModelTurnInput) -> ModelTurnInput | None:
        if not inp.outputs_in_history:
            return inp
        outputs = self._outputs.take(run, inp.turn - 1, inp.outputs_in_history, inp.output_digests)
        return None if outputs is None else with_outputs(inp, outputs)

    @staticmethod
    def _current(turns: list[RecordedTurn], inp: ModelTurnInput) -> ModelTurnInput:
        for turn_input, _ in turns:
            if turn_input.turn == inp.turn:
                return turn_input
        raise MissingTurn(f"turn {inp.turn} is not in this run's history")

    def _cached(self, run: RunKey, turn: int, digest: str | None) -> Conversation | None:
        """The cached conversation through `turn`, if it holds the items history recorded for it (`digest`)."""
        entry = self._entries.get(run)
        if entry is None:
            return None
        cached_turn, cached_digest, conversation = entry
        if cached_turn != turn or (digest is not None and digest != cached_digest):
            return None
        return Conversation(conversation.instructions, list(conversation.items))

    @staticmethod
    def _rebuild(turns: list[RecordedTurn], turn: int) -> Conversation:
        found = {turn_input.turn: (turn_input, output) for turn_input, output in turns if turn_input.turn < turn}
        conversation = Conversation(instructions=found[1][0].instructions if 1 in found else None)
        for number in range(1, turn):
            if number not in found or found[number][1] is None:
                raise MissingTurn(f"cannot rebuild the conversation: turn {number} is missing from history")
            turn_input, output = found[number]
            conversation.items += [*turn_input.new_items, *(output or [])]
        logger.info("conversation rebuilt from history", extra={"turns": turn - 1})
        return conversation
