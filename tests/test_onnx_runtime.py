"""A user's multi-exit ONNX model through the importer into the runtime: weights in the NPU's layout match
ONNX's own reference evaluator, and the quantised model runs bit-exactly on ModelDevice."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from fluidnpu.errors import FluidError  # noqa: E402
from fluidnpu.onnx_runtime import load_onnx_network  # noqa: E402
from fluidnpu.quantize import quantize  # noqa: E402

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "ee_cnn_onnx.py"


@pytest.fixture(scope="module")
def ee_cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "ee_cnn.onnx"
    onnx.save(runpy.run_path(str(EXAMPLE))["build"](), str(path))
    return path


def flat_model(path: Path, extra_op: str | None = None) -> Path:
    """conv 3x3 (2->4, 6x6) -> Relu -> [extra] -> Flatten -> Gemm (exit) and conv -> Relu -> Flatten -> Gemm."""
    rng = np.random.default_rng(3)
    w = lambda name, *s: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, name)  # noqa: E731
    inits = [w("c1.w", 4, 2, 3, 3), w("c1.b", 4), w("e.w", 5, 4 * 36), w("e.b", 5),
             w("c2.w", 3, 4, 3, 3), w("f.w", 5, 3 * 9)]
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["c1"], name="c1", kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["a1"], name="r1")]
    t = "a1"
    if extra_op:
        nodes.append(helper.make_node(extra_op, ["a1"], ["m"], name="extra", kernel_shape=[1, 1]))
        t = "m"
    nodes += [helper.make_node("Flatten", [t], ["fl"], name="flat"),
              helper.make_node("Gemm", ["fl", "e.w", "e.b"], ["exit_logits"], name="e", transB=1),
              helper.make_node("Conv", ["a1", "c2.w"], ["c2"], name="c2", kernel_shape=[3, 3], strides=[2, 2],
                               pads=[1] * 4),
              helper.make_node("Relu", ["c2"], ["a2"], name="r2"),
              helper.make_node("Flatten", ["a2"], ["fl2"], name="flat2"),
              helper.make_node("Gemm", ["fl2", "f.w"], ["logits"], name="f", transB=1)]
    graph = helper.make_graph(nodes, "flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
                              [helper.make_tensor_value_info("exit_logits", TensorProto.FLOAT, ["N", 5]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def onnx_outputs(path: Path, x_hwc: np.ndarray, names: list[str]) -> list[np.ndarray]:
    sess = ReferenceEvaluator(str(path))
    return sess.run(names, {sess.input_names[0]: x_hwc.transpose(0, 3, 1, 2).astype(np.float32)})


def test_ee_cnn_matches_onnx_and_runs_on_model_device(ee_cnn):
    net = load_onnx_network(ee_cnn, exits=["exit1_logits"], exit_rates=[0.5, 0.5])
    assert [(fl.layer.name, fl.relu, fl.pre) for fl in net.layers] == [
        ("conv1", True, None), ("conv2", True, None), ("exit1.conv", True, None), ("exit1.fc", False, "gap"),
        ("conv3", True, None), ("conv4", True, None), ("fc", False, "gap")]
    x = np.random.default_rng(0).uniform(-1, 1, (6, 32, 32, 3))
    ref = onnx_outputs(ee_cnn, x, ["exit1_logits", "logits"])
    for ours, theirs in zip(net.exit_logits(x), ref):
        assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    q = quantize(net, x)
    for ours, fixed in zip(net.exit_logits(x), q.exit_logits_reference(q.quantize_input(x)[0])):
        assert np.max(np.abs(ours - fixed)) < 1e-2 * np.max(np.abs(ours)) + 1e-4
    # on the NPU model: a small design for this workload, bit-exact with the golden model
    from fluidnpu import digits_ee as D
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.runtime import NetworkRuntime

    bundle = bundle_from_result(explore(net.workload, D.small_board(), DSEOptions(bmax=4)))
    dev = NetworkRuntime(q, NpuDriver(ModelDevice(bundle), bundle), tau=0.5).infer(x)
    gold = NetworkRuntime(q, None, bmax=4, tau=0.5).infer(x)
    for a, b in zip(dev, gold):
        assert a.exit == b.exit and np.array_equal(a.logits, b.logits)


def test_flatten_of_a_conv_is_reordered_to_hwc(tmp_path):
    path = flat_model(tmp_path / "flat.onnx")
    net = load_onnx_network(path, exits=["exit_logits"])
    x = np.random.default_rng(1).uniform(-1, 1, (4, 6, 6, 2))
    for ours, theirs in zip(net.exit_logits(x), onnx_outputs(path, x, ["exit_logits", "logits"])):
        assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_unsupported_host_op_is_refused(tmp_path):
    path = flat_model(tmp_path / "pool.onnx", extra_op="MaxPool")
    with pytest.raises(FluidError, match="MaxPool"):
        load_onnx_network(path, exits=["exit_logits"])
