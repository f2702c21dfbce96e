"""digits-ee: the committed trained network, float vs 16-bit fixed point, the zoo entry, the training script,
and ModelDevice vs RtlSimDevice bit-identity."""

from __future__ import annotations

import numpy as np
import pytest

from fluidnpu import digits_ee as D
from fluidnpu.quantize import early_exit_eval, quantize
from fluidnpu.zoo import zoo_model


@pytest.fixture(scope="module")
def nets():
    net = D.load_float_network()
    xtr, ytr, xte, yte = D.load_dataset()
    return net, quantize(net, xtr), xte, yte


def test_dataset_split_is_fixed():
    xtr, ytr, xte, yte = D.load_dataset()
    assert xtr.shape == (1347, 8, 8, 1) and xte.shape == (450, 8, 8, 1)
    assert 0.0 <= xtr.min() and xtr.max() <= 1.0
    assert sorted(set(yte.tolist())) == list(range(10))


def test_workload_is_in_the_zoo():
    wl = zoo_model("digits-ee")
    assert wl.name == "digits-ee" and [e.name for e in wl.exits] == ["exit1", "exit2", "final"]
    assert sum(e.rate for e in wl.exits) == pytest.approx(1.0)
    assert [s.layer.name for s in wl.schedule()] == ["conv1", "exit1.fc", "conv2", "exit2.fc", "conv3", "fc"]
    assert zoo_model("digits_ee") == wl


def test_float_and_fixed_accuracy(nets):
    net, q, xte, yte = nets
    fl = early_exit_eval(net.exit_logits(xte), yte, D.DEFAULT_TAU)
    fx = early_exit_eval(q.exit_logits_reference(q.quantize_input(xte)[0]), yte, D.DEFAULT_TAU)
    assert fl["accuracy"] >= 0.95
    assert abs(fl["accuracy"] - fx["accuracy"]) <= 0.01                    # within 1 point
    for a, b in zip(fl["exits"], fx["exits"]):
        assert a["accuracy_all"] >= 0.9
        assert abs(a["accuracy_all"] - b["accuracy_all"]) <= 0.01
        assert abs(a["exit_rate"] - b["exit_rate"]) <= 0.01
    # the workload's exit rates are the fixed-point network's on the test split
    assert [e["exit_rate"] for e in fx["exits"]] == pytest.approx([e.rate for e in q.workload.exits], abs=1e-9)
    assert not q.calibration_saturation.any


def test_quantised_formats(nets):
    _, q, _, _ = nets
    assert q.input_frac == 14
    for ql in q.layers:
        assert 0 <= ql.shift <= 31 and ql.acc_max * 2 < 2 ** 31


def test_training_script_is_deterministic(tmp_path):
    import runpy
    from pathlib import Path

    main = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "train_digits_ee.py"))["main"]
    outs = []
    for k in range(2):
        out = tmp_path / f"w{k}.npz"
        assert main(["--epochs", "1", "--out", str(out)]) == 0
        outs.append(np.load(out))
    assert set(outs[0].files) >= {"conv1.w", "exit1.fc.b", "fc.w", "exit_rates"}
    for key in outs[0].files:
        assert np.array_equal(outs[0][key], outs[1][key]), key
    net = D.load_float_network(tmp_path / "w0.npz")
    assert net.layers[0].weight.shape == (9, 8)


def test_small_default_design():
    b = D.default_design(4)
    TR, TP, TC = b.design
    assert TP * TC <= D.SMALL_DSP and b.bmax == 4
    assert [s.layer.name for s in b.workload.schedule()] == [s.layer.name for s in D.digits_ee().schedule()]
