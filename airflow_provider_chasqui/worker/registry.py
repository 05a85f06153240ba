"""The handler registry: job name -> callable, loaded from dotted paths given by the operator.

A worker runs the handlers that *its command line* names (``--handlers pkg.module[:attr]``);
dispatch is a dictionary lookup by the job's name, so nothing a producer writes into a job
(name or payload) is ever imported or evaluated.  A job whose name has no handler raises
:class:`~airflow_provider_chasqui.errors.HandlerNotFound` in the engine's lookup and is
dead-lettered (reason ``unrecoverable``).

A handler module declares its handlers in one of three ways::

    HANDLERS = {"resize": resize, "rollup": rollup}      # a plain mapping

    registry = HandlerRegistry()                          # a registry object
    @registry.handler("rollup")
    def rollup(job, spark): ...

    @handler("rollup")                                    # module-level decorator
    def rollup(job, spark): ...

``pkg.module:attr`` picks one object instead: a mapping, a :class:`HandlerRegistry`, a function
marked with ``@handler`` or any callable (registered under the attribute's name).

Handlers take the :class:`~airflow_provider_chasqui.types.Job` as their first argument.  A handler
that declares a parameter named ``spark`` is handed the worker process's shared SparkSession
(see :mod:`.spark`); :func:`bind` does that injection once, at start-up.

Imports only the standard library and this package's core; never airflow or pyspark.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..core.codec import validate_job_name
from ..core.running import BATCH_ATTR, TIMEOUT_ATTR, check_batch, check_timeout_ms
from ..errors import ConfigError, HandlerNotFound
from .spark_batches import takes_dataframe

__all__ = [
    "HandlerLoadError",
    "HandlerRegistry",
    "RESOURCE_PARAMS",
    "bind",
    "handler",
    "load_handlers",
    "parse_spec",
]

#: Parameter names that ask for a process-wide resource instead of job data.
RESOURCE_PARAMS = ("spark",)
_MARK = "__chasqui_job_names__"
_MODULE_NAMES = ("HANDLERS", "registry")


class HandlerLoadError(ConfigError):
    """A ``--handlers`` spec could not be turned into handlers; the message names the spec."""


def handler(
    name: str, *, timeout_ms: int | float | None = None, batch: int | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a module-level function as the handler of job ``name`` (stackable for aliases).
    ``timeout_ms``: every attempt it runs is stopped after that long (``core/running.py``).
    ``batch``: it takes a list of up to that many jobs of its name and returns one result (or
    exception) per job (docs/running-jobs.md)."""
    _check_name(name, "@handler")
    limit = None if timeout_ms is None else check_timeout_ms(timeout_ms, f"@handler({name!r}) timeout_ms")
    size = None if batch is None else check_batch(batch, f"@handler({name!r}) batch")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ConfigError(f"@handler({name!r}) must decorate a callable, got {type(fn).__name__}")
        names = list(getattr(fn, _MARK, ()))
        names.append(name)
        setattr(fn, _MARK, tuple(names))
        if limit is not None:
            setattr(fn, TIMEOUT_ATTR, limit)
        if size is not None:
            setattr(fn, BATCH_ATTR, size)
        return fn

    return mark


def _check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a job name must be a non-empty str, got {name!r}")
    validate_job_name(name)
    return name


