"""End to end: toolloop.testing's request helpers are shortcuts over toolloop's client on a real dev server, a
demo worker and the real business service. start_request starts through ToolloopClient.start (the request id
names the actor's workflow); approve_all and decide decide as the testing channel, recorded "<user> via test"
(never "via cli": the CLI is another channel); waiting_operation gives an operation that still waits."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

import toolloop
from tests.agent_helpers import U1, call, effects, say, start_agent, ticket_version
from tests.conftest import APPROVAL_KEY
from toolloop import testing
from toolloop._temporal.requests import request_workflow_id
from toolloop._temporal.settings import Settings

pytestmark = pytest.mark.e2e


def _note(version: int, text: str, call_id: str) -> dict[str, Any]:
    return call("append_ticket_note", {"ticketId": "T1001", "text": text, "expectedVersion": version}, call_id)


async def test_start_request_starts_through_the_client_once_per_request_id(
    client: Client, settings: Settings, worker: Worker
) -> None:
    request_id = f"helpers-{uuid.uuid4().hex[:8]}"

    async def start(question: str) -> Any:
        return await testing.start_request(
            client,
            question,
            actor=U1,
            task_queue=settings.task_queue,
            model=testing.script([say("hi")]),
            request_id=request_id,
        )

    handle = await start("hello")
    # The request id names this user's workflow; the same submission again is the same run, another is refused.
    assert handle.id == request_workflow_id(U1, request_id)
    assert (await start("hello")).id == handle.id
    with pytest.raises(toolloop.RequestIdReused):
        await start("something else")
    assert (await asyncio.wait_for(toolloop.request_result(handle), 60)).final_text == "hi"


async def test_approve_all_decides_through_the_client_as_the_testing_channel(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    version = await ticket_version(settings.service_url)
    # Any handle will do (this one's workflow was started without the client).
    handle = await start_agent(
        client,
        settings,
        "add a note",
        model=testing.script([_note(version, "approved by the helper", "w1")], [say("noted")]),
    )
    async with testing.approve_all(handle, signing_key=APPROVAL_KEY, approver=U1) as approved:
        result = await asyncio.wait_for(toolloop.request_result(handle), 120)
    [op] = result.operations
    assert approved == [op.operation_id] and op.state == "verified"
    assert op.approval is not None and (op.approval.decision, op.approval.by) == ("approved", "u1 via test")
    assert len(await effects(admin, op.operation_id)) == 1


async def test_waiting_operation_skips_an_operation_decided_before_its_record_was_read(
    client: Client, settings: Settings, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = await ticket_version(settings.service_url)
    turns = [[_note(version, "first", "w1")], [_note(version + 1, "second", "w2")], [say("ok")]]
    handle = await start_agent(client, settings, "two notes", model=testing.script(*turns))
    read_ledger = toolloop.ToolloopRequest.operations
    decided_first: list[str] = []

    async def another_approver_first(self: toolloop.ToolloopRequest) -> list[toolloop.OperationRecord]:
        # Another approver decides the operation the follower was just given, before its record is read.
        if not decided_first:
            [waiting] = await self.pending_approvals()
            await testing.decide(handle, waiting.operation_id, signing_key=APPROVAL_KEY, decider=U1)
            decided_first.append(waiting.operation_id)
        return await read_ledger(self)

    monkeypatch.setattr(toolloop.ToolloopRequest, "operations", another_approver_first)
    record = await testing.waiting_operation(handle, within=60)
    # Not the first operation (approved meanwhile): the next one that waits.
    assert decided_first and record.operation_id != decided_first[0]
    assert (record.state, record.call_ids) == ("awaiting_approval", ["w2"])
    receipt = await testing.decide(handle, record.operation_id, signing_key=APPROVAL_KEY, decider=U1, approve=False)
    assert receipt.approval is not None and receipt.approval.by == "u1 via test"
    result = await asyncio.wait_for(toolloop.request_result(handle), 120)
    assert [(op.call_ids, op.state) for op in result.operations] == [(["w1"], "verified"), (["w2"], "denied")]
