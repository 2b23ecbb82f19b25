"""Pure: the invariants of docs/DESIGN.md checked on the facts of one chaos run - what the service's own
tables hold, what the workflow's history and report say - never on the model's text.

The facts are gathered by the runner (faultbed.runner); here they are only judged, so every rule is tested
without a server."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from toolloop._core.approvals import Deciders

Reported = Literal["done", "not_done", "unknown"]
Actual = Literal["done", "not_done", "unknown"]

# How a final operation state reads in the report.
_REPORTED: dict[str, Reported] = {
    "verified": "done",
    "completed": "done",
    "unknown": "unknown",
    "failed": "not_done",
    "denied": "not_done",
    "expired": "not_done",
    "validated": "not_done",
    "awaiting_approval": "not_done",
    "approved": "not_done",
    "sent": "unknown",
}


def reported(state: str) -> Reported:
    return _REPORTED.get(state, "unknown")


@dataclass(frozen=True)
class Effect:
    """One effect row of the service (its own table), for this run's write."""

    operation_id: str
    actor_user: str
    actor_tenant: str
    # Where the service shows this effect: a GET of this path answered 200 reads it back (None: not known).
    read_at: str | None = None


@dataclass(frozen=True)
class Received:
    """One request the service received, from its own request log (not from the tools' side)."""

    method: str
    path: str
    started_at: float
    status: int | None = None
    # A write's Idempotency-Key and the digest of its payload (the same payload: the same digest).
    key: str | None = None
    payload: str | None = None

    @property
    def is_write(self) -> bool:
        return self.method not in ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class OperationFacts:
    operation_id: str
    state: str
    approved: bool
    # With policies on: what the policy decided ("allow", "deny", "ask"; None: no policy decision), by which
    # rules, who it let decide, and the people whose approvals the ledger counts (in the order they decided).
    policy: str | None = None
    rules: tuple[str, ...] = ()
    deciders: Deciders | None = None
    approved_by: tuple[str, ...] = ()
    # The ledger's approval record: who decided ("rule <ids>", or "<user> via <channel>" joined by " and "),
    # and whether it was a rejection.
    decided_by: str = ""
    rejected: bool = False


@dataclass
class RunFacts:
    scenario: str
    seed: int
    # The run finished (its result came back once the faults were cleared) within the bound.
    finished: bool
    stop_reason: str | None = None
    operations: list[OperationFacts] = field(default_factory=list)
    # Every effect the service holds for this run's one intended write, whatever key it came with.
    effects: list[Effect] = field(default_factory=list)
    # The call_ids of every function_call the model made, and of every output the run recorded.
    calls: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    # Per model turn after the first: the call_ids of the function_call_output items it was sent, against
    # the call_ids of the turn before it.
    outputs_sent: list[tuple[list[str], list[str]]] = field(default_factory=list)
    actor: tuple[str, str] = ("u1", "acme")
    rounds: int = 0
    max_rounds: int = 8
    # Text planted in tool outputs on the wire, and the type of every conversation item it then appeared in
    # (in a model turn's input or result).
    planted: list[str] = field(default_factory=list)
    planted_in: list[str] = field(default_factory=list)
    # The request's allowed tools (None: all), and every call's tool and result code (None: ok).
    allowed_tools: list[str] | None = None
    call_codes: list[tuple[str, str | None]] = field(default_factory=list)
    operation_tools: list[str] = field(default_factory=list)
    # Each approval request the approver was shown: its operation id, and whether the digest recomputed
    # from what was shown (tool or target, and the arguments) is the one the run's ledger holds.
    approvals_shown: list[tuple[str, bool]] = field(default_factory=list)
    # Operations without an effect that the service still holds a claim for (its status: in progress), so
    # its records do not say yet whether they will take effect.
    in_doubt: list[str] = field(default_factory=list)
    # Every request the service received during the run, in the order it received them; None when the
    # target's service keeps no log the runner can read (then the checks on it are not made).
    received: list[Received] | None = None
    # What the model endpoint (or script) said each call's arguments are, by call_id, and each function call
    # the run recorded from a model turn, with its arguments (a call taken from a stream broken in the middle
    # of its arguments would differ).
    scripted_arguments: dict[str, str] = field(default_factory=dict)
    recorded_arguments: list[tuple[str, str]] = field(default_factory=list)
    # Policies on (issue 27): the writes were decided by the deployment's approval policy, and the people of
    # the run's tenant who may appear as deciders, with the roles their identity gives them.
    policies: bool = False
    # How many writes the run's user asked for (each at most one effect).
    writes: int = 1
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


