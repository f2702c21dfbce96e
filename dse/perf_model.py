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
  and its own input-buffer bank. When C <= TCk, g = min(BP, TCk // C, NB) groups
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

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import NamedTuple, cast

import numpy as np

from fluidnpu.hw.regmap import (
    FETCH_AHEAD,
    K_CODES,
    ROW_BITS,
    KCode,
    buffer_window,
    fill_chunk,
    k_dims,
    mode_depth,
    nmax,
)

ArrayLike = int | float | np.ndarray
# one kind of step as `LayerCosts._walk` takes it: weight commands, weight beats, input commands, input
# beats, steps
StepKind = tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike, ArrayLike]
BlockPrice = Callable[..., list]   # `LayerCosts.blocks` or `LayerCosts.stagings`: a block's price in column tiles
# a layer priced for the DSE's bound and as it is side by side, along a leading axis of their own (the DSE's
# arrays have at most three: splits, designs, layers): side 0 without the several-port skew (`LayerCosts.skew`)
# and a buffered layer with the bound's fill (`FillShape.sided`), side 1 as it is (`layer_cycles_bound`)
SIDES = np.array([0.0, 1.0]).reshape(2, 1, 1, 1)


@dataclass(frozen=True)
class EngineTiming:
    """Fixed costs of the engine, in cycles, calibrated against the RTL (docs/rtl-agreement.md).

    fill_base + the adder pipeline (`regmap.mode_depth`: the DSP cascades and the
    tree over their outputs): a row's trip from issue to the staging buffer
    plus the writer's set-up, paid once per layer (blocks stream back to back
    through the pipeline); step_overhead: fetcher cycles per weight step
    beyond its reads (0: the fetcher chains steps); dma_latency: a read
    command's trip to the core (paid where nothing hides it: the layer's
    first step, a pass that regroups the PEs); block_overhead: fetcher cycles
    per row block, pass_overhead per pass (+ one per group); layer_overhead:
    the fixed part of a layer's control (descriptor round trip, state
    changes, the last write's response). The control unit's planning, which
    depends on the layer, is priced exactly by `plan_cycles`. stage_turn: the
    staging loop's fixed cycles beyond fill_base + the pipeline, a block's rows
    and its writes (`LayerCosts.staging`): 3 from a block's last step handed
    over to its first row in the MACs, 1 from its last write to the next
    hand-over that waits for its half (traced, docs/rtl-agreement.md).

    The register stages the timing proxy asks for (docs/resources.md, "Timing
    proxy") are priced where the RTL adds them: the requantiser's stage adds 1
    to fill_base (6 -> 7), the read-command slice 1 to dma_latency (6 -> 7:
    every read's trip) and 1 to layer_overhead (the descriptor's read), the
    DMA's per-port command slices of the two walkers another 1 to dma_latency
    (7 -> 8; hw/dma.py, `read_streams=2`), the
    write-command slice 1 to layer_overhead (the last write; 15 -> 17 in all);
    the response skid buffer adds none (it passes a response in the cycle it
    comes while the loader takes it).

    port_restart: on several ports, the cycles a step takes beyond its beats
    on the ports where those bind: its reads wait in the ports until the core
    releases the staging half they fill, and then restart through the DMA's
    in-order merge (`LayerCosts.block`; fitted on the several-port agreement
    cases, docs/rtl-agreement.md; one port pays none).
    """

    word_bytes: int = 2
    fill_base: int = 7
    stage_turn: int = 4
    layer_overhead: int = 18
    step_overhead: int = 0
    dma_latency: int = 8
    block_overhead: int = 1
    pass_overhead: int = 1
    port_restart: float = 0.75


DEFAULT_TIMING = EngineTiming()


