"""I/O: an MCP server as a tool source - its tools listed when the worker opens the source, each offered with
its input schema made strict (or refused, with the reason), and called through one persistent session with
the official `mcp` SDK, over stdio or streamable HTTP.

    notes = toolloop.McpSource.stdio("notes", command=["python", "-m", "notes_server"], read_only={"list_notes"})
    tools = toolloop.Toolset()
    tools.include(notes)

Effect class: a tool is read-only only when the configuration says so (`read_only`, or
`trust_read_only_hint=True` for tools that declare `readOnlyHint`); every other tool is a write. A write is
approved like any other (its digest binds the tool's name and its arguments), and MCP has neither a status
query nor a read-back: an unclear outcome stays unknown and is never resent, and a completed write is
reported as completed, not verified.

How a call's outcome is sorted:

- the session cannot be opened (the server does not start, the connection is refused): a read is retried
  (ToolTemporaryError); a write is certainly not sent (WriteNotSent).
- a timeout, a broken connection, or any failure once the call may have been sent: a read is retried; a write's
  outcome is unknown (WriteOutcomeUnknown).
- the tool answers with `isError: true`: for a read, CONFLICT with the server's text (capped, and withheld
  where it shows a stack trace, a path or SQL). For a write it is an unknown outcome: MCP's error answer does
  not say whether the tool acted before it failed, and "not done" is said only when that is known.
- any other answer: `{"ok": true, "content": [the text blocks], "structured": structuredContent or None}`,
  untrusted text capped like every tool output; other kinds of content are counted, not passed on.

The server sees no actor: every user's calls share the source's one session. Offer only tools that are not
per-user, or a server that scopes them by other means.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from toolloop._core.arguments import JsonSchemaArguments
from toolloop._core.codes import ResultCode
from toolloop._core.redaction import internal_text
from toolloop._core.registry import (
    ToolContext,
    ToolError,
    ToolSpec,
    ToolTemporaryError,
    WriteNotSent,
    WriteOutcomeUnknown,
    registration_problems,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

_PREFIX = re.compile(r"^[a-zA-Z0-9_-]{0,32}$")
_MAX_ERROR_TEXT = 200
_MAX_DESCRIPTION_CHARS = 1024
_MAX_PAGES = 100
# Longest wait for a ping before a write (it proves the session still answers before anything is sent).
_MAX_PING_SECONDS = 5.0
_STOP_SECONDS = 10.0
# Error codes the SDK itself makes up for a dead session (not the server's answer to the call).
_REQUEST_TIMEOUT = int(httpx.codes.REQUEST_TIMEOUT)
_SESSION_TERMINATED = 32600  # streamable HTTP: the server no longer knows the session (HTTP 404)
_SESSION_GONE = (types.CONNECTION_CLOSED, _SESSION_TERMINATED)
# A broken transport, as it surfaces from the SDK's streams and clients.
_TRANSPORT_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError, httpx.HTTPError)

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]


class McpServerUnavailable(OSError):
    """The MCP server could not be started or reached: one line for the operator (worker.py shows it)."""


class _ConnectionLost(Exception):
    """The session ended while a request was waiting for its answer."""


# --- Transports -------------------------------------------------------------------------------------------


class _Transport(Protocol):
    def describe(self) -> str: ...

    def streams(self) -> AbstractAsyncContextManager[Streams]: ...


@dataclass(frozen=True)
class _Stdio:
    command: tuple[str, ...]
    env: Mapping[str, str] | None
    cwd: str | None

    def describe(self) -> str:
        return f"stdio: {os.path.basename(self.command[0])}"

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[Streams]:
        params = StdioServerParameters(
            command=self.command[0],
            args=list(self.command[1:]),
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
        )
        # The server's stderr goes where the worker's does (looked up now, not when the SDK was imported).
        async with stdio_client(params, errlog=sys.stderr) as (read, write):
            yield read, write


@dataclass(frozen=True)
class _Http:
    url: str
    headers: Mapping[str, str]
    connect_timeout_seconds: float

    def describe(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[Streams]:
        # No transport retries (Temporal's retry policy is the only retry loop); the SDK bounds each call, and
        # a response stream may stay open that long.
        async with (
            httpx.AsyncClient(
                headers=dict(self.headers),
                timeout=httpx.Timeout(self.connect_timeout_seconds, read=300.0),
                transport=httpx.AsyncHTTPTransport(retries=0),
                trust_env=False,
            ) as client,
            streamable_http_client(self.url, http_client=client) as (read, write, _),
        ):
            yield read, write


# --- One session ------------------------------------------------------------------------------------------


class _Connection:
    """One MCP session, owned by a background task: anyio requires the transport's and the session's
    context managers to be entered and left in one task. Callers send their requests on the session from
    their own tasks (the SDK matches answers to requests by id, so reads run in parallel); each request also
    ends as soon as the session does, so nobody waits on a dead session."""

    def __init__(self, source: str, transport: _Transport, timeout_seconds: float, connect_timeout_seconds: float):
        self._source = source
        self._transport = transport
        self._timeout = timeout_seconds
        self._connect_timeout = connect_timeout_seconds
        self.session: ClientSession | None = None
        self.tools: list[types.Tool] = []
        self.closed = asyncio.Event()
        # Set to stop the session, and by the reader when the server's stream ends.
        self._wake = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    @property
    def usable(self) -> bool:
        return self.session is not None and not self.closed.is_set()

    async def start(self, list_tools: bool) -> None:
        """Returns once the session is initialized (and the tools listed); McpServerUnavailable if not."""
        self._task = asyncio.create_task(self._run(list_tools), name=f"mcp session {self._source}")
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            await self.stop()
            raise

    async def _run(self, list_tools: bool) -> None:
        try:
            async with self._transport.streams() as (read, write):
                inbound, session_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._relay, read, inbound)
                    # Every request is bounded (the handshake by the connect timeout, a call by its own).
                    bound = timedelta(seconds=max(self._timeout, self._connect_timeout))
                    async with ClientSession(session_read, write, read_timeout_seconds=bound) as session:
                        with anyio.fail_after(self._connect_timeout):
                            await session.initialize()
                            if list_tools:
                                self.tools = await _list_tools(session)
                        self.session = session
                        self._ready.set_result(None)
                        await self._wake.wait()
                    tasks.cancel_scope.cancel()
        except Exception as exc:
            why = _one_line(exc, self._connect_timeout)
            if not self._ready.done():
                self._ready.set_exception(
                    McpServerUnavailable(
                        f"MCP server {self._source!r} ({self._transport.describe()}) could not be opened: {why}"
                    )
                )
            else:
                logger.warning("MCP server %r: the session ended: %s", self._source, why)
        finally:
            self.closed.set()
            if not self._ready.done():
                self._ready.set_exception(McpServerUnavailable(f"MCP server {self._source!r}: stopped while opening"))

    async def _relay(
        self,
        source: MemoryObjectReceiveStream[SessionMessage | Exception],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """Passes the server's messages on to the session, and notices when the server's stream ends (a stdio
        server that exited), which the SDK alone does not report."""
        try:
            async with sink:
                async for message in source:
                    await sink.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self._wake.set()

    async def request(self, send: Callable[[ClientSession], Awaitable[T]]) -> T:
        """`send(session)`'s answer; _ConnectionLost as soon as the session ends without one."""
        session = self.session
        if session is None or self.closed.is_set():
            raise _ConnectionLost()
        call = asyncio.ensure_future(send(session))
        ended = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({call, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (call, ended):
                if not waiter.done():
                    waiter.cancel()
            await asyncio.gather(call, ended, return_exceptions=True)
        if call.cancelled():
            raise _ConnectionLost()
        error = call.exception()
        if error is not None:
            if isinstance(error, McpError) and error.error.code in _SESSION_GONE:
                raise _ConnectionLost() from None
            raise error
        return call.result()

    async def stop(self) -> None:
        self._wake.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), _STOP_SECONDS)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: a failed start is reported by start(), not logged again


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.nextCursor
        if not cursor:
            break
    return tools


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _one_line(exc: BaseException, timeout: float) -> str:
    """Why a session failed, in one line for the operator's log (never for the model)."""
    leaf = _leaf(exc)
    if isinstance(leaf, TimeoutError):
        return f"no answer within {timeout:g} s"
    text = leaf.error.message if isinstance(leaf, McpError) else str(leaf)
    text = " ".join(text.split()) or "no details"
    return f"{type(leaf).__name__}: {text}"[:_MAX_ERROR_TEXT]


