"""ONNX import: models are built here with onnx.helper (nothing downloaded) and lowered to GEMMs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from fluidnpu.errors import FluidError  # noqa: E402
from fluidnpu.onnx_import import load_onnx  # noqa: E402

OPSET = 17


class GraphBuilder:
    """Collects nodes and random initializers so each test model reads like a layer list."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._rng = np.random.default_rng(0)

    def weight(self, name: str, *shape: int) -> str:
        self.inits.append(numpy_helper.from_array(self._rng.standard_normal(shape).astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, name: str | None = None, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output if name is None else name, **attrs))
        return output

    def conv(self, name: str, x: str, in_ch: int, out_ch: int, k: int, group: int = 1,
             with_kernel_attr: bool = True, **attrs) -> str:
        w = self.weight(f"{name}.w", out_ch, in_ch // group, k, k)
        if with_kernel_attr:
            attrs["kernel_shape"] = [k, k]
        return self.node("Conv", [x, w], name, group=group, **attrs)

    def save(self, tmp_path: Path, filename: str, inputs: list, outputs: dict[str, int],
             extra_inputs: list | None = None) -> Path:
        """`outputs` maps each graph output to its rank (the checker wants a shape, dims may be unknown)."""
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * rank) for o, rank in outputs.items()]
        graph = helper.make_graph(self.nodes, "g", (extra_inputs or []) + inputs, outs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        path = tmp_path / filename
        onnx.save(model, path)
        return path


def image_input(name: str = "x", shape: tuple = ("N", 3, 32, 32)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def small_cnn(tmp_path: Path) -> Path:
    g = GraphBuilder()
    h = g.conv("conv1", "x", 3, 16, 3, pads=[1, 1, 1, 1])                      # 32x32
    h = g.node("Relu", [h], "relu1")
    h = g.node("MaxPool", [h], "pool1", kernel_shape=[2, 2], strides=[2, 2])   # 16x16
    # pads are (top, left, bottom, right): H 16+2+1, W 16+0+0
    h = g.conv("conv2", h, 16, 32, 3, strides=[2, 2], pads=[2, 0, 1, 0])       # 9x7
    # depthwise, dilated, kernel size only in the weight
    h = g.conv("dw3", h, 32, 32, 3, group=32, with_kernel_attr=False, pads=[2, 2, 2, 2], dilations=[2, 2])
    h = g.conv("pw4", h, 32, 64, 1, group=4)                                   # grouped 1x1
    h = g.node("GlobalAveragePool", [h], "gap")
    h = g.node("Flatten", [h], "flat")
    w = g.weight("fc.w", 10, 64)
    g.node("Gemm", [h, w, g.weight("fc.b", 10)], "logits", name="fc", transB=1)
    return g.save(tmp_path, "small_cnn.onnx", [image_input()], {"logits": 2})


def test_small_cnn_layers(tmp_path):
    wl = load_onnx(small_cnn(tmp_path))
    got = [(ly.name, ly.kind, ly.R, ly.P, ly.C, ly.groups, ly.out_hw) for ly in wl.backbone]
    assert got == [
        ("conv1", "conv", 32 * 32, 3 * 3 * 3, 16, 1, (32, 32)),
        ("conv2", "conv", 9 * 7, 3 * 3 * 16, 32, 1, (9, 7)),
        ("dw3", "conv", 9 * 7, 3 * 3 * 1, 1, 32, (9, 7)),
        ("pw4", "conv", 9 * 7, 1 * 1 * 8, 16, 4, (9, 7)),
        ("fc", "fc", 1, 64, 10, 1, (1, 1)),
    ]
    conv2 = wl.backbone[1]
    assert conv2.in_hw == (16, 16) and conv2.stride == (2, 2) and conv2.pads == (2, 0, 1, 0)
    assert wl.backbone[2].kernel == (3, 3) and wl.backbone[2].dilation == (2, 2)
    assert wl.total_macs == (1024 * 27 * 16) + (63 * 144 * 32) + (32 * 63 * 9 * 1) + (4 * 63 * 8 * 16) + 640
    assert wl.total_macs == 783712
    assert wl.name == "small_cnn" and wl.input_shape == (3, 32, 32)
    assert wl.source == str(tmp_path / "small_cnn.onnx")
    assert [(e.name, e.position, e.head, e.rate) for e in wl.exits] == [("final", 4, (), 1.0)]


def test_name_override_and_unnamed_nodes_get_unique_names(tmp_path):
    g = GraphBuilder()
    h = g.node("Conv", ["x", g.weight("w1", 4, 3, 1, 1)], "a", name="")
    h = g.node("Conv", [h, g.weight("w2", 4, 4, 1, 1)], "b", name="dup")
    h = g.node("Conv", [h, g.weight("w3", 4, 4, 1, 1)], "c", name="dup")
    path = g.save(tmp_path, "m.onnx", [image_input(shape=(1, 3, 8, 8))], {h: 4})
    wl = load_onnx(path, name="custom")
    assert wl.name == "custom"
    assert [ly.name for ly in wl.backbone] == ["Conv_0", "dup", "dup_2"]


@pytest.mark.parametrize("auto_pad, pads, out_hw", [
    ("SAME_UPPER", (1, 1, 2, 1), (4, 4)),
    ("SAME_LOWER", (2, 1, 1, 1), (4, 4)),
    ("VALID", (0, 0, 0, 0), (2, 3)),
])
def test_conv_auto_pad(tmp_path, auto_pad, pads, out_hw):
    # 7x8 input, 4x4 kernel, stride 2: SAME needs 3 rows (odd, split differs) and 2 cols of padding
    g = GraphBuilder()
    h = g.conv("c", "x", 4, 8, 4, strides=[2, 2], auto_pad=auto_pad)
    path = g.save(tmp_path, "pad.onnx", [image_input(shape=(1, 4, 7, 8))], {h: 4})
    (layer,) = load_onnx(path).backbone
    assert layer.pads == pads and layer.out_hw == out_hw and layer.R == out_hw[0] * out_hw[1]


def test_matmul_rows_skip_batch_dim(tmp_path):
    g = GraphBuilder()
    h = g.node("MatMul", ["x", g.weight("w1", 32, 64)], "mm1")
    h = g.node("Relu", [h], "act")
    h = g.node("MatMul", [h, g.weight("w2", 64, 8)], "mm2")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 32])
    wl = load_onnx(g.save(tmp_path, "mm.onnx", [x], {h: 3}))
    got = [(ly.name, ly.kind, ly.R, ly.P, ly.C) for ly in wl.backbone]
    assert got == [("mm1", "matmul", 16, 32, 64), ("mm2", "matmul", 16, 64, 8)]
    assert wl.input_shape == (16, 32)
    assert wl.total_macs == 16 * 32 * 64 + 16 * 64 * 8


