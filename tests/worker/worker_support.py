"""A real ``chasqui worker`` subprocess for tests: started with the console script, output in a file.

Waits are conditions with deadlines (``wait_for_log``, ``wait_exit``); ``stop()`` sends
SIGTERM by pid; the fixture kills by pid whatever a failing test left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import airflow_provider_chasqui

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Subprocesses import the package under test: a checkout goes on their PYTHONPATH, an installed wheel
# (scripts/matrix.sh) is found by the venv itself and the checkout must stay off the path.
_PACKAGE_HOME = Path(airflow_provider_chasqui.__file__).resolve().parents[1]
PACKAGE_PATH = [] if _PACKAGE_HOME.name in ("site-packages", "dist-packages") else [str(_PACKAGE_HOME)]


def chasqui_command() -> list[str]:
    """The installed console script (what users run), else the module."""
    script = Path(sys.executable).parent / "chasqui"
    return [str(script)] if script.exists() else [sys.executable, "-m", "airflow_provider_chasqui.cli"]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *PACKAGE_PATH, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


class WorkerProc:
    """One ``chasqui worker`` process; ``args`` are appended after ``worker``."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.log_path = log_path
        self.args = list(args)
        with open(log_path, "wb") as log:
            # A session of its own: kill() ends the whole tree (spark-submit's JVM and its Python child).
            self.proc = subprocess.Popen(
                [*(command or [*chasqui_command(), "worker"]), *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env or subprocess_env(),
                cwd=str(ROOT),
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker exited ({self.proc.returncode}) before logging {text!r}:\n{self.output()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"worker did not log {text!r} within {timeout}s:\n{self.output()[-4000:]}")
            time.sleep(0.02)

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout}s:\n{self.output()[-4000:]}") from None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL to this worker's process group (its own session), then reap the leader."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def metric_value(text: str, metric: str, /, **labels: str) -> float | None:
    """The value of one sample in Prometheus text output (labels must match exactly)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and sample.labels == labels:
                return sample.value
    return None
