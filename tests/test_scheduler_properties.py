"""Property tests (hypothesis) over random designs, traces and policies:

* every sample completes exactly once, at the exit it was drawn for;
* no run ever carries more than Bmax samples;
* FluidB with an exact latency table: every sample that takes part in a
  preemption (held at the exit or backfilled) still meets its SLO, i.e. a
  preemption never turns a sample that would have met its SLO into a
  violation; preemptions happen only at exits;
* the reorder buffer releases results in ID order, each exactly once.
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from fluidnpu.scheduler_fw.backend import SimulatedNPU
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.registry import POLICIES, make_policy
from fluidnpu.scheduler_fw.samples import ReorderBuffer
from fluidnpu.scheduler_fw.serving import TraceSource, VirtualClock, serve

EPS = 1e-9


@st.composite
def scenarios(draw, policies=tuple(POLICIES)):
    n_seg = draw(st.integers(1, 4))
    bmax = draw(st.integers(1, 6))
    # arbitrary per-batch latencies, not necessarily monotone in b
    seg = [[draw(st.floats(1e-3, 5e-2)) for _ in range(bmax)] for _ in range(n_seg)]
    weights = [draw(st.floats(0.05, 1.0)) for _ in range(n_seg)]
    rates = [w / sum(weights) for w in weights]
    rates[-1] = 1.0 - sum(rates[:-1])
    table = LatencyTable.from_segments(seg, rates, layers_per_segment=draw(st.integers(1, 3)))
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0.0, 4e-2), min_size=n, max_size=n))
    times = []
    t = 0.0
    for g in gaps:
        t += g
        times.append(t)
    exits = draw(st.lists(st.integers(0, n_seg - 1), min_size=n, max_size=n))
    policy = draw(st.sampled_from(policies))
    slo = draw(st.floats(5e-3, 0.5))
    use_bmax = draw(st.integers(1, bmax))
    return table, times, exits, policy, slo, use_bmax


def _serve(table, times, exits, policy, slo, bmax):
    pol = make_policy(policy, table, slo, bmax)
    released = []
    rep = serve(pol, SimulatedNPU(table), TraceSource(times, exits), VirtualClock(), record_runs=True,
                on_result=lambda sid, res: released.append(sid))
    return pol, rep, released


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_every_sample_completes_exactly_once_within_bmax(sc):
    table, times, exits, policy, slo, bmax = sc
    pol, rep, released = _serve(*sc)
    n = len(times)
    assert sorted(rep.ids) == list(range(n))
    assert released == list(range(n))
    for sid, ex, a, d in zip(rep.ids, rep.exit, rep.arrival, rep.done):
        assert ex == exits[sid] and a == times[sid] and d >= a - EPS
    assert all(1 <= len(r.batch) <= pol.bmax for r in rep.runs_log)
    assert rep.max_batch <= bmax
    # no sample is ever in two places at once: a run's batch is disjoint from samples already finished
    finished: set[int] = set()
    for r in rep.runs_log:
        assert not finished & set(r.batch)
        finished |= set(r.batch) - set(r.remaining)


@settings(max_examples=200, deadline=None)
@given(scenarios(policies=("fluidb",)))
def test_fluidb_preemption_never_creates_a_violation(sc):
    table, times, exits, policy, slo, bmax = sc
    _, rep, _ = _serve(*sc)
    lat = {i: d - a for i, a, d in zip(rep.ids, rep.arrival, rep.done)}
    log = rep.runs_log
    for k, r in enumerate(log):
        if r.kind != "catch-up":
            continue
        before = log[k - 1]
        # preemption only at an exit: the held batch stopped at the end of a segment and the backfill
        # runs from layer 0 to exactly that point
        assert before.kind != "catch-up" and before.stop == r.stop and r.start == 0
        assert r.stop in table.segment_stops[:-1]
        involved = set(before.remaining) | set(r.batch)
        assert len(before.remaining) + len(r.batch) <= bmax
        for sid in involved:
            assert lat[sid] <= slo + EPS, (sid, lat[sid], slo)


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(range(30))))
def test_reorder_buffer_releases_in_id_order(order):
    rob = ReorderBuffer()
    out: list[int] = []
    done: set[int] = set()
    for sid in order:
        released = rob.add(sid, sid * 10)
        done.add(sid)
        # exactly the longest finished prefix has been released so far
        prefix = 0
        while prefix in done:
            prefix += 1
        out += [i for i, _ in released]
        assert out == list(range(prefix))
        assert all(res == i * 10 for i, res in released)
    assert out == list(range(30)) and len(rob) == 0
