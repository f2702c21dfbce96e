"""What a model switch costs the NPU itself: PL cycles to rewrite the FBCB through s_axi (Amaranth sim).

A node that time-multiplexes models reloads the FBCB (L x Bmax entries, one
FBCB_DATA write each after one FBCB_ADDR write) whenever it switches model.
This counts the clock cycles the RTL takes for those writes from the AXI-Lite
master's side, back to back. The PS's general-purpose port round trip is not
in the RTL and comes on top (the planner's `mmio_write_ns`, docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.sim import Simulator

from fluidnpu.hw.npu import Npu
from fluidnpu.hw.regmap import REG, NpuParams
from fluidnpu.sim_tb.axil_master import AxiLiteMaster


def fbcb_reload_cycles(params: NpuParams, words: Sequence[int]) -> tuple[int, int]:
    """(cycles for the FBCB_DATA writes of `words` from entry 0, FBCB_ADDR read back afterwards)."""
    dut = Npu(params)
    axil = AxiLiteMaster(dut.s_axi)
    state = {"cycles": 0, "counting": False, "addr": -1}

    async def count(ctx):
        async for _ in ctx.tick():
            state["cycles"] += state["counting"]

    async def testbench(ctx):
        await axil.write(ctx, REG["FBCB_ADDR"].offset, 0)
        state["counting"] = True
        for w in words:
            await axil.write(ctx, REG["FBCB_DATA"].offset, w)
        state["counting"] = False
        state["addr"] = await axil.read(ctx, REG["FBCB_ADDR"].offset)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(count)
    sim.add_testbench(testbench)
    sim.run()
    return int(state["cycles"]), int(state["addr"])