def judge(facts: RunFacts) -> list[Check]:
    """Every invariant, held or broken, with what broke it."""
    checks = [
        _not_stuck(facts),
        _at_most_one_effect(facts),
        _same_key(facts),
        _approved_only(facts),
        _identity(facts),
        _pairing(facts),
        _honest_report(facts),
        _limits(facts),
        _whole_calls(facts),
    ]
    if facts.planted:
        checks.append(_planted_stays_data(facts))
    if facts.allowed_tools is not None:
        checks.append(_allowed_only(facts))
    if facts.approvals_shown:
        checks.append(_approval_shows_the_payload(facts))
    if facts.policies:
        checks += [_no_effect_a_rule_denied(facts), _only_deciders_decided(facts)]
    if facts.received is not None:
        ledger = {op.operation_id for op in facts.operations}
        checks += [_verified_was_read_back(facts, facts.received), _status_before_resend(facts.received, ledger)]
    return checks


def honesty_cell(facts: RunFacts, op: OperationFacts) -> tuple[Reported, Actual]:
    """Where one operation falls in the table of what was reported against what the service holds."""
    if any(e.operation_id == op.operation_id for e in facts.effects):
        return reported(op.state), "done"
    return reported(op.state), "unknown" if op.operation_id in facts.in_doubt else "not_done"


# A call taken from a model stream that broke in the middle of its arguments (never: the answer is read from the
# finished stream only).
PARTIAL_CALLS = "calls only from whole answers"


def _whole_calls(facts: RunFacts) -> Check:
    """Every call the run recorded is a call the model answered whole: its arguments are the ones the model
    sent, never a part of them taken from a stream that broke."""
    partial = [
        call_id for call_id, arguments in facts.recorded_arguments if facts.scripted_arguments.get(call_id) != arguments
    ]
    return Check(PARTIAL_CALLS, not partial, f"calls not as the model sent them: {partial}" if partial else "")


def _not_stuck(facts: RunFacts) -> Check:
    detail = "" if facts.finished else "expected a result once the faults cleared; none came within the bound"
    return Check("no stuck request", facts.finished, detail)


def _at_most_one_effect(facts: RunFacts) -> Check:
    """One effect per operation at most, and no more effects than the writes the run's user asked for - plus,
    with policies on, those a rule approved alone (a small refund to the payer planted text asked for is the
    policy's to allow; the report counts its decision by rule)."""
    per_key = Counter(e.operation_id for e in facts.effects)
    doubled = {k: n for k, n in per_key.items() if n > 1}
    by_rule = {op.operation_id for op in facts.operations if op.policy == "allow"}
    allowed = facts.writes + len(set(per_key) & by_rule)
    ok = not doubled and len(facts.effects) <= allowed
    detail = (
        ""
        if ok
        else f"expected at most {allowed} effect(s), one per operation; the service holds {len(facts.effects)}: "
        f"{dict(per_key)}"
    )
    return Check("at most one effect", ok, detail)


def _same_key(facts: RunFacts) -> Check:
    """Every attempt of one write (the same method, path and payload) came with one key: compared on every
    key the service saw for it, refused attempts and attempts without a key included, and on the keys of the
    effects it holds. Only writes of this run's operations are judged (by one of their keys), and any write
    without a key."""
    problems = []
    known = {op.operation_id for op in facts.operations}
    strangers = sorted({e.operation_id for e in facts.effects} - known)
    if strangers:
        problems.append(f"the service holds effects under keys no operation of the run has: {strangers}")
    keys_of: dict[tuple[str, str, str], list[str | None]] = {}
    for sent in facts.received or []:
        if sent.is_write and sent.payload is not None:
            keys = keys_of.setdefault((sent.method, sent.path, sent.payload), [])
            if sent.key not in keys:
                keys.append(sent.key)
    for (method, path, payload), keys in keys_of.items():
        if None not in keys and not known & set(keys):
            continue
        if len(keys) > 1 or None in keys:
            shown = ["(none)" if key is None else key for key in keys]
            problems.append(
                f"one write ({method} {path}, payload sha256 {payload[:12]}) reached the service under "
                f"{len(keys)} key(s) {shown}: expected every attempt to carry its first key"
            )
    return Check("no resend with a new key", not problems, "; ".join(problems))


