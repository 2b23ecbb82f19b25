"""End to end: approval policies on the real stack - the Temporal dev server, the demo business service
deciding its writes by policy (its kit holds the policy's public key and knows its rules), a policy evaluator
worker holding the policy's signing key, and the demo's worker, which holds neither.

Each test asserts what the service itself recorded (its effect table), the exact result code, and that the
run's history replays."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker

import toolloop
from demo.agent import build as build_demo
from devstack.processes import ManagedProcess, free_port, start_business_service
from tests.agent_helpers import assert_eventually, effects, set_faults, start_agent, ticket_version, waiting_operation
from tests.api_helpers import U1 as U1_TOKEN
from tests.api_helpers import U2, Api, assert_problem, pending_operation, running_api
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, REPO_ROOT, BusinessService, TemporalServer
from toolloop import ApprovalRefused, request_result
from toolloop._core.approvals import (
    PolicyClaims,
    generate_signing_key,
    http_subject,
    join_tokens,
    mint_approval_token,
    payload_digest,
    verify_key_for,
)
from toolloop._core.contracts import (
    Actor,
    AgentResult,
    GrantTerms,
    Limits,
    OperationRecord,
    PolicyDecision,
    PolicyInput,
)
from toolloop._core.names import DECIDE_BY_POLICY_ACTIVITY, POLICY_RULES_SEARCH_ATTRIBUTE
from toolloop._temporal.converter import data_converter
from toolloop._temporal.plugin import workflow_runner
from toolloop._temporal.policy_worker import running_policy_worker
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker
from toolloop.activities.policy import PolicyActivities, PolicySource
from toolloop.testing import call, decide, say, script
from toolloop.workflows.agent import AgentWorkflow

POLICY_KEY = generate_signing_key()
POLICY_VERIFY_KEY = verify_key_for(POLICY_KEY)
DEMO_POLICY = REPO_ROOT / "config" / "policies"
MANAGER = Actor(user_id="m1", tenant_id="acme")
U1 = Actor(user_id="u1", tenant_id="acme")


@dataclass
class PolicyStack:
    client: Client
    settings: Settings
    service_url: str
    admin: httpx.AsyncClient
    policy_file: Path


@pytest.fixture
def policy_files(tmp_path: Path) -> Path:
    """A copy of the demo policy (so a test may change it), in its own folder."""
    folder = tmp_path / "policy"
    shutil.copytree(DEMO_POLICY, folder)
    return folder


@pytest.fixture
def policy_service(tmp_path: Path, policy_files: Path) -> Iterator[tuple[str, str]]:
    port, token = free_port(), uuid.uuid4().hex
    process: ManagedProcess = start_business_service(
        tmp_path / "service" / "service.sqlite",
        port,
        token,
        approval_verify_key=APPROVAL_VERIFY_KEY,
        policy_verify_key=POLICY_VERIFY_KEY,
        policy_file=policy_files / "demo.cedar",
        cwd=REPO_ROOT,
    )
    try:
        yield f"http://127.0.0.1:{port}", token
    finally:
        process.stop()


def policy_worker_settings(temporal_server: TemporalServer, service_url: str, queue: str) -> Settings:
    """A worker's on `queue` that asks the policy evaluator on `<queue>-policy` and trusts its public key."""
    return Settings.model_validate(
        {
            "TEMPORAL_ADDRESS": temporal_server.address,
            "TOOLLOOP_TASK_QUEUE": queue,
            "TOOLLOOP_SERVICE_URL": service_url,
            "TOOLLOOP_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY,
            "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
            "TOOLLOOP_POLICY_TASK_QUEUE": f"{queue}-policy",
            "TOOLLOOP_POLICY_VERIFY_KEY": POLICY_VERIFY_KEY,
        }
    )


@contextlib.asynccontextmanager
async def running_policy_api(
    client: Client,
    temporal_server: TemporalServer,
    service_url: str,
    admin_token: str,
    policy_files: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Api]:
    """The HTTP API with a worker that asks a policy evaluator of its own (the demo policy in `policy_files`)."""
    service = BusinessService(service_url, admin_token, APPROVAL_KEY, Path("unused"), None)  # type: ignore[arg-type]
    policy_queue = f"policy-{uuid.uuid4().hex[:8]}"
    source = PolicySource(policy_files / "demo.cedar", policy_files / "demo.cedarschema")
    worker_env = {"TOOLLOOP_POLICY_TASK_QUEUE": policy_queue, "TOOLLOOP_POLICY_VERIFY_KEY": POLICY_VERIFY_KEY}
    async with (
        running_policy_worker(client, source, POLICY_KEY, policy_queue),
        running_api(temporal_server, service, client, tmp_path_factory, worker_env=worker_env) as api,
    ):
        yield api


