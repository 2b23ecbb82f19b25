"""Pure tests of the public tool API: declaring read and write tools (functions, classes, the HTTP contract),
what a declaration puts on the checked call (per-tool timeout and attempts, redaction, the digest target),
every registration trap refused with its reason, and running one tool without Temporal."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field

import toolloop
from toolloop import Actor, Arguments, ReadBack, ToolContext, Toolset
from toolloop._core.approvals import derive_operation_id, payload_digest
from toolloop._core.arguments import JsonSchemaArguments
from toolloop._core.contracts import FunctionCallItem
from toolloop._core.redaction import internal_text, secret_name
from toolloop._core.validation import check_call
from toolloop._tools.http import request_under_base
from toolloop.testing import run_tool

U1 = Actor(user_id="u1", tenant_id="acme")


class OrderArgs(Arguments):
    order_id: str = Field(alias="orderId", pattern=r"^A[0-9]{3}$", description="Order id.")


class Order(BaseModel):
    order_id: str
    status: str


class NoteArgs(Arguments):
    ticket_id: str = Field(alias="ticketId", pattern=r"^T[0-9]{4}$", description="Ticket id.")
    text: toolloop.PlainText = Field(min_length=1, max_length=50, description="The note.")


class Note(BaseModel):
    note_id: str
    text: str


class RefundArgs(Arguments):
    order_id: str = Field(alias="orderId", pattern=r"^A[0-9]{3}$", description="Order id.")
    amount: toolloop.Amount = Field(description="The amount.")
    parts: list[toolloop.Amount] = Field(description="Its parts.")


class Credentials(Arguments):
    user: str = Field(description="User.")
    password: str = Field(description="Password.")


class LoginArgs(Arguments):
    account: str = Field(pattern=r"^[a-z]+$", description="Account.")
    password: str = Field(description="Password.")
    api_key: str = Field(alias="apiKey", description="Key.")
    pin: str = Field(description="PIN.")
    card_pin: str = Field(alias="cardPin", description="Card PIN.")
    extra: Credentials | None = Field(description="More.")


async def no_status(ctx: ToolContext, operation_id: str) -> toolloop.OperationStatus:
    return toolloop.OperationStatus(state="not_found")


async def no_evidence(ctx: ToolContext, args: Any, output: Any) -> toolloop.Evidence:
    return toolloop.Evidence(verified=False, detail="n/a")


def checked(tools: Toolset, name: str, arguments: dict[str, Any]) -> Any:
    return check_call(tools.registry, FunctionCallItem(call_id="c1", name=name, arguments=json.dumps(arguments)))


# --- Declaring tools ---------------------------------------------------------------------------------------


def test_a_read_function_gets_its_models_description_and_limits_from_the_declaration() -> None:
    tools = Toolset()

    @tools.read(timeout=2.5, attempts=4, redact=("orderId",))
    async def get_order(ctx: ToolContext, args: OrderArgs) -> Order:
        """Status of one of the current user's orders."""
        return Order(order_id=args.order_id, status="shipped")

    spec = tools.registry.get("get_order")
    assert spec is not None and spec.read_only
    assert (spec.arguments, spec.result, spec.description) == (
        OrderArgs,
        Order,
        "Status of one of the current user's orders.",
    )
    call = checked(tools, "get_order", {"orderId": "A100"})
    assert call.rejection is None
    # What the workflow reads from the checked call: this tool's own timeout and attempts, what to redact.
    assert (call.timeout_seconds, call.max_attempts, call.redact) == (2.5, 4, ["orderId"])
    assert call.target is None  # a read binds no digest
    assert tools.registry.definitions()[0]["parameters"]["additionalProperties"] is False


def test_a_tool_class_declares_itself_with_attributes_and_methods() -> None:
    tools = Toolset()

    @tools.write
    class AddNote:
        """Add a note to a ticket."""

        timeout = 3.0
        redact = ("text",)

        async def __call__(self, ctx: ToolContext, args: NoteArgs) -> Note:
            return Note(note_id="N1", text=args.text)

        async def status(self, ctx: ToolContext, operation_id: str) -> toolloop.OperationStatus:
            return toolloop.OperationStatus(state="not_found")

        async def read_back(self, ctx: ToolContext, args: NoteArgs, output: Any) -> toolloop.Evidence:
            return toolloop.Evidence(verified=True, detail="seen")

    spec = tools.registry.get("AddNote")
    assert spec is not None and spec.effect == "side_effecting"
    assert (spec.description, spec.timeout_seconds, spec.redact, spec.result) == (
        "Add a note to a ticket.",
        3.0,
        ("text",),
        Note,
    )
    assert spec.status is not None and spec.read_back is not None
    call = checked(tools, "AddNote", {"ticketId": "T1001", "text": "hi"})
    assert (call.read_only, call.has_status, call.has_read_back) == (False, True, True)


