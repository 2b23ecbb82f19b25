"""End to end in a real browser: the API's web page (toolloop/_api/static) in headless Chromium (Debian's
binary, driven by Playwright; no browser is downloaded), against a real `starter.py serve` process, the
session's dev server and business service, and a worker with the demo's tools. Judged by what the page
shows (the approval card's exact payload, each operation's state and outcome in words) and by the service's
own effect table."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from playwright.async_api import Page, Request, Route, async_playwright, expect
from temporalio.client import Client

from demo.agent import build as build_demo
from devstack.processes import ManagedProcess, free_port, start_api
from tests.agent_helpers import assert_eventually, effects
from tests.api_helpers import api_env, pending_operation, worker_settings
from tests.conftest import REPO_ROOT, BusinessService, TemporalServer
from tests.fake_openai_server import FakeOpenAIServer, output_message, responses_response
from toolloop._core.approvals import payload_digest
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling out, and on a closed network its refused
# connections pile up; a fresh profile per page keeps runs independent.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
U1_TOKEN = "demo-token-u1-acme-0001"
U1 = {"Authorization": f"Bearer {U1_TOKEN}"}
REFUND = "Refund 5 EUR on order A100 because it arrived late"
# Untrusted text that would be markup if the page ever rendered it as HTML.
MARKUP = '<img src=x onerror="document.title=1"> & <b>bold</b>'
NOTE = f"Add a note to ticket T1001: {MARKUP} called"
WAIT_MS = 60_000


@dataclass
class Api:
    url: str
    port: int
    env: dict[str, str]
    log: Path
    process: ManagedProcess

    async def restart(self) -> None:
        """Stop the API process and start it again on the same port: every open stream drops."""
        self.process.stop()
        self.process = await asyncio.to_thread(start_api, REPO_ROOT, self.env, self.port, self.log)


@pytest.fixture(scope="module")
async def api(
    temporal_server: TemporalServer, business_service: BusinessService, client: Client, tmp_path_factory: Any
) -> AsyncIterator[Api]:
    """One API process (serving the page) and one worker for this module's requests, on their own task queue."""
    task_queue = f"web-{uuid.uuid4().hex[:8]}"
    settings = worker_settings(temporal_server, task_queue)
    port = free_port()
    env = api_env(temporal_server, task_queue)
    log = Path(tmp_path_factory.mktemp("web")) / "api.log"
    process = await asyncio.to_thread(start_api, REPO_ROOT, env, port, log)
    served = Api(url=f"http://127.0.0.1:{port}", port=port, env=env, log=log, process=process)
    try:
        async with running_worker(client, settings, build_demo(business_service.url)):
            yield served
    finally:
        served.process.stop()


@pytest.fixture
async def http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30, trust_env=False) as c:
        yield c


class Served(Protocol):
    """Whatever serves the page: an API process at `url`."""

    @property
    def url(self) -> str: ...


@dataclass
class Browsed:
    page: Page
    errors: list[str] = field(default_factory=list)
    event_requests: list[Request] = field(default_factory=list)


def require_chromium() -> None:
    """Fails (never skips) the test without the system's Chromium: Playwright must not download one."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's Chromium with `apt-get install -y chromium`", pytrace=False
        )


@asynccontextmanager
async def browse(api: Served) -> AsyncIterator[Browsed]:
    """A page in a fresh headless Chromium; collects uncaught errors and CSP violations, and the event-stream
    requests it makes."""
    require_chromium()
    async with async_playwright() as playwright:
        with tempfile.TemporaryDirectory(prefix="toolloop-chromium-") as profile:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1100, "height": 900},
            )
            try:
                page = context.pages[0] if context.pages else await context.new_page()
                page.set_default_timeout(WAIT_MS)
                browsed = Browsed(page)
                page.on("pageerror", lambda error: browsed.errors.append(f"page error: {error}"))
                page.on(
                    "console",
                    lambda message: (
                        browsed.errors.append(f"console: {message.text}")
                        if "Content Security Policy" in message.text
                        else None
                    ),
                )
                page.on("request", lambda r: browsed.event_requests.append(r) if "/events" in r.url else None)
                await page.goto(api.url + "/")
                yield browsed
                assert browsed.errors == []
                # Nothing the server sent was ever turned into markup.
                assert await page.locator("#requests img, #requests b, #decisions img, #decisions b").count() == 0
            finally:
                await context.close()


async def log_in(page: Page) -> None:
    await page.fill("#token", "not-a-token")
    await page.click("#login-submit")
    await expect(page.locator("#login-error")).to_have_text("That token was not accepted. Check it and try again.")
    await expect(page.locator("#app")).to_be_hidden()
    await page.fill("#token", U1_TOKEN)
    await page.click("#login-submit")
    await expect(page.locator("#who")).to_have_text("Logged in as u1 in tenant acme")
    await expect(page.locator("#login-error")).to_be_hidden()


async def ask(page: Page, question: str) -> str:
    """Start a request through the page's form; its id."""
    await page.fill("#question", question)
    async with page.expect_response(lambda r: r.url.endswith("/v1/requests") and r.request.method == "POST") as info:
        await page.click("#ask-submit")
    response = await info.value
    assert response.status == 201, await response.text()
    request_id: str = (await response.json())["id"]
    return request_id


