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
      headers: {Header-Name: value}
    basic_auth_users:                # bcrypt hashes, as in exporter-toolkit (needs cachemon[auth])
      alice: $2y$10$...

Not supported (rejected with a clear error rather than silently ignored):
cipher_suites, curve_preferences, prefer_server_cipher_suites, client_allowed_sans,
RequestClientCert / RequireAnyClientCert, http2.
"""
from __future__ import annotations

import base64
import hashlib
import re
import secrets
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class BasicAuth:
    """HTTP basic auth against bcrypt hashes, the way exporter-toolkit does it.

    - An unknown user is checked against a dummy hash of the same cost, so the reply takes as
      long as for a known user with a wrong password: usernames cannot be found by timing.
    - One bcrypt check at a time (a lock): a flood of wrong passwords costs at most one core.
    - Outcomes are cached by (user, hash, password) digest, so a scraper that sends the same
      good credentials every 15 s pays bcrypt once; failures are cached apart, so a flood of
      wrong passwords cannot evict the good ones.
    """

    CACHE_SIZE = 256
    MAX_PASSWORD_BYTES = 72   # bcrypt's limit; longer passwords are refused before any hashing

    def __init__(self, users: dict[str, bytes]) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = users
        cost = max(int(h[4:6]) for h in users.values())
        self.dummy_hash: bytes = bcrypt.hashpw(secrets.token_hex(16).encode(), bcrypt.gensalt(rounds=cost))
        self._bcrypt_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        pw = password.encode("utf-8")
        if not sep or len(pw) > self.MAX_PASSWORD_BYTES:
            return False
        known = self.users.get(user)
        hashed = known if known is not None else self.dummy_hash
        key = hashlib.sha256(b"\0".join((user.encode("utf-8"), hashed, pw))).digest()
        with self._cache_lock:
            if key in self._ok:
                self._ok.move_to_end(key)
                return True
            if key in self._bad:
                return False
        with self._bcrypt_lock:
            ok = self._bcrypt.checkpw(pw, hashed) and known is not None
        with self._cache_lock:
            cache = self._ok if ok else self._bad
            cache[key] = None
            if len(cache) > self.CACHE_SIZE:
                cache.popitem(last=False)
        return ok


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def authorized(self, header: str | None) -> bool:
        return self.auth is None or self.auth.check(header)


def _bcrypt_hash(v: Any, key: str) -> bytes:
    m = _BCRYPT_RE.match(v) if isinstance(v, str) else None
    if m is None:
        raise ConfigError(key, "expected a bcrypt hash like $2y$10$ followed by 53 characters "
                               "(make one with: htpasswd -nBC 10 '' | tr -d ':\\n')")
    lo, hi = BCRYPT_COST_RANGE
    if not lo <= int(m.group(1)) <= hi:
        raise ConfigError(key, f"bcrypt cost {int(m.group(1))} is outside the allowed range: must be between {lo} "
                               f"and {hi} (each step doubles the time of every check; cost 16 takes seconds)")
    return ("$2b$" + v[4:]).encode()      # Python's bcrypt reads $2y$ like $2b$


def _header_value(v: Any, key: str) -> str:
    if _HEADER_VALUE_BAD_RE.search(str(v)):
        raise ConfigError(key, "control characters (CR, LF, ...) are not allowed in a header value")
    return str(v)


def _headers(v: Any, key: str) -> dict[str, str]:
    headers: dict[str, str] = mapping_of(_header_value)(v, key)
    for name in headers:
        if not _HEADER_NAME_RE.match(name):
            raise ConfigError(key, f"{name!r} is not a valid header name")
    return headers


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
    headers: dict[str, str] = setting(optional(_headers), default_factory=dict)


@dataclass
class WebConfigFile:
    """The file as written (exporter-toolkit names); ``load_web_config`` builds the TLS context from it."""
    tls_server_config: TlsServerConfig | None = setting(optional(section(TlsServerConfig)), None)
    http_server_config: HttpServerConfig | None = setting(optional(section(HttpServerConfig)), None)
    basic_auth_users: dict[str, bytes] | None = setting(optional(mapping_of(_bcrypt_hash)), None)


KEY = "web_config"


def load_web_config(path: str) -> WebConfig:
    base = Path(path).parent
    f = load_section(WebConfigFile, load_yaml(path, what="web config file", key=KEY), KEY)
    wc = WebConfig()

    def resolve(p: str, key: str) -> str:
        q = Path(p)
        return regular_file(q if q.is_absolute() else base / q, key, what="file")

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

    if f.basic_auth_users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError(f"{KEY}.basic_auth_users",
                              "needs the bcrypt package: pip install 'cachemon[auth]'") from None
        wc.auth = BasicAuth(dict(f.basic_auth_users))

    if f.http_server_config is not None:
        wc.headers = dict(f.http_server_config.headers or {})
    return wc
