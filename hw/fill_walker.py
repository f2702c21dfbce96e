"""The block input buffer's fill walker: which input rows a block of output pixels reads, as DMA reads.

Given a block's first output pixel (its sample, output row and column, the input row its window
starts at, the sample's base address: the fetcher's block cursors) and its rows t, it walks the
block's output rows, one a cycle, sample by sample up to the group's end, and for each sample the
block reaches issues:

* a `region`: the half and the sample, the byte address of the first input row the block's
  windows read in that sample, and the word of the buffer half it lands at (a multiple of the
  buffer's window, hw/input_buffer.py), so that a run's buffer offset is its address less the
  region's, plus the region's word;
* the region's `cmd`s: reads of up to `chunk` words (`input_buffer.fill_chunk`: what one fill of
  the buffer writes), in order, each with the buffer word it lands at and
  the half; the block's last read is marked `last` (the half is then full).

The fetcher's row block covers one run of pixels in each of its groups (hw/seq_fetcher.py), so a
block comes as one `block` a group: `cont` on every group after the first (its regions follow the
previous group's in the half), `close` on the last (its last read is the block's `last`). A group
whose pixels all lie past its end sample (a short last group's padding rows) reads nothing; if it
closes the block, the walker issues a marker instead: a read of no words marked `last`, which
hw/sequencer.py answers itself, so that the half still completes.

The input rows of a sample are max(0, iy_first) .. min(in_h - 1, iy_last + span), iy_first and
iy_last the input rows the windows of the block's first and last output row in it start at, span
(kh - 1) x dilation. A block's regions must fit one half: the walker does not check it, the plan
does (a layer is buffered only where its largest block fits). No multiplier or divider: rows and
addresses advance by addition, so a block costs its output rows plus its first region's input rows
in cycles before the reads, which run at one a cycle. docs/hw-architecture.md, "A block input buffer".
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from fluidnpu.hw.input_buffer import fill_chunk
from fluidnpu.hw.seq_streams import ADDR

GEOM = 16          # bits of a layer's rows, columns and words a row


def geometry_layout() -> data.StructLayout:
    """The layer's shape as the walker needs it (constant while a layer runs): output columns and rows,
    input rows, the stride and window span in input rows, the first window's input row (-pad), the
    words of an input row and the bytes between samples."""
    return data.StructLayout({"out_w": GEOM, "out_h": GEOM, "in_h": GEOM, "sh": 4, "span": 8,
                              "iy_top": signed(GEOM), "row_words": 24, "sample_bytes": ADDR})


def block_layout(bmax: int, TR: int) -> data.StructLayout:
    """A block's group to fill: the half, its first pixel (sample, output row and column, input row of
    its window, the sample's base byte address), its rows t and the group's end sample (exclusive);
    `cont`: not the block's first group; `close`: the block's last."""
    return data.StructLayout({"half": 1, "sample": bits_for(bmax + 1), "oy": GEOM, "ox": GEOM,
                              "iy": signed(GEOM + 1), "sbase": ADDR, "t": bits_for(TR), "gend": bits_for(bmax),
                              "cont": 1, "close": 1})


def fill_cmd_layout(depth: int, nmax: int) -> data.StructLayout:
    """A fill read: byte address, 1..NMAX words, the buffer word it lands at, the half, the block's last."""
    return data.StructLayout({"addr": ADDR, "nwords": range(nmax + 1), "offset": range(depth), "half": 1,
                              "last": 1})


def region_layout(bmax: int, depth: int) -> data.StructLayout:
    """A sample's region of the block: the half, the sample, its first byte and buffer word."""
    return data.StructLayout({"half": 1, "sample": bits_for(bmax), "src": ADDR, "buf": range(depth)})


