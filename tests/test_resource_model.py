"""Resource model: RAM primitives at their real granularity, and the TR search."""

from __future__ import annotations

import numpy as np

from fluidnpu.boards import load_board
from fluidnpu.dse.resource_model import bram36_for, design_resources, fbcb_bits, max_tr, memory_use, uram_for


def test_bram_aspect_ratios():
    assert bram36_for(512, 72) == 1.0        # exactly one BRAM36 in 512x72
    assert bram36_for(1024, 18) == 0.5       # one BRAM18
    assert bram36_for(1025, 18) == 1.0       # spills into 2K x 18
    assert bram36_for(4652, 16) == 2.5       # five 1K x 18 BRAM18s beat three 2K x 18 BRAM36s
    assert bram36_for(100, 4096) == 57.0     # wide: 512 x 72 tiles, ceil(4096/72) = 57
    assert bram36_for(0, 16) == 0.0


def test_uram_granularity():
    assert uram_for(4096, 72) == 1
    assert uram_for(4097, 72) == 2
    assert uram_for(100, 4096) == 57


def test_fbcb_register_bits_match_paper():
    # The paper stores BR in log2(Bmax) bits and k in 2: 5 bits at Bmax = 8, so a
    # 62-layer FBCB is 62*8*5 = 2480 registers = 0.57% of ZC706's 437,200 FFs (Sec. IV).
    assert fbcb_bits(8) == 5
    zc706 = load_board("zc706")
    res = design_resources(1024, 7, 128, zc706, 8, 62, True)
    assert res.fbcb_ff == 2480
    assert round(100 * res.fbcb_ff / zc706.ff, 2) == 0.57


def test_max_tr_is_largest_fitting(make_board):
    board = make_board(dsp=16, bram36=20)
    TP = np.array([1, 2, 4, 8])
    TC = np.array([16, 8, 4, 2])
    tr = max_tr(TP, TC, board, 4, 5, True, tr_cap=100_000)
    for i in range(len(TP)):
        _, _, ok_at = memory_use(np.array(tr[i]), TP[i], TC[i], board, 4)
        _, _, ok_next = memory_use(np.array(tr[i] + 1), TP[i], TC[i], board, 4)
        assert ok_at and not ok_next


def test_uram_takes_big_buffers_on_ultrascale():
    zcu104 = load_board("zcu104")
    bram, uram, ok = memory_use(np.array(8192), np.array(27), np.array(64), zcu104, 8)
    assert ok and uram > 0 and bram <= zcu104.bram36
    # the paper's <6832, 10, 172> needs 48 bits per (row, PE) here: it does not fit (docs/dse.md)
    assert not memory_use(np.array(6832), np.array(10), np.array(172), zcu104, 8)[2]
    zc706 = load_board("zc706")
    _, uram7, _ = memory_use(np.array(1024), np.array(7), np.array(128), zc706, 8)
    assert uram7 == 0
