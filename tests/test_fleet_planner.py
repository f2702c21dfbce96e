"""The Nexus planner (scheduler_fw/fleet/nexus.py): hand-worked cases and properties over random fleets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from fluidnpu.scheduler_fw.fleet.nexus import (
    DeviceKind,
    Profile,
    Session,
    mean_for,
    per_cycle,
    plan,
    poisson_cdf,
    residue_slot,
    switch_cost,
)
from fluidnpu.scheduler_fw.fleet.profiles import exit_aware, reach

TOL = 1e-6


def affine(a_ms: float, c_ms: float, bmax: int = 16, switch_ms: float = 0.0) -> Profile:
    """ℓ(b) = a + c·b: throughput b/ℓ(b) grows with b, as on the NPU and the GPU."""
    return Profile(tuple((a_ms + c_ms * b) / 1e3 for b in range(1, bmax + 1)), switch_ms / 1e3)


# ---- hand-worked cases -------------------------------------------------------------------------------------

def test_saturate_then_residue_by_hand():
    # ℓ(b) = 10 + 5b ms, L = 100 ms: B = 8 (2ℓ(8) = 100), T = 8/50ms = 160/s; 400/s = 2 full nodes + 80/s.
    # Residue: largest b with 10 + 5b + b/80 s <= 100 ms is 5 -> d = 62.5 ms, occupancy 35/62.5.
    k = DeviceKind("npu", 10, {"a": affine(10, 5)})
    p = plan([Session("a", 400.0, 0.100)], [k])
    assert [n.saturated for n in p.nodes] == [True, True, False]
    for n in p.nodes[:2]:
        assert (n.slots[0].batch, n.duty_s, n.slots[0].rate) == (8, pytest.approx(0.050), pytest.approx(160.0))
    res = p.nodes[2]
    assert res.slots[0].batch == 5 and res.duty_s == pytest.approx(0.0625)
    assert res.occupancy == pytest.approx(35 / 62.5)
    assert p.lower_bound == pytest.approx(400 * 0.050 / 8)
    assert p.unplaced == []


@pytest.mark.parametrize("switch_ms, shared_nodes", [(0.0, 1), (4.0, 1), (10.0, 2)])
def test_merge_prices_model_switches_in_the_duty_cycle(switch_ms, shared_nodes):
    # a: b = 5, d = 62.5 ms, ℓ = 35 ms (as above, 80/s). b: ℓ = 5 + 2b ms, L = 200 ms, 20/s -> b = 3, d = 150 ms.
    # Merged: d = 62.5 ms, b's batch ceil(20 * 0.0625) = 2 (9 ms): 35 + 9 + 2 switches <= 62.5 iff switch <= 9.25.
    k = DeviceKind("npu", 10, {"a": affine(10, 5, switch_ms=switch_ms), "b": affine(5, 2, switch_ms=switch_ms)})
    p = plan([Session("a", 80.0, 0.100), Session("b", 20.0, 0.200)], [k])
    assert len(p.nodes) == shared_nodes
    if shared_nodes == 1:
        n = p.nodes[0]
        assert n.duty_s == pytest.approx(0.0625)
        assert sorted((s.model, s.batch) for s in n.slots) == [("a", 5), ("b", 2)]
        assert n.switch_s == pytest.approx(2 * switch_ms / 1e3)


def test_one_model_pays_no_switch():
    profiles = {"a": affine(1, 1, switch_ms=5), "b": affine(1, 1, switch_ms=7)}
    assert switch_cost(["a", "a"], profiles) == 0.0
    assert switch_cost(["a", "b", "a"], profiles) == pytest.approx(0.012)


def test_low_rate_residue_runs_a_batch_that_need_not_fill():
    # 1 req/s, L = 100 ms: even one request takes 1 s to arrive, so d = L - ℓ(1) and the batch of one may be empty.
    p = affine(10, 5)
    b, d = residue_slot(p, Session("a", 1.0, 0.100), 1.0)
    assert (b, d) == (1, pytest.approx(0.085))


def test_heterogeneous_kinds_cheapest_first_then_spill():
    slow = DeviceKind("slow", 1, {"a": affine(20, 10)})
    fast = DeviceKind("fast", 1, {"a": affine(5, 2)})
    p = plan([Session("a", 2000.0, 1.0)], [slow, fast])
    assert p.kinds[0] == "fast"                     # ℓ(B)/B is lower on the fast kind although it is listed second
    assert [n.device for n in p.nodes] == ["fast", "slow"]
    assert len(p.unplaced) == 1 and "no free device" in p.unplaced[0].reason
    assert p.placed_rate(0) + p.unplaced[0].rate == pytest.approx(2000.0)


def test_exit_aware_latency_prices_expected_survivors():
    table = [[1, 2, 3, 4], [10, 20, 30, 40]]
    assert reach([0.5, 0.5]) == [1.0, 0.5]
    assert exit_aware(table, [0.5, 0.5]) == [11, 12, 23, 24]       # segment 1 at ceil(b/2)
    assert exit_aware(table, [0.5, 0.5], early_exit=False) == [11, 22, 33, 44]
    assert exit_aware(table, [1.0, 0.0]) == [1, 2, 3, 4]            # nobody reaches segment 1


def test_a_kind_only_one_session_can_use_is_left_to_it():
    """y runs only on the fast kind, x on both (and prefers it): x saturating first would starve y."""
    fast = DeviceKind("fast", 2, {"x": affine(5, 2), "y": affine(5, 2)})
    slow = DeviceKind("slow", 10, {"x": affine(20, 10)})
    p = plan([Session("x", 1000.0, 1.0), Session("y", 100.0, 1.0)], [fast, slow])   # x alone: 2 fast nodes
    assert p.unplaced == []
    assert {n.device for n in p.nodes if any(s.session == 1 for s in n.slots)} == {"fast"}
    assert any(n.device == "slow" for n in p.nodes if any(s.session == 0 for s in n.slots))


def test_residue_too_large_for_the_next_free_kind_spills_to_a_saturated_node():
    # x prefers fast (T = 16/37 ms = 432/s) but y's residue keeps the one fast device; x's 300/s exceeds one slow
    # node (B = 16, ℓ = 180 ms, 89/s): saturated slow nodes take it until a residue fits on one.
    fast = DeviceKind("fast", 1, {"x": affine(5, 2), "y": affine(5, 2)})
    slow = DeviceKind("slow", 10, {"x": affine(20, 10)})
    p = plan([Session("x", 300.0, 1.0), Session("y", 10.0, 1.0)], [fast, slow])
    assert p.unplaced == [] and p.placed_rate(0) == pytest.approx(300.0)
    assert sum(1 for n in p.nodes if n.saturated and n.device == "slow") == 3


def test_poisson_slot_is_the_quantile_of_arrivals_per_cycle():
    assert poisson_cdf(2, 1.0) == pytest.approx(2.5 / math.e)                      # (1 + 1 + 1/2) e^-1
    assert poisson_cdf(3, 2000.0) == pytest.approx(0.0, abs=1e-12)                 # no underflow trouble
    assert per_cycle(3.2) == 4 and mean_for(4) == 4.0                              # Nexus: ceil(r·d)
    assert per_cycle(3.2, 0.99) == 8                                               # P(Poisson(3.2) <= 8) >= 0.99
    for b in (1, 3, 8, 16):
        lam = mean_for(b, 0.99)
        assert per_cycle(lam, 0.99) <= b < per_cycle(lam * 1.01, 0.99)             # mean_for inverts per_cycle
        assert poisson_cdf(b, lam) >= 0.99 > poisson_cdf(b, lam * 1.01)


# ---- properties ----------------------------------------------------------------------------------------------

MODELS = ("m0", "m1", "m2")


@st.composite
def monotone_profile(draw) -> Profile:
    """Any non-decreasing ℓ(b) (throughput may fall with b, as an exit-aware ℓ with rounding can)."""
    steps = draw(st.lists(st.floats(0.0, 20.0), min_size=1, max_size=12))
    first = draw(st.floats(0.5, 30.0))
    return Profile(tuple((first + sum(steps[:b])) / 1e3 for b in range(len(steps))),
                   draw(st.sampled_from([0.0, 0.5, 3.0])) / 1e3)


@st.composite
def fleets(draw, min_count: int = 1, max_count: int = 1000, any_shape: bool = False):
    n_kinds = draw(st.integers(1, 3))
    kinds = []
    for i in range(n_kinds):
        profiles = {}
        for m in MODELS:
            if draw(st.booleans()) or i == 0:
                profiles[m] = draw(monotone_profile()) if any_shape else affine(
                    draw(st.floats(0.5, 30)), draw(st.floats(0.1, 10)), draw(st.integers(1, 16)),
                    draw(st.sampled_from([0.0, 0.5, 3.0])))
        kinds.append(DeviceKind(f"k{i}", draw(st.integers(min_count, max_count)), profiles))
    sessions = draw(st.lists(st.builds(Session, st.sampled_from(MODELS), st.floats(0.1, 3000),
                                       st.floats(0.002, 2.0)), min_size=1, max_size=8))
    return sessions, kinds


def check_plan(p, sessions, kinds) -> None:
    by_name = {k.name: k for k in kinds}
    for n in p.nodes:
        prof = by_name[n.device].profiles
        assert n.busy_s <= n.duty_s * (1 + TOL) + 1e-12                         # Σ occupancy + switches <= 1
        assert n.switch_s == pytest.approx(switch_cost([s.model for s in n.slots], prof))
        for s in n.slots:
            assert s.latency_s == prof[s.model].latency(s.batch)
            assert n.duty_s + s.latency_s <= s.slo_s + 1e-9                       # duty cycle + ℓ(b) <= SLO
            assert s.batch / n.duty_s >= s.rate * (1 - TOL)                       # served >= assigned
    for i, s in enumerate(sessions):                                              # every rate covered or reported
        lost = sum(u.rate for u in p.unplaced if u.session == i)
        assert p.placed_rate(i) + lost == pytest.approx(s.rate, rel=1e-6)
        assert all(u.reason for u in p.unplaced)


@settings(max_examples=80, deadline=None)
@given(st.booleans().flatmap(lambda any_shape: fleets(any_shape=any_shape)))
def test_plan_properties(case):
    sessions, kinds = case
    check_plan(plan(sessions, kinds), sessions, kinds)


@settings(max_examples=80, deadline=None)
@given(fleets(min_count=10 ** 6, max_count=10 ** 6))
def test_node_count_within_nexus_bound_of_lower_bound(case):
    """With devices to spare: LB <= nodes <= floor(LB) + one node per session's residue."""
    sessions, kinds = case
    p = plan(sessions, kinds)
    check_plan(p, sessions, kinds)
    placed = {s.index for s in p.sessions} - {u.session for u in p.unplaced}
    assert p.lower_bound - 1e-6 <= len(p.nodes) <= p.bound <= math.floor(p.lower_bound + 1e-6) + len(placed)
    for u in p.unplaced:   # only sessions Nexus's worst case cannot serve anywhere are left out
        s = sessions[u.session]
        able = [k.profiles[s.model].latency(1) for k in kinds if s.model in k.profiles]
        assert u.rate == s.rate and (not able or s.slo_s < 2 * min(able))