def test_a_write_declared_without_status_or_read_back_says_so_on_its_checked_calls() -> None:
    tools = Toolset()

    @tools.write(status=None, read_back=None)
    async def fire(ctx: ToolContext, args: NoteArgs) -> Note:
        """Fire and forget."""
        return Note(note_id="N1", text=args.text)

    call = checked(tools, "fire", {"ticketId": "T1001", "text": "x"})
    # The workflow never resends such a write after a doubtful attempt, and never calls it verified.
    assert (call.has_status, call.has_read_back) == (False, False)


def test_the_canonical_form_decides_the_payload_that_is_approved() -> None:
    tools = Toolset()

    @tools.write(
        status=no_status, read_back=no_evidence, canonical=lambda a: a.model_copy(update={"text": a.text.lower()})
    )
    async def shout(ctx: ToolContext, args: NoteArgs) -> Note:
        """Write a note."""
        return Note(note_id="N1", text=args.text)

    one = checked(tools, "shout", {"ticketId": "T1001", "text": "HELLO"})
    two = checked(tools, "shout", {"ticketId": "T1001", "text": "hello"})
    assert one.arguments == two.arguments == {"ticketId": "T1001", "text": "hello"}


def test_a_canonical_form_that_does_not_validate_back_is_internal_and_runs_nothing() -> None:
    tools = Toolset()

    @tools.write(
        status=no_status, read_back=no_evidence, canonical=lambda a: a.model_copy(update={"text": a.text + "!"})
    )
    async def grow(ctx: ToolContext, args: NoteArgs) -> Note:
        """Write a note."""
        return Note(note_id="N1", text=args.text)

    call = checked(tools, "grow", {"ticketId": "T1001", "text": "x"})
    assert call.arguments is None and call.rejection is not None
    assert call.rejection["code"] == "INTERNAL"


def test_an_http_write_binds_its_method_and_the_path_the_service_receives() -> None:
    tools = Toolset()
    shop = toolloop.HttpSource("shop", base_url="http://shop.internal/api/v1")
    tools.http_write(
        "add_note",
        source=shop,
        path="/tickets/{ticketId}/notes",
        arguments=NoteArgs,
        result=Note,
        description="Add a note.",
        read_back=ReadBack("/tickets/{ticketId}/notes/{note_id}", Note, lambda a, c, f: {"text": f.text == a.text}),
    )
    call = checked(tools, "add_note", {"ticketId": "T1001", "text": "hi"})
    assert call.target == "POST /api/v1/tickets/T1001/notes"
    assert (call.has_status, call.has_read_back) == (True, True)


def test_a_writes_approval_audience_is_its_sources_by_default_and_a_read_has_none() -> None:
    tools = Toolset()
    common: dict[str, Any] = {"arguments": NoteArgs, "result": Note, "description": "d", "read_back": None}
    tools.http_write("shop_note", source=toolloop.HttpSource("shop", base_url="http://shop"), path="/n", **common)
    named = toolloop.HttpSource("crm", base_url="http://crm", audience="crm.example")
    tools.http_write("crm_note", source=named, path="/n", **common)

    @tools.write(status=None, read_back=None)
    async def local_note(ctx: ToolContext, args: NoteArgs) -> Note:
        """A write without a source."""
        return Note(note_id="N1", text=args.text)

    @tools.read
    async def get_order(ctx: ToolContext, args: OrderArgs) -> Order:
        """A read."""
        return Order(order_id=args.order_id, status="x")

    note = {"ticketId": "T1001", "text": "x"}
    # The token's aud: what the service accepts (its kit's audience=), named once, on the source.
    assert checked(tools, "shop_note", note).audience == "shop"
    assert checked(tools, "crm_note", note).audience == "crm.example"
    assert checked(tools, "local_note", note).audience == "local_note"
    assert checked(tools, "get_order", {"orderId": "A100"}).audience is None


