"""Nothing a producer writes is ever executed, imported or unpickled.

Statically (AST of every module, text of every Lua script): no pickle-family module, no
eval/exec/compile, no ``__import__``, ``importlib.import_module`` only in the handler registry
(whose module names come from the operator's ``--handlers``), msgpack decoding without hooks
that could build objects, and no dynamic code in Lua.  At run time: a malicious pickle sent
as job data reaches the handler as inert bytes, sent as a raw envelope it is dead-lettered,
and job names that look like code or import paths find no handler and are dead-lettered.
"""

from __future__ import annotations

import ast
import os
import pickle
import re
from pathlib import Path

import pytest
from engine_support import raw_async, running, wait_until

from airflow_provider_chasqui import Queue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_provider_chasqui"
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
IMPORT_MODULE_ALLOWED = {
    "worker/registry.py",  # operator-given --handlers only, never job data
    "cli.py",  # the fixed table of subcommand modules (cli.COMMANDS), constants in the source
    # a deployer's --credential-provider or Airflow [chasqui] credential_provider setting, never job
    # or connection data (SECURITY.md, "Token credentials")
    "credentials.py",
}
MSGPACK_HOOKS = {"ext_hook", "object_hook", "object_pairs_hook", "list_hook"}
# (module, call): the one exception, with its reason.  ``core/fast.py`` builds per-class
# constructors as ``dataclasses`` builds ``__init__``: ``exec`` of a source made of the class's
# field names (identifiers, checked) at import, never of data (tests/core/test_fast.py).
EXEC_ALLOWED = {("core/fast.py", "exec")}
# (module, hooks): msgpack hooks that build nothing but builtin containers.  ``core/codec.py``'s
# bounded decode passes ``_ContainerBudget.take``, which counts each list and map and returns it
# unchanged (``test_the_decode_budget_hook_returns_what_it_is_given``); its second pass, for maps
# with array keys, ``_TupleKeyedMaps.take``, which makes each map a dict with those keys as
# tuples (``test_the_tuple_key_hook_builds_only_dicts_and_tuples``).
COUNTING_HOOKS = {
    ("core/codec.py", frozenset({"list_hook", "object_hook"})),
    ("core/codec.py", frozenset({"list_hook", "object_pairs_hook"})),
}


