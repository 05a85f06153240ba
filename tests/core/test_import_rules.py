"""The import rules of docs/architecture.md, checked by walking every module's imports with ``ast``.

Each import is resolved to the part of the package it reaches (``core``, ``engine``, ``sync``,
``worker``...).  Imports under ``if TYPE_CHECKING:`` are skipped (they never run); imports inside
a function count, since they run when it is called.  The rules:

1. Every part may import only the parts ``ALLOWED`` names for it (the arrows of
   docs/architecture.md); the few deliberate exceptions are listed with their reasons.
2. ``core`` imports no I/O library (redis, hiredis, asyncio, socket) nor Airflow or PySpark.
3. Only the Airflow glue (hooks, operators, sensors, triggers, queues), the dashboard's plugin and
   the examples import ``airflow`` (``cli_common`` only inside the function that reads an Airflow
   connection); only ``spark``, the examples and the worker's Spark mode import ``pyspark`` (the
   worker only inside functions).
4. No private name crosses parts: nothing imports ``_name`` (or a ``_module``) of another part.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parents[2] / "airflow_provider_chasqui"
PKG = PKG_DIR.name

LOWER = {"core", "errors", "drivers_common", "credentials", "engine", "sync", "types", "tracing"}
UPPER = {
    "worker",
    "ops",
    "cli",
    "cli_common",
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
# parts that are one layer of docs/architecture.md: the Airflow glue, and the ``chasqui`` command
LAYER = {
    **dict.fromkeys(("hooks", "operators", "sensors", "triggers", "queues", "get_provider_info"), "airflow"),
    "cli": "ops",
}
_BASE = {"core", "errors", "types", "tracing"}
ALLOWED = {  # layer -> the layers it may import (itself always): the arrows of docs/architecture.md
    "core": {"errors"},
    "errors": {"core"},  # core.urls.redact_text, imported inside ChasquiConnectionError.__init__
    "types": {"core", "errors"},
    "tracing": set(),
    "__init__": {"errors", "engine", "sync", "types", "core"},
    "drivers_common": {"core", "errors"},
    "credentials": {"core", "errors"},  # redis-py's CredentialProvider; registered in core.urls
    "engine": _BASE | {"drivers_common", "credentials", "__init__"},
    "sync": _BASE | {"drivers_common", "credentials", "__init__"},
    "cli_common": {"core", "errors", "airflow"},  # airflow: reading a connection, inside a function
    "worker": _BASE | {"engine", "sync", "cli_common", "credentials"},
    "ops": _BASE | {"drivers_common", "engine", "sync", "worker", "cli_common"},
    "airflow": _BASE | {"engine", "sync", "credentials"},  # [chasqui] credential_provider (hooks)
    "dashboard": _BASE | {"sync", "cli_common", "airflow"},  # airflow: plugin.py only
    "spark": _BASE | {"sync", "engine"},
    "compat": _BASE | {"engine"},
    "examples": _BASE | {"worker"},
    "demo": _BASE | {"sync", "engine", "worker", "cli_common"},
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


def layer_of(module: str) -> str:
    part = part_of(module)
    return LAYER.get(part, part)


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
    me, layer = part_of(module), layer_of(module)
    for target, in_function, line in imports(module, path):
        where = f"{module}:{line} imports {target}"
        top = target.split(".")[0]
        if top == PKG:
            if target == PKG:  # the package itself (``from .. import tracing`` is resolved above)
                continue
            them = layer_of(target)
            if them != layer and (module, target) not in EXCEPTIONS and them not in ALLOWED.get(layer, set()):
                bad.append(f"{where}: {layer} may import only {sorted(ALLOWED.get(layer, set()))}")
            continue
        if top == "airflow" and me not in AIRFLOW_PARTS and not (me == "cli_common" and in_function):
            bad.append(f"{where}: only {sorted(AIRFLOW_PARTS)} import Airflow")
        if top in ("pyspark", "py4j") and me not in PYSPARK_PARTS and not (me in PYSPARK_LAZY_PARTS and in_function):
            bad.append(f"{where}: only {sorted(PYSPARK_PARTS)} import PySpark (the worker inside functions)")
        if me == "core" and top in IO_LIBS:
            bad.append(f"{where}: the core is sans-I/O")
    return bad + private_violations(module, path)


def private_violations(module: str, path: Path) -> list[str]:
    """``from <another part> import _name`` or ``from <another part>._module import ...``."""
    bad = []
    layer = layer_of(module)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if not target.startswith(PKG + ".") or layer_of(target) == layer:
            continue
        private = [p for p in target.split(".")[1:] if p.startswith("_") and p != "__init__"]
        private += [a.name for a in node.names if a.name.startswith("_")]
        if private:
            bad.append(f"{module}:{node.lineno} imports private {', '.join(private)} of {target}")
    return bad


def test_every_part_and_layer_is_named() -> None:
    parts = {part_of(m) for m, _ in _modules()}
    assert parts <= LOWER | UPPER | {"__init__"}, sorted(parts - LOWER - UPPER)
    assert {layer_of(f"{PKG}.{p}.x") for p in parts if p != "__init__"} <= ALLOWED.keys()


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
    assert len(bad) == 4, bad
    assert any("engine._driver" in b for b in bad) and any("Airflow" in b for b in bad)
    assert any("private _driver" in b for b in bad)  # a private module of another part
    assert any("PySpark" in b for b in bad)
    fake.write_text("from ..core.codec import _packb\nfrom ..worker import cli\n")
    bad = module_violations(f"{PKG}.spark.fake", fake)
    assert sorted(b.split(" imports ")[1] for b in bad) == [
        f"{PKG}.worker.cli: spark may import only ['core', 'engine', 'errors', 'sync', 'tracing', 'types']",
        f"{PKG}.worker: spark may import only ['core', 'engine', 'errors', 'sync', 'tracing', 'types']",
        f"private _packb of {PKG}.core.codec",
    ], bad
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
