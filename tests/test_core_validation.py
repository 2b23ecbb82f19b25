"""Pure tests: strict schemas and stage-3 validation with a registry built in the test."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, create_model, model_validator

from toolloop._core.approvals import derive_operation_id, payload_digest
from toolloop._core.contracts import FunctionCallItem
from toolloop._core.registry import (
    Evidence,
    Instant,
    OperationStatus,
    PlainText,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    sorted_unique,
    strict_json_schema,
)
from toolloop._core.validation import argument_text_problem, check_call, check_turn, forbid_not_allowed


class LookupArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    itemId: str = Field(pattern=r"^I[0-9]{2}$", description="item id")
    title: str | None = Field(default=None, max_length=20, description="a property named like a keyword")
    limit: int | None = Field(default=None, ge=1, le=50, description="max rows")


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: PlainText = Field(min_length=1, max_length=50, description="note text")


async def nothing(ctx: ToolContext, args: Any) -> dict[str, Any]:
    return {}


async def no_status(ctx: ToolContext, operation_id: str) -> OperationStatus:
    return OperationStatus(state="not_found")


async def no_evidence(ctx: ToolContext, args: Any, output: Any) -> Evidence:
    return Evidence(verified=False, detail="test")


@pytest.fixture
def registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.register(ToolSpec("lookup", "Look an item up.", LookupArgs, "read_only", nothing))
    reg.register(
        ToolSpec("note", "Write a note.", NoteArgs, "side_effecting", nothing, status=no_status, read_back=no_evidence)
    )
    return reg


def call(name: str, arguments: str, call_id: str = "c1") -> FunctionCallItem:
    return FunctionCallItem(name=name, arguments=arguments, call_id=call_id)


def test_strict_schema_closes_objects_and_keeps_property_named_title() -> None:
    schema = strict_json_schema(LookupArgs)
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["itemId", "title", "limit"]
    assert "title" in schema["properties"]
    assert "title" not in schema and "default" not in schema["properties"]["limit"]


def test_register_refuses_open_models_optional_non_nullable_fields_and_writes_without_status() -> None:
    class Open(BaseModel):
        x: int

    reg = ToolRegistry()
    with pytest.raises(ValueError, match="needs a status query and a read-back"):
        reg.register(ToolSpec("write", "d", NoteArgs, "side_effecting", nothing))
    with pytest.raises(ValueError, match="extra='forbid'"):
        reg.register(ToolSpec("open", "d", Open, "read_only", nothing))


def test_valid_call_is_normalised(registry: ToolRegistry) -> None:
    checked = check_call(registry, call("lookup", '{"itemId": "I01", "title": null, "limit": 5}'))
    assert checked.rejection is None
    assert checked.arguments == {"itemId": "I01", "title": None, "limit": 5}
    assert checked.read_only is True
    assert checked.summary == "lookup I01 5"


@pytest.mark.parametrize(
    ("arguments", "code", "needle"),
    [
        ('{"itemId": "I01"', "BAD_JSON", "not valid JSON"),
        ('{"itemId": "I01",}', "BAD_JSON", "not valid JSON"),
        ("null", "BAD_JSON", "got null"),
        ("[1]", "BAD_JSON", "got array"),
        ("42", "BAD_JSON", "got number"),
        ('{"itemId": NaN}', "BAD_JSON", "NaN"),
        ('{"title": null, "limit": null}', "BAD_ARGUMENTS", "itemId: is required"),
        ('{"itemId": "I01", "title": null, "limit": null, "userId": "u2"}', "BAD_ARGUMENTS", "userId"),
        ('{"itemId": "I01", "title": null, "limit": "5"}', "BAD_ARGUMENTS", "limit"),
        ('{"itemId": "I01", "title": null, "limit": 51}', "BAD_ARGUMENTS", "limit"),
        ('{"itemId": "X", "title": null, "limit": null}', "BAD_ARGUMENTS", "itemId"),
    ],
)
def test_bad_arguments_get_specific_codes(registry: ToolRegistry, arguments: str, code: str, needle: str) -> None:
    checked = check_call(registry, call("lookup", arguments))
    assert checked.arguments is None
    assert checked.rejection is not None
    assert checked.rejection["ok"] is False
    assert checked.rejection["code"] == code
    assert needle in checked.rejection["message"]


def test_hostile_values_are_rejected_without_echo(registry: ToolRegistry) -> None:
    for text in ["a\u200bb", "a\x00b", "x" * 10_000, "\u202eevil"]:
        checked = check_call(registry, call("note", json.dumps({"text": text})))
        assert checked.rejection is not None and checked.rejection["code"] == "BAD_ARGUMENTS"
        assert text not in checked.rejection["message"]


def test_unknown_tool_lists_available_ones(registry: ToolRegistry) -> None:
    checked = check_call(registry, call("delete_everything", "{}"))
    assert checked.rejection == {
        "ok": False,
        "code": "UNKNOWN_TOOL",
        "message": "There is no tool named 'delete_everything'. Available: lookup, note.",
    }
    # A request offered only some tools: the answer names those, never one it was not given.
    narrowed = check_call(registry, call("delete_everything", "{}"), offered=["lookup"])
    assert narrowed.rejection is not None
    assert narrowed.rejection["message"] == "There is no tool named 'delete_everything'. Available: lookup."


def test_a_tool_this_request_may_not_use_is_forbidden_and_never_offered(registry: ToolRegistry) -> None:
    ok = '{"itemId": "I01", "title": null, "limit": null}'
    checked, _ = check_turn(
        registry, [call("lookup", ok, "a"), call("note", '{"text": "x"}', "b"), call("nope", "{}", "c")]
    )
    allowed = forbid_not_allowed(checked, ["lookup"])
    assert allowed[0] == checked[0] and allowed[0].rejection is None
    assert allowed[1].rejection == {
        "ok": False,
        "code": "FORBIDDEN",
        "message": "'note' is not available to this request; it was not run.",
    }
    assert allowed[1].arguments is None
    assert allowed[2] == checked[2] and allowed[2].rejection["code"] == "UNKNOWN_TOOL"  # type: ignore[index]
    assert forbid_not_allowed(checked, None) == checked
    # The model is offered only the allowed tools; without a list, all of them.
    assert [d["name"] for d in registry.definitions(["lookup"])] == ["lookup"]
    assert sorted(d["name"] for d in registry.definitions()) == ["lookup", "note"]


def test_duplicate_call_id_rejects_the_whole_turn_once_per_id(registry: ToolRegistry) -> None:
    ok = '{"itemId": "I01", "title": null, "limit": null}'
    checked, error = check_turn(
        registry, [call("lookup", ok, "same"), call("lookup", ok, "same"), call("lookup", ok, "x")]
    )
    assert error is not None and "same" in error
    assert [c.call_id for c in checked] == ["same", "x"]
    assert all(c.rejection is not None and c.arguments is None for c in checked)


# --- Registration refuses what strict mode or the activity cannot honour (issue 6, item 9) -------------


class AliasedArgs(BaseModel):
    # Aliases without serialize_by_alias: the checked arguments must still come out under the aliases.
    model_config = ConfigDict(extra="forbid")
    item_id: str = Field(alias="itemId", pattern=r"^I[0-9]{2}$", description="item id")


def test_aliased_arguments_are_checked_under_the_names_the_model_sees_and_validate_again() -> None:
    reg = ToolRegistry()
    reg.register(ToolSpec("aliased", "d", AliasedArgs, "read_only", nothing))
    checked = check_call(reg, call("aliased", '{"itemId": "I07"}'))
    assert checked.arguments == {"itemId": "I07"}
    # What the activity does with them: validate again, unchanged.
    assert AliasedArgs.model_validate(checked.arguments).item_id == "I07"


def test_register_refuses_a_field_read_and_written_under_different_names() -> None:
    class Split(BaseModel):
        model_config = ConfigDict(extra="forbid")
        item_id: str = Field(validation_alias="itemId", serialization_alias="item", description="x")

    with pytest.raises(ValueError, match="read as 'itemId' but written as 'item'"):
        ToolRegistry().register(ToolSpec("split", "d", Split, "read_only", nothing))


def test_register_refuses_a_free_form_map_that_strict_mode_would_close() -> None:
    class WithMap(BaseModel):
        model_config = ConfigDict(extra="forbid")
        counts: dict[str, int] = Field(description="x")

    # Made strict, {"additionalProperties": {"type": "integer"}} would accept only {}.
    with pytest.raises(ValueError, match="free-form map"):
        ToolRegistry().register(ToolSpec("map", "d", WithMap, "read_only", nothing))


def test_register_inspects_the_schema_actually_sent_to_the_model() -> None:
    @dataclass(frozen=True)
    class LooseSpec(ToolSpec):
        def definition(self) -> dict[str, Any]:
            sent = super().definition()
            sent["parameters"]["additionalProperties"] = True
            return sent

    with pytest.raises(ValueError, match="additionalProperties is not false"):
        ToolRegistry().register(LooseSpec("loose", "d", LookupArgs, "read_only", nothing))


@pytest.mark.parametrize("pattern", [r"^I\d{2}$", r"^\w+$"])
def test_register_refuses_patterns_that_match_non_ascii_digits_or_letters(pattern: str) -> None:
    class Unicodey(BaseModel):
        model_config = ConfigDict(extra="forbid")
        item: str = Field(pattern=pattern, description="x")

    with pytest.raises(ValueError, match="non-ASCII"):
        ToolRegistry().register(ToolSpec("uni", "d", Unicodey, "read_only", nothing))


@pytest.mark.parametrize("item", ["I\u0660\u0661", "I\uff10\uff11", "\u0406\u0030\u0031", "I01\n", "I0\u200b1"])
def test_identifiers_with_non_ascii_or_confusable_characters_are_bad_arguments(
    registry: ToolRegistry, item: str
) -> None:
    checked = check_call(registry, call("lookup", json.dumps({"itemId": item, "title": None, "limit": None})))
    assert checked.arguments is None and checked.rejection is not None
    assert checked.rejection["code"] == "BAD_ARGUMENTS" and "itemId" in checked.rejection["message"]


# --- Canonical forms: two spellings of one intended call are one payload (item 6) ----------------------


class EventArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: PlainText = Field(description="x")
    start: Instant = Field(description="x")
    guests: Annotated[list[str], AfterValidator(sorted_unique)] = Field(description="x")


def test_equivalent_spellings_give_one_digest_and_one_operation_id() -> None:
    reg = ToolRegistry()
    reg.register(ToolSpec("event", "d", EventArgs, "side_effecting", nothing, status=no_status, read_back=no_evidence))
    spellings = [
        {"title": "Caf\u00e9", "start": "2026-12-03T10:00:00Z", "guests": ["b@x.io", "a@x.io"]},
        {"title": "Cafe\u0301", "start": "2026-12-03T12:00:00+02:00", "guests": ["a@x.io", "b@x.io", "a@x.io"]},
        {"title": "Caf\u00e9", "start": "2026-12-03T05:00:00-05:00", "guests": ["b@x.io", "a@x.io", "b@x.io"]},
    ]
    checked = [check_call(reg, call("event", json.dumps(s))).arguments for s in spellings]
    assert checked[0] == {"title": "Caf\u00e9", "start": "2026-12-03T10:00:00Z", "guests": ["a@x.io", "b@x.io"]}
    assert all(c == checked[0] for c in checked)
    assert {payload_digest("event", c) for c in checked if c is not None} == {payload_digest("event", checked[0])}
    ids = {derive_operation_id("wf-1", "event", c) for c in checked if c is not None}
    assert len(ids) == 1
    # A real difference is still another operation.
    other = check_call(reg, call("event", json.dumps({**spellings[0], "start": "2026-12-03T10:00:01Z"})))
    assert other.arguments is not None and derive_operation_id("wf-1", "event", other.arguments) not in ids


# --- The definition the model is sent, nested models, and the rest of what registration checks -----------


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    street: str = Field(description="x")
    note: str | None = Field(default=None, description="x")


class Shipment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: Address = Field(description="x")
    stops: list[Address] = Field(description="x")
    fallback: Address | None = Field(default=None, description="x")


def test_the_definition_is_a_strict_function_tool_with_every_nested_object_closed() -> None:
    spec = ToolSpec("ship", "Ship it.", Shipment, "read_only", nothing)
    ToolRegistry().register(spec)
    definition = spec.definition()
    assert {k: v for k, v in definition.items() if k != "parameters"} == {
        "type": "function",
        "name": "ship",
        "description": "Ship it.",
        "strict": True,
    }
    params = definition["parameters"]
    address = params["$defs"]["Address"]
    assert (params["additionalProperties"], params["required"]) == (False, ["to", "stops", "fallback"])
    assert (address["additionalProperties"], address["required"]) == (False, ["street", "note"])
    assert "title" not in address and "default" not in address["properties"]["note"]


def test_registration_checks_nested_models_too() -> None:
    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        depth: int = 1  # optional, not nullable

    class Outer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        inner: list[Inner] = Field(description="x")

    with pytest.raises(ValueError, match="depth: optional but not nullable"):
        ToolRegistry().register(ToolSpec("outer", "d", Outer, "read_only", nothing))


@pytest.mark.parametrize(
    ("field", "problem"),
    [
        (Field(validation_alias=AliasChoices("a", "b"), description="x"), "AliasPath and AliasChoices"),
        (Field(exclude=True, description="x"), "excluded from dumps"),
        (Field(serialization_alias="out", description="x"), "read as 'value' but written as 'out'"),
    ],
)
def test_registration_refuses_fields_that_would_not_come_back_from_a_dump(field: Any, problem: str) -> None:
    model = create_model("M", __config__=ConfigDict(extra="forbid"), value=(str, field))
    with pytest.raises(ValueError, match=problem):
        ToolRegistry().register(ToolSpec("m", "d", model, "read_only", nothing))


def test_registration_refuses_aliases_that_would_not_validate_again() -> None:
    class ByNameOnly(BaseModel):
        model_config = ConfigDict(extra="forbid", validate_by_alias=False, validate_by_name=True)
        item_id: str = Field(alias="itemId", description="x")

    with pytest.raises(ValueError, match="validate_by_alias=False"):
        ToolRegistry().register(ToolSpec("m", "d", ByNameOnly, "read_only", nothing))


def test_registration_refuses_bad_names_twice_registered_tools_and_lists_every_problem() -> None:
    reg = ToolRegistry()
    with pytest.raises(ValueError, match="must match"):
        reg.register(ToolSpec("has space", "d", LookupArgs, "read_only", nothing))
    reg.register(ToolSpec("lookup", "d", LookupArgs, "read_only", nothing))
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(ToolSpec("lookup", "d", LookupArgs, "read_only", nothing))
    assert reg.names() == ["lookup"] and [s.name for s in reg] == ["lookup"]
    assert reg.definitions() == [reg.get("lookup").definition()]  # type: ignore[union-attr]
    # A copy: changing what one caller got cannot change what the model is sent next.
    reg.definitions()[0]["parameters"]["required"].clear()
    assert reg.definitions()[0]["parameters"]["required"] == ["itemId", "title", "limit"]

    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int = 1

    class TwoProblems(BaseModel):
        model_config = ConfigDict(extra="forbid")
        inner: Inner = Field(description="x")
        counts: dict[str, int] = Field(description="x")

    with pytest.raises(ValueError) as both:
        reg.register(ToolSpec("two", "d", TwoProblems, "read_only", nothing))
    assert "a: optional but not nullable" in str(both.value) and "free-form map" in str(both.value)


def test_a_turn_of_distinct_calls_is_checked_call_by_call_without_a_protocol_error(registry: ToolRegistry) -> None:
    ok = '{"itemId": "I01", "title": null, "limit": null}'
    checked, error = check_turn(
        registry, [call("lookup", ok, "a"), call("note", '{"text": "hi"}', "b"), call("x", "{}", "c")]
    )
    assert error is None
    assert [(c.call_id, c.read_only, c.rejection is None) for c in checked] == [
        ("a", True, True),
        ("b", False, True),
        ("c", True, False),
    ]
    assert checked[2].rejection is not None and checked[2].rejection["code"] == "UNKNOWN_TOOL"


def test_a_duplicated_call_id_answers_each_id_once_with_the_reason(registry: ToolRegistry) -> None:
    ok = '{"itemId": "I01", "title": null, "limit": null}'
    checked, error = check_turn(registry, [call("lookup", ok, "same"), call("note", '{"text": "x"}', "same")])
    assert (
        error
        == "call_id 'same' appears 2 times in one turn; nothing in this turn ran. Use a distinct call_id per call."
    )
    [only] = checked
    assert only.rejection == {"ok": False, "code": "BAD_ARGUMENTS", "message": error}


def test_a_side_effecting_call_is_marked_and_carries_what_to_redact() -> None:
    reg = ToolRegistry()
    reg.register(
        ToolSpec(
            "note", "d", NoteArgs, "side_effecting", nothing, status=no_status, read_back=no_evidence, redact=("text",)
        )
    )
    checked = check_call(reg, call("note", '{"text": "secret"}'))
    assert (checked.read_only, checked.redact, checked.arguments) == (False, ["text"], {"text": "secret"})
    refused = check_call(reg, call("note", '{"text": ""}'))
    assert (refused.read_only, refused.rejection is not None) == (False, True)


def test_long_names_and_many_errors_are_shortened_in_messages(registry: ToolRegistry) -> None:
    name = "t" * 100
    unknown = check_call(registry, call(name, "{}"))
    assert unknown.rejection is not None and f"'{'t' * 61}...'" in unknown.rejection["message"]
    assert unknown.summary == "t" * 61 + "... (unknown tool)"
    # Seven bad fields: five are named, the rest counted.
    many = create_model(
        "Many", __config__=ConfigDict(extra="forbid"), **{f"f{i}": (int, Field(description="x")) for i in range(7)}
    )
    reg = ToolRegistry()
    reg.register(ToolSpec("many", "d", many, "read_only", nothing))
    checked = check_call(reg, call("many", "{}"))
    assert checked.rejection is not None
    assert checked.rejection["message"] == "; ".join(f"f{i}: is required" for i in range(5)) + "; and 2 more"
    one = check_call(reg, call("many", json.dumps({f"f{i}": 1 for i in range(6)})))
    assert one.rejection is not None and one.rejection["message"] == "f6: is required"
    assert check_call(reg, call("many", '"x"')).rejection["message"] == "arguments must be a JSON object, got string."  # type: ignore[index]


# --- Edges the first mutation run found untested --------------------------------------------------------------


def test_a_write_needs_both_its_status_query_and_its_read_back() -> None:
    for status, read_back in [(no_status, None), (None, no_evidence)]:
        with pytest.raises(ValueError, match="needs a status query and a read-back"):
            ToolRegistry().register(
                ToolSpec("w", "d", NoteArgs, "side_effecting", nothing, status=status, read_back=read_back)
            )


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        (lambda p: p["required"].clear(), "not every property is required"),
        (lambda p: p.update(title="Lookup"), "keyword 'title' is not allowed"),
        (lambda p: p.update(type="array"), "top level is not an object"),
    ],
)
def test_registration_names_each_problem_of_the_schema_it_would_send(tamper: Any, problem: str) -> None:
    @dataclass(frozen=True)
    class Tampered(ToolSpec):
        def definition(self) -> dict[str, Any]:
            sent = super().definition()
            tamper(sent["parameters"])
            return sent

    with pytest.raises(ValueError, match=problem):
        ToolRegistry().register(Tampered("t", "d", LookupArgs, "read_only", nothing))


def test_by_alias_false_alone_is_fine_and_every_bad_field_is_reported() -> None:
    class NoAliases(BaseModel):
        model_config = ConfigDict(extra="forbid", validate_by_alias=False, validate_by_name=True)
        item: str = Field(description="x")

    ToolRegistry().register(ToolSpec("plain", "d", NoAliases, "read_only", nothing))
    two = create_model(
        "Two",
        __config__=ConfigDict(extra="forbid"),
        a=(str, Field(validation_alias=AliasChoices("a", "b"), description="x")),
        c=(str, Field(exclude=True, description="x")),
    )
    with pytest.raises(ValueError) as both:
        ToolRegistry().register(ToolSpec("two", "d", two, "read_only", nothing))
    assert "AliasPath and AliasChoices" in str(both.value) and "c: excluded" in str(both.value)


@pytest.mark.parametrize("text", ["line one\nline \u200btwo", "tab\tthen\x00", "a\n\u202eb"])
def test_forbidden_characters_after_a_newline_or_tab_are_still_found(text: str) -> None:
    checked = check_call_with_note(text)
    assert checked.rejection is not None and checked.rejection["code"] == "BAD_ARGUMENTS"
    assert "disallowed character U+" in checked.rejection["message"]


def check_call_with_note(text: str) -> Any:
    reg = ToolRegistry()
    reg.register(ToolSpec("note", "d", NoteArgs, "side_effecting", nothing, status=no_status, read_back=no_evidence))
    return check_call(reg, call("note", json.dumps({"text": text})))


def test_instants_are_kept_in_utc_whatever_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        reg = ToolRegistry()
        reg.register(
            ToolSpec("event", "d", EventArgs, "side_effecting", nothing, status=no_status, read_back=no_evidence)
        )
        spelled = {"title": "x", "start": "2026-12-03T12:00:00+02:00", "guests": []}
        checked = check_call(reg, call("event", json.dumps(spelled)))
        assert checked.arguments is not None and checked.arguments["start"] == "2026-12-03T10:00:00Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_name_of_exactly_the_limit_is_not_shortened(registry: ToolRegistry) -> None:
    checked = check_call(registry, call("n" * 64, "{}"))
    assert checked.summary == "n" * 64 + " (unknown tool)"


def test_error_counts_at_the_shown_limit_and_model_level_errors() -> None:
    many = create_model(
        "Many", __config__=ConfigDict(extra="forbid"), **{f"f{i}": (int, Field(description="x")) for i in range(7)}
    )
    reg = ToolRegistry()
    reg.register(ToolSpec("many", "d", many, "read_only", nothing))
    five = check_call(reg, call("many", json.dumps({"f5": 1, "f6": 1}))).rejection
    assert five is not None and five["message"] == "; ".join(f"f{i}: is required" for i in range(5))
    six = check_call(reg, call("many", json.dumps({"f6": 1}))).rejection
    assert six is not None and six["message"].endswith("f4: is required; and 1 more")

    class Range(BaseModel):
        model_config = ConfigDict(extra="forbid")
        low: int = Field(description="x")
        high: int = Field(description="x")

        @model_validator(mode="after")
        def _ordered(self) -> Range:
            if self.high < self.low:
                raise ValueError("high must not be below low")
            return self

    reg.register(ToolSpec("range", "d", Range, "read_only", nothing))
    whole = check_call(reg, call("range", '{"low": 2, "high": 1}')).rejection
    assert whole is not None and whole["message"] == "arguments: Value error, high must not be below low"


def test_a_model_turn_result_stores_each_checked_call_whole(registry: ToolRegistry) -> None:
    from toolloop._core.contracts import ModelTurnResult, OtherItem
    from toolloop._temporal.converter import data_converter

    items: list[Any] = [
        OtherItem.model_validate({"type": "reasoning", "id": "r1"}),
        FunctionCallItem(call_id="c1", name="lookup", arguments='{"itemId": "I01", "title": null, "limit": null}'),
        # Arguments the check canonicalises.
        FunctionCallItem(call_id="c2", name="note", arguments='{"text": "Cafe\\u0301"}'),
        FunctionCallItem(call_id="c3", name="nope", arguments="{}"),
        FunctionCallItem(call_id="c4", name="lookup", arguments="not json"),
        # Defaults the check fills in.
        FunctionCallItem(call_id="c5", name="lookup", arguments='{"itemId": "I02"}'),
    ]
    checked, error = check_turn(registry, [i for i in items if isinstance(i, FunctionCallItem)])
    result = ModelTurnResult(items=items, calls=checked, model_label="test", protocol_error=error)
    converter = data_converter().payload_converter
    [payload] = converter.to_payloads([result])
    stored = {c["call_id"]: c for c in json.loads(payload.data)["calls"]}
    # Each call as checked, whole: the workflow and a reader of history need nothing else to know it.
    assert stored["c2"]["name"] == "note" and stored["c2"]["arguments"] == {"text": "Café"}
    assert stored["c5"]["arguments"] == {"itemId": "I02", "title": None, "limit": None}
    assert stored["c3"]["rejection"] and stored["c4"]["rejection"]
    [back] = converter.from_payloads([payload], [ModelTurnResult])
    assert back == result
    # A payload written before calls were shortened (every field there) reads the same.
    full = result.model_dump(mode="json")
    assert ModelTurnResult.model_validate(full) == result


@pytest.mark.parametrize(
    ("arguments", "code", "needle"),
    [
        ('{"itemId": ' + "[" * 200_000 + "]" * 200_000 + "}", "BAD_ARGUMENTS", "at most 65536"),
        ('{"itemId": ' + "[" * 33 + "]" * 33 + "}", "BAD_ARGUMENTS", "nest more than 32 levels"),
        ('{"itemId": "I01", "x": ' + '{"a":' * 40 + "1" + "}" * 40 + "}", "BAD_ARGUMENTS", "nest more than 32"),
        (json.dumps({"itemId": "I" * 70_000}), "BAD_ARGUMENTS", "at most 65536"),
        ('{"itemId": ' + "9" * 5_000 + "}", "BAD_JSON", "not valid JSON"),
        ('{"itemId": "I01", "limit": 1e999}', "BAD_JSON", "too large"),
        ('{"itemId": "I01", "limit": -1e999}', "BAD_JSON", "too large"),
    ],
    ids=["deep", "33-levels", "deep-objects", "huge-string", "huge-integer", "infinity", "minus-infinity"],
)
def test_hostile_arguments_are_refused_before_they_are_parsed(
    registry: ToolRegistry, arguments: str, code: str, needle: str
) -> None:
    checked = check_call(registry, call("lookup", arguments))
    assert checked.rejection is not None and checked.arguments is None
    assert checked.rejection["code"] == code and needle in checked.rejection["message"]


def test_brackets_inside_strings_do_not_count_as_nesting(registry: ToolRegistry) -> None:
    text = json.dumps({"itemId": "I01", "title": "[[[[{{{{" * 2})
    assert argument_text_problem(text) is None
    assert argument_text_problem('{"itemId": "\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') is None
    assert argument_text_problem("[" * 32 + "]" * 32) is None


def test_an_argument_with_a_default_is_sent_nullable_and_a_null_takes_the_default() -> None:
    class Search(BaseModel):
        model_config = ConfigDict(extra="forbid")
        query: str = Field(description="what to look for")
        n: int = Field(default=100, ge=1, description="how many")
        sort: str = "relevance"

    reg = ToolRegistry()
    reg.register(ToolSpec("search", "d", Search, "read_only", nothing))
    [definition] = reg.definitions()
    parameters = definition["parameters"]
    # Strict mode: every property required, the defaulted ones nullable; no default in what the model sees.
    assert parameters["required"] == ["query", "n", "sort"] and parameters["additionalProperties"] is False
    assert {"type": "null"} in parameters["properties"]["n"]["anyOf"] or "null" in parameters["properties"]["n"]["type"]
    assert "default" not in str(parameters)
    checked = check_call(reg, call("search", '{"query": "a", "n": null, "sort": null}'))
    assert checked.rejection is None and checked.arguments == {"query": "a", "n": 100, "sort": "relevance"}
    given = check_call(reg, call("search", '{"query": "a", "n": 5, "sort": "date"}'))
    assert given.arguments == {"query": "a", "n": 5, "sort": "date"}
    # The field's own rules still hold, and a null for an argument without a default is still refused.
    assert check_call(reg, call("search", '{"query": "a", "n": 0, "sort": null}')).rejection is not None
    assert check_call(reg, call("search", '{"query": null, "n": null, "sort": null}')).rejection is not None
