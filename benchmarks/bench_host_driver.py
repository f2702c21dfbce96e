"""Host driver speed: ModelDevice subnet time, RtlSimDevice simulated cycles/s, host-side launch overhead.

    .venv/bin/python benchmarks/bench_host_driver.py [--no-rtl] [--json]

* ModelDevice: wall time of `run_subnet` on a 2-layer subnet (8x8x16 input, 3x3 convs / FC, Bmax 4)
  on the <16, 4, 4> engine, and the model's own compute time inside it.
* Host overhead of one launch apart from device time: `run_subnet` wall time minus the model's
  compute time (register traffic through the Device interface, checks, counter reads), with the
  number of register accesses one launch makes (on a board each is one uncached MMIO access).
* RtlSimDevice: the same subnet on the generated Verilog under Verilator (cocotb bridge, cocotbext-axi):
  simulated cycles per wall second, START to DONE as the driver sees it (polling included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from fluidnpu.host_driver.driver import NpuDriver, random_fbcb, stub_bundle
from fluidnpu.host_driver.model_device import ModelDevice
from fluidnpu.host_driver.scenario import timed_runs

TR, TP, TC, BMAX, LAYERS = 16, 4, 4, 4, 2


def bench_model(bundle, n: int) -> dict:
    dev = ModelDevice(bundle)
    driver = NpuDriver(dev, bundle)
    timed_runs(driver, n=3)                                  # warm-up
    res = timed_runs(driver, n=n)
    rows = res["rows"]
    wall = statistics.median(r["wall_s"] for r in rows)
    device = statistics.median(r["device_s"] for r in rows)
    overhead = statistics.median(r["wall_s"] - r["device_s"] for r in rows)
    return {"correct": res["correct"], "subnet_wall_ms": wall * 1e3, "model_compute_ms": device * 1e3,
            "host_overhead_us": overhead * 1e6, "register_accesses": rows[-1]["accesses"],
            "modelled_cycles": rows[-1]["counters"]["busy"]}


def bench_rtl(bundle, n: int) -> dict:
    from fluidnpu.host_driver.rtl_sim_device import run_with_rtl
    t0 = time.perf_counter()
    res = run_with_rtl(bundle, timed_runs, 0, n)
    total = time.perf_counter() - t0
    rows = res["rows"]
    cycles = [r["sim_ns"] / 10.0 for r in rows]              # 100 MHz simulated clock
    rates = [c / r["wall_s"] for c, r in zip(cycles, rows)]
    return {"correct": res["correct"], "busy_cycles": rows[-1]["counters"]["busy"],
            "start_to_done_cycles": statistics.median(cycles), "sim_cycles_per_s": statistics.median(rates),
            "run_wall_s": statistics.median(r["wall_s"] for r in rows),
            "register_transactions": rows[-1]["accesses"], "total_with_build_s": total}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-rtl", action="store_true")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    bundle = stub_bundle(TR, TP, TC, BMAX, random_fbcb(LAYERS, BMAX, TR, TP, TC, seed=1))
    out = {"engine": f"<{TR},{TP},{TC}> Bmax {BMAX}", "model": bench_model(bundle, a.runs)}
    if not a.no_rtl:
        out["rtl"] = bench_rtl(bundle, 2)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    m = out["model"]
    print(f"engine {out['engine']}, 2-layer subnet at Bactive {BMAX}")
    print(f"ModelDevice: run_subnet {m['subnet_wall_ms']:.2f} ms (model compute {m['model_compute_ms']:.2f} ms, "
          f"{m['modelled_cycles']} modelled cycles), bit-exact: {m['correct']}")
    print(f"host-side overhead per launch (apart from device time): {m['host_overhead_us']:.0f} us, "
          f"{m['register_accesses']} register accesses")
    if "rtl" in out:
        r = out["rtl"]
        print(f"RtlSimDevice: {r['start_to_done_cycles']:.0f} simulated cycles START->DONE "
              f"(CYC_BUSY {r['busy_cycles']}) in {r['run_wall_s']:.2f} s: {r['sim_cycles_per_s']:.0f} "
              f"simulated cycles/s; {r['register_transactions']} AXI4-Lite transactions per launch; "
              f"bit-exact: {r['correct']}; whole simulation incl. build/elaboration {r['total_with_build_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
