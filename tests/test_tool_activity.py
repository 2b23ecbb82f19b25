"""Activity tests without a server: the tool activity's error mapping through ActivityEnvironment."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.tool_calls import ToolActivities
from agentcore.codes import ErrorType, ResultCode
from agentcore.contracts import Actor, ToolCallInput
from agentcore.registry import ToolContext, ToolError, ToolRegistry, ToolSpec, ToolTemporaryError


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
    assert result.output["truncated"] is True and '"actor":"u1"' in result.output["preview"]


async def test_tool_missing_on_this_worker_is_non_retryable(activities: ToolActivities) -> None:
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(activities.run_tool, tool_input("ok", tool="gone"))
    assert caught.value.type == ErrorType.TOOL_MISCONFIGURED and caught.value.non_retryable
