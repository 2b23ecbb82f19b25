"""Observability, checked where it is produced: the worker's, the API's and the service's structured JSON logs
(with the fields an operator filters on and arguments masked by a rule per field), the Prometheus endpoints of
the worker and the API (Temporal's runtime metrics beside toolloop's counts), and the optional tracing."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.worker import Worker

import toolloop
from demo.agent import build as build_demo
from devstack.processes import free_port, start_api, start_worker
from tests.agent_helpers import (
    approving,
    assert_eventually,
    call,
    run_agent,
    say,
    script_spec,
    start_agent,
    worker_env,
)
from tests.conftest import APPROVAL_KEY, REPO_ROOT, BusinessService, TemporalServer
from toolloop._core.redaction import MASK, for_logs, log_rules
from toolloop._temporal.settings import Settings
from toolloop.testing import start_request

REFUND = {"orderId": "A100", "amountCents": 300, "reason": "a very private reason"}


def demo_rules(tool: str) -> dict[str, bool]:
    spec = build_demo("http://x").tools.registry.get(tool)
    assert spec is not None
    return log_rules(spec.definition()["parameters"], spec.redact)


def json_lines(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


# --- The rule per field (pure) --------------------------------------------------------------------------------


def test_free_text_amounts_and_addresses_are_masked_ids_times_and_counts_are_not() -> None:
    assert for_logs(REFUND, demo_rules("refund_order")) == {"orderId": "A100", "amountCents": MASK, "reason": MASK}
    note = {"ticketId": "T1001", "text": "call me on +49 170 1234567", "expectedVersion": 3}
    assert for_logs(note, demo_rules("append_ticket_note")) == {"ticketId": "T1001", "text": MASK, "expectedVersion": 3}
    event = {
        "calendarId": "cal-u1",
        "title": "Dentist",
        "start": "2026-12-03T10:00:00Z",
        "end": "2026-12-03T11:00:00Z",
        "attendees": ["ada@example.org"],
    }
    masked = for_logs(event, demo_rules("create_calendar_event"))
    assert masked == {**event, "title": MASK, "attendees": MASK}
    assert for_logs({"page": 2, "pageSize": None}, demo_rules("list_my_orders")) == {"page": 2, "pageSize": None}
    # A field the schema does not know is masked, and so is one the tool names in `redact`.
    assert for_logs({"surprise": "x"}, {}) == {"surprise": MASK}
    assert log_rules({"properties": {"orderId": {"type": "string", "pattern": "^A"}}}, redact=["orderId"]) == {
        "orderId": False
    }


# --- The worker: JSON logs and metrics ------------------------------------------------------------------------


@pytest.mark.e2e
async def test_the_worker_logs_json_with_the_call_fields_and_serves_metrics(
    client: Client, settings: Settings, business_service: BusinessService, tmp_path: Path
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    env = {**worker_env(settings), "TOOLLOOP_METRICS_ADDRESS": metrics}
    log = tmp_path / "worker.log"
    proc = await asyncio.to_thread(start_worker, REPO_ROOT, env, log)
    try:
        read, _ = await run_agent(
            client,
            settings,
            "A100?",
            model=script_spec([call("get_order_status", {"orderId": "A100"}, "r1")], [say("ok")]),
        )
        handle = await start_agent(
            client, settings, "refund", model=script_spec([call("refund_order", REFUND, "w1")], [say("refunded")])
        )
        async with approving(handle):
            write = await toolloop.request_result(handle)
        async with httpx.AsyncClient(trust_env=False) as http:
            scraped = (await http.get(f"http://{metrics}/metrics")).text
    finally:
        proc.stop()
    assert read.status == "completed" and [o.state for o in write.operations] == ["verified"]

    records = json_lines(log)
    assert records and all({"time", "level", "logger", "message", "component"} <= set(r) for r in records)
    assert {r["component"] for r in records} == {"worker"}
    [tool] = [r for r in records if r["message"] == "tool call done" and r["call_id"] == "r1"]
    assert tool["request_id"] == read.workflow_id and (tool["round"], tool["tool"]) == (1, "get_order_status")
    assert (tool["code"], tool["side_effect"], tool["arguments"]) == (None, False, {"orderId": "A100"})
    assert isinstance(tool["duration_ms"], int)
    [attempt] = [r for r in records if r["message"] == "write attempt done"]
    assert (attempt["request_id"], attempt["tool"], attempt["side_effect"]) == (
        write.workflow_id,
        "refund_order",
        "yes",
    )
    assert attempt["arguments"] == {"orderId": "A100", "amountCents": MASK, "reason": MASK, "toAccount": None}
    # The masked values appear nowhere in the worker's log.
    assert "a very private reason" not in log.read_text()

    # Temporal's own runtime metrics and toolloop's counts, on one endpoint.
    assert "temporal_workflow_completed" in scraped or "temporal_workflow_task_execution_latency" in scraped
    assert "toolloop_tool_results{" in scraped
    lines = scraped.splitlines()
    assert any(
        'tool="get_order_status"' in line and 'code="ok"' in line for line in lines if "toolloop_tool_results" in line
    )
    assert any('outcome="completed"' in line for line in lines if line.startswith("toolloop_write_attempts"))
    assert any('state="verified"' in line for line in lines if line.startswith("toolloop_operations"))


# --- The API: JSON logs and metrics ---------------------------------------------------------------------------


@pytest.mark.e2e
async def test_the_api_logs_json_per_request_and_serves_metrics(
    temporal_server: TemporalServer, tmp_path: Path
) -> None:
    port, metrics = free_port(), f"127.0.0.1:{free_port()}"
    env = {
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_TASK_QUEUE": f"obs-{uuid.uuid4().hex[:8]}",
        "TOOLLOOP_APPROVAL_KEY": APPROVAL_KEY,
        "TOOLLOOP_API_TOKENS": str(REPO_ROOT / "config" / "api_tokens.json"),
        "TOOLLOOP_API_ALLOW_DEMO_TOKENS": "true",
        "TOOLLOOP_API_METRICS_ADDRESS": metrics,
    }
    log = tmp_path / "api.log"
    proc = await asyncio.to_thread(start_api, REPO_ROOT, env, port, log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
            me = await http.get("/v1/me", headers={"Authorization": "Bearer demo-token-u1-acme-0001"})
            missing = await http.get("/v1/requests/nope", headers={"Authorization": "Bearer demo-token-u1-acme-0001"})
            scraped = (await http.get(f"http://{metrics}/metrics")).text
    finally:
        proc.stop()
    assert (me.status_code, missing.status_code) == (200, 404)

    async def logged() -> bool:
        return len([r for r in json_lines(log) if r.get("message") == "api request"]) >= 2

    await assert_eventually(logged, within=10, what="the API logged both requests")
    requests = [r for r in json_lines(log) if r.get("message") == "api request"]
    first = next(r for r in requests if r["route"] == "/v1/me")
    assert (first["status"], first["user_id"], first["tenant_id"], first["component"]) == (200, "u1", "acme", "api")
    second = next(r for r in requests if r["route"] == "/v1/requests/{request_id}")
    assert (second["status"], second["request_id"]) == (404, "nope")
    assert "demo-token" not in log.read_text()  # tokens never reach the logs
    lines = [line for line in scraped.splitlines() if line.startswith("toolloop_api_responses")]
    assert any('route="/v1/me"' in line and 'status="200"' in line for line in lines), lines
    assert "temporal_request" in scraped  # the API's Temporal client's own RPC metrics


# --- The service: JSON logs -------------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_the_service_logs_json_per_request(business_service: BusinessService) -> None:
    async with httpx.AsyncClient(base_url=business_service.url, trust_env=False) as http:
        await http.get("/orders/A100", headers={"X-Actor-User": "u1", "X-Actor-Tenant": "acme"})
    log = business_service.process.log_path
    assert log is not None

    async def logged() -> bool:
        return any(r.get("message") == "request" and r.get("path") == "/orders/A100" for r in json_lines(log))

    await assert_eventually(logged, within=10, what="the service logged the request")
    record = next(r for r in json_lines(log) if r.get("message") == "request" and r.get("path") == "/orders/A100")
    assert (record["component"], record["status"], record["user_id"], record["side_effect"]) == (
        "service",
        200,
        "u1",
        False,
    )


# --- Tracing (off by default) ---------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_tracing_when_asked_for_spans_the_workflow_and_its_activities(
    client: Client, settings: Settings, business_service: BusinessService
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    plugin = toolloop.ToolloopPlugin(build_demo(business_service.url), tracing=True, allow_scripted_models=True)
    traced = await Client.connect(client.service_client.config.target_host, plugins=[plugin])
    async with Worker(traced, task_queue=settings.task_queue):  # the client's plugin configures it
        handle = await start_request(
            traced,
            "A100?",
            actor=toolloop.Actor(user_id="u1"),
            task_queue=settings.task_queue,
            model=script_spec([call("get_order_status", {"orderId": "A100"}, "c1")], [say("ok")]),
        )
        await toolloop.request_result(handle)
    names = {span.name for span in exporter.get_finished_spans()}
    assert {"StartWorkflow:AgentWorkflow", "RunWorkflow:AgentWorkflow", "RunActivity:run_tool"} <= names, names