class FillWalker(wiring.Component):
    """Turns a block into its regions and fill reads; see the module docstring.

    Ports: `geom` (geometry_layout, held while a layer runs), `block` (stream of block_layout), `cmd`
    (stream of fill_cmd_layout), `region` (stream of region_layout), `overflow` (with a region's valid:
    the region does not fit the half; its reads still go, into words that wrap). `window`: the
    buffer's window in words (regions start on it); `depth`: the words of a half.
    """

    def __init__(self, *, TR: int, bmax: int, nmax: int, depth: int, window: int) -> None:
        if window & (window - 1):
            raise ValueError(f"the buffer's window must be a power of two, got {window}")
        self.TR, self.bmax, self.nmax, self.depth, self.window = TR, bmax, nmax, depth, window
        self.chunk = fill_chunk(nmax, window)
        super().__init__({
            "geom": In(geometry_layout()),
            "block": In(stream.Signature(block_layout(bmax, TR))),
            "cmd": Out(stream.Signature(fill_cmd_layout(depth, nmax))),
            "region": Out(stream.Signature(region_layout(bmax, depth))),
            "overflow": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        g, blk = self.geom, self.block.payload
        chunk, W = self.chunk, self.window
        log2w = ceil_log2(W)
        half, close = Signal(), Signal()
        sample, gend = Signal.like(blk.sample), Signal.like(blk.gend)
        oy, iy, iy_first, iy_last = (Signal(GEOM), Signal(signed(GEOM + 1)), Signal(signed(GEOM + 1)),
                                     Signal(signed(GEOM + 1)))
        px_row = Signal(GEOM + 1)             # output pixels of the current row still in the block
        left = Signal(bits_for(self.TR))      # the block's pixels not yet walked
        sbase = Signal(ADDR)
        lo, hi, row = Signal(signed(GEOM + 2)), Signal(signed(GEOM + 2)), Signal(signed(GEOM + 2))
        addr, words = Signal(ADDR), Signal(32)
        buf, buf_start = Signal(range(self.depth + W + chunk)), Signal(range(self.depth + W + chunk))
        final = Signal()

        with m.FSM(name="fill"):
            with m.State("IDLE"):
                m.d.comb += self.block.ready.eq(1)
                with m.If(self.block.valid):
                    m.d.sync += [half.eq(blk.half), sample.eq(blk.sample), gend.eq(blk.gend), close.eq(blk.close),
                                 oy.eq(blk.oy), iy.eq(blk.iy), iy_first.eq(blk.iy), px_row.eq(g.out_w - blk.ox),
                                 left.eq(blk.t), sbase.eq(blk.sbase)]
                    with m.If(~blk.cont):
                        m.d.sync += buf.eq(0)
                    with m.If(blk.sample < blk.gend):
                        m.next = "ROW"
                    with m.Elif(blk.close):
                        m.next = "MARK"
            with m.State("MARK"):                  # an empty group closes the block: a read of no words
                c = self.cmd.payload
                m.d.comb += [self.cmd.valid.eq(1), c.half.eq(half), c.last.eq(1)]
                with m.If(self.cmd.ready):
                    m.next = "IDLE"
            with m.State("ROW"):                   # one output row a cycle, to the block's last in this sample
                with m.If(left <= px_row):
                    m.d.sync += [iy_last.eq(iy), left.eq(0)]
                    m.next = "SPAN"
                with m.Else():
                    m.d.sync += [left.eq(left - px_row), px_row.eq(g.out_w)]
                    with m.If(oy + 1 == g.out_h):
                        m.d.sync += iy_last.eq(iy)
                        m.next = "SPAN"
                    with m.Else():
                        m.d.sync += [oy.eq(oy + 1), iy.eq(iy + g.sh)]
            with m.State("SPAN"):                  # the input rows the sample's windows read
                top = iy_last + g.span
                m.d.sync += [lo.eq(Mux(iy_first < 0, 0, iy_first)),
                             hi.eq(Mux(top > g.in_h - 1, g.in_h - 1, top)),
                             row.eq(0), addr.eq(sbase), words.eq(0), buf_start.eq(buf),
                             final.eq((left == 0) | (sample + 1 >= gend))]
                m.next = "ADDR"
            with m.State("ADDR"):                  # rows before lo move the address, rows lo..hi are read
                with m.If(row < lo):
                    m.d.sync += addr.eq(addr + 2 * g.row_words)
                with m.Else():
                    m.d.sync += words.eq(words + g.row_words)
                m.d.sync += row.eq(row + 1)
                with m.If(row == hi):
                    m.next = "REGION"
            with m.State("REGION"):
                p = self.region.payload
                m.d.comb += [self.region.valid.eq(1), p.half.eq(half), p.sample.eq(sample), p.src.eq(addr),
                             p.buf.eq(buf_start), self.overflow.eq(buf_start + words > self.depth)]
                with m.If(self.region.ready):
                    m.next = "FILL"
            with m.State("FILL"):
                c = self.cmd.payload
                end = words <= chunk
                m.d.comb += [self.cmd.valid.eq(1), c.addr.eq(addr), c.nwords.eq(Mux(end, words, chunk)),
                             c.offset.eq(buf), c.half.eq(half), c.last.eq(end & final & close)]
                with m.If(self.cmd.ready):
                    m.d.sync += [addr.eq(addr + 2 * chunk), words.eq(words - chunk), buf.eq(buf + chunk)]
                    with m.If(end):
                        # the next region starts on the buffer's window after this one's last word
                        m.d.sync += buf.eq(((buf + words + W - 1) >> log2w) << log2w)
                        with m.If(final):
                            m.next = "IDLE"
                        with m.Else():
                            m.d.sync += [sample.eq(sample + 1), oy.eq(0), iy.eq(g.iy_top),
                                         iy_first.eq(g.iy_top), px_row.eq(g.out_w), sbase.eq(sbase + g.sample_bytes)]
                            m.next = "ROW"
        return m
