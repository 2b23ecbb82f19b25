"""End to end in a real browser, with an approval policy deciding the writes (docs/API.md, "Approvals"): the
web page in headless Chromium against a real `starter.py serve` process, the demo business service deciding
its writes by the demo policy, the policy evaluator worker and the demo's worker. Judged by what each person
sees on the page, and by the service's own effect table."""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, expect
from temporalio.client import Client

from devstack.processes import ManagedProcess, free_port, start_business_service
from tests.agent_helpers import assert_eventually, effects
from tests.api_helpers import pending_operation, running_api, users_of_their_own
from tests.conftest import APPROVAL_VERIFY_KEY, REPO_ROOT, BusinessService, TemporalServer
from tests.test_policies_e2e import DEMO_POLICY, POLICY_VERIFY_KEY, lower_four_eyes, running_policy_api
from tests.test_web_page_e2e import WAIT_MS, Browsed, ask, browse

pytestmark = pytest.mark.e2e

U1_TOKEN = "demo-token-u1-acme-0001"
M1_TOKEN = "demo-token-m1-acme-0005"
M1 = {"Authorization": f"Bearer {M1_TOKEN}"}
U1 = {"Authorization": f"Bearer {U1_TOKEN}"}
# The offline model asks 4000 cents for this: over 10.00, which the demo policy leaves to a manager.
LARGER_REFUND = "Refund 40.00 EUR on order A100 because it arrived late"
RULE = "manager-decides-larger-refunds"
# 500 cents, with no read of the order first (the offline model does not read it): the requester decides.
SMALL_REFUND = "Refund 5 EUR on order A100 because it arrived late"


