"""Pure tests of the conversation state behind the model turns (activities/conversation.py): what the model is
shown before each turn comes from the per-worker cache, or is rebuilt from the run's own turn history - the
instructions of turn 1 included - and a history that lacks a turn is an error, never a guess."""

from __future__ import annotations

import pytest

from toolloop._core.contracts import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ModelTurnInput,
    items_digest,
    text_digest,
)
from toolloop.activities.conversation import (
    Conversation,
    ConversationState,
    MissingTurn,
    RunKey,
    ToolOutputStore,
    with_outputs,
)

RUN = RunKey("wf-1", "run-1")


def user(text: str) -> MessageItem:
    return MessageItem(role="user", content=text)


def said(text: str) -> MessageItem:
    return MessageItem(content=[{"type": "output_text", "text": text}])


def turn_input(turn: int, *items: ConversationItem, instructions: str | None = None) -> ModelTurnInput:
    return ModelTurnInput(turn=turn, new_items=list(items), provider="offline", instructions=instructions)


class RecordedHistory:
    """Turn history kept in memory (what TemporalTurnHistory decodes from a real run), counting its reads."""

    def __init__(self, turns: list[tuple[ModelTurnInput, list[ConversationItem] | None]]) -> None:
        self._turns = turns
        self.reads = 0
        self.first_reads = 0

    async def turns(self, run: RunKey) -> list[tuple[ModelTurnInput, list[ConversationItem] | None]]:
        self.reads += 1
        return list(self._turns)

    async def first_input(self, run: RunKey) -> ModelTurnInput | None:
        self.first_reads += 1
        return next((turn_input for turn_input, _ in self._turns if turn_input.turn == 1), None)


CALL = FunctionCallItem(call_id="c1", name="get_order_status", arguments='{"orderId":"A100"}')
OUTPUT = FunctionCallOutputItem(call_id="c1", output='{"ok":true}')


async def test_the_first_turn_starts_from_the_request_and_its_instructions() -> None:
    history = RecordedHistory([])
    state = ConversationState(history)
    first = await state.before(RUN, turn_input(1, user("where is A100?"), instructions="Be brief."))
    assert first == Conversation("Be brief.", [user("where is A100?")])
    assert history.reads == 0


async def test_later_turns_come_from_the_cache_without_reading_history() -> None:
    history = RecordedHistory([])
    state = ConversationState(history)
    first = await state.before(RUN, turn_input(1, user("q"), instructions="Be brief."))
    state.after(RUN, 1, first.extended([CALL]), [CALL])
    second = await state.before(RUN, turn_input(2, OUTPUT))
    assert second == Conversation("Be brief.", [user("q"), CALL, OUTPUT])
    assert history.reads == 0


async def test_a_miss_is_rebuilt_from_history_with_the_first_turns_instructions() -> None:
    history = RecordedHistory(
        [
            (turn_input(1, user("q"), instructions="Be brief."), [CALL]),
            (turn_input(2, OUTPUT), [said("A100 shipped.")]),
        ]
    )
    state = ConversationState(history)  # a new worker: nothing cached
    third = await state.before(RUN, turn_input(3, user("and A101?")))
    assert third.instructions == "Be brief."
    assert third.items == [user("q"), CALL, OUTPUT, said("A100 shipped."), user("and A101?")]
    assert history.reads == 1


async def test_a_cache_entry_for_another_turn_is_not_used() -> None:
    history = RecordedHistory([(turn_input(1, user("q")), [CALL]), (turn_input(2, OUTPUT), [said("done")])])
    state = ConversationState(history)
    state.after(
        RUN, 1, Conversation(None, [user("q"), CALL]), [CALL]
    )  # the worker missed turn 2 (another worker ran it)
    third = await state.before(RUN, turn_input(3, user("next")))
    assert third.items == [user("q"), CALL, OUTPUT, said("done"), user("next")]
    assert history.reads == 1


