"""Cycle-level performance model of the fluidnpu GEMM engine.

The engine and what each mode does to its loops is defined in
docs/interpretations.md ("The engine", "Fluid Batching", "Stackable PEs");
this module is that definition in numbers, and the RTL is checked against it.

In short, for a layer run at batch b with split BR and Stackable-PE mode k:

* k reshapes the engine: k=1 <TR,TP,TC>; k=2 <TR//2, 2TP, TC//2>;
  k=1/2 <TR//2, TP//2, 2TC>.
* The b samples form BP = ceil(b/BR) groups of (at most) BR samples. A group's
  samples are appended along R (its rows are the concatenation of its samples'
  rows). Groups are appended along P of the input matrix, i.e. side by side
  with their own input columns; in hardware a group owns a set of PE columns
  and its own input-buffer bank. When C <= TCk, g = min(BP, TCk // C) groups
  share one pass over the PE array (each group's row tile is then at most
  TRk // g rows, the input buffer being split between the groups); when
  C > TCk each group takes its own passes over ceil(C/TCk) column tiles.
* A pass is cut into the fewest balanced row blocks of at most TRe rows. A
  block runs ceil(P/TPk) weight steps of t cycles each (one row per cycle),
  overlapped with the DMA moving the block's weights (P x w words), inputs
  (t x P words per group) and outputs (t x w words per group):
  block cycles = max(compute, memory) + pipeline fill.

Everything is vectorised with numpy broadcasting: pass design parameters as
column vectors and layer shapes as row vectors to evaluate a whole design
space in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

ArrayLike = Union[int, float, np.ndarray]

# Two-bit FBCB encoding of the Stackable-PE mode.
K_CODE_TO_K: dict[int, float] = {0: 1.0, 1: 2.0, 2: 0.5}
K_TO_CODE: dict[float, int] = {v: c for c, v in K_CODE_TO_K.items()}
# Order in which modes are tried: ties keep the earlier (plain PEs first).
K_CODES: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class EngineTiming:
    """Fixed costs of the engine, in cycles, calibrated against the RTL (docs/rtl-agreement.md).

    fill_base + ceil(log2 TPk): a row's trip from issue to the staging buffer,
    paid once per layer (blocks stream back to back through the pipeline);
    step_overhead: per weight step, the fetcher's step set-up plus the DMA
    round trip that two buffer halves cannot hide; layer_overhead: descriptor
    fetch, per-layer planning (a few sequential divisions) and write drain.
    """

    word_bytes: int = 2
    fill_base: int = 5
    layer_overhead: int = 100
    step_overhead: int = 1
    dma_latency: int = 6


DEFAULT_TIMING = EngineTiming()


def mode_dims(TR: ArrayLike, TP: ArrayLike, TC: ArrayLike, k_code: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The engine shape <TRk, TPk, TCk> seen by a layer in Stackable-PE mode k."""
    TR, TP, TC = np.asarray(TR), np.asarray(TP), np.asarray(TC)
    if k_code == 0:
        return TR, TP, TC
    if k_code == 1:  # k = 2: pairs of PEs stack into one tree of width 2TP
        return TR // 2, TP * 2, TC // 2
    if k_code == 2:  # k = 1/2: each PE splits into two trees of width TP/2
        return TR // 2, TP // 2, TC * 2
    raise ValueError(f"unknown Stackable-PE mode code {k_code}")


