"""The handler registry: the three declaration styles, every load error, resource binding, and
dispatch by name in a real Worker (unknown names dead-lettered, nothing from a job imported)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis

from airflow_provider_chasqui import SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ConfigError, HandlerNotFound, UnrecoverableError
from airflow_provider_chasqui.worker.registry import (
    HandlerLoadError,
    HandlerRegistry,
    bind,
    handler,
    load_handlers,
    parse_spec,
)


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``make_module(source) -> name``: a uniquely named module importable for this test only."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(source: str, name: str | None = None) -> str:
        name = name or f"chasqui_h_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        made.append(name)
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


# ---- declaration styles ----------------------------------------------------------------
def test_handlers_mapping(make_module) -> None:
    mod = make_module("""
        def a(job): return 1
        def b(job): return 2
        HANDLERS = {"a": a, "b": b}
    """)
    reg = load_handlers([mod])
    assert sorted(reg) == ["a", "b"] and reg["a"](None) == 1
    assert reg.origin("a") == mod


def test_registry_object_and_decorator(make_module) -> None:
    mod = make_module("""
        from airflow_provider_chasqui.worker import HandlerRegistry
        registry = HandlerRegistry()
        @registry.handler("resize")
        def resize(job): return "r"
    """)
    assert list(load_handlers([mod])) == ["resize"]


def test_module_level_handler_decorator_with_alias(make_module) -> None:
    mod = make_module("""
        from airflow_provider_chasqui.worker import handler
        @handler("send")
        @handler("send_v2")
        def send(job): return "s"
        def helper(job): return "not registered"
    """)
    reg = load_handlers([mod])
    assert sorted(reg) == ["send", "send_v2"] and reg["send"] is reg["send_v2"]


def test_module_attr_forms(make_module) -> None:
    mod = make_module("""
        from airflow_provider_chasqui.worker import handler
        def plain(job): return "plain"
        @handler("marked_name")
        def marked(job): return "m"
        class Holder:
            TABLE = {"nested": plain}
    """)
    assert list(load_handlers([f"{mod}:plain"])) == ["plain"]  # a bare callable: its attribute name
    assert list(load_handlers([f"{mod}:marked"])) == ["marked_name"]
    assert list(load_handlers([f"{mod}:Holder.TABLE"])) == ["nested"]


def test_specs_combine_and_duplicates_are_refused(make_module) -> None:
    one = make_module("HANDLERS = {'a': print}")
    two = make_module("HANDLERS = {'b': len}")
    clash = make_module("HANDLERS = {'a': len}")
    assert sorted(load_handlers([one, two])) == ["a", "b"]
    with pytest.raises(HandlerLoadError, match=rf"job name 'a' has two handlers: {one} and {clash}"):
        load_handlers([one, clash])


# ---- load errors -------------------------------------------------------------------------
def test_missing_module_is_named() -> None:
    with pytest.raises(HandlerLoadError, match=r"handler module 'no_such_pkg_x\.mod' .* was not found"):
        load_handlers(["no_such_pkg_x.mod"])


def test_import_error_inside_the_module_is_not_reported_as_missing(make_module) -> None:
    mod = make_module("import dependency_that_is_not_installed_q\n")
    with pytest.raises(
        HandlerLoadError, match=rf"importing handler module '{mod}'.*dependency_that_is_not_installed_q"
    ) as err:
        load_handlers([mod])
    assert "was not found" not in str(err.value)


def test_exception_while_importing(make_module) -> None:
    mod = make_module("raise RuntimeError('config missing')\n")
    with pytest.raises(HandlerLoadError, match="RuntimeError: config missing"):
        load_handlers([mod])


def test_a_module_exiting_while_imported_is_a_load_error(make_module) -> None:
    mod = make_module("raise SystemExit('usage: handlers.py FILE')\n")
    with pytest.raises(HandlerLoadError, match=rf"'{mod}'.* called sys.exit\('usage: handlers.py FILE'\)"):
        load_handlers([mod])


def test_missing_attribute(make_module) -> None:
    mod = make_module("HANDLERS = {}\nclass K: pass\n")
    with pytest.raises(HandlerLoadError, match=rf"{mod} has no attribute 'nope'"):
        load_handlers([f"{mod}:nope"])
    with pytest.raises(HandlerLoadError, match=rf"{mod}:K has no attribute 'inner'"):
        load_handlers([f"{mod}:K.inner"])


def test_non_callable_attribute_and_mapping_value(make_module) -> None:
    mod = make_module("LIMIT = 3\nHANDLERS = {'x': 'not callable'}\n")
    with pytest.raises(HandlerLoadError, match=rf"{mod}:LIMIT is a int, not a handler"):
        load_handlers([f"{mod}:LIMIT"])
    with pytest.raises(HandlerLoadError, match=r"the handler for job name 'x' is a str, not a callable"):
        load_handlers([mod])


def test_module_without_handlers(make_module) -> None:
    mod = make_module("def helper(job): pass\n")
    with pytest.raises(HandlerLoadError, match="defines no handlers"):
        load_handlers([mod])


@pytest.mark.parametrize("spec", ["", "pkg..mod", "pkg.mod:1x", "pkg mod", "pkg.mod:"])
def test_malformed_specs(spec: str) -> None:
    with pytest.raises(HandlerLoadError):
        parse_spec(spec)


def test_no_specs() -> None:
    with pytest.raises(HandlerLoadError, match="no handler specs"):
        load_handlers([])


def test_bad_names_are_refused() -> None:
    with pytest.raises(ConfigError):
        handler("")
    with pytest.raises(ConfigError):
        HandlerRegistry({"x" * 300: print})


# ---- binding resources -------------------------------------------------------------------
def test_spark_handlers_need_a_session() -> None:
    def rollup(job, spark):
        return spark

    reg = HandlerRegistry({"rollup": rollup, "plain": lambda job: job})
    assert reg.needs("spark") == ["rollup"]
    with pytest.raises(ConfigError, match=r"job name 'rollup' needs spark"):
        bind(reg)
    table = bind(reg, {"spark": "the-session"})
    assert table["rollup"]("job") == "the-session" and table["plain"]("job") == "job"


def test_keyword_only_spark_and_wrap() -> None:
    def rollup(job, *, spark):
        return (job, spark)

    seen = []
    table = bind({"rollup": rollup}, {"spark": 1}, wrap=lambda name, fn: seen.append(name) or fn)
    assert table["rollup"]("j") == ("j", 1) and seen == ["rollup"]


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda: None, "takes no job argument"),
        (lambda job, other: None, "also requires other"),
        (lambda job, *, token: None, "also requires token"),
    ],
)
def test_handler_signatures_are_checked_at_start(fn, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        bind({"x": fn})


def test_the_job_comes_before_the_session() -> None:
    def backwards(spark, job):
        return job

    with pytest.raises(ConfigError, match="the job must be the first parameter, not 'spark'"):
        bind({"x": backwards}, {"spark": object()})


def test_lookup_raises_handler_not_found() -> None:
    registry = HandlerRegistry({"ok": len})
    assert registry.lookup("ok") is len
    with pytest.raises(HandlerNotFound, match="no handler registered for job name 'missing'") as raised:
        registry.lookup("missing")
    # what code catching the lookup's miss or a dead-lettering error expects of it
    assert isinstance(raised.value, LookupError) and isinstance(raised.value, UnrecoverableError)
    with pytest.raises(KeyError):  # the Mapping protocol keeps KeyError (`in`, `get`)
        registry["missing"]
    assert "missing" not in registry and registry.get("missing") is None


# ---- dispatch in a real Worker -------------------------------------------------------------
async def test_unknown_job_name_is_dead_lettered_and_nothing_is_imported(
    make_module, tmp_path: Path, redis_url: str, queue_name: str
) -> None:
    marker = tmp_path / "imported"
    trap = make_module(f"open({str(marker)!r}, 'w').write('x')\ndef run(job): return 'pwned'\n")
    good = make_module("""
        from airflow_provider_chasqui.worker import handler
        @handler("ok")
        def ok(job): return job.data
    """)
    table = bind(load_handlers([good]))
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        ok = q.add("ok", {"n": 1})
        by_name = q.add(f"{trap}:run", {"n": 2})  # a dotted path as the job name
        by_data = q.add("ok", {"handler": f"{trap}:run"})  # and one in the payload: just data
        worker = Worker(
            queue_name,
            table,
            redis_url=redis_url,
            run_scheduler=False,
            store_results=True,
            max_jobs=3,
            read_block_ms=200,
        )
        await worker.run()
        assert q.get_job_result(ok.id) == {"n": 1}
        assert q.get_job_result(by_data.id) == {"handler": f"{trap}:run"}
        (dead,) = q.peek_dlq()
        assert (dead["name"], dead["reason"]) == (f"{trap}:run", "unrecoverable")
        assert q.get_job_state(by_name.id) == "failed"
    assert trap not in sys.modules and not marker.exists()
    events = redis.Redis.from_url(redis_url).xrange(QueueKeys.for_queue(queue_name).events)
    failed = [f for _id, f in events if f[b"e"] == b"failed" and f[b"id"] == by_name.id.encode()]
    assert len(failed) == 1
    assert f"no handler registered for job name '{trap}:run'".encode() in failed[0][b"reason"]
