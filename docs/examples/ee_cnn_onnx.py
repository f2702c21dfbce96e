"""Write a small two-exit CNN as ONNX, to try `fluidnpu dse` on an ONNX model.

    python docs/examples/ee_cnn_onnx.py ee_cnn.onnx
    fluidnpu dse --model ee_cnn.onnx --board zcu104 --exits exit1_logits --exit-rates 0.4,0.6

Random weights: the DSE only needs shapes. Built with onnx.helper so nothing is downloaded.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.05, name)


def build() -> onnx.ModelProto:
    nodes, inits = [], []

    def conv(name: str, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        inits.append(_weight(f"{name}.w", cout, cin, k, k))
        nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.y"], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"{name}.y"], [f"{name}.a"], name=f"{name}.relu"))
        return f"{name}.a"

    def classifier(name: str, x: str, cin: int, out: str) -> None:
        nodes.append(helper.make_node("GlobalAveragePool", [x], [f"{name}.gap"], name=f"{name}.gap"))
        nodes.append(helper.make_node("Flatten", [f"{name}.gap"], [f"{name}.flat"], name=f"{name}.flatten"))
        inits.append(_weight(f"{name}.w", 10, cin))
        nodes.append(helper.make_node("Gemm", [f"{name}.flat", f"{name}.w"], [out], name=name, transB=1))

    x = conv("conv1", "image", 3, 32, 3)
    x = conv("conv2", x, 32, 64, 3, stride=2)
    e = conv("exit1.conv", x, 64, 64, 3, stride=2)
    classifier("exit1.fc", e, 64, "exit1_logits")
    x = conv("conv3", x, 64, 128, 3, stride=2)
    x = conv("conv4", x, 128, 128, 3)
    classifier("fc", x, 128, "logits")
    graph = helper.make_graph(
        nodes, "ee_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("exit1_logits", TensorProto.FLOAT, ["N", 10]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "ee_cnn.onnx"
    onnx.save(build(), path)
    print(f"wrote {path}")
