"""The engine's tile schedule for one layer, block by block.

`perf_model.layer_cycles` prices this schedule in closed form for the whole
design space at once; this module spells the same schedule out explicitly,
which is what descriptors, the bit-accurate model and the tests need:
`run_schedule` executes it with numpy and must reproduce every sample's GEMM
exactly, and `schedule_cycles` must equal the closed form.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fluidnpu.dse.perf_model import (
    DEFAULT_TIMING,
    Bus,
    EngineTiming,
    LayerCosts,
    TileCosts,
    bias_chunk,
    descriptor_reads,
    layer_costs,
    mode_dims,
)
from fluidnpu.hw.regmap import ROW_BITS, mode_depth


@dataclass(frozen=True)
class GroupSlice:
    """Rows [row0, row1) of one sample group's R-appended matrix (group rows = its samples' rows in order)."""

    group: int
    samples: tuple[int, ...]
    row0: int
    row1: int


@dataclass(frozen=True)
class Block:
    """One row block: weight columns [c0, c1) for up to g groups side by side on the PE array.

    It runs ceil(P / TPk) weight steps of `rows` cycles each.
    """

    c0: int
    c1: int
    slices: tuple[GroupSlice, ...]
    pass_groups: int

    @property
    def rows(self) -> int:
        return max(s.row1 - s.row0 for s in self.slices)


@dataclass(frozen=True)
class LayerSchedule:
    TRk: int
    TPk: int
    TCk: int
    groups_per_pass: int
    rows_per_block: int
    blocks: tuple[Block, ...]
    TR: int = 0                 # the engine, layer and batch it was planned for (the planning cost)
    R: int = 0
    TC: int = 0
    b: int = 1
    BR: int = 1
    TP: int = 0                 # (with TC: the bias chunk a read moves)
    k_code: int = 1             # the Stackable-PE mode (with TP: the pipeline's depth)


def sample_groups(b: int, BR: int) -> list[tuple[int, ...]]:
    """Samples 0..b-1 in ceil(b/BR) groups of BR (the last may be smaller)."""
    return [tuple(range(s, min(s + BR, b))) for s in range(0, b, BR)]


def _balanced(rows: int, limit: int) -> Iterator[tuple[int, int]]:
    n = -(-rows // limit)
    s, big = divmod(rows, n)
    start = 0
    for i in range(n):
        size = s + (1 if i < big else 0)
        yield start, start + size
        start += size


def layer_schedule(TR: int, TP: int, TC: int, R: int, P: int, C: int, b: int, BR: int, k_code: int,
                   banks: int | None = None) -> LayerSchedule:
    """The blocks the engine runs for one GEMM group of a layer at batch b, split BR, mode k, on an
    engine with `banks` input banks (None: as many as groups), which cap the groups of a pass."""
    TRk, TPk, TCk = (int(x) for x in mode_dims(TR, TP, TC, k_code))
    if min(TRk, TPk, TCk) < 1:
        raise ValueError(f"mode k code {k_code} does not exist on <{TR}, {TP}, {TC}>")
    groups = sample_groups(b, BR)
    g = min(len(groups), TCk // C, banks or len(groups)) if C <= TCk else 1
    if TRk < g:
        raise ValueError(f"{g} packed groups need TR >= {g} rows in mode k code {k_code}")
    TRe = TRk // g
    blocks: list[Block] = []
    # passes -> row blocks -> column tiles (hw/seq_fetcher.py): a row block runs every tile before the next
    for p0 in range(0, len(groups), g):
        pass_groups = list(enumerate(groups))[p0:p0 + g]
        rows = max(len(samples) for _, samples in pass_groups) * R
        # a pass with fewer groups (the last) gives each of them more buffer rows
        for r0, r1 in _balanced(rows, TRk // len(pass_groups)):
            slices = tuple(GroupSlice(gi, samples, r0, min(r1, len(samples) * R))
                           for gi, samples in pass_groups if r0 < len(samples) * R)
            for c0 in range(0, C, TCk):
                blocks.append(Block(c0, min(C, c0 + TCk), slices, len(pass_groups)))
    return LayerSchedule(TRk, TPk, TCk, g, TRe, tuple(blocks), TR, R, TC, b, BR, TP, int(k_code))


def planning_cycles(sched: LayerSchedule) -> int:
    """The control unit's planning, walked the way hw/sequencer.py does it."""
    narrow = max(sched.TR, 2 * sched.TC).bit_length() + 2      # one narrow division
    wide = 2 * (ROW_BITS + 2)                                    # n and s on the 24-bit divider
    bp = len(sample_groups(sched.b, sched.BR))
    packed = max(b.c1 for b in sched.blocks) <= sched.TCk      # C <= TCk: groups per pass divided out
    passes: list[list] = []          # (groups, rows) of each pass, from its blocks in the first column tile
    for blk in sched.blocks:
        if blk.c0 != sched.blocks[0].c0:
            continue
        if blk.slices[0].row0 == 0:          # every pass starts at its groups' row 0
            passes.append([None, 0, blk.pass_groups])
        passes[-1][1] = max(passes[-1][1], max(sl.row1 for sl in blk.slices))
    cycles = bp + sched.BR + len(passes) + (narrow if packed else 1)

    def kind(rows: int, groups: int) -> int:
        return narrow + (1 if rows <= sched.TRk // groups else wide)

    first, last = passes[0], passes[-1]
    if len(passes) == 1:
        return cycles + kind(last[1], last[2])
    cycles += kind(first[1], first[2])
    if (last[2], last[1]) != (first[2], first[1]):
        cycles += kind(last[1], last[2])
    return cycles


@dataclass
class _PricedLayer:
    """A layer's costs on one engine shape and bus, with the tiles and blocks priced so far: none depends on
    TR, b or BR, so every schedule of the layer shares them (a brute force prices thousands a layer)."""

    costs: LayerCosts
    tiles: dict[tuple[int, int], TileCosts]
    blocks: dict[tuple[int, int, int, float], float]


@functools.lru_cache(maxsize=4096)
def _priced_layer(TPk: int, P: int, C: int, taps: int, bus: Bus, timing: EngineTiming, R: int, inside: float,
                  chunk: int, depth: int, kw: int, edge: float) -> _PricedLayer:
    return _PricedLayer(layer_costs(np.int64(TPk), np.int64(P), np.int64(C), taps, bus, timing, R, inside, chunk,
                                    depth, kw, edge), {}, {})


def schedule_cycles(sched: LayerSchedule, P: int, G: int, bytes_per_cycle: float,
                    timing: EngineTiming = DEFAULT_TIMING, taps: int = 1, port_bytes: float | None = None,
                    inside: float = 1.0, ports: int = 0, kw: int = 1, edge: float = 0.0) -> int:
    """Price an explicit schedule block by block (must equal perf_model.layer_cycles)."""
    C = sched.blocks[0].c1 if len(sched.blocks) == 1 else max(b.c1 for b in sched.blocks)
    priced = _priced_layer(int(sched.TPk), int(P), int(C), int(taps),
                           Bus.of(bytes_per_cycle, port_bytes, timing.word_bytes, ports), timing, int(sched.R),
                           float(inside), int(bias_chunk(sched.TP, sched.TC)), int(mode_depth(sched.TP, sched.k_code)),
                           int(kw), float(edge))
    costs, tiles, blocks = priced.costs, priced.tiles, priced.blocks

    def tile_of(blk: Block) -> TileCosts:
        # a schedule repeats a few (width, groups) tiles and (rows, tile, pad) blocks many times over
        key = (blk.c1 - blk.c0, blk.pass_groups)
        if key not in tiles:
            tiles[key] = costs.tile(*key)
        return tiles[key]

    def block_of(blk: Block, pad: float) -> float:
        key = (blk.rows, blk.c1 - blk.c0, blk.pass_groups, pad)
        if key not in blocks:
            blocks[key] = float(costs.block(blk.rows, tile_of(blk), blk.pass_groups, pad=pad))
        return blocks[key]

    total = 0.0
    staged = 0.0                     # the staging loop's pace (`LayerCosts.staging`), beside the fetcher's
    regroups = 0.0
    prev = None
    pass_pad = 0.0
    for blk in sched.blocks:
        tile = tile_of(blk)
        # a pass starts at its groups' row 0, in the first column tile
        new_pass = blk.slices[0].row0 == 0 and blk.c0 == 0
        if prev is None:
            total += 1                                          # the fetcher's set-up of the first tile
        if new_pass:
            total += timing.pass_overhead + blk.pass_groups      # pass set-up, a cursor per group
            if prev is not None and blk.pass_groups != prev.pass_groups:
                # another group count: the core empties before the pass's first step
                regroups += float(costs.regroup(prev.rows, blk.rows, tile, blk.pass_groups))
            pass_pad = _pass_padding(sched, blk)
        # every group of the pass streams the block's rows (a short group's beyond its samples' are
        # padding: zero-fill reads and no write-back)
        pad = _block_padding(blk)
        total += block_of(blk, pad)
        staged += float(costs.staging(blk.rows, tile, blk.pass_groups, pad=pad))
        prev = blk
    total = max(total, staged) + regroups
    first, last = sched.blocks[0], sched.blocks[-1]
    total += float(costs.prologue(first.rows, tile_of(first), first.pass_groups))
    last_tile = tile_of(last)
    # the drain takes the last block at its pass's even share of padding (`perf_model._body`)
    last_block = block_of(last, pass_pad)
    total += float(costs.drain(last.rows, last_tile, last.pass_groups, last_block / float(costs.n_p), pad=pass_pad))
    total += planning_cycles(sched) + descriptor_reads(costs.bus)
    return int(np.ceil(G * total + timing.layer_overhead - 1e-6))


def _block_padding(blk: Block) -> float:
    """A block's padding, in group units: every group of the pass streams the block's rows, and a short
    group (fewer than BR samples) has rows only up to its last sample's, the rest padding."""
    return blk.pass_groups - sum(sl.row1 - sl.row0 for sl in blk.slices) / blk.rows


def _pass_padding(sched: LayerSchedule, first: Block) -> float:
    """The padding of the pass that starts with block `first`, spread evenly over its blocks, in group
    units: a short group (fewer than BR samples) beside others streams the pass's BR*R rows, the rest
    of its share padding."""
    if first.pass_groups < 2:
        return 0.0
    short = min(len(sl.samples) for sl in first.slices)
    return (sched.BR - short) / sched.BR


def run_schedule(sched: LayerSchedule, X: np.ndarray, W: np.ndarray, R: int) -> np.ndarray:
    """Execute the schedule on per-sample inputs X[s] (R x P) and weights W (P x C).

    Each block accumulates over the TPk-wide weight steps into a TRe x (g*w)
    accumulator, the way the PE array does; returns Y[s] (R x C) for every sample.
    """
    b = X.shape[0]
    P = X.shape[2]
    C = W.shape[1]
    Y = np.zeros((b, R, C), dtype=np.int64)
    for blk in sched.blocks:
        w = blk.c1 - blk.c0
        acc = np.zeros((len(blk.slices), blk.rows, w), dtype=np.int64)
        for p0 in range(0, P, sched.TPk):
            wt = W[p0:p0 + sched.TPk, blk.c0:blk.c1].astype(np.int64)
            for gi, sl in enumerate(blk.slices):
                rows = _group_rows(X, sl)[:, p0:p0 + sched.TPk].astype(np.int64)
                acc[gi, : rows.shape[0]] += rows @ wt
        for gi, sl in enumerate(blk.slices):
            for r in range(sl.row0, sl.row1):
                s_local, row = divmod(r, R)
                Y[sl.samples[s_local], row, blk.c0:blk.c1] = acc[gi, r - sl.row0]
    return Y


def _group_rows(X: np.ndarray, sl: GroupSlice) -> np.ndarray:
    R = X.shape[1]
    stacked = X[list(sl.samples)].reshape(len(sl.samples) * R, X.shape[2])
    return stacked[sl.row0:sl.row1]
