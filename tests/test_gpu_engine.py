"""Staged engine correctness on CPU: for any sequence of new/stretch/split (and early exits,
failures, buffer counts, stage counts), every query is answered exactly once and its output
equals running it alone through the unsliced model."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from fluidnpu.errors import FluidError  # noqa: E402
from fluidnpu.host_driver.staged.batch_table import Query  # noqa: E402
from fluidnpu.host_driver.staged.buffers import BufState  # noqa: E402
from fluidnpu.host_driver.staged.engine import ExecState, StagedEngine  # noqa: E402
from fluidnpu.host_driver.staged.model import ModelSpec  # noqa: E402
from fluidnpu.host_driver.staged.slicing import StageProfile, partition, profile_from_module_times, slice_model  # noqa: E402,E501
from fluidnpu.host_driver.staged.workloads import build_workload, sample_lengths  # noqa: E402

torch.set_num_threads(1)
CPU = torch.device("cpu")
BSS = (1, 2, 4, 8)
N_QUERIES = 24
_CACHE: dict = {}


def workload(name: str):
    """(spec, payloads, reference outputs, reference exits), built once per test session."""
    if name not in _CACHE:
        spec = build_workload(name, size="tiny", seed=3).to(CPU)
        payloads = spec.sample(np.random.default_rng(5), N_QUERIES)
        refs = [spec.reference(p, CPU) for p in payloads]
        _CACHE[name] = (spec, payloads, refs)
    return _CACHE[name]


def synthetic_profile(spec: ModelSpec, n_stages: int) -> StageProfile:
    m = len(spec.modules)
    ms = np.outer(np.linspace(1.0, 2.0, m), np.asarray(BSS, dtype=float) ** 0.5) * 1e-4
    return profile_from_module_times(ms, BSS, n_stages, [e.after + 1 for e in spec.exits])


def check_results(eng: StagedEngine, queries, refs, failed_ok: set[int] = frozenset()) -> None:
    assert set(eng.results) == {q.id for q in queries}, "every query answered"
    assert eng.live() == 0
    for q in queries:
        r = eng.results[q.id]
        if r.error is not None:
            assert q.id in failed_ok, r.error
            continue
        out, ex = refs[q.id]
        assert r.exit == ex
        torch.testing.assert_close(r.output, out, rtol=1e-4, atol=1e-5)
    # no buffer slot left in use
    for ring in eng.rings[1:]:
        assert all(s.state is BufState.AVAILABLE and s.refs == 0 and s.held == 0 for s in ring.slots), ring.slots
    assert not eng.table.rows


OPS = st.lists(st.one_of(
    st.tuples(st.just("new"), st.integers(1, 6)),
    st.tuples(st.just("stretch"), st.integers(1, 4)),
    st.tuples(st.just("split"), st.integers(0, 3)),
    st.tuples(st.just("step"), st.integers(1, 3)),
), min_size=1, max_size=14)


@pytest.mark.parametrize("name", ["bert", "cnn", "unet", "eecnn"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, n_stages=st.integers(1, 4), n_buffers=st.integers(1, 3), seed=st.integers(0, 2**16),
       hook=st.booleans())
def test_any_meta_operation_sequence_matches_unsliced_model(name, ops, n_stages, n_buffers, seed, hook):
    spec, payloads, refs = workload(name)
    n_stages = min(n_stages, len(spec.modules))
    if spec.exits:
        n_stages = max(n_stages, len(spec.exits) + 1)
    eng = StagedEngine(spec, synthetic_profile(spec, n_stages), CPU, n_buffers=n_buffers, max_batch=8)
    rnd = random.Random(seed)
    if hook:   # a random Schedule(): split whole batches at random boundaries into random sizes
        def split_hook(engine, row, b):
            if row.bs > 1 and rnd.random() < 0.5:
                cut = rnd.randint(1, row.bs - 1)
                return [cut, row.bs - cut]
            return None
        eng.split_hook = split_hook
    queries = [Query(i, p, 0.0, spec.length(p) if spec.length else 1) for i, p in enumerate(payloads)]
    nxt = 0
    for op in ops:
        kind = op[0]
        if kind == "new" and nxt < len(queries):
            k = min(op[1], len(queries) - nxt)
            eng.new(queries[nxt:nxt + k])
            nxt += k
        elif kind == "stretch" and nxt < len(queries):
            rows = [r for r in eng.table.rows.values() if eng.can_stretch(r, op[1])]
            if rows:
                k = min(op[1], len(queries) - nxt)
                eng.stretch(rnd.choice(rows), queries[nxt:nxt + k])
                nxt += k
        elif kind == "split":
            rows = [r for r in eng.table.rows.values() if r.bs > 1]
            if rows:
                row = rnd.choice(rows)
                cut = rnd.randint(1, row.bs - 1)
                eng.split(row, [cut, row.bs - cut])
        elif kind == "step":
            for _ in range(op[1]):
                eng.step()
    if nxt < len(queries):
        eng.new(queries[nxt:nxt + 8])
        nxt = min(nxt + 8, len(queries))
    eng.run_until_done()
    check_results(eng, queries[:nxt], refs)


def test_paper_example_new_stretch_split():
    """Fig. 8: new batch0 with 2 queries, stretch it with 2 while stage 2 runs it, split at stage 3."""
    spec, payloads, refs = workload("cnn")
    eng = StagedEngine(spec, synthetic_profile(spec, 4), CPU, n_buffers=2, max_batch=8, trace_states=True)
    qs = [Query(i, payloads[i]) for i in range(4)]
    row = eng.new(qs[:2])
    assert eng.queues[0].view() == [{"id": row.id, "start": 0, "num": 2}]
    eng.step()      # executor 1 launches the first 2 queries and passes them on to batch queue 2 at once
    assert eng.queues[1].view() == [{"id": row.id, "start": 0, "num": 2}]
    assert row.statusmap[0] == 0   # ... before their completion was observed
    eng.stretch(row, qs[2:])       # (our stages are enqueued ahead, so the stretch comes one step earlier)
    eng.step()      # executor 2 launches the batch (its stream waits on executor 1's event); 1's completion seen
    assert row.statusmap[0] == 2
    assert eng.executors[1].state is ExecState.WORKING
    assert row.bs == 4
    eng.split(row, [2, 2], at=3)
    eng.run_until_done()
    check_results(eng, qs, refs)
    ops = [op for op, _, _ in eng.meta_log]
    assert ops == ["new", "stretch", "split"]
    # the stretched queries caught up and ran merged with the first two before the split
    assert any(n == 4 for _, bid, n in eng.launch_log if bid == row.id)


def test_buffer_states_and_checking_with_one_buffer_pair():
    spec, payloads, refs = workload("cnn")
    eng = StagedEngine(spec, synthetic_profile(spec, 3), CPU, n_buffers=1, max_batch=8, trace_states=True)
    qs = [Query(i, payloads[i]) for i in range(6)]
    eng.new(qs[:2])
    eng.new(qs[2:4])
    eng.new(qs[4:])
    eng.step()
    slot = eng.rings[1].slots[0]
    # stage 0 enqueued batch 0 and passed the slot on at once (written behind its event): not writable
    assert slot.state is BufState.INVALID and eng.queues[1].view()[0]["num"] == 2
    eng.step()
    assert slot.state is BufState.IN_READING    # stage 1 reads batch 0
    assert eng.executors[0].state is ExecState.CHECKING   # batch 1 pulled, no legitimate pair
    assert ExecState.CHECKING in eng.executors[0].transitions
    eng.run_until_done()
    check_results(eng, qs, refs)
    for ex in eng.executors:
        assert ex.state is ExecState.INACTIVE


def test_early_exit_answers_at_exits_and_at_the_end():
    spec, payloads, refs = workload("eecnn")
    exits = {ex for _, ex in refs}
    assert None in exits and len(exits) >= 2, "the tiny early-exit model must exit somewhere and finish somewhere"
    eng = StagedEngine(spec, synthetic_profile(spec, 3), CPU, max_batch=32)
    qs = [Query(i, p) for i, p in enumerate(payloads)]
    eng.new(qs[:16])
    eng.new(qs[16:])
    eng.run_until_done()
    check_results(eng, qs, refs)


def test_failing_stage_fails_its_queries_and_nothing_else():
    spec, payloads, refs = workload("bert")
    eng = StagedEngine(spec, synthetic_profile(spec, 3), CPU, max_batch=8)
    qs = [Query(i, p, 0.0, len(p)) for i, p in enumerate(payloads[:12])]
    a = eng.new(qs[:4])
    eng.step()
    eng.stretch(a, qs[4:6])                      # the catch-up rows will fail at stage 0
    eng.fail_stage = lambda s, item: s == 0 and item.start == 4
    eng.new(qs[6:9])
    eng.run_until_done()
    c = eng.new(qs[9:])
    eng.fail_stage = lambda s, item: s == 2 and item.batch_id == c.id   # the last stage fails on batch c
    eng.run_until_done()
    failed = {q.id for q in qs[4:6]} | {q.id for q in qs[9:]}
    check_results(eng, qs, refs, failed_ok=failed)
    assert {q.id for q in qs if eng.results[q.id].error} == failed
    assert "stage 0 failed" in eng.results[qs[4].id].error
    assert "stage 2 failed" in eng.results[qs[9].id].error
    assert c.id not in eng.table.rows


def test_bad_inputs_are_clear_errors():
    spec, payloads, _ = workload("bert")
    eng = StagedEngine(spec, synthetic_profile(spec, 2), CPU, max_batch=4)
    with pytest.raises(FluidError, match="longer than the model's maximum"):
        eng.new([Query(0, np.ones(spec.max_length + 1, dtype=int))])
    with pytest.raises(FluidError, match="empty batch"):
        eng.new([])
    with pytest.raises(FluidError, match="larger than the maximum"):
        eng.new([Query(i, payloads[i]) for i in range(5)])
    with pytest.raises(FluidError, match="more stages than modules"):
        slice_model(spec, len(spec.modules) + 1, CPU, BSS)
    with pytest.raises(FluidError, match="cannot be sliced"):
        ModelSpec("x", torch.nn.Linear(2, 2), lambda p, d: (p,), lambda b: [])
    broken = ModelSpec("broken", [torch.nn.Linear(3, 3), torch.nn.Linear(5, 5)],
                       lambda ps, d: (torch.stack(ps),), lambda bs: [torch.zeros(3)] * bs)
    with pytest.raises(FluidError, match="module 1 .* cannot be sliced"):
        slice_model(broken, 2, CPU, (1, 2))
    row = eng.new([Query(10, payloads[0])])
    eng.split(row, [1])
    with pytest.raises(FluidError, match="cannot be stretched"):
        eng.stretch(row, [Query(11, payloads[1])])
    with pytest.raises(FluidError, match="submitted twice"):
        eng.new([Query(10, payloads[0])])
    eng.run_until_done()


def test_partition_balances_and_respects_exit_cuts():
    assert partition([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert partition([4, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert partition([1, 1, 1, 1, 1, 1], 3, cuts=[1]) [0] == (0, 1)
    with pytest.raises(FluidError):
        partition([1, 1], 3)
    with pytest.raises(FluidError, match="early exits"):
        partition([1, 1, 1], 1, cuts=[1])


def test_profile_slicing_interpolation_and_roundtrip(tmp_path):
    spec, _, _ = workload("unet")
    prof = slice_model(spec, 3, CPU, BSS, repeats=1)
    assert len(prof.bounds) == 3 and prof.bounds[0][0] == 0 and prof.bounds[-1][1] == len(spec.modules)
    assert prof.time(0, 3) == pytest.approx((prof.time(0, 2) + prof.time(0, 4)) / 2)
    assert prof.remain(0, 4) == pytest.approx(prof.total(4))
    prof.save(tmp_path / "p.json")
    again = StageProfile.from_json(__import__("json").loads((tmp_path / "p.json").read_text()))
    assert again.bounds == prof.bounds
    np.testing.assert_allclose(again.stage_seconds, prof.stage_seconds)


def test_length_distributions_are_data_with_sources():
    from fluidnpu.host_driver.staged.workloads import LENGTH_DISTRIBUTIONS

    rng = np.random.default_rng(0)
    for name, d in LENGTH_DISTRIBUTIONS.items():
        assert d["source"] and abs(sum(d["probs"]) - 1) < 1e-9 and len(d["edges"]) == len(d["probs"]) + 1
        x = sample_lengths(name, rng, 500)
        assert x.min() >= 1 and x.max() <= d["edges"][-1]
    assert np.median(sample_lengths("sst2", rng, 2000)) < np.median(sample_lengths("rte", rng, 2000))
    assert sample_lengths("uniform-5-500", rng, 2000).min() >= 5


# ---- asynchronous execution, observed through a fake device ----------------------------------

class FakeEvent:
    def __init__(self, dev: FakeDevice, stream: int, deps: list[FakeEvent]) -> None:
        self.dev, self.stream, self.deps, self.done = dev, stream, deps, False
        self.id = len(dev.events)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        raise AssertionError("the engine must never block the host on an event")


class FakeStream:
    """A StreamShim stand-in: work is computed at once on the CPU, but its events complete only when the
    fake device ticks, in stream order and after the events the stream was told to wait on."""

    cuda = False

    def __init__(self, dev: FakeDevice) -> None:
        self.dev, self.id, self.last, self.waits = dev, len(dev.streams), None, []
        dev.streams.append(self)

    def record(self) -> FakeEvent:
        ev = FakeEvent(self.dev, self.id, [e for e in [self.last, *self.waits] if e is not None])
        self.last, self.waits = ev, []
        self.dev.events.append(ev)
        self.dev.log.append(("record", self.id, ev.id))
        return ev

    def wait(self, event) -> None:
        self.waits.append(event)
        self.dev.log.append(("wait", self.id, event.id))

    def context(self):
        import contextlib

        return contextlib.nullcontext()

    def keep_alive(self, tensors) -> None:
        pass


class FakeDevice:
    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.events: list[FakeEvent] = []
        self.log: list[tuple[str, int, int]] = []

    def stream(self, device) -> FakeStream:
        return FakeStream(self)

    def tick(self) -> None:
        """Every stream whose oldest pending event has its dependencies done completes that event."""
        ready = []
        for st_ in self.streams:
            pending = [e for e in self.events if e.stream == st_.id and not e.done]
            if pending and all(d.done for d in pending[0].deps):
                ready.append(pending[0])
        for e in ready:
            e.done = True
            self.log.append(("complete", e.stream, e.id))

    def at(self, op: str, ev: int, stream: int | None = None) -> int:
        return next(i for i, (o, s, e) in enumerate(self.log)
                    if o == op and e == ev and (stream is None or s == stream))


def drive(eng: StagedEngine, dev: FakeDevice, limit: int = 500) -> int:
    """Step the engine and tick the device until every query is answered; the most executors WORKING at once."""
    most = 0
    for _ in range(limit):
        if not eng.live():
            return most
        eng.step()
        most = max(most, sum(ex.state is ExecState.WORKING for ex in eng.executors))
        dev.tick()
    raise AssertionError("the engine did not finish")


def test_dependent_stages_are_enqueued_behind_events_without_host_polling():
    spec, payloads, refs = workload("cnn")
    dev = FakeDevice()
    eng = StagedEngine(spec, synthetic_profile(spec, 4), CPU, n_buffers=2, max_batch=8, stream_factory=dev.stream)
    qs = [Query(i, payloads[i]) for i in range(2)]
    eng.new(qs)
    for _ in range(4):
        eng.step()                       # the device never runs: no event completes
    assert [s for s, _, _ in eng.launch_log] == [0, 1, 2, 3]      # yet all four stages of the batch are enqueued
    assert all(ex.state is ExecState.WORKING for ex in eng.executors)
    assert not any(op == "complete" for op, _, _ in dev.log) and not eng.results
    # stage s+1's stream waits (on the device) on the event recorded after stage s, before that event completes
    stage_ev = [next(e for o, st_, e in dev.log if o == "record" and st_ == ex.stream.id) for ex in eng.executors]
    for s in range(1, 4):
        assert dev.at("wait", stage_ev[s - 1], eng.executors[s].stream.id) < dev.at("record", stage_ev[s])
    drive(eng, dev)
    for s in range(1, 4):                # the device then ran them in dependency order
        assert dev.at("complete", stage_ev[s - 1]) < dev.at("complete", stage_ev[s])
    check_results(eng, qs, refs)


def test_serial_mode_is_serial_and_one_buffer_pair_is_not():
    spec, payloads, refs = workload("cnn")
    qs = [Query(i, payloads[i]) for i in range(8)]
    most = {}
    for serial, n_buffers in ((True, 2), (True, 1), (False, 1), (False, 2)):
        dev = FakeDevice()
        eng = StagedEngine(spec, synthetic_profile(spec, 4), CPU, n_buffers=n_buffers, max_batch=8, serial=serial,
                           stream_factory=dev.stream)
        for k in range(0, 8, 2):
            eng.new(qs[k:k + 2])
        most[(serial, n_buffers)] = drive(eng, dev)
        check_results(eng, qs, refs)
        if serial:   # every stage execution is recorded only after the previous one completed on the device
            recs = [(i, e) for i, (o, _, e) in enumerate(dev.log) if o == "record"
                    and dev.streams[dev.events[e].stream] is not eng.input_stream]
            for (_, prev), (i, _) in zip(recs, recs[1:]):
                assert dev.at("complete", prev) < i
    assert most[(True, 2)] == most[(True, 1)] == 1
    # one buffer pair does not make the stages serial: stages that share no boundary still overlap
    assert most[(False, 1)] >= 2 and most[(False, 2)] >= 3


def test_exits_and_outputs_are_read_back_without_blocking():
    spec, payloads, refs = workload("eecnn")
    dev = FakeDevice()
    eng = StagedEngine(spec, synthetic_profile(spec, 3), CPU, max_batch=32, stream_factory=dev.stream)
    qs = [Query(i, p) for i, p in enumerate(payloads)]
    eng.new(qs[:12])
    for _ in range(3):
        eng.step()
    assert not eng.results     # the exit's confidences are in flight: nobody waited for them
    assert eng.executors[0].inflight.conf is not None and not eng.executors[1].inflight
    drive(eng, dev)            # FakeEvent.synchronize raises: the host never blocked
    check_results(eng, qs[:12], refs)
