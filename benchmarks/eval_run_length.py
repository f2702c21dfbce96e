"""Does the scheduler evaluation's headline move with the run length?

    .venv/bin/python benchmarks/eval_run_length.py [--seeds 3] [--samples 2000,4000,8000] [--jobs 2]

Runs Figs. 4 and 5 (every policy, own designs and the same-hardware control) at each request count
and prints the headline over unsaturated points both ways, beside the old aggregate over every point.
Writes run_length.json to --out (default build/eval). About 3 min per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    from fluidnpu.scheduler_fw.experiments import EvalConfig, design_tables, figure_panels, run_panels, sweep_summary

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--samples", default="2000,4000,8000")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "build" / "eval"))
    args = ap.parse_args(argv)
    panels = figure_panels("fig4") + figure_panels("fig5")
    cfg = EvalConfig(seeds=args.seeds, jobs=args.jobs)
    tables, _ = design_tables(panels, cfg)
    rows = []
    for n in (int(x) for x in args.samples.split(",")):
        cfg.n_samples = n
        t0 = time.perf_counter()
        res, _ = run_panels(panels, cfg, tables=tables)
        s = sweep_summary(res)
        row = {"requests": n, "seeds": args.seeds, "seconds": time.perf_counter() - t0,
               "all_points_mean_latency_gain": s["all_points_mean_latency_gain"]}
        for way, h in (("own", s), ("same_hardware", s["same_hardware"])):
            row[way] = {k: h[k] for k in ("points", "points_total", "mean_latency_gain", "mean_latency_gain_ci",
                                          "p99_latency_gain", "baseline_violation_rate", "fluidb_violation_rate")}
        rows.append(row)
        print(f"{n:6d} requests x {args.seeds} seeds: own designs {row['own']['mean_latency_gain']:.3f}x "
              f"({row['own']['points']} points, p99 {row['own']['p99_latency_gain']:.3f}x), FluidB's design "
              f"{row['same_hardware']['mean_latency_gain']:.3f}x ({row['same_hardware']['points']} points, p99 "
              f"{row['same_hardware']['p99_latency_gain']:.3f}x); old all-points aggregate "
              f"{row['all_points_mean_latency_gain']:.3f}x  [{row['seconds']:.0f} s]", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_length.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
