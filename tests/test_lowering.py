"""The stem's kernel rows folded into channels (fluidnpu/lowering.py): the same outputs from the folded input
and weights, which layers fold, the fold through the workload, the bundle, the runtime and the RTL."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fluidnpu.errors import FluidError
from fluidnpu.hw.descriptor import LayerDescriptor
from fluidnpu.hw.reference import layer_reference
from fluidnpu.lowering import fold_input, fold_network, fold_rows, fold_stem, fold_weights, folds
from fluidnpu.quantize import FloatLayer, FloatNetwork, quantize
from fluidnpu.workload import Exit, Layer, Workload
from fluidnpu.zoo import zoo_model

STEMS = [  # (cin, cout, in_hw, kernel, stride, padding)
    (3, 5, (16, 14), 7, 2, 3),              # ResNet-50's conv1, small
    (3, 4, (15, 15), 3, 2, 0),              # Inception-v3's first conv, small (no padding, odd rows)
    (2, 3, (11, 9), (5, 3), (3, 2), (1, 0, 2, 1)),      # uneven kernel, stride and padding
    (1, 2, (7, 8), (4, 2), 2, (2, 1, 0, 0)),            # padding on top only: the last rows run out
]


def _geometry(layer: Layer) -> LayerDescriptor:
    return LayerDescriptor.from_layer(layer, 0, shift=3)


@pytest.mark.parametrize("cin,cout,hw,k,s,pad", STEMS)
def test_a_folded_stem_computes_the_same_outputs(cin, cout, hw, k, s, pad):
    """The NPU's arithmetic (hw/reference.py) on the folded input, weights and 1 x kw layer gives the stem's
    int16 outputs exactly, at the same MACs; the folded layer reads kh rows' channels side by side."""
    stem = Layer.conv("stem", cin, cout, hw, k, s, pad)
    folded = fold_rows(stem)
    assert folded.kernel == (1, stem.kernel[1]) and folded.in_ch == stem.kernel[0] * cin
    assert (folded.out_hw, folded.macs, folded.P) == (stem.out_hw, stem.macs, stem.P)
    rng = np.random.default_rng(sum(hw))
    x = rng.integers(-32768, 32768, (3, *hw, cin)).astype(np.int16)
    w = rng.integers(-32768, 32768, (stem.P, cout)).astype(np.int16)
    bias = rng.integers(-1 << 20, 1 << 20, cout).astype(np.int32)
    xf = fold_input(stem, x)
    assert xf.shape == (3, *folded.in_hw, folded.in_ch) and xf.dtype == np.int16
    np.testing.assert_array_equal(layer_reference(xf, _geometry(folded), fold_weights(stem, w), bias),
                                  layer_reference(x, _geometry(stem), w, bias))


def test_which_first_layers_fold():
    """Image stems of stride >= 2 fold; a stride-1 stem, a wide input, a 1-row kernel and an FC do not;
    folding is done once (the workload keeps the network's own layer as its stem)."""
    assert folds(Layer.conv("c", 3, 64, 224, 7, 2, 3)) and folds(Layer.conv("c", 1, 8, 28, 3, 2))
    assert not folds(Layer.conv("c", 3, 64, 224, 7, 1, 3))
    assert not folds(Layer.conv("c", 16, 64, 56, 3, 2, 1))
    assert not folds(Layer.conv("c", 3, 64, 224, (1, 7), 2))
    assert not folds(Layer.fc("f", 147, 10))
    resnet = zoo_model("resnet50")
    assert resnet.stem is not None and resnet.stem.kernel == (7, 7) and resnet.backbone[0] == fold_rows(resnet.stem)
    assert fold_stem(resnet) is resnet
    assert zoo_model("inceptionv3").backbone[0].kernel == (1, 3)
    assert zoo_model("digits-ee").stem is None                     # stride 1: its input would be copied 3 times
    assert resnet.backbone[0].macs == resnet.stem.macs


def test_the_stem_travels_with_the_workload_and_the_bundle(tmp_path):
    """A folded workload's stem survives its JSON and a design bundle (the runtime folds the input from it)."""
    from fluidnpu import digits_ee as D
    from fluidnpu.bundle import bundle_from_result, load_bundle
    from fluidnpu.dse.search import DSEOptions, explore

    wl = fold_stem(Workload("stemmed", (Layer.conv("c1", 3, 4, 12, 5, 2, 2), Layer.fc("fc", 4 * 36, 5)),
                            (Exit("final", 1, (), 1.0),)))
    assert wl.stem is not None
    assert Workload.from_dict(json.loads(json.dumps(wl.to_dict()))) == wl
    assert "stem" not in zoo_model("digits-ee").to_dict()
    bad = wl.to_dict()
    bad["stem"]["out_ch"] = 5
    with pytest.raises(FluidError, match="does not fold into its first layer"):
        Workload.from_dict(bad)
    path = tmp_path / "b.json"
    bundle_from_result(explore(wl, D.small_board(), DSEOptions(bmax=2))).save(path)
    assert Workload.from_dict(load_bundle(path).data["workload"]) == wl


