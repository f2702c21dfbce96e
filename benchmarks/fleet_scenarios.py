"""The fleet's scenarios on Ray with emulated boards: a ramp, three ramps together, a board killed mid-run.

The example fleet (docs/examples/fleet/fleet.json: 4 ZC706 boards with the
ResNet-50 design, 2 ZCU104 boards with the Inception-v3 design), every board
an emulated one (fleet/ray_fleet.py: an actor sleeping through each batch's
modelled time, samples leaving at exits). The plan is re-made every epoch on
the rates measured over it, with headroom.

1. ramp: ResNet-50 ramping 0 -> 40 req/s over 40 s, SLO 2 s;
2. three: ResNet-50, Inception-v3 and digits-ee ramping 0 -> 40 req/s each
   over 40 s, SLOs 1 s, 1 s and 100 ms; the same arrivals also served by the
   baseline, Ray Serve's static @serve.batch per model with one replica per
   device, provisioned for the peak (fleet/serve_batch.py): "three-serve-batch";
3. kill: ResNet-50 at 30 req/s for 20 s, SLO 1 s, the board of node 0 killed at 10 s.

Device-seconds (both paths): the integral over the run of the devices in use, a device being in use
while the current plan gives it a node (Nexus) or a static deployment holds it (@serve.batch);
devices started but given nothing are not counted.

Writes docs/figures/fleet/scenarios.{json,csv,png} and prints a summary.
Needs Ray with Serve (the 'fleet' extra). About 4 minutes.

    python benchmarks/fleet_scenarios.py [--epoch 2] [--headroom 0.5] [--slo-margin 0.1] [--jitter-ms 20]
        [--quantile 0.99] [--only ramp,three,three-serve-batch,kill] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

from fluidnpu.scheduler_fw.fleet.inputs import device_kinds, load_fleet_file
from fluidnpu.scheduler_fw.fleet.nexus import Session, plan
from fluidnpu.scheduler_fw.fleet.ray_fleet import Fleet, RunLog, poisson_arrivals
from fluidnpu.serving.percentiles import percentiles

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "fleet"

SCENARIOS = {
    "ramp": {"seconds": 40.0, "sessions": [("resnet50", 2.0)], "peak": 40.0, "ramp": True},
    "three": {"seconds": 40.0, "sessions": [("resnet50", 1.0), ("inceptionv3", 1.0), ("digits-ee", 0.1)],
              "peak": 40.0, "ramp": True},
    "kill": {"seconds": 20.0, "sessions": [("resnet50", 1.0)], "peak": 30.0, "ramp": False, "kill": (10.0, 0)},
}
SCENARIOS["three-serve-batch"] = {**SCENARIOS["three"], "baseline": True}


def ms_percentiles(xs: list[float]) -> dict[str, float]:
    """p50, p99 and max of seconds, in ms (empty: zeros)."""
    return percentiles(xs, scale=1e3, suffix="_ms", empty=0.0)


def run_scenario(name: str, spec: dict, epoch: float, headroom: float, margin: float, seed: int = 0,
                 jitter_s: float = 0.0, quantile: float = 0.0) -> dict:
    sessions = [Session(m, 1.0, slo) for m, slo in spec["sessions"]]
    kinds = device_kinds(load_fleet_file(EXAMPLE / "fleet.json"), [s.model for s in sessions])
    peak, T = spec["peak"], spec["seconds"]
    if spec["ramp"]:
        rates = {i: (lambda t, peak=peak, T=T: peak * t / T) for i in range(len(sessions))}
        first = plan(sessions, kinds, headroom, margin, jitter_s, quantile)   # rates start near 0: plan for 1 req/s
    else:
        rates = {i: peak for i in range(len(sessions))}
        first = plan([Session(s.model, peak, s.slo_s) for s in sessions], kinds, headroom, margin, jitter_s, quantile)
    arrivals = poisson_arrivals(rates, T, seed, peak={i: peak for i in range(len(sessions))})
    static: list[dict] = []
    log: RunLog
    if spec.get("baseline"):
        from fluidnpu.scheduler_fw.fleet.serve_batch import ServeBatchFleet, static_deployments

        deps, _ = static_deployments([Session(s.model, peak, s.slo_s) for s in sessions], kinds, headroom, margin,
                                     jitter_s)
        static = [{"model": d.model, "device": d.device, "replicas": d.replicas, "max_batch_size": d.max_batch_size,
                   "batch_wait_timeout_ms": 1e3 * d.batch_wait_timeout_s} for d in deps]
        base = ServeBatchFleet(deps, kinds, sessions, seed=seed)
        try:
            log = base.run(arrivals)
        finally:
            base.shutdown()
        devices = [(0.0, base.devices)]
    else:
        fleet = Fleet(first, kinds, seed=seed, headroom=headroom, slo_margin=margin, jitter_s=jitter_s)
        try:
            log = fleet.run(arrivals, epoch_s=epoch, kill=spec.get("kill"))
        finally:
            fleet.shutdown()
        devices = [(0.0, len(first.nodes))] + [(e["t"], e["devices"]) for e in log.epochs]
    device_s = sum(n * (min(T, t1) - t0) for (t0, n), (t1, _) in zip(devices, devices[1:] + [(T, 0)]) if t0 < T)
    within = sum(1 for s, _, lat in log.answers if lat is not None and lat <= sessions[s].slo_s)
    arrived = sum(log.arrivals.values())
    per_second = []
    for sec in range(int(T)):
        xs = [(s, lat) for s, t, lat in log.answers if sec <= t < sec + 1]
        ok = sum(1 for s, lat in xs if lat is not None and lat <= sessions[s].slo_s)
        per_second.append({"t": sec, "requests": len(xs), "within_slo": ok})
    return {"scenario": name, "seconds": T, "epoch_s": epoch, "headroom": headroom, "slo_margin": margin,
            "jitter_ms": 1e3 * jitter_s, "quantile": quantile, "seed": seed, "static_deployments": static,
            "loadavg_1min": os.getloadavg()[0],      # the shared host's load at the end: the figures depend on it
            "dispatch_lateness": ms_percentiles(log.jitter.get("lateness", [])),
            "transit": ms_percentiles(log.jitter.get("transit", [])),
            "arrivals": arrived,
            "answered": sum(len(v) for v in log.latencies.values()), "rejected": sum(log.rejected.values()),
            "retried": sum(log.retried.values()),
            "within_slo": within, "slo_compliance": within / arrived if arrived else 1.0, "device_seconds": device_s,
            "sessions": [{"model": s.model, "slo_ms": s.slo_s * 1e3, "arrivals": log.arrivals[i],
                          "answered": len(log.latencies[i]), "rejected": log.rejected[i],
                          "within_slo": sum(1 for x in log.latencies[i] if x <= s.slo_s)}
                         for i, s in enumerate(sessions)],
            "epochs": [{"t": e["t"], "devices": e["devices"], "died": e["died"], "batches": e["batches"],
                        "rates": e["rates"]} for e in log.epochs],
            "devices": devices, "per_second": per_second}


def plot(results: list[dict], path: Path) -> None:
    from fluidnpu.scheduler_fw.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(3, len(results), figsize=(5 * len(results), 8), sharex="col", squeeze=False)
    for col, r in enumerate(results):
        ax = axes[0][col]
        ts = [t for t, _ in r["devices"]] + [r["seconds"]]
        ax.step(ts, [n for _, n in r["devices"]] + [r["devices"][-1][1]], where="post")
        for e in r["epochs"]:
            if e["died"]:
                ax.axvline(e["t"], color="red", linestyle=":", label="death found, re-planned")
        ax.set_title(f"{r['scenario']}: {100 * r['slo_compliance']:.2f} % in SLO, {r['rejected']} refused, "
                     f"{r['device_seconds']:.0f} device-s", fontsize=9)
        ax.set_ylabel("devices in use")
        ax = axes[1][col]
        for d in r.get("static_deployments", []):          # @serve.batch: max_batch_size, fixed
            ax.step([0, r["seconds"]], [d["max_batch_size"]] * 2, where="post", label=f"{d['model']} (max)")
        for i, s in enumerate(r["sessions"]):
            pts = [(e["t"], e["batches"].get(i, e["batches"].get(str(i)))) for e in r["epochs"]]
            if not pts:
                continue
            ax.step([t for t, b in pts if b], [b for t, b in pts if b], where="post", label=s["model"])
        ax.set_ylabel("batch size (first node)")
        ax.legend(fontsize=7)
        ax = axes[2][col]
        ps = r["per_second"]
        ax.plot([p["t"] for p in ps], [100 * p["within_slo"] / p["requests"] if p["requests"] else 100 for p in ps])
        ax.set_ylim(0, 105)
        ax.set_ylabel("in SLO per second (%)")
        ax.set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epoch", type=float, default=2.0)
    ap.add_argument("--headroom", type=float, default=0.5)
    ap.add_argument("--slo-margin", type=float, default=0.1)
    ap.add_argument("--jitter-ms", type=float, default=20.0, help="absolute SLO margin for dispatch jitter")
    ap.add_argument("--quantile", type=float, default=0.99, help="Poisson quantile of each slot (0: Nexus's mean)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="ramp,three,three-serve-batch,kill")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "fleet")
    args = ap.parse_args()
    from plan_headroom import ensure_designs  # the example's bundles, from the design cache

    ensure_designs(load_fleet_file(EXAMPLE / "fleet.json"))
    results = [run_scenario(n, SCENARIOS[n], args.epoch, args.headroom, args.slo_margin, args.seed,
                            args.jitter_ms / 1e3, args.quantile) for n in args.only.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scenarios.json").write_text(json.dumps(results, indent=1))
    keys = ["scenario", "seconds", "arrivals", "answered", "retried", "rejected", "within_slo", "slo_compliance",
            "device_seconds"]
    with open(args.out / "scenarios.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(results)
    plot(results, args.out / "scenarios.png")
    for r in results:
        per = ", ".join(f"{s['model']} {100 * s['within_slo'] / max(1, s['arrivals']):.2f} %" for s in r["sessions"])
        print(f"{r['scenario']}: {r['arrivals']} arrivals, {r['answered']} answered ({r['retried']} retried on another "
              f"device), {r['rejected']} refused, "
              f"{100 * r['slo_compliance']:.2f} % within SLO ({per}), {r['device_seconds']:.1f} device-seconds; "
              f"dispatch lateness p99 {r['dispatch_lateness']['p99_ms']:.1f} ms, transit p99 "
              f"{r['transit']['p99_ms']:.1f} ms; host load {r['loadavg_1min']:.1f}")


if __name__ == "__main__":
    main()