@settings(max_examples=40, deadline=None)
@given(fleets(), st.floats(0.05, 1.0))
def test_headroom_keeps_the_properties_on_the_real_rates(case, h):
    sessions, kinds = case
    p = plan(sessions, kinds, h)
    check_plan(p, sessions, kinds)
    for n in p.nodes:
        for s in n.slots:
            assert s.batch / n.duty_s >= s.rate * (1 + h) * (1 - TOL)


@settings(max_examples=40, deadline=None)
@given(fleets(), st.floats(0.0, 0.5), st.floats(0.0, 0.2), st.floats(0.0, 0.02), st.sampled_from([0.9, 0.99]))
def test_jitter_margin_and_poisson_slots_keep_the_properties(case, h, m, jitter_s, q):
    """Planned for SLO x (1 - m) - j with residue slots at the q-quantile: every session still placed or
    reported, d + ℓ(b) <= the planned SLO, and a quantile slot's batch covers the q-quantile of its arrivals
    per cycle (at the planned rate x (1 + h)); saturated slots and residues that fit no quantile slot keep
    Nexus's mean."""
    sessions, kinds = case
    p = plan(sessions, kinds, h, m, jitter_s, q)
    check_plan(p, sessions, kinds)
    for n in p.nodes:
        for s in n.slots:
            assert s.slo_s == pytest.approx(max(0.0, sessions[s.session].slo_s * (1 - m) - jitter_s))  # planned SLO
            assert s.quantile in ((0.0, q) if not n.saturated else (0.0,))
            if s.quantile:
                assert poisson_cdf(s.batch, s.rate * (1 + h) * n.duty_s) >= q - 1e-9
            assert p.capacity(s.session) >= p.placed_rate(s.session) * (1 + h) * (1 - TOL)


