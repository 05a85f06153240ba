"""Merge the benchmark results into one table, ``report.json`` and a PNG chart.

    python benchmarks/report.py                 # results/engine.json + peers.json + scheduler.json
    python benchmarks/report.py --smoke         # the same, from *-smoke inputs where they exist
    python benchmarks/report.py --engine X.json --peers Y.json --out-json R.json --out-png R.png

Every input is optional (a missing one is reported as such).  For each workload (enqueue one
by one, enqueue in bulk, end-to-end processing, delayed end-to-end) the table shows this
project, every peer, the best peer, and the ratios of this project to the best peer and to the
plain client's limit measured in ``engine.json``.  This project's figures come from the peers
run (same method as the peers, same run) when there is one, else from ``engine.json``; the
ratio to the limit always uses ``engine.json``'s own figure when it has one (same run as the
limit, acknowledgements included for the end-to-end rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, write_json

WORKLOADS = {
    "enqueue_single": ("enqueue, one by one", "queue_add", "limit_sync_xadd_single"),
    "enqueue_bulk": ("enqueue, bulk", "queue_add_bulk", "limit_sync_xadd_pipeline"),
    "process": ("end to end, 1 worker process, concurrency 50", "e2e_process", "limit_sync_xadd_pipeline"),
    "delayed": ("delayed end to end (1 s delay)", "e2e_delayed", "limit_sync_xadd_pipeline"),
}
OURS = "chasqui"


def _load(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text())


def _rate(entry: Any) -> float | None:
    if isinstance(entry, dict) and isinstance(entry.get("jobs_per_s"), (int, float)) and entry["jobs_per_s"] > 0:
        return float(entry["jobs_per_s"])
    return None


def build(
    engine: dict[str, Any] | None, peers: dict[str, Any] | None, scheduler: dict[str, Any] | None
) -> dict[str, Any]:
    eng = (engine or {}).get("results", {})
    peer_results = (peers or {}).get("results", {})
    rows = []
    for key, (label, engine_key, limit_key) in WORKLOADS.items():
        ours_src = "peers run" if _rate(peer_results.get(OURS, {}).get(key)) else "engine.json"
        ours = _rate(peer_results.get(OURS, {}).get(key)) or _rate(eng.get(engine_key))
        others = {p: _rate(r.get(key)) for p, r in peer_results.items() if p != OURS}
        notes = {
            p: (r.get(key) or {}).get("unsupported") or (r.get(key) or {}).get("error")
            for p, r in peer_results.items()
            if p != OURS and not _rate(r.get(key))
        }
        measured = {p: v for p, v in others.items() if v}
        best = max(measured, key=measured.get) if measured else None
        limit = _rate(eng.get(limit_key))
        row: dict[str, Any] = {
            "workload": key,
            "label": label,
            OURS: ours,
            "ours_source": ours_src,
            "ours_engine_json": _rate(eng.get(engine_key)),
            "ours_cpu_us_per_job": (peer_results.get(OURS, {}).get(key) or {}).get("client_cpu_us_per_job")
            or (eng.get(engine_key) or {}).get("client_cpu_us_per_job"),
            "peers": others,
            "peer_notes": {p: v for p, v in notes.items() if v},
            "best_peer": best,
            "best_peer_jobs_per_s": measured.get(best) if best else None,
            "ratio_to_best_peer": (ours / measured[best]) if ours and best else None,
            "limit": limit_key,
            "limit_jobs_per_s": limit,
            # against the limit measured in the same run (engine.json) whenever that run has our figure
            "ratio_to_limit": ((_rate(eng.get(engine_key)) or ours) / limit) if ours and limit else None,
        }
        rows.append(row)
    report: dict[str, Any] = {
        "rows": rows,
        "engine": {
            k: {
                m: v.get(m)
                for m in ("jobs_per_s", "client_cpu_us_per_job", "ratio", "ratio_to")
                if v.get(m) is not None
            }
            for k, v in eng.items()
        },
        "engine_targets": (engine or {}).get("targets"),
        "peer_versions": (peers or {}).get("versions"),
        "meta": {"engine": (engine or {}).get("meta"), "peers": (peers or {}).get("meta")},
        "inputs_missing": [
            name for name, d in (("engine", engine), ("peers", peers), ("scheduler", scheduler)) if d is None
        ],
    }
    if scheduler is not None:
        report["scheduler"] = {
            k: scheduler.get(k)
            for k in ("mode", "memory", "upsert", "fire_burst", "fire_spread", "targets", "meets")
            if k in scheduler
        }
    return report


def _fmt(v: float | None, ratio: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" if ratio else f"{v:,.0f}"


def table(report: dict[str, Any]) -> str:
    peers = sorted({p for r in report["rows"] for p in r["peers"]})
    head = (
        f"{'workload (jobs/s)':<34}{OURS:>10}"
        + "".join(f"{p:>9}" for p in peers)
        + f"{'best peer':>11}{'vs best':>9}{'limit':>10}{'vs limit*':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(
            f"{r['label'][:33]:<34}{_fmt(r[OURS]):>10}"
            + "".join(f"{_fmt(r['peers'].get(p)):>9}" for p in peers)
            + f"{(r['best_peer'] or '-'):>11}{_fmt(r['ratio_to_best_peer'], True):>9}"
            + f"{_fmt(r['limit_jobs_per_s']):>10}{_fmt(r['ratio_to_limit'], True):>10}"
        )
    lines.append("* engine.json's own figure for this project over the limit of the same run")
    sched = report.get("scheduler")
    if sched:
        lines.append("")
        mem, ups, burst, spread = (sched.get(k) or {} for k in ("memory", "upsert", "fire_burst", "fire_spread"))
        lines.append(
            f"scheduler ({sched.get('mode')}, {mem.get('specs', 0):,} specs): "
            f"{mem.get('bytes_per_spec', 0):.0f} B/spec (x{mem.get('ratio', 0):.2f} of the floor), "
            f"upsert {ups.get('upsert_specs_per_s', 0):,.0f} specs/s, burst {burst.get('fires_per_s', 0):,.0f} "
            f"fires/s, spread lag p99 {spread.get('lag_p99_ms', '-')} ms"
        )
    if report["inputs_missing"]:
        lines.append(f"\n(no {', '.join(report['inputs_missing'])} results)")
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = sorted({p for r in report["rows"] for p in r["peers"]})
    series = [OURS, *peers, "limit"]
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
    colors = {OURS: "#d62728", "limit": "#7f7f7f", **{p: palette[i % len(palette)] for i, p in enumerate(peers)}}
    fig, ax = plt.subplots(figsize=(11, 6))
    width = 0.8 / len(series)
    for si, name in enumerate(series):
        values = []
        for r in report["rows"]:
            v = r["limit_jobs_per_s"] if name == "limit" else (r[OURS] if name == OURS else r["peers"].get(name))
            values.append(v or 0)
        xs = [i + (si - (len(series) - 1) / 2) * width for i in range(len(report["rows"]))]
        label = (
            "raw redis-py limit (XADD one by one / pipelined)"
            if name == "limit"
            else f"{name} (this project)"
            if name == OURS
            else name
        )
        bars = ax.bar(xs, values, width, label=label, color=colors.get(name))
        if name == OURS:
            for b, v in zip(bars, values):
                if v:
                    ax.annotate(
                        f"{v / 1000:.0f}k" if v >= 1000 else f"{v:.0f}",
                        (b.get_x() + b.get_width() / 2, v),
                        ha="center",
                        va="bottom",
                        fontsize=8,
                    )
    ax.set_yscale("log")
    ax.set_xticks(range(len(report["rows"])))
    ax.set_xticklabels(
        [r["label"].replace(", 1 worker", "\n1 worker").replace(" (1 s", "\n(1 s") for r in report["rows"]], fontsize=9
    )
    ax.set_ylabel("jobs/s (log scale, higher is better)")
    meta = (report.get("meta") or {}).get("peers") or (report.get("meta") or {}).get("engine") or {}
    ax.set_title(
        f"Throughput, one Redis {meta.get('redis_version', '?')} on loopback, {meta.get('cpus', '?')} cores, "
        f"N={meta.get('n', '?'):,}"
        if isinstance(meta.get("n"), int)
        else "Throughput"
    )
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="read and write the *-smoke files")
    ap.add_argument("--engine", default=None)
    ap.add_argument("--peers", default=None)
    ap.add_argument("--scheduler", default=None)
    ap.add_argument("--out-json", default=None)
    ap.add_argument("--out-png", default=None)
    ap.add_argument("--no-png", action="store_true")
    args = ap.parse_args(argv)
    sfx = "-smoke" if args.smoke else ""
    engine = _load(Path(args.engine) if args.engine else RESULTS / f"engine{sfx}.json")
    peers = _load(Path(args.peers) if args.peers else RESULTS / f"peers{sfx}.json")
    scheduler = _load(Path(args.scheduler) if args.scheduler else RESULTS / f"scheduler{sfx}.json")
    report = build(engine, peers, scheduler)
    out_json = Path(args.out_json) if args.out_json else RESULTS / f"report{sfx}.json"
    out_png = Path(args.out_png) if args.out_png else RESULTS / f"report{sfx}.png"
    write_json(out_json, report)
    if not args.no_png:
        chart(report, out_png)
    print(table(report))
    print(f"\nwrote {out_json}" + ("" if args.no_png else f" and {out_png}"))
    return report


if __name__ == "__main__":
    main()