@pytest.fixture
async def stack(
    client: Client, temporal_server: TemporalServer, policy_service: tuple[str, str], policy_files: Path
) -> AsyncIterator[PolicyStack]:
    url, admin_token = policy_service
    queue = f"test-{uuid.uuid4().hex[:10]}"
    settings = policy_worker_settings(temporal_server, url, queue)
    source = PolicySource(policy_files / "demo.cedar", policy_files / "demo.cedarschema")
    async with (
        httpx.AsyncClient(base_url=url, headers={"X-Admin-Token": admin_token}, timeout=10) as admin,
        running_policy_worker(client, source, POLICY_KEY, f"{queue}-policy", APPROVAL_VERIFY_KEY),
        running_worker(client, settings, build_demo(url)),
    ):
        yield PolicyStack(client, settings, url, admin, policy_files / "demo.cedar")


def read_order(order_id: str, call_id: str) -> dict[str, Any]:
    return call("get_order_status", {"orderId": order_id}, call_id)


def refund(order_id: str, cents: int, call_id: str, to_account: str | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"orderId": order_id, "amountCents": cents, "reason": "late delivery"}
    if to_account is not None:
        arguments["toAccount"] = to_account
    return call("refund_order", arguments, call_id)


async def start(stack: PolicyStack, *turns: list[dict[str, Any]], **limits: Any) -> WorkflowHandle[Any, AgentResult]:
    return await start_agent(
        stack.client, stack.settings, "refund", model=script(*turns, [say("done")]), limits=Limits(**limits)
    )


async def finished(handle: WorkflowHandle[Any, AgentResult]) -> AgentResult:
    result = await asyncio.wait_for(request_result(handle), timeout=120)
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    await replayer.replay_workflow(await handle.fetch_history())
    return result


async def refunds_made(stack: PolicyStack, op: OperationRecord) -> list[dict[str, Any]]:
    return await effects(stack.admin, op.operation_id)


# Writes settle fast here: a status that cannot be read gives up in seconds, and the write stays unknown.
FAST = Limits(unknown_resolution_seconds=3, settle_seconds=5, status_max_attempts=2)


def new_thread(stack: PolicyStack) -> toolloop.ToolloopThread:
    client = toolloop.ToolloopClient(
        stack.client, task_queue=stack.settings.task_queue, signing_key=APPROVAL_KEY, channel="test"
    )
    return client.thread(f"t-{uuid.uuid4().hex[:8]}", actor=U1)


def answered_once(result: AgentResult) -> None:
    ids = [c.call_id for c in result.calls]
    assert len(ids) == len(set(ids)), ids


async def test_a_small_refund_on_a_late_order_is_approved_by_its_rule_with_no_person(stack: PolicyStack) -> None:
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 500, "w1")])
    result = await finished(handle)
    [op] = result.operations
    assert op.state == "verified" and op.transitions[:3] == ["proposed", "validated", "approved"]
    assert op.policy is not None and (op.policy.verdict, op.policy.rules) == ("allow", ["small-late-refund"])
    assert op.policy.version.startswith("sha256:")
    assert op.approval is not None and op.approval.by == "rule small-late-refund"
    [made] = await refunds_made(stack, op)
    assert made["operation_id"] == op.operation_id
    answered_once(result)


async def test_a_run_made_by_a_reset_takes_the_policy_decisions_it_replays_and_ends_as_before(
    stack: PolicyStack,
) -> None:
    # A decision names the run it was made in. A reset (an operator's tool) makes a new run that replays the
    # old run's history up to its reset point: the allow it replays was made for the first run, and it is still
    # this request's. The reset run replays it, goes on, and the refund is not made again.
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 500, "w1")])
    first = await finished(handle)
    [op] = first.operations
    assert op.state == "verified" and op.approval is not None and op.approval.by == "rule small-late-refund"
    described = await handle.describe()
    events = [e async for e in handle.fetch_history_events()]
    last_task = max(e.event_id for e in events if e.HasField("workflow_task_completed_event_attributes"))
    reset = await stack.client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=stack.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=handle.id, run_id=described.run_id),
            reason="an operator replays the end of the request",
            workflow_task_finish_event_id=last_task,
            request_id=str(uuid.uuid4()),
        )
    )
    assert reset.run_id != described.run_id
    after = stack.client.get_workflow_handle(handle.id, run_id=reset.run_id, result_type=AgentResult)
    again = await asyncio.wait_for(request_result(after), timeout=120)
    assert [(o.operation_id, o.state) for o in again.operations] == [(op.operation_id, "verified")]
    assert len(await refunds_made(stack, op)) == 1
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(), workflow_runner=workflow_runner())
    await replayer.replay_workflow(await after.fetch_history())


