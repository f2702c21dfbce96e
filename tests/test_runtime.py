"""NetworkRuntime and DeviceBackend on ModelDevice: bit-exactness, activation bookkeeping for backfill and
merge, exits with tau, and bad input / device faults answered exactly once."""

from __future__ import annotations

import numpy as np
import pytest

from fluidnpu import digits_ee as D
from fluidnpu.errors import FluidError
from fluidnpu.host_driver.driver import NpuDriver
from fluidnpu.host_driver.model_device import ModelDevice
from fluidnpu.host_driver.runtime import NetworkRuntime
from fluidnpu.quantize import quantize
from fluidnpu.scheduler_fw.device_backend import DeviceBackend, measure_table, serve_stream


@pytest.fixture(scope="module")
def setup():
    net = D.load_float_network()
    xtr, _, xte, yte = D.load_dataset()
    return quantize(net, xtr), D.default_design(8), xte, yte


def driver(bundle, **kw):
    return NpuDriver(ModelDevice(bundle, **kw), bundle)


def same(a, b):
    return all(x.exit == y.exit and x.pred == y.pred and np.array_equal(x.logits, y.logits) for x, y in zip(a, b))


def test_model_device_matches_golden_model(setup):
    q, bundle, xte, _ = setup
    ref = NetworkRuntime(q, None, bmax=8).infer(xte[:100])
    dev = NetworkRuntime(q, driver(bundle)).infer(xte[:100])
    assert same(ref, dev)
    # and the golden model of the whole network gives the same exit logits
    logits = q.exit_logits_reference(q.quantize_input(xte[:100])[0])
    for k, st in enumerate(dev):
        assert np.array_equal(st.logits, logits[st.exit][k])


def test_backfill_and_merge_continue_from_kept_activations(setup):
    """Samples that stopped at exit 1 in different runs merge into one batch, and stopping at every layer
    boundary gives the same results as running whole segments, one sample at a time."""
    q, bundle, xte, _ = setup
    rt = NetworkRuntime(q, driver(bundle), tau=0.999)     # high tau: many samples continue
    alone = []
    for x in xte[:12]:
        alone += rt.infer(x[None])
    s1 = rt.segment_stops[0]
    a = rt.new_samples(xte[:6])
    b = rt.new_samples(xte[6:12])
    ra = rt.run(0, s1, a)
    rb = rt.run(0, s1, b)
    left = [a[i] for i in ra.remaining] + [b[i] for i in rb.remaining]
    assert 2 <= len(left) <= 8
    for st in left:                       # at the exit: only the backbone output the next segment reads
        assert set(st.acts) == rt.needed[s1] and st.position == s1
    pos = s1
    while left:                           # layer by layer, as LazyBatching stops
        r = rt.run(pos, pos + 1, left)
        left = [left[i] for i in r.remaining]
        pos += 1
    assert same(a + b, alone)


def test_exit_threshold(setup):
    q, bundle, xte, _ = setup
    lo = NetworkRuntime(q, None, tau=0.05).infer(xte[:50])
    hi = NetworkRuntime(q, None, tau=1.0).infer(xte[:50])
    assert all(s.exit == 0 for s in lo)
    assert all(s.exit == 2 for s in hi) or all(s.exit in (0, 2) and s.confidence >= 1.0 for s in hi if s.exit == 0)
    mid = NetworkRuntime(q, None, tau=0.8).infer(xte[:50])
    for s in mid:
        assert s.exit == 2 or s.confidence >= 0.8
        assert all(c < 0.8 for c in s.confidences[:s.exit])


def test_run_refuses_misuse(setup):
    q, bundle, xte, _ = setup
    rt = NetworkRuntime(q, driver(bundle))
    st = rt.new_samples(xte[:9])
    with pytest.raises(FluidError, match="Bmax"):
        rt.run(0, 3, st)
    with pytest.raises(FluidError, match="cannot run from layer"):
        rt.run(3, 4, st[:2])
    with pytest.raises(FluidError, match="outside"):
        rt.run(0, 99, st[:1])
    with pytest.raises(FluidError, match="NaN"):
        rt.new_sample(np.full((8, 8, 1), np.inf))
    with pytest.raises(FluidError, match="shape"):
        rt.new_sample(np.zeros((8, 8)))
    with pytest.raises(FluidError, match="Bmax"):
        NetworkRuntime(q, driver(bundle), bmax=9)


