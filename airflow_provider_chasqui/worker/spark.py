"""The Spark worker: a ``chasqui worker`` whose handlers share one SparkSession.

Run it as the application file of ``spark-submit`` (client mode)::

    spark-submit --master local[2] .../airflow_provider_chasqui/worker/spark.py \\
        --queue sales --handlers airflow_provider_chasqui.examples.spark_handlers --max-jobs 10

(or ``python -m airflow_provider_chasqui.worker.spark ...``, or plain ``chasqui worker`` when a
handler declares ``spark``: pyspark then starts the JVM itself).  Same arguments as
``chasqui worker`` plus ``--app-name`` and ``--spark-conf KEY=VALUE``.

Theory of operation.  ``main()`` builds exactly one SparkSession per process (pyspark is
imported there and nowhere at module level, so importing this module stays cheap) and hands
it to every handler that declares a ``spark`` parameter.  Spark handlers are plain functions
run in the worker's thread pool; a Spark job already spreads over every executor core, so
the defaults keep few of them at once (concurrency 2, prefetch 1, threads = concurrency), and
the scheduler runs in FAIR mode with one pool per handler thread (``chasqui-0``, ``chasqui-1``...,
declared in the shipped ``fairscheduler.xml``) so concurrent handlers share the executors
instead of queueing behind each other.  Spark logs at WARN unless ``spark.log.level`` is given
(at INFO a three-job batch writes some 700 lines); the worker's own lines keep ``--log-level``.
Each handler call runs in a Spark job group named after the job id (visible in the Spark UI,
and cancellable).  A Spark job may run for hours: the worker renews its lease every
``--claim-min-idle-ms`` / 3 (default 30 s), so no other worker starts it again while this one
lives.

Spark Connect.  With ``--remote sc://host:15002`` (or ``$SPARK_REMOTE``) the session is a Spark
Connect client (``SparkSession.builder.remote(url)``): no local JVM, no SparkContext.  Then the
JVM-only parts do not apply and are skipped, each said once in the log: job groups (each
handler's operations carry the Connect tag ``chasqui-<job id>`` instead, and stragglers are
interrupted through it), FAIR pools and the default Spark log level (the server's settings),
JVM signal forwarding (a SIGTERM reaches this process directly) and the JVM watchdog (a lost
server fails the Spark calls of the handlers, which are retried as usual).

Stopping.  Under spark-submit the JVM is the parent process and, in a container, PID 1: a
SIGTERM reaches the JVM, whose default reaction (shutdown hooks: stop the SparkContext, kill
the Python child) would kill running jobs.  So once the session exists, the JVM's SIGTERM
and SIGINT handlers are replaced (through py4j's callback server) by one that forwards the
signal to this process's worker.  Either way the worker stops reading, lets running and
already-read jobs finish within ``--shutdown-deadline`` (default 30 s), acknowledges them,
then cancels whatever Spark jobs are left, stops the session and exits 0; Python's exit code
becomes spark-submit's.  If the JVM itself dies (OOM kill, SIGKILL), a watchdog stops the
worker too and the process exits 1 instead of failing every job it would still read; so does
a handler that stops the session itself (``spark.stop()``), whose job fails as unrecoverable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

if __name__ == "__main__":  # run as a file by spark-submit / python: drop this folder from sys.path
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from airflow_provider_chasqui.core.running import handler_batch
from airflow_provider_chasqui.errors import ConfigError, UnrecoverableError
from airflow_provider_chasqui.worker import cli
from airflow_provider_chasqui.worker.registry import (
    HandlerLoadError,
    HandlerRegistry,
    bind,
)
from airflow_provider_chasqui.worker.spark_batches import batch_outcomes, jobs_frame, takes_dataframe
from airflow_provider_chasqui.worker.spark_session import (
    DEFAULT_SPARK_LOG_LEVEL,
    ENV_REMOTE,
    POOL_FILE,
    POOLS,
    build_session,
    describe_remote,
    is_connect,
    parse_conf,
    remote_url,
)

__all__ = [
    "DEFAULT_SPARK_CONCURRENCY",
    "DEFAULT_SPARK_LOG_LEVEL",
    "ENV_REMOTE",
    "POOLS",
    "POOL_FILE",
    "SparkRuntime",
    "build_session",
    "main",
    "remote_url",
    "run_with_spark",
]

log = logging.getLogger("airflow_provider_chasqui.worker.spark")

#: Spark handlers run at once by default: each Spark job already uses every core it is given.
DEFAULT_SPARK_CONCURRENCY = 2
FINAL_PROGRESS_WAIT_SECS = 2.0  # the most a handler's end waits for Spark's tracker to catch up
PROGRESS_POLL_SECS = 0.5  # how often a running Spark handler's Spark jobs and tasks are looked at


def _spark_defaults() -> dict[str, Any]:
    return {
        "concurrency": DEFAULT_SPARK_CONCURRENCY,
        "read_count": 1,  # prefetch one: a read job waits for a slot (and must finish on SIGTERM)
        "sync_threads": lambda opts: opts.get("concurrency") or DEFAULT_SPARK_CONCURRENCY,
    }


class SparkRuntime:
    """Glue between one SparkSession and the worker: job groups, signals, the final stop.

    ``wrap`` is called once per handler at start-up; the wrapped handlers and ``active`` are
    used from the worker's handler threads; ``forward_jvm_signals`` from the loop thread.
    """

    def __init__(self, spark: Any, queue_hint: str = "") -> None:
        self.spark = spark
        self.connect = is_connect(spark)
        self.sc = None if self.connect else spark.sparkContext
        self.queue_hint = queue_hint
        self._lock = threading.Lock()
        self.active = 0
        self._jvm_handlers: list[Any] = []
        self._finished = threading.Event()
        self.jvm_lost = False
        self.stopped_by = ""  # the job whose handler stopped the shared session (spark.stop())
        self._request_stop: Callable[[str, str], None] | None = None
        self._slots = threading.local()
        self._next_slot = 0
        # jobs whose handler runs Spark now: id -> (the Job its worker slot made, the last value
        # sent); a job whose handler reports progress itself leaves (its own values win)
        self._running: dict[str, tuple[Any, dict[str, int] | None]] = {}

    def pool(self) -> str:
        """The FAIR pool of the calling handler thread: ``chasqui-<slot>``, a slot per thread in
        the order threads first run a handler (modulo :data:`POOLS`, the pools the file declares)."""
        slot = getattr(self._slots, "n", None)
        if slot is None:
            with self._lock:
                slot = self._slots.n = self._next_slot
                self._next_slot += 1
        return f"chasqui-{slot % POOLS}"

    # ---- handlers ------------------------------------------------------------------------
    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        params = _declared(fn)
        if _batch_size(fn):
            return self._wrap_batch(name, fn, params)
        if "spark" not in params:
            return fn
        if inspect.iscoroutinefunction(fn):
            log.warning(
                "Spark handler for %r is async: its Spark calls block the event loop; make it a plain def", name
            )
            return fn

        def run_in_job_group(job: Any) -> Any:
            self._refuse_if_stopped()
            if job._progress is not None and self.sc is not None:  # (Spark Connect has no status tracker)
                with self._lock:
                    self._running[job.id] = (job, None)
                job = dataclasses.replace(job, _progress=_OwnProgress(job, self._running, self._lock))
            try:
                with self._scope(job.id, f"chasqui {self.queue_hint} {name} {job.id}"):
                    try:
                        result = fn(job)
                    finally:
                        gone = self._session_gone(job.id)  # raises once, for the job that stopped it
                        if job.id in self._running and not gone:  # the last word: every Spark job it ran, ended
                            with contextlib.suppress(Exception):
                                self.final_progress(job.id)
                    return result
            finally:
                with self._lock:
                    self._running.pop(job.id, None)

        run_in_job_group.__name__ = getattr(fn, "__name__", name)
        return run_in_job_group

    def _wrap_batch(self, name: str, fn: Callable[..., Any], params: list[str]) -> Callable[..., Any]:
        """A batch handler: its calls run in one job group (or Connect tag) named after the
        batch's first job; one whose job parameter is ``jobs_df`` gets the batch as one
        DataFrame and may answer with one (``spark_batches``)."""
        as_frame = takes_dataframe(params)
        if inspect.iscoroutinefunction(fn) or ("spark" not in params and not as_frame):
            return fn
        spark = self.spark

        def run_batch(jobs: list[Any]) -> Any:
            first = jobs[0].id if jobs else "empty"
            self._refuse_if_stopped()
            with self._scope(first, f"chasqui {self.queue_hint} {name} batch of {len(jobs)}"):
                try:
                    if not as_frame:
                        return fn(jobs)
                    return batch_outcomes(jobs, fn(jobs_frame(spark, jobs)))
                finally:
                    self._session_gone(first)

        run_batch.__name__ = getattr(fn, "__name__", name)
        return run_batch

    @contextlib.contextmanager
    def _scope(self, job_id: str, description: str) -> Iterator[None]:
        """One handler call's Spark scope, counted in ``active``: its Spark jobs run in the
        thread's FAIR pool and the job group ``chasqui-<job id>`` (so concurrent handlers share
        the executors), or on Spark Connect (no groups or pools) carry the tag
        ``chasqui-<job id>`` (tags are per thread), which ``finish`` can interrupt."""
        sc = self.sc
        with self._lock:
            self.active += 1
        if sc is not None:
            sc.setLocalProperty("spark.scheduler.pool", self.pool())
            sc.setJobGroup(f"chasqui-{job_id}", description, True)
        else:
            self.spark.addTag(_tag(job_id))
        try:
            yield
        finally:
            if not self._stopped():  # (a handler that stopped the session left nothing to reset)
                if sc is not None:
                    sc.setLocalProperty("spark.jobGroup.id", None)
                    sc.setLocalProperty("spark.job.description", None)
                else:
                    self.spark.removeTag(_tag(job_id))
            with self._lock:
                self.active -= 1

    def _session_gone(self, job_id: str) -> bool:
        """After a handler call: whether it stopped the shared session (``spark.stop()``).  Then
        this worker stops (every later Spark job would fail here) and exits 1, and that job
        fails as unrecoverable: run again, it would stop the next worker's session too."""
        if self.stopped_by or not self._stopped():
            return bool(self.stopped_by)
        self.stopped_by = job_id
        log.error(
            "job %s: its handler stopped the worker's shared SparkSession (spark.stop()): stopping the worker; "
            "a handler must leave the session to the worker",
            job_id,
        )
        if self._request_stop is not None:
            self._request_stop("SparkSession stopped", f"job {job_id}")
        raise UnrecoverableError(
            f"the handler stopped the worker's shared SparkSession (spark.stop()); the worker stops "
            f"(job {job_id} is not run again: it would stop the next worker's session too)"
        )

    def _stopped(self) -> bool:
        if self.sc is not None:
            return self.sc._jsc is None  # what SparkContext.stop() leaves
        return getattr(self.spark, "is_stopped", False) is True  # a Spark Connect client session

    def _refuse_if_stopped(self) -> None:
        if self.stopped_by:
            raise RuntimeError(
                f"this worker's SparkSession was stopped by job {self.stopped_by}'s handler and the worker "
                "is stopping: the job follows its retry policy"
            )

    # ---- signals -------------------------------------------------------------------------
    def forward_jvm_signals(self, request_stop: Callable[[str, str], None]) -> None:
        """Make the JVM hand SIGTERM/SIGINT to the worker instead of shutting Spark down."""
        from pyspark.java_gateway import ensure_callback_server_started

        assert self.sc is not None  # classic sessions only (skipped over Spark Connect)
        gateway = self.sc._gateway
        ensure_callback_server_started(gateway)
        jvm = self.sc._jvm

        class _Forward:
            def handle(self, sig: Any) -> None:  # called by the JVM's signal thread via py4j
                request_stop(f"SIG{sig.getName()}", "the JVM")

            class Java:
                implements = ["sun.misc.SignalHandler"]

        for name in ("TERM", "INT"):
            try:
                handler = _Forward()
                jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), handler)
                self._jvm_handlers.append(handler)  # keep the proxy alive for the JVM
            except Exception as exc:  # noqa: BLE001 - an exotic JVM: fall back to Python's handlers only
                log.warning(
                    "could not forward the JVM's SIG%s to the worker (%s); a SIGTERM to the JVM stops Spark at once",
                    name,
                    exc,
                )

    def start(self, request_stop: Callable[[str, str], None]) -> None:
        """``RunHooks.on_start``: forward the JVM's signals and watch that the JVM stays up
        (neither applies to a Spark Connect session: there is no JVM in this process)."""
        self._request_stop = request_stop  # a handler stopping the session stops the worker (_session_gone)
        if self.connect:
            log.info(
                "Spark Connect session: JVM signal forwarding and the JVM watchdog are skipped (no JVM in this "
                "process; SIGTERM reaches the worker directly); job groups and FAIR pools too (handlers' Spark "
                "operations are tagged chasqui-<job id> instead)"
            )
            return
        self.forward_jvm_signals(request_stop)
        self.watch_jvm(request_stop)
        self.watch_progress()

    # ---- progress ------------------------------------------------------------------------
    def report_progress(self, only: str | None = None) -> None:
        """One look at Spark's status tracker: for each job whose handler runs Spark (or job
        ``only``), its Spark jobs and tasks so far, reported as the job's progress when changed."""
        assert self.sc is not None
        tracker = self.sc.statusTracker()
        with self._lock:
            running = [(k, v) for k, v in self._running.items() if only is None or k == only]
        for job_id, (job, last) in running:
            value = spark_progress(tracker, f"chasqui-{job_id}")
            if value is None or value == last:
                continue
            with self._lock:  # one lock with _OwnProgress: a handler's own value is never overwritten
                if job_id not in self._running:  # ended, or its handler reports on its own
                    continue
                self._running[job_id] = (job, value)
                try:
                    job._progress.report(job, value)
                except Exception as exc:  # noqa: BLE001 - progress is a convenience: the job runs on
                    log.debug("Spark progress of job %s not reported: %s", job_id, exc)

    def final_progress(self, job_id: str, wait: float = FINAL_PROGRESS_WAIT_SECS) -> None:
        """When a handler returns, its Spark jobs have ended, but the status tracker learns it
        from Spark's listener bus a moment later: wait (at most ``wait`` seconds) until it says
        every one ended, then report."""
        assert self.sc is not None
        tracker = self.sc.statusTracker()
        deadline = time.monotonic() + wait
        try:  # the bus delivers the handler's last Spark job's start too: the tracker knows every id
            self.sc._jsc.sc().listenerBus().waitUntilEmpty(int(wait * 1000))
        except Exception as exc:  # noqa: BLE001 - a JVM without it, or a timeout: the look below still waits
            log.debug("Spark listener bus not drained: %s", exc)
        while time.monotonic() < deadline:
            ids = tracker.getJobIdsForGroup(f"chasqui-{job_id}")
            infos = [tracker.getJobInfo(j) for j in ids]
            if all(i is None or str(i.status) in ("SUCCEEDED", "FAILED") for i in infos):
                break
            time.sleep(0.02)
        self.report_progress(job_id)

    def watch_progress(self, interval: float = PROGRESS_POLL_SECS) -> None:
        """Report Spark progress every ``interval`` seconds until the worker finishes."""

        def watch() -> None:
            while not self._finished.wait(interval):
                if self._running:
                    try:
                        self.report_progress()
                    except Exception as exc:  # noqa: BLE001 - py4j down while stopping: the next look or none
                        log.debug("Spark progress look failed: %s", exc)

        threading.Thread(target=watch, name="chasqui-spark-progress", daemon=True).start()

    def watch_jvm(self, request_stop: Callable[[str, str], None], interval: float = 1.0) -> None:
        """Stop the worker if the JVM dies (OOM-killed, SIGKILL): without it every Spark job would
        fail, and under spark-submit this process would live on as an orphan."""
        parent = os.getppid()
        under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit's JVM is our parent
        assert self.sc is not None  # classic sessions only (skipped over Spark Connect)
        launched = getattr(self.sc._gateway, "proc", None)  # or pyspark started the JVM as our child

        def alive() -> bool:
            if launched is not None:
                return launched.poll() is None
            return not under_submit or os.getppid() == parent

        def watch() -> None:
            while not self._finished.wait(interval):
                if not alive():
                    self.jvm_lost = True
                    log.error("the Spark JVM is gone: stopping the worker (running jobs fail and are retried)")
                    request_stop("JVM exit", "watchdog")
                    return

        threading.Thread(target=watch, name="chasqui-jvm-watchdog", daemon=True).start()

    # ---- stopping ------------------------------------------------------------------------
    def finish(self, grace: float = 10.0) -> None:
        """After the worker returned: cancel Spark jobs of handlers past the deadline, stop Spark."""
        self._finished.set()
        if self.jvm_lost or self.stopped_by:
            return
        if self.active:
            log.warning(
                "%d Spark handler(s) still running after the shutdown deadline: cancelling their Spark jobs "
                "(their entries stay pending and are reclaimed)",
                self.active,
            )
            if self.connect:
                self.spark.interruptAll()  # this session's operations: the handlers' only
            else:
                assert self.sc is not None
                self.sc.cancelAllJobs()
            deadline = time.monotonic() + grace
            while self.active and time.monotonic() < deadline:
                time.sleep(0.05)
        self.spark.stop()


