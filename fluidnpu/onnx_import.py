"""Import an ONNX model as a GEMM workload (backbone layers plus early exits).

The rest of fluidnpu only sees a `Workload`; this module is the bridge from a
model file. It keeps the rules simple and explicit so a user can predict what
the NPU will be asked to run:

* `Conv` (2-D), `Gemm` and `MatMul` with a constant weight become `Layer`s.
  Their spatial sizes come from ONNX shape inference, so the input size must
  be static (only the batch dim may be symbolic).
* Ops in `PASSTHROUGH_OPS` (activations, normalisation, pooling, shape
  plumbing) are done by the NPU's post-processing or by the host; they add no
  layer but still carry the data dependencies used to split exits. Any other
  op is rejected by name, because silently dropping it would make the MAC and
  latency numbers wrong.
* Batch rule: the batch dim is dim 0 of the first (non-initializer) graph
  input. A `Gemm` whose row count is that batch dim (or 1) is one fully-
  connected layer with R = 1 per sample. A `MatMul` input [d0, .., M, K] gives
  R = product of its leading dims d0..M, leaving out d0 when it equals the
  batch dim and either the rank is >= 3 or d0 is symbolic (a dim_param can
  only be the batch). So [N, 49, 512] x [512, 10] has R = 49, and a rank-2
  [8, 512] with a static batch of 8 stays R = 8 (ambiguous; export with
  batch 1 or a symbolic batch to get R = 1).
* Exits: the user names the node or graph output that produces each exit
  classifier's output. The final output is the graph output not named as an
  exit (the last one if several remain). Backbone = GEMM layers that feed the
  final output; an exit's head = GEMM layers that feed the exit but not the
  final output; its position = the last backbone layer that feeds it. The
  final exit is called "final", as in the built-in zoo.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fluidnpu.errors import FluidError
from fluidnpu.workload import Exit, Layer, Workload

if TYPE_CHECKING:  # onnx is an optional dependency, imported lazily at run time
    import onnx

GEMM_OPS = ("Conv", "Gemm", "MatMul")

#: Ops that become no layer: the NPU's post-processing unit or the host runs them.
PASSTHROUGH_OPS = frozenset({
    # element-wise activations (post-processing unit)
    "Relu", "Clip", "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Softplus", "Gelu", "Erf",
    # normalisation and element-wise arithmetic (folded into scale/bias or done on the host)
    "BatchNormalization", "LayerNormalization", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt",
    "Max", "Min", "Sum", "QuantizeLinear", "DequantizeLinear",
    # pooling and reductions
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean",
    # layout and shape plumbing
    "Concat", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity",
    "Dropout", "Constant", "Shape", "Gather", "Pad", "Resize", "Split", "Slice", "Cast",
    # classifier outputs
    "Softmax", "LogSoftmax",
})

_ONNX_DOMAINS = ("", "ai.onnx")
_SUPPORTED_HINT = "supported GEMM ops: Conv, Gemm, MatMul"
FINAL_EXIT = "final"  # the final exit's name, as in the built-in zoo
_MISSING_ONNX = "ONNX import needs the 'onnx' package: pip install 'fluidnpu[onnx]'"

Dim = int | str | None
"""A tensor dim: its size, its dim_param name when symbolic, or None when unknown."""
Shape = tuple[Dim, ...]


def load_onnx(
    path: str | os.PathLike,
    exits: Sequence[str] = (),
    exit_rates: Sequence[float] | None = None,
    name: str | None = None,
) -> Workload:
    """Read an ONNX file and lower it to a `Workload`.

    `exits` names the nodes or graph outputs that produce the early-exit
    classifiers' outputs (a single string is taken as one name). `exit_rates`
    gives the fraction of samples leaving at each of them, in the order of
    `exits`, plus one last value for the final exit; by default every exit,
    the final one included, gets the same rate. The workload is named after
    the file stem unless `name` is given. Every problem with the file or the
    arguments raises `FluidError` with a one-line message starting with the
    path.
    """
    onnx = _require_onnx()
    label = os.fspath(path)
    exit_names = (exits,) if isinstance(exits, str) else tuple(exits)
    try:
        model = _read_model(onnx, label)
        return _to_workload(model.graph, label, exit_names, exit_rates,
                            name if name is not None else Path(label).stem)
    except FluidError as exc:
        raise FluidError(f"{label}: {exc}") from None


# ---------------------------------------------------------------- reading


def _require_onnx() -> Any:
    """Import onnx only when needed: the core package must run without it (e.g. on a Zynq)."""
    try:
        import onnx
        import onnx.checker
        import onnx.shape_inference
    except ImportError:
        raise FluidError(_MISSING_ONNX) from None
    return onnx


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """Squash an exception text into one bounded line, as FluidError promises."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_model(onnx: Any, path: str) -> onnx.ModelProto:
    """Load, validate and shape-infer the model, turning every failure into a FluidError.

    External weight data is not loaded (only initializer dims are needed, and
    this keeps models over 2 GB within what inference accepts), except integer
    tensors, which shape inference may need as Reshape/Slice shapes. The
    checker gets the path so that it finds external files next to the model.
    """
    if not os.path.exists(path):
        raise FluidError("a symbolic link loop or a broken link" if os.path.islink(path) else "no such file")
    if os.path.isdir(path):
        raise FluidError("is a directory, not an ONNX file")
    if os.path.getsize(path) == 0:
        raise FluidError("is empty")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError, ...
        raise FluidError(f"not a readable ONNX model ({_one_line(exc)})") from exc
    try:
        onnx.checker.check_model(path)
    except Exception as exc:
        raise FluidError(f"invalid ONNX model ({_one_line(exc)})") from exc
    try:
        _load_external_int_tensors(onnx, model, os.path.dirname(os.path.abspath(path)))
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise FluidError(f"ONNX shape inference failed ({_one_line(exc)})") from exc


