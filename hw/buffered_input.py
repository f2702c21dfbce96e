"""The block input buffer joined to the control unit: a buffered layer's input runs answered from chip memory.

An NPU built with `NpuParams.input_buffer` words a half has this beside its fetcher (hw/sequencer.py).
For a layer whose descriptor is `buffered` (hw/descriptor.py), the sequencer routes the fetcher's
im2col runs here instead of to the DMA, and the DMA's input read stream carries this unit's fills:

* `block`: the fetcher hands over each row block's groups a block ahead (hw/seq_fetcher.py); the fill
  walker (hw/fill_walker.py) turns them into regions and fill reads (`rd`, to the DMA's input stream).
  Each read's buffer word, half and `last` wait in an in-order FIFO until its response (`rd_rsp`)
  arrives and is written into the buffer (hw/input_buffer.py); a marker read (no words) is answered
  here, without the DMA.
* the regions go to a table of (half, sample) -> (first byte, buffer word);
* `run`: the fetcher's runs with their half, sample and whether the run is its block's last. A run
  waits until its sample's region of its half is in the table (the walker may still be walking the
  block), is translated to the buffer word (address - region's first byte) / 2 + region's word, and
  goes to the buffer, which answers it on `rsp` with its tag, in the DMA's response layout, so the
  loader does not change. A block's last run clears its half's table.

The runs come in through a fully registered slice, the translation leaves through a forward one
and the answers through a skid buffer, so no path runs from the loader's hand-over logic through the
buffer into the fetcher (the timing proxy's budget). `busy`: a run or a fill is
in flight here (the layer's drain check waits for it). docs/hw-architecture.md, "A block input
buffer".
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from fluidnpu.hw.fill_walker import FillWalker, block_layout, geometry_layout
from fluidnpu.hw.input_buffer import InputBuffer, run_layout
from fluidnpu.hw.seq_streams import ADDR, read_cmd_layout, read_rsp_layout
from fluidnpu.hw.stream_slice import StreamSlice

FILLS_IN_FLIGHT = 16        # fill reads the DMA may hold: the pairing FIFO's depth
FILLS_BEHIND = 4            # ... while the other half is full: the fill runs behind a block's steps


def buffered_run_layout(tag: data.StructLayout, nmax: int, bmax: int) -> data.StructLayout:
    """A fetcher run of a buffered layer: the DMA command it would have been, its block's half, its
    sample and whether it is the block's last run."""
    return data.StructLayout({"cmd": read_cmd_layout(tag, nmax), "half": 1, "sample": bits_for(bmax) + 1,
                              "last": 1})


