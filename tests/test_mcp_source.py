"""MCP servers as tool sources (toolloop.McpSource): a real MCP server (tests/mcp_notes_server.py, built with the
official SDK's FastMCP) over stdio and streamable HTTP, called through real Temporal workflows with the scripted
model. The oracle is the server's own effects file (one JSON line per start, call and effect), never the
model's text: effects are counted per call, and a call that was not sent leaves no line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import types
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

import starter
from devstack.processes import ManagedProcess, cmdline_matches, free_port, pid_alive, wait_for_port
from tests.agent_helpers import approving, assert_eventually, call, say, script_spec, start_agent, tool_outputs
from tests.conftest import REPO_ROOT
from toolloop import McpSource, Toolset, request_result
from toolloop._core.approvals import payload_digest
from toolloop._core.codes import ResultCode
from toolloop._core.contracts import Actor, AgentResult, Limits
from toolloop._core.names import RUN_TOOL_ACTIVITY
from toolloop._core.registry import (
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
    ToolTemporaryError,
    WriteNotSent,
    WriteOutcomeUnknown,
)
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker
from toolloop._tools.mcp import McpServerUnavailable, tool_output

TRANSPORTS = ["stdio", "http"]
# The parameters every MCP tool is offered with: strict (closed, all required), optional made nullable.
LIST_NOTES_PARAMETERS = {
    "type": "object",
    "properties": {"limit": {"type": ["integer", "null"]}},
    "required": ["limit"],
    "additionalProperties": False,
}


# --- The server under test -------------------------------------------------------------------------------


@dataclass
class NotesServer:
    """One notes server: started by the test (HTTP) or by the source it builds (stdio, a child process of
    the worker); its effects file is the oracle."""

    transport: str
    directory: Path
    options: list[str]
    process: ManagedProcess | None = None
    port: int | None = None
    sources: list[McpSource] = field(default_factory=list)

    @property
    def effects(self) -> Path:
        return self.directory / "effects.jsonl"

    @property
    def down_file(self) -> Path:
        return self.directory / "down"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "tests.mcp_notes_server", "--transport", self.transport]
        argv += ["--effects", str(self.effects), "--down-file", str(self.down_file), *self.options]
        if self.port is not None:
            argv += ["--port", str(self.port)]
        return argv

    def start_http(self) -> None:
        if self.port is None:
            self.port = free_port()
        self.process = ManagedProcess.spawn("mcp-notes", self.argv(), self.directory / "server.log", cwd=REPO_ROOT)
        wait_for_port(self.port, 30, self.process)

    def source(self, **options: Any) -> McpSource:
        if self.transport == "stdio":
            source = McpSource.stdio("notes", self.argv(), cwd=REPO_ROOT, **options)
        else:
            source = McpSource.http("notes", f"http://127.0.0.1:{self.port}/mcp", **options)
        self.sources.append(source)
        return source

    def events(self, event: str, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.effects.exists():
            return []
        lines = [json.loads(line) for line in self.effects.read_text(encoding="utf-8").splitlines()]
        return [e for e in lines if e["event"] == event and (tool is None or e.get("tool") == tool)]

    def server_pids(self) -> list[int]:
        return [e["pid"] for e in self.events("start")]

    def take_down(self) -> None:
        """The server goes away and cannot come back: HTTP, the process is stopped; stdio, the process the
        source started is killed (by its PID, checked against its argv) and a new one refuses to start."""
        if self.transport == "http":
            assert self.process is not None
            self.process.stop()
            return
        self.down_file.touch()
        for pid in self.server_pids():
            if pid_alive(pid) and cmdline_matches(pid, self.argv()):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def notes_server(transport: str, tmp_path: Path) -> AsyncIterator[Callable[..., NotesServer]]:
    """Makes notes servers with the given server options (`--seed TEXT`, `--slow-after-act SECONDS`)."""
    made: list[NotesServer] = []

    def make(*options: str) -> NotesServer:
        directory = tmp_path / f"notes-{len(made)}"
        directory.mkdir()
        server = NotesServer(transport, directory, list(options))
        made.append(server)
        if transport == "http":
            server.start_http()
        return server

    yield make
    for server in made:
        for source in server.sources:
            await source.close()  # whatever a failed test left open (a closed source: nothing to do)
        if server.process is not None:
            server.process.stop()


async def run_requests(
    client: Client,
    settings: Settings,
    source: McpSource,
    turns: list[list[dict[str, Any]]],
    *,
    limits: Limits | None = None,
    before: Callable[[], None] | None = None,
) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
    """One request against a worker that serves the source's tools, every operation approved."""
    toolset = Toolset()
    toolset.include(source)
    async with running_worker(client, settings, toolset):

        async def source_open() -> bool:
            return bool(source.tool_specs())

        await assert_eventually(source_open, within=30, what="the worker opened the MCP source")
        if before is not None:
            before()
        handle = await start_agent(client, settings, "notes", model=script_spec(*turns), limits=limits)
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=120)
    return result, handle