def test_serving_with_bad_inputs_answers_each_valid_sample_once(setup):
    q, bundle, xte, yte = setup
    rt = NetworkRuntime(q, driver(bundle))
    table = measure_table(rt, bundle, reps=1)
    inputs = list(xte[:30])
    inputs[3] = np.full((8, 8, 1), np.nan)
    inputs[7] = np.zeros((8, 8, 2))
    inputs[11] = np.array(["x"] * 64).reshape(8, 8, 1)
    inputs[12] = xte[12].astype(np.float32)           # another float dtype is fine
    rep = serve_stream(rt, table, inputs, yte[:30].tolist(), "fluidb", rate=2000, slo_s=0.5)
    assert rep["sent"] == 30 and rep["rejected"] == 3 and rep["admitted"] == 27 and rep["answered"] == 27
    assert [r["index"] for r in rep["rejections"]] == [3, 7, 11]
    assert "NaN" in rep["rejections"][0]["error"] and "shape" in rep["rejections"][1]["error"]
    assert "dtype" in rep["rejections"][2]["error"]
    assert rep["errors"] == 0 and sum(rep["exit_rates"]) == pytest.approx(1.0)


@pytest.mark.parametrize("policy", ["fluidb", "lazybatching", "serial", "r-adaptb-s", "fc-adaptb-m"])
def test_every_policy_drives_the_device(setup, policy):
    q, bundle, xte, yte = setup
    rt = NetworkRuntime(q, driver(bundle), tau=0.95)
    table = measure_table(rt, bundle, batch_sizes=[1, 8], reps=1)
    rep = serve_stream(rt, table, list(xte[:40]), yte[:40].tolist(), policy, rate=1500, slo_s=0.2, seed=3)
    assert rep["answered"] == 40 and rep["errors"] == 0
    assert rep["accuracy"] >= 0.9
    ref = NetworkRuntime(q, None, tau=0.95).infer(xte[:40])
    assert rep["exit_rates"] == pytest.approx([np.mean([s.exit == e for s in ref]) for e in range(3)])


def test_device_fault_answers_the_batch_with_an_error(setup):
    q, bundle, xte, yte = setup
    good = NetworkRuntime(q, driver(bundle))
    table = measure_table(good, bundle, batch_sizes=[1, 8], reps=1)
    rt = NetworkRuntime(q, driver(bundle, hang="soft"), timeout_s=0.01)
    rep = serve_stream(rt, table, list(xte[:10]), yte[:10].tolist(), "fluidb", rate=1000, slo_s=0.5)
    assert rep["answered"] == 10 and rep["errors"] == 10
    assert "NpuTimeout" in rep["error_messages"][0]


def test_device_backend_checks_the_table(setup):
    q, bundle, _, _ = setup
    from fluidnpu.scheduler_fw.latency import LatencyTable

    t = LatencyTable.from_segments([[1e-3] * 8] * 2, [0.5, 0.5])
    with pytest.raises(FluidError, match="segments"):
        DeviceBackend(NetworkRuntime(q, None), t)


@pytest.mark.parametrize("warmup,reps", [(1, 2), (0, 1)])
def test_latency_table_runs_each_piece_warmup_plus_reps_times(setup, monkeypatch, warmup, reps):
    """measure_table times `reps` runs of every exit segment at every batch size after `warmup` untimed ones
    (the RTL simulation's server calibrates with none)."""
    q, bundle, _, _ = setup
    rt = NetworkRuntime(q, driver(bundle))
    calls = []
    real = rt._run_piece
    monkeypatch.setattr(rt, "_run_piece",
                        lambda start, stop, states: calls.append(len(states)) or real(start, stop, states))
    table = measure_table(rt, bundle, batch_sizes=[1, 8], reps=reps, warmup=warmup)
    assert len(calls) == len(rt.segment_stops) * 2 * (warmup + reps)
    assert sorted(set(calls)) == [1, 8]
    assert all(t > 0 for row in table.segment_seconds for t in row)