async def test_a_refund_sent_outdates_the_order_it_was_decided_on_until_the_order_is_read_again(
    stack: PolicyStack,
) -> None:
    handle = await start(
        stack,
        [read_order("A100", "r1")],
        [refund("A100", 500, "w1")],
        [refund("A100", 600, "w2")],
        [read_order("A100", "r2")],
        [refund("A100", 700, "w3")],
    )
    # The second small refund is not judged on the order as it was before the first: the requester is asked.
    second = await waiting_operation(handle)
    assert second.call_ids == ["w2"] and second.policy is not None and second.policy.verdict == "ask"
    await decide(handle, second.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    result = await finished(handle)
    by = [(op.call_ids[0], op.state, op.approval.by if op.approval else None) for op in result.operations]
    assert by == [
        ("w1", "verified", "rule small-late-refund"),
        ("w2", "verified", "u1 via test"),
        # Read again, the order's refundable amount is what the service now says: the rule decides.
        ("w3", "verified", "rule small-late-refund"),
    ]
    # The service's own records: each refund made once.
    assert [len(await refunds_made(stack, op)) for op in result.operations] == [1, 1, 1]


async def test_a_write_whose_tool_names_no_facts_outdates_every_earlier_read(stack: PolicyStack) -> None:
    # create_calendar_event declares no policy facts: nothing says what it changes, so the order read before it
    # is no fact for the refund after it (a user's own write, a cancellation say, could have changed the order).
    event = {"calendarId": "cal-u1", "title": "Refund call", "start": "2027-03-01T10:00:00Z"}
    event["end"] = "2027-03-01T10:30:00Z"
    handle = await start(
        stack,
        [read_order("A100", "r1")],
        [call("create_calendar_event", event, "w1")],
        [refund("A100", 500, "w2")],
        [read_order("A100", "r2")],
        [refund("A100", 600, "w3")],
    )
    first = await waiting_operation(handle)
    assert first.call_ids == ["w1"] and first.policy is not None and first.policy.verdict == "ask"
    await decide(handle, first.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    second = await waiting_operation(handle)
    # Without the event in between, the rule would allow this refund (the first test above).
    assert second.call_ids == ["w2"] and second.policy is not None and second.policy.verdict == "ask"
    assert second.policy.rules == ["requester-decides-the-rest"]
    await decide(handle, second.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    result = await finished(handle)
    by = [(op.call_ids[0], op.state, op.approval.by if op.approval else None) for op in result.operations]
    assert by == [
        ("w1", "verified", "u1 via test"),
        ("w2", "verified", "u1 via test"),
        # The order read again after both writes: the rule decides on what the service says now.
        ("w3", "verified", "rule small-late-refund"),
    ]
    assert [len(await effects(stack.admin, op.operation_id)) for op in result.operations] == [1, 1, 1]
    answered_once(result)


async def test_while_an_earlier_message_of_the_thread_left_a_write_unknown_no_read_is_a_fact(
    stack: PolicyStack,
) -> None:
    # Message 1's note is approved but every attempt gets a 503: it stays unknown (it may yet have happened, and
    # nothing says what it changes). Message 2 reads the order and asks for a small refund: the rule that would
    # allow it (the first test above) cannot, since the read may show the state before that write; a person asks.
    await set_faults(stack.admin, {"method": "POST", "path_regex": "^/tickets/T1001/notes$", "status": 503})
    thread = new_thread(stack)
    note = {"ticketId": "T1001", "text": "policy: unknown", "expectedVersion": await ticket_version(stack.service_url)}
    first = await asyncio.wait_for(
        thread.run(
            "note it", model=script([call("append_ticket_note", note, "w1")], [say("ok")]), limits=FAST, approver=bool
        ),
        120,
    )
    assert [op.state for op in first.operations] == ["unknown"]
    (await stack.admin.delete("/admin/faults")).raise_for_status()
    asked: list[toolloop.ApprovalRequest] = []
    second = await asyncio.wait_for(
        thread.run(
            "refund it",
            model=script([read_order("A100", "r1")], [refund("A100", 500, "w2")], [say("done")]),
            approver=lambda a: asked.append(a) or True,
        ),
        120,
    )
    [op] = second.operations
    assert [a.operation_id for a in asked] == [op.operation_id]
    assert op.policy is not None and (op.policy.verdict, op.policy.rules) == ("ask", ["requester-decides-the-rest"])
    assert op.state == "verified" and op.approval is not None and op.approval.by == "u1 via test"
    assert len(await refunds_made(stack, op)) == 1


async def test_a_refund_an_earlier_message_left_unknown_outdates_the_order_once_settled(stack: PolicyStack) -> None:
    # Message 1's refund, allowed by rule, commits but its reply is lost and its status cannot be read: unknown.
    await set_faults(
        stack.admin,
        {"method": "POST", "path_regex": "^/orders/A100/refunds$", "when": "after_commit", "action": "drop"},
        {"method": "GET", "path_regex": "^/operations/", "status": 503},
    )
    thread = new_thread(stack)
    model = script([read_order("A100", "r1")], [refund("A100", 500, "w1")], [say("ok")])
    first = await asyncio.wait_for(thread.run("refund it", model=model, limits=FAST), 120)
    [unknown] = first.operations
    assert unknown.state == "unknown" and len(await refunds_made(stack, unknown)) == 1
    (await stack.admin.delete("/admin/faults")).raise_for_status()
    # Message 2 reads the order, proposes the same refund (settled by its status: done), then another one. The
    # earlier refund may have taken effect after that read: the read is no fact for the next refund, which the
    # rule cannot allow; its requester is asked.
    asked: list[toolloop.ApprovalRequest] = []
    second = await asyncio.wait_for(
        thread.run(
            "and refund 6 more",
            model=script(
                [read_order("A100", "r1")], [refund("A100", 500, "w1")], [refund("A100", 600, "w2")], [say("ok")]
            ),
            approver=lambda a: asked.append(a) or True,
        ),
        120,
    )
    settled, more = second.operations
    assert (settled.operation_id, settled.state, settled.attempts) == (unknown.operation_id, "verified", 0)
    assert more.policy is not None and (more.policy.verdict, more.policy.rules) == (
        "ask",
        ["requester-decides-the-rest"],
    )
    assert [a.operation_id for a in asked] == [more.operation_id] and more.state == "verified"
    assert [len(await refunds_made(stack, op)) for op in (settled, more)] == [1, 1]


async def test_without_reading_the_order_first_the_rule_cannot_allow_and_the_requester_decides(
    stack: PolicyStack,
) -> None:
    handle = await start(stack, [refund("A100", 500, "w1")])
    op = await waiting_operation(handle)
    assert op.policy is not None and op.policy.verdict == "ask"
    assert op.policy.rules == ["requester-decides-the-rest"]
    # Another user of the tenant is neither the requester nor a manager: nothing is signed for them.
    with pytest.raises(ApprovalRefused, match="may not decide"):
        await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=Actor(user_id="u2", tenant_id="acme"))
    await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    result = await finished(handle)
    [done] = result.operations
    assert done.state == "verified" and done.approval is not None and done.approval.by == "u1 via test"
    assert len(await refunds_made(stack, done)) == 1


async def test_a_refund_to_an_account_that_did_not_pay_is_denied_by_rule_and_never_sent(stack: PolicyStack) -> None:
    # An injected instruction would ask for exactly this: a refund under the threshold, to the attacker.
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 900, "w1", to_account="acct-mallory-1")])
    result = await finished(handle)
    [op] = result.operations
    assert op.state == "denied" and op.attempts == 0
    assert op.output is not None and op.output["code"] == "POLICY_DENIED"
    assert op.policy is not None and op.policy.rules == ["refund-to-payer-only"]
    assert await refunds_made(stack, op) == []


