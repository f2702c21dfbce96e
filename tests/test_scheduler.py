"""scheduler_fw: queue and reorder buffer, latency tables, the simulated NPU,
and each policy on small hand-checked traces."""

from __future__ import annotations

import pytest

from fluidnpu.bundle import bundle_from_result
from fluidnpu.dse.search import DSEOptions, explore
from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.adaptive import AdaptiveBatching, Serial
from fluidnpu.scheduler_fw.backend import SimulatedNPU
from fluidnpu.scheduler_fw.fluidb import FluidB
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.lazybatching import LazyBatching
from fluidnpu.scheduler_fw.policy import RunKind
from fluidnpu.scheduler_fw.registry import POLICIES, make_policy, policy_spec
from fluidnpu.scheduler_fw.samples import ReorderBuffer, RequestQueue, Sample
from fluidnpu.scheduler_fw.serving import TraceSource, VirtualClock, WallClock, serve

MS = 1e-3


def two_exit_table(bmax: int = 8, layers_per_segment: int = 1) -> LatencyTable:
    """Segment 0: 10 + 2(b-1) ms; segment 1: 20 + 4(b-1) ms."""
    seg = [[(10 + 2 * (b - 1)) * MS for b in range(1, bmax + 1)], [(20 + 4 * (b - 1)) * MS for b in range(1, bmax + 1)]]
    return LatencyTable.from_segments(seg, [0.5, 0.5], layers_per_segment=layers_per_segment)


def run(policy, table, times, exits, **kw):
    return serve(policy, SimulatedNPU(table), TraceSource(times, exits), VirtualClock(), record_runs=True, **kw)


def latencies(rep) -> dict[int, float]:
    return {i: d - a for i, a, d in zip(rep.ids, rep.arrival, rep.done)}


# ---- queue and reorder buffer ------------------------------------------------------

def test_queue_ids_fifo_and_pop():
    q = RequestQueue()
    a, b, c = (q.admit(t, p) for t, p in ((0.0, "x"), (1.0, "y"), (1.0, "z")))
    assert [a.id, b.id, c.id] == [0, 1, 2] and q.admitted == 3
    assert q.oldest() is a and len(q) == 3
    assert q.pop(2) == [a, b] and list(q) == [c]
    with pytest.raises(ValueError):
        q.pop(2)
    with pytest.raises(ValueError):
        q.admit(0.5)  # earlier than the tail: the queue would no longer be FIFO in time


def test_reorder_buffer_holds_until_gaps_fill():
    rob = ReorderBuffer()
    assert rob.add(2, "c") == [] and rob.add(1, "b") == [] and len(rob) == 2
    assert rob.add(0, "a") == [(0, "a"), (1, "b"), (2, "c")]
    assert rob.next_id == 3 and len(rob) == 0
    with pytest.raises(ValueError, match="twice"):
        rob.add(1, "again")
    rob.add(4, "e")
    with pytest.raises(ValueError, match="twice"):
        rob.add(4, "e")


# ---- latency tables ---------------------------------------------------------------

def test_span_sums_segments_and_uses_the_monotone_envelope():
    tab = LatencyTable.from_segments([[3.0, 2.0, 4.0], [1.0, 1.5, 1.2]], [0.5, 0.5])
    assert tab.span(0, 1, 1) == pytest.approx(4.0)
    # b = 2 is faster than b = 1 in segment 0: the estimate keeps the b = 1 figure (upper bound)
    assert tab.span(0, 0, 2) == pytest.approx(3.0)
    assert tab.span(1, 1, 3) == pytest.approx(1.5)
    assert tab.span(1, 0, 3) == 0.0
    assert tab.layers_span(0, 2, 2) == pytest.approx(3.5)
    # full-batch capacity: Bmax / (T0 + (1 - 0.5) * T1) at b = 3
    assert tab.full_batch_capacity() == pytest.approx(3 / (4.0 + 0.5 * 1.2))


