"""I/O: toolloop's side of the benchmark, on the public API only - the demo service's tools plus a local
report tool (the growth measurement's large outputs), and a model that plays the benchmark's requests
from the conversation it is given, the way a real model would (nothing of it is in the request's input).

    python worker.py --tools bench.agent:build
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, Field

import toolloop
from bench.scenarios import ANSWER, REPORT_TOOL, calls_for_turn, report_text, scenario_of
from demo.tools import demo_tools

BENCH_MODEL = "bench"


class ReadReportArgs(toolloop.Arguments):
    report_id: str = Field(alias="reportId", pattern=r"^R[0-9-]{1,20}$", description="Report id, e.g. R1-0.")
    size: int = Field(ge=1, le=1_000_000, description="How many characters of the report to read.")


class Report(BaseModel):
    report_id: str
    text: str


class BenchModel:
    """Turn N of a benchmark request: the calls `bench.scenarios` gives, then the answer. A thread's message is
    shown the earlier messages first; it plays its own question, the last user message."""

    needs_conversation = True
    # Canned answers: a worker serves it only with scripted models allowed (the benchmark's worker is so).
    scripted = True

    def label(self, model_name: str | None) -> str:
        return BENCH_MODEL

    async def respond(self, request: toolloop.ModelRequest) -> list[toolloop.ConversationItem]:
        # The request's own question: the last user message (a thread's message is shown the earlier ones first).
        asked = next(
            item
            for item in reversed(request.conversation)
            if isinstance(item, toolloop.MessageItem) and item.role == "user"
        )
        calls = calls_for_turn(scenario_of(asked.text()), request.turn)
        if calls is None:
            return [toolloop.MessageItem(content=[{"type": "output_text", "text": ANSWER}])]
        return [
            toolloop.FunctionCallItem(call_id=c.call_id, name=c.name, arguments=json.dumps(c.arguments)) for c in calls
        ]


def bench_tools(service_url: str) -> toolloop.Toolset:
    tools = demo_tools(service_url)

    @tools.read(name=REPORT_TOOL, summary=lambda a: f"{REPORT_TOOL} {a.report_id}")
    async def read_report(ctx: toolloop.ToolContext, args: ReadReportArgs) -> Report:
        """A report's text (the benchmark's large outputs; no service call)."""
        return Report(report_id=args.report_id, text=report_text(args.report_id, args.size))

    return tools


def build(service_url: str | None = None) -> toolloop.AgentSpec:
    url = service_url or os.environ.get("TOOLLOOP_SERVICE_URL") or "http://127.0.0.1:8701"
    return toolloop.AgentSpec(tools=bench_tools(url), models={BENCH_MODEL: BenchModel()})
