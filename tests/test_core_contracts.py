"""The payload contracts as Temporal stores them: plain JSON with every field written (Temporal's pydantic
data converter, as its authors document it), decoding back to the same value; and the one rule that says
what a finished request came to."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from toolloop._core import contracts
from toolloop._core.contracts import (
    Actor,
    AgentInput,
    ApprovalDecision,
    ApprovalRecord,
    ApprovalWait,
    Limits,
    OperationRecord,
)
from toolloop._temporal.converter import data_converter


def round_trip(value: object) -> tuple[dict[str, object], object]:
    converter = data_converter().payload_converter
    [payload] = converter.to_payloads([value])
    [back] = converter.from_payloads([payload], [type(value)])
    return json.loads(payload.data), back


def test_a_requests_input_is_written_whole_and_reads_back_the_same() -> None:
    inp = AgentInput(request="hi", actor=Actor(user_id="u1"), limits=Limits(deadline_seconds=3600.0))
    stored, back = round_trip(inp)
    assert back == inp
    assert isinstance(stored["limits"], dict) and len(stored["limits"]) == len(Limits.model_fields)


def test_a_report_holds_every_operation_field_itself() -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)
    op = OperationRecord(
        operation_id="op_1",
        tool="t",
        call_ids=["c1"],
        arguments={"a": 1},
        digest="sha256:ab",
        state="verified",
        transitions=["proposed", "verified"],
        approval=ApprovalRecord(decision="approved", by="u1", at=at),
        evidence={"verified": True, "detail": "seen"},
        output={"ok": True},
    )
    report = contracts.AgentResult(
        workflow_id="wf", status="completed", stop_reason="final_answer", rounds=1, calls=[], operations=[op]
    )
    stored, back = round_trip(report)
    assert back == report
    assert stored["workflow_id"] == "wf" and stored["status"] == "completed"
    [written] = stored["operations"]  # type: ignore[misc]
    assert written["digest"] == "sha256:ab" and written["arguments"] == {"a": 1}  # type: ignore[index]
    assert written["approval"]["by"] == "u1" and written["evidence"]["verified"] is True  # type: ignore[index]


def test_a_decision_is_written_whole_beside_its_token() -> None:
    decision = ApprovalDecision(operation_id="op_1", digest="sha256:ab", approve=False, token="t", by="u1 via cli")
    stored, back = round_trip(decision)
    assert back == decision
    assert stored == {
        "operation_id": "op_1",
        "digest": "sha256:ab",
        "approve": False,
        "token": "t",
        "by": "u1 via cli",
        "then_wait": None,
    }
    waiting = decision.model_copy(update={"then_wait": ApprovalWait(seen=["op_0"])})
    stored, back = round_trip(waiting)
    assert back == waiting and stored["then_wait"] == {"seen": ["op_0"]}


def op_in(state: str) -> OperationRecord:
    return OperationRecord(operation_id="op", tool="t", call_ids=["c"], state=state)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "states", "codes", "outcome"),
    [
        ("completed", [], [], "answered"),
        ("completed", ["verified"], [None], "answered"),
        ("completed", ["denied"], [], "not_done"),
        ("completed", [], ["NOT_AVAILABLE"], "not_done"),
        ("completed", [], ["BAD_ARGUMENTS"], "answered"),  # the model's own mistake, not the service's refusal
        ("stopped", ["verified"], [], "stopped"),
        ("failed", ["expired"], [], "failed"),
        # A side effect nobody can vouch for outranks everything: someone must look.
        ("failed", ["unknown"], [], "unknown"),
        ("completed", ["completed"], [], "unknown"),
    ],
)
def test_one_rule_says_what_a_request_came_to_for_the_cli_the_ui_and_the_api(
    status: str, states: list[str], codes: list[str | None], outcome: str
) -> None:
    calls = [
        contracts.CallRecord(call_id=f"c{i}", tool="t", round=1, ok=code is None, code=code)
        for i, code in enumerate(codes)
    ]
    report = contracts.AgentResult(
        status=status, stop_reason="final_answer", rounds=1, calls=calls, operations=[op_in(s) for s in states]
    )  # type: ignore[arg-type]
    assert report.outcome == outcome
    # Written with the report, so a plain reader of the workflow's result sees it.
    assert report.model_dump(mode="json")["outcome"] == outcome
    assert (
        contracts.EXIT_CODES[report.outcome]
        == {"answered": 0, "stopped": 1, "failed": 1, "unknown": 3, "not_done": 4}[outcome]
    )


def test_a_model_name_is_parsed_once_for_the_cli_and_the_api() -> None:
    from toolloop._core.contracts import ModelSpec

    assert ModelSpec.named("offline") == ModelSpec(provider="offline")
    assert ModelSpec.named("openai:gpt-4.1-mini") == ModelSpec(provider="openai", name="gpt-4.1-mini")
    assert ModelSpec.named("small:") == ModelSpec(provider="small")
    for bad in ("", "Open AI", ":gpt", "9lives"):
        with pytest.raises(ValueError, match="NAME or NAME:MODEL"):
            ModelSpec.named(bad)


def test_fields_renamed_for_clarity_still_read_under_their_old_names() -> None:
    # What a workflow of the version before wrote, read by this version's activities.
    from toolloop._core.contracts import ModelTurnInput, WriteInput

    turn = ModelTurnInput.model_validate({"turn": 2, "new_items": [], "provider": "offline", "output_refs": ["c1"]})
    assert turn.outputs_in_history == ["c1"] and "output_refs" not in turn.model_dump()
    write = WriteInput.model_validate(
        {
            "operation_id": "op_1",
            "tool": "t",
            "arguments": {},
            "actor": {"user_id": "u1", "tenant_id": "acme"},
            "call_id": "c1",
            "keep_output_round": 3,
        }
    )
    assert write.round == 3 and "keep_output_round" not in write.model_dump()


def test_every_contract_is_fully_defined_at_import() -> None:
    # A field naming a model defined further down is resolved only on first use, and inside Temporal's workflow
    # sandbox that may fail ("CheckedCall is not fully defined"): every model must be complete once imported.
    import inspect

    from pydantic import BaseModel

    from toolloop._core import contracts

    models = [m for _, m in inspect.getmembers(contracts, inspect.isclass) if issubclass(m, BaseModel)]
    incomplete = [m.__name__ for m in models if m.__module__ == contracts.__name__ and not m.__pydantic_complete__]
    assert incomplete == []


def test_a_refusal_is_the_answer_text_never_an_empty_answer() -> None:
    # Both adapters keep a refusal as a content part: {"type": "refusal"} (Responses; Chat's `refusal` as one).
    # answer_text read only text parts, so a request the model declined ended "answered" with no text.
    declined = contracts.MessageItem(content=[{"type": "refusal", "refusal": "I can't help with refunds."}])
    assert contracts.answer_text([declined]) == "The model declined: I can't help with refunds."
    said = contracts.MessageItem(content=[{"type": "output_text", "text": "A100 shipped."}])
    assert contracts.answer_text([said, declined]) == "A100 shipped.\nThe model declined: I can't help with refunds."
    assert contracts.answer_text([contracts.MessageItem(content=[])]) is None