def test_table_from_a_bundle_matches_it(tiny_board, tiny_workload):
    bundle = bundle_from_result(explore(tiny_workload, tiny_board, DSEOptions(bmax=4)))
    tab = LatencyTable.from_bundle(bundle)
    assert tab.bmax == 4 and tab.n_segments == 2 and tab.n_layers == 4
    assert tab.segment_stops == (2, 4)  # c1 + e1.fc | c2 + fc
    for s in range(2):
        for b in range(1, 5):
            assert tab.span(s, s, b) == pytest.approx(bundle.segment_seconds(s, b))
            assert tab.layers_span(tab.segment_start(s), tab.segment_stops[s], b) == \
                pytest.approx(bundle.segment_seconds(s, b))
    assert LatencyTable.from_bundle(bundle, bmax=2).bmax == 2
    with pytest.raises(FluidError, match="beyond the design bundle"):
        LatencyTable.from_bundle(bundle, bmax=5)


def test_bad_tables_are_refused():
    with pytest.raises(FluidError, match="> 0"):
        LatencyTable.from_segments([[1.0, 0.0]], [1.0])
    with pytest.raises(FluidError, match="columns"):
        LatencyTable.from_segments([[1.0, 2.0], [1.0]], [0.5, 0.5])


# ---- the simulated NPU --------------------------------------------------------------

def test_simulated_npu_times_segments_and_drops_exits():
    tab = two_exit_table(layers_per_segment=2)
    npu = SimulatedNPU(tab)
    batch = [Sample(0, 0.0, 0), Sample(1, 0.0, 1), Sample(2, 0.0, 1)]
    res = npu.run(0, 4, batch)
    assert res.seconds == pytest.approx(14 * MS + 24 * MS)  # b=3 then b=2 after sample 0 leaves at exit 0
    assert [(s.id, e) for s, e, _ in res.exited] == [(0, 0), (1, 1), (2, 1)]
    assert res.exited[0][2] == pytest.approx(14 * MS) and res.remaining == []
    half = npu.run(0, 1, batch)  # first layer of segment 0 only: no exit yet
    assert half.seconds == pytest.approx(7 * MS) and [s.id for s in half.remaining] == [0, 1, 2]
    assert res.macs == 3 * 2 * 1_000_000 + 2 * 2 * 1_000_000
    with pytest.raises(ValueError, match="Bmax"):
        npu.run(0, 2, [Sample(i, 0.0, 1) for i in range(9)])
    with pytest.raises(ValueError, match="outside"):
        npu.run(3, 3, batch)


# ---- FluidB ------------------------------------------------------------------------

# A (final exit) and B (exit 0) at t=0; C..F arrive during the first segment.
TIMES = [0.0, 0.0, 1 * MS, 2 * MS, 3 * MS, 4 * MS]
EXITS = [1, 0, 0, 1, 1, 1]


def test_fluidb_preempts_at_an_exit_when_the_slo_allows():
    tab = two_exit_table()
    pol = FluidB(tab, slo_s=100 * MS)
    rep = run(pol, tab, TIMES, EXITS)
    kinds = [(r.kind, r.start, r.stop, r.batch) for r in rep.runs_log]
    # launch A,B; at exit 0 B has left: Brem = 1, NQ = 4 -> Bincr = 4; overhead 16 + 36 = 52 ms < 88 ms slack
    assert kinds == [("launch", 0, 1, (0, 1)), ("catch-up", 0, 1, (2, 3, 4, 5)), ("continue", 1, 2, (0, 3, 4, 5))]
    lat = latencies(rep)
    assert lat[0] == pytest.approx(60 * MS) and lat[1] == pytest.approx(12 * MS)
    assert lat[2] == pytest.approx(27 * MS) and lat[5] == pytest.approx(56 * MS)
    assert rep.preemptions == 1 and rep.invocations == 4 and rep.preemption_points == 1


