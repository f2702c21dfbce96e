"""Batching policies for the staged engine: DVABatch's rules, TurboTransformers' DP and its
cost table, the baselines, and short Poisson loads end to end on CPU."""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings, strategies as st  # noqa: E402

from fluidnpu.errors import FluidError  # noqa: E402
from fluidnpu.host_driver.staged.batch_table import Query  # noqa: E402
from fluidnpu.host_driver.staged.engine import StagedEngine  # noqa: E402
from fluidnpu.host_driver.staged.slicing import StageProfile  # noqa: E402
from fluidnpu.scheduler_fw.gpu.policies import DelayBatch, DVABatch, ZeroBatch, length_bucket  # noqa: E402
from fluidnpu.scheduler_fw.gpu.runner import make_trace, parse_load, serve_load  # noqa: E402
from fluidnpu.scheduler_fw.gpu.setup import make_engine, make_policy, prepare  # noqa: E402
from fluidnpu.scheduler_fw.gpu.turbo import CostTable, NaiveBatch, NoBatch, TurboDP, dp_schedule  # noqa: E402

torch.set_num_threads(1)


def _cost(L, b):
    return 1e-3 * (1.0 + 0.02 * L * b ** 0.8)


def brute_force(lengths, cost, cap):
    L = sorted(lengths)
    n = len(L)
    best = float("inf")
    for cuts in itertools.product([0, 1], repeat=max(n - 1, 0)):
        total, start = 0.0, 0
        ok = True
        for i in range(n):
            if i == n - 1 or cuts[i]:
                size = i - start + 1
                if size > cap:
                    ok = False
                    break
                total += cost(L[i], size)
                start = i + 1
        if ok:
            best = min(best, total)
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(2, 500), min_size=1, max_size=9), st.integers(1, 6))
def test_dp_schedule_is_optimal_over_sorted_splits(lengths, cap):
    batches, total = dp_schedule(lengths, _cost, cap)
    assert sorted(k for b in batches for k in b) == list(range(len(lengths)))      # every request once
    assert all(1 <= len(b) <= cap for b in batches)
    assert total == pytest.approx(brute_force(lengths, _cost, cap))
    assert total == pytest.approx(sum(_cost(max(lengths[k] for k in b), len(b)) for b in batches))


def test_dp_paper_example_beats_one_batch_and_no_batching():
    """§5: lengths 17, 18, 52, 63, 77 — one padded batch is worse than the DP's packing."""
    lengths = [17, 18, 52, 63, 77]
    cost = lambda L, b: 1e-3 * (2.0 + 0.05 * L * b)   # noqa: E731 - fixed launch cost + padded work
    batches, total = dp_schedule(lengths, cost, 20)
    assert total < cost(77, 5) and total <= sum(cost(L, 1) for L in lengths)
    assert len(batches) > 1


def test_cost_table_interpolates_and_roundtrips(tmp_path):
    t = CostTable([8, 16, 32], [1, 4], [[1.0, 2.0], [2.0, 4.0], [4.0, 8.0]])
    assert t.cost(16, 4) == 4.0
    assert t.cost(12, 1) == pytest.approx(1.5)
    assert t.cost(16, 2) == pytest.approx(2.0 + (4.0 - 2.0) / 3)
    assert t.cost(32, 8) == pytest.approx(8.0 + 4 * 4.0 / 3)       # linear beyond the largest batch
    t.save(tmp_path / "c.json")
    u = CostTable.load(tmp_path / "c.json")
    assert u.cost(12, 3) == pytest.approx(t.cost(12, 3))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(FluidError, match="cannot read cost table"):
        CostTable.load(tmp_path / "bad.json")


class FakeEngine:
    def __init__(self):
        self.batches = []
        self._live = 0

    def stage_free(self, s=0):
        return self._live == 0

    def live(self):
        return self._live

    def new(self, qs, now=None):
        self.batches.append([q.id for q in qs])


def _q(i, arrival, length=10):
    return Query(i, None, arrival, length)


def test_lazy_trigger_timeout_bsmax_and_half_slo_guard():
    table = CostTable([1, 500], [1, 20], [[0.001, 0.002], [0.05, 0.5]])
    pol = TurboDP(table, bsmax=4, trigger="lazy", timeout_s=0.010, slo_s=0.150)
    eng = FakeEngine()
    pend = deque([_q(0, 0.0), _q(1, 0.001)])
    assert pol.tick(0.002, pend, eng) == pytest.approx(0.010)      # waits for the timeout
    assert not eng.batches
    pol.tick(0.011, pend, eng)                                      # timeout reached
    assert eng.batches and not pend
    eng.batches.clear()
    pend = deque([_q(i, 0.0, 500) for i in range(3)])               # long queries: estimate ~0.1 s > SLO/2
    pol.tick(0.0, pend, eng)
    assert eng.batches and pol.guard_fired == 1                     # the half-SLO guard fires at once
    pend = deque([_q(i, 0.0) for i in range(4)])
    eng.batches.clear()
    pol.tick(0.0, pend, eng)
    assert eng.batches                                               # bsmax queued: schedule
    hungry = TurboDP(table, bsmax=4, trigger="hungry")
    pend = deque([_q(0, 0.0, 300), _q(1, 0.0, 3)])
    eng.batches.clear()
    hungry.tick(0.0, pend, eng)
    assert sorted(i for b in eng.batches for i in b) == [0, 1]
    with pytest.raises(FluidError):
        TurboDP(table, trigger="eager")


