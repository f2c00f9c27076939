"""The cache config of the server a request stream ran on, for `cachemon analyze`: from its /metrics page's
``vllm:cache_config_info`` (--upstream, --metrics-file), or from the start-up lines of its log (--log-file),
the one source where vLLM 0.32's Rust frontend, whose page has no cache_config_info, states it.

Both are read into the daemon's one description of a server (normalise/server_profile.ServerProfile),
with the daemon's log lines (normalise.log_grammar CONFIG_LINES): the block size is the logged pool in
tokens over the logged block count, which vLLM logs only when ``--num-gpu-blocks-override`` is set."""
from __future__ import annotations

from dataclasses import dataclass, replace

from cachemon.normalise.eras import FreeOrder
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.server_profile import ServerProfile, merge

CHUNK = 1024 * 1024
MAX_BYTES = 512 * 1024 * 1024      # a log bigger than this is read from its first 512 MiB only


class ServerConfigError(Exception):
    """--upstream / --metrics-file / --log-file gave no usable cache config."""


class LogConfigError(Exception):
    """The log cannot be read."""


def missing_block_size(profile: ServerProfile, where: str) -> str:
    """Why no block size came out of a log (for an error message)."""
    if profile.pool_tokens:
        return (f"{where} give the pool ({profile.pool_tokens} tokens) but no block count (vLLM logs it "
                "only with --num-gpu-blocks-override)")
    return f"{where} state no KV cache size (not a vLLM server log, or its start is cut off)"


def read_log_config(path: str) -> ServerProfile:
    """What the newest engine start in ``path`` said of its cache (the lines of the last start win)."""
    stream = LogStream("log")
    read = 0
    try:
        with open(path, "rb") as f:
            rest = b""
            while read < MAX_BYTES:
                block = f.read(CHUNK)
                if not block:
                    break
                read += len(block)
                block = rest + block
                cut = block.rfind(b"\n") + 1
                stream.feed(block[:cut])
                rest = block[cut:]
            if rest:
                stream.feed(rest + b"\n")
    except OSError as e:
        raise LogConfigError(f"cannot read --log-file {path}: {e.strerror or e}") from None
    return ServerProfile.from_log_config(stream.config, f"the start-up lines of {path}")


def read_cache_config(upstream: str | None, metrics_file: str | None, log_file: str | None = None,
                      block_size_given: bool = False) -> ServerProfile:
    """Block size and pool size from vLLM's ``vllm:cache_config_info`` labels, else from the log's start-up lines."""
    from cachemon.sources.exposition import ExpositionError, parse
    if not (upstream or metrics_file):
        return _logged_config(str(log_file), block_size_given=block_size_given)
    if metrics_file:
        from cachemon.config import ConfigError, read_small_file
        try:     # bounded like a scraped page (16 MiB); a FIFO or device is refused, not waited on
            text, source = read_small_file(metrics_file, "--metrics-file", 16 * 1024 * 1024,
                                           what="metrics file").decode("utf-8"), metrics_file
        except (ConfigError, UnicodeDecodeError) as e:
            raise ServerConfigError(f"cannot read --metrics-file {metrics_file}: {e}") from e
    else:
        from cachemon.sources.vllm_api import VllmApi, VllmApiError
        from cachemon.urls import redact_url
        url = str(upstream).rstrip("/")
        url = url if url.endswith("/metrics") else url + "/metrics"
        try:
            text, source = VllmApi(url.removesuffix("/metrics")).metrics(timeout=10.0), redact_url(url)
        except VllmApiError as e:
            raise ServerConfigError(f"--upstream {e.url}: {e}") from e
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        rows = parse(text, frozenset({"cache_config_info"})).samples.get("cache_config_info") or []
    except ExpositionError as e:
        raise ServerConfigError(f"{source}: not a usable /metrics page ({e})") from e
    if not rows and log_file:
        return _logged_config(log_file, f" ({source} has no vllm:cache_config_info)", block_size_given)
    if not rows:
        from cachemon.normalise.eras import frontends_without_config_on_page
        raise ServerConfigError(f"{source} has no vllm:cache_config_info (vLLM frontends that serve none: "
                                f"{', '.join(frontends_without_config_on_page())}): "
                                "pass --log-file (the server's log: its start-up lines) or --block-size")
    page = ServerProfile.from_cache_config_info(rows[0][0], source)
    if not log_file:
        return page
    try:       # the log fills what the page does not say (the release, the frontend)
        return merge(page, read_log_config(log_file))
    except LogConfigError:
        return page


