"""The DSE's bound over ranges of TR (perf_model.layer_cycles_bound) and the properties of the
cycle model's parts it rests on (docs/interpretations.md, Eq. 2). They hold for whatever a
block, a weight fetch or the bus costs, as long as a block's cost is convex in its rows and
not negative at zero rows; these tests price with the model as it is, so a change to the
pricing that breaks them fails here."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from fluidnpu.boards import load_board
from fluidnpu.dse.perf_model import (
    DEFAULT_TIMING,
    Bus,
    layer_cycles,
    layer_cycles_bound,
    layer_parts,
    layer_setup,
    mode_costs,
    row_blocks,
    without_port_skew,
)
from fluidnpu.dse.search import (
    LayerShapes,
    buffered_modes,
    choice_setup,
    choices,
    modes_of,
    split_stacks,
    unique_layers,
)
from fluidnpu.zoo import zoo_model

TOL = 1e-7

layers = st.tuples(
    st.integers(1, 9), st.integers(1, 12),                          # TP TC
    st.integers(1, 40), st.integers(1, 24), st.sampled_from([1, 3, 9]), st.integers(1, 30),  # R cin taps C
    st.integers(1, 2),                                              # G
    st.integers(1, 8), st.integers(1, 8), st.sampled_from([0, 1, 2]),  # b BR k
    st.sampled_from([(0.5, None), (3.0, None), (8.0, None), (16.0, 8.0), (50.0, None)]),  # bytes/cycle, port
    st.sampled_from([1.0, 0.8, 0.5]),                               # inside
).filter(lambda c: c[8] <= c[7])


def priced(case):
    """(the layer's setup, its cycles at TR) for a drawn case."""
    TP, TC, R, cin, taps, C, G, b, BR, k, (bpc, port), inside = case
    P = taps * cin
    mode = mode_costs(TP, TC, R, P, C, k, Bus.of(bpc, port), DEFAULT_TIMING, taps, inside)
    setup = layer_setup(mode, R, G, b, BR)

    def cycles(TR):
        return layer_cycles(TR, TP, TC, R, P, C, G, b, BR, k, bpc, DEFAULT_TIMING, taps, port, inside)
    return setup, cycles


@settings(max_examples=300, deadline=None)
@given(layers, st.integers(1, 300), st.integers(0, 200))
def test_bound_is_below_the_cycles_on_the_whole_range(case, lo, width):
    setup, cycles = priced(case)
    hi = lo + width
    at_hi, low = layer_cycles_bound(setup, np.int64(lo), np.int64(hi))
    assert at_hi == cycles(hi) or (np.isinf(at_hi) and np.isinf(cycles(hi)))
    every = cycles(np.arange(lo, hi + 1))
    assert (low <= every).all(), (low, every.min(), np.argmin(every) + lo)
    if np.isinf(at_hi):
        assert np.isinf(every).all()         # a mode missing at hi is missing at every smaller TR
    point, point_low = layer_cycles_bound(setup, np.int64(lo), np.int64(lo))
    if setup.mode.costs.bus.n_ports == 1:            # on several ports the bound drops the skew
        assert point_low == point == cycles(lo) or np.isinf(point)
    else:
        assert point_low <= point == cycles(lo) or np.isinf(point)


@settings(max_examples=200, deadline=None)
@given(layers)
def test_each_part_moves_with_tr_as_the_bound_assumes(case):
    setup = without_port_skew(priced(case)[0])      # the parts the bound takes apart
    TR = np.arange(1, 400)
    parts = layer_parts(setup, TR)
    ok = parts.exists
    assert (ok[1:] >= ok[:-1]).all()                                  # exists from some TR on
    body, regroup, prologue = (x[ok] for x in np.broadcast_arrays(parts.body, parts.regroup, parts.prologue))
    assert (np.diff(body) <= TOL).all()
    assert (np.diff(regroup) >= -TOL).all()
    assert (np.diff(prologue) >= -TOL).all()
    # the last block's size grows with TR, and the drain is concave in it
    s_last = np.broadcast_to(row_blocks(setup, TR).last[1], TR.shape)[ok]
    assert (np.diff(s_last) >= 0).all()
    drain = np.broadcast_to(parts.drain, TR.shape)[ok]
    sizes, first = np.unique(s_last, return_index=True)
    d = drain[first]
    if sizes.size >= 3:
        slope = np.diff(d) / np.diff(sizes)
        assert (np.diff(slope) <= TOL).all()


@settings(max_examples=300, deadline=None)
@given(layers, st.integers(0, 8), st.integers(1, 3))
def test_block_cost_is_convex_and_not_negative(case, w, groups):
    """Balanced blocks are optimal and fewer blocks never cost more (the body is non-increasing in
    TR) because a block's cost is convex in its rows with block(0) >= 0; the drain is concave."""
    setup, _ = priced(case)
    costs = without_port_skew(setup).mode.costs      # the bound's costs (the skew is not convex)
    tile = costs.tile(np.int64(min(w, int(setup.mode.C)) or 1))
    t = np.arange(0, 80)
    f = costs.block(t, tile, groups)
    assert f[0] >= 0
    assert (f[:-2] + f[2:] - 2 * f[1:-1] >= -TOL).all()


def test_splits_priced_side_by_side_equal_each_priced_alone():
    """`split_stacks`: a batch size's splits BR stacked on a leading axis price every (split, design,
    layer) exactly as one split at a time does (the search's bound takes their minimum)."""
    from dataclasses import replace


    reps, _ = unique_layers(zoo_model("resnet50").layers())
    shapes = LayerShapes.of(reps)
    TP, TC = np.array([[3], [14], [27]]), np.array([[40], [64], [64]])
    lo, hi = np.array([[5], [300], [778]]), np.array([[90], [2091], [778]])
    board = load_board("zcu104")
    for ports, banks, b in ((1, 2, 3), (4, 8, 8), (2, 4, 5)):
        bus = board.bus(board.clock_mhz, ports)
        stacks = split_stacks(choices("fluid", b, True))
        assert len(stacks) == 3        # one run per Stackable-PE mode
        for ch, BR in stacks:
            assert BR is not None and BR[:, 0, 0].tolist() == list(range(b, 0, -1))
            modes = modes_of(TP, TC, shapes, (ch.k_code,), bus, DEFAULT_TIMING)
            both = layer_cycles_bound(choice_setup(modes, shapes, b, ch, banks, BR), lo, hi)
            for i, br in enumerate(BR[:, 0, 0]):
                alone = layer_cycles_bound(choice_setup(modes, shapes, b, replace(ch, BR=int(br)), banks), lo, hi)
                for s, a in zip(both, alone):
                    np.testing.assert_array_equal(np.broadcast_to(s, (b, *a.shape))[i], a)
    assert [BR for _, BR in split_stacks(choices("r", 4, True))] == [None, None, None]


def test_a_buffered_choice_shares_its_ddr_twins_groups_passes_and_tiles():
    """`choice_setup(like=)`: the search prices a buffered choice (and its bound's repriced fill) on the
    setup of the same choice from DDR with only the mode replaced, which holds only while a layer's
    groups, passes and column tiles do not depend on where its input is read from."""
    from dataclasses import fields, replace

    from fluidnpu.dse.perf_model import TileCosts

    reps, _ = unique_layers(zoo_model("inceptionv3").layers())
    shapes = LayerShapes.of(reps)
    TP, TC = np.array([[3], [14], [48]]), np.array([[40], [64], [36]])
    TR = np.array([[77], [391], [577]])
    board = load_board("zcu104")
    for ports, banks, b in ((1, 2, 3), (4, 8, 8), (3, 2, 5)):
        bus = board.bus(board.clock_mhz, ports)
        ks = (0, 1, 2)
        modes = modes_of(TP, TC, shapes, ks, bus, DEFAULT_TIMING) | buffered_modes(TP, TC, shapes, ks, bus,
                                                                                   DEFAULT_TIMING)
        for ch, BR in split_stacks(choices("fluid", b, True, True)):
            if not ch.buffered:
                continue
            fresh = choice_setup(modes, shapes, b, ch, banks, BR)
            shared = choice_setup(modes, shapes, b, ch, banks, BR,
                                  like=choice_setup(modes, shapes, b, replace(ch, buffered=False), banks, BR))
            assert shared.mode is fresh.mode
            for f in fields(fresh):
                a, s = getattr(fresh, f.name), getattr(shared, f.name)
                if isinstance(a, TileCosts):
                    for g in fields(a):
                        np.testing.assert_array_equal(getattr(a, g.name), getattr(s, g.name))
                elif f.name != "mode":
                    np.testing.assert_array_equal(a, s)
            np.testing.assert_array_equal(layer_parts(shared, TR).cycles(shared), layer_parts(fresh, TR).cycles(fresh))


def test_the_cycles_and_the_bound_priced_side_by_side_equal_each_priced_alone():
    """`layer_cycles_bound` prices the parts at hi with the several-port skew and a buffered layer's own
    fill (the cycles) beside those without the skew and with the bound's fill (`SIDES`): each side must be
    what it is priced alone, for splits stacked or not, from DDR and buffered; and the bound's fill put in
    with `with_fill` must price as the mode built with it (nothing else in a mode depends on the fill)."""
    from fluidnpu.dse.perf_model import layer_cycles_low, with_fill

    reps, _ = unique_layers(zoo_model("resnet50").layers())
    shapes = LayerShapes.of(reps)
    TP, TC = np.array([[3], [14], [27]]), np.array([[40], [64], [64]])
    lo, hi = np.array([[5], [300], [700]]), np.array([[90], [2091], [778]])
    board = load_board("zc706")
    sided = 0
    for ports, banks, b in ((1, 2, 1), (1, 4, 3), (4, 2, 8), (3, 4, 5), (2, 2, 1)):
        bus = board.bus(board.clock_mhz, ports)
        modes = modes_of(TP, TC, shapes, (0, 1, 2), bus, DEFAULT_TIMING)
        modes |= buffered_modes(TP, TC, shapes, (0, 1, 2), bus, DEFAULT_TIMING)
        fill = shapes.fills(TP, TC)
        for ch, BR in split_stacks(choices("fluid", b, True, True)):
            setup = choice_setup(modes, shapes, b, ch, banks, BR)
            rb_lo, rb_hi = row_blocks(setup, lo), row_blocks(setup, hi)
            low_fill = fill.linear(np.maximum(rb_lo.last[1], 1), np.maximum(rb_hi.t0_full, rb_lo.last[1])) \
                if ch.buffered else None
            at_hi, low = layer_cycles_bound(setup, lo, hi, low_fill=low_fill)
            bound_setup = setup if low_fill is None else with_fill(setup, low_fill)
            np.testing.assert_array_equal(at_hi, layer_parts(setup, hi).cycles(setup))
            np.testing.assert_array_equal(low, layer_cycles_low(bound_setup, lo, hi))
            sided += ports > 1 or ch.buffered
            if ch.buffered:
                fresh = buffered_modes(TP, TC, shapes, (ch.k_code,), bus, DEFAULT_TIMING, low_fill)
                built = choice_setup(fresh, shapes, b, ch, banks, BR)
                np.testing.assert_array_equal(layer_parts(bound_setup, hi).cycles(bound_setup),
                                              layer_parts(built, hi).cycles(built))
    assert sided >= 10        # the side-by-side pricing ran, not only the one-port path


def test_the_edges_together_bound_a_one_pass_layer_small_against_the_array():
    """digits-ee's conv1 (R=64, P=9, C=8) on ZCU104's <24, 32> at b = 8, BR = 8 (one pass), over TR 1..512:
    priced apart, the prologue at TR = 1 and the drain at TR = 512 (-1,841 cycles: the one block's long last
    step) bounded it at 1,117 cycles; priced together (`_edges_floor`) the bound is 2,964 against the 3,146
    the layer reaches at its best TR, and still below the cycles at every TR."""

    board = load_board("zcu104")
    shapes = LayerShapes.of(zoo_model("digits-ee").layers()[:1])
    TP, TC = np.array([[24]]), np.array([[32]])
    modes = modes_of(TP, TC, shapes, [0], board.bus(board.clock_mhz, 4), DEFAULT_TIMING)
    setup = choice_setup(modes, shapes, 8, choices("fluid", 8, False)[0], banks=2)
    assert (int(setup.BR.ravel()[0]), int(setup.npass.ravel()[0])) == (8, 1)
    every = layer_parts(setup, np.arange(1, 513)[:, None]).cycles(setup).ravel()
    _, low = layer_cycles_bound(setup, np.array([[1]]), np.array([[512]]))
    assert (int(every.min()), float(low.ravel()[0])) == (3146, 2964.0)
