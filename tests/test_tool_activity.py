"""Activity tests without a server: the tool activity's error mapping through ActivityEnvironment."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field, field_serializer
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from toolloop._core.codes import ErrorType, ResultCode
from toolloop._core.contracts import Actor, FunctionCallItem, ToolCallInput, WriteInput
from toolloop._core.outputs import output_size
from toolloop._core.registry import (
    Evidence,
    OperationStatus,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
    ToolTemporaryError,
)
from toolloop._core.validation import check_call
from toolloop.activities.tool_calls import ToolActivities
from toolloop.activities.write_operations import WriteActivities


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: str = Field(description="what the fake executor does")


async def fake_executor(ctx: ToolContext, args: Args) -> dict[str, Any]:
    if args.mode == "crash":
        raise RuntimeError("SELECT * FROM secrets WHERE path='/etc/passwd'")
    if args.mode == "missing":
        raise ToolError(ResultCode.NOT_AVAILABLE, "item is not available")
    if args.mode == "busy":
        raise ToolTemporaryError("service busy", retry_after_seconds=2)
    return {"ok": True, "actor": ctx.actor.user_id, "blob": "x" * 5000}


@pytest.fixture
def activities() -> ToolActivities:
    registry = ToolRegistry()
    registry.register(ToolSpec("fake", "A fake tool.", Args, "read_only", fake_executor))
    return ToolActivities(registry, httpx.AsyncClient())


def tool_input(mode: str, tool: str = "fake", max_bytes: int = 100_000) -> ToolCallInput:
    return ToolCallInput(
        round=1,
        call_id="c1",
        tool=tool,
        arguments={"mode": mode},
        actor=Actor(user_id="u1"),
        max_output_bytes=max_bytes,
    )


async def test_crashing_executor_gives_internal_without_details(activities: ToolActivities) -> None:
    result = await ActivityEnvironment().run(activities.run_tool, tool_input("crash"))
    assert result.output == {
        "ok": False,
        "code": "INTERNAL",
        "message": "the tool failed unexpectedly; this is not your fault.",
    }


async def test_definite_tool_error_is_returned_not_raised(activities: ToolActivities) -> None:
    result = await ActivityEnvironment().run(activities.run_tool, tool_input("missing"))
    assert result.output == {"ok": False, "code": "NOT_AVAILABLE", "message": "item is not available"}


async def test_temporary_error_raises_retryable_with_delay(activities: ToolActivities) -> None:
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(activities.run_tool, tool_input("busy"))
    assert caught.value.type == ErrorType.SERVICE_TEMPORARILY_UNAVAILABLE
    assert not caught.value.non_retryable
    assert caught.value.next_retry_delay is not None and caught.value.next_retry_delay.total_seconds() == 2


async def test_actor_comes_from_the_input_and_output_is_capped(activities: ToolActivities) -> None:
    result = await ActivityEnvironment().run(activities.run_tool, tool_input("ok", max_bytes=1024))
    output = result.output
    assert output["actor"] == "u1" and output["_truncated"]["original_bytes"] > 5000
    assert output["blob"].endswith("...[truncated]") and output_size(output) <= 1024


async def test_tool_missing_on_this_worker_is_non_retryable(activities: ToolActivities) -> None:
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(activities.run_tool, tool_input("ok", tool="gone"))
    assert caught.value.type == ErrorType.TOOL_MISCONFIGURED and caught.value.non_retryable


async def test_a_tool_this_worker_knows_as_a_write_is_never_run_as_a_read() -> None:
    # The model turn ran on a worker that knows the tool as a read; this one (a newer deploy, an MCP server whose
    # hints it reads otherwise) knows it as a write. Run here it would act with no operation id and no approval,
    # and be retried as a read. Before, it ran.
    ran: list[str] = []

    async def write(ctx: ToolContext, args: Args) -> dict[str, Any]:
        ran.append(args.mode)
        return {"ok": True}

    registry = ToolRegistry()
    registry.register(
        ToolSpec("fake", "A fake tool.", Args, "side_effecting", write, status=_no_status, read_back=_no_read_back)
    )
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(ToolActivities(registry, httpx.AsyncClient()).run_tool, tool_input("ok"))
    assert caught.value.type == ErrorType.TOOL_MISCONFIGURED and caught.value.non_retryable
    assert ran == []


# --- Checked arguments that do not validate again: the tool's bug, never retried, a write never sent ----


class Drifting(BaseModel):
    """Passes registration, but dumps what it would not accept again (a serializer out of step)."""

    model_config = ConfigDict(extra="forbid")
    code: str = Field(pattern=r"^[a-z]+$", description="x")

    @field_serializer("code")
    def _shout(self, value: str) -> str:
        return value.upper()


async def _no_status(ctx: ToolContext, operation_id: str) -> OperationStatus:
    raise AssertionError("not reached")


async def _no_read_back(ctx: ToolContext, args: Any, output: Any) -> Evidence:
    raise AssertionError("not reached")


def drifting_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(ToolSpec("drift_read", "d", Drifting, "read_only", fake_executor))
    registry.register(
        ToolSpec(
            "drift_write", "d", Drifting, "side_effecting", fake_executor, status=_no_status, read_back=_no_read_back
        )
    )
    return registry


async def test_a_read_whose_checked_arguments_do_not_validate_again_is_not_retried() -> None:
    registry = drifting_registry()
    checked = check_call(registry, FunctionCallItem(call_id="c1", name="drift_read", arguments='{"code": "abc"}'))
    assert checked.arguments == {"code": "ABC"}
    activities = ToolActivities(registry, httpx.AsyncClient())
    inp = ToolCallInput(
        round=1,
        call_id="c1",
        tool="drift_read",
        arguments=checked.arguments,
        actor=Actor(user_id="u1"),
        max_output_bytes=1000,
    )
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(activities.run_tool, inp)
    # The workflow turns TOOL_MISCONFIGURED into INTERNAL for the model, not TEMPORARY_UNAVAILABLE.
    assert caught.value.type == ErrorType.TOOL_MISCONFIGURED and caught.value.non_retryable


async def test_a_write_whose_checked_arguments_do_not_validate_again_is_refused_and_never_sent() -> None:
    registry = drifting_registry()
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json={})

    async with httpx.AsyncClient(transport=httpx.MockTransport(record), base_url="http://svc") as http:
        activities = WriteActivities(registry, http)
        inp = WriteInput(
            operation_id="op_1",
            tool="drift_write",
            arguments={"code": "ABC"},
            actor=Actor(user_id="u1"),
            approval_token="t",
            attempt=1,
            call_id="c1",
        )
        outcome = await ActivityEnvironment().run(activities.execute_write, inp)
    # Refused (not "unknown"): nothing left the worker, so it is reported not done.
    assert outcome.kind == "refused" and outcome.output is not None and outcome.output["code"] == "INTERNAL"
    assert sent == []
