"""16-bit fixed-point quantisation (fluidnpu/quantize.py): formats, accumulator fit, saturation, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fluidnpu.errors import FluidError
from fluidnpu.hw.reference import INT16_MAX
from fluidnpu.quantize import (
    ACC_LIMIT,
    FloatLayer,
    FloatNetwork,
    early_exit_eval,
    frac_bits_for,
    quantize,
    softmax_confidence,
    to_fixed,
)
from fluidnpu.workload import Exit, Layer, Workload


def small_net(seed: int = 0, scale: float = 1.0, w_override: dict | None = None) -> FloatNetwork:
    """conv 3x3 1->4 on 5x5 (pad 1), exit head fc 100->3, conv 3x3 s2 4->6, final fc 54->3."""
    c1 = Layer.conv("c1", 1, 4, 5, 3, padding=1)
    c2 = Layer.conv("c2", 4, 6, 5, 3, stride=2, padding=1)
    fc = Layer.fc("fc", 6 * 9, 3)
    head = Layer.fc("e1.fc", 100, 3)
    wl = Workload("small", (c1, c2, fc), (Exit("e1", 0, (head,), 0.5), Exit("final", 2, (), 0.5)))
    rng = np.random.default_rng(seed)
    layers = []
    for s in wl.schedule():
        L = s.layer
        w = rng.standard_normal((L.P, L.C)) * scale / np.sqrt(L.P)
        if w_override and L.name in w_override:
            w = w_override[L.name](w)
        layers.append(FloatLayer(L, w, rng.standard_normal(L.C) * 0.1, L.kind == "conv"))
    return FloatNetwork(wl, tuple(layers), (5, 5, 1))


def calib(n: int = 64, seed: int = 1, amp: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-amp, amp, (n, 5, 5, 1))


def test_fixed_point_tracks_float():
    net = small_net()
    q = quantize(net, calib())
    x = calib(32, seed=5)
    fl = net.exit_logits(x)
    fx = q.exit_logits_reference(q.quantize_input(x)[0])
    for a, b in zip(fl, fx):
        assert np.max(np.abs(a - b)) < 2e-2 * max(1.0, np.max(np.abs(a)))
    for ql in q.layers:
        assert 0 <= ql.shift <= 31
        assert ql.shift == ql.frac_in + ql.frac_w - ql.frac_out
        assert ql.acc_max * 2 < ACC_LIMIT
        assert ql.weights.dtype == np.int16 and ql.bias.dtype == np.int32
    assert not q.calibration_saturation.any


def test_format_choice():
    assert frac_bits_for(1.0) == 14 and frac_bits_for(0.9) == 15 and frac_bits_for(3.0) == 13
    v, sat = to_fixed(np.array([0.5, 3.0, -5.0]), 14)
    assert v.tolist() == [8192, INT16_MAX, -32768] and sat == 2


def test_accumulator_fit_lowers_the_weight_format():
    # weights near 1 on a 9-tap kernel with inputs near 2: x*w sums overflow 32 bits at the weights' own format
    net = small_net(w_override={"c1": lambda w: np.full_like(w, 0.99)})
    q = quantize(net, calib(amp=1.99))
    c1 = q.layers[0]
    assert c1.frac_w < frac_bits_for(0.99)
    assert c1.acc_max * 2 < ACC_LIMIT
    assert c1.acc_bound >= c1.acc_max


def test_saturation_is_counted_not_an_error():
    net = small_net()
    q = quantize(net, calib(amp=0.1))          # formats for small inputs...
    xq, sat_in = q.quantize_input(calib(16, amp=8.0))   # ...then much bigger ones
    assert sat_in > 0
    _, rep = q.run_reference(xq)
    d = rep.to_dict()
    assert d["input"]["saturated"] == sat_in and rep.any
    assert sum(v["saturated"] for k, v in d.items() if k != "input") > 0


def test_weights_that_overflow_are_refused():
    with pytest.raises(FluidError, match=r"overflows 16-bit fixed point Q1\.14"):
        quantize(small_net(w_override={"c2": lambda w: w * 0 + 3.0}), calib(), weight_frac_bits=14)
    with pytest.raises(FluidError, match="overflows 16-bit fixed point"):
        quantize(small_net(w_override={"fc": lambda w: w * 1e30}), calib())
    with pytest.raises(FluidError, match="NaN or Inf"):
        small_net(w_override={"c1": lambda w: np.where(w > 0, np.nan, w)})


@pytest.mark.parametrize("bad,msg", [
    (np.zeros((2, 5, 5)), "shape"), (np.zeros((2, 5, 5, 2)), "shape"), (np.zeros((2, 4, 5, 1)), "shape"),
    (np.array([["a"]]), "dtype"), (np.zeros((1, 5, 5, 1), dtype=bool), "dtype"),
    (np.full((1, 5, 5, 1), np.nan), "NaN"), (np.full((1, 5, 5, 1), np.inf), "NaN/Inf"), ([[1, 2]], "numpy array"),
])
def test_bad_inputs(bad, msg):
    q = quantize(small_net(), calib())
    with pytest.raises(FluidError, match=msg):
        q.quantize_input(bad)


def test_bad_calibration_and_tau():
    with pytest.raises(FluidError, match="calibration"):
        quantize(small_net(), np.zeros((3, 4, 4, 1)))
    with pytest.raises(FluidError, match="NaN"):
        quantize(small_net(), np.full((3, 5, 5, 1), np.nan))
    with pytest.raises(FluidError, match="tau"):
        early_exit_eval([np.zeros((1, 3))], np.zeros(1), 1.5)


def test_early_exit_eval():
    sure = np.array([[10.0, 0, 0], [0, 0, 0]])      # sample 0 confident at exit 0, sample 1 not
    final = np.array([[0, 5.0, 0], [0, 0, 5.0]])
    r = early_exit_eval([sure, final], np.array([0, 2]), 0.8)
    assert r["taken"].tolist() == [0, 1] and r["pred"].tolist() == [0, 2] and r["accuracy"] == 1.0
    assert [e["exit_rate"] for e in r["exits"]] == [0.5, 0.5]
    pred, conf = softmax_confidence(np.array([[0.0, 0.0]]))
    assert conf[0] == pytest.approx(0.5)
