"""Connections: how many may be open, and how long each may take to say what it wants.

Left alone, uvicorn keeps a connection for as long as the client likes before its first
request, while a request's head trickles in, and while its body does; a few thousand such
sockets used up the open-file limit and nobody else got in. :class:`GuardedHttp` (uvicorn's
httptools protocol, as ``Config(http=...)``) adds, per connection:

- a cap on open connections (``--max-connections``). A newcomer past it closes the
  connection that has been quiet longest among those running no request (idle keep-alive,
  or a head still arriving); when every connection runs a request it gets a 503 instead;
- an idle deadline (``--idle-timeout``): a connection that sends nothing is closed, fresh
  ones as well as uvicorn's keep-alive ones;
- a head deadline (``--header-timeout``): from its first byte, a request's line and headers
  must be complete in this time (408 otherwise), and may not pass :data:`MAX_HEAD_BYTES`
  (431);
- a body rate (``--body-min-rate``): after the head, the body may take the same grace and
  then must keep up this average rate (408 otherwise): a slow upload of any size passes,
  a body that trickles forever does not. Time the server itself stops reading (its app is
  not reading the body yet) is not held against the client.

What the guard did is logged as one summary line at most every :data:`NOTE_EVERY_S`, and the
accept error a full file table would cause is rate-limited the same way
(``accept_errors.AcceptErrorFilter``), so a flood cannot fill the disk with the log.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import fcntl
import json
import logging
import termios
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..fdlimit import open_file_limit
from .accept_errors import NOTE_EVERY_S, install_accept_error_filter

log = logging.getLogger("mlxbun.server")

DEFAULT_MAX_CONNECTIONS = 1024
FD_RESERVE = 256  # descriptors kept for model files, caches, pipes and the engine's sockets
DEFAULT_IDLE_TIMEOUT_S = 5.0  # uvicorn's own keep-alive default
DEFAULT_HEADER_TIMEOUT_S = 20.0
DEFAULT_BODY_MIN_RATE = 1024  # bytes per second: below any real link
MAX_HEAD_BYTES = 64 * 1024
LINGER_S = 1.0  # a refused client's time to read its 503 before the socket closes
EVICT_SCAN = 64  # connections with unread bytes skipped at most, per newcomer

# status: (reason phrase, OpenAI type, code, Anthropic type)
_ANSWERS = {408: ("Request Timeout", "invalid_request_error", "request_timeout",
                  "invalid_request_error"),
            431: ("Request Header Fields Too Large", "invalid_request_error",
                  "request_header_fields_too_large", "invalid_request_error"),
            503: ("Service Unavailable", "unavailable_error", "too_many_connections",
                  "overloaded_error")}
_NOTES = (("idle", "idle closed"), ("head", "heads too slow (408)"),
          ("body", "bodies too slow (408)"), ("large", "heads too large (431)"),
          ("evicted", "quiet ones closed for newcomers"),
          ("refused", "refused (503: every connection busy)"))


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    body_min_rate: float = DEFAULT_BODY_MIN_RATE  # 0: no rate (the head deadline still holds)
    max_head_bytes: int = MAX_HEAD_BYTES


def default_max_connections(fd_limit: int | None) -> int:
    """1024, or half of what the open-file limit leaves after :data:`FD_RESERVE` (a
    proxied request holds a second socket in the ``--isolate`` parent)."""
    if fd_limit is None:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, (fd_limit - FD_RESERVE) // 2))


def limits_from_args(args: argparse.Namespace) -> ConnectionLimits:
    """The serve flags' limits (a flag left out: its default)."""
    cap = getattr(args, "max_connections", None)
    return ConnectionLimits(
        max_connections=cap or default_max_connections(open_file_limit()),
        idle_timeout=getattr(args, "idle_timeout", None) or DEFAULT_IDLE_TIMEOUT_S,
        header_timeout=getattr(args, "header_timeout", None) or DEFAULT_HEADER_TIMEOUT_S,
        body_min_rate=float(getattr(args, "body_min_rate", DEFAULT_BODY_MIN_RATE)))