async def test_a_larger_refund_waits_for_a_manager_and_the_requester_cannot_decide_it(stack: PolicyStack) -> None:
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 4000, "w1")])
    op = await waiting_operation(handle)
    assert op.policy is not None and op.policy.deciders is not None
    assert (op.policy.deciders.requester, op.policy.deciders.roles) == (False, ["manager"])
    with pytest.raises(ApprovalRefused, match="u1 may not decide"):
        await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    # The manager of another tenant may not decide either.
    with pytest.raises(ApprovalRefused, match="may not decide"):
        await decide(
            handle,
            op.operation_id,
            signing_key=APPROVAL_KEY,
            decider=Actor(user_id="m1", tenant_id="globex"),
            roles=["manager"],
        )
    await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"])
    result = await finished(handle)
    [done] = result.operations
    assert done.state == "verified" and done.approval is not None and done.approval.by == "m1 via test"
    assert done.policy is not None and done.policy.approved_by == ["m1"]
    assert len(await refunds_made(stack, done)) == 1


def lower_four_eyes(policy: str) -> str:
    """The demo policy with four eyes from 50.00 (the demo's orders are too small for its 200.00)."""
    return policy.replace("amountCents <= 20000", "amountCents <= 5000").replace(
        "amountCents > 20000", "amountCents > 5000"
    )