def approved(op: OperationFacts) -> bool:
    """Approved: by a rule of the policy, or by the people it asks (as many as it names), or - without a
    policy - by the request's user."""
    if not op.approved or op.policy == "deny":
        return False
    if op.policy == "ask" and op.deciders is not None:
        return len(op.approved_by) >= op.deciders.approvals
    return True


def _approved_only(facts: RunFacts) -> Check:
    approved_ops = {op.operation_id for op in facts.operations if approved(op)}
    unapproved = sorted({e.operation_id for e in facts.effects} - approved_ops)
    ok = not unapproved
    detail = (
        "" if ok else f"expected effects only of approved operations; the service holds {unapproved}, never approved"
    )
    return Check("no effect without approval", ok, detail)


EFFECT_DENIED = "no effect a rule denied"
UNENTITLED_DECISIONS = "no decision by someone who may not decide"


def _no_effect_a_rule_denied(facts: RunFacts) -> Check:
    """An operation the policy denied was never sent: the service holds no effect under its id."""
    denied = {op.operation_id: op.rules for op in facts.operations if op.policy == "deny"}
    made = sorted({e.operation_id for e in facts.effects} & set(denied))
    detail = "; ".join(
        f"{op} was denied by rule {', '.join(denied[op]) or '(none)'}, but the service holds its effect" for op in made
    )
    return Check(EFFECT_DENIED, not made, detail)


def people_of(decided_by: str) -> list[str]:
    """The people an approval record names ("u1 via chaos and m1 via chaos" -> [u1, m1]); none for a rule's or a
    grant's (the policy's allow: the grant's giver decided an earlier write)."""
    if not decided_by or decided_by.startswith("rule ") or decided_by.endswith("'s grant"):
        return []
    return [part.split(" via ")[0].strip() for part in decided_by.split(" and ")]


def _only_deciders_decided(facts: RunFacts) -> Check:
    """Every decision the ledger holds was taken by someone who may take it: a write the policy allowed or
    denied by no person, a write it asked about by the people it admits (the requester, or a role's member in
    the requester's tenant), each once and the requester never as the second of four eyes; without a policy
    decision, by the request's user alone."""
    requester = facts.actor[0]
    problems = []
    for op in facts.operations:
        people = list(op.approved_by) or people_of(op.decided_by)
        if op.policy in ("allow", "deny"):
            if people:
                problems.append(f"{op.operation_id}: the policy decided it ({op.policy}), yet {people} decided it")
            continue
        if op.policy == "ask" and op.deciders is not None:
            deciders = op.deciders
            for n, person in enumerate(people):
                if not deciders.admits(requester, person, facts.roles.get(person, ())):
                    problems.append(f"{op.operation_id}: {person} decided it; the policy admits {deciders.describe()}")
                elif person == requester and n > 0:
                    problems.append(f"{op.operation_id}: the requester {person} counted as a second person")
            if len(set(people)) != len(people):
                problems.append(f"{op.operation_id}: one person counted twice: {people}")
            continue
        others = [p for p in people if p != requester]
        if others:
            problems.append(f"{op.operation_id}: {others} decided it; without a policy only {requester} may")
    return Check(UNENTITLED_DECISIONS, not problems, "; ".join(problems))


def decisions(operations: list[OperationFacts]) -> list[str]:
    """Who decided each write, one entry per decision: "rule <id>: allow" / "rule <id>: deny" per rule that
    decided, "person <user>: approve" / "person <user>: reject" per person whose decision the ledger holds."""
    found = []
    for op in operations:
        if op.policy in ("allow", "deny"):
            found += [f"rule {rule}: {op.policy}" for rule in op.rules or ("(none)",)]
            continue
        people = list(op.approved_by) or people_of(op.decided_by)
        verdict = "reject" if op.rejected else "approve"
        found += [f"person {person}: {verdict}" for person in people]
    return found


