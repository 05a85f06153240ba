"""``chasqui worker --handlers myapp.handlers`` finds ``myapp`` in the current directory, as
``celery -A`` and ``rq worker`` do, with no PYTHONPATH set."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from worker_support import chasqui_command

from airflow_provider_chasqui import SyncQueue

pytestmark = pytest.mark.timeout(180)


def test_handlers_module_in_the_current_directory(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "handlers.py").write_text("HANDLERS = {'shout': lambda job: job.data.upper()}\n")
    env = dict(os.environ)  # PYTHONPATH may name the checkout under test, never tmp_path
    assert str(tmp_path) not in env.get("PYTHONPATH", "")
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("shout", "hello")
        proc = subprocess.run(
            [
                *chasqui_command(),
                "worker",
                "--redis-url",
                redis_url,
                "--queue",
                queue_name,
                "--handlers",
                "myapp.handlers",
                "--max-jobs",
                "1",
                "--no-scheduler",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert q.get_job_result(job.id) == "HELLO"
