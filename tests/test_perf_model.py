"""The cycle model: hand-computed cases, each mode's purpose, and its invariants.

The closed form (perf_model.layer_cycles) is checked against the explicit
block schedule (dse.tiling), which is itself executed with numpy and must
compute exactly every sample's GEMM.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidnpu.dse.perf_model import EngineTiming, layer_cycles, mode_dims
from fluidnpu.dse.tiling import layer_schedule, run_schedule, schedule_cycles

FAST = 1e9  # bytes/cycle: memory never limits


def test_compute_bound_case_by_hand():
    # TR=8 TP=4 TC=4; R=10 P=8 C=4, b=1: two weight steps (P/TP), 10 rows -> 2 balanced
    # blocks of 5 rows: 2*(2*5) compute + 2 fills (4 + log2 4) + 32 layer overhead.
    assert layer_cycles(8, 4, 4, 10, 8, 4, 1, 1, 1, 0, FAST) == 2 * (2 * 5) + 2 * 6 + 32


def test_memory_bound_fc_by_hand():
    # FC P=1000 C=10 on TP=TC=10 at 1 word/cycle: one block whose DMA moves
    # 10000 weights + 1000 inputs + 10 outputs; plus fill 4+4, prologue 100, overhead 32.
    assert layer_cycles(64, 10, 10, 1, 1000, 10, 1, 1, 1, 0, 2.0) == 11010 + 8 + 100 + 32
    # R-batching 4 samples reuses the weights: only inputs/outputs grow.
    assert layer_cycles(64, 10, 10, 1, 1000, 10, 1, 4, 4, 0, 2.0) == 10000 + 4 * 1010 + 8 + 100 + 32


def test_p_batching_packs_small_c_into_idle_pes():
    # C=2 on 8 PE columns: R-batching leaves 6 PEs idle, P-batching runs 4 samples side by side.
    r_batch = layer_cycles(1024, 4, 8, 200, 16, 2, 1, 4, 4, 0, FAST)
    p_batch = layer_cycles(1024, 4, 8, 200, 16, 2, 1, 4, 1, 0, FAST)
    assert p_batch < r_batch / 3


def test_stacking_k2_helps_small_c_at_batch_one():
    k1 = layer_cycles(64, 4, 8, 32, 64, 4, 1, 1, 1, 0, FAST)
    k2 = layer_cycles(64, 4, 8, 32, 64, 4, 1, 1, 1, 1, FAST)
    assert k2 < 0.6 * k1


def test_splitting_k_half_helps_short_reductions():
    # P=4 < TP=8 wastes half of every tree; k=1/2 gives 2TC narrower PEs.
    k1 = layer_cycles(1024, 8, 8, 320, 4, 16, 1, 1, 1, 0, FAST)
    kh = layer_cycles(1024, 8, 8, 320, 4, 16, 1, 1, 1, 2, FAST)
    assert kh < 0.6 * k1


def test_mode_dims_and_missing_modes():
    assert [tuple(map(int, mode_dims(10, 7, 5, k))) for k in (0, 1, 2)] == [(10, 7, 5), (5, 14, 2), (5, 3, 10)]
    assert np.isinf(layer_cycles(10, 1, 4, 4, 4, 4, 1, 1, 1, 2, FAST))  # k=1/2 needs TP >= 2
    assert np.isinf(layer_cycles(10, 4, 1, 4, 4, 4, 1, 1, 1, 1, FAST))  # k=2 needs TC >= 2
    with pytest.raises(ValueError):
        layer_cycles(10, 4, 4, 4, 4, 4, 1, 2, 3, 0, FAST)


def test_grouped_conv_runs_groups_in_sequence():
    one = layer_cycles(32, 4, 4, 9, 9, 4, 1, 1, 1, 0, FAST, EngineTiming(layer_overhead=0))
    assert layer_cycles(32, 4, 4, 9, 9, 4, 8, 1, 1, 0, FAST, EngineTiming(layer_overhead=0)) == 8 * one


def test_vectorised_call_matches_scalar_calls():
    TR = np.array([[16], [40]])
    TP = np.array([[3], [5]])
    TC = np.array([[7], [2]])
    R, P, C = np.array([[9, 30]]), np.array([[20, 7]]), np.array([[5, 11]])
    grid = layer_cycles(TR, TP, TC, R, P, C, 1, 5, 2, 1, 3.0)
    for i in range(2):
        for j in range(2):
            assert grid[i, j] == layer_cycles(TR[i, 0], TP[i, 0], TC[i, 0], R[0, j], P[0, j], C[0, j], 1, 5, 2, 1, 3.0)


cases = st.tuples(
    st.integers(1, 40), st.integers(1, 9), st.integers(1, 12),       # TR TP TC
    st.integers(1, 30), st.integers(1, 40), st.integers(1, 30),      # R P C
    st.integers(1, 8), st.integers(1, 8), st.sampled_from([0, 1, 2]),  # b BR k
    st.sampled_from([0.5, 3.0, 7.3, 50.0]),
).filter(lambda c: c[7] <= c[6])


@settings(max_examples=300, deadline=None)
@given(cases)
def test_closed_form_equals_explicit_schedule(case):
    TR, TP, TC, R, P, C, b, BR, k, bpc = case
    closed = layer_cycles(TR, TP, TC, R, P, C, 1, b, BR, k, bpc)
    try:
        sched = layer_schedule(TR, TP, TC, R, P, C, b, BR, k)
    except ValueError:
        assert np.isinf(closed)
        return
    assert schedule_cycles(sched, P, 1, bpc) == closed


@settings(max_examples=150, deadline=None)
@given(cases, st.integers(0, 2**31 - 1))
def test_every_mode_computes_each_samples_gemm_exactly(case, seed):
    TR, TP, TC, R, P, C, b, BR, k, _ = case
    try:
        sched = layer_schedule(TR, TP, TC, R, P, C, b, BR, k)
    except ValueError:
        return
    rng = np.random.default_rng(seed)
    X = rng.integers(-2**15, 2**15, (b, R, P))
    W = rng.integers(-2**15, 2**15, (P, C))
    assert np.array_equal(run_schedule(sched, X, W, R), np.einsum("srp,pc->src", X, W))
    # every output element is produced exactly once
    produced = sum((sl.row1 - sl.row0) * (blk.c1 - blk.c0) for blk in sched.blocks for sl in blk.slices)
    assert produced == b * R * C


@settings(max_examples=200, deadline=None)
@given(cases.map(lambda c: c[1:]), st.integers(1, 3))
def test_cycles_never_beat_peak_and_never_grow_with_tr(case, G):
    TP, TC, R, P, C, b, BR, k, bpc = case
    TR = np.arange(1, 200)
    cyc = layer_cycles(TR, TP, TC, R, P, C, G, b, BR, k, bpc)
    finite = np.isfinite(cyc)
    assert (cyc[finite] >= G * b * R * P * C / (TP * TC)).all()
    # monotone non-increasing in TR: the basis of the DSE's exactness (docs/interpretations.md)
    as_big = np.where(finite, cyc, 1e30)
    assert (np.diff(as_big) <= 0).all()
