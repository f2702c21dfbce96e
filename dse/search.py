"""Exhaustive design-space exploration (the paper's Eq. 2).

    d* = argmax_d  sum_b  w_b * max_{k, BR} perf_W(d, b, k, BR)

Every <TR, TP, TC> that fits the board is visited, at every input-bank count NB
the batching can use (docs/interpretations.md, "Bank count"), every count P of
AXI masters the board can wire ("AXI port count") and both PE kinds, Stackable
or plain ("Stackable PEs"): every <TP, TC> with
TP*TC <= DSPs and every TR up to the largest that fits it with NB banks and P ports. The cycles are not
monotone in TR (a layer's first step and last write-out grow with its blocks),
so the search scores some designs and bounds the others, by branch and bound
over ranges of TR (`branch_and_bound`; the bound and its proof:
perf_model.layer_cycles_bound, docs/interpretations.md, Eq. 2). Ties go to the
smaller TP, then TC, then TR, across spaces to fewer ports, then fewer banks,
then plain PEs (fewer LUTs). For each design, batch size b and layer, the best
<BR, k> is taken per layer, which maximises the workload's GOp/s at b because
the layers' times add up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fluidnpu.boards.catalog import Board
from fluidnpu.dse.buffer_fit import block_words
from fluidnpu.dse.perf_model import (
    DEFAULT_TIMING,
    ArrayLike,
    Bus,
    EngineTiming,
    FillShape,
    LayerSetup,
    ModeCosts,
    layer_cycles_bound,
    layer_edge,
    layer_inside,
    layer_parts,
    layer_setup,
    mode_costs,
    row_blocks,
    windows,
)
from fluidnpu.dse.resource_model import (
    Resources,
    bram_reserve,
    buffer_room,
    buffers_bram36,
    design_resources,
    feasible_designs,
    input_buffer_per_bank,
    input_buffer_words,
    logic_fits,
    memory_tr_max,
    over_limits,
)
from fluidnpu.dse.timing_model import TimingEstimate, design_timing
from fluidnpu.errors import FluidError
from fluidnpu.hw.regmap import bank_choices, check_banks, input_banks, k_codes, packs_groups
from fluidnpu.workload import Layer, Workload

BATCHING_MODES: dict[str, str] = {
    "fluid": "Fluid Batching: best BR per layer and batch size",
    "r": "static R-batching on all layers (BR = b)",
    "p": "static P-batching on all layers (BR = 1)",
    "fc": "batching on FC layers only; other layers run one sample at a time",
}
MAX_BMAX = 64
SEED_PAIRS = 32    # largest arrays scored first, whose best score prunes the pairs whose peak is below it
SEED_TR_SHARE = 3  # a buffer space's seeds take a third of their largest TR: two thirds of the BRAM left to
                   # the buffer, where the buffered layers fit (at the largest TR they do not)
BOUND_SLACK = 1e-9   # relative rounding a bound may fall below a score it bounds (`reach`)
ROUND_RANGES = 32   # ranges a round of branch and bound prices at least, when ranges are cut (`split_ranges`)
PARALLEL_DESIGNS = 10_000_000   # searches this large run their spaces in forked workers

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class DSEOptions:
    """What to search for. `weights[b-1]` is w_b; `fixed_batch` makes it one-hot."""

    bmax: int = 8
    batching: str = "fluid"
    stackable: bool | None = None  # Stackable PEs built; None: search both (a generator parameter)
    weights: tuple[float, ...] | None = None
    fixed_batch: int | None = None
    clock_mhz: float | None = None
    timing: EngineTiming = DEFAULT_TIMING
    banks: int | None = None     # input banks NB; None: search every count the batching can use
    ports: int | None = None     # AXI masters P; None: search 1 .. the board's HP ports
    buffer: bool | None = None   # a block input buffer built; None: search both (a generator parameter)
    # the least share of the board's DSPs a searched design uses (a floor beside the ceilings)
    min_dsp: float = 0.0

    def batch_weights(self) -> np.ndarray:
        if self.fixed_batch is not None:
            w = np.zeros(self.bmax)
            w[self.fixed_batch - 1] = 1.0
            return w
        if self.weights is not None:
            return np.asarray(self.weights, dtype=float)
        return np.ones(self.bmax)

    @property
    def packing(self) -> bool:
        """Whether the engine is built to pack sample groups: static R and FC-only designs never do,
        so they get 2 input banks (the fewest the row interleaving uses)."""
        return packs_groups(self.batching)

    def bank_options(self) -> list[int]:
        """The bank counts NB the search tries, fewest first (ties go to fewer banks)."""
        return [self.banks] if self.banks is not None else bank_choices(self.bmax, self.packing)

    def given_banks(self) -> int:
        """NB of a design given without a search: the option, else the most the batching uses."""
        return self.banks if self.banks is not None else input_banks(self.bmax, self.packing)

    def stackable_options(self) -> list[bool]:
        """Whether the engine has Stackable PEs, the options the search tries: plain PEs first (fewer
        LUTs, so ties go to them)."""
        return [self.stackable] if self.stackable is not None else [False, True]

    def given_stackable(self) -> bool:
        """Stackable PEs of a design given without a search: the option, else built."""
        return self.stackable if self.stackable is not None else True

    def resolved(self, stackable: bool, buffer: bool | None = None) -> DSEOptions:
        """These options for one design space: Stackable PEs built or not, a block input buffer or not
        (None: as the options say)."""
        return replace(self, stackable=stackable, buffer=self.buffer if buffer is None else buffer)

    def buffer_options(self) -> list[bool]:
        """Whether the NPU has a block input buffer, the options the search tries: none first (fewer
        resources, so ties go to it)."""
        return [self.buffer] if self.buffer is not None else [False, True]

    def given_buffer(self) -> bool:
        """A block input buffer in a design given without a search: the option, else none."""
        return bool(self.buffer)

    def port_options(self, board: Board) -> list[int]:
        """The AXI master counts P the search tries, fewest first (ties go to fewer ports)."""
        return [self.ports] if self.ports is not None else board.port_choices()

    def given_ports(self, board: Board) -> int:
        """P of a design given without a search: the option, else every HP port of the board."""
        return self.ports if self.ports is not None else board.npu_axi_ports

    def least_dsps(self, board: Board) -> int:
        """TP*TC a searched design uses at least: `min_dsp` of the board's DSPs, rounded up."""
        return int(np.ceil(self.min_dsp * board.dsp - 1e-9))

    def validate(self, board: Board) -> None:
        if not 1 <= self.bmax <= MAX_BMAX:
            raise FluidError(f"Bmax must be in [1, {MAX_BMAX}], got {self.bmax}")
        if self.batching not in BATCHING_MODES:
            raise FluidError(f"unknown batching {self.batching!r}; choose from {', '.join(BATCHING_MODES)}")
        if self.fixed_batch is not None and not 1 <= self.fixed_batch <= self.bmax:
            raise FluidError(f"fixed batch size {self.fixed_batch} is outside [1, Bmax={self.bmax}]")
        if self.weights is not None:
            if len(self.weights) != self.bmax:
                raise FluidError(f"need {self.bmax} batch weights w_b, got {len(self.weights)}")
            if any(w < 0 for w in self.weights) or not any(w > 0 for w in self.weights):
                raise FluidError("batch weights w_b must be >= 0 with at least one > 0")
        if self.banks is not None:
            check_banks(self.banks, self.bmax if self.packing else 2)
        if self.ports is not None:
            board.check_ports(self.ports)
        board.check_clock(self.clock_mhz or board.clock_mhz)
        if not 0.0 <= self.min_dsp <= 1.0:
            raise FluidError(f"the DSP floor must be a share in [0, 1] (e.g. 0.98 or 98%), got {self.min_dsp:g}")
        if self.least_dsps(board) > board.limit("dsp"):
            raise FluidError(f"a DSP floor of {self.least_dsps(board):,} ({self.min_dsp:.0%} of {board.dsp:,}) is "
                             f"above the DSP ceiling ({board.limit('dsp'):,})")


