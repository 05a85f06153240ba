"""Fixtures of the worker suite: real ``chasqui worker`` subprocesses, always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_support import WorkerProc


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    """``start_worker(args, **kw)``; any worker still running at teardown is killed by pid."""
    made: list[WorkerProc] = []

    def start(args: list[str], **kwargs: Any) -> WorkerProc:
        proc = WorkerProc(args, tmp_path / f"worker-{len(made)}.log", **kwargs)
        made.append(proc)
        return proc

    yield start
    for proc in made:
        proc.kill()
