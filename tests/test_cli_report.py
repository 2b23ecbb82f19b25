"""Pure tests of the CLI's report: the exit-code table (an unknown or unverified side effect outranks every
other outcome) and a stopped run that still says what it did."""

from __future__ import annotations

from typing import Any

import pytest

import starter
from toolloop._core.contracts import Actor, AgentResult, CallRecord, OperationRecord
from toolloop._temporal.requests import request_workflow_id


def op(state: str) -> OperationRecord:
    return OperationRecord.model_validate(
        {
            "operation_id": f"op_{state}",
            "tool": "refund_order",
            "call_ids": ["c1"],
            "arguments": {"orderId": "A100", "amountCents": 1, "reason": "r"},
            "digest": "sha256:x",
            "state": state,
        }
    )


@pytest.mark.parametrize(
    ("status", "states", "code"),
    [
        ("completed", [], 0),
        ("completed", ["verified"], 0),
        ("completed", ["verified", "denied"], 4),
        ("completed", ["expired"], 4),
        ("completed", ["failed"], 4),
        ("completed", ["completed"], 3),
        ("completed", ["unknown", "denied"], 3),
        ("stopped", [], 1),
        ("stopped", ["verified"], 1),
        ("stopped", ["denied"], 1),
        ("stopped", ["unknown"], 3),
        ("failed", ["completed"], 3),
        ("failed", ["sent"], 3),  # a run that ended mid-write: not settled
        ("failed", [], 1),
    ],
)
def test_the_exit_code_table(status: str, states: list[str], code: int) -> None:
    assert starter._exit_code(status, [op(s) for s in states]) == code


def call(code: str | None) -> CallRecord:
    return CallRecord(call_id="c", tool="get_ticket", round=1, ok=code is None, code=code)


@pytest.mark.parametrize(
    ("status", "codes", "code"),
    [
        ("completed", [None], 0),
        # The service refused what the request needed: not done, whatever the model answered.
        ("completed", ["NOT_AVAILABLE"], 4),
        ("completed", [None, "FORBIDDEN"], 4),
        # The model's own mistakes, which it may correct, and a service that did not answer, are not refusals.
        ("completed", ["BAD_ARGUMENTS", None], 0),
        ("completed", ["TEMPORARY_UNAVAILABLE"], 0),
        ("stopped", ["NOT_AVAILABLE"], 1),
    ],
)
def test_a_call_the_service_refused_means_not_done(status: str, codes: list[str | None], code: int) -> None:
    assert starter._exit_code(status, [], [call(c) for c in codes]) == code


def test_an_unsettled_write_outranks_a_refused_call() -> None:
    assert starter._exit_code("completed", [op("unknown")], [call("NOT_AVAILABLE")]) == 3


def result(**changes: Any) -> AgentResult:
    base: dict[str, Any] = {
        "workflow_id": "ask-acme-u1-x-1",
        "status": "stopped",
        "stop_reason": "deadline",
        "final_text": None,
        "rounds": 1,
        "calls": [],
    }
    return AgentResult.model_validate({**base, **changes})


def test_a_run_stopped_at_the_deadline_after_a_write_says_so_and_shows_the_receipt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = starter.Settings()
    starter._print_result(result(operations=[op("verified")]), settings)
    out, err = capsys.readouterr()
    assert "the request stopped (deadline) after side effects were made or attempted" in out
    assert "refund_order op_verified: done, verified by read-back" in err


def test_a_run_stopped_with_nothing_done_says_only_that(capsys: pytest.CaptureFixture[str]) -> None:
    starter._print_result(result(operations=[op("expired")]), starter.Settings())
    out, _ = capsys.readouterr()
    assert "the request stopped (deadline)." in out and "side effects" not in out


def test_request_ids_are_scoped_by_tenant_and_user() -> None:
    ids = {
        request_workflow_id(Actor(user_id=u, tenant_id=t), r)
        for u, t, r in [("u1", "acme", "r1"), ("u1", "globex", "r1"), ("u2", "acme", "r1"), ("u1", "acme", "r2")]
    }
    assert len(ids) == 4
    # Readable, yet the hash tells apart triples that read alike.
    a = request_workflow_id(Actor(user_id="b-c", tenant_id="a"), "d")
    b = request_workflow_id(Actor(user_id="b", tenant_id="a"), "c-d")
    assert a.startswith("ask-a-b-c-d-") and b.startswith("ask-a-b-c-d-") and a != b
