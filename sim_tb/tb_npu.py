"""cocotb testbench of the generated NPU Verilog, with cocotbext-axi.

Off-chip memory is cocotbext-axi's `AxiRam` on each `m_axi<i>` (one memory), the registers are
driven by its `AxiLiteMaster` on `s_axi`. Every AXI channel gets random
pauses. Parameters arrive as JSON in FLUIDNPU_NPU_TB (engine shape, seed,
number of cases); per-run counters are written to FLUIDNPU_NPU_TB_OUT so the
pytest side can compare them with the performance model.
"""

from __future__ import annotations

import json
import logging
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from fluidnpu.hw.regmap import REG
from fluidnpu.sim_tb.cocotb_ram import axi_rams
from fluidnpu.sim_tb.npu_cases import Case, make_case

MEM = 1 << 20


def _cfg() -> dict:
    return json.loads(os.environ["FLUIDNPU_NPU_TB"])


async def _setup(dut, cfg: dict, pause: float):
    Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False)
    dut.rst.value = 1
    # Let reset settle before the bus models sample anything (Icarus shows undriven
    # nets as Z in the first delta cycles).
    await ClockCycles(dut.clk, 2)
    ram = axi_rams(dut, MEM, pause=pause, seed=cfg["seed"])[0]      # one per m_axi<i>, one memory
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi", bus_separator="__"), dut.clk, dut.rst)
    for obj in (axil.write_if, axil.read_if):
        obj.log.setLevel(logging.WARNING)
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)
    return ram, axil


async def _reg(axil, name: str, value: int | None = None) -> int:
    off = REG[name].offset
    if value is None:
        return int.from_bytes((await axil.read(off, 4)).data, "little")
    await axil.write(off, value.to_bytes(4, "little"))
    return value


async def _run(dut, ram, axil, cfg: dict, case: Case, b: int | None = None) -> dict:
    """Load a case, program the NPU, start, wait for done; return status and counters."""
    img = case.image
    ram.write(img.base, bytes(img.memory))
    for addr, word in case.fbcb_words(cfg["layers"], cfg["bmax"]).items():
        await _reg(axil, "FBCB_ADDR", addr)
        await _reg(axil, "FBCB_DATA", word)
    await _reg(axil, "CTRL", 0b100)
    await _reg(axil, "DESC_BASE", img.desc_base)
    await _reg(axil, "DESC_COUNT", img.desc_count)
    if b is None:
        await _reg(axil, "BACTIVE", case.b)
    await _reg(axil, "CTRL", 0b001)
    for _ in range(cfg.get("timeout_polls", 20000)):
        status = await _reg(axil, "STATUS")
        if not status & 1:
            break
        await ClockCycles(dut.clk, 32)
    else:
        raise AssertionError("NPU never finished")
    counters = {n: await _reg(axil, n) for n in ("CYC_BUSY", "CYC_MAC", "CYC_DMA_STALL", "CYC_LAYERS")}
    return {"status": status, **counters}


def _check(ram, case: Case) -> None:
    img = case.image
    img.memory[:] = ram.read(img.base, len(img.memory))
    for i, want in enumerate(case.expected):
        got = img.read_tensor(i + 1, case.b)
        bad = (got != want).sum()
        assert bad == 0, f"layer {i}: {bad} of {want.size} outputs differ (modes {case.modes}, b={case.b})"


