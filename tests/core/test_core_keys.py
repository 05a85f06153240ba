"""Key layout (wire spec 2) and queue-name validation."""

from __future__ import annotations

import pytest

from airflow_provider_chasqui.core.keys import MAX_QUEUE_NAME_BYTES, QueueKeys, validate_queue_name
from airflow_provider_chasqui.errors import ConfigError


def test_chasquimq_key_layout() -> None:
    k = QueueKeys.for_queue("emails")
    assert k.prefix == "{chasqui:emails}"
    assert k.stream == "{chasqui:emails}:stream"
    assert k.delayed == "{chasqui:emails}:delayed"
    assert k.dlq == "{chasqui:emails}:dlq"
    assert k.events == "{chasqui:emails}:events"
    assert k.promoter_lock == "{chasqui:emails}:promoter:lock"
    assert k.scheduler_lock == "{chasqui:emails}:scheduler:lock"
    assert k.repeat == "{chasqui:emails}:repeat"
    assert k.repeat_spec("report::every:60000") == "{chasqui:emails}:repeat:spec:report::every:60000"
    assert k.dlid("J1") == "{chasqui:emails}:dlid:J1"
    assert k.didx("J1") == "{chasqui:emails}:didx:J1"


def test_extension_keys_share_the_hash_tag() -> None:
    k = QueueKeys.for_queue("emails")
    ours = [
        k.result("J"),
        k.failure("J"),
        k.unique("u"),
        k.cursor("c"),
        k.repeat_paused,
        k.repeat_quarantine,
        k.controls,
        k.blocked,
        k.rate,
        k.running,
    ]
    assert ours == [
        "{chasqui:emails}:result:J",
        "{chasqui:emails}:failure:J",
        "{chasqui:emails}:unique:u",
        "{chasqui:emails}:cursor:c",
        "{chasqui:emails}:repeat:paused",
        "{chasqui:emails}:repeat:quarantine",
        "{chasqui:emails}:controls",
        "{chasqui:emails}:blocked",
        "{chasqui:emails}:rate",
        "{chasqui:emails}:running",
    ]
    for key in ours:
        assert key.startswith("{chasqui:emails}:")
        # none collides with a ChasquiMQ key
        assert key not in {k.stream, k.delayed, k.dlq, k.events, k.repeat}


def test_queue_names_are_inserted_verbatim() -> None:
    assert QueueKeys.for_queue("a:b/c d.é").stream == "{chasqui:a:b/c d.é}:stream"


@pytest.mark.parametrize(
    "name",
    ["", "a{b", "a}b", "{x}", "line\nbreak", "cr\r", "nul\0"],
    ids=["empty", "open-brace", "close-brace", "both", "newline", "cr", "nul"],
)
def test_bad_queue_names(name: str) -> None:
    with pytest.raises(ConfigError):
        validate_queue_name(name)
    with pytest.raises(ValueError):  # ConfigError is a ValueError, as chasquimq raises
        QueueKeys.for_queue(name)


def test_queue_name_limit_counts_utf8_bytes() -> None:
    assert validate_queue_name("q" * MAX_QUEUE_NAME_BYTES)
    assert validate_queue_name("é" * 128)
    with pytest.raises(ConfigError, match="256"):
        validate_queue_name("q" * 257)
    with pytest.raises(ConfigError):
        validate_queue_name("é" * 129)


@pytest.mark.parametrize("name", [None, 5, b"bytes"])
def test_queue_name_must_be_a_str(name) -> None:
    with pytest.raises(ConfigError):
        validate_queue_name(name)


def test_the_count_cap_indexes_cannot_collide_with_a_record() -> None:
    """``results``/``failures`` (what the Lua scripts derive from the prefix) are no job's
    ``result:<id>``/``failure:<id>`` key, whatever the id."""
    k = QueueKeys.for_queue("emails")
    assert (k.results, k.failures) == ("{chasqui:emails}:results", "{chasqui:emails}:failures")
    assert not any(idx.startswith(k.prefix + p) for idx in (k.results, k.failures) for p in (":result:", ":failure:"))
