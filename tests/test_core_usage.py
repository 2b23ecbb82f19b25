"""Usage and budgets without a server: what a turn costs by a price table, a request's totals, when a budget is
reached, the usage read from both OpenAI wire formats, the price table as a worker's setting, the model
activity that records a turn's usage and counts its tokens on the worker's metrics, and how the CLI and the
API show and accept them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

import starter
from devstack.stack import LocalStack, StackSecrets
from tests.conftest import REPO_ROOT
from tests.fake_openai_server import chat_completion, output_message, responses_response
from toolloop._api.app import LimitsBody, _limits
from toolloop._api.limits import ApiLimits
from toolloop._core.approvals import generate_signing_key
from toolloop._core.contracts import (
    EXIT_CODES,
    Actor,
    AgentInput,
    AgentResult,
    ConversationItem,
    Limits,
    MessageItem,
    ModelTurnInput,
    outcome_of,
    status_of,
    user_message,
)
from toolloop._core.names import MODEL_TOKENS_METRIC
from toolloop._core.registry import ToolRegistry
from toolloop._core.usage import ModelPrice, RequestUsage, TokenUsage, price_table, usage_line
from toolloop._models.adapter import ModelAnswer, ModelRequest
from toolloop._models.chat import chat_answer
from toolloop._models.responses import responses_answer
from toolloop._temporal.client import submission_digest
from toolloop._temporal.settings import Settings, WorkerSettings, settings_error
from toolloop.activities.conversation import ConversationState, RecordedTurn, RunKey
from toolloop.activities.model_turn import ModelActivities

MINI = ModelPrice(input=0.40, cached_input=0.10, output=1.60)


# --- What a turn costs ----------------------------------------------------------------------------------------


def test_cached_input_is_priced_apart_from_the_rest_of_the_input() -> None:
    usage = TokenUsage(
        input_tokens=1_000_000, cached_input_tokens=200_000, output_tokens=500_000, total_tokens=1_500_000
    )
    # 800k uncached at 0.40, 200k cached at 0.10, 500k out at 1.60 (per million).
    assert MINI.cost(usage) == pytest.approx(0.32 + 0.02 + 0.80)


def test_without_a_cached_price_cached_input_costs_the_input_price() -> None:
    usage = TokenUsage(input_tokens=2_000, cached_input_tokens=1_000, output_tokens=0, total_tokens=2_000)
    assert ModelPrice(input=3.0, output=15.0).cost(usage) == pytest.approx(2_000 * 3.0 / 1e6)


def test_a_price_table_reads_json_and_says_what_is_wrong() -> None:
    table = price_table(
        '{"gpt-4.1-mini": {"input": 0.4, "cached_input": 0.1, "output": 1.6}, "m": {"input": 1, "output": 2}}'
    )
    assert table == {"gpt-4.1-mini": MINI, "m": ModelPrice(input=1, output=2)}
    assert price_table("") == {} and price_table({}) == {}
    for bad in (
        "{not json",
        "[1, 2]",
        '{"m": {"input": -1, "output": 1}}',
        '{"m": {"input": 1}}',
        '{"m": {"input": 1, "output": 1, "cache": 1}}',
    ):
        with pytest.raises(ValueError):
            price_table(bad)


# --- A request's totals and its budget ------------------------------------------------------------------------


def turn(input_tokens: int, output_tokens: int, cached: int = 0) -> TokenUsage:
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        cached_input_tokens=cached,
    )


def test_totals_add_each_reported_turn_and_a_turn_without_usage_counts_nothing() -> None:
    totals = RequestUsage().plus(turn(100, 10, cached=40), 0.5).plus(None, None).plus(turn(200, 20), 0.25)
    assert totals == RequestUsage(
        input_tokens=300, cached_input_tokens=40, output_tokens=30, total_tokens=330, turns=2, cost=0.75
    )


def test_the_cost_is_unknown_until_a_turn_has_a_price_and_unpriced_turns_are_counted() -> None:
    unpriced = RequestUsage().plus(turn(100, 10), None)
    assert (unpriced.cost, unpriced.unpriced_turns, unpriced.turns) == (None, 1, 1)
    mixed = unpriced.plus(turn(100, 10), 0.5)
    assert (mixed.cost, mixed.unpriced_turns, mixed.turns) == (0.5, 1, 2)


@pytest.mark.parametrize(
    ("total_tokens", "cost", "max_total_tokens", "max_cost", "reached"),
    [
        (0, None, None, None, False),  # no budget: never
        (10**9, 10.0**6, None, None, False),
        (999, None, 1000, None, False),
        (1000, None, 1000, None, True),  # reached at the budget, not only past it
        (1001, None, 1000, None, True),
        (5, 0.99, None, 1.0, False),
        (5, 1.0, None, 1.0, True),
        (5, None, None, 1.0, False),  # no priced turn: the cost so far counts 0
        (1000, 0.5, 2000, 0.5, True),  # either budget stops
    ],
)
def test_a_budget_is_reached_once_the_totals_get_to_it(
    total_tokens: int, cost: float | None, max_total_tokens: int | None, max_cost: float | None, reached: bool
) -> None:
    usage = RequestUsage(total_tokens=total_tokens, cost=cost, turns=1)
    assert usage.reached(max_total_tokens, max_cost) is reached


def test_a_budget_stop_is_a_stop_at_a_limit_like_the_others() -> None:
    assert status_of("budget") == "stopped"
    assert EXIT_CODES[outcome_of("stopped", [])] == EXIT_CODES[outcome_of(status_of("max_rounds"), [])] == 1


def test_limits_have_no_budget_unless_given_and_refuse_a_nonsense_one() -> None:
    assert (Limits().max_total_tokens, Limits().max_cost) == (None, None)
    assert Limits(max_total_tokens=5000, max_cost=0.25).max_total_tokens == 5000
    for bad in ({"max_total_tokens": 0}, {"max_cost": 0}, {"max_cost": float("inf")}, {"max_total_tokens": -3}):
        with pytest.raises(ValidationError):
            Limits.model_validate(bad)


def test_a_report_stored_before_usage_existed_reads_with_zero_totals() -> None:
    stored: dict[str, Any] = {"status": "completed", "stop_reason": "final_answer", "rounds": 1, "calls": []}
    assert AgentResult.model_validate(stored).usage == RequestUsage()


def test_unset_budgets_leave_a_requests_submission_digest_as_it_was() -> None:
    """A request id started before budgets existed still attaches to the same submission after the upgrade."""
    inp = AgentInput(request="hi", actor=Actor(user_id="u1"))
    before = AgentInput(request="hi", actor=Actor(user_id="u1"))
    with_budget = AgentInput(request="hi", actor=Actor(user_id="u1"), limits=Limits(max_total_tokens=100))
    assert submission_digest(inp) == submission_digest(before) != submission_digest(with_budget)
    # The digest of the limits as they were written before the budget fields existed.
    old_fields = {
        k: v for k, v in inp.limits.model_dump(mode="json").items() if k not in ("max_total_tokens", "max_cost")
    }
    assert inp.limits.model_dump(mode="json", exclude_none=True) == old_fields


# --- The line the CLI prints and the UI's details show -------------------------------------------------------


def test_the_totals_on_one_line() -> None:
    assert usage_line(RequestUsage()) is None  # no turn reported usage: nothing to say
    usage = RequestUsage(input_tokens=1234, cached_input_tokens=200, output_tokens=56, total_tokens=1290, turns=2)
    assert usage_line(usage) == "tokens: 1,234 in (200 cached), 56 out, 1,290 total"
    assert usage_line(usage.model_copy(update={"cost": 0.0123})) == (
        "tokens: 1,234 in (200 cached), 56 out, 1,290 total; cost 0.0123"
    )
    assert usage_line(usage.model_copy(update={"cost": 1234.5, "unpriced_turns": 1})) == (
        "tokens: 1,234 in (200 cached), 56 out, 1,290 total; cost 1,234.5 (1 turn without a price)"
    )


def report(**changes: Any) -> AgentResult:
    base: dict[str, Any] = {"workflow_id": "ask-acme-u1-x-1", "status": "stopped", "stop_reason": "budget", "rounds": 2}
    return AgentResult.model_validate({**base, "calls": [], **changes})


def test_the_cli_receipt_prints_the_totals_only_when_the_model_reported_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    usage = RequestUsage(
        input_tokens=300, cached_input_tokens=40, output_tokens=30, total_tokens=330, turns=2, cost=0.5
    )
    starter._print_result(report(usage=usage), starter.Settings())
    out, err = capsys.readouterr()
    assert "the request stopped (budget)" in out
    assert "tokens: 300 in (40 cached), 30 out, 330 total; cost 0.5\n" in err

    starter._print_result(report(stop_reason="final_answer", status="completed", final_text="ok"), starter.Settings())
    _, err = capsys.readouterr()
    assert "tokens:" not in err


def test_the_api_takes_budgets_among_a_requests_limits() -> None:
    limits = _limits(LimitsBody(max_total_tokens=5000, max_cost=0.5), ApiLimits())
    assert (limits.max_total_tokens, limits.max_cost) == (5000, 0.5)
    assert _limits(None, ApiLimits()).max_total_tokens is None
    with pytest.raises(ValidationError):
        LimitsBody.model_validate({"max_total_tokens": 0})


# --- Usage as the providers report it ---------------------------------------------------------------------------


def test_both_wire_formats_report_cached_input_tokens() -> None:
    expected = TokenUsage(input_tokens=120, output_tokens=9, total_tokens=129, cached_input_tokens=100)
    assert chat_answer(chat_completion("ok", usage=(120, 9), cached=100)).usage == expected
    assert responses_answer(responses_response(output_message("ok"), usage=(120, 9), cached=100)).usage == expected
    # Not said, or not the provider's arithmetic (more cached than the whole input): nothing cached.
    assert chat_answer(chat_completion("ok", usage=(120, 9))).usage == expected.model_copy(
        update={"cached_input_tokens": 0}
    )
    assert chat_answer(chat_completion("ok", usage=(120, 9), cached=121)).usage == expected.model_copy(
        update={"cached_input_tokens": 0}
    )


# --- The price table as a worker's setting ------------------------------------------------------------------------


def test_the_workers_price_table_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().model_prices == {}
    monkeypatch.setenv(
        "TOOLLOOP_MODEL_PRICES", '{"gpt-4.1-mini": {"input": 0.40, "cached_input": 0.10, "output": 1.60}}'
    )
    assert WorkerSettings().model_prices == {"gpt-4.1-mini": MINI}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{not json", "TOOLLOOP_MODEL_PRICES: Value error, must be a JSON object"),
        ('{"gpt-4.1-mini": {"input": -1, "output": 1}}', "TOOLLOOP_MODEL_PRICES.gpt-4.1-mini.input: "),
        ('{"gpt-4.1-mini": {"input": 1}}', "TOOLLOOP_MODEL_PRICES.gpt-4.1-mini.output: Field required"),
        ('{"gpt-4.1-mini": {"input": 1, "output": 1, "cache": 1}}', "TOOLLOOP_MODEL_PRICES.gpt-4.1-mini.cache: "),
    ],
)
def test_a_bad_price_table_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv("TOOLLOOP_MODEL_PRICES", value)
    with pytest.raises(ValidationError) as caught:
        WorkerSettings()
    line = settings_error(caught.value)
    assert line.startswith(says) and "\n" not in line, line


# --- The model activity records usage and counts tokens -------------------------------------------------------------


class NoHistory:
    """A turn history that is never needed (turn 1 of an adapter that needs no earlier turns)."""

    async def turns(self, run: RunKey) -> list[RecordedTurn]:
        raise AssertionError("turn 1 needs no history")

    async def first_input(self, run: RunKey) -> ModelTurnInput | None:
        raise AssertionError("turn 1 needs no history")


class Answering:
    """An adapter that answers with a fixed text and, unless told otherwise, the usage a provider reported."""

    needs_conversation = True

    def __init__(self, usage: TokenUsage | None, plain: bool = False) -> None:
        self.usage = usage
        self.plain = plain

    def label(self, model_name: str | None) -> str:
        return f"fake:{model_name or 'fake-default'}"

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        items: list[ConversationItem] = [MessageItem(content=[{"type": "output_text", "text": "done"}])]
        if self.plain:
            return items
        return ModelAnswer(items, usage=self.usage, model=request.model_name or "fake-default")


async def run_turn(
    adapter: Answering, model_name: str | None = None
) -> tuple[Any, list[tuple[str, int, dict[str, str]]]]:
    buffer = MetricBuffer(1000)
    env = ActivityEnvironment()
    env.metric_meter = Runtime(telemetry=TelemetryConfig(metrics=buffer)).metric_meter
    activities = ModelActivities(
        ToolRegistry(),
        None,  # type: ignore[arg-type]  # never used: the conversation state is given
        {"fake": adapter},
        conversations=ConversationState(NoHistory()),
        prices={"fake-default": MINI},
    )
    inp = ModelTurnInput(turn=1, new_items=[user_message("hi")], provider="fake", model_name=model_name)
    result = await env.run(activities.model_turn, inp)
    counted = [
        (u.attributes["kind"], int(u.value), u.attributes)
        for u in buffer.retrieve_updates()
        if u.metric.name == MODEL_TOKENS_METRIC
    ]
    return result, counted


async def test_a_turn_records_its_usage_and_cost_and_counts_its_tokens_by_kind() -> None:
    usage = turn(1000, 50, cached=400)
    result, counted = await run_turn(Answering(usage))
    assert result.usage == usage
    assert result.cost == pytest.approx(MINI.cost(usage)) and result.cost == pytest.approx(
        (600 * 0.4 + 400 * 0.1 + 50 * 1.6) / 1e6
    )
    assert sorted((kind, value) for kind, value, _ in counted) == [("cached", 400), ("input", 1000), ("output", 50)]
    assert {attributes["model"] for _, _, attributes in counted} == {"fake:fake-default"}


async def test_a_model_without_a_price_has_usage_but_no_cost() -> None:
    result, counted = await run_turn(Answering(turn(10, 5)), model_name="another-model")
    assert result.usage == turn(10, 5) and result.cost is None
    assert len(counted) == 3


async def test_an_adapter_that_reports_no_usage_records_none_and_counts_nothing() -> None:
    for adapter in (Answering(None), Answering(turn(1, 1), plain=True)):
        result, counted = await run_turn(adapter)
        assert (result.usage, result.cost, counted) == (None, None, [])


def test_the_local_stacks_worker_gets_the_price_table_only_when_one_is_set(tmp_path: Path) -> None:
    secrets = StackSecrets(admin_token="t", approval_key=generate_signing_key())
    plain = Settings.model_validate({"TOOLLOOP_DATA_DIR": str(tmp_path)})
    # Unset: the worker's environment (and so its configuration digest) is what it was before prices existed.
    assert "TOOLLOOP_MODEL_PRICES" not in LocalStack(plain, REPO_ROOT)._worker_env(secrets)
    priced = plain.model_copy(update={"model_prices": {"gpt-4.1-mini": MINI}})
    given = LocalStack(priced, REPO_ROOT)._worker_env(secrets)["TOOLLOOP_MODEL_PRICES"]
    assert price_table(given) == {"gpt-4.1-mini": MINI}
