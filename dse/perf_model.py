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
    """Fixed costs of the engine, in cycles (calibrated against the RTL).

    fill_base + ceil(log2 TPk) cycles drain the pipeline at the end of every
    row block (input-buffer read, multiply, adder tree, accumulate);
    layer_overhead covers the descriptor fetch and configuration of a layer.
    """

    word_bytes: int = 2
    fill_base: int = 4
    layer_overhead: int = 32


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


def layer_cycles(
    TR: ArrayLike, TP: ArrayLike, TC: ArrayLike,
    R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike,
    b: int, BR: int, k_code: int, bytes_per_cycle: float,
    timing: EngineTiming = DEFAULT_TIMING,
) -> np.ndarray:
    """Cycles to run one layer (all G convolution groups) for b samples.

    Returns float cycles (np.inf where the mode does not exist on the design,
    e.g. k=1/2 with TP=1). Broadcasts over all array arguments.
    """
    if not 1 <= BR <= b:
        raise ValueError(f"BR must be in [1, b]: BR={BR}, b={b}")
    TRk, TPk, TCk = mode_dims(TR, TP, TC, k_code)
    exists = (TRk >= 1) & (TPk >= 1) & (TCk >= 1)
    TRk, TPk, TCk = np.maximum(TRk, 1), np.maximum(TPk, 1), np.maximum(TCk, 1)
    R, P, C, G = (np.asarray(x, dtype=np.int64) for x in (R, P, C, G))

    BP = -(-b // BR)
    n_last = b - (BP - 1) * BR          # samples in the last (possibly partial) group
    n_p = _ceil_div(P, TPk)             # weight steps per block
    packed = C <= TCk
    g = np.where(packed, np.minimum(BP, TCk // np.maximum(C, 1)), 1)
    exists = exists & (TRk >= g)        # each packed group needs at least one buffer row
    TRe = np.maximum(TRk // g, 1)       # rows per block when g groups share the input buffer
    nct = _ceil_div(C, TCk)
    w_full = np.minimum(C, TCk)
    w_last = C - (nct - 1) * TCk
    npass = _ceil_div(np.int64(BP), g)
    h = BP - (npass - 1) * g            # groups in the last pass
    rows_full = BR * R
    rows_last = np.where(h == 1, n_last, BR) * R   # a partial group alone streams only its rows
    fill = timing.fill_base + np.ceil(np.log2(TPk))
    wpc = timing.word_bytes / bytes_per_cycle  # cycles per word moved

    def pass_cycles(rows: np.ndarray, w: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """A pass: `groups` groups side by side, `rows` rows cut into n balanced
        blocks (the first `big` hold s+1 rows, the rest s). Every group of the
        pass streams all the pass's rows (a short group's extra rows are padding
        the DMA moves like any other), so each block costs the same per row."""
        n = _ceil_div(rows, TRe)
        s = rows // n
        big = rows - n * s
        alpha = wpc * P * w                  # weights, once per block
        per_row = wpc * (P + w) * groups     # inputs + outputs of one row of every group
        small_blk = np.maximum(n_p * s, alpha + per_row * s)
        big_blk = np.maximum(n_p * (s + 1), alpha + per_row * (s + 1))
        return (n - big) * small_blk + big * big_blk + n * fill

    def column_tile_cycles(w: np.ndarray) -> np.ndarray:
        return (npass - 1) * pass_cycles(rows_full, w, g) + pass_cycles(rows_last, w, h)

    body = (nct - 1) * column_tile_cycles(w_full) + column_tile_cycles(w_last)
    prologue = wpc * TPk * w_full        # the first weight step is not overlapped
    cycles = G * (body + prologue) + timing.layer_overhead
    return np.where(exists, np.ceil(cycles - 1e-6), np.inf)  # tolerance: float sums in any order


def ideal_cycles(R: ArrayLike, P: ArrayLike, C: ArrayLike, G: ArrayLike, b: int, TP: ArrayLike, TC: ArrayLike) -> np.ndarray:
    """Cycles at 100% MAC utilisation: the peak-performance lower bound."""
    return np.asarray(G) * np.asarray(R) * np.asarray(P) * np.asarray(C) * b / (np.asarray(TP) * np.asarray(TC))
