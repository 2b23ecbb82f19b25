"""I/O: one OpenAI-compatible endpoint through the official `openai` SDK, as both model adapters (Responses and
Chat Completions) use it: a client with the SDK's retries off, and every failed call classified as a
ModelCallError whose `kind` says whether retrying can help.

The classification is pure (`status_failure`, `retry_after_seconds`, `is_context_length_error`, `decode_body`);
`call_failure` reads the SDK's public exceptions into it. Temporal owns retries: an SDK retry under the
activity's retry policy would multiply attempts and hide failures, so `max_retries=0` always.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Self, cast

import httpx2
import openai
from openai import AsyncOpenAI

from toolloop._core.contracts import ConversationItem
from toolloop._models.adapter import ModelAnswer, ModelRequest, TextSink, TokenUsage
from toolloop._models.errors import ModelCallError, temporary_code, truncate

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT_SECONDS = 120.0
# How long the rest of a streamed body is read once the answer is whole (the SDK's own streams wait as long).
_DRAIN_SECONDS = 0.1

# --- pure: what a failed call means -------------------------------------------------------------------------

# How providers say the conversation no longer fits the model: OpenAI's error code, llama.cpp's error type,
# and the wording of OpenAI, vLLM, llama.cpp and Anthropic-compatible servers.
_CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_CONTEXT_LENGTH_TEXT = re.compile(
    r"maximum context length|maximum model length|context[ _]length[ _](?:is )?exceeded"
    r"|exceeds? the (?:\w+ )?context (?:size|length|window)|prompt is too long",
    re.IGNORECASE,
)


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` without any of `secrets` (providers sometimes echo a key in their error text)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


def error_detail(body: object, secrets: Sequence[str] = ()) -> str:
    """The provider's error message, else a short slice of the body: enough to diagnose, never a whole body.

    `body` is what the SDK keeps of an error answer (APIStatusError.body): the `error` object of a JSON body,
    the whole JSON without one, or the text of a body that is not JSON."""
    if body is None:
        return ""
    if isinstance(body, dict):
        message = body.get("message")
        text = message if isinstance(message, str) and message else json.dumps(body)
    elif isinstance(body, str):
        text = body
    else:
        text = json.dumps(body)
    # Redacted before it is cut, so a cut cannot leave half a key behind.
    return truncate(redact(text, secrets))


def is_context_length_error(body: object) -> bool:
    """Whether an error answer says the conversation is longer than the model's context window."""
    if isinstance(body, dict):
        for field in ("code", "type"):
            if isinstance(body.get(field), str) and body[field] in _CONTEXT_LENGTH_CODES:
                return True
        message = body.get("message")
        return isinstance(message, str) and _CONTEXT_LENGTH_TEXT.search(message) is not None
    return isinstance(body, str) and _CONTEXT_LENGTH_TEXT.search(body) is not None


