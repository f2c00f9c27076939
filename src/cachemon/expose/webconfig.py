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

from cachemon.config import ConfigError, load_yaml

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


# $2a$/$2b$/$2y$, a two-digit cost 04..31, then 22 characters of salt and 31 of hash.
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
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

    def __init__(self, users: dict[str, bytes]):
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


def load_web_config(path: str) -> WebConfig:
    base = Path(path).parent
    data = load_yaml(path)
    allowed = {"tls_server_config", "http_server_config", "basic_auth_users"}
    for k in data:
        if k not in allowed:
            raise ConfigError(f"web_config.{k}", f"not supported by cachemon (supported: {', '.join(sorted(allowed))})")
    wc = WebConfig()

    def resolve(p: str) -> str:
        q = Path(p)
        return str(q if q.is_absolute() else base / q)

    tls = data.get("tls_server_config")
    if tls:
        if not isinstance(tls, dict):
            raise ConfigError("web_config.tls_server_config", "expected a mapping")
        ok_keys = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
        for k in tls:
            if k not in ok_keys:
                raise ConfigError(f"web_config.tls_server_config.{k}", f"not supported (supported: {', '.join(sorted(ok_keys))})")
        for k in ("cert_file", "key_file"):
            if not tls.get(k):
                raise ConfigError(f"web_config.tls_server_config.{k}", "required when tls_server_config is set")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(resolve(tls["cert_file"]), resolve(tls["key_file"]))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError("web_config.tls_server_config.cert_file", f"cannot load certificate/key: {e}") from None
        auth = tls.get("client_auth_type", "NoClientCert")
        if auth not in _CLIENT_AUTH:
            raise ConfigError("web_config.tls_server_config.client_auth_type",
                              f"{auth!r} not supported (supported: {', '.join(_CLIENT_AUTH)})")
        ctx.verify_mode = _CLIENT_AUTH[auth]
        if ctx.verify_mode != ssl.CERT_NONE:
            ca = tls.get("client_ca_file")
            if not ca:
                raise ConfigError("web_config.tls_server_config.client_ca_file", f"required with client_auth_type {auth}")
            try:
                ctx.load_verify_locations(resolve(ca))
            except (OSError, ssl.SSLError) as e:
                raise ConfigError("web_config.tls_server_config.client_ca_file", f"cannot load: {e}") from None
        for k, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
            if k in tls:
                if tls[k] not in _TLS_VERSIONS:
                    raise ConfigError(f"web_config.tls_server_config.{k}", f"expected TLS12 or TLS13, got {tls[k]!r}")
                setattr(ctx, attr, _TLS_VERSIONS[tls[k]])
        if "min_version" in tls and "max_version" in tls and \
                _TLS_VERSIONS[tls["min_version"]] > _TLS_VERSIONS[tls["max_version"]]:
            raise ConfigError("web_config.tls_server_config.min_version",
                              f"{tls['min_version']} is above max_version {tls['max_version']}")
        if "min_version" not in tls:
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2   # exporter-toolkit's default
        wc.ssl_context = ctx

    users = data.get("basic_auth_users")
    if users:
        if not isinstance(users, dict):
            raise ConfigError("web_config.basic_auth_users", "expected a mapping of user: bcrypt hash")
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ConfigError("web_config.basic_auth_users",
                              "needs the bcrypt package: pip install 'cachemon[auth]'") from None
        hashes: dict[str, bytes] = {}
        for user, hashed in users.items():
            if not isinstance(hashed, str) or not _BCRYPT_RE.match(hashed):
                raise ConfigError(f"web_config.basic_auth_users.{user}",
                                  "expected a bcrypt hash like $2y$10$ followed by 53 characters "
                                  "(make one with: htpasswd -nBC 10 '' | tr -d ':\\n')")
            # Python's bcrypt reads $2y$ like $2b$.
            hashes[str(user)] = ("$2b$" + hashed[4:]).encode()
        wc.auth = BasicAuth(hashes)

    http = data.get("http_server_config")
    if http:
        if not isinstance(http, dict):
            raise ConfigError("web_config.http_server_config", "expected a mapping")
        for k in http:
            if k != "headers":
                raise ConfigError(f"web_config.http_server_config.{k}", "not supported (supported: headers)")
        headers = http.get("headers") or {}
        if not isinstance(headers, dict):
            raise ConfigError("web_config.http_server_config.headers", "expected a mapping")
        for k, v in headers.items():
            if not _HEADER_NAME_RE.match(str(k)):
                raise ConfigError("web_config.http_server_config.headers", f"{str(k)!r} is not a valid header name")
            if _HEADER_VALUE_BAD_RE.search(str(v)):
                raise ConfigError(f"web_config.http_server_config.headers.{k}",
                                  "control characters (CR, LF, ...) are not allowed in a header value")
        wc.headers = {str(k): str(v) for k, v in headers.items()}
    return wc
