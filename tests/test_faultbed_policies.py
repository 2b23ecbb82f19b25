"""Pure tests: the chaos runner's policy pieces (issue 27) - the policy scenarios and their workload, the
policy variants they run with, the invariants on decisions (an effect a rule denied, a decision by someone who
may not decide, rule approvals counting as approvals), the decisions counted by rule and by person in the
report, the expectations of a policy run, the choice of a run with policies on, and the forged decision the
proxy's forge_token fault sends."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from faultbed.cli import ChaosUsageError, choose, policy_problems
from faultbed.invariants import Check, Effect, OperationFacts, RunFacts, decisions, judge, people_of
from faultbed.proxy import forged_decision
from faultbed.report import decision_counts, headline, render_markdown, to_json
from faultbed.runner import RunOutcome
from faultbed.scenarios import (
    ATTACKER_ACCOUNT,
    BUILT_IN,
    PEOPLE,
    POLICY_SCENARIOS,
    find_any,
    policy_text,
    policy_turns,
    policy_wanted,
    refund_to_attacker,
    with_model_faults,
    withdraw_auto_refunds,
)
from tests.conftest import REPO_ROOT
from toolloop._core.approvals import (
    ApprovalClaims,
    Deciders,
    PolicyClaims,
    PolicyDecisionInvalid,
    generate_signing_key,
    join_tokens,
    key_id,
    mint_approval_token,
    verify_key_for,
    verify_policy_token,
)
from toolloop._core.policies import Policies, WriteProposal

OP, OTHER = "op_" + "a" * 32, "op_" + "b" * 32
ME = ("u1", "acme")
DEMO = REPO_ROOT / "config" / "policies"
FOUR_EYES = Deciders(requester=True, roles=["manager"], approvals=2)
MANAGER = Deciders(roles=["manager"])


def facts(*operations: OperationFacts, effects: tuple[Effect, ...] = (), writes: int = 1) -> RunFacts:
    return RunFacts(
        scenario="policy-x",
        seed=0,
        finished=True,
        operations=list(operations),
        effects=list(effects),
        policies=True,
        roles=dict(PEOPLE),
        writes=writes,
    )


def broken(run: RunFacts) -> dict[str, str]:
    return {c.name: c.detail for c in judge(run) if not c.ok}


def by_rule(state: str = "verified", rules: tuple[str, ...] = ("small-late-refund",), op: str = OP) -> OperationFacts:
    return OperationFacts(op, state, approved=True, policy="allow", rules=rules, decided_by=f"rule {', '.join(rules)}")


def asked(
    people: tuple[str, ...], deciders: Deciders = MANAGER, state: str = "verified", op: str = OP
) -> OperationFacts:
    by = " and ".join(f"{p} via chaos" for p in people)
    done = len(people) >= deciders.approvals
    return OperationFacts(
        op,
        state,
        approved=done,
        policy="ask",
        rules=("manager-decides-larger-refunds",),
        deciders=deciders,
        approved_by=people,
        decided_by=by if done else "",
    )


def denied(rules: tuple[str, ...] = ("refund-to-payer-only",), op: str = OP) -> OperationFacts:
    return OperationFacts(op, "denied", approved=False, policy="deny", rules=rules)


def test_with_policies_on_a_run_is_judged_by_the_two_policy_invariants_too() -> None:
    clean = facts(by_rule(), effects=(Effect(OP, *ME),))
    names = [c.name for c in judge(clean)]
    assert names[-2:] == ["no effect a rule denied", "no decision by someone who may not decide"]
    assert broken(clean) == {}
    # Without policies, the checks are the ones they always were.
    assert "no effect a rule denied" not in [c.name for c in judge(replace(clean, policies=False))]


def test_an_operation_approved_by_a_rule_counts_as_approved() -> None:
    assert "no effect without approval" not in broken(facts(by_rule(), effects=(Effect(OP, *ME),)))


def test_an_effect_of_an_operation_a_rule_denied_breaks_its_invariant_and_counts_unapproved() -> None:
    found = broken(facts(denied(), effects=(Effect(OP, *ME),)))
    assert found["no effect a rule denied"] == (
        f"{OP} was denied by rule refund-to-payer-only, but the service holds its effect"
    )
    assert "no effect without approval" in found
    assert broken(facts(denied())) == {}


def test_four_eyes_counts_as_approved_only_with_both_people() -> None:
    one = asked(("u1",), FOUR_EYES, state="expired")
    assert broken(facts(one)) == {}
    # An effect of a four-eyes write with one approval (the ledger saying approved or not) is unapproved.
    sent_early = replace(one, approved=True, decided_by="u1 via chaos")
    assert "no effect without approval" in broken(facts(sent_early, effects=(Effect(OP, *ME),)))
    both = asked(("u1", "m1"), FOUR_EYES)
    assert broken(facts(both, effects=(Effect(OP, *ME),))) == {}


@pytest.mark.parametrize(
    ("operation", "said"),
    [
        (asked(("u1",)), "u1 decided it; the policy admits a manager"),  # the requester, not a manager
        (asked(("u2",)), "u2 decided it"),  # nobody the policy names
        (asked(("m1", "u1"), FOUR_EYES), "the requester u1 counted as a second person"),
        (asked(("m1", "m1"), FOUR_EYES), "one person counted twice"),
        (replace(by_rule(), approved_by=("u1",)), "the policy decided it (allow), yet ['u1'] decided it"),
        (replace(denied(), decided_by="m1 via chaos"), "the policy decided it (deny), yet ['m1'] decided it"),
        # Without a policy decision, only the request's user decides (a rejection too).
        (OperationFacts(OP, "denied", approved=False, decided_by="m1 via chaos", rejected=True), "['m1'] decided"),
    ],
)
def test_a_decision_by_someone_who_may_not_decide_breaks_its_invariant(operation: OperationFacts, said: str) -> None:
    found = broken(facts(operation))
    assert said in found["no decision by someone who may not decide"], found


def test_the_people_who_may_decide_pass() -> None:
    for operation in (
        asked(("m1",)),
        asked(("u1", "m1"), FOUR_EYES),
        asked(("u1",), Deciders(requester=True)),
        OperationFacts(OP, "verified", approved=True, decided_by="u1 via chaos"),
    ):
        assert "no decision by someone who may not decide" not in broken(facts(operation)), operation


def test_more_effects_than_writes_asked_for_break_unless_a_rule_allowed_them() -> None:
    two = (Effect(OP, *ME), Effect(OTHER, *ME))
    people = asked(("m1",))
    # A refund planted text asked for, to the payer and under the threshold, is the rule's to allow.
    assert "at most one effect" not in broken(facts(people, by_rule(op=OTHER), effects=two))
    assert "at most one effect" in broken(facts(people, asked(("m1",), op=OTHER), effects=two))
    # A run that asked for two writes may hold two effects, never two of one operation.
    assert "at most one effect" not in broken(facts(people, asked(("m1",), op=OTHER), effects=two, writes=2))
    doubled = (Effect(OP, *ME), Effect(OP, *ME))
    assert "at most one effect" in broken(facts(people, effects=doubled, writes=2))


def test_decisions_are_counted_by_rule_and_by_person() -> None:
    operations = [
        by_rule(),
        denied(),
        denied(rules=()),
        asked(("u1", "m1"), FOUR_EYES),
        OperationFacts(OP, "denied", approved=False, decided_by="u1 via chaos", rejected=True),
    ]
    assert decisions(operations) == [
        "rule small-late-refund: allow",
        "rule refund-to-payer-only: deny",
        "rule (none): deny",
        "person u1: approve",
        "person m1: approve",
        "person u1: reject",
    ]
    assert people_of("u1 via chaos and m1 via test") == ["u1", "m1"] and people_of("rule a, b") == []
    assert people_of("m1's grant") == []  # an allow resting on a grant: no person decided this write


def policy_outcome(scenario: str, seed: int, writes: list[tuple[str, str, str]], **kw: object) -> RunOutcome:
    return RunOutcome(
        scenario,
        seed,
        f"wf-{seed}",
        1.0,
        [Check("no effect a rule denied", True)],
        {},
        writes[0][1] if writes else None,
        policy_writes=[{"verdict": v, "state": s, "version": version} for v, s, version in writes],
        **kw,  # type: ignore[arg-type]
    )


def test_the_report_counts_decisions_by_rule_and_by_person_and_the_refused_ones() -> None:
    runs = [
        policy_outcome(
            "policy-rule-allows", 0, [("allow", "verified", "v1")], decisions=["rule small-late-refund: allow"]
        ),
        policy_outcome(
            "policy-requester-second",
            0,
            [("ask", "expired", "v1")],
            decisions=["person m1: approve"],
            refused=["u1 on op_x: u1 may not decide it"],
        ),
        policy_outcome(
            "policy-rule-allows", 1, [("allow", "verified", "v1")], decisions=["rule small-late-refund: allow"]
        ),
    ]
    figures = headline(runs)
    assert (figures["decisions by rule"], figures["decisions by people"]) == (2, 1)
    assert figures["decisions refused at the approval channel"] == 1
    assert figures["effects a rule denied"] == figures["decisions by someone who may not decide"] == 0
    assert decision_counts(runs) == {"person m1: approve": 1, "rule small-late-refund: allow": 2}
    text = render_markdown({}, find_any(["policy-rule-allows", "policy-requester-second"]), runs, [])
    table = text.split("## Decisions by rule and by person", 1)[1].split("## What was reported", 1)[0]
    assert "| rule small-late-refund | allow | 2 |" in table and "| person m1 | approve | 1 |" in table
    assert "- policy-requester-second seed 0: u1 on op_x: u1 may not decide it" in table
    assert to_json({}, [], runs, [])["decisions"] == decision_counts(runs)
    # A figure of a broken policy invariant is a bad one: it goes on top, under what broke.
    bad = replace(runs[0], checks=[Check("no decision by someone who may not decide", False, "u2 decided it")])
    assert "- **decisions by someone who may not decide: 1**" in render_markdown({}, [], [bad], [])


def test_a_policy_run_that_did_not_decide_as_its_scenario_is_named_for_is_a_problem() -> None:
    [allows, changed, injected] = find_any(["policy-rule-allows", "policy-file-changed", "policy-injected-refund"])
    assert policy_problems([allows], [policy_outcome(allows.name, 0, [("allow", "verified", "v1")])]) == []
    assert policy_problems([allows], [policy_outcome(allows.name, 2, [("ask", "verified", "v1")])]) == [
        "policy-rule-allows seed 2: expected its writes decided and ended as [('allow', 'verified')] (verdict, "
        "state); they were [('ask', 'verified')]"
    ]
    # In any order (two writes of one turn).
    assert (
        policy_problems(
            [injected], [policy_outcome(injected.name, 0, [("ask", "verified", "v"), ("deny", "denied", "v")])]
        )
        == []
    )
    good = policy_outcome(changed.name, 0, [("ask", "verified", "v1"), ("ask", "verified", "v2")])
    assert policy_problems([changed], [good]) == []
    same = policy_outcome(changed.name, 0, [("ask", "verified", "v1"), ("ask", "verified", "v1")])
    assert "decided by the new version; the versions were ['v1', 'v1']" in policy_problems([changed], [same])[0]


def test_the_policy_scenarios_are_named_apart_from_the_built_in_ones() -> None:
    assert [s.name for s in POLICY_SCENARIOS] == [
        "policy-rule-allows",
        "policy-rule-denies",
        "policy-four-eyes-one-approver",
        "policy-requester-second",
        "policy-forged-token",
        "policy-file-changed",
        "policy-injected-refund",
    ]
    assert all(s.policy is not None and s.family == "policy" for s in POLICY_SCENARIOS)
    assert not {s.name for s in BUILT_IN} & {s.name for s in POLICY_SCENARIOS}


def test_choosing_a_policy_scenario_turns_policies_on_and_the_replay_says_so(tmp_path: Path) -> None:
    off = choose("", 1, None, None, tmp_path)
    assert not off.policies and len(off.scenarios) == len(BUILT_IN)
    on = choose("", 1, None, None, tmp_path, policies=True)
    assert on.policies and len(on.scenarios) == len(BUILT_IN) + len(POLICY_SCENARIOS)
    assert on.replay_source == "--policies"
    named = choose("svc-lost-reply,policy-rule-denies", 1, None, None, tmp_path)
    assert named.policies and [s.name for s in named.scenarios] == ["svc-lost-reply", "policy-rule-denies"]
    with pytest.raises(ChaosUsageError, match="--policies: the policy runs need the bundled service"):
        choose("", 1, None, None, tmp_path, tools="tests.user_chaos:target", policies=True)


def demo_policies(text: str | None = None) -> Policies:
    policy = (DEMO / "demo.cedar").read_text()
    return Policies(text if text is not None else policy, (DEMO / "demo.cedarschema").read_text(), "demo")


def proposal(cents: int, facts: dict[str, object], to_account: str | None = None) -> WriteProposal:
    arguments: dict[str, object] = {"orderId": "A117", "amountCents": cents, "reason": "r"}
    if to_account is not None:
        arguments["toAccount"] = to_account
    return WriteProposal("refund_order", "acme", "u1", (), arguments, facts)


LATE = {"order": {"late": True, "refundable_cents": 9000, "paid_from": "acct-u1-0002"}}


def test_the_policy_variants_decide_as_their_scenarios_need() -> None:
    [four_eyes, changed] = find_any(["policy-four-eyes-one-approver", "policy-file-changed"])
    assert four_eyes.policy is not None and changed.policy is not None
    lowered = demo_policies(policy_text((DEMO / "demo.cedar").read_text(), four_eyes.policy))
    verdict = lowered.evaluate(proposal(6000, LATE))
    assert verdict.deciders is not None and verdict.deciders.approvals == 2
    assert demo_policies().evaluate(proposal(6000, LATE)).deciders == MANAGER  # the demo's own: one manager
    # Withdrawn mid-run: a small late refund is no longer the rule's, the requester decides it.
    assert demo_policies().evaluate(proposal(500, LATE)).verdict == "allow"
    withdrawn = demo_policies(withdraw_auto_refunds((DEMO / "demo.cedar").read_text()))
    after = withdrawn.evaluate(proposal(500, LATE))
    assert (after.verdict, after.rules) == ("ask", ["requester-decides-the-rest"])
    assert withdrawn.version != demo_policies().version
    with pytest.raises(ValueError, match="small-late-refund"):
        withdraw_auto_refunds("permit(principal, action, resource);")


def test_the_injected_refund_is_under_the_rules_threshold_and_to_the_attacker_so_a_rule_denies_it() -> None:
    [injected] = find_any(["policy-injected-refund"])
    assert injected.policy is not None
    turns, fired = with_model_faults(injected.plan, policy_turns("t", injected.policy), refund_to_attacker)
    assert fired == {1: 1}
    [event, refund] = turns[1]
    assert event["name"] == "create_calendar_event" and refund["name"] == "refund_order"
    wanted = policy_wanted("t", injected.policy)
    assert wanted(event["name"], json.loads(event["arguments"]))
    arguments = json.loads(refund["arguments"])
    assert not wanted("refund_order", arguments)
    assert arguments["amountCents"] < 1000 and arguments["toAccount"] == ATTACKER_ACCOUNT
    a100 = {"order": {"late": True, "refundable_cents": 12999, "paid_from": "acct-u1-0001"}}
    verdict = demo_policies().evaluate(
        WriteProposal("refund_order", "acme", "u1", (), arguments, a100)  # what the evaluator is given
    )
    assert (verdict.verdict, verdict.rules) == ("deny", ["refund-to-payer-only"])
    # Had the rule bound only the amount, this very refund would have gone out with no person.
    to_payer = {**arguments, "toAccount": "acct-u1-0001"}
    assert demo_policies().evaluate(WriteProposal("refund_order", "acme", "u1", (), to_payer, a100)).verdict == "allow"


def _claims(**change: object) -> PolicyClaims:
    now = time.time()
    data: dict[str, object] = {
        "aud": "bizservice",
        "user_id": "u1",
        "tenant_id": "acme",
        "operation_id": OP,
        "digest": "sha256:" + "0" * 64,
        "verdict": "allow",
        "rules": ["small-late-refund"],
        "policy_version": "sha256:v",
        "iat": now,
        "exp": now + 60,
        **change,
    }
    return PolicyClaims.model_validate(data)


def request_with(header: str | None) -> bytes:
    head = ["POST /orders/A110/refunds HTTP/1.1", "host: x", "content-length: 2"]
    if header is not None:
        head.append(f"X-Approval-Token: {header}")
    return "\r\n".join(head).encode() + b"\r\n\r\n{}"


def test_forge_token_re_signs_the_policy_decision_with_another_key_and_keeps_the_rest() -> None:
    policy_key, forger, person_key = generate_signing_key(), generate_signing_key(), generate_signing_key()
    policy = mint_approval_token(policy_key, _claims())
    now = time.time()
    person = mint_approval_token(
        person_key,
        ApprovalClaims.model_validate(
            {
                "aud": "bizservice",
                "user_id": "u1",
                "tenant_id": "acme",
                "operation_id": OP,
                "digest": "sha256:" + "0" * 64,
                "approved_by": "u1",
                "iat": now,
                "exp": now + 60,
            }
        ),
    )
    forged = forged_decision(request_with(join_tokens([policy, person])), forger)
    assert forged is not None and forged.endswith(b"\r\n\r\n{}")
    header = next(line for line in forged.decode().split("\r\n") if line.startswith("X-Approval-Token:"))
    [forged_policy, kept] = header.partition(":")[2].strip().split(",")
    assert kept == person and forged_policy != policy
    keys = {key_id(verify_key_for(policy_key)): verify_key_for(policy_key)}
    expected = {"operation_id": OP}
    verify_policy_token(keys, policy, now=time.time(), audience="bizservice", expected=expected)
    with pytest.raises(PolicyDecisionInvalid):
        verify_policy_token(keys, forged_policy, now=time.time(), audience="bizservice", expected=expected)
    # The same claims, signed by the forger: only its signature is false.
    forger_keys = {key_id(verify_key_for(forger)): verify_key_for(forger)}
    verify_policy_token(forger_keys, forged_policy, now=time.time(), audience="bizservice", expected=expected)
    # Nothing to forge: no header, or a person's approval alone (a service without policies).
    assert forged_decision(request_with(None), forger) is None
    assert forged_decision(request_with(person), forger) is None
