"""``--claim-min-idle-ms`` (the job lease) and ``--max-stalled-attempts`` on ``chasqui worker``
and the Spark worker."""

from __future__ import annotations

import pytest

from airflow_provider_chasqui import Worker
from airflow_provider_chasqui.worker import cli


@pytest.mark.parametrize("spark", [False, True])
def test_the_lease_flag_reaches_the_worker(spark: bool) -> None:
    parser = cli.build_parser("chasqui worker", spark=spark)
    args = parser.parse_args(["-q", "q", "-H", "m", "--claim-min-idle-ms", "1500"])
    w = Worker("q", lambda job: None, **cli.worker_options(args))
    assert w.settings.claim_min_idle_ms == 1500
    default = parser.parse_args(["-q", "q", "-H", "m"])
    assert Worker("q", lambda job: None, **cli.worker_options(default)).settings.claim_min_idle_ms == 30_000


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "nan", "x"])
def test_a_bad_lease_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser("chasqui worker").parse_args(["-q", "q", "-H", "m", "--claim-min-idle-ms", bad])
    assert exc.value.code == 2 and "--claim-min-idle-ms" in capsys.readouterr().err


@pytest.mark.parametrize("spark", [False, True])
def test_the_stall_limit_flag_reaches_the_worker(spark: bool) -> None:
    parser = cli.build_parser("chasqui worker", spark=spark)
    args = parser.parse_args(["-q", "q", "-H", "m", "--max-stalled-attempts", "3"])
    w = Worker("q", lambda job: None, **cli.worker_options(args))
    assert w.settings.max_stalled_attempts == 3 and w.core.stall_limit == 3
    default = Worker("q", lambda job: None, **cli.worker_options(parser.parse_args(["-q", "q", "-H", "m"])))
    assert default.settings.max_stalled_attempts is None and default.core.stall_limit is None


@pytest.mark.parametrize("bad", ["0", "-1", "2.5", "inf", "x"])
def test_a_bad_stall_limit_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser("chasqui worker").parse_args(["-q", "q", "-H", "m", "--max-stalled-attempts", bad])
    assert exc.value.code == 2 and "--max-stalled-attempts" in capsys.readouterr().err