async def test_a_history_without_an_earlier_turn_is_an_error() -> None:
    state = ConversationState(RecordedHistory([(turn_input(1, user("q")), [CALL])]))
    with pytest.raises(MissingTurn, match="turn 2 is missing"):
        await state.before(RUN, turn_input(3, user("next")))


async def test_the_cache_is_bounded_by_bytes_and_evicts_the_least_recent_run() -> None:
    history = RecordedHistory([(turn_input(1, user("q")), [CALL])])
    one_run = Conversation(None, [user("q"), CALL])
    size = sum(len(item.model_dump_json()) + 512 for item in one_run.items)
    state = ConversationState(history, max_bytes=2 * size)  # room for two runs
    runs = [RunKey("wf", f"run-{i}") for i in range(3)]
    for run in runs:
        state.after(run, 1, one_run, [CALL])
    for run in runs[1:]:
        await state.before(run, turn_input(2, OUTPUT))
    assert history.reads == 0
    await state.before(runs[0], turn_input(2, OUTPUT))  # evicted: rebuilt from history
    assert history.reads == 1


async def test_a_growing_run_is_measured_by_what_it_holds_now() -> None:
    history = RecordedHistory([])
    big = FunctionCallOutputItem(call_id="c1", output="x" * 10_000)
    small = Conversation(None, [user("q")])
    grown = Conversation(None, [user("q"), CALL, big, big, big])

    def size(c: Conversation) -> int:
        return sum(len(item.model_dump_json()) + 512 for item in c.items)

    # Room for the grown run, not for it and the small one as well.
    state = ConversationState(history, max_bytes=size(grown) + size(small) - 1)
    run, other = RunKey("wf", "grows"), RunKey("wf", "small")
    state.after(other, 1, small, [])
    for turn in (1, 2):
        state.after(run, turn, Conversation(None, grown.items[: 2 + turn]), [])
    assert await state.before(other, turn_input(2, OUTPUT)) is not None and history.reads == 0
    state.after(run, 3, grown, [])  # its third output pushes the least recent run (the small one) out
    assert await state.before(run, turn_input(4, OUTPUT)) is not None and history.reads == 0
    with pytest.raises(MissingTurn):
        await state.before(other, turn_input(2, OUTPUT))  # evicted, and the (empty) history lacks it
    assert history.reads == 1


async def test_thousands_of_open_runs_stay_cached_under_the_default_bound() -> None:
    # The benchmark's scale phase: 5,000 requests open at once, each between its first and second turn.
    history = RecordedHistory([])
    state = ConversationState(history)
    runs = [RunKey("wf", f"run-{i}") for i in range(5000)]
    for run in runs:
        state.after(run, 1, Conversation(None, [user("where is A100? " * 20), CALL, CALL, CALL]), [CALL, CALL, CALL])
    for run in runs:
        await state.before(run, turn_input(2, OUTPUT))
    assert history.reads == 0


# --- Tool outputs by reference -------------------------------------------------------------------------

REF = FunctionCallOutputItem(call_id="c1", output="")


def referring(turn: int) -> ModelTurnInput:
    """A turn whose c1 output is the previous round's tool activity result, sent by reference."""
    return ModelTurnInput(turn=turn, new_items=[REF], provider="offline", outputs_in_history=["c1"])


def test_with_outputs_fills_only_the_referred_outputs_and_refuses_a_missing_one() -> None:
    inline = FunctionCallOutputItem(call_id="c2", output='{"ok":false,"code":"LIMIT_REACHED"}')
    inp = ModelTurnInput(turn=2, new_items=[REF, inline], provider="offline", outputs_in_history=["c1"])
    filled = with_outputs(inp, {"c1": '{"ok":true}', "c2": "not used"})
    assert filled.new_items == [OUTPUT, inline] and filled.outputs_in_history == []
    with pytest.raises(MissingTurn, match="no tool output for c1"):
        with_outputs(inp, {})


