"""Generated cases (Hypothesis): argument validation against the real service app (over ASGI, on a real
SQLite file) never lets an input through that makes the service fail or leak; canonicalisation gives
equivalent payloads one operation id and different ones different ids."""

from __future__ import annotations

import asyncio
import json
import unicodedata
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demo.bizservice.app import create_app
from demo.tools import demo_tools
from toolloop._core.approvals import derive_operation_id
from toolloop._core.contracts import Actor, FunctionCallItem
from toolloop._core.validation import check_call
from toolloop.testing import run_tool

U1 = Actor(user_id="u1", tenant_id="acme")
TOOLS = demo_tools("http://svc")
NAMES = TOOLS.registry.names()
LEAK_MARKERS = ("Traceback", "sqlite", "SELECT", 'File "', ".py", "/tmp", "/work", "bizservice/")
# Each example is a real request to the service app; a few dozen per tool keep the suite quick.
# Derandomized: the same examples every run (the tests' seeds are fixed), so a failure reproduces.
PROFILE = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)


class Recorder(httpx.AsyncBaseTransport):
    """The service app over ASGI, recording every status it answered."""

    def __init__(self, app: Any) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self.statuses: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        self.statuses.append(response.status_code)
        return response


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return create_app(Path(tmp_path_factory.mktemp("props")) / "biz.db", admin_token="t")


def _schema(name: str) -> dict[str, Any]:
    spec = TOOLS.registry.get(name)
    assert spec is not None
    return dict(spec.definition()["parameters"])


_ANYTHING = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10,
)
_HOSTILE = st.sampled_from(
    ["", " ", "\u200b", "\x00", "A100\n", "'; DROP TABLE orders;--", "../../etc/passwd", "9" * 400]
)
# Instants within two days (so a range or an event often has a valid length), with offsets, and broken ones.
_INSTANTS = st.builds(
    lambda minutes, offset: (
        (datetime(2027, 1, 4, tzinfo=UTC) + timedelta(minutes=minutes)).astimezone(offset).isoformat()
    ),
    st.integers(0, 2 * 24 * 60),
    st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))]),
) | st.sampled_from(["2026-12-01T10:00:00", "2026-12-01T10:00:00.5Z", "2026-02-30T10:00:00Z", "now"])
_PLAIN = st.characters(codec="utf-8", categories=("L", "N", "P", "Zs"))


