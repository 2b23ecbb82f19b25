"""Pure tests: fault plans (the file format and its one-line-per-field errors) and when a fault fires."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo.bizservice.firing import draw, fires
from faultbed.plan import (
    FaultPlan,
    PlanError,
    ServiceFaultSpec,
    When,
    WireFaultSpec,
    fault_fires,
    load_plan,
    parse_plan,
    service_rules,
)

PLAN_YAML = """
name: lost-reply
description: a refund whose reply is lost, on a slow wire
seed: 3
faults:
  - boundary: service
    fault: commit_then_drop
    match: {method: POST, path: "^/orders/[^/]+/refunds$"}
    when: {nth: 1}
  - boundary: wire
    fault: latency
    latency_ms: 300
    match: {method: GET}
    when: {probability: 0.5}
  - boundary: model
    fault: malformed_output
    text: '{"orderId": "A100",'
    when: {nth: 2}
  - boundary: process
    fault: kill_worker
    at: after_service_commit
"""


def test_a_yaml_plan_loads_into_typed_faults(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN_YAML)
    plan = load_plan(path)
    assert (plan.name, plan.seed, [f.boundary for f in plan.faults]) == (
        "lost-reply",
        3,
        ["service", "wire", "model", "process"],
    )
    service, wire = plan.faults[0], plan.faults[1]
    assert isinstance(service, ServiceFaultSpec) and service.match.matches("POST", "/orders/A100/refunds")
    assert not service.match.matches("GET", "/orders/A100/refunds")
    assert isinstance(wire, WireFaultSpec) and wire.when.probability == 0.5
    # The process fault fires on the first time its point is reached unless told otherwise.
    assert plan.faults[3].when == When(nth=1)


def test_the_same_plan_reads_the_same_from_json(tmp_path: Path) -> None:
    yaml_path, json_path = tmp_path / "p.yml", tmp_path / "p.json"
    yaml_path.write_text(PLAN_YAML)
    json_path.write_text(json.dumps(load_plan(yaml_path).model_dump(mode="json")))
    assert load_plan(json_path) == load_plan(yaml_path)


def test_every_bad_field_gets_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        """
name: Bad Name
faults:
  - boundary: service
    fault: explode
  - boundary: wire
    fault: latency
    match: {method: FETCH, path: "("}
  - boundary: process
    fault: kill_worker
    at: after_service_commit
    when: {nth: 2, probability: 0.5}
  - boundary: moon
    fault: latency
