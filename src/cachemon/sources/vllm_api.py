"""The vLLM OpenAI server's read-only API, fetched one way: ``/version``, ``/v1/models`` and ``/metrics``.

Every GET cachemon makes to a vLLM server's API goes through ``VllmApi`` (the poller's
``/version``, change detection's models and version, ``check``, warm-up's default model,
``capture`` and ``analyze``'s cache config), so each answer is bounded in time and size by
``sources.scrape.fetch_text``, parsed into one typed result, and every URL in a message is
redacted (``cachemon.urls``).

What vLLM serves (vllm-project/vllm, ``vllm/entrypoints/openai/api_server.py``):
``GET /version`` answers ``{"version": "<vllm.__version__>"}``; ``GET /v1/models`` answers
an OpenAI model list, ``{"object": "list", "data": [{"id", "root", "max_model_len", ...}]}``
(``ModelCard`` in ``vllm/entrypoints/openai/protocol.py``). ``/version`` is optional here:
older servers and other engines behind the same URL do not serve it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import urllib3

from cachemon.jsontypes import JsonObject, JsonValue
from cachemon.sources.scrape import METRICS_ACCEPT, FetchError, fetch_text
from cachemon.urls import redact_url

JSON_ACCEPT = "application/json"
VERSION_MAX_BYTES = 65536
MODELS_MAX_BYTES = 4 * 1024 * 1024
METRICS_MAX_BYTES = 16 * 1024 * 1024
VERSION_MAX_CHARS = 64          # a label value: a real version is far shorter


class VllmApiError(FetchError):
    """An API call that gave no usable answer. ``reason`` is one of ``fetch_text``'s (refused,
    timeout, http_status, too_large, truncated, not_exposition, other) or ``bad_answer`` (not the
    JSON shape vLLM serves); ``url`` is the redacted URL that was asked."""

    def __init__(self, reason: str, message: str, url: str):
        super().__init__(reason, message)
        self.url = url


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models``."""

    id: str
    root: str = ""                      # the model path or name the served name stands for
    max_model_len: int | None = None
    raw: JsonObject = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, row: JsonObject) -> ServedModel:
        n = row.get("max_model_len")
        return cls(id=str(row.get("id", "")), root=str(row.get("root", "") or ""),
                   max_model_len=n if isinstance(n, int) and not isinstance(n, bool) else None, raw=row)


class VllmApi:
    """The API of one vLLM server at ``base_url`` (``http://host:port``, credentials allowed: they
    are sent as basic auth and never shown). ``session`` is a ``scrape.new_session()`` pool (None:
    the shared one); ``timeout`` bounds each whole call unless the call is given its own."""

    def __init__(self, base_url: str, session: urllib3.PoolManager | None = None, timeout: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = timeout
        self.shown = redact_url(self.base_url)      # the one form of the URL in messages

    def _get(self, path_or_url: str, timeout: float | None, max_bytes: int, accept: str) -> str:
        url = path_or_url if "://" in path_or_url else self.base_url + path_or_url
        try:
            return fetch_text(self.session, url, self.timeout if timeout is None else timeout, max_bytes,
                              accept=accept)
        except VllmApiError:
            raise
        except FetchError as e:
            raise VllmApiError(e.reason, str(e), redact_url(url)) from None

    def _json(self, path: str, timeout: float | None, max_bytes: int) -> JsonValue:
        body = self._get(path, timeout, max_bytes, JSON_ACCEPT)
        try:
            data: JsonValue = json.loads(body)
        except ValueError as e:
            raise VllmApiError("bad_answer", str(e), redact_url(self.base_url + path)) from None
        return data

    def version(self, timeout: float | None = None) -> str | None:
        """The server's vLLM version (at most VERSION_MAX_CHARS), "" if it answers without one,
        None if ``/version`` gives no JSON object (not served, unreachable, not vLLM)."""
        try:
            data = self._json("/version", timeout, VERSION_MAX_BYTES)
        except VllmApiError:
            return None
        if not isinstance(data, dict):
            return None
        return str(data.get("version", ""))[:VERSION_MAX_CHARS]

    def models(self, timeout: float | None = None) -> list[ServedModel]:
        """The served models, in the server's order. Raises VllmApiError (an answer without a
        ``data`` list is ``bad_answer``: "no 'data' list in the answer")."""
        data = self._json("/v1/models", timeout, MODELS_MAX_BYTES)
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise VllmApiError("bad_answer", "no 'data' list in the answer", redact_url(self.base_url + "/v1/models"))
        return [ServedModel.from_json(r) for r in rows if isinstance(r, dict)]

    def metrics(self, url: str | None = None, timeout: float | None = None,
                max_bytes: int = METRICS_MAX_BYTES) -> str:
        """The ``/metrics`` page as text (``url``: a metrics URL other than base_url + /metrics)."""
        return self._get(url or "/metrics", timeout, max_bytes, METRICS_ACCEPT)