def _ceil_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -(-a // b)


def _gcd(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """np.gcd over broadcast operands with few distinct values (designs x layers): a table
    of the distinct pairs, indexed -- np.gcd on the full grid is the DSE's slowest step."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    ua, ia = np.unique(a, return_inverse=True)
    ub, ib = np.unique(b, return_inverse=True)
    return np.gcd.outer(ua, ub)[ia.reshape(a.shape), ib.reshape(b.shape)]


@dataclass(frozen=True)
class TileCosts:
    """What a column tile of w weight columns costs to move, computed once per layer."""

    w: np.ndarray
    weights: np.ndarray        # all P weight rows + the tile's bias
    first_weights: np.ndarray  # the first step's weight rows + bias
    out_row: np.ndarray        # one output row of one group (the writer's command)


@dataclass(frozen=True)
class Bus:
    """How the DMA sees memory: AXI beats of `port_bytes`, `bytes_per_cycle` in all.

    Reads and writes are separate AXI channels. A DMA command of n words at a
    random 2-byte alignment costs (n + w - 1) / w beats on average (w words a
    beat): a short run still occupies whole beats, which is what makes narrow
    input rows expensive. With several ports, beats of different commands go
    out side by side: a beat costs port_bytes / bytes_per_cycle cycles.
    """

    bytes_per_cycle: float
    port_bytes: float
    word_bytes: int = 2

    @classmethod
    def of(cls, bytes_per_cycle: float, port_bytes: float | None = None, word_bytes: int = 2) -> "Bus":
        return cls(bytes_per_cycle, bytes_per_cycle if port_bytes is None else min(port_bytes, bytes_per_cycle),
                   word_bytes)

    @property
    def words_per_beat(self) -> int:
        return max(1, int(self.port_bytes // self.word_bytes))

    def cycles(self, words: ArrayLike, runs: ArrayLike = 1, grain: ArrayLike = 1) -> np.ndarray:
        """Expected cycles to move `words` words cut into `runs` contiguous commands.

        Commands start at multiples of `grain` words (e.g. gcd of run length
        and pitch); averaged over those alignments a run of n words (grain | n)
        takes exactly (n + wpb - grain) / wpb beats, wpb = words per beat.
        """
        wpb = self.words_per_beat
        grain = np.asarray(grain, dtype=np.int64)
        if wpb & (wpb - 1) == 0:                  # gcd with a power of two: the lowest set bit
            grain = np.minimum(grain & -grain, wpb)
        else:
            grain = np.gcd(grain, wpb)
        beats = (np.asarray(words) + np.asarray(runs) * (wpb - grain)) / wpb
        return beats * (wpb * self.word_bytes / self.bytes_per_cycle)


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer terms of the block cost, broadcast over designs and layers."""

    n_p: np.ndarray          # weight steps per block
    TPk: np.ndarray
    in_row: np.ndarray       # read cycles of one input row over all steps (im2col runs)
    P: np.ndarray
    C: np.ndarray
    bus: Bus
    timing: EngineTiming

    def _weights(self, rows: ArrayLike, w: np.ndarray, grain: np.ndarray) -> np.ndarray:
        """`rows` weight rows of w words (row pitch C) plus the tile's int32 bias."""
        return self.bus.cycles(np.asarray(rows) * w, rows, grain) + self.bus.cycles(2 * w, 1, 2 * w)

    def tile(self, w: ArrayLike) -> TileCosts:
        w = np.asarray(w)
        # only gcd(C, w, words per beat) matters: for a power-of-two beat, min of lowest set bits
        wpb = self.bus.words_per_beat
        grain = np.minimum(self.C & -self.C, w & -w) if wpb & (wpb - 1) == 0 else np.gcd(self.C, w)
        return TileCosts(w, self._weights(self.P, w, grain),
                         self._weights(np.minimum(self.TPk, self.P), w, grain),
                         np.maximum(1.0, self.bus.cycles(w, 1, grain)))

    def block(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """One row block of t rows, a column tile, `groups` sample groups side by side.

        Steps pipeline over two buffer halves: the reads of step s+1 (F
        cycles) overlap step s's t cycles of compute, and the fetch of step
        s+2 waits for step s to leave the buffers, so a step takes
        max(t, F + step_overhead, (F + step_overhead + dma_latency + t) / 2);
        the writer drains the previous block on the write channel meanwhile.
        """
        t, groups = np.asarray(t), np.asarray(groups)
        tm = self.timing
        fetch = tile.weights + t * groups * self.in_row + self.n_p * tm.step_overhead
        compute = self.n_p * t
        balance = (fetch + self.n_p * (tm.dma_latency + t)) / 2
        steps = np.maximum(np.maximum(compute, fetch), balance)
        return np.maximum(steps, t * groups * tile.out_row) + 1

    def prologue(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """The layer's first step is fetched before anything can compute."""
        return (tile.first_weights + np.asarray(t) * groups * self.in_row / self.n_p
                + self.timing.step_overhead + self.timing.dma_latency)

    def drain(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """After the last row: the pipeline empties and the last block is written out."""
        fill = self.timing.fill_base + np.ceil(np.log2(self.TPk))
        return fill + np.asarray(t) * groups * tile.out_row


def layer_costs(TPk: np.ndarray, P: np.ndarray, C: np.ndarray, taps: ArrayLike, bus: Bus,
                timing: EngineTiming) -> LayerCosts:
    """Step count and input-row read cost of a layer whose P = taps * cin.

    A weight step reads TPk consecutive values of each im2col row; they are
    one contiguous run unless the step crosses from one kernel tap to the
    next (every cin values), which starts a new DMA command.
    """
    taps = np.asarray(taps, dtype=np.int64)
    n_p = _ceil_div(P, TPk)
    cin = np.maximum(P // np.maximum(taps, 1), 1)
    # tap boundaries i*cin (0 < i < taps) that fall inside a step: those not on a multiple
    # of TPk, i.e. all but the multiples of TPk / gcd(TPk, cin)
    grain = _gcd(TPk, cin)
    crossings = (taps - 1) - (taps - 1) // (TPk // grain)
    in_row = bus.cycles(P, n_p + crossings, grain)
    return LayerCosts(n_p, TPk, in_row, P, np.asarray(C), bus, timing)


def layer_cycles(
    TR: ArrayLike, TP: ArrayLike, TC: ArrayLike,
    R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike,
    b: int, BR: int, k_code: int, bytes_per_cycle: float,
    timing: EngineTiming = DEFAULT_TIMING, taps: ArrayLike = 1, port_bytes: float | None = None,
) -> np.ndarray:
    """Cycles to run one layer (all G convolution groups) for b samples.

    `taps` = kh*kw of a convolution (P = taps * cin); `port_bytes` = bytes of
    one AXI beat (default: one port carrying all of `bytes_per_cycle`).
    Returns float cycles (np.inf where the mode does not exist on the design,
    e.g. k=1/2 with TP=1). Broadcasts over all array arguments.
    """
    if not 1 <= BR <= b:
        raise ValueError(f"BR must be in [1, b]: BR={BR}, b={b}")
    TRk, TPk, TCk = mode_dims(TR, TP, TC, k_code)
    exists = (TRk >= 1) & (TPk >= 1) & (TCk >= 1)
    TRk, TPk, TCk = np.maximum(TRk, 1), np.maximum(TPk, 1), np.maximum(TCk, 1)
    R, P, C, G = (np.asarray(x, dtype=np.int64) for x in (R, P, C, G))
    costs = layer_costs(TPk, P, C, taps, Bus.of(bytes_per_cycle, port_bytes, timing.word_bytes), timing)

    BP = -(-b // BR)
    n_last = b - (BP - 1) * BR          # samples in the last (possibly partial) group
    packed = C <= TCk
    g = np.where(packed, np.minimum(BP, TCk // np.maximum(C, 1)), 1)
    exists = exists & (TRk >= g)        # each packed group needs at least one buffer row
    TRe = np.maximum(TRk // g, 1)       # rows per block when g groups share the input buffer
    nct = _ceil_div(C, TCk)
    w_full = np.minimum(C, TCk)
    w_last = C - (nct - 1) * TCk
    npass = _ceil_div(np.int64(BP), g)
    h = BP - (npass - 1) * g            # groups in the last pass
    TRh = np.maximum(TRk // np.maximum(h, 1), 1)
    rows_full = BR * R
    rows_last = np.where(h == 1, n_last, BR) * R   # a partial group alone streams only its rows

    def split(rows: np.ndarray, tre: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n balanced blocks of a pass: the first `big` hold s+1 rows, the rest s."""
        n = _ceil_div(rows, tre)
        s = rows // n
        return n, s, rows - n * s

    def pass_cycles(rows: np.ndarray, tre: np.ndarray, tile: TileCosts, groups: np.ndarray) -> np.ndarray:
        """Every group of the pass streams all the pass's rows (a short group's extra rows
        are padding), so each block costs the same per row."""
        n, s, big = split(rows, tre)
        return (n - big) * costs.block(s, tile, groups) + big * costs.block(s + 1, tile, groups)

    def column_tile_cycles(tile: TileCosts) -> np.ndarray:
        return (npass - 1) * pass_cycles(rows_full, TRe, tile, g) + pass_cycles(rows_last, TRh, tile, h)

    full, last = costs.tile(w_full), costs.tile(w_last)
    body = (nct - 1) * column_tile_cycles(full) + column_tile_cycles(last)
    first_rows, first_tre, first_groups = (np.where(npass == 1, rows_last, rows_full), np.where(npass == 1, TRh, TRe),
                                           np.where(npass == 1, h, g))
    n0, s0, big0 = split(first_rows, first_tre)
    prologue = costs.prologue(np.where(big0 > 0, s0 + 1, s0), full, first_groups)
    _, s_end, _ = split(rows_last, TRh)
    drain = costs.drain(s_end, last, h)
    cycles = G * (body + prologue + drain) + timing.layer_overhead
    return np.where(exists, np.ceil(cycles - 1e-6), np.inf)  # tolerance: float sums in any order


def ideal_cycles(R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike, b: int, TP: ArrayLike, TC: ArrayLike) -> np.ndarray:
    """Cycles at 100% MAC utilisation: the peak-performance lower bound."""
    return np.asarray(G) * np.asarray(R) * np.asarray(P) * np.asarray(C) * b / (np.asarray(TP) * np.asarray(TC))
