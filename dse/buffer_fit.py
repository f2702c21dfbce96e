"""Whether a buffered layer's blocks fit a half of the block input buffer, as the DSE prices it.

The RTL raises BUFFER_OVERFLOW where a block's regions (hw/regmap.py `fill_regions`, one per sample
each group's rows reach, each starting on a window) end past a half; the bit-accurate model device
walks the exact schedule to say where. The DSE prices thousands of designs a round, so it takes a
bound instead: the most words any block of a layer's plan can need at the worst alignment of its
rows, never below what the RTL needs (tests/test_buffer_fit.py checks it against the exact walk).
A layer is buffered in the DSE only where this bound fits, so no design the DSE picks overflows.
"""

from __future__ import annotations

import numpy as np

from fluidnpu.dse.perf_model import FillShape, LayerSetup, RowBlocks, windows
from fluidnpu.hw.regmap import block_fill_end, buffer_window, fill_regions


def _one_sample_rows(fill: FillShape, n: np.ndarray) -> np.ndarray:
    """Most input rows a run of n (1..npix) output pixels inside one sample covers: it touches at
    most floor((n + out_w - 2) / out_w) + 1 output rows, whose windows cover (rows - 1) sh + kh
    input rows, and a sample has in_h."""
    rows_out = (n + fill.out_w - 2) // fill.out_w + 1
    return np.minimum(fill.in_h, (rows_out - 1) * fill.sh + fill.kh)


def _two_ends_rows(fill: FillShape, n: np.ndarray) -> np.ndarray:
    """Most input rows a run of n pixels over the end of one sample and the start of the next covers:
    the two parts, aligned to their sample's end and start, touch at most ceil(n / out_w) + 1 output
    rows between them, each part's windows (rows - 1) sh + kh input rows."""
    rows_out = -(-n // fill.out_w) + 1
    return np.minimum(2 * fill.in_h, (rows_out - 2) * fill.sh + 2 * fill.kh)


def slice_words(fill: FillShape, t: np.ndarray, samples: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Most words of a half one group's run of t output pixels takes (its group `samples` samples long):
    inside one sample, or over k whole samples and two partial ones (k + 2 <= samples), each region
    rounded up to a window."""
    t = np.asarray(t, dtype=np.int64)
    npix = fill.out_w * fill.out_h
    inside = np.where(t <= npix, _one_sample_rows(fill, np.minimum(t, npix)) * fill.row_words + window - 1, 0)
    best = inside
    k_top = np.maximum((t - 2) // npix, 0)
    for k in (k_top, k_top - 1):          # the partial ends then hold 2..npix + 1 or npix + 2..2 npix + 1 pixels
        ends = t - k * npix
        valid = (k >= 0) & (ends >= 2) & (ends <= 2 * npix) & (k + 2 <= samples)
        rows = k * fill.in_h + _two_ends_rows(fill, np.maximum(ends, 1))
        best = np.maximum(best, np.where(valid, rows * fill.row_words + (k + 2) * (window - 1), 0))
    return best


def block_words(fill: FillShape, setup: LayerSetup, rb: RowBlocks, TP: np.ndarray) -> np.ndarray:
    """Most words a half holds for any block of the layer's plan: a full pass's g groups of its largest
    block, or the last pass's h groups of theirs, each group a run of up to BR samples."""
    window = windows(TP)
    full = setup.g * slice_words(fill, rb.t0_full, setup.BR, window)
    last = setup.h * slice_words(fill, rb.t0_last, setup.BR, window)
    return np.where(setup.npass > 1, np.maximum(full, last), last)


def exact_block_words(TR: int, TP: int, TC: int, geometry: tuple[int, int, int, int, int, int, int], npix: int,
                      P: int, C: int, b: int, BR: int, k_code: int, banks: int) -> int:
    """The most words any block of a buffered layer needs in a half, exactly as the RTL fills it: the
    layer's blocks (dse/tiling.py's schedule, the one the RTL runs), each block's groups' regions as the
    fill walker reads them (`fill_regions`), one after another in one half (`block_fill_end`). Every
    column tile walks the same blocks, so the first tile's suffice. `geometry`: out_w, out_h, in_h, sh,
    kh, ph and the words of an input row. What the bit-accurate model device checks BUFFER_OVERFLOW by."""
    from fluidnpu.dse.tiling import layer_schedule

    window = buffer_window(TP)
    most = 0
    for blk in layer_schedule(TR, TP, TC, npix, P, C, b, BR, k_code, banks).blocks:
        if blk.c0 != 0:            # the same row block in a later column tile
            continue
        regions = [r for sl in blk.slices
                   for r in fill_regions(*geometry, sl.samples[0] + sl.row0 // npix, sl.row0 % npix, sl.row1 - sl.row0,
                                         sl.samples[-1] + 1)]
        most = max(most, block_fill_end(regions, window))
    return most
