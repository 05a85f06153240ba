"""``chasqui worker``: run a ``Worker`` for one queue with handlers named on the command line.

::

    chasqui worker --queue Q --handlers pkg.module[:attr] [--handlers ...]
                   [--redis-url URL | --conn-id ID] [--concurrency N] [--no-scheduler]
                   [--max-jobs N] [--idle-exit S] [--metrics-port P [--metrics-host H]]
                   [--log-level LEVEL] [--log-format human|json] [--version]

The process: parse arguments, configure logging (this module owns the process's
``logging.dictConfig``; library modules only log), load the handler registry, then run the
worker until SIGTERM/SIGINT (graceful: stop reading, finish running and buffered jobs within
``--shutdown-deadline``, flush acknowledgements; a second signal exits at once), ``--max-jobs``
or ``--idle-exit`` (batch mode).  Exit status: 0 after a clean stop, 1 when the worker
failed, 2 for bad arguments or handlers.

If a handler declares a ``spark`` parameter, the same command starts a SparkSession in this
process (see :mod:`.spark`); under ``spark-submit`` run ``worker/spark.py`` instead.

Where Redis is (:func:`resolve_url`, shared with the operator commands): ``--redis-url``, else
``--conn-id`` (an Airflow ``chasqui`` connection: standalone, Sentinel or Cluster), else
``$CHASQUI_REDIS_URL``, else ``redis://127.0.0.1:6379/0``; the two flags exclude each other.  Prefer
the environment or a connection: an argv is visible to every user of the machine (``ps``).
``--conn-id`` is the only path that imports Airflow; this module imports neither airflow nor
pyspark at import time.  Every log line goes through a formatter that redacts secrets
(:func:`..core.urls.redact_text`), tracebacks included; ``--log-format json`` (or
``CHASQUI_LOG_FORMAT=json``) writes one JSON object per line instead (see :mod:`.logs`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import logging.config
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cli_common import DEFAULT_URL, LOG_LEVELS, configure_logging, resolve_url, tcp_port
from ..cli_common import positive_int as _positive_int
from ..cli_common.logs import LOG_FORMATS, RedactingFormatter, set_log_context
from ..core.urls import redact_text
from ..engine.identity import package_version
from ..errors import ConfigError, ReconnectLimitError
from .registry import HandlerLoadError, HandlerRegistry, bind, load_handlers

__all__ = [
    "DEFAULT_REDIS_URL",
    "RedactingFormatter",
    "RunHooks",
    "build_parser",
    "configure_logging",
    "main",
    "package_version",
    "resolve_target",
    "resolve_url",
    "run_worker",
    "worker_options",
]

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = DEFAULT_URL  # the name this module has always exported


# ---- arguments ------------------------------------------------------------------------------
def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite, non-negative number of seconds, got {text!r}")
    return value


def build_parser(prog: str = "chasqui worker", *, spark: bool = False) -> argparse.ArgumentParser:
    """The worker's arguments; ``spark=True`` adds the Spark entry's options."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Consume one Chasqui queue with the handlers named by --handlers.",
        epilog="Redis: --redis-url, else --conn-id, else $CHASQUI_REDIS_URL, else "
        + DEFAULT_REDIS_URL
        + " (prefer the environment or a connection: argv is visible in ps).  CHASQUI_LOG_LEVEL sets "
        "the default --log-level, CHASQUI_LOG_FORMAT the default --log-format.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("--queue", "-q", help="queue to consume (default with --conn-id: the connection's default_queue)")
    p.add_argument(
        "--handlers",
        "-H",
        action="append",
        required=True,
        metavar="pkg.module[:attr]",
        help="handler module or object; repeat to combine (a job name may appear once)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--redis-url", help=f"Redis URL (default: $CHASQUI_REDIS_URL or {DEFAULT_REDIS_URL})")
    where.add_argument("--conn-id", help="an Airflow 'chasqui' connection id (imports Airflow)")
    p.add_argument(
        "--concurrency", "-c", type=_positive_int, help="jobs run at once (default: 100; 2 for the Spark worker)"
    )
    p.add_argument(
        "--sync-threads",
        type=_positive_int,
        help="threads for plain (non-async) handlers (default: min(concurrency, 64))",
    )
    p.add_argument(
        "--prefetch",
        type=_positive_int,
        dest="read_count",
        help="entries read per XREADGROUP beyond the running ones (default: 256; the Spark worker: 1)",
    )
    p.add_argument(
        "--claim-min-idle-ms",
        type=_positive_int,
        metavar="MS",
        help="job lease: a running job's worker renews it every MS/10; a dead or paused worker's jobs "
        "are taken over by another worker after MS (default 30000)",
    )
    p.add_argument("--max-attempts", type=int, help="attempts before a failing job is dead-lettered (default 25)")
    p.add_argument(
        "--max-stalled-attempts",
        type=_positive_int,
        metavar="N",
        help="the N-th take-over of a job from a dead or frozen worker dead-letters it (reason 'stalled') "
        "instead of running it again (default: only --max-attempts bounds them)",
    )
    p.add_argument("--group", help="consumer group (default: 'default')")
    p.add_argument(
        "--reconnect-max-attempts",
        type=_positive_int,
        metavar="N",
        help="stop (exit 1) after N failed attempts in a row to reach Redis, so a supervisor restarts the "
        "worker elsewhere (default: retry with backoff until stopped)",
    )
    p.add_argument(
        "--credential-provider",
        metavar="pkg.module:attr",
        help="an async function (endpoint) -> (username, password) giving the Redis credentials of each "
        "new connection: token AUTH such as ElastiCache IAM (SECURITY.md, 'Token credentials')",
    )
    p.add_argument("--no-scheduler", action="store_true", help="do not run the repeatable-job scheduler loop")
    p.add_argument("--no-promoter", action="store_true", help="do not run the delayed-job promoter loop")
    p.add_argument("--max-jobs", type=_positive_int, help="exit after this many jobs (batch mode)")
    p.add_argument(
        "--idle-exit",
        type=_non_negative_float,
        metavar="SECONDS",
        help="exit after this long with nothing to do (batch mode)",
    )
    p.add_argument(
        "--job-timeout",
        type=_non_negative_float,
        metavar="SECONDS",
        help="stop every attempt after this long (reason 'timeout', then the retry policy) unless the "
        "job or its handler has its own timeout (default: none)",
    )
    if not spark:  # Spark handlers share the driver's one SparkSession: they run in its process
        p.add_argument(
            "--processes",
            type=_positive_int,
            metavar="N",
            help="run handlers in N child processes: a CPU-bound or blocking handler cannot stall the "
            "worker, a timeout or cancel kills its process, a dead one is replaced (default: in this process)",
        )
        p.add_argument(
            "--process-memory-mb",
            type=_positive_int,
            metavar="MB",
            help="with --processes: a child whose resident memory passes MB fails its job and is replaced",
        )
    p.add_argument(
        "--shutdown-deadline",
        type=_non_negative_float,
        default=None,
        metavar="SECONDS",
        help="on SIGTERM, how long running jobs may take to finish (default 30)",
    )
    results = p.add_mutually_exclusive_group()
    results.add_argument(
        "--store-results",
        dest="store_results",
        action="store_true",
        default=True,
        help="store handler results for Queue.get_job_result and the Airflow sensor (default)",
    )
    results.add_argument(
        "--no-store-results",
        dest="store_results",
        action="store_false",
        help="do not store results (chasquimq's default)",
    )
    p.add_argument(
        "--result-ttl", type=_non_negative_float, metavar="SECONDS", help="how long stored results live (default 86400)"
    )
    p.add_argument(
        "--max-results",
        type=_positive_int,
        dest="results_max_len",
        metavar="N",
        help="stored results kept per queue besides their TTL; the oldest go first (default 10000)",
    )
    p.add_argument(
        "--max-result-bytes",
        type=_positive_int,
        dest="max_result_bytes",
        metavar="BYTES",
        help="a larger stored result (packed) fails its job as unrecoverable (default 1048576)",
    )
    p.add_argument(
        "--max-failures",
        type=_positive_int,
        dest="failures_max_len",
        metavar="N",
        help="failure records kept per queue besides their TTL (default 10000)",
    )
    p.add_argument(
        "--metrics-port",
        type=tcp_port,
        help="serve /metrics, /livez, /readyz (and /healthz = /readyz) on this port (0: any free port)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 to let Prometheus in a pod scrape it)",
    )
    p.add_argument(
        "--metrics-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often queue depths are sampled for /metrics (default 5)",
    )
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("CHASQUI_LOG_LEVEL", "INFO").upper(),
        help="level of this package's loggers (default INFO; DEBUG logs every job)",
    )
    p.add_argument(
        "--log-format",
        type=str.lower,
        choices=LOG_FORMATS,
        default=(os.environ.get("CHASQUI_LOG_FORMAT") or "human").lower(),
        help="human: one text line per record (default); json: one JSON object per line with ts, "
        "level, logger, message, queue, job_id, job_name, attempt (and trace ids when known)",
    )
    if spark:
        p.add_argument("--app-name", default=None, help="Spark application name (default: chasqui-worker-<queue>)")
        p.add_argument(
            "--spark-conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="extra Spark setting for the session this worker builds (repeatable)",
        )
        p.add_argument(
            "--remote",
            default=None,
            metavar="sc://HOST:PORT",
            help="a Spark Connect server: the session is a Connect client (default: $SPARK_REMOTE, else a "
            "classic session); put a URL with a token in $SPARK_REMOTE, not in argv",
        )
    return p


