"""Activities (I/O): the floor's model and business calls - plain httpx calls to the same endpoints with the
same headers toolloop's tools send, answers passed on as text."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from temporalio import activity

from bench.floor_types import FloorCall, FloorReadBack, FloorTurn, FloorWrite, Plan
from bench.scenarios import (
    ANSWER,
    CALENDAR,
    REPORT_TOOL,
    WRITE_TOOL,
    calls_for_turn,
    report_output,
    scenario_of,
    write_body,
)

ACTOR_HEADERS = {"X-Actor-User": "u1", "X-Actor-Tenant": "acme"}


class FloorActivities:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    @activity.defn(name="floor_model")
    async def model(self, turn: FloorTurn) -> Plan:
        calls = calls_for_turn(scenario_of(turn.request), turn.turn)
        if calls is None:
            return Plan(answer=ANSWER)
        return Plan(calls=[FloorCall(c.name, c.arguments, c.call_id, write=c.name == WRITE_TOOL) for c in calls])

    @activity.defn(name="floor_read")
    async def read(self, call: FloorCall) -> str:
        if call.name == REPORT_TOOL:
            return json.dumps(report_output(call.arguments["reportId"], call.arguments["size"]))
        response = await self._http.get(f"/orders/{call.arguments['orderId']}", headers=ACTOR_HEADERS)
        response.raise_for_status()
        return response.text

    @activity.defn(name="floor_write")
    async def write(self, inp: FloorWrite) -> str:
        headers = {**ACTOR_HEADERS, "Idempotency-Key": inp.key, "X-Approval-Token": inp.token}
        response = await self._http.post(
            f"/calendars/{CALENDAR}/events", json=write_body(inp.arguments), headers=headers
        )
        response.raise_for_status()
        event_id: str = response.json()["event_id"]
        return event_id

    @activity.defn(name="floor_read_back")
    async def read_back(self, inp: FloorReadBack) -> str:
        response = await self._http.get(f"/calendars/{CALENDAR}/events/{inp.event_id}", headers=ACTOR_HEADERS)
        response.raise_for_status()
        return response.text

    def all(self) -> list[Callable[..., Any]]:
        return [self.model, self.read, self.write, self.read_back]