"""
    )
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    lines = str(caught.value).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    where = [line.removeprefix(f"{path}: ").split(":")[0] for line in lines]
    assert where == [
        "name",
        "faults[0].fault",
        "faults[1].match.method",
        "faults[1].match.path",
        "faults[2].when",
        "faults[3]",
    ], lines
    assert "not a valid regular expression" in lines[3]
    assert "exactly one of nth or probability" in lines[4]
    assert "Traceback" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [("faults: [", ".yaml", "not valid YAML at line 1"), ("{", ".json", "not valid JSON")],
)
def test_a_file_that_does_not_parse_is_one_line(tmp_path: Path, text: str, suffix: str, expected: str) -> None:
    path = tmp_path / f"plan{suffix}"
    path.write_text(text)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert str(caught.value) == f"{path}: {expected}"


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"cannot read it") as caught:
        load_plan(tmp_path / "nope.yaml")
    assert "\n" not in str(caught.value)


def test_latency_faults_need_their_latency() -> None:
    with pytest.raises(PlanError, match=r"faults\[0\]: .*latency needs latency_ms > 0"):
        parse_plan({"name": "x", "faults": [{"boundary": "service", "fault": "latency"}]})


def test_a_plant_needs_its_text_and_a_field_path() -> None:
    with pytest.raises(PlanError, match=r"faults\[0\]: plant needs the text to plant and the reply's field"):
        parse_plan({"name": "x", "faults": [{"boundary": "wire", "fault": "plant", "field": "items.0.name"}]})
    with pytest.raises(PlanError, match=r"faults\[0\]\.field: String should match pattern"):
        parse_plan({"name": "x", "faults": [{"boundary": "wire", "fault": "plant", "text": "t", "field": "a..b"}]})


def test_a_process_fault_strikes_at_an_nth_point_never_at_random() -> None:
    kill = {"boundary": "process", "fault": "kill_worker", "at": "after_service_commit"}
    with pytest.raises(PlanError, match=r"faults\[0\]: a process fault strikes the Nth time .*give when.nth"):
        parse_plan({"name": "x", "faults": [{**kill, "when": {"probability": 0.5}}]})
    with pytest.raises(PlanError, match=r"faults\[0\]\.at: Input should be 'during_model_turn'"):
        parse_plan({"name": "x", "faults": [{**kill, "at": "whenever"}]})
    assert parse_plan({"name": "x", "faults": [kill]}).faults[0].when.nth == 1


def test_process_points_become_holds_in_the_service_and_the_proxy() -> None:
    from faultbed.strikes import HOLD_MS, process_faults, service_holds, wire_holds

    plan = parse_plan(
        {
            "name": "x",
            "faults": [
                {"boundary": "service", "fault": "commit_then_drop"},
                {"boundary": "process", "fault": "kill_service", "at": "after_service_commit", "when": {"nth": 2}},
                {"boundary": "process", "fault": "kill_worker", "at": "before_write_sent"},
                {"boundary": "process", "fault": "restart_temporal", "at": "during_approval_wait"},
            ],
        }
    )
    strikes = process_faults(plan)
    assert [(f.index, f.process) for f in strikes] == [(1, "service"), (2, "worker"), (3, "temporal")]
    # The 2nd committed write's reply is held; the 1st write request is held before the service.
    assert service_holds(strikes) == [
        {"method": "POST", "path_regex": "^/", "when": "after_commit", "latency_ms": HOLD_MS, "times": 1, "skip": 1}
    ]
    [held] = wire_holds(strikes)
    assert (held.index, held.spec.fault, held.spec.latency_ms, held.spec.match.method) == (
        2,
        "latency",
        HOLD_MS,
        "POST",
    )
    assert held.spec.when.nth == 1


def test_an_nth_fault_fires_on_exactly_its_calls() -> None:
    when = When(nth=3, times=2)
    assert [n for n in range(1, 10) if fault_fires(when, seed=0, fault_index=0, call_number=n)] == [3, 4]
    assert [n for n in range(1, 10) if fault_fires(When(nth=2), seed=0, fault_index=0, call_number=n)] == [2]
    # A seeded fault with a cap stops once it has fired that often.
    capped = When(probability=1.0, times=2)
    assert fault_fires(capped, seed=0, fault_index=0, call_number=9, fired_before=1)
    assert not fault_fires(capped, seed=0, fault_index=0, call_number=9, fired_before=2)


def test_a_seeded_fault_fires_the_same_way_for_the_same_seed_and_differently_for_another() -> None:
    when = When(probability=0.3)

    def fired(seed: int, fault: int) -> list[int]:
        return [n for n in range(1, 201) if fault_fires(when, seed=seed, fault_index=fault, call_number=n)]

    assert fired(1, 0) == fired(1, 0)
    assert fired(1, 0) != fired(2, 0) and fired(1, 0) != fired(1, 1)
    # About the probability asked for (200 draws).
    assert 30 <= len(fired(1, 0)) <= 90


def test_draws_are_fixed_numbers_not_a_process_random_state() -> None:
    # A value computed once and written here: any change to the draw changes which faults a seed fires.
    assert draw(7, "f0", 1) == pytest.approx(0.008162107, abs=1e-9)
    assert 0 <= min(draw(s, "x", n) for s in range(20) for n in range(1, 20)) < 0.1
    assert 0.9 < max(draw(s, "x", n) for s in range(20) for n in range(1, 20)) < 1


def test_fires_counts_skip_times_and_probability_together() -> None:
    assert not fires(1, skip=1)
    assert fires(2, skip=1)
    assert not fires(5, times=2, fired_before=2)
    assert fires(5, times=2, fired_before=1, probability=1.0)


def test_a_plan_needs_a_name_and_a_fault() -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan({"faults": []}, source="inline")
    assert str(caught.value).splitlines() == [
        "inline: name: Field required",
        "inline: faults: List should have at least 1 item after validation, not 0",
    ]
    assert isinstance(parse_plan({"name": "ok", "faults": [{"boundary": "wire", "fault": "reset"}]}), FaultPlan)


def test_service_faults_become_the_services_own_rules() -> None:
    from demo.bizservice.faults import FaultRule

    plan = parse_plan(
        {
            "name": "svc",
            "faults": [
                {"boundary": "wire", "fault": "reset"},
                {"boundary": "service", "fault": "commit_then_drop", "match": {"method": "POST", "path": "/refunds$"}},
                {"boundary": "service", "fault": "status_down", "when": {"nth": 2, "times": 3}},
                {"boundary": "service", "fault": "commit_then_500", "when": {"probability": 0.25}},
                {"boundary": "service", "fault": "stall_after_claim", "latency_ms": 800},
            ],
        }
    )
    rules = service_rules(plan, seed=11)
    assert rules == [
        {"method": "POST", "path_regex": "/refunds$", "when": "after_commit", "action": "drop", "latency_ms": 0,
         "times": 1, "skip": 0},
        {"method": "GET", "path_regex": "^/operations/", "when": "before_handler", "status": 503, "latency_ms": 0,
         "times": 3, "skip": 1},
        {"method": "*", "path_regex": "^/", "when": "after_commit", "status": 500, "latency_ms": 0, "times": None,
         "probability": 0.25, "seed": 11, "label": "3"},
        {"method": "*", "path_regex": "^/", "when": "after_claim", "latency_ms": 800, "times": 1, "skip": 0},
    ]  # fmt: skip
    # Every one is a rule the service accepts as it is.
    assert [FaultRule.model_validate(rule).model_dump(include=set(rule)) for rule in rules] == rules