@dataclass
class RunHooks:
    """How a runtime (the Spark one) plugs into :func:`run_worker`.

    ``resources``: objects handlers ask for by parameter name; ``wrap(name, fn)``: decorates
    each bound handler; ``on_start(request_stop)``: called on the loop once the worker exists,
    with a thread-safe ``request_stop(signal_name, route)``; ``defaults``: Worker options used when the
    command line leaves them unset.
    """

    resources: dict[str, Any] = field(default_factory=dict)
    wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None = None
    on_start: Callable[[Callable[[str, str], None]], None] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)


def worker_options(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``Worker(**options)`` keywords from parsed arguments (None = the engine's default)."""
    opts: dict[str, Any] = {
        "concurrency": args.concurrency,
        "sync_threads": args.sync_threads,
        "read_count": args.read_count,
        "max_attempts": args.max_attempts,
        "max_stalled_attempts": args.max_stalled_attempts,
        "reconnect_max_attempts": args.reconnect_max_attempts,
        "claim_min_idle_ms": args.claim_min_idle_ms,
        "group": args.group,
        "max_jobs": args.max_jobs,
        "idle_exit_secs": args.idle_exit,
        "shutdown_deadline_secs": args.shutdown_deadline,
        "job_timeout_ms": None if args.job_timeout is None else args.job_timeout * 1000,
        "processes": getattr(args, "processes", None),
        "process_memory_mb": getattr(args, "process_memory_mb", None),
        "store_results": args.store_results,
        "result_ttl_ms": None if args.result_ttl is None else int(args.result_ttl * 1000),
        "results_max_len": args.results_max_len,
        "max_result_bytes": args.max_result_bytes,
        "failures_max_len": args.failures_max_len,
        "run_scheduler": not args.no_scheduler,
        "delayed_enabled": not args.no_promoter,
    }
    for key, value in (defaults or {}).items():
        if opts.get(key) is None:
            opts[key] = value(opts) if callable(value) else value
    return {k: v for k, v in opts.items() if v is not None}


def resolve_target(args: argparse.Namespace) -> tuple[str, str]:
    """``(redis_url, queue)`` from --redis-url / --conn-id / the environment."""
    url, default_queue = resolve_url(args.redis_url, args.conn_id)
    queue = args.queue or default_queue
    if args.conn_id:
        configure_logging(args.log_level, getattr(args, "log_format", "human"))  # Airflow installed its own setup
    if not queue:
        raise ConfigError("no queue: pass --queue (or a --conn-id whose connection sets default_queue)")
    return url, queue


# ---- logging --------------------------------------------------------------------------------
# ---- running --------------------------------------------------------------------------------
def load_registry(args: argparse.Namespace) -> HandlerRegistry:
    registry = load_handlers(args.handlers)
    log.info("handlers: %s", ", ".join(f"{n} <- {registry.origin(n)}" for n in registry))
    return registry


def run_worker(args: argparse.Namespace, registry: HandlerRegistry, hooks: RunHooks | None = None) -> int:
    """Build the Worker (and the metrics server) and run it to completion; returns the exit status."""
    from ..engine.worker import (
        Worker,  # the engine's import cost is paid once arguments are valid
    )

    hooks = hooks or RunHooks()
    url, queue = resolve_target(args)
    set_log_context(queue=queue)
    table = bind(registry, hooks.resources, wrap=hooks.wrap)
    options = worker_options(args, hooks.defaults)
    if getattr(args, "credential_provider", None):  # before any client: the metrics sampler's too
        from ..credentials import load_provider, register

        options["credential_provider"] = load_provider(args.credential_provider, "--credential-provider")
        register(url, options["credential_provider"])
    sink = server = None
    if args.metrics_port is not None:
        from .metrics import DepthSampler, MetricsServer, PrometheusMetrics

        sink = PrometheusMetrics(known_names=table)
        sampler = DepthSampler(url, queue, group=options.get("group", "default"))
        try:
            server = MetricsServer(
                sink,
                port=args.metrics_port,
                host=args.metrics_host,
                sampler=sampler,
                interval=args.metrics_interval,
                queue=queue,
            )
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}") from exc
    worker = Worker(queue, table, redis_url=url, metrics=sink, install_signal_handlers=False, **options)
    if server is not None:
        server.is_running = lambda: worker.is_running
        server.health_source = getattr(worker, "health", None)  # per-task liveness, when the engine has it
        server.start()
    try:
        _run_loop(_serve(worker, server, hooks))
    except ReconnectLimitError as exc:  # --reconnect-max-attempts: a clean stop with a reason, no traceback
        log.error("worker %s on queue %s stopped: %s", worker.consumer_id, queue, exc)
        return 1
    except Exception:
        log.exception("worker %s on queue %s failed", worker.consumer_id, queue)
        return 1
    finally:
        if server is not None:
            server.stop()
    return 0


#: A signal relayed by another route (the JVM) within this many seconds of the same signal
#: received directly is the same delivery (e.g. an init that signals the whole process group).
_SAME_SIGNAL_WINDOW = 5.0


async def _serve(worker: Any, server: Any, hooks: RunHooks) -> None:
    loop = asyncio.get_running_loop()
    first: list[tuple[str, str, float]] = []  # (signal, route, when) of the stop request
    closing: list[asyncio.Future[None]] = []

    async def _close() -> None:
        await worker.close()  # returns once the blocked read is released: nothing new is read after this line
        log.info(
            "worker %s: no longer reading; running jobs get %.0fs to finish",
            worker.consumer_id,
            worker.settings.shutdown_deadline_secs,
        )

    def stop(signame: str, route: str = "") -> None:  # on the loop
        reason = f"{signame} (via {route})" if route else signame
        now = time.monotonic()
        if not first:
            first.append((signame, route, now))
            log.info("worker %s: %s: stopping", worker.consumer_id, reason)
            closing.append(asyncio.ensure_future(_close()))
            return
        sig0, route0, t0 = first[0]
        if signame == sig0 and route != route0 and now - t0 < _SAME_SIGNAL_WINDOW:
            log.debug("worker %s: %s is the same delivery as the first %s", worker.consumer_id, reason, sig0)
            return
        log.warning(
            "worker %s: %s again: exiting now; unfinished jobs stay pending and are reclaimed",
            worker.consumer_id,
            reason,
        )
        logging.shutdown()
        os._exit(130)

    def request_stop(signame: str, route: str) -> None:  # any thread
        loop.call_soon_threadsafe(stop, signame, route)

    installed = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
            installed.append(sig)
    if hooks.on_start is not None:
        hooks.on_start(request_stop)
    if server is not None:
        server.attach_loop(loop)
    try:
        await worker.run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


#: Tasks still running once the worker stopped (a handler ignoring its cancellation); main()
#: exits without them, as without a handler's thread.
_LEFT_RUNNING: list[asyncio.Task[Any]] = []


def _run_loop(main: Coroutine[Any, Any, None], grace: float = 2.0) -> None:
    """``asyncio.run(main)``, except at its end: the tasks still running are cancelled once and
    given ``grace`` seconds, then left (``_LEFT_RUNNING``).  ``asyncio.run`` waits for each
    until it ends, and a handler that swallows its ``CancelledError`` in a loop never does:
    the stopped worker's process never exited."""
    _LEFT_RUNNING.clear()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # as asyncio.run does: get_event_loop() in the main thread finds it
    try:
        loop.run_until_complete(main)
    finally:
        rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in rest:
            task.cancel()
        if rest:
            loop.run_until_complete(asyncio.wait(rest, timeout=grace))
        left = [t for t in rest if not t.done()]
        _LEFT_RUNNING.extend(left)
        if not left:  # with tasks left, the process ends by os._exit (main): nothing else to close
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
        asyncio.set_event_loop(None)


def _straggler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("chasqui-") and not t.daemon and t.is_alive()]