def _record(rows: list[dict]) -> None:
    out = os.environ.get("FLUIDNPU_NPU_TB_OUT")
    if out:
        with open(out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


def _case_row(cfg: dict, case: Case, result: dict, test: str) -> dict:
    return {"test": test, "b": case.b, "modes": case.modes,
            "layers": [lp.geometry.__dict__ | {"P": lp.geometry.P} for lp in case.layers], **result}


@cocotb.test()
async def random_subnets_back_to_back(dut):
    """Random subnets, batch sizes, <BR, k> per layer, back-to-back starts, AXI pauses everywhere."""
    cfg = _cfg()
    ram, axil = await _setup(dut, cfg, cfg.get("pause", 0.3))
    rng = random.Random(cfg["seed"])
    rows = []
    for _ in range(cfg["cases"]):
        case = make_case(rng, bmax=cfg["bmax"], TR=cfg["TR"], TP=cfg["TP"], TC=cfg["TC"],
                         nlayers=rng.randint(1, min(3, cfg["layers"])))
        result = await _run(dut, ram, axil, cfg, case)
        assert result["status"] & 0b110 == 0b010, f"status {result['status']:#x}"
        _check(ram, case)
        rows.append(_case_row(cfg, case, result, "random"))
    _record(rows)


@cocotb.test()
async def bactive_changes_between_subnets(dut):
    """Exits and backfill: BEXIT/BINCR change Bactive between two subnets; each runs at its own b."""
    cfg = _cfg()
    ram, axil = await _setup(dut, cfg, 0.2)
    rng = random.Random(cfg["seed"] + 1)
    bmax = cfg["bmax"]
    b0 = bmax
    first = make_case(rng, bmax=bmax, TR=cfg["TR"], TP=cfg["TP"], TC=cfg["TC"], nlayers=1, b=b0)
    await _run(dut, ram, axil, cfg, first)
    _check(ram, first)
    exited = rng.randint(1, b0 - 1) if b0 > 1 else 0
    await _reg(axil, "BEXIT", exited)
    assert await _reg(axil, "BACTIVE") == b0 - exited
    backfill = rng.randint(0, exited)
    if backfill:
        await _reg(axil, "BINCR", backfill)
    b1 = b0 - exited + backfill
    assert await _reg(axil, "BACTIVE") == b1
    second = make_case(rng, bmax=bmax, TR=cfg["TR"], TP=cfg["TP"], TC=cfg["TC"], nlayers=2, b=b1)
    result = await _run(dut, ram, axil, cfg, second, b=b1)
    assert result["status"] & 0b110 == 0b010
    _check(ram, second)


@cocotb.test()
async def reset_in_the_middle_of_a_run(dut):
    """A reset mid-run leaves a clean NPU: the same case then runs to the right answer."""
    cfg = _cfg()
    ram, axil = await _setup(dut, cfg, 0.0)
    rng = random.Random(cfg["seed"] + 2)
    case = make_case(rng, bmax=cfg["bmax"], TR=cfg["TR"], TP=cfg["TP"], TC=cfg["TC"], nlayers=2)
    img = case.image
    ram.write(img.base, bytes(img.memory))
    for addr, word in case.fbcb_words(cfg["layers"], cfg["bmax"]).items():
        await _reg(axil, "FBCB_ADDR", addr)
        await _reg(axil, "FBCB_DATA", word)
    await _reg(axil, "DESC_BASE", img.desc_base)
    await _reg(axil, "DESC_COUNT", img.desc_count)
    await _reg(axil, "BACTIVE", case.b)
    await _reg(axil, "CTRL", 0b001)
    await ClockCycles(dut.clk, rng.randint(20, 200))
    # SOFT_RESET first (the driver's timeout path), then a full reset of everything.
    await _reg(axil, "CTRL", 0b010)
    for _ in range(1000):
        if not await _reg(axil, "STATUS") & 1:
            break
    else:
        raise AssertionError("SOFT_RESET did not bring the NPU back to idle")
    ram.write(img.base, bytes(img.memory))
    result = await _run(dut, ram, axil, cfg, case)
    assert result["status"] & 0b110 == 0b010
    _check(ram, case)
    # Now a hard reset (of the NPU and the memory's AXI state) in the middle of a run.
    ram.write(img.base, bytes(img.memory))
    await _reg(axil, "CTRL", 0b001)
    await ClockCycles(dut.clk, rng.randint(20, 200))
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)
    assert not await _reg(axil, "STATUS") & 1, "busy after reset"
    ram.write(img.base, bytes(img.memory))
    result = await _run(dut, ram, axil, cfg, case)
    assert result["status"] & 0b110 == 0b010
    _check(ram, case)


@cocotb.test(skip=os.environ.get("FLUIDNPU_NPU_TB_BENCH") is None)
async def one_layer_for_speed(dut):
    """The benchmark's representative layer (a 3x3 conv at batch 2): wall time per simulated cycle."""
    import time

    cfg = _cfg()
    ram, axil = await _setup(dut, cfg, 0.0)
    rng = random.Random(5)
    case = make_case(rng, bmax=cfg["bmax"], TR=cfg["TR"], TP=cfg["TP"], TC=cfg["TC"], nlayers=1,
                     b=min(2, cfg["bmax"]), in_shape=(8, 8, 16), modes=[(1, 0)], max_c=16)
    t0 = time.perf_counter()
    result = await _run(dut, ram, axil, cfg, case)
    seconds = time.perf_counter() - t0
    _check(ram, case)
    _record([{"test": "speed", "cycles": result["CYC_BUSY"], "seconds": seconds}])