def mode_dims(TR: ArrayLike, TP: ArrayLike, TC: ArrayLike, k_code: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The engine shape <TRk, TPk, TCk> seen by a layer in Stackable-PE mode k."""
    if k_code not in K_CODES:
        raise ValueError(f"unknown Stackable-PE mode code {k_code}")
    return k_dims(np.asarray(TR), np.asarray(TP), np.asarray(TC), k_code)


def _unpadded(pad: ArrayLike) -> bool:
    """A block without a short group's padding rows (`LayerCosts.block`'s `pad` a scalar 0, as in most)."""
    return np.ndim(pad) == 0 and pad == 0


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
    weights: np.ndarray        # all P weight rows + the tile's bias, on one command stream (cycles)
    out_row: np.ndarray        # one output row of one group (the writer's command)
    row_beats: np.ndarray      # beats of one weight row's first copy (one DMA command, on one port)
    copies_beats: np.ndarray   # beats of one weight row's copies, one per group (that many commands)
    last_copy_beats: np.ndarray  # beats of the last group's copy, the longest (w * groups words)
    weight_cmds: ArrayLike = 0.0       # `weights`' commands alone (cycles at the command rate) ...
    weight_beats: ArrayLike = 0.0      # ... and its beats alone (cycles on the ports): the weight walker's
    first_weight_cmds: ArrayLike = 0.0  # the same of the first step's weight rows + bias
    first_weight_beats: ArrayLike = 0.0
    last_weight: ArrayLike = 0.0       # several ports: when a step's last weight copy is in (`port_skew`'s f_w) ...
    groups: np.ndarray | None = None    # ... for the groups the tile was priced for (`LayerCosts.tile`)


def astuple_shallow(tile: TileCosts | LayerParts) -> tuple[np.ndarray, ...]:
    """A TileCosts' (or LayerParts') arrays in field order (dataclasses.astuple would deep-copy them)."""
    return tuple(getattr(tile, f.name) for f in fields(tile))


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
    command_cycles: float = 1.0
    """Cycles per DMA command: the fetcher issues, and the loader takes, one a cycle (0: the what-if of
    a control unit without that limit, benchmarks/peak_gap.py)."""
    walkers: int = 2
    """2: the RTL, whose weight walker and input walker issue side by side on two command streams,
    the DMA dealing a command of each a cycle and the loader taking a response of each a cycle
    (`LayerCosts.fetch`; docs/hw-architecture.md, "Two walkers"). 1: the what-if
    (benchmarks/peak_gap.py) of a fetcher with one walker, a step's weight reads and then its input reads
    on one command stream."""
    gather: bool = False
    """False: the RTL, one DMA command per im2col run (a kernel row's piece of a step, or a tap where
    the row meets the padding's edge, `layer_costs`). True: the what-if of a command that gathers all
    of a step's input row, across kernel rows and the padding (benchmarks/peak_gap.py)."""

    @classmethod
    def of(cls, bytes_per_cycle: float, port_bytes: float | None = None, word_bytes: int = 2,
           ports: int = 0, command_cycles: float = 1.0, walkers: int = 2, gather: bool = False) -> Bus:
        return cls(bytes_per_cycle, bytes_per_cycle if port_bytes is None else min(port_bytes, bytes_per_cycle),
                   word_bytes, ports, command_cycles, walkers, gather)

    @classmethod
    def of_ports(cls, n: int, port_bytes: float, word_bytes: int = 2) -> Bus:
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
    def zero_beats(self) -> float:
        """Beats a zero-fill input read is charged on the ports: one (its response holds a port's response
        register for a cycle, and is dealt a port like any read) on one port or with one walker; none on
        several ports with two walkers, where the DMA answers the input stream's zero reads itself, in
        their place in the stream's order, without a port (hw/dma.py, `AxiDma`; docs/interpretations.md,
        "Zero fills on several ports")."""
        return 1.0 if self.n_ports == 1 or self.walkers == 1 else 0.0

    @property
    def words_per_beat(self) -> int:
        return max(1, int(self.port_bytes // self.word_bytes))

    def stream(self, beats: ArrayLike, commands: ArrayLike) -> np.ndarray:
        """Cycles of `commands` DMA commands moving `beats` beats (zero fills count as `zero_beats`):
        the busier of the command stream and the ports."""
        return np.maximum(np.asarray(commands) * self.command_cycles, np.asarray(beats) * self.beat_cycles)

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

    def reads_in(self, words: int, n: int) -> float:
        """Cycles until the last of n reads of `words` beat-aligned words is in, issued one a cycle and
        dealt round-robin over the ports: a read's beats all move on its port, so on several ports the
        last read's beats follow its command (n - 1 + B) and a port's reads follow one another
        (ceil(n / N) B), beside the stream that `cycles` charges (the layer descriptor's three reads:
        12 cycles on one 64-bit port, 6 on four, 8 on two)."""
        one = float(self.beats(words, 1, words)) * self.port_cycles
        return max(n * float(self.cycles(words, 1, words)), (n - 1) * self.command_cycles + one,
                   -(-n // self.n_ports) * one)


FILL_PIPELINE = 6   # cycles from a block's last fill response to its first run answered (hw/buffered_input.py)


@functools.lru_cache(maxsize=8)
def _window_table(top: int) -> np.ndarray:
    return np.array([buffer_window(max(t, 1)) for t in range(top + 1)], dtype=np.int64)


def windows(TP: np.ndarray) -> np.ndarray:
    """`regmap.buffer_window` of every TP in an array (looked up: TPs repeat across a design space)."""
    TP = np.asarray(TP, dtype=np.int64)
    top = int(TP.max(initial=1))
    return _window_table(max(1 << top.bit_length(), 64))[TP]


def fill_chunks(TP: np.ndarray, TC: np.ndarray) -> np.ndarray:
    """`regmap.fill_chunk` of every <TP, TC> in arrays: whole windows where NMAX holds one, else the
    largest power of two up to NMAX (frexp gives it exactly)."""
    nm, win = np.asarray(nmax(TP, TC), dtype=np.int64), windows(TP)
    return np.where(nm >= win, nm // win * win, np.ldexp(1, np.frexp(nm)[1] - 1).astype(np.int64))


@dataclass(frozen=True)
class FillShape:
    """A buffered layer's input as the block input buffer's fill walker reads it (hw/fill_walker.py):
    for each sample a block reaches, the input rows its output rows' windows cover, whole rows of
    `row_words` words (in_w x pixel pitch), in reads of up to `chunk` words. Priced at a block's
    average alignment: t consecutive output pixels touch (t + out_w - 1) / out_w output rows."""

    out_w: np.ndarray
    out_h: np.ndarray
    in_h: np.ndarray
    sh: np.ndarray
    kh: np.ndarray
    row_words: np.ndarray
    chunk: ArrayLike          # words a fill read moves (an array over designs in the DSE)
    rate: ArrayLike | None = None   # set: a block of t rows fills rate * t input rows (the DSE's bound)
    sided: bool = False       # with `rate`: rate * t on the bound's side of `SIDES`, its own rows on the other

    @classmethod
    def of(cls, TP: ArrayLike, TC: ArrayLike, out_w: ArrayLike, out_h: ArrayLike, in_h: ArrayLike, sh: ArrayLike,
           kh: ArrayLike, row_words: ArrayLike) -> FillShape:
        """The fill on an engine of <TP, TC> (its buffer's fill chunk) of a layer, or of many as arrays
        (designs as arrays too: the DSE's design spaces)."""
        w, h, ih, s, k, rw = (np.asarray(v) for v in (out_w, out_h, in_h, sh, kh, row_words))
        if np.ndim(TP) == 0 and np.ndim(TC) == 0:
            chunk: ArrayLike = fill_chunk(int(nmax(int(TP), int(TC))), buffer_window(int(TP)))
        else:
            chunk = fill_chunks(np.asarray(TP), np.asarray(TC))
        return cls(w, h, ih, s, k, rw, chunk=chunk)

    def linear(self, t_lo: ArrayLike, t_hi: ArrayLike) -> FillShape:
        """A fill linear in a block's rows, below this one for every block of t_lo..t_hi rows: the fewest
        input rows a block row fills on that range, at each of its ends and at one sample's pixels
        (between them the rows a row fills are monotone: c + a / t, in_h / t). The DSE's lower bound on a
        buffered layer (a block's cost stays convex in its rows; docs/interpretations.md)."""
        t_lo, t_hi = np.asarray(t_lo, dtype=float), np.asarray(t_hi, dtype=float)
        npix = self.out_w * self.out_h
        rate = np.minimum.reduce([self.rows(t)[1] / t for t in (t_lo, np.clip(npix, t_lo, t_hi), t_hi)])
        # a hair below: rate * t must not round above rows(t) where the reads' count is a ceiling
        return replace(self, rate=rate * (1 - 1e-12))

    def rows(self, t: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """(output rows, input rows) a block of t rows (output pixels) of one group touches; a block
        longer than a sample reads its samples' whole inputs and a partial window row at each end."""
        t = np.asarray(t, dtype=float)
        rows_out = (t + self.out_w - 1) / self.out_w
        if self.rate is not None and not self.sided:
            return rows_out, self.rate * t
        npix = self.out_w * self.out_h
        within = np.minimum((rows_out - 1) * self.sh + self.kh, self.in_h)
        across = t / npix * self.in_h + np.maximum(self.kh - self.sh, 0)
        rows_in = np.where(t <= npix, within, across)
        return rows_out, rows_in if self.rate is None else np.where(SIDES == 0, self.rate * t, rows_in)

    def words(self, t: ArrayLike) -> np.ndarray:
        """Words a block of t rows of one group fills."""
        return self.rows(t)[1] * self.row_words

    def walk(self, t: ArrayLike) -> np.ndarray:
        """The fill walker's cycles before its first read of a block of one group: an output row a
        cycle, an input row a cycle, its SPAN and REGION states."""
        rows_out, rows_in = self.rows(t)
        return rows_out + rows_in + 2


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
    bias_chunk: ArrayLike = 8    # int32 biases one read moves (NMAX / 2 = max(TP, TC, 8))
    in_beats: ArrayLike = 0.0    # beats (and zero-fill responses) of one input row over all steps
    in_runs: ArrayLike = 1.0     # DMA commands of one input row over all steps
    skew: bool | np.ndarray = True  # False: price steps without `port_skew` (the DSE's lower bound);
                                    # `SIDES`: without it and with it side by side (`layer_cycles_bound`)
    depth: ArrayLike = 0         # the engine's adder pipeline in this mode (`regmap.mode_depth`)
    first_beats: ArrayLike = 0.0  # a block's first rows of its steps, read one run a tap: beats and
    first_runs: ArrayLike = 0.0   # commands beyond in_beats and in_runs (`layer_costs`)
    split_steps: ArrayLike = 0.0  # steps of a block in which a kernel row ends, so every row reads two runs;
    split_runs: ArrayLike = 0.0   # one row's commands and beats in those steps (parts of in_runs, in_beats):
    split_beats: ArrayLike = 0.0  # `fetch` prices those steps apart from the others
    row_excess: ArrayLike = 0.0   # cycles of one input row over all steps by which its step's rows, each
                                  # paced by its own commands or beats, outlast the step's sums
                                  # (`im2col_row_reads`; in the DSE `row_excess_estimate`)
    fill: FillShape | None = None  # buffered (hw/buffered_input.py): the input runs are answered from
                                   # chip memory, and each row block's input is filled a row block ahead
    fill_tiles: ArrayLike = 1      # column tiles a row block runs (hw/seq_fetcher.py): its fill is read
                                   # once, behind the previous row block's steps in all of them

    def fill_cycles(self, t: ArrayLike, groups: ArrayLike) -> np.ndarray:
        """Cycles on the ports of a block's fill (t rows in each of `groups` groups)."""
        f = self.fill
        assert f is not None
        words = f.words(t) * np.asarray(groups)
        reads = np.ceil(words / f.chunk)
        return self.bus.stream(self.bus.beats(words, reads), reads)

    def first_fill(self, t: ArrayLike, groups: ArrayLike) -> np.ndarray:
        """A layer's first block waits for its own fill: the walker, the reads, a round trip, the pipeline."""
        f = self.fill
        assert f is not None
        return (f.walk(t) * np.asarray(groups) + self.fill_cycles(t, groups) + self.timing.dma_latency
                + FILL_PIPELINE)

    @property
    def first_extra(self) -> np.ndarray:
        """Read cycles of a block's first rows of its steps beyond `in_row`, on one command stream."""
        runs = np.asarray(self.in_runs)
        return self.bus.stream(np.asarray(self.in_beats) + self.first_beats, runs + self.first_runs) - self.in_row

    def _weights(self, rows: ArrayLike, w: np.ndarray, grain: np.ndarray, groups: ArrayLike,
                 copies: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`rows` weight rows of w words (row pitch C) plus the tile's int32 bias, for `groups`
        sample groups side by side: (cycles on one command stream, commands alone, beats alone), each
        in cycles. Every group's copy is a read of its own (the core has no replication network,
        docs/hw-architecture.md): group q reads the row q*w words early (a packed pass has w = C =
        cw), (q + 1)*w words, so a row costs G reads of w*G(G+1)/2 words in all; the bias likewise,
        one set of chunk reads per group (`copies`: `_bias_copies`, on the ports)."""
        bus = self.bus
        g = np.asarray(groups)
        rows = np.asarray(rows)
        reads = rows * g
        row_beats = bus.beats(rows * w * g * (g + 1) // 2, reads, grain)
        bias_beats = bus.beats(2 * w, 1, 2 * w)
        cycles = bus.stream(row_beats, reads) + bus.stream(bias_beats, 1) + copies
        return cycles, (reads + 1) * bus.command_cycles, (row_beats + bias_beats) * bus.beat_cycles + copies

    def _bias_copies(self, w: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Reads of groups q >= 1's bias, beat for beat (hw/sequencer.py, state BIAS): group q's
        columns [q*w, (q+1)*w) are covered by the NMAX/2-column chunks from the one holding
        column q*w, each read q*w int32 before the logical column it lands in, from a 64-byte
        aligned bias array (a packed pass is the layer's only column tile)."""
        wpb = self.bus.words_per_beat
        shape = np.broadcast(w, groups, self.bias_chunk).shape
        total = np.zeros(shape)
        packed = np.broadcast_to(groups, shape) > 1      # only packed passes copy (the DSE's few)
        if not packed.any():
            return total
        w, groups, bw = (np.broadcast_to(x, shape)[packed] for x in (w, groups, self.bias_chunk))
        copies = np.zeros(w.shape)
        n_chunks = int(np.max(-(-(w + bw - 1) // bw)))    # chunks that cover w columns from any offset
        for q in range(1, int(np.max(groups))):
            lo = q * w
            b0 = lo // bw * bw
            for i in range(n_chunks):
                col = b0 + i * bw                          # the chunk's first logical column
                n = 2 * np.clip(lo + w - col, 0, bw)       # words of this read (0: no read)
                beats = ((2 * (col - lo)) % wpb + n + wpb - 1) // wpb
                copies = copies + np.where((q < groups) & (n > 0), beats, 0)
        total[packed] = copies
        return total * (wpb * self.bus.word_bytes / self.bus.bytes_per_cycle)

    def tile(self, w: ArrayLike, groups: ArrayLike = 1) -> TileCosts:
        """A column tile of w columns run by `groups` sample groups side by side."""
        w = np.asarray(w)
        # only gcd(C, w, words per beat) matters: for a power-of-two beat, min of lowest set bits
        wpb = self.bus.words_per_beat
        grain = np.minimum(self.C & -self.C, w & -w) if wpb & (wpb - 1) == 0 else np.gcd(self.C, w)
        g = np.asarray(groups)
        copies = self._bias_copies(w, g)
        weights, cmds, beats = self._weights(self.P, w, grain, g, copies)
        _, first_cmds, first_beats = self._weights(np.minimum(self.TPk, self.P), w, grain, g, copies)
        copies_beats, last_copy_beats = self.bus.beats(w * g * (g + 1) // 2, g, grain), self.bus.beats(w * g, 1, grain)
        return TileCosts(w, weights, np.maximum(1.0, self.bus.cycles(w, 1, grain)), self.bus.beats(w, 1, grain),
                         copies_beats, last_copy_beats, cmds, beats, first_cmds, first_beats,
                         self._last_weight(g, copies_beats, last_copy_beats), g)

    def _last_weight(self, groups: np.ndarray, copies_beats: np.ndarray, last_copy_beats: np.ndarray) -> ArrayLike:
        """`port_skew`'s f_w, when a step's last weight copy is in: the same in every block of a tile run by
        the groups it was priced for, so priced with it (0 on one port, where there is no skew)."""
        n = self.bus.n_ports
        if n == 1:
            return 0.0
        pc = self.bus.port_cycles
        n_w = self.TPk * groups                                                # weight commands a step
        b_last = last_copy_beats * pc
        b_port = np.where(n % groups == 0, b_last, copies_beats / groups * pc)
        return np.maximum(n_w - 1 + b_last, (n_w - 1) % n + _ceil_div(n_w, n) * b_port)

    def port_skew(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """Cycles by which a step's last response follows its command stream, on several ports.

        The DMA deals a step's commands (TPk weight rows, each as G copies, one per packed
        group, group q's (q + 1) w words long; then m input runs of B_i beats) round-robin
        over N ports; a command's beats all move on its port, one a cycle, behind that
        port's earlier commands, and responses leave in command order, one a cycle. So the
        step's last response comes at max(stream, f_w + m, c - 1 + B_i) (c = n_w + m
        commands, n_w = TPk G), f_w = max(n_w - 1 + B_G, (n_w - 1) mod N + ceil(n_w/N) B_port)
        being when the last weight copy is in (`TileCosts.last_weight`): B_G the last (longest) copy's beats, B_port
        the copies' a port carries -- the longest where G divides N (a port then always
        gets the same group's copy, and one port the last group's), else their mean;
        `stream` = max(c, beats / N) is what `fetch` charges (with two walkers: their longer
        command stream without the weight walker's cycle a step, `_walk`'s `handover`). The
        difference delays the step's hand-over to the core, which matters where the fetcher
        waits for it (`block`'s balance term, the prologue). 0 on one port: the
        beats already run one by one there (docs/rtl-agreement.md, "Several AXI ports").
        """
        n = self.bus.n_ports
        if n == 1 or self.skew is False:
            return np.zeros(np.broadcast(np.asarray(t), np.asarray(groups), self.n_p).shape)
        d_weights, d_inputs = self._skew_terms(t, tile, groups)
        return self._sides(np.maximum(np.maximum(d_weights, d_inputs), 0.0))

    def _sides(self, skew: np.ndarray) -> np.ndarray:
        """The skew as priced: itself, or 0 on the bound's side of `SIDES` and itself on the other."""
        return skew if self.skew is True else skew * self.skew

    def _skew_terms(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """`port_skew` before its max: (the step's hand-over after its last weight row, last input run
        out) - stream. Each is linear minus convex in t (m, c and the beats grow linearly with t), so
        concave in t."""
        pc = self.bus.port_cycles
        m, beats_in = self._step_inputs(t, groups)
        b_in = beats_in * pc                                                  # cycles of one on its port
        n_w = self.TPk * groups                                                # weight commands a step
        last_w = (tile.last_weight if groups is tile.groups
                  else self._last_weight(np.asarray(groups), tile.copies_beats, tile.last_copy_beats))
        beats = self.TPk * tile.copies_beats + m * beats_in
        if self.bus.walkers == 1:
            c = n_w + m
            stream = self.bus.stream(beats, c)
            return last_w + m - stream, c - 1 + b_in - stream
        # two walkers: the step's m input runs are dealt beside its n_w weight copies, and the DMA's merge
        # gives each stream its own next response (hw/dma.py), so the input runs dealt after the last
        # weight copy do not hold it back. Measured from the cycle after the step's last command (not
        # the weight walker's spare cycle, which follows it: `_walk(handover=True)`), as the one-port
        # calibration of `dma_latency` measures the trip, which already holds the hand-over's cycle
        stream = np.maximum(np.maximum(n_w, m) * self.bus.command_cycles, beats * self.bus.beat_cycles)
        return last_w - stream, m - 1 + b_in - stream

    def _step_inputs(self, t: ArrayLike, groups: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """(input runs a step for `groups` groups of t rows, beats of one run)."""
        runs_per_step, beats_per_run = self._run_terms
        return t * groups * runs_per_step, beats_per_run

    @functools.cached_property
    def _run_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """(an input row's runs a step, beats of one run): `_step_inputs`' per-layer part."""
        in_runs = np.asarray(self.in_runs, dtype=float)
        return in_runs / self.n_p, np.asarray(self.in_beats) / np.maximum(in_runs, 1e-9)

    def busiest_port(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray | None:
        """Cycles a step keeps its busiest port busy where the round-robin deal repeats every step
        with each group's copies on ports of their own (0 elsewhere); None where no step can (one port,
        no packed groups, or priced without the skew, as the DSE's bound is).

        A step deals c = TPk G + m commands over N ports; when G divides N and c (m/G whole), command i
        always lands on a port of residue i mod G, so the N/G ports of residue G - 1 carry every
        row's longest copy (B_G beats) and m/N input runs each: (TPk G B_G + m B_i) / N beats, more
        than the even share `fetch` charges (the copies average (G + 1)/2 of B_G's length). Measured:
        a packed FC step on 2 ports, 14 beats on one port against 11 (docs/rtl-agreement.md)."""
        n = self.bus.n_ports
        g = np.asarray(groups)
        if n == 1 or self.skew is False or not np.any(g > 1):
            return None
        if self.bus.walkers == 2:
            # two walkers: the DMA starts each layer's deal at port 0 (`rd_restart`), and a pair of reads
            # split by a busy port shifts the rest of the deal, which spreads the long copies: the packed
            # FC step above loads its busiest port 7.1 beats a step against an even share of 6.8
            # (docs/rtl-agreement.md), so the even share `fetch` charges stands
            return None
        m, b_in = self._step_inputs(t, g)
        per_group = m / g                                                      # input runs a group
        repeats = (g > 1) & (n % g == 0) & np.isclose(per_group, np.rint(per_group))
        beats = self.TPk * g * tile.last_copy_beats + m * b_in
        return self._sides(np.where(repeats, beats * self.bus.port_cycles / n, 0.0))

    def port_skew_floor(self, t_lo: ArrayLike, t_hi: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """A lower bound on `port_skew` at every t in [t_lo, t_hi]: each of its concave terms
        (`_skew_terms`) is smallest at an end of the range (the DSE's bound on the
        prologue)."""
        if self.bus.n_ports == 1:
            return np.zeros(np.broadcast(np.asarray(t_lo), np.asarray(t_hi), np.asarray(groups), self.n_p).shape)
        (w_lo, i_lo), (w_hi, i_hi) = (self._skew_terms(x, tile, groups) for x in (t_lo, t_hi))
        return np.maximum(np.maximum(np.minimum(w_lo, w_hi), np.minimum(i_lo, i_hi)), 0.0)

    def first_step(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike) -> np.ndarray:
        """Reads of a block's first weight step (its weight rows, the bias, its input rows)."""
        t, groups = np.asarray(t), np.asarray(groups)
        rows = t * groups / self.n_p
        in_cmds = (rows * np.asarray(self.in_runs) + self.first_runs / self.n_p) * self.bus.command_cycles
        in_beats = (rows * np.asarray(self.in_beats) + self.first_beats / self.n_p) * self.bus.beat_cycles
        return self._walk(tile.first_weight_cmds, tile.first_weight_beats, in_cmds, in_beats, 1)

    def _walk(self, w_cmds: ArrayLike, w_beats: ArrayLike, in_cmds: ArrayLike, in_beats: ArrayLike,
              steps: ArrayLike, rate: bool = False, handover: bool = False) -> np.ndarray:
        """Cycles the fetcher takes to issue `steps` steps' reads: weight and input commands (in cycles
        at the command rate) and their beats (in cycles on the ports).

        Two walkers (the RTL): the longer command stream or the beats of both, whichever binds; the
        weight walker's stream pays a cycle a step, as the next step starts only in the cycle after
        it has finished (hw/seq_fetcher.py). Every step of a block has the same
        rows, so the sum over steps of the longer stream is the longer of the sums (the first step's
        bias and first rows aside). On one port the DMA takes one command a cycle, so both streams'
        commands queue for it; with `rate` (the pace of steps back to back, `block`) a step whose
        weight walker finishes last also leaves the port a cycle empty, priced by its convex envelope
        (docs/interpretations.md, "Two walkers on one port"). `handover`: to the cycle after the steps'
        last commands, not to the next step's start: on several ports the weight walker's cycle a step
        follows its last command and delays the next step, not this one's data (`block`'s balance
        term times a step's hand-over; docs/interpretations.md, "The hand-over on several ports"). One
        walker (`Bus.walkers` = 1, a what-if): the commands and the beats of both in one stream."""
        beats = w_beats + in_beats
        if self.bus.walkers == 1:
            return np.maximum(w_cmds + in_cmds, beats)
        cc = self.bus.command_cycles
        if self.bus.n_ports > 1 or self.fill is not None:   # buffered runs go to the buffer, not the DMA
            return np.maximum(np.maximum(w_cmds + (0 if handover else steps * cc), in_cmds), beats)
        walk = np.maximum(np.maximum(w_cmds + steps * cc, in_cmds), beats)
        both = np.asarray(w_cmds) + in_cmds
        if rate:
            # the empty cycle a step where the weights finish last, by its convex envelope in the input
            # commands (a cycle a step at none, none from as many as the weight commands on), so that a
            # block's cost stays convex in its rows, as the DSE's bound needs
            share = np.maximum(0.0, 1.0 - np.asarray(in_cmds) / np.maximum(w_cmds, 1e-9))
            both = both + steps * cc * share
        return np.maximum(walk, both)

    def block(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, extra: ArrayLike = 0.0,
              pad: ArrayLike = 0.0) -> np.ndarray:
        """One row block of t rows, a column tile, `groups` sample groups side by side.

        The fetcher issues the reads of each step (F cycles: one command a cycle,
        one beat a cycle) while the core computes the previous one, and runs up
        to A = `FETCH_AHEAD` steps ahead (it starts step k + A's reads as step k is
        handed over), so a step takes max(t, F, (H + dma_latency) / A): a
        step's data streams into the half the core releases as it starts the
        next step. H is F on one port; on several ports it ends at the step's
        last command, before the weight walker's cycle a step (`_walk`'s
        `handover`), and the skew adds the beats still in flight then. On
        several ports each kind of step (`_step_kinds`) also takes its beats on
        the ports plus `port_restart` (its reads wait there for the staging half;
        not for a buffered layer, whose inputs come from the buffer), and the
        zero fills of a short group's padding rows after them (`_padding_zeros`).
        `extra`: fetcher cycles spent before the block (a new pass's set-up).
        The writer drains the previous block on the write channel meanwhile. `pad`: the share of a
        group's rows that are a short group's padding (in group units): zero-fill reads and no write-back.
        """
        return self.blocks(t, (tile,), groups, extra, pad)[0]

    def blocks(self, t: ArrayLike, tiles: Sequence[TileCosts], groups: ArrayLike, extra: ArrayLike = 0.0,
               pad: ArrayLike = 0.0) -> list[np.ndarray]:
        """`block` in each of `tiles` (a layer's column tiles): the block's rows, which no tile changes,
        priced once."""
        t, groups = np.asarray(t), np.asarray(groups)
        tm = self.timing
        fixed, rows = self._step_rows(t, groups, extra, pad)
        compute = self.n_p * t
        several = self.bus.n_ports > 1
        # a step's reads wait in the ports while the core works through the step two before; its data enters the
        # staging half the core releases, at the ports' pace, and restarts through the merge. Each kind of step
        # at its own pace, as `fetch` walks them: the longer of its reads' walk and its beats plus the restart
        # (docs/interpretations.md, "The ports' restart")
        restart = tm.port_restart + self._padding_zeros(t, pad) / self.n_p if several and self.fill is None else None
        written = t * (groups - np.asarray(pad))
        out = []
        for tile in tiles:
            kinds = self._kinds(tile, rows)
            walks = [self._walk(*kind) for kind in kinds]
            fetch = sum(walks) + fixed
            handed = self._walk_kinds(kinds, handover=True) + fixed if several else fetch
            balance = (handed + self.n_p * (tm.dma_latency + self.port_skew(t, tile, groups))) / FETCH_AHEAD
            # back to back, a step on one port may also leave the port a cycle empty (`_walk`'s `rate`)
            paced = fetch if several else self._walk_kinds(kinds, rate=True) + fixed
            steps = np.maximum(np.maximum(compute, paced), balance)
            if restart is not None:
                restarted = [np.asarray(w_beats) + np.asarray(in_beats) + restart * np.asarray(n)
                             for _, w_beats, _, in_beats, n in kinds]
                if len(kinds) == 1:     # the same bound on the kind's (smaller) shape, before it broadcasts
                    steps = np.maximum(steps, restarted[0] + fixed)
                else:
                    steps = np.maximum(steps, sum(np.maximum(w, r) for w, r in zip(walks, restarted)) + fixed)
            busiest = self.busiest_port(t, tile, groups)
            if busiest is not None:
                steps = np.maximum(steps, self.n_p * busiest + fixed)
            out.append(np.maximum(steps, written * tile.out_row))
        return out

    def _padding_zeros(self, t: ArrayLike, pad: ArrayLike) -> ArrayLike:
        """Cycles a block's short-group padding rows (`pad` of a group's t rows, `block`) add to its steps on
        several ports: a step's groups read in order, the short group last, so its padding's zero fills are
        the step's last input reads, and the input stream's in-order merge answers them one a cycle after
        the real reads the ports deliver (hw/dma.py, `AxiDma`). 0 where no row is padding."""
        if _unpadded(pad):
            return 0.0
        return np.asarray(t) * np.asarray(pad) * self._row_terms[0]

    def stagings(self, t: ArrayLike, tiles: Sequence[TileCosts], groups: ArrayLike,
                 pad: ArrayLike = 0.0) -> list[np.ndarray]:
        """`staging` in each of `tiles` (`blocks`' counterpart)."""
        return [self.staging(t, tile, groups, pad) for tile in tiles]

    def staging(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, pad: ArrayLike = 0.0) -> np.ndarray:
        """Half the staging loop of a block of t rows: a block's last step is handed to the core only once
        the block two before it (the two staging halves alternate by block) is written out, so two blocks
        take at least the turn (`stage_turn`), a block's last step's rows, the pipeline and writer's set-up
        (`fill_base` + the adder pipeline, as in `drain`) and its writes. Binds only where a block is a
        step or two of few rows (docs/interpretations.md, "The staging loop")."""
        return (self.timing.stage_turn + np.asarray(t) + self._written(t, tile, groups, pad)) / 2

    def _written(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, pad: ArrayLike) -> np.ndarray:
        """Cycles from a block's last row entering the MACs to its last write: the row's trip to staging
        and the writer's set-up (`fill_base` + the adder pipeline), then the block's writes."""
        return (self.timing.fill_base + np.asarray(self.depth)
                + np.asarray(t) * (np.asarray(groups) - np.asarray(pad)) * tile.out_row)

    def fetch(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, extra: ArrayLike = 0.0,
              pad: ArrayLike = 0.0, rate: bool = False) -> np.ndarray:
        """Fetcher cycles of one row block (`block`'s arguments): every step's weight rows (the bias on
        the first) on the weight walker's stream and its input rows on the input walker's, as `_walk`
        prices them, plus the steps' first rows read one run a tap (`first_runs`, `first_beats`) and
        the step and block overheads. With `Bus.gather` (a what-if) a step's input row is one command
        however many runs it has. `rate`: as in `_walk`."""
        fixed, kinds = self._step_kinds(t, tile, groups, extra, pad)
        return self._walk_kinds(kinds, rate) + fixed

    def _walk_kinds(self, kinds: list[StepKind], rate: bool = False, handover: bool = False) -> np.ndarray:
        """`_walk` of each kind of step (`_step_kinds`), summed."""
        # an array: every block has at least one kind of step
        return cast(np.ndarray, sum(self._walk(*kind, rate, handover) for kind in kinds))

    def _step_kinds(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, extra: ArrayLike = 0.0,
                    pad: ArrayLike = 0.0) -> tuple[np.ndarray, list[StepKind]]:
        """`fetch`'s fixed cycles and its kinds of step, each as `_walk`'s (weight commands, weight beats,
        input commands, input beats, steps): all of a block's steps, or, where a kernel row ends inside
        some, those steps and the others apart (`split_steps`)."""
        fixed, rows = self._step_rows(t, groups, extra, pad)
        return fixed, self._kinds(tile, rows)

    @staticmethod
    def _kinds(tile: TileCosts, rows: list[tuple]) -> list[StepKind]:
        """`_step_kinds`' kinds of step from `_step_rows`' (share of the steps, input commands, input beats,
        steps) and a tile's weights (which go by step count)."""
        if len(rows) == 1:
            _, in_cmds, beats, steps = rows[0]
            return [(tile.weight_cmds, tile.weight_beats, in_cmds, beats, steps)]
        w_cmds, w_beats = np.asarray(tile.weight_cmds), np.asarray(tile.weight_beats)
        return [(w_cmds * share, w_beats * share, in_cmds, beats, steps) for share, in_cmds, beats, steps in rows]

    def _step_rows(self, t: ArrayLike, groups: ArrayLike, extra: ArrayLike = 0.0,
                   pad: ArrayLike = 0.0) -> tuple[np.ndarray, list[tuple]]:
        """`_step_kinds` without the weights, which no row changes: the fixed cycles and each kind of step as
        (its share of the steps (None: all), input commands, input beats, steps)."""
        tm = self.timing
        fixed = self.n_p * tm.step_overhead + tm.block_overhead + extra
        runs_c, beats_c, pad_c, first_c, first_b = self._row_terms
        # a short group's padding rows are zero fills: one response a run, no beat
        tg = t * groups
        if self._excess is not None:
            fixed = fixed + tg * self._excess
        in_cmds = tg * runs_c + first_c
        pad_beats = 0.0 if _unpadded(pad) else t * pad * pad_c    # the padding's saving is 0 in most blocks
        beats = tg * beats_c - pad_beats + first_b
        if self.fill is not None:
            # the next row block's fill (taken as this block's size) shares the ports with this row block's
            # steps in every column tile: a tile's share of it
            beats = beats + self.fill_cycles(t, groups) / np.asarray(self.fill_tiles)
        split = self._split_terms
        if split is None:
            return fixed, [(None, in_cmds, beats, self.n_p)]
        # the steps in which a kernel row ends read two runs a row: they may wait on their commands where
        # the others wait on the beats, so each kind walks at its own pace (docs/interpretations.md,
        # "Steps of two kinds"); the weights, the steps' first rows and the padding go by step count
        steps, share, runs_s, beats_s = split
        s_cmds = tg * runs_s + first_c * share
        s_beats = tg * beats_s + (first_b - pad_beats) * share
        return fixed, [(1 - share, in_cmds - s_cmds, beats - s_beats, self.n_p - steps),
                       (share, s_cmds, s_beats, steps)]

    @functools.cached_property
    def _excess(self) -> np.ndarray | None:
        """`row_excess` as an array; None where it is 0 everywhere (one port, no padding, rows alike)."""
        excess = np.asarray(self.row_excess, dtype=float)
        return excess if np.any(excess) else None

    @functools.cached_property
    def _split_terms(self) -> tuple[np.ndarray, ...] | None:
        """(split steps, their share of the steps, a row's commands and beats in them, in cycles); None
        where no step splits (or with `Bus.gather`, whose rows are one command a step)."""
        split = np.asarray(self.split_steps, dtype=float)
        if self.bus.gather or not np.any(split > 0):
            return None
        return (split, split / self.n_p, np.asarray(self.split_runs) * self.bus.command_cycles,
                np.asarray(self.split_beats) * self.bus.beat_cycles)

    @functools.cached_property
    def _row_terms(self) -> tuple[np.ndarray, ...]:
        """`fetch`'s per-row terms in cycles: an input row's commands and beats, what a padding row
        saves in beats, a block's first rows' extra commands and beats (none with `Bus.gather`)."""
        bus = self.bus
        runs = np.minimum(self.in_runs, self.n_p) if bus.gather else np.asarray(self.in_runs, dtype=float)
        in_beats = np.asarray(self.in_beats, dtype=float)
        first_runs, first_beats = (0.0, 0.0) if bus.gather else (self.first_runs, self.first_beats)
        return (runs * bus.command_cycles, in_beats * bus.beat_cycles,
                (in_beats - runs * bus.zero_beats) * bus.beat_cycles,
                np.asarray(first_runs) * bus.command_cycles, np.asarray(first_beats) * bus.beat_cycles)

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

    def drain(self, t: ArrayLike, tile: TileCosts, groups: ArrayLike, step: ArrayLike = 0.0,
              pad: ArrayLike = 0.0) -> np.ndarray:
        """After the last row: the pipeline empties and the last block is written out.
        `step`: the last block's step time, of which only its t rows of compute follow
        the last step's data (the model's body counts whole steps); `pad` as in `block`."""
        return self._written(t, tile, groups, pad) - np.maximum(np.asarray(step) - np.asarray(t), 0)


def plan_cycles(TR: ArrayLike, TC: ArrayLike, b: int, BR: ArrayLike, BP: ArrayLike, packed: ArrayLike,
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


def bias_chunk(TP: ArrayLike, TC: ArrayLike) -> np.ndarray:
    """int32 biases one DMA read moves: NMAX / 2 (`fluidnpu.hw.regmap.nmax`)."""
    return nmax(np.asarray(TP), np.asarray(TC)) // 2


def layer_costs(TPk: np.ndarray, P: np.ndarray, C: np.ndarray, taps: ArrayLike, bus: Bus,
                timing: EngineTiming, R: ArrayLike = 2, inside: ArrayLike = 1.0,
                chunk: ArrayLike = 8, depth: ArrayLike | None = None, kw: ArrayLike = 1,
                edge: ArrayLike = 0.0) -> LayerCosts:
    """Step count and input-row read cost of a layer whose P = taps * cin.

    A weight step reads TPk consecutive values of each im2col row; they are
    one contiguous run unless the step crosses from one kernel tap to the
    next (every cin values), which starts a new DMA command -- unless both
    taps are in one kernel row (of `kw` taps, which follow each other in
    memory: the pixel pitch is cin) and the row's whole window reads the
    input: the fetcher then
    reads the rest of the kernel row as one run (hw/seq_fetcher.py). So a
    row's runs are one a step plus the kernel rows' ends inside steps -- but
    every crossing for the rows whose window reaches into the padding (a
    share `edge`, `im2col_edge`), which are read one run a tap. Each
    step's first row still walks tap by tap (its end is the next step's
    start): `first_extra`, once a step of a block. Runs start at
    multiples of gcd(TPk, cin) words (pixels are cin words apart), except in
    a layer with one row and one tap per sample (an FC layer): its rows are
    the samples' 64-byte aligned tensors, so runs start at multiples of TPk.
    `inside`: the fraction of (row, tap) runs inside the input (`im2col_inside`);
    a run in the padding is a zero-fill command, one response and no beat.
    `chunk`: int32 biases a read moves (`bias_chunk` of the engine). `depth`: the engine's adder
    pipeline in the layer's mode (`regmap.mode_depth`; None: a k = 1 engine of TP = TPk).
    """
    taps = np.asarray(taps, dtype=np.int64)
    kw = np.asarray(kw, dtype=np.int64)
    n_p = _ceil_div(P, TPk)
    cin = np.maximum(P // np.maximum(taps, 1), 1)
    # tap boundaries i*cin (0 < i < taps) that fall inside a step: those not on a multiple
    # of TPk, i.e. all but the multiples of TPk / gcd(TPk, cin); of them, the kernel rows' ends
    # j*kw*cin (0 < j < kh) always start a run
    grain = _gcd(TPk, cin)
    crossings = (taps - 1) - (taps - 1) // (TPk // grain)
    kh = np.maximum(taps // np.maximum(kw, 1), 1)
    row_ends = (kh - 1) - (kh - 1) // (TPk // _gcd(TPk, kw * cin))
    tap_runs = n_p + crossings
    runs = n_p + row_ends + (crossings - row_ends) * np.asarray(edge, dtype=float)
    align = np.where((np.asarray(R) == 1) & (taps == 1), TPk, grain)
    inside = np.asarray(inside, dtype=float)

    def beats(n_runs: np.ndarray, words: ArrayLike = P) -> np.ndarray:
        return inside * bus.beats(words, n_runs, align) + (1 - inside) * n_runs * bus.zero_beats
    in_beats = beats(runs)
    in_row = bus.stream(in_beats, runs)
    # the steps holding a kernel row's end: TPk words a row in two runs (`LayerCosts.split_steps`)
    split = np.minimum(row_ends, n_p)
    excess = row_excess_estimate(TPk, n_p, split, crossings - row_ends, edge, inside, bus, align)
    depth = mode_depth(TPk, KCode.K1) if depth is None else depth
    return LayerCosts(n_p, TPk, in_row, P, np.asarray(C), bus, timing,
                      bias_chunk=np.asarray(chunk), in_beats=in_beats, in_runs=runs, depth=np.asarray(depth),
                      first_beats=beats(tap_runs) - in_beats, first_runs=tap_runs - runs,
                      split_steps=split, split_runs=2 * split, split_beats=beats(2 * split, split * TPk),
                      row_excess=excess)


def _paced_apart(bus: Bus, rows: list[tuple]) -> np.ndarray:
    """Cycles by which rows of several kinds (share, commands, beats), each taken at its own pace, outlast
    their sums taken at the longer of the two: `LayerCosts.row_excess` of one step (docs/interpretations.md,
    "Rows of two kinds")."""
    cc, bc = bus.command_cycles, bus.beat_cycles
    paced = sum(s * np.maximum(r * cc, b * bc) for s, r, b in rows)
    return paced - np.maximum(sum(s * r for s, r, _ in rows) * cc, sum(s * b for s, _, b in rows) * bc)


def row_excess_estimate(TPk: ArrayLike, n_p: ArrayLike, split: ArrayLike, cuts: ArrayLike, edge: ArrayLike,
                        inside: ArrayLike, bus: Bus, align: ArrayLike) -> np.ndarray:
    """`LayerCosts.row_excess` from a layer's counts, as the DSE prices it (`im2col_row_reads` walks the
    rows where the geometry is known). Two kinds of step differ row by row: those in which a tap boundary
    that is no kernel row's end (`cuts` of them a row, over all steps) cuts the rows at the padding (a
    share `edge`, read one run a tap) into more runs while the others read one, and the rest, in which
    some of those rows' one run is a zero fill in the padding ((1 - inside) / edge of them). The steps
    holding a kernel row's end (`split`) read two runs in every row: no excess. 0 on one port, where a
    row's beats are never fewer than its commands (docs/interpretations.md, "Rows of two kinds")."""
    edge, inside = np.asarray(edge, dtype=float), np.asarray(inside, dtype=float)
    if bus.n_ports == 1 or not np.any(edge > 0):
        return np.zeros(np.broadcast(np.asarray(TPk), edge).shape)
    pad = np.clip((1 - inside) / np.maximum(edge, 1e-12), 0.0, 1.0)    # an edge row's runs in the padding
    one = bus.beats(TPk, 1, align)
    rest = np.maximum(np.asarray(n_p) - split, 0)
    cut_steps = np.minimum(rest, cuts)
    runs = 1 + np.asarray(cuts) / np.maximum(cut_steps, 1e-12)           # an edge row's runs in those steps
    zero = bus.zero_beats
    cut = _paced_apart(bus, [(1 - edge, 1.0, one),
                             (edge, runs, (1 - pad) * bus.beats(TPk, runs, align) + pad * runs * zero)])
    plain = _paced_apart(bus, [(1 - edge * pad, 1.0, one), (edge * pad, 1.0, zero)])
    return cut_steps * cut + (rest - cut_steps) * plain


def descriptor_reads(bus: Bus) -> float:
    """Cycles of a layer's descriptor: three 16-word reads, in when the last port is done (`Bus.reads_in`)."""
    return bus.reads_in(16, 3)


def _conv_shape(layer) -> tuple | None:
    """A workload Layer's convolution geometry as `im2col_*` take it; None for FC and matmul layers."""
    if getattr(layer, "kind", "conv") != "conv":
        return None
    return layer.in_hw, layer.out_hw, layer.kernel, layer.stride, layer.pads, layer.dilation


def layer_edge(layer) -> float:
    """`im2col_edge` of a workload Layer (0.0 for FC and matmul layers)."""
    shape = _conv_shape(layer)
    return 0.0 if shape is None else im2col_edge(*shape)


def layer_inside(layer) -> float:
    """`im2col_inside` of a workload Layer (1.0 for FC and matmul layers)."""
    shape = _conv_shape(layer)
    return 1.0 if shape is None else im2col_inside(*shape)


class RowReads(NamedTuple):
    """One im2col row's reads over all weight steps, averaged over the rows (`im2col_row_reads`):
    `LayerCosts.in_row`, `in_beats`, `in_runs`, `first_beats`, `first_runs`, `split_steps`, `split_runs`,
    `split_beats`, `row_excess`."""

    in_row: float
    in_beats: float
    in_runs: float
    first_beats: float
    first_runs: float
    split_steps: float
    split_runs: float
    split_beats: float
    row_excess: float


def im2col_row_reads(geometry, TPk: int, bus: Bus) -> RowReads:
    """Exact read cycles of one im2col row over all weight steps, averaged over the rows.

    `geometry` names the convolution as a layer descriptor does (in_h, in_w,
    cin, out_h, out_w, kh, kw, sh, sw, ph, pw; HWC tensors with a pixel pitch
    of cin words from a beat-aligned sample base, as host_driver/memory_plan
    lays them out). Walks the runs of each step the way the RTL's fetcher
    cuts them -- where the row's whole window reads the input, a step's piece
    of a kernel row is one run, elsewhere one run a tap -- and charges each
    its actual beats at its actual alignment, or one response for a zero-fill
    run in the padding. This replaces the average-alignment estimate where
    the geometry is known (the RTL testbenches); the DSE uses the estimate.
    `first_beats`, `first_runs` are what a row read one run a tap (each step's first row) costs beyond
    that; `split_*` count the steps in which most rows read two runs or more (a kernel row's end, or
    every tap of a row at the padding) and a row's commands and beats in them (`LayerCosts.fetch`
    walks those steps apart). `row_excess`: on several ports, a step whose rows differ in kind (the
    rows at the padding read two runs where the others read one) takes each row at its own pace,
    its commands' or its beats', whichever is longer, not the step's sums at the longer of theirs:
    the excess, per row over all steps (docs/interpretations.md, "Rows of two kinds").
    """
    g = geometry
    wpb, cin = bus.words_per_beat, g.cin
    P = g.kh * g.kw * cin
    oy, ox = (a.reshape(-1) for a in np.meshgrid(np.arange(g.out_h), np.arange(g.out_w), indexing="ij"))
    iy = (oy * g.sh - g.ph)[:, None] + np.arange(g.kh)[None, :]                 # (pixels, kh)
    ix = (ox * g.sw - g.pw)[:, None] + np.arange(g.kw)[None, :]                 # (pixels, kw)
    status = ((iy >= 0) & (iy < g.in_h))[:, :, None] & ((ix >= 0) & (ix < g.in_w))[:, None, :]
    window_in = status.all(axis=(1, 2))
    base = ((oy * g.sh - g.ph) * g.in_w + (ox * g.sw - g.pw)) * cin             # window origin, in words

    def cost_of(first: int, length: int, live: np.ndarray) -> np.ndarray:
        return np.where(live, ((base + first) % wpb + length + wpb - 1) // wpb, bus.zero_beats)

    taps = np.zeros(len(oy))               # beats, one run a tap
    merged = np.zeros(len(oy))             # beats, one run a kernel row's piece
    n_taps = n_pieces = 0
    split = [0, 0.0, 0.0]                  # the steps with a kernel row's end: count, commands, beats
    excess = 0.0
    for p0 in range(0, P, TPk):
        p, end = p0, min(P, p0 + TPk)
        step = (n_taps, n_pieces, taps.copy(), merged.copy())
        while p < end:                     # a kernel row's piece of the step, one piece a tap
            ky = p // (g.kw * cin)
            seg_end = min(end, (ky + 1) * g.kw * cin)
            kx0, ci0 = divmod(p - ky * g.kw * cin, cin)
            merged += cost_of((ky * g.in_w + kx0) * cin + ci0, seg_end - p, status[:, ky, kx0])
            n_pieces += 1
            while p < seg_end:
                kx, ci = divmod(p - ky * g.kw * cin, cin)
                n = min(cin - ci, seg_end - p)
                taps += cost_of((ky * g.in_w + kx) * cin + ci, n, status[:, ky, kx])
                n_taps += 1
                p += n
        row_runs = np.where(window_in, n_pieces - step[1], n_taps - step[0])
        row_beats = np.where(window_in, merged - step[3], taps - step[2])
        runs = float(row_runs.mean())
        if bus.n_ports > 1:                # the step's rows by kind (commands, beats), each kind's share
            kinds, count = np.unique(np.stack([row_runs, row_beats], axis=1), axis=0, return_counts=True)
            excess += float(_paced_apart(bus, [(n / len(oy), r, b) for (r, b), n in zip(kinds, count)]))
        if runs >= 1.5:                    # most rows read two runs or more in this step
            split[0] += 1
            split[1] += runs
            split[2] += float(row_beats.mean())
    beats_t, cmds_t = float(taps.mean()), float(n_taps)
    beats = float(np.where(window_in, merged, taps).mean())
    cmds = float(np.where(window_in, n_pieces, n_taps).mean())
    return RowReads(float(bus.stream(beats, cmds)), beats, cmds, beats_t - beats, cmds_t - cmds,
                    float(split[0]), split[1], split[2], excess)


def im2col_edge(in_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
                stride: tuple[int, int] = (1, 1), pads: tuple[int, ...] = (0, 0),
                dilation: tuple[int, int] = (1, 1)) -> float:
    """Fraction of a convolution's output pixels whose im2col window is not wholly inside the input
    (some tap is padding): their rows are read one run a tap, the others one run a kernel row's piece
    (`layer_costs`, hw/seq_fetcher.py). 0.0 without padding."""
    def axis(n_in: int, n_out: int, k: int, s: int, p: int, d: int) -> float:
        first = np.arange(n_out) * s - p
        return float(((first >= 0) & (first + (k - 1) * d < n_in)).mean())
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw) = in_hw, out_hw, kernel, stride, dilation
    return 1.0 - axis(ih, oh, kh, sh, pads[0], dh) * axis(iw, ow, kw, sw, pads[1], dw)


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


@dataclass(frozen=True)
class ModeCosts:
    """A layer in one Stackable-PE mode on <TP, TC>: what depends neither on TR nor on the batch
    (computed once per mode and shared by every <b, BR> and every TR the DSE prices)."""

    k_code: int
    TPk: np.ndarray
    TCk: np.ndarray
    TC: np.ndarray               # the design's TC (the planning divider's width)
    C: np.ndarray
    exists: np.ndarray           # TPk >= 1 and TCk >= 1
    costs: LayerCosts
    nct: np.ndarray              # column tiles
    w_full: np.ndarray           # columns of a full column tile
    w_last: np.ndarray           # ... of the last


def mode_costs(TP: ArrayLike, TC: ArrayLike, R: ArrayLike, P: ArrayLike, C: ArrayLike, k_code: int,
               bus: Bus, timing: EngineTiming = DEFAULT_TIMING, taps: ArrayLike = 1, inside: ArrayLike = 1.0,
               geometry=None, kw: ArrayLike = 1, edge: ArrayLike = 0.0, fill: FillShape | None = None) -> ModeCosts:
    """The TR- and batch-free part of `layer_cycles` (see there for the arguments)."""
    _, TPk, TCk = mode_dims(1, TP, TC, k_code)
    exists = (TPk >= 1) & (TCk >= 1)
    TPk, TCk = np.maximum(TPk, 1), np.maximum(TCk, 1)
    R, P, C = (np.asarray(x, dtype=np.int64) for x in (R, P, C))
    costs = layer_costs(TPk, P, C, taps, bus, timing, R, inside, bias_chunk(TP, TC),
                        np.where(exists, mode_depth(np.maximum(np.asarray(TP), 1), k_code), 0), kw, edge)
    if geometry is not None:
        if np.ndim(TPk) != 0:
            raise ValueError("exact input reads (geometry=) price one design at a time")
        reads = im2col_row_reads(geometry, int(TPk), bus)
        costs = replace(costs, **reads._asdict() | {"in_row": np.asarray(reads.in_row)})
    nct = _ceil_div(C, TCk)
    if fill is not None:
        # the input runs are answered by the buffer, one a cycle: commands, no beats on the ports
        runs = np.asarray(costs.in_runs, dtype=float)
        costs = replace(costs, in_beats=np.zeros_like(runs), first_beats=0.0, split_beats=0.0, row_excess=0.0,
                        in_row=runs * bus.command_cycles, fill=fill, fill_tiles=nct)
    return ModeCosts(k_code, TPk, TCk, np.asarray(TC), C, exists, costs, nct, np.minimum(C, TCk),
                     C - (nct - 1) * TCk)


@dataclass(frozen=True)
class LayerSetup:
    """A layer at batch b with split BR in one mode: its sample groups and passes (none depend on TR)."""

    mode: ModeCosts
    R: np.ndarray
    G: np.ndarray
    b: int
    BR: np.ndarray               # the split (an array where several are priced side by side)
    BP: np.ndarray
    packed: np.ndarray           # C <= TCk: groups share a pass
    g: np.ndarray                # groups in a full pass
    h: np.ndarray                # groups in the last pass
    npass: np.ndarray
    rows_full: np.ndarray
    rows_last: np.ndarray
    regroups: np.ndarray         # the last pass has another group count
    full_g: TileCosts            # a full column tile run by a full pass's g groups
    full_h: TileCosts            # ... by the last pass's h groups
    last_g: TileCosts            # the last column tile, g groups
    last_h: TileCosts            # ... h groups
    first: TileCosts             # the layer's first pass: full_h where it is the only pass, else full_g (its groups)
    pad: np.ndarray              # the last pass's padding rows, in group units (`LayerCosts.block`)


def layer_setup(mode: ModeCosts, R: ArrayLike, G: ArrayLike, b: int, BR: ArrayLike,
                banks: int | None = None) -> LayerSetup:
    """`banks`: the engine's input banks NB, which cap the groups of a pass (None: no cap, as on an
    engine with NB >= Bmax). `BR` may be an array (several splits priced in one call, broadcast
    against the designs and layers: the DSE prices a batch size's splits side by side)."""
    BR = np.asarray(BR, dtype=np.int64)
    if np.any(BR < 1) or np.any(BR > b):
        raise ValueError(f"BR must be in [1, b]: BR={BR}, b={b}")
    R, G = np.asarray(R, dtype=np.int64), np.asarray(G, dtype=np.int64)
    C, TCk = mode.C, mode.TCk
    BP = -(-b // BR)
    n_last = b - (BP - 1) * BR          # samples in the last (possibly partial) group
    packed = C <= TCk
    g = np.where(packed, np.minimum(BP if banks is None else np.minimum(BP, banks), TCk // np.maximum(C, 1)), 1)
    npass = _ceil_div(BP, g)
    h = BP - (npass - 1) * g            # groups in the last pass
    rows_last = np.where(h == 1, n_last, BR) * R   # a partial group alone streams only its rows
    # beside others, a partial group streams the pass's rows: the rest of its share is padding (zero-fill
    # reads, no write-back), spread evenly over the pass's blocks
    pad = np.where(h > 1, (BR - n_last) / BR, 0.0)
    # every group of a pass reads its own copy of the tile's weights and bias (no replication network)
    tile = mode.costs.tile
    full_g, full_h = tile(mode.w_full, g), tile(mode.w_full, h)
    return LayerSetup(mode, R, G, b, BR, BP, packed, g, h, npass, BR * R, rows_last, (npass > 1) & (h != g),
                      full_g, full_h, tile(mode.w_last, g), tile(mode.w_last, h),
                      TileCosts(*(np.where(npass == 1, a, b) for a, b in zip(astuple_shallow(full_h),
                                                                             astuple_shallow(full_g)))), pad)


def _split(rows: np.ndarray, tre: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n balanced blocks of at most tre rows: the first `big` hold s+1 rows, the rest s."""
    n = _ceil_div(rows, tre)
    s = rows // n
    return n, s, rows - n * s


@dataclass(frozen=True)
class RowBlocks:
    """How a layer's passes are cut into balanced row blocks on an engine of TR rows. Every
    block count falls and every block size grows (weakly) with TR."""

    TR: np.ndarray
    exists: np.ndarray           # the mode exists and each packed group gets a buffer row
    TRe: np.ndarray              # rows per block in a full pass
    TRh: np.ndarray              # ... in the last pass
    full: tuple[np.ndarray, np.ndarray, np.ndarray]   # (n, s, big) of a full pass
    last: tuple[np.ndarray, np.ndarray, np.ndarray]   # ... of the last pass
    t0_full: np.ndarray          # a full pass's first (largest) block
    t0_last: np.ndarray
    t0_first: np.ndarray         # the layer's first block


def row_blocks(setup: LayerSetup, TR: ArrayLike) -> RowBlocks:
    m = setup.mode
    TRk, _, _ = mode_dims(TR, 1, 1, m.k_code)
    exists = m.exists & (TRk >= 1) & (TRk >= setup.g)
    TRk = np.maximum(TRk, 1)
    TRe = np.maximum(TRk // setup.g, 1)   # rows per block when g groups share the input buffer
    TRh = np.maximum(TRk // np.maximum(setup.h, 1), 1)
    full, last = _split(setup.rows_full, TRe), _split(setup.rows_last, TRh)
    t0_full, t0_last = np.where(full[2] > 0, full[1] + 1, full[1]), np.where(last[2] > 0, last[1] + 1, last[1])
    return RowBlocks(np.asarray(TR), exists, TRe, TRh, full, last, t0_full, t0_last,
                     np.where(setup.npass == 1, t0_last, t0_full))


@dataclass(frozen=True)
class LayerParts:
    """A layer's cycles (per convolution group) split by how each part moves with TR, which is
    what bounds the cycles over a range of TR (`layer_cycles_bound`, docs/interpretations.md, Eq. 2):

    body      the passes' balanced blocks, pass and tile set-up: non-increasing in TR
    regroup   waits where the group count changes: non-decreasing (grows with the block sizes)
    prologue  the layer's first step, fetched before anything computes: non-decreasing
    drain     the last block's write-out: concave in the last block's size (block cost convex)
    plan      the control unit's planning (`plan_cycles`): its narrow divider widens with TR,
              its 24-bit divisions drop out as passes fit one block
    desc      the descriptor reads: constant
    """

    exists: np.ndarray
    body: np.ndarray
    regroup: np.ndarray
    prologue: np.ndarray
    drain: np.ndarray
    plan: np.ndarray
    desc: np.ndarray

    def cycles(self, setup: LayerSetup) -> np.ndarray:
        """All G groups and the layer's fixed control cost; np.inf where the mode does not exist."""
        per_group = self.body + self.regroup + self.prologue + self.drain + self.plan + self.desc
        cycles = setup.G * per_group + setup.mode.costs.timing.layer_overhead
        return np.where(self.exists, np.ceil(cycles - 1e-6), np.inf)  # tolerance: float sums in any order


def _body(setup: LayerSetup, rb: RowBlocks) -> tuple[np.ndarray, np.ndarray]:
    """(the passes' blocks with their set-ups, the layer's last block: the drain's, priced on the way)."""
    m, costs, timing = setup.mode, setup.mode.costs, setup.mode.costs.timing

    def all_tiles(price: BlockPrice) -> tuple[np.ndarray, np.ndarray]:
        """(the column tiles' blocks, each priced by `price` (blocks or stagings) in the full tile and the last
        at once, the layer's last block). Every group of a pass streams all the pass's rows; a short group's
        rows beyond its samples' are padding, which fills the pass's last blocks (`padded_blocks`)."""
        def pass_cycles(split: tuple, tiles: tuple[TileCosts, ...], groups: np.ndarray) -> tuple[list, np.ndarray]:
            n, s, big = split
            small = price(s, tiles, groups)
            return [(n - big) * a + big * b for a, b in zip(small, price(s + 1, tiles, groups))], small[-1]
        full, _ = pass_cycles(rb.full, (setup.full_g, setup.last_g), setup.g)
        by_h = (setup.full_h, setup.last_h)
        if not np.any(setup.pad):
            last, last_block = pass_cycles(rb.last, by_h, setup.h)
        else:
            # the last pass: blocks of real rows, the block across the short group's last sample, padding blocks
            last = [np.zeros(np.broadcast(f, setup.pad).shape) for f in full]
            for count, t, pad in padded_blocks(rb.last, setup.rows_last, setup.pad):
                last = [x + count * p for x, p in zip(last, price(t, by_h, setup.h, pad=pad))]
            # the drain takes the last block at the pass's even share of padding: concave in its rows, as the
            # DSE's bound needs (`layer_cycles_bound`)
            last_block = price(rb.last[1], by_h[1:], setup.h, pad=setup.pad)[0]
        full_tile, last_tile = ((setup.npass - 1) * f + x for f, x in zip(full, last))
        return (m.nct - 1) * full_tile + last_tile, last_block

    # passes -> row blocks -> column tiles (hw/seq_fetcher.py): each pass's fetcher set-up (a cycle, one per
    # group) once a layer, before its first block, and the layer's first tile's cycle
    setups = (setup.npass - 1) * (timing.pass_overhead + setup.g) + timing.pass_overhead + setup.h + 1
    blocks, last_block = all_tiles(costs.blocks)
    # the fetcher's pace, or the staging loop's where blocks are a step or two of few rows (set-ups hide in it)
    return np.maximum(blocks + setups, all_tiles(costs.stagings)[0]), last_block


def padded_blocks(split: tuple, rows: ArrayLike, pad: ArrayLike) -> list[tuple[np.ndarray, np.ndarray, ArrayLike]]:
    """The last pass's blocks as (count, rows, padding) kinds, where a short group's share `pad` of its
    `rows` rows is padding: that group's rows run in sample order, so its padding is the pass's last
    rows: the blocks before its last sample's end have none (pad 0), the blocks after it are all
    padding for that group (pad 1, in group units), and the block across it has the share beyond it.
    Priced apart, not as blocks of an even share each: the padding's zero fills take no port time on
    several ports (`Bus.zero_beats`), so the two kinds wait on different things (docs/interpretations.md,
    "Zero fills on several ports")."""
    n, s, big = (np.asarray(x) for x in split)
    pad = np.asarray(pad, dtype=float)
    real = np.rint((1 - pad) * np.asarray(rows))                       # the short group's rows of its samples
    # blocks k < big hold s + 1 rows, the rest s: the index of the block holding row `real`
    in_big = real < big * (s + 1)
    k = np.where(in_big, real // (s + 1), big + (real - big * (s + 1)) // np.maximum(s, 1))
    start = k * s + np.minimum(k, big)
    size = np.where(k < big, s + 1, s)
    across = np.where((real > start) & (k < n), 1, 0)                  # a block with rows on both sides
    share = np.where(across == 1, 1 - (real - start) / np.maximum(size, 1), 0.0)
    n_real, n_pad = k, n - k - across
    real_big = np.minimum(n_real, big)
    pad_big = np.maximum(big - n_real - across, 0)
    return [(real_big, s + 1, 0.0), (n_real - real_big, s, 0.0), (across, size, share),
            (pad_big, s + 1, 1.0), (n_pad - pad_big, s, 1.0)]


def _regroup(setup: LayerSetup, rb: RowBlocks) -> np.ndarray:
    """The last pass, with fewer groups, waits for the core to empty, once a layer (passes are the
    fetcher's outer loop): its first block in the first column tile follows the previous pass's last
    block in the last tile."""
    m, costs = setup.mode, setup.mode.costs
    s_f = rb.full[1]
    once = np.where(m.nct > 1, costs.regroup(s_f, rb.t0_last, setup.full_h, setup.h),
                    costs.regroup(s_f, rb.t0_last, setup.last_h, setup.h))
    return np.where(setup.regroups, once, 0)


def _prologue(setup: LayerSetup, rb: RowBlocks, skew: ArrayLike = 0.0) -> np.ndarray:
    """The layer's first step, fetched before anything computes (`skew`: the several-port skew the
    DSE's bound adds to it, which a buffered layer's first fill overlaps like the rest)."""
    # the first pass's set-up is in the prologue
    costs = setup.mode.costs
    groups = setup.first.groups      # the first pass's: h where it is the only pass, else g
    pro = costs.prologue(rb.t0_first, setup.first, groups) + skew
    if costs.fill is None:
        return pro
    # buffered: the layer's first step also waits for its block's fill (every later block's fill, a later
    # pass's or column tile's first block's too, runs behind the block before it: `_step_kinds`)
    return np.maximum(pro, costs.first_fill(rb.t0_first, groups) + costs.timing.block_overhead)


def _drain(setup: LayerSetup, rb: RowBlocks, last_block: np.ndarray | None = None) -> np.ndarray:
    """`last_block`: the layer's last block, where `_body` has priced it."""
    m, s_l = setup.mode, rb.last[1]
    if last_block is None:
        last_block = m.costs.block(s_l, setup.last_h, setup.h, pad=setup.pad)
    return m.costs.drain(s_l, setup.last_h, setup.h, last_block / m.costs.n_p, pad=setup.pad)


def _plan(setup: LayerSetup, TR: ArrayLike, tre: RowBlocks) -> np.ndarray:
    """Planning with the narrow divider of an engine of TR rows and the pass kinds of `tre`'s blocks."""
    return plan_cycles(TR, setup.mode.TC, setup.b, setup.BR, setup.BP, setup.packed, setup.npass,
                       (setup.h == setup.g) & (setup.rows_last == setup.rows_full),
                       setup.rows_full, tre.TRe, setup.rows_last, tre.TRh)


def layer_parts(setup: LayerSetup, TR: ArrayLike) -> LayerParts:
    """The parts of a layer's cycles on an engine of TR rows."""
    rb = row_blocks(setup, TR)
    desc = descriptor_reads(setup.mode.costs.bus)
    body, last_block = _body(setup, rb)
    return LayerParts(rb.exists, body, _regroup(setup, rb), _prologue(setup, rb), _drain(setup, rb, last_block),
                      _plan(setup, rb.TR, rb), np.asarray(desc))


def without_port_skew(setup: LayerSetup) -> LayerSetup:
    """The same layer priced with `LayerCosts.port_skew` = 0: a lower bound on its cycles at
    every TR (the skew only adds to a block, and of the last block's extra the drain takes back
    at most 1/n_p; docs/interpretations.md, Eq. 2). The identity on one port."""
    costs = setup.mode.costs
    if costs.bus.n_ports == 1:
        return setup
    return replace(setup, mode=replace(setup.mode, costs=replace(costs, skew=False)))


def with_fill(setup: LayerSetup, fill: FillShape) -> LayerSetup:
    """The same buffered layer priced with another fill (the DSE's bound: `FillShape.linear`): none of its
    other costs depends on the fill (`mode_costs`)."""
    return replace(setup, mode=replace(setup.mode, costs=replace(setup.mode.costs, fill=fill)))


def layer_cycles_bound(setup: LayerSetup, lo: ArrayLike, hi: ArrayLike,
                       low_fill: FillShape | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cycles at TR = hi, a lower bound on the cycles at every TR in [lo, hi]).

    Each part is taken where it is smallest on the range (docs/interpretations.md, Eq. 2):
    body at hi, regroup and prologue at lo, the drain at the better end (it is concave in the
    last block's size, which grows with TR), the planning with lo's narrow divider and hi's
    pass kinds, all on the skew-free costs (`without_port_skew`: the several-port skew is not
    convex in a block's rows), plus the prologue's skew at its smaller end (`port_skew_floor`).
    Where the mode does not exist at hi it exists nowhere on the range (inf). At lo == hi the
    bound is the cycles, bit for bit, unless the skew delays a block (then it is below them).
    `low_fill`: a buffered layer's bound priced with this fill in place of its own (`FillShape.linear`).

    The parts at hi of the cycles and of the bound differ only by the skew and the fill, so they are priced
    side by side in one call (`SIDES`: numpy's per-call cost is most of a few hundred designs' price).
    """
    costs = setup.mode.costs
    low = setup if low_fill is None else with_fill(setup, low_fill)
    skew = costs.bus.n_ports > 1 and costs.skew is True
    if not (skew or low_fill is not None) or max(np.ndim(hi), np.ndim(setup.g)) >= SIDES.ndim:
        at_hi = layer_parts(setup, hi)
        return at_hi.cycles(setup), layer_cycles_low(low, lo, hi, at_hi if low is setup else None)
    sided = replace(costs, skew=SIDES if skew else costs.skew,
                    fill=costs.fill if low_fill is None else replace(low_fill, sided=True))
    parts = astuple_shallow(layer_parts(replace(setup, mode=replace(setup.mode, costs=sided)), hi))
    ndim = max(np.ndim(x) for x in parts if np.ndim(x) < SIDES.ndim)   # the parts' own axes

    def side(i: int) -> LayerParts:
        return LayerParts(*(x[i].reshape(x.shape[x.ndim - ndim:]) if np.ndim(x) == SIDES.ndim else x for x in parts))
    at_hi = side(1)
    return at_hi.cycles(setup), layer_cycles_low(low, lo, hi, free_hi=side(0))


def layer_cycles_low(setup: LayerSetup, lo: ArrayLike, hi: ArrayLike, at_hi: LayerParts | None = None,
                     free_hi: LayerParts | None = None) -> np.ndarray:
    """`layer_cycles_bound`'s lower bound alone (`at_hi`: the parts at hi, where already priced;
    `free_hi`: those without the skew)."""
    free = without_port_skew(setup)
    if free_hi is None:
        free_hi = at_hi if free is setup and at_hi is not None else layer_parts(free, hi)
    rb_lo = row_blocks(free, lo)
    rb_hi = row_blocks(free, hi)
    skew = setup.mode.costs.port_skew_floor(rb_lo.t0_first, rb_hi.t0_first, setup.first, setup.first.groups)
    drain_lo = _drain(free, rb_lo)
    prologue = _prologue(free, rb_lo, skew)
    drain = np.minimum(drain_lo, free_hi.drain)
    # passes of one kind (one pass, or every pass with the same groups and rows): the first block and the
    # last come from the same balanced split (`_edges_floor`)
    alike = (setup.npass == 1) | ((setup.h == setup.g) & (setup.rows_last == setup.rows_full))
    if np.any(alike) and np.any(np.asarray(lo) < np.asarray(hi)):
        # the prologue and the drain move against each other (a long first step, a long last step the drain
        # takes back): priced apart at the range's two ends their sum can be far below its least value
        joint = alike & (np.asarray(lo) < np.asarray(hi))
        floor = _edges_floor(free, rb_lo, rb_hi, drain_lo, free_hi.drain, skew)
        prologue = np.where(joint, np.maximum(prologue, floor - drain), prologue)
    low = LayerParts(free_hi.exists, free_hi.body, _regroup(free, rb_lo), prologue, drain,
                     _plan(free, rb_lo.TR, rb_hi), free_hi.desc)
    return low.cycles(free)


def _edges_floor(setup: LayerSetup, rb_lo: RowBlocks, rb_hi: RowBlocks, drain_lo: np.ndarray, drain_hi: np.ndarray,
                 skew: ArrayLike) -> np.ndarray:
    """A lower bound on prologue + drain at every TR in [lo, hi] of a layer whose passes are all of one kind (one
    pass, or the same groups and rows in each; docs/interpretations.md, "The edges together"). Every pass then
    splits its rows alike: the first block holds t0 = ceil(rows/n) rows and the last s = floor(rows/n), so
    t0 >= s; the prologue is at least p(t0) >= p(s), p(t) = `LayerCosts.prologue` + the skew's floor, convex
    and non-decreasing in t (a max of affine terms); the drain is D(s), concave. For an integer a, the secant of p
    through a and a + 1 lies below p at every integer, so secant + D is concave in s and, s running from s_lo to
    s_hi on the range, at least its smaller value at those two ends. Secants at s_lo and at s_hi - 1: the
    larger of the two floors."""
    costs, tile, groups = setup.mode.costs, setup.first, setup.first.groups
    s_lo, s_hi = rb_lo.last[1], rb_hi.last[1]

    def p(t: ArrayLike) -> np.ndarray:
        return costs.prologue(t, tile, groups) + skew

    floor = None
    for a in (s_lo, np.maximum(s_hi - 1, s_lo)):
        at_a = p(a)
        slope = p(a + 1) - at_a
        ends = np.minimum(at_a + slope * (s_lo - a) + drain_lo, at_a + slope * (s_hi - a) + drain_hi)
        floor = ends if floor is None else np.maximum(floor, ends)
    assert floor is not None
    return floor


def layer_cycles(
    TR: ArrayLike, TP: ArrayLike, TC: ArrayLike,
    R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike,
    b: int, BR: int, k_code: int, bytes_per_cycle: float,
    timing: EngineTiming = DEFAULT_TIMING, taps: ArrayLike = 1, port_bytes: float | None = None,
    inside: ArrayLike = 1.0, geometry=None, ports: int = 0, banks: int | None = None, fill: FillShape | None = None,
) -> np.ndarray:
    """Cycles to run one layer (all G convolution groups) for b samples.

    `taps` = kh*kw of a convolution (P = taps * cin); `port_bytes` = bytes of
    one AXI beat (default: one port carrying all of `bytes_per_cycle`); `ports`: AXI
    ports the DMA deals its commands over (0: bytes_per_cycle / port_bytes, rounded up);
    `inside` = `im2col_inside` of a padded convolution; `geometry` (a layer
    descriptor, scalar design only): price the input reads exactly
    (`im2col_row_reads`) instead of at their average alignment; `banks`: the
    engine's input banks NB (None: as many as groups); `fill`: the layer is buffered (its input read
    into the block input buffer a block ahead, `FillShape`).
    Returns float cycles (np.inf where the mode does not exist on the design,
    e.g. k=1/2 with TP=1). Broadcasts over all array arguments. The steps
    (`mode_costs`, `layer_setup`, `layer_parts`) are public so that the DSE
    can share the TR-free ones and bound the cycles over ranges of TR.
    """
    if not 1 <= BR <= b:
        raise ValueError(f"BR must be in [1, b]: BR={BR}, b={b}")
    bus = Bus.of(bytes_per_cycle, port_bytes, timing.word_bytes, ports)
    mode = mode_costs(TP, TC, R, P, C, k_code, bus, timing, taps, inside, geometry, fill=fill)
    setup = layer_setup(mode, R, G, b, BR, banks)
    return layer_parts(setup, TR).cycles(setup)


def descriptor_cycles(TR: int, TP: int, TC: int, bytes_per_cycle: float, geometry, b: int, BR: int, k_code: int,
                      timing: EngineTiming = DEFAULT_TIMING, exact: bool = True, ports: int = 1,
                      banks: int | None = None, buffered: bool = False) -> int:
    """Cycles of one layer given as a layer descriptor's geometry (npix, P, cout, in_h, in_w, out_h,
    out_w, kh, kw, sh, sw, ph, pw) on an engine with `ports` AXI ports of `bytes_per_cycle` each: how
    the RTL agreement and the bit-accurate ModelDevice price a layer. `exact`: input reads at their
    actual alignments (im2col_row_reads); False: at their average alignment, as the DSE prices GEMM shapes.
    `buffered`: priced as an NPU with the block input buffer runs it (its FBCB entry's BUFFERED bit)."""
    g = geometry
    inside = im2col_inside((g.in_h, g.in_w), (g.out_h, g.out_w), (g.kh, g.kw), (g.sh, g.sw), (g.ph, g.pw))
    fill = fill_shape(g, TP, TC) if buffered else None
    return int(layer_cycles(TR, TP, TC, g.npix, g.P, g.cout, 1, b, BR, k_code, ports * bytes_per_cycle, timing,
                            taps=g.kh * g.kw, port_bytes=bytes_per_cycle, inside=inside,
                            geometry=g if exact else None, ports=ports, banks=banks, fill=fill))


def fill_shape(geometry, TP: int, TC: int) -> FillShape:
    """The fill of a buffered layer given as a layer descriptor's geometry, on an engine of <TP, TC>."""
    g = geometry
    return FillShape.of(TP, TC, g.out_w, g.out_h, g.in_h, g.sh, g.kh, g.in_w * getattr(g, "in_pitch", g.cin))


def ideal_cycles(R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike, b: int, TP: ArrayLike,
                 TC: ArrayLike) -> np.ndarray:
    """Cycles at 100% MAC utilisation: the peak-performance lower bound."""
    return np.asarray(G) * np.asarray(R) * np.asarray(P) * np.asarray(C) * b / (np.asarray(TP) * np.asarray(TC))


def memory_floor_cycles(layer, b: int, multipliers: int, bytes_per_cycle: float, word_bytes: int = 2) -> float:
    """The fewest cycles any design of `multipliers` MACs a cycle could spend on a workload Layer at
    batch b while layers share no data on chip: its MACs at full use, or its compulsory traffic at
    `bytes_per_cycle`, whichever is longer. Compulsory: each sample's input words that some window
    touches read once (a stride-2 1x1 convolution touches a quarter of its input), its output written
    once, the weights read once and the int32 biases once. What no tiling, port count or control unit
    can beat, so the gap from a pick to it is what re-reads cost (benchmarks/peak_gap.py)."""
    in_pixels = min(layer.in_hw[0] * layer.in_hw[1],
                    layer.out_hw[0] * layer.out_hw[1] * layer.kernel[0] * layer.kernel[1])
    words = b * (in_pixels * layer.in_ch + layer.out_hw[0] * layer.out_hw[1] * layer.out_ch) + layer.weight_count
    traffic = (words * word_bytes + 4 * layer.out_ch) / bytes_per_cycle
    return max(b * layer.macs / multipliers, traffic)