@dataclass(frozen=True)
class Choice:
    """One way to run a layer at batch b: split BR, Stackable-PE mode, or one sample at a time."""

    BR: int
    k_code: int
    serial: bool = False
    fc_only: bool | None = None  # None: any layer; True: FC layers only; False: non-FC only
    buffered: bool = False       # the layer's input runs from the block input buffer (its FBCB BUFFERED bit)

    @property
    def mode_key(self) -> int | tuple[int, bool]:
        """Its costs in a `modes_of` dict: by k code; buffered, by (k code, True)."""
        return (self.k_code, True) if self.buffered else self.k_code


def choices(batching: str, b: int, stackable: bool, buffer: bool = False) -> list[Choice]:
    """Candidate <BR, k> for batch b under a batching mode, in tie-break order; `buffer`: each also
    buffered, after all those from DDR (so ties go to DDR)."""
    ks = k_codes(stackable)
    if batching == "fluid":
        out = [Choice(BR, k) for k in ks for BR in range(b, 0, -1)]
    elif batching == "r":
        out = [Choice(b, k) for k in ks]
    elif batching == "p":
        out = [Choice(1, k) for k in ks]
    elif batching == "fc":
        out = [Choice(b, k, fc_only=True) for k in ks] + [Choice(1, k, serial=True, fc_only=False) for k in ks]
    else:
        raise FluidError(f"unknown batching {batching!r}")
    return out + [replace(ch, buffered=True) for ch in out] if buffer else out


def layer_taps(layer: Layer) -> int:
    """kh*kw of a convolution, 1 for FC and matmul layers."""
    return layer.kernel[0] * layer.kernel[1] if layer.kind == "conv" else 1


def layer_kw(layer: Layer) -> int:
    """kw of a convolution (taps in a kernel row), 1 for FC and matmul layers."""
    return layer.kernel[1] if layer.kind == "conv" else 1


@dataclass(frozen=True)
class LayerShapes:
    """Layer GEMM shapes as row vectors for broadcasting."""

    R: np.ndarray
    P: np.ndarray
    C: np.ndarray
    G: np.ndarray
    is_fc: np.ndarray
    taps: np.ndarray          # kh*kw: where a weight step's im2col read splits into runs
    inside: np.ndarray        # fraction of im2col runs outside the zero padding
    kw: np.ndarray            # taps in a kernel row: their crossings may be read as one run
    edge: np.ndarray          # fraction of those crossings at the padding's edge (never one run)
    fill_geometry: tuple[np.ndarray, ...] = ()   # out_w, out_h, in_h, sh, kh, row words: a buffered layer's fill

    @classmethod
    def of(cls, layers: Sequence[Layer]) -> LayerShapes:
        def row(values: list[int]) -> np.ndarray:
            return np.asarray(values, dtype=np.int64)[None, :]
        return cls(row([x.R for x in layers]), row([x.P for x in layers]), row([x.C for x in layers]),
                   row([x.groups for x in layers]), np.asarray([x.kind == "fc" for x in layers])[None, :],
                   row([layer_taps(x) for x in layers]),
                   np.asarray([layer_inside(x) for x in layers], dtype=float)[None, :],
                   row([layer_kw(x) for x in layers]),
                   np.asarray([layer_edge(x) for x in layers], dtype=float)[None, :],
                   tuple(row(list(v)) for v in zip(*(fill_geometry(x) for x in layers))))

    def fills(self, TP: np.ndarray, TC: np.ndarray) -> FillShape:
        """Every layer's fill, were it buffered, on designs <TP, TC> (column vectors)."""
        return FillShape.of(TP, TC, *self.fill_geometry)


def fill_geometry(layer: Layer) -> tuple[int, int, int, int, int, int]:
    """What the fill walker reads of a layer's input (hw/fill_walker.py): out_w, out_h, in_h, the vertical
    stride and kernel, and the words of an input row (in_w x channels)."""
    return (layer.out_hw[1], layer.out_hw[0], layer.in_hw[0], layer.stride[0], layer.kernel[0],
            layer.in_hw[1] * layer.in_ch)


def modes_of(TP: np.ndarray, TC: np.ndarray, shapes: LayerShapes, k_codes: Sequence[int], bus: Bus,
             timing: EngineTiming, fill: FillShape | None = None) -> dict[int, ModeCosts]:
    """The Stackable-PE modes' TR- and batch-free costs of every (design, layer), on the bus as
    layer_cycles sees it (words of the engine's timing); `fill`: every layer buffered."""
    bus = replace(bus, word_bytes=timing.word_bytes)
    return {k: mode_costs(TP, TC, shapes.R, shapes.P, shapes.C, k, bus, timing, shapes.taps, shapes.inside,
                          kw=shapes.kw, edge=shapes.edge, fill=fill)
            for k in k_codes}


def buffered_modes(TP: np.ndarray, TC: np.ndarray, shapes: LayerShapes, k_codes: Sequence[int], bus: Bus,
                   timing: EngineTiming, fill: FillShape | None = None) -> dict[tuple[int, bool], ModeCosts]:
    """The modes of every layer buffered, keyed as buffered choices look them up (`Choice.mode_key`);
    `fill`: another fill than the layers' own (the bound's `FillShape.linear`)."""
    modes = modes_of(TP, TC, shapes, k_codes, bus, timing, fill=fill or shapes.fills(TP, TC))
    return {(k, True): m for k, m in modes.items()}


