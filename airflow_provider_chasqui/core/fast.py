"""``fast_constructor``: build a value type on a per-job hot path without its ``__init__``.

Why: a frozen dataclass' generated ``__init__`` stores each field through
``object.__setattr__`` and a ``NamedTuple``'s ``__new__`` is a Python function around
``tuple.__new__``; on the paths that make one object per job (a prepared job, a decoded
envelope, the ``Job`` a handler or ``add`` gets, a scheduler's due spec) that costs two to
three times what storing the values does.  The builder stores them directly: the instance
dict in one assignment, the slot descriptors of a ``slots=True`` class, or
``tuple.__new__`` for a ``NamedTuple``.

What it skips: only the constructor's own code.  Classes whose constructor does more than store
its arguments are refused (``__post_init__``, ``init=False`` fields, a ``default_factory``, a
hand-written ``__init__`` or ``__new__``), so the result always equals the normally constructed
instance: same fields, ``==``, ``repr`` and ``hash``.  Arguments are not checked; neither does
the constructor (type hints are not enforced).  ``tests/core/test_fast.py`` proves the equality
for every class built this way.

The field list is read from ``dataclasses.fields`` (``_fields`` for a ``NamedTuple``) when the
builder is made, so it cannot drift from the class: a new field is a new parameter.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable
from types import MemberDescriptorType, MethodType
from typing import Any, TypeVar

__all__ = ["fast_constructor"]

_T = TypeVar("_T")


def fast_constructor(cls: type[_T], *params: str) -> Callable[..., _T]:
    """A function making ``cls`` instances equal to ``cls(...)``, without running its constructor.

    For a dataclass it takes the fields positionally, in declaration order, or only ``params``
    in that order when given (the other fields take their defaults); trailing fields with a
    default keep it as the parameter's default.  For a ``NamedTuple`` it takes all values as
    ONE tuple, in field order (as ``cls._make`` does, without its length check): that skips
    the argument packing a call with separate values would cost.
    """
    if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        if params:
            raise TypeError("a NamedTuple builder takes every field, as one tuple")
        if not getattr(cls.__new__, "__module__", "").startswith("namedtuple_"):  # not namedtuple's own
            raise TypeError(f"{cls.__name__} has its own __new__; build it normally")
        # ``tuple.__new__`` bound to ``cls``: as cheap as calling ``tuple.__new__(cls, values)``
        # at the call site (a ``functools.partial`` costs ~20% more)
        built: Callable[..., _T] = MethodType(tuple.__new__, cls)
        return built
    return _dataclass_builder(cls, params)


def _dataclass_builder(cls: type[_T], params: tuple[str, ...]) -> Callable[..., _T]:
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise TypeError(f"{cls!r} is neither a dataclass nor a NamedTuple")
    if not cls.__dataclass_params__.init or "__init__" not in cls.__dict__:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} has no generated __init__")
    if hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__:
        raise TypeError(f"{cls.__name__}'s construction runs code of its own; build it normally")
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    params = params or tuple(names)
    if len(set(params)) != len(params) or not set(params) <= set(names):
        raise TypeError(f"params {params!r} must be distinct fields of {cls.__name__}")
    if any(n.startswith("_fc_") for n in names):
        raise TypeError("field names starting with _fc_ are reserved by fast_constructor")
    # the generated source holds nothing but these names and fixed text: never data
    if not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        raise TypeError(f"{cls.__name__}: every field name must be a Python identifier, got {names!r}")
    defaults: dict[str, Any] = {}
    for f in fields:
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: init=False and default_factory are not supported")
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.name not in params:
            raise TypeError(f"{cls.__name__}.{f.name} has no default, so it must be a parameter")
    # the parameters' defaults: from the last parameter back, as long as each field has one
    signature = []
    with_default = True
    for n in reversed(params):
        with_default = with_default and n in defaults
        signature.append(f"{n}=_fc_default_{n}" if with_default else n)
    signature.reverse()
    value = {n: (n if n in params else f"_fc_default_{n}") for n in names}
    scope: dict[str, Any] = {"_fc_new": object.__new__, "_fc_cls": cls}
    scope.update({f"_fc_default_{n}": v for n, v in defaults.items()})
    if "__slots__" in cls.__dict__:
        body = []
        for n in names:
            scope[f"_fc_set_{n}"] = _slot(cls, n).__set__
            body.append(f"    _fc_set_{n}(_fc_obj, {value[n]})")
    else:
        scope["_fc_setattr"] = object.__setattr__
        items = ", ".join(f"{n!r}: {value[n]}" for n in names)
        body = [f"    _fc_setattr(_fc_obj, '__dict__', {{{items}}})"]
    source = "\n".join(
        [f"def _fc_build({', '.join(signature)}):", "    _fc_obj = _fc_new(_fc_cls)", *body, "    return _fc_obj"]
    )
    # the technique ``dataclasses`` itself uses for ``__init__``; run at import, on a source made
    # of the class's own field names (checked above), never on anything read from Redis
    exec(source, scope)
    build: Callable[..., _T] = scope["_fc_build"]
    build.__qualname__ = build.__name__ = f"fast_{cls.__name__}"
    build.__doc__ = f"``{cls.__name__}({', '.join(params)})``, built by ``fast_constructor``."
    return build


def _slot(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        attr = klass.__dict__.get(name)
        if isinstance(attr, MemberDescriptorType):
            return attr
    raise TypeError(f"{cls.__name__}.{name} is not a slot")
