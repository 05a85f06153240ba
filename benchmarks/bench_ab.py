"""Two trees of this package measured back to back: ``bench_engine.py`` of each, alternating.

    git worktree add --detach /tmp/old 5ac35c7
    python benchmarks/bench_ab.py --old /tmp/old --rounds 8             # e2e_process, N=20,000

Each round runs one workload of ``bench_engine.py`` once from the old tree and once from the new
one (this checkout unless ``--new``), in the order old/new, then new/old the next round, so a
noisy neighbour hits both alike; each run uses its own tree's code (``PYTHONPATH``) on one
private ``redis-server`` shared by all runs.  The URL asks for RESP2 (``?protocol=2``): trees
from before RESP2 was pinned read RESP3 replies wrongly under redis-py 8, and it is what the
new code uses anyway.  Prints each run, the medians of jobs/s and of the worker's CPU per job,
and their ratios new/old; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import log, private_redis, write_json

HERE = Path(__file__).resolve().parent


def run_once(tree: Path, url: str, workload: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "engine.json"
        proc = subprocess.run(
            [
                sys.executable,
                "benchmarks/bench_engine.py",
                "--redis-url",
                url,
                "--only",
                workload,
                "--repeats",
                "1",
                "--n",
                str(n),
                "--out",
                str(out),
            ],
            cwd=tree,
            check=False,
            env=dict(os.environ, PYTHONPATH=str(tree)),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{tree}: bench_engine.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
        res = json.loads(out.read_text())["results"][workload]
    return {
        "jobs_per_s": res["jobs_per_s"],
        "cpu_us_per_job": res["client_cpu_us_per_job"],
        "redis_cpu_us_per_job": res.get("redis_cpu_us_per_job", float("nan")),  # e2e workloads only
        "loadavg": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, type=Path, help="the other tree (e.g. a git worktree)")
    ap.add_argument("--new", type=Path, default=HERE.parent, help="default: this checkout")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--workload", default="e2e_process", help="a bench_engine.py workload")
    ap.add_argument("--redis-url", default=None, help="use this server instead of a private one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with private_redis(args.redis_url) as url:
        url += ("&" if "?" in url else "?") + "protocol=2"
        for r in range(args.rounds):
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                res = run_once(trees[which], url, args.workload, args.n)
                runs[which].append(res)
                log(
                    f"round {r + 1} {which}: {res['jobs_per_s']:,.0f} jobs/s, {res['cpu_us_per_job']:.1f} us CPU/job, "
                    f"Redis {res['redis_cpu_us_per_job']:.1f} us/job, load {res['loadavg']:.1f}"
                )
    med = {w: {k: statistics.median(x[k] for x in runs[w]) for k in ("jobs_per_s", "cpu_us_per_job")} for w in runs}
    ratio = {k: med["new"][k] / med["old"][k] for k in ("jobs_per_s", "cpu_us_per_job")}
    print(f"old: median {med['old']['jobs_per_s']:,.0f} jobs/s, {med['old']['cpu_us_per_job']:.2f} us CPU/job")
    print(f"new: median {med['new']['jobs_per_s']:,.0f} jobs/s, {med['new']['cpu_us_per_job']:.2f} us CPU/job")
    print(f"new/old: jobs/s {ratio['jobs_per_s']:.3f}, CPU per job {ratio['cpu_us_per_job']:.3f}")
    data = {
        "trees": {k: str(v) for k, v in trees.items()},
        "workload": args.workload,
        "n": args.n,
        "runs": runs,
        "medians": med,
        "ratio_new_over_old": ratio,
    }
    if args.out:
        write_json(Path(args.out), data)
    return data


if __name__ == "__main__":
    main()
