"""Pure: what a model adapter is - one call of the model with the conversation so far, the instructions and
the tools, answered with Responses-shaped output items (or a ModelCallError saying whether to retry)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from toolloop._core.contracts import Actor, ConversationItem
from toolloop._core.usage import TokenUsage

__all__ = ["ModelAdapter", "ModelAnswer", "ModelRequest", "TextSink", "TokenUsage"]

# Where an adapter that streams sends the text of its answer as it is written, a piece at a time. For display
# only: what the turn decides (its text, its tool calls) is the answer `respond` returns once it is complete.
TextSink = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class ModelRequest:
    """One model call. `conversation` holds every earlier item, the user's message first."""

    turn: int
    conversation: Sequence[ConversationItem]
    instructions: str
    tools: list[dict[str, Any]]
    actor: Actor
    # The model a request names within the adapter ("gpt-4.1-mini"), or None for the adapter's default.
    model_name: str | None = None
    # The script model only: this turn's scripted items (None once the script has run out) and its length.
    scripted_output: Sequence[ConversationItem] | None = None
    script_length: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # Which request this call serves: its workflow id, and the labels its starter gave (AgentInput.metadata).
    request_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    # Set by the model activity: an adapter that streams awaits it with each piece of text (never with a tool
    # call's arguments); one that does not leaves it alone, and the activity sends the whole text at the end.
    on_text: TextSink | None = None


class ModelAnswer(list[ConversationItem]):
    """What an adapter that learns the call's token usage returns: the output items, a plain list to every
    caller, with `usage` beside them (None when the provider sent none) and `model`, the model the call asked
    for (the request's, else the adapter's default; the worker's price table is keyed by it). `respond` keeps
    its signature, so other adapters need not know of it; the model activity records the usage of a turn
    whose answer is one."""

    def __init__(
        self, items: Iterable[ConversationItem] = (), usage: TokenUsage | None = None, model: str | None = None
    ) -> None:
        super().__init__(items)
        self.usage = usage
        self.model = model


@runtime_checkable
class ModelAdapter(Protocol):
    """A model the worker can call, registered under the name a request asks for (ModelSpec.provider).

    `respond` raises toolloop's ModelCallError when the call gives no usable answer: kind "temporary" is
    retried by the activity's retry policy, "rejected", "malformed" and "exhausted" stop the request. An
    adapter that needs no conversation (the script model) sets `needs_conversation = False`, and the worker
    does not rebuild one for it. Every turn is an activity of its own, whatever the adapter. An adapter whose
    answers are written in advance or canned (the script model, the demo's offline model) sets `scripted =
    True`: a worker serves it only when its configuration allows scripted models."""

    needs_conversation: bool

    def label(self, model_name: str | None) -> str:
        """How the model is named in results and the UI ("openai:gpt-4.1-mini", "script")."""
        ...

    async def respond(self, request: ModelRequest) -> list[ConversationItem]: ...