async def run_tool_attempts(handle: WorkflowHandle[Any, Any]) -> dict[int, int]:
    """event id -> the attempt each run_tool call ended on (its started event records its last)."""
    scheduled: set[int] = set()
    attempts: dict[int, int] = {}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == RUN_TOOL_ACTIVITY:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in scheduled:
                attempts[started.scheduled_event_id] = started.attempt
    return attempts


async def reads_scheduled_together(handle: WorkflowHandle[Any, Any]) -> int:
    """How many run_tool activities the run's first wave of reads scheduled in one workflow task: requested
    together, none waiting for another's result."""
    by_task: dict[int, int] = {}
    async for event in handle.fetch_history_events():
        attrs = event.activity_task_scheduled_event_attributes
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and (
            attrs.activity_type.name == RUN_TOOL_ACTIVITY
        ):
            by_task[attrs.workflow_task_completed_event_id] = by_task.get(attrs.workflow_task_completed_event_id, 0) + 1
    return by_task[min(by_task)] if by_task else 0


# --- Listing: strict schemas, effect classes, refusals ----------------------------------------------------


async def test_tools_are_listed_strict_with_configured_effects_and_bad_ones_refused(
    notes_server: Callable[..., NotesServer],
) -> None:
    server = notes_server()
    source = server.source(read_only={"get_note"}, trust_read_only_hint=True, prefix="notes_")
    toolset = Toolset()
    toolset.include(source)
    async with toolset.opened():
        registry = toolset.registry
        assert sorted(registry.names()) == ["notes_add_note", "notes_get_note", "notes_list_notes"]
        definitions = {d["name"]: d for d in registry.definitions()}
        assert all(d["strict"] is True for d in definitions.values())
        assert definitions["notes_list_notes"]["parameters"] == LIST_NOTES_PARAMETERS
        assert definitions["notes_get_note"]["parameters"] == {
            "type": "object",
            "properties": {"note_id": {"type": "integer"}},
            "required": ["note_id"],
            "additionalProperties": False,
        }
        assert definitions["notes_add_note"]["description"] == "Add a note."

        listed, got, added = (registry.get(f"notes_{n}") for n in ("list_notes", "get_note", "add_note"))
        assert listed is not None and listed.read_only  # its readOnlyHint, trusted by configuration
        assert got is not None and got.read_only  # named read-only by configuration
        assert added is not None and not added.read_only
        assert (added.status, added.read_back, added.without_status, added.without_read_back) == (
            None,
            None,
            True,
            True,
        )
        assert added.target is None  # the approval digest binds the tool's name and its arguments
        assert added.approval_audience == "notes"  # its decision tokens' aud: the source's name by default

        assert sorted(source.refused) == ["notes.export", "tag_note"]
        assert "tags: a free-form map" in source.refused["tag_note"]
        assert "the name must match" in source.refused["notes.export"]
    if server.transport == "stdio":
        # Closing the source ended the server process it had started.
        [pid] = server.server_pids()
        assert not pid_alive(pid)


async def test_without_configuration_every_tool_is_a_write(notes_server: Callable[..., NotesServer]) -> None:
    # readOnlyHint is the server's word: not trusted unless the configuration says so.
    source = notes_server().source(audience="notes.example")
    await source.open()
    try:
        specs = {spec.name: spec for spec in source.tool_specs()}
        assert sorted(specs) == ["add_note", "get_note", "list_notes"]
        assert not any(spec.read_only for spec in specs.values())
        # The audience its writes' decision tokens name, as configured (the server checks it, if it checks them).
        assert {spec.approval_audience for spec in specs.values()} == {"notes.example"}
    finally:
        await source.close()


