"""Run the whole NPU in Amaranth's simulator against the AXI RAM model.

Fast to start (no HDL compile), so it is where most functional cases run;
the cocotb testbench (sim_tb/tb_npu.py) runs the generated Verilog the same
way with cocotbext-axi.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from amaranth.sim import Simulator

from fluidnpu.hw.regmap import m_axi_name
from fluidnpu.hw.npu import Npu
from fluidnpu.hw.regmap import REG, NpuParams
from fluidnpu.sim_tb.axi_model import AxiRamModel, SlaveTiming
from fluidnpu.sim_tb.axil_master import AxiLiteMaster
from fluidnpu.sim_tb.npu_cases import Case

COUNTERS = ("CYC_BUSY", "CYC_MAC", "CYC_DMA_STALL", "CYC_LAYERS")


@dataclass
class RunResult:
    outputs: list[np.ndarray]       # per layer (b, h, w, c)
    status: int
    counters: dict[str, int]
    cycles: int                     # START to DONE as seen by the testbench


def _mem_size(n: int) -> int:
    size = 1 << 12
    while size < n:
        size *= 2
    return size


def run_cases(params: NpuParams, cases: list[Case], *, timing: SlaveTiming | Sequence[SlaveTiming] = SlaveTiming(),
              seed: int = 0, max_cycles: int = 2_000_000) -> list[RunResult]:
    """Run `cases` back to back on one simulated NPU (one elaboration, one memory).

    Each AXI port `m_axi<i>` gets its own RAM model on the one memory, with its own
    random stream (`seed`) and `timing` (one for all ports, or one per port).

    For each case: load its image, program the FBCB entries, DESC_BASE,
    DESC_COUNT and BACTIVE, START, poll STATUS until not busy, read the
    counters and the outputs.
    """
    dut = Npu(params)
    lo = min(c.image.base for c in cases)
    hi = max(c.image.base + len(c.image.memory) for c in cases)
    size = _mem_size(hi)
    timings = [timing] * params.axi_ports if isinstance(timing, SlaveTiming) else list(timing)
    if len(timings) != params.axi_ports:
        raise ValueError(f"{len(timings)} port timings for {params.axi_ports} AXI ports")
    # memory the plans do not own answers SLVERR on every port: a read or write outside them fails the case
    ports: list[AxiRamModel] = []
    for i, port_timing in enumerate(timings):
        ports.append(AxiRamModel(getattr(dut, m_axi_name(i)), size=size, data_width=params.axi_dw,
                                 timing=port_timing, seed=seed + 7919 * i, mem=ports[0].mem if ports else None,
                                 error_ranges=((0, lo), (hi, size))))
    ram = ports[0]
    axil = AxiLiteMaster(dut.s_axi)
    results: list[RunResult] = []

    async def testbench(ctx):
        for case in cases:
            img = case.image
            ram.mem[img.base:img.base + len(img.memory)] = img.memory
            for addr, word in case.fbcb_words(params.layers, params.bmax).items():
                await axil.write(ctx, REG["FBCB_ADDR"].offset, addr)
                await axil.write(ctx, REG["FBCB_DATA"].offset, word)
            await axil.write(ctx, REG["CTRL"].offset, 0b100)       # clear counters
            await axil.write(ctx, REG["DESC_BASE"].offset, img.desc_base)
            await axil.write(ctx, REG["DESC_COUNT"].offset, img.desc_count)
            await axil.write(ctx, REG["BACTIVE"].offset, case.b)
            await axil.write(ctx, REG["CTRL"].offset, 0b001)
            cycles = 0
            while True:
                status = await axil.read(ctx, REG["STATUS"].offset)
                if not status & 1:
                    break
                await ctx.tick().repeat(16)
                cycles += 16
                if cycles > max_cycles:
                    raise TimeoutError(f"NPU still busy after {max_cycles} cycles")
            counters = {n: await axil.read(ctx, REG[n].offset) for n in COUNTERS}
            img.memory[:] = ram.mem[img.base:img.base + len(img.memory)]
            outputs = [img.read_tensor(i + 1, case.b) for i in range(len(case.layers))]
            results.append(RunResult(outputs, status, counters, cycles))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for port in ports:
        sim.add_process(port.process)
    sim.add_testbench(testbench)
    sim.run()
    return results


def run_case(params: NpuParams, case: Case, **kw) -> RunResult:
    """One case on a fresh simulated NPU."""
    return run_cases(params, [case], **kw)[0]