def _load_external_int_tensors(onnx: Any, model: onnx.ModelProto, base_dir: str) -> None:
    """Pull in externally stored integer initializers: small, and they can drive shapes."""
    from onnx import external_data_helper as ext

    ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    for tensor in model.graph.initializer:
        if ext.uses_external_data(tensor) and tensor.data_type in ints:
            ext.load_external_data_for_tensor(tensor, base_dir)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


# ---------------------------------------------------------------- graph facts


@dataclass
class _GraphInfo:
    """What lowering needs to know about tensors, gathered once per graph."""

    shapes: dict[str, Shape]
    constants: set[str]  # tensor names whose value is fixed at export time (weights)
    input_name: str
    batch: Dim


def _dim(d: Any) -> Dim:
    kind = d.WhichOneof("value")
    if kind == "dim_value":
        return int(d.dim_value)
    if kind == "dim_param":
        return d.dim_param or None
    return None


def _collect_shapes(graph: onnx.GraphProto) -> dict[str, Shape]:
    """Shapes of every tensor: inferred value_info, graph inputs/outputs and initializers."""
    shapes: dict[str, Shape] = {}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        tensor_type = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tensor_type is not None and tensor_type.HasField("shape"):
            shapes[vi.name] = tuple(_dim(d) for d in tensor_type.shape.dim)
    for init in graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    for sparse in graph.sparse_initializer:
        shapes[sparse.values.name] = tuple(int(d) for d in sparse.dims)
    return shapes


def _graph_info(graph: onnx.GraphProto) -> _GraphInfo:
    """Find the activation input (graph inputs that are initializers are weights) and its batch dim."""
    constants = {init.name for init in graph.initializer}
    constants |= {sparse.values.name for sparse in graph.sparse_initializer}
    activations = [vi.name for vi in graph.input if vi.name not in constants]
    if not activations:
        raise FluidError("the graph has no activation input")
    shapes = _collect_shapes(graph)
    first = activations[0]
    if first not in shapes:
        raise FluidError(f"graph input {first!r} has no shape")
    in_shape = shapes[first]
    return _GraphInfo(shapes=shapes, constants=constants, input_name=first,
                      batch=in_shape[0] if in_shape else None)


def _input_shape(info: _GraphInfo) -> tuple[int, ...]:
    """The first graph input's shape without its batch dim; those dims must be static."""
    rest = info.shapes[info.input_name][1:]
    if not all(isinstance(d, int) for d in rest):
        raise FluidError(f"graph input {info.input_name!r} has shape {_fmt(info.shapes[info.input_name])}; "
                         "only the batch dim may be dynamic, export with a fixed input size")
    return tuple(rest)  # type: ignore[arg-type]


