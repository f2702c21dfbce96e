"""The DSE's view of the block input buffer (dse/buffer_fit.py, dse/search.py's buffered choices): the
words it says a block needs are never fewer than the RTL's fill regions take, and its bound on a
buffered choice over a range of TR is never above the choice's cycles anywhere in the range."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from fluidnpu.dse.buffer_fit import block_words, exact_block_words
from fluidnpu.dse.perf_model import DEFAULT_TIMING, Bus, row_blocks
from fluidnpu.dse.search import (
    Choice,
    LayerShapes,
    buffered_bound,
    buffered_cycles,
    buffered_modes,
    choice_setup,
    fill_geometry,
)
from fluidnpu.workload import Layer

convs = st.tuples(
    st.integers(1, 6), st.integers(1, 8), st.integers(1, 9),         # TP TC cin
    st.integers(2, 12), st.integers(2, 12), st.sampled_from([1, 3, 5]), st.integers(1, 2),  # in h w, kernel, stride
    st.integers(1, 10),                                              # C
    st.integers(1, 4), st.integers(1, 4), st.sampled_from([0, 1, 2]), st.sampled_from([2, 4]),  # b BR k NB
).filter(lambda c: c[9] <= c[8] and c[5] <= min(c[3], c[4]) + 2 * (c[5] // 2))


def _layer(case) -> Layer:
    _, _, cin, h, w, k, s, C, *_ = case
    return Layer.conv("x", cin, C, (h, w), k, stride=s, padding=k // 2)


def _setup(case, layer: Layer, bus: tuple[float, float] = (4.0, 8.0)):
    TP, TC, *_, b, BR, k, NB = case
    shapes = LayerShapes.of([layer])
    tp, tc = np.array([[TP]]), np.array([[TC]])
    modes = buffered_modes(tp, tc, shapes, (k,), Bus.of(*bus), DEFAULT_TIMING)
    return shapes, tp, tc, choice_setup(modes, shapes, b, Choice(BR, k, buffered=True), NB)


@settings(max_examples=300, deadline=None)
@given(convs, st.integers(1, 80))
def test_block_words_bound_the_rtls_fill(case, TR):
    TP, TC, *_, b, BR, k, NB = case
    layer = _layer(case)
    shapes, tp, tc, setup = _setup(case, layer)
    rb = row_blocks(setup, np.array([[TR]]))
    if not rb.exists[0, 0]:
        return
    out_w, out_h, in_h, sh, kh, row_words = fill_geometry(layer)
    exact = exact_block_words(TR, TP, TC, (out_w, out_h, in_h, sh, kh, layer.pads[0], row_words), layer.R, layer.P,
                              layer.C, b, BR, k, NB)
    bound = int(block_words(shapes.fills(tp, tc), setup, rb, tp)[0, 0])
    assert exact <= bound, (exact, bound)


@settings(max_examples=400, deadline=None)
@given(convs, st.integers(1, 150), st.integers(0, 80), st.integers(0, 3000),
       st.sampled_from([(0.5, 8.0), (4.0, 8.0), (16.0, 8.0), (24.0, 8.0)]))
def test_buffered_bound_is_below_the_cycles_on_the_whole_range(case, lo, width, depth, bus):
    """A buffer of `depth` words a half at every TR of the range: the bound is at most the choice's
    cycles (inf where its blocks do not fit) at each TR in [lo, lo + width], on one port and on two
    and three (where the bound takes the ports' skew apart: it must stay inside the first fill's max)."""
    layer = _layer(case)
    shapes, tp, tc, setup = _setup(case, layer, bus)
    TP, TC, *_, b, BR, k, NB = case
    hi = lo + width
    most = np.array([[depth]])

    at_hi, low = buffered_bound(setup, np.array([[lo]]), np.array([[hi]]), tp, shapes.fills(tp, tc), most, most)
    every = np.array([buffered_cycles(setup, np.array([[TR]]), tp, shapes.fills(tp, tc), most)[0][0, 0]
                      for TR in range(lo, hi + 1)])
    assert at_hi[0, 0] == every[-1]              # the cycles at hi, priced beside the bound
    assert (low[0, 0] <= every * (1 + 1e-9)).all(), (low, every.min())
    if np.isinf(low[0, 0]):
        assert np.isinf(every).all()
