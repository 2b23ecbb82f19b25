"""The payload contracts' fixed defaults: a payload leaves out a field that holds its fixed default, so a
stored history means that default for good. Changing one here changes what every stored history means
(a running request would replay with another limit, say): add a field instead."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from toolloop._core import contracts
from toolloop._core.contracts import Actor, AgentInput, ApprovalDecision, Compact, Limits
from toolloop._temporal.converter import data_converter

PINNED: dict[str, dict[str, Any]] = {
    "CheckedCall": {"read_only": True, "has_status": True, "has_read_back": True},
    "WriteInput": {"attempt": 1},
    "Limits": {
        "max_rounds": 8,
        "max_calls_per_round": 8,
        "max_total_calls": 32,
        "max_parallel_reads": 8,
        "max_tool_output_bytes": 16_384,
        "tool_timeout_seconds": 10.0,
        "tool_max_attempts": 3,
        "model_timeout_seconds": 120.0,
        "model_max_attempts": 5,
        "deadline_seconds": 600.0,
        "approval_ttl_seconds": 300.0,
        "write_timeout_seconds": 10.0,
        "max_write_attempts": 3,
        "status_max_attempts": 4,
        "unknown_resolution_seconds": 60.0,
        "readback_max_attempts": 3,
        "idempotency_retention_seconds": 86_400.0,
        "settle_seconds": 30.0,
    },
}


def _fixed_defaults() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name in dir(contracts):
        cls = getattr(contracts, name)
        if not (isinstance(cls, type) and issubclass(cls, Compact)) or cls is Compact:
            continue
        fixed = set(cls.model_fields) if cls.every_default_fixed else set(cls.fixed_defaults)
        if fixed:
            found[cls.__name__] = {f: cls.model_fields[f].default for f in sorted(fixed)}
    return found


def test_every_fixed_default_is_pinned() -> None:
    assert _fixed_defaults() == PINNED
    # A verified operation's payload that leaves out its transitions means the happy path.
    assert contracts.VERIFIED_PATH == (
        "proposed",
        "validated",
        "awaiting_approval",
        "approved",
        "sent",
        "completed",
        "verified",
    )


def test_a_requests_input_holds_only_the_limits_that_differ_from_the_defaults() -> None:
    converter = data_converter().payload_converter
    inp = AgentInput(request="hi", actor=Actor(user_id="u1"), limits=Limits(deadline_seconds=3600.0))
    [payload] = converter.to_payloads([inp])
    assert json.loads(payload.data)["limits"] == {"deadline_seconds": 3600.0}
    [back] = converter.from_payloads([payload], [AgentInput])
    assert back == inp and back.limits.max_parallel_reads == 8
    # An input stored with every limit written (before) reads the same.
    assert AgentInput.model_validate(inp.model_dump(mode="json")) == inp
    # Outside payloads (the API, --json) every limit is still written.
    assert len(inp.limits.model_dump(mode="json")) == len(Limits.model_fields)


def test_a_decision_stores_its_operation_digest_and_decision_once_in_the_signed_token() -> None:
    from toolloop._core.approvals import ApprovalClaims, generate_signing_key, mint_approval_token

    claims = ApprovalClaims(
        audience="bizservice",
        user_id="u1",
        tenant_id="acme",
        operation_id="op_1",
        digest="sha256:ab",
        approved_by="u1",
        approved_at=1.0,
        expires_at=2.0,
        decision="reject",
    )
    token = mint_approval_token(generate_signing_key(), claims)
    converter = data_converter().payload_converter
    decision = ApprovalDecision(operation_id="op_1", digest="sha256:ab", approve=False, token=token, by="u1 via cli")
    [payload] = converter.to_payloads([decision])
    assert json.loads(payload.data) == {"token": token, "by": "u1 via cli"}
    assert converter.from_payloads([payload], [ApprovalDecision]) == [decision]
    # Who decided through which channel is in the token too: a decision that says the same leaves it out.
    same_by = decision.model_copy(update={"by": "u1"})
    [payload] = converter.to_payloads([same_by])
    assert json.loads(payload.data) == {"token": token}
    assert converter.from_payloads([payload], [ApprovalDecision]) == [same_by]
    # A decision that says something its token does not keeps it, and is refused by the validator later.
    other = decision.model_copy(update={"operation_id": "op_2", "approve": True})
    [payload] = converter.to_payloads([other])
    assert json.loads(payload.data) == {"operation_id": "op_2", "approve": True, "token": token, "by": "u1 via cli"}
    assert converter.from_payloads([payload], [ApprovalDecision]) == [other]
    # Without a readable token nothing is left out, and a payload that lacks the fields does not decode.
    bare = ApprovalDecision(operation_id="op_1", digest="sha256:ab", approve=True, token="junk")
    [payload] = converter.to_payloads([bare])
    assert {"operation_id", "digest", "approve"} <= set(json.loads(payload.data))
    with pytest.raises(ValidationError):
        ApprovalDecision.model_validate({"token": "junk"})


def test_a_report_operation_names_every_field_history_holds_in_short() -> None:
    converter = data_converter().payload_converter
    every = list(contracts.HISTORY_FIELDS)
    op = contracts.OperationRecord(
        operation_id="op_1", tool="t", call_ids=["c1"], digest="sha256:ab", state="verified", in_history=every
    )
    [payload] = converter.to_payloads([op])
    stored = json.loads(payload.data)
    assert stored["in_history"] == ["*"] and "digest" not in stored
    [back] = converter.from_payloads([payload], [contracts.OperationRecord])
    assert back.in_history == every and back.digest == ""  # the reader fills it from history
    # Fewer than all are named one by one; a record stored before in_history existed names none.
    some = op.model_copy(update={"in_history": ["approval"]})
    [payload] = converter.to_payloads([some])
    assert json.loads(payload.data)["in_history"] == ["approval"]
    assert converter.from_payloads([payload], [contracts.OperationRecord]) == [some]
    old = {"operation_id": "op_1", "tool": "t", "call_ids": ["c1"], "digest": "sha256:ab", "state": "failed"}
    assert contracts.OperationRecord.model_validate(old).in_history == []


@pytest.mark.parametrize(
    ("stop", "status"),
    [("final_answer", "completed"), ("max_rounds", "stopped"), ("cancelled", "stopped"), ("model_error", "failed")],
)
def test_a_reports_status_is_implied_by_its_stop_reason(stop: str, status: str) -> None:
    converter = data_converter().payload_converter
    report = contracts.AgentResult(status=status, stop_reason=stop, rounds=1, calls=[])
    [payload] = converter.to_payloads([report])
    assert "status" not in json.loads(payload.data)
    assert converter.from_payloads([payload], [contracts.AgentResult]) == [report]
    # A report stored with its status written reads the same.
    assert contracts.AgentResult.model_validate(report.model_dump(mode="json")) == report
