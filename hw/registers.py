"""The NPU's AXI4-Lite register block, the FBCB memory, and the sequencer's view of both.

Every register, offset and error code comes from `hw/regmap.py`, so the driver
and this block cannot disagree; the policies (unmapped offsets, WSTRB, writes
while busy, error precedence) are documented there and in
`docs/register-map.md`.

AXI4-Lite: AW and W are accepted independently (each has a one-entry holding
register); the write happens once both are held and the previous B response
was taken, so one write is outstanding at a time. Reads answer one cycle after
the AR handshake and hold RDATA until RREADY. Responses are always OKAY.

Sequencer contract: `start` and `soft_reset` are one-cycle pulses. The
sequencer raises `busy` the cycle after `start` (the block treats the `start`
cycle itself as busy, so a second START cannot slip in between), pulses `done`
when the run ends, and reports a failure by pulsing `error` with `error_code`
(an ErrorCode). `desc_base`, `desc_count`, `bactive` and the FBCB contents
cannot change while `busy`. The FBCB read port is synchronous: `fbcb_data` is
the entry at the `fbcb_addr` of the previous cycle.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal, Value, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.axi import AXI_RESP_OKAY, axi_lite_signature
from fluidnpu.hw.regmap import BUSY_LOCKED, ID_VALUE, REG, REGISTERS, VERSION_VALUE, Access, ErrorCode, NpuParams


class NpuRegisters(wiring.Component):
    """AXI4-Lite slave `s_axi` with the NPU's registers, the FBCB memory and `irq`.

    Ports (besides `s_axi` and `irq`), from the sequencer's point of view:

    * out `start`, `soft_reset`: pulses.
    * out `desc_base` (32), `desc_count` (16), `bactive` (range(Bmax+1)): the run's configuration.
    * in `busy`, `done` (pulse), `error` (pulse) + `error_code` (8): run state.
    * in `mac_active`, `dma_stall`, `layer_done`: per-cycle strobes for the counters and LAYER.
    * in `fbcb_addr` (range(L*Bmax)) -> out `fbcb_data` (entry bits) one cycle later.
    """

    def __init__(self, params: NpuParams) -> None:
        self.params = params
        super().__init__({
            "s_axi": Out(axi_lite_signature(32, 32).flip()),
            "irq": Out(1),
            "start": Out(1),
            "soft_reset": Out(1),
            "desc_base": Out(32),
            "desc_count": Out(REG["DESC_COUNT"].field("COUNT").width),
            "bactive": Out(range(params.bmax + 1)),
            "busy": In(1),
            "done": In(1),
            "error": In(1),
            "error_code": In(REG["STATUS"].field("ERROR_CODE").width),
            "mac_active": In(1),
            "dma_stall": In(1),
            "layer_done": In(1),
            "fbcb_addr": In(range(params.fbcb_depth)),
            "fbcb_data": Out(params.fbcb_width),
        })

    def elaborate(self, platform) -> Module:
        p = self.params
        m = Module()
        bus = self.s_axi

        # ---- AXI4-Lite write channels: AW and W held independently ----
        aw_full, w_full, bvalid = Signal(), Signal(), Signal()
        aw_word = Signal(10)  # byte address bits [11:2]
        w_data, w_strb = Signal(32), Signal(4)
        m.d.comb += [bus.awready.eq(~aw_full), bus.wready.eq(~w_full),
                     bus.bvalid.eq(bvalid), bus.bresp.eq(AXI_RESP_OKAY)]
        with m.If(bus.awvalid & ~aw_full):
            m.d.sync += [aw_full.eq(1), aw_word.eq(bus.awaddr[2:12])]
        with m.If(bus.wvalid & ~w_full):
            m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]
        do_write = Signal()
        m.d.comb += do_write.eq(aw_full & w_full & ~bvalid)
        with m.If(do_write):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), bvalid.eq(1)]
        with m.Elif(bvalid & bus.bready):
            m.d.sync += bvalid.eq(0)

        byte_mask = Signal(32)
        m.d.comb += byte_mask.eq(Cat(*(w_strb[i].replicate(8) for i in range(4))))
        wval = Signal(32)  # action registers: unstrobed bytes read as 0
        m.d.comb += wval.eq(w_data & byte_mask)
        we = {}
        for reg in REGISTERS:
            if reg.access is not Access.RO:
                we[reg.name] = Signal(name=f"we_{reg.name.lower()}")
                m.d.comb += we[reg.name].eq(do_write & w_strb.any() & (aw_word == reg.offset >> 2))

        def merged(old: Signal) -> Value:
            """RW write: strobed bytes from WDATA, the others kept."""
            width = len(old)
            return ((old & ~byte_mask[:width]) | (w_data[:width] & byte_mask[:width]))[:width]

        # ---- state ----
        start_o, soft_o = Signal(), Signal()
        irq_en, irq_st = Signal(2), Signal(2)
        st_done, st_error = Signal(), Signal()
        err_code = Signal(len(self.error_code))
        desc_base, desc_count = Signal(32), Signal(len(self.desc_count))
        bactive = Signal(32)
        fbcb_ptr = Signal(REG["FBCB_ADDR"].field("INDEX").width)
        layer_cnt = Signal(REG["LAYER"].field("COUNT").width)
        cyc_busy, cyc_mac, cyc_stall, cyc_layers = (Signal(32, name=n) for n in
                                                   ("cyc_busy", "cyc_mac", "cyc_stall", "cyc_layers"))
        running = Signal()
        m.d.comb += [running.eq(self.busy | start_o),
                     self.start.eq(start_o), self.soft_reset.eq(soft_o),
                     self.desc_base.eq(desc_base), self.desc_count.eq(desc_count),
                     self.bactive.eq(bactive[:len(self.bactive)]),
                     self.irq.eq((irq_st & irq_en).any())]

        # ---- FBCB memory: written from FBCB_DATA, read by the sequencer ----
        m.submodules.fbcb = fbcb = Memory(shape=unsigned(p.fbcb_width), depth=p.fbcb_depth, init=list(p.fbcb))
        wp = fbcb.write_port()
        rp = fbcb.read_port(domain="sync")
        m.d.comb += [rp.addr.eq(self.fbcb_addr), self.fbcb_data.eq(rp.data),
                     wp.addr.eq(fbcb_ptr), wp.data.eq(wval[:p.fbcb_width])]

        # ---- register writes ----
        reg_err = Signal()
        reg_err_code = Signal(len(err_code))
        start_accept = Signal()
        clear_counters = Signal()

        def refuse(code: ErrorCode) -> list:
            return [reg_err.eq(1), reg_err_code.eq(code)]

        m.d.sync += [start_o.eq(0), soft_o.eq(0)]
        ctrl = REG["CTRL"]
        with m.If(we["CTRL"]):
            with m.If(wval[ctrl.field("SOFT_RESET").lsb]):
                m.d.sync += soft_o.eq(1)
            with m.Elif(wval[ctrl.field("START").lsb]):
                with m.If(running):
                    m.d.comb += refuse(ErrorCode.START_WHILE_BUSY)
                with m.Elif((bactive == 0) | (bactive > p.bmax)):
                    m.d.comb += refuse(ErrorCode.BAD_BACTIVE)
                with m.Else():
                    m.d.comb += start_accept.eq(1)
                    m.d.sync += start_o.eq(1)
            m.d.comb += clear_counters.eq(wval[ctrl.field("CLEAR_COUNTERS").lsb])

        with m.If(we["IRQ_EN"]):
            m.d.sync += irq_en.eq(merged(irq_en))

        locked = {name: we[name] & running for name in BUSY_LOCKED}
        with m.If(Cat(*locked.values()).any()):
            m.d.comb += refuse(ErrorCode.WRITE_WHILE_BUSY)
        with m.If(we["DESC_BASE"] & ~running):
            m.d.sync += desc_base.eq(merged(desc_base))
        with m.If(we["DESC_COUNT"] & ~running):
            m.d.sync += desc_count.eq(merged(desc_count))
        with m.If(we["BACTIVE"] & ~running):
            m.d.sync += bactive.eq(merged(bactive))
        with m.If(we["BEXIT"] & ~running):
            with m.If(wval > bactive):
                m.d.comb += refuse(ErrorCode.BAD_BACTIVE_UPDATE)
            with m.Else():
                m.d.sync += bactive.eq(bactive - wval)
        with m.If(we["BINCR"] & ~running):
            total = Signal(33)
            m.d.comb += total.eq(bactive + wval)
            with m.If(total > p.bmax):
                m.d.comb += refuse(ErrorCode.BAD_BACTIVE_UPDATE)
            with m.Else():
                m.d.sync += bactive.eq(total)
        with m.If(we["FBCB_ADDR"]):
            m.d.sync += fbcb_ptr.eq(merged(fbcb_ptr))
        with m.If(we["FBCB_DATA"] & ~running):
            with m.If(fbcb_ptr >= p.fbcb_depth):
                m.d.comb += refuse(ErrorCode.FBCB_INDEX)
            with m.Else():
                m.d.comb += wp.en.eq(1)
                m.d.sync += fbcb_ptr.eq(fbcb_ptr + 1)

        # ---- status, interrupts, LAYER: later statements take precedence ----
        with m.If(we["IRQ_STATUS"]):
            m.d.sync += irq_st.eq(irq_st & ~wval[:2])
        done_bit = REG["IRQ_STATUS"].field("DONE").lsb
        error_bit = REG["IRQ_STATUS"].field("ERROR").lsb
        with m.If(self.layer_done):
            m.d.sync += layer_cnt.eq(layer_cnt + 1)
        with m.If(reg_err):
            m.d.sync += [st_error.eq(1), err_code.eq(reg_err_code), irq_st[error_bit].eq(1)]
        with m.If(self.error):  # the sequencer's error wins over a register error in the same cycle
            m.d.sync += [st_error.eq(1), err_code.eq(self.error_code), irq_st[error_bit].eq(1)]
        with m.If(self.done):
            m.d.sync += [st_done.eq(1), irq_st[done_bit].eq(1)]
        with m.If(start_accept):  # a done/error of the previous run in this cycle belongs to that run
            m.d.sync += [st_done.eq(0), st_error.eq(0), err_code.eq(0), layer_cnt.eq(0)]
        with m.If(soft_o):
            m.d.sync += [st_done.eq(0), st_error.eq(0), err_code.eq(0), layer_cnt.eq(0), irq_st.eq(0)]

        # ---- performance counters ----
        for counter, strobe in ((cyc_busy, self.busy), (cyc_mac, self.mac_active),
                                (cyc_stall, self.dma_stall), (cyc_layers, self.layer_done)):
            with m.If(clear_counters):
                m.d.sync += counter.eq(0)
            with m.Elif(strobe):
                m.d.sync += counter.eq(counter + 1)

        # ---- reads ----
        status = REG["STATUS"]
        ec = status.field("ERROR_CODE")
        status_word = Signal(32)
        m.d.comb += [status_word[status.field("BUSY").lsb].eq(running),
                     status_word[status.field("DONE").lsb].eq(st_done),
                     status_word[status.field("ERROR").lsb].eq(st_error),
                     status_word[ec.lsb:ec.lsb + len(err_code)].eq(err_code)]
        readable = {
            "ID": Const(ID_VALUE, 32), "VERSION": Const(VERSION_VALUE, 32), "IRQ_EN": irq_en,
            "STATUS": status_word, "IRQ_STATUS": irq_st, "DESC_BASE": desc_base, "DESC_COUNT": desc_count,
            "BACTIVE": bactive, "FBCB_ADDR": fbcb_ptr, "LAYER": layer_cnt, "CYC_BUSY": cyc_busy,
            "CYC_MAC": cyc_mac, "CYC_DMA_STALL": cyc_stall, "CYC_LAYERS": cyc_layers,
            **{name: Const(v, 32) for name, v in p.cfg_values.items()},
        }
        expected = {r.name for r in REGISTERS if r.access is not Access.WO}
        assert set(readable) == expected, set(readable) ^ expected
        rvalid, rdata = Signal(), Signal(32)
        m.d.comb += [bus.arready.eq(~rvalid), bus.rvalid.eq(rvalid), bus.rdata.eq(rdata),
                     bus.rresp.eq(AXI_RESP_OKAY)]
        with m.If(bus.arvalid & ~rvalid):
            m.d.sync += rvalid.eq(1)
            with m.Switch(bus.araddr[2:12]):
                for name, value in readable.items():
                    with m.Case(REG[name].offset >> 2):
                        m.d.sync += rdata.eq(value)
                with m.Default():
                    m.d.sync += rdata.eq(0)
        with m.Elif(rvalid & bus.rready):
            m.d.sync += rvalid.eq(0)
        return m
