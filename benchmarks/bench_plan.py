"""Benchmark: how long the Nexus planner takes to re-plan a fleet (issue 13).

Re-planning runs every epoch on the ingress, so its cost bounds the epoch. This
times `fluidnpu.scheduler_fw.fleet.nexus.plan` alone (ℓ(b) already priced) on
seeded random fleets: 3 device kinds, 8 models with affine ℓ(b) up to Bmax 16,
sessions with rates 1-2000/s and SLOs 20-1000 ms, from 10 to 1,000 sessions,
and reports the median wall time and the node count against its lower bound.

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
              "python": platform.python_version(), "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"Nexus planner on {result['machine']}, Python {result['python']}")
    print(f"{'sessions':>9} {'median':>10} {'nodes':>6} {'shared':>7} {'lower bound':>12} {'unplaced':>9}")
    for r in rows:
        print(f"{r['sessions']:>9} {r['median_s'] * 1e3:>8.1f}ms {r['nodes']:>6} {r['shared_nodes']:>7} "
              f"{r['lower_bound']:>12.1f} {r['unplaced']:>9}")


if __name__ == "__main__":
    main()
