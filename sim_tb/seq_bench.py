"""What the control unit's component testbenches share (tests/test_seq_*.py).

`plan_values` is the plan the planner must present for a layer, worked out
from docs/interpretations.md's definitions in plain Python (the planner's own
test holds it against the DSE's explicit schedule, dse/tiling.py), so the
fetcher and writer can be tested on a known plan without a planner.
"""

from __future__ import annotations

from typing import Any

from fluidnpu.hw.descriptor import LAYOUT, LayerDescriptor
from fluidnpu.hw.regmap import k_dims


def _blocks(rows: int, tre: int) -> dict[str, int]:
    """n balanced blocks of at most TRe rows: n = ceil(rows / TRe), s, big = divmod(rows, n)."""
    n = -(-rows // tre)
    s, big = divmod(rows, n)
    return {"n": n, "s": s, "big": big}


_PLAN_FIELDS = {name for name, *_ in LAYOUT}     # the plan's descriptor: not the buffer's fields


def plan_values(desc: LayerDescriptor, *, TR: int, TP: int, TC: int, NB: int, b: int, BR: int,
                k: int) -> dict[str, Any]:
    """The planner's `plan` for `desc` at batch b, split BR, mode k (a dict for `plan_layout`)."""
    TRk, TPk, nPE = k_dims(TR, TP, TC, k)
    C, R = desc.cout, desc.npix
    BP = -(-b // BR)
    packed = C <= nPE
    g = min(BP, nPE // C, NB) if packed else 1
    gl = BP - (-(-BP // g) - 1) * g
    rows_f = BR * R
    rows_l = (b - (BP - 1) * BR) * R if gl == 1 else rows_f
    return {
        "desc": {name: v for name, v in desc.fields_packed().items() if name in _PLAN_FIELDS},
        "b": b, "BR": BR, "BP": BP, "nPE": nPE, "TPk": TPk, "g": g, "gl": gl,
        "cw": C if packed else nPE, "br_src": BR * desc.src_sample_stride, "br_dst": BR * desc.dst_sample_stride,
        "full": _blocks(rows_f, TRk // g), "last": _blocks(rows_l, TRk // gl),
    }


def block_rows(plan: dict[str, Any], kind: str) -> list[int]:
    """Rows of each block of a pass of `kind` ("full" or "last"): the first `big` get one more."""
    p = plan[kind]
    return [p["s"] + (i < p["big"]) for i in range(p["n"])]
