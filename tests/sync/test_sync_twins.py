"""``sync/queue.py`` is the blocking twin of ``engine/queue.py``: the same methods with the
same bodies, differing only in async/await/aclose-style tokens.  And importing the package
(or the worker) never pulls in Airflow or PySpark."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import airflow_provider_chasqui.engine._driver as async_driver_mod
import airflow_provider_chasqui.engine._sentinel as async_sentinel_mod
import airflow_provider_chasqui.engine.queue as async_mod
import airflow_provider_chasqui.engine.sharded as async_sharded_mod
import airflow_provider_chasqui.sync._driver as sync_driver_mod
import airflow_provider_chasqui.sync._sentinel as sync_sentinel_mod
import airflow_provider_chasqui.sync.queue as sync_mod
import airflow_provider_chasqui.sync.sharded as sync_sharded_mod
from airflow_provider_chasqui import Queue, SyncQueue

# async-side name -> sync-side name; everything else must be identical
RENAMES = {
    "Queue": "SyncQueue",
    "AsyncDriver": "SyncDriver",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aclose": "close",
}
# The one deliberate difference: an asyncio Job can await its own result (Job.wait_for_result
# is a coroutine), so only the async twin hands the Job its queue.
ASYNC_ONLY_KEYWORDS = {("_job", "_queue")}
# The other: the asyncio twin waits through the process's shared event reader
# (``engine/event_hub.py``, one per queue and event loop); the blocking one, one caller per
# thread, follows the events stream on its own driver.
ASYNC_ONLY_METHODS = {"wait_for_results"}


class _ToSync(ast.NodeTransformer):
    """async def -> def, await x -> x, async with/for -> with/for, renames applied, no docstrings."""

    def __init__(self, method: str = "") -> None:
        self.method = method

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        new = ast.FunctionDef(**{f: getattr(node, f) for f in node._fields})
        return self.visit_FunctionDef(ast.copy_location(new, node))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = RENAMES.get(node.name, node.name)
        self.generic_visit(node)
        return node

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        return self.visit(ast.copy_location(ast.With(items=node.items, body=node.body, type_comment=None), node))

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        new = ast.For(target=node.target, iter=node.iter, body=node.body, orelse=node.orelse, type_comment=None)
        return self.visit(ast.copy_location(new, node))

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = RENAMES.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = RENAMES.get(node.attr, node.attr)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str):  # string annotations such as "Queue"
            node.value = RENAMES.get(node.value, node.value)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.keywords = [kw for kw in node.keywords if (self.method, kw.arg) not in ASYNC_ONLY_KEYWORDS]
        return node


def _strip_docstrings(node: ast.AST) -> None:
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            child.body = body[1:] or [ast.Pass()]


def _class(module, name: str) -> ast.ClassDef:
    tree = ast.parse(Path(module.__file__).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    _strip_docstrings(cls)
    return cls


def _methods(cls: ast.ClassDef, to_sync: bool) -> dict[str, str]:
    out = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if to_sync:
                node = _ToSync(node.name).visit(node)
            out[node.name] = ast.dump(node, include_attributes=False)
    return out


def test_the_twins_have_the_same_methods_with_the_same_bodies() -> None:
    async_methods = _methods(_class(async_mod, "Queue"), to_sync=True)
    sync_methods = _methods(_class(sync_mod, "SyncQueue"), to_sync=False)
    assert sorted(async_methods) == sorted(sync_methods)
    differ = [
        name for name in async_methods if async_methods[name] != sync_methods[name] and name not in ASYNC_ONLY_METHODS
    ]
    assert differ == [], f"methods that differ beyond async/await tokens: {differ}"


def test_the_only_async_only_keyword_is_still_there() -> None:
    """Keep the exception list honest: if the async twin stops passing _queue, drop the rule."""
    src = inspect.getsource(Queue._job)
    assert "_queue=self" in src
    assert "_queue" not in inspect.getsource(SyncQueue._job)


def test_every_async_method_is_a_coroutine_and_every_sync_one_is_not() -> None:
    for name, fn in inspect.getmembers(Queue, inspect.isfunction):
        if name.startswith("_") and name not in ("__aenter__", "__aexit__"):
            continue
        twin = getattr(SyncQueue, RENAMES.get(name, name))
        assert inspect.iscoroutinefunction(fn), name
        assert not inspect.iscoroutinefunction(twin), name
        a, s = inspect.signature(fn), inspect.signature(twin)
        assert list(a.parameters) == list(s.parameters), name
        for p in a.parameters:
            assert a.parameters[p].default == s.parameters[p].default, (name, p)


def test_shared_module_helpers_are_shared_not_copied() -> None:
    assert sync_mod.window_to_ms is async_mod.window_to_ms
    assert sync_mod.DEFAULT_URL is async_mod.DEFAULT_URL
    sync_tree = ast.parse(Path(sync_mod.__file__).read_text())
    async_tree = ast.parse(Path(async_mod.__file__).read_text())
    sync_fns = {n.name: n for n in sync_tree.body if isinstance(n, ast.FunctionDef)}
    async_fns = {n.name: n for n in async_tree.body if isinstance(n, ast.FunctionDef)}
    for name, fn in sync_fns.items():
        if name in async_fns:
            assert ast.dump(fn) == ast.dump(async_fns[name]), name


ISOLATION = textwrap.dedent(
    """
    import sys
    import airflow_provider_chasqui
    import airflow_provider_chasqui.engine.worker
    import airflow_provider_chasqui.engine.queue
    import airflow_provider_chasqui.sync.queue
    from airflow_provider_chasqui import Queue, SyncQueue, Worker, QueueEvents
    bad = sorted(m for m in sys.modules
                 if m.split(".")[0] in ("airflow", "pyspark", "py4j", "sqlalchemy", "pendulum"))
    print("LEAKED", bad)
    """
)


def test_importing_the_package_and_the_worker_does_not_import_airflow_or_pyspark() -> None:
    proc = subprocess.run([sys.executable, "-c", ISOLATION], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "LEAKED []" in proc.stdout, proc.stdout


# ---- every twin pair: same public names, compatible signatures -------------------------------

# (async module, sync module, {async class: sync class}): the pairs kept as twins.
TWIN_MODULES = [
    (async_mod, sync_mod, {"Queue": "SyncQueue"}),
    (async_sharded_mod, sync_sharded_mod, {"ShardedQueue": "SyncShardedQueue"}),
    (async_driver_mod, sync_driver_mod, {"AsyncDriver": "SyncDriver"}),
    (async_sentinel_mod, sync_sentinel_mod, {}),
]
# Names in annotations that differ by twin (async spelling -> sync spelling).
ANNOTATION_RENAMES = {
    "AsyncDriver": "SyncDriver",
    "ShardedQueue": "SyncShardedQueue",
    "Queue": "SyncQueue",
    "aioredis.Redis": "redis.Redis",
    "AsyncIterator": "Iterator",
    "AsyncRedisCluster": "RedisCluster",
}
# The intended differences, each with its reason.  Module level: (module, name) present on one side only.
ASYNC_ONLY_MODULE_NAMES = {
    # the asyncio twin's historical alias of ShardedQueue (chasquimq spells it that way)
    ("airflow_provider_chasqui.engine.sharded", "AsyncShardedQueue"),
    # a sharded *worker* is asyncio only: workers are asyncio processes, there is no blocking worker
    ("airflow_provider_chasqui.engine.sharded", "ShardedWorker"),
}
SYNC_ONLY_MODULE_NAMES: set[tuple[str, str]] = set()
# Methods on one side only: (async class, method); none today (the context-manager dunders and
# ``aclose`` are renamed by RENAMES, not missing; ``wait_for_results`` differs in body only).
ASYNC_ONLY_CLASS_METHODS: set[tuple[str, str]] = set()
SYNC_ONLY_CLASS_METHODS: set[tuple[str, str]] = set()
# Methods that stay plain functions on the asyncio side (no I/O: they pick a shard, build a call).
ASYNC_SIDE_NOT_COROUTINES = {("ShardedQueue", "shard_for"), ("Queue", "_job")}


def _norm(annotation: object) -> str:
    text = str(annotation)
    for a, s in sorted(ANNOTATION_RENAMES.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w.]){re.escape(a)}(?!\w)", s, text)
    return text


def _public(obj: object) -> dict[str, object]:
    keep = {"__init__", "__aenter__", "__aexit__", "__enter__", "__exit__"}
    return {
        RENAMES.get(n, n): f
        for n, f in vars(obj).items()
        if (not n.startswith("_") or n in keep) and (callable(f) or isinstance(f, property))
    }


def _same_signature(where: str, a: object, s: object) -> None:
    if isinstance(a, property) or isinstance(s, property):
        assert isinstance(a, property) and isinstance(s, property), where
        return
    sa, ss = inspect.signature(a), inspect.signature(s)
    assert list(sa.parameters) == list(ss.parameters), where
    for name, pa in sa.parameters.items():
        ps = ss.parameters[name]
        assert (pa.kind, pa.default) == (ps.kind, ps.default), (where, name)
        assert _norm(pa.annotation) == _norm(ps.annotation), (where, name, pa.annotation, ps.annotation)
    assert _norm(sa.return_annotation) == _norm(ss.return_annotation), (where, "return")


@pytest.mark.parametrize("amod,smod,classes", TWIN_MODULES, ids=lambda v: getattr(v, "__name__", ""))
def test_every_twin_pair_has_the_same_public_api(amod, smod, classes) -> None:
    a_all, s_all = set(amod.__all__), set(smod.__all__)
    a_all = {classes.get(n, n) for n in a_all} - {n for m, n in ASYNC_ONLY_MODULE_NAMES if m == amod.__name__}
    s_all -= {n for m, n in SYNC_ONLY_MODULE_NAMES if m == smod.__name__}
    assert a_all == s_all, (amod.__name__, sorted(a_all ^ s_all))
    for a_name in amod.__all__:
        s_name = classes.get(a_name, a_name)
        if s_name not in s_all:
            continue
        a_obj, s_obj = getattr(amod, a_name), getattr(smod, s_name)
        if not isinstance(a_obj, type):
            if callable(a_obj) and a_obj is not s_obj:  # a shared helper is one object: nothing to compare
                assert not inspect.iscoroutinefunction(s_obj), f"{smod.__name__}.{s_name} is a coroutine"
                _same_signature(f"{amod.__name__}.{a_name}", a_obj, s_obj)
            continue
        a_methods, s_methods = _public(a_obj), _public(s_obj)
        a_names = set(a_methods) - {m for c, m in ASYNC_ONLY_CLASS_METHODS if c == a_name}
        s_names = set(s_methods) - {m for c, m in SYNC_ONLY_CLASS_METHODS if c == a_name}
        assert a_names == s_names, (a_name, sorted(a_names ^ s_names))
        for m in sorted(a_names):
            fa, fs = a_methods[m], s_methods[m]
            if isinstance(fa, property):
                _same_signature(f"{a_name}.{m}", fa, fs)
                continue
            async_side = inspect.iscoroutinefunction(fa) or inspect.isasyncgenfunction(fa)
            if m == "__init__" or (a_name, m) in ASYNC_SIDE_NOT_COROUTINES:
                assert not async_side, (a_name, m)
            else:
                assert async_side, f"{a_name}.{m} is a blocking method on the asyncio twin"
            assert not (inspect.iscoroutinefunction(fs) or inspect.isasyncgenfunction(fs)), (s_name, m)
            _same_signature(f"{a_name}.{m}", fa, fs)


def test_the_allow_lists_name_real_things() -> None:
    """An allow-list entry whose difference is gone must be dropped."""
    mods = {m.__name__: m for pair in TWIN_MODULES for m in pair[:2]}
    for mod, name in ASYNC_ONLY_MODULE_NAMES | SYNC_ONLY_MODULE_NAMES:
        assert hasattr(mods[mod], name), (mod, name)
    for cls, name in ASYNC_ONLY_CLASS_METHODS | ASYNC_SIDE_NOT_COROUTINES:
        assert hasattr(getattr(async_mod, cls, None) or getattr(async_sharded_mod, cls), name), (cls, name)
    for cls, name in SYNC_ONLY_CLASS_METHODS:
        assert not hasattr(getattr(async_mod, cls, None) or getattr(async_sharded_mod, cls), name), (cls, name)


def test_sync_imports_nothing_private_from_engine() -> None:
    """The twins share through ``drivers_common`` and ``core``, never through each other."""
    root = Path(sync_mod.__file__).parent
    bad = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                if mod.startswith(("..engine", "airflow_provider_chasqui.engine")):
                    bad.append(f"{path.name}: from {mod} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                bad += [
                    f"{path.name}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("airflow_provider_chasqui.engine")
                ]
    assert bad == [], bad
