"""A small AXI4-Lite master for Amaranth's simulator (async testbenches).

It drives a slave's `s_axi` port cycle by cycle, with optional delays on each
channel, so tests can show that the slave handles AW before W, W before AW and
back-pressure on B and R. (cocotb testbenches of the Verilog use
cocotbext-axi instead; this one needs no Verilog.)
"""

from __future__ import annotations

from typing import Any


class AxiLiteTimeout(AssertionError):
    """The slave did not complete a handshake within the allowed cycles."""


class AxiLiteMaster:
    """Drives `bus` (an AXI4-Lite slave interface, e.g. `dut.s_axi`) from a testbench."""

    def __init__(self, bus: Any, max_cycles: int = 200) -> None:
        self.bus = bus
        self.max_cycles = max_cycles

    async def write(self, ctx: Any, addr: int, data: int, strb: int = 0xF, *,
                    aw_delay: int = 0, w_delay: int = 0, b_delay: int = 0) -> int:
        """One write; AW waits `aw_delay` cycles, W `w_delay`, BREADY `b_delay`. Returns BRESP."""
        bus = self.bus
        ctx.set(bus.awaddr, addr)
        ctx.set(bus.awprot, 0)
        ctx.set(bus.wdata, data)
        ctx.set(bus.wstrb, strb)
        aw_left, w_left, bresp = True, True, None
        for cycle in range(self.max_cycles):
            ctx.set(bus.awvalid, aw_left and cycle >= aw_delay)
            ctx.set(bus.wvalid, w_left and cycle >= w_delay)
            ctx.set(bus.bready, cycle >= b_delay)
            _, _, awv, awr, wv, wr, bv, br, resp = await ctx.tick().sample(
                bus.awvalid, bus.awready, bus.wvalid, bus.wready, bus.bvalid, bus.bready, bus.bresp)
            if awv and awr:
                aw_left = False
            if wv and wr:
                w_left = False
            if bv and br:
                if aw_left or w_left:
                    raise AssertionError("BVALID before both AW and W were accepted")
                bresp = resp
                break
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        ctx.set(bus.bready, 0)
        if bresp is None:
            raise AxiLiteTimeout(f"write to {addr:#x}: no B response in {self.max_cycles} cycles")
        return bresp

    async def read_resp(self, ctx: Any, addr: int, *, r_delay: int = 0) -> tuple[int, int]:
        """One read; RREADY waits `r_delay` cycles. Returns (RDATA, RRESP)."""
        bus = self.bus
        ctx.set(bus.araddr, addr)
        ctx.set(bus.arprot, 0)
        ar_left, result = True, None
        for cycle in range(self.max_cycles):
            ctx.set(bus.arvalid, ar_left)
            ctx.set(bus.rready, cycle >= r_delay)
            _, _, arv, arr, rv, rr, rdata, rresp = await ctx.tick().sample(
                bus.arvalid, bus.arready, bus.rvalid, bus.rready, bus.rdata, bus.rresp)
            if arv and arr:
                ar_left = False
            if rv and rr:
                if ar_left:
                    raise AssertionError("RVALID before AR was accepted")
                result = (rdata, rresp)
                break
        ctx.set(bus.arvalid, 0)
        ctx.set(bus.rready, 0)
        if result is None:
            raise AxiLiteTimeout(f"read of {addr:#x}: no R response in {self.max_cycles} cycles")
        return result

    async def read(self, ctx: Any, addr: int, **kw: int) -> int:
        """One read that must answer OKAY; returns RDATA."""
        data, resp = await self.read_resp(ctx, addr, **kw)
        if resp != 0:
            raise AssertionError(f"read of {addr:#x} answered RRESP={resp}")
        return data
