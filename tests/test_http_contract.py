"""The library's HTTP write contract (toolloop/_tools/http.py, declared with `Toolset.http_write`) against the
kit service as a real process on loopback, with faults at its boundary, on SQLite and on PostgreSQL: how
every answer is sorted (completed, refused, in progress, not sent, unknown), what the status query and the
read-back say, and one real Temporal workflow through it all. Effects are counted in the service's own
rows (notes per operation id), attempts by the service's own count of the writes it received."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field
from temporalio.client import Client

from devstack.processes import free_port
from tests.agent_helpers import approving, assert_eventually, call, say, script_spec, start_agent, tool_outputs
from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY
from tests.kit_service import (
    AUDIENCE,
    NOTE_REFUSED,
    KitServiceProcess,
    NotesStorage,
    PostgresNotes,
    SqliteNotes,
    note_digest,
    note_token,
    start_kit_service,
)
from tests.pg import PgServer, pg_server  # noqa: F401 - the fixture, for the PostgreSQL storage
from toolloop import (
    Arguments,
    EvidenceNotYetVisible,
    HttpSource,
    ReadBack,
    ResultCode,
    ToolContext,
    ToolError,
    Toolset,
    WriteInProgress,
    WriteNotSent,
    WriteOutcomeUnknown,
    request_result,
)
from toolloop._core.approvals import payload_digest
from toolloop._core.contracts import Actor, Limits
from toolloop._core.registry import ToolSpec
from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import running_worker
from toolloop._tools.http import default_actor_headers

# Against a real service process (and, for the last test, the Temporal dev server).
pytestmark = pytest.mark.e2e

U1 = Actor(user_id="u1", tenant_id="acme")
PROBLEM_CODES = {NOTE_REFUSED: ResultCode.BAD_ARGUMENTS}
RETRY_AFTER = 3


# --- The tool, declared as a user would -----------------------------------------------------------------------


class AddNoteArgs(Arguments):
    text: str = Field(min_length=1, max_length=500, description="The note, plain text.")


class NoteCreated(BaseModel):
    note_id: str
    text: str


class NoteFound(BaseModel):
    note_id: str
    text: str


def note_matches(args: AddNoteArgs, created: NoteCreated, found: NoteFound) -> dict[str, bool]:
    return {"id": found.note_id == created.note_id, "text": found.text == args.text}


def note_tools(base_url: str) -> Toolset:
    source = HttpSource("kit", base_url=base_url, problem_codes=PROBLEM_CODES, timeout_seconds=10, audience=AUDIENCE)
    tools = Toolset()
    tools.http_write(
        "add_note",
        source=source,
        path="/notes",
        arguments=AddNoteArgs,
        result=NoteCreated,
        description="Add a note for the current user. Runs only after a person approves it.",
        read_back=ReadBack("/notes/{note_id}", NoteFound, note_matches),
    )
    return tools


# --- The service ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kit:
    service: KitServiceProcess
    storage: NotesStorage

    @property
    def url(self) -> str:
        return self.service.url

    def notes_of(self, operation_id: str) -> list[tuple[Any, ...]]:
        return self.storage.rows("SELECT note_id, text FROM notes WHERE operation_id = ?", operation_id)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def kit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    """One kit service process per storage for the module (every test uses operation ids of its own)."""
    directory = tmp_path_factory.mktemp(f"kit-{request.param}")
    if request.param == "sqlite":
        storage: NotesStorage = SqliteNotes(directory / "kit.db")
        yield from _serve(storage, directory)
        return
    server: PgServer = request.getfixturevalue("pg_server")
    with server.database() as dsn:
        yield from _serve(PostgresNotes(dsn), directory)


def _serve(storage: NotesStorage, directory: Any) -> Iterator[Kit]:
    service = start_kit_service(storage, directory / "service.log", verify_key=APPROVAL_VERIFY_KEY)
    try:
        yield Kit(service, storage)
    finally:
        service.stop()


@pytest.fixture
async def admin(kit: Kit) -> AsyncIterator[httpx.AsyncClient]:
    """The service's fault switch; no fault is left in force (nor an attempt stalled) after a test."""
    async with httpx.AsyncClient(base_url=kit.url, timeout=10, trust_env=False) as http:
        (await http.put("/admin/fault", json={"kind": "none"})).raise_for_status()
        yield http
        (await http.put("/admin/fault", json={"kind": "none"})).raise_for_status()
        (await http.post("/admin/fault/release")).raise_for_status()


