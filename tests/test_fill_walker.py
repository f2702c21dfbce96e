"""hw/fill_walker.py in the Amaranth simulator: a block's regions and fill reads against a Python model.

Random layer shapes (stride 1 or 2, kernels of 1 to 5 rows, padding, several channels), random blocks
(any first pixel, 1..TR rows, across samples up to the group's end) and random stalls on both output
streams. The model cuts the block's pixels by sample and takes, per sample, the input rows its
windows read; the walker must issue exactly those regions and reads, in order. One case is tied to
the line buffer's pricing: the block benchmarks/peak_gap.py's `block_input_words` counts by hand.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from amaranth.sim import Simulator

from fluidnpu.hw.fill_walker import FillWalker
from fluidnpu.hw.regmap import fill_chunk, fill_regions
from fluidnpu.sim_tb.axi_model import StreamSink, StreamSource

NMAX, WINDOW, DEPTH, TR, BMAX = 16, 8, 4096, 200, 4


@dataclass(frozen=True)
class Shape:
    out_w: int
    out_h: int
    in_h: int
    in_w: int
    cin: int
    sh: int
    kh: int
    ph: int
    gap: int              # bytes between one sample's tensor and the next's

    @property
    def row_words(self) -> int:
        return self.in_w * self.cin

    @property
    def sample_bytes(self) -> int:
        return 2 * self.in_h * self.row_words + self.gap


def _model(sh: Shape, base: int, groups: list[tuple[int, int, int, int]], window: int = WINDOW) -> tuple[list, list]:
    """(regions, reads) of a block: t pixels from pixel p0 of sample s0 in each group (s0, p0, t, gend)."""
    chunk = fill_chunk(NMAX, window)
    regions, reads, buf = [], [], 0
    for s0, p0, t, gend in groups:
        # the regions as the model device checks them against the halves (hw/regmap.py)
        for s, lo, words in fill_regions(sh.out_w, sh.out_h, sh.in_h, sh.sh, sh.kh, sh.ph, sh.row_words,
                                         s0, p0, t, gend):
            src = base + s * sh.sample_bytes + 2 * lo * sh.row_words
            regions.append((s, src, buf))
            for i in range(0, words, chunk):
                reads.append([src + 2 * i, min(chunk, words - i), buf + i, 0])
            buf = -(-(buf + words) // window) * window
    s0, _, _, gend = groups[-1]
    if s0 >= gend:
        reads.append([0, 0, 0, 1])          # the closing group reads nothing: a marker completes the half
    else:
        reads[-1][3] = 1
    return regions, [tuple(r) for r in reads]


def _run(shape: Shape, blocks: list[list[tuple[int, int, int, int]]], seed: int, stall: float,
         window: int = WINDOW) -> None:
    """Each block a list of groups (s0, p0, t, gend), in halves 0, 1, 0, ..."""
    dut = FillWalker(TR=TR, bmax=BMAX, nmax=NMAX, depth=DEPTH, window=window)
    base = 0x1000
    expected = [_model(shape, base, groups, window=window) for groups in blocks]
    items = []
    for i, groups in enumerate(blocks):
        for q, (s0, p0, t, gend) in enumerate(groups):
            oy, ox = divmod(p0, shape.out_w)
            items.append({"half": i % 2, "sample": s0, "oy": oy, "ox": ox, "iy": oy * shape.sh - shape.ph,
                          "sbase": base + s0 * shape.sample_bytes, "t": t, "gend": gend,
                          "cont": int(q > 0), "close": int(q + 1 == len(groups))})
    want_regions = [(i % 2, *r) for i, (regions, _) in enumerate(expected) for r in regions]
    want_reads = [(*c, i % 2) for i, (_, reads) in enumerate(expected) for c in reads]
    source = StreamSource(dut.block, items, valid_prob=1 - stall, seed=seed)
    regions = StreamSink(dut.region, len(want_regions), ready_prob=1 - stall, seed=seed + 1)
    reads = StreamSink(dut.cmd, len(want_reads), ready_prob=1 - stall, seed=seed + 2)

    async def geometry(ctx):
        g = dut.geom
        for name, v in (("out_w", shape.out_w), ("out_h", shape.out_h), ("in_h", shape.in_h), ("sh", shape.sh),
                        ("span", shape.kh - 1), ("iy_top", -shape.ph), ("row_words", shape.row_words),
                        ("sample_bytes", shape.sample_bytes)):
            ctx.set(getattr(g, name), v)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(geometry)
    for proc in (source, regions, reads):
        sim.add_process(proc.process)
    sim.run()
    rl, cl = dut.region.payload.shape(), dut.cmd.payload.shape()
    assert [(r.half, r.sample, r.src, r.buf) for r in map(rl.from_bits, regions.items)] == want_regions
    got_reads = [(c.addr, c.nwords, c.offset, c.last, c.half) for c in map(cl.from_bits, reads.items)]
    # a marker's address and word mean nothing
    assert [(0, 0, 0, *c[3:]) if c[1] == 0 else c for c in got_reads] == want_reads


def _shape(rng: random.Random) -> Shape:
    while True:
        sh, kh = rng.choice((1, 2)), rng.choice((1, 3, 5))
        ph = rng.randint(0, kh // 2)
        out_h, out_w = rng.randint(1, 9), rng.randint(1, 9)
        in_h = (out_h - 1) * sh + kh - 2 * ph
        if in_h >= 1:
            return Shape(out_w, out_h, in_h, rng.randint(1, 9), rng.randint(1, 5), sh, kh, ph, 2 * rng.randint(0, 5))


@pytest.mark.parametrize("seed", range(6))
def test_regions_and_reads_follow_the_blocks_pixels(seed):
    """Windows of 8 words (NMAX 16: reads of 16) and, on odd seeds, of 32 (reads of 16 inside one)."""
    rng = random.Random(seed)
    shape = _shape(rng)
    npix = shape.out_w * shape.out_h
    blocks = []
    for _ in range(5):
        s0 = rng.randrange(BMAX)
        blocks.append([(s0, rng.randrange(npix), rng.randint(1, min(TR, 3 * npix)), rng.randint(s0 + 1, BMAX))])
    _run(shape, blocks, seed, stall=0.3 if seed % 2 else 0.0, window=32 if seed % 2 else WINDOW)


def test_a_block_over_two_samples_reads_what_the_pricing_counts():
    """peak_gap's hand count (tests/test_peak_gap.py): a 3 x 3, pad 1 convolution of an 8 x 8 x 2 input,
    a block of 80 output pixels over two samples reads all 8 input rows of the first and 3 of the
    second: 128 + 48 words, regions at buffer words 0 and 128."""
    shape = Shape(out_w=8, out_h=8, in_h=8, in_w=8, cin=2, sh=1, kh=3, ph=1, gap=0)
    regions, reads = _model(shape, 0x1000, [(0, 0, 80, 2)])
    assert [r[2] for r in regions] == [0, 128] and sum(c[1] for c in reads) == 128 + 48
    _run(shape, [[(0, 0, 80, 2)], [(1, 16, 64, 2)]], seed=9, stall=0.2)


@pytest.mark.parametrize("seed", range(3))
def test_a_blocks_groups_share_its_half_and_an_empty_last_group_still_closes_it(seed):
    """The fetcher's blocks of several groups (hw/seq_fetcher.py): one `block` a group, the later groups'
    regions after the earlier ones' in the half and only the last group's last read marked `last`; a
    short last group whose pixels lie past its samples reads nothing and closes the half with a marker."""
    rng = random.Random(50 + seed)
    shape = _shape(rng)
    npix = shape.out_w * shape.out_h
    blocks = []
    for i in range(4):
        t = rng.randint(1, 2 * npix)
        p0 = rng.randrange(npix)
        # groups of two samples, the last one short; on odd blocks its pixels lie past its end
        groups = [(0, p0, t, 2), (2, p0, t, 3)]
        if i % 2:
            groups.append((4, p0, t, 4))
        blocks.append(groups)
    _run(shape, blocks, seed, stall=0.3)
