"""The import rules of docs/architecture.md, checked by walking every module's imports with ``ast``.

Each import is resolved to the part of the package it reaches (``core``, ``engine``, ``sync``,
``worker``...).  Imports under ``if TYPE_CHECKING:`` are skipped (they never run); imports inside
a function count, since they run when it is called.  The rules:

1. ``core`` imports nothing of the package but ``core`` and ``errors``, and no I/O library
   (redis, hiredis, asyncio, socket) nor Airflow or PySpark.
2. ``drivers_common`` (what the two driver twins share) imports only ``core`` and ``errors``.
3. ``engine`` and ``sync`` never import each other; they share through ``drivers_common`` and
   ``core``; neither imports a part above them (worker, ops, cli, Airflow glue, spark,
   dashboard), except the allow-listed entry points below.
4. Only the Airflow glue (hooks, operators, sensors, triggers, queues), the dashboard's plugin and
   the examples import ``airflow``; only ``spark``, the examples and the worker's Spark mode
   import ``pyspark`` (the worker only inside functions).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parents[2] / "airflow_provider_chasqui"
PKG = PKG_DIR.name

LOWER = {"core", "errors", "drivers_common", "engine", "sync", "types", "tracing"}
UPPER = {
    "worker",
    "ops",
    "cli",
    "hooks",
    "operators",
    "sensors",
    "triggers",
    "queues",
    "dashboard",
    "spark",
    "examples",
    "compat",
    "demo",
    "get_provider_info",
}
ALLOWED = {  # part -> the parts of the package it may import (itself always)
    "core": {"errors"},
    "errors": {"core"},  # core.urls.redact_text, imported inside ChasquiConnectionError.__init__
    "drivers_common": {"core", "errors"},
    "engine": {"core", "drivers_common", "errors", "types", "tracing", "__init__"},
    "sync": {"core", "drivers_common", "errors", "types", "tracing", "__init__"},
}
# (importing module, imported module): deliberate exceptions, each with its reason
EXCEPTIONS = {
    # the deprecated ``python -m airflow_provider_chasqui.engine.scheduler`` entry forwards to the CLI
    (f"{PKG}.engine.scheduler", f"{PKG}.ops.standalone"),
}
AIRFLOW_PARTS = {"hooks", "operators", "sensors", "triggers", "queues", "dashboard", "examples"}
PYSPARK_PARTS = {"spark", "examples"}
PYSPARK_LAZY_PARTS = {"worker"}  # the worker's Spark mode imports pyspark when it runs
IO_LIBS = {"redis", "hiredis", "asyncio", "socket"}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PKG_DIR.rglob("*.py")):
        rel = path.relative_to(PKG_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def part_of(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(module: str, path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, inside a function, line) for every import that can run."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rsplit(".", 1)[0]
    out: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other, in_function)
                continue
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                out.append((target, in_function, child.lineno))
                for a in child.names:  # ``from .. import tracing``: the submodule is the target
                    sub = f"{target}.{a.name}"
                    rel = Path(*sub.split(".")[1:]) if sub.startswith(PKG + ".") else None
                    if rel is not None and ((PKG_DIR / rel).with_suffix(".py").exists() or (PKG_DIR / rel).is_dir()):
                        out.append((sub, in_function, child.lineno))
            visit(child, nested)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return out


def violations() -> list[str]:
    return [v for module, path in _modules() for v in module_violations(module, path)]


def module_violations(module: str, path: Path) -> list[str]:
    bad = []
    me = part_of(module)
    for target, in_function, line in imports(module, path):
        where = f"{module}:{line} imports {target}"
        top = target.split(".")[0]
        if top == PKG:
            if target == PKG:  # the package itself (``from .. import tracing`` is resolved above)
                continue
            them = part_of(target)
            if them != me and (module, target) not in EXCEPTIONS and me in ALLOWED and them not in ALLOWED[me]:
                bad.append(f"{where}: {me} may import only {sorted(ALLOWED[me])}")
            continue
        if top == "airflow" and me not in AIRFLOW_PARTS:
            bad.append(f"{where}: only {sorted(AIRFLOW_PARTS)} import Airflow")
        if top in ("pyspark", "py4j") and me not in PYSPARK_PARTS and not (me in PYSPARK_LAZY_PARTS and in_function):
            bad.append(f"{where}: only {sorted(PYSPARK_PARTS)} import PySpark (the worker inside functions)")
        if me == "core" and top in IO_LIBS:
            bad.append(f"{where}: the core is sans-I/O")
    return bad


def test_every_part_and_layer_is_named() -> None:
    parts = {part_of(m) for m, _ in _modules()}
    assert parts <= LOWER | UPPER | {"__init__"}, sorted(parts - LOWER - UPPER)


def test_the_import_rules_hold() -> None:
    assert violations() == []


def test_the_exceptions_are_still_needed() -> None:
    found = {(m, t) for m, p in _modules() for t, _f, _l in imports(m, p)}
    assert found >= EXCEPTIONS, sorted(EXCEPTIONS - found)


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..engine._driver import AsyncDriver\n"  # sync -> engine
        "import airflow\n"  # Airflow outside the glue
        "if TYPE_CHECKING:\n"
        "    from ..worker import cli\n"  # never runs: allowed
        "def f():\n"
        "    import pyspark\n"  # PySpark outside spark
    )
    bad = module_violations(f"{PKG}.sync.fake", fake)
    assert len(bad) == 3, bad
    assert any("engine._driver" in b for b in bad) and any("Airflow" in b for b in bad)
    assert any("PySpark" in b for b in bad)
    fake.write_text("import redis\nfrom ..engine import queue\n")
    assert len(module_violations(f"{PKG}.core.fake", fake)) == 3  # redis, engine, engine.queue


def test_the_resolver_reads_relative_imports() -> None:
    """The resolver is right about the relative imports the rules depend on."""
    core_calls = PKG_DIR / "core" / "calls.py"
    got = {t for t, _f, _l in imports(f"{PKG}.core.calls", core_calls)}
    assert f"{PKG}.core.scripts" in got
    sync_driver = PKG_DIR / "sync" / "_driver.py"
    got = {t for t, _f, _l in imports(f"{PKG}.sync._driver", sync_driver)}
    assert f"{PKG}.drivers_common" in got and f"{PKG}.core.calls" in got
    engine_queue = PKG_DIR / "engine" / "queue.py"
    assert f"{PKG}.tracing" in {t for t, _f, _l in imports(f"{PKG}.engine.queue", engine_queue)}
    assert part_of(f"{PKG}.engine._driver") == "engine" and part_of(PKG) == "__init__"


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports at module level): each
    strongly connected component of more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm (the graph has ~150 nodes: recursion is fine)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1 or v in graph.get(v, ()):
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module-level imports between the package's modules (``TYPE_CHECKING`` blocks and imports
    inside functions run later, so they cannot make an import cycle).  The package ``__init__``
    is left out: it is lazy (PEP 562) and every module sits below it."""
    modules = dict(_modules())
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        if module == PKG:
            continue
        graph[module] = {
            t for t, in_function, _l in imports(module, path) if not in_function and t in modules and t != PKG
        }
    return graph


def test_no_module_level_import_cycles() -> None:
    """No module needs another that needs it back while either is still half imported (issue
    #17: ``core/producer.py`` and ``types.py`` used to import each other)."""
    graph = import_graph()
    assert len(graph) > 100 and f"{PKG}.core.producer" in graph
    assert module_cycles(graph) == []


def test_the_cycle_finder_sees_cycles() -> None:
    assert module_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert module_cycles({"a": {"a"}}) == [["a"]]
    assert module_cycles({"a": {"b"}, "b": set()}) == []