def choice_setup(modes: dict, shapes: LayerShapes, b: int, ch: Choice, banks: int,
                 BR: np.ndarray | None = None, like: LayerSetup | None = None) -> LayerSetup:
    """A choice's groups and passes on an engine of `banks` input banks; a serial choice is one sample
    (its cycles count b times). `modes`: by `Choice.mode_key`. `BR`: several splits of the choice's kind
    at once (`split_stacks`). `like`: the setup of the same choice from DDR (or buffered with another
    fill), whose groups, passes and column tiles this one shares: none depends on where a layer's input
    is read from, so only the mode is replaced (a setup's tiles are most of its price)."""
    if like is not None:
        return replace(like, mode=modes[ch.mode_key])
    split = ch.BR if BR is None else BR
    return layer_setup(modes[ch.mode_key], shapes.R, shapes.G, 1 if ch.serial else b, 1 if ch.serial else split,
                       banks)


def buffered_cycles(setup: LayerSetup, TR: np.ndarray, TP: np.ndarray, fill: FillShape,
                    depth: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(cycles of a buffered choice at TR, inf where a block may not fit a half of `depth` words; the
    words a half its blocks need, `buffer_fit.block_words`: never below what the RTL's blocks need).
    `fill`: the layers' fills on these designs, `LayerShapes.fills`."""
    need = block_words(fill, setup, row_blocks(setup, TR), TP)
    return np.where(need <= np.asarray(depth), layer_parts(setup, TR).cycles(setup), np.inf), need


def split_stacks(cands: list[Choice]) -> list[tuple[Choice, np.ndarray | None]]:
    """The candidates in runs that differ only in BR, each with its BRs as an array along a new
    leading axis (None: a run of one, priced as it is): numpy's per-call cost, not the arithmetic,
    dominates pricing a few hundred ranges, so a batch size's splits are priced side by side in one call."""
    stacks: list[tuple[Choice, list[int]]] = []
    for ch in cands:
        if stacks and replace(stacks[-1][0], BR=ch.BR) == ch:
            stacks[-1][1].append(ch.BR)
        else:
            stacks.append((ch, [ch.BR]))
    return [(ch, np.asarray(brs, dtype=np.int64)[:, None, None] if len(brs) > 1 else None) for ch, brs in stacks]


def _applies(cyc: np.ndarray, shapes: LayerShapes, b: int, ch: Choice) -> np.ndarray:
    """Cycles of a choice as priced for one sample or all: b runs of one sample when serial, inf on
    the layers it does not apply to."""
    if ch.serial:
        cyc = b * cyc
    if ch.fc_only is not None:
        cyc = np.where(shapes.is_fc == ch.fc_only, cyc, np.inf)
    return cyc


def buffered_bound(setup: LayerSetup, lo: np.ndarray, hi: np.ndarray, TP: np.ndarray, fill: FillShape,
                   depth: np.ndarray, most: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`buffered_cycles` at hi in `depth` words, a lower bound on a buffered choice's cycles at every TR in
    [lo, hi]) (docs/interpretations.md, "The DSE's buffered bound"). Its blocks grow with TR and the room
    shrinks, so where they do not fit at lo in `most` words (the room at lo, the most there is on the range)
    the choice exists nowhere on the range (inf). Elsewhere, the bound prices the choice with a fill linear
    in a block's rows and below the layer's own on every block the range holds (`FillShape.linear`), so that
    a block's cost stays convex in its rows and `layer_cycles_bound` holds on the whole range: where the
    blocks stop fitting inside the range, the bound is that of a range that runs buffered to hi, which is
    lower still."""
    shape = np.broadcast(setup.g, lo, setup.R).shape
    rb_lo = row_blocks(setup, lo)
    at_lo = np.broadcast_to(block_words(fill, setup, rb_lo, TP) <= most, shape)
    if not at_lo.any():
        return np.full(shape, np.inf), np.full(shape, np.inf)
    rb_hi = row_blocks(setup, hi)
    t_lo = np.maximum(np.minimum(rb_lo.full[1], rb_lo.last[1]), 1)     # the smallest block (balanced blocks: s, s + 1)
    t_hi = np.maximum(np.maximum(rb_hi.t0_full, rb_hi.t0_last), t_lo)
    at_hi, low = layer_cycles_bound(setup, lo, hi, low_fill=fill.linear(t_lo, t_hi))
    return (np.where(block_words(fill, setup, rb_hi, TP) <= np.asarray(depth), at_hi, np.inf),
            np.where(at_lo, low, np.inf))


def best_cycles(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, shapes: LayerShapes, b: int, cands: list[Choice],
                bus: Bus, timing: EngineTiming, banks: int, depth: ArrayLike = 0,
                words: dict[Choice, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(min cycles, index of the winning choice) over the candidates, per (design, layer); a choice is inf
    where it does not apply (a buffered one where its blocks may not fit halves of `depth` words, the
    words a half of the design's block input buffer). `words`: filled with each buffered candidate's
    `block_words` per (design, layer)."""
    ks = sorted({ch.k_code for ch in cands})
    modes: dict = modes_of(TP, TC, shapes, ks, bus, timing)
    if any(ch.buffered for ch in cands):
        modes |= buffered_modes(TP, TC, shapes, ks, bus, timing)
        fill = shapes.fills(TP, TC)
    best = None
    arg = None
    for i, ch in enumerate(cands):
        setup = choice_setup(modes, shapes, b, ch, banks)
        if ch.buffered:
            cyc, need = buffered_cycles(setup, TR, TP, fill, depth)
            if words is not None:
                words[ch] = need
        else:
            cyc = layer_parts(setup, TR).cycles(setup)
        cyc = _applies(cyc, shapes, b, ch)
        if best is None:
            best, arg = cyc, np.zeros(cyc.shape, dtype=np.int64)
        else:
            better = cyc < best
            best = np.where(better, cyc, best)
            arg = np.where(better, i, arg)
    assert best is not None and arg is not None
    return best, arg


@dataclass(frozen=True)
class Scorer:
    """Eq. 2's objective of designs, exactly at one TR or as an upper bound over a range of TR."""

    shapes: LayerShapes
    counts: np.ndarray       # multiplicity of each distinct layer shape
    options: DSEOptions
    bus: Bus
    clock_mhz: float
    macs: float
    banks: int               # the engines' input banks NB
    room: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None
    # words a half of the largest block input buffer a design <TR, TP, TC> fits (None: none built)

    def score_bound(self, lo: np.ndarray, hi: np.ndarray, TP: np.ndarray, TC: np.ndarray,
                    threshold: float = -np.inf) -> tuple[np.ndarray, np.ndarray]:
        """(score at TR = hi, upper bound on the score at every TR in [lo, hi]) per design.

        The workload's time at b is the sum over layers of the best choice's cycles, so the
        sum of each layer's lowest lower bound over the choices bounds it from below on the
        whole range, and Eq. 2's objective (decreasing in every time) from above.

        `threshold`: only the ranges whose bound reaches it (within rounding) are wanted. The batch sizes are then
        priced smallest first (the fewest <BR, k>, the most memory-bound), each only for the
        ranges whose bound so far, with the batch sizes not yet priced at their peak share
        (`peak_bound`), still reaches it; the others get that partial bound, which is below the
        threshold, and score -inf. Ranges that cannot win (a losing port or bank count, most of
        all) are so dropped for a fraction of their price.

        With a block input buffer (`room`), each layer may also run buffered where its blocks fit the
        buffer the design at hi has room for; over the range, a buffered choice is bounded by
        `buffered_bound`. Where every range is one TR, the bound is the score itself (priced once).
        """
        opts = self.options
        weights = opts.batch_weights()
        peak = 2.0 * TP * TC * self.clock_mhz * 1e6 / 1e9
        # the partial sums add in another order than the full bound: a range that ties the threshold
        # (exact ties are common: TRs whose blocks split alike) must not fall below it by rounding
        threshold = reach(threshold)
        score, bound = np.zeros(lo.size), np.zeros(lo.size)
        live = np.arange(lo.size)
        exact = bool((lo == hi).all())   # every range one TR (the seeds, a search's last round): its bound is its score
        room = self.room
        buffer = room is not None
        if room is not None:   # words a half of the buffer each range's design at hi has room for, and at lo
            room_hi = room(hi[:, None], TP[:, None], TC[:, None])              # (it shrinks with TR)
            room_lo = room_hi if exact else room(lo[:, None], TP[:, None], TC[:, None])
        if np.isfinite(threshold):
            bound += float(weights.sum()) * peak
            live = live[bound >= threshold]
        ks = k_codes(opts.given_stackable())
        priced = None     # the live ranges the modes below are of (they depend on neither b nor TR)
        for b, w in enumerate(weights, start=1):
            if w == 0 or live.size == 0:
                continue
            col = (lo[live, None], hi[live, None])
            tp, tc = TP[live, None], TC[live, None]
            if priced is None or priced.size != live.size:
                priced = live
                modes: dict = modes_of(tp, tc, self.shapes, ks, self.bus, opts.timing)
                if buffer:
                    modes |= buffered_modes(tp, tc, self.shapes, ks, self.bus, opts.timing)
                    fill = self.shapes.fills(tp, tc)
                    depth, most = room_hi[live], room_lo[live]
            best_hi = best_lo = None
            from_ddr: dict[tuple, LayerSetup] = {}   # each choice's setup from DDR, shared by its buffered twin
            for ch, BR in split_stacks(choices(opts.batching, b, opts.given_stackable(), buffer)):
                twin = (replace(ch, buffered=False), None if BR is None else BR.tobytes())
                setup = choice_setup(modes, self.shapes, b, ch, self.banks, BR, like=from_ddr.get(twin))
                from_ddr.setdefault(twin, setup)
                if exact:
                    cyc = (buffered_cycles(setup, col[1], tp, fill, depth)[0] if ch.buffered
                           else layer_parts(setup, col[1]).cycles(setup),) * 2
                elif ch.buffered:
                    cyc = buffered_bound(setup, *col, tp, fill, depth, most)
                else:
                    cyc = layer_cycles_bound(setup, *col)
                at_hi, low = (_applies(c if BR is None else c.min(axis=0), self.shapes, b, ch) for c in cyc)
                best_hi = at_hi if best_hi is None else np.minimum(best_hi, at_hi)
                best_lo = low if best_lo is None else np.minimum(best_lo, low)
            gop = w * 2.0 * b * self.macs * self.clock_mhz * 1e6 / 1e9
            score[live] += gop / (best_hi @ self.counts)
            bound[live] += gop / (best_lo @ self.counts)
            if np.isfinite(threshold):
                bound[live] -= w * peak[live]
                live = live[bound[live] >= threshold]
        if np.isfinite(threshold):
            score[np.setdiff1d(np.arange(lo.size), live)] = -np.inf
        return score, bound

    def peak_bound(self, TP: np.ndarray, TC: np.ndarray) -> np.ndarray:
        """Eq. 2's objective if every cycle did TP*TC MACs: a bound no TR reaches, for free."""
        w = self.options.batch_weights()
        return float(w.sum()) * 2.0 * TP * TC * self.clock_mhz * 1e6 / 1e9


@dataclass
class LayerPlan:
    """How the chosen design runs every layer at every batch size (index [layer][b-1])."""

    cycles: list[list[int]]
    BR: list[list[int]]
    k_code: list[list[int]]
    serial: list[list[bool]]
    buffered: list[list[bool]] = field(default_factory=list)   # input runs from the block input buffer


@dataclass
class DSEResult:
    board: Board
    options: DSEOptions
    clock_mhz: float
    workload: Workload
    TR: int
    TP: int
    TC: int
    resources: Resources
    plan: LayerPlan
    total_cycles: list[int]          # per batch size
    gops: list[float]                # per batch size
    peak_gops: float
    score: float | None              # Eq. 2's objective; None when the design was given, not searched
    n_designs: int                   # <TR, TP, TC> that fit, every one scored or bounded
    seconds: float
    runners_up: list[dict] = field(default_factory=list)   # other pairs' best scored design
    n_scored: int = 1                # designs the search scored exactly (the rest were bounded)
    timing_proxy: TimingEstimate | None = None   # longest path in LUT levels (dse/timing_model.py)
    NB: int = 2                      # input banks of the engine (a generator parameter the DSE chooses)
    ports: int = 1                   # AXI masters P (a generator parameter the DSE chooses)
    input_buffer: int = 0            # words a half of the block input buffer (0: none; the DSE chooses)

    def segment_cycles(self) -> list[list[int]]:
        """Nexits x Bmax: cycles of each exit segment (backbone part + exit head) at each b."""
        out = []
        for seg in self.workload.segments():
            out.append([int(sum(self.plan.cycles[s.index][b] for s in seg)) for b in range(self.options.bmax)])
        return out


def enumerate_tp_tc(dsp: int) -> tuple[np.ndarray, np.ndarray]:
    """Every <TP, TC> with TP * TC <= dsp, ordered by TP then TC."""
    tp = np.concatenate([np.full(dsp // p, p) for p in range(1, dsp + 1)])
    tc = np.concatenate([np.arange(1, dsp // p + 1) for p in range(1, dsp + 1)])
    return tp.astype(np.int64), tc.astype(np.int64)


def unique_layers(layers: Sequence[Layer]) -> tuple[list[Layer], np.ndarray]:
    """Distinct GEMM shapes with their multiplicities (many layers repeat). The shape includes all
    that LayerShapes prices: the taps, and the share of the im2col reads in the padding (a
    stride-2 block's 3x3 conv has the same R, P, C as the stride-1 ones after it, less padding)."""
    seen: dict[tuple, int] = {}
    reps: list[Layer] = []
    counts: list[int] = []
    for layer in layers:
        key = (layer.R, layer.P, layer.C, layer.groups, layer.kind == "fc", layer_taps(layer), layer_inside(layer),
               layer_kw(layer), layer_edge(layer))
        if key not in seen:
            seen[key] = len(reps)
            reps.append(layer)
            counts.append(0)
        counts[seen[key]] += 1
    return reps, np.asarray(counts, dtype=np.float64)


def _before(TP: np.ndarray, TC: np.ndarray, TR: np.ndarray, key: tuple[int, int, int]) -> np.ndarray:
    """<TP, TC, TR> comes before `key` in the tie order (smaller TP, then TC, then TR)."""
    kp, kc, kr = key
    return (TP < kp) | ((TP == kp) & ((TC < kc) | ((TC == kc) & (TR < kr))))


@dataclass
class SearchOutcome:
    """The best design, and for every <TP, TC> the best TR the search scored."""

    TR: int
    TP: int
    TC: int
    score: float
    pair_score: np.ndarray
    pair_tr: np.ndarray
    n_scored: int


def reach(score: float) -> float:
    """The least bound that may still hold a design scoring `score`: a bound adds its batch sizes
    in another order than a score (and, against a threshold, from the peak down), so a range whose
    best design exactly ties `score` can come out a few ulps below it."""
    return score - abs(score) * BOUND_SLACK


def split_ranges(pair: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 target: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each range [lo, hi] cut in m near-equal parts, m = max(2, target // ranges) (at most its
    length; target: ROUND_RANGES): a round costs about the same from one range to a few dozen
    (numpy's per-call overhead), so when few ranges are left each is cut finer and the search
    takes fewer rounds (the last pair's TRs: 12 halvings of 4096 become 2 rounds)."""
    n = hi - lo + 1
    m = np.minimum(n, max(2, (target or ROUND_RANGES) // max(1, pair.size)))
    part = np.repeat(np.arange(pair.size), m)
    j = np.arange(part.size) - np.repeat(np.cumsum(m) - m, m)     # index of each part in its range
    mm, nn = m[part], n[part]
    start = lo[part] + (j * nn) // mm
    stop = lo[part] + ((j + 1) * nn) // mm - 1
    return pair[part], start, stop


def branch_and_bound(scorer: Scorer, TP: np.ndarray, TC: np.ndarray, tr_max: np.ndarray,
                     progress: ProgressFn | None = None, floor: float = -np.inf,
                     ties: bool = False, shared: SharedFloor | None = None,
                     tie_key: tuple = ()) -> SearchOutcome:
    """The best <TR, TP, TC> over every TR in [1, tr_max] of every pair (memory use grows with TR,
    so exactly these fit), by branch and bound over ranges of TR (docs/interpretations.md, Eq. 2).

    Each round scores every live range [lo, hi] at hi and bounds it from above (Scorer.score_bound),
    all at once; a range is dropped when its bound is below the best score found, or equal to it
    and every design in it loses the tie (best score, then smaller TP, TC, TR); the others lose
    their scored hi and are cut in parts (`split_ranges`). A range of one TR is scored exactly, so the search ends with
    the optimum. Ranges start as the whole [1, tr_max]: the bound there is the body at the
    largest TR (the old search's score) plus the edges at TR = 1, which already drops most pairs.

    `floor`: a score already found elsewhere (another bank or port count); only designs scoring
    above it are sought (`ties`: or equal to it, when this space comes earlier in the tie order):
    the outcome's score is then <= floor (< floor with `ties`) when there is none. `shared`: the best
    score the other spaces have found so far and its space's `tie_key`, read each round as a higher
    floor (ties kept only where this space, `tie_key`, comes first in the tie order: a tie it would
    lose cannot be the pick) and told this space's best, so the pick does not change.
    """

    def above(x: np.ndarray | float) -> np.ndarray | bool:
        return (x >= floor) if ties else (x > floor)

    keep_ties = ties

    n_total = int(tr_max.sum())
    pair_score = np.full(TP.size, -np.inf)
    pair_tr = np.zeros(TP.size, dtype=np.int64)
    # before the first round: the pairs whose peak cannot beat the floor, or a design already scored
    # among the largest arrays, are dropped on that bound alone
    peak = scorer.peak_bound(TP, TC)
    # a floor from another space already prunes as the seeds would, so the seeds are not priced then
    seed = np.argsort(-peak, kind="stable")[:SEED_PAIRS if not np.isfinite(floor) else 0]
    seed_score = scorer.score_bound(tr_max[seed], tr_max[seed], TP[seed], TC[seed], threshold=floor)[0]
    seed_best = float(seed_score.max()) if seed.size else -np.inf
    pair = np.flatnonzero(above(peak) & (peak >= seed_best))
    n_scored = int(np.isfinite(seed_score).sum())
    lo, hi = np.ones(pair.size, dtype=np.int64), tr_max[pair].astype(np.int64)
    best, key = -np.inf, (0, 0, 0)
    while pair.size:
        if shared is not None:
            score_elsewhere, key_elsewhere = shared.get()
            if score_elsewhere > floor or (score_elsewhere == floor and key_elsewhere < tie_key):
                floor, ties = score_elsewhere, bool(keep_ties and tie_key <= key_elsewhere)
        # a range whose bound is below a design already scored (the seeds', the best so far) or
        # the floor holds no winner: its batch sizes stop being priced once that shows
        score, bound = scorer.score_bound(lo, hi, TP[pair], TC[pair], threshold=max(best, floor, seed_best))
        n_scored += int(np.isfinite(score).sum())
        # each pair's best scored design (ties to the smaller TR)
        order = np.lexsort((hi, -score))
        pairs, first = np.unique(pair[order], return_index=True)
        cand = order[first]
        better = (score[cand] > pair_score[pairs]) | ((score[cand] == pair_score[pairs]) & (hi[cand] < pair_tr[pairs]))
        pair_score[pairs[better]], pair_tr[pairs[better]] = score[cand[better]], hi[cand[better]]
        i = int(np.lexsort((pair_tr, TC, TP, -pair_score))[0])
        best, key = pair_score[i], (int(TP[i]), int(TC[i]), int(pair_tr[i]))
        if shared is not None and np.isfinite(best):
            shared.offer(float(best), tie_key)
        if above(best):
            live = (bound > best) | ((bound >= reach(best)) & _before(TP[pair], TC[pair], lo, key))
        else:
            live = (bound >= reach(floor)) if ties else (bound > floor)
        pair, lo, hi = pair[live], lo[live], hi[live] - 1
        left = hi >= lo
        pair, lo, hi = split_ranges(pair[left], lo[left], hi[left])
        if progress:
            progress(n_total - int((hi - lo + 1).sum()), n_total)
    return SearchOutcome(key[2], key[0], key[1], float(best), pair_score, pair_tr, n_scored)


@dataclass(frozen=True)
class Space:
    """The designs of one bank count NB, one port count P and PEs plain or stackable: the pairs that
    fit and their largest TR."""

    ports: int
    banks: int
    stackable: bool
    TP: np.ndarray
    TC: np.ndarray
    tr_max: np.ndarray
    buffer: bool = False

    @property
    def tie_key(self) -> tuple[int, int, bool, bool]:
        """Ties between spaces go to fewer ports, then fewer banks, then plain PEs (fewer LUTs), then
        no block input buffer."""
        return self.ports, self.banks, self.stackable, self.buffer


def design_spaces(workload: Workload, board: Board, options: DSEOptions) -> list[Space]:
    """Every (P, NB, stackable, buffer) the options allow with the <TP, TC> that fit it (and use the
    options' `min_dsp` of the DSPs at least), in the order
    `explore` searches them: most ports first (the board's full bandwidth usually scores best, so
    its score prunes the others on their bounds), then fewest banks, Stackable PEs first (they win
    on most boards, so the plain spaces are searched against their score), a buffer first (it wins
    where it fits: each layer may still run from DDR)."""
    layers = workload.layers()
    TP_all, TC_all = enumerate_tp_tc(board.limit("dsp"))
    enough = TP_all * TC_all >= options.least_dsps(board)
    TP_all, TC_all = TP_all[enough], TC_all[enough]
    tr_cap = max(2, options.bmax * max(x.R for x in layers))
    memory_tr: dict[tuple[int, bool], np.ndarray] = {}   # the TR the memories allow: per bank count and buffer
    spaces = []
    for p in sorted(options.port_options(board), reverse=True):
        for nb in options.bank_options():
            for st in sorted(options.stackable_options(), reverse=True):
                for buf in sorted(options.buffer_options(), reverse=True):
                    if (nb, buf) not in memory_tr:
                        reserve = bram_reserve(TP_all, buf, len(layers), options.bmax, board)
                        memory_tr[nb, buf] = memory_tr_max(TP_all, TC_all, board, options.bmax, tr_cap, banks=nb,
                                                           reserve=reserve)
                    fits = logic_fits(TP_all, TC_all, board, options.bmax, len(layers), st, banks=nb, ports=p,
                                      buffer=buf)
                    tr_max = np.where(fits, memory_tr[nb, buf], 0)
                    keep = tr_max >= 1
                    spaces.append(Space(p, nb, st, TP_all[keep], TC_all[keep], tr_max[keep], buf))
    return spaces


@dataclass
class SpaceOutcome:
    """The best design one space holds at or above the search's floor (None: none), and the
    designs it scored."""

    found: SearchOutcome | None
    space: Space
    n_scored: int


def buffer_words_fn(board: Board, bmax: int, n_layers: int, stackable: bool, banks: int,
                    ports: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Words a half of the largest block input buffer each design <TR, TP, TC> of a space fits
    (`resource_model.buffer_room`)."""
    def words(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray) -> np.ndarray:
        return input_buffer_words(TP, buffer_room(TR, TP, TC, board, bmax, n_layers, stackable, banks=banks,
                                                  ports=ports))
    return words


def space_scorer(sp: Space, shapes: LayerShapes, counts: np.ndarray, options: DSEOptions, board: Board,
                 clock: float, macs: float, n_layers: int) -> Scorer:
    """The scorer of one space's designs (its PE kind, port count, bank count and buffer)."""
    room = buffer_words_fn(board, options.bmax, n_layers, sp.stackable, sp.banks, sp.ports) if sp.buffer else None
    return Scorer(shapes, counts, options.resolved(sp.stackable, sp.buffer), board.bus(clock, sp.ports), clock, macs,
                  sp.banks, room)


def seed_floor(sp: Space, scorer: Scorer) -> tuple[float, int]:
    """(best score, designs scored) of the SEED_PAIRS largest arrays of the first space, each at its
    largest TR or, in a space with the block input buffer, a SEED_TR_SHARE of it: a score some design
    reaches, which every space is then searched against."""
    peak = scorer.peak_bound(sp.TP, sp.TC)
    seed = np.argsort(-peak, kind="stable")[:SEED_PAIRS]
    tr = np.maximum(sp.tr_max[seed] // (SEED_TR_SHARE if sp.buffer else 1), 1)
    score = scorer.score_bound(tr, tr, sp.TP[seed], sp.TC[seed])[0]
    return float(score.max()), int(seed.size)


def search_space(sp: Space, floor: float, shapes: LayerShapes, counts: np.ndarray, options: DSEOptions,
                 board: Board, clock: float, macs: float, n_layers: int, *,
                 progress: Callable[[int], None] | None = None) -> SpaceOutcome:
    """Branch and bound over one space, keeping the designs that reach `floor` (ties included: the
    tie order between spaces is settled when their outcomes meet). `progress(done)`: designs settled."""
    scorer = space_scorer(sp, shapes, counts, options, board, clock, macs, n_layers)
    step = (lambda d, _t: progress(d)) if progress else None
    out = branch_and_bound(scorer, sp.TP, sp.TC, sp.tr_max, step, floor=floor, ties=True, shared=_SHARED_FLOOR,
                           tie_key=sp.tie_key)
    return SpaceOutcome(out if out.score >= floor else None, sp, out.n_scored)


class SharedFloor:
    """The best score any space of one search has found so far, in shared memory: forked workers
    inherit it (`_SHARED_FLOOR`), so each space is searched against the others' progress."""

    KEY = 4   # a space's tie key: ports, banks, stackable, buffer

    def __init__(self, value: float) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        # the score, then the tie key of the space that found it (the seed's: after every space's)
        self._value = ctx.Array("d", [value] + [float("inf")] * self.KEY)

    def get(self) -> tuple[float, tuple]:
        with self._value.get_lock():
            score, *key = self._value[:]
        return score, tuple(key)

    def offer(self, score: float, tie_key: tuple) -> None:
        """`score` found in the space of `tie_key`: kept if higher, or equal and earlier in the tie order."""
        with self._value.get_lock():
            key = tuple(self._value[1:])
            if score > self._value[0] or (score == self._value[0] and tuple(map(float, tie_key)) < key):
                self._value[:] = [score, *map(float, tie_key)]


_SHARED_FLOOR: SharedFloor | None = None   # set by `explore` while it runs (a fork pool's workers inherit it)


def _fork_pool(workers: int):
    """A process pool of `workers` sharing this process's imports, or None where it cannot help
    (no fork, one core, a daemonic process such as a pool worker)."""
    import multiprocessing
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 2 or "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return None
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(min(workers, cores), mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_init, initargs=(os.getpid(),))


def _worker_init(parent: int) -> None:
    """A forked worker leaves interrupts to its parent, which kills the pool (`_kill_pool`): a worker that
    caught Ctrl-C itself would hand the KeyboardInterrupt back as its space's outcome and take the next
    space. And it dies with its parent (a parent killed outright cannot kill the pool)."""
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(os, "sched_getaffinity"):   # Linux: prctl(PR_SET_PDEATHSIG, SIGKILL)
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:   # the parent died before the prctl took
        os._exit(1)


def _kill_pool(pool: Any) -> None:
    """Kill a fork pool's workers now and reap them (no process is left), dropping the spaces not yet
    searched: a shutdown alone waits for every submitted space to finish."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for proc in processes:
        proc.kill()
    for proc in processes:
        proc.join(timeout=2)
    pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the search runs (where it would kill this process at once,
    leaving the pool's workers to finish their spaces), so the search stops as on Ctrl-C; a handler the
    caller set (the CLI's) is left in place."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _search_spaces(spaces: list[Space], floor: float, args: tuple[Any, ...], n_total: int,
                   progress: ProgressFn | None) -> list[SpaceOutcome]:
    """Every space searched from `floor`, in forked workers where the search is large and cores are free.
    An interrupt (Ctrl-C, or SIGTERM: `_sigterm_interrupts`) kills the workers and propagates."""
    pool = _fork_pool(len(spaces)) if len(spaces) > 1 and n_total >= PARALLEL_DESIGNS else None
    if pool is None:
        outcomes, base = [], 0
        for sp in spaces:
            step = (lambda d, b=base: progress(b + d, n_total)) if progress else None
            outcomes.append(search_space(sp, floor, *args, progress=step))
            base += int(sp.tr_max.sum())
        return outcomes
    from concurrent.futures import as_completed

    try:
        # Stackable spaces with the buffer and the fewest banks first, most ports first: the near ties, the
        # longest searches, start early (each port count's best then prunes the other bank counts) and
        # the short ones fill in behind them
        heavy_first = sorted(spaces, key=lambda sp: (not sp.stackable, not sp.buffer, sp.banks, -sp.ports))
        futures = {pool.submit(search_space, sp, floor, *args): int(sp.tr_max.sum()) for sp in heavy_first}
        done = 0
        for fut in as_completed(futures):
            done += futures[fut]
            if progress:
                progress(done, n_total)
        outcomes = [fut.result() for fut in futures]   # the pick does not depend on their order
    except BaseException:
        _kill_pool(pool)
        raise
    pool.shutdown(wait=True)
    return outcomes


def explore(workload: Workload, board: Board, options: DSEOptions = DSEOptions(),
            progress: ProgressFn | None = None) -> DSEResult:
    """Run the exhaustive DSE (every <TR, TP, TC> that fits at every port count P, bank count NB
    and PE kind, scored or bounded) and return the best design with its tables. `progress(done,
    total)`: designs settled of all that fit.

    Every space is searched against one floor, at first the best seed design of the first space
    (`seed_floor`), then the best any space has found so far (`SharedFloor`): where the search is
    large and cores are free they run in forked workers, each taking the next space as it finishes
    one, and the pick is the same as one after the other (the runners-up, designs the search
    scored, may differ). The best wins, ties to the space earlier in the tie order."""
    global _SHARED_FLOOR
    options.validate(board)
    t0 = time.perf_counter()
    clock = options.clock_mhz or board.clock_mhz
    spaces = [sp for sp in design_spaces(workload, board, options) if sp.tr_max.size]
    n_total = sum(int(sp.tr_max.sum()) for sp in spaces)
    if n_total == 0:
        at_least = f" with at least {options.least_dsps(board):,} DSPs" if options.min_dsp else ""
        raise FluidError(f"no NPU design fits {board.name} with Bmax={options.bmax}{at_least} under its resource "
                         "ceilings")
    reps, counts = unique_layers(workload.layers())
    shapes = LayerShapes.of(reps)
    args = (shapes, counts, options, board, clock, float(workload.total_macs), len(workload.layers()))
    with _sigterm_interrupts():
        floor, n_seed = seed_floor(spaces[0], space_scorer(spaces[0], *args))
        _SHARED_FLOOR = SharedFloor(floor)
        try:
            outcomes = _search_spaces(spaces, floor, args, n_total, progress)
        finally:
            _SHARED_FLOOR = None
    if progress:
        progress(n_total, n_total)
    # the best score; a tie goes to the space earlier in the tie order (fewer ports, banks, plain PEs)
    best = max((o for o in outcomes if o.found is not None),
               key=lambda o: (o.found.score, [-k for k in o.space.tie_key]))  # type: ignore[union-attr]
    found, sp = best.found, best.space
    assert found is not None and sp is not None
    result = _finish(workload, board, options.resolved(sp.stackable, sp.buffer), clock, found.TR, found.TP, found.TC,
                     found.score, n_designs=n_total, t0=t0, banks=sp.banks, ports=sp.ports)
    result.n_scored = n_seed + sum(o.n_scored for o in outcomes)
    # the other pairs the search scored exactly (those dropped on their bound have no score)
    others = [j for j in np.lexsort((found.pair_tr, sp.TC, sp.TP, -found.pair_score))
              if np.isfinite(found.pair_score[j]) and (sp.TP[j], sp.TC[j]) != (found.TP, found.TC)][:5]
    result.runners_up = [{"TR": int(found.pair_tr[j]), "TP": int(sp.TP[j]), "TC": int(sp.TC[j]), "NB": sp.banks,
                          "ports": sp.ports, "stackable": sp.stackable, "buffer": sp.buffer,
                          "score": float(found.pair_score[j])}
                         for j in others]
    return result


def evaluate_design(workload: Workload, board: Board, TR: int, TP: int, TC: int,
                    options: DSEOptions = DSEOptions(), allow_oversize: bool = False,
                    input_buffer: int | None = None) -> DSEResult:
    """The tables and figures of one given design (no search over <TR, TP, TC>).

    Its input banks, AXI ports, Stackable PEs and block input buffer are `options.banks`, `options.ports`,
    `options.stackable` and `options.buffer`, or, where None, the ones that fit and score best (ties:
    fewer ports, then fewer banks, then plain PEs, then no buffer; the most banks the batching uses,
    every HP port, Stackable PEs and no buffer when oversize designs are allowed). `input_buffer`: the
    words a half of a block input buffer the design already has (another model on a built design: its
    buffer is not resized). A design that does not fit the
    board is refused unless allow_oversize (for studies of other people's design points); its
    memory use is then reported as infinite.
    """
    options.validate(board)
    if min(TR, TP, TC) < 1:
        raise FluidError(f"design <{TR}, {TP}, {TC}>: every size must be >= 1")
    if input_buffer is not None:
        options = replace(options, buffer=input_buffer > 0)
    n_layers = len(workload.layers())
    clock = options.clock_mhz or board.clock_mhz
    if allow_oversize:
        return _finish(workload, board, options.resolved(options.given_stackable(), bool(input_buffer)), clock,
                       TR, TP, TC, score=None, n_designs=1, t0=time.perf_counter(), banks=options.given_banks(),
                       ports=options.given_ports(board), buffer_words=input_buffer or 0)
    d = (np.array([TR]), np.array([TP]), np.array([TC]))
    fits = [(p, nb, st, buf) for p in options.port_options(board) for nb in options.bank_options()
            for st in options.stackable_options() for buf in options.buffer_options()
            if feasible_designs(*d, board, options.bmax, n_layers, st, banks=nb, ports=p, buffer=buf)]
    if not fits:
        p, nb, st = options.port_options(board)[0], options.bank_options()[0], options.stackable_options()[0]
        res = design_resources(TR, TP, TC, board, options.bmax, n_layers, st, banks=nb, ports=p)
        need = buffers_bram36(TR, TP, TC, options.bmax, banks=nb)
        problems = over_limits(res, board, need) or ["no room for a block input buffer of a BRAM36 a bank"]
        raise FluidError(f"design <{TR}, {TP}, {TC}> with {nb} input banks and {p} AXI port{'s' * (p > 1)} does "
                         f"not fit {board.name} at Bmax {options.bmax}: " + "; ".join(problems))
    t0 = time.perf_counter()
    reps, counts = unique_layers(workload.layers())
    shapes = LayerShapes.of(reps)
    macs = float(workload.total_macs)
    scores = [space_scorer(Space(p, nb, st, d[1], d[2], d[0], buf), shapes, counts, options, board, clock, macs,
                           n_layers).score_bound(d[0], *d)[0][0] for p, nb, st, buf in fits]
    best = max(range(len(fits)), key=lambda i: (scores[i], [-int(v) for v in fits[i]]))
    p, nb, st, buf = fits[best]
    return _finish(workload, board, options.resolved(st, buf), clock, TR, TP, TC, score=None, n_designs=1, t0=t0,
                   banks=nb, ports=p, buffer_words=input_buffer)


def _finish(workload: Workload, board: Board, options: DSEOptions, clock: float, TR: int, TP: int, TC: int,
            score: float | None, n_designs: int, t0: float, banks: int, ports: int,
            buffer_words: int | None = None) -> DSEResult:
    """The design's plan, tables and resources. Its block input buffer (where `options` build one) is
    `buffer_words` a half, or, None, the largest it has room for cut to what its plan buffers."""
    layers = workload.layers()
    bpc = board.bus(clock, ports)
    shapes = LayerShapes.of(layers)
    n = len(layers)
    plan = LayerPlan([[0] * options.bmax for _ in layers], [[0] * options.bmax for _ in layers],
                     [[0] * options.bmax for _ in layers], [[False] * options.bmax for _ in layers],
                     [[False] * options.bmax for _ in layers])
    d = (np.array([[TR]]), np.array([[TP]]), np.array([[TC]]))
    buffer = options.given_buffer() and buffer_words != 0
    # the largest buffer the design has room for; then cut to what its buffered layers need
    room = (buffer_words if buffer_words is not None else
            int(buffer_words_fn(board, options.bmax, n, options.given_stackable(), banks, ports)(*d)[0, 0])) \
        if buffer else 0
    need = 0
    for b in range(1, options.bmax + 1):
        cands = choices(options.batching, b, options.given_stackable(), buffer)
        block_need: dict[Choice, np.ndarray] = {}
        best, arg = best_cycles(*d, shapes, b, cands, bpc, options.timing, banks, room, block_need)
        for li in range(len(layers)):
            if not np.isfinite(best[0, li]):
                raise FluidError(f"layer {layers[li].name!r} cannot run on <{TR}, {TP}, {TC}>")
            ch = cands[int(arg[0, li])]
            plan.cycles[li][b - 1] = int(best[0, li])
            plan.BR[li][b - 1] = ch.BR
            plan.k_code[li][b - 1] = ch.k_code
            plan.serial[li][b - 1] = ch.serial
            plan.buffered[li][b - 1] = ch.buffered
            if ch.buffered:
                need = max(need, int(block_need[ch][0, li]))
    total = [int(sum(plan.cycles[li][b] for li in range(len(layers)))) for b in range(options.bmax)]
    macs = workload.total_macs
    gops = [2.0 * (b + 1) * macs * clock * 1e6 / total[b] / 1e9 for b in range(options.bmax)]
    window = int(windows(np.array(TP)))
    words = buffer_words if buffer_words is not None else -(-need // window) * window
    resources = design_resources(TR, TP, TC, board, options.bmax, len(layers), options.given_stackable(), banks=banks,
                                 ports=ports, input_buffer=words)
    return DSEResult(board=board, options=options, clock_mhz=clock, workload=workload, TR=TR, TP=TP, TC=TC,
                     resources=resources, plan=plan, total_cycles=total, gops=gops,
                     peak_gops=2.0 * TP * TC * clock * 1e6 / 1e9, score=score, n_designs=n_designs,
                     seconds=time.perf_counter() - t0,
                     timing_proxy=design_timing(TR, TP, TC, options.bmax, banks=banks,
                                                buffer_per_bank=input_buffer_per_bank(TP, words)),
                     NB=banks, ports=ports, input_buffer=words)

