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
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemon.config import ConfigError, choice, load_section, load_yaml, mapping_of, optional, section, setting, text

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    # bcrypt is slow on purpose; remember credentials that already checked out.
    _ok_cache: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        token = (user, hmac.new(hashed, password.encode(), "sha256").digest())
        with self._lock:
            if token in self._ok_cache:
                return True
        import bcrypt
        ok = bcrypt.checkpw(password.encode("utf-8"), hashed)
        if ok:
            with self._lock:
                self._ok_cache.add(token)
        return ok


def _bcrypt_hash(v: Any, key: str) -> bytes:
    if not isinstance(v, str) or not v.startswith(("$2a$", "$2b$", "$2y$")):
        raise ConfigError(key, "expected a bcrypt hash ($2y$...)")
    return ("$2b$" + v[4:]).encode()      # Python's bcrypt reads $2y$ like $2b$


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
    headers: dict[str, str] = setting(optional(mapping_of(lambda v, k: str(v))), default_factory=dict)


@dataclass
class WebConfigFile:
    """The file as written (exporter-toolkit names); ``load_web_config`` builds the TLS context from it."""
    tls_server_config: TlsServerConfig | None = setting(optional(section(TlsServerConfig)), None)
    http_server_config: HttpServerConfig | None = setting(optional(section(HttpServerConfig)), None)
    basic_auth_users: dict[str, bytes] | None = setting(optional(mapping_of(_bcrypt_hash)), None)


KEY = "web_config"


def load_web_config(path: str) -> WebConfig:
    base = Path(path).parent
    f = load_section(WebConfigFile, load_yaml(path), KEY)
    wc = WebConfig()

    def resolve(p: str) -> str:
        q = Path(p)
        return str(q if q.is_absolute() else base / q)

    tls = f.tls_server_config
    if tls is not None:
        k = f"{KEY}.tls_server_config"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(resolve(tls.cert_file), resolve(tls.key_file))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{k}.cert_file", f"cannot load certificate/key: {e}") from None
        ctx.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
        if ctx.verify_mode != ssl.CERT_NONE:
            if not tls.client_ca_file:
                raise ConfigError(f"{k}.client_ca_file", f"required with client_auth_type {tls.client_auth_type}")
            try:
                ctx.load_verify_locations(resolve(tls.client_ca_file))
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
        wc.users = dict(f.basic_auth_users)

    if f.http_server_config is not None:
        wc.headers = dict(f.http_server_config.headers or {})
    return wc
