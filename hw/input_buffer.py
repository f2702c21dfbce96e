"""A block input buffer: input runs answered from chip memory instead of DDR.

A 3 x 3 layer's fetcher reads each input pixel from DDR once for every
window over it (docs/dse.md, "Would a line buffer fit beside this pick?").
This buffer holds a block's input region on chip, in two halves: a fill
walker writes the next block's region into one half (`fill`, DMA responses
of up to NMAX words) while the fetcher's input runs read the other (`cmd`),
answered on `rsp` in order with the command's tag, exactly as the DMA's input
stream answers them, so the loader does not change (docs/hw-architecture.md,
"A block input buffer").

The halves synchronise themselves: a run of a half (a zero run too) waits
until the fill marked `last` has written it, and a fill of a half waits
until the run marked `last` has released it. Zero runs (padding) are
answered with zeros, as the DMA answers them.

A fill writes one window of nbank x lanes words a cycle: `chunk` words at
offsets that are multiples of it (whole windows, or a power of two inside one
where NMAX is shorter than a window). Banks: `nbank` banks of `lanes` 16-bit
words a row, interleaved by word
address (word w is lane w % lanes of row w // (lanes * nbank) in bank
(w // lanes) % nbank), so any run of up to 2 TP consecutive words reads each
bank at most once. The banks' rows are rotated by the run's first bank and
shifted by its first lane, one register stage after the read.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from fluidnpu.hw.regmap import BUFFER_LANES, buffer_banks, fill_chunk


def fill_layout(depth: int, nmax: int) -> data.StructLayout:
    """A fill write: `nwords` words of `data` (at most `InputBuffer.chunk`) at word `offset` of `half`
    (a multiple of the chunk); `last` completes the half (its reads may start)."""
    return data.StructLayout({"half": 1, "offset": range(depth), "nwords": range(nmax + 1), "last": 1,
                              "data": 16 * nmax})


def run_layout(depth: int, TP: int, tag: data.StructLayout) -> data.StructLayout:
    """An input run: `nwords` (1..2 TP) words from word `offset` of `half`, or zeros (`zero`);
    `last` releases the half once this run is read (its next fill may start)."""
    return data.StructLayout({"half": 1, "offset": range(depth), "nwords": range(2 * TP + 1), "zero": 1,
                              "last": 1, "tag": tag})


class InputBuffer(wiring.Component):
    """Two halves of `depth` words each, read as runs of up to 2 TP words; see the module docstring.

    Ports: `fill` (stream of `fill_layout`), `cmd` (stream of `run_layout`), `rsp` (stream of
    the DMA's response layout: the run's words at bits 16 i, zeros above, and the run's tag),
    `full` (per half: filled and not yet released).
    """

    def __init__(self, *, TP: int, nmax: int, depth: int, tag: data.StructLayout, lanes: int = BUFFER_LANES) -> None:
        if lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two, got {lanes}")
        self.TP, self.nmax, self.lanes = TP, nmax, lanes
        self.nbank = buffer_banks(TP, lanes)
        self.window = self.nbank * lanes
        self.rows = -(-depth // self.window)            # bank rows a half
        self.chunk = fill_chunk(nmax, self.window)
        self.depth = self.rows * self.window
        self.tag = tag
        super().__init__({
            "fill": In(stream.Signature(fill_layout(self.depth, nmax))),
            "cmd": In(stream.Signature(run_layout(self.depth, TP, tag))),
            "rsp": Out(stream.Signature(data.StructLayout({"data": 16 * nmax, "tag": tag}))),
            "full": Out(2),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        TP, L, NBK, W, rows = self.TP, self.lanes, self.nbank, self.window, self.rows
        lb, nb_bits = ceil_log2(L), ceil_log2(NBK)
        lw = lb + nb_bits                     # a word address's window: word >> lw
        banks = []
        for k in range(NBK):
            mem = Memory(shape=unsigned(16 * L), depth=2 * rows, init=[])
            m.submodules[f"bank{k}"] = mem
            banks.append((mem.write_port(granularity=16), mem.read_port()))

        full = self.full                  # the half is filled and not yet released

        # fills: one window of W words a cycle, each bank one row of L words
        f = self.fill.payload
        windows = Signal(range(-(-self.nmax // W) + 1))       # windows of this fill already written
        n_win = (f.nwords + W - 1) >> lw
        may_fill = self.fill.valid & ~full.bit_select(f.half, 1)
        last_win = windows + 1 >= n_win
        row_w = Mux(f.half, rows, 0) + (f.offset >> lw) + windows
        words_in = Signal(16 * W)
        first = Signal(range(W))                  # where in its window a fill smaller than one starts
        if self.chunk >= W:
            m.d.comb += words_in.eq(Cat(f.data, Const(0, 16 * (-self.nmax % W))).word_select(windows, 16 * W))
        else:
            m.d.comb += [first.eq(f.offset[:lw]), words_in.eq(f.data[:16 * self.chunk] << (first * 16))]
        for k, (wp, _) in enumerate(banks):
            m.d.comb += [wp.addr.eq(row_w), wp.data.eq(words_in.word_select(k, 16 * L))]
            for i in range(L):
                at = (windows << lw) + k * L + i          # the word's place in the fill's windows
                m.d.comb += wp.en[i].eq(may_fill & (at >= first) & (at < first + f.nwords))
        # ready does not wait for valid (the fill's half free and its last window due: registers only), so
        # no path runs from the DMA's response through the window logic back into its ready
        m.d.comb += self.fill.ready.eq(~full.bit_select(f.half, 1) & last_win)
        with m.If(may_fill):
            m.d.sync += windows.eq(Mux(last_win, 0, windows + 1))
            with m.If(last_win & f.last):
                m.d.sync += full.bit_select(f.half, 1).eq(1)

        # reads: stage 1 reads every bank; stage 2 rotates, shifts and masks into `rsp`
        c = self.cmd.payload
        adv = ~self.rsp.valid | self.rsp.ready
        can_read = full.bit_select(c.half, 1)          # zero runs too: the half's runs stay in order
        take = self.cmd.valid & can_read & adv
        m.d.comb += self.cmd.ready.eq(can_read & adv)
        group = c.offset >> lb
        first_bank = group[:nb_bits] if nb_bits else Const(0, 1)
        row_r = Mux(c.half, rows, 0) + (group >> nb_bits)
        for k, (_, rp) in enumerate(banks):
            m.d.comb += [rp.addr.eq(row_r + (Const(k, nb_bits + 1) < first_bank)), rp.en.eq(adv)]
        v1 = Signal()
        s_bank, s_lane = Signal(max(nb_bits, 1)), Signal(max(lb, 1))
        s_n, s_zero = Signal.like(c.nwords), Signal()
        s_tag = Signal.like(c.tag)
        with m.If(adv):
            m.d.sync += [v1.eq(take), s_bank.eq(first_bank), s_lane.eq(c.offset[:lb] if lb else 0),
                         s_n.eq(c.nwords), s_zero.eq(c.zero), s_tag.eq(c.tag)]
        with m.If(take & c.last):
            m.d.sync += full.bit_select(c.half, 1).eq(0)

        rotated = Signal(16 * W)
        m.d.comb += rotated.eq(_rotate(Cat(rp.data for _, rp in banks), s_bank, 16 * L, NBK))
        shifted = Signal(16 * W)
        m.d.comb += shifted.eq(rotated >> (s_lane * 16))
        run = Signal(16 * 2 * TP)
        for i in range(2 * TP):
            m.d.comb += run.word_select(i, 16).eq(Mux(~s_zero & (i < s_n), shifted.word_select(i, 16), 0))
        with m.If(adv):
            m.d.sync += [self.rsp.valid.eq(v1), self.rsp.payload.data.eq(run), self.rsp.payload.tag.eq(s_tag)]
        return m


def _rotate(value, by, unit: int, n: int):
    """`value` (n units of `unit` bits, n a power of two) rotated down by `by` units: unit i of the result
    is unit (by + i) % n of `value`, a barrel of log2(n) stages of two-way selects."""
    out = value
    for s in range(ceil_log2(n)):
        out = Mux(by[s], Cat(out[unit << s:], out[:unit << s]), out)
    return out