@pytest.fixture
def policy_service(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """The demo service deciding its writes by (a copy of) the demo policy: its url, admin token and policy folder."""
    folder = tmp_path / "policy"
    shutil.copytree(DEMO_POLICY, folder)
    port, token = free_port(), uuid.uuid4().hex
    process: ManagedProcess = start_business_service(
        tmp_path / "service" / "service.sqlite",
        port,
        token,
        approval_verify_key=APPROVAL_VERIFY_KEY,
        policy_verify_key=POLICY_VERIFY_KEY,
        policy_file=folder / "demo.cedar",
        cwd=REPO_ROOT,
    )
    try:
        yield f"http://127.0.0.1:{port}", token, folder
    finally:
        process.stop()


async def log_in_as(page: Page, token: str, who: str) -> None:
    await page.fill("#token", token)
    await page.click("#login-submit")
    await expect(page.locator("#who")).to_have_text(who)


@dataclass
class PolicyPage:
    browsed: Browsed
    http: httpx.AsyncClient
    admin: httpx.AsyncClient
    policy_file: Path


@pytest.fixture
async def policy_page(
    client: Client,
    temporal_server: TemporalServer,
    policy_service: tuple[str, str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[PolicyPage]:
    """The policy stack (the policy evaluator, the API and a worker asking it) and a page of its API."""
    url, admin_token, policy_files = policy_service
    async with (
        running_policy_api(client, temporal_server, url, admin_token, policy_files, tmp_path_factory) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as http,
        httpx.AsyncClient(base_url=url, headers={"X-Admin-Token": admin_token}, timeout=10) as admin,
        browse(api) as browsed,
    ):
        yield PolicyPage(browsed, http, admin, policy_files / "demo.cedar")


async def listed_for_the_manager(http: httpx.AsyncClient, operation_id: str) -> None:
    """Waits until GET /v1/approvals lists the operation for m1 (Temporal's visibility lags a moment)."""

    async def listed() -> bool:
        approvals = (await http.get("/v1/approvals", headers=M1)).json()["approvals"]
        return any(a["operation"]["operation_id"] == operation_id for a in approvals)

    await assert_eventually(listed, within=60, what="the manager's list shows the operation")


async def test_a_manager_approves_on_the_page_a_refund_left_to_managers_and_the_requester_sees_who_and_why(
    policy_page: PolicyPage,
) -> None:
    http, admin = policy_page.http, policy_page.admin
    page = policy_page.browsed.page
    # u1 asks; the page shows the refund waiting, whom for and by which rule, and offers u1 no buttons.
    await log_in_as(page, U1_TOKEN, "Logged in as u1 in tenant acme")
    await expect(page.locator("#decisions-section")).to_be_hidden()
    # A write the policy leaves to its requester is decided in the request's own card, as without a policy.
    small_id = await ask(page, SMALL_REFUND)
    small = page.locator(f'[data-request-id="{small_id}"]')
    own = small.locator('.approval[data-ready="true"]')
    await expect(own).to_have_attribute("data-yours", "true", timeout=WAIT_MS)
    await expect(own.locator('[data-field="approval-rules"]')).to_have_text(
        "the policy's rule requester-decides-the-rest"
    )
    await expect(own.locator('[data-field="approval-deciders"]')).to_have_text("the requester")
    await own.locator('[data-action="approve"]').click()
    await expect(small).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    await expect(small.locator('.operation [data-field="decided"]')).to_have_text(
        "Approved by u1 via api (rule requester-decides-the-rest asked the requester)"
    )
    await expect(small.locator('.operation [data-field="policy-version"]')).to_have_text(re.compile(r"^policy sha256:"))

    request_id = await ask(page, LARGER_REFUND)
    request = page.locator(f'[data-request-id="{request_id}"]')
    card = request.locator('.approval[data-ready="true"]')
    await expect(card).to_be_visible(timeout=WAIT_MS)
    operation_id = await card.get_attribute("data-operation-id")
    assert operation_id
    await expect(card).to_have_attribute("data-yours", "false")
    await expect(card.locator("button[data-action]")).to_have_count(0)
    await expect(card.locator('[data-field="approval-not-yours"]')).to_have_text(
        "Not yours to decide: the approval policy leaves it to a manager. This card shows the decision once it is made."
    )
    await expect(card.locator('[data-field="approval-rules"]')).to_have_text(f"the policy's rule {RULE}")
    await expect(card.locator('tr[data-arg="amountCents"] [data-field="arg-value"]')).to_have_text("4000")
    operation = request.locator(f'.operation[data-operation-id="{operation_id}"]')
    await expect(operation.locator('[data-field="outcome"]')).to_have_text("waiting for a decision")
    await expect(operation.locator('[data-field="decided"]')).to_have_text(
        f"Waiting: the policy's rule {RULE} asked a manager"
    )

    # The manager's list is Temporal's visibility, which lags a moment: the page reads it when m1 logs in.
    await listed_for_the_manager(http, operation_id)
    await page.click("#logout")
    await log_in_as(page, M1_TOKEN, "Logged in as m1 in tenant acme (manager)")
    item = page.locator(f'#decisions [data-operation-id="{operation_id}"]')
    await expect(item).to_be_visible()
    item_workflow = await item.get_attribute("data-workflow-id")
    await expect(item.locator('[data-field="decision-title"]')).to_have_text(
        "refund_order (POST /orders/A100/refunds) for u1"
    )
    await expect(item.locator('[data-field="decision-requester"]')).to_have_text("u1 in tenant acme")
    await expect(item.locator('[data-field="approval-tool"]')).to_have_text("refund_order")
    await expect(item.locator('[data-field="approval-rules"]')).to_have_text(f"the policy's rule {RULE}")
    await expect(item.locator('[data-field="approval-deciders"]')).to_have_text("a manager")
    await expect(item.locator('[data-field="digest-check"]')).to_have_attribute("data-check", "ok")
    whole = await http.get(f"/v1/approvals/{item_workflow}/{operation_id}", headers=M1)
    payload: dict[str, Any] = whole.json()
    await expect(item.locator('[data-field="approval-digest"]')).to_have_text(payload["digest"])
    # Every argument, exactly, and no other.
    await expect(item.locator("tr[data-arg]")).to_have_count(len(payload["arguments"]))
    await expect(item.locator('tr[data-arg="orderId"] [data-field="arg-value"]')).to_have_text('"A100"')
    await expect(item.locator('tr[data-arg="amountCents"] [data-field="arg-value"]')).to_have_text("4000")
    await expect(item.locator('[data-field="approval-decider"]')).to_have_text("m1 in tenant acme")

    await item.locator('[data-action="approve"]').click()
    await expect(page.locator("#decided li").first).to_contain_text(
        "Approved: refund_order (POST /orders/A100/refunds) for u1, recorded as decided by m1 via api"
    )
    await expect(item).to_have_count(0)
    # Nothing is listed, and the page says so in one of two ways: "nothing waits" only when the API read every
    # request that could wait for m1 (GET /v1/approvals, complete), else that the list may leave some out (the
    # session's other tests may leave requests waiting for a manager whose workers are gone).
    await expect(page.locator("#decisions li")).to_have_count(0)
    shown = page.locator("#decisions-empty:visible, #decisions-incomplete:visible")
    await expect(shown).to_have_count(1)
    listed = (await http.get("/v1/approvals", headers=M1)).json()
    visible = "#decisions-empty" if listed["complete"] else "#decisions-incomplete"
    await expect(page.locator(visible)).to_be_visible()

    # Back as u1: the request's card names the manager, the rule and the policy's version.
    await page.click("#logout")
    await log_in_as(page, U1_TOKEN, "Logged in as u1 in tenant acme")
    await expect(request).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    await expect(operation).to_have_attribute("data-state", "verified", timeout=WAIT_MS)
    await expect(operation.locator('[data-field="decided"]')).to_have_text(
        f"Approved by m1 via api (rule {RULE} asked a manager)"
    )
    view = (await http.get(f"/v1/requests/{request_id}", headers=U1)).json()
    version = view["operations"][0]["policy"]["version"]
    assert version.startswith("sha256:")
    await expect(operation.locator('[data-field="policy-version"]')).to_have_text(f"policy {version[:18]}…")
    await expect(operation.locator('[data-field="policy-version"]')).to_have_attribute(
        "title", f"policy version {version}"
    )
    assert len(await effects(admin, operation_id)) == 1


async def test_four_eyes_on_the_page_the_requester_first_then_the_manager_who_sees_who_approved_so_far(
    policy_page: PolicyPage,
) -> None:
    # Four eyes from 50.00, as tests/test_policies_e2e.py lowers it (the demo's orders are too small for 200.00).
    policy_page.policy_file.write_text(lower_four_eyes(policy_page.policy_file.read_text()))
    http, page = policy_page.http, policy_page.browsed.page
    await log_in_as(page, U1_TOKEN, "Logged in as u1 in tenant acme")
    request_id = await ask(page, "Refund 60.00 EUR on order A100 because it arrived late")
    request = page.locator(f'[data-request-id="{request_id}"]')
    card = request.locator('.approval[data-ready="true"]')
    await expect(card).to_have_attribute("data-yours", "true", timeout=WAIT_MS)
    await expect(card.locator('tr[data-arg="amountCents"] [data-field="arg-value"]')).to_have_text("6000")
    await expect(card.locator('[data-field="approval-deciders"]')).to_have_text(
        "two people (the requester or a manager; the requester never second)"
    )
    await expect(card.locator('[data-field="approval-approved-so-far"]')).to_have_text("nobody yet")
    operation_id = await card.get_attribute("data-operation-id")
    assert operation_id
    await card.locator('[data-action="approve"]').click()

    # One of two: it still waits, now for a manager, and u1 has no second say. (After a decision's round trip
    # through the workflow: as long as any wait for the workflow, as a loaded CI machine once took past 5 s.)
    await expect(card).to_have_attribute("data-yours", "false", timeout=WAIT_MS)
    await expect(card.locator("button[data-action]")).to_have_count(0)
    await expect(card.locator('[data-field="approval-approved-so-far"]')).to_have_text("u1")
    operation = request.locator(f'.operation[data-operation-id="{operation_id}"]')
    await expect(operation.locator('[data-field="decided"]')).to_contain_text(
        "; approved so far by u1", timeout=WAIT_MS
    )

    await listed_for_the_manager(http, operation_id)
    await page.click("#logout")
    await log_in_as(page, M1_TOKEN, "Logged in as m1 in tenant acme (manager)")
    item = page.locator(f'#decisions [data-operation-id="{operation_id}"]')
    await expect(item.locator('[data-field="approval-approved-so-far"]')).to_have_text("u1")
    await expect(item.locator('[data-field="approval-rules"]')).to_contain_text("four-eyes-over-200")
    await item.locator('[data-action="approve"]').click()
    # The receipt names this decision's person; the write, once sent, names both.
    await expect(page.locator("#decided li").first).to_contain_text("recorded as decided by m1 via api; now approved")
    await expect(item).to_have_count(0)

    await page.click("#logout")
    await log_in_as(page, U1_TOKEN, "Logged in as u1 in tenant acme")
    await expect(request).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    await expect(operation).to_have_attribute("data-state", "verified", timeout=WAIT_MS)
    await expect(operation.locator('[data-field="decided"]')).to_contain_text("Approved by u1 via api and m1 via api (")
    assert len(await effects(policy_page.admin, operation_id)) == 1


async def test_the_page_says_its_list_of_decisions_may_leave_some_out_never_that_nothing_waits(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    # A manager of this test's own, whose two requests wait for approval, and an API that reads one running
    # request for its approvals list (TOOLLOOP_API_APPROVALS_SCAN=1): its answer is incomplete. The page lists
    # nobody else's write for them, and must not say "Nothing waits for your decision".
    tokens_file, (manager,) = users_of_their_own(tmp_path, "mgr", roles=["manager"])
    env = {"TOOLLOOP_API_APPROVALS_SCAN": "1", "TOOLLOOP_API_TOKENS": str(tokens_file)}
    headers = manager.headers
    async with (
        running_api(temporal_server, business_service, client, tmp_path_factory, env=env) as api,
        httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as http,
    ):
        waiting = []
        for _ in range(2):
            answer = await http.post("/v1/requests", json={"question": SMALL_REFUND}, headers=headers)
            assert answer.status_code == 201, answer.text
            request_id = answer.json()["id"]
            waiting.append((request_id, await pending_operation(http, request_id, headers)))

        async def incomplete() -> bool:
            return (await http.get("/v1/approvals", headers=headers)).json()["complete"] is False

        await assert_eventually(incomplete, within=60, what="the API reads one of the two waiting requests")
        async with browse(api) as browsed:
            page = browsed.page
            await log_in_as(page, manager.token, f"Logged in as {manager.user_id} in tenant acme (manager)")
            await expect(page.locator("#decisions-incomplete")).to_be_visible()
            await expect(page.locator("#decisions-empty")).to_be_hidden()
            await expect(page.locator("#decisions li")).to_have_count(0)  # their own writes are in their cards
        for request_id, op in waiting:  # rejected, so nothing is left waiting
            path = f"/v1/requests/{request_id}/operations/{op['operation_id']}/decision"
            decided = await http.post(path, json={"decision": "reject", "digest": op["digest"]}, headers=headers)
            assert decided.status_code == 200, decided.text
