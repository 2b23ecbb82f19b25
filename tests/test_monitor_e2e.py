"""End to end: what someone watching the Temporal UI sees, read back through the Temporal client as the UI
reads it - the workflow's summary, its search attributes (who, how it ended, whether a side effect is
unsettled), its current details (each call with its result code, rejected calls included), labelled timers,
an unknown outcome that is not green, and a failed request that is failed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.worker import Worker

from tests.agent_helpers import (
    approving,
    assert_eventually,
    call,
    decide,
    say,
    script_spec,
    set_faults,
    waiting_operation,
)
from toolloop import Actor, AgentInput, AgentResult, Limits, ModelSpec, request_result
from toolloop._core.names import AGENT_WORKFLOW
from toolloop._temporal.converter import data_converter
from toolloop._temporal.requests import (
    request_search_attributes,
    request_summary,
)
from toolloop._temporal.search_attributes import OUTCOME_KEY, TENANT_KEY, UNSETTLED_KEY, USER_KEY
from toolloop._temporal.settings import Settings

pytestmark = pytest.mark.e2e

FAILED_EVENT = "workflow_execution_failed_event_attributes"

U1 = Actor(user_id="u1", tenant_id="acme")


async def start(
    client: Client, settings: Settings, question: str, model: ModelSpec, limits: Limits | None = None
) -> WorkflowHandle[Any, AgentResult]:
    """As the CLI and the API start a request: with its summary and search attributes."""
    return await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request=question,
            actor=U1,
            model=model,
            limits=limits or Limits(),
        ),
        id=f"mon-{uuid.uuid4().hex[:10]}",
        task_queue=settings.task_queue,
        result_type=AgentResult,
        search_attributes=request_search_attributes(U1),
        static_summary=request_summary(U1, question),
    )


async def details(handle: WorkflowHandle[Any, Any]) -> str:
    """The current details the UI shows on the workflow's page (its built-in metadata query)."""
    metadata: WorkflowMetadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def history_summaries(handle: WorkflowHandle[Any, Any], event_type: int) -> list[str]:
    converter = data_converter()
    found = []
    async for event in handle.fetch_history_events():
        if event.event_type == event_type and event.user_metadata.HasField("summary"):
            [text] = await converter.decode([event.user_metadata.summary], [str])
            found.append(text)
    return found


async def test_a_finished_read_shows_who_asked_what_and_how_it_ended(
    client: Client, settings: Settings, worker: Worker
) -> None:
    model = script_spec(
        [call("get_order_status", {"orderId": "A100"}, "c1"), call("nope", {}, "c2"), call("get_ticket", "{bad", "c3")],
        [say("A100 shipped.")],
    )
    handle = await start(client, settings, "Where is my order A100?\nAnd my ticket?", model)
    result = await request_result(handle)
    description = await handle.describe()
    assert await description.static_summary() == "u1@acme: Where is my order A100? And my ticket?"
    attributes = description.typed_search_attributes
    assert (attributes.get(USER_KEY), attributes.get(TENANT_KEY)) == ("u1", "acme")
    # Unsettled is set only when true: a settled request does not carry it.
    assert (attributes.get(OUTCOME_KEY), attributes.get(UNSETTLED_KEY)) == ("answered", None)
    assert result.status == "completed" and description.status == WorkflowExecutionStatus.COMPLETED
    shown = await details(handle)
    # Each call with its result code, readable without opening any JSON; rejected calls say so.
    assert "| 1 | get\\_order\\_status c1 | ok |" in shown
    assert "| 1 | nope c2 | UNKNOWN\\_TOOL \\(rejected, not run\\) |" in shown
    assert "| 1 | get\\_ticket c3 | BAD\\_JSON \\(rejected, not run\\) |" in shown
    assert shown.startswith("**finished: final\\_answer**")
    # Found by a filter in the UI's list.
    query = f'{USER_KEY.name} = "u1" AND {OUTCOME_KEY.name} = "answered" AND WorkflowId = "{handle.id}"'

    async def listed() -> bool:
        return len([w async for w in client.list_workflows(query)]) == 1

    await assert_eventually(listed, what="the request is found by user and outcome")


async def test_text_from_the_user_or_the_model_shows_as_text_never_as_markup(
    client: Client, settings: Settings, worker: Worker
) -> None:
    # The UI renders summaries and details as Markdown and HTML: an image tag would make an operator's browser
    # fetch its URL, a link could disguise what the request says.
    hostile = '<img src="http://198.51.100.7/x.png"> [click](http://198.51.100.7) **urgent**'
    model = script_spec([call('<b onmouseover="x">evil</b>', {}, "`c1`|")], [say("done")])
    handle = await start(client, settings, hostile, model)
    await request_result(handle)
    summary = await (await handle.describe()).static_summary()
    shown = await details(handle)
    for text in (summary or "", shown):
        assert "<img" not in text and "<b" not in text and "](" not in text and "**urgent**" not in text
    assert summary == (
        'u1@acme: &lt;img src="http://198\\.51\\.100\\.7/x\\.png"&gt; \\[click\\]\\(http://198\\.51\\.100\\.7\\) '
        "\\*\\*urgent\\*\\*"
    )
    assert '&lt;b onmouseover="x"&gt;evil&lt;/b&gt;' in shown and "\\`c1\\`\\|" in shown