class _OwnProgress:
    """The progress sink a Spark handler's job carries: a report of its own ends the Spark
    reports for that job (the handler's values win)."""

    def __init__(self, job: Any, running: dict[str, Any], lock: threading.Lock) -> None:
        self._job, self._running, self._lock = job, running, lock  # the Job its worker slot made

    def report(self, job: Any, value: Any) -> None:
        with self._lock:
            self._running.pop(job.id, None)
            self._job._progress.report(self._job, value)

    def log(self, job: Any, line: Any) -> None:
        self._job._progress.log(self._job, line)


def spark_progress(tracker: Any, group: str) -> dict[str, int] | None:
    """A job group's Spark jobs (done of all) and tasks (done of all) from the status tracker;
    None before its first Spark job."""
    ids = tracker.getJobIdsForGroup(group)
    if not ids:
        return None
    jobs = jobs_done = tasks = tasks_done = 0
    for jid in ids:
        info = tracker.getJobInfo(jid)
        if info is None:
            continue
        jobs += 1
        succeeded = str(info.status) == "SUCCEEDED"
        jobs_done += succeeded
        for sid in info.stageIds:
            stage = tracker.getStageInfo(sid)
            if stage is None or (succeeded and stage.numCompletedTasks == 0 and stage.numActiveTasks == 0):
                continue  # a stage a finished job skipped (its shuffle output was reused): no tasks ran
            tasks += stage.numTasks
            tasks_done += stage.numCompletedTasks
    return {"spark_jobs": jobs, "spark_jobs_done": jobs_done, "tasks": tasks, "tasks_done": tasks_done}