def retry_after_seconds(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """How long the server asked us to wait: OpenAI's `retry-after-ms`, else `Retry-After` as a number of
    seconds or an HTTP date. None when it asked nothing readable. (`headers` is case-insensitive when it is
    the SDK's; a plain dict must use lower-case names.)"""
    milliseconds = _number(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = headers.get("retry-after")
    if not value:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _number(value: str | None) -> float | None:
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return max(0.0, number) if math.isfinite(number) else None


def status_failure(
    status: int, headers: Mapping[str, str], body: object, secrets: Sequence[str] = ()
) -> ModelCallError:
    """An HTTP error answer as a ModelCallError: 408, 429 and 5xx are temporary (with the server's
    Retry-After), a context window exceeded and every other 4xx are rejected (retrying sends the same
    request)."""
    detail = error_detail(body, secrets)
    suffix = f": {detail}" if detail else ""
    if status in (408, 429) or status >= 500:
        # 408 is a timeout in HTTP terms: as transient as a 503.
        return ModelCallError(
            "temporary",
            f"model endpoint answered HTTP {status}{suffix}",
            retry_after_seconds=retry_after_seconds(headers),
        )
    if is_context_length_error(body):
        return ModelCallError(
            "rejected",
            f"the conversation no longer fits the model's context window (HTTP {status}{suffix})",
        )
    return ModelCallError("rejected", f"model endpoint rejected the request: HTTP {status}{suffix}")


def decode_body(content: bytes, secrets: Sequence[str] = ()) -> object:
    """A successful answer's body as JSON, or a malformed ModelCallError quoting its start."""
    try:
        return json.loads(content)
    except (ValueError, UnicodeDecodeError):
        start = redact(content.decode("utf-8", "replace"), secrets)
        raise ModelCallError("malformed", f"response body is not JSON: {truncate(start, 80)!r}") from None


def token_usage(usage: object, input_field: str, output_field: str) -> TokenUsage | None:
    """An answer's `usage` object read by its two field names (Responses: input_tokens/output_tokens, Chat
    Completions: prompt_tokens/completion_tokens), with the cached part of the input from `<input
    field>_details.cached_tokens` (0 when absent or unreadable); None if the counts are absent or unreadable:
    usage is information, never a reason to fail a call."""
    if not isinstance(usage, dict):
        return None
    counts = [usage.get(input_field), usage.get(output_field), usage.get("total_tokens")]
    if not all(_count(n) for n in counts[:2]):
        return None
    input_tokens, output_tokens, total = cast(list[int], counts)
    if not _count(total):
        total = input_tokens + output_tokens
    details = usage.get(f"{input_field}_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    # A cached count above the input's is not the provider's arithmetic: read as nothing cached.
    cached_tokens = cached if _count(cached) and cast(int, cached) <= input_tokens else 0
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total,
        cached_input_tokens=cached_tokens,
    )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- I/O: the SDK's exceptions, and the client ---------------------------------------------------------------


def call_failure(exc: openai.OpenAIError, secrets: Sequence[str], timeout_seconds: float | None) -> ModelCallError:
    """What a failed SDK call means for the activity (the SDK keeps the transport's own error as __cause__)."""
    if isinstance(exc, openai.APIStatusError):
        return status_failure(exc.status_code, exc.response.headers, exc.body, secrets)
    if isinstance(exc, openai.APITimeoutError):
        return timeout_failure(exc.__cause__ or exc, timeout_seconds)
    if isinstance(exc, openai.APIConnectionError):
        return connection_failure(exc.__cause__ or exc, secrets)
    detail = truncate(redact(str(exc), secrets)) or "no detail"
    return ModelCallError("malformed", f"the model call failed ({type(exc).__name__}: {detail})")


def timeout_failure(cause: BaseException, timeout_seconds: float | None) -> ModelCallError:
    within = f" within {timeout_seconds:g} s" if timeout_seconds else ""
    return ModelCallError("temporary", f"the model endpoint did not answer{within} ({type(cause).__name__})")


def connection_failure(cause: BaseException, secrets: Sequence[str]) -> ModelCallError:
    # Connect refused, resets, DNS, a stream cut: the answer may not have come whole; a retry is safe because a
    # model call has no side effect.
    detail = truncate(redact(str(cause), secrets)) or "no detail"
    return ModelCallError("temporary", f"could not reach the model endpoint ({type(cause).__name__}: {detail})")


def check_base_url(base_url: str) -> None:
    """A base URL the SDK cannot use is a configuration error: say so at start, not at every model call."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"the model base URL must start with http:// or https:// (got {base_url!r})")


class OpenAIEndpoint:
    """One model endpoint and the SDK client that reaches it. Holds the API key; nothing it raises or logs
    contains that key or an extra header's value.

    Give `api_key` (and `base_url`, `extra_headers`) and it builds an `openai.AsyncOpenAI`, or give your own
    client (`openai.AsyncAzureOpenAI`, one with a custom `http_client`) as `openai_client`: it is used
    through `with_options(max_retries=0)` and left open on exit, as its owner's. `extra_body` adds
    provider-specific fields to every call (opt-in); it may not set the fields the endpoint itself sends
    (`reserved_body_fields`). With `stream` (the default) each call asks for a streamed answer: its text goes
    to the caller's `on_text` as it is written, and the answer is read from the completed stream only, so a
    tool call is never taken from arguments still being written. `stream=False` for a server that cannot."""

    reserved_body_fields: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        timeout_seconds: float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        openai_client: AsyncOpenAI | None = None,
        stream: bool = True,
    ) -> None:
        self.stream = stream
        clash = self.reserved_body_fields.intersection(extra_body or {})
        if clash:
            raise ValueError(f"extra_body may not set {sorted(clash)}")
        self._extra_body = dict(extra_body or {})
        headers = dict(extra_headers or {})
        if openai_client is None:
            if not api_key:
                raise ValueError("api_key is empty")
            check_base_url(base_url)
            self.timeout_seconds: float | None = timeout_seconds or DEFAULT_TIMEOUT_SECONDS
            self.client = AsyncOpenAI(
                api_key=api_key,
                base_url=base_url,
                timeout=self.timeout_seconds,
                max_retries=0,
                default_headers=headers,
            )
        else:
            self.timeout_seconds = timeout_seconds
            options: dict[str, Any] = {"max_retries": 0}
            if timeout_seconds is not None:
                options["timeout"] = timeout_seconds
            if headers:
                options["default_headers"] = headers
            self.client = openai_client.with_options(**options)
        self._owns_client = openai_client is None
        self.model = model
        # Short header values ("toolloop", "1") are no secret, and redacting them would garble messages.
        self._secrets = tuple(
            s for s in (api_key, self.client.api_key, *headers.values()) if isinstance(s, str) and len(s) >= 12
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={str(self.client.base_url)!r}, model={self.model!r}, api_key=set)"

    @property
    def base_url(self) -> str:
        return str(self.client.base_url).rstrip("/")

    async def respond(
        self,
        *,
        instructions: str,
        conversation: Sequence[ConversationItem],
        tools: list[dict[str, Any]],
        model: str | None = None,
        on_text: TextSink | None = None,
    ) -> ModelAnswer:
        """One model call: the answer as Responses-shaped items (and its usage), or a ModelCallError. `model`
        overrides the client's default model for this call (a run may name its own); a streamed answer's text
        goes to `on_text` as it comes."""
        raise NotImplementedError

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _answer_body(self, call: Awaitable[Any]) -> object:
        """Await one `with_raw_response` call: the answer's body as decoded JSON, or a ModelCallError.

        The raw body, not the SDK's parsed model: the SDK builds its models without validating them, so the
        checking is ours either way, and every field of an output item must go back to the model unchanged."""
        try:
            raw = await call
        except openai.OpenAIError as exc:
            raise call_failure(exc, self._secrets, self.timeout_seconds) from None
        return decode_body(raw.http_response.content, self._secrets)

    async def _stream_data(self, call: AbstractAsyncContextManager[Any]) -> AsyncGenerator[Any, None]:
        """The JSON data of each server-sent event of one streamed call, in order, until the stream ends (or its
        `[DONE]`); every failure, before or during the stream, as a ModelCallError. A stream cut, stalled past
        the timeout or carrying a chunk that is not JSON is temporary: the activity retries the turn, which
        streams again from the start.

        `call` is the SDK's `with_streaming_response.create(..., stream=True)`: the raw response, its events
        read by the HTTP client's own decoder (httpx2.EventSource). The SDK's typed events are not built: each
        is validated against a union of some fifty event types, several times the cost of the answer itself on a
        worker, and the terminal event's JSON is the whole answer as the provider sent it."""
        try:
            async with call as response:
                http: httpx2.Response = response.http_response
                kind = http.headers.get("content-type", "")
                if not kind.startswith("text/event-stream"):
                    start = redact((await http.aread()).decode("utf-8", "replace"), self._secrets)
                    raise ModelCallError(
                        "malformed",
                        f"a streamed call was answered with {kind or 'no content type'}, not an event stream "
                        f"({truncate(start, 80)!r}); an endpoint that cannot stream needs streaming off "
                        "(OPENAI_STREAM=false)",
                    )
                # No size limit on one event: the last one carries the whole answer, as a plain call's body does.
                events = aiter(httpx2.EventSource(http, max_event_size=None))
                try:
                    async with contextlib.aclosing(_event_data(events, self._secrets)) as datas:
                        async for data in datas:
                            yield data
                finally:
                    # The answer is whole (the last event read, or its reader has what it needs): what is left of
                    # the body is read for a moment, so the connection goes back to the pool instead of being
                    # closed (a new connection per model turn otherwise), as the SDK's own streams do.
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(_DRAIN_SECONDS):
                            async for _ in events:
                                pass
        except openai.OpenAIError as exc:
            raise call_failure(exc, self._secrets, self.timeout_seconds) from None
        except httpx2.TimeoutException as exc:
            raise timeout_failure(exc, self.timeout_seconds) from None
        except httpx2.RequestError as exc:
            # Only while the answer streams (a failure to connect comes as the SDK's own error, above).
            detail = truncate(redact(str(exc), self._secrets)) or "no detail"
            raise ModelCallError(
                "temporary", f"the model endpoint's stream broke off ({type(exc).__name__}: {detail})"
            ) from None
        except ValueError:
            raise ModelCallError("temporary", "the model endpoint's stream carried a chunk that is not JSON") from None


async def _event_data(
    events: AsyncIterator[httpx2.ServerSentEvent], secrets: Sequence[str]
) -> AsyncGenerator[Any, None]:
    """Each event's JSON data until `[DONE]` (Chat Completions' end) or the end of the stream. An error the
    provider sends in the middle (Chat Completions' {"error": {...}} chunk, the Responses API's `error` event)
    means it gave up on this answer: temporary, another attempt may not."""
    async for event in events:
        if event.data == "[DONE]":
            return
        data = event.json()
        if isinstance(data, dict):
            error = data.get("error")
            if error:
                raise stream_error(error, secrets)
            if data.get("type") == "error":
                raise stream_error(data, secrets)
        yield data


def stream_error(error: object, secrets: Sequence[str] = ()) -> ModelCallError:
    """An error a provider sends in the middle of a stream, by what it says: a context window exceeded, or an
    HTTP 4xx code other than 408 and 429, is rejected as the same error before the stream would be; anything
    else (a server error, an overload, no code) is temporary: the provider gave up on this answer, another
    attempt may not."""
    message = error.get("message") if isinstance(error, dict) else error
    detail = truncate(redact(str(message or "no detail"), secrets))
    code = error.get("code") if isinstance(error, dict) else None
    if is_context_length_error(error):
        return ModelCallError("rejected", f"the conversation no longer fits the model's context window ({detail})")
    if not temporary_code(code):  # a 4xx other than 408 and 429, invalid_prompt, a content policy
        return ModelCallError("rejected", f"the model endpoint rejected the request in its stream: {detail}")
    return ModelCallError("temporary", f"the model endpoint's stream reported an error: {detail}")


class OpenAIModel:
    """A model adapter over one OpenAI endpoint (Responses or Chat Completions): the whole conversation each
    turn, the answer as Responses-shaped items, so the workflow and its history see the same items whichever
    API a worker uses."""

    needs_conversation = True

    def __init__(self, client: OpenAIEndpoint) -> None:
        self.client = client

    def label(self, model_name: str | None) -> str:
        return f"openai:{model_name or 'default'}"

    async def respond(self, request: ModelRequest) -> list[ConversationItem]:
        return await self.client.respond(
            instructions=request.instructions,
            conversation=request.conversation,
            tools=request.tools,
            model=request.model_name,
            on_text=request.on_text,
        )