# --- Through the workflow -------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_parallel_reads_are_each_answered_once(
    client: Client, settings: Settings, notes_server: Callable[..., NotesServer]
) -> None:
    server = notes_server("--seed", "Call the customer back")
    source = server.source(read_only={"get_note"}, trust_read_only_hint=True)
    reads = [
        call("list_notes", {"limit": None}, "r1"),
        call("get_note", {"note_id": 1}, "r2"),
        call("get_note", {"note_id": 7}, "r3"),
    ]
    result, handle = await run_requests(client, settings, source, [reads, [say("One note.")]])

    assert (result.status, result.final_text, result.operations) == ("completed", "One note.", [])
    outputs = await tool_outputs(handle)  # every call_id answered exactly once
    note = {"id": 1, "text": "Call the customer back"}
    assert outputs["r1"]["ok"] is True and outputs["r1"]["structured"] == {"result": [note]}
    assert outputs["r2"]["ok"] is True and outputs["r2"]["structured"] == note
    assert json.loads(outputs["r2"]["content"][0]) == note
    # The server's own error (isError): its answer, not a transport failure.
    assert outputs["r3"]["code"] == ResultCode.CONFLICT
    assert outputs["r3"]["message"].startswith("the tool reported an error: ")
    assert "there is no note 7" in outputs["r3"]["message"]
    # Each read reached the server once, and all three were scheduled in one workflow task (that they
    # overlap in time is checked at the demo service's own log: test_read_only_calls_overlap_in_time...).
    assert len(server.events("call", "list_notes")) == 1 and len(server.events("call", "get_note")) == 2
    assert list((await run_tool_attempts(handle)).values()) == [1, 1, 1]
    assert await reads_scheduled_together(handle) == 3


@pytest.mark.e2e
async def test_an_approved_write_makes_one_effect_and_is_completed_not_verified(
    client: Client, settings: Settings, notes_server: Callable[..., NotesServer]
) -> None:
    server = notes_server()
    source = server.source(read_only={"list_notes", "get_note"})
    text = "Replacement shipped."
    turns = [[call("add_note", {"text": text}, "w1")], [say("Noted.")]]
    result, handle = await run_requests(client, settings, source, turns)

    [op] = result.operations
    assert (op.tool, op.state, op.attempts, op.call_ids) == ("add_note", "completed", 1, ["w1"])
    assert op.transitions == ["proposed", "validated", "awaiting_approval", "approved", "sent", "completed"]
    assert op.approval is not None and op.approval.decision == "approved"
    assert op.digest == payload_digest("add_note", {"text": text})
    assert op.note == "this tool has no read-back"
    # Done by the server's word, never verified: the exit code says "unsettled", not "ok".
    assert starter._exit_code(result.status, result.operations) == 3
    output = (await tool_outputs(handle))["w1"]
    assert (output["ok"], output["state"], output["verified"]) == (True, "completed", False)
    assert output["result"]["structured"] == {"id": 1, "text": text}
    [effect] = server.events("effect")
    assert (effect["tool"], effect["text"]) == ("add_note", text)
    assert len(server.events("call", "add_note")) == 1


@pytest.mark.e2e
async def test_a_timeout_after_the_server_acted_is_unknown_and_never_resent(
    client: Client, settings: Settings, notes_server: Callable[..., NotesServer]
) -> None:
    server = notes_server("--slow-after-act", "4")
    source = server.source(read_only={"list_notes", "get_note"}, timeout_seconds=1)
    turns = [[call("add_note", {"text": "slow one"}, "w1")], [say("I could not tell whether it was added.")]]
    result, handle = await run_requests(client, settings, source, turns)

    [op] = result.operations
    assert (op.state, op.attempts) == ("unknown", 1)
    assert op.transitions[-2:] == ["sent", "unknown"]
    assert op.status_checks == []  # nobody to ask: MCP has no status query
    output = (await tool_outputs(handle))["w1"]
    assert output["code"] == ResultCode.OUTCOME_UNKNOWN
    assert starter._exit_code(result.status, result.operations) == 3
    # The server did act, once; the call was not sent again.
    assert len(server.events("effect")) == 1
    assert len(server.events("call", "add_note")) == 1


@pytest.mark.e2e
async def test_an_error_answer_after_the_server_acted_is_unknown_never_not_done_and_shows_no_path(
    client: Client, settings: Settings, notes_server: Callable[..., NotesServer]
) -> None:
    # FastMCP answers isError for an exception the tool raised after its effect. That was reported "not done" on
    # the server's word, with the exception's text (a file path, an OS error) passed to the model.
    server = notes_server("--fail-after-act")
    source = server.source(read_only={"list_notes", "get_note"})
    turns = [[call("add_note", {"text": "saved or not"}, "w1")], [say("I could not tell whether it was added.")]]
    result, handle = await run_requests(client, settings, source, turns)

    [op] = result.operations
    assert (op.state, op.attempts) == ("unknown", 1)
    output = (await tool_outputs(handle))["w1"]
    assert output["code"] == ResultCode.OUTCOME_UNKNOWN
    assert "/var/lib" not in json.dumps(output) and "Errno" not in json.dumps(output)
    assert starter._exit_code(result.status, result.operations) == 3
    # It did act, once, and was not sent again.
    assert len(server.events("effect")) == 1 and len(server.events("call", "add_note")) == 1


