"""A plan served on Ray by emulated boards (scheduler_fw/fleet/ray_fleet.py); skipped without the 'fleet' extra."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from fluidnpu.scheduler_fw.fleet.check import session_checks  # noqa: E402
from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Profile, Session, plan  # noqa: E402
from fluidnpu.scheduler_fw.fleet.ray_fleet import Fleet, resource_name  # noqa: E402


def affine(a_ms: float, c_ms: float, bmax: int = 8, switch_ms: float = 0.0) -> Profile:
    return Profile(tuple((a_ms + c_ms * b) / 1e3 for b in range(1, bmax + 1)), switch_ms / 1e3)


def test_plan_on_ray_answers_every_request_on_pinned_emulated_boards():
    """Three emulated boards of two kinds on a local 2-CPU Ray: custom resources pin them, pacing is real."""
    kinds = [DeviceKind("board-a", 3, {"m": affine(20, 5), "n": affine(10, 2, switch_ms=3)}),
             DeviceKind("board-b", 2, {"m": affine(30, 8)})]
    sessions = [Session("m", 100.0, 0.300), Session("n", 20.0, 0.200), Session("m", 5.0, 0.400)]
    p = plan(sessions, kinds, headroom=1.0)
    assert p.unplaced == [] and len(p.nodes) >= 2
    fleet = Fleet(p, kinds, seed=1)
    try:
        want = {resource_name(k.name): 0.0 for k in kinds}   # one actor per device, busy or idle
        for _ in range(100):   # the resource view is eventually consistent: poll it, boundedly
            avail = ray.available_resources()
            if all(avail.get(r, 0.0) == pytest.approx(v) for r, v in want.items()):
                break
            time.sleep(0.1)
        assert {r: avail.get(r, 0.0) for r in want} == pytest.approx(want)
        lat, arrived = fleet.run_poisson(3.0, seed=2)
    finally:
        fleet.shutdown()
    checks = session_checks(p, lat, arrived)
    for c in checks:
        assert c.arrivals > 0 and c.answered == c.arrivals            # nothing lost
    fastest = min(prof.latency(1) for k in kinds for prof in k.profiles.values())
    assert min(x for xs in lat.values() for x in xs) >= fastest * 0.9  # paced to the modelled batch time
    assert sum(c.within_slo for c in checks) / sum(c.arrivals for c in checks) > 0.9


def test_killed_board_is_replanned_within_an_epoch_and_counters_add_up():
    from fluidnpu.scheduler_fw.fleet.ray_fleet import poisson_arrivals

    kinds = [DeviceKind("board-a", 3, {"m": affine(20, 5)})]
    sessions = [Session("m", 120.0, 0.500)]
    p = plan(sessions, kinds, headroom=0.5)
    assert len(p.nodes) == 2 and p.unplaced == []
    fleet = Fleet(p, kinds, seed=3, headroom=0.5)
    try:
        log = fleet.run(poisson_arrivals({0: 120.0}, 5.0, seed=4), epoch_s=1.0, kill=(2.3, 0))
    finally:
        fleet.shutdown()
    answered = len(log.latencies[0])
    assert log.arrivals[0] == answered + log.rejected[0] > 500             # every request answered or refused
    # the dead board's requests in flight went to a live node: none refused (two live boards carry the load)
    assert log.retried.get(0, 0) > 0 and log.rejected[0] == 0
    deaths = [e for e in log.epochs if e["died"]]
    assert len(deaths) == 1 and 2.3 < deaths[0]["t"] <= 3.3              # found and re-planned within one epoch
    assert all(e["devices"] <= 2 for e in log.epochs if e["t"] >= deaths[0]["t"]) and not deaths[0]["unplaced"]


def test_board_dead_after_the_last_health_check_has_its_requests_retried():
    """No health check at all (no epoch): the dead board's requests are found failed only when collected,
    and are then retried on a live node of the re-made plan, not refused."""
    from fluidnpu.scheduler_fw.fleet.ray_fleet import poisson_arrivals

    kinds = [DeviceKind("board-a", 3, {"m": affine(20, 5)})]
    p = plan([Session("m", 120.0, 0.500)], kinds, headroom=0.5)
    assert len(p.nodes) == 2
    fleet = Fleet(p, kinds, seed=3, headroom=0.5)
    try:
        log = fleet.run(poisson_arrivals({0: 120.0}, 3.0, seed=4), epoch_s=None, kill=(1.5, 0))
    finally:
        fleet.shutdown()
    assert log.retried.get(0, 0) > 0 and log.rejected[0] == 0
    assert log.arrivals[0] == len(log.latencies[0]) > 250
    assert [e["replan"] for e in log.epochs] == ["died"]        # one re-plan, when the death was found


def test_ramp_is_followed_by_replanning_without_drops():
    """Scenario 1 in small: one model ramping 0 -> 40 req/s, 2 s SLO, re-planned every second.

    Planned for 1.8 s (slo_margin 0.1): Nexus puts d + ℓ(b) right at the SLO, and a wall clock, RPCs
    and a rate that grows within the epoch need some of it."""
    from fluidnpu.scheduler_fw.fleet.ray_fleet import poisson_arrivals

    kinds = [DeviceKind("board-a", 4, {"m": affine(30, 10, bmax=16)})]
    sessions = [Session("m", 1.0, 2.0)]
    fleet = Fleet(plan(sessions, kinds, 0.5, 0.1), kinds, seed=5, headroom=0.5, slo_margin=0.1)
    try:
        log = fleet.run(poisson_arrivals({0: lambda t: 40.0 * t / 6.0}, 6.0, seed=6, peak={0: 40.0}), epoch_s=1.0)
    finally:
        fleet.shutdown()
    assert log.rejected[0] == 0 and len(log.latencies[0]) == log.arrivals[0] > 50
    assert sum(x <= 2.0 for x in log.latencies[0]) == log.arrivals[0]    # 100 % within the SLO
    batches = [e["batches"].get(0) for e in log.epochs]
    assert batches[-1] > batches[0]                                       # batches grow with the rate


def test_serve_batch_baseline_pins_one_replica_per_device_and_answers_every_request():
    """The @serve.batch baseline (fleet/serve_batch.py) on Ray Serve: replicas pinned by the kinds' resources,
    batches paced to the modelled time, nothing lost."""
    from fluidnpu.scheduler_fw.fleet.ray_fleet import poisson_arrivals
    from fluidnpu.scheduler_fw.fleet.serve_batch import ServeBatchFleet, static_deployments

    kinds = [DeviceKind("board-a", 2, {"m": affine(20, 5)}), DeviceKind("board-b", 1, {"n": affine(10, 2)})]
    sessions = [Session("m", 60.0, 0.300), Session("n", 20.0, 0.200)]
    deps, unplaced = static_deployments(sessions, kinds, headroom=0.5)
    assert unplaced == [] and [(d.device, d.replicas) for d in deps] == [("board-a", 1), ("board-b", 1)]
    base = ServeBatchFleet(deps, kinds, sessions, seed=1)
    try:
        want = {resource_name("board-a"): 1.0, resource_name("board-b"): 0.0}   # one device each replica
        for _ in range(100):
            avail = ray.available_resources()
            if all(avail.get(r, 0.0) == pytest.approx(v) for r, v in want.items()):
                break
            time.sleep(0.1)
        assert {r: avail.get(r, 0.0) for r in want} == pytest.approx(want)
        log = base.run(poisson_arrivals({0: 60.0, 1: 20.0}, 3.0, seed=2))
    finally:
        base.shutdown()
    for i, s in enumerate(sessions):
        assert log.arrivals[i] > 20 and len(log.latencies[i]) == log.arrivals[i] and log.rejected[i] == 0
        assert min(log.latencies[i]) >= kinds[i].profiles[s.model].latency(1) * 0.9    # paced
    assert base.devices == 2
