"""I/O: the fault proxy - a TCP proxy on loopback between the tools and the business service that reads
just enough HTTP/1.1 to count requests, and injects a plan's wire faults on the real socket.

Each client connection gets its own connection to the service. A request is read whole (head and
Content-Length body), numbered for every wire fault it matches, and the first fault that fires on its
number acts on it (faultbed.plan.fault_fires: the Nth matching call, or a seeded draw):

- `latency`: the request waits `latency_ms`, then goes through; a client that hangs up meanwhile (a worker
  killed while its request waits) never had it sent, and the service never sees it;
- `reset`: the request reaches the service and the service answers; the client's connection is reset before
  any byte of that answer (the service has acted: an unknown outcome for the client);
- `timeout`: the request reaches the service and the reply is withheld; the connection stays open and
  silent until the client gives up;
- `cut_reply`: the request reaches the service; half of its reply is sent, then the connection closes;
- `refused`: the request never reaches the service; its connection is reset as soon as it arrived;
- `down`: like `refused`, and the proxy stops listening for `latency_ms` (dropping its idle connections):
  every connection tried meanwhile is refused by the kernel, before anything was sent;
- `plant`: the request reaches the service; its JSON reply comes back with `text` written into `field`
  (appended to a string there, else in its place) - hostile content in a tool's output, as if the service's
  data held it. A reply that is not a JSON object with a Content-Length passes unchanged (and the fault does
  not count as fired).
- `forge_token`: the write reaches the service with its policy decision (the first token of its
  `X-Approval-Token`) re-signed with a key of the proxy's own: the same claims, a forged signature, as an
  attacker on the wire or a compromised model worker would send it. A request without a decision passes
  unchanged (and the fault does not count as fired).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from faultbed.plan import WireFaultSpec, fault_fires
from toolloop._core.approvals import (
    PolicyDecisionInvalid,
    generate_signing_key,
    join_tokens,
    mint_approval_token,
    read_policy_claims,
    split_tokens,
)

_MAX_HEAD_BYTES = 64 * 1024
_MAX_BODY_BYTES = 16 * 1024 * 1024
# How long a withheld reply keeps its connection open at most (the client's own timeout ends it first).
_TIMEOUT_HOLD_S = 300.0


class _BadHttp(Exception):
    pass


@dataclass
class _Message:
    """One HTTP/1.1 request or response, as bytes, with what the proxy needs from its head."""

    raw: bytes
    start_line: str
    close: bool


@dataclass
class WireFault:
    """A wire fault of a plan, with its index there (its seeded draws and its counts go by the index)."""

    index: int
    spec: WireFaultSpec


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    faults: Sequence[WireFault]
    seed: int = 0
    # Per fault index: the requests it matched, and those it acted on.
    matched: Counter[int] = field(default_factory=Counter)
    fired: Counter[int] = field(default_factory=Counter)
    # Wall-clock time each fault first fired (for the recovery time).
    first_fired_at: dict[int, float] = field(default_factory=dict)
    # Every request the proxy saw, in order: (method, path, fault index or None).
    log: list[tuple[str, str, int | None]] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _host: str = "127.0.0.1"
    _port: int = 0
    _idle: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    # The key a forge_token fault signs with: no service knows it.
    _forger: str = field(default_factory=generate_signing_key)

    @property
    def port(self) -> int:
        return self._port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen (on a free port unless given one); returns the port."""
        self._host = host
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        self._port = self._server.sockets[0].getsockname()[1]
        return self._port

    async def stop(self) -> None:
        await self._stop_listening()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_listening(self) -> None:
        # Not wait_closed(): from Python 3.12 it waits for every open connection, this one's caller included.
        if self._server is not None:
            self._server.close()
            self._server = None

    # --- One client connection ---------------------------------------------------------------------------

    async def _serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                self._idle.add(client)
                try:
                    request = await _read_message(client_reader, is_request=True)
                finally:
                    self._idle.discard(client)
                if request is None:
                    return
                method, path = _method_and_path(request.start_line)
                fault = self._fault_for(method, path)
                self.log.append((method, path, None if fault is None else fault.index))
                kind = None if fault is None else fault.spec.fault
                if kind == "latency":
                    assert fault is not None
                    if await self._client_left(client_reader, fault.spec.latency_ms / 1000):
                        return
                if kind in ("refused", "down"):
                    _reset(client)
                    if kind == "down":
                        assert fault is not None
                        await self._go_away(fault.spec.latency_ms / 1000)
                    return
                if kind == "forge_token":
                    assert fault is not None
                    forged = forged_decision(request.raw, self._forger)
                    if forged is None:
                        self.fired[fault.index] -= 1
                    else:
                        request = _Message(raw=forged, start_line=request.start_line, close=request.close)
                if upstream is None:
                    upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
                up_reader, up_writer = upstream
                up_writer.write(request.raw)
                await up_writer.drain()
                if kind == "reset":
                    # The service answers first, then the client's connection is reset before any byte of that
                    # answer: the reply is lost after the service acted, whatever the machine's load.
                    await _read_message(up_reader, is_request=False)
                    _reset(client)
                    return
                reply = await _read_message(up_reader, is_request=False)
                if reply is None:
                    return
                if kind == "timeout":
                    await self._hold(client_reader)
                    return
                if kind == "plant":
                    assert fault is not None
                    planted = _planted(reply.raw, fault.spec.field, fault.spec.text)
                    if planted is None:
                        self.fired[fault.index] -= 1
                    else:
                        reply = _Message(raw=planted, start_line=reply.start_line, close=reply.close)
                if kind == "cut_reply":
                    client.write(reply.raw[: max(len(reply.raw) // 2, 1)])
                    await client.drain()
                    client.close()
                    return
                client.write(reply.raw)
                await client.drain()
                if request.close or reply.close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, _BadHttp, OSError):
            return
        except asyncio.CancelledError:
            # The proxy is stopping: end this connection quietly (the server's callback reads the result).
            return
        finally:
            self._tasks.discard(task)
            for writer in (client, upstream[1] if upstream else None):
                if writer is not None and not writer.is_closing():
                    writer.close()

    def _fault_for(self, method: str, path: str) -> WireFault | None:
        """Number the request for every fault it matches; the first that fires on its number acts."""
        chosen = None
        for fault in self.faults:
            if not fault.spec.match.matches(method, path):
                continue
            self.matched[fault.index] += 1
            if chosen is None and fault_fires(
                fault.spec.when, self.seed, fault.index, self.matched[fault.index], self.fired[fault.index]
            ):
                chosen = fault
                self.fired[fault.index] += 1
                self.first_fired_at.setdefault(fault.index, time.time())
        return chosen

    async def _client_left(self, client_reader: asyncio.StreamReader, seconds: float) -> bool:
        """Wait `seconds`; True as soon as the client closes its connection meanwhile. (Any byte ends the
        wait too: HTTP/1.1 clients do not pipeline, so the only thing that can come is the close.)"""
        try:
            await asyncio.wait_for(client_reader.read(1), seconds)
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    async def _hold(self, client_reader: asyncio.StreamReader) -> None:
        """Keep a connection open and silent until the client closes it (or a long bound passes)."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(client_reader.read(), _TIMEOUT_HOLD_S)

    async def _go_away(self, seconds: float) -> None:
        """Stop listening for `seconds` (new connections are refused) and drop the idle ones, so the
        client's next request must connect; then listen again on the same port."""
        await self._stop_listening()
        for writer in list(self._idle):
            writer.close()
        self._idle.clear()
        await asyncio.sleep(seconds)
        self._server = await asyncio.start_server(self._serve, self._host, self._port, reuse_address=True)


def forged_decision(raw: bytes, key: str) -> bytes | None:
    """The request with the policy decision in its `X-Approval-Token` (the first token) re-signed with `key`,
    the people's approvals after it kept; None if it carries no policy decision."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    for number, line in enumerate(lines[1:], start=1):
        name, _, value = line.partition(":")
        if name.strip().lower() != "x-approval-token":
            continue
        tokens = split_tokens(value)
        try:
            claims = read_policy_claims(tokens[0]) if tokens else None
        except PolicyDecisionInvalid:
            return None  # a person's approval (no policy on this service): not a policy decision
        if claims is None:
            return None
        lines[number] = f"{name}: {join_tokens([mint_approval_token(key, claims), *tokens[1:]])}"
        return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
    return None


def _planted(raw: bytes, field: str, text: str) -> bytes | None:
    """The reply with `text` planted at `field` of its JSON body, its Content-Length updated; None if it has
    no such body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not any(line.lower().startswith("content-length:") for line in lines[1:]):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    *path, last = field.split(".")
    node: Any = data
    for part in path:
        node = (
            node[int(part)]
            if isinstance(node, list) and part.isdigit()
            else node.get(part)
            if isinstance(node, dict)
            else None
        )
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        key: Any = int(last)
    elif isinstance(node, dict):
        key = last
    else:
        return None
    current = node[key] if isinstance(node, list) else node.get(key)
    node[key] = f"{current} {text}" if isinstance(current, str) else text
    encoded = json.dumps(data).encode()
    kept = [line for line in lines[1:] if not line.lower().startswith("content-length:")]
    return "\r\n".join([lines[0], *kept, f"content-length: {len(encoded)}"]).encode("latin-1") + b"\r\n\r\n" + encoded


def _child(node: Any, part: str) -> Any:
    if isinstance(node, list) and part.isdigit():
        return node[int(part)] if int(part) < len(node) else None
    return node.get(part) if isinstance(node, dict) else None


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN: the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _method_and_path(start_line: str) -> tuple[str, str]:
    parts = start_line.split(" ")
    if len(parts) != 3:
        raise _BadHttp(start_line)
    return parts[0], parts[1].split("?", 1)[0]


async def _read_message(reader: asyncio.StreamReader, *, is_request: bool) -> _Message | None:
    """One whole HTTP/1.1 message (None at a clean end of the stream before it began)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError:
        raise _BadHttp("head too long") from None
    if len(head) > _MAX_HEAD_BYTES:
        raise _BadHttp("head too long")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    close = headers.get("connection", "").lower() == "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if length > _MAX_BODY_BYTES:
            raise _BadHttp("body too long")
        body = await reader.readexactly(length)
    elif is_request or _no_body(lines[0]):
        body = b""
    else:
        body = await reader.read(_MAX_BODY_BYTES)  # a reply that ends with its connection
        close = True
    return _Message(raw=head + body, start_line=lines[0], close=close)


def _no_body(status_line: str) -> bool:
    parts = status_line.split(" ")
    return len(parts) > 1 and (parts[1].startswith("1") or parts[1] in ("204", "304"))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        out += size_line
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            # Trailers, then the empty line.
            while True:
                line = await reader.readuntil(b"\r\n")
                out += line
                if line == b"\r\n":
                    return bytes(out)
        if len(out) + size > _MAX_BODY_BYTES:
            raise _BadHttp("body too long")
        out += await reader.readexactly(size + 2)