async def test_four_eyes_needs_the_requester_first_and_a_manager_second(stack: PolicyStack) -> None:
    text = stack.policy_file.read_text()
    stack.policy_file.write_text(lower_four_eyes(text))
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 6000, "w1")], approval_ttl_seconds=8)
    op = await waiting_operation(handle)
    assert op.policy is not None and op.policy.deciders is not None and op.policy.deciders.approvals == 2
    assert "four-eyes-over-200" in op.policy.rules
    # The manager approves first: one of two.
    receipt = await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"])
    assert receipt.state == "awaiting_approval"
    # The requester would be the second person now: refused, and nothing is sent.
    with pytest.raises(ApprovalRefused, match="u1 may not decide"):
        await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    # The same manager again counts once.
    with pytest.raises(ApprovalRefused, match="m1 may not decide"):
        await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"])
    result = await finished(handle)
    [expired] = result.operations
    assert expired.state == "expired" and expired.policy is not None and expired.policy.approved_by == ["m1"]
    assert await refunds_made(stack, expired) == []


async def test_four_eyes_with_the_requester_first_then_the_manager_is_sent_with_both_decisions(
    stack: PolicyStack,
) -> None:
    text = stack.policy_file.read_text()
    stack.policy_file.write_text(lower_four_eyes(text))
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 6000, "w1")])
    op = await waiting_operation(handle)
    first = await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    assert first.state == "awaiting_approval"
    await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"])
    result = await finished(handle)
    [done] = result.operations
    assert done.state == "verified" and done.policy is not None and done.policy.approved_by == ["u1", "m1"]
    assert done.approval is not None and done.approval.by == "u1 via test and m1 via test"
    assert len(await refunds_made(stack, done)) == 1


async def test_a_changed_policy_applies_to_writes_asked_after_the_change_only(stack: PolicyStack) -> None:
    # Two refunds, each decided when it is proposed: the first under the demo policy (a manager decides),
    # the second after the file changed so that the manager's rule is gone and refunds go to the requester.
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 4000, "w1")], [refund("A100", 3000, "w2")])
    first = await waiting_operation(handle)
    assert first.policy is not None and first.policy.rules == ["manager-decides-larger-refunds"]
    before = first.policy.version
    text = stack.policy_file.read_text()
    stack.policy_file.write_text(
        text.replace('principal in Role::"manager"', 'principal in Role::"auditor"')
        .replace("context.arguments.amountCents > 1000 && context.arguments.amountCents <= 20000", "false")
        # A rule of a new name: the service follows its policy file, so it knows it at once.
        .replace('@id("requester-decides-the-rest")', '@id("requester-decides-every-write")')
    )
    # The waiting operation keeps the rule it was asked under: the manager decides it.
    await decide(handle, first.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"])
    second = await _next_waiting(handle, first.operation_id)
    assert second.policy is not None and second.policy.version != before
    assert second.policy.deciders is not None
    assert (second.policy.deciders.requester, second.policy.deciders.roles) == (True, ["auditor"])
    assert "requester-decides-every-write" in second.policy.rules
    await decide(handle, second.operation_id, signing_key=APPROVAL_KEY, decider=U1)
    result = await finished(handle)
    assert [op.state for op in result.operations] == ["verified", "verified"]
    assert [op.policy.version == before for op in result.operations if op.policy] == [True, False]


async def test_a_managers_grant_approves_the_next_writes_within_its_bounds_and_then_asks_again(
    stack: PolicyStack,
) -> None:
    handle = await start(
        stack,
        [read_order("A100", "r1")],
        [refund("A100", 1500, "w1")],
        [refund("A100", 1200, "w2")],
        [refund("A100", 1100, "w3")],
        [refund("A100", 1300, "w4")],
    )
    first = await waiting_operation(handle)
    terms = GrantTerms(uses=2, max={"amountCents": 2000}, same=["orderId"])
    # The requester cannot give what is not theirs to decide, grant or no grant.
    with pytest.raises(ApprovalRefused, match="u1 may not decide"):
        await decide(handle, first.operation_id, signing_key=APPROVAL_KEY, decider=U1, grant=terms)
    await decide(handle, first.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"], grant=terms)
    # Two more refunds go through on the grant; the fourth asks the manager again, who says no.
    fourth = await _next_waiting(handle, first.operation_id)
    await decide(
        handle, fourth.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"], approve=False
    )
    result = await finished(handle)
    states = [(op.state, op.approval.by if op.approval else None) for op in result.operations]
    assert states == [
        ("verified", "m1 via test"),
        ("verified", "m1's grant"),
        ("verified", "m1's grant"),
        ("denied", "m1 via test"),
    ]
    granted = result.operations[1].policy
    assert granted is not None and (granted.verdict, granted.granted_by) == ("allow", "m1")
    made = [len(await refunds_made(stack, op)) for op in result.operations]
    assert made == [1, 1, 1, 0]


async def test_a_manager_who_asks_for_a_refund_left_to_managers_cannot_decide_it(stack: PolicyStack) -> None:
    handle = await start_agent(
        stack.client,
        stack.settings,
        "refund",
        user="m1",
        model=script([refund("A100", 4000, "w1")], [say("done")]),
        limits=Limits(approval_ttl_seconds=4),
    )
    op = await waiting_operation(handle)
    assert op.policy is not None and op.policy.deciders is not None and not op.policy.deciders.requester
    with pytest.raises(ApprovalRefused, match="m1 may not decide"):
        await decide(handle, op.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"])
    result = await finished(handle)
    assert result.operations[0].state == "expired" and await refunds_made(stack, result.operations[0]) == []


async def test_a_grant_holds_only_once_the_write_it_came_with_is_approved(stack: PolicyStack) -> None:
    # Four eyes from 50.00, and no refund allowed by rule: the requester decides small refunds themselves.
    text = lower_four_eyes(stack.policy_file.read_text())
    stack.policy_file.write_text(text.replace("context.facts has order && context.facts.order.late &&", "false &&"))
    handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 6000, "w1")], [refund("A100", 900, "w2")])
    first = await waiting_operation(handle)
    # The requester approves first, with a grant that would cover the next small refund; the manager says no.
    terms = GrantTerms(uses=1, max={"amountCents": 6000}, same=["orderId"])
    await decide(handle, first.operation_id, signing_key=APPROVAL_KEY, decider=U1, grant=terms)
    await decide(
        handle, first.operation_id, signing_key=APPROVAL_KEY, decider=MANAGER, roles=["manager"], approve=False
    )
    # The write it came with was denied: the grant never held, and the next refund asks the requester.
    second = await _next_waiting(handle, first.operation_id)
    assert second.policy is not None and second.policy.verdict == "ask"
    await decide(handle, second.operation_id, signing_key=APPROVAL_KEY, decider=U1, approve=False)
    result = await finished(handle)
    assert [op.state for op in result.operations] == ["denied", "denied"]
    assert all(op.policy is not None and op.policy.granted_by is None for op in result.operations)


