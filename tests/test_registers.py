"""NpuRegisters in Amaranth's simulator: AXI4-Lite handshakes, every register's semantics, FBCB, errors."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("amaranth")

from amaranth.sim import Simulator

from fluidnpu.hw.registers import NpuRegisters
from fluidnpu.hw.regmap import (
    ID_VALUE,
    REG,
    REGISTERS,
    VERSION_VALUE,
    Access,
    ErrorCode,
    NpuParams,
    decode_fbcb_entry,
    encode_fbcb_entry,
)
from fluidnpu.sim_tb.axil_master import AxiLiteMaster

PARAMS = NpuParams(TR=8, TP=4, TC=3, bmax=4, layers=3, axi_dw=64, design_hash=0xDEADBEEF)

START, SOFT_RESET, CLEAR = 1, 2, 4


class Bench:
    """Register-name access plus the sequencer-side signals, for one testbench."""

    def __init__(self, ctx, dut: NpuRegisters) -> None:
        self.ctx, self.dut = ctx, dut
        self.starts = self.soft_resets = 0
        self.axi = AxiLiteMaster(dut.s_axi)

    async def rd(self, name: str, **kw) -> int:
        return await self.axi.read(self.ctx, REG[name].offset, **kw)

    async def wr(self, name: str, value: int, **kw) -> None:
        assert await self.axi.write(self.ctx, REG[name].offset, value, **kw) == 0

    async def status(self) -> tuple[int, int, int, int]:
        """(BUSY, DONE, ERROR, ERROR_CODE)."""
        s = await self.rd("STATUS")
        f = REG["STATUS"]
        return tuple(f.field(n).get(s) for n in ("BUSY", "DONE", "ERROR", "ERROR_CODE"))

    async def pulse(self, *signals, value: int = 1) -> None:
        for s in signals:
            self.ctx.set(s, value)
        await self.ctx.tick()
        for s in signals:
            self.ctx.set(s, 0)

    async def watch_start(self, name: str, value: int, **kw) -> int:
        """Write a register; how many `start` pulses followed (the monitor counts them)."""
        before = self.starts
        await self.wr(name, value, **kw)
        await self.ctx.tick().repeat(2)
        return self.starts - before


async def monitor(ctx, dut: NpuRegisters, bench: Bench) -> None:
    """Counts `start` and `soft_reset` pulses, which last one cycle and are easy to miss from the bench."""
    while True:
        _, _, start, soft = await ctx.tick().sample(dut.start, dut.soft_reset)
        bench.starts += start
        bench.soft_resets += soft


def sequencer_model(cycles: int, layers: int):
    """A sequencer that raises busy the cycle after `start`, runs `cycles` cycles, pulses done."""
    async def process(ctx, dut: NpuRegisters, bench: Bench) -> None:
        while True:
            _, _, start = await ctx.tick().sample(dut.start)
            if not start:
                continue
            ctx.set(dut.busy, 1)
            for i in range(cycles):
                ctx.set(dut.layer_done, i < layers)
                ctx.set(dut.mac_active, i % 2)
                await ctx.tick()
            ctx.set(dut.layer_done, 0)
            ctx.set(dut.mac_active, 0)
            ctx.set(dut.busy, 0)
            ctx.set(dut.done, 1)
            await ctx.tick()
            ctx.set(dut.done, 0)
    return process


def simulate(bench_fn, params: NpuParams = PARAMS, sequencer=None) -> None:
    dut = NpuRegisters(params)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    bench = Bench(None, dut)

    async def tb(ctx):
        bench.ctx = ctx
        await bench_fn(bench)

    sim.add_testbench(tb)
    async def mon(ctx):
        await monitor(ctx, dut, bench)

    sim.add_process(mon)
    if sequencer is not None:
        async def seq(ctx):
            await sequencer(ctx, dut, bench)
        sim.add_process(seq)
    sim.run()


def test_constant_registers_and_unmapped_offsets():
    async def bench(t: Bench):
        assert await t.rd("ID") == ID_VALUE
        assert await t.rd("VERSION") == VERSION_VALUE == 0x00010000
        for name, value in PARAMS.cfg_values.items():
            assert await t.rd(name) == value, name
        # read-only registers ignore writes, with OKAY
        await t.wr("ID", 0)
        await t.wr("CFG_TR", 99)
        assert await t.rd("ID") == ID_VALUE and await t.rd("CFG_TR") == 8
        # write-only registers read 0
        for reg in REGISTERS:
            if reg.access is Access.WO:
                assert await t.rd(reg.name) == 0, reg.name
        # unmapped: OKAY, reads 0, writes ignored; only bits [11:2] are decoded
        for off in (0x38, 0x3C, 0x50, 0x7C, 0xFFC):
            assert await t.axi.read_resp(t.ctx, off) == (0, 0)
            assert await t.axi.write(t.ctx, off, 0xFFFFFFFF) == 0
        assert await t.axi.read(t.ctx, 0x4000_1000 | REG["ID"].offset) == ID_VALUE
        assert await t.axi.read(t.ctx, REG["VERSION"].offset | 0x2) == VERSION_VALUE

    simulate(bench)


def test_rw_registers_masks_and_wstrb():
    async def bench(t: Bench):
        await t.wr("DESC_BASE", 0x8000_1240)
        await t.wr("DESC_COUNT", 0xABCD_0017)  # upper 16 bits do not exist
        await t.wr("BACTIVE", 3)
        await t.wr("IRQ_EN", 0xFFFF_FFFF)
        await t.wr("FBCB_ADDR", 0x1_0005)
        assert await t.rd("DESC_BASE") == 0x8000_1240
        assert await t.rd("DESC_COUNT") == 0x0017
        assert await t.rd("BACTIVE") == 3
        assert await t.rd("IRQ_EN") == 0b11
        assert await t.rd("FBCB_ADDR") == 5
        assert t.ctx.get(t.dut.desc_base) == 0x8000_1240 and t.ctx.get(t.dut.desc_count) == 0x17
        assert t.ctx.get(t.dut.bactive) == 3
        # byte strobes: only bytes 1 and 3 change
        await t.wr("DESC_BASE", 0x11223344, strb=0b1010)
        assert await t.rd("DESC_BASE") == 0x1100_3340
        # no strobe at all: nothing happens
        await t.wr("DESC_BASE", 0, strb=0)
        await t.wr("CTRL", START, strb=0)
        assert await t.rd("DESC_BASE") == 0x1100_3340 and (await t.status())[0] == 0

    simulate(bench)


def test_axi_channel_orders_and_backpressure():
    async def bench(t: Bench):
        # AW long before W, W long before AW, both together, slow B and R acceptance
        for i, (aw, w, b) in enumerate([(0, 5, 0), (6, 0, 0), (0, 0, 4), (3, 3, 7)]):
            value = 0x1000 * (i + 1) + i
            assert await t.axi.write(t.ctx, REG["DESC_BASE"].offset, value, aw_delay=aw, w_delay=w,
                                     b_delay=b) == 0
            assert await t.rd("DESC_BASE", r_delay=i * 2) == value
        # BVALID/RVALID stay up until accepted (checked by the master); reads back to back work
        assert [await t.rd("ID") for _ in range(3)] == [ID_VALUE] * 3

    simulate(bench)


def test_start_rules():
    async def bench(t: Bench):
        # Bactive 0 (reset value): refused
        assert await t.watch_start("CTRL", START) == 0
        assert await t.status() == (0, 0, 1, ErrorCode.BAD_BACTIVE)
        await t.wr("BACTIVE", PARAMS.bmax + 1)
        assert await t.watch_start("CTRL", START) == 0
        assert (await t.status())[3] == ErrorCode.BAD_BACTIVE
        # valid: exactly one pulse; it clears the old error, BUSY shows at once
        await t.wr("BACTIVE", PARAMS.bmax)
        assert await t.watch_start("CTRL", START) == 1
        assert await t.status() == (0, 0, 0, 0)  # the sequencer never raised busy here
        t.ctx.set(t.dut.busy, 1)
        assert await t.watch_start("CTRL", START) == 0
        assert await t.status() == (1, 0, 1, ErrorCode.START_WHILE_BUSY)
        # SOFT_RESET beats START in the same write, pulses soft_reset and clears STATUS
        t.ctx.set(t.dut.busy, 0)
        assert await t.watch_start("CTRL", START | SOFT_RESET) == 0
        assert t.soft_resets == 1
        assert (await t.status()) == (0, 0, 0, 0)

    simulate(bench)


def test_run_with_sequencer_model():
    """START, a second START right behind it (refused), then the run ends with DONE and an interrupt."""
    async def bench(t: Bench):
        await t.wr("BACTIVE", 2)
        await t.wr("DESC_COUNT", 3)
        await t.wr("IRQ_EN", 0b01)
        await t.wr("CTRL", START)
        await t.wr("CTRL", START)  # its W/AW arrive while the first run is starting
        assert (await t.status())[0:1] == (1,)
        assert t.starts == 1
        await t.ctx.tick().until(t.dut.irq)
        busy, done, error, code = await t.status()
        assert (busy, done, error, code) == (0, 1, 1, ErrorCode.START_WHILE_BUSY)
        assert await t.rd("LAYER") == 3 and await t.rd("CYC_LAYERS") == 3
        assert await t.rd("CYC_BUSY") == 20 and await t.rd("CYC_MAC") == 10
        assert t.starts == 1

    simulate(bench, sequencer=sequencer_model(cycles=20, layers=3))


def test_busy_from_the_start_cycle():
    """STATUS.BUSY is set in the cycle `start` pulses, before the sequencer's busy can follow."""
    async def bench(t: Bench):
        await t.wr("BACTIVE", 1)
        ctx, bus = t.ctx, t.dut.s_axi
        ctx.set(bus.awaddr, REG["CTRL"].offset)
        ctx.set(bus.wdata, START)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        await ctx.tick()  # AW and W held
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        await ctx.tick()  # the write: start pulses in the next cycle
        assert ctx.get(t.dut.start) == 1
        ctx.set(bus.araddr, REG["STATUS"].offset)
        ctx.set(bus.arvalid, 1)
        await ctx.tick()  # STATUS captured in the start cycle
        ctx.set(bus.arvalid, 0)
        assert ctx.get(bus.rvalid) == 1 and ctx.get(bus.rdata) & 1 == 1
        ctx.set(bus.bready, 1)
        ctx.set(bus.rready, 1)
        await ctx.tick()
        ctx.set(bus.bready, 0)
        ctx.set(bus.rready, 0)
        assert t.starts == 1

    simulate(bench)