def _fmt(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    from onnx import helper

    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        out[attr.name] = value.decode() if isinstance(value, bytes) else value
    return out


# ---------------------------------------------------------------- lowering


@dataclass
class _Lowered:
    """All GEMM layers in graph order and, per tensor, a bitmask of the layers feeding it."""

    layers: list[Layer]
    feeds: dict[str, int]


def _lower_graph(graph: onnx.GraphProto, info: _GraphInfo) -> _Lowered:
    """Walk the nodes (the checker guarantees topological order) and lower GEMM ops.

    A node whose inputs are all constants is constant-folded at export time:
    it adds no layer and its outputs count as constants, so a weight passed
    through Transpose, Cast or DequantizeLinear is still a weight.
    """
    layers: list[Layer] = []
    feeds: dict[str, int] = {}
    used: set[str] = set()
    for index, node in enumerate(graph.node):
        op = node.op_type
        label = node.name or f"{op}_{index}"
        _check_supported(node, label)
        inputs = [i for i in node.input if i]
        mask = 0
        for tensor in inputs:
            mask |= feeds.get(tensor, 0)
        if all(t in info.constants for t in inputs):
            info.constants.update(o for o in node.output if o)
        elif op in GEMM_OPS:
            layers.append(_LOWERERS[op](node, _unique(label, used), info))
            mask |= 1 << (len(layers) - 1)
        for out in node.output:
            if out:
                feeds[out] = mask
    return _Lowered(layers, feeds)


def _check_supported(node: onnx.NodeProto, label: str) -> None:
    op = node.op_type if node.domain in _ONNX_DOMAINS else f"{node.domain}.{node.op_type}"
    if node.domain not in _ONNX_DOMAINS or (op not in GEMM_OPS and op not in PASSTHROUGH_OPS):
        raise FluidError(f"unsupported op {op} (node {label!r}); {_SUPPORTED_HINT}")


def _unique(name: str, used: set[str]) -> str:
    """Layer names must be unique in a Workload; suffix _2, _3, ... on a clash."""
    candidate, k = name, 2
    while candidate in used:
        candidate, k = f"{name}_{k}", k + 1
    used.add(candidate)
    return candidate


def _shape(info: _GraphInfo, tensor: str, what: str, node_label: str) -> Shape:
    if tensor not in info.shapes:
        raise FluidError(f"node {node_label!r}: shape of {what} {tensor!r} is unknown after shape inference")
    return info.shapes[tensor]


def _static(shape: Shape, what: str, node_label: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in shape):
        raise FluidError(f"node {node_label!r}: {what} shape {_fmt(shape)} is not static; "
                         "export the model with a fixed input size")
    return shape  # type: ignore[return-value]


def _is_batch(dim: Dim, batch: Dim) -> bool:
    return dim is not None and dim == batch


def _prod(dims: Sequence[int]) -> int:
    return math.prod(dims) if dims else 1


def _lower_conv(node: onnx.NodeProto, name: str, info: _GraphInfo) -> Layer:
    """A 2-D Conv: channels from the weight, spatial size from the inferred input shape."""
    x, w = node.input[0], node.input[1]
    if w not in info.constants:
        raise FluidError(f"node {name!r}: Conv weight {w!r} is not a constant; the NPU needs fixed weights")
    wshape = _static(_shape(info, w, "weight", name), "weight", name)
    if len(wshape) != 4:
        raise FluidError(f"unsupported op Conv with {len(wshape) - 2} spatial dims (node {name!r}); "
                         "only 2-D Conv is supported")
    attrs = _attrs(node)
    group = int(attrs.get("group", 1))
    kernel = tuple(attrs.get("kernel_shape", wshape[2:]))
    stride = tuple(attrs.get("strides", (1, 1)))
    dilation = tuple(attrs.get("dilations", (1, 1)))
    xshape = _shape(info, x, "input", name)
    in_hw = _static(xshape[2:], "input spatial", name)
    pads = _conv_pads(attrs, in_hw, kernel, stride, dilation, name)
    layer = Layer.conv(name, in_ch=wshape[1] * group, out_ch=wshape[0], in_hw=in_hw, kernel=kernel,
                       stride=stride, padding=pads, groups=group, dilation=dilation)
    inferred = info.shapes.get(node.output[0], ())[2:]
    if len(inferred) == 2 and all(isinstance(d, int) for d in inferred) and tuple(inferred) != layer.out_hw:
        raise FluidError(f"node {name!r}: computed output {layer.out_hw} but ONNX infers {tuple(inferred)}")
    return layer


def _conv_pads(attrs: dict[str, Any], in_hw: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
               dilation: Sequence[int], name: str) -> tuple[int, int, int, int]:
    """Padding as (top, left, bottom, right), resolving auto_pad the way the ONNX spec does."""
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0)))
        if len(pads) != 4:
            raise FluidError(f"node {name!r}: Conv pads must have 4 values, got {list(pads)}")
        return pads  # type: ignore[return-value]
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise FluidError(f"node {name!r}: unknown auto_pad {auto_pad!r}")
    begins, ends = [], []
    for size, k, s, d in zip(in_hw, kernel, stride, dilation):
        out = -(-size // s)  # ceil: SAME keeps ceil(in / stride) outputs
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        begins.append(begin)
        ends.append(end)
    return (begins[0], begins[1], ends[0], ends[1])


def _lower_gemm(node: onnx.NodeProto, name: str, info: _GraphInfo) -> Layer:
    """Gemm (Y = A' B' + C): B must be a weight; rows that are the batch dim give R = 1."""
    a, b = node.input[0], node.input[1]
    if b not in info.constants:
        raise FluidError(f"node {name!r}: Gemm weight B {b!r} must be an initializer or Constant")
    attrs = _attrs(node)
    bshape = _static(_shape(info, b, "weight", name), "weight", name)
    k, n = (bshape[1], bshape[0]) if attrs.get("transB", 0) else (bshape[0], bshape[1])
    ashape = _shape(info, a, "input", name)
    rows = ashape[1] if attrs.get("transA", 0) else ashape[0]
    if rows == 1 or _is_batch(rows, info.batch):
        return Layer.fc(name, k, n)
    if not isinstance(rows, int):
        raise FluidError(f"node {name!r}: Gemm input shape {_fmt(ashape)} has a dynamic row count "
                         "that is not the batch dim")
    return Layer.matmul(name, rows, k, n)


def _lower_matmul(node: onnx.NodeProto, name: str, info: _GraphInfo) -> Layer:
    """MatMul with one constant operand: x @ W, or W @ x (lowered as its transpose x^T W^T)."""
    a, b = node.input[0], node.input[1]
    a_const, b_const = a in info.constants, b in info.constants
    if not (a_const or b_const):
        raise FluidError(f"node {name!r}: MatMul of two activations is not supported "
                         "(one operand must be a constant weight)")
    if b_const:
        weight = _matrix(_static(_shape(info, b, "weight", name), "weight", name), name)
        if len(weight) == 1:  # [K] vector: one output column
            weight = (weight[0], 1)
        inner, cols = weight
        act = _shape(info, a, "input", name)
        lead = list(act[:-1])
    else:
        weight = _matrix(_static(_shape(info, a, "weight", name), "weight", name), name)
        if len(weight) == 1:
            weight = (1, weight[0])
        cols, inner = weight
        act = _shape(info, b, "input", name)
        lead = list(act[:-2]) + list(act[-1:]) if len(act) >= 2 else []
    if lead and _is_batch(lead[0], info.batch) and (len(act) >= 3 or isinstance(lead[0], str)):
        lead = lead[1:]
    return Layer.matmul(name, _prod(_static(tuple(lead), "input row", name)), inner, cols)


def _matrix(shape: tuple[int, ...], name: str) -> tuple[int, ...]:
    """A MatMul weight as a 1-D or 2-D shape; leading 1s only broadcast and are dropped."""
    dims = list(shape)
    while len(dims) > 2 and dims[0] == 1:
        dims.pop(0)
    if len(dims) > 2:
        raise FluidError(f"node {name!r}: batched MatMul weight of shape {list(shape)} is not supported")
    return tuple(dims)


_LOWERERS: dict[str, Callable[[Any, str, _GraphInfo], Layer]] = {
    "Conv": _lower_conv, "Gemm": _lower_gemm, "MatMul": _lower_matmul,
}


# ---------------------------------------------------------------- exits


def _resolve_exit(graph: onnx.GraphProto, name: str) -> str:
    """The tensor an exit name refers to: a graph output, a node (its first output) or a tensor."""
    outputs = [o.name for o in graph.output]
    if name in outputs:
        return name
    nodes = [n for n in graph.node if n.name == name]
    if len(nodes) > 1:
        raise FluidError(f"exit {name!r} is ambiguous: {len(nodes)} nodes have that name")
    if nodes:
        return nodes[0].output[0]
    if any(name in n.output for n in graph.node):
        return name
    shown = ", ".join(repr(o) for o in outputs[:8]) + (", ..." if len(outputs) > 8 else "")
    raise FluidError(f"unknown exit {name!r}: no node or graph output has that name (graph outputs: {shown})")


def _check_distinct_tensors(exits: dict[str, str]) -> None:
    """Two names for one tensor (e.g. a node and its output) would be one exit counted twice."""
    seen: dict[str, str] = {}
    for exit_name, tensor in exits.items():
        if tensor in seen:
            raise FluidError(f"exits {seen[tensor]!r} and {exit_name!r} name the same tensor {tensor!r}")
        seen[tensor] = exit_name


def _final_output(graph: onnx.GraphProto, exit_tensors: set[str]) -> str:
    remaining = [o.name for o in graph.output if o.name not in exit_tensors]
    if not remaining:
        raise FluidError("every graph output is named as an exit; one must remain as the final output")
    return remaining[-1]


def _rates(exit_rates: Sequence[float] | None, count: int) -> list[float]:
    """Per-exit rates in the user's order (final exit last), uniform when not given."""
    if exit_rates is None:
        return [1.0 / count] * count
    try:
        rates = [float(r) for r in exit_rates]
    except (TypeError, ValueError):
        raise FluidError(f"exit_rates must be numbers, got {exit_rates!r}") from None
    if len(rates) != count:
        raise FluidError(f"exit_rates needs {count} values (one per exit plus one for the final exit), "
                         f"got {len(rates)}")
    if any(not math.isfinite(r) or r < 0 for r in rates) or abs(sum(rates) - 1.0) > 1e-6:
        raise FluidError(f"exit_rates must be >= 0 and sum to 1, got {rates}")
    return rates


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _build_exits(lowered: _Lowered, backbone_mask: int, exits: dict[str, str],
                 rates: list[float], final: str) -> list[Exit]:
    """Split each exit's layers into backbone (tap position) and head, and check they fit together."""
    layers = lowered.layers
    backbone = _bits(backbone_mask)
    position = {layer_index: pos for pos, layer_index in enumerate(backbone)}
    last = len(backbone) - 1
    built: list[Exit] = []
    heads_seen: dict[int, str] = {}
    for (exit_name, tensor), rate in zip(exits.items(), rates):
        feeds = lowered.feeds.get(tensor, 0)
        shared, head = feeds & backbone_mask, feeds & ~backbone_mask
        if not shared:
            raise FluidError(f"exit {exit_name!r} shares no GEMM layer with the backbone of {final!r}")
        if not head:
            raise FluidError(f"exit {exit_name!r} has no GEMM layer of its own; name the exit "
                             "classifier's output, not a backbone tensor")
        for layer_index in _bits(head):
            if layer_index in heads_seen:
                raise FluidError(f"layer {layers[layer_index].name!r} feeds both exits "
                                 f"{heads_seen[layer_index]!r} and {exit_name!r}; exit heads must be disjoint")
            heads_seen[layer_index] = exit_name
        tap = position[shared.bit_length() - 1]
        if tap == last:
            raise FluidError(f"exit {exit_name!r} taps the last backbone layer "
                             f"{layers[shared.bit_length() - 1].name!r}, where the final exit sits")
        built.append(Exit(exit_name, tap, tuple(layers[i] for i in _bits(head)), rate))
    built.sort(key=lambda e: e.position)
    for before, after in zip(built, built[1:]):
        if before.position == after.position:
            raise FluidError(f"exits {before.name!r} and {after.name!r} both tap backbone layer "
                             f"{layers[backbone[before.position]].name!r}; "
                             "each exit needs its own position")
    built.append(Exit(FINAL_EXIT, last, (), rates[-1]))
    return built


def _to_workload(graph: onnx.GraphProto, source: str, exit_names: tuple[str, ...],
                 exit_rates: Sequence[float] | None, name: str) -> Workload:
    if len(set(exit_names)) != len(exit_names):
        raise FluidError(f"exit names must be unique, got {list(exit_names)}")
    if FINAL_EXIT in exit_names:
        raise FluidError(f"exit name {FINAL_EXIT!r} is reserved for the final exit")
    rates = _rates(exit_rates, len(exit_names) + 1)
    info = _graph_info(graph)
    input_shape = _input_shape(info)
    lowered = _lower_graph(graph, info)
    exits = {e: _resolve_exit(graph, e) for e in exit_names}
    _check_distinct_tensors(exits)
    final = _final_output(graph, set(exits.values()))
    backbone_mask = lowered.feeds.get(final, 0)
    if not backbone_mask:
        raise FluidError(f"final output {final!r} depends on no Conv, Gemm or MatMul layer")
    backbone = tuple(lowered.layers[i] for i in _bits(backbone_mask))
    return Workload(name=name, backbone=backbone,
                    exits=tuple(_build_exits(lowered, backbone_mask, exits, rates, final)),
                    input_shape=input_shape, source=source)