async def test_an_approval_wait_is_a_labelled_timer_and_its_operation_is_in_the_details(
    client: Client, settings: Settings, worker: Worker
) -> None:
    model = script_spec(
        [call("refund_order", {"orderId": "A100", "amountCents": 100, "reason": "late"}, "w1")], [say("Refunded.")]
    )
    handle = await start(client, settings, "Refund 1 EUR on A100", model)
    op = await waiting_operation(handle)
    shown = await details(handle)
    escaped_id = op.operation_id.replace("_", "\\_")
    assert f"waiting for approval of {escaped_id}" in shown and "awaiting_approval" in shown
    async with approving(handle):
        result = await request_result(handle)
    assert [o.state for o in result.operations] == ["verified"]
    [timer] = await history_summaries(handle, EventType.EVENT_TYPE_TIMER_STARTED)
    assert timer.startswith(f"waiting for approval of refund_order {op.operation_id[:14]}… until ")
    assert timer.endswith(" UTC")
    attributes = (await handle.describe()).typed_search_attributes
    assert (attributes.get(OUTCOME_KEY), attributes.get(UNSETTLED_KEY)) == ("answered", None)
    finished = await details(handle)
    assert "refund\\_order" in finished and "verified ✅ (approved by u1 via test)" in finished


async def test_an_unknown_outcome_is_not_green_and_marks_the_request_unsettled(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(
        admin,
        {"method": "POST", "path_regex": "/refunds$", "when": "after_commit", "action": "drop"},
        {"method": "GET", "path_regex": "^/operations/", "status": 503},
    )
    model = script_spec(
        [call("refund_order", {"orderId": "A100", "amountCents": 100, "reason": "lost"}, "w1")], [say("Unclear.")]
    )
    limits = Limits(status_max_attempts=2, unknown_resolution_seconds=3)
    handle = await start(client, settings, "Refund 1 EUR on A100", model, limits)
    async with approving(handle):
        result = await asyncio.wait_for(request_result(handle), timeout=90)
    assert [o.state for o in result.operations] == ["unknown"]
    failed_attempts = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failure = event.activity_task_failed_event_attributes.failure
            failed_attempts.append((failure.application_failure_info.type, failure.message))
    # The attempt that ended without an answer is a failed activity in the UI, saying why.
    assert failed_attempts[0][0] == "WriteOutcomeUnknown"
    assert failed_attempts[0][1].startswith("the outcome of this attempt is unknown")
    attributes = (await handle.describe()).typed_search_attributes
    assert (attributes.get(OUTCOME_KEY), attributes.get(UNSETTLED_KEY)) == ("unknown", True)
    assert "❗ UNKNOWN" in await details(handle)


async def test_a_request_that_answered_without_doing_its_write_is_found_as_not_done(
    client: Client, settings: Settings, worker: Worker
) -> None:
    model = script_spec(
        [call("refund_order", {"orderId": "A100", "amountCents": 100, "reason": "late"}, "w1")], [say("Not done.")]
    )
    handle = await start(client, settings, "Refund 1 EUR on A100", model)
    op = await waiting_operation(handle)
    await decide(handle, op.operation_id, approve=False)
    result = await request_result(handle)
    assert (result.status, [o.state for o in result.operations]) == ("completed", ["denied"])
    attributes = (await handle.describe()).typed_search_attributes
    assert (attributes.get(OUTCOME_KEY), attributes.get(UNSETTLED_KEY)) == ("not_done", None)
    assert ": denied ✖ (rejected by u1 via test)" in await details(handle)


async def test_a_failed_request_is_a_failed_run_that_still_carries_its_report(
    client: Client, settings: Settings, worker: Worker
) -> None:
    handle = await start(client, settings, "hello", script_spec([call("get_order_status", {"orderId": "A100"}, "c1")]))
    result = await request_result(handle)
    description = await handle.describe()
    assert description.status == WorkflowExecutionStatus.FAILED
    assert (result.status, result.stop_reason, [c.ok for c in result.calls]) == ("failed", "model_error", [True])
    assert result.error is not None and "model script has 1 turn(s)" in result.error
    attributes = description.typed_search_attributes
    assert (attributes.get(OUTCOME_KEY), attributes.get(UNSETTLED_KEY)) == ("failed", None)
    # The UI shows the failure's message, never the workflow code's stack trace (the worker's file paths).
    [failed] = [
        e async for e in handle.fetch_history_events() if e.HasField("workflow_execution_failed_event_attributes")
    ]
    failure = failed.workflow_execution_failed_event_attributes.failure
    assert failure.message.startswith("model turn 2 failed: the model script has 1 turn(s)")
    assert failure.stack_trace == "" and 'File "' not in failure.message
