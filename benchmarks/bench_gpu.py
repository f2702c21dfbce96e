"""GPU batching benchmarks, in one command:

    .venv/bin/python benchmarks/bench_gpu.py            # CUDA if available, else a reduced CPU run

1. latency at low / medium / high load (1/4, 3/5, 9/10 of the measured peak; MLPerf-server-style
   seeded Poisson arrivals) for DVABatch, ZeroBatch and DelayBatch (window tuned for peak
   throughput) on BERT (RTE-shaped lengths), the ResNet-like CNN and the UNet-like network;
2. peak throughput under a 200 ms p99 (rate sweep) for DVABatch and DelayBatch on BERT;
3. TurboTransformers' DP batching against naive and no batching: saturated throughput at
   lengths uniform in 2-100 and 5-500 (max batch 20, hungry trigger);
4. scheduling overhead: host time per stage execution, and closed-loop latency of DVABatch
   (window 0) against ZeroBatch at one query at a time (the paper's §8.8 measurement);
5. stages: DVABatch §7.1's profiling search for the stage count (up to 8 tries per workload);
6. overlap: the same batches through a 4-stage engine with dependent stages enqueued behind
   events (the default) and in the strictly serial mode: on a GPU the first must be faster;
7. allocator: TurboTransformers' Algorithm 1 against a plain caching allocator over BERT-base
   request streams (reserved memory, device allocations, fragmentation; bookkeeping only, so
   the figures do not depend on the device).

Writes gpu_bench.json, one CSV per experiment and PNGs (with matplotlib) to --out
(docs/figures/gpu/ by default) and prints the figures. On CPU the models are the "small"
sizes (tiny for the DP runs) and runs are seconds long: it exercises the harness; its figures
are not GPU figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("latency", "peak", "dp", "overhead", "stages", "overlap", "allocator")


def log(*a):
    print(*a, flush=True)


def run_point(bench, policy_name, rate, duration, seed, bsmax, window_s=None, drain_s=60.0, **kw):
    from fluidnpu.scheduler_fw.gpu.runner import make_trace, serve_load
    from fluidnpu.scheduler_fw.gpu.setup import make_engine, make_policy

    pol, prof = make_policy(bench, policy_name, bsmax, window_s=window_s, **kw)
    eng = make_engine(bench, prof, max(bsmax, pol.bsmax))
    arrivals, payloads = make_trace(bench.spec, rate, duration, seed)
    res = serve_load(bench.spec, pol, eng, arrivals, payloads, drain_s=drain_s)
    s = res.summary()
    s["rate_qps"] = rate
    return s


def tune_delay_window(bench, peak, bsmax, duration, seed, fractions, slo_s=0.2):
    """DelayBatch's window tuned for peak throughput: the window with the highest served
    throughput under an overload of 1.2 x peak (ties: lower mean latency). Candidates are
    fractions of the bsmax batch time, capped at a quarter of the 200 ms QoS target so that
    the window alone cannot break the p99 target."""
    from fluidnpu.scheduler_fw.gpu.setup import make_policy

    _, prof = make_policy(bench, "zerobatch", bsmax)
    tbatch = prof.total(bsmax)
    best = None
    rows = []
    for f in fractions:
        w = min(f * tbatch, slo_s / 4)
        s = run_point(bench, "delaybatch", 1.2 * peak, duration, seed, bsmax, window_s=w, drain_s=0.0)
        rows.append({"window_ms": w * 1e3, "throughput_qps": s["throughput_qps"],
                     "mean_latency_ms": s["mean_latency_ms"]})
        key = (round(s["throughput_qps"], -1), -s["mean_latency_ms"])
        if best is None or key > best[0]:
            best = (key, w)
    return best[1], rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "gpu"))
    ap.add_argument("--duration", type=float, default=None, help="seconds of arrivals per point")
    ap.add_argument("--only", default=",".join(EXPERIMENTS), help="comma-separated experiments")
    ap.add_argument("--workloads", default="bert,cnn,unet")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--size", default=None, help="model size: full (GPU default), small (CPU default), tiny")
    args = ap.parse_args(argv)

    import torch

    from fluidnpu.host_driver.staged.torchutil import device_name
    from fluidnpu.scheduler_fw.gpu.runner import LOAD_FRACTIONS
    from fluidnpu.scheduler_fw.gpu.setup import make_policy, prepare

    torch.set_num_threads(args.threads)
    dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = dev.startswith("cuda")
    size = args.size or ("full" if gpu else "small")
    dp_size = args.size or ("full" if gpu else "tiny")    # CPU: 5-500 tokens at BERT-small size takes too long
    dur = args.duration or (30.0 if gpu else 4.0)
    bsmax = 64
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    report = {"device": dev, "device_name": None, "size": size, "duration_s": dur, "bsmax": bsmax,
              "torch": torch.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "note": "GPU figures" if gpu else "CPU run of the reduced harness (small/tiny models): NOT GPU figures"}
    log(f"bench_gpu: device={dev} size={size} duration={dur}s per point")

    # 1. latency vs load --------------------------------------------------------
    if "latency" in only:
        rows, tuning = [], {}
        for w in args.workloads.split(","):
            bench = prepare(w, dev, size=size, bsmax=bsmax, **({"lengths": "rte"} if w == "bert" else {}))
            report["device_name"] = device_name(bench.device)
            peak = bench.peak(bsmax)
            window, trows = tune_delay_window(bench, peak, bsmax, dur / 2, args.seed,
                                              (0.25, 0.5, 1.0, 2.0) if gpu else (0.25, 1.0))
            tuning[w] = {"peak_qps": peak, "window_ms": window * 1e3, "sweep": trows}
            log(f"[latency] {w}: measured peak {peak:.0f} q/s, DelayBatch window {window * 1e3:.2f} ms")
            for load, frac in LOAD_FRACTIONS.items():
                base = {}
                for p in ("zerobatch", "delaybatch", "dva"):
                    s = run_point(bench, p, frac * peak, dur, args.seed, bsmax, window_s=window)
                    base[p] = s
                    rows.append({"workload": w, "load": load, "rate_qps": frac * peak, "policy": p,
                                 "mean_latency_ms": s["mean_latency_ms"], "p99_latency_ms": s["p99_latency_ms"],
                                 "throughput_qps": s["throughput_qps"], "sent": s["sent"], "answered": s["answered"],
                                 "overhead_per_stage_ms": s["overhead_per_stage_ms"]})
                d, z, dl = base["dva"], base["zerobatch"], base["delaybatch"]
                log(f"  {load:6s} {frac * peak:8.1f} q/s  mean ms: dva {d['mean_latency_ms']:8.2f}  "
                    f"zero {z['mean_latency_ms']:8.2f}  delay {dl['mean_latency_ms']:8.2f}  "
                    f"(dva vs delay {100 * (d['mean_latency_ms'] / dl['mean_latency_ms'] - 1):+.1f}%, "
                    f"vs zero {100 * (d['mean_latency_ms'] / z['mean_latency_ms'] - 1):+.1f}%)  "
                    f"p99 ms: dva {d['p99_latency_ms']:.1f} zero {z['p99_latency_ms']:.1f} "
                    f"delay {dl['p99_latency_ms']:.1f}")
        report["latency"] = rows
        report["delay_tuning"] = tuning
        _csv(out / "latency_vs_load.csv", rows)
        _plot_latency(out / "latency_vs_load.png", rows)

    # 2. peak throughput under a 200 ms p99 ----------------------------------------
    if "peak" in only:
        bench = prepare("bert", dev, size=size, bsmax=bsmax, lengths="rte")
        report["device_name"] = device_name(bench.device)
        peak = bench.peak(bsmax)
        window = report.get("delay_tuning", {}).get("bert", {}).get("window_ms")
        window = window / 1e3 if window else tune_delay_window(bench, peak, bsmax, dur / 2, args.seed, (0.25, 1.0))[0]
        rows, best = [], {}
        for p in ("delaybatch", "dva"):
            for f in (0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0):
                s = run_point(bench, p, f * peak, dur, args.seed, bsmax, window_s=window, drain_s=10.0)
                ok = s["p99_latency_ms"] <= 200.0 and s["answered"] == s["sent"]
                rows.append({"policy": p, "rate_qps": f * peak, "throughput_qps": s["throughput_qps"],
                             "p99_latency_ms": s["p99_latency_ms"], "mean_latency_ms": s["mean_latency_ms"],
                             "meets_slo": ok})
                if ok:
                    best[p] = max(best.get(p, 0.0), s["throughput_qps"])
                log(f"[peak] {p:10s} {f * peak:8.1f} q/s -> {s['throughput_qps']:8.1f} q/s, p99 "
                    f"{s['p99_latency_ms']:.1f} ms {'ok' if ok else 'VIOLATES'}")
        dva_over_delay = best.get("dva", 0) / best["delaybatch"] if best.get("delaybatch") else None
        report["peak_under_slo"] = {"rows": rows, "best_qps": best, "dva_over_delay": dva_over_delay}
        _csv(out / "peak_under_200ms_p99.csv", rows)
        log(f"[peak] highest throughput with p99 <= 200 ms: {best}")

    # 3. DP vs naive vs no batching ---------------------------------------------------
    if "dp" in only:
        rows = []
        for dist in ("uniform-2-100", "uniform-5-500"):
            kw = {"lengths": dist} if dp_size == "full" else {"lengths": dist, "max_len": 512}
            bench = prepare("bert", dev, size=dp_size, bsmax=20, **kw)
            report["device_name"] = device_name(bench.device)
            report["dp_size"] = dp_size
            table_path = out / f"cost_table_{dist}_{dp_size}_{dev.replace(':', '')}.json"
            nob_peak = 1.0 / max(bench.profile(1).total(1), 1e-6)
            res = {}
            for p in ("nobatch", "naive", "dp"):
                # saturated: offered load far above what any policy serves; throughput over the run
                s = run_point(bench, p, 6.0 * nob_peak, dur, args.seed, 20, drain_s=0.0, cost_table=table_path)
                res[p] = s["throughput_qps"]
                rows.append({"lengths": dist, "policy": p, "offered_qps": 6.0 * nob_peak,
                             "throughput_qps": s["throughput_qps"], "mean_latency_ms": s["mean_latency_ms"]})
            log(f"[dp] {dist}: saturated throughput q/s: nobatch {res['nobatch']:.1f}, naive {res['naive']:.1f}, "
                f"dp {res['dp']:.1f} (dp/naive {res['dp'] / res['naive']:.2f}x)")
        report["dp"] = rows
        _csv(out / "dp_vs_naive_nobatch.csv", rows)

    # 4. scheduling overhead ------------------------------------------------------------
    if "overhead" in only:
        from fluidnpu.host_driver.staged.batch_table import Query
        from fluidnpu.host_driver.staged.engine import StagedEngine

        rows = []
        for w in args.workloads.split(","):
            bench = prepare(w, dev, size=size, bsmax=bsmax)
            lat = {}
            per_stage = {}
            for p in ("zerobatch", "dva"):
                pol, prof = make_policy(bench, p, bsmax)
                eng = StagedEngine(bench.spec, prof, bench.device, max_batch=bsmax)
                payloads = bench.spec.sample(np.random.default_rng(3), 220)
                ts = []
                for k, pl in enumerate(payloads):
                    q = Query(k, pl, 0.0, bench.spec.length(pl) if bench.spec.length else 1)
                    t0 = time.perf_counter()
                    eng.new([q])
                    eng.run_until_done()
                    ts.append(time.perf_counter() - t0)
                lat[p] = float(np.mean(ts[20:]) * 1e3)
                per_stage[p] = eng.overhead_per_stage_s() * 1e3
            rows.append({"workload": w, "closed_loop_zerobatch_ms": lat["zerobatch"], "closed_loop_dva_ms": lat["dva"],
                         "added_latency_ms": lat["dva"] - lat["zerobatch"],
                         "dva_host_overhead_per_stage_ms": per_stage["dva"]})
            log(f"[overhead] {w}: closed loop bs=1 zerobatch {lat['zerobatch']:.3f} ms, dva {lat['dva']:.3f} ms "
                f"(+{lat['dva'] - lat['zerobatch']:.3f} ms); host overhead per stage {per_stage['dva']:.3f} ms")
        report["overhead"] = rows
        _csv(out / "overhead.csv", rows)

    # 5. stage-count search ---------------------------------------------------------------
    if "stages" in only:
        rows = []
        for w in args.workloads.split(","):
            bench = prepare(w, dev, size=size, bsmax=bsmax, **({"lengths": "rte"} if w == "bert" else {}))
            n, tries = bench.search_stages(bsmax, duration_s=min(dur, 10.0) / 2, seed=args.seed)
            for t in tries:
                rows.append({"workload": w, **t, "chosen": t["stages"] == n})
            log(f"[stages] {w}: tried {[t['stages'] for t in tries]} -> {n} stages "
                f"(throughput q/s {[round(t['throughput_qps'], 1) for t in tries]})")
        report["stage_search"] = rows
        _csv(out / "stage_search.csv", rows)

    # 6. overlap of dependent stages against the strictly serial mode -------------------------
    if "overlap" in only:
        from fluidnpu.host_driver.staged.batch_table import Query
        from fluidnpu.host_driver.staged.engine import StagedEngine
        from fluidnpu.host_driver.staged.torchutil import synchronize

        rows = []
        for w in args.workloads.split(","):
            bench = prepare(w, dev, size=size, bsmax=bsmax)
            report["device_name"] = device_name(bench.device)
            prof = bench.profile(min(4, len(bench.spec.modules)))
            payloads = bench.spec.sample(np.random.default_rng(4), 16 * 16)
            res = {}
            for serial in (False, True):
                eng = StagedEngine(bench.spec, prof, bench.device, max_batch=bsmax, serial=serial)
                ts = []
                for rep in range(3):
                    synchronize(bench.device)
                    t0 = time.perf_counter()
                    for k in range(0, len(payloads), 16):
                        eng.new([Query(rep * 10_000 + k + j, pl, 0.0, bench.spec.length(pl) if bench.spec.length
                                       else 1) for j, pl in enumerate(payloads[k:k + 16])])
                    eng.run_until_done()
                    ts.append(time.perf_counter() - t0)
                res["serial" if serial else "overlapped"] = float(np.median(ts))
            rows.append({"workload": w, "stages": prof.n_stages, "batches": 16, "batch": 16,
                         "overlapped_s": res["overlapped"], "serial_s": res["serial"],
                         "speedup": res["serial"] / res["overlapped"]})
            log(f"[overlap] {w}: 16 batches of 16 through {prof.n_stages} stages: overlapped "
                f"{res['overlapped'] * 1e3:.1f} ms, serial {res['serial'] * 1e3:.1f} ms "
                f"({res['serial'] / res['overlapped']:.2f}x)")
        report["overlap"] = rows
        _csv(out / "overlap.csv", rows)

    # 7. Algorithm 1 against a caching allocator -------------------------------------------------
    if "allocator" in only:
        from fluidnpu.host_driver.staged.allocator import compare_allocators

        rows = []
        for dist, (lo, hi) in (("uniform-2-100", (2, 100)), ("uniform-5-500", (5, 500))):
            lengths = np.random.default_rng(args.seed).integers(lo, hi + 1, 500)
            for batch in (1, 8):
                for idle in (0, 8):
                    r = compare_allocators(lengths, batch=batch, max_idle=idle)
                    for name, v in r.items():
                        if name == "caching" and idle:
                            continue
                        rows.append({"lengths": dist, "batch": batch, "allocator":
                                     name if name == "caching" else f"alg1 (release after {idle} idle)", **v})
                    a, c = r["alg1"], r["caching"]
                    log(f"[allocator] {dist} batch {batch} idle {idle}: alg1 {a['peak_reserved_mib']:.1f} MiB, "
                        f"{a['device_allocs']} allocs (reuse {100 * a['reuse']:.1f} %), frag "
                        f"{a['fragmentation_mean']:.2f}; caching {c['peak_reserved_mib']:.1f} MiB, "
                        f"{c['device_allocs']} allocs (reuse {100 * c['reuse']:.1f} %), "
                        f"frag {c['fragmentation_mean']:.2f}")
        report["allocator"] = rows
        _csv(out / "allocator.csv", rows)

    path = out / "gpu_bench.json"
    if only != set(EXPERIMENTS) and path.exists():   # a partial re-run updates the record
        old = json.loads(path.read_text())
        if "latency" in report and "latency" in old:    # keep the other workloads' rows
            redone = {r["workload"] for r in report["latency"]}
            report["latency"] = [r for r in old["latency"] if r["workload"] not in redone] + report["latency"]
            report["delay_tuning"] = {**old.get("delay_tuning", {}), **report["delay_tuning"]}
            _csv(out / "latency_vs_load.csv", report["latency"])
            _plot_latency(out / "latency_vs_load.png", report["latency"])
        old.update({k: v for k, v in report.items() if v is not None})
        report = old
    path.write_text(json.dumps(report, indent=1, default=float))
    log(f"wrote {out}/gpu_bench.json on {report['device_name']}")
    return 0


def _csv(path: Path, rows):
    if not rows:
        return
    with path.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


def _plot_latency(path: Path, rows):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return
    ws = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(ws), figsize=(4.5 * len(ws), 3.5), squeeze=False)
    loads = ["low", "medium", "high"]
    for ax, w in zip(axes[0], ws):
        for k, p in enumerate(("zerobatch", "delaybatch", "dva")):
            ys = [next((r["mean_latency_ms"] for r in rows
                        if r["workload"] == w and r["load"] == ld and r["policy"] == p), np.nan) for ld in loads]
            ax.bar(np.arange(3) + (k - 1) * 0.27, ys, 0.27, label=p)
        ax.set_xticks(range(3), loads)
        ax.set_title(w)
        ax.set_ylabel("mean latency (ms)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