async def _next_waiting(handle: WorkflowHandle[Any, Any], after: str) -> OperationRecord:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ops = [op for op in await handle.query("get_ledger", result_type=list[OperationRecord])]
        waiting = [op for op in ops if op.operation_id != after and op.state == "awaiting_approval"]
        if waiting:
            return waiting[0]
        await asyncio.sleep(0.2)
    raise AssertionError("no second operation waited for approval")


def _policy_token(digest: str, operation_id: str, key: str, **change: Any) -> str:
    now = time.time()
    claims: dict[str, Any] = {
        "aud": "bizservice",
        "user_id": "u1",
        "tenant_id": "acme",
        "operation_id": operation_id,
        "digest": digest,
        "verdict": "allow",
        "rules": ["small-late-refund"],
        "policy_version": "sha256:forged",
        "iat": now,
        "exp": now + 60,
        **change,
    }
    return mint_approval_token(key, PolicyClaims.model_validate(claims))


@pytest.mark.parametrize(
    ("forgery", "code"),
    [
        ("none", "POLICY_DECISION_REQUIRED"),
        ("another key", "POLICY_DECISION_INVALID"),
        ("a rule that does not exist", "POLICY_DECISION_INVALID"),
        ("another payload", "POLICY_DECISION_INVALID"),
        ("expired", "POLICY_DECISION_INVALID"),
        ("a person's approval instead", "POLICY_DECISION_INVALID"),
    ],
)
async def test_the_service_refuses_a_forged_policy_decision_with_its_own_code(
    stack: PolicyStack, forgery: str, code: str
) -> None:
    body = {"orderId": "A100", "amountCents": 500, "reason": "late", "toAccount": None}
    path = "/orders/A100/refunds"
    digest = payload_digest(http_subject("POST", path), body)
    operation_id = f"op_forged_{uuid.uuid4().hex[:8]}"
    tokens = {
        "none": "",
        "another key": _policy_token(digest, operation_id, APPROVAL_KEY),
        "a rule that does not exist": _policy_token(digest, operation_id, POLICY_KEY, rules=["refund-anything"]),
        "another payload": _policy_token("sha256:" + "0" * 64, operation_id, POLICY_KEY),
        "expired": _policy_token(digest, operation_id, POLICY_KEY, exp=time.time() - 1),
        "a person's approval instead": _person_token(digest, operation_id),
    }
    headers = {"Idempotency-Key": operation_id, "X-Actor-User": "u1", "X-Actor-Tenant": "acme"}
    if tokens[forgery]:
        headers["X-Approval-Token"] = tokens[forgery]
    async with httpx.AsyncClient(base_url=stack.service_url, timeout=10) as http:
        refused = await http.post(path, json=body, headers=headers)
        assert (refused.status_code, refused.json()["code"]) == (403, code)
        # The same write with the policy's own decision is taken: the refusals were the forgeries'.
        headers["X-Approval-Token"] = _policy_token(digest, operation_id, POLICY_KEY)
        taken = await http.post(path, json=body, headers=headers)
        assert taken.status_code == 201, taken.text
    assert len(await effects(stack.admin, operation_id)) == 1