async def set_fault(admin: httpx.AsyncClient, kind: str, **options: Any) -> None:
    (await admin.put("/admin/fault", json={"kind": kind, **options})).raise_for_status()


async def writes_received(admin: httpx.AsyncClient) -> int:
    response = await admin.get("/admin/stats")
    response.raise_for_status()
    return int(response.json()["writes_received"])


@pytest.fixture
async def tools(kit: Kit) -> AsyncIterator[Toolset]:
    toolset = note_tools(kit.url)
    async with toolset.opened():
        yield toolset


def add_note(tools: Toolset) -> ToolSpec:
    spec = tools.registry.get("add_note")
    assert spec is not None
    return spec


def new_op() -> str:
    return f"op-{uuid.uuid4().hex[:12]}"


def context(tools: Toolset, operation_id: str | None, token: str | None, actor: Actor = U1) -> ToolContext:
    """What the tool activity hands the executor: the source's client, the actor's headers, the key, the token."""
    spec = add_note(tools)
    assert isinstance(spec.source, HttpSource)
    return ToolContext(
        actor=actor,
        http=spec.source.http,
        workflow_id="wf-contract",
        call_id="c1",
        operation_id=operation_id,
        approval_token=token,
        headers=default_actor_headers(actor),
    )


def approved(tools: Toolset, operation_id: str, args: AddNoteArgs, **token_options: Any) -> ToolContext:
    return context(tools, operation_id, note_token(APPROVAL_KEY, operation_id, args.model_dump(), **token_options))


async def write(spec: ToolSpec, ctx: ToolContext, args: AddNoteArgs) -> dict[str, Any]:
    """Run the executor and take its answer as the tool activity does."""
    return spec.output_of(await spec.execute(ctx, args))


# --- The executor's sorting of each answer --------------------------------------------------------------------


async def test_the_digest_the_library_approves_is_the_one_the_service_checks(kit: Kit, tools: Toolset) -> None:
    spec = add_note(tools)
    args = AddNoteArgs(text="same digest")
    assert spec.target is not None and spec.target(args) == "POST /notes"
    assert payload_digest(spec.target(args), spec.schema.dump(args)) == note_digest({"text": "same digest"})


async def test_a_completed_write_and_its_replay_give_one_output_and_one_effect(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="plain write")
    first = await write(spec, approved(tools, op, args), args)
    again = await write(spec, approved(tools, op, args), args)

    [(note_id, text)] = kit.notes_of(op)
    assert first == again == {"ok": True, "note_id": note_id, "text": "plain write"}
    assert text == "plain write"


async def test_a_reply_dropped_after_commit_is_unknown_and_the_status_gives_the_stored_output(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="reply dropped")
    await set_fault(admin, "drop_after_commit")
    with pytest.raises(WriteOutcomeUnknown):
        await write(spec, approved(tools, op, args), args)

    assert spec.status is not None
    status = await spec.status(context(tools, None, None), op)
    [(note_id, _)] = kit.notes_of(op)
    assert status.state == "completed" and status.retention_seconds == 86_400.0
    assert status.output == {"ok": True, "note_id": note_id, "text": "reply dropped"}
    assert await writes_received(admin) >= 1 and len(kit.notes_of(op)) == 1


