"""The scripted model endpoint on a real loopback socket, called by toolloop's real Responses client: each
endpoint fault as the client sees it, the turn chosen from the conversation (so a repeated call gets the
same turn), and a held call for a strike during a model turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from faultbed.model_endpoint import ScriptedModelEndpoint, endpoint_faults
from faultbed.plan import parse_plan
from toolloop._core.contracts import FunctionCallItem, FunctionCallOutputItem, MessageItem
from toolloop._models.errors import ModelCallError
from toolloop._models.responses import ResponsesClient
from toolloop.testing import call, say

TURNS = [
    [call("get_order_status", {"orderId": "A100"}, "r0"), call("get_order_status", {"orderId": "A102"}, "r1")],
    [call("create_calendar_event", {"title": "x"}, "w1")],
    [say("Done.")],
]


@pytest.fixture
async def endpoint() -> AsyncIterator[ScriptedModelEndpoint]:
    served = ScriptedModelEndpoint(timeout_hold_seconds=5)
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


def model_faults(*faults: dict[str, Any]) -> Any:
    plan = parse_plan({"name": "m", "faults": [{"boundary": "model", **f} for f in faults]})
    return endpoint_faults(plan.faults)


async def ask(endpoint: ScriptedModelEndpoint, conversation: list[Any], client_timeout: float = 5.0) -> list[Any]:
    client = ResponsesClient(api_key="sk-test", base_url=endpoint.url, model="m", timeout_seconds=client_timeout)
    async with client:
        return await client.respond(instructions="", conversation=conversation, tools=[])


def answered(*call_ids: str) -> list[Any]:
    return [FunctionCallOutputItem(call_id=c, output="{}") for c in call_ids]


async def test_the_turn_comes_from_the_conversation_so_a_repeated_call_gets_the_same_turn(
    endpoint: ScriptedModelEndpoint,
) -> None:
    endpoint.load(TURNS, [], seed=0)
    first = await ask(endpoint, [])
    again = await ask(endpoint, [])
    assert [i.call_id for i in first] == [i.call_id for i in again] == ["r0", "r1"]
    assert all(isinstance(i, FunctionCallItem) for i in first)
    # One read answered is not the turn done: the same turn again.
    assert [i.call_id for i in await ask(endpoint, [*first, *answered("r0")])] == ["r0", "r1"]
    [write] = await ask(endpoint, [*first, *answered("r0", "r1")])
    assert isinstance(write, FunctionCallItem) and write.name == "create_calendar_event"
    [final] = await ask(endpoint, [*first, *answered("r0", "r1"), write, *answered("w1")])
    assert isinstance(final, MessageItem) and endpoint.calls == 5


async def test_each_endpoint_fault_is_what_the_client_sees_on_its_call_number(endpoint: ScriptedModelEndpoint) -> None:
    endpoint.load(
        TURNS,
        model_faults(
            {"fault": "status_429", "when": {"nth": 1}},
            {"fault": "status_500", "when": {"nth": 2}},
            {"fault": "reset", "when": {"nth": 3}},
            {"fault": "timeout", "when": {"nth": 4}},
        ),
        seed=0,
    )
    with pytest.raises(ModelCallError) as busy:
        await ask(endpoint, [])
    assert (busy.value.kind, busy.value.retry_after_seconds) == ("temporary", 1.0)
    assert "HTTP 429" in busy.value.message
    with pytest.raises(ModelCallError, match="HTTP 500") as failed:
        await ask(endpoint, [])
    assert failed.value.kind == "temporary"
    with pytest.raises(ModelCallError, match="could not reach the model endpoint") as reset:
        await ask(endpoint, [])
    assert reset.value.kind == "temporary"
    with pytest.raises(ModelCallError, match="ReadTimeout") as slow:
        await ask(endpoint, [], client_timeout=0.5)
    assert slow.value.kind == "temporary"
    # The 5th call is answered, with the turn the conversation is at.
    assert [i.call_id for i in await ask(endpoint, [])] == ["r0", "r1"]
    assert dict(endpoint.fired) == {0: 1, 1: 1, 2: 1, 3: 1} and set(endpoint.first_fired_at) == {0, 1, 2, 3}


async def test_a_seeded_endpoint_fault_fires_on_the_same_calls_for_the_same_seed(
    endpoint: ScriptedModelEndpoint,
) -> None:
    async def outcomes(seed: int) -> list[bool]:
        endpoint.load(TURNS, model_faults({"fault": "status_500", "when": {"probability": 0.5}}), seed=seed)
        seen = []
        for _ in range(12):
            try:
                await ask(endpoint, [])
                seen.append(True)
            except ModelCallError:
                seen.append(False)
        return seen

    first = await outcomes(3)
    assert await outcomes(3) == first and False in first and True in first
    assert await outcomes(4) != first


async def test_a_paused_call_is_held_until_released(endpoint: ScriptedModelEndpoint) -> None:
    endpoint.load(TURNS, [], seed=0)
    arrived = endpoint.pause(2)
    assert [i.call_id for i in await ask(endpoint, [])] == ["r0", "r1"]  # call 1 is not held
    held = asyncio.create_task(ask(endpoint, []))
    await asyncio.wait_for(arrived.wait(), 5)
    await asyncio.sleep(0.3)
    assert not held.done()
    endpoint.release()
    assert [i.call_id for i in await asyncio.wait_for(held, 5)] == ["r0", "r1"]


async def test_a_streamed_answer_is_the_plain_one_and_each_stream_fault_breaks_it_mid_arguments(
    endpoint: ScriptedModelEndpoint,
) -> None:
    endpoint.load(
        TURNS,
        model_faults(
            {"fault": "stream_cut", "when": {"nth": 1}},
            {"fault": "stream_garbage", "when": {"nth": 2}},
            {"fault": "stream_stall", "when": {"nth": 3}},
        ),
        seed=0,
    )
    failures = []
    for _ in range(3):
        with pytest.raises(ModelCallError) as caught:
            await ask(endpoint, [], client_timeout=1.0)
        failures.append(caught.value)
    # Each broken stream is a temporary failure: the turn is asked again, nothing taken from its half.
    assert [f.kind for f in failures] == ["temporary"] * 3
    assert failures[1].message == "the model endpoint's stream carried a chunk that is not JSON"
    assert failures[2].message.startswith("the model endpoint did not answer within 1 s")
    streamed = await ask(endpoint, [])
    client = ResponsesClient(api_key="sk-test", base_url=endpoint.url, model="m", stream=False)
    async with client:
        plain = await client.respond(instructions="", conversation=[], tools=[])
    assert [(i.call_id, i.arguments) for i in streamed] == [(i.call_id, i.arguments) for i in plain]
    assert [i.arguments for i in streamed] == ['{"orderId": "A100"}', '{"orderId": "A102"}']
    assert dict(endpoint.fired) == {0: 1, 1: 1, 2: 1}
