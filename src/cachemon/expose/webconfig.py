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

from cachemon.config import ConfigError, load_yaml

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
        for user, hashed in users.items():
            if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
                raise ConfigError(f"web_config.basic_auth_users.{user}", "expected a bcrypt hash ($2y$...)")
            # Python's bcrypt reads $2y$ like $2b$.
            wc.users[str(user)] = ("$2b$" + hashed[4:]).encode()

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
        wc.headers = {str(k): str(v) for k, v in headers.items()}
    return wc