async def test_a_referred_output_comes_from_this_workers_store_without_reading_history() -> None:
    history = RecordedHistory([])
    state = ConversationState(history)
    state.after(RUN, 1, Conversation(None, [user("q"), CALL]), [CALL])
    state.outputs.put(RUN, 1, "c1", '{"ok":true}')
    second = await state.before(RUN, referring(2))
    assert second.items == [user("q"), CALL, OUTPUT]
    assert history.reads == 0
    # Taken once: a retry of the turn reads it from history.
    assert state.outputs.take(RUN, 1, ["c1"]) is None


async def test_a_referred_output_another_worker_produced_is_read_from_history() -> None:
    history = RecordedHistory(
        [(turn_input(1, user("q")), [CALL]), (with_outputs(referring(2), {"c1": '{"ok":true}'}), None)]
    )
    state = ConversationState(history)
    state.after(RUN, 1, Conversation(None, [user("q"), CALL]), [CALL])
    second = await state.before(RUN, referring(2))
    assert second.items == [user("q"), CALL, OUTPUT]
    assert history.reads == 1
    assert (await state.without_conversation(RUN, referring(2))).items == [OUTPUT]


async def test_outputs_of_another_round_or_run_are_not_taken() -> None:
    store = ToolOutputStore()
    store.put(RUN, 1, "c1", "a")
    assert store.take(RUN, 2, ["c1"]) is None
    assert store.take(RunKey("wf-1", "run-2"), 1, ["c1"]) is None
    assert store.take(RUN, 1, ["c1"]) == {"c1": "a"}


def test_the_output_store_is_bounded_by_bytes_and_evicts_the_oldest() -> None:
    store = ToolOutputStore(max_bytes=10)
    store.put(RUN, 1, "c1", "x" * 6)
    store.put(RUN, 1, "c2", "y" * 6)
    assert store.take(RUN, 1, ["c1"]) is None
    assert store.take(RUN, 1, ["c2"]) == {"c2": "y" * 6}


async def test_a_turn_an_attempt_answered_after_its_recorded_retry_is_not_what_the_model_is_shown() -> None:
    # A model turn that timed out goes on running on its worker. Its retry (attempt 2) was recorded with call B;
    # attempt 1 then finished with call A and its conversation replaced the cached one. The next turn was shown
    # A, which never ran, beside B's output. The workflow now names the items history recorded.
    other = FunctionCallItem(call_id="c2", name="cancel_order", arguments='{"orderId":"A102"}')
    answer = FunctionCallOutputItem(call_id="c2", output='{"ok":true}')
    history = RecordedHistory([(turn_input(1, user("q")), [other])])
    state = ConversationState(history)
    first = await state.before(RUN, turn_input(1, user("q")))
    state.after(RUN, 1, first.extended([other]), [other])  # attempt 2, recorded
    state.after(RUN, 1, first.extended([CALL]), [CALL])  # attempt 1, late
    second = turn_input(2, answer)
    second.previous_turn_digest = items_digest([other])
    assert (await state.before(RUN, second)).items == [user("q"), other, answer]
    assert history.reads == 1
    # With the recorded attempt's copy in the cache, nothing is read.
    state.after(RUN, 1, first.extended([other]), [other])
    assert (await state.before(RUN, second)).items == [user("q"), other, answer] and history.reads == 1


def test_a_tools_output_left_by_an_attempt_given_up_on_is_not_taken() -> None:
    store = ToolOutputStore()
    recorded, late = '{"ok":true,"status":"shipped"}', '{"code":"INTERNAL","ok":false}'
    store.put(RUN, 1, "c1", recorded)
    store.put(RUN, 1, "c1", late)  # the attempt Temporal had retried finished last
    assert store.take(RUN, 1, ["c1"], {"c1": text_digest(recorded)}) is None  # read from history instead
    store.put(RUN, 1, "c1", recorded)
    assert store.take(RUN, 1, ["c1"], {"c1": text_digest(recorded)}) == {"c1": recorded}


