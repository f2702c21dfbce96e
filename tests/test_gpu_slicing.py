"""DVABatch §7.1 on CPU: preferred batch sizes, preferred-size cut points, the stage-count search, and
§5.2.2's "latest batch stored in the batch table"."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.batch_table import BatchTable, Query
from fluidnpu.host_driver.staged.slicing import (
    STAGE_TRIES,
    choose_stage_count,
    partition,
    preferred_batch_sizes,
    stage_cuts,
)

BSS = (1, 2, 4, 8, 16, 32, 64)


def saturating(knee: int, scale: float = 1.0) -> np.ndarray:
    """Seconds per batch size for an operator that is latency-bound up to `knee` and linear after it."""
    return scale * np.maximum(np.asarray(BSS, dtype=float), knee) / knee


def test_preferred_batch_size_is_where_throughput_saturates():
    ms = np.stack([saturating(1), saturating(8), saturating(32)])
    assert preferred_batch_sizes(ms, BSS) == [1, 8, 32]


def test_cuts_go_where_preferred_sizes_change_if_the_balance_allows():
    # modules 0-3 prefer 32, modules 4-7 prefer 1; the time-balanced 2-stage cut is elsewhere (module 5)
    ms = np.stack([saturating(32, 3.0)] * 4 + [saturating(1, 0.3)] * 4)
    costs = ms.sum(axis=1)
    assert partition(costs, 2) != [(0, 4), (4, 8)]
    assert stage_cuts(ms, BSS, 2) == [4]
    assert partition(costs, 2, stage_cuts(ms, BSS, 2)) == [(0, 4), (4, 8)]
    # when honouring the change would unbalance the stages too much, time-evenness wins
    lopsided = np.stack([saturating(32, 0.05)] + [saturating(1, 1.0)] * 7)
    assert stage_cuts(lopsided, BSS, 2) == []
    # exits are always cuts, and take the stage budget first
    assert stage_cuts(ms, BSS, 2, exit_cuts=[6]) == [6]
    assert stage_cuts(ms, BSS, 3, exit_cuts=[6]) == [4, 6]


def test_stage_count_choice_weighs_throughput_then_latency():
    tries = [{"stages": 1, "throughput_qps": 100.0, "mean_latency_ms": 9.0},
             {"stages": 2, "throughput_qps": 140.0, "mean_latency_ms": 8.0},
             {"stages": 4, "throughput_qps": 143.0, "mean_latency_ms": 7.0},
             {"stages": 8, "throughput_qps": 145.0, "mean_latency_ms": 11.0}]
    assert choose_stage_count(tries) == 4          # within 5 % of the best throughput, lowest latency
    assert choose_stage_count(tries, tolerance=0.0) == 8
    with pytest.raises(FluidError):
        choose_stage_count([])
    assert len(STAGE_TRIES) == 8                    # the paper: "8 tries"


def test_search_stages_tries_at_most_eight_counts_and_respects_exits():
    from fluidnpu.scheduler_fw.gpu.setup import Bench

    seen = []

    def evaluate(n):
        seen.append(n)
        return {"throughput_qps": 100.0 + (10.0 if n == 3 else 0.0), "mean_latency_ms": 5.0}

    spec = SimpleNamespace(modules=list(range(10)), exits=[SimpleNamespace(after=2)])
    bench = Bench("x", spec, None, BSS, np.ones((10, len(BSS))))
    n, tries = bench.search_stages(8, evaluate=evaluate)
    assert n == 3 and seen == [2, 3, 4, 6, 8] and [t["stages"] for t in tries] == seen   # >= exits + 1, <= modules


def test_stretch_targets_the_latest_batch_stored_in_the_table():
    t = BatchTable(3)
    a = t.new([Query(0, None)], 0.0)
    b = t.new([Query(1, None)], 0.1)
    assert t.latest() is b
    t.retire(b)                      # the newest batch finished: the latest *stored* one is a
    assert t.latest() is a
    kids = t.split(a, [[Query(2, None)], [Query(3, None)]], 1, 0.2)
    assert t.latest() is kids[-1]
    t.retire(kids[0])
    t.retire(kids[1])
    assert t.latest() is None