def test_matmul_static_batch_and_constant_first_operand(tmp_path):
    # x: [2, 5, 12, 6]; dim 0 equals the input's batch (2) and rank >= 3, so rows = 5 * 12
    g = GraphBuilder()
    h = g.node("MatMul", ["x", g.weight("w", 6, 3)], "right")            # [2, 5, 12, 3]
    h = g.node("MatMul", [g.weight("v", 7, 12), h], "left")              # W @ x -> [2, 5, 7, 3]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 12, 6])
    wl = load_onnx(g.save(tmp_path, "mm2.onnx", [x], {h: 4}))
    assert [(ly.R, ly.P, ly.C) for ly in wl.backbone] == [(5 * 12, 6, 3), (5 * 3, 12, 7)]


def test_gemm_weight_from_constant_node_and_initializer_listed_as_input(tmp_path):
    g = GraphBuilder()
    wt = numpy_helper.from_array(np.ones((20, 5), np.float32), "wc")
    g.nodes.append(helper.make_node("Constant", [], ["w"], name="const_w", value=wt))
    g.node("Gemm", ["x", "w"], "y", name="fc")
    scale = g.weight("unused_scale", 1)
    # IR-3 style: the initializer also appears as a graph input, and it comes first
    scale_in = helper.make_tensor_value_info(scale, TensorProto.FLOAT, [1])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 20])
    wl = load_onnx(g.save(tmp_path, "fc.onnx", [x], {"y": 2}, extra_inputs=[scale_in]))
    (fc,) = wl.backbone
    assert (fc.kind, fc.R, fc.P, fc.C) == ("fc", 1, 20, 5)
    assert wl.input_shape == (20,)