def main(argv: Sequence[str] | None = None, *, prog: str = "chasqui worker") -> int:
    """Entry point of ``chasqui worker`` and ``python -m airflow_provider_chasqui.worker``."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        registry = load_registry(args)
        if registry.needs("spark"):
            from .spark import run_with_spark

            log.info("handlers %s use Spark: starting a SparkSession in this process", registry.needs("spark"))
            code = run_with_spark(args, registry)
        else:
            code = run_worker(args, registry)
    except (HandlerLoadError, ConfigError) as exc:
        log.error("%s", exc)
        if args.log_format != "json":  # a JSON log has the line above; nothing else may be written
            print(f"{parser.prog}: error: {redact_text(exc)}", file=sys.stderr)
        return 2
    stragglers = _straggler_threads()
    if stragglers or _LEFT_RUNNING:
        # Handlers past the shutdown deadline, or ignoring their cancellation: their entries stay
        # pending and are reclaimed by another worker (or were settled without them); do not let
        # them hold the process (the interpreter would join the threads, asyncio wait for the tasks).
        log.warning(
            "%d handler thread(s) and %d handler task(s) still running after the shutdown deadline; "
            "exiting without them",
            len(stragglers),
            len(_LEFT_RUNNING),
        )
        sys.stdout.flush()
        logging.shutdown()
        os._exit(code)
    return code
