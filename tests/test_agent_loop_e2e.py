"""End to end: real Temporal dev server, real business service process, real worker. Each test checks
the service's own request log and the outputs the model received (paired by call_id) in history."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from demo.agent import build as build_demo
from tests.agent_helpers import (
    call,
    run_agent,
    say,
    script_spec,
    service_requests,
    set_faults,
    tool_outputs,
)
from toolloop._core.contracts import ConversationItem, FunctionCallItem, Limits, MessageItem, ModelSpec
from toolloop._models.adapter import ModelRequest
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker

pytestmark = pytest.mark.e2e

ORDER_ARGS = {"orderId": "A100"}


async def test_offline_model_answers_order_status_from_the_service(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    result, handle = await run_agent(client, settings, "Where is my order A100?")

    assert result.status == "completed" and result.stop_reason == "final_answer"
    assert result.rounds == 2
    assert [(c.tool, c.ok, c.code) for c in result.calls] == [("get_order_status", True, None)]
    assert result.final_text is not None and result.final_text.startswith("[offline model]")
    assert "DHL" in result.final_text and "shipped" in result.final_text
    outputs = await tool_outputs(handle)
    assert list(outputs) == [result.calls[0].call_id]
    assert outputs[result.calls[0].call_id]["carrier"] == "DHL"
    requests = await service_requests(admin, "/orders")
    assert [(r["method"], r["path"], r["actor_user"], r["status"]) for r in requests] == [
        ("GET", "/orders/A100", "u1", 200)
    ]


async def test_another_users_order_looks_exactly_like_a_missing_one(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    theirs, theirs_handle = await run_agent(client, settings, "Where is my order A100?", user="u2")
    missing, missing_handle = await run_agent(client, settings, "Where is my order A999?", user="u2")

    [theirs_output] = (await tool_outputs(theirs_handle)).values()
    [missing_output] = (await tool_outputs(missing_handle)).values()
    assert theirs_output["code"] == "NOT_AVAILABLE"
    assert theirs_output == {**missing_output, "message": missing_output["message"].replace("A999", "A100")}
    assert theirs.final_text == (missing.final_text or "").replace("A999", "A100")
    assert "DHL" not in (theirs.final_text or "") and "u1" not in str(theirs_output)
    # The service itself answered both alike, for the session's user.
    requests = await service_requests(admin, "/orders")
    assert [(r["path"], r["actor_user"], r["status"]) for r in requests] == [
        ("/orders/A100", "u2", 404),
        ("/orders/A999", "u2", 404),
    ]


async def test_invalid_calls_get_specific_codes_and_never_reach_the_service(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    turn = [
        call("delete_all_orders", {}, "unknown"),
        call("get_order_status", '{"orderId": "A100"', "truncated"),
        call("get_order_status", "null", "json_null"),
        call("get_order_status", '["A100"]', "json_array"),
        call("get_order_status", "42", "json_number"),
        call("get_order_status", {}, "missing"),
        call("get_order_status", {"orderId": "A100", "userId": "u1"}, "extra_user"),
        call("list_my_orders", {"page": 1, "pageSize": "20"}, "wrong_type"),
        call("list_my_orders", {"page": 1, "pageSize": 101}, "too_big"),
        # Ids are ASCII: Arabic-Indic and fullwidth digits, a Cyrillic look-alike letter.
        call("get_order_status", {"orderId": "A\u0661\u0660\u0660"}, "arabic_digits"),
        call("get_ticket", {"ticketId": "T\uff11\uff10\uff10\uff11"}, "fullwidth_digits"),
        call("get_order_status", {"orderId": "\u0410100"}, "cyrillic_a"),
    ]
    result, handle = await run_agent(
        client,
        settings,
        "break things",
        user="u2",
        model=script_spec(turn, [say("done")]),
        limits=Limits(max_calls_per_round=20),
    )

    assert result.stop_reason == "final_answer" and result.final_text == "done"
    outputs = await tool_outputs(handle)
    codes = {call_id: (out["ok"], out["code"]) for call_id, out in outputs.items()}
    assert codes == {
        "unknown": (False, "UNKNOWN_TOOL"),
        "truncated": (False, "BAD_JSON"),
        "json_null": (False, "BAD_JSON"),
        "json_array": (False, "BAD_JSON"),
        "json_number": (False, "BAD_JSON"),
        "missing": (False, "BAD_ARGUMENTS"),
        "extra_user": (False, "BAD_ARGUMENTS"),
        "wrong_type": (False, "BAD_ARGUMENTS"),
        "too_big": (False, "BAD_ARGUMENTS"),
        "arabic_digits": (False, "BAD_ARGUMENTS"),
        "fullwidth_digits": (False, "BAD_ARGUMENTS"),
        "cyrillic_a": (False, "BAD_ARGUMENTS"),
    }
    assert "orderId" in outputs["missing"]["message"]
    assert "userId" in outputs["extra_user"]["message"]
    assert "pageSize" in outputs["wrong_type"]["message"] and "pageSize" in outputs["too_big"]["message"]
    assert [c.call_id for c in result.calls] == [c["call_id"] for c in turn]
    assert await service_requests(admin) == []


async def test_same_tool_twice_results_paired_by_call_id_when_finishing_out_of_order(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 800})
    turn = [
        call("get_order_status", {"orderId": "A100"}, "slow"),
        call("get_order_status", {"orderId": "A102"}, "fast"),
    ]
    result, handle = await run_agent(client, settings, "two orders", model=script_spec(turn, [say("ok")]))

    requests = {r["path"]: r for r in await service_requests(admin, "/orders")}
    assert requests["/orders/A102"]["ended_at"] < requests["/orders/A100"]["ended_at"]
    outputs = await tool_outputs(handle)
    assert list(outputs) == ["slow", "fast"]  # the model's order, not completion order
    assert outputs["slow"]["order_id"] == "A100" and outputs["fast"]["order_id"] == "A102"
    assert [c.call_id for c in result.calls] == ["slow", "fast"]


async def test_read_only_calls_overlap_in_time_at_the_service(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/(orders|tickets)/", "latency_ms": 1200})
    turn = [
        call("get_order_status", {"orderId": "A100"}, "c1"),
        call("get_order_status", {"orderId": "A102"}, "c2"),
        call("get_ticket", {"ticketId": "T1001"}, "c3"),
    ]
    result, _ = await run_agent(client, settings, "three reads", model=script_spec(turn, [say("ok")]))

    assert [c.ok for c in result.calls] == [True, True, True]
    spans = [(r["started_at"], r["ended_at"]) for r in await service_requests(admin)]
    assert len(spans) == 3
    # All three were in flight at one moment: the latest start precedes the earliest end.
    assert max(start for start, _ in spans) < min(end for _, end in spans)


async def test_parallel_reads_are_bounded(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/", "latency_ms": 800})
    turn = [call("get_order_status", {"orderId": f"A1{i:02d}"}, f"c{i}") for i in range(4)]
    await run_agent(
        client, settings, "four reads", model=script_spec(turn, [say("ok")]), limits=Limits(max_parallel_reads=2)
    )

    spans = [(r["started_at"], r["ended_at"]) for r in await service_requests(admin, "/orders")]
    assert len(spans) == 4
    most_in_flight = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert most_in_flight == 2


async def test_round_limit_stops_a_model_that_never_answers(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    turns = [[call("get_order_status", ORDER_ARGS, f"r{n}")] for n in range(5)]
    result, handle = await run_agent(client, settings, "loop", model=script_spec(*turns), limits=Limits(max_rounds=3))

    assert (result.status, result.stop_reason, result.rounds) == ("stopped", "max_rounds", 3)
    assert [c.call_id for c in result.calls] == ["r0", "r1", "r2"]
    assert result.final_text is None
    assert len(await service_requests(admin, "/orders")) == 3
    assert set(await tool_outputs(handle)) == {"r0", "r1"}  # r2's output is in the result; no 4th turn ran


async def test_per_round_limit_answers_every_call_and_stops(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    turn = [call("get_order_status", ORDER_ARGS, f"c{n}") for n in range(4)]
    result, _ = await run_agent(
        client, settings, "many", model=script_spec(turn, [say("never reached")]), limits=Limits(max_calls_per_round=2)
    )

    assert (result.status, result.stop_reason, result.rounds) == ("stopped", "max_calls_per_round", 1)
    assert [(c.call_id, c.ok, c.code) for c in result.calls] == [
        ("c0", True, None),
        ("c1", True, None),
        ("c2", False, "LIMIT_REACHED"),
        ("c3", False, "LIMIT_REACHED"),
    ]
    assert len(await service_requests(admin, "/orders")) == 2


async def test_total_call_limit_spans_rounds(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    turns = [
        [call("get_order_status", ORDER_ARGS, f"t{n}a"), call("get_order_status", ORDER_ARGS, f"t{n}b")]
        for n in range(3)
    ]
    result, _ = await run_agent(client, settings, "many", model=script_spec(*turns), limits=Limits(max_total_calls=3))

    assert (result.stop_reason, result.rounds) == ("max_total_calls", 2)
    assert [(c.call_id, c.code) for c in result.calls] == [
        ("t0a", None),
        ("t0b", None),
        ("t1a", None),
        ("t1b", "LIMIT_REACHED"),
    ]
    assert len(await service_requests(admin, "/orders")) == 3


async def test_script_running_out_of_turns_is_a_clear_error(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    result, _ = await run_agent(
        client, settings, "x", model=script_spec([call("get_ticket", {"ticketId": "T1001"}, "c1")])
    )

    assert (result.status, result.stop_reason) == ("failed", "model_error")
    assert result.error is not None and "script has 1 turn" in result.error
    assert [(c.call_id, c.ok) for c in result.calls] == [("c1", True)]


async def test_large_tool_output_is_capped_keeping_every_field(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    turn = [call("list_my_orders", {"page": 1, "pageSize": 100}, "big")]
    _, handle = await run_agent(
        client, settings, "x", model=script_spec(turn, [say("ok")]), limits=Limits(max_tool_output_bytes=512)
    )

    output = (await tool_outputs(handle))["big"]
    assert len(json.dumps(output, ensure_ascii=False, separators=(",", ":"))) <= 512
    # The page's own fields survive the cut of its long list: a prefix cut would have lost them.
    assert set(output) == {"ok", "orders", "page", "page_size", "total", "has_more", "_truncated"}
    assert (output["ok"], output["page"], output["total"]) == (True, 1, 25)
    assert output["_truncated"]["original_bytes"] > 512
    assert output["orders"][-1].endswith(" more]") and output["orders"][0]["order_id"]


async def test_read_slower_than_its_timeout_is_retried_and_answered_once(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 3000, "times": 1})
    turn = [call("get_order_status", ORDER_ARGS, "c1")]
    result, handle = await run_agent(
        client, settings, "x", model=script_spec(turn, [say("ok")]), limits=Limits(tool_timeout_seconds=1)
    )

    assert [(c.call_id, c.ok) for c in result.calls] == [("c1", True)]
    assert (await tool_outputs(handle))["c1"]["order_id"] == "A100"
    assert len(await service_requests(admin, "/orders/A100")) == 2


async def test_service_down_for_every_attempt_gives_temporary_unavailable(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "status": 503})
    turn = [call("get_order_status", ORDER_ARGS, "c1")]
    result, handle = await run_agent(
        client, settings, "x", model=script_spec(turn, [say("ok")]), limits=Limits(tool_max_attempts=2)
    )

    assert [(c.call_id, c.code) for c in result.calls] == [("c1", "TEMPORARY_UNAVAILABLE")]
    assert (await tool_outputs(handle))["c1"]["ok"] is False
    assert [r["status"] for r in await service_requests(admin, "/orders/A100")] == [503, 503]


async def test_overall_deadline_stops_the_request(
    client: Client, settings: Settings, worker: Worker, admin: httpx.AsyncClient
) -> None:
    await set_faults(admin, {"method": "GET", "path_regex": "^/orders/A100$", "latency_ms": 5000})
    turns = [[call("get_order_status", ORDER_ARGS, "c1")], [say("never reached")]]
    result, _ = await run_agent(
        client, settings, "x", model=script_spec(*turns), limits=Limits(deadline_seconds=2, tool_timeout_seconds=30)
    )

    assert (result.status, result.stop_reason, result.rounds) == ("stopped", "deadline", 1)
    assert [(c.call_id, c.code) for c in result.calls] == [("c1", "LIMIT_REACHED")]


# A model's arguments as no schema-honouring model writes them: what a broken or hostile one may send.
HOSTILE_ARGUMENTS = {
    "deep_arrays": '{"orderId": ' + "[" * 200_000 + "]" * 200_000 + "}",
    "deep_objects": '{"orderId": "A100", "x": ' + '{"a":' * 5_000 + "1" + "}" * 5_000 + "}",
    "huge_string": json.dumps({"orderId": "A" * 20_000_000}),
    "huge_integer": '{"orderId": ' + "9" * 50_000 + "}",
    "infinite_float": '{"orderId": 1e999999}',
}


class HostileModel:
    """Turn 1 proposes one call per hostile argument text; turn 2 answers."""

    needs_conversation = False

    def label(self, model_name: str | None) -> str:
        return "hostile"

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        if request.turn > 1:
            return [MessageItem.model_validate(say("still here"))]
        return [
            FunctionCallItem(call_id=call_id, name="get_order_status", arguments=text)
            for call_id, text in HOSTILE_ARGUMENTS.items()
        ]


async def test_hostile_arguments_are_answered_to_the_model_and_the_request_goes_on(
    client: Client, settings: Settings, admin: httpx.AsyncClient
) -> None:
    spec = build_demo(settings.service_url)
    spec = dataclasses.replace(spec, models={**spec.models, "hostile": HostileModel()})
    async with running_worker(client, settings, spec):
        result, handle = await run_agent(
            client, settings, "x", model=ModelSpec(provider="hostile"), limits=Limits(max_calls_per_round=10)
        )

    assert (result.status, result.stop_reason, result.final_text) == ("completed", "final_answer", "still here")
    outputs = await tool_outputs(handle)  # every call answered exactly once
    codes = {call_id: out["code"] for call_id, out in outputs.items()}
    assert codes == {
        "deep_arrays": "BAD_ARGUMENTS",
        "deep_objects": "BAD_ARGUMENTS",
        "huge_string": "BAD_ARGUMENTS",
        "huge_integer": "BAD_JSON",
        "infinite_float": "BAD_JSON",
    }
    assert "at most 65536" in outputs["huge_string"]["message"]
    assert "nest more than 32 levels" in outputs["deep_objects"]["message"]
    assert await service_requests(admin) == []
    # History keeps only the first KiB of an oversized call: the run's whole history stays small.
    size = sum([event.ByteSize() async for event in handle.fetch_history_events()])
    assert size < 200_000, size
