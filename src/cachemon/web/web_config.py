"""The Prometheus exporter-toolkit web-config file (``--web.config.file``), the subset cachemon serves.

Supported::

    tls_server_config:
      cert_file: server.crt          # required with TLS
      key_file: server.key           # required with TLS
      client_auth_type: NoClientCert | RequireAndVerifyClientCert | VerifyClientCertIfGiven
      client_ca_file: ca.crt         # required when client certificates are verified
      min_version: TLS12 | TLS13
      max_version: TLS12 | TLS13
    http_server_config:
      headers: {Header-Name: value}  # exporter-toolkit's security headers only (see _SECURITY_HEADERS)
    basic_auth_users:                # bcrypt hashes, as in exporter-toolkit (needs cachemon[auth])
      alice: $2y$10$...

Not supported (rejected with a clear error rather than silently ignored):
cipher_suites, curve_preferences, prefer_server_cipher_suites, client_allowed_sans,
RequestClientCert / RequireAnyClientCert, http2.

Re-read like exporter-toolkit's: the users (password hashes) for each request, the TLS
certificate, key and client CA for each new connection, whenever the file or a file it names
changed (``WebConfigSource``). exporter-toolkit re-reads the file on every request
(web/handler.go, ``webHandler.ServeHTTP`` calls ``getConfig``) and on every TLS handshake
(web/tls_config.go, ``Serve`` sets ``GetConfigForClient`` to ``getTLSConfig``); cachemon
re-reads only when a file's (mtime, size, inode) changed, which takes effect at the same moment.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import ssl
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from cachemon import install_hint
from cachemon.config import (
    ConfigError,
    choice,
    load_section,
    load_yaml,
    mapping_of,
    optional,
    regular_file,
    section,
    setting,
    text,
)

log = logging.getLogger("cachemon.http")

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


# $2a$/$2b$/$2y$, a two-digit cost, then 22 characters of salt and 31 of hash.
_BCRYPT_RE = re.compile(r"^\$2[aby]\$([0-9]{2})\$[./A-Za-z0-9]{53}$")
# bcrypt allows costs 4..31, each one doubling the time of a check. Every check at start-up (the
# dummy hash) and of each new password pays it: measured on a 2-core machine, cost 10 takes 0.06 s,
# 12 0.24 s, 14 0.97 s, 16 7 s and 31 about 4 days. 14 keeps start-up and a first scrape near a second.
BCRYPT_COST_RANGE = (4, 14)
# An HTTP header name is a token; a value must not end the header or start another one.
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HEADER_VALUE_BAD_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# exporter-toolkit's extraHTTPHeaders (web/handler.go): the only headers a web config may set, and
# the allowed values where the header is an enumeration. Anything else (Content-Length,
# Transfer-Encoding, Set-Cookie, ...) would corrupt or hijack the replies.
_SECURITY_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}


# Cached outcomes are keyed by an HMAC under a key made at start and never written anywhere: a
# memory dump's cache keys cannot be tested against password guesses at SHA-256 speed (a plain
# digest of the user, hash and password could), only bcrypt's.
_CACHE_KEY = secrets.token_bytes(32)


class _Pending:
    """Credentials whose outcome is not cached yet: they need one bcrypt check (``BasicAuth.verify``)."""
    __slots__ = ("hashed", "key", "known", "password")

    def __init__(self, key: bytes, password: bytes, hashed: bytes | None, known: bool) -> None:
        self.key, self.password, self.hashed, self.known = key, password, hashed, known


class BasicAuth:
    """HTTP basic auth against bcrypt hashes, the way exporter-toolkit does it.

    - An unknown user is checked against a dummy hash of the same cost, so the reply takes as
      long as for a known user with a wrong password: usernames cannot be found by timing.
    - One bcrypt check at a time (a lock): a flood of wrong passwords costs at most one core.
    - Outcomes are cached by a keyed (user, hash, password) digest, so a scraper that sends the same
      good credentials every 15 s pays bcrypt once; failures are cached apart, so a flood of
      wrong passwords cannot evict the good ones.
    - ``lookup`` answers from the cache without waiting; the listener runs ``verify`` (bcrypt)
      for the rest in a bounded queue, so verified credentials never wait behind unverified ones.
    """

    CACHE_SIZE = 256
    MAX_PASSWORD_BYTES = 72   # bcrypt's limit; longer passwords are refused before any hashing

    def __init__(self, users: dict[str, bytes]) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = users
        self.cost = max(int(h[4:6]) for h in users.values())
        self._dummy: bytes | None = None     # made on first need, in the bcrypt thread, not at load
        self._bcrypt_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()

    @property
    def dummy_hash(self) -> bytes:
        if self._dummy is None:
            self._dummy = self._bcrypt.hashpw(secrets.token_hex(16).encode(), self._bcrypt.gensalt(rounds=self.cost))
        return self._dummy

    def adopt(self, old: BasicAuth) -> None:
        """Keep a previous config's cached outcomes: keys include the hash, so an outcome for a
        changed hash never matches again, and unchanged users do not pay bcrypt after a reload."""
        with old._cache_lock:
            self._ok, self._bad = OrderedDict(old._ok), OrderedDict(old._bad)
        if old.cost == self.cost:
            self._dummy = old._dummy

    def lookup(self, header: str | None) -> bool | _Pending:
        """True/False when the answer is known without bcrypt, else what ``verify`` needs."""
        scheme, _, token = (header or "").strip().partition(" ")
        if scheme.lower() != "basic":    # RFC 7617 / 9110: the scheme is case-insensitive
            return False
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        pw = password.encode("utf-8")
        if not sep or len(pw) > self.MAX_PASSWORD_BYTES:
            return False
        known = self.users.get(user)
        # an unknown user's key uses a fixed marker: the dummy hash is random and made lazily
        key = hmac.new(_CACHE_KEY, b"\0".join((user.encode("utf-8"), known or b"?unknown", pw)), hashlib.sha256).digest()
        with self._cache_lock:
            if key in self._ok:
                self._ok.move_to_end(key)
                return True
            if key in self._bad:
                return False
        return _Pending(key, pw, known, known is not None)

    def verify(self, p: _Pending) -> bool:
        """The bcrypt check of credentials ``lookup`` could not answer (one at a time)."""
        with self._bcrypt_lock:
            ok = self._bcrypt.checkpw(p.password, p.hashed or self.dummy_hash) and p.known
        with self._cache_lock:
            cache = self._ok if ok else self._bad
            cache[p.key] = None
            if len(cache) > self.CACHE_SIZE:
                cache.popitem(last=False)
        return ok

    def check(self, header: str | None) -> bool:
        outcome = self.lookup(header)
        return outcome if isinstance(outcome, bool) else self.verify(outcome)


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: dict[str, str] = field(default_factory=dict)
    path: str | None = None                        # the file, when loaded from one (re-read on change)
    files: tuple[str, ...] = ()                    # the file and the files it names, watched for changes

    def authorized(self, header: str | None) -> bool:
        return self.auth is None or self.auth.check(header)


def _bcrypt_hash(v: object, key: str) -> bytes:
    m = _BCRYPT_RE.match(v) if isinstance(v, str) else None
    if m is None:
        raise ConfigError(key, "expected a bcrypt hash like $2y$10$ followed by 53 characters "
                               "(make one with: htpasswd -nBC 10 '' | tr -d ':\\n')")
    lo, hi = BCRYPT_COST_RANGE
    if not lo <= int(m.group(1)) <= hi:
        raise ConfigError(key, f"bcrypt cost {int(m.group(1))} is outside the allowed range: must be between {lo} "
                               f"and {hi} (each step doubles the time of every check; cost 16 takes seconds)")
    return ("$2b$" + str(v)[4:]).encode()      # Python's bcrypt reads $2y$ like $2b$


def _header_value(v: object, key: str) -> str:
    if _HEADER_VALUE_BAD_RE.search(str(v)):
        raise ConfigError(key, "control characters (CR, LF, ...) are not allowed in a header value")
    return str(v)


def _headers(v: object, key: str) -> dict[str, str]:
    headers: dict[str, str] = mapping_of(_header_value)(v, key)
    canonical = {k.lower(): k for k in _SECURITY_HEADERS}
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not _HEADER_NAME_RE.match(name):
            raise ConfigError(key, f"{name!r} is not a valid header name")
        known = canonical.get(name.lower())
        if known is None:
            raise ConfigError(f"{key}.{name}", "this header cannot be configured; allowed (as in exporter-toolkit): "
                                               + ", ".join(_SECURITY_HEADERS))
        allowed = _SECURITY_HEADERS[known]
        if allowed and value not in allowed:
            raise ConfigError(f"{key}.{name}", f"expected one of {', '.join(allowed)}, got {value!r}")
        out[known] = value
    return out


@dataclass
class TlsServerConfig:
    cert_file: str = setting(text)
    key_file: str = setting(text)
    client_auth_type: str = setting(choice(*_CLIENT_AUTH), "NoClientCert")
    client_ca_file: str | None = setting(optional(text), None)
    min_version: str | None = setting(optional(choice(*_TLS_VERSIONS)), None)
    max_version: str | None = setting(optional(choice(*_TLS_VERSIONS)), None)


@dataclass
class HttpServerConfig:
    headers: dict[str, str] | None = setting(optional(_headers), default_factory=dict)


@dataclass
class WebConfigFile:
    """The file as written (exporter-toolkit names); ``load_web_config`` builds the TLS context from it."""
    tls_server_config: TlsServerConfig | None = setting(optional(section(TlsServerConfig)), None)
    http_server_config: HttpServerConfig | None = setting(optional(section(HttpServerConfig)), None)
    basic_auth_users: dict[str, bytes] | None = setting(optional(mapping_of(_bcrypt_hash)), None)


KEY = "web_config"
# The web config is re-read on the listener's loop thread (the next request after a change must see
# it), so its size bounds that pause: a 4 MiB file took 6.8 s with the pure-Python YAML loader; 256
# KiB (some 3 000 users; exporter-toolkit's files hold a handful) takes about 0.1 s with libyaml.
MAX_WEB_CONFIG_BYTES = 256 * 1024


class EmptyWebConfig(ConfigError):
    """The file, or its ``basic_auth_users``, is empty: what a torn rewrite or a failed template
    leaves. Never read as "no TLS, no auth" (that would fail open)."""


def load_web_config(path: str) -> WebConfig:
    base = Path(path).parent
    raw = load_yaml(path, what="web config file", key=KEY, max_bytes=MAX_WEB_CONFIG_BYTES)
    if not raw:
        raise EmptyWebConfig(KEY, f"web config file {path} is empty: to serve without TLS or basic auth, "
                                  "give no --web-config-file")
    f = load_section(WebConfigFile, raw, KEY)
    if "basic_auth_users" in raw and not f.basic_auth_users:
        raise EmptyWebConfig(f"{KEY}.basic_auth_users", "is empty: give at least one user, or remove the key "
                                                         "to serve without basic auth")
    wc = WebConfig(path=path)

    def path_of(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else base / q

    def resolve(p: str, key: str) -> str:
        return regular_file(path_of(p), key, what="file")

    tls = f.tls_server_config
    if tls is not None:
        k = f"{KEY}.tls_server_config"
        if tls.min_version and tls.max_version and _TLS_VERSIONS[tls.min_version] > _TLS_VERSIONS[tls.max_version]:
            raise ConfigError(f"{k}.min_version", f"{tls.min_version} is above max_version {tls.max_version}")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(resolve(tls.cert_file, f"{k}.cert_file"), resolve(tls.key_file, f"{k}.key_file"))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{k}.cert_file", f"cannot load certificate/key: {e}") from None
        ctx.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
        if ctx.verify_mode != ssl.CERT_NONE:
            if not tls.client_ca_file:
                raise ConfigError(f"{k}.client_ca_file", f"required with client_auth_type {tls.client_auth_type}")
            try:
                ctx.load_verify_locations(resolve(tls.client_ca_file, f"{k}.client_ca_file"))
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"{k}.client_ca_file", f"cannot load: {e}") from None
        # exporter-toolkit's default minimum is TLS 1.2
        ctx.minimum_version = _TLS_VERSIONS[tls.min_version or "TLS12"]
        if tls.max_version:
            ctx.maximum_version = _TLS_VERSIONS[tls.max_version]
        wc.ssl_context = ctx
        wc.files = tuple(str(path_of(p)) for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p)

    if f.basic_auth_users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError(f"{KEY}.basic_auth_users",
                              f"needs the bcrypt package; {install_hint('auth')}") from None
        wc.auth = BasicAuth(dict(f.basic_auth_users))

    if f.http_server_config is not None:
        wc.headers = dict(f.http_server_config.headers or {})
    wc.files = (path, *wc.files)
    return wc


def _signature(files: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


class WebConfigSource:
    """The web config in force: re-read when the file or a file it names changed (or on SIGHUP).

    A file that no longer loads is refused the way exporter-toolkit refuses it: requests that
    need the config (everything but the probes) get 500 until it is fixed, and the error is
    logged once per change. TLS keeps the last good certificate meanwhile, so the probes keep
    answering; turning TLS on or off needs a restart (exporter-toolkit also decides it at start).

    Fail closed: a file that is empty, has an empty ``basic_auth_users``, or no longer has the users
    it had (what a torn in-place rewrite reads like) is refused and the last good config stays in
    force, users and all; turning basic auth off needs a restart.
    """

    def __init__(self, initial: WebConfig) -> None:
        self._lock = threading.Lock()
        self._config = initial
        self.error: str | None = None
        # re-reads by outcome: applied, refused (the last good config kept), failed (500 until fixed)
        self.outcomes: Counter[str] = Counter()
        self._sig = _signature(initial.files)

    def current(self) -> tuple[WebConfig, str | None]:
        """(the config to use, the reload error if the file on disk is broken)."""
        if self._config.path is None:
            return self._config, None
        with self._lock:
            files = self._config.files
            sig = _signature(files)
            if sig != self._sig:
                self._reload(sig)
            return self._config, self.error

    def reload(self) -> str:
        """Re-read now (SIGHUP); returns what happened, for the log line."""
        if self._config.path is None:
            return "no web config file: nothing to re-read"
        with self._lock:
            refused = self.outcomes["refused"]
            self._reload(_signature(self._config.files))
            if self.outcomes["refused"] > refused:
                return f"web config {self._config.path} refused, the last good one stays in force"
            return f"web config {self._config.path} re-read" + (f"; still broken: {self.error}" if self.error else "")

    def _reload(self, sig: tuple[tuple[int, int, int] | None, ...]) -> None:
        old = self._config
        assert old.path is not None
        self._sig = sig
        try:
            new = load_web_config(old.path)
        except EmptyWebConfig as e:
            self._refuse(f"{e}; the last good web config stays in force")
            return
        except ConfigError as e:
            self.error = str(e)
            self.outcomes["failed"] += 1
            log.error("web config %s not re-read, serving 500 to requests needing it: %s", old.path, e)
            return
        if new.auth is None and old.auth is not None:
            self._refuse("it has no basic_auth_users, which were on (a torn rewrite reads like this); the last "
                         "good web config stays in force: turning basic auth off needs a restart")
            return
        if (new.ssl_context is None) != (old.ssl_context is None):
            self.error = "turning TLS on or off needs a restart"
            self.outcomes["failed"] += 1
            log.error("web config %s not re-read: %s", old.path, self.error)
            return
        if new.auth is not None and old.auth is not None:
            new.auth.adopt(old.auth)
        self._sig = _signature(new.files)    # the files the new config names
        self._config = new
        self.error = None
        self.outcomes["applied"] += 1
        log.info("web config %s re-read", old.path)

    def _refuse(self, why: str) -> None:
        self.error = None       # the last good config answers, as before the rewrite
        self.outcomes["refused"] += 1
        log.error("web config %s refused: %s", self._config.path, why)