def _person_token(digest: str, operation_id: str) -> str:
    from toolloop._core.approvals import ApprovalClaims

    now = time.time()
    claims = ApprovalClaims.model_validate(
        {
            "aud": "bizservice",
            "user_id": "u1",
            "tenant_id": "acme",
            "operation_id": operation_id,
            "digest": digest,
            "approved_by": "u1",
            "iat": now,
            "exp": now + 60,
        }
    )
    return join_tokens([mint_approval_token(APPROVAL_KEY, claims)])


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        ("permit(principal, action, resource", "the policy does not parse: unexpected end of input"),
        (
            '@id("typo")\npermit(principal, action == Action::"refund_order", resource)\n'
            'when { context.arguments.amountCents <= "ten" };',
            "policy typo: ",
        ),
    ],
    ids=["does_not_parse", "does_not_validate"],
)
def test_a_policy_evaluator_whose_policy_does_not_load_does_not_start(tmp_path: Path, policy: str, said: str) -> None:
    (tmp_path / "p.cedar").write_text(policy)
    env = {
        **os.environ,
        "TOOLLOOP_POLICY_FILE": str(tmp_path / "p.cedar"),
        "TOOLLOOP_POLICY_SCHEMA": str(DEMO_POLICY / "demo.cedarschema"),
        "TOOLLOOP_POLICY_SIGNING_KEY": POLICY_KEY,
        # Nothing listens there: a policy that loaded would fail later, on connecting, with exit code 1.
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
    }
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "worker.py"), "--policy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'p.cedar'}: ") and said in line
    assert "Traceback" not in done.stderr and done.stdout == ""


# --- The people who may decide, through the HTTP API (their tokens carry their roles) -------------------------

M1 = {"Authorization": "Bearer demo-token-m1-acme-0005"}
M1_GLOBEX = {"Authorization": "Bearer demo-token-m1-globex-0006"}