def exit_model(tmp_path: Path, branches: list[tuple[str, str]], final_first: bool = False) -> Path:
    """Backbone c1-c2-c3-fc; each (tap tensor, exit name) adds Conv+GAP+Flatten+Gemm off the tap."""
    g = GraphBuilder()
    r1 = g.node("Relu", [g.conv("c1", "x", 3, 8, 3, pads=[1, 1, 1, 1])], "r1")
    r2 = g.node("Relu", [g.conv("c2", r1, 8, 16, 3, pads=[1, 1, 1, 1])], "r2")
    channels = {"x": 3, "r1": 8, "r2": 16}
    outputs = {}
    for tap, exit_name in branches:
        h = g.conv(f"{exit_name}.conv", tap, channels[tap], 8, 1, strides=[2, 2])
        h = g.node("Flatten", [g.node("GlobalAveragePool", [h], f"{exit_name}.gap")], f"{exit_name}.flat")
        g.node("Gemm", [h, g.weight(f"{exit_name}.w", 10, 8)], exit_name, name=f"{exit_name}.fc", transB=1)
        outputs[exit_name] = 2
    h = g.conv("c3", r2, 16, 32, 3, strides=[2, 2], pads=[1, 1, 1, 1])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h], "gap")], "flat")
    g.node("Gemm", [h, g.weight("fc.w", 10, 32)], "logits", name="fc", transB=1)
    outputs = {"logits": 2, **outputs} if final_first else {**outputs, "logits": 2}
    return g.save(tmp_path, "exits.onnx", [image_input(shape=("N", 3, 16, 16))], outputs)


def test_two_exit_model_split_and_rates(tmp_path):
    path = exit_model(tmp_path, [("r2", "exit1")])
    wl = load_onnx(path, exits=["exit1"], exit_rates=[0.3, 0.7])
    assert [ly.name for ly in wl.backbone] == ["c1", "c2", "c3", "fc"]
    early, final = wl.exits
    assert (early.name, early.position, early.rate) == ("exit1", 1, 0.3)
    assert [(ly.name, ly.R, ly.P, ly.C) for ly in early.head] == [("exit1.conv", 64, 16, 8), ("exit1.fc", 1, 8, 10)]
    assert (final.name, final.position, final.head, final.rate) == ("final", 3, (), 0.7)
    assert [ly.name for ly in wl.layers()] == ["c1", "c2", "exit1.conv", "exit1.fc", "c3", "fc"]

    uniform = load_onnx(path, exits=["exit1.fc"])  # by node name this time
    assert [(e.name, e.position, e.rate) for e in uniform.exits] == [("exit1.fc", 1, 0.5), ("final", 3, 0.5)]
    assert uniform.exits[0].head == early.head


def test_without_exits_the_branch_is_dropped_and_last_output_is_final(tmp_path):
    wl = load_onnx(exit_model(tmp_path, [("r2", "exit1")]))
    assert [ly.name for ly in wl.layers()] == ["c1", "c2", "c3", "fc"]
    assert [(e.name, e.position, e.rate) for e in wl.exits] == [("final", 3, 1.0)]


def test_final_output_is_the_output_not_named_as_exit(tmp_path):
    wl = load_onnx(exit_model(tmp_path, [("r2", "exit1")], final_first=True), exits=["exit1"])
    assert [ly.name for ly in wl.backbone] == ["c1", "c2", "c3", "fc"]
    assert [(e.name, e.position) for e in wl.exits] == [("exit1", 1), ("final", 3)]


def test_exit_rates_follow_the_order_of_exits(tmp_path):
    path = exit_model(tmp_path, [("r1", "e_early"), ("r2", "e_mid")])
    wl = load_onnx(path, exits=["e_mid", "e_early"], exit_rates=[0.2, 0.3, 0.5])
    assert [(e.name, e.position, e.rate) for e in wl.exits] == [
        ("e_early", 0, 0.3), ("e_mid", 1, 0.2), ("final", 3, 0.5)]


def test_two_exits_at_same_position(tmp_path):
    path = exit_model(tmp_path, [("r2", "ea"), ("r2", "eb")])
    with pytest.raises(FluidError, match=r"'ea' and 'eb' both tap backbone layer 'c2'"):
        load_onnx(path, exits=["ea", "eb"])


def test_exit_on_backbone_tensor_rejected(tmp_path):
    with pytest.raises(FluidError, match=r"exit 'r2' has no GEMM layer of its own"):
        load_onnx(exit_model(tmp_path, [("r2", "exit1")]), exits=["r2"])


def test_exit_sharing_no_backbone_layer(tmp_path):
    with pytest.raises(FluidError, match=r"exit 'e_in' shares no GEMM layer with the backbone"):
        load_onnx(exit_model(tmp_path, [("x", "e_in")]), exits=["e_in"])