def test_fluidb_holds_back_when_the_overhead_exceeds_the_slack():
    tab = two_exit_table()
    pol = FluidB(tab, slo_s=60 * MS)  # slack 48 ms < 52 ms overhead
    rep = run(pol, tab, TIMES, EXITS)
    assert [r.kind for r in rep.runs_log] == ["launch", "continue", "launch", "continue"]
    assert latencies(rep)[0] == pytest.approx(32 * MS) and rep.preemptions == 0


def test_fluidb_criterion_is_bincr_min_of_queue_and_slack():
    tab = two_exit_table()
    pol = FluidB(tab, slo_s=10.0)
    assert pol.preemption_size(now=0.0, exit_index=0, brem=5, nq=10, oldest_arrival=0.0) == 3
    assert pol.preemption_size(now=0.0, exit_index=0, brem=5, nq=2, oldest_arrival=0.0) == 2
    assert pol.preemption_size(now=0.0, exit_index=0, brem=8, nq=2, oldest_arrival=0.0) == 0
    # T^2_{0:0} + T^7_{1:1} = 12 + 44 = 56 ms: needs more than 56 ms of slack left
    tight = FluidB(tab, slo_s=100 * MS)
    assert tight.preemption_size(now=0.0445, exit_index=0, brem=5, nq=2, oldest_arrival=0.0) == 0
    assert tight.preemption_size(now=0.043, exit_index=0, brem=5, nq=2, oldest_arrival=0.0) == 2


def test_fluidb_backfills_once_per_exit_and_never_beyond_bmax():
    tab = two_exit_table(bmax=4)
    times = [0.0] + [0.1 * MS * i for i in range(1, 12)]
    exits = [1] * 12
    rep = run(FluidB(tab, slo_s=10.0), tab, times, exits)
    assert max(len(r.batch) for r in rep.runs_log) <= 4
    # each exit point is followed by at most one catch-up before the batch continues
    for a, b in zip(rep.runs_log, rep.runs_log[1:]):
        assert not (a.kind is RunKind.CATCH_UP and b.kind is RunKind.CATCH_UP)
    assert sorted(rep.ids) == list(range(12))


# ---- LazyBatching --------------------------------------------------------------------

def test_lazybatching_is_invoked_at_every_layer():
    tab = two_exit_table(layers_per_segment=3)
    rep = run(LazyBatching(tab, slo_s=1.0), tab, [0.0], [1])
    assert [(r.start, r.stop) for r in rep.runs_log] == [(i, i + 1) for i in range(6)]
    assert rep.invocations == 7 and rep.preemption_points == 5  # launch + a stop after every layer
    fl = run(FluidB(tab, slo_s=1.0), tab, [0.0], [1])
    assert fl.invocations == 3 and fl.preemption_points == 1  # launch + a stop after every segment


def test_lazybatching_estimate_is_b_times_single_sample():
    tab = two_exit_table(layers_per_segment=1)
    lazy = LazyBatching(tab, slo_s=100 * MS)
    # at layer 1 (exit 0) with Brem = 1, Bincr = 4: 4 * 10 + 5 * 20 = 140 ms > 100: refuses what FluidB accepts
    assert lazy.preemption_size(now=0.012, layer=1, brem=1, nq=4, oldest_arrival=0.0) == 0
    assert FluidB(tab, slo_s=100 * MS).preemption_size(0.012, 0, 1, 4, 0.0) == 4
    assert LazyBatching(tab, slo_s=0.2).preemption_size(0.012, 1, 1, 4, 0.0) == 4


def test_lazybatching_never_preempts_a_batch_that_reached_bmax():
    tab = two_exit_table(bmax=2, layers_per_segment=2)
    # two samples fill Bmax = 2; one leaves at exit 0, a third is queued: no backfill
    rep = run(LazyBatching(tab, slo_s=10.0), tab, [0.0, 0.0, 1 * MS], [0, 1, 1])
    assert "catch-up" not in [r.kind for r in rep.runs_log]
    fl = run(FluidB(tab, slo_s=10.0), tab, [0.0, 0.0, 1 * MS], [0, 1, 1])
    assert "catch-up" in [r.kind for r in fl.runs_log]


