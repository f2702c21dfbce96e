"""The DSE of a model whose layers are small against the array (digits-ee, small ONNX
CNNs): most designs then score within a few per cent of each other, many exactly alike, and the
branch and bound must still return the pick of scoring every design."""

from __future__ import annotations

import numpy as np
import pytest

from fluidnpu.dse.search import DSEOptions, LayerShapes, design_spaces, explore, space_scorer, unique_layers
from fluidnpu.workload import Exit, Layer, Workload


@pytest.fixture
def small_workload() -> Workload:
    """digits-ee's shape at a quarter of its size: 3x3 convs of few channels, FC exit heads."""
    c1 = Layer.conv("c1", 1, 4, 4, 3, padding=1)             # R=16, P=9, C=4
    c2 = Layer.conv("c2", 4, 8, 4, 3, stride=2, padding=1)   # R=4, P=36, C=8
    head = (Layer.fc("e1.fc", 4 * 16, 3),)
    fc = Layer.fc("fc", 8 * 4, 3)
    return Workload("small", (c1, c2, fc), (Exit("e1", 0, head, 0.5), Exit("final", 2, (), 0.5)))


def every_design_scored(workload, board, options):
    """(score, <TR, TP, TC, NB, P, stackable, buffer>) of the best of every design that fits, each
    scored exactly; ties to the space earlier in the tie order, then smaller TP, TC, TR."""
    reps, counts = unique_layers(workload.layers())
    shapes = LayerShapes.of(reps)
    clock = board.clock_mhz
    best = None
    for sp in design_spaces(workload, board, options):
        if not sp.tr_max.size:
            continue
        scorer = space_scorer(sp, shapes, counts, options, board, clock, float(workload.total_macs),
                              len(workload.layers()))
        pair = np.repeat(np.arange(sp.TP.size), sp.tr_max)
        tr = np.concatenate([np.arange(1, m + 1) for m in sp.tr_max])
        score = scorer.score_bound(tr, tr, sp.TP[pair], sp.TC[pair])[0]
        i = int(np.lexsort((tr, sp.TC[pair], sp.TP[pair], -score))[0])
        key = (float(score[i]), tuple(-int(k) for k in sp.tie_key))
        if best is None or key > best[0]:
            best = (key, (int(tr[i]), int(sp.TP[pair[i]]), int(sp.TC[pair[i]]), sp.banks, sp.ports, sp.stackable,
                          sp.buffer))
    assert best is not None
    return best[0][0], best[1]


def test_small_layers_on_a_big_array_pick_what_scoring_every_design_picks(make_board, small_workload):
    """32 DSPs against layers of 4 to 8 output channels: every design that fits (every port count,
    bank count, PE kind, with and without the block input buffer) scored exactly picks the same
    design, with the same score, as the branch and bound."""
    board = make_board(dsp=32, bram36=16, hp_ports=2)
    options = DSEOptions(bmax=3)
    result = explore(small_workload, board, options)
    score, design = every_design_scored(small_workload, board, options)
    assert (result.TR, result.TP, result.TC, result.NB, result.ports, result.options.stackable,
            result.options.buffer) == design
    assert result.score == pytest.approx(score, rel=1e-12)
    assert result.n_scored < result.n_designs / 4      # the bound, not scoring, settles most designs