def test_done_error_irq_and_w1c():
    async def bench(t: Bench):
        d = t.dut
        await t.wr("BACTIVE", 2)
        await t.wr("CTRL", START)
        t.ctx.set(d.busy, 1)
        await t.pulse(d.layer_done)
        await t.pulse(d.layer_done)
        assert await t.rd("LAYER") == 2
        t.ctx.set(d.busy, 0)
        await t.pulse(d.done)
        assert await t.status() == (0, 1, 0, 0)
        assert await t.rd("IRQ_STATUS") == 0b01
        assert t.ctx.get(d.irq) == 0  # not enabled
        await t.wr("IRQ_EN", 0b01)
        assert t.ctx.get(d.irq) == 1
        # a sequencer error
        t.ctx.set(d.error_code, ErrorCode.AXI_READ)
        await t.pulse(d.error)
        assert await t.status() == (0, 1, 1, ErrorCode.AXI_READ)
        assert await t.rd("IRQ_STATUS") == 0b11
        # W1C: writing 0 does nothing, writing 1 clears only that bit; unstrobed bytes count as 0
        await t.wr("IRQ_STATUS", 0)
        await t.wr("IRQ_STATUS", 0b11, strb=0b0010)
        assert await t.rd("IRQ_STATUS") == 0b11
        await t.wr("IRQ_STATUS", 0b01)
        assert await t.rd("IRQ_STATUS") == 0b10
        assert t.ctx.get(d.irq) == 0  # ERROR is latched but not enabled
        await t.wr("IRQ_EN", 0b10)
        assert t.ctx.get(d.irq) == 1
        await t.wr("IRQ_STATUS", 0b10)
        assert t.ctx.get(d.irq) == 0 and await t.rd("IRQ_STATUS") == 0
        # STATUS still records the error until the next accepted START, which also zeroes LAYER
        assert (await t.status())[2:] == (1, ErrorCode.AXI_READ)
        await t.wr("CTRL", START)
        assert await t.status() == (0, 0, 0, 0) and await t.rd("LAYER") == 0

    simulate(bench)