@pytest.mark.e2e
async def test_with_the_server_down_reads_are_unavailable_and_a_write_is_not_done(
    client: Client, settings: Settings, notes_server: Callable[..., NotesServer]
) -> None:
    server = notes_server("--seed", "first")
    source = server.source(read_only={"list_notes", "get_note"}, connect_timeout_seconds=5)
    turns = [
        [call("list_notes", {"limit": None}, "r1"), call("get_note", {"note_id": 1}, "r2")],
        [call("add_note", {"text": "not now"}, "w1")],
        [say("The notes service is down.")],
    ]
    started = time.monotonic()
    result, handle = await run_requests(client, settings, source, turns, before=server.take_down)

    assert time.monotonic() - started < 60  # no stuck workflow
    assert result.status == "completed"
    outputs = await tool_outputs(handle)
    assert outputs["r1"]["code"] == outputs["r2"]["code"] == ResultCode.TEMPORARY_UNAVAILABLE
    assert sorted((await run_tool_attempts(handle)).values()) == [3, 3]  # retried up to the budget
    [op] = result.operations
    assert (op.state, op.attempts) == ("failed", 3)
    assert outputs["w1"]["code"] == ResultCode.TEMPORARY_UNAVAILABLE
    assert "it was not done" in outputs["w1"]["message"]
    assert starter._exit_code(result.status, result.operations) == 4
    # Nothing reached a server once it was down: the one start, no call, no effect.
    assert len(server.events("start")) == 1
    assert server.events("call") == [] and server.events("effect") == []


# --- The executors directly (real servers, no workflow) ------------------------------------------------------

CTX = ToolContext(
    actor=Actor(user_id="u1", tenant_id="acme"),
    http=None,  # type: ignore[arg-type]  # MCP executors use their own session
    workflow_id="wf",
    call_id="c1",
    operation_id="op_1",
)


def executors(source: McpSource) -> dict[str, ToolSpec]:
    return {spec.name: spec for spec in source.tool_specs()}


async def test_a_write_in_flight_when_the_stdio_server_dies_is_unknown_and_the_next_call_reconnects(
    tmp_path: Path,
) -> None:
    server = NotesServer("stdio", tmp_path, ["--slow-after-act", "30"])
    source = server.source(read_only={"list_notes"}, timeout_seconds=20)
    await source.open()
    try:
        tools = executors(source)
        write = asyncio.ensure_future(tools["add_note"].execute(CTX, {"text": "in flight"}))

        async def acted() -> bool:
            return len(server.events("effect")) == 1

        await assert_eventually(acted, within=20, what="the server acted")
        [pid] = server.server_pids()
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WriteOutcomeUnknown):
            await asyncio.wait_for(write, timeout=10)
        assert time.monotonic() - started < 5  # found out when the session ended, not at the timeout
        # The next call opens a new session (a new process: a stdio server's state lives in its process).
        assert (await tools["list_notes"].execute(CTX, {"limit": None}))["structured"] == {"result": []}
        assert len(server.server_pids()) == 2
        assert len(server.events("effect")) == 1
    finally:
        await source.close()


async def test_a_write_after_the_http_server_restarted_is_sent_once_on_a_new_session(tmp_path: Path) -> None:
    server = NotesServer("http", tmp_path, [])
    server.start_http()
    source = server.source(read_only={"list_notes"})
    try:
        await source.open()
        assert server.process is not None
        server.process.stop()
        # Down: the old session is found dead before anything is sent.
        with pytest.raises(WriteNotSent):
            await executors(source)["add_note"].execute(CTX, {"text": "while down"})
        server.start_http()  # the same port; the server knows no session any more
        output = await executors(source)["add_note"].execute(CTX, {"text": "after restart"})
        assert output["structured"] == {"id": 1, "text": "after restart"}
        assert [e["text"] for e in server.events("effect")] == ["after restart"]
    finally:
        await source.close()
        if server.process is not None:
            server.process.stop()