class HandlerRegistry(Mapping[str, Callable[..., Any]]):
    """An ordered, duplicate-checked table of job name -> handler.

    A read-only ``Mapping`` once built, so it can be passed straight to ``Worker``.  Register
    with :meth:`register` or the :meth:`handler` decorator; a second handler for a name is a
    ``ConfigError`` naming both.  Not thread-safe while being filled (start-up only).
    """

    def __init__(self, handlers: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self._table: dict[str, Callable[..., Any]] = {}
        self._origin: dict[str, str] = {}
        for name, fn in (handlers or {}).items():
            self.register(name, fn)

    def register(self, name: str, fn: Callable[..., Any], *, origin: str = "") -> None:
        _check_name(name, origin or "register")
        if not callable(fn):
            raise HandlerLoadError(
                f"{origin or 'register'}: the handler for job name {name!r} is a {type(fn).__name__}, not a callable"
            )
        if name in self._table and self._table[name] is not fn:
            first = self._origin.get(name) or _qualname(self._table[name])
            raise HandlerLoadError(f"job name {name!r} has two handlers: {first} and {origin or _qualname(fn)}")
        self._table[name] = fn
        self._origin[name] = origin or _qualname(fn)

    def handler(
        self, name: str, *, timeout_ms: int | float | None = None, batch: int | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register`; ``timeout_ms`` and ``batch`` as for :func:`handler`."""
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms, f"handler({name!r}) timeout_ms")
        size = None if batch is None else check_batch(batch, f"handler({name!r}) batch")

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            if limit is not None:
                setattr(fn, TIMEOUT_ATTR, limit)
            if size is not None:
                setattr(fn, BATCH_ATTR, size)
            self.register(name, fn)
            return fn

        return deco

    def update(self, other: Mapping[str, Callable[..., Any]], *, origin: str = "") -> None:
        for name, fn in other.items():
            self.register(name, fn, origin=origin)

    def lookup(self, name: str) -> Callable[..., Any]:
        """The handler of job ``name``; ``HandlerNotFound`` (a ``LookupError``) when none is
        registered.  ``registry[name]`` raises ``KeyError`` instead, as a ``Mapping`` must."""
        try:
            return self._table[name]
        except KeyError:
            raise HandlerNotFound.for_name(name) from None

    def origin(self, name: str) -> str:
        """Where the handler of ``name`` came from (for logs and errors)."""
        return self._origin[name]

    def needs(self, resource: str) -> list[str]:
        """Job names whose handler declares the parameter ``resource`` (e.g. ``"spark"``)."""
        return [n for n, fn in self._table.items() if resource in (_parameters(fn) or {})]

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"HandlerRegistry({sorted(self._table)})"


def _qualname(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _parameters(fn: Any) -> Mapping[str, inspect.Parameter] | None:
    """The parameters, or None when there is no signature to read (some builtins): trusted as fn(job)."""
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


# ---- loading ------------------------------------------------------------------------------
def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"pkg.module:attr.sub"`` -> ``("pkg.module", "attr.sub")``; validates the shape only."""
    if not isinstance(spec, str) or not spec.strip():
        raise HandlerLoadError(f"empty handler spec {spec!r}; expected pkg.module or pkg.module:attr")
    module, sep, attr = spec.strip().partition(":")
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts) or (sep and not all(a.isidentifier() for a in attr.split("."))):
        raise HandlerLoadError(f"handler spec {spec!r} is not pkg.module or pkg.module:attr")
    return module, (attr if sep else None)


def _import(module: str, spec: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only a miss of the named module (or a parent) is "not found"; a missing import
        # *inside* the module is that module's own error and is reported as such.
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise HandlerLoadError(
                f"handler module {module!r} (from {spec!r}) was not found: is it installed or on PYTHONPATH?"
            ) from exc
        raise HandlerLoadError(f"importing handler module {module!r} (from {spec!r}) failed: {exc}") from exc
    except Exception as exc:  # any error while importing user code is a load error
        raise HandlerLoadError(
            f"importing handler module {module!r} (from {spec!r}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    except SystemExit as exc:  # a script's sys.exit() at import: the worker quietly exited (0 for exit(0))
        raise HandlerLoadError(
            f"importing handler module {module!r} (from {spec!r}) called sys.exit({exc.code!r}): a handler "
            "module must not exit when imported (put a script's own run under if __name__ == '__main__':)"
        ) from exc


def _from_object(obj: Any, spec: str, attr_name: str | None) -> dict[str, Callable[..., Any]]:
    if isinstance(obj, Mapping):
        out: dict[str, Callable[..., Any]] = {}
        for name, fn in obj.items():
            _check_name(name, spec)
            if not callable(fn):
                raise HandlerLoadError(
                    f"{spec}: the handler for job name {name!r} is a {type(fn).__name__}, not a callable"
                )
            out[name] = fn
        if not out:
            raise HandlerLoadError(f"{spec} is an empty mapping: no handlers to run")
        return out
    if callable(obj) and not isinstance(obj, type):
        names = getattr(obj, _MARK, None) or ((attr_name,) if attr_name else ())
        return dict.fromkeys(names, obj)
    raise HandlerLoadError(
        f"{spec} is a {type(obj).__name__}, not a handler: expected a callable, a mapping of "
        "job name to callable, or a HandlerRegistry"
    )


def _load_one(spec: str) -> dict[str, Callable[..., Any]]:
    module_name, attr = parse_spec(spec)
    module = _import(module_name, spec)
    if attr is not None:
        obj: Any = module
        for i, part in enumerate(attr.split(".")):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                where = module_name + (":" + ".".join(attr.split(".")[:i]) if i else "")
                raise HandlerLoadError(f"{where} has no attribute {part!r} (from {spec!r})") from None
        return _from_object(obj, spec, attr.rsplit(".", 1)[-1])
    for name in _MODULE_NAMES:
        if hasattr(module, name):
            return _from_object(getattr(module, name), f"{module_name}:{name}", None)
    marked: dict[str, Callable[..., Any]] = {}
    for value in vars(module).values():
        for job_name in getattr(value, _MARK, ()) if callable(value) else ():
            if job_name in marked and marked[job_name] is not value:
                raise HandlerLoadError(f"{module_name}: job name {job_name!r} is marked on two functions")
            marked[job_name] = value
    if not marked:
        raise HandlerLoadError(
            f"handler module {module_name!r} defines no handlers: expected HANDLERS (a mapping), "
            "registry (a HandlerRegistry) or @handler(...) functions, or name one as "
            f"{module_name}:attr"
        )
    return marked


def load_handlers(specs: Iterable[str]) -> HandlerRegistry:
    """Import each ``pkg.module[:attr]`` and merge their handlers; any problem is a HandlerLoadError."""
    registry = HandlerRegistry()
    specs = list(specs)
    if not specs:
        raise HandlerLoadError("no handler specs given (use --handlers pkg.module[:attr])")
    # As `celery -A` and `rq worker` do: the project in the current directory is importable
    # (a console script's sys.path starts at its bin/ folder, not at the caller's directory).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for spec in specs:
        registry.update(_load_one(spec), origin=spec)
    return registry


# ---- binding resources ----------------------------------------------------------------------
def bind(
    registry: Mapping[str, Callable[..., Any]],
    resources: Mapping[str, Any] | None = None,
    *,
    wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None = None,
) -> dict[str, Callable[..., Any]]:
    """The table ``Worker`` receives: each handler as ``fn(job)``, resources bound by keyword.

    ``resources`` maps a :data:`RESOURCE_PARAMS` name to its object; a handler declaring a
    resource that is absent is a ConfigError now, not a failure per job.  ``wrap(name, fn)``
    may decorate each bound handler (the Spark runtime tags Spark jobs with it).  A handler
    must accept the job positionally and require nothing else.
    """
    resources = dict(resources or {})
    out: dict[str, Callable[..., Any]] = {}
    for name, fn in registry.items():
        signature = _parameters(fn)
        params = signature or {}
        wanted = {p: resources[p] for p in RESOURCE_PARAMS if p in params and p in resources}
        missing = [p for p in RESOURCE_PARAMS if p in params and p not in resources]
        if missing:
            raise ConfigError(
                f"handler {_qualname(fn)} for job name {name!r} needs {', '.join(missing)}, which this "
                "worker does not provide (run Spark handlers with the Spark worker: "
                "spark-submit .../worker/spark.py or chasqui worker, which starts one when needed)"
            )
        if signature is not None:
            _check_signature(name, fn, signature, set(wanted))
            _check_frame_handler(name, fn, signature)
        bound = functools.partial(fn, **wanted) if wanted else fn
        out[name] = _keep_timeout(fn, wrap(name, bound) if wrap is not None else bound)
    return out


def _keep_timeout(fn: Any, bound: Any) -> Any:
    """A handler's own timeout and batch size survive binding (a ``partial`` or a wrapper does
    not carry them)."""
    for attr in (TIMEOUT_ATTR, BATCH_ATTR):
        value = getattr(fn, attr, None)
        if value is not None and getattr(bound, attr, None) != value:
            try:
                setattr(bound, attr, value)
            except (AttributeError, TypeError) as exc:
                raise ConfigError(f"handler {_qualname(fn)}: its {attr} cannot be kept on {bound!r}") from exc
    return bound


def _check_frame_handler(name: str, fn: Any, params: Mapping[str, inspect.Parameter]) -> None:
    """A handler whose job parameter is ``jobs_df`` takes a batch as one DataFrame
    (``worker/spark_batches.py``): it must be a batch handler and declare ``spark``."""
    if not takes_dataframe(list(params)):
        return
    if getattr(fn, BATCH_ATTR, None) is None or "spark" not in params:
        raise ConfigError(
            f"handler {_qualname(fn)} for job name {name!r} takes jobs_df (a batch as one DataFrame): "
            "declare it with @handler(name, batch=N) and give it a spark parameter"
        )


def _check_signature(name: str, fn: Any, params: Mapping[str, inspect.Parameter], given: set[str]) -> None:
    all_positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if all_positional and all_positional[0].name in given:
        raise ConfigError(
            f"handler {_qualname(fn)} for job name {name!r}: the job must be the first parameter, "
            f"not {all_positional[0].name!r}"
        )
    positional = [p for p in all_positional if p.name not in given]
    takes_job = bool(positional) or any(p.kind is p.VAR_POSITIONAL for p in params.values())
    required = [p.name for p in positional[1:] if p.default is p.empty] + [
        p.name for p in params.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in given
    ]
    if not takes_job or required:
        why = "takes no job argument" if not takes_job else f"also requires {', '.join(required)}"
        raise ConfigError(
            f"handler {_qualname(fn)} for job name {name!r} {why}; a handler is fn(job) "
            f"(optionally with a {' / '.join(RESOURCE_PARAMS)} parameter)"
        )
