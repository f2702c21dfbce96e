"""dse/timing_model.py: the structural counts, the proxy per design, and its place in the DSE output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fluidnpu.dse.timing_model import (DEFAULT_COSTS, LEVEL_BUDGET, STRUCTURES, TimingCosts, design_timing,
                                       path_levels, structure_levels, structure_x)

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
    from fluidnpu.dse.search import evaluate_design
    from fluidnpu.zoo import zoo_model

    res = evaluate_design(zoo_model("digits-ee"), load_board("zc706"), 64, 4, 4)
    assert res.timing_proxy == design_timing(64, 4, 4, res.options.bmax, banks=res.NB)
    assert bundle_from_result(res).data["timing_proxy"]["lut_levels"] == res.timing_proxy.lut_levels