async def test_a_503_before_commit_is_unknown_the_status_not_found_and_a_resend_makes_one_effect(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="503 first")
    await set_fault(admin, "503_before_commit")
    with pytest.raises(WriteOutcomeUnknown) as unknown:
        await write(spec, approved(tools, op, args), args)
    assert unknown.value.retry_after_seconds is None

    assert spec.status is not None
    status = await spec.status(context(tools, None, None), op)
    assert (status.state, status.output) == ("not_found", None)
    assert kit.notes_of(op) == []
    # Not found: the same key may go again, and makes the one effect.
    resent = await write(spec, approved(tools, op, args), args)
    [(note_id, _)] = kit.notes_of(op)
    assert resent == {"ok": True, "note_id": note_id, "text": "503 first"}


async def test_a_write_while_another_attempt_holds_the_key_is_in_progress(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="in flight")
    await set_fault(admin, "stall_after_claim")
    stalled = asyncio.create_task(write(spec, approved(tools, op, args), args))
    try:

        async def claimed() -> bool:
            held = kit.storage.rows("SELECT 1 FROM idempotency_claims WHERE operation_id = ?", op)
            return len(held) == 1

        await assert_eventually(claimed, within=10, what="the first attempt claimed the key and stalled")
        with pytest.raises(WriteInProgress):
            await write(spec, approved(tools, op, args), args)
        assert spec.status is not None
        assert (await spec.status(context(tools, None, None), op)).state == "in_progress"
        assert kit.notes_of(op) == []
    finally:
        (await admin.post("/admin/fault/release")).raise_for_status()
    first = await stalled

    [(note_id, _)] = kit.notes_of(op)
    assert first == {"ok": True, "note_id": note_id, "text": "in flight"}


async def test_a_429_after_commit_is_unknown_with_its_retry_after_and_never_not_sent(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="busy after commit")
    await set_fault(admin, "429_after_commit", retry_after_seconds=RETRY_AFTER)
    with pytest.raises(WriteOutcomeUnknown) as unknown:
        await write(spec, approved(tools, op, args), args)
    assert not isinstance(unknown.value, WriteNotSent)
    assert unknown.value.retry_after_seconds == float(RETRY_AFTER)

    assert spec.status is not None
    status = await spec.status(context(tools, None, None), op)
    [(note_id, _)] = kit.notes_of(op)
    assert status.state == "completed"
    assert status.output == {"ok": True, "note_id": note_id, "text": "busy after commit"}


async def test_a_refused_connection_is_not_sent() -> None:
    # A loopback port nothing listens on: the connection never opens, so nothing can have happened.
    toolset = note_tools(f"http://127.0.0.1:{free_port()}")
    async with toolset.opened():
        spec, op, args = add_note(toolset), new_op(), AddNoteArgs(text="never sent")
        with pytest.raises(WriteNotSent):
            await write(spec, approved(toolset, op, args), args)