class BufferedInput(wiring.Component):
    """The buffer, its fill walker, the region table and the fill pairing; see the module docstring.

    Ports: `geom` (the fill walker's geometry, held while a layer runs), `block` (stream of the fill
    walker's `block_layout`), `run` (stream of `buffered_run_layout`), `rsp` (answers, the DMA's
    response layout), `rd` / `rd_rsp` (fill reads to the DMA's input stream and their responses),
    `busy`, `fill_issued` (one cycle: a block's last fill read, or its marker, has left), `overflow`
    (one cycle: a block's regions do not fit a half; the planner reports it as the run's error).
    """

    def __init__(self, *, TR: int, TP: int, bmax: int, nmax: int, depth: int, tag: data.StructLayout) -> None:
        self.TR, self.TP, self.bmax, self.nmax, self.tag = TR, TP, bmax, nmax, tag
        self.buffer = InputBuffer(TP=TP, nmax=nmax, depth=depth, tag=tag)
        self.walker = FillWalker(TR=TR, bmax=bmax, nmax=nmax, depth=self.buffer.depth, window=self.buffer.window)
        super().__init__({
            "geom": In(geometry_layout()),
            "block": In(stream.Signature(block_layout(bmax, TR))),
            "run": In(stream.Signature(buffered_run_layout(tag, nmax, bmax))),
            "rsp": Out(stream.Signature(read_rsp_layout(tag, nmax))),
            "rd": Out(stream.Signature(read_cmd_layout(tag, nmax))),
            "rd_rsp": In(stream.Signature(read_rsp_layout(tag, nmax))),
            "busy": Out(1), "fill_issued": Out(1), "overflow": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.buffer = buf = self.buffer
        m.submodules.walker = walker = self.walker
        depth = buf.depth
        m.d.sync += walker.geom.eq(self.geom)
        wiring.connect(m, wiring.flipped(self.block), walker.block)

        # fill reads to the DMA, each one's landing place kept in order for its response
        pending = data.StructLayout({"offset": range(depth), "half": 1, "last": 1, "nwords": range(self.nmax + 1)})
        m.submodules.pairing = pairing = fifo.SyncFIFOBuffered(width=pending.size, depth=FILLS_IN_FLIGHT)
        c = walker.cmd.payload
        marker = c.nwords == 0
        # a fill behind a block the core is running (the other half is full) keeps a few reads in flight,
        # so that they share the ports with that block's weight reads rather than hold them back in a
        # burst; a fill nothing waits behind (a layer's first block) goes at full speed
        behind = buf.full.bit_select(~c.half, 1)
        room = Signal()
        under = Signal()
        m.d.sync += under.eq(pairing.level + 1 < Mux(behind, FILLS_BEHIND, FILLS_IN_FLIGHT))
        m.d.comb += room.eq(under & pairing.w_rdy)
        item = Signal(pending)
        m.d.comb += [item.offset.eq(c.offset), item.half.eq(c.half), item.last.eq(c.last), item.nwords.eq(c.nwords),
                     pairing.w_data.eq(item),
                     self.rd.valid.eq(walker.cmd.valid & room & ~marker),
                     self.rd.payload.addr.eq(c.addr), self.rd.payload.nwords.eq(c.nwords),
                     walker.cmd.ready.eq(room & (marker | self.rd.ready)),
                     pairing.w_en.eq(walker.cmd.valid & walker.cmd.ready),
                     self.fill_issued.eq(walker.cmd.valid & walker.cmd.ready & c.last)]
        head = pending(pairing.r_data)
        head_marker = head.nwords == 0
        f = buf.fill.payload
        m.d.comb += [buf.fill.valid.eq(pairing.r_rdy & (head_marker | self.rd_rsp.valid)),
                     f.half.eq(head.half), f.offset.eq(head.offset), f.nwords.eq(head.nwords), f.last.eq(head.last),
                     f.data.eq(self.rd_rsp.payload.data),
                     self.rd_rsp.ready.eq(pairing.r_rdy & ~head_marker & buf.fill.ready),
                     pairing.r_en.eq(buf.fill.valid & buf.fill.ready)]

        # the region table: per half, per sample, where the sample's region lies in memory and in the half
        nsamp = self.bmax
        src = Array(Array(Signal(ADDR, name=f"reg_src{h}_{s}") for s in range(nsamp)) for h in range(2))
        word = Array(Array(Signal(range(depth), name=f"reg_buf{h}_{s}") for s in range(nsamp)) for h in range(2))
        known = Array(Signal(nsamp, name=f"reg_known{h}") for h in range(2))
        r = walker.region.payload
        m.d.comb += [walker.region.ready.eq(1), self.overflow.eq(walker.region.valid & walker.overflow)]

        # runs: a slice, the region lookup and translation, a slice, the buffer
        m.submodules.run_in = run_in = StreamSlice(self.run.payload.shape(), forward=True, backward=True)
        wiring.connect(m, wiring.flipped(self.run), run_in.i)
        m.submodules.run_out = run_out = StreamSlice(run_layout(depth, self.TP, self.tag))
        wiring.connect(m, run_out.o, buf.cmd)
        u = run_in.o.payload
        in_range = u.sample < nsamp
        has_region = in_range & known[u.half].bit_select(u.sample[:bits_for(nsamp - 1)], 1)
        may_go = u.cmd.zero | has_region
        o = run_out.i.payload
        m.d.comb += [run_out.i.valid.eq(run_in.o.valid & may_go), run_in.o.ready.eq(run_out.i.ready & may_go),
                     o.half.eq(u.half), o.nwords.eq(u.cmd.nwords), o.zero.eq(u.cmd.zero), o.last.eq(u.last),
                     o.tag.eq(u.cmd.tag),
                     o.offset.eq(Mux(u.cmd.zero, 0,
                                     ((u.cmd.addr - src[u.half][u.sample]) >> 1) + word[u.half][u.sample]))]
        taken = run_in.o.valid & run_in.o.ready
        with m.If(taken & u.last):
            m.d.sync += known[u.half].eq(0)
        with m.If(walker.region.valid):
            m.d.sync += [src[r.half][r.sample].eq(r.src), word[r.half][r.sample].eq(r.buf),
                         known[r.half].bit_select(r.sample, 1).eq(1)]
        m.submodules.rsp_skid = rsp_skid = StreamSlice(buf.rsp.payload.shape(), forward=False, backward=True)
        wiring.connect(m, buf.rsp, rsp_skid.i)
        wiring.connect(m, rsp_skid.o, wiring.flipped(self.rsp))

        # in flight: runs taken and not answered by the buffer (an answer in the skid counts apart: the
        # loader's ready, which comes from the core's step hand-over, stays out of the count's adder),
        # fill reads issued and not written
        runs, fills = Signal(range(64)), Signal(range(FILLS_IN_FLIGHT + 2))
        m.d.sync += [runs.eq(runs + (self.run.valid & self.run.ready) - (buf.rsp.valid & buf.rsp.ready)),
                     fills.eq(fills + (self.rd.valid & self.rd.ready) - (self.rd_rsp.valid & self.rd_rsp.ready))]
        m.d.comb += self.busy.eq((runs != 0) | rsp_skid.busy | (fills != 0) | pairing.r_rdy)
        return m
