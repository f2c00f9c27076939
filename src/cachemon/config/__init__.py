"""Typed configuration definitions: the one way every config section is read.

A section is a dataclass whose fields are declared with ``setting(parse, default)``;
``load_section(cls, raw, key)`` rejects unknown keys, runs each present value through its
field's parser with the full key path, and fills defaults. Parsers are small functions
``(value, key) -> typed value`` built here (``duration()``, ``integer()``, ``http_url`` ...).
Every error is a ``ConfigError`` whose message starts with the key path
(``upstreams[1].url: ...``); the CLI prints it on one line and exits 2.

This module sits below every layer (sources, state, expose, runtime all declare their
sections with it); ``cachemon.runconfig`` assembles the sections of `cachemon run`'s file.

The package: ``values`` (errors, durations, parsers), ``sections`` (``setting``, ``load_section``),
``files`` (bounded reads, YAML), ``kv`` (the KV-event sections), ``listen`` (upstreams, the listener).
"""
from __future__ import annotations

from cachemon.config.files import (
    MAX_CONFIG_BYTES,
    MAX_INT_DIGITS,
    MAX_TOKENIZER_FILE_BYTES,
    MAX_YAML_DEPTH,
    load_yaml,
    read_small_file,
    regular_file,
)
from cachemon.config.kv import (
    KV_EVENTS_EXTRA,
    KvEventsEndpoint,
    KvEventsSettings,
    MiB,
    check_kv_event_deps,
    kv_events_endpoint,
    tenant_key,
    tenant_names,
    zmq_endpoint,
)
from cachemon.config.listen import (
    Listen,
    Upstream,
    check_unique_names,
    parse_kv_events_spec,
    parse_listen,
    parse_upstream_spec,
    parse_windows,
    upstream,
)
from cachemon.config.sections import (
    check_keys,
    load_section,
    section,
    section_parsers,
    setting,
)
from cachemon.config.values import (
    DAY,
    DEFAULT_MAX_DURATION,
    DEFAULT_PORT,
    DEFAULT_UPSTREAM,
    DEFAULT_WINDOWS,
    DURATION_RE,
    HOUR,
    MINUTE,
    ConfigError,
    Parser,
    boolean,
    choice,
    duration,
    format_duration,
    http_url,
    integer,
    list_of,
    mapping_of,
    number,
    optional,
    or_empty,
    parse_duration,
    port,
    string,
    subkey,
    text,
    type_error,
)

__all__ = [
    "ConfigError", "DAY", "DEFAULT_MAX_DURATION", "DEFAULT_PORT", "DEFAULT_UPSTREAM", "DEFAULT_WINDOWS",
    "DURATION_RE", "HOUR", "KV_EVENTS_EXTRA", "KvEventsEndpoint", "KvEventsSettings", "Listen",
    "MAX_CONFIG_BYTES", "MAX_INT_DIGITS", "MAX_TOKENIZER_FILE_BYTES", "MAX_YAML_DEPTH", "MINUTE", "MiB",
    "Parser", "Upstream", "boolean", "check_keys", "check_kv_event_deps", "check_unique_names", "choice",
    "duration", "format_duration", "http_url", "integer", "kv_events_endpoint", "list_of", "load_section",
    "load_yaml", "mapping_of", "number", "optional", "or_empty", "parse_duration", "parse_kv_events_spec", "parse_listen",
    "parse_upstream_spec", "parse_windows", "port", "read_small_file", "regular_file", "section",
    "section_parsers", "setting", "string", "subkey", "tenant_key", "tenant_names", "text", "type_error", "upstream",
    "zmq_endpoint",
]
