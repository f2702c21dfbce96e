"""dse/timing_model.py: the structural counts, the proxy per design, and its place in the DSE output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fluidnpu.dse.timing_model import (
    DEFAULT_COSTS,
    LEVEL_BUDGET,
    STRUCTURES,
    TimingCosts,
    design_timing,
    path_levels,
    structure_levels,
    structure_x,
)

FIT = Path(__file__).resolve().parents[1] / "docs" / "figures" / "timing" / "timing.json"


def test_structural_counts() -> None:
    assert structure_x("operand", 64, 2, 2, 8) == 3
    assert structure_x("read_command", 64, 16, 2, 2) == 6          # a run of up to 2TP = 32 words: 6 bits
    assert structure_x("response_ready", 1024, 2, 2, 2) == 11
    assert structure_x("write_data", 64, 2, 8, 2) == 6             # word offsets up to 2TC(NB+1) = 48
    assert structure_x("requantise", 64, 64, 64, 8) == 0


def test_broadcasts_and_takes_the_deepest_structure() -> None:
    TP, TC = np.array([2, 16, 64]), np.array([2, 32, 64])
    per = structure_levels(1024, TP, TC, 8)
    assert all(v.shape == (3,) for v in per.values())
    parts = path_levels(1024, TP, TC, 8)
    assert np.array_equal(parts["core"], np.maximum.reduce([per[s.name] for s in STRUCTURES if s.part == "core"]))
    est = design_timing(1024, 64, 64, 8)
    assert est.lut_levels == max(est.levels.values()) == est.levels[est.structure]
    assert set(est.over_budget) == {k for k, v in est.levels.items() if v > LEVEL_BUDGET}
    assert set(est.fixes) == set(est.over_budget) and all(est.fixes.values())
    assert est.to_dict()["meets_budget"] == (est.lut_levels <= LEVEL_BUDGET)
    # a structure that grows with the design never gets shallower as it grows
    small, big = design_timing(64, 2, 2, 2), design_timing(8192, 64, 64, 8)
    assert all(big.levels[k] >= small.levels[k] for k in small.levels)


def test_costs_are_the_benchmark_fit() -> None:
    """DEFAULT_COSTS is what benchmarks/bench_timing.py fitted (rerun it and paste after an RTL change)."""
    fit = json.loads(FIT.read_text())["meta"]["fit"]
    assert dict(DEFAULT_COSTS.base) == fit["base"] and dict(DEFAULT_COSTS.per_level) == fit["per_level"]
    assert design_timing(64, 2, 2, 2, TimingCosts((), ())).lut_levels == 0


def test_dse_reports_the_proxy() -> None:
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, evaluate_design
    from fluidnpu.zoo import zoo_model

    res = evaluate_design(zoo_model("digits-ee"), load_board("zc706"), 64, 4, 4, DSEOptions(buffer=False))
    assert res.timing_proxy == design_timing(64, 4, 4, res.options.bmax, banks=res.NB)
    assert bundle_from_result(res).data["timing_proxy"]["lut_levels"] == res.timing_proxy.lut_levels


def test_the_block_input_buffer_adds_its_measured_levels():
    """A design with the block input buffer reports its read path and its join: Yosys measured the buffer
    at 4 levels up to 4 BRAM36 a bank and 6 at 18 (docs/figures/resources/input_buffer_points.json), the
    control unit with it joined at 8; a design without one reports neither."""
    import json
    from pathlib import Path

    from fluidnpu.dse.timing_model import design_timing, input_buffer_levels

    doc = json.loads((Path(__file__).parents[1] / "docs/figures/resources/input_buffer_points.json").read_text())
    for pt in doc["points"]:
        assert input_buffer_levels(pt["bram36"] / pt["banks"]) == pt["lut_levels"], pt
    plain = design_timing(1372, 14, 64, 8, banks=2)
    built = design_timing(1372, 14, 64, 8, banks=2, buffer_per_bank=37)
    assert "input_buffer" not in plain.levels and built.levels["input_buffer"] == 6
    assert built.levels["buffer_join"] == 8 and built.lut_levels == max(plain.lut_levels, 8)
