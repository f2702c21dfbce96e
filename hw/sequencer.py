"""The Control Unit: runs a subnet's layers on the EngineCore through the DMA.

Four machines, each a Component of its own, joined by typed streams
(hw/seq_streams.py; docs/hw-architecture.md, "Control unit"):

* the planner (hw/seq_planner.py) runs the layer loop: per layer it reads the
  descriptor, looks up the layer's <BR, k> in the FBCB for the current
  Bactive and plans the passes and balanced row blocks exactly as
  docs/interpretations.md defines them (the same plan dse/perf_model.py
  prices), then lets the other three run the layer until they have drained;
* the fetcher (hw/seq_fetcher.py) walks passes -> row blocks -> column tiles ->
  weight steps and issues DMA reads for each step's weights (+ the block's
  bias) and its input rows (im2col runs straight from the previous layer's
  HWC tensor) into the free half of the double buffers;
* the loader (hw/seq_loader.py) routes DMA responses into the core's buffers
  (and the descriptor's words to the planner) and, once a step's data is
  complete, hands the step to the core;
* the writer (hw/seq_writer.py) drains each finished block from staging to
  memory.

Everything the sequencer would need a multiplier for is precomputed by the
host into the descriptor (hw/descriptor.py) or built by repeated addition.
With `input_buffer` words a half it also holds the block input buffer (hw/buffered_input.py), which
answers the input runs of a layer its FBCB entry marks buffered from chip memory in place of the DMA's
input stream and takes that stream for its fills. This module only instantiates and connects them, with a register slice
(hw/stream_slice.py) on each stream to and from the DMA, so that no path runs
from the control unit's logic into the DMA's or back (the timing proxy,
docs/resources.md).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.buffered_input import BufferedInput
from fluidnpu.hw.engine_core import buffer_write_signatures, step_signature
from fluidnpu.hw.seq_fetcher import SeqFetcher
from fluidnpu.hw.seq_loader import SeqLoader
from fluidnpu.hw.seq_planner import SeqPlanner
from fluidnpu.hw.seq_streams import ADDR, register_ports, store_control_params
from fluidnpu.hw.seq_writer import SeqWriter
from fluidnpu.hw.stream_slice import OrderedPair, StreamSlice


class Sequencer(wiring.Component):
    """The NPU's control unit; see the module docstring and docs/hw-architecture.md.

    Its ports face the register block (`start` .. `dma_stall`), the DMA (`rd_cmd_*`,
    `rd_rsp_*`, `wr_*`: hw/npu.py gates them while a soft reset flushes the DMA) and the
    EngineCore (`cfg_*`, the buffer writes `in_wr`/`w_wr`/`b_wr`, `step`, the staging read
    port; the grouped ones have the core's own signatures, so hw/npu.py connects them with
    `wiring.connect`).
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, bmax: int, layers: int, nmax: int,
                 stackable: bool = True, input_buffer: int = 0) -> None:
        store_control_params(self, TR=TR, TP=TP, TC=TC, NB=NB, bmax=bmax, layers=layers, nmax=nmax,
                             stackable=stackable)
        self.input_buffer = input_buffer        # words a half of the block input buffer; 0: none
        super().__init__({
            # registers
            **register_ports(bmax, layers, input_buffer > 0),
            # DMA read
            "rd_cmd_valid": Out(1), "rd_cmd_ready": In(1), "rd_cmd_addr": Out(ADDR),
            "rd_cmd_nwords": Out(range(nmax + 1)), "rd_cmd_zero": Out(1), "rd_cmd_tag": Out(self.tag),
            "rd_rsp_valid": In(1), "rd_rsp_ready": Out(1), "rd_rsp_data": In(16 * nmax),
            "rd_rsp_tag": In(self.tag), "rd_error": In(1), "rd_restart": Out(1),
            # the DMA's second read stream: the input walker's (docs/hw-architecture.md, "Two walkers")
            "in_cmd_valid": Out(1), "in_cmd_ready": In(1), "in_cmd_addr": Out(ADDR),
            "in_cmd_nwords": Out(range(nmax + 1)), "in_cmd_zero": Out(1), "in_cmd_tag": Out(self.tag),
            "in_rsp_valid": In(1), "in_rsp_ready": Out(1), "in_rsp_data": In(16 * nmax), "in_rsp_tag": In(self.tag),
            # DMA write
            "wr_valid": Out(1), "wr_ready": In(1), "wr_addr": Out(ADDR),
            "wr_nwords": Out(range(nmax + 1)), "wr_data": Out(16 * nmax),
            "wr_idle": In(1), "wr_error": In(1),
            # EngineCore
            "cfg_k": Out(2), "cfg_g": Out(range(NB + 1)), "cfg_cw": Out(range(2 * TC + 1)),
            "cfg_shift": Out(5), "cfg_relu": Out(1),
            **{name: Out(sig) for name, sig in buffer_write_signatures(TR, TP, TC, NB, nmax).items()},
            "step": Out(step_signature(TR)),
            "released": In(1), "block_done": In(1),
            "st_sb": Out(1), "st_j": Out(range(TR)), "st_data": In(16 * 2 * TC),
            "mac_active": In(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        TR, TP, TC, NB, bmax, nmax = self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax
        buffer = self.input_buffer > 0
        m.submodules.planner = planner = SeqPlanner(TR=TR, TP=TP, TC=TC, NB=NB, bmax=bmax, layers=self.layers,
                                                    nmax=nmax, stackable=self.stackable, buffer=buffer)
        m.submodules.fetcher = fetcher = SeqFetcher(TR=TR, TP=TP, TC=TC, NB=NB, bmax=bmax, nmax=nmax, buffer=buffer)
        m.submodules.loader = loader = SeqLoader(TR=TR, TP=TP, TC=TC, NB=NB, nmax=nmax)
        m.submodules.writer = writer = SeqWriter(TR=TR, TP=TP, TC=TC, NB=NB, bmax=bmax, nmax=nmax)

        # planner <-> registers, core configuration
        m.d.comb += [planner.start.eq(self.start), planner.desc_base.eq(self.desc_base),
                     planner.desc_count.eq(self.desc_count), planner.bactive.eq(self.bactive),
                     self.fbcb_addr.eq(planner.fbcb_addr), planner.fbcb_data.eq(self.fbcb_data),
                     self.busy.eq(planner.busy), self.done.eq(planner.done), self.error.eq(planner.error),
                     self.error_code.eq(planner.error_code), self.layer_done.eq(planner.layer_done),
                     self.dma_stall.eq(planner.dma_stall), planner.mac_active.eq(self.mac_active),
                     planner.rd_error.eq(self.rd_error), planner.wr_error.eq(self.wr_error),
                     self.cfg_k.eq(planner.cfg_k), self.cfg_cw.eq(planner.cfg_cw),
                     self.cfg_shift.eq(planner.cfg_shift), self.cfg_relu.eq(planner.cfg_relu),
                     self.cfg_g.eq(fetcher.cfg_g)]

        # the plan and the layer's start go to the fetcher and writer
        m.d.comb += [fetcher.plan.eq(planner.plan), writer.plan.eq(planner.plan), fetcher.go.eq(planner.go),
                     self.rd_restart.eq(planner.go)]     # every read of the layer before is answered
        wiring.connect(m, fetcher.step, loader.step)
        wiring.connect(m, fetcher.block, writer.block)
        wiring.connect(m, loader.desc, planner.desc_rsp)
        wiring.connect(m, loader.staging, writer.staging)
        m.d.comb += fetcher.core_idle.eq(loader.idle)

        # two read command streams: the planner's descriptor reads (only between layers), else the
        # weight walker's, and the input walker's, through one fully registered slice that keeps
        # them in one order (`OrderedPair`): the fetcher's im2col run ends at a register, not in the
        # DMA's deal (+1 cycle on every read's trip; hw/stream_slice.py), and the DMA sees a read
        # only once every read taken in an earlier cycle has left, so it deals a step's reads before
        # the next step's, which the loader's in-order streams rely on (docs/hw-architecture.md, "Two
        # walkers"); reads taken in one cycle are of one step
        m.submodules.rd_pair = rd_pair = OrderedPair(fetcher.rd_cmd.payload.shape(), fetcher.in_cmd.payload.shape())
        desc = planner.desc_cmd.valid
        m.d.comb += [rd_pair.i0.payload.eq(Mux(desc, planner.desc_cmd.payload, fetcher.rd_cmd.payload)),
                     rd_pair.i0.valid.eq(desc | fetcher.rd_cmd.valid),
                     planner.desc_cmd.ready.eq(rd_pair.i0.ready),
                     fetcher.rd_cmd.ready.eq(rd_pair.i0.ready & ~desc)]
        if buffer:
            m.submodules.buffered = bi = BufferedInput(TR=TR, TP=TP, bmax=bmax, nmax=nmax, depth=self.input_buffer,
                                                       tag=self.tag)
            on = planner.buf_on        # the layer's input runs go to the buffer, its fills to the DMA
            d = planner.plan.desc
            g = bi.geom
            m.d.comb += [fetcher.buffered.eq(on), fetcher.fill_issued.eq(bi.fill_issued),
                         planner.buf_overflow.eq(bi.overflow),
                         g.out_w.eq(d.out_w), g.out_h.eq(d.out_h), g.in_h.eq(d.in_h), g.sh.eq(d.sh),
                         g.span.eq(d.kh - 1), g.iy_top.eq(-d.ph), g.row_words.eq(planner.buf_desc.in_row_words),
                         g.sample_bytes.eq(d.src_sample_stride)]
            wiring.connect(m, fetcher.fill_block, bi.block)
            run = bi.run.payload
            m.d.comb += [run.cmd.eq(fetcher.in_cmd.payload), run.half.eq(fetcher.in_ctx.half),
                         run.sample.eq(fetcher.in_ctx.sample), run.last.eq(fetcher.in_ctx.last),
                         bi.run.valid.eq(on & fetcher.in_cmd.valid),
                         rd_pair.i1.valid.eq(Mux(on, bi.rd.valid, fetcher.in_cmd.valid)),
                         rd_pair.i1.payload.eq(Mux(on, bi.rd.payload, fetcher.in_cmd.payload)),
                         bi.rd.ready.eq(on & rd_pair.i1.ready),
                         fetcher.in_cmd.ready.eq(Mux(on, bi.run.ready, rd_pair.i1.ready))]
        else:
            wiring.connect(m, fetcher.in_cmd, rd_pair.i1)
        cmd = rd_pair.o0.payload
        m.d.comb += [self.rd_cmd_valid.eq(rd_pair.o0.valid), rd_pair.o0.ready.eq(self.rd_cmd_ready),
                     self.rd_cmd_addr.eq(cmd.addr), self.rd_cmd_nwords.eq(cmd.nwords),
                     self.rd_cmd_zero.eq(cmd.zero), self.rd_cmd_tag.eq(cmd.tag)]
        icmd = rd_pair.o1.payload
        m.d.comb += [self.in_cmd_valid.eq(rd_pair.o1.valid), rd_pair.o1.ready.eq(self.in_cmd_ready),
                     self.in_cmd_addr.eq(icmd.addr), self.in_cmd_nwords.eq(icmd.nwords),
                     self.in_cmd_zero.eq(icmd.zero), self.in_cmd_tag.eq(icmd.tag)]
        # responses to the loader through skid buffers: rd_rsp_ready and in_rsp_ready (the DMA's merge)
        # are registers, not the end of the core's step hand-over logic; no latency at full rate
        m.submodules.rsp_slice = rsp_slice = StreamSlice(loader.rd_rsp.payload.shape(), forward=False,
                                                         backward=True)
        m.d.comb += [rsp_slice.i.valid.eq(self.rd_rsp_valid), self.rd_rsp_ready.eq(rsp_slice.i.ready),
                     rsp_slice.i.payload.data.eq(self.rd_rsp_data), rsp_slice.i.payload.tag.eq(self.rd_rsp_tag)]
        wiring.connect(m, rsp_slice.o, loader.rd_rsp)
        m.submodules.in_rsp_slice = in_rsp_slice = StreamSlice(loader.in_rsp.payload.shape(), forward=False,
                                                               backward=True)
        m.d.comb += [in_rsp_slice.i.valid.eq(self.in_rsp_valid), self.in_rsp_ready.eq(in_rsp_slice.i.ready),
                     in_rsp_slice.i.payload.data.eq(self.in_rsp_data),
                     in_rsp_slice.i.payload.tag.eq(self.in_rsp_tag)]
        if buffer:     # a buffered layer's DMA input responses are fills, the loader's input the buffer's answers
            m.d.comb += [bi.rd_rsp.valid.eq(on & in_rsp_slice.o.valid), bi.rd_rsp.payload.eq(in_rsp_slice.o.payload),
                         loader.in_rsp.valid.eq(Mux(on, bi.rsp.valid, in_rsp_slice.o.valid)),
                         loader.in_rsp.payload.eq(Mux(on, bi.rsp.payload, in_rsp_slice.o.payload)),
                         in_rsp_slice.o.ready.eq(Mux(on, bi.rd_rsp.ready, loader.in_rsp.ready)),
                         bi.rsp.ready.eq(on & loader.in_rsp.ready)]
        else:
            wiring.connect(m, in_rsp_slice.o, loader.in_rsp)
        # the loader fills the core's buffers and hands it the steps
        for ours, theirs in ((self.in_wr, loader.in_wr), (self.w_wr, loader.w_wr), (self.b_wr, loader.b_wr),
                             (self.step, loader.core_step)):
            wiring.connect(m, wiring.flipped(ours), theirs)
        m.d.comb += loader.released.eq(self.released)
        # the writer drains staging to the DMA through a forward register slice: the writer's word
        # offset and address logic end at a register, not in the DMA's burst planning (+1 cycle a write)
        m.submodules.wr_slice = wr_slice = StreamSlice(writer.wr.payload.shape())
        wiring.connect(m, writer.wr, wr_slice.i)
        m.d.comb += [writer.block_done.eq(self.block_done), self.st_sb.eq(writer.st_sb), self.st_j.eq(writer.st_j),
                     writer.st_data.eq(self.st_data),
                     self.wr_valid.eq(wr_slice.o.valid), wr_slice.o.ready.eq(self.wr_ready),
                     self.wr_addr.eq(wr_slice.o.payload.addr), self.wr_nwords.eq(wr_slice.o.payload.nwords),
                     self.wr_data.eq(wr_slice.o.payload.data)]

        # the layer is over when every read is answered and every machine and the DMA's writes are idle
        # (one count a stream: each moves by one a cycle at most, a shorter path than one count of both).
        # A read counts from the command slice's near end (one held in the slice is in flight), a response
        # as it enters its skid, whose ready is a register (one held in the skid is in flight by its
        # `busy`): neither the loader's ready nor the buffer's reaches the counts' adders
        rd_out = [Signal(range(128), name=f"rd_out{s}") for s in (0, 1)]   # reads issued, not yet answered
        for cnt, i, rsp in ((rd_out[0], rd_pair.i0, rsp_slice.i), (rd_out[1], rd_pair.i1, in_rsp_slice.i)):
            m.d.sync += cnt.eq(cnt + (i.valid & i.ready) - (rsp.valid & rsp.ready))
        # registered (the planner's state logic then starts at a register: +1 cycle a layer), and
        # cleared by `go`, so the cycle after it never sees the idle machines of before the layer
        drained = Signal()
        idle = (fetcher.idle & loader.idle & writer.idle & ~wr_slice.busy & self.wr_idle & ~rsp_slice.busy
                & ~in_rsp_slice.busy)
        if buffer:
            idle = idle & ~bi.busy
        m.d.sync += drained.eq(idle & (rd_out[0] == 0) & (rd_out[1] == 0) & ~planner.go)
        m.d.comb += planner.drained.eq(drained)
        return m
