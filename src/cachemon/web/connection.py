"""One connection's state, the listener's limits, and the small helpers of its event loop."""
from __future__ import annotations

import enum
import fcntl
import ipaddress
import logging
import resource
import socket
import ssl
import struct
import termios
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("cachemon.http")

_LOG_BURST = 20          # failed-connection log lines per _LOG_WINDOW seconds, then a summary
_LOG_WINDOW = 10.0


@dataclass(frozen=True)
class Limits:
    # The kernel caps the backlog at net.core.somaxconn (4096 on current kernels).
    backlog: int = 1024
    # Open connections held at once (also capped by the file-descriptor limit); when full, the
    # one idle the longest is closed to make room.
    max_connections: int = 1024
    handshake_timeout: float = 5.0
    # Go's ReadHeaderTimeout: from a request's first byte (a new connection: from its start or
    # the end of its TLS handshake) until its headers and body are read.
    request_timeout: float = 5.0
    # A keep-alive connection waiting for its next request (Prometheus scrapes every 15-60 s).
    idle_timeout: float = 120.0
    write_timeout: float = 30.0
    # Slow readers (clients that send requests, pipelined or not, and do not read the replies):
    # a pipelined request waits while more than this many bytes of the replies before it are still
    # in the kernel's send queue (the client has not taken them), so a client that never reads
    # costs one reply, never a reply per request it sent.
    pipeline_backlog: int = 65536
    # Reply bytes held by the listener for clients still to take them (a page shared by several
    # replies counts once); over it, the stalled connections holding the most are closed.
    max_buffered_bytes: int = 32 << 20
    # SO_SNDBUF of each connection: Linux autotunes a connection's send buffer up to 4 MiB
    # (net.ipv4.tcp_wmem), kernel memory a client that does not read pins, counted against the
    # pod's memory limit (cgroup v2 counts socket buffers). The kernel doubles the value set;
    # 0 leaves the autotuning.
    send_buffer: int = 256 << 10
    # Credentials refused (401, or 429 when too many wait for bcrypt) are answered this much later:
    # a client looping on wrong passwords gets one try per second per connection, not as many as
    # the event loop can refuse (measured: 3 400/s from 100 clients, 85 % of the loop thread).
    refusal_delay: float = 1.0
    # A reply that made no progress for this long marks its client a slow reader: closed first
    # when the connections or the reply bytes are over their limit.
    stall_timeout: float = 1.0
    workers: int = 2                # /metrics render threads (each renders one page for a whole batch)
    auth_queue: int = 16            # unverified credentials waiting for the bcrypt thread
    auth_per_client: int = 2        # ... of which from one client address (a flood from one host
                                    # cannot keep a scraper elsewhere from being verified)
    # Wrong passwords one client address may have checked: a burst, then this many a second
    # (a token bucket); beyond it its unverified credentials get 429 without a bcrypt, so a flood
    # costs ~1 bcrypt a second (~0.06 s of CPU at cost 10), not a core: under a CPU limit
    # (500m shipped) a busy bcrypt thread used the whole quota and throttled the scraper's reply.
    auth_failure_burst: int = 10
    auth_failure_rate: float = 1.0
    ready_queue: int = 64           # /-/ready requests waiting for the readiness thread
    max_header_bytes: int = 65536
    max_body_bytes: int = 65536     # a GET/HEAD body is read and discarded up to this size


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reason(exc: BaseException | None) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


class ConnState(enum.IntEnum):
    HELLO = 0        # TLS port: waiting for the first bytes
    HANDSHAKE = 1    # TLS handshake under way
    READ = 2         # a request is due: the connection's first, or one whose first byte came
    IDLE = 3         # keep-alive: waiting for the next request
    BUSY = 4         # a complete request is being answered by a thread (no deadline)
    WRITE = 5        # writing a reply
    DRAIN = 6        # reply sent, closing: reading and dropping what the client still sends
    HELD = 7         # a pipelined request waits: the client has not taken the replies before it
    DEFER = 8        # a refusal of credentials (401, 429) held back for refusal_delay


# Evictable when the server is full: waiting for the client, never being answered.
EVICTABLE = frozenset({ConnState.HELLO, ConnState.HANDSHAKE, ConnState.READ, ConnState.IDLE, ConnState.DRAIN})


class Conn:
    __slots__ = ("buf", "close_after", "deadline", "events", "holding", "out", "peer", "progress", "served", "since",
                 "sock", "state")

    def __init__(self, sock: socket.socket, peer: str, state: ConnState, deadline: float) -> None:
        self.sock: socket.socket = sock
        self.peer = peer
        self.state = state
        self.buf = bytearray()
        self.out: deque[memoryview] = deque()         # the reply's parts still to send
        self.holding: tuple[bytes, ...] = ()          # the buffers those parts point into (budgeted)
        self.progress = 0.0                           # when the reply last moved (stall detection)
        self.close_after = False
        self.served = 0
        self.since = time.monotonic()         # when it became idle (eviction order)
        self.deadline = deadline
        self.events = 0                       # what the selector watches (0: not registered)


class LogLimiter:
    """At most _LOG_BURST failed-connection lines per _LOG_WINDOW s; the rest are counted and summed up."""

    def __init__(self) -> None:
        self.window_start = 0.0
        self.lines = 0
        self.suppressed = 0

    def __call__(self, level: int, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.window_start >= _LOG_WINDOW:
            if self.suppressed:
                log.warning("%d more failed-connection lines suppressed in the last %gs", self.suppressed, _LOG_WINDOW)
            self.window_start, self.lines, self.suppressed = now, 0, 0
        if self.lines >= _LOG_BURST:
            self.suppressed += 1
            return
        self.lines += 1
        log.log(level, msg, *args)


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes handed to the kernel for this connection that the peer has not acknowledged yet
    (Linux SIOCOUTQ); 0 where the kernel cannot tell, which turns off the pipelining hold."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except (OSError, ValueError, AttributeError):
        return 0


def fd_headroom() -> int:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):   # pragma: no cover
        return 1 << 30
    return max(16, soft - 64) if soft != resource.RLIM_INFINITY else 1 << 30


def address_family(address: str, port: int) -> tuple[socket.AddressFamily, bool]:
    """(address family, dual-stack) for a listen address; `::` listens on IPv4 too, as in Go."""
    if not address:
        return socket.AF_INET, False     # "" binds every IPv4 interface
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:   # a host name: listen on what it resolves to first
        try:
            infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise OSError(f"cannot listen on {host_port(address, port)}: {e.strerror}") from e
        return infos[0][0], False
    if ip.version == 6:
        return socket.AF_INET6, ip == ipaddress.IPv6Address("::")
    return socket.AF_INET, False
