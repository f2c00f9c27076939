"""`cachemon fingerprint`: print a model directory's tokenizer / chat-template hashes,
or compare two directories on sample prompts — the check to run before a model or
tokenizer upgrade, since any change in token ids starts the prefix cache cold."""
from __future__ import annotations

import json
import sys
from typing import TypedDict

import click

from cachemon.analyze.requests_io import Request, RequestsFileError, Skip, iter_requests
from cachemon.analyze.tokenize import MissingExtraError, TemplateError, TokenizerDirError
from cachemon.cli_options import format_option, usage_error

# Constructed sample prompts (used when --prompts is not given): plain prose, numbers,
# code, non-ASCII text and odd whitespace — where tokenizer versions tend to differ.
SAMPLE_REQUESTS = [
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "Where is my parcel number 1042?"}]},
    {"messages": [{"role": "user", "content": "Summarise: the quick brown fox jumps over the lazy dog, 3 times."}]},
    {"messages": [{"role": "user", "content": "def f(x):\n    return x ** 2  # square\n\n\tprint(f(12345))"}]},
    {"messages": [{"role": "user", "content": "Grüße aus Köln — ¿qué tal? 東京は晴れ。🙂"}]},
    {"messages": [{"role": "system", "content": "Current time: 2025-06-01 10:23:45."},
                  {"role": "user", "content": "  leading and trailing spaces  \n\n\n"}]},
    {"prompt": "Plain completion prompt with numbers 3.14159 and an ID 3fa2b1c4d5e6f708."},
]


@click.command("fingerprint")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False),
              help="Model directory (tokenizer.json, tokenizer_config.json, chat template).")
@click.option("--compare", nargs=2, type=click.Path(file_okay=False), metavar="DIR_A DIR_B",
              help="Compare two model directories: hashes, and tokenisation of sample prompts.")
@click.option("--prompts", type=click.Path(dir_okay=False),
              help="JSONL of requests to compare on (same format as `cachemon analyze`); default: built-in samples.")
@format_option()
@click.option("--redact", is_flag=True, help="Do not show token text around the first difference.")
def fingerprint_command(tokenizer_dir: str | None, compare: tuple[str, str] | None, prompts: str | None, fmt: str,
                        redact: bool) -> None:
    """Stable hashes of a tokenizer and its chat template (usable as labels).

    With --compare, exits 1 when the two directories tokenise any sample differently."""
    from cachemon.sources.fingerprint import fingerprint_dir
    if bool(tokenizer_dir) == bool(compare):
        raise click.UsageError("give exactly one of --tokenizer DIR or --compare DIR_A DIR_B")
    try:
        if tokenizer_dir:
            fp = fingerprint_dir(tokenizer_dir)
            if fmt == "json":
                click.echo(json.dumps({"path": tokenizer_dir, **fp}, indent=1))
            else:
                click.echo(f"tokenizer      {fp['tokenizer']}")
                click.echo(f"chat_template  {fp['chat_template'] or '(none)'}")
                click.echo(f"labels         tokenizer_hash=\"{fp['tokenizer']}\",chat_template_hash=\"{fp['chat_template']}\"")
            return
        assert compare is not None       # exactly one of the two was given
        result = compare_dirs(compare[0], compare[1], prompts)
    except (TokenizerDirError, MissingExtraError, RequestsFileError) as e:
        usage_error(e, "fingerprint")
    if fmt == "json":
        click.echo(json.dumps(_compare_json(result, redact), indent=1))
    else:
        click.echo(_compare_text(result, redact))
    sys.exit(1 if result["differing"] else 0)


class _Dir(TypedDict):
    path: str
    tokenizer: str          # the hashes of fingerprint_dir
    chat_template: str


class _Row(TypedDict, total=False):
    """One prompt rendered and tokenised by both directories."""
    line: int
    status: str             # "same", "differs" or "error"
    error: str
    tokens_a: int
    tokens_b: int
    first_difference: int | None
    ids_a: list[int]        # from the first differing token, 5 ids
    ids_b: list[int]
    text_a: str             # prompt text: left out with --redact
    text_b: str
    context: str


class _Skipped(TypedDict):
    line: int
    reason: str


class Comparison(TypedDict):
    """`cachemon fingerprint --compare A B --format json`."""
    a: _Dir
    b: _Dir
    changed_parts: list[str]
    prompts: str
    rows: list[_Row]
    differing: int
    skipped: list[_Skipped]


