"""Benchmark: how long the Nexus planner takes to re-plan a fleet.

Re-planning runs every epoch on the ingress, so its cost bounds the epoch. This
times `fluidnpu.scheduler_fw.fleet.nexus.plan` alone (ℓ(b) already priced) on
seeded random fleets: 3 device kinds, 8 models with affine ℓ(b) up to Bmax 16,
sessions with rates 1-2000/s and SLOs 20-1000 ms, from 10 to 1,000 sessions,
and reports the median wall time and the node count against its lower bound.
Then the RTL's share of a model switch: the cycles the NPU's s_axi takes to
reload ResNet-50's FBCB (63 layers x Bmax 8 entries) in Amaranth's simulator
(a small engine: the FBCB path does not depend on its size), against what the
planner prices per switch (docs/fleet.md, rule 7).

    python benchmarks/bench_plan.py [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Profile, Session, plan


def random_fleet(n_sessions: int, seed: int) -> tuple[list[Session], list[DeviceKind]]:
    rng = random.Random(seed)
    models = [f"m{i}" for i in range(8)]
    kinds = []
    for k in range(3):
        profiles = {m: Profile(tuple((rng.uniform(2, 30) + rng.uniform(1, 15) * b) / 1e3 for b in range(1, 17)),
                               rng.uniform(0, 5) / 1e3) for m in models}
        kinds.append(DeviceKind(f"kind{k}", 10 ** 6, profiles))
    sessions = [Session(rng.choice(models), rng.uniform(1, 2000), rng.uniform(0.02, 1.0)) for _ in range(n_sessions)]
    return sessions, kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for n in (10, 100, 300, 1000):
        sessions, kinds = random_fleet(n, seed=n)
        times, p = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            p = plan(sessions, kinds)
            times.append(time.perf_counter() - t0)
        rows.append({"sessions": n, "median_s": statistics.median(times), "nodes": len(p.nodes),
                     "shared_nodes": sum(1 for x in p.nodes if not x.saturated), "lower_bound": p.lower_bound,
                     "unplaced": len(p.unplaced)})
    result = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "python": platform.python_version(), "rows": rows, "fbcb_reload": fbcb_reload()}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"Nexus planner on {result['machine']}, Python {result['python']}")
    print(f"{'sessions':>9} {'median':>10} {'nodes':>6} {'shared':>7} {'lower bound':>12} {'unplaced':>9}")
    for r in rows:
        print(f"{r['sessions']:>9} {r['median_s'] * 1e3:>8.1f}ms {r['nodes']:>6} {r['shared_nodes']:>7} "
              f"{r['lower_bound']:>12.1f} {r['unplaced']:>9}")
    f = result["fbcb_reload"]
    if f:
        print(f"FBCB reload on the RTL: {f['entries']} entries in {f['cycles']} cycles "
              f"({f['cycles_per_entry']:.2f}/entry, {f['us_at_200mhz']:.2f} µs at 200 MHz); "
              f"priced with the PS round trip: {f['priced_us']:.1f} µs")


def fbcb_reload() -> dict | None:
    """Measured FBCB reload cycles per entry on the RTL (None without amaranth)."""
    try:
        from fluidnpu.hw.regmap import NpuParams, encode_fbcb_entry
        from fluidnpu.sim_tb.fbcb_reload import fbcb_reload_cycles
    except ImportError:
        return None
    from fluidnpu.scheduler_fw.fleet.profiles import MMIO_WRITE_NS

    layers, bmax = 63, 8
    params = NpuParams(TR=16, TP=4, TC=4, bmax=bmax, layers=layers, axi_dw=64)
    cycles, _ = fbcb_reload_cycles(params, [encode_fbcb_entry(1, 0, bmax)] * (layers * bmax))
    return {"entries": layers * bmax, "cycles": cycles, "cycles_per_entry": cycles / (layers * bmax),
            "us_at_200mhz": cycles / 200.0, "priced_us": layers * bmax * MMIO_WRITE_NS / 1e3}


if __name__ == "__main__":
    main()
