"""Pure: what a request's model calls used - each turn's tokens as its provider counted them, a request's
totals, what they cost by the worker's price table, and whether a request's budget is spent.

Tokens are the provider's own count (the `usage` of its answer): toolloop never estimates them. A turn whose
provider reported nothing (the script and offline models, a server that sends no `usage`) counts 0 tokens, so
a token or cost budget holds only with a model that reports usage. A cost is a plain number in whatever
currency the price table is written in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# Prices are per million tokens, as providers publish them.
_PER = 1_000_000


class TokenUsage(BaseModel):
    """The tokens one model call used, as the provider counted them. `input_tokens` includes the cached ones
    (`cached_input_tokens`: the part of the input the provider served from its prompt cache, 0 when it did not
    say)."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)


class ModelPrice(BaseModel):
    """One model's price per million tokens: input, cached input (default: the input price) and output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)
    cached_input: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    def cost(self, usage: TokenUsage) -> float:
        """What a call that used `usage` costs: cached input at its own price, the rest of the input and the
        output at theirs."""
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            (usage.input_tokens - cached) * self.input + cached * cached_price + usage.output_tokens * self.output
        ) / _PER


PriceTable = dict[str, ModelPrice]
_PRICE_TABLE: TypeAdapter[PriceTable] = TypeAdapter(PriceTable)
PRICE_TABLE_SHAPE = '{"MODEL": {"input": N, "cached_input": N, "output": N}} (per million tokens)'


def price_table(value: str | Mapping[str, Any]) -> PriceTable:
    """A price table by model name, from JSON text (`{"gpt-4.1-mini": {"input": 0.40, "cached_input": 0.10,
    "output": 1.60}}`) or a mapping; a ValueError (pydantic's ValidationError is one) says what is wrong."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ValueError(f"must be a JSON object: {PRICE_TABLE_SHAPE}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a JSON object: {PRICE_TABLE_SHAPE}")
    return _PRICE_TABLE.validate_python(dict(value))


class RequestUsage(BaseModel):
    """A request's totals so far: the tokens of every turn whose provider reported them, and what the turns
    the worker had a price for cost."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    # Model turns whose provider reported usage (the others count 0 tokens).
    turns: int = 0
    # The cost of the turns that had a price; None while no turn had one.
    cost: float | None = None
    # Turns that reported usage but had no price (their model is not in the worker's price table): `cost`
    # leaves them out.
    unpriced_turns: int = 0

    def plus(self, usage: TokenUsage | None, cost: float | None) -> RequestUsage:
        """These totals and one more turn's (`cost`: the turn's, None when the worker had no price for it)."""
        if usage is None:
            return self
        return RequestUsage(
            input_tokens=self.input_tokens + usage.input_tokens,
            cached_input_tokens=self.cached_input_tokens + usage.cached_input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            total_tokens=self.total_tokens + usage.total_tokens,
            turns=self.turns + 1,
            cost=self.cost if cost is None else (self.cost or 0.0) + cost,
            unpriced_turns=self.unpriced_turns + (cost is None),
        )

    def reached(self, max_total_tokens: int | None, max_cost: float | None) -> bool:
        """Whether these totals have reached a budget (None: no such budget)."""
        if max_total_tokens is not None and self.total_tokens >= max_total_tokens:
            return True
        return max_cost is not None and (self.cost or 0.0) >= max_cost


def budget_reached(usage: RequestUsage, max_total_tokens: int | None, max_cost: float | None) -> str:
    """Which budget the totals reached, in words (the report's `error` for stop reason "budget")."""
    if max_total_tokens is not None and usage.total_tokens >= max_total_tokens:
        return f"the token budget was reached: {usage.total_tokens:,} of max_total_tokens {max_total_tokens:,}"
    return f"the cost budget was reached: {format_cost(usage.cost or 0.0)} of max_cost {max_cost:g}"


def format_cost(cost: float) -> str:
    """A cost as people read it: up to six decimals, no trailing zeros."""
    return f"{cost:,.6f}".rstrip("0").rstrip(".")


def usage_line(usage: RequestUsage) -> str | None:
    """The totals on one line ("tokens: 1,234 in (200 cached), 56 out, 1,290 total; cost 0.0123"); None when
    no turn reported usage."""
    if usage.turns == 0:
        return None
    line = (
        f"tokens: {usage.input_tokens:,} in ({usage.cached_input_tokens:,} cached), {usage.output_tokens:,} out, "
        f"{usage.total_tokens:,} total"
    )
    if usage.cost is not None:
        line += f"; cost {format_cost(usage.cost)}"
        if usage.unpriced_turns:
            line += f" ({usage.unpriced_turns} turn{'s' if usage.unpriced_turns > 1 else ''} without a price)"
    return line