def test_event_in_clearing_cycle_is_not_lost():
    """A done pulse in the very cycle IRQ_STATUS.DONE is cleared leaves DONE set."""
    async def bench(t: Bench):
        d = t.dut
        await t.pulse(d.done)
        assert await t.rd("IRQ_STATUS") == 0b01
        # the write happens the cycle after AW and W are held; pulse done then
        ctx, bus = t.ctx, d.s_axi
        ctx.set(bus.awaddr, REG["IRQ_STATUS"].offset)
        ctx.set(bus.wdata, 0b01)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        ctx.set(bus.bready, 1)
        await ctx.tick()  # AW and W accepted
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        ctx.set(d.done, 1)  # the write takes effect at this edge
        await ctx.tick()
        ctx.set(d.done, 0)
        assert ctx.get(bus.bvalid) == 1
        await ctx.tick()
        ctx.set(bus.bready, 0)
        assert await t.rd("IRQ_STATUS") == 0b01

    simulate(bench)


def test_bactive_updates_and_errors():
    async def bench(t: Bench):
        await t.wr("BACTIVE", 4)
        await t.wr("BEXIT", 3)
        assert await t.rd("BACTIVE") == 1 and t.ctx.get(t.dut.bactive) == 1
        await t.wr("BINCR", 2)
        assert await t.rd("BACTIVE") == 3
        assert (await t.status())[2] == 0
        await t.wr("BEXIT", 4)  # more than active
        assert await t.rd("BACTIVE") == 3
        assert (await t.status())[2:] == (1, ErrorCode.BAD_BACTIVE_UPDATE)
        await t.wr("BINCR", 2)  # 5 > Bmax
        assert await t.rd("BACTIVE") == 3
        await t.wr("BINCR", 0xFFFF_FFFF)  # would wrap in 32 bits
        assert await t.rd("BACTIVE") == 3
        await t.wr("BEXIT", 3)
        assert await t.rd("BACTIVE") == 0
        await t.wr("BINCR", 4)
        assert await t.rd("BACTIVE") == 4
        # locked while busy
        t.ctx.set(t.dut.busy, 1)
        for name in ("BEXIT", "BINCR", "BACTIVE", "DESC_BASE", "DESC_COUNT"):
            await t.wr("IRQ_STATUS", 0b11)
            await t.wr(name, 1)
            assert (await t.status())[2:] == (1, ErrorCode.WRITE_WHILE_BUSY), name
            assert await t.rd("IRQ_STATUS") == 0b10
        assert await t.rd("BACTIVE") == 4 and await t.rd("DESC_BASE") == 0 and await t.rd("DESC_COUNT") == 0
        await t.wr("IRQ_EN", 0b11)  # allowed while busy
        assert await t.rd("IRQ_EN") == 0b11

    simulate(bench)