# ---- adaptive batching and SERIAL ---------------------------------------------------

def test_adaptb_waits_for_the_timeout_or_a_full_batch():
    tab = two_exit_table(bmax=4)
    rep = run(AdaptiveBatching(tab, timeout_s=50 * MS, bmax=4), tab, [0.0, 10 * MS, 20 * MS], [1, 1, 1])
    assert [(r.kind, r.t0, r.batch) for r in rep.runs_log] == [("launch", pytest.approx(50 * MS), (0, 1, 2))]
    full = run(AdaptiveBatching(tab, timeout_s=50 * MS, bmax=4), tab, [0.0, 10 * MS, 20 * MS, 30 * MS], [1] * 4)
    assert full.runs_log[0].t0 == pytest.approx(30 * MS) and len(full.runs_log[0].batch) == 4
    # the batch shrinks at exit 0 and is not refilled (model-level batching)
    mixed = run(AdaptiveBatching(tab, timeout_s=0.0, bmax=4), tab, [0.0, 0.0, 1 * MS], [0, 1, 1])
    assert [r.batch for r in mixed.runs_log] == [(0, 1), (2,)]


def test_serial_runs_one_sample_at_a_time():
    tab = two_exit_table()
    rep = run(Serial(tab), tab, [0.0, 0.0, 0.0], [0, 1, 1])
    assert [r.batch for r in rep.runs_log] == [(0,), (1,), (2,)]
    assert latencies(rep)[2] == pytest.approx(10 * MS + 30 * MS + 30 * MS)


def test_decision_cost_is_charged_per_invocation():
    tab = two_exit_table()
    free = run(FluidB(tab, 1.0), tab, [0.0], [1])
    paid = run(FluidB(tab, 1.0), tab, [0.0], [1], decision_cost_s=1 * MS)
    assert latencies(paid)[0] == pytest.approx(latencies(free)[0] + 2 * MS)  # launch + the stop at exit 0


# ---- registry and the serving loop ---------------------------------------------------

def test_registry_names_and_errors():
    assert set(POLICIES) == {"serial", "fc-adaptb-s", "fc-adaptb-m", "fc-adaptb-l", "r-adaptb-s", "r-adaptb-m",
                             "r-adaptb-l", "lazybatching", "fluidb"}
    tab = two_exit_table()
    pol = make_policy("FC-AdaptB-M", tab, slo_s=0.2)
    assert pol.timeout == pytest.approx(0.09) and pol.name == "fc-adaptb-m"
    assert policy_spec("fluidb").design.stackable is None and policy_spec("lazybatching").design.stackable is False
    with pytest.raises(FluidError, match="unknown policy"):
        policy_spec("fifo")
    with pytest.raises(FluidError, match="SLO"):
        make_policy("fluidb", tab, slo_s=0)
    with pytest.raises(FluidError, match="beyond"):
        make_policy("fluidb", tab, slo_s=1.0, bmax=9)


def test_results_are_released_in_id_order():
    tab = two_exit_table()
    got = []
    # sample 0 goes to the final exit, 1 and 2 leave at exit 0: they finish first but are released after 0
    serve(FluidB(tab, 1.0), SimulatedNPU(tab), TraceSource([0.0, 0.0, 0.0], [1, 0, 0]), VirtualClock(),
          on_result=lambda sid, res: got.append((sid, res[0])))
    assert got == [(0, 1), (1, 0), (2, 0)]


def test_the_loop_runs_on_a_wall_clock():
    tab = LatencyTable.from_segments([[1e-4, 1e-4]], [1.0])
    import time

    t0 = time.monotonic()
    rep = serve(FluidB(tab, 1.0), SimulatedNPU(tab), TraceSource([t0 + 0.002, t0 + 0.004], [0, 0]), WallClock())
    assert sorted(rep.ids) == [0, 1] and rep.done[-1] >= t0 + 0.004
