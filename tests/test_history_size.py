"""End to end, a rule rather than a benchmark: a request's workflow history stays within 1.2x of the content
the request produced - the model's outputs and the tools' outputs, each stored once - whatever the number of
rounds. The model here checks that it was shown every earlier output whole, so storing an output once never
means the model sees less of it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from typing import Any

import pytest
from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowHandle

import toolloop
from toolloop import Actor, FunctionCallItem, FunctionCallOutputItem, MessageItem, ModelSpec, request_result
from toolloop._core.contracts import AgentResult, Limits, output_json
from toolloop.testing import answered_once, model_turns, start_request, worker

pytestmark = pytest.mark.e2e

READS_PER_ROUND = 2
# The growth measurement: 50 KB tool outputs (under a cap raised to let them through whole).
PAGE_CHARS = 50_000
BOUND = 1.2


def page_text(page_id: str) -> str:
    """A page's deterministic text, different for every page (so no two outputs are alike)."""
    seed = hashlib.sha256(page_id.encode()).hexdigest()
    return (f"{page_id} {seed} " * (PAGE_CHARS // 70 + 1))[:PAGE_CHARS]


class PageArgs(toolloop.Arguments):
    page_id: str = Field(alias="pageId", pattern=r"^P[0-9]{1,3}-[0-9]$", description="Page id, e.g. P1-0.")


class Page(BaseModel):
    page_id: str
    text: str


def paging_tools() -> toolloop.Toolset:
    tools = toolloop.Toolset()

    @tools.read(name="read_page")
    async def read_page(ctx: toolloop.ToolContext, args: PageArgs) -> Page:
        """One page of a long document."""
        return Page(page_id=args.page_id, text=page_text(args.page_id))

    return tools


class PagingModel:
    """Reads two pages per round for as many rounds as the request says, then answers. It refuses to go
    on unless the conversation holds every earlier output, whole and in order."""

    needs_conversation = True

    def label(self, model_name: str | None) -> str:
        return "paging"

    async def respond(self, request: toolloop.ModelRequest) -> list[toolloop.ConversationItem]:
        first = request.conversation[0]
        assert isinstance(first, MessageItem)
        rounds = int(first.text())
        shown = [json.loads(i.output) for i in request.conversation if isinstance(i, FunctionCallOutputItem)]
        expected = [f"P{t}-{i}" for t in range(1, request.turn) for i in range(READS_PER_ROUND)]
        if [o.get("page_id") for o in shown] != expected or any(o["text"] != page_text(o["page_id"]) for o in shown):
            raise toolloop.ModelCallError("malformed", f"turn {request.turn}: the earlier outputs are not all shown")
        if request.turn > rounds:
            return [MessageItem(content=[{"type": "output_text", "text": f"Read {len(shown)} pages."}])]
        return [
            FunctionCallItem(
                call_id=f"c{request.turn}-{i}",
                name="read_page",
                arguments=json.dumps({"pageId": f"P{request.turn}-{i}"}),
            )
            for i in range(READS_PER_ROUND)
        ]


async def history_bytes(handle: WorkflowHandle[Any, Any]) -> int:
    return sum([event.ByteSize() async for event in handle.fetch_history_events()])


async def content_bytes(handle: WorkflowHandle[Any, AgentResult]) -> int:
    """What the request produced: every model turn's output items and every tool output, once each."""
    model_outputs = sum(
        len(json.dumps([item.model_dump(mode="json") for item in result.items]))
        for _, result in await model_turns(handle)
        if result is not None
    )
    tool_outputs = sum(len(output_json(output)) for output in (await answered_once(handle)).values())
    return model_outputs + tool_outputs


@pytest.mark.parametrize("rounds", [1, 5, 20, 40])
async def test_history_stays_within_the_bound_of_the_content_produced(client: Client, rounds: int) -> None:
    queue = f"history-{uuid.uuid4().hex[:8]}"
    async with worker(client, paging_tools(), task_queue=queue, models={"paging": PagingModel()}):
        handle = await start_request(
            client,
            str(rounds),
            actor=Actor(user_id="u1", tenant_id="acme"),
            task_queue=queue,
            model=ModelSpec(provider="paging"),
            limits=Limits(
                max_rounds=rounds + 1, max_total_calls=READS_PER_ROUND * rounds, max_tool_output_bytes=65_536
            ),
        )
        result = await asyncio.wait_for(request_result(handle), timeout=120)
        assert (result.status, result.final_text) == ("completed", f"Read {READS_PER_ROUND * rounds} pages.")
        assert len(result.calls) == READS_PER_ROUND * rounds
        stored, produced = await history_bytes(handle), await content_bytes(handle)
    assert produced >= READS_PER_ROUND * rounds * PAGE_CHARS
    assert stored <= BOUND * produced, f"{rounds} rounds: history {stored} B for {produced} B of content"