def test_baselines_zero_delay_naive_nobatch():
    eng = FakeEngine()
    pend = deque([_q(i, 0.0) for i in range(5)])
    ZeroBatch(bsmax=3).tick(0.0, pend, eng)
    assert eng.batches == [[0, 1, 2]]
    d = DelayBatch(bsmax=8, window_s=0.05)
    assert d.tick(0.01, pend, eng) == pytest.approx(0.05)
    d.tick(0.06, pend, eng)
    assert eng.batches[-1] == [3, 4]
    pend = deque([_q(i, 0.0) for i in range(3)])
    NoBatch().tick(0.0, pend, eng)
    assert eng.batches[-1] == [0]
    NaiveBatch(bsmax=20).tick(0.0, pend, eng)
    assert eng.batches[-1] == [1, 2]


def _profile(times):
    """One-stage-per-entry profile from {bs: [stage seconds]}."""
    bss = sorted(times)
    arr = np.array([times[b] for b in bss]).T
    return StageProfile(tuple(bss), arr, tuple((i, i + 1) for i in range(arr.shape[0])))


def test_policy_ii_splits_only_when_halving_pays():
    # stage 1 saturates at 8 (time flat to 8, then linear): splitting 64 halves T_remain per half
    prof = _profile({1: [1.0, 1.0], 8: [1.0, 1.0], 32: [2.0, 4.0], 64: [4.0, 9.0]})
    pol = DVABatch(prof, bsmax=64, n_stages=2)

    class E:
        profile = prof
        n_stages = 2
        executors = []

        def overhead_per_stage_s(self):
            return 0.0
    pol.engine = E()

    class R:
        bs = 64
    assert pol.split_hook(E(), R(), 1) == [32, 32]          # T_remain(64)=9 >= 2*T_remain(32)=8 (+ host cost)
    R.bs = 8
    assert pol.split_hook(E(), R(), 1) is None              # T_remain(8)=1 < 2*T_remain(4)=2
    assert length_bucket(5) == length_bucket(8) == 3 and length_bucket(9) == 4


def _tiny_bench(name):
    return prepare(name, "cpu", bsmax=8, repeats=1)


def test_dva_clusters_by_length_and_stretches_the_latest_batch():
    """Policies I (length clusters) and III (stretch). Policy II is off: it splits a batch where the
    profile says two halves finish sooner, and that profile is one timed run per batch size on a
    loaded CPU, so it sometimes splits the long batch (a split batch cannot stretch: CI, 2026-11-28)."""
    bench = _tiny_bench("bert")
    pol, prof = make_policy(bench, "dva", bsmax=8, stages=2)
    pol.split_enabled = False
    eng = make_engine(bench, prof, 8)
    pol.attach(eng)
    rng = np.random.default_rng(0)
    short = [Query(i, rng.integers(1, 100, size=5), 0.0, 5) for i in range(3)]
    long_ = [Query(10 + i, rng.integers(1, 100, size=40), 0.0, 40) for i in range(2)]
    pend = deque(short + long_)
    pol.tick(0.0, pend, eng)
    assert sorted(len(r.queries) for r in eng.table.rows.values()) == [2, 3]   # two length clusters
    eng.step()
    latest = eng.table.latest()
    more = deque([Query(20, rng.integers(1, 100, size=39), 0.0, 39)])
    pol.tick(0.0, more, eng)                                   # same bucket as the long batch: stretch
    assert pol.stretches == 1 and latest.bs == 3 and not more
    eng.run_until_done()
    assert eng.live() == 0 and all(r.error is None for r in eng.results.values())


@pytest.mark.parametrize("workload,policy", [
    ("bert", "dva"), ("bert", "zerobatch"), ("bert", "delaybatch"), ("bert", "dp"), ("bert", "naive"),
    ("bert", "nobatch"), ("cnn", "dva"), ("unet", "dva"), ("unet", "dva-split"), ("eecnn", "dva"),
])
def test_short_poisson_load_answers_every_query(workload, policy, tmp_path):
    bench = _tiny_bench(workload)
    pol, prof = make_policy(bench, policy, bsmax=8, cost_table=tmp_path / "cost.json")
    eng = make_engine(bench, prof, 8)
    arrivals, payloads = make_trace(bench.spec, 200.0, 0.15, seed=1)
    res = serve_load(bench.spec, pol, eng, arrivals, payloads, drain_s=30)
    s = res.summary()
    assert s["sent"] == len(arrivals) == s["answered"] and s["failed"] == 0 and s["unanswered"] == 0
    assert s["mean_latency_ms"] > 0 and s["p99_latency_ms"] >= s["mean_latency_ms"] * 0.5
    assert len(eng.results) == s["sent"]
    for k, payload in enumerate(payloads):        # any policy: each output is the query run alone
        ref, ex = bench.spec.reference(payload, bench.device)
        r = eng.results[k]
        assert r.exit == ex
        torch.testing.assert_close(r.output, ref, rtol=1e-4, atol=1e-5)
    if policy == "dp":
        assert (tmp_path / "cost.json").exists()   # the warm-up profile is saved for the next start


def test_loads_and_bad_rates():
    assert parse_load("low", 100) == 25 and parse_load("medium", 100) == 60 and parse_load("high", 100) == 90
    assert parse_load("12.5", 100) == 12.5
    for bad in ("fast", "0", "-3", "inf"):
        with pytest.raises(FluidError):
            parse_load(bad, 100)


def test_engine_rejects_batches_over_its_maximum():
    bench = _tiny_bench("cnn")
    _, prof = make_policy(bench, "zerobatch", bsmax=4)
    eng = StagedEngine(bench.spec, prof, bench.device, max_batch=2)
    with pytest.raises(FluidError):
        eng.new([Query(i, p) for i, p in enumerate(bench.spec.sample(np.random.default_rng(0), 3))])