# --- Registration traps --------------------------------------------------------------------------------------


class OpenArgs(BaseModel):
    x: int = Field(description="x")


class MapArgs(Arguments):
    tags: dict[str, str] = Field(description="free-form")


class OptionalArgs(Arguments):
    limit: int = Field(default=5, description="not nullable")


class UnicodeArgs(Arguments):
    code: str = Field(pattern=r"^\d{3}$", description="digits")


class SplitArgs(Arguments):
    model_config = ConfigDict(extra="forbid")
    item: str = Field(validation_alias="itemId", serialization_alias="item_id", description="x")


def _declare_read(arguments: type[BaseModel], description: str = "A tool.") -> None:
    tools = Toolset()

    async def tool(ctx: ToolContext, args: Any) -> Order:
        return Order(order_id="A100", status="x")

    tool.__annotations__["args"] = arguments
    tools.read(tool, description=description)


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (OpenArgs, "extra='forbid'"),
        (MapArgs, "free-form map"),
        (UnicodeArgs, r"uses \d or \w"),
        (SplitArgs, "read as 'itemId' but written as 'item_id'"),
    ],
)
def test_registration_refuses_what_strict_mode_cannot_honour_with_the_reason(
    arguments: type[BaseModel], reason: str
) -> None:
    with pytest.raises(ValueError, match="tool 'tool'") as info:
        _declare_read(arguments)
    assert reason in str(info.value)


def test_registration_refuses_declarations_it_cannot_run() -> None:
    tools = Toolset()

    def not_async(ctx: ToolContext, args: OrderArgs) -> Order:
        return Order(order_id="A100", status="x")

    async def no_model(ctx: ToolContext, args: dict[str, Any]) -> Order:
        return Order(order_id="A100", status="x")

    async def three(ctx: ToolContext, args: OrderArgs, extra: int) -> Order:
        return Order(order_id="A100", status="x")

    async def undocumented(ctx: ToolContext, args: OrderArgs) -> Order:
        return Order(order_id="A100", status="x")

    with pytest.raises(ValueError, match="must be an async function"):
        tools.read(not_async)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="pydantic argument model"):
        tools.read(no_model)
    with pytest.raises(ValueError, match=r"exactly \(ctx, args\)"):
        tools.read(three)
    with pytest.raises(ValueError, match="needs a description"):
        tools.read(undocumented)
    with pytest.raises(ValueError, match="needs status= and read_back="):
        tools.write()(undocumented)
    with pytest.raises(ValueError, match="timeout_seconds must be"):
        tools.read(timeout=0, description="d")(undocumented)
    with pytest.raises(ValueError, match="max_attempts must be"):
        tools.read(attempts=50, description="d")(undocumented)
    tools.read(undocumented, description="Now documented.")
    with pytest.raises(ValueError, match="registered twice"):
        tools.read(undocumented, description="Again.")


def test_the_http_contract_refuses_paths_that_name_no_argument() -> None:
    tools = Toolset()
    shop = toolloop.HttpSource("shop", base_url="http://shop")
    common: dict[str, Any] = {
        "source": shop,
        "arguments": NoteArgs,
        "result": Note,
        "description": "d",
        "read_back": None,
    }
    with pytest.raises(ValueError, match="names ticket_id, which is not an argument"):
        tools.http_write("w1", path="/tickets/{ticket_id}/notes", **common)
    with pytest.raises(ValueError, match="status_path must name exactly"):
        tools.http_write("w2", path="/tickets/{ticketId}/notes", status_path="/ops/{id}", **common)
    rb = ReadBack("/notes/{nope}", Note, lambda a, c, f: {})
    with pytest.raises(ValueError, match="names nope, which is neither an argument nor a field"):
        tools.http_write("w3", path="/tickets/{ticketId}/notes", **{**common, "read_back": rb})
    with pytest.raises(ValueError, match="uses POST, PUT, PATCH or DELETE"):
        tools.http_write("w4", path="/tickets/{ticketId}/notes", method="GET", **common)
    other = toolloop.HttpSource("shop", base_url="http://elsewhere")
    tools.http_write("w5", path="/tickets/{ticketId}/notes", **common)
    with pytest.raises(ValueError, match="two different tool sources are both named 'shop'"):
        tools.http_write("w6", path="/tickets/{ticketId}/notes", **{**common, "source": other})


