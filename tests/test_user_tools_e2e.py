"""End to end: a user's own tools and models on a real worker - `python worker.py --tools module:build` runs a
user's registry (and refuses a bad one in one line), a tool's own timeout and attempts bound its calls, a model
adapter of the user's gets the request's instructions or the worker's, and the plugin configures workers from
the client."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

import toolloop
from devstack.processes import start_worker
from tests.agent_helpers import run_agent, script_spec, tool_outputs, worker_env
from tests.conftest import APPROVAL_VERIFY_KEY, REPO_ROOT, TemporalServer
from toolloop import Actor, ModelRequest, ToolContext, Toolset, request_result
from toolloop._temporal.settings import Settings
from toolloop.testing import call, say, start_request
from toolloop.testing import worker as toolloop_worker

pytestmark = pytest.mark.e2e


def worker_command(tools: str | None) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "worker.py"), *(["--tools", tools] if tools is not None else [])]


async def test_worker_runs_a_users_registry_given_by_tools(client: Client, settings: Settings, tmp_path: Path) -> None:
    proc = await asyncio.to_thread(
        start_worker, REPO_ROOT, worker_env(settings), tmp_path / "worker.log", tools="tests.user_tools:build"
    )
    try:
        result, handle = await run_agent(
            client,
            settings,
            "add two numbers",
            model=script_spec(
                [call("add", {"a": 2, "b": 3}, "c1"), call("append_ticket_note", {"ticketId": "T1001"}, "c2")],
                [say("5")],
            ),
        )
    finally:
        proc.stop()
    outputs = await tool_outputs(handle)
    assert outputs["c1"] == {"ok": True, "total": 5}
    # Only the user's tools are there: the demo's are unknown to this worker.
    assert outputs["c2"]["code"] == "UNKNOWN_TOOL" and "Available: add." in outputs["c2"]["message"]
    assert (result.status, result.final_text) == ("completed", "5")
    assert "tools=tests.user_tools:build (1 tools)" in (tmp_path / "worker.log").read_text()


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (None, "--tools is required"),
        ("no_such_module:build", "cannot import no_such_module"),
        ("tests.user_tools:nothing", "has no function nothing"),
        ("tests.user_tools:not_a_toolset", "returned int, not a Toolset or AgentSpec"),
        ("tests.user_tools:refused", "free-form map"),
        ("just-words", "expected package.module:function"),
        ("tests.user_tools:needs_a_setting", "needs_a_setting() failed: KeyError: 'TOOLLOOP_TEST_SETTING_NEVER_SET'"),
    ],
)
def test_a_bad_tools_option_is_one_line_and_exit_2(tools: str | None, message: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "TEMPORAL_ADDRESS": "127.0.0.1:9"}  # nothing is ever reached
    done = subprocess.run(worker_command(tools), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_malformed_verify_key_is_one_line_and_exit_2_before_anything_starts() -> None:
    env = {"PATH": "/usr/bin:/bin", "TEMPORAL_ADDRESS": "127.0.0.1:9", "TOOLLOOP_APPROVAL_VERIFY_KEY": "not-a-key"}
    command = worker_command("tests.user_tools:build")
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: TOOLLOOP_APPROVAL_VERIFY_KEY: ") and "not-a-key" not in line


def test_a_worker_whose_tools_cannot_open_or_whose_temporal_is_down_says_so_in_one_line(
    temporal_server: TemporalServer,
) -> None:
    cases = [
        (
            "tests.user_tools:unopenable",
            temporal_server.address,
            "a tool source could not be opened: MCP server 'gone'",
        ),
        ("tests.user_tools:build", "127.0.0.1:9", "cannot reach Temporal at 127.0.0.1:9"),
    ]
    for tools, address, message in cases:
        env = {"PATH": "/usr/bin:/bin", "TEMPORAL_ADDRESS": address}
        done = subprocess.run(worker_command(tools), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and message in errors[0], done.stderr
        assert "Traceback" not in done.stderr


class Wait(toolloop.Arguments):
    seconds: float = Field(ge=0, le=10, description="How long.")


class Waited(BaseModel):
    waited: float


async def test_a_tools_own_timeout_and_attempts_bound_its_calls(client: Client, settings: Settings) -> None:
    tools = Toolset()
    started: list[float] = []

    @tools.read(timeout=1.0, attempts=2)
    async def slow(ctx: ToolContext, args: Wait) -> Waited:
        """Wait."""
        started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(args.seconds)
        return Waited(waited=args.seconds)

    async with toolloop_worker(client, tools, task_queue=settings.task_queue, approval_verify_key=APPROVAL_VERIFY_KEY):
        # The request's own limits would allow 3 attempts of 10 s each; the tool says 2 of 1 s.
        result, handle = await run_agent(
            client, settings, "wait", model=script_spec([call("slow", {"seconds": 5}, "c1")], [say("gave up")])
        )
    outputs = await tool_outputs(handle)
    assert outputs["c1"]["code"] == "TEMPORARY_UNAVAILABLE"
    assert len(started) == 2
    assert result.status == "completed"


class RecordingModel:
    """A user's model adapter: answers from what it is given, and remembers what that was."""

    needs_conversation = True

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def label(self, model_name: str | None) -> str:
        return f"recording:{model_name or 'default'}"

    async def respond(self, request: ModelRequest) -> list[toolloop.ConversationItem]:
        self.requests.append(request)
        if request.turn == 1:
            return [toolloop.FunctionCallItem(call_id="c1", name="add", arguments='{"a": 1, "b": 1}')]
        seen = [i for i in request.conversation if isinstance(i, toolloop.FunctionCallOutputItem)]
        return [toolloop.MessageItem(content=[{"type": "output_text", "text": f"saw {seen[-1].output}"}])]