async def test_a_closed_source_sends_nothing_and_starts_nothing(tmp_path: Path) -> None:
    server = NotesServer("stdio", tmp_path, [])
    source = server.source(read_only={"list_notes"})
    await source.open()
    tools = executors(source)
    await source.close()
    with pytest.raises(ToolTemporaryError):
        await tools["list_notes"].execute(CTX, {"limit": None})
    with pytest.raises(WriteNotSent):
        await tools["add_note"].execute(CTX, {"text": "after close"})
    assert len(server.server_pids()) == 1 and server.events("call") == []


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_server_that_cannot_be_reached_at_open_is_one_oserror_line(kind: str) -> None:
    if kind == "stdio":
        source = McpSource.stdio("notes", ["/nonexistent/notes-server", "--flag"])
    else:
        source = McpSource.http("notes", f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_seconds=2)
    with pytest.raises(OSError) as caught:
        await source.open()
    assert isinstance(caught.value, McpServerUnavailable)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("MCP server 'notes' (")
    assert "could not be opened" in message
    assert source.tool_specs() == []
    await source.close()


# --- Pure: result conversion and refusals -------------------------------------------------------------------


def test_a_result_passes_on_its_text_and_structured_content_only() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="first"),
            types.ImageContent(type="image", data="aGk=", mimeType="image/png"),
            types.TextContent(type="text", text="second"),
        ],
        structuredContent={"count": 2},
    )
    assert tool_output(result) == {
        "ok": True,
        "content": ["first", "second"],
        "structured": {"count": 2},
        "omitted_blocks": 1,
    }
    assert tool_output(types.CallToolResult(content=[])) == {"ok": True, "content": [], "structured": None}


def test_an_error_result_is_the_servers_answer_capped() -> None:
    long = "no such note;\n" + "x" * 500
    with pytest.raises(ToolError) as caught:
        tool_output(types.CallToolResult(content=[types.TextContent(type="text", text=long)], isError=True))
    assert caught.value.code == ResultCode.CONFLICT
    prefix = "the tool reported an error: "
    assert caught.value.message.startswith(prefix + "no such note; xxx")
    assert len(caught.value.message) == len(prefix) + 200 and caught.value.message.endswith("...")
    with pytest.raises(ToolError, match="no details"):
        tool_output(types.CallToolResult(content=[], isError=True))
    # A server's insides (FastMCP passes an unexpected exception's text on) are not the model's to read.
    leaked = "Error executing tool list_todos: [Errno 21] Is a directory: '/srv/todos.d'"
    with pytest.raises(ToolError) as withheld:
        tool_output(types.CallToolResult(content=[types.TextContent(type="text", text=leaked)], isError=True))
    assert withheld.value.message == "the tool reported an error: its details are not shown"


def tool(name: str, schema: dict[str, Any], description: str | None = "A tool.", **hints: Any) -> types.Tool:
    annotations = types.ToolAnnotations(**hints) if hints else None
    return types.Tool(name=name, description=description, inputSchema=schema, annotations=annotations)


OBJECT = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def test_refused_tools_are_listed_with_reasons_and_the_rest_register() -> None:
    source = McpSource.stdio("s", ["unused"], prefix="s_", read_only={"find"})
    listed = [
        tool("find", OBJECT),
        tool("peek", OBJECT, readOnlyHint=True),  # the hint is not trusted here: a write
        tool("find", OBJECT),
        tool("free", {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": True}}}),
        tool("odd", {"type": "object", "properties": {"q": {"type": "string"}}, "required": 5}),
        tool("quiet", OBJECT, description=None),
        tool("x" * 63, OBJECT),
    ]
    specs, refused = source._specs_for(listed)
    assert [(s.name, s.effect) for s in specs] == [("s_find", "read_only"), ("s_peek", "side_effecting")]
    assert refused["find"] == "the server lists a tool of this name twice"
    assert "free-form map" in refused["free"]
    assert refused["odd"] == "its input schema could not be converted (TypeError)"
    assert "needs a description" in refused["quiet"]
    assert "the name must match" in refused["x" * 63]  # 65 characters with the prefix
    registry = ToolRegistry()
    for spec in specs:
        registry.register(spec)  # never refused: the source refused them first


def test_the_configuration_is_checked_when_the_source_is_built() -> None:
    with pytest.raises(ValueError, match="prefix"):
        McpSource.stdio("s", ["server"], prefix="bad.prefix")
    with pytest.raises(ValueError, match="command"):
        McpSource.stdio("s", "server --stdio")  # type: ignore[arg-type]
    for url in ("ftp://example.com/mcp", "http://127.0.0.1:port/mcp", "/mcp"):
        with pytest.raises(ValueError, match="url"):
            McpSource.http("s", url)
    with pytest.raises(ValueError, match="timeout_seconds"):
        McpSource.http("s", "http://127.0.0.1:1/mcp", timeout_seconds=0)