def test_external_weight_data(tmp_path):
    # every tensor saved beside the model (as for models over 2 GB), the Reshape target included
    g = GraphBuilder()
    h = g.conv("c", "x", 3, 4, 3)                                            # [1, 4, 6, 6]
    g.inits.append(numpy_helper.from_array(np.array([1, 144], np.int64), "flat_shape"))
    h = g.node("Reshape", [h, "flat_shape"], "flat")
    g.node("Gemm", [h, g.weight("fc.w", 144, 10)], "y", name="fc")
    model = onnx.load(g.save(tmp_path, "inline.onnx", [image_input(shape=(1, 3, 8, 8))], {"y": 2}))
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").stat().st_size > 0
    wl = load_onnx(tmp_path / "ext.onnx")
    got = [(ly.name, ly.kind, ly.R, ly.P, ly.C) for ly in wl.backbone]
    assert got == [("c", "conv", 36, 27, 4), ("fc", "fc", 1, 144, 10)]


# ---------------------------------------------------------------- errors


def test_unknown_exit_name(tmp_path):
    path = exit_model(tmp_path, [("r2", "exit1")])
    with pytest.raises(FluidError, match=r"exits\.onnx: unknown exit 'nope'.*'exit1', 'logits'"):
        load_onnx(path, exits=["nope"])


@pytest.mark.parametrize("rates", [[1.0], [0.2, 0.3, 0.5]])
def test_wrong_number_of_exit_rates(tmp_path, rates):
    path = exit_model(tmp_path, [("r2", "exit1")])
    with pytest.raises(FluidError, match=rf"exit_rates needs 2 values .* got {len(rates)}"):
        load_onnx(path, exits=["exit1"], exit_rates=rates)


def test_exit_rates_must_sum_to_one(tmp_path):
    with pytest.raises(FluidError, match="exit_rates must be >= 0 and sum to 1"):
        load_onnx(exit_model(tmp_path, [("r2", "exit1")]), exits=["exit1"], exit_rates=[0.5, 0.6])


def test_unsupported_lstm(tmp_path):
    g = GraphBuilder()
    g.nodes.append(helper.make_node("LSTM", ["x", g.weight("W", 1, 32, 4), g.weight("R", 1, 32, 8)],
                                    ["y"], name="lstm_1", hidden_size=8))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 4])
    path = g.save(tmp_path, "rnn.onnx", [x], {"y": 4})
    with pytest.raises(FluidError) as err:
        load_onnx(path)
    assert str(err.value) == (f"{path}: unsupported op LSTM (node 'lstm_1'); "
                              "supported GEMM ops: Conv, Gemm, MatMul")


def test_unsupported_conv_transpose(tmp_path):
    g = GraphBuilder()
    h = g.conv("c1", "x", 3, 4, 3)
    g.node("ConvTranspose", [h, g.weight("wt", 4, 2, 2, 2)], "up", name="deconv", strides=[2, 2])
    path = g.save(tmp_path, "up.onnx", [image_input(shape=(1, 3, 8, 8))], {"up": 4})
    with pytest.raises(FluidError, match=r"up\.onnx: unsupported op ConvTranspose \(node 'deconv'\)"):
        load_onnx(path)


def test_unsupported_3d_conv(tmp_path):
    g = GraphBuilder()
    g.node("Conv", ["x", g.weight("w", 4, 3, 3, 3, 3)], "y", name="conv3d")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8, 8])
    with pytest.raises(FluidError, match=r"unsupported op Conv with 3 spatial dims \(node 'conv3d'\)"):
        load_onnx(g.save(tmp_path, "vol.onnx", [x], {"y": 5}))


def test_matmul_of_two_activations(tmp_path):
    g = GraphBuilder()
    g.node("MatMul", ["x", "x"], "y", name="attn")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8])
    with pytest.raises(FluidError, match=r"node 'attn': MatMul of two activations is not supported"):
        load_onnx(g.save(tmp_path, "att.onnx", [x], {"y": 3}))


def test_garbage_file(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x00\xff this is not a protobuf \x13\x37" * 4)
    with pytest.raises(FluidError, match=r"junk\.onnx: not a readable ONNX model") as err:
        load_onnx(path)
    assert "\n" not in str(err.value)


def test_invalid_model_is_one_line(tmp_path):
    # a Conv whose weight is neither an input nor produced by any node
    node = helper.make_node("Conv", ["x", "ghost"], ["y"], name="c")
    graph = helper.make_graph([node], "g", [image_input(shape=(1, 3, 8, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)
    with pytest.raises(FluidError, match=r"bad\.onnx: invalid ONNX model \(.*ghost") as err:
        load_onnx(path)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(FluidError, match=r"nowhere\.onnx: no such file"):
        load_onnx(tmp_path / "nowhere.onnx")


def test_missing_onnx_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    with pytest.raises(FluidError, match=r"pip install 'fluidnpu\[onnx\]'"):
        load_onnx(tmp_path / "any.onnx")
