"""API parity details that code written for chasquimq's Python package relies on.

chasquimq's own suite (``chasquimq-py/tests``) is not shipped in its wheel or an sdist and is never
copied here (``scripts/chasquimq_suite.py`` runs it from a directory outside the repo, through the
``compat.chasquimq`` alias); these tests pin the same observable contract with our own assertions:
which built-in exception class a bad argument raises (so ``except RuntimeError``/``TypeError``/
``ValueError`` in chasquimq code catches ours), the words its messages are matched on, the
``Worker`` signature, the alias itself and the runner.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest

import airflow_provider_chasqui as pkg
from airflow_provider_chasqui import ConfigError, Job, Queue, SyncQueue, Worker, WorkerSettings
from airflow_provider_chasqui.compat import chasquimq as compat_chasquimq

pytestmark = pytest.mark.timeout(60)

URL = "redis://127.0.0.1:6379"


def _name() -> str:
    return f"parity-{uuid.uuid4().hex}"


@pytest.fixture
async def queue():
    q = Queue(_name(), redis_url=URL)
    yield q
    await q.close()


async def test_oversized_name_is_a_runtime_error_naming_the_limit(queue: Queue) -> None:
    with pytest.raises(RuntimeError, match="256") as info:
        await queue.add("x" * 257, {"k": 1})
    assert isinstance(info.value, ConfigError)  # and still the package's own bad-argument error
    # 256 bytes, not characters: a 2-byte character pushes a 129-character name over
    with pytest.raises(RuntimeError, match="258 bytes"):
        await queue.add("é" * 129, {"k": 1})
    await queue.add("x" * 256, {"k": 1})  # the limit itself is allowed


@pytest.mark.parametrize("backoff", ["not-a-thing", True, 1.5, [100]])
async def test_backoff_of_the_wrong_type_is_a_type_error(queue: Queue, backoff: object) -> None:
    with pytest.raises(TypeError, match="backoff"):
        await queue.add("x", {"k": 1}, backoff=backoff)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay_ms", [math.inf, -math.inf, math.nan])
async def test_non_finite_delay_says_finite_non_negative(queue: Queue, delay_ms: float) -> None:
    with pytest.raises(ValueError, match="finite non-negative"):
        await queue.add("x", {"k": 1}, delay_ms=delay_ms)


@pytest.mark.parametrize("kwargs", [{"delay_ms": -1}, {"delay_ms": -0.5}, {"delay": timedelta(milliseconds=-100)}])
async def test_negative_delay_says_non_negative(queue: Queue, kwargs: dict) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        await queue.add("x", {"k": 1}, **kwargs)


async def test_both_delay_arguments_say_not_both(queue: Queue) -> None:
    with pytest.raises(ValueError, match="not both"):
        await queue.add("x", {"k": 1}, delay_ms=1_000, delay=timedelta(seconds=1))


def test_the_blocking_twin_raises_the_same_classes() -> None:
    q = SyncQueue(_name(), redis_url=URL)
    try:
        with pytest.raises(RuntimeError, match="256"):
            q.add("x" * 257, {})
        with pytest.raises(TypeError, match="backoff"):
            q.add("x", {}, backoff="fast")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="finite non-negative"):
            q.add("x", {}, delay_ms=math.nan)
    finally:
        q.close()


def test_worker_signature_shows_chasquimq_default_concurrency() -> None:
    param = inspect.signature(Worker.__init__).parameters["concurrency"]
    assert param.default == 100 == WorkerSettings().concurrency


def test_concurrency_argument_and_settings_agree() -> None:
    def handler(job):  # never called: nothing runs
        return None

    assert Worker(_name(), handler).settings.concurrency == 100
    assert Worker(_name(), handler, concurrency=7).settings.concurrency == 7
    # a given settings object keeps its own value unless the argument says otherwise
    assert Worker(_name(), handler, settings=WorkerSettings(concurrency=3)).settings.concurrency == 3
    assert Worker(_name(), handler, settings=WorkerSettings(concurrency=3), concurrency=9).settings.concurrency == 9
    for bad in (0, -1, True, 2.5, "4"):
        with pytest.raises(ConfigError, match="concurrency"):
            Worker(_name(), handler, concurrency=bad)  # type: ignore[arg-type]


# ---- arguments chasquimq accepts and drops: honoured or refused here (issue #17) -------------


@pytest.mark.parametrize("twin", ["async", "sync"])
async def test_delay_with_repeat_is_refused_not_dropped(twin: str) -> None:
    """chasquimq drops ``delay`` when ``repeat`` is given; a spec that silently fires at once
    when the caller asked for a delay is a surprise, so it is a ConfigError naming the way."""
    name = _name()
    every = {"kind": "every", "interval_ms": 60_000}
    for kwargs in ({"delay": 5.0}, {"delay_ms": 5000}):
        with pytest.raises(ConfigError, match=r"delay/delay_ms do not apply.*start_after"):
            if twin == "async":
                async with Queue(name, redis_url=URL) as q:
                    await q.add("tick", {}, repeat=every, **kwargs)
            else:
                with SyncQueue(name, redis_url=URL) as sq:
                    sq.add("tick", {}, repeat=every, **kwargs)
    with SyncQueue(name, redis_url=URL) as sq:
        assert sq.get_repeatable_jobs() == []  # nothing was written


async def test_job_id_of_a_repeatable_spec_is_its_key(queue: Queue) -> None:
    """chasquimq drops ``job_id`` on upserts; here it names the spec (the returned Job's id is the
    key), and a different ``key`` beside it is refused."""
    every = {"kind": "every", "interval_ms": 60_000}
    job = await queue.add("tick", {"n": 1}, repeat=every, job_id="nightly-report")
    assert job.id == "nightly-report"
    assert [m.key for m in await queue.get_repeatable_jobs()] == ["nightly-report"]
    same = await queue.upsert_repeatable_job(
        "tick", {"n": 2}, repeat=every, job_id="nightly-report", key="nightly-report"
    )
    assert same.id == "nightly-report" and len(await queue.get_repeatable_jobs()) == 1  # an upsert, not a second spec
    with pytest.raises(ConfigError, match="both name the spec"):
        await queue.upsert_repeatable_job("tick", {}, repeat=every, job_id="a", key="b")
    for bad in ("", 7):
        with pytest.raises(ConfigError, match="non-empty str"):
            await queue.upsert_repeatable_job("tick", {}, repeat=every, job_id=bad)  # type: ignore[arg-type]
    assert len(await queue.get_repeatable_jobs()) == 1


async def test_poll_interval_is_checked(queue: Queue) -> None:
    job = await queue.add("x", {"k": 1})
    for bad in (0, -1, math.nan, math.inf, "1", True):
        with pytest.raises(ConfigError, match="poll_interval"):
            await job.wait_for_result(timeout=0.1, poll_interval=bad)
    with pytest.raises(TimeoutError):  # a valid one is accepted (nothing runs the job)
        await job.wait_for_result(timeout=0.2, poll_interval=0.05)


async def test_wait_for_result_checks_its_timeout_and_needs_a_queue(queue: Queue) -> None:
    """chasquimq's words: a timeout that is not positive is a ValueError saying so, and a Job
    made by hand (no queue) cannot wait: RuntimeError naming the missing Queue reference."""
    job = await queue.add("x", {"k": 1})
    for bad in (0, -1, math.nan, math.inf, "1", True, None):
        with pytest.raises(ValueError, match="timeout must be a positive"):
            await job.wait_for_result(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll_interval must be a positive"):
        await job.wait_for_result(timeout=1, poll_interval=0)
    orphan = Job(id=job.id, name="x", data={"k": 1}, attempt=0, created_at_ms=0)
    with pytest.raises(RuntimeError, match="requires a Queue reference"):
        await orphan.wait_for_result(timeout=1)


# ---- the ``chasquimq`` alias (airflow_provider_chasqui.compat.chasquimq) ------------------------


@pytest.fixture
def alias() -> Iterator[ModuleType]:
    """The alias installed as ``chasquimq`` for one test; whatever was there before (the real
    package, in the interop venv) is put back afterwards."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "chasquimq" or k.startswith("chasquimq.")}
    try:
        yield compat_chasquimq.install()
    finally:
        compat_chasquimq.uninstall()
        for k in [k for k in sys.modules if k == "chasquimq" or k.startswith("chasquimq.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_the_alias_names_this_package(alias: ModuleType) -> None:
    import chasquimq  # the alias, not a real install
    from chasquimq import errors, queue_events, repeat
    from chasquimq.job import Job as AliasJob
    from chasquimq.worker import Worker as AliasWorker

    assert chasquimq is alias and compat_chasquimq.installed()
    assert chasquimq.Queue is Queue and AliasWorker is Worker and AliasJob is pkg.Job
    assert queue_events.QueueEvents is pkg.QueueEvents and repeat.RepeatPattern is pkg.RepeatPattern
    assert errors.UnrecoverableError is pkg.UnrecoverableError
    exported = {n for names in compat_chasquimq.SUBMODULES.values() for n in names} | {"version"}
    assert set(chasquimq.__all__) == exported
    assert all(getattr(chasquimq, n) is not None for n in exported)
    assert chasquimq.version() == pkg.__version__
    assert compat_chasquimq.install() is alias  # idempotent


def test_the_alias_errors_catch_what_this_package_raises(alias: ModuleType) -> None:
    import chasquimq
    import chasquimq.errors

    # the built-in bases chasquimq gives them, so ``except RuntimeError`` code keeps working too
    for cls in (chasquimq.UnrecoverableError, chasquimq.errors.NotSupportedError):
        assert issubclass(cls, RuntimeError)
    with pytest.raises(chasquimq.errors.UnrecoverableError):
        raise pkg.UnrecoverableError("poison")
    with pytest.raises(chasquimq.NotSupportedError):
        raise pkg.NotSupportedError("left out")
    assert issubclass(chasquimq.errors.WaitUntilFinishedTimeoutError, TimeoutError)


async def test_a_wait_timeout_is_caught_as_the_alias_timeout(alias: ModuleType) -> None:
    import chasquimq

    async with chasquimq.Queue(_name(), redis_url=URL) as q:
        job = await q.add("x", {"k": 1})  # no worker: the wait runs out
        with pytest.raises(chasquimq.WaitUntilFinishedTimeoutError):
            await job.wait_for_result(timeout=0.2)


async def test_a_handler_raising_the_alias_unrecoverable_error_is_not_retried(alias: ModuleType) -> None:
    import chasquimq

    class Poison(chasquimq.UnrecoverableError):
        pass

    attempts: list[int] = []

    def handler(job: pkg.Job) -> None:
        attempts.append(job.attempt)
        raise Poison("bad input")

    name = _name()
    async with chasquimq.Queue(name, redis_url=URL) as q:
        job = await q.add("poison", {"k": 1})
        worker = chasquimq.Worker(name, handler, redis_url=URL, max_attempts=5, store_results=True)
        run = asyncio.create_task(worker.run())
        try:
            with pytest.raises(pkg.JobFailed) as info:
                await job.wait_for_result(timeout=15)
        finally:
            await worker.close()
            await asyncio.wait_for(run, timeout=10)
    assert info.value.reason == "unrecoverable" and attempts == [0]


def test_the_native_classes_have_no_alias(alias: ModuleType) -> None:
    import chasquimq

    for name, instead in (("Producer", "Queue"), ("Consumer", "Worker"), ("Scheduler", "Worker")):
        with pytest.raises(AttributeError, match=f"chasquimq.{name} .*no alias.*use {instead}"):
            getattr(chasquimq, name)
    with pytest.raises(ImportError):
        from chasquimq import Producer  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        import chasquimq._native


def test_install_refuses_to_shadow_an_imported_chasquimq(alias: ModuleType) -> None:
    compat_chasquimq.uninstall()
    assert "chasquimq" not in sys.modules and "chasquimq.errors" not in sys.modules
    other = ModuleType("chasquimq")
    sys.modules["chasquimq"] = other
    with pytest.raises(ImportError, match="already imported"):
        compat_chasquimq.install()
    assert sys.modules["chasquimq"] is other and not compat_chasquimq.installed()
    compat_chasquimq.uninstall()  # not ours: left alone
    assert sys.modules["chasquimq"] is other
    del sys.modules["chasquimq"]


# ---- scripts/chasquimq_suite.py, on a tiny suite of our own ---------------------------------------

_SUITE_CONFTEST = """
import uuid
import pytest

@pytest.fixture
def qname():
    return f"suite-{uuid.uuid4().hex}"
"""
_SUITE_TESTS = """
import asyncio
import os
import pytest
import redis.asyncio as aioredis
from chasquimq import Queue, UnrecoverableError
from chasquimq._encoding import decode_payload
import airflow_provider_chasqui as ours

@pytest.mark.asyncio
async def test_alias_and_private_helpers(qname):
    assert Queue is ours.Queue and UnrecoverableError is ours.UnrecoverableError
    q = Queue(qname, redis_url=os.environ["CHASQUIMQ_TEST_REDIS_URL"])
    await q.add("n", {"v": 7})
    r = aioredis.from_url(os.environ["CHASQUIMQ_TEST_REDIS_URL"])
    try:
        (_, fields), = await r.xrange(f"{{chasqui:{qname}}}:stream")
        assert decode_payload(decode_payload(fields[b"d"])[1]) == {"v": 7}
        await r.delete(f"{{chasqui:{qname}}}:stream")
    finally:
        await r.aclose()
        await q.close()

def test_that_fails():
    assert Queue is not ours.Queue

def test_needs_internals():
    raise AssertionError("deselected, never runs")
"""


def test_the_suite_runner_runs_installs_and_deselects(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(_SUITE_CONFTEST)
    (suite / "test_mini.py").write_text(_SUITE_TESTS)
    listed = tmp_path / "deselect.txt"
    listed.write_text(
        "# comment\n"
        "test_mini.py::test_needs_internals | reads chasquimq._native  # trailing comment\n"
        "test_mini.py::test_gone | removed upstream\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "CHASQUIMQ_TEST_REDIS_URL": URL}
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "chasquimq_suite.py"), str(suite)]
        + ["--files", "test_mini.py", "--deselect-file", str(listed), "--", "-v"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text  # pytest's: a test failed
    assert "1 failed, 1 passed, 1 deselected" in text, text
    assert "test_mini.py::test_that_fails FAILED" in text  # -v after -- reached pytest
    assert "test_mini.py::test_needs_internals: reads chasquimq._native" in text
    assert "listed for deselection but not collected" in text and "test_mini.py::test_gone" in text