def _modules() -> list[tuple[str, ast.AST]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


# The process pool's private pipe (issue 25): the worker sends its own children the job fields
# it decoded from msgpack, and they send back their handlers' results and exceptions.  Nothing
# read from Redis is ever unpickled (test_the_pool_unpickles_only_its_childrens_pipe).
PICKLE_ALLOWED = {"engine/process_pool.py", "engine/pool_child.py"}


def test_no_pickle_family_module_is_imported() -> None:
    bad = []
    for rel, tree in _modules():
        if rel in PICKLE_ALLOWED:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [f"{rel}: {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
    assert not bad, bad
    # and not through a string either (importlib, __import__ of "pickle")
    for p in PACKAGE.rglob("*.py"):
        assert not re.search(r"""["'](c?[Pp]ickle|dill|cloudpickle|marshal)["']""", p.read_text()), p


def test_the_pool_unpickles_only_its_childrens_pipe() -> None:
    """In the two pool modules, every ``pickle.loads`` reads what came through the pool's pipe
    (a child's reply, or the handler table the worker itself pickled), and nothing else in the
    package imports them but the worker, which builds a pool only for ``processes=N``."""
    loads = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("loads", "load")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "pickle"
            ):
                loads.append((rel, ast.unparse(node.args[0])))
    assert sorted(loads) == sorted(
        [
            ("engine/process_pool.py", "blob"),  # a child's reply (ProcessPool.run)
            ("engine/pool_child.py", "payload"),  # the handler table the worker pickled (child_main)
            ("engine/pool_child.py", "pickle.dumps(exc)"),  # a round trip of the handler's own exception
        ]
    ), loads
    users = {
        rel
        for rel, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith(("process_pool", "pool_child"))
    }
    worker_parts = {"engine/worker.py", "engine/worker_base.py", "engine/worker_slots.py"}
    assert users <= worker_parts | {"engine/process_pool.py"}, users


def test_no_eval_exec_or_dynamic_import_outside_the_registry() -> None:
    bad = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in FORBIDDEN_CALLS and (rel, fn.id) not in EXEC_ALLOWED:
                bad.append(f"{rel}:{node.lineno} {fn.id}()")
            if isinstance(fn, ast.Attribute) and fn.attr == "import_module" and rel not in IMPORT_MODULE_ALLOWED:
                bad.append(f"{rel}:{node.lineno} import_module()")
            if (
                isinstance(fn, ast.Attribute)
                and fn.attr in ("unpackb", "Unpacker", "unpack")
                or isinstance(fn, ast.Name)
                and fn.id in ("_unpackb",)
            ):
                hooks = {k.arg for k in node.keywords} & MSGPACK_HOOKS
                counting = all(
                    isinstance(k.value, ast.Attribute) and k.value.attr == "take"
                    for k in node.keywords
                    if k.arg in MSGPACK_HOOKS
                )
                if hooks and (rel, frozenset(hooks)) in COUNTING_HOOKS and counting:
                    continue  # the decode budget's counter: returns each container as it came
                if hooks:
                    bad.append(f"{rel}:{node.lineno} msgpack decoding with {sorted(hooks)}")
            if (
                isinstance(fn, ast.Attribute)
                and fn.attr in ("load", "unsafe_load")
                and isinstance(fn.value, ast.Name)
                and fn.value.id == "yaml"
            ):
                bad.append(f"{rel}:{node.lineno} yaml.{fn.attr}()")
    assert not bad, bad


def test_the_consuming_path_cannot_import_anything() -> None:
    """core/, engine/ and sync/ (everything between Redis and a handler) never import importlib
    or the handler registry: dispatch is a dict lookup of the job name in the handlers the
    worker was constructed with."""
    bad = []
    for rel, tree in _modules():
        if rel.split("/")[0] not in ("core", "engine", "sync"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [f"{rel}: import {a.name}" for a in node.names if a.name.split(".")[0] == "importlib"]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if mod.split(".")[0] == "importlib" and not (
                    rel == "core/scripts.py" and mod == "importlib" and [a.name for a in node.names] == ["resources"]
                ):
                    bad.append(f"{rel}: from {mod}")
                if "registry" in mod:
                    bad.append(f"{rel}: from {mod}")
    assert not bad, bad


def test_lua_scripts_run_no_dynamic_code() -> None:
    for path in (ROOT / "lua").glob("*.lua"):
        text = re.sub(r"--[^\n]*", "", path.read_text())  # comments may mention anything
        for word in ("loadstring", "dofile", "loadfile", "require", "load(", "setfenv", "getfenv", "debug."):
            assert word not in text, f"{path.name} uses {word}"


class _Bomb:
    """Unpickling this would create the marker file: the proof that nothing unpickles."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.timeout(60)
async def test_pickles_and_code_like_names_stay_inert(redis_url: str, queue_name: str, tmp_path) -> None:
    marker = tmp_path / "unpickled"
    bomb = pickle.dumps(_Bomb(str(marker)))
    keys = QueueKeys.for_queue(queue_name)
    got: list[object] = []

    async def data(job) -> None:
        got.append(job.data)

    async with Queue(queue_name, redis_url=redis_url) as q:
        await q.add("data", bomb)  # a pickle as job data: msgpack bin, handed over as bytes
        for name in ("os.system", "builtins:eval", "__import__", "subprocess.Popen", "data\x00", "DATA"):
            await q.add(name, {"cmd": "touch " + str(marker)})
        async with raw_async(redis_url) as r:  # a pickle where the envelope should be
            await r.execute_command("XADD", keys.stream, "*", "d", bomb, "n", "data")
            worker = Worker(queue_name, {"data": data}, redis_url=redis_url, run_scheduler=False)
            async with running(worker):
                await wait_until(lambda: len(got) == 1, 15, what="the pickled data job")
                dead = await wait_until(lambda: _dlq(q, 7), 15, what="seven dead letters")
    assert got == [bomb] and isinstance(got[0], bytes)
    reasons = sorted(d["reason"] for d in dead)
    assert reasons == ["decode_failed"] + ["unrecoverable"] * 6, reasons
    assert not marker.exists() and not os.path.exists(marker)


async def _dlq(q: Queue, n: int):
    rows = await q.peek_dlq(100)
    return rows if len(rows) >= n else None


def test_the_one_exec_is_still_there_and_alone() -> None:
    """The allow-list names a real call, and that module calls exec exactly once."""
    calls = [
        (rel, node.func.id)
        for rel, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS
    ]
    assert sorted(calls) == sorted(EXEC_ALLOWED), calls


def test_the_decode_budget_hook_returns_what_it_is_given() -> None:
    from airflow_provider_chasqui.core.codec import _ContainerBudget

    budget = _ContainerBudget(3)
    values: list[object] = [[1], {"a": 1}, []]
    assert all(budget.take(v) is v for v in values)  # the very object: nothing built, nothing run


def test_the_tuple_key_hook_builds_only_dicts_and_tuples() -> None:
    from airflow_provider_chasqui.core.codec import _ContainerBudget, _TupleKeyedMaps

    maps = _TupleKeyedMaps(_ContainerBudget(2))
    out = maps.take([([1, [2, "x"]], "v"), ("k", [1])])
    assert out == {(1, (2, "x")): "v", "k": [1]} and type(out) is dict
    assert all(type(k) in (tuple, str) for k in out)
    assert maps.budget.left == 1  # counted like any map


def test_a_worker_without_a_pool_loads_no_pickle() -> None:
    """The pool's modules (and with them ``pickle`` and ``multiprocessing``) are imported only
    by a ``Worker`` made with ``processes=N``."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from airflow_provider_chasqui import Worker\n"
        "Worker('q', {'x': print})\n"
        "print(sorted(m for m in ('pickle', 'multiprocessing', 'airflow_provider_chasqui.engine.process_pool')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