# --- Results ----------------------------------------------------------------------------------------------


def _capped(text: str, limit: int = _MAX_ERROR_TEXT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_text(result: types.CallToolResult) -> str:
    """An `isError` answer's text as the model may see it: capped, and none of it where it shows the server's
    insides (a stack trace, a path, SQL: FastMCP passes an unexpected exception's text on)."""
    detail = _capped(" ".join(block.text for block in result.content if isinstance(block, types.TextContent)))
    if internal_text(detail):
        return "its details are not shown"
    return detail or "no details"


def tool_output(result: types.CallToolResult) -> dict[str, Any]:
    """The tool output for an MCP tool's answer: its text blocks and structured content (untrusted data;
    the activity caps the size), or, for `isError: true`, the server's own refusal as a ToolError."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if result.isError:
        raise ToolError(ResultCode.CONFLICT, "the tool reported an error: " + error_text(result))
    output: dict[str, Any] = {"ok": True, "content": texts, "structured": result.structuredContent}
    omitted = len(result.content) - len(texts)
    if omitted:
        # Images, audio, resources: not passed on to the model.
        output["omitted_blocks"] = omitted
    return output


# --- The source -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class McpSource:
    """An MCP server whose tools the worker offers. Build it with `McpSource.stdio(...)` or
    `McpSource.http(...)` and `Toolset.include` it; the worker opens it (starts or connects to the server,
    lists its tools) before the first task and closes it after the last.

    - `read_only`: the server's names of the tools that only read; every other tool is a write.
    - `trust_read_only_hint`: also treat a tool as read-only when it declares `readOnlyHint: true` (off by
      default: the hint is the server's word, and a wrong one would run a write without approval).
    - `prefix`: put before every tool's name ("notes_" makes `add_note` `notes_add_note`), to keep two
      servers' names apart. Names must match ^[a-zA-Z0-9_-]{1,64}$.
    - `timeout_seconds`: how long one call may take (the SDK's read timeout); each attempt's activity gets
      this plus the time to reconnect, so the executor's own bound ends a hung call.
    - `connect_timeout_seconds`: how long starting or connecting to the server and its handshake may take.

    A tool whose schema strict mode cannot honour (a free-form map, ...) or whose name is not accepted is not
    offered: it is logged at WARNING with the reason and listed in `refused` (server name -> reason), and the
    server's other tools still work. One session serves every call; when it breaks (the server exited, the
    connection dropped) the call fails cleanly and the next call opens a new one.
    """

    name: str
    transport: _Transport
    read_only: frozenset[str] = frozenset()
    trust_read_only_hint: bool = False
    prefix: str = ""
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 10.0
    # The `aud` of its writes' approval tokens (a server that checks them accepts only its own); default: the name.
    audience: str | None = None
    refused: dict[str, str] = field(default_factory=dict, init=False)
    _specs: list[ToolSpec] = field(default_factory=list, init=False, repr=False)
    _conn: _Connection | None = field(default=None, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _open: bool = field(default=False, init=False, repr=False)
    # Connection attempts so far, and how the last one failed: callers that queued behind a failed attempt
    # share its answer instead of each waiting out a connect timeout of its own.
    _attempts: int = field(default=0, init=False, repr=False)
    _last_failure: McpServerUnavailable | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("an MCP source needs a name")
        if not _PREFIX.fullmatch(self.prefix):
            raise ValueError(f"MCP source {self.name!r}: the prefix must match {_PREFIX.pattern}")
        if not 0 < self.timeout_seconds <= 600:
            raise ValueError(f"MCP source {self.name!r}: timeout_seconds must be more than 0 and at most 600")
        if not 0 < self.connect_timeout_seconds <= 120:
            raise ValueError(f"MCP source {self.name!r}: connect_timeout_seconds must be more than 0 and at most 120")
        self.read_only = frozenset(self.read_only)

    @classmethod
    def stdio(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        read_only: Iterable[str] = (),
        trust_read_only_hint: bool = False,
        prefix: str = "",
        timeout_seconds: float = 10.0,
        connect_timeout_seconds: float = 10.0,
        audience: str | None = None,
    ) -> McpSource:
        """A server the worker starts as a child process and talks to over its stdin and stdout: `command` is
        its argv. `env` is added to the SDK's minimal default environment (PATH, HOME, ...; the worker's own
        variables are not passed on); `cwd` is its working directory. Its state lives as long as its process:
        a new one is started when the session breaks."""
        if isinstance(command, str) or not command or not all(isinstance(part, str) for part in command):
            raise ValueError(f"MCP source {name!r}: command must be a non-empty list of strings (the argv)")
        return cls(
            name=name,
            transport=_Stdio(tuple(command), dict(env) if env is not None else None, os.fspath(cwd) if cwd else None),
            read_only=frozenset(read_only),
            trust_read_only_hint=trust_read_only_hint,
            prefix=prefix,
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            audience=audience,
        )

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        read_only: Iterable[str] = (),
        trust_read_only_hint: bool = False,
        prefix: str = "",
        timeout_seconds: float = 10.0,
        connect_timeout_seconds: float = 5.0,
        audience: str | None = None,
    ) -> McpSource:
        """A server reached over streamable HTTP at `url` (e.g. "http://127.0.0.1:8000/mcp"). `headers` are
        sent with every request (an API key, say: held by the worker, never in history); proxies from the
        environment are not used."""
        try:
            parts = urllib.parse.urlsplit(url)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
        except ValueError:  # a port that is not a number
            valid = False
        if not valid:
            raise ValueError(
                f"MCP source {name!r}: url must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/mcp"
            )
        return cls(
            name=name,
            transport=_Http(url, dict(headers or {}), connect_timeout_seconds),
            read_only=frozenset(read_only),
            trust_read_only_hint=trust_read_only_hint,
            prefix=prefix,
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            audience=audience,
        )

    # --- Lifecycle (the Toolset's provider protocol) -------------------------------------------------

    async def open(self) -> None:
        """Start or connect to the server and list its tools; McpServerUnavailable (an OSError) if it cannot
        be reached."""
        async with self._lock:
            if self._conn is not None:
                await self._conn.stop()
                self._conn = None
            conn = self._new_connection()
            await conn.start(list_tools=True)
            self._conn = conn
            self._open = True
        self._specs, self.refused = self._specs_for(conn.tools)
        unknown = sorted(self.read_only - {tool.name for tool in conn.tools})
        if unknown:
            logger.warning("MCP server %r lists no tool named %s (given in read_only)", self.name, ", ".join(unknown))
        logger.info(
            "MCP server %r (%s): %d tools offered, %d refused",
            self.name,
            self.transport.describe(),
            len(self._specs),
            len(self.refused),
        )

    async def close(self) -> None:
        async with self._lock:
            self._open = False
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.stop()

    def tool_specs(self) -> list[ToolSpec]:
        """The tools offered (after open); the refused ones are in `refused`."""
        return list(self._specs)

    # --- Declaring the tools ---------------------------------------------------------------------------

    def _attempt_timeout(self) -> float:
        # The call, plus a reconnect and a ping before a write: the executor's own bounds fire first.
        return min(600.0, self.timeout_seconds + 2 * self.connect_timeout_seconds + 1.0)

    def _is_read_only(self, tool: types.Tool) -> bool:
        if tool.name in self.read_only:
            return True
        hint = tool.annotations.readOnlyHint if tool.annotations is not None else None
        return self.trust_read_only_hint and hint is True

    def _specs_for(self, tools: Sequence[types.Tool]) -> tuple[list[ToolSpec], dict[str, str]]:
        """The tools offered and the ones refused (server name -> reason). Never raises: a tool the
        registry would refuse is refused here, so registering the others cannot fail."""
        specs: list[ToolSpec] = []
        refused: dict[str, str] = {}
        names: set[str] = set()
        for tool in tools:
            spec: ToolSpec | None = None
            try:
                spec = self._spec_for(tool)
                problems = registration_problems(spec)
            except Exception as exc:  # a schema odd enough to break the conversion
                logger.debug("MCP tool %r: conversion failed", tool.name, exc_info=True)
                problems = [f"its input schema could not be converted ({type(exc).__name__})"]
            if spec is not None and spec.name in names:
                problems.insert(0, "the server lists a tool of this name twice")
            if problems or spec is None:
                reason = "; ".join(problems)
                refused[tool.name] = reason
                logger.warning("MCP server %r: tool %r is not offered: %s", self.name, tool.name, reason)
                continue
            names.add(spec.name)
            specs.append(spec)
        return specs, refused

    def _spec_for(self, tool: types.Tool) -> ToolSpec:
        schema = JsonSchemaArguments(tool.inputSchema)
        read_only = self._is_read_only(tool)
        # The server's words reach the model as they are, so they are capped like any untrusted text.
        description = _capped((tool.description or tool.title or "").strip(), _MAX_DESCRIPTION_CHARS)
        if read_only:
            return ToolSpec(
                name=self.prefix + tool.name,
                description=description,
                arguments=schema,
                effect="read_only",
                execute=self._executor(tool.name, schema, write=False),
                timeout_seconds=self._attempt_timeout(),
            )
        return ToolSpec(
            name=self.prefix + tool.name,
            description=description,
            arguments=schema,
            effect="side_effecting",
            execute=self._executor(tool.name, schema, write=True),
            timeout_seconds=self._attempt_timeout(),
            status=None,
            read_back=None,
            without_status=True,
            without_read_back=True,
            audience=self.audience or self.name,
        )

    def _executor(
        self, tool: str, schema: JsonSchemaArguments, *, write: bool
    ) -> Callable[[ToolContext, Any], Awaitable[dict[str, Any]]]:
        async def execute(ctx: ToolContext, args: Any) -> dict[str, Any]:
            # Optional properties the model sent as null are left out: the server sees what its schema allows.
            arguments = schema.without_nulls(args)
            if write:
                return await self._call_write(tool, arguments)
            return await self._call_read(tool, arguments)

        return execute

    # --- Calls -----------------------------------------------------------------------------------------

    def _new_connection(self) -> _Connection:
        return _Connection(self.name, self.transport, self.timeout_seconds, self.connect_timeout_seconds)

    async def _connection(self) -> tuple[_Connection, bool]:
        """The live session, or a new one (True: just opened). McpServerUnavailable if none can be opened."""
        seen = self._attempts
        async with self._lock:
            if not self._open:
                raise McpServerUnavailable(f"MCP source {self.name!r} is not open (the worker opens its sources)")
            conn = self._conn
            if conn is not None and conn.usable:
                return conn, False
            if self._attempts != seen and self._last_failure is not None:
                raise self._last_failure  # an attempt made while this call waited failed just now
            self._conn = None
            if conn is not None:
                await conn.stop()
            conn = self._new_connection()
            self._attempts += 1
            try:
                await conn.start(list_tools=False)
            except McpServerUnavailable as exc:
                logger.warning("%s", exc)
                self._last_failure = exc
                raise
            self._last_failure = None
            logger.info("MCP server %r: reconnected", self.name)
            self._conn = conn
            return conn, True

    async def _discard(self, conn: _Connection) -> None:
        """Drop a session that broke; the next call opens a new one."""
        async with self._lock:
            if self._conn is conn:
                self._conn = None
        await conn.stop()

    def _call_tool(self, tool: str, arguments: dict[str, Any]) -> Callable[[ClientSession], Awaitable[Any]]:
        timeout = timedelta(seconds=self.timeout_seconds)
        return lambda session: session.call_tool(tool, arguments, read_timeout_seconds=timeout)

    async def _call_read(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A read: anything the transport does wrong is temporary (the activity retries it)."""
        unreachable = f"MCP server {self.name!r} could not be reached"
        try:
            conn, _ = await self._connection()
        except McpServerUnavailable:
            raise ToolTemporaryError(unreachable) from None
        try:
            result: types.CallToolResult = await conn.request(self._call_tool(tool, arguments))
        except _ConnectionLost:
            await self._discard(conn)
            raise ToolTemporaryError(f"the session with MCP server {self.name!r} broke") from None
        except McpError as err:
            if err.error.code == _REQUEST_TIMEOUT:
                raise ToolTemporaryError(f"MCP server {self.name!r} did not answer in time") from None
            if err.error.code == types.INVALID_PARAMS:
                raise ToolError(ResultCode.BAD_ARGUMENTS, "the tool's server rejected the arguments") from None
            raise ToolTemporaryError(f"MCP server {self.name!r} answered with an error") from None
        except RuntimeError:
            # The SDK's check of structured content against the tool's declared output schema.
            raise ToolError(ResultCode.INTERNAL, "the tool's answer does not match what it declares") from None
        except TimeoutError:
            raise ToolTemporaryError(f"MCP server {self.name!r} did not answer in time") from None
        except _TRANSPORT_ERRORS:
            await self._discard(conn)
            raise ToolTemporaryError(f"the session with MCP server {self.name!r} broke") from None
        return tool_output(result)

    async def _call_write(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A write: WriteNotSent only while the call certainly has not left; after that anything but the
        tool's own answer is an unknown outcome."""
        conn = await self._session_for_write()
        try:
            result: types.CallToolResult = await conn.request(self._call_tool(tool, arguments))
        except _ConnectionLost:
            await self._discard(conn)
            raise WriteOutcomeUnknown(f"the session with MCP server {self.name!r} broke during the call") from None
        except McpError as err:
            if err.error.code == _REQUEST_TIMEOUT:
                raise WriteOutcomeUnknown(f"MCP server {self.name!r} did not answer in time") from None
            raise WriteOutcomeUnknown(f"MCP server {self.name!r} gave no definite answer") from None
        except _TRANSPORT_ERRORS:
            await self._discard(conn)
            raise WriteOutcomeUnknown(f"the session with MCP server {self.name!r} broke during the call") from None
        except Exception:
            # An answer that does not parse or does not match the output schema, a timeout: it may have acted.
            raise WriteOutcomeUnknown(f"the call to MCP server {self.name!r} ended without a definite answer") from None
        if result.isError:
            # An error answer does not say whether the tool acted before it failed (FastMCP answers so for an
            # exception raised after the effect): unknown, never "not done", and so never sent again.
            raise WriteOutcomeUnknown(f"MCP server {self.name!r} reported an error: {error_text(result)}")
        return tool_output(result)

    async def _session_for_write(self) -> _Connection:
        """A session that answered just now. A session opened before this call is pinged first, so a server that
        went away since is found out before anything is sent: WriteNotSent when no session answers."""
        not_sent = f"MCP server {self.name!r} could not be reached; nothing was sent"
        try:
            conn, fresh = await self._connection()
        except McpServerUnavailable:
            raise WriteNotSent(not_sent) from None
        if fresh:
            return conn
        try:
            async with asyncio.timeout(min(self.connect_timeout_seconds, _MAX_PING_SECONDS)):
                await conn.request(lambda session: session.send_ping())
            return conn
        except _ConnectionLost:
            pass
        except Exception as exc:
            if conn.usable:
                # Alive but not answering: leave it (a stdio server would lose its state), send nothing.
                logger.warning("MCP server %r did not answer a ping: %s", self.name, _one_line(exc, _MAX_PING_SECONDS))
                raise WriteNotSent(f"MCP server {self.name!r} did not answer; nothing was sent") from None
        await self._discard(conn)
        try:
            conn, _ = await self._connection()
        except McpServerUnavailable:
            raise WriteNotSent(not_sent) from None
        return conn