def compare_dirs(dir_a: str, dir_b: str, prompts_path: str | None) -> Comparison:
    from cachemon.analyze.requests_io import parse_line
    from cachemon.analyze.tokenize import ModelTokenizer
    from cachemon.sources.fingerprint import fingerprint_dir

    fa, fb = fingerprint_dir(dir_a), fingerprint_dir(dir_b)
    ta, tb = ModelTokenizer(dir_a), ModelTokenizer(dir_b)
    if prompts_path:
        items = list(iter_requests(prompts_path))
        source = prompts_path
    else:
        items = [it for i, body in enumerate(SAMPLE_REQUESTS, 1) for it in parse_line(json.dumps(body), i)]
        source = "built-in samples"
    reqs = [it for it in items if isinstance(it, Request)]
    skipped = [it for it in items if isinstance(it, Skip)]
    rows: list[_Row] = []
    differing = 0
    for req, ea, eb in zip(reqs, ta.encode_many(reqs), tb.encode_many(reqs), strict=False):
        row: _Row = {"line": req.line}
        if isinstance(ea, TemplateError) or isinstance(eb, TemplateError):
            row.update({"status": "error", "error": str(ea if isinstance(ea, TemplateError) else eb)})
            differing += 1
            rows.append(row)
            continue
        first = _first_difference(ea.ids, eb.ids)
        row.update({"tokens_a": len(ea.ids), "tokens_b": len(eb.ids), "first_difference": first,
                    "status": "same" if first is None else "differs"})
        if first is not None:
            differing += 1
            row["ids_a"] = ea.ids[first:first + 5]
            row["ids_b"] = eb.ids[first:first + 5]
            row["text_a"] = ta.tok.decode(ea.ids[first:first + 5], skip_special_tokens=False)
            row["text_b"] = tb.tok.decode(eb.ids[first:first + 5], skip_special_tokens=False)
            row["context"] = ta.tok.decode(ea.ids[max(0, first - 5):first], skip_special_tokens=False)
        rows.append(row)
    changed = sorted(k for k in set(fa["parts"]) | set(fb["parts"]) if fa["parts"].get(k) != fb["parts"].get(k))
    if fa["chat_template"] != fb["chat_template"]:
        changed.append("chat_template")
    return {"a": {"path": dir_a, "tokenizer": fa["tokenizer"], "chat_template": fa["chat_template"]},
            "b": {"path": dir_b, "tokenizer": fb["tokenizer"], "chat_template": fb["chat_template"]},
            "changed_parts": changed, "prompts": source, "rows": rows, "differing": differing,
            "skipped": [{"line": s.line, "reason": s.reason} for s in skipped]}


def _first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _compare_json(r: Comparison, redact: bool) -> Comparison:
    if redact:
        rows: list[_Row] = []
        for row in r["rows"]:
            kept = row.copy()
            kept.pop("text_a", None)      # prompt text
            kept.pop("text_b", None)
            kept.pop("context", None)
            rows.append(kept)
        r = {**r, "rows": rows}
    return r


def _compare_text(r: Comparison, redact: bool) -> str:
    out = [f"A  {r['a']['path']}: tokenizer {r['a']['tokenizer']}, chat template {r['a']['chat_template'] or '(none)'}",
           f"B  {r['b']['path']}: tokenizer {r['b']['tokenizer']}, chat template {r['b']['chat_template'] or '(none)'}",
           "changed: " + (", ".join(r["changed_parts"]) if r["changed_parts"] else "nothing (identical hashes)"),
           f"{len(r['rows'])} prompts from {r['prompts']}: {r['differing']} tokenise differently"]
    for row in r["rows"]:
        if row["status"] == "error":
            out.append(f"  line {row['line']}: cannot render: {row['error']}")
        elif row["status"] == "differs":
            s = (f"  line {row['line']}: first differing token at {row['first_difference']} "
                 f"({row['tokens_a']} vs {row['tokens_b']} tokens): ids {row['ids_a']} vs {row['ids_b']}")
            if not redact:
                s += f"; after {row['context']!r}: {row['text_a']!r} vs {row['text_b']!r}"
            out.append(s)
    for sk in r["skipped"]:
        out.append(f"  line {sk['line']} skipped: {sk['reason']}")
    if not r["differing"]:
        out.append("Same token ids for every prompt: prefix-cache blocks stay valid across the change.")
    else:
        out.append("Token ids change: every cached block of the affected prompts will miss after the upgrade.")
    return "\n".join(out)
