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


def decided(verdict: str, approval: dict[str, Any] | None = None, **policy: Any) -> OperationRecord:
    record: dict[str, Any] = {"verdict": verdict, "version": "sha256:" + "ab12" * 16, **policy}
    changes: dict[str, Any] = {"policy": record}
    if approval is not None:
        changes["approval"] = {"at": "2026-01-01T00:00:00Z", **approval}
    return OperationRecord.model_validate({**op("verified").model_dump(), **changes})


MANAGERS = {"deciders": {"roles": ["manager"]}}
FOUR_EYES = {"deciders": {"requester": True, "roles": ["manager"], "approvals": 2}}


@pytest.mark.parametrize(
    ("record", "line"),
    [
        (
            decided("allow", {"decision": "approved", "by": "rule small-late-refund"}, rules=["small-late-refund"]),
            "policy: approved by rule small-late-refund; version sha256:ab12ab12ab12",
        ),
        (
            decided(
                "ask",
                {"decision": "approved", "by": "m1 via cli"},
                rules=["manager-decides-larger-refunds"],
                approved_by=["m1"],
                **MANAGERS,
            ),
            "policy: approved by m1 under rule manager-decides-larger-refunds; version sha256:ab12ab12ab12",
        ),
        (
            decided(
                "ask",
                {"decision": "approved", "by": "m1 via api"},
                rules=["four-eyes-over-200", "requester-decides-the-rest"],
                approved_by=["u1", "m1"],
                **FOUR_EYES,
            ),
            "policy: approved by u1, m1 under rule four-eyes-over-200, requester-decides-the-rest; "
            "version sha256:ab12ab12ab12",
        ),
        (
            decided("ask", {"decision": "rejected", "by": "m1 via cli"}, rules=["manager-decides-larger-refunds"]),
            "policy: rejected by m1 via cli under rule manager-decides-larger-refunds; version sha256:ab12ab12ab12",
        ),
        (
            decided("ask", None, rules=["four-eyes-over-200"], approved_by=["u1"], **FOUR_EYES),
            "policy: left to two people (the requester or a manager; the requester never second) by rule "
            "four-eyes-over-200, not decided; approved so far by u1; version sha256:ab12ab12ab12",
        ),
        (
            decided("deny", None, rules=["refund-to-payer-only"]),
            "policy: denied by rule refund-to-payer-only; version sha256:ab12ab12ab12",
        ),
    ],
)
def test_the_receipt_says_which_rule_or_which_people_decided_a_write_and_the_policy_version(
    record: OperationRecord, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    starter._print_receipt([record])
    _, err = capsys.readouterr()
    assert f"\n    {line}\n" in err


def test_a_write_without_a_policy_has_no_policy_line(capsys: pytest.CaptureFixture[str]) -> None:
    starter._print_receipt([op("verified")])
    _, err = capsys.readouterr()
    assert "policy:" not in err
