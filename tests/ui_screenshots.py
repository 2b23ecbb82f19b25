"""Screenshots of the Temporal UI as a monitor of toolloop, for the docs: `python -m tests.ui_screenshots --out
docs/ui`.

Starts a throwaway stack (a Temporal dev server with its UI on free ports, the business service, an in-process
worker with the demo's tools), runs five requests as the CLI and the API start them (summary and search
attributes included) - a finished read, a finished write (approved), a write waiting for approval, a write
whose outcome is unknown (the service commits and drops the reply, and its status endpoint is down) and a
failed request (a script model that runs out of turns) - checks that each ended as it should, and takes
screenshots in headless Chromium (Debian's binary; nothing is downloaded):

- workflows.png: the workflow list, with the search attributes ToolloopUser, ToolloopOutcome and
  ToolloopUnsettled as columns (set through the UI's own column configuration in localStorage);
- <name>-details.png for each request: its summary and current details (the phase, the calls table with each
  result code, the side effects' states) on the workflow's "User Metadata" tab;
- <name>-timeline.png for each request: the labelled activities and timers (and the failed write attempt) on
  its timeline.

Every screenshot waits for the text it is meant to show, so a UI that does not show it fails the script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import Page, ViewportSize, async_playwright
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from demo.agent import build as build_demo
from devstack.processes import free_port, start_temporal_dev_server
from tests.agent_helpers import approving, call, script_spec, set_faults, waiting_operation
from tests.conftest import APPROVAL_VERIFY_KEY, start_service
from toolloop import Actor, AgentInput, AgentResult, Limits, ModelSpec, request_result
from toolloop._core.names import AGENT_WORKFLOW
from toolloop._temporal.converter import data_converter
from toolloop._temporal.requests import (
    request_search_attributes,
    request_summary,
    request_workflow_id,
)
from toolloop._temporal.search_attributes import OUTCOME_KEY, UNSETTLED_KEY
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

CHROMIUM = Path("/usr/bin/chromium")
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
U1 = Actor(user_id="u1", tenant_id="acme")
OFFLINE = ModelSpec(provider="offline")
# The workflow list's columns, by the labels of the UI's column configuration (custom search attributes by name).
LIST_COLUMNS = ["Status", "Workflow ID", "ToolloopUser", "ToolloopOutcome", "ToolloopUnsettled", "Start", "End"]
VIEWPORT: ViewportSize = {"width": 1600, "height": 1600}
LIST_VIEWPORT: ViewportSize = {"width": 1860, "height": 800}
WAIT_MS = 30_000


@dataclass
class Shown:
    """One request and what its pages must show."""

    name: str
    question: str
    handle: WorkflowHandle[Any, AgentResult]
    run_id: str
    status: str  # the UI's status badge
    details: list[str]  # texts the current details must contain
    timeline: list[str]  # texts the timeline must contain


async def eventually(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"not true within {within} s: {what}")


async def start(
    client: Client,
    settings: Settings,
    request_id: str,
    question: str,
    model: ModelSpec = OFFLINE,
    limits: Limits | None = None,
) -> WorkflowHandle[Any, AgentResult]:
    """As the CLI and the API start a request: its scoped id, summary and search attributes."""
    return await client.start_workflow(
        AGENT_WORKFLOW,
        AgentInput(
            request=question,
            actor=U1,
            model=model,
            limits=limits or Limits(),
        ),
        id=request_workflow_id(U1, request_id),
        task_queue=settings.task_queue,
        result_type=AgentResult,
        search_attributes=request_search_attributes(U1),
        static_summary=request_summary(U1, question),
    )


def expect_states(result: AgentResult, states: list[str], what: str) -> None:
    found = [op.state for op in result.operations]
    if found != states:
        raise RuntimeError(f"{what}: operations {found}, expected {states}")


async def run_requests(client: Client, settings: Settings, admin: httpx.AsyncClient) -> list[Shown]:
    shown: list[Shown] = []

    async def record(
        name: str, question: str, handle: WorkflowHandle[Any, AgentResult], status: str, details: list[str],
        timeline: list[str],
    ) -> None:  # fmt: skip
        run_id = (await handle.describe()).run_id
        assert run_id is not None
        shown.append(Shown(name, question, handle, run_id, status, details, timeline))

    question = "Where is my order A100?"
    handle = await start(client, settings, "read-order-status", question)
    result = await asyncio.wait_for(request_result(handle), 60)
    if result.status != "completed":
        raise RuntimeError(f"the read ended {result.status}: {result.error}")
    await record(
        "read", question, handle, "Completed", ["finished: final_answer", "get_order_status"], ["model turn 1"]
    )

    question = "Refund 5 EUR on order A100 because it arrived late"
    handle = await start(client, settings, "refund-approved", question)
    async with approving(handle):
        result = await asyncio.wait_for(request_result(handle), 60)
    expect_states(result, ["verified"], "the approved write")
    await record(
        "write-approved", question, handle, "Completed", ["refund_order", "verified ✅"],
        ["waiting for approval of refund_order", "refund_order A100 500 attempt 1"],
    )  # fmt: skip

    # The service commits the refund and drops the reply; its status endpoint is down: nobody can tell.
    await set_faults(
        admin,
        {"method": "POST", "path_regex": "/refunds$", "when": "after_commit", "action": "drop"},
        {"method": "GET", "path_regex": "^/operations/", "status": 503},
    )
    question = "Refund 2 EUR on order A102 because it was damaged"
    limits = Limits(status_max_attempts=2, unknown_resolution_seconds=3)
    handle = await start(client, settings, "refund-outcome-unknown", question, limits=limits)
    try:
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), 90)
    finally:
        (await admin.delete("/admin/faults")).raise_for_status()
    expect_states(result, ["unknown"], "the write with a lost reply")
    await record(
        "write-unknown", question, handle, "Completed", ["OUTCOME_UNKNOWN", "❗ UNKNOWN"],
        ["refund_order A102 200 attempt 1", "(after an unclear outcome)"],
    )  # fmt: skip

    question = "Where is my order A100? (a scripted model with a single turn)"
    model = script_spec([call("get_order_status", {"orderId": "A100"}, "c1")])
    handle = await start(client, settings, "script-runs-out", question, model=model)
    result = await asyncio.wait_for(request_result(handle), 60)
    if result.status != "failed":
        raise RuntimeError(f"the scripted request ended {result.status}, not failed")
    await record("failed", question, handle, "Failed", ["finished: model_error", "get_order_status"], ["model turn 2"])

    # Last, so it is still waiting (for the approval TTL, 300 s) while the screenshots are taken.
    question = "Add a note to ticket T1001: Customer called"
    handle = await start(client, settings, "note-waiting", question)
    op = await waiting_operation(handle)
    await record(
        "write-waiting", question, handle, "Running", [f"waiting for approval of {op.operation_id}"],
        ["waiting for approval of append_ticket_note"],
    )  # fmt: skip

    # The list reads visibility, which follows a moment later: wait until it says how each one ended.
    ids = {s.handle.id for s in shown}

    async def listed() -> bool:
        found = {}
        async for execution in client.list_workflows(f'WorkflowType = "{AGENT_WORKFLOW}"'):
            found[execution.id] = execution
        if set(found) != ids:
            return False
        outcomes = {i: found[i].typed_search_attributes.get(OUTCOME_KEY) for i in ids}
        failed = [i for i in ids if found[i].status == WorkflowExecutionStatus.FAILED]
        unsettled = [i for i in ids if found[i].typed_search_attributes.get(UNSETTLED_KEY)]
        return list(outcomes.values()).count("running") == 1 and len(failed) == 1 and len(unsettled) == 1

    await eventually(listed, 30, "the list shows the five requests and how each ended")
    return shown


# --- Screenshots --------------------------------------------------------------------------------------------

# The page's content column (without the navigation rail), from the top down to the bottom of `bottom`: an
# element, or for "timeline" the section around the "Timeline" heading, or for "rows" the list's last row.
_CLIP_JS = """(bottom) => {
    const main = document.querySelector('main') || document.body;
    const r = main.getBoundingClientRect();
    let end = window.innerHeight;
    if (bottom === 'timeline') {
        let n = Array.from(document.querySelectorAll('h2, h3')).find(e => e.textContent.trim() === 'Timeline');
        while (n && n.getBoundingClientRect().height < 150) n = n.parentElement;
        if (n) end = n.getBoundingClientRect().bottom;
    } else if (bottom === 'rows') {
        const rows = document.querySelectorAll('tbody tr');
        if (rows.length) end = rows[rows.length - 1].getBoundingClientRect().bottom;
    } else {
        const frames = document.querySelectorAll(bottom);
        if (frames.length) end = Math.max(...Array.from(frames, f => f.getBoundingClientRect().bottom));
    }
    const left = Math.max(0, r.left);
    return {x: left, y: 0, width: Math.min(r.width, window.innerWidth - left),
            height: Math.min(window.innerHeight, Math.ceil(end) + 16)};
}"""


async def shoot(page: Page, path: Path, bottom: str) -> Path:
    clip = await page.evaluate(_CLIP_JS, bottom)
    await page.screenshot(path=path, clip=clip, animations="disabled")
    return path


async def list_page(page: Page, ui: str, shown: list[Shown], out: Path) -> Path:
    await page.set_viewport_size(LIST_VIEWPORT)  # wide enough for every column
    await page.goto(f"{ui}/namespaces/default/workflows")
    for s in shown:
        await page.get_by_text(s.handle.id, exact=True).first.wait_for()
    for label in LIST_COLUMNS[2:]:
        await page.get_by_role("columnheader", name=label).first.wait_for()
    await page.get_by_text("1 Failed", exact=False).first.wait_for()
    await page.get_by_role("cell", name="true", exact=False).first.wait_for()
    path = await shoot(page, out / "workflows.png", "rows")
    await page.set_viewport_size(VIEWPORT)
    return path


async def details_page(page: Page, ui: str, shown: Shown, out: Path) -> Path:
    await page.goto(f"{ui}/namespaces/default/workflows/{shown.handle.id}/{shown.run_id}/user-metadata")
    await page.get_by_test_id("workflow-id-heading").wait_for()
    await page.get_by_test_id("execution-status").get_by_text(shown.status, exact=False).wait_for()
    summary = page.frame_locator("#user-metadata-summary")
    # As the UI renders it: the summary is Markdown, its punctuation escaped.
    shown_summary = re.sub(r"\\(.)", r"\1", request_summary(U1, shown.question))
    await summary.get_by_text(shown_summary, exact=True).wait_for()
    details = page.frame_locator("#user-metadata-current-details")
    for text in shown.details:
        await details.get_by_text(text, exact=False).first.wait_for()
    return await shoot(page, out / f"{shown.name}-details.png", "iframe")


async def timeline_page(page: Page, ui: str, shown: Shown, out: Path) -> Path:
    await page.goto(f"{ui}/namespaces/default/workflows/{shown.handle.id}/{shown.run_id}/timeline")
    await page.get_by_test_id("workflow-id-heading").wait_for()
    for text in shown.timeline:
        await page.get_by_text(text, exact=False).first.wait_for()
    return await shoot(page, out / f"{shown.name}-timeline.png", "timeline")


async def screenshots(ui: str, shown: list[Shown], out: Path) -> list[Path]:
    columns = json.dumps({"default": [{"label": label} for label in LIST_COLUMNS]})
    paths = []
    async with async_playwright() as playwright:
        with tempfile.TemporaryDirectory(prefix="toolloop-chromium-") as profile:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                args=CHROMIUM_ARGS,
                headless=True,
                viewport=VIEWPORT,
                color_scheme="light",
                timezone_id="UTC",
            )
            try:
                # The UI keeps its column configuration in localStorage, per namespace.
                await context.add_init_script(
                    f"localStorage.setItem('namespace-workflow-table-columns', {json.dumps(columns)});"
                )
                page = context.pages[0] if context.pages else await context.new_page()
                page.set_default_timeout(WAIT_MS)
                paths.append(await list_page(page, ui, shown, out))
                for s in shown:
                    paths.append(await details_page(page, ui, s, out))
                    paths.append(await timeline_page(page, ui, s, out))
            finally:
                await context.close()
    return paths


async def main(out: Path) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="toolloop-ui-") as tmp:
        directory = Path(tmp)
        port, ui_port = free_port(), free_port()
        temporal = await asyncio.to_thread(start_temporal_dev_server, directory / "temporal", port, ui_port)
        try:
            service = await asyncio.to_thread(start_service, directory / "service")
            try:
                address = f"127.0.0.1:{port}"
                client = await Client.connect(address, data_converter=data_converter())
                settings = Settings.model_validate(
                    {
                        "TEMPORAL_ADDRESS": address,
                        "TOOLLOOP_TASK_QUEUE": "ui-screenshots",
                        "TOOLLOOP_SERVICE_URL": service.url,
                        "TOOLLOOP_APPROVAL_VERIFY_KEY": APPROVAL_VERIFY_KEY,
                        "TOOLLOOP_ALLOW_SCRIPTED_MODELS": "1",
                    }
                )
                admin_headers = {"X-Admin-Token": service.admin_token}
                async with (
                    running_worker(client, settings, build_demo(service.url)),
                    httpx.AsyncClient(
                        base_url=service.url, headers=admin_headers, timeout=10, trust_env=False
                    ) as admin,
                ):
                    shown = await run_requests(client, settings, admin)
                    return await screenshots(f"http://127.0.0.1:{ui_port}", shown, out)
            finally:
                service.process.stop()
        finally:
            temporal.stop()


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.ui_screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/ui"), help="where the PNG files go (docs/ui)")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: install Debian's Chromium with `apt-get install -y chromium`")
    args.out.mkdir(parents=True, exist_ok=True)
    # The in-process worker logs every failed attempt with its traceback; some fail here on purpose.
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    for path in asyncio.run(main(args.out)):
        print(f"{path} ({path.stat().st_size // 1024} KiB)")
    sys.stdout.flush()


if __name__ == "__main__":
    cli()