async def test_a_users_model_adapter_gets_the_requests_instructions_or_the_workers(
    client: Client, settings: Settings
) -> None:
    from tests.user_tools import build

    model = RecordingModel()
    spec = toolloop.AgentSpec(tools=build(), models={"recording": model}, instructions="Be brief.")
    actor = Actor(user_id="u1", tenant_id="acme")
    async with toolloop_worker(client, spec, task_queue=settings.task_queue, approval_verify_key=APPROVAL_VERIFY_KEY):
        own = await start_request(
            client,
            "add",
            actor=actor,
            task_queue=settings.task_queue,
            model=toolloop.ModelSpec(provider="recording", name="m1"),
            instructions="Answer in French.",
        )
        default = await start_request(
            client, "add", actor=actor, task_queue=settings.task_queue, model=toolloop.ModelSpec(provider="recording")
        )
        first, second = await request_result(own), await request_result(default)
    assert (first.final_text, first.model_label) == ('saw {"ok":true,"total":2}', "recording:m1")
    assert second.model_label == "recording:default"
    by_run: dict[str, list[ModelRequest]] = {}
    for request in model.requests:
        by_run.setdefault(request.instructions, []).append(request)
    # Turn 2 still has the request's own instructions (they travel once, with turn 1).
    assert [r.turn for r in by_run["Answer in French."]] == [1, 2]
    assert [r.turn for r in by_run["Be brief."]] == [1, 2]
    assert [t["name"] for t in model.requests[0].tools] == ["add"]
    assert model.requests[0].actor == actor


async def test_a_request_for_a_model_the_worker_lacks_fails_and_names_it(client: Client, settings: Settings) -> None:
    from tests.user_tools import build

    async with toolloop_worker(
        client, build(), task_queue=settings.task_queue, approval_verify_key=APPROVAL_VERIFY_KEY
    ):
        handle = await start_request(
            client,
            "add",
            actor=Actor(user_id="u1"),
            task_queue=settings.task_queue,
            model=toolloop.ModelSpec(provider="nonexistent"),
        )
        result = await request_result(handle)
    assert (result.status, result.stop_reason) == ("failed", "model_error")
    assert result.error is not None and "no model 'nonexistent'" in result.error and "script" in result.error


async def test_the_plugin_on_the_client_configures_its_workers(temporal_server: TemporalServer) -> None:
    from tests.user_tools import build

    # A test's plugin: its request is scripted.
    plugin = toolloop.ToolloopPlugin(build(), allow_scripted_models=True)
    client = await Client.connect(temporal_server.address, plugins=[plugin])
    task_queue = f"test-{uuid.uuid4().hex[:10]}"
    async with Worker(client, task_queue=task_queue):
        handle = await start_request(
            client,
            "add",
            actor=Actor(user_id="u1"),
            task_queue=task_queue,
            model=script_spec([call("add", {"a": 40, "b": 2}, "c1")], [say("42")]),
        )
        result: Any = await request_result(handle)
    assert (result.status, result.calls[0].ok) == ("completed", True)
    # Replay-testing your own tools' histories: the plugin brings AgentWorkflow to the Replayer too (naming it
    # again in `workflows` would register it twice).
    replayed = await Replayer(workflows=[], plugins=[plugin]).replay_workflow(await handle.fetch_history())
    assert replayed.replay_failure is None
    # A client without toolloop's converter cannot serve the workflow: said at once, in words.
    bare = await Client.connect(temporal_server.address)
    with pytest.raises(ValueError, match=r"plugins=\[ToolloopPlugin"):
        Worker(bare, task_queue=task_queue, plugins=[plugin])


async def test_a_worker_run_with_the_plugin_whose_source_cannot_open_stops_and_says_why(
    client: Client, settings: Settings
) -> None:
    from tests.user_tools import unopenable

    # The plugin opens the sources inside the worker's run: it must not leave the worker waiting forever.
    with pytest.raises(OSError, match="MCP server 'gone'"):
        async with (
            asyncio.timeout(60),
            toolloop_worker(
                client, unopenable(), task_queue=settings.task_queue, approval_verify_key=APPROVAL_VERIFY_KEY
            ),
        ):
            await asyncio.sleep(30)  # never reached: the worker fails as it starts


def test_tools_in_the_folder_the_worker_runs_from_are_importable(tmp_path: Path) -> None:
    """`python worker.py --tools mypkg.tools:build` from the folder that holds mypkg/ finds it."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text("import toolloop\n\ndef build():\n    return 42\n")
    env = {"PATH": "/usr/bin:/bin", "TEMPORAL_ADDRESS": "127.0.0.1:9"}
    done = subprocess.run(
        worker_command("mypkg.tools:build"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    # Imported and called: what it built is refused, not the import.
    assert done.returncode == 2 and "build() returned int, not a Toolset or AgentSpec" in done.stderr, done.stderr
