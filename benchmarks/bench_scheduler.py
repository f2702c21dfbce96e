"""Benchmark: the scheduler's cost and the simulator's speed.

* FluidB's decision cost per preemption-point evaluation: one `decide()` at
  an exit, including forming the backfill batch, for queues of 10 to 100,000
  waiting samples (target: <= 20 µs median, flat in the queue length);
* the discrete-event simulator's speed in simulated samples per second;
* FluidB's scheduler invocations against LazyBatching's on the 4-exit
  ResNet-50 on ZC706 (the paper: 16.6x fewer);
* optionally (--fig4) the wall time of the whole Fig. 4 reproduction with
  three seeds from a cold DSE cache (target: < 2 minutes on 2 cores).

    python benchmarks/bench_scheduler.py [--repeat 20000] [--fig4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from fluidnpu.boards import load_board
from fluidnpu.scheduler_fw.backend import RunResult
from fluidnpu.scheduler_fw.designs import design_for
from fluidnpu.scheduler_fw.fluidb import FluidB
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import RunKind
from fluidnpu.scheduler_fw.registry import FLUID, R_B8
from fluidnpu.scheduler_fw.samples import RequestQueue
from fluidnpu.scheduler_fw.simulation import Setting, run_once
from fluidnpu.zoo import zoo_model


def decision_cost(table: LatencyTable, queue_len: int, preempt: bool, repeat: int) -> list[float]:
    """Seconds per FluidB.decide() at exit 0 with 3 samples left in the batch and `queue_len` waiting.

    preempt=True: the SLO leaves room, so the call also pops Bincr samples and
    forms the backfill batch. preempt=False: the criterion fails, the batch continues.
    """
    slo = 10.0 if preempt else 1e-6
    pol = FluidB(table, slo)
    q = RequestQueue()
    for _ in range(3):
        q.admit(0.0, 3)
    launch = pol.decide(0.0, q)
    pol.completed(launch, RunResult(0.0, [], list(launch.batch)), 0.0)  # the batch stands at exit 0
    for _ in range(queue_len):
        q.admit(0.0, 3)
    held = list(launch.batch)
    out = []
    clock = time.perf_counter_ns
    for _ in range(repeat):
        t0 = clock()
        act = pol.decide(1e-3, q)
        t1 = clock()
        out.append((t1 - t0) * 1e-9)
        # put the world back for the next call (benchmark-only use of internals)
        if act.kind is RunKind.CATCH_UP:
            q._q.extendleft(reversed(act.batch))
        pol._active, pol._held, pol._backfilled_at, pol._next_seg = held, None, -1, 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--fig4", action="store_true", help="also time the whole Fig. 4 reproduction (3 seeds)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}")
    wl, board = zoo_model("resnet50"), load_board("zc706")
    with tempfile.TemporaryDirectory() as tmp:
        fluid = LatencyTable.from_bundle(design_for(wl, board, FLUID, 8, Path(tmp))[0])
        rdes = LatencyTable.from_bundle(design_for(wl, board, R_B8, 8, Path(tmp))[0])

    costs = {}
    for n in (10, 1_000, 100_000):
        for preempt in (True, False):
            xs = decision_cost(fluid, n, preempt, args.repeat)
            costs[f"queue={n},{'preempt' if preempt else 'continue'}"] = {
                "median_us": statistics.median(xs) * 1e6, "p99_us": sorted(xs)[int(0.99 * len(xs))] * 1e6}

    speed = {}
    for pol, tab in (("fluidb", fluid), ("lazybatching", rdes), ("r-adaptb-s", rdes), ("serial", rdes)):
        t0 = time.perf_counter()
        m, _ = run_once(Setting(pol, 15.0, 0.4, n_samples=args.samples), tab, seed=0)
        dt = time.perf_counter() - t0
        speed[pol] = {"samples_per_s": args.samples / dt, "invocations_per_s": m["invocations"] / dt}

    inv = []
    for rate, slo in ((5.0, 0.4), (10.0, 0.4), (15.0, 0.4), (20.0, 0.4), (25.0, 0.4), (15.0, 0.2)):
        f, _ = run_once(Setting("fluidb", rate, slo, n_samples=args.samples), fluid, seed=0)
        lz, _ = run_once(Setting("lazybatching", rate, slo, n_samples=args.samples), rdes, seed=0)
        inv.append({"rate": rate, "slo_ms": slo * 1e3,
                    "fluidb_invocations_per_sample": f["invocations_per_sample"],
                    "lazy_invocations_per_sample": lz["invocations_per_sample"],
                    "invocation_ratio": lz["invocations"] / f["invocations"],
                    "fluidb_points_per_sample": f["preemption_points_per_sample"],
                    "lazy_points_per_sample": lz["preemption_points_per_sample"],
                    "preemption_point_ratio": lz["preemption_points"] / f["preemption_points"]})

    fig4 = None
    if args.fig4:
        from fluidnpu.scheduler_fw.experiments import EvalConfig, run_figure

        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run_figure("fig4", Path(tmp) / "out", EvalConfig(seeds=3, cache_dir=Path(tmp) / "cache"))
            fig4 = {"seconds_cold_cache": time.perf_counter() - t0}

    figure = {"benchmark": "scheduler", "machine": machine, "decision_cost": costs, "simulator": speed,
              "invocations_resnet50_zc706": inv, "fig4": fig4}
    if args.json:
        print(json.dumps(figure, indent=1))
        return
    print(f"[{machine}]")
    print("FluidB decision cost per preemption-point evaluation (decide() at an exit, 4-exit ResNet-50 LUT):")
    for k, v in costs.items():
        print(f"  {k:28s} median {v['median_us']:6.2f} µs   p99 {v['p99_us']:6.2f} µs")
    print(f"simulator speed ({args.samples} samples at 15 samples/s, ResNet-50 on ZC706):")
    for k, v in speed.items():
        print(f"  {k:14s} {v['samples_per_s']:9.0f} simulated samples/s  ({v['invocations_per_s']:.0f} invocations/s)")
    print("scheduler invocations, LazyBatching / FluidB (paper: 16.6x fewer for FluidB):")
    for r in inv:
        print(f"  {r['rate']:4.0f}/s SLO {r['slo_ms']:3.0f} ms: all invocations "
              f"{r['lazy_invocations_per_sample']:5.1f} vs "
              f"{r['fluidb_invocations_per_sample']:4.2f} per sample = {r['invocation_ratio']:5.1f}x;  "
              f"preemption-point evaluations {r['lazy_points_per_sample']:5.1f} vs "
              f"{r['fluidb_points_per_sample']:4.2f} "
              f"= {r['preemption_point_ratio']:5.1f}x")
    if fig4:
        print(f"Fig. 4 reproduction, 3 seeds, cold DSE cache: {fig4['seconds_cold_cache']:.1f} s")


if __name__ == "__main__":
    main()