def uvicorn_settings(limits: ConnectionLimits, app: Any = None) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments that put ``limits`` in force; an ``app`` with
    ``/stats`` providers (``app.state.stats_providers``) gets a ``connections`` section."""
    install_accept_error_filter()
    protocol = guarded_protocol(limits)
    providers = getattr(getattr(app, "state", None), "stats_providers", None)
    if isinstance(providers, dict):
        providers["connections"] = protocol.tally.stats
    return {"http": protocol, "timeout_keep_alive": limits.idle_timeout}


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttp]:
    """A :class:`GuardedHttp` for one server: its limits and its own tally."""

    class Guarded(GuardedHttp):
        pass

    Guarded.limits, Guarded.tally = limits, Tally(limits)
    return Guarded


class Tally:
    """What the guard did, said in one line at most every :data:`NOTE_EVERY_S` (a lone
    event at once; a flood as counts)."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.pending: Counter[str] = Counter()
        self.total: Counter[str] = Counter()
        self.last = -NOTE_EVERY_S
        self.handle: asyncio.TimerHandle | None = None
        self.open: set[Any] = set()  # uvicorn's set of open connections, once one came
        # this server's HTTP connections, the one quiet longest first (the eviction order)
        self.quiet: OrderedDict[GuardedHttp, None] = OrderedDict()

    def stats(self) -> dict[str, Any]:
        """``/stats.connections``: open now, the limits, and what the guard closed."""
        lim = self.limits
        return {"open": len(self.open), "max": lim.max_connections,
                "idle_timeout_s": lim.idle_timeout, "header_timeout_s": lim.header_timeout,
                "body_min_rate": lim.body_min_rate, "closed": {k: self.total[k] for k, _ in _NOTES}}

    def note(self, loop: asyncio.AbstractEventLoop, what: str, open_now: set[Any]) -> None:
        self.pending[what] += 1
        self.total[what] += 1
        if self.handle is None:
            wait = max(0.0, self.last + NOTE_EVERY_S - loop.time())
            self.handle = loop.call_later(wait, self.flush, loop, open_now)

    def flush(self, loop: asyncio.AbstractEventLoop, open_now: set[Any]) -> None:
        self.handle, self.last = None, loop.time()
        parts = [f"{self.pending[key]} {label}" for key, label in _NOTES if self.pending[key]]
        self.pending.clear()
        if parts:
            log.warning("connections: %s; %d open of %d", ", ".join(parts), len(open_now),
                        self.limits.max_connections)


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the cap and the deadlines of the module doc."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    tally: ClassVar[Tally] = Tally(ConnectionLimits())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.phase = "idle"  # idle, head, body, app (the request read, its answer pending)
        self.head_bytes = 0
        self.body_bytes = 0
        self.body_since = 0.0
        self.hanging_up = False  # answered and closing: what the client sends is dropped

    # -- accept ------------------------------------------------------------------------
    # uvicorn narrows asyncio's BaseTransport to Transport in its own signature
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.tally.open = self.connections
        if len(self.connections) >= self.limits.max_connections and not self._make_room():
            self.transport = transport
            self._note("refused")
            self._answer(503, "the server has as many connections open as it allows "
                         "(--max-connections); try again shortly", retry=True)
            return
        super().connection_made(transport)
        self.tally.quiet[self] = None
        self._arm(self.limits.idle_timeout, self._idle_expired)

    def _make_room(self) -> bool:
        """Close the connection quiet longest among those running no request (one whose
        request head was arriving gets a 503 first). One whose bytes already wait in the
        kernel is not quiet (accepted in the same burst as a flood, its request is about to
        be read): it goes to the back of the line."""
        quiet = self.tally.quiet
        victim = None
        for _ in range(min(len(quiet), EVICT_SCAN)):
            first = next((c for c in quiet if c.evictable()), None)
            if first is None or not first.bytes_waiting():
                victim = first
                break
            quiet.move_to_end(first)
        if victim is None:
            return False
        self._note("evicted")
        victim.evict()
        return True

    def evict(self) -> None:
        """Close this quiet connection for a newer one; its slot is free at once."""
        self._cancel()
        del self.tally.quiet[self]
        self.connections.discard(self)  # its slot is free now, not when the close lands
        if self.phase == "head":  # a request half sent gets an answer, not a bare close
            self._answer(503, "the server closed this connection for a newer one: it has "
                         "as many open as it allows (--max-connections); try again shortly",
                         retry=True)
        else:
            self.transport.close()

    def bytes_waiting(self) -> bool:
        """The client has sent bytes the server has not read yet."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            buf = array.array("i", [0])
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
        except (OSError, ValueError):
            return False
        return buf[0] > 0

    def evictable(self) -> bool:
        """No request of this connection is running or waiting (a head may be arriving)."""
        if self.hanging_up or self.transport.is_closing():
            return False
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    # -- the request's phases ----------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.hanging_up:
            return
        if self in self.tally.quiet:
            self.tally.quiet.move_to_end(self)
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.phase, self.head_bytes = "head", 0
        self._arm(self.limits.header_timeout, self._head_expired)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > self.limits.max_head_bytes:
            raise HeadTooLarge  # stops the parser; uvicorn then calls send_400_response

    def send_400_response(self, msg: str) -> None:
        if self.head_bytes > self.limits.max_head_bytes:
            self._note("large")
            self._answer(431, f"the request's line and headers pass "
                         f"{self.limits.max_head_bytes} bytes")
            return
        super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._cancel()
        super().on_headers_complete()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # a WebSocket: its own protocol takes the connection
        self.phase = "body"
        if self.limits.body_min_rate > 0:
            self.body_bytes, self.body_since = 0, self.loop.time()
            self._arm(self.limits.header_timeout, self._check_body)

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel()
        self.phase = "app"
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._settle()  # answered before its body ended (an error, or a route that
            # reads no body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.phase == "app":
            self._settle()

    def _settle(self) -> None:
        """Between requests: the idle deadline (uvicorn's keep-alive timer ends at the
        first byte, even one that starts no request)."""
        running = self.cycle is not None and not self.cycle.response_complete
        if not running and not self.pipeline and not self.transport.is_closing():
            self.phase = "idle"
            self._arm(self.limits.idle_timeout, self._idle_expired)

    def handle_websocket_upgrade(self) -> None:
        self._cancel()
        self.tally.quiet.pop(self, None)  # the WebSocket protocol has the connection now
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self.tally.quiet.pop(self, None)
        if self.hanging_up and self.flow is None:  # refused at accept: uvicorn never saw it
            return
        super().connection_lost(exc)

    # -- deadlines ---------------------------------------------------------------------
    def _arm(self, delay: float, then: Any) -> None:
        self._cancel()
        self.deadline = self.loop.call_later(delay, then)

    def _cancel(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _idle_expired(self) -> None:
        self.deadline = None
        if self.phase == "idle" and not self.transport.is_closing():
            self._note("idle")
            self.transport.close()

    def _head_expired(self) -> None:
        self.deadline = None
        self._note("head")
        self._answer(408, f"the request's line and headers took longer than "
                     f"{self.limits.header_timeout:g} s")

    def _check_body(self) -> None:
        """The body keeps up: ``header_timeout`` of grace, then ``body_min_rate``."""
        now = self.loop.time()
        if self.flow is not None and self.flow.read_paused:  # the app is not reading yet
            self.body_bytes, self.body_since = 0, now
            self._arm(self.limits.header_timeout, self._check_body)
            return
        due = self.body_since + self.limits.header_timeout \
            + self.body_bytes / self.limits.body_min_rate
        if now < due:
            self._arm(due - now, self._check_body)
            return
        self.deadline = None
        self._note("body")
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() ends, its late writes are dropped
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
        self._answer(408, f"the request body came slower than "
                     f"{self.limits.body_min_rate:g} bytes/s")

    # -- answers -----------------------------------------------------------------------
    def _answer(self, status: int, message: str, *, retry: bool = False) -> None:
        """Write a final JSON error, then close once the client has had time to read it
        (closing at once, with its bytes unread, would reset the connection)."""
        self._cancel()
        self.hanging_up = True
        reason, kind, code, anthropic = _ANSWERS[status]
        url = getattr(self, "url", b"") or b""  # as far as it came (none before a request)
        shape = {"type": "error", "error": {"type": anthropic, "message": message}} \
            if url.lower().startswith(b"/v1/messages") else \
            {"error": {"message": message, "type": kind, "code": code}}
        body = json.dumps(shape).encode()
        head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n"
                + ("retry-after: 1\r\n" if retry else "") + "\r\n")
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(head.encode() + body)
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    def _note(self, what: str) -> None:
        self.tally.note(self.loop, what, self.connections)


class HeadTooLarge(Exception):
    """A request's line and headers passed the cap (raised inside the parser)."""
