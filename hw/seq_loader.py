"""The control unit's response loader (hw/sequencer.py).

It takes the DMA's two read streams, one per walker of the fetcher
(docs/hw-architecture.md, "Two walkers"), a response of each a cycle:
`rd_rsp` carries descriptor words (to the planner, `desc`), weight rows and
bias chunks (into `w_wr`, `b_wr`); `in_rsp` carries input rows (into `in_wr`;
a row that came in several runs is assembled first). Once both streams' last
responses of a step are in (each marks it with `step_last`), it hands the step
from the fetcher (`step`) to the core (`core_step`); a block's last step also
needs its staging half free, which it `claim`s on the `staging` port the
writer frees. A stream whose step is complete takes nothing more until the
step is handed over: its next response belongs to the next step's half.

Writes into the core go through one register stage per stream, so a response
can be taken in the very cycle the previous step is handed over: it lands in
the half the core releases in the next cycle (the cycle its write happens),
with no bubble per step.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.engine_core import buffer_write_signatures, step_signature
from fluidnpu.hw.seq_streams import (
    DESC_CMD_WORDS,
    KIND_BIAS,
    KIND_DESC,
    KIND_WEIGHT,
    desc_chunk_layout,
    read_rsp_layout,
    staging_signature,
    step_layout,
    tag_layout,
)


class SeqLoader(wiring.Component):
    """Routes read responses into the core and hands it each complete step; see the module docstring.

    Ports: `rd_rsp` (weight, bias and descriptor responses), `in_rsp` (input responses), `desc`
    (descriptor words to the planner, always taken), `step` (steps from the fetcher),
    `in_wr`/`w_wr`/`b_wr`/`core_step` and `released` (the core's), `staging` (to the writer) and
    `idle` (no step handed to the core is unreleased).
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, nmax: int) -> None:
        self.TR, self.TP, self.TC, self.NB, self.nmax = TR, TP, TC, NB, nmax
        self.tag = tag_layout(NB, TR, TP, TC, nmax)
        super().__init__({
            "rd_rsp": In(stream.Signature(read_rsp_layout(self.tag, nmax))),
            "in_rsp": In(stream.Signature(read_rsp_layout(self.tag, nmax))),
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
        lhalf = Signal()
        w_got, in_got = Signal(), Signal()        # the stream's last response of the step is in
        issued = Signal()
        steps_out = Signal(range(8))
        m.d.comb += [self.rd_rsp.ready.eq(~w_got | issued), self.in_rsp.ready.eq(~in_got | issued)]

        # weights, bias and descriptor words; a response taken while the previous step is handed
        # over belongs to the other half
        wtag, wdata = self.rd_rsp.payload.tag, self.rd_rsp.payload.data
        take_w = self.rd_rsp.valid & self.rd_rsp.ready
        ld_w, ld_b, w_half = Signal(), Signal(), Signal()
        w_lane, w_q, w_idx = Signal.like(wtag.lane), Signal.like(wtag.q), Signal.like(wtag.idx)
        w_data = Signal(16 * max(nmax, 2 * TC))
        m.d.sync += [ld_w.eq(take_w & (wtag.kind == KIND_WEIGHT)), ld_b.eq(take_w & (wtag.kind == KIND_BIAS))]
        with m.If(take_w):
            m.d.sync += [w_half.eq(lhalf ^ issued), w_lane.eq(wtag.lane), w_q.eq(wtag.q), w_idx.eq(wtag.idx),
                         w_data.eq(wdata)]
        m.d.comb += [self.w_wr.valid.eq(ld_w), self.w_wr.wb.eq(w_half), self.w_wr.lane.eq(w_lane),
                     self.w_wr.q.eq(w_q), self.w_wr.data.eq(w_data[:16 * 2 * TC]),
                     self.b_wr.valid.eq(ld_b), self.b_wr.wb.eq(w_half), self.b_wr.base.eq(w_idx),
                     self.b_wr.q.eq(w_q), self.b_wr.data.eq(w_data[:16 * nmax])]
        m.d.comb += [self.desc.valid.eq(take_w & (wtag.kind == KIND_DESC)), self.desc.payload.idx.eq(wtag.idx),
                     self.desc.payload.data.eq(wdata[:16 * DESC_CMD_WORDS])]

        # input rows, assembled run by run
        itag, idata = self.in_rsp.payload.tag, self.in_rsp.payload.data
        take_in = self.in_rsp.valid & self.in_rsp.ready
        row = Signal(16 * 2 * TP)
        placed = Signal(16 * 2 * TP)
        m.d.comb += placed.eq(row | (idata << (itag.lane * 16))[:16 * 2 * TP])
        ld_in, in_half = Signal(), Signal()
        in_q, in_idx, in_data = Signal.like(itag.q), Signal.like(itag.idx), Signal(16 * 2 * TP)
        m.d.sync += ld_in.eq(take_in & itag.row_last)
        with m.If(take_in):
            m.d.sync += [in_half.eq(lhalf ^ issued), in_q.eq(itag.q), in_idx.eq(itag.idx), in_data.eq(placed),
                         row.eq(Mux(itag.row_last, 0, placed))]
        m.d.comb += [self.in_wr.valid.eq(ld_in), self.in_wr.ib.eq(in_half), self.in_wr.q.eq(in_q),
                     self.in_wr.j.eq(in_idx), self.in_wr.data.eq(in_data)]

        # hand the step to the core (a block's last step also needs its staging half drained)
        st = self.step.payload
        can = w_got & in_got & self.step.valid & (~st.last | self.staging.free.bit_select(st.sb, 1))
        cs = self.core_step
        m.d.comb += [cs.valid.eq(can), cs.ib.eq(lhalf), cs.wb.eq(lhalf), cs.t.eq(st.t), cs.first.eq(st.first),
                     cs.last.eq(st.last), cs.sb.eq(st.sb)]
        m.d.comb += issued.eq(can & cs.ready)
        with m.If(issued):
            m.d.comb += self.step.ready.eq(1)
            m.d.sync += [w_got.eq(0), in_got.eq(0), lhalf.eq(~lhalf)]
        with m.If(take_w & wtag.step_last):
            m.d.sync += w_got.eq(1)
        with m.If(take_in & itag.step_last):
            m.d.sync += in_got.eq(1)
        m.d.comb += self.staging.claim.eq(Mux(issued & st.last, Mux(st.sb, 0b10, 0b01), 0))
        m.d.sync += steps_out.eq(steps_out + issued - self.released)
        m.d.comb += self.idle.eq(steps_out == 0)
        return m