@settings(max_examples=60, deadline=None)
@given(fleets(), st.floats(0.1, 0.99))
def test_slo_below_one_sample_is_reported_not_dropped(case, share):
    sessions, kinds = case
    l1 = min(p.latency(1) for k in kinds for p in k.profiles.values())
    sessions = [*sessions, Session("m0", 5.0, share * l1)]
    p = plan(sessions, kinds)
    check_plan(p, sessions, kinds)
    last = [u for u in p.unplaced if u.session == len(sessions) - 1]
    assert len(last) == 1 and last[0].rate == 5.0 and "below ℓ(1)" in last[0].reason


# ---- replaying a plan (fleet/check.py) ----------------------------------------------------------------------

def test_replay_answers_everything_and_headroom_buys_slo_compliance():
    """Sized at the mean rate a slot is a bulk server at load 1 and Poisson bursts miss the SLO; headroom fixes it."""
    from fluidnpu.scheduler_fw.fleet.check import check_plan

    k = DeviceKind("npu", 100, {"a": affine(10, 5), "b": affine(5, 2, switch_ms=2)})
    sessions = [Session("a", 400.0, 0.100), Session("b", 20.0, 0.200)]
    tight, loose = (check_plan(plan(sessions, [k], h), [k], seconds=30, seed=1) for h in (0.0, 1.0))
    for c in (*tight, *loose):
        assert c.arrivals > 0 and c.answered == c.arrivals
    assert tight[0].compliance < 0.5 and loose[0].compliance > 0.98 and loose[1].compliance > 0.98
    p = plan(sessions, [k], 1.0)
    assert sum(p.placed_rate(i) for i in range(2)) == pytest.approx(420.0)       # shares are the real rates
    assert all(s.batch / n.duty_s >= 2 * s.rate * (1 - TOL) for n in p.nodes for s in n.slots)


