"""No module compares Redis' error text outside the drivers' error boundary (issue #17).

Redis error replies are told apart by type (``errors.BusyGroupError``, ``NoGroupError``, ...),
translated in one place, ``drivers_common.translate_error``.  This walks every module of the
package with ``ast`` and fails on a comparison that reads an error's text: a Redis error code
or message in a string that is compared (``"BUSYGROUP" in str(exc)``, ``==``, ``startswith``,
``endswith``, ``find``), anywhere but ``drivers_common.py``.  It also fails on any
``... in str(exc)`` / ``str(exc).startswith(...)`` of an exception caught by an ``except``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "airflow_provider_chasqui"
BOUNDARY = {PKG / "drivers_common.py"}
# Redis error codes and the texts of replies code has branched on
REDIS_TEXT = re.compile(
    r"BUSYGROUP|NOGROUP|NOSCRIPT|WRONGTYPE|READONLY|NOPERM|NOAUTH|WRONGPASS|CLUSTERDOWN|TRYAGAIN|MASTERDOWN|"
    r"LOADING|BUSYKEY|EXECABORT|Function not found|already exists|no such key|unknown command|'evalsha'|"
    r"^ERR\b|no permissions"
)
_TEXT_METHODS = {"startswith", "endswith", "find", "index", "count", "__contains__"}


def _strings(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
        elif isinstance(n, ast.JoinedStr):
            out.extend(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return out


def _str_of(node: ast.AST, names: set[str]) -> bool:
    """``str(x)`` or ``repr(x)`` of an exception name bound by an ``except``, or ``x.args``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("str", "repr")
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in names
    ):
        return True
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "args"
        and isinstance(node.value, ast.Name)
        and node.value.id in names
    )


def offences(source: str, label: str) -> list[str]:
    tree = ast.parse(source, filename=label)
    caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    found = []
    for node in ast.walk(tree):
        texts: list[str] = []
        reads_error = False
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            texts = [t for p in parts for t in _strings(p)]
            reads_error = any(_str_of(p, caught) for p in parts)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _TEXT_METHODS:
            texts = [t for a in node.args for t in _strings(a)]
            reads_error = _str_of(node.func.value, caught)
        if reads_error or any(REDIS_TEXT.search(t) for t in texts):
            found.append(f"{label}:{node.lineno}: {ast.unparse(node)[:120]}")
    return found


def test_no_module_reads_redis_error_text_outside_the_boundary() -> None:
    bad = [
        o
        for p in sorted(PKG.rglob("*.py"))
        if p not in BOUNDARY
        for o in offences(p.read_text(), str(p.relative_to(PKG.parent)))
    ]
    assert bad == [], "compare typed errors (errors.py), not messages:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "src",
    [
        'try:\n    pass\nexcept Exception as exc:\n    if "BUSYGROUP" not in str(exc):\n        raise\n',
        'try:\n    pass\nexcept Exception as e:\n    ok = str(e).startswith("Function not found")\n',
        'def f(reply):\n    return reply == "NOGROUP"\n',
        'try:\n    pass\nexcept Exception as err:\n    ok = "whatever" in str(err)\n',
    ],
)
def test_the_check_catches_the_patterns_it_forbids(src: str) -> None:
    assert offences(src, "probe.py")


def test_the_boundary_is_where_the_text_is_read() -> None:
    """The one module allowed to read Redis' text does so (else the check guards nothing)."""
    path = next(iter(BOUNDARY))
    assert offences(path.read_text(), path.name)
