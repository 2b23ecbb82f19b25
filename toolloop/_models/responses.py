"""I/O: the OpenAI Responses API adapter over httpx (any compatible base URL); it classifies every failure.

It sends the whole conversation as `input` and returns the response's `output` items as our models,
keeping every field so they can go back unchanged next round. It never retries: Temporal owns retries,
so each failure becomes a ModelCallError whose `kind` says whether retrying can help.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import TypeAdapter, ValidationError

from toolloop._core.contracts import ConversationItem, item_to_wire
from toolloop._models.adapter import ModelRequest
from toolloop._models.errors import ModelCallError, json_type, truncate

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_ITEM: TypeAdapter[ConversationItem] = TypeAdapter(ConversationItem)

# Fields our adapter owns; `extra_body` cannot override them.
_RESERVED = frozenset({"model", "instructions", "input", "tools", "parallel_tool_calls"})


class ResponsesClient:
    """One model endpoint. Holds the API key; nothing it raises or logs contains that key."""

    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout_seconds: float = 120.0,
        http: httpx.AsyncClient | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not api_key:
            raise ValueError("api_key is empty")
        clash = _RESERVED.intersection(extra_body or {})
        if clash:
            raise ValueError(f"extra_body may not set {sorted(clash)}")
        self._api_key = api_key
        self.model = model
        self.base_url = base_url.rstrip("/")
        self._timeout = httpx.Timeout(timeout_seconds)
        # e.g. {"store": False, "include": ["reasoning.encrypted_content"]}; provider-specific, so opt-in.
        self._extra_body = dict(extra_body or {})
        self._owns_http = http is None
        # retries=0: a transport retry under Temporal's retry would multiply attempts and hide failures.
        self._http = http or httpx.AsyncClient(
            timeout=self._timeout, transport=httpx.AsyncHTTPTransport(retries=0), follow_redirects=False
        )

    def __repr__(self) -> str:
        return f"ResponsesClient(base_url={self.base_url!r}, model={self.model!r}, api_key=set)"

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> ResponsesClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def respond(
        self,
        *,
        instructions: str,
        conversation: Sequence[ConversationItem],
        tools: list[dict[str, Any]],
        model: str | None = None,
    ) -> list[ConversationItem]:
        """One model call: the response's output items, or a ModelCallError. `model` overrides the
        client's default model for this call (a run may name its own)."""
        model_name = model or self.model
        body: dict[str, Any] = {
            **self._extra_body,
            "model": model_name,
            "instructions": instructions,
            "input": [item_to_wire(item) for item in conversation],
            "tools": tools,
            "parallel_tool_calls": True,
        }
        url = f"{self.base_url}/responses"
        logger.debug("model request", extra={"url": url, "model": model_name, "input_items": len(conversation)})
        try:
            response = await self._http.post(
                url,
                json=body,
                headers={"Authorization": f"Bearer {self._api_key}"},
                timeout=self._timeout,
            )
        except httpx.UnsupportedProtocol as exc:
            # A base URL without http(s):// is a configuration error; retrying cannot fix it.
            raise ModelCallError("rejected", f"bad model base URL: {self._redact(str(exc))}") from None
        except httpx.TransportError as exc:
            # Connect refused, timeouts, resets: the request may not have arrived; a retry is safe
            # because a model call has no side effect.
            detail = self._redact(str(exc)) or "no detail"
            raise ModelCallError(
                "temporary", f"could not reach the model endpoint ({type(exc).__name__}: {detail})"
            ) from None
        except httpx.RequestError as exc:
            raise ModelCallError("malformed", f"could not read the model response ({type(exc).__name__})") from None
        return self._parse(response)

    # --- classification ---------------------------------------------------------------------------

    def _parse(self, response: httpx.Response) -> list[ConversationItem]:
        status = response.status_code
        if status in (408, 429) or status >= 500:
            # 408 is a timeout in HTTP terms: as transient as a 503.
            raise ModelCallError(
                "temporary",
                f"model endpoint answered HTTP {status}{self._error_suffix(response)}",
                retry_after_seconds=_retry_after(response.headers.get("retry-after")),
            )
        if not 200 <= status < 300:
            raise ModelCallError(
                "rejected", f"model endpoint rejected the request: HTTP {status}{self._error_suffix(response)}"
            )

        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelCallError(
                "malformed", f"response body is not JSON: {self._redact(truncate(response.text, 80))!r}"
            ) from None
        if not isinstance(data, dict):
            raise ModelCallError("malformed", f"response body is a JSON {json_type(data)}, not an object")
        state = data.get("status")
        if state != "completed":
            raise ModelCallError(
                "malformed", f"response status is {state!r}{self._why_not_completed(data)}, not 'completed'"
            )
        output = data.get("output")
        if not isinstance(output, list):
            raise ModelCallError("malformed", f"response 'output' is a JSON {json_type(output)}, not a list")
        return [self._item(index, raw) for index, raw in enumerate(output, start=1)]

    def _item(self, index: int, raw: Any) -> ConversationItem:
        where = f"output item {index}"
        if not isinstance(raw, dict):
            raise ModelCallError("malformed", f"{where} is a JSON {json_type(raw)}, not an object")
        kind = raw.get("type")
        if not isinstance(kind, str) or not kind:
            raise ModelCallError("malformed", f"{where} has no 'type'")
        if kind == "function_call":
            for field in ("name", "arguments", "call_id"):
                if not isinstance(raw.get(field), str):
                    got = "missing" if field not in raw else f"a JSON {json_type(raw[field])}"
                    raise ModelCallError("malformed", f"{where}: function_call '{field}' must be a string, got {got}")
        try:
            return _ITEM.validate_python(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"][1:]) or "item"
            raise ModelCallError("malformed", f"{where} ({kind}): {loc}: {first['msg']}") from None

    def _error_suffix(self, response: httpx.Response) -> str:
        """The provider's `error.message`, else a short slice of the body, for a human reading logs."""
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            text = response.text.strip()
            return f": {self._redact(truncate(text))}" if text else ""
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str) and message:
            return f": {self._redact(truncate(message))}"
        return f": {self._redact(truncate(json.dumps(data)))}"

    @staticmethod
    def _why_not_completed(data: dict[str, Any]) -> str:
        details = data.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        if isinstance(reason, str):
            return f" ({truncate(reason, 80)})"
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return f" ({truncate(message, 120)})" if isinstance(message, str) else ""

    def _redact(self, text: str) -> str:
        # Providers sometimes echo a (partial) key in their error text; never pass it on.
        return text.replace(self._api_key, "[redacted]")


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: either a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class ResponsesModel:
    """The model adapter for the OpenAI Responses API (or any compatible base URL): the whole conversation
    as `input`, the tools in strict mode, every output item kept so it goes back unchanged next round.

    Server-side conversation state (`previous_response_id`) is not used: it needs the provider to store
    responses (refused under zero data retention), is missing from many compatible servers, and is lost
    when a request moves to another model or provider; the workflow's history already holds each item
    once and the worker's cache makes rebuilding the conversation rare."""

    needs_conversation = True

    def __init__(self, client: ResponsesClient) -> None:
        self.client = client

    def label(self, model_name: str | None) -> str:
        return f"openai:{model_name or 'default'}"

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        return await self.client.respond(
            instructions=request.instructions,
            conversation=request.conversation,
            tools=request.tools,
            model=request.model_name,
        )
