"""Pure: the benchmark's requests - which calls each round makes - shared by the three stacks, so toolloop,
the hand-written floor and the plain asyncio loop make exactly the same business calls.

A request is `reads` parallel reads in each of `rounds` rounds, then optionally one approved write (an
event in u1's calendar, read back by GET) - in a model turn of its own, or (`write_in_round`) in the last round's
turn after its reads - then the final answer. `output_bytes` > 0 makes the reads
return that much text each (the growth measurement) instead of calling the service."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# u1's orders in the demo service's seed data (A101 is u2's).
U1_ORDERS = ["A100", *(f"A{n}" for n in range(102, 126))]
CALENDAR = "cal-u1"
WRITE_TOOL = "create_calendar_event"
READ_TOOL = "get_order_status"
REPORT_TOOL = "read_report"
ANSWER = "Done: every order is accounted for."
_PREFIX = "bench "


@dataclass(frozen=True)
class Scenario:
    reads: int = 3
    write: bool = False
    rounds: int = 1
    output_bytes: int = 0
    # Makes each request's write a distinct event (and its operation id distinct).
    tag: str = ""
    # The write in the same model turn as the last round's reads (after them, as a side effect is a barrier),
    # not in a turn of its own: the request is then a reads-only request's turns plus the write.
    write_in_round: bool = False

    def request_text(self) -> str:
        fields = asdict(self)
        if not self.write_in_round:
            del fields["write_in_round"]  # the other phases' requests keep their text (and history size)
        return _PREFIX + json.dumps(fields, sort_keys=True)

    @property
    def model_turns(self) -> int:
        return self.rounds + (1 if self.write and not self.write_in_round else 0) + 1

    @property
    def calls(self) -> int:
        """The calls the model makes in the whole request; each must be answered once."""
        return self.reads * self.rounds + (1 if self.write else 0)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    call_id: str


def scenario_of(request: str) -> Scenario:
    if not request.startswith(_PREFIX):
        raise ValueError("not a benchmark request")
    return Scenario(**json.loads(request[len(_PREFIX) :]))


def write_arguments(scenario: Scenario) -> dict[str, Any]:
    return {
        "calendarId": CALENDAR,
        "title": f"bench {scenario.tag or 'event'}",
        "start": "2027-01-04T10:00:00Z",
        "end": "2027-01-04T11:00:00Z",
        "attendees": None,
    }


def write_body(arguments: dict[str, Any]) -> dict[str, Any]:
    """The body of the write's POST for these arguments, as toolloop's contract sends it (no attendees: [])."""
    return {**arguments, "attendees": arguments.get("attendees") or []}


def calls_for_turn(scenario: Scenario, turn: int) -> list[Call] | None:
    """The calls the model makes on its `turn`-th call (from 1); None: it answers."""
    if turn <= scenario.rounds:
        if scenario.output_bytes:
            reads = [
                Call(REPORT_TOOL, {"reportId": f"R{turn}-{i}", "size": scenario.output_bytes}, f"c{turn}-{i}")
                for i in range(scenario.reads)
            ]
        else:
            reads = [
                Call(READ_TOOL, {"orderId": U1_ORDERS[i % len(U1_ORDERS)]}, f"c{turn}-{i}")
                for i in range(scenario.reads)
            ]
        if scenario.write and scenario.write_in_round and turn == scenario.rounds:
            reads.append(Call(WRITE_TOOL, write_arguments(scenario), f"c{turn}-w"))
        return reads
    if scenario.write and not scenario.write_in_round and turn == scenario.rounds + 1:
        return [Call(WRITE_TOOL, write_arguments(scenario), f"c{turn}-w")]
    return None


def write_call(scenario: Scenario) -> Call:
    """The request's write (it must have one)."""
    turn = 0
    while (calls := calls_for_turn(scenario, turn := turn + 1)) is not None:
        for call in calls:
            if call.name == WRITE_TOOL:
                return call
    raise ValueError("this request makes no write")


def report_text(report_id: str, size: int) -> str:
    """A deterministic text of `size` characters (what a report tool returns)."""
    line = f"{report_id}: the quarterly figures, line by line. "
    return (line * (size // len(line) + 1))[:size]


def report_output(report_id: str, size: int) -> dict[str, Any]:
    """What the report tool returns (the same in every stack)."""
    return {"report_id": report_id, "text": report_text(report_id, size)}


def content_bytes(scenario: Scenario) -> int:
    """What one request produces, in bytes of compact JSON: every call the model makes (name, call id,
    arguments), its answer, and every tool output. The least any durable record of the request must hold;
    only defined for report reads (an order's size is the service's)."""
    if not scenario.output_bytes:
        raise ValueError("content is only defined for report reads (output_bytes > 0)")
    total = len(ANSWER.encode())
    turn = 0
    while (calls := calls_for_turn(scenario, turn := turn + 1)) is not None:
        for call in calls:
            total += len(_compact({"name": call.name, "call_id": call.call_id, "arguments": call.arguments}))
            if call.name == REPORT_TOOL:
                total += len(_compact(report_output(call.arguments["reportId"], call.arguments["size"])))
    return total


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