def test_replayed_batch_shrinks_at_exits():
    import random

    from fluidnpu.scheduler_fw.fleet.node_loop import batch_seconds

    p = Profile((11.0, 22.0), 0.0, ((1.0, 2.0), (10.0, 20.0)), (1.0, 0.0))
    assert batch_seconds(p, 2, random.Random(0)) == 2.0                  # everyone leaves at exit 0
    p = Profile((11.0, 22.0), 0.0, ((1.0, 2.0), (10.0, 20.0)), (0.0, 1.0))
    assert batch_seconds(p, 2, random.Random(0)) == 22.0                 # nobody does
    assert batch_seconds(Profile((3.0, 5.0)), 2, random.Random(0)) == 5.0  # a GPU profile: ℓ(n)


def test_static_serve_batch_deployments_are_sized_for_the_peak():
    """The @serve.batch baseline's provisioning (fleet/serve_batch.py): B = argmax 2ℓ(b) <= L', timeout L' - 2ℓ(B),
    replicas ceil(peak x (1 + h) / (B/ℓ(B))), the constrained session first, spilling to the next kind."""
    from fluidnpu.scheduler_fw.fleet.serve_batch import static_deployments

    fast = DeviceKind("fast", 2, {"x": affine(5, 2), "y": affine(10, 5)})
    slow = DeviceKind("slow", 3, {"x": affine(20, 10)})
    # y (fast only): L' = 0.1 - 0.01 = 90 ms -> B = 7 (2 x 45 ms), T = 7/45 ms = 155.6/s; 200 x 1.5 = 300/s -> 2
    deps, unplaced = static_deployments([Session("x", 100.0, 0.2), Session("y", 200.0, 0.1)], [fast, slow],
                                        headroom=0.5, jitter_s=0.01)
    y = [d for d in deps if d.session == 1]
    assert [(d.device, d.replicas, d.max_batch_size) for d in y] == [("fast", 2, 7)]
    assert y[0].batch_wait_timeout_s == pytest.approx(0.090 - 2 * 0.045)
    # x: fast taken by y; slow: L' = 190 ms -> B = 8 (2 x 100 ms > 190: B = 7, ℓ = 90 ms), 150/s / 77.8/s -> 2
    x = [d for d in deps if d.session == 0]
    assert [(d.device, d.replicas, d.max_batch_size) for d in x] == [("slow", 2, 7)]
    assert x[0].batch_wait_timeout_s == pytest.approx(0.190 - 0.180) and unplaced == []
    deps, unplaced = static_deployments([Session("x", 1000.0, 0.2)], [slow])   # L = 200 ms: B = 8, 80/s per device
    assert deps[0].replicas == 3 and unplaced[0].rate == pytest.approx(1000.0 - 3 * 80.0)