def _value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values for one property of a strict schema (the shapes the tool API writes): mostly what the schema
    allows, its edges, and hostile strings of the right type."""
    if "anyOf" in schema:
        return st.one_of(*(_value(option) for option in schema["anyOf"]))
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "integer":
        low, high = schema.get("minimum", -(2**63)), schema.get("maximum", 2**63)
        return st.integers(low, high) | st.sampled_from([low - 1, high + 1, 0, -1, 2**64])
    if kind == "array":
        return st.lists(_value(schema["items"]), max_size=int(schema.get("maxItems", 5)) + 1)
    if kind == "string":
        if schema.get("format") == "date-time":
            return _INSTANTS
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True) | _HOSTILE
        low, high = int(schema.get("minLength", 0)), int(schema.get("maxLength", 50))
        return st.text(_PLAIN, min_size=low, max_size=min(high, 60)) | st.text(max_size=high + 2) | _HOSTILE
    return _ANYTHING


_RANGES = (("from", "to"), ("start", "end"))


def _instant(minutes: int) -> str:
    return (datetime(2027, 1, 4, tzinfo=UTC) + timedelta(minutes=minutes)).isoformat()


# One valid call per demo tool: the near-valid inputs change one field of it.
VALID: dict[str, dict[str, Any]] = {
    "get_order_status": {"orderId": "A100"},
    "list_my_orders": {"page": 1, "pageSize": 5},
    "get_ticket": {"ticketId": "T1001"},
    "find_free_slots": {"calendarId": "cal-u1", "from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z"},
    "append_ticket_note": {"ticketId": "T1001", "text": "a note", "expectedVersion": 1},
    "create_calendar_event": {
        "calendarId": "cal-u1",
        "title": "review",
        "start": "2027-01-04T10:00:00Z",
        "end": "2027-01-04T11:00:00Z",
        "attendees": ["ana@example.com"],
    },
    "refund_order": {"orderId": "A100", "amountCents": 100, "reason": "damaged"},
}


def _arguments(name: str) -> st.SearchStrategy[Any]:
    """A valid call with one field changed to a schema-shaped value, arguments shaped by the tool's strict
    schema, and arbitrary JSON values the model might send."""
    properties = _schema(name)["properties"]
    near_valid = st.sampled_from(sorted(properties)).flatmap(
        lambda key: _value(properties[key]).map(lambda value: {**VALID[name], key: value})
    )
    shaped = st.fixed_dictionaries({key: _value(prop) for key, prop in properties.items()})
    for first, second in _RANGES:
        if first in properties and second in properties:
            # A range's ends drawn together, so its length is often (not always) one the tool accepts.
            shaped = (
                st.builds(
                    lambda args, at, length, a=first, b=second: {**args, a: _instant(at), b: _instant(at + length)},
                    shaped,
                    st.integers(0, 24 * 60),
                    st.integers(-60, 15 * 24 * 60),
                )
                | shaped
            )
    return near_valid | shaped | st.dictionaries(st.sampled_from([*properties, "userId", "tenant"]), _ANYTHING)


async def _run(app: Any, name: str, arguments: Any) -> tuple[dict[str, Any], list[int]]:
    transport = Recorder(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
        text = json.dumps(arguments)
        try:
            output = await run_tool(TOOLS, name, text, actor=U1, http=http, operation_id="op_" + "0" * 32)
        except Exception as exc:  # a temporary failure or an unclear write outcome: what the loop retries
            output = {"raised": type(exc).__name__, "message": str(exc)}
    return output, transport.statuses


@pytest.mark.parametrize("name", NAMES)
def test_no_input_that_passes_validation_makes_the_service_fail_or_leak(app: Any, name: str) -> None:
    reached: list[bool] = []

    @PROFILE
    @given(arguments=_arguments(name))
    def check(arguments: Any) -> None:
        checked = check_call(TOOLS.registry, FunctionCallItem(call_id="c", name=name, arguments=json.dumps(arguments)))
        output, statuses = asyncio.run(_run(app, name, arguments))
        if checked.rejection is not None:
            # Rejected by validation: nothing reached the service, and the model reads why.
            assert statuses == [] and output["code"] in ("BAD_ARGUMENTS", "BAD_JSON"), output
        # Whatever passed, the service answered it without failing, and nothing leaks into the output.
        assert all(status < 500 for status in statuses), (statuses, output)
        assert "raised" not in output, output
        text = json.dumps(output)
        assert not [marker for marker in LEAK_MARKERS if marker in text], output
        reached.append(bool(statuses))

    check()
    # Not vacuous: some generated inputs passed validation and were answered by the service.
    assert any(reached) and not all(reached)


# --- Canonicalisation ---------------------------------------------------------------------------------------

_titles = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=30)
_emails = st.lists(st.from_regex(r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", fullmatch=True), max_size=5)
_offsets = st.integers(min_value=-12 * 60, max_value=14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
_starts = st.datetimes(min_value=datetime(2027, 1, 1), max_value=datetime(2030, 1, 1)).map(
    lambda d: d.replace(microsecond=0, tzinfo=UTC)
)


def _event(title: str, start: datetime, minutes: int, attendees: list[str], offset: timezone) -> dict[str, Any]:
    return {
        "calendarId": "cal-u1",
        "title": title,
        "start": start.astimezone(offset).isoformat(),
        "end": (start + timedelta(minutes=minutes)).astimezone(offset).isoformat(),
        "attendees": attendees,
    }


def _operation_id(arguments: dict[str, Any]) -> str | None:
    checked = check_call(
        TOOLS.registry, FunctionCallItem(call_id="c", name="create_calendar_event", arguments=json.dumps(arguments))
    )
    if checked.arguments is None:
        return None
    return derive_operation_id("wf-props", "create_calendar_event", checked.arguments)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    title=_titles,
    start=_starts,
    minutes=st.integers(min_value=15, max_value=8 * 60),
    attendees=_emails,
    offsets=st.tuples(_offsets, _offsets),
    order=st.randoms(use_true_random=False),
)
def test_equivalent_payloads_have_one_operation_id(
    title: str, start: datetime, minutes: int, attendees: list[str], offsets: tuple[timezone, timezone], order: Any
) -> None:
    first = _operation_id(_event(unicodedata.normalize("NFC", title), start, minutes, attendees, offsets[0]))
    shuffled = attendees + attendees[:1]
    order.shuffle(shuffled)
    # The same intended event: another UTC offset, the attendees in another order and repeated, NFD text.
    second = _operation_id(_event(unicodedata.normalize("NFD", title), start, minutes, shuffled, offsets[1]))
    assert first == second
    if first is not None:
        assert first.startswith("op_")


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    a=st.tuples(_titles, _starts, st.integers(min_value=15, max_value=480), _emails),
    b=st.tuples(_titles, _starts, st.integers(min_value=15, max_value=480), _emails),
)
def test_different_payloads_never_share_an_operation_id(
    a: tuple[str, datetime, int, list[str]], b: tuple[str, datetime, int, list[str]]
) -> None:
    ids = [_operation_id(_event(*payload, UTC)) for payload in (a, b)]
    canonical = [
        (unicodedata.normalize("NFC", t).strip(), s, m, sorted(set(e))) for t, s, m, e in (a, b)
    ]  # what the canonical form keeps
    if None in ids or canonical[0] == canonical[1]:
        return
    assert ids[0] != ids[1]
