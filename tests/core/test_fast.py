"""``core.fast.fast_constructor``: every builder made with it gives what the class' own
constructor gives (fields, ``==``, ``repr``, ``hash``), takes exactly the class' fields, and
follows a class whose fields change; classes whose construction runs code are refused."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from airflow_provider_chasqui.core import calls, codec, producer, spec_decode
from airflow_provider_chasqui.core.calls import Call
from airflow_provider_chasqui.core.codec import Envelope, RetryOverride
from airflow_provider_chasqui.core.enqueue import QueueFlows
from airflow_provider_chasqui.core.fast import fast_constructor
from airflow_provider_chasqui.core.producer import PreparedJob
from airflow_provider_chasqui.core.repeat import MissedFiresPolicy, RepeatPattern, StoredSpec
from airflow_provider_chasqui.core.spec_decode import DueSpec
from airflow_provider_chasqui.types import Job, new_job

pytestmark = pytest.mark.timeout(30)

POLICY = MissedFiresPolicy.skip()
EVERY = RepeatPattern.every(1000)

# (builder in use, class, the builder's parameters, sample arguments) for every class built
# with fast_constructor in the package
BUILT = [
    (
        new_job,
        Job,
        ("id", "name", "data", "attempt", "created_at_ms", "_queue", "_progress", "progress", "stalled_count"),
        ("j1", "n", (1, "x"), 2, 3, None, None, {"pct": 5}, 1),
    ),
    (
        codec._new_envelope,
        Envelope,
        ("id", "inner", "created_at_ms", "attempt", "retry"),
        ("j1", b"\x01", 5, 1, RetryOverride(3, None)),
    ),
    (
        producer._new_prepared,
        PreparedJob,
        ("id", "name", "name_bytes", "envelope", "created_at_ms", "run_at_ms"),
        ("j1", "n", b"n", b"env", 5, None),
    ),
    (calls.packed_command, Call, ("args", "packed"), (("XADD", "k"), b"*2\r\n")),
]


def normal(cls: type, params: tuple[str, ...], args: tuple[Any, ...]) -> Any:
    return cls(**dict(zip(params, args)))


def assert_same(fast: Any, slow: Any) -> None:
    assert type(fast) is type(slow)
    assert fast == slow
    assert repr(fast) == repr(slow)
    # every field, including those left out of == and repr (Job._queue, Call.packed)
    assert [getattr(fast, f.name) for f in dataclasses.fields(slow)] == [
        getattr(slow, f.name) for f in dataclasses.fields(slow)
    ]
    if hasattr(slow, "__dict__"):
        assert vars(fast) == vars(slow)
    if type(slow).__hash__ is not None:
        assert hash(fast) == hash(slow)


@pytest.mark.parametrize("build,cls,params,args", BUILT, ids=[b[1].__name__ for b in BUILT])
def test_builders_in_use_equal_the_constructor(build: Any, cls: type, params: tuple[str, ...], args: Any) -> None:
    assert build.__name__ == f"fast_{cls.__name__}"  # made by fast_constructor, not by hand
    assert_same(build(*args), normal(cls, params, args))


@pytest.mark.parametrize("build,cls,params,args", BUILT, ids=[b[1].__name__ for b in BUILT])
def test_builders_take_the_class_fields(build: Any, cls: type, params: tuple[str, ...], args: Any) -> None:
    """The builder's parameters are read from the class: for the full builders, every field in
    declaration order, so a field added to the class is a parameter (a hand-written fast path
    would keep the old list, and this test would fail)."""
    names = tuple(inspect.signature(build).parameters)
    assert names == params
    if cls is not Call:
        assert names == tuple(f.name for f in dataclasses.fields(cls))


def test_frozen_instances_stay_frozen_and_hash_alike() -> None:
    job = new_job("j1", "n", "d", 1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]
    assert hash(job) == hash(Job("j1", "n", "d", 1, 2))
    env = codec._new_envelope("j1", b"x", 1, 0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.attempt = 3  # type: ignore[misc]
    assert {env: 1}[Envelope("j1", b"x", 1)] == 1
    assert env.with_attempt(2) == Envelope("j1", b"x", 1, 2)


def test_defaults_of_trailing_and_left_out_fields() -> None:
    assert new_job("a", "n", None, 0, 1)._queue is None
    marker = object()
    assert new_job("a", "n", None, 0, 1, _queue=marker)._queue is marker
    c = calls.packed_command(("PING",), b"*1\r\n$4\r\nPING\r\n")
    assert (c.script, c.keys, c.argv) == (None, (), ())


def test_due_spec_builder_equals_the_named_tuple() -> None:
    values = ("k", "job", EVERY, b"inner", None, None, None, POLICY, (("Every", 1000), None, ""))
    fast = spec_decode._new_due_spec(values)
    assert_tuple_same(fast, DueSpec(*values))
    assert fast._fields == tuple(DueSpec.__annotations__)


def assert_tuple_same(fast: Any, slow: Any) -> None:
    assert type(fast) is type(slow)
    assert fast == slow and tuple(fast) == tuple(slow)
    assert repr(fast) == repr(slow) and hash(fast) == hash(slow)
    assert fast._asdict() == slow._asdict()


def test_hot_paths_build_what_the_constructors_build() -> None:
    """The call sites end to end: a decoded envelope, a prepared job, a pre-packed XADD and a
    decoded stored spec equal the objects built the ordinary way."""
    env = codec.decode_envelope(codec.encode_new_envelope("01J0000000000000000000000A", b"\xa1x", 7))
    assert_same(env, Envelope("01J0000000000000000000000A", b"\xa1x", 7, 0, None))
    flows = QueueFlows("fast-test")
    job = flows.prepare("job", {"a": 1}, now=1_700_000_000_000)
    assert_same(job, PreparedJob(job.id, "job", b"job", job.envelope, 1_700_000_000_000, None))
    call, _jid, _created = flows.quick_add("job", {"a": 1})
    assert_same(call, Call(args=call.args, packed=call.packed))
    assert call.packed is not None
    stored = StoredSpec(key="k", job_name="job", pattern=EVERY, payload_inner=b"\x01")
    raw = stored.encode()
    decoder = spec_decode.SpecDecoder()
    decoder.decode(raw)  # the first decode fills the pattern cache
    spec = decoder.decode(raw)  # the second takes the fast path
    slow = spec_decode._slow(raw)
    assert spec[:8] == slow[:8] and type(spec) is DueSpec


# ---- the helper on classes made for the test -----------------------------------------------


def test_an_added_field_is_a_new_parameter() -> None:
    """Built from ``dataclasses.fields``: the same code follows a class that gains a field."""
    v1 = dataclass(frozen=True)(type("V", (), {"__annotations__": {"a": int, "b": str}}))
    v2 = dataclass(frozen=True)(type("V", (), {"__annotations__": {"a": int, "b": str, "c": float}}))
    b1, b2 = fast_constructor(v1), fast_constructor(v2)
    assert tuple(inspect.signature(b1).parameters) == ("a", "b")
    assert tuple(inspect.signature(b2).parameters) == ("a", "b", "c")
    assert b2(1, "x", 2.5) == v2(1, "x", 2.5)
    with pytest.raises(TypeError):
        b2(1, "x")  # the new field cannot be forgotten


@pytest.mark.parametrize("slots", [False, True])
def test_plain_and_slotted_classes(slots: bool) -> None:
    @dataclass(frozen=True, slots=slots)
    class P:
        a: int
        b: Any = None
        c: tuple[int, ...] = ()

    build = fast_constructor(P)
    assert_same(build(1), P(1))
    assert_same(build(1, "b", (3,)), P(1, "b", (3,)))
    only_c = fast_constructor(P, "c", "a")
    assert tuple(inspect.signature(only_c).parameters) == ("c", "a")
    assert_same(only_c((4,), 9), P(9, None, (4,)))


def test_refuses_classes_whose_construction_runs_code() -> None:
    @dataclass
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass
    class NoInit:
        a: int
        b: int = field(default=0, init=False)

    @dataclass
    class Req:
        a: int

    class OwnNew(NamedTuple):
        a: int

    class Sub(OwnNew):
        def __new__(cls, a: int) -> Sub:
            return super().__new__(cls, a)

    for cls in (Post, Factory, NoInit, Sub, int):
        with pytest.raises(TypeError):
            fast_constructor(cls)
    with pytest.raises(TypeError):
        fast_constructor(Req, "b")  # not a field
    with pytest.raises(TypeError):
        fast_constructor(Req, "a", "a")
    with pytest.raises(TypeError):
        fast_constructor(OwnNew, "a")  # a NamedTuple builder takes every field
    assert fast_constructor(OwnNew)((5,)) == OwnNew(5)


def test_field_names_that_are_not_identifiers_never_reach_exec() -> None:
    """The builder's source is made of field names: a tampered name (code, not an identifier)
    is refused before any source is written or run."""
    import builtins

    @dataclass
    class Tampered:
        a: int

    payload = "a=setattr(__import__('builtins'), 'chasqui_pwned', 1)"
    Tampered.__dataclass_fields__["a"].name = payload
    with pytest.raises(TypeError, match="identifier"):
        fast_constructor(Tampered)
    assert not hasattr(builtins, "chasqui_pwned")
    for bad in ("class", "x y", "1a"):
        Tampered.__dataclass_fields__["a"].name = bad
        with pytest.raises(TypeError, match="identifier"):
            fast_constructor(Tampered)
