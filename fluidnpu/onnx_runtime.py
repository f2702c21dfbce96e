"""A user's own trained multi-exit model from ONNX, with its weights, for the runtime.

`fluidnpu.onnx_import.load_onnx` lowers the graph to a `Workload` (shapes and
exits, what the DSE needs); `load_onnx_network` adds the numbers: each GEMM
layer's weights and bias from the initializers, in the NPU's layout (P
ordered (ky, kx, cin), HWC activations), a ReLU that directly follows a layer
folded into its post-processing, and global average pooling before a layer
run on the host between two NPU subnets. The result is a
`fluidnpu.quantize.FloatNetwork`, ready for `quantize` and `NetworkRuntime`.

What the runtime can run (anything else is refused with one line naming the
node): Conv (2-D, group 1, no dilation), Gemm (transA = 0, alpha = beta = 1)
and MatMul with constant weights; between two GEMM layers only Relu (right
after the first), GlobalAveragePool, Flatten/Reshape to 2-D, Identity and
Dropout; the data flow must be the workload's (a layer reads the previous
layer of its exit segment; a segment's first layer the previous segment's
last backbone layer). Inputs are HWC: transpose NCHW images with
`x.transpose(0, 2, 3, 1)`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.lowering import fold_network
from fluidnpu.quantize import FloatLayer, FloatNetwork, layer_sources

_SKIP = ("Flatten", "Reshape", "Identity", "Dropout")


def load_onnx_network(path: str | os.PathLike, exits: Sequence[str] = (),
                      exit_rates: Sequence[float] | None = None) -> FloatNetwork:
    """The ONNX model at `path` as a float network (exits named as for `fluidnpu dse --exits`), its stem folded
    where it folds (fluidnpu/lowering.py), as `fluidnpu.design.load_model` lowers its workload."""
    from fluidnpu.onnx_import import GEMM_OPS, _require_onnx, _unique, load_onnx

    label = os.fspath(path)
    wl = load_onnx(path, exits=exits, exit_rates=exit_rates)
    onnx = _require_onnx()
    from onnx import helper, numpy_helper

    try:
        model = onnx.shape_inference.infer_shapes(onnx.load(label))
    except Exception as exc:  # noqa: BLE001 - load_onnx already accepted the file; be safe anyway
        raise FluidError(f"{label}: cannot read the weights ({exc})") from None
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producer: dict[str, Any] = {}
    consumers: dict[str, list[Any]] = {}
    gemm_of: dict[int, str] = {}          # id(node) -> layer name, as load_onnx names them
    used: set[str] = set()
    for index, node in enumerate(g.node):
        for o in node.output:
            producer[o] = node
        for i in node.input:
            consumers.setdefault(i, []).append(node)
        if node.op_type in GEMM_OPS and not all(i in inits for i in node.input if i):
            gemm_of[id(node)] = _unique(node.name or f"{node.op_type}_{index}", used)
    by_name = {name: node for node in g.node for name in [gemm_of.get(id(node))] if name}
    input_name = next(vi.name for vi in g.input if vi.name not in inits)
    sched = wl.schedule()
    index_of = {s.layer.name: s.index for s in sched}
    sources = layer_sources(wl)

    def attrs(node: Any) -> dict[str, Any]:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def fail(msg: str) -> FluidError:
        return FluidError(f"{label}: {msg}")

    layers = []
    for s in sched:
        L = s.layer
        node = by_name.get(L.name)
        if node is None:
            raise fail(f"no node for layer {L.name!r}")
        a = attrs(node)
        if node.op_type == "Conv":
            if L.groups != 1 or tuple(L.dilation) != (1, 1):
                raise fail(f"node {L.name!r}: grouped or dilated Conv is not supported by the runtime")
            kernel = inits[node.input[1]].astype(np.float64)           # (cout, cin, kh, kw)
            weight = kernel.transpose(2, 3, 1, 0).reshape(L.P, L.C)
            bias = inits[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else np.zeros(L.C)
        elif node.op_type == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise fail(f"node {L.name!r}: Gemm with transA or alpha/beta != 1 is not supported by the runtime")
            w = inits.get(node.input[1])
            if w is None:
                raise fail(f"node {L.name!r}: the Gemm weight is not an initializer")
            weight = (w.T if a.get("transB", 0) else w).astype(np.float64)
            bias = np.broadcast_to(inits[node.input[2]], (L.C,)).astype(np.float64) \
                if len(node.input) > 2 and node.input[2] else np.zeros(L.C)
        else:  # MatMul
            w = inits.get(node.input[1])
            if w is None or L.R != 1:
                raise fail(f"node {L.name!r}: only MatMul by a constant weight with one row per sample is supported")
            weight, bias = w.astype(np.float64), np.zeros(L.C)
        # ReLU folded into the post-processing
        outs = consumers.get(node.output[0], [])
        relu = len(outs) == 1 and outs[0].op_type == "Relu"
        # walk back from the data input to the producing layer, collecting host operations
        t = node.input[0]
        pre, flatten_from = None, None
        while True:
            if t == input_name:
                src = -1
                break
            p = producer.get(t)
            if p is None:
                raise fail(f"node {L.name!r}: cannot trace its input {t!r}")
            if id(p) in gemm_of:
                src = index_of[gemm_of[id(p)]]
                break
            if p.op_type == "Relu":
                q = producer.get(p.input[0])
                if q is None or id(q) not in gemm_of or len(consumers.get(q.output[0], [])) != 1:
                    raise fail(f"node {p.name!r}: a Relu the runtime can run directly follows a Conv/Gemm/MatMul")
            elif p.op_type == "GlobalAveragePool":
                if pre is not None:
                    raise fail(f"node {p.name!r}: one host operation per layer input")
                pre = "gap"
            elif p.op_type in _SKIP:
                if p.op_type in ("Flatten", "Reshape"):
                    flatten_from = p.input[0]
            else:
                raise fail(f"op {p.op_type} (node {p.name!r}) before layer {L.name!r} is not run by the runtime; "
                           f"between layers it runs Relu, GlobalAveragePool, Flatten/Reshape")
            t = p.input[0]
        if src != sources[s.index]:
            want = "the input" if sources[s.index] < 0 else repr(sched[sources[s.index]].layer.name)
            raise fail(f"layer {L.name!r} reads {'the input' if src < 0 else repr(sched[src].layer.name)}, "
                       f"the runtime expects {want} (a chain per exit segment)")
        if node.op_type != "Conv" and pre is None and flatten_from is not None and src >= 0:
            # ONNX flattens NCHW as (c, h, w); the NPU's tensors are HWC: reorder the FC's input rows
            shp = _shape(model, flatten_from)
            if shp is not None and len(shp) == 4 and shp[2] * shp[3] > 1:
                c, h, w_ = shp[1], shp[2], shp[3]
                perm = np.arange(c * h * w_).reshape(c, h, w_).transpose(1, 2, 0).reshape(-1)
                weight = weight[perm]
        layers.append(FloatLayer(L, np.ascontiguousarray(weight), np.ascontiguousarray(bias), relu, pre))
    shape = tuple(wl.input_shape)
    if len(shape) != 3:
        raise fail(f"the runtime needs an image input [N, C, H, W], got {list(shape)}")
    c, h, w_ = shape
    return fold_network(FloatNetwork(wl, tuple(layers), (h, w_, c)))


def _shape(model: Any, name: str) -> tuple[int, ...] | None:
    for vi in (*model.graph.value_info, *model.graph.input, *model.graph.output):
        if vi.name == name:
            dims = vi.type.tensor_type.shape.dim
            return tuple(d.dim_value if d.HasField("dim_value") else 0 for d in dims)
    return None