def test_bactive_random_sequence_matches_model():
    rng = random.Random(7)
    ops = [(rng.choice(["BEXIT", "BINCR", "BACTIVE"]), rng.randrange(0, 7)) for _ in range(40)]

    async def bench(t: Bench):
        model, bmax = 0, PARAMS.bmax
        for name, value in ops:
            await t.wr(name, value)
            if name == "BACTIVE":
                expect_err, model = False, value
            elif name == "BEXIT":
                expect_err = value > model
                model = model if expect_err else model - value
            else:
                expect_err = model + value > bmax
                model = model if expect_err else model + value
            assert await t.rd("BACTIVE") == model
            err = await t.rd("IRQ_STATUS") >> 1
            assert err == expect_err, (name, value, model)
            await t.wr("IRQ_STATUS", 0b10)

    simulate(bench)


def test_fbcb_write_and_sequencer_readback():
    init = tuple(encode_fbcb_entry(br, 1, PARAMS.bmax) for _ in range(PARAMS.layers)
                 for br in range(1, PARAMS.bmax + 1))
    params = NpuParams(**{**PARAMS.__dict__, "fbcb": init})

    async def read_entry(t: Bench, index: int) -> int:
        t.ctx.set(t.dut.fbcb_addr, index)
        await t.ctx.tick()
        return t.ctx.get(t.dut.fbcb_data)

    async def bench(t: Bench):
        bmax = params.bmax
        assert params.fbcb_width == 4
        # initial contents from the bundle
        for i in range(params.fbcb_depth):
            assert await read_entry(t, i) == init[i]
        # layer 1 rewritten through FBCB_ADDR / FBCB_DATA with auto-increment
        entries = [(1, 0), (2, 2), (2, 1), (4, 0)]
        await t.wr("FBCB_ADDR", 1 * bmax)
        for br, k in entries:
            await t.wr("FBCB_DATA", encode_fbcb_entry(br, k, bmax))
        assert await t.rd("FBCB_ADDR") == 2 * bmax
        for b, (br, k) in enumerate(entries, start=1):
            assert decode_fbcb_entry(await read_entry(t, bmax + b - 1), bmax) == (br, k)
        assert await read_entry(t, 0) == init[0] and await read_entry(t, 2 * bmax) == init[2 * bmax]
        # bits above the entry width are not stored
        await t.wr("FBCB_ADDR", 0)
        await t.wr("FBCB_DATA", 0xFFFF_FFF6)
        assert await read_entry(t, 0) == 0x6
        # past the table: refused, nothing written, pointer kept
        await t.wr("FBCB_ADDR", params.fbcb_depth)
        await t.wr("FBCB_DATA", 0x5)
        assert (await t.status())[2:] == (1, ErrorCode.FBCB_INDEX)
        assert await t.rd("FBCB_ADDR") == params.fbcb_depth
        # while busy: refused
        await t.wr("FBCB_ADDR", 3)
        t.ctx.set(t.dut.busy, 1)
        await t.wr("FBCB_DATA", 0x1)
        assert (await t.status())[3] == ErrorCode.WRITE_WHILE_BUSY
        assert await read_entry(t, 3) == init[3] and await t.rd("FBCB_ADDR") == 3

    simulate(bench, params)


