"""Pure: the fault catalog (docs/FAULTS.md) against what covers each case - a built-in chaos scenario (its
`covers`), or a focused test named here with why it is not a scenario, or an open gap said plainly. The
chaos report prints the whole table; tests/test_faultbed_catalog.py checks that every id of the catalog is
here, and that every named test exists."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from faultbed.scenarios import BUILT_IN, Scenario


@dataclass(frozen=True)
class CoveredByTest:
    """A test that covers the case: its pytest node id, and why it is a test rather than a scenario."""

    node: str
    why: str
    # What of the catalog's expected behaviour it does not check ("": all of it).
    missing: str = ""


@dataclass(frozen=True)
class Gap:
    """Nothing covers the case yet, and why."""

    why: str


# Every id of docs/FAULTS.md, in its order.
CATALOG_IDS: tuple[str, ...] = tuple(
    """
M1 M2 M3 M4 M5 M6 M7 M8 M9 M10 M11 M12 M13
A1 A2 A3 A4 A5 A6 A7 A8 A10 A11 A12
Z1 Z2 Z3 Z4
T1 T2 T3 T4 T5 T6 T7 T8 T9 T10 T11 T12 T13
W1 W2 W3 W4 W6 W8 W10 W11 W12
C1 C2 C3 C4 C5 C6 C7
I1 I2 I4 I6 I7
    """.split()
)

# The cases no built-in scenario covers.
ELSEWHERE: dict[str, CoveredByTest | Gap] = {
    "M2": CoveredByTest(
        "tests/test_agent_loop_e2e.py::test_invalid_calls_get_specific_codes_and_never_reach_the_service",
        "pure validation: no fault to inject, a scripted bad call and the service log suffice",
    ),
    "M3": CoveredByTest(
        "tests/test_core_validation.py::test_unknown_tool_lists_available_ones",
        "pure validation: no fault to inject, checked without a server",
    ),
    "M4": CoveredByTest(
        "tests/test_durability_e2e.py::test_a_request_limited_to_some_tools_offers_only_those_and_forbids_the_rest",
        "a request's own allow-list, checked on what the model is offered; no fault to inject",
    ),
    "M5": CoveredByTest(
        "tests/test_core_validation.py::test_duplicate_call_id_rejects_the_whole_turn_once_per_id",
        "pure turn check: no fault to inject, checked without a server",
    ),
    "M6": CoveredByTest(
        "tests/test_write_protocol_workflow.py::test_writes_count_toward_the_per_round_cap",
        "a limit branch of the workflow, driven with stand-in activities",
    ),
    "M7": CoveredByTest(
        "tests/test_writes_e2e.py::test_same_write_proposed_twice_makes_one_effect",
        "a scripted repeat of one write, no fault to inject; effects counted",
    ),
    "M8": CoveredByTest(
        "tests/test_agent_loop_e2e.py::test_round_limit_stops_a_model_that_never_answers",
        "a limit, not a fault: a scripted endless model and a low max_rounds",
    ),
    "M9": CoveredByTest(
        "tests/test_cli_e2e.py::test_ask_exits_3_when_a_side_effect_is_unknown_or_unverified_whatever_the_model_says",
        "the receipt and exit code are CLI output, checked on the real CLI",
    ),
    "M12": CoveredByTest(
        "tests/test_durability_e2e.py::test_responses_adapter_retries_429_and_sends_every_item_back",
        "checks the exact input sent to a fake Responses server; chaos model is scripted",
    ),
    "M13": CoveredByTest(
        "tests/test_durability_e2e.py::test_responses_adapter_definite_failures_stop_without_retry",
        "needs the real Responses adapter against a fake server, not the scripted model",
        missing="incomplete only; empty output in test_a_turn_with_neither_text_nor_calls_stops_with_no_answer; no refusal",
    ),
    "A1": CoveredByTest(
        "tests/test_agent_loop_e2e.py::test_invalid_calls_get_specific_codes_and_never_reach_the_service",
        "pure validation: no fault to inject, a scripted call and the service log suffice",
    ),
    "A2": CoveredByTest(
        "tests/test_properties.py::test_no_input_that_passes_validation_makes_the_service_fail_or_leak",
        "generated inputs by the hundred against the service app; no fault to inject",
        missing="NaN is left out of the generated inputs (test_bad_arguments_get_specific_codes has it)",
    ),
    "A3": CoveredByTest(
        "tests/test_demotools_writes.py::test_definite_refusals_are_tool_errors",
        "the loop never reuses a key for another payload; only a direct call can try it",
    ),
    "A4": CoveredByTest(
        "tests/test_bizservice_writes.py::test_without_a_valid_approval_nothing_happens",
        "a hand-made token for another digest, sent at the service directly",
        missing="at the service (APPROVAL_REQUIRED); the code's mapping in test_answers_are_sorted_without_passing_raw_bodies",
    ),
    "A5": CoveredByTest(
        "tests/test_writes_e2e.py::test_service_refuses_an_approval_that_expired_before_execution",
        "needs a token TTL tuned against one stalled write, a one-off timing setup",
    ),
    "A6": CoveredByTest(
        "tests/test_writes_e2e.py::test_update_validator_refuses_bad_decisions_and_nothing_is_sent",
        "forged decisions sent to the update validator by hand; no fault to inject",
        missing="another operation only at the token level (test_a_token_for_anything_else_is_refused_with_its_reason)",
    ),
    "A8": CoveredByTest(
        "tests/test_write_protocol_workflow.py::test_the_same_approval_twice_is_recorded_once",
        "one update sent twice by hand to the workflow; no fault to inject",
    ),
    "A10": CoveredByTest(
        "tests/test_writes_e2e.py::test_stale_version_is_a_version_conflict_without_effect",
        "a scripted stale version, a business refusal rather than an injected fault",
        missing="no check that the ticket is read again after the conflict",
    ),
    "A11": CoveredByTest(
        "tests/test_writes_e2e.py::test_two_spellings_of_one_event_are_one_operation_and_one_effect",
        "canonicalisation of scripted spellings; no fault to inject",
    ),
    "A12": CoveredByTest(
        "tests/test_write_protocol_workflow.py::test_an_update_of_another_users_decision_names_no_one",
        "an update validator branch, driven by hand with stand-in activities",
    ),
    "Z1": CoveredByTest(
        "tests/test_writes_e2e.py::test_authority_revoked_before_the_approved_write_runs_is_refused_there_and_reported_not_done",
        "a revocation at the service between proposal and execution, on a private service",
    ),
    "Z2": CoveredByTest(
        "tests/test_demotools.py::test_not_yours_and_missing_give_the_same_not_available",
        "compares answers across actors on seeded data; no fault to inject",
    ),
    "Z4": CoveredByTest(
        "tests/test_api_e2e.py::test_another_users_or_tenants_request_is_answered_like_a_missing_one",
        "an API authorization check across users and tenants; no fault to inject",
    ),
    "T10": CoveredByTest(
        "tests/test_http_contract.py::test_a_definite_refusal_is_a_tool_error_with_its_code_after_one_attempt",
        "one refusal per code at the HTTP tool layer, counted attempt by attempt",
    ),
    "T11": CoveredByTest(
        "tests/test_writes_e2e.py::test_late_retry_past_retention_is_not_resent_and_stays_unknown",
        "needs a short-retention service and a worker down past it; slow, one-off setup",
    ),
    "T12": CoveredByTest(
        "tests/test_write_protocol_workflow.py::test_a_write_whose_read_back_fails_ends_completed_not_verified",
        "a read-back that never sees the write, driven with stand-in activities",
        missing="no count of re-reads; never re-written in test_the_read_back_of_a_note_not_visible_yet_says_so_and_is_never_a_rewrite",
    ),
    "W8": CoveredByTest(
        "tests/test_replay_histories.py::test_a_non_deterministic_change_fails_the_replay",
        "a workflow code change, caught by replaying stored histories",
    ),
    "W10": CoveredByTest(
        "tests/test_agent_loop_e2e.py::test_large_tool_output_is_capped_keeping_every_field",
        "an output-size limit, not a fault: a big read under a low cap",
        missing="a 512-byte cap on a page of orders, not several MB; model responses have no size cap",
    ),
    "W11": CoveredByTest(
        "tests/test_replay_histories.py::test_committed_history_replays_with_todays_workflow",
        "replay of a stored history with an expired approval, long after it ran",
        missing="the stored approval ran out at the request deadline, not at its own expiry",
    ),
    "W12": CoveredByTest(
        "tests/test_writes_e2e.py::test_a_write_stalled_at_the_service_past_the_deadline_is_never_committed_and_is_resolved",
        "needs a stall timed against a short request deadline; a tuned one-off",
        missing="no deadline during a read-back; the approval wait in test_the_deadline_ends_the_approval_wait_and_nothing_is_sent",
    ),
    "C1": CoveredByTest(
        "tests/test_bizservice_writes.py::test_stale_version_is_a_stored_conflict",
        "the service's own version check, driven at the service directly",
        missing="two writes one after the other at the service, not two concurrent requests",
    ),
    "C2": CoveredByTest(
        "tests/test_api_e2e.py::test_two_identical_posts_at_once_make_one_workflow",
        "needs concurrent identical POSTs, the chaos runner drives one at a time",
    ),
    "C4": CoveredByTest(
        "tests/test_write_protocol_workflow.py::test_a_request_cancelled_during_the_approval_wait_sends_nothing_even_if_approved_then",
        "a cancel is the user's action, not an injected fault; the approval raced against it by hand",
    ),
    "C5": CoveredByTest(
        "tests/test_writes_e2e.py::test_a_request_cancelled_while_its_committed_write_is_in_flight_reports_it_done_once",
        "a cancel is the user's action, not an injected fault; timed against a held reply",
    ),
    "C6": CoveredByTest(
        "tests/test_core_planning.py::test_consecutive_reads_form_one_parallel_group_and_writes_are_barriers",
        "pure round planning: no fault to inject, checked without a server",
        missing="the round's plan only; nothing end to end shows the reads saw the state before the write",
    ),
    "C7": CoveredByTest(
        "tests/test_ledger_races.py::test_two_attempts_meeting_between_check_and_insert_make_one_claim_and_one_effect",
        "the service's own idempotency race, forced with hold points in two processes",
        missing="check-insert only; effect-record in test_a_process_killed_between_effect_and_record_leaves_no_effect_and_the_key_then_makes_one",
    ),
    "I7": CoveredByTest(
        "tests/test_core_planning.py::test_large_output_is_capped_to_valid_json_with_marker",
        "pure output capping: no fault to inject, checked without a server",
        missing="about 250 KB from a tool, not megabytes planted in the service's data",
    ),
}


@dataclass(frozen=True)
class Coverage:
    case: str
    scenarios: tuple[str, ...]
    elsewhere: CoveredByTest | Gap | None


def coverage(ids: Sequence[str] = CATALOG_IDS, scenarios: Sequence[Scenario] = BUILT_IN) -> list[Coverage]:
    """Each catalog id, with the scenarios that cover it and what else does."""
    return [Coverage(case, tuple(s.name for s in scenarios if case in s.covers), ELSEWHERE.get(case)) for case in ids]
