"""Pure tests: strict schemas and stage-3 validation with a registry built in the test."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from agentcore.contracts import FunctionCallItem
from agentcore.registry import (
    Evidence,
    OperationStatus,
    PlainText,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    strict_json_schema,
)
from agentcore.validation import check_call, check_turn


class LookupArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    itemId: str = Field(pattern=r"^I\d{2}$", description="item id")
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

    class OptionalNotNullable(BaseModel):
        model_config = ConfigDict(extra="forbid")
        x: int = 3

    reg = ToolRegistry()
    with pytest.raises(ValueError, match="needs a status query and a read-back"):
        reg.register(ToolSpec("write", "d", NoteArgs, "side_effecting", nothing))
    with pytest.raises(ValueError, match="extra='forbid'"):
        reg.register(ToolSpec("open", "d", Open, "read_only", nothing))
    with pytest.raises(ValueError, match="optional but not nullable"):
        reg.register(ToolSpec("opt", "d", OptionalNotNullable, "read_only", nothing))


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


def test_duplicate_call_id_rejects_the_whole_turn_once_per_id(registry: ToolRegistry) -> None:
    ok = '{"itemId": "I01", "title": null, "limit": null}'
    checked, error = check_turn(
        registry, [call("lookup", ok, "same"), call("lookup", ok, "same"), call("lookup", ok, "x")]
    )
    assert error is not None and "same" in error
    assert [c.call_id for c in checked] == ["same", "x"]
    assert all(c.rejection is not None and c.arguments is None for c in checked)