def test_counters_and_clear():
    async def bench(t: Bench):
        d = t.dut
        pattern = [(1, 1, 0, 0), (1, 0, 1, 0), (1, 1, 0, 1), (0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 0, 0)]
        for busy, mac, stall, layer in pattern:
            for s, v in ((d.busy, busy), (d.mac_active, mac), (d.dma_stall, stall), (d.layer_done, layer)):
                t.ctx.set(s, v)
            await t.ctx.tick()
        for s in (d.busy, d.mac_active, d.dma_stall, d.layer_done):
            t.ctx.set(s, 0)
        sums = [sum(col) for col in zip(*pattern)]
        got = [await t.rd(n) for n in ("CYC_BUSY", "CYC_MAC", "CYC_DMA_STALL", "CYC_LAYERS")]
        assert got == sums == [4, 4, 2, 2]
        assert await t.rd("LAYER") == 2
        # SOFT_RESET keeps the counters but zeroes LAYER; CLEAR_COUNTERS zeroes them
        await t.wr("CTRL", SOFT_RESET)
        assert await t.rd("CYC_MAC") == 4 and await t.rd("LAYER") == 0
        t.ctx.set(d.busy, 1)
        await t.wr("CTRL", CLEAR)
        t.ctx.set(d.busy, 0)
        assert await t.rd("CYC_MAC") == 0 and await t.rd("CYC_LAYERS") == 0
        # busy kept counting for the cycles after the clear until the read
        assert 0 < await t.rd("CYC_BUSY") < 10

    simulate(bench)


def test_bmax_one_has_two_bit_entries():
    params = NpuParams(TR=2, TP=2, TC=2, bmax=1, layers=1, axi_dw=64, design_hash=1)

    async def bench(t: Bench):
        assert len(t.dut.fbcb_data) == 2
        await t.wr("FBCB_DATA", 2)
        t.ctx.set(t.dut.fbcb_addr, 0)
        await t.ctx.tick()
        assert t.ctx.get(t.dut.fbcb_data) == 2
        await t.wr("BACTIVE", 1)
        assert await t.watch_start("CTRL", START) == 1
        await t.wr("BINCR", 1)
        assert (await t.status())[2:] == (1, ErrorCode.BAD_BACTIVE_UPDATE)

    simulate(bench, params)