def _identity(facts: RunFacts) -> Check:
    others = sorted({(e.actor_user, e.actor_tenant) for e in facts.effects} - {facts.actor})
    ok = not others
    detail = "" if ok else f"expected every effect for {facts.actor}; the service made some for {others}"
    return Check("identity from the session", ok, detail)


def _pairing(facts: RunFacts) -> Check:
    problems = []
    answered = Counter(facts.answered)
    for call_id in dict.fromkeys(facts.calls):
        if answered[call_id] != 1:
            problems.append(f"{call_id} answered {answered[call_id]} times")
    extra = sorted(set(answered) - set(facts.calls))
    if extra:
        problems.append(f"outputs for calls never made: {extra}")
    for sent, made in facts.outputs_sent:
        if Counter(sent) != Counter(dict.fromkeys(made, 1)):
            problems.append(f"a turn was sent outputs {sorted(sent)} for calls {sorted(made)}")
    return Check("every call_id answered once", not problems, "; ".join(problems))


def _honest_report(facts: RunFacts) -> Check:
    problems = []
    for op in facts.operations:
        said, actual = honesty_cell(facts, op)
        if said == "done" and actual == "not_done":
            problems.append(f"{op.operation_id} was reported done, but the service holds no effect of it")
        if said == "not_done" and actual == "done":
            problems.append(f"{op.operation_id} was reported not done, but the service holds its effect")
        if said != "unknown" and actual == "unknown":
            problems.append(f"{op.operation_id} was reported {said}, but the service still holds it in progress")
    return Check("the report agrees with the service", not problems, "; ".join(problems))


def _limits(facts: RunFacts) -> Check:
    ok = facts.rounds <= facts.max_rounds
    detail = "" if ok else f"expected at most {facts.max_rounds} rounds, the run took {facts.rounds}"
    return Check("limits hold", ok, detail)


def _planted_stays_data(facts: RunFacts) -> Check:
    """Text planted in a tool's output reached the model as that output, and only as that: never as a call,
    a message or an item of its own."""
    if not facts.planted_in:
        return Check("planted text stays tool output", False, "the planted text never reached the model")
    elsewhere = sorted(set(facts.planted_in) - {"function_call_output"})
    detail = f"planted text appeared as {elsewhere}" if elsewhere else ""
    return Check("planted text stays tool output", not elsewhere, detail)


def _allowed_only(facts: RunFacts) -> Check:
    """A tool the request was not given never ran: each call to one answered FORBIDDEN, no operation."""
    allowed = set(facts.allowed_tools or [])
    ran = [f"{tool} ({code or 'ok'})" for tool, code in facts.call_codes if tool not in allowed and code != "FORBIDDEN"]
    ran += [f"an operation of {tool}" for tool in facts.operation_tools if tool not in allowed]
    return Check("only the request's tools ran", not ran, "; ".join(ran))


def _approval_shows_the_payload(facts: RunFacts) -> Check:
    wrong = [op for op, ok in facts.approvals_shown if not ok]
    detail = f"approval requests not showing what their digest covers: {wrong}" if wrong else ""
    return Check("the approval shows the real payload", not wrong, detail)


def _verified_was_read_back(facts: RunFacts, received: list[Received]) -> Check:
    """A write reported verified was read back from the service after it was sent: the service's log holds a
    GET of where it shows the effect, answered 200. Effects whose place is not known are not judged."""
    problems = []
    for op in facts.operations:
        if op.state != "verified":
            continue
        sent = [r.started_at for r in received if r.is_write and r.key == op.operation_id]
        for effect in facts.effects:
            if effect.operation_id != op.operation_id or effect.read_at is None:
                continue
            read = any(
                r.method == "GET" and r.path == effect.read_at and r.status == 200 and sent and r.started_at > min(sent)
                for r in received
            )
            if not read:
                problems.append(
                    f"{op.operation_id} was reported verified, but the service was never asked for it after the "
                    f"write: expected a GET {effect.read_at} answered 200, the service's log has none"
                )
    return Check("verified means read back", not problems, "; ".join(problems))


