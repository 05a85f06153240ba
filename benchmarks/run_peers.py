"""The same workloads for this project and its Python peers, in one run on one Redis.

    python benchmarks/run_peers.py                  # N=20,000, median of 3 (about half an hour)
    python benchmarks/run_peers.py --smoke          # N=200, one run (installs the peers first)
    python benchmarks/run_peers.py --peers bullmq,saq --repeats 1

Each peer is installed into its own virtual environment under
``~/.cache/airflow-provider-chasqui/peers/<name>`` (arq needs redis-py < 6, so they cannot share
one) and measured by ``peers/<name>_bench.py``, run with that environment's interpreter, which
prints one JSON object per workload (see ``peers/_peer_common.py`` for the method).  This
project runs through the same skeleton (``peers/chasqui_bench.py``) in its own environment, so
every row of the table is measured the same way, interleaved (run 1 of every peer, then run
2, ...), on a private ``redis-server`` flushed between runs.

Workloads: enqueue one by one, enqueue in bulk (the peer's bulk API or 1,000 concurrent
singles), end-to-end processing of no-op jobs by one worker process at concurrency 50, and
delayed end-to-end (1 s delay: promotion plus processing).  RQ processes one job at a time
(about 150-300 jobs/s here), so its two processing workloads use ``--slow-n`` jobs (default
5,000) instead of N; the JSON records the N each figure used.

Writes ``benchmarks/results/peers.json``; ``report.py`` merges it with ``engine.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, log, machine, median_of, private_redis, redis_version, write_json

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
VENVS = Path(os.environ.get("CHASQUI_PEERS_HOME", Path.home() / ".cache" / "airflow-provider-chasqui" / "peers"))
WORKLOADS = ("enqueue_single", "enqueue_bulk", "process", "delayed")

# name -> pip requirements of its private environment (None = this project's own interpreter)
PEERS: dict[str, list[str] | None] = {
    "chasqui": None,
    "bullmq": ["bullmq"],
    "rq": ["rq"],
    "arq": ["arq", "redis<6"],
    "saq": ["saq[redis]", "typing_extensions"],
    "taskiq": ["taskiq", "taskiq-redis"],
}
SLOW = {"rq"}  # one job at a time: process/delayed use --slow-n


def python_for(name: str, install: bool) -> str:
    reqs = PEERS[name]
    if reqs is None:
        return sys.executable
    venv = VENVS / name
    exe = venv / "bin" / "python"
    marker = venv / ".bench-requirements"
    wanted = "\n".join(reqs)
    if exe.exists() and marker.exists() and marker.read_text() == wanted:
        return str(exe)
    if not install:
        raise SystemExit(f"{name}: no environment at {venv}; run without --no-install")
    log(f"installing {name} into {venv} ({', '.join(reqs)}) ...")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs], check=True)
    marker.write_text(wanted)
    return str(exe)


def flush(url: str) -> None:
    import redis

    r = redis.Redis.from_url(url)
    try:
        r.flushall()
    finally:
        r.close()


def run_one(python: str, name: str, url: str, workload: str, n: int, timeout: float) -> dict[str, Any]:
    cmd = [python, str(PEERS_DIR / f"{name}_bench.py"), "--redis-url", url, "--n", str(n), "--workload", workload]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-1500:].strip() or f"exit {proc.returncode}"}
    return json.loads(lines[-1])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "jobs_per_s" in r]
    if ok:
        out = median_of(ok)
        out["n"] = ok[0].get("n")
        if len(ok) < len(runs):
            out["failed_runs"] = [r for r in runs if "jobs_per_s" not in r]
        return out
    first = runs[0] if runs else {}
    return {"unsupported": first["unsupported"]} if "unsupported" in first else {"error": first.get("error", "no run")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--slow-n", type=int, default=5_000, help="N for RQ's processing workloads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="N=200, one run")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--redis-url", default=None, help="use this server (it is FLUSHALLed between runs!)")
    ap.add_argument("--no-install", action="store_true", help="fail instead of creating missing environments")
    ap.add_argument("--out", default=str(RESULTS / "peers.json"))
    ap.add_argument(
        "--merge", action="store_true", help="keep the other peers' results already in --out (re-measure only --peers)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.slow_n, args.repeats = 200, 200, 1
    names = [p for p in args.peers.split(",") if p]
    unknown = set(names) - set(PEERS)
    if unknown:
        ap.error(f"unknown peers {sorted(unknown)}")
    workloads = [w for w in args.workloads.split(",") if w]
    pythons = {name: python_for(name, not args.no_install) for name in names}

    meta = machine()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {w: [] for w in workloads} for p in names}
    with private_redis(args.redis_url) as url:
        meta.update(
            redis_version=redis_version(url),
            n=args.n,
            slow_n=args.slow_n,
            repeats=args.repeats,
            smoke=args.smoke,
            redis_private=args.redis_url is None,
        )
        for rep in range(args.repeats):
            for name in names:
                for w in workloads:
                    n = args.slow_n if name in SLOW and w in ("process", "delayed") else args.n
                    flush(url)
                    t0 = time.monotonic()
                    res = run_one(pythons[name], name, url, w, n, timeout=300 + n / 20)
                    shown = (
                        f"{res['jobs_per_s']:,.0f} jobs/s"
                        if "jobs_per_s" in res
                        else res.get("unsupported") or res.get("error", "")[:300]
                    )
                    log(f"[{rep + 1}/{args.repeats}] {name:<8} {w:<15} {shown}  ({time.monotonic() - t0:.1f} s)")
                    runs[name][w].append(res)
        flush(url)
    meta["loadavg_at_end"] = os.getloadavg()
    versions = {
        p: next((r.get("version") for ws in runs[p].values() for r in ws if r.get("version")), None) for p in names
    }
    results = {p: {w: summarize(runs[p][w]) for w in workloads} for p in names}
    data = {"meta": meta, "versions": versions, "results": results}
    if args.merge and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        for p, res in old.get("results", {}).items():
            if p not in results:
                results[p] = res
                versions[p] = old.get("versions", {}).get(p)
            else:  # keep the workloads not re-measured now
                results[p] = {**res, **results[p]}
        data["meta"] = {**old.get("meta", {}), "merged": {"peers": names, **meta}}
        data["results"] = {p: results[p] for p in PEERS if p in results}
        names = list(data["results"])
    write_json(Path(args.out), data)
    print(f"{'peer':<9}" + "".join(f"{w:>16}" for w in workloads))
    for p in names:
        cells = []
        for w in workloads:
            r = data["results"][p].get(w, {})
            cells.append(f"{r['jobs_per_s']:>16,.0f}" if "jobs_per_s" in r else f"{'n/a':>16}")
        print(f"{p:<9}" + "".join(cells))
    print(f"\nwrote {args.out}")
    return data


if __name__ == "__main__":
    main()