async def check_approval_card(page: Page, http: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    """The pending approval's card shows exactly the payload the digest covers (as the API gives it whole);
    returns that payload."""
    card = page.locator(f'[data-request-id="{request_id}"] .approval[data-ready="true"]')
    await expect(card).to_be_visible(timeout=WAIT_MS)
    operation_id = await card.get_attribute("data-operation-id")
    assert operation_id
    response = await http.get(f"/v1/requests/{request_id}/operations/{operation_id}", headers=U1)
    payload: dict[str, Any] = response.json()
    assert response.status_code == 200 and payload["state"] == "awaiting_approval", payload
    await expect(card.locator('[data-field="approval-tool"]')).to_have_text(payload["tool"])
    await expect(card.locator('[data-field="approval-target"]')).to_have_text(payload["target"])
    await expect(card.locator('[data-field="approval-digest"]')).to_have_text(payload["digest"])
    await expect(card.locator('[data-field="digest-check"]')).to_have_attribute("data-check", "ok")
    expires = card.locator('[data-field="approval-expires"]')
    await expect(expires).to_have_attribute("data-expires-at", payload["approval_expires_at"])
    await expect(expires).to_contain_text(re.compile(r"in \d+ (min|s)"))
    # Every argument, each value as its exact JSON text, and no other row.
    rows = card.locator("tr[data-arg]")
    await expect(rows).to_have_count(len(payload["arguments"]))
    for name, value in payload["arguments"].items():
        shown = card.locator(f'tr[data-arg="{name}"] [data-field="arg-value"]')
        await expect(shown).to_have_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return payload


async def test_a_write_approved_on_the_page_is_done_once_and_shown_verified(
    api: Api, http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    async with browse(api) as browsed:
        page = browsed.page
        await log_in(page)
        request_id = await ask(page, REFUND)
        request = page.locator(f'[data-request-id="{request_id}"]')
        await expect(request.locator('[data-field="question"]')).to_have_text(REFUND)
        payload = await check_approval_card(page, http, request_id)
        assert (payload["tool"], payload["target"]) == ("refund_order", "POST /orders/A100/refunds")
        assert payload["arguments"] == {
            "orderId": "A100",
            "amountCents": 500,
            "reason": "it arrived late",
            "toAccount": None,
        }
        card = request.locator(".approval")
        await expect(card.locator('tr[data-arg="orderId"] [data-field="arg-value"]')).to_have_text('"A100"')
        await expect(card.locator('tr[data-arg="amountCents"] [data-field="arg-value"]')).to_have_text("500")
        await expect(card.locator('tr[data-arg="reason"] [data-field="arg-value"]')).to_have_text('"it arrived late"')

        await card.locator('[data-action="approve"]').click()

        operation = request.locator(f'.operation[data-operation-id="{payload["operation_id"]}"]')
        await expect(request).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        await expect(operation).to_have_attribute("data-state", "verified")
        await expect(operation.locator('[data-field="outcome"]')).to_have_text("verified")
        await expect(card).to_have_count(0)
        await expect(request.locator('[data-field="request-outcome"]')).to_have_text(
            "Outcome: answered; every side effect done and verified"
        )
        await expect(request.locator('[data-field="final-text"]')).to_contain_text("refunded 500 cents")
        await expect(request.locator('tr[data-call-id] [data-field="result"]')).to_have_text(["ok"])
    assert len(await effects(admin, payload["operation_id"])) == 1


async def test_the_digest_check_spells_floats_and_long_integers_as_the_server_does(
    api: Api, http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    """A tool's float argument (25.0, 1e-07) or a 20-digit integer is one JS number once parsed, 25 and a
    rounded integer: the page rebuilt the digest's text from that, said "DOES NOT MATCH" and disabled Approve
    for a payload that was exactly right. The operation's answer is rewritten here (a tool with such arguments,
    its digest made by the server's own function) so the page's check meets those numbers."""
    arguments = {"amount": 25.0, "tiny": 1e-07, "big": 12345678901234567890, "cents": 500, "shape": {"xy": [1.5, 2]}}
    digests: list[str] = []

    async def with_numbers(route: Route) -> None:
        response = await route.fetch()
        payload = await response.json()
        subject = payload["target"] or payload["tool"]
        payload["arguments"] = arguments
        payload["digest"] = digests[-1] if digests else payload_digest(subject, arguments)
        await route.fulfill(response=response, body=json.dumps(payload))

    async with browse(api) as browsed:
        page = browsed.page
        await page.route(re.compile(r".*/v1/requests/[^/]+/operations/[^/]+$"), with_numbers)
        await log_in(page)
        request_id = await ask(page, REFUND)
        card = page.locator(f'[data-request-id="{request_id}"] .approval[data-ready="true"]')
        await expect(card.locator('[data-field="digest-check"]')).to_have_attribute("data-check", "ok")
        for name, text in (("amount", "25.0"), ("tiny", "1e-07"), ("big", "12345678901234567890"), ("cents", "500")):
            await expect(card.locator(f'tr[data-arg="{name}"] [data-field="arg-value"]')).to_have_text(text)
        await expect(card.locator('tr[data-arg="shape"] [data-field="arg-value"]')).to_have_text('{"xy":[1.5,2]}')
        await expect(card.locator('[data-action="approve"]')).to_be_enabled()
        # And the check still catches a digest of other numbers: 25 where 25.0 is shown.
        digests.append(payload_digest("POST /orders/A100/refunds", {**arguments, "amount": 25}))
        tampered = await ask(page, REFUND)
        card = page.locator(f'[data-request-id="{tampered}"] .approval[data-ready="true"]')
        await expect(card.locator('[data-field="digest-check"]')).to_have_attribute("data-check", "mismatch")
        await expect(card.locator('[data-action="approve"]')).to_be_disabled()
    for asked in (request_id, tampered):
        real = await pending_operation(http, asked, U1)
        path = f"/v1/requests/{asked}/operations/{real['operation_id']}/decision"
        rejected = await http.post(path, json={"decision": "reject", "digest": real["digest"]}, headers=U1)
        assert rejected.status_code == 200, rejected.text
        assert await effects(admin, real["operation_id"]) == []


async def test_a_write_rejected_on_the_page_after_a_dropped_stream_is_not_done(
    api: Api, http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    async with browse(api) as browsed:
        page = browsed.page
        await log_in(page)
        request_id = await ask(page, NOTE)
        request = page.locator(f'[data-request-id="{request_id}"]')
        # The question and the note's text are shown as the text they are, never as markup.
        await expect(request.locator('[data-field="question"]')).to_have_text(NOTE)
        payload = await check_approval_card(page, http, request_id)
        assert payload["tool"] == "append_ticket_note" and payload["target"] == "POST /tickets/T1001/notes"
        assert payload["arguments"]["text"] == f"{MARKUP} called"
        assert set(payload["arguments"]) == {"ticketId", "text", "expectedVersion"}
        live = request.locator('[data-field="live"]')
        await expect(live).to_have_attribute("data-live", "live")

        # The API goes away under the open stream and comes back: the page reconnects where it left off.
        seen_before = len(browsed.event_requests)
        await api.restart()
        view = (await http.get(f"/v1/requests/{request_id}", headers=U1)).json()

        async def resumed() -> bool:
            later = [r for r in browsed.event_requests[seen_before:] if request_id in r.url]
            resumes = [(await r.all_headers()).get("last-event-id") for r in later]
            return str(view["events"]) in resumes

        await assert_eventually(resumed, within=30, what="the page reconnects with Last-Event-ID")
        await expect(live).to_have_attribute("data-live", "live", timeout=WAIT_MS)

        card = request.locator(".approval")
        await card.locator('[data-action="reject"]').click()

        operation = request.locator(f'.operation[data-operation-id="{payload["operation_id"]}"]')
        await expect(request).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        await expect(operation).to_have_attribute("data-state", "denied")
        await expect(operation).to_have_attribute("data-outcome", "not-done")
        await expect(operation.locator('[data-field="outcome"]')).to_have_text("not done")
        await expect(request.locator('[data-field="request-outcome"]')).to_have_text(
            "Outcome: answered, but not all it asked for was done"
        )
        assert await page.title() != "1"
    assert await effects(admin, payload["operation_id"]) == []


# --- The model's text as it is written ---------------------------------------------------------------------

STREAMED_ANSWER = "Your order A100 left the warehouse on Monday and should arrive on Thursday."


@pytest.fixture
async def live_api(
    temporal_server: TemporalServer,
    business_service: BusinessService,
    client: Client,
    tmp_path_factory: Any,
    live_text_url: str,
) -> AsyncIterator[tuple[Api, FakeOpenAIServer]]:
    """An API process and a worker whose model streams (a loopback OpenAI server) into a live text store."""
    async with FakeOpenAIServer() as model_server:
        task_queue = f"web-live-{uuid.uuid4().hex[:8]}"
        settings = worker_settings(
            temporal_server,
            task_queue,
            TOOLLOOP_LIVE_TEXT_URL=live_text_url,
            OPENAI_API_KEY="sk-test-web-live-0123456789",
            OPENAI_BASE_URL=model_server.url,
        )
        port = free_port()
        env = api_env(
            temporal_server,
            task_queue,
            TOOLLOOP_LIVE_TEXT_URL=live_text_url,
            TOOLLOOP_API_MODEL="openai",
            TOOLLOOP_API_MODELS="offline,script,openai",
        )
        log = Path(tmp_path_factory.mktemp("web-live")) / "api.log"
        process = await asyncio.to_thread(start_api, REPO_ROOT, env, port, log)
        served = Api(url=f"http://127.0.0.1:{port}", port=port, env=env, log=log, process=process)
        try:
            async with running_worker(client, settings, build_demo(business_service.url)):
                yield served, model_server
        finally:
            served.process.stop()


async def test_the_page_shows_the_models_text_as_it_is_written_then_the_answer_once(
    live_api: tuple[Api, FakeOpenAIServer],
) -> None:
    api, model_server = live_api
    # The answer stops after its first pieces until the page has shown them.
    model_server.reply(responses_response(output_message(STREAMED_ANSWER)), fault="pause", fault_after=4)
    async with browse(api) as browsed:
        page = browsed.page
        await log_in(page)
        request_id = await ask(page, "Where is my order A100?")
        request = page.locator(f'[data-request-id="{request_id}"]')
        writing = request.locator('[data-field="writing-text"]')

        await expect(request.locator('[data-field="writing"]')).to_be_visible(timeout=WAIT_MS)
        shown = await writing.text_content() or ""
        assert shown and STREAMED_ANSWER.startswith(shown) and shown != STREAMED_ANSWER
        await expect(request.locator('[data-field="answer"]')).to_be_hidden()

        model_server.resume()
        await expect(request).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        await expect(request.locator('[data-field="final-text"]')).to_have_text(STREAMED_ANSWER)
        # The answer once: the text written so far gives way to it.
        await expect(request.locator('[data-field="writing"]')).to_be_hidden()


# --- A conversation (a thread) ----------------------------------------------------------------------------------

THREAD_READ = "Where is my order A102?"


async def send_message(page: Page, question: str) -> dict[str, Any]:
    """Send a message of the open thread through the page's form; the API's answer."""
    await page.fill("#message", question)
    async with page.expect_response(lambda r: "/messages" in r.url and r.request.method == "POST") as info:
        await page.click("#message-submit")
    response = await info.value
    assert response.status == 201, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


async def test_a_conversation_ended_from_the_page_takes_no_new_message_and_says_so(
    api: Api, http: httpx.AsyncClient
) -> None:
    async with browse(api) as browsed:
        page = browsed.page
        await log_in(page)
        await page.click("#thread-new")
        thread_id = await page.input_value("#thread-id")
        first = await send_message(page, THREAD_READ)
        one = page.locator(f'#thread-messages [data-request-id="{first["request_id"]}"]')
        await expect(one).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        async with page.expect_response(lambda r: r.url.endswith("/close") and r.request.method == "POST") as info:
            await page.click("#thread-end")
        assert (await info.value).status == 200
        await expect(page.locator("#thread-closed")).to_be_visible()
        await expect(page.locator("#message-submit")).to_be_disabled()
        await expect(page.locator("#thread-end")).to_be_disabled()
        # Its messages have run, so its workflow ends and its stream says so: the page stops following it.
        await expect(page.locator("#thread-live")).to_have_text("closed", timeout=WAIT_MS)
        await expect(page.locator("#thread-error")).to_be_hidden()
        refused = await http.post(f"/v1/threads/{thread_id}/messages", json={"question": "more?"}, headers=U1)
        assert refused.status_code == 409 and refused.json()["code"] == "THREAD_CLOSED"
        # Opened again, it is the same conversation, shown closed once its stream says so.
        await page.fill("#thread-id", thread_id)
        await page.click("#thread-open")
        await expect(page.locator("#thread-messages > li")).to_have_count(1)
        await expect(page.locator("#thread-live")).to_have_text("closed", timeout=WAIT_MS)
        await expect(page.locator("#message-submit")).to_be_disabled()


async def test_a_conversation_shows_two_messages_in_order_a_queued_one_as_queued_and_approves_a_write(
    api: Api, http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    async with browse(api) as browsed:
        page = browsed.page
        await log_in(page)
        await page.click("#thread-new")
        await expect(page.locator("#thread-view")).to_be_visible()
        thread_id = await page.input_value("#thread-id")
        await expect(page.locator("#thread-name")).to_have_text(thread_id)

        first = await send_message(page, REFUND)
        second = await send_message(page, THREAD_READ)
        assert (first["number"], second["number"]) == (1, 2)
        # The first waits for approval, so the second is queued behind it, and the page says so.
        assert (second["queued"], second["ahead"]) == (True, 1)
        messages = page.locator("#thread-messages > li")
        one = page.locator(f'#thread-messages [data-request-id="{first["request_id"]}"]')
        two = page.locator(f'#thread-messages [data-request-id="{second["request_id"]}"]')
        await expect(two).to_have_attribute("data-status", "queued")
        await expect(two.locator('[data-field="status"]')).to_have_text("queued")
        await expect(two.locator('[data-field="phase"]')).to_have_text("queued: waiting for 1 message before it")

        # Approved from the conversation view, exactly as the request card approves.
        card = one.locator('.approval[data-ready="true"]')
        await expect(card).to_be_visible(timeout=WAIT_MS)
        operation_id = await card.get_attribute("data-operation-id")
        await expect(card.locator('[data-field="digest-check"]')).to_have_attribute("data-check", "ok")
        await expect(card.locator('tr[data-arg="amountCents"] [data-field="arg-value"]')).to_have_text("500")
        await card.locator('[data-action="approve"]').click()

        await expect(one).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        await expect(one.locator(f'.operation[data-operation-id="{operation_id}"]')).to_have_attribute(
            "data-state", "verified"
        )
        await expect(two).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        # Both answers, in the order the messages were sent.
        await expect(messages.locator('[data-field="question"]')).to_have_text([REFUND, THREAD_READ])
        await expect(messages.nth(0).locator('[data-field="final-text"]')).to_contain_text("refunded 500 cents")
        await expect(messages.nth(1).locator('[data-field="final-text"]')).to_contain_text("A102")
        await expect(messages.nth(1)).not_to_have_attribute("data-queued", "true")

        # Opened again in a fresh page (picked by its id): the same conversation, in order, with its answers.
        await page.reload()
        await expect(page.locator("#who")).to_have_text("Logged in as u1 in tenant acme")
        await expect(page.locator(f'#thread-ids option[value="{thread_id}"]')).to_have_count(1, timeout=WAIT_MS)
        await page.fill("#thread-id", thread_id)
        await page.click("#thread-open")
        await expect(messages.locator('[data-field="question"]')).to_have_text([REFUND, THREAD_READ])
        await expect(messages.nth(0).locator('[data-field="request-outcome"]')).to_have_text(
            "Outcome: answered; every side effect done and verified"
        )
        await expect(messages.nth(1).locator('[data-field="final-text"]')).to_contain_text("A102")
        assert await page.locator("#thread-messages img, #thread-messages b").count() == 0
    assert operation_id is not None
    assert len(await effects(admin, operation_id)) == 1
