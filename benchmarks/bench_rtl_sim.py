"""Simulated NPU cycles per second: Verilator and Amaranth's simulator.

One representative layer (a 3x3 conv, 8x8x16 -> 16 channels, batch 2) on a
<16, 4, 4> engine with Bmax 4 and a 64-bit AXI port, START to DONE through
the registers. The HDL simulators run the generated Verilog under cocotb with
cocotbext-axi; build time is excluded (reported separately).

    python benchmarks/bench_rtl_sim.py
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path

from fluidnpu.hw.npu import Npu
from fluidnpu.hw.regmap import NpuParams
from fluidnpu.sim_tb.npu_amaranth import run_case
from fluidnpu.sim_tb.npu_cases import make_case
from fluidnpu.sim_tb.runner import SimulatorMissing, run_cocotb, simulator_available

PARAMS = NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=1, axi_dw=64)
CFG = {"TR": 16, "TP": 4, "TC": 4, "bmax": 4, "layers": 1, "seed": 1, "cases": 0}


def hdl(sim: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speed.jsonl"
        t0 = time.perf_counter()
        run_cocotb(Npu(PARAMS), "fluidnpu_npu", "fluidnpu.sim_tb.tb_npu", sim=sim, testcase="one_layer_for_speed",
                   extra_env={"FLUIDNPU_NPU_TB": json.dumps(CFG), "FLUIDNPU_NPU_TB_OUT": str(out),
                              "FLUIDNPU_NPU_TB_BENCH": "1"})
        total = time.perf_counter() - t0
        row = json.loads(out.read_text().splitlines()[-1])
    return {"simulator": sim, "cycles": row["cycles"], "seconds": row["seconds"],
            "cycles_per_s": row["cycles"] / row["seconds"], "build_and_run_s": total}


def amaranth() -> dict:
    case = make_case(random.Random(5), bmax=4, TR=16, TP=4, TC=4, nlayers=1, b=2, in_shape=(8, 8, 16),
                     modes=[(1, 0)], max_c=16)
    t0 = time.perf_counter()
    res = run_case(PARAMS, case)
    seconds = time.perf_counter() - t0
    return {"simulator": "amaranth", "cycles": res.counters["CYC_BUSY"], "seconds": seconds,
            "cycles_per_s": res.counters["CYC_BUSY"] / seconds, "build_and_run_s": seconds}


def main() -> None:
    rows = []
    for sim in ("verilator", "icarus"):
        if simulator_available(sim):
            try:
                rows.append(hdl(sim))
            except SimulatorMissing:
                pass
        else:
            print(f"{sim}: not installed, skipped")
    rows.append(amaranth())
    for r in rows:
        print(f"{r['simulator']:>9}: {r['cycles_per_s']:10.0f} simulated cycles/s "
              f"({r['cycles']} cycles in {r['seconds']:.2f} s; with build {r['build_and_run_s']:.1f} s)")
    if os.environ.get("BENCH_JSON"):
        Path(os.environ["BENCH_JSON"]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