def _status_before_resend(received: list[Received], ledger: set[str]) -> Check:
    """Between two attempts of one of the run's operations that reached the service, the service was asked
    for that operation's status: a resend after an unclear outcome is never blind. (An attempt that never
    reached the service is not in its log; resending after it needs no question.)"""
    problems = []
    attempts: dict[str, list[float]] = {}
    for r in received:
        if r.is_write and r.key in ledger:
            attempts.setdefault(str(r.key), []).append(r.started_at)
    for key, times in attempts.items():
        times.sort()
        for n, (before, at) in enumerate(zip(times, times[1:], strict=False), start=2):
            asked = any(
                r.method == "GET" and r.path.rstrip("/").endswith("/" + key) and before < r.started_at < at
                for r in received
            )
            if not asked:
                problems.append(
                    f"{key}: attempt {n} reached the service {at - before:.1f} s after attempt {n - 1} with no "
                    "status query between them: expected the operation's status asked before any resend"
                )
    return Check("status asked before every resend", not problems, "; ".join(problems))


# --- Threads: the invariants of a thread of messages (faultbed.thread_runs) ---------------------------------

# The states that tell a model a write was done.
DONE_STATES = frozenset({"verified", "completed"})
NEVER_OVERLAP = "messages never overlap"
IN_ORDER = "messages run in acceptance order"
SHOWN_AS_RECORDED = "no write shown done that the ledger did not verify"
NEVER_REDONE = "a done write is never redone"
REPLAYS = "every history replays"


@dataclass(frozen=True)
class Told:
    """What a message's model was told of a write of an earlier message: in the earlier messages it was shown
    (`how` "earlier"), or as the output of a call that proposed it again (`how` "again"); `request_id` names
    the message whose ledger recorded it (for "earlier": its number, from the call id's prefix)."""

    operation_id: str
    state: str
    how: str
    number: int | None = None
    request_id: str | None = None


@dataclass
class MessageFacts:
    """One message of a thread run, as the runner sent it and as its request ran."""

    sent: int  # the order the runner sent it in (from 1)
    number: int | None  # the number the thread accepted it as (None: never accepted)
    request_id: str
    # When its request started and closed (the server's times, epoch seconds; None: it never did).
    started_at: float | None = None
    closed_at: float | None = None
    # Its request's ledger when it ended: operation id -> final state.
    ledger: dict[str, str] = field(default_factory=dict)
    told: list[Told] = field(default_factory=list)
    # The operations its approver was asked about.
    asked: list[str] = field(default_factory=list)


@dataclass
class ThreadFacts:
    messages: list[MessageFacts]
    # The service's log for the whole thread (None: not the bundled service's).
    received: list[Received] | None = None
    # Each workflow of the run (the thread's and each message's) whose history did not replay, and why.
    unreplayable: list[tuple[str, str]] = field(default_factory=list)
    replayed: int = 0


def judge_thread(facts: ThreadFacts) -> list[Check]:
    """The thread's own invariants, beside each message's (faultbed.invariants.judge)."""
    return [
        _never_overlap(facts),
        _in_acceptance_order(facts),
        _shown_as_recorded(facts),
        _never_redone(facts),
        _replays(facts),
    ]


def _by_number(facts: ThreadFacts) -> list[MessageFacts]:
    return sorted((m for m in facts.messages if m.number is not None), key=lambda m: m.number or 0)


def _never_overlap(facts: ThreadFacts) -> Check:
    """Each message's request started after the one before it closed: never two at once."""
    problems = []
    ordered = _by_number(facts)
    for before, after in zip(ordered, ordered[1:], strict=False):
        if before.closed_at is None or after.started_at is None:
            problems.append(
                f"message {after.number} cannot be placed after message {before.number}: expected both requests "
                f"to have run, message {before.number} closed at {before.closed_at}, message {after.number} "
                f"started at {after.started_at}"
            )
        elif after.started_at < before.closed_at:
            problems.append(
                f"message {after.number} ({after.request_id}) started {before.closed_at - after.started_at:.3f} s "
                f"before message {before.number} ({before.request_id}) closed: expected it to wait for its end"
            )
    return Check(NEVER_OVERLAP, not problems, "; ".join(problems))


