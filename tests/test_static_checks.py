"""The layer contract, the type check and the linter run with the tests, so `make test` and CI
enforce them (configuration: [tool.importlinter], [tool.mypy], [tool.ruff] in pyproject.toml)."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not path:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_import_layers_hold():
    r = run(tool("lint-imports"), "--no-cache")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.slow
def test_mypy_is_clean_on_src():
    r = run(sys.executable, "-m", "mypy", "src")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_ruff_is_clean():
    r = run(tool("ruff"), "check", "src", "tests", "scripts", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_the_sidecar_loads_no_offline_tool_and_no_requests():
    """What `cachemon run` imports (config loader, every stage) stays in its layers at run time too:
    no offline tool (cachemon.analyze, cachemon.tools), and requests only when a warm-up is configured."""
    code = ("import sys\nfrom cachemon.runconfig import build_config\nfrom cachemon.daemon import Daemon\n"
            "d = Daemon(build_config(None, ('http://127.0.0.1:9/metrics',)))\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.startswith(('cachemon.analyze', 'cachemon.tools')) or m in ('requests', 'click')))")
    r = run(sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_every_top_level_module_has_a_layer():
    """A module missing from the layers contract is checked by nothing: each must be placed."""
    block = re.search(r"^layers = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block, "no layers contract in pyproject.toml"
    listed = set(re.findall(r"[a-z_]+", block.group(1)))
    pkg = ROOT / "src" / "cachemon"
    modules = {p.stem for p in pkg.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert modules - listed == set(), f"add these to [tool.importlinter] layers: {sorted(modules - listed)}"


# 500 lines is a smell detector, not a target (docs/architecture.md, "Size"): past it, look for a second job
# that moved in and give it a module of its own. A module that is one job says why here.
OVER_500_ALLOWED: dict[str, str] = {
    "analyze/sim/prefix.py": "one class, vLLM's pool: its runs, evictions and miss split share every field; a module "
                             "carved from it would hold none of the state it works on",
    "state/ledger/replica.py": "one class, a replica's ledger: each step of a store or a removal reads and writes the "
                               "same records, reference counts and departed-content table",
    "web/listener.py": "one class, the event loop: accepting, TLS, reading, holding, writing and evicting all read and "
                       "write the same connection table, selector and deferred replies",
}


def test_no_module_in_src_is_over_500_lines():
    pkg = ROOT / "src" / "cachemon"
    sizes = {p.relative_to(pkg).as_posix(): len(p.read_text().splitlines()) for p in pkg.rglob("*.py")}
    assert len(sizes) > 50
    over = {name: n for name, n in sizes.items() if n > 500 and name not in OVER_500_ALLOWED}
    assert over == {}, f"split these modules (one job per file, <= 500 lines): {over}"


# --- import circles: the picture of the package (and of the scripts) has none -------------------------
# Built from the source with ast, so every import counts: module level, function level and under
# TYPE_CHECKING (a circle there is still a circle in the design). An import of a package names its
# __init__; ``from a.b import c`` names the module a.b.c when there is one, else a.b (as grimp does).
# Dynamic imports (cli.py's lazy commands through importlib) are strings, not edges.

def _imports(path: Path) -> list[tuple[str, int, tuple[str, ...]]]:
    """(module, relative level, names) of every import statement in a file, wherever it sits."""
    out: list[tuple[str, int, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, 0, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level, tuple(a.name for a in node.names)))
    return out


def package_graph(src: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` (a directory under ``src``) it imports."""
    files = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (src / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for name, level, names in _imports(path):
            if level:
                base = here.rsplit(".", level - 1)[0] if level > 1 else here
                name = f"{base}.{name}" if name else base
            targets = [f"{name}.{n}" for n in names if f"{name}.{n}" in files]
            if len(targets) < len(names) or not names:      # an attribute of the module (or `import a.b`)
                while name and name not in files:
                    name = name.rpartition(".")[0]
                targets += [name] if name else []
            graph[mod].update(t for t in targets if t != mod)
    return graph


def flat_graph(dirs: list[Path], search: list[Path]) -> dict[str, set[str]]:
    """Scripts that import each other by plain module name (each puts its own directory, and some
    of ``search``, on sys.path): file -> the files it imports, resolved in its own directory first.
    The files found on ``search`` join the graph with their own imports."""
    graph: dict[str, set[str]] = {}
    todo = [p for d in dirs for p in sorted(d.glob("*.py"))]
    while todo:
        path = todo.pop()
        if str(path) in graph:
            continue
        edges = graph[str(path)] = set()
        for name, level, _ in _imports(path):
            if level or not name:
                continue
            for where in (path.parent, *search):
                hit = where / f"{name.split('.')[0]}.py"
                if hit.is_file():
                    if hit != path:
                        edges.add(str(hit))
                        todo.append(hit)
                    break
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (a -> b -> ... -> a) of the graph, or None: an iterative depth-first search."""
    state: dict[str, int] = {}        # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


@pytest.mark.slow
def test_the_package_has_no_import_circle():
    graph = package_graph(ROOT / "src", "cachemon")
    assert graph["cachemon.daemon"] >= {"cachemon.runtime.stages"}, "the graph lost the daemon's imports"
    assert "cachemon.judge.snapshots" in graph["cachemon.check.run"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


@pytest.mark.slow
def test_the_package_graph_holds_every_import_grimp_sees():
    """The ast graph above is no weaker than import-linter's own (grimp): every edge grimp finds
    between two cachemon modules is in it."""
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(ROOT / "src"))
    try:
        g = grimp.build_graph("cachemon", cache_dir=None)
    finally:
        sys.path.remove(str(ROOT / "src"))
    ours = package_graph(ROOT / "src", "cachemon")
    missing = {(m, t) for m in g.modules for t in g.find_modules_directly_imported_by(m)
               if t.startswith("cachemon") and t not in ours.get(m, set())}
    assert not missing, sorted(missing)


def test_the_scripts_have_no_import_circle():
    dirs = [ROOT / "scripts", ROOT / "scripts" / "e2e"]
    graph = flat_graph(dirs, [ROOT / "tests"])
    assert str(ROOT / "scripts" / "e2e" / "procs.py") in graph[str(ROOT / "scripts" / "e2e" / "run.py")]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(str(Path(c).relative_to(ROOT)) for c in cycle or ())


def test_a_constructed_circle_is_found(tmp_path):
    """Constructed packages and scripts: the checks above can fail, and name the circle."""
    pkg = tmp_path / "src" / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")     # function level, relative
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a, c\n")                        # no circle of its own
    graph = package_graph(tmp_path / "src", "pkg")
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import pkg\n")
    assert find_cycle(package_graph(tmp_path / "src", "pkg")) is None

    e2e = tmp_path / "scripts"
    e2e.mkdir()
    (e2e / "run.py").write_text("import sys\nfrom scenarios import all_scenarios\n")
    (e2e / "scenarios.py").write_text("def pick():\n    import run\n")
    cycle = find_cycle(flat_graph([e2e], []))
    assert cycle is not None and [Path(c).name for c in cycle] == ["run.py", "scenarios.py", "run.py"]
    (e2e / "scenarios.py").write_text("def pick():\n    import procs\n")
    assert find_cycle(flat_graph([e2e], [])) is None


# --- typing.Any: a ratchet ------------------------------------------------------------------------------
# `Any` where a type is known hides that value from mypy (issue 34, "Architecture v5", item 5). Lower the
# ceiling when you type more; never raise it: a value that really is arbitrary is `object`, narrowed with
# isinstance, and a JSON document is cachemon.jsontypes.JsonValue.
ANY_CEILING = 30


def any_lines(root: Path) -> list[str]:
    """``file:line`` of each line of the .py files under ``root`` that names ``Any`` outside an import
    line: what ``grep -rn '\\bAny\\b' src/cachemon --include=*.py | grep -v import`` lists."""
    word = re.compile(r"\bAny\b")
    return [f"{p.relative_to(root).as_posix()}:{n}" for p in sorted(root.rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if word.search(line) and "import" not in line]


def test_any_does_not_grow_back():
    """Baseline: 365 lines on 74d8045 (the issue's commit), 131 at v4's start, 408 on b966c57; 51 after
    JsonValue for the documents monitoring/ builds, Parser[T] and `object` for raw config values,
    TypedDicts / NamedTuples / protocols for records whose keys are known, BlockKey in analyze/sim and
    the optional libraries' own types (jinja2, tokenizers, pyzmq, watchdog)."""
    lines = any_lines(ROOT / "src" / "cachemon")
    assert len(lines) > 0, "the count found nothing: is the path right?"
    assert len(lines) <= ANY_CEILING, (f"{len(lines)} lines name Any (ceiling {ANY_CEILING}): type what is known "
                                        "instead\n" + "\n".join(lines))


def test_the_any_count_sees_annotations_and_skips_imports(tmp_path):
    """Constructed: one annotation, one import, one word that only contains Any."""
    (tmp_path / "m.py").write_text("from typing import Any\nx: Any = 1\nMany = 2\n")
    assert any_lines(tmp_path) == ["m.py:2"]