def _tag(job_id: str) -> str:
    """A Spark Connect operation tag for a job: no commas, as Spark requires."""
    return "chasqui-" + str(job_id).replace(",", "_")


def _declared(fn: Any) -> list[str]:
    """Parameter names of the user's function, in order (``bind`` hands us a partial with
    spark= bound)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return []


def _batch_size(fn: Any) -> int:
    """The batch size the user's function declares (``bind`` copies it onto the wrapper later)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    return handler_batch(target)


def run_with_spark(args: argparse.Namespace, registry: HandlerRegistry) -> int:
    """Start the session, run the worker with it, stop the session; returns the exit status."""
    conf = parse_conf(getattr(args, "spark_conf", []) or [])
    # Fail on bad arguments or handlers before paying for a JVM.
    cli.resolve_target(args)
    bind(registry, {"spark": None})
    remote = remote_url(args)
    started = time.monotonic()
    spark = build_session(
        getattr(args, "app_name", None),
        conf,
        default_name=f"chasqui-worker-{args.queue or args.conn_id or 'queue'}",
        remote=remote,
    )
    if remote is not None:
        log.info(
            "Spark Connect session to %s up in %.1fs (Spark %s)",
            describe_remote(remote),
            time.monotonic() - started,
            spark.version,
        )
    else:
        log.info(
            "SparkSession %s up in %.1fs (master %s, Spark %s)",
            spark.sparkContext.appName,
            time.monotonic() - started,
            spark.sparkContext.master,
            spark.version,
        )
    runtime = SparkRuntime(spark, args.queue or "")
    hooks = cli.RunHooks(
        resources={"spark": spark}, wrap=runtime.wrap, on_start=runtime.start, defaults=_spark_defaults()
    )
    try:
        code = cli.run_worker(args, registry, hooks)
    finally:
        runtime.finish()
    return 1 if runtime.jvm_lost or runtime.stopped_by else code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the Spark worker (spark-submit application, or ``python -m``)."""
    parser = cli.build_parser("spark-submit .../worker/spark.py", spark=True)
    args = parser.parse_args(argv)
    cli.configure_logging(args.log_level, getattr(args, "log_format", "human"))
    try:
        registry = cli.load_registry(args)
        code = run_with_spark(args, registry)
    except (HandlerLoadError, ConfigError) as exc:
        log.error("%s", exc)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    stragglers = cli._straggler_threads()
    if stragglers:
        log.warning("%d handler thread(s) still running; exiting without them", len(stragglers))
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