async def test_a_turn_with_oversized_arguments_is_cached_as_history_holds_it() -> None:
    # A hostile turn proposes a call with 70 KB of arguments: history keeps its first KiB (answered BAD_ARGUMENTS,
    # never run). The next turn on the same worker was shown the whole 70 KB again (and paid for it), while one on
    # another worker was shown the cut version: what the model sees must not depend on which worker runs it.
    from temporalio.testing import ActivityEnvironment

    from toolloop._core.registry import ToolRegistry
    from toolloop._models.adapter import ModelRequest
    from toolloop.activities.model_turn import ModelActivities

    big = FunctionCallItem(call_id="c1", name="get_order_status", arguments='{"orderId":"' + "A" * 70_000 + '"}')
    seen: list[list[ConversationItem]] = []

    class Recording:
        needs_conversation = True

        def label(self, model_name: str | None) -> str:
            return "fake"

        async def respond(self, request: ModelRequest) -> list[ConversationItem]:
            seen.append(list(request.conversation))
            return [big] if request.turn == 1 else [said("done")]

    history = RecordedHistory([])
    state = ConversationState(history)
    activities = ModelActivities(ToolRegistry(), None, {"offline": Recording()}, conversations=state)  # type: ignore[arg-type]
    env = ActivityEnvironment()
    first = await env.run(activities.model_turn, turn_input(1, user("hi")))
    [stored] = [item for item in first.items if isinstance(item, FunctionCallItem)]
    assert len(stored.arguments) < 2_000  # what history holds
    second = turn_input(2, FunctionCallOutputItem(call_id="c1", output='{"ok":false}'))
    second.previous_turn_digest = items_digest(first.items)
    await env.run(activities.model_turn, second)
    [shown] = [item for item in seen[1] if isinstance(item, FunctionCallItem)]
    assert shown.arguments == stored.arguments
    assert history.reads == 0  # from the worker's cache, which now holds what history holds


async def test_an_adapter_without_a_conversation_is_given_the_requests_instructions_on_every_turn() -> None:
    # Only turn 1's input carries the request's instructions. An adapter that keeps no conversation (its state
    # on the provider's side) was given them on turn 1 and the worker's default from turn 2 on: a request's
    # "never refund more than X" silently dropped. Now from the worker's memory, or from history on another worker.
    from temporalio.testing import ActivityEnvironment

    from toolloop._core.registry import ToolRegistry
    from toolloop._models.adapter import ModelRequest
    from toolloop.activities.model_turn import ModelActivities

    given: list[str] = []

    class Stateless:
        needs_conversation = False

        def label(self, model_name: str | None) -> str:
            return "fake"

        async def respond(self, request: ModelRequest) -> list[ConversationItem]:
            given.append(request.instructions)
            return [said("ok")]

    first = turn_input(1, user("hi"), instructions="never refund more than 5 EUR")
    second = turn_input(2, user("and now?"))
    env = ActivityEnvironment()
    same_worker = ModelActivities(
        ToolRegistry(),
        None,  # type: ignore[arg-type]
        {"offline": Stateless()},
        conversations=ConversationState(RecordedHistory([])),
    )
    await env.run(same_worker.model_turn, first)
    await env.run(same_worker.model_turn, second)
    history = RecordedHistory([(first, [said("ok")])])
    other_worker = ModelActivities(
        ToolRegistry(),
        None,  # type: ignore[arg-type]
        {"offline": Stateless()},
        conversations=ConversationState(history),
    )
    await env.run(other_worker.model_turn, second)
    assert given == ["never refund more than 5 EUR"] * 3
    # Turn 1's input only, no whole history: this turn's outputs need none.
    assert (history.reads, history.first_reads) == (0, 1)


async def test_the_instructions_kept_per_run_are_bounded_even_for_requests_without_any() -> None:
    # Counted by their text alone, entries of requests without instructions weighed nothing: never evicted.
    history = RecordedHistory([])
    state = ConversationState(history, max_bytes=16 * 200 * 100)  # room for 100 such entries
    for number in range(1_000):
        await state.without_conversation(RunKey(f"wf-{number}", "run"), turn_input(1, user("q")))
    kept = sum(1 for number in range(1_000) if state._instructions.get(RunKey(f"wf-{number}", "run")) is not None)
    assert kept <= 100 and history.reads == history.first_reads == 0
