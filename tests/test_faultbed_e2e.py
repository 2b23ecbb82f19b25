"""End to end: a plan's wire faults on the real socket between a real worker's tools and the real service
(the fault proxy in between), and its service faults as the service's own rules; judged by the service's
effect table and request log, and the request's ledger."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
from temporalio.client import Client

from demo.agent import build as build_demo
from faultbed.plan import parse_plan, service_rules
from faultbed.proxy import FaultProxy, WireFault
from faultbed.runner import wire_faults
from tests.agent_helpers import effects, say, set_faults, tool_outputs
from tests.conftest import BusinessService
from tests.test_writes_e2e import FAST, note_call, run_approved, ticket_version
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e
NOTES = "^/tickets/T1001/notes$"


@pytest.fixture
async def proxy(business_service: BusinessService) -> AsyncIterator[FaultProxy]:
    parts = urlsplit(business_service.url)
    assert parts.hostname is not None and parts.port is not None
    found = FaultProxy(parts.hostname, parts.port, [])
    await found.start()
    yield found
    await found.stop()


def through(settings: Settings, proxy: FaultProxy) -> Settings:
    return settings.model_copy(update={"service_url": f"http://127.0.0.1:{proxy.port}"})


def wire(*faults: dict[str, object]) -> list[WireFault]:
    return wire_faults(parse_plan({"name": "wire", "faults": [{"boundary": "wire", **f} for f in faults]}))


async def posts(admin: httpx.AsyncClient) -> list[dict[str, object]]:
    log = (await admin.get("/admin/requests", params={"path_prefix": "/tickets/T1001/notes"})).json()["requests"]
    return [r for r in log if r["method"] == "POST"]


async def test_a_reset_after_the_write_left_is_settled_by_status_with_one_effect(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService, proxy: FaultProxy
) -> None:
    proxy.faults = wire({"fault": "reset", "match": {"method": "POST", "path": NOTES}})
    proxied = through(settings, proxy)
    version = await ticket_version(business_service.url)
    async with running_worker(client, proxied, build_demo(proxied.service_url)):
        result, handle = await run_approved(
            client, proxied, business_service, [[note_call(version, "reset on the wire", "w1")], [say("ok")]], **FAST
        )
    [op] = result.operations
    # The reply was lost after the service committed: asked, found completed, read back - never resent.
    assert (op.state, op.attempts, [c.state for c in op.status_checks]) == ("verified", 1, ["completed"])
    assert proxy.fired == {0: 1}
    assert len(await effects(admin, op.operation_id)) == 1 and len(await posts(admin)) == 1
    assert list(await tool_outputs(handle)) == ["w1"]


async def test_a_service_down_before_the_write_is_resent_with_the_same_key_once_it_is_back(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService, proxy: FaultProxy
) -> None:
    proxy.faults = wire({"fault": "down", "latency_ms": 1500, "match": {"method": "POST", "path": NOTES}})
    proxied = through(settings, proxy)
    version = await ticket_version(business_service.url)
    async with running_worker(client, proxied, build_demo(proxied.service_url)):
        result, handle = await run_approved(
            client, proxied, business_service, [[note_call(version, "service away", "w1")], [say("ok")]], **FAST
        )
    [op] = result.operations
    assert op.state == "verified" and op.attempts >= 2
    assert proxy.fired == {0: 1}
    # Nothing of the first attempt reached the service; the one effect carries the operation's own key.
    [post] = await posts(admin)
    [effect] = await effects(admin, op.operation_id)
    assert post["status"] == 201 and effect["operation_id"] == op.operation_id


async def test_a_plans_service_fault_fires_on_its_nth_call_and_the_write_is_one_effect(
    client: Client, settings: Settings, admin: httpx.AsyncClient, business_service: BusinessService
) -> None:
    plan = parse_plan(
        {
            "name": "second-write-dropped",
            "faults": [
                {
                    "boundary": "service",
                    "fault": "commit_then_drop",
                    "match": {"method": "POST", "path": NOTES},
                    "when": {"nth": 2},
                }
            ],
        }
    )
    await set_faults(admin, *service_rules(plan, seed=0))
    version = await ticket_version(business_service.url)
    turns = [[note_call(version, "first", "w1")], [note_call(version + 1, "second", "w2")], [say("ok")]]
    async with running_worker(client, settings, build_demo(settings.service_url)):
        result, _ = await run_approved(client, settings, business_service, turns, **FAST)
    first, second = result.operations
    assert (first.state, first.status_checks) == ("verified", [])
    assert (second.state, [c.state for c in second.status_checks]) == ("verified", ["completed"])
    [rule] = (await admin.get("/admin/faults")).json()["rules"]
    assert (rule["matched"], rule["fired"]) == (2, 1)
    for op in result.operations:
        assert len(await effects(admin, op.operation_id)) == 1
