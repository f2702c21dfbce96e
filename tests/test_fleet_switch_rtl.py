"""The RTL's share of a model switch: FBCB reload cycles through s_axi (sim_tb/fbcb_reload.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("amaranth")

from fluidnpu.hw.regmap import NpuParams, encode_fbcb_entry  # noqa: E402
from fluidnpu.sim_tb.fbcb_reload import fbcb_reload_cycles  # noqa: E402


def test_fbcb_reload_is_linear_in_entries_and_fills_the_table():
    params = NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=6, axi_dw=64)
    word = encode_fbcb_entry(1, 0, params.bmax)
    full, addr = fbcb_reload_cycles(params, [word] * 24)
    half, _ = fbcb_reload_cycles(params, [word] * 12)
    assert addr == 24                                   # every write landed: FBCB_ADDR walked the whole table
    assert full == 2 * half and 1 <= full / 24 <= 8    # a fixed cost per entry, a few cycles each
