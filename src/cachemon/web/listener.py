"""The listener's connection state machine: one event-loop thread owns every socket.

It accepts, runs TLS handshakes non-blocking, reads requests and writes replies, so an idle,
half-sent or pre-handshake connection costs a socket and a few hundred bytes, never a thread.
Every state but BUSY has a deadline; ``_sweep`` ends the connections past theirs and counts why.
Complete requests go to ``_dispatch`` (the application, web/workers.py); replies come back from
any thread through ``_post``.
"""
from __future__ import annotations

import errno
import functools
import heapq
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cachemon.web.connection import (
    EVICTABLE,
    Conn,
    ConnState,
    Limits,
    LogLimiter,
    fd_headroom,
    host_port,
    reason,
    unsent_bytes,
)
from cachemon.web.handler import BadRequest, Request, body_length, parse_request, response
from cachemon.web.web_config import WebConfigSource

log = logging.getLogger("cachemon.http")

# A reply: its bytes, or its parts (a head of its own, then a page shared with other replies).
Reply = bytes | tuple[bytes, ...]

# Bytes read from a connection at a time; reading stops at the first complete request head, so a
# client pipelining requests it never reads the replies to has at most this much buffered here.
_READ_CHUNK = 8192
# Slow readers closed at once when the server is full: one scan of the connections pays for
# several accepts (a flood of reconnecting slow readers would otherwise cost a scan per accept).
_EVICT_BATCH = 16