def _stemmed_network() -> FloatNetwork:
    """A 5 x 5 stride-2 stem over a 12 x 12 x 3 image, a 3 x 3 conv, an exit head and an FC."""
    c1 = Layer.conv("c1", 3, 6, 12, 5, 2, 2)
    c2 = Layer.conv("c2", 6, 4, 6, 3, 1, 1)
    head = Layer.fc("e1.fc", 6 * 36, 3)
    fc = Layer.fc("fc", 4 * 36, 3)
    wl = Workload("stemmed", (c1, c2, fc), (Exit("e1", 0, (head,), 0.5), Exit("final", 2, (), 0.5)))
    rng = np.random.default_rng(5)
    layers = tuple(FloatLayer(L, rng.standard_normal((L.P, L.C)) * 0.2, rng.standard_normal(L.C) * 0.1, relu)
                   for L, relu in ((c1, True), (head, False), (c2, True), (fc, False)))
    return FloatNetwork(wl, layers, (12, 12, 3))


def test_a_folded_network_runs_bit_exact_on_the_model_device():
    """The folded network computes the plain one's float outputs and, quantised, its int16 exit logits
    exactly; on the NPU model (ModelDevice, a design for the folded workload) every sample exits with
    the golden model's logits, the host folding each input before the first subnet."""
    from fluidnpu import digits_ee as D
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.runtime import NetworkRuntime

    plain = _stemmed_network()
    net = fold_network(plain)
    assert net.layers[0].pre == "fold_rows" and net.workload.stem == plain.layers[0].layer
    x = np.random.default_rng(1).uniform(-1, 1, (6, 12, 12, 3))
    for a, b in zip(net.exit_logits(x), plain.exit_logits(x)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    q, q_plain = quantize(net, x), quantize(plain, x)
    xq = q.quantize_input(x)[0]
    for a, b in zip(q.exit_logits_reference(xq), q_plain.exit_logits_reference(xq)):
        np.testing.assert_array_equal(a, b)
    bundle = bundle_from_result(explore(net.workload, D.small_board(), DSEOptions(bmax=4)))
    dev = NetworkRuntime(q, NpuDriver(ModelDevice(bundle), bundle), tau=0.5).infer(x)
    gold = NetworkRuntime(q_plain, None, bmax=4, tau=0.5).infer(x)
    for a, b in zip(dev, gold):
        assert a.exit == b.exit and np.array_equal(a.logits, b.logits)


def test_a_network_that_reads_its_input_through_a_host_operation_does_not_fold():
    net = _stemmed_network()
    first = net.layers[0]
    bad = FloatNetwork(net.workload, (FloatLayer(first.layer, first.weight, first.bias, True, "gap"),) + net.layers[1:],
                       net.input_hwc)
    with pytest.raises(FluidError, match="does not fold"):
        fold_network(bad)
    with pytest.raises(FluidError, match="folds inputs of shape"):
        fold_input(first.layer, np.zeros((1, 12, 12, 4)))


def test_the_folded_stem_runs_bit_exact_in_the_rtl_in_fewer_cycles():
    """ResNet-50's stem, shrunk to a 16 x 16 image, on the pick-shaped engine (TP = 14 on three 64-bit
    ports; sim_tb/agreement.py's PICK_LAYERS, which benchmarks/rtl_agreement.py also runs): the plain layer
    and its folded one are both bit-exact in the simulated RTL, the folded one in under half the cycles (a
    window is one run, not seven), and the model prices it within 5 %."""
    from fluidnpu.sim_tb.agreement import PICK_LAYERS, pick_layer_rows

    plain, folded = "7x7 stride-2 stem, cin 3 (conv1)", "the stem folded: 1x7 stride (1, 2), cin 21"
    stem = Layer.conv("stem", 3, 4, 16, 7, 2, 3)
    for name, layer in ((plain, stem), (folded, fold_rows(stem))):
        geo = _geometry(layer)
        assert {f: getattr(geo, f) for f in PICK_LAYERS[name]} == PICK_LAYERS[name]
    rows = dict(zip((plain, folded), pick_layer_rows((plain, folded))))
    assert rows[plain].correct and rows[folded].correct
    assert rows[folded].hw_cycles < 0.5 * rows[plain].hw_cycles, (rows[folded], rows[plain])
    assert abs(rows[folded].error) <= 0.05


def test_an_onnx_stem_folds_alike_for_the_dse_and_the_runtime(tmp_path):
    """An ONNX model whose first Conv is a 5 x 5 stride-2 stem over an RGB image: `fluidnpu dse`'s workload
    (`load_model`) and the runtime's network (`load_onnx_network`) are folded the same way, and the folded
    network still computes ONNX's own outputs."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from fluidnpu.design import load_model
    from fluidnpu.onnx_import import load_onnx
    from fluidnpu.onnx_runtime import load_onnx_network

    rng = np.random.default_rng(2)
    w = lambda name, *s: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.2, name)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], name="c1", kernel_shape=[5, 5], strides=[2, 2],
                              pads=[2] * 4),
             helper.make_node("Relu", ["c1"], ["a1"], name="r1"),
             helper.make_node("Flatten", ["a1"], ["fl"], name="flat"),
             helper.make_node("Gemm", ["fl", "f.w", "f.b"], ["logits"], name="f", transB=1)]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
                              [w("c1.w", 4, 3, 5, 5), w("c1.b", 4), w("f.w", 5, 4 * 36), w("f.b", 5)])
    path = tmp_path / "stem.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    net = load_onnx_network(path)
    assert net.layers[0].pre == "fold_rows" and net.workload.stem == load_onnx(path).backbone[0]
    assert load_model(str(path)).to_dict() == net.workload.to_dict()
    x = rng.uniform(-1, 1, (3, 12, 12, 3))
    (theirs,) = ReferenceEvaluator(str(path)).run(["logits"], {"x": x.transpose(0, 3, 1, 2).astype(np.float32)})
    np.testing.assert_allclose(net.exit_logits(x)[-1], theirs, rtol=1e-4, atol=1e-5)
