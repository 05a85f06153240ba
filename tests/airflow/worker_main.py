"""A real Chasqui worker for the Airflow end-to-end tests: ``python worker_main.py <redis_url> <queue>``.

Runs the example handlers with ``store_results=True`` and no scheduler until SIGTERM, and
prints ``READY`` once it runs.  It refuses to run if importing the
engine pulled Airflow in (worker pods must not need it).
"""

from __future__ import annotations

import asyncio
import sys


async def main(url: str, queue: str) -> None:
    from airflow_provider_chasqui import Worker
    from airflow_provider_chasqui.examples.handlers import HANDLERS

    if "airflow" in sys.modules:
        raise SystemExit("the worker imported airflow")
    worker = Worker(
        queue,
        HANDLERS,
        redis_url=url,
        store_results=True,
        run_scheduler=False,
        install_signal_handlers=True,
        read_block_ms=1000,
        claim_min_idle_ms=5000,
    )
    run = asyncio.create_task(worker.run())
    while not worker.is_running:
        await asyncio.sleep(0.01)
    print("READY", flush=True)
    await run
    print(f"STOPPED processed={worker.processed}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