class Listener:
    """The event loop. ``serve_forever`` runs it; ``shutdown`` stops it; ``server_close`` closes
    the sockets. ``server_address`` is the bound (host, port, ...)."""

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, dual_stack: bool,
                 limits: Limits, web: WebConfigSource) -> None:
        self.limits = limits
        self.web = web
        self.tls = web.current()[0].ssl_context is not None
        self.max_connections = min(limits.max_connections, fd_headroom())
        self.refused: Counter[str] = Counter()
        self.address_family = family
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
            self.socket.bind(address)
            self.socket.listen(limits.backlog)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.socket, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, Conn] = {}          # by id(conn)
        self._replies: queue.SimpleQueue[tuple[Conn, Reply, bool, float]] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._accept_paused_until = 0.0
        self._log = LogLimiter()
        self._held: set[Conn] = set()              # HELD: a pipelined request waits for its client
        # connections with a pipelined request already read: one request each per pass of the
        # loop, so a client pipelining thousands takes its turn like any other, and no recursion
        self._runnable: list[Conn] = []
        self._deferred: list[tuple[float, int, Conn, Reply, bool]] = []     # a heap by when due
        self._deferred_seq = 0
        # reply buffers still referenced by a connection's unsent output: by id, [references, size]
        self._buffers: dict[int, list[int]] = {}
        self.buffered_bytes = 0

    def _dispatch(self, c: Conn, req: Request) -> None:
        """Answer a complete request: ``_reply`` now (loop thread) or ``_post`` later (any thread)."""
        raise NotImplementedError

    def _stop_workers(self) -> None:
        """Called once by ``server_close`` before the sockets close."""

    # --- the event loop -------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        self._stopped.clear()
        try:
            last_sweep = 0.0
            while not self._closing.is_set():
                timeout = 0.0 if self._runnable else poll_interval
                if self._deferred:
                    timeout = min(timeout, max(0.0, self._deferred[0][0] - time.monotonic()))
                if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._sel.register(self.socket, selectors.EVENT_READ, None)
                ready = self._sel.select(timeout)
                if len(ready) > 1:
                    ready.sort(key=_turn)
                for key, _events in ready:
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                        self._take_replies()
                    else:
                        self._guarded(key.data)
                self._take_replies()
                self._run_pipelined()
                now = time.monotonic()
                self._send_deferred(now)
                if now - last_sweep >= 0.05:
                    last_sweep = now
                    self._sweep(now)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._closing.set()
        self._wake()
        self._stopped.wait(10)

    def server_close(self) -> None:
        if not self._stopped.is_set():
            self.shutdown()
        self._closing.set()
        self._stop_workers()
        for c in list(self._conns.values()):
            self._close(c)
        for s in (self.socket, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    def reload_web_config(self) -> str:
        """SIGHUP: re-read the web config now."""
        return self.web.reload()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:     # buffer full (a wake-up is already pending) or closed
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _watch(self, c: Conn, events: int) -> None:
        if events == c.events:
            return
        try:
            if not events:
                self._sel.unregister(c.sock)
            elif not c.events:
                self._sel.register(c.sock, events, c)
            else:
                self._sel.modify(c.sock, events, c)
        except (KeyError, ValueError, OSError):
            pass
        c.events = events

    def _accept(self) -> None:
        for _ in range(64):     # a burst at a time, so the rest of the loop keeps running
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.refused["fd_limit"] += 1
                    self._log(logging.WARNING, "cannot accept a connection: %s", e.strerror)
                    if not self._evict_one():
                        # nothing to close: stop accepting for a moment instead of spinning
                        self._sel.unregister(self.socket)
                        self._accept_paused_until = time.monotonic() + 0.1
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                self._log(logging.WARNING, "cannot accept a connection: %s", reason(e))
                return
            sock.setblocking(False)
            if self.limits.send_buffer:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer)
                except OSError:
                    pass
            if len(self._conns) >= self.max_connections and not self._evict_one():
                self.refused["connection_limit"] += 1
                sock.close()
                continue
            peer = host_port(*addr[:2]) if isinstance(addr, tuple) else "?"
            now = time.monotonic()
            if self.tls:
                c = Conn(sock, peer, ConnState.HELLO, now + self.limits.handshake_timeout)
            else:
                c = Conn(sock, peer, ConnState.READ, now + self.limits.request_timeout)
            self._conns[id(c)] = c
            self._watch(c, selectors.EVENT_READ)

    def _stalled(self, c: Conn, now: float) -> bool:
        """A slow reader: its reply has not moved for stall_timeout, or its next request waits
        for it to take the replies already sent."""
        return c.state == ConnState.HELD or (c.state == ConnState.WRITE
                                             and now - c.progress >= self.limits.stall_timeout)

    def _evict_one(self) -> bool:
        """Make room for a new connection: close slow readers and held-back refusals (the longest
        stalled first, a few at once), else the connection idle the longest. False when every
        connection is being served."""
        now = time.monotonic()
        stalled = [c for c in self._conns.values() if c.state == ConnState.DEFER or self._stalled(c, now)]
        if stalled:
            for c in heapq.nsmallest(_EVICT_BATCH, stalled, key=lambda c: c.progress):
                if c.state == ConnState.DEFER:      # refused anyway: closed without its refusal
                    self.refused["connection_limit"] += 1
                    self._close(c)
                else:
                    self._close_slow_reader(c, f"{len(self._conns)} connections open, the limit")
            return True
        idle = [c for c in self._conns.values() if c.state in EVICTABLE]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.since)
        self.refused["connection_limit"] += 1
        self._log(logging.INFO, "closed idle connection from %s: %d connections open, the limit",
                  oldest.peer, len(self._conns))
        self._close(oldest)
        return True

    def _close_slow_reader(self, c: Conn, why: str) -> None:
        self.refused["slow_reader"] += 1
        self._log(logging.INFO, "closed connection from %s: not reading its replies; %s", c.peer, why)
        self._close(c)

    def _over_budget(self) -> None:
        """Reply bytes over max_buffered_bytes: close the stalled connections holding the most
        until under it (connections whose replies move are never closed for it)."""
        now = time.monotonic()
        stalled = sorted((c for c in self._conns.values() if c.holding and self._stalled(c, now)),
                         key=lambda c: sum(len(m) for m in c.out), reverse=True)
        for c in stalled:
            if self.buffered_bytes <= self.limits.max_buffered_bytes:
                return
            self._close_slow_reader(c, f"{self.buffered_bytes} reply bytes buffered, the limit")

    def _hold(self, c: Conn, parts: tuple[bytes, ...]) -> None:
        self._release(c)
        c.holding = parts
        for p in parts:
            entry = self._buffers.get(id(p))
            if entry is None:
                self._buffers[id(p)] = [1, len(p)]
                self.buffered_bytes += len(p)
            else:
                entry[0] += 1

    def _release(self, c: Conn) -> None:
        for p in c.holding:
            entry = self._buffers[id(p)]
            entry[0] -= 1
            if not entry[0]:
                del self._buffers[id(p)]
                self.buffered_bytes -= entry[1]
        c.holding = ()

    def _close(self, c: Conn) -> None:
        self._watch(c, 0)
        self._conns.pop(id(c), None)
        self._held.discard(c)
        self._release(c)
        c.out.clear()
        try:
            c.sock.close()
        except OSError:
            pass

    def _sweep(self, now: float) -> None:
        for c in [c for c in self._held if c.deadline > now]:
            if unsent_bytes(c.sock) <= self.limits.pipeline_backlog:     # the client read: go on
                self._held.discard(c)
                self._guarded(c, self._next_pipelined)
        for c in [c for c in self._conns.values() if c.deadline <= now and c.state != ConnState.BUSY]:
            match c.state:
                case ConnState.HELLO | ConnState.HANDSHAKE:
                    self.refused["handshake_timeout"] += 1
                    self._log(logging.INFO, "TLS handshake with %s failed: timed out", c.peer)
                case ConnState.READ:
                    self.refused["request_timeout"] += 1
                    self._log(logging.INFO, "connection with %s ended: no complete request within %gs",
                              c.peer, self.limits.request_timeout)
                case ConnState.WRITE | ConnState.HELD:
                    self.refused["write_timeout"] += 1
                    self._log(logging.INFO, "connection with %s ended: reply not read within %gs",
                              c.peer, self.limits.write_timeout)
                case ConnState.IDLE | ConnState.DRAIN:     # keep-alive idleness or lingering close: routine
                    log.debug("connection with %s closed: %s", c.peer, c.state.name.lower())
            self._close(c)

    def _guarded(self, c: Conn, step: Callable[[Conn], None] | None = None) -> None:
        """One connection's event (or `step`); a bug there costs that connection, never the listener."""
        try:
            (step or self._on_event)(c)
        except Exception as e:
            self.refused["internal_error"] += 1
            log.error("error serving %s, connection closed: %s", c.peer, reason(e), exc_info=e)
            self._close(c)

    def _on_event(self, c: Conn) -> None:
        # the connection's state says what it waits for; the selector registration matches it
        if id(c) not in self._conns:
            return
        match c.state:
            case ConnState.HELLO:
                self._hello(c)
            case ConnState.HANDSHAKE:
                self._handshake(c)
            case ConnState.READ | ConnState.IDLE:
                self._read(c)
            case ConnState.WRITE:
                self._write(c)
            case ConnState.DRAIN:
                self._drain(c)

    # --- TLS ------------------------------------------------------------------------------

    def _hello(self, c: Conn) -> None:
        """First bytes on the TLS port: a TLS record starts the handshake; plain HTTP gets a 400
        in plain text, as Go answers "client sent an HTTP request to an HTTPS server"."""
        try:
            first = c.sock.recv(8, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._log(logging.INFO, "TLS handshake with %s failed: %s", c.peer, reason(e))
            self._close(c)
            return
        if not first:
            self._log(logging.INFO, "TLS handshake with %s failed: client closed the connection", c.peer)
            self._close(c)
            return
        if first[:1] != b"\x16" and first[:1].isalpha():
            self.refused["plain_http_on_tls"] += 1
            self._log(logging.WARNING, "TLS handshake with %s failed: client sent an HTTP request to an HTTPS server",
                      c.peer)
            self._reply(c, response(400, b"Client sent an HTTP request to an HTTPS server.\n", close=True), True)
            return
        conf, _ = self.web.current()     # the certificate as of this connection (GetConfigForClient)
        assert conf.ssl_context is not None
        self._watch(c, 0)
        try:
            c.sock = conf.ssl_context.wrap_socket(c.sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as e:
            self._log(logging.WARNING, "TLS handshake with %s failed: %s", c.peer, reason(e))
            self._close(c)
            return
        c.state = ConnState.HANDSHAKE
        self._handshake(c)

    def _handshake(self, c: Conn) -> None:
        sock = c.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(c, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(c, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as e:
            gone = isinstance(e, (ssl.SSLEOFError, ConnectionError))
            self.refused["handshake_failed"] += 1
            self._log(logging.INFO if gone else logging.WARNING, "TLS handshake with %s failed: %s", c.peer, reason(e))
            self._close(c)
            return
        c.state = ConnState.READ
        c.deadline = time.monotonic() + self.limits.request_timeout
        self._watch(c, selectors.EVENT_READ)
        self._read(c)     # the client may have sent its request with the handshake's last flight

    # --- reading requests -----------------------------------------------------------------

    def _recv_into_buffer(self, c: Conn) -> bool:
        """Read what is available, up to the first complete request head (more stays in the
        kernel until that request is answered); False when the connection ended (and was closed)."""
        cap = self.limits.max_header_bytes + self.limits.max_body_bytes + 1
        while len(c.buf) < cap:
            try:
                data = c.sock.recv(min(_READ_CHUNK, cap - len(c.buf)))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return True
            except ssl.SSLWantWriteError:
                self._watch(c, selectors.EVENT_READ | selectors.EVENT_WRITE)
                return True
            except OSError as e:
                self._log(logging.INFO, "connection with %s ended: %s", c.peer, reason(e))
                self._close(c)
                return False
            if not data:
                if c.buf:
                    self._log(logging.INFO, "connection with %s ended: closed mid-request", c.peer)
                else:
                    log.debug("connection with %s closed by the client", c.peer)
                self._close(c)
                return False
            if c.state == ConnState.IDLE:
                # the next request's first byte: its header deadline starts (ReadHeaderTimeout)
                c.state = ConnState.READ
                c.deadline = time.monotonic() + self.limits.request_timeout
            c.buf += data
            if c.buf.find(b"\r\n\r\n", max(0, len(c.buf) - len(data) - 3)) >= 0:
                break
        return True

    def _read(self, c: Conn) -> None:
        while self._recv_into_buffer(c):
            self._next_request(c)
            # TLS may hold decrypted bytes the selector cannot see: read them while still waiting
            if not (c.state in (ConnState.READ, ConnState.IDLE) and isinstance(c.sock, ssl.SSLSocket)
                    and c.sock.pending()):
                return

    def _next_request(self, c: Conn) -> None:
        """Parse a complete request from the buffer and dispatch it, or keep waiting."""
        while c.buf[:2] == b"\r\n":       # RFC 9112 2.2: ignore empty lines before a request
            del c.buf[:2]
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(c.buf) > self.limits.max_header_bytes:
                self._refuse(c, 431, "headers_too_large", "Request headers too large.\n")
            return
        if end > self.limits.max_header_bytes:
            self._refuse(c, 431, "headers_too_large", "Request headers too large.\n")
            return
        try:
            req = parse_request(bytes(c.buf[:end]))
            body_len, chunked = body_length(req, self.limits.max_body_bytes)
        except BadRequest as e:
            self._refuse(c, e.code, "bad_request", f"{e}\n")
            return
        start = end + 4
        if len(c.buf) < start + body_len:
            return                        # the body is still coming (same deadline)
        # The body of a GET/HEAD is read and discarded: it can never be taken as a second request.
        del c.buf[:start + body_len]
        if chunked:
            req.close = True              # a chunked body is not read: the connection ends after the reply
        c.state = ConnState.BUSY
        self._watch(c, 0)
        self._dispatch(c, req)

    def _refuse(self, c: Conn, code: int, reason: str, message: str) -> None:
        self.refused[reason] += 1
        self._log(logging.INFO, "connection with %s ended: %d %s", c.peer, code, message.strip())
        c.buf.clear()
        self._reply(c, response(code, message.encode(), close=True), True)

    # --- answering ------------------------------------------------------------------------

    def _reply(self, c: Conn, data: Reply, close: bool) -> None:
        """Start writing a reply (loop thread)."""
        c.state = ConnState.WRITE
        parts = tuple(p for p in ((data,) if isinstance(data, bytes) else data) if p)
        c.out.clear()
        c.out.extend(memoryview(p) for p in parts)
        self._hold(c, parts)
        c.close_after = close
        c.progress = time.monotonic()
        c.deadline = c.progress + self.limits.write_timeout
        self._write(c)
        if self.buffered_bytes > self.limits.max_buffered_bytes:
            self._over_budget()

    def _post(self, c: Conn, data: Reply, close: bool, delay: float = 0.0) -> None:
        """A worker's reply, handed to the loop thread (to be sent `delay` seconds later)."""
        self._replies.put((c, data, close, delay))
        self._wake()

    def _reply_later(self, c: Conn, data: Reply, close: bool, delay: float) -> None:
        """A refusal held back `delay` seconds (loop thread): the client waits without costing
        the loop anything, and reads nothing meanwhile; closed first when the server is full."""
        if delay <= 0:
            self._reply(c, data, close)
            return
        c.state = ConnState.DEFER
        self._watch(c, 0)
        due = time.monotonic() + delay
        c.progress = due                      # eviction order: the one due soonest goes first
        c.deadline = due + self.limits.write_timeout
        self._deferred_seq += 1
        heapq.heappush(self._deferred, (due, self._deferred_seq, c, data, close))

    def _send_deferred(self, now: float) -> None:
        while self._deferred and self._deferred[0][0] <= now:
            _, _, c, data, close = heapq.heappop(self._deferred)
            if id(c) in self._conns and c.state == ConnState.DEFER:
                self._guarded(c, functools.partial(self._reply, data=data, close=close))

    def _take_replies(self) -> None:
        while True:
            try:
                c, data, close, delay = self._replies.get_nowait()
            except queue.Empty:
                return
            if id(c) in self._conns:
                try:
                    self._reply_later(c, data, close, delay)
                except Exception as e:
                    self.refused["internal_error"] += 1
                    log.error("error answering %s, connection closed: %s", c.peer, reason(e), exc_info=e)
                    self._close(c)

    def _write(self, c: Conn) -> None:
        while c.out:
            part = c.out[0]
            try:
                n = c.sock.send(part[:1 << 18])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._watch(c, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._watch(c, selectors.EVENT_READ)
                return
            except OSError as e:
                self._log(logging.INFO, "connection with %s ended: %s", c.peer, reason(e))
                self._close(c)
                return
            if n:
                c.progress = time.monotonic()
            if n == len(part):
                c.out.popleft()
            else:
                c.out[0] = part[n:]
        self._release(c)
        c.served += 1
        now = time.monotonic()
        c.since = now
        if c.close_after:
            self._linger(c)
            return
        if c.buf and unsent_bytes(c.sock) > self.limits.pipeline_backlog:
            # a pipelined request, but the client has not taken the replies before it: answer
            # it once it has (the sweep looks), so a client that never reads costs one reply
            c.state, c.deadline = ConnState.HELD, now + self.limits.write_timeout
            self._watch(c, 0)
            self._held.add(c)
            return
        self._next_pipelined(c)

    def _next_pipelined(self, c: Conn) -> None:
        """After a reply: the next request already read (on the loop's next pass), or wait for one."""
        now = time.monotonic()
        if c.buf:                 # a pipelined request already read: nothing more is read meanwhile
            c.state, c.deadline = ConnState.READ, now + self.limits.request_timeout
            self._watch(c, 0)
            self._runnable.append(c)
            return
        c.state, c.deadline = ConnState.IDLE, now + self.limits.idle_timeout
        self._watch(c, selectors.EVENT_READ)
        if isinstance(c.sock, ssl.SSLSocket) and c.sock.pending():
            self._read(c)

    def _run_pipelined(self) -> None:
        runnable, self._runnable = self._runnable, []
        for c in runnable:
            if id(c) in self._conns and c.state == ConnState.READ:
                self._guarded(c, self._resume_pipelined)

    def _resume_pipelined(self, c: Conn) -> None:
        self._watch(c, selectors.EVENT_READ)     # a partial request left in the buffer: read the rest
        self._next_request(c)

    def _linger(self, c: Conn) -> None:
        """Close after the reply without losing it: stop sending, then read and drop what the client
        still sends for up to a second (closing with unread input would reset the connection)."""
        if isinstance(c.sock, ssl.SSLSocket):    # TLS: the reply is complete; close at once
            self._close(c)
            return
        c.state = ConnState.DRAIN
        c.buf.clear()
        c.deadline = time.monotonic() + 1.0
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(c)
            return
        self._watch(c, selectors.EVENT_READ)
        self._drain(c)

    def _drain(self, c: Conn) -> None:
        try:
            while True:
                if not c.sock.recv(65536):
                    self._close(c)
                    return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)


def _turn(ready: tuple[selectors.SelectorKey, int]) -> int:
    """The order of one select batch: the workers' finished replies (a rendered page waiting to be
    written), then connections that were already served (kept alive: a scraper's), then the rest,
    then new connections. Every ready event is still handled in the same pass, so the order costs
    nobody a turn; it only keeps a scraper's request and reply from waiting behind a flood of new
    connections (measured: benchmarks/bench_soak.py)."""
    data = ready[0].data
    if data == "wake":
        return 0
    if data is None:
        return 3
    return 1 if data.served else 2
