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

from dataclasses import dataclass, replace
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

    fill_base + ceil(log2 TPk): a row's trip from issue to the staging buffer
    plus the writer's set-up, paid once per layer (blocks stream back to back
    through the pipeline); step_overhead: fetcher cycles per weight step
    beyond its reads (0: the fetcher chains steps); dma_latency: a read
    command's trip to the core (paid where nothing hides it: the layer's
    first step, a pass that regroups the PEs); block_overhead: fetcher cycles
    per row block, pass_overhead per pass (+ one per group); layer_overhead:
    the fixed part of a layer's control (descriptor round trip, state
    changes, the last write's response). The control unit's planning, which
    depends on the layer, is priced exactly by `plan_cycles`.
    """

    word_bytes: int = 2
    fill_base: int = 6
    layer_overhead: int = 15
    step_overhead: int = 0
    dma_latency: int = 6
    block_overhead: int = 1
    pass_overhead: int = 1


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
    row_beats: np.ndarray      # beats of one weight row (one DMA command, on one port)


@dataclass(frozen=True)
class Bus:
    """How the DMA sees memory: AXI beats of `port_bytes`, `bytes_per_cycle` in all.

    Reads and writes are separate AXI channels. A DMA command of n words at a
    random 2-byte alignment costs (n + w - 1) / w beats on average (w words a
    beat): a short run still occupies whole beats, which is what makes narrow
    input rows expensive. With several ports (bytes_per_cycle > port_bytes),
    the DMA deals commands round-robin over them, so beats of different
    commands go out side by side: a beat costs port_bytes / bytes_per_cycle
    cycles. But the control unit issues one command a cycle and takes one
    response a cycle (in command order), so a stream of commands costs at
    least one cycle each: `stream` = max(commands, beats x beat cycles). On one
    port a command is at least one beat (or one zero-fill response), so the
    floor never binds there and one port's figures are the plain beat counts.
    """

    bytes_per_cycle: float
    port_bytes: float
    word_bytes: int = 2
    ports: int = 0             # AXI ports the commands are dealt over; 0: as many as the bandwidth needs

    COMMAND_CYCLES = 1.0
    """Cycles per DMA command: the fetcher issues, and the loader takes, one a cycle."""

    @classmethod
    def of(cls, bytes_per_cycle: float, port_bytes: float | None = None, word_bytes: int = 2,
           ports: int = 0) -> "Bus":
        return cls(bytes_per_cycle, bytes_per_cycle if port_bytes is None else min(port_bytes, bytes_per_cycle),
                   word_bytes, ports)

    @classmethod
    def of_ports(cls, n: int, port_bytes: float, word_bytes: int = 2) -> "Bus":
        """n AXI ports of `port_bytes` each at one beat a cycle (the RTL's `AxiDma(ports=n)` on an ideal memory)."""
        return cls.of(n * port_bytes, port_bytes, word_bytes, n)

    @property
    def n_ports(self) -> int:
        """AXI ports: `ports`, or the fewest whose beats carry `bytes_per_cycle`."""
        return self.ports or max(1, int(np.ceil(self.bytes_per_cycle / self.port_bytes - 1e-9)))

    @property
    def port_cycles(self) -> float:
        """Cycles one port takes per beat with every port busy (> 1 where the memory, not the ports, limits)."""
        return max(1.0, self.n_ports * self.beat_cycles)

    @property
    def beat_cycles(self) -> float:
        """Cycles one beat (or one zero-fill response) occupies the bus."""
        return self.port_bytes / self.bytes_per_cycle

    @property
    def words_per_beat(self) -> int:
        return max(1, int(self.port_bytes // self.word_bytes))

    def stream(self, beats: ArrayLike, commands: ArrayLike) -> np.ndarray:
        """Cycles of `commands` DMA commands moving `beats` beats (zero-fill responses count as
        beats): the busier of the command stream and the ports."""
        return np.maximum(np.asarray(commands) * self.COMMAND_CYCLES, np.asarray(beats) * self.beat_cycles)

    def beats(self, words: ArrayLike, runs: ArrayLike = 1, grain: ArrayLike = 1) -> np.ndarray:
        """Expected beats of `words` words cut into `runs` contiguous commands.

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
        return (np.asarray(words) + np.asarray(runs) * (wpb - grain)) / wpb

    def cycles(self, words: ArrayLike, runs: ArrayLike = 1, grain: ArrayLike = 1) -> np.ndarray:
        """Expected cycles to move `words` words cut into `runs` contiguous commands (`beats`, `stream`)."""
        return self.stream(self.beats(words, runs, grain), runs)


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
    in_beats: ArrayLike = 0.0    # beats (and zero-fill responses) of one input row over all steps
    in_runs: ArrayLike = 1.0     # DMA commands of one input row over all steps

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
                         np.maximum(1.0, self.bus.cycles(w, 1, grain)), self.bus.beats(w, 1, grain))

    def port_skew(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """Cycles by which a step's last response follows its command stream, on several ports.

        The DMA deals a step's commands (TPk weight rows of B_w beats, then m input runs
        of B_i) round-robin over N ports; a command's beats all move on its port, one a
        cycle, behind that port's earlier commands, and responses leave in command order,
        one a cycle. So the step's last response comes at max(stream, f_w + m, c - 1 + B_i)
        (c = TPk + m commands), f_w = max(TPk - 1 + B_w, (TPk - 1) mod N + ceil(TPk/N) B_w)
        being when the last weight row is in; `stream` = max(c, beats / N) is what `fetch`
        charges. The difference delays the step's hand-over to the core, which matters where
        the fetcher waits for it (`block`'s balance term, the prologue). 0 on one port: the
        beats already run one by one there (docs/rtl-agreement.md, "Several AXI ports").
        """
        n = self.bus.n_ports
        if n == 1:
            return np.zeros(np.broadcast(np.asarray(t), np.asarray(groups), self.n_p).shape)
        pc = self.bus.port_cycles
        in_runs = np.asarray(self.in_runs, dtype=float)
        m = np.asarray(t) * np.asarray(groups) * in_runs / self.n_p          # input commands a step
        b_in = np.asarray(self.in_beats) / np.maximum(in_runs, 1e-9) * pc     # cycles of one on its port
        b_w = tile.row_beats * pc
        c = self.TPk + m
        last_w = np.maximum(self.TPk - 1 + b_w, (self.TPk - 1) % n + _ceil_div(self.TPk, n) * b_w)
        stream = self.bus.stream(self.TPk * tile.row_beats + m * np.asarray(self.in_beats)
                                 / np.maximum(in_runs, 1e-9), c)
        return np.maximum(np.maximum(last_w + m, c - 1 + b_in) - stream, 0.0)

    def first_step(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """Reads of a block's first weight step (its weight rows, the bias, its input rows)."""
        return tile.first_weights + np.asarray(t) * groups * self.in_row / self.n_p

    def block(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, extra: ArrayLike = 0.0) -> np.ndarray:
        """One row block of t rows, a column tile, `groups` sample groups side by side.

        The fetcher issues the reads of each step (F cycles: one command a cycle,
        one beat a cycle) while the core computes the previous one, and runs up
        to two steps ahead, so a step takes max(t, F, (F + dma_latency) / 2): a
        step's data streams into the half the core releases as it starts the
        next step. `extra`: fetcher cycles spent before the block (a new pass's
        set-up). The writer drains the previous block on the write channel
        meanwhile.
        """
        t, groups = np.asarray(t), np.asarray(groups)
        tm = self.timing
        fetch = (tile.weights + t * groups * self.in_row + self.n_p * tm.step_overhead + tm.block_overhead
                 + np.asarray(extra))
        compute = self.n_p * t
        balance = (fetch + self.n_p * (tm.dma_latency + self.port_skew(t, tile, groups))) / 2
        steps = np.maximum(np.maximum(compute, fetch), balance)
        return np.maximum(steps, t * groups * tile.out_row)

    def prologue(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """The layer's first step is fetched before anything can compute."""
        tm = self.timing
        return self.first_step(t, tile, groups) + tm.dma_latency + tm.block_overhead + self.port_skew(t, tile, groups)

    def regroup(self, t_prev: ArrayLike, t_next: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """A pass with another group count waits for the core to empty (the input
        banks are placed by the group count): the round trip of its first step
        is not hidden behind compute, nor the previous pass's last step behind
        the fetch."""
        return self.timing.dma_latency + 1 + np.minimum(np.asarray(t_prev), self.first_step(t_next, tile, groups))

    def drain(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, step: ArrayLike = 0.0) -> np.ndarray:
        """After the last row: the pipeline empties and the last block is written out.
        `step`: the last block's step time, of which only its t rows of compute follow
        the last step's data (the model's body counts whole steps)."""
        fill = self.timing.fill_base + np.ceil(np.log2(self.TPk))
        t = np.asarray(t)
        return fill + t * groups * tile.out_row - np.maximum(np.asarray(step) - t, 0)


ROW_BITS = 24       # the control unit's wide divider (rows of a pass)


def plan_cycles(TR: ArrayLike, TC: ArrayLike, b: int, BR: int, BP: ArrayLike, packed: ArrayLike,
                npass: ArrayLike, same_last: ArrayLike, rows_full: ArrayLike, tre_full: ArrayLike,
                rows_last: ArrayLike, tre_last: ArrayLike) -> np.ndarray:
    """The control unit's per-layer planning (hw/sequencer.py), cycle for cycle.

    BP and BR*R by repeated addition (BP + BR cycles), the passes by repeated
    subtraction (npass), groups per pass and rows per group on a narrow
    sequential divider (bits_for(max(TR, 2TC)) + 2 cycles a division), and the
    balanced blocks of each pass kind on the 24-bit one (two divisions, only
    when a pass needs more than one block).
    """
    narrow = np.floor(np.log2(np.maximum(np.asarray(TR), 2 * np.asarray(TC)))) + 3
    wide = 2 * (ROW_BITS + 2)

    def kind(rows, tre):
        return narrow + np.where(np.asarray(rows) <= tre, 1, wide)

    per = np.where(npass == 1, kind(rows_last, tre_last),
                   kind(rows_full, tre_full) + np.where(same_last, 0, kind(rows_last, tre_last)))
    return BP + BR + npass + np.where(packed, narrow, 1) + per


def layer_costs(TPk: np.ndarray, P: np.ndarray, C: np.ndarray, taps: ArrayLike, bus: Bus,
                timing: EngineTiming, R: ArrayLike = 2, inside: ArrayLike = 1.0) -> LayerCosts:
    """Step count and input-row read cost of a layer whose P = taps * cin.

    A weight step reads TPk consecutive values of each im2col row; they are
    one contiguous run unless the step crosses from one kernel tap to the
    next (every cin values), which starts a new DMA command. Runs start at
    multiples of gcd(TPk, cin) words (pixels are cin words apart), except in
    a layer with one row and one tap per sample (an FC layer): its rows are
    the samples' 64-byte aligned tensors, so runs start at multiples of TPk.
    `inside`: the fraction of (row, tap) runs inside the input (`im2col_inside`);
    a run in the padding is a zero-fill command, one response and no beat.
    """
    taps = np.asarray(taps, dtype=np.int64)
    n_p = _ceil_div(P, TPk)
    cin = np.maximum(P // np.maximum(taps, 1), 1)
    # tap boundaries i*cin (0 < i < taps) that fall inside a step: those not on a multiple
    # of TPk, i.e. all but the multiples of TPk / gcd(TPk, cin)
    grain = _gcd(TPk, cin)
    crossings = (taps - 1) - (taps - 1) // (TPk // grain)
    runs = n_p + crossings
    align = np.where((np.asarray(R) == 1) & (taps == 1), TPk, grain)
    inside = np.asarray(inside, dtype=float)
    in_beats = inside * bus.beats(P, runs, align) + (1 - inside) * runs
    return LayerCosts(n_p, TPk, bus.stream(in_beats, runs), P, np.asarray(C), bus, timing, in_beats, runs)


def layer_inside(layer) -> float:
    """`im2col_inside` of a workload Layer (1.0 for FC and matmul layers)."""
    if getattr(layer, "kind", "conv") != "conv":
        return 1.0
    return im2col_inside(layer.in_hw, layer.out_hw, layer.kernel, layer.stride, layer.pads, layer.dilation)


def im2col_row_reads(geometry, TPk: int, bus: Bus) -> tuple[float, float, float]:
    """Exact read cycles of one im2col row over all weight steps, averaged over the rows.

    `geometry` names the convolution as a layer descriptor does (in_h, in_w,
    cin, out_h, out_w, kh, kw, sh, sw, ph, pw; HWC tensors with a pixel pitch
    of cin words from a beat-aligned sample base, as host_driver/memory_plan
    lays them out). Walks the runs of each step the way the RTL's fetcher
    cuts them (contiguous channels of one kernel tap) and charges each its
    actual beats at its actual alignment, or one response for a zero-fill run
    in the padding. This replaces the average-alignment estimate where the
    geometry is known (the RTL testbenches); the DSE uses the estimate.
    Returns (cycles, beats, commands), each per row (`LayerCosts.in_row`,
    `in_beats`, `in_runs`).
    """
    g = geometry
    wpb, cin = bus.words_per_beat, g.cin
    P = g.kh * g.kw * cin
    runs = []                                        # (ky, kx, word offset in the window, length)
    for p0 in range(0, P, TPk):
        p, end = p0, min(P, p0 + TPk)
        while p < end:
            tap, ci = divmod(p, cin)
            n = min(cin - ci, end - p)
            ky, kx = divmod(tap, g.kw)
            runs.append((ky, kx, (ky * g.in_w + kx) * cin + ci, n))
            p += n
    ky, kx, off, n = (np.asarray(x, dtype=np.int64)[None, :] for x in zip(*runs))
    oy, ox = (a.reshape(-1, 1) for a in np.meshgrid(np.arange(g.out_h), np.arange(g.out_w), indexing="ij"))
    iy0, ix0 = oy * g.sh - g.ph, ox * g.sw - g.pw
    inside = (iy0 + ky >= 0) & (iy0 + ky < g.in_h) & (ix0 + kx >= 0) & (ix0 + kx < g.in_w)
    start = (iy0 * g.in_w + ix0) * cin + off         # words from the sample base
    beats = (start % wpb + n + wpb - 1) // wpb
    cost = np.where(inside, beats, 1)
    rows = g.out_h * g.out_w
    return float(bus.stream(cost.sum(), cost.size)) / rows, float(cost.sum()) / rows, float(cost.size) / rows


def im2col_inside(in_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
                  stride: tuple[int, int] = (1, 1), pads: tuple[int, ...] = (0, 0),
                  dilation: tuple[int, int] = (1, 1)) -> float:
    """Fraction of a convolution's (output pixel, kernel tap) pairs that read the input,
    not the zero padding (pads: top, left[, bottom, right]); 1.0 without padding."""
    def axis(n_in: int, n_out: int, k: int, s: int, p: int, d: int) -> int:
        pos = np.arange(n_out)[:, None] * s - p + np.arange(k)[None, :] * d
        return int(((pos >= 0) & (pos < n_in)).sum())
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw) = in_hw, out_hw, kernel, stride, dilation
    return axis(ih, oh, kh, sh, pads[0], dh) * axis(iw, ow, kw, sw, pads[1], dw) / (oh * ow * kh * kw)


def layer_cycles(
    TR: ArrayLike, TP: ArrayLike, TC: ArrayLike,
    R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike,
    b: int, BR: int, k_code: int, bytes_per_cycle: float,
    timing: EngineTiming = DEFAULT_TIMING, taps: ArrayLike = 1, port_bytes: float | None = None,
    inside: ArrayLike = 1.0, geometry=None, ports: int = 0,
) -> np.ndarray:
    """Cycles to run one layer (all G convolution groups) for b samples.

    `taps` = kh*kw of a convolution (P = taps * cin); `port_bytes` = bytes of
    one AXI beat (default: one port carrying all of `bytes_per_cycle`); `ports`: AXI
    ports the DMA deals its commands over (0: bytes_per_cycle / port_bytes, rounded up);
    `inside` = `im2col_inside` of a padded convolution; `geometry` (a layer
    descriptor, scalar design only): price the input reads exactly
    (`im2col_row_reads`) instead of at their average alignment.
    Returns float cycles (np.inf where the mode does not exist on the design,
    e.g. k=1/2 with TP=1). Broadcasts over all array arguments.
    """
    if not 1 <= BR <= b:
        raise ValueError(f"BR must be in [1, b]: BR={BR}, b={b}")
    TRk, TPk, TCk = mode_dims(TR, TP, TC, k_code)
    exists = (TRk >= 1) & (TPk >= 1) & (TCk >= 1)
    TRk, TPk, TCk = np.maximum(TRk, 1), np.maximum(TPk, 1), np.maximum(TCk, 1)
    R, P, C, G = (np.asarray(x, dtype=np.int64) for x in (R, P, C, G))
    bus = Bus.of(bytes_per_cycle, port_bytes, timing.word_bytes, ports)
    costs = layer_costs(TPk, P, C, taps, bus, timing, R, inside)
    if geometry is not None:
        if np.ndim(TPk) != 0:
            raise ValueError("exact input reads (geometry=) price one design at a time")
        in_row, in_beats, in_runs = im2col_row_reads(geometry, int(TPk), bus)
        costs = replace(costs, in_row=np.asarray(in_row), in_beats=in_beats, in_runs=in_runs)

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

    full, last = costs.tile(w_full), costs.tile(w_last)
    n_f, s_f, big_f = split(rows_full, TRe)
    n_l, s_l, big_l = split(rows_last, TRh)
    t0_f, t0_l = np.where(big_f > 0, s_f + 1, s_f), np.where(big_l > 0, s_l + 1, s_l)
    regroups = (npass > 1) & (h != g)

    def column_tile_cycles(tile: TileCosts) -> np.ndarray:
        # each pass: its fetcher set-up (a cycle, one per group) before its first block
        full_pass = pass_cycles(rows_full, TRe, tile, g) + timing.pass_overhead + g
        last_pass = pass_cycles(rows_last, TRh, tile, h) + timing.pass_overhead + h
        # the last pass with fewer groups waits for the core to empty
        return ((npass - 1) * full_pass + last_pass + 1
                + np.where(regroups, costs.regroup(s_f, t0_l, tile, h), 0))

    body = (nct - 1) * column_tile_cycles(full) + column_tile_cycles(last)
    # the next column tile's first pass regroups again
    body = body + np.where(regroups, (nct - 1) * costs.regroup(s_l, t0_f, full, g), 0)
    first_rows, first_tre, first_groups = (np.where(npass == 1, rows_last, rows_full), np.where(npass == 1, TRh, TRe),
                                           np.where(npass == 1, h, g))
    n0, s0, big0 = split(first_rows, first_tre)
    # the first pass's set-up is in the prologue
    prologue = costs.prologue(np.where(big0 > 0, s0 + 1, s0), full, first_groups)
    last_block = costs.block(s_l, last, h)
    drain = costs.drain(s_l, last, h, last_block / costs.n_p)
    plan = plan_cycles(TR, TC, b, BR, BP, packed, npass, (h == g) & (rows_last == rows_full),
                       rows_full, TRe, rows_last, TRh)
    desc = 3 * costs.bus.cycles(16, 1, 16)          # three 16-word descriptor reads
    cycles = G * (body + prologue + drain + plan + desc) + timing.layer_overhead
    return np.where(exists, np.ceil(cycles - 1e-6), np.inf)  # tolerance: float sums in any order


def descriptor_cycles(TR: int, TP: int, TC: int, bytes_per_cycle: float, geometry, b: int, BR: int, k_code: int,
                      timing: EngineTiming = DEFAULT_TIMING, exact: bool = True, ports: int = 1) -> int:
    """Cycles of one layer given as a layer descriptor's geometry (npix, P, cout, in_h, in_w, out_h,
    out_w, kh, kw, sh, sw, ph, pw) on an engine with `ports` AXI ports of `bytes_per_cycle` each: how
    the RTL agreement and the bit-accurate ModelDevice price a layer. `exact`: input reads at their
    actual alignments (im2col_row_reads); False: at their average alignment, as the DSE prices GEMM shapes."""
    g = geometry
    inside = im2col_inside((g.in_h, g.in_w), (g.out_h, g.out_w), (g.kh, g.kw), (g.sh, g.sw), (g.ph, g.pw))
    return int(layer_cycles(TR, TP, TC, g.npix, g.P, g.cout, 1, b, BR, k_code, ports * bytes_per_cycle, timing,
                            taps=g.kh * g.kw, port_bytes=bytes_per_cycle, inside=inside,
                            geometry=g if exact else None, ports=ports))


def ideal_cycles(R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike, b: int, TP: ArrayLike, TC: ArrayLike) -> np.ndarray:
    """Cycles at 100% MAC utilisation: the peak-performance lower bound."""
    return np.asarray(G) * np.asarray(R) * np.asarray(P) * np.asarray(C) * b / (np.asarray(TP) * np.asarray(TC))