def _logged_config(log_file: str, why: str = "", block_size_given: bool = False) -> ServerProfile:
    """The log's profile; one without a block size raises, saying why, unless --block-size gives it."""
    try:
        profile = read_log_config(log_file)
    except LogConfigError as e:
        raise ServerConfigError(str(e)) from None
    if not profile.block_size and not block_size_given:
        raise ServerConfigError(f"{missing_block_size(profile, f'the start-up lines of {log_file}')}{why}: "
                                "pass --block-size")
    return replace(profile, sources=tuple((k, w + why) for k, w in profile.sources))


def server_version(vllm_version: str | None, upstream: str | None, log_file: str | None) -> tuple[str, str]:
    """The vLLM release the traffic ran on and where it was read: --vllm-version, else the --log-file's
    start-up lines, else the --upstream's ``/version``; ("", "") when nothing says."""
    if vllm_version:
        return vllm_version, "--vllm-version"
    if log_file:
        try:
            v = read_log_config(log_file).version
        except LogConfigError:
            v = ""
        if v:
            return v, f"the start-up lines of {log_file}"
    if upstream:
        from cachemon.sources.vllm_api import VllmApi
        from cachemon.urls import redact_url
        base = upstream.rstrip("/").removesuffix("/metrics")
        v = VllmApi(base).version(timeout=10.0) or ""
        if v:
            return v, redact_url(base + "/version")
    return "", ""


def free_order_note(version: str, source: str) -> tuple[FreeOrder, str]:
    """The release's free-queue order (normalise/eras.FREE_ORDERS; unknown: the newest) and the note saying
    which order is simulated and why."""
    from cachemon.normalise.eras import FREE_ORDERS, free_order
    fo = free_order(version)
    if fo is None:
        fo = FREE_ORDERS[0]
        why = (f"vLLM version {version!r} unreadable" if version else "no vLLM version known") + \
            ": the newest order (pass --vllm-version, --log-file or --upstream)"
    else:
        why = f"{version} read from {source}"
    return fo, f"free queue {fo.name} as in vLLM {fo.versions}: {why}"


@dataclass(frozen=True)
class BlockSizeChoice:
    tokens: int
    note: str                  # which block size, and where it came from
    assumed: bool = False      # no flag, server or release said it: the output says so


def choose_block_size(given: int | None, server: ServerProfile | None, version: str, version_source: str,
                      platform: str | None) -> BlockSizeChoice:
    """The block size to simulate and where it came from: --block-size, else the server's
    ``cache_config_info`` (or log), else the default of the release the traffic ran on (normalise/eras.BLOCK_SIZE_DEFAULTS),
    else the newest release's GPU default, stated as an assumption. Never a silent 16."""
    from cachemon.normalise.eras import NEWEST_GPU, default_block_row, platform_of
    if given is not None:
        return BlockSizeChoice(given, "block size from --block-size")
    if server is not None and server.block_size:
        return BlockSizeChoice(server.block_size, f"block size {server.block_size} read from {server.source}")
    why = f"no block_size in {server.source}" if server is not None else "no --block-size, --upstream or --metrics-file"
    plat = platform or platform_of(version)
    row = default_block_row(version, plat or "gpu") if version else None
    if version and row is None:
        why += f" and vLLM version {version!r} (from {version_source}) unreadable"
        version = ""
    if row is not None:
        note = (f"{why}: block size {row.block_size} is vLLM {version}'s default on {(plat or 'gpu').upper()} ({row.source}; "
                f"version from {version_source})")
        if plat is None:
            return BlockSizeChoice(row.block_size, note + " - ASSUMED a GPU server: pass --platform cpu for the CPU "
                                   "backend's 128, or --block-size", assumed=True)
        return BlockSizeChoice(row.block_size, note)
    if plat is not None:
        cpu = default_block_row(NEWEST_GPU.first, plat)
        assert cpu is not None
        return BlockSizeChoice(cpu.block_size, f"{why}: block size {cpu.block_size}, the {plat.upper()} default of the newest "
                               f"release ({cpu.source}) - ASSUMED: no vLLM version known (--vllm-version)", assumed=True)
    if not version_source:
        why += ", no vLLM version"
    return BlockSizeChoice(
        NEWEST_GPU.block_size,
        f"{why}: block size {NEWEST_GPU.block_size} ASSUMED, the GPU default from vLLM {NEWEST_GPU.first} "
        f"({NEWEST_GPU.source}); 0.8.5-0.33 GPUs default to 16, the CPU backend to 128 - pass --block-size, "
        "--vllm-version with --platform, or --upstream", assumed=True)
