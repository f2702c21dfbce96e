"""The control unit's response loader (hw/sequencer.py).

It routes DMA read responses (`rd_rsp`) by their tag: descriptor words to the
planner (`desc`), weight rows, bias chunks and input rows into the core's
double buffers (`in_wr`, `w_wr`, `b_wr`; an input row that came in several
runs is assembled first). Once a step's last response is in, it hands the
step from the fetcher (`step`) to the core (`core_step`); a block's last step
also needs its staging half free, which it `claim`s on the `staging` port the
writer frees.

Writes into the core go through one register stage, so a response can be
taken in the very cycle the previous step is handed over: it lands in the half
the core releases in the next cycle (the cycle its write happens), with no
bubble per step.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.engine_core import buffer_write_signatures, step_signature
from fluidnpu.hw.seq_streams import (DESC_CMD_WORDS, KIND_BIAS, KIND_DESC, KIND_INPUT, KIND_WEIGHT,
                                     desc_chunk_layout, read_rsp_layout, staging_signature, step_layout,
                                     tag_layout)


class SeqLoader(wiring.Component):
    """Routes read responses into the core and hands it each complete step; see the module docstring.

    Ports: `rd_rsp` (stream of read responses), `desc` (descriptor words to the planner, always
    taken), `step` (steps from the fetcher), `in_wr`/`w_wr`/`b_wr`/`core_step` and `released`
    (the core's), `staging` (to the writer) and `idle` (no step handed to the core is unreleased).
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, nmax: int) -> None:
        self.TR, self.TP, self.TC, self.NB, self.nmax = TR, TP, TC, NB, nmax
        self.tag = tag_layout(NB, TR, TP, TC, nmax)
        super().__init__({
            "rd_rsp": In(stream.Signature(read_rsp_layout(self.tag, nmax))),
            "desc": Out(stream.Signature(desc_chunk_layout(), always_ready=True)),
            "step": In(stream.Signature(step_layout(TR))),
            **{name: Out(sig) for name, sig in buffer_write_signatures(TR, TP, TC, NB, nmax).items()},
            "core_step": Out(step_signature(TR)), "released": In(1),
            "staging": Out(staging_signature()),
            "idle": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        TP, TC, nmax = self.TP, self.TC, self.nmax
        rtag = self.rd_rsp.payload.tag
        rdata = self.rd_rsp.payload.data
        lhalf = Signal()
        pending = Signal()
        issued = Signal()
        steps_out = Signal(range(8))
        row = Signal(16 * 2 * TP)
        placed = Signal(16 * 2 * TP)
        m.d.comb += placed.eq(row | (rdata << (rtag.lane * 16))[:16 * 2 * TP])

        m.d.comb += self.rd_rsp.ready.eq(~pending | issued)
        take = self.rd_rsp.valid & (~pending | issued)
        # the registered write port
        dw = 16 * max(nmax, 2 * TP)
        ld_in, ld_w, ld_b = Signal(), Signal(), Signal()
        ld_half = Signal()
        ld_lane = Signal.like(rtag.lane)
        ld_q = Signal.like(rtag.q)
        ld_idx = Signal.like(rtag.idx)
        ld_data = Signal(dw)
        m.d.sync += [ld_in.eq(0), ld_w.eq(0), ld_b.eq(0)]
        m.d.comb += [self.w_wr.valid.eq(ld_w), self.w_wr.wb.eq(ld_half), self.w_wr.lane.eq(ld_lane),
                     self.w_wr.q.eq(ld_q), self.b_wr.q.eq(ld_q),
                     self.w_wr.data.eq(ld_data[:16 * 2 * TC]),
                     self.b_wr.valid.eq(ld_b), self.b_wr.wb.eq(ld_half), self.b_wr.base.eq(ld_idx),
                     self.b_wr.data.eq(ld_data[:16 * nmax]),
                     self.in_wr.valid.eq(ld_in), self.in_wr.ib.eq(ld_half), self.in_wr.q.eq(ld_q),
                     self.in_wr.j.eq(ld_idx), self.in_wr.data.eq(ld_data[:16 * 2 * TP])]
        m.d.comb += [self.desc.valid.eq(take & (rtag.kind == KIND_DESC)), self.desc.payload.idx.eq(rtag.idx),
                     self.desc.payload.data.eq(rdata[:16 * DESC_CMD_WORDS])]
        with m.If(take):
            # a response taken while the previous step is handed over belongs to the other half
            m.d.sync += [ld_half.eq(lhalf ^ issued), ld_lane.eq(rtag.lane), ld_q.eq(rtag.q), ld_idx.eq(rtag.idx),
                         ld_data.eq(Mux(rtag.kind == KIND_INPUT, placed, rdata))]
            with m.Switch(rtag.kind):
                with m.Case(KIND_WEIGHT):
                    m.d.sync += ld_w.eq(1)
                with m.Case(KIND_BIAS):
                    m.d.sync += ld_b.eq(1)
                with m.Case(KIND_INPUT):
                    with m.If(rtag.row_last):
                        m.d.sync += [ld_in.eq(1), row.eq(0)]
                    with m.Else():
                        m.d.sync += row.eq(placed)

        # hand the step to the core (a block's last step also needs its staging half drained)
        st = self.step.payload
        can = pending & self.step.valid & (~st.last | self.staging.free.bit_select(st.sb, 1))
        cs = self.core_step
        m.d.comb += [cs.valid.eq(can), cs.ib.eq(lhalf), cs.wb.eq(lhalf), cs.t.eq(st.t), cs.first.eq(st.first),
                     cs.last.eq(st.last), cs.sb.eq(st.sb)]
        m.d.comb += issued.eq(can & cs.ready)
        with m.If(issued):
            m.d.comb += self.step.ready.eq(1)
            m.d.sync += [pending.eq(0), lhalf.eq(~lhalf)]
        with m.If(take & rtag.step_last):
            m.d.sync += pending.eq(1)
        m.d.comb += self.staging.claim.eq(Mux(issued & st.last, Mux(st.sb, 0b10, 0b01), 0))
        m.d.sync += steps_out.eq(steps_out + issued - self.released)
        m.d.comb += self.idle.eq(steps_out == 0)
        return m