async def test_a_manager_finds_decides_and_is_named_for_a_refund_the_policy_left_to_managers(
    client: Client,
    temporal_server: TemporalServer,
    policy_service: tuple[str, str],
    policy_files: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    url, admin_token = policy_service
    async with (
        running_policy_api(client, temporal_server, url, admin_token, policy_files, tmp_path_factory) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as http,
    ):
        assert (await http.get("/v1/me", headers=M1)).json()["roles"] == ["manager"]
        question = {"question": "Refund 40.00 EUR on order A100 because it arrived late"}
        started = await http.post("/v1/requests", json=question, headers=U1_TOKEN)
        assert started.status_code == 201, started.text
        request_id = started.json()["id"]
        op = await pending_operation(http, request_id, U1_TOKEN)
        assert op["policy"]["rules"] == ["manager-decides-larger-refunds"]
        approve = {"decision": "approve", "digest": op["digest"]}
        # Its requester may not decide it: it looks like a missing operation.
        own = f"/v1/requests/{request_id}/operations/{op['operation_id']}/decision"
        assert_problem(await http.post(own, json=approve, headers=U1_TOKEN), 404, "NOT_FOUND")

        listed: list[dict[str, Any]] = []

        async def manager_sees_it() -> bool:
            listed[:] = (await http.get("/v1/approvals", headers=M1)).json()["approvals"]
            return bool(listed)

        await assert_eventually(manager_sees_it, within=60, what="the manager's list shows the refund")
        [item] = listed
        assert (item["requester"], item["operation"]["operation_id"]) == ("u1", op["operation_id"])
        # Nobody else of the tenant, and no other tenant's manager, sees or decides it.
        assert (await http.get("/v1/approvals", headers=U2)).json()["approvals"] == []
        path = f"/v1/approvals/{item['workflow_id']}/{op['operation_id']}"
        for stranger in (U2, M1_GLOBEX, U1_TOKEN):
            assert_problem(await http.get(path, headers=stranger), 404, "NOT_FOUND")
            assert_problem(await http.post(f"{path}/decision", json=approve, headers=stranger), 404, "NOT_FOUND")
        assert (await http.get(path, headers=M1)).json()["digest"] == op["digest"]
        decided = await http.post(f"{path}/decision", json=approve, headers=M1)
        assert decided.status_code == 200, decided.text
        assert decided.json()["approval"]["by"] == "m1 via api"
        # Decided, it waits for nobody: its payload is no longer shown to the people who could have decided it.
        assert_problem(await http.get(path, headers=M1), 404, "NOT_FOUND")

        async def finished_view() -> bool:
            view = (await http.get(f"/v1/requests/{request_id}", headers=U1_TOKEN)).json()
            return bool(view["status"] != "running")

        await assert_eventually(finished_view, within=60, what="the request finished")
        view = (await http.get(f"/v1/requests/{request_id}", headers=U1_TOKEN)).json()
        [done] = view["operations"]
        assert done["state"] == "verified" and done["approval"]["by"] == "m1 via api"
        assert done["policy"]["approved_by"] == ["m1"] and done["policy"]["version"].startswith("sha256:")

        # An operator finds the requests a rule decided (Temporal's visibility, ToolloopPolicyRules).
        async def found_by_rule() -> bool:
            query = f'{POLICY_RULES_SEARCH_ATTRIBUTE} = "manager-decides-larger-refunds"'
            return any([e.id == item["workflow_id"] async for e in client.list_workflows(query)])

        await assert_eventually(found_by_rule, within=60, what="the request is found by its rule")


async def test_an_impostor_answering_on_the_policy_queue_is_not_believed_and_nothing_is_sent(
    client: Client, temporal_server: TemporalServer, policy_service: tuple[str, str], policy_files: Path
) -> None:
    # Someone who can poll the policy's task queue answers with decisions signed by a key of their own.
    url, admin_token = policy_service
    queue = f"test-{uuid.uuid4().hex[:10]}"
    settings = policy_worker_settings(temporal_server, url, queue)
    source = PolicySource(policy_files / "demo.cedar", policy_files / "demo.cedarschema")
    async with (
        httpx.AsyncClient(base_url=url, headers={"X-Admin-Token": admin_token}, timeout=10) as admin,
        running_policy_worker(client, source, generate_signing_key(), f"{queue}-policy"),
        running_worker(client, settings, build_demo(url)),
    ):
        stack = PolicyStack(client, settings, url, admin, policy_files / "demo.cedar")
        handle = await start(stack, [read_order("A100", "r1")], [refund("A100", 500, "w1")])
        result = await finished(handle)
        [op] = result.operations
        assert (op.state, op.attempts) == ("denied", 0)
        assert op.output is not None and op.output["code"] == "POLICY_DENIED"
        assert op.policy is not None and op.policy.reason == "the policy's answer is not valid"
        assert await refunds_made(stack, op) == []


def test_a_worker_with_half_a_policy_configuration_does_not_start() -> None:
    from toolloop import ToolloopPlugin, Toolset

    with pytest.raises(ValueError, match="go together"):
        ToolloopPlugin(Toolset(), policy_task_queue="toolloop-policy")
    with pytest.raises(ValueError, match="go together"):
        ToolloopPlugin(Toolset(), policy_verify_key=POLICY_VERIFY_KEY)


async def test_an_answer_whose_record_says_more_than_its_signed_decision_is_held_to_the_decision(
    client: Client, temporal_server: TemporalServer, policy_service: tuple[str, str], policy_files: Path
) -> None:
    # On the policy's queue, something relays the evaluator's genuine decision but rewrites the unsigned record
    # beside it: "allow", nobody to ask. The workflow acts on what the policy signed: a manager must decide.
    url, admin_token = policy_service
    queue = f"test-{uuid.uuid4().hex[:10]}"
    settings = policy_worker_settings(temporal_server, url, queue)
    genuine = PolicyActivities(PolicySource(policy_files / "demo.cedar", policy_files / "demo.cedarschema"), POLICY_KEY)

    @activity.defn(name=DECIDE_BY_POLICY_ACTIVITY)
    def relayed(inp: PolicyInput) -> PolicyDecision:
        decided = genuine.decide_by_policy(inp)
        rewritten = decided.record.model_copy(update={"verdict": "allow", "deciders": None})
        return decided.model_copy(update={"record": rewritten})

    with ThreadPoolExecutor(max_workers=2) as pool:
        async with (
            httpx.AsyncClient(base_url=url, headers={"X-Admin-Token": admin_token}, timeout=10) as admin,
            Worker(client, task_queue=f"{queue}-policy", activities=[relayed], activity_executor=pool),
            running_worker(client, settings, build_demo(url)),
        ):
            stack = PolicyStack(client, settings, url, admin, policy_files / "demo.cedar")
            handle = await start(
                stack, [read_order("A100", "r1")], [refund("A100", 4000, "w1")], approval_ttl_seconds=4
            )
            waiting = await waiting_operation(handle)
            assert waiting.policy is not None and waiting.policy.verdict == "ask"
            assert waiting.policy.deciders is not None and waiting.policy.deciders.roles == ["manager"]
            result = await finished(handle)
            [op] = result.operations
            assert (op.state, op.attempts) == ("expired", 0) and await refunds_made(stack, op) == []