REFUSALS = {
    "business_refusal": ResultCode.BAD_ARGUMENTS,  # NOTE_REFUSED, mapped by the source's problem codes
    "no_approval": ResultCode.CONFIRMATION_REQUIRED,
    "forged_approval": ResultCode.CONFIRMATION_REQUIRED,
    "key_reused": ResultCode.IDEMPOTENCY_CONFLICT,
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_definite_refusal_is_a_tool_error_with_its_code_after_one_attempt(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient, refusal: str
) -> None:
    spec, op = add_note(tools), new_op()
    args = AddNoteArgs(text="REFUSE this one" if refusal == "business_refusal" else "refused for its approval")
    ctx = approved(tools, op, args)
    if refusal == "no_approval":
        ctx = context(tools, op, None)
    elif refusal == "forged_approval":
        ctx = context(tools, op, note_token(OTHER_SIGNING_KEY, op, args.model_dump()))
    elif refusal == "key_reused":
        earlier = AddNoteArgs(text="the key's first payload")
        await write(spec, approved(tools, op, earlier), earlier)
    before = await writes_received(admin)
    notes_before = kit.notes_of(op)

    with pytest.raises(ToolError) as refused:
        await write(spec, ctx, args)

    assert refused.value.code == REFUSALS[refusal]
    assert await writes_received(admin) == before + 1  # one attempt: a refusal is never resent
    assert kit.notes_of(op) == notes_before  # and it changed nothing
    if refusal == "business_refusal":
        # Stored under the key like a success: the status gives the same refusal.
        assert spec.status is not None
        status = await spec.status(context(tools, None, None), op)
        assert status.state == "completed" and status.output is not None
        assert (status.output["ok"], status.output["code"]) == (False, ResultCode.BAD_ARGUMENTS)


# --- The read-back ---------------------------------------------------------------------------------------------


async def test_the_read_back_verifies_what_was_approved(kit: Kit, tools: Toolset, admin: httpx.AsyncClient) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="read me back")
    output = await write(spec, approved(tools, op, args), args)
    assert spec.read_back is not None
    evidence = await spec.read_back(context(tools, None, None), args, output)

    assert evidence.verified is True and evidence.checks == {"id": True, "text": True}
    # Where the effect was seen, the created id named once (the path read holds it).
    assert evidence.detail == f"GET /notes/{output['note_id']} matches the approved operation"


async def test_the_read_back_of_a_note_changed_since_differs(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="as approved")
    output = await write(spec, approved(tools, op, args), args)
    # Someone else changed the note in the service's own table after the write.
    kit.storage.execute("UPDATE notes SET text = ? WHERE operation_id = ?", "changed since", op)
    assert spec.read_back is not None
    evidence = await spec.read_back(context(tools, None, None), args, output)

    assert evidence.verified is False and evidence.checks == {"id": True, "text": False}
    assert "differs" in evidence.detail and "text" in evidence.detail


async def test_the_read_back_of_a_note_not_visible_yet_says_so_and_is_never_a_rewrite(
    kit: Kit, tools: Toolset, admin: httpx.AsyncClient
) -> None:
    spec, op, args = add_note(tools), new_op(), AddNoteArgs(text="lagging replica")
    output = await write(spec, approved(tools, op, args), args)
    await set_fault(admin, "hide_reads")
    before = await writes_received(admin)
    assert spec.read_back is not None
    with pytest.raises(EvidenceNotYetVisible):
        await spec.read_back(context(tools, None, None), args, output)

    assert await writes_received(admin) == before and len(kit.notes_of(op)) == 1
    # Once the read sees it, the same read-back verifies.
    evidence = await spec.read_back(context(tools, None, None), args, output)
    assert evidence.verified is True


# --- One real workflow ------------------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_a_workflow_resolves_a_reply_dropped_after_commit_by_status_and_verifies_it(
    kit: Kit, admin: httpx.AsyncClient, client: Client, settings: Settings
) -> None:
    await set_fault(admin, "drop_after_commit")
    turns = [[call("add_note", {"text": "through the workflow"}, "w1")], [say("Noted.")]]
    async with running_worker(client, settings, note_tools(kit.url)):
        handle = await start_agent(
            client,
            settings,
            "add a note",
            model=script_spec(*turns),
            limits=Limits(write_timeout_seconds=3, unknown_resolution_seconds=10),
        )
        async with approving(handle):
            result = await asyncio.wait_for(request_result(handle), timeout=60)
        outputs = await tool_outputs(handle)

    [op] = result.operations
    assert (op.state, op.attempts) == ("verified", 1)
    assert "unknown" in op.transitions and op.transitions[-2:] == ["completed", "verified"]
    assert [c.state for c in op.status_checks] == ["completed"]
    [(note_id, text)] = kit.notes_of(op.operation_id)
    assert text == "through the workflow"
    assert outputs["w1"] == {
        "ok": True,
        "operation_id": op.operation_id,
        "state": "verified",
        "result": {"ok": True, "note_id": note_id, "text": "through the workflow"},
    }
    assert await writes_received(admin) >= 1