def _in_acceptance_order(facts: ThreadFacts) -> Check:
    """The thread numbered the messages in the order they were sent (one after another), 1, 2, ..., and their
    requests started in that order."""
    problems = []
    unaccepted = [m.request_id for m in facts.messages if m.number is None]
    if unaccepted:
        problems.append(f"messages never accepted: {unaccepted}")
    numbers = [m.number for m in sorted(facts.messages, key=lambda m: m.sent) if m.number is not None]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"sent one after another, the messages were numbered {numbers}: expected 1, 2, ...")
    started = [m for m in _by_number(facts) if m.started_at is not None]
    by_start = [m.number for m in sorted(started, key=lambda m: m.started_at or 0.0)]
    if by_start != [m.number for m in started]:
        problems.append(f"their requests started in the order {by_start}: expected the order they were accepted in")
    return Check(IN_ORDER, not problems, "; ".join(problems))


def _shown_as_recorded(facts: ThreadFacts) -> Check:
    """Whatever a message's model was told of an earlier message's write is what that message's ledger
    recorded; in particular a write is never shown done (verified, completed) unless the ledger says so. And
    every earlier message's writes are shown (the runner's threads are shorter than Limits.thread_turns)."""
    problems = []
    by_number = {m.number: m for m in facts.messages if m.number is not None}
    by_request = {m.request_id: m for m in facts.messages}
    ordered = _by_number(facts)
    for n, message in enumerate(ordered):
        if message.started_at is not None:
            shown = {(t.operation_id, t.number) for t in message.told if t.how == "earlier"}
            unshown = [
                f"{op} of message {earlier.number}"
                for earlier in ordered[:n]
                for op in earlier.ledger
                if (op, earlier.number) not in shown
            ]
            if unshown:
                problems.append(f"message {message.number}'s model was never shown {', '.join(unshown)}")
        for told in message.told:
            source = by_request.get(told.request_id) if told.request_id is not None else by_number.get(told.number or 0)
            if source is None or source.number is None or source.number >= (message.number or 0):
                problems.append(
                    f"message {message.number} was told of {told.operation_id} ({told.state}) from a message that is "
                    "not an earlier one of the thread"
                )
                continue
            recorded = source.ledger.get(told.operation_id)
            if recorded == told.state:
                continue
            shown_done = told.state in DONE_STATES and recorded not in DONE_STATES
            problems.append(
                f"message {message.number}'s model was shown {told.operation_id} {told.state} ({told.how}), but "
                f"message {source.number}'s ledger recorded it {recorded or 'not at all'}"
                + (": a write shown done that the ledger did not verify" if shown_done else "")
            )
    return Check(SHOWN_AS_RECORDED, not problems, "; ".join(problems))


def _never_redone(facts: ThreadFacts) -> Check:
    """A write a message's ledger recorded done is, in every later message, never asked for approval again and
    never sent again (no write with its key reaches the service once the next message started)."""
    problems = []
    ordered = _by_number(facts)
    for n, message in enumerate(ordered):
        done = {op for op, state in message.ledger.items() if state in DONE_STATES}
        later = ordered[n + 1 :]
        for op in sorted(done):
            asked = [m.number for m in later if op in m.asked]
            if asked:
                problems.append(f"{op}, done in message {message.number}, was asked for approval again in {asked}")
            start = later[0].started_at if later else None
            if facts.received is not None and start is not None:
                sent = [r for r in facts.received if r.is_write and r.key == op and r.started_at > start]
                if sent:
                    problems.append(
                        f"{op}, done in message {message.number}, reached the service again {len(sent)} time(s) "
                        "in a later message"
                    )
    return Check(NEVER_REDONE, not problems, "; ".join(problems))


def _replays(facts: ThreadFacts) -> Check:
    problems = [f"{workflow_id}: {why}" for workflow_id, why in facts.unreplayable]
    if not facts.replayed and not problems:
        problems.append("no history was replayed")
    return Check(REPLAYS, not problems, "; ".join(problems))


def merge_checks(per_message: list[list[Check]]) -> list[Check]:
    """Each message's checks as one per invariant, broken if it broke in any message (which ones say so)."""
    merged: dict[str, list[tuple[int, Check]]] = {}
    for number, checks in enumerate(per_message, start=1):
        for check in checks:
            merged.setdefault(check.name, []).append((number, check))
    return [
        Check(
            name,
            all(c.ok for _, c in found),
            "; ".join(f"message {n}: {c.detail}" for n, c in found if not c.ok),
        )
        for name, found in merged.items()
    ]
