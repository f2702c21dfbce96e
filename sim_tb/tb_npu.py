"""cocotb testbench of the generated NPU Verilog, with cocotbext-axi.

Off-chip memory is cocotbext-axi's `AxiRam` on each `m_axi<i>` (one memory), the registers are
driven by its `AxiLiteMaster` on `s_axi` through the host driver's `NpuDriver` (the `TB` harness,
sim_tb/cocotb_tb.py). Every AXI channel gets random pauses. Parameters arrive as JSON in FLUIDNPU_NPU_TB
(engine shape, seed, number of cases; `input_buffer` and `buffered`: an NPU with the block input buffer,
random subnets with every layer buffered); per-run counters are written to FLUIDNPU_NPU_TB_OUT so the
pytest side can compare them with the performance model.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
from cocotb.triggers import ClockCycles

from fluidnpu.host_driver.driver import NpuDriver
from fluidnpu.hw.regmap import REG, NpuParams
from fluidnpu.sim_tb.cocotb_tb import TB
from fluidnpu.sim_tb.npu_cases import Case, load_case


def _cfg() -> dict:
    return json.loads(os.environ["FLUIDNPU_NPU_TB"])


def _params(cfg: dict) -> NpuParams:
    return NpuParams(TR=cfg["TR"], TP=cfg["TP"], TC=cfg["TC"], bmax=cfg["bmax"], layers=cfg["layers"],
                     axi_dw=cfg.get("axi_dw", 64), input_buffer=cfg.get("input_buffer", 0))


def _record(rows: list[dict]) -> None:
    out = os.environ.get("FLUIDNPU_NPU_TB_OUT")
    if out:
        with open(out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


def _case_row(cfg: dict, case: Case, result: dict, test: str) -> dict:
    return {"test": test, "b": case.b, "modes": case.modes,
            "layers": [lp.geometry.__dict__ | {"P": lp.geometry.P, "buffered": case.is_buffered(i)}
                       for i, lp in enumerate(case.layers)], **result}


@cocotb.test()
async def random_subnets_back_to_back(dut):
    """Random subnets, batch sizes, <BR, k> per layer, back-to-back starts, AXI pauses everywhere."""
    cfg = _cfg()
    tb = await TB(dut, _params(cfg), pause=cfg.get("pause", 0.3), seed=cfg["seed"]).start()
    rng = random.Random(cfg["seed"])
    rows = []
    for _ in range(cfg["cases"]):
        case = tb.case(rng, nlayers=rng.randint(1, min(3, cfg["layers"])), buffered=cfg.get("buffered", False))
        result = await tb.run(case)
        assert result["status"] & 0b110 == 0b010, f"status {result['status']:#x}"
        rows.append(_case_row(cfg, case, result, "random"))
    _record(rows)


@cocotb.test()
async def bactive_changes_between_subnets(dut):
    """Exits and backfill: BEXIT/BINCR change Bactive between two subnets; each runs at its own b."""
    cfg = _cfg()
    tb = await TB(dut, _params(cfg), pause=0.2, seed=cfg["seed"]).start()
    rng = random.Random(cfg["seed"] + 1)
    b0 = tb.params.bmax
    first = tb.case(rng, nlayers=1, b=b0)
    assert (await tb.run(first))["status"] & 0b110 == 0b010
    exited = rng.randint(1, b0 - 1) if b0 > 1 else 0
    assert await tb.call(NpuDriver.exit, exited) == b0 - exited
    backfill = rng.randint(0, exited)
    b1 = await tb.call(NpuDriver.backfill, backfill)
    assert b1 == b0 - exited + backfill
    second = tb.case(rng, nlayers=2, b=b1)
    result = await tb.run(second, set_b=False)
    assert result["status"] & 0b110 == 0b010


def _start(driver: NpuDriver, tb: TB, case: Case) -> None:
    """Load the case, START, and return at once."""
    load_case(driver, case, tb.window)
    driver.start(case.image, b=case.b)


@cocotb.test()
async def reset_in_the_middle_of_a_run(dut):
    """A reset mid-run leaves a clean NPU: the same case then runs to the right answer."""
    cfg = _cfg()
    tb = await TB(dut, _params(cfg), seed=cfg["seed"]).start()
    rng = random.Random(cfg["seed"] + 2)
    case = tb.case(rng, nlayers=2)
    await tb.call(_start, tb, case)
    await ClockCycles(dut.clk, rng.randint(20, 200))
    # SOFT_RESET first (the driver's timeout path), then a full reset of everything.
    await tb.axil.write_dword(REG["CTRL"].offset, REG["CTRL"].field("SOFT_RESET").mask)
    for _ in range(1000):
        if not await tb.axil.read_dword(REG["STATUS"].offset) & 1:
            break
    else:
        raise AssertionError("SOFT_RESET did not bring the NPU back to idle")
    case.image.upload()
    assert (await tb.run(case))["status"] & 0b110 == 0b010
    # Now a hard reset (of the NPU and the memory's AXI state) in the middle of a run.
    case.image.upload()
    await tb.call(_start, tb, case)
    await ClockCycles(dut.clk, rng.randint(20, 200))
    await tb.call(NpuDriver.hard_reset)
    assert not await tb.axil.read_dword(REG["STATUS"].offset) & 1, "busy after reset"
    case.image.upload()
    assert (await tb.run(case))["status"] & 0b110 == 0b010


@cocotb.test(skip=os.environ.get("FLUIDNPU_NPU_TB_BENCH") is None)
async def one_layer_for_speed(dut):
    """The benchmark's representative layer (a 3x3 conv at batch 2): wall time per simulated cycle."""
    import time

    cfg = _cfg()
    tb = await TB(dut, _params(cfg), seed=cfg["seed"]).start()
    case = tb.case(random.Random(5), nlayers=1, b=min(2, cfg["bmax"]), in_shape=(8, 8, 16), modes=[(1, 0)],
                   max_c=16)
    t0 = time.perf_counter()
    result = await tb.run(case)
    seconds = time.perf_counter() - t0
    _record([{"test": "speed", "cycles": result["CYC_BUSY"], "seconds": seconds}])
