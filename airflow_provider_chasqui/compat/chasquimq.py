"""``import chasquimq`` served by this package, for code written against chasquimq's Python API.

One line, before the first ``import chasquimq`` (e.g. at the top of the program or a conftest)::

    from airflow_provider_chasqui.compat import chasquimq; chasquimq.install()

``chasquimq`` and its public submodules (``errors``, ``job``, ``queue``, ``queue_events``,
``repeat``, ``worker``) then name this package's classes: ``chasquimq.Queue is
airflow_provider_chasqui.Queue``, so an ``except chasquimq.UnrecoverableError`` catches ours.
``WaitUntilFinishedTimeoutError`` is the built-in ``TimeoutError`` that ``Job.wait_for_result``
raises here.  The native-extension classes (``Producer``, ``Consumer``, ``Scheduler``) and the
private modules (``chasquimq._native``, ``_encoding``...) have no alias.  The alias shadows a
real chasquimq install; ``install()`` refuses when the real package is already imported.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from .. import version
from ..core.repeat import MissedFiresPolicy, RepeatableMeta, RepeatPattern
from ..engine.events import QueueEvents
from ..engine.queue import Queue
from ..engine.worker import Handler, Worker
from ..errors import NotSupportedError, UnrecoverableError
from ..types import BackoffSpec, Job, QueueEvent

WaitUntilFinishedTimeoutError = TimeoutError

#: chasquimq's public submodules and the names each one exports
SUBMODULES: dict[str, tuple[str, ...]] = {
    "errors": ("NotSupportedError", "UnrecoverableError", "WaitUntilFinishedTimeoutError"),
    "job": ("Job",),
    "queue": ("Queue",),
    "queue_events": ("QueueEvent", "QueueEvents"),
    "repeat": ("BackoffSpec", "MissedFiresPolicy", "RepeatableMeta", "RepeatPattern"),
    "worker": ("Handler", "Worker"),
}
#: chasquimq's native classes, not aliased: what to use instead
NOT_ALIASED = {
    "Producer": "Queue",
    "Consumer": "Worker",
    "Scheduler": "Worker (it runs the scheduler) or airflow_provider_chasqui.Scheduler",
}

# chasquimq's ``__all__`` less its native classes (each name above, plus ``version``)
__all__ = [
    "BackoffSpec",
    "Handler",
    "Job",
    "MissedFiresPolicy",
    "NotSupportedError",
    "Queue",
    "QueueEvent",
    "QueueEvents",
    "RepeatPattern",
    "RepeatableMeta",
    "UnrecoverableError",
    "WaitUntilFinishedTimeoutError",
    "Worker",
    "version",
]


def __getattr__(name: str) -> Any:
    if name in NOT_ALIASED:
        raise AttributeError(
            f"chasquimq.{name} (a class of chasquimq's native extension) has no alias in "
            f"airflow_provider_chasqui; use {NOT_ALIASED[name]}"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _submodule(sub: str, names: tuple[str, ...]) -> ModuleType:
    mod = ModuleType(f"chasquimq.{sub}", f"chasquimq.{sub}, aliased to airflow_provider_chasqui.")
    for name in names:
        setattr(mod, name, globals()[name])
    mod.__all__ = list(names)  # type: ignore[attr-defined]
    return mod


# the submodule objects, also attributes here (``from chasquimq import errors``)
_SUBMODULE_OBJECTS = {sub: _submodule(sub, names) for sub, names in SUBMODULES.items()}
globals().update(_SUBMODULE_OBJECTS)


def installed() -> bool:
    """Whether ``import chasquimq`` gives this alias."""
    return sys.modules.get("chasquimq") is sys.modules[__name__]


def install() -> ModuleType:
    """Make ``import chasquimq`` (and its public submodules) give this package; idempotent.

    Raises ``ImportError`` when another ``chasquimq`` (the real package) is already imported.
    """
    me = sys.modules[__name__]
    current = sys.modules.get("chasquimq")
    if current is not None and current is not me:
        raise ImportError(
            f"chasquimq is already imported from {getattr(current, '__file__', current)!r}; "
            "install the airflow_provider_chasqui alias before the first import of chasquimq"
        )
    sys.modules["chasquimq"] = me
    for sub, mod in _SUBMODULE_OBJECTS.items():
        sys.modules[f"chasquimq.{sub}"] = mod
    return me


def uninstall() -> None:
    """Undo ``install()`` (``import chasquimq`` finds the real package again, if any)."""
    if not installed():
        return
    for sub, mod in _SUBMODULE_OBJECTS.items():
        if sys.modules.get(f"chasquimq.{sub}") is mod:
            del sys.modules[f"chasquimq.{sub}"]
    del sys.modules["chasquimq"]