def test_a_json_schema_tool_is_made_strict_or_refused_with_the_reason() -> None:
    strict = JsonSchemaArguments(
        {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}
    ).parameters()
    assert strict["additionalProperties"] is False and strict["required"] == ["q", "n"]
    assert strict["properties"]["n"]["type"] == ["integer", "null"]  # optional became nullable
    for schema, reason in [
        ({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": True}}}, "free-form map"),
        ({"type": "object", "properties": {"m": {"type": "object"}}}, "without declared properties"),
        ({"type": "object", "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}, "oneOf"),
        ({"type": "object", "properties": {"d": {"type": "string", "pattern": "^\\d+$"}}}, r"\d or \w"),
    ]:
        arguments = JsonSchemaArguments(schema)
        assert any(reason in p for p in arguments.problems(arguments.parameters())), (schema, reason)


def test_a_json_schema_rejection_names_the_field_never_the_value() -> None:
    arguments = JsonSchemaArguments(
        {"type": "object", "properties": {"q": {"type": "string", "maxLength": 5}}, "required": ["q"]}
    )
    for text, hint in [
        ('{"q": "secret-and-long"}', "q: breaks maxLength 5"),
        ('{"q": 7}', "q: must be a string"),
        ("{}", "q: is required"),
        ('{"q": "ok", "zz": "SECRET"}', "has a field that is not accepted"),
    ]:
        with pytest.raises(ValueError) as info:
            arguments.check(text)
        assert hint in str(info.value) and "secret" not in str(info.value).lower()
    assert arguments.without_nulls({"q": "x"}) == {"q": "x"}


# --- Running one tool without Temporal (toolloop.testing.run_tool) ------------------------------------------


async def test_run_tool_checks_like_the_loop_and_returns_what_the_model_reads() -> None:
    tools = Toolset()
    shop = toolloop.HttpSource("shop", base_url="http://shop")
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"order_id": "A100", "status": "shipped", "internal": "dropped"})

    tools.http_read(
        "get_order", source=shop, path="/orders/{orderId}", arguments=OrderArgs, result=Order, description="d"
    )

    @tools.read(source=shop)
    async def wrong(ctx: ToolContext, args: OrderArgs) -> Order:
        """Answers something that is not its declared result."""
        return {"order_id": "A100"}  # type: ignore[return-value]

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://shop") as http:
        out = await run_tool(tools, "get_order", {"orderId": "A100"}, actor=U1, http=http)
        bad = await run_tool(tools, "get_order", {"orderId": "A100", "userId": "u2"}, actor=U1, http=http)
        # The answer is checked against the declared result model, as the activity does.
        undeclared = await run_tool(tools, "wrong", {"orderId": "A100"}, actor=U1, http=http)
    assert out == {"ok": True, "order_id": "A100", "status": "shipped"}
    assert bad["code"] == "BAD_ARGUMENTS" and "userId" in bad["message"]
    assert undeclared["code"] == "INTERNAL"
    [request] = seen  # the rejected call sent nothing
    assert (request.url.path, request.headers["x-actor-user"], request.headers["x-actor-tenant"]) == (
        "/orders/A100",
        "u1",
        "acme",
    )


def order_answer(seen: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    """A service that answers every request with one order, noting each request it got."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"order_id": "A100", "status": "x"})

    return answer


class ProjectNoteArgs(Arguments):
    project: str = Field(max_length=20, description="Project.")
    note: str = Field(max_length=20, description="Note.")


@pytest.mark.parametrize(
    ("project", "note"),
    [("..", "globex"), (".", "x"), ("a", ".."), ("", "x")],
    ids=["dot-dot", "dot", "dot-dot-last", "empty"],
)
async def test_a_path_value_cannot_leave_the_sources_base_path(project: str, note: str) -> None:
    """`..` under the base `.../tenants/me` would have sent GET `.../tenants/globex` (httpx removes dot
    segments): such a value is refused before anything is sent."""
    tools = Toolset()
    shop = toolloop.HttpSource("shop", base_url="http://shop/tenants/me")
    seen: list[httpx.Request] = []
    answer = order_answer(seen)

    tools.http_read(
        "get_note", source=shop, path="/{project}/{note}", arguments=ProjectNoteArgs, result=Order, description="d"
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://shop/tenants/me") as http:
        out = await run_tool(tools, "get_note", {"project": project, "note": note}, actor=U1, http=http)
        fine = await run_tool(tools, "get_note", {"project": "p..q", "note": "a.b"}, actor=U1, http=http)
    assert out["code"] == "BAD_ARGUMENTS"
    assert fine["ok"] is True
    assert [r.url.path for r in seen] == ["/tenants/me/p..q/a.b"]


async def test_a_hand_built_path_that_leaves_the_base_path_is_refused_too() -> None:
    tools = Toolset()
    shop = toolloop.HttpSource("shop", base_url="http://shop/tenants/me")
    seen: list[httpx.Request] = []
    answer = order_answer(seen)

    @tools.read(source=shop)
    async def get_order(ctx: ToolContext, args: OrderArgs) -> Order:
        """A read that builds its own path (here from a constant: the point is what reaches the service)."""
        return await shop.get(ctx, "/../globex/orders/A100", Order, not_available="no such order")

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://shop/tenants/me") as http:
        out = await run_tool(tools, "get_order", {"orderId": "A100"}, actor=U1, http=http)
    assert out["code"] == "BAD_ARGUMENTS" and seen == []


@pytest.mark.parametrize("path", ["/%2e%2e/globex/orders/A100", "/..%2Fglobex", "/a/%2E/b"])
async def test_an_encoded_dot_segment_is_refused_as_well(path: str) -> None:
    seen: list[httpx.Request] = []
    answer = order_answer(seen)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://shop/tenants/me") as http:
        with pytest.raises(toolloop.ToolError) as refused:
            request_under_base(http, "GET", path)
        fine = request_under_base(http, "GET", "orders/A100?x=1")  # relative and with a query: under the base
    assert refused.value.code == "BAD_ARGUMENTS" and seen == []
    assert fine.url.path == "/tenants/me/orders/A100" and fine.url.params["x"] == "1"


def test_an_argument_with_a_default_is_accepted_as_it_is_declared() -> None:
    # `limit: int = 5` needs no `| None`: the model is sent it nullable, and a null takes the default.
    _declare_read(OptionalArgs)


class Count(Arguments):
    word: str = Field(description="what to count")
    limit: int = Field(default=3, description="at most this many")


async def test_tools_declared_from_a_table_need_no_annotations_and_may_answer_plain_values() -> None:
    # A port of another framework's tools: names, descriptions and models from a table, one generic executor.
    tools = Toolset()
    table = [("count_words", "How many times a word occurs.", Count), ("echo_words", "The word, repeated.", Count)]

    def executor_for(name: str) -> Any:
        async def run(ctx, args):  # type: ignore[no-untyped-def]  # the point: no annotations to read
            return len(args.word) if name == "count_words" else [args.word] * args.limit

        return run

    for name, description, model in table:
        tools.read(executor_for(name), name=name, description=description, arguments=model)
    assert sorted(tools.registry.names()) == ["count_words", "echo_words"]
    # A plain value (a number, a list) reaches the model as the output's result; the default applies on null.
    async with httpx.AsyncClient() as http:  # the tools call nothing; run_tool wants a client all the same
        counted = await run_tool(tools, "count_words", {"word": "four", "limit": None}, actor=U1, http=http)
        echoed = await run_tool(tools, "echo_words", {"word": "a", "limit": None}, actor=U1, http=http)
    assert counted == {"ok": True, "result": 4} and echoed == {"ok": True, "result": ["a", "a", "a"]}
    # Without annotations and without arguments=, the declaration says what is missing.
    with pytest.raises(ValueError, match="give arguments="):
        tools.read(executor_for("x"), name="x", description="d")


async def test_an_in_process_write_checks_its_own_approval_token_as_a_service_would() -> None:
    from tests.conftest import APPROVAL_KEY, APPROVAL_VERIFY_KEY, OTHER_SIGNING_KEY
    from tests.user_tools import in_process_ledger
    from toolloop.testing import approval_token

    written: list[str] = []
    tools = in_process_ledger(written, keys=APPROVAL_VERIFY_KEY, audience="ledger")

    def token(key: str = APPROVAL_KEY, audience: str = "ledger", text: str = "hi", op: str = "op_1") -> str:
        return approval_token(
            key, actor=U1, operation_id=op, payload={"text": text}, tool="add_entry", audience=audience
        )

    async def run(approval: str) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            return await run_tool(
                tools, "add_entry", {"text": "hi"}, actor=U1, http=http, operation_id="op_1", approval_token=approval
            )

    # Refused, and nothing written: another key, another audience, another payload, another operation.
    for bad in (token(OTHER_SIGNING_KEY), token(audience="bizservice"), token(text="bye"), token(op="op_2")):
        out = await run(bad)
        assert (out["ok"], out["code"]) == (False, "CONFIRMATION_REQUIRED") and "nothing was done" in out["message"]
    assert written == []
    assert await run(token()) == {"ok": True, "entries": 1} and written == ["hi"]


def test_a_json_schema_tools_whole_numbers_are_one_payload_however_the_model_writes_them() -> None:
    # {"n": 5} and {"n": 5.0} are the same JSON payload: one operation id and one digest, never two operations.
    arguments = JsonSchemaArguments(
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "tags": {"type": "array"}},
            "required": ["n", "x", "tags"],
        }
    )
    plain = arguments.check('{"n": 5, "x": 2, "tags": [1, {"k": 3}]}')
    written = arguments.check('{"n": 5.0, "x": 2.0, "tags": [1.0, {"k": 3.0}]}')
    assert plain == written and json.dumps(written) == '{"n": 5, "x": 2, "tags": [1, {"k": 3}]}'
    assert derive_operation_id("r", "t", plain) == derive_operation_id("r", "t", written)
    assert payload_digest("t", plain) == payload_digest("t", written)
    # A fraction stays as it was written.
    assert arguments.check('{"n": 5, "x": 2.5, "tags": []}')["x"] == 2.5


def test_an_amount_is_one_payload_however_the_model_spells_it() -> None:
    # A bare Decimal keeps its exponent: a refund of 5.10 spelled "5.10" was another operation than 5.1, a second
    # approval that looked the same and, approved, a second refund. toolloop.Amount is one amount by its value.
    tools = Toolset()

    @tools.write(status=no_status, read_back=no_evidence)
    async def refund(ctx: ToolContext, args: RefundArgs) -> Note:
        """Refund."""
        return Note(note_id="N1", text=str(args.amount))

    spellings = ["5.1", "5.10", '"5.1"', '"5.10"', '"5.100"', "51e-1", '"51E-1"']
    calls = [
        check_call(
            tools.registry,
            FunctionCallItem(
                call_id="c1",
                name="refund",
                arguments=f'{{"orderId": "A100", "amount": {a}, "parts": [{a}, "0.00", 100]}}',
            ),
        )
        for a in spellings
    ]
    one = '{"orderId": "A100", "amount": "5.1", "parts": ["5.1", "0", "100"]}'
    assert {json.dumps(c.arguments) for c in calls} == {one}
    assert len({payload_digest("refund", c.arguments) for c in calls}) == 1
    assert checked(tools, "refund", {"orderId": "A100", "amount": "5.11", "parts": []}).arguments["amount"] == "5.11"
    assert checked(tools, "refund", {"orderId": "A100", "amount": "1E+2", "parts": []}).arguments["amount"] == "100"
    # Every digit is kept (the default context would round to 28), and trailing zeros do not count.
    exact = "12345678901234567890.123456789"
    assert checked(tools, "refund", {"orderId": "A100", "amount": exact, "parts": []}).arguments["amount"] == exact
    zeros = checked(tools, "refund", {"orderId": "A100", "amount": "5.1" + "0" * 40, "parts": []})
    assert zeros.arguments["amount"] == "5.1"
    # Nine characters must not become a million digits: an amount has at most 40 either side of the point.
    huge = checked(tools, "refund", {"orderId": "A100", "amount": "1e999999", "parts": []})
    assert huge.arguments is None and huge.rejection is not None and "40 digits" in huge.rejection["message"]


def test_a_json_schema_tools_text_is_one_payload_in_either_unicode_spelling() -> None:
    arguments = JsonSchemaArguments(
        {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array"}}, "required": ["name"]}
    )
    composed = arguments.check(json.dumps({"name": "Caf\u00e9", "tags": ["\u00e9t\u00e9"]}))
    decomposed = arguments.check(json.dumps({"name": "Cafe\u0301", "tags": ["e\u0301te\u0301"]}))
    assert composed == decomposed == {"name": "Caf\u00e9", "tags": ["\u00e9t\u00e9"]}
    assert payload_digest("t", composed) == payload_digest("t", decomposed)
    # The schema checks the text that is sent: NFD input meets an NFC enum and length, in the turn and again in
    # the activity (load), never accepted by one and refused by the other.
    bounded = JsonSchemaArguments(
        {"type": "object", "properties": {"e": {"enum": ["Caf\u00e9"]}, "s": {"type": "string", "maxLength": 4}}}
    )
    checked_nfd = bounded.check(json.dumps({"e": "Cafe\u0301", "s": "Cafe\u0301"}))
    assert checked_nfd == {"e": "Caf\u00e9", "s": "Caf\u00e9"} == bounded.load(checked_nfd)


def test_optional_nulls_are_left_out_in_array_items_and_referenced_objects_as_the_server_expects() -> None:
    # Strict mode makes every optional property nullable, so the model sends them as null; the server's own schema
    # refuses a null it did not declare. Nulls inside array items were kept (the tool could not be used), and
    # behind a $ref every null was dropped, a required nullable one too.
    schema = {
        "type": "object",
        "$defs": {
            "Line": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "note": {"type": "string"},
                    "gift": {"type": ["string", "null"]},
                },
                "required": ["sku", "gift"],
            }
        },
        "properties": {
            "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
            "main": {"$ref": "#/$defs/Line"},
        },
        "required": ["lines"],
    }
    arguments = JsonSchemaArguments(schema)
    sent = {
        "lines": [{"sku": "S1", "note": None, "gift": None}, {"sku": "S2", "note": "x", "gift": "y"}],
        "main": {"sku": "S3", "note": None, "gift": None},
    }
    assert arguments.without_nulls(sent) == {
        "lines": [{"sku": "S1", "gift": None}, {"sku": "S2", "note": "x", "gift": "y"}],
        "main": {"sku": "S3", "gift": None},
    }


def test_a_calls_summary_shows_no_argument_the_tool_redacts_and_no_secret() -> None:
    # The summary is the activity's in the Temporal UI, the progress phase and the live views.
    tools = Toolset()

    @tools.read(redact=("pin",))
    async def check_login(ctx: ToolContext, args: LoginArgs) -> Note:
        """Check a login."""
        return Note(note_id="N1", text="ok")

    sent = {"account": "bob", "password": "hunter2", "apiKey": "sk-ABC", "pin": "1234", "cardPin": "9", "extra": None}
    for name in ("apikey", "accesstoken", "newpassword", "sessionid", "cardnumber", "sshKey", "otp_code", "IBAN"):
        assert secret_name(name), name
    for name in ("shipping", "keyword", "author", "orderId", "monkey"):
        assert not secret_name(name), name
    call = checked(tools, "check_login", {**sent, "extra": {"user": "u", "password": "hunter2"}})
    assert call.summary == "check_login bob"


@pytest.mark.parametrize(
    ("text", "internal"),
    [
        ("Error executing tool list_todos: [Errno 21] Is a directory: '/srv/todos.d'", True),
        ('Traceback (most recent call last):\n  File "app.py", line 3', True),
        ("duplicate key value; SQLSTATE 23505", True),
        ("SELECT id FROM notes WHERE owner = 1", True),
        ("postgresql://notes:S3cret@db:5432/notes", True),
        ("password authentication failed for user notes", True),
        ("GET /x?api_key=sk-live-123 failed", True),
        ("./data/notes.json is missing", True),
        ("C:/notes/x.json is locked", True),
        ("there is no note 7", False),
        ("Select a date from the calendar", False),
        ("cannot delete from a closed ledger", False),
        ("no such user /users/42", False),
        ("title: breaks maxLength 80", False),
        ("FileNotFoundError: /app/data/notes.json", True),
        ("select id, secret from users where id = 1", True),
        ("insert into notes values (1)", True),
        ("next_page_token=abc is invalid", False),
    ],
)
def test_a_services_error_text_that_shows_its_insides_is_withheld_and_a_hint_is_kept(text: str, internal: bool) -> None:
    assert internal_text(text) is internal
