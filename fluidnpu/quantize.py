"""16-bit fixed-point quantisation of a float early-exit network for the NPU.

The NPU computes `y = clamp(round((bias + x @ w) >> shift), int16)` with int16
activations and weights, int32 bias and a 32-bit accumulator
(docs/hw-architecture.md, "Numbers"). We map a float network onto that with
power-of-two scales, one per tensor:

* every activation tensor t (the network input and each layer's output) is
  int16 with `f_t` fractional bits: x_float ~= x_int / 2**f_t;
* each layer's weights are int16 with `f_w` fractional bits (per layer), its
  bias int32 in the accumulator's format, `f_in + f_w` fractional bits;
* the layer's requantisation shift is `f_in + f_w - f_out` (0..31).

How the formats are chosen (docs/runtime.md):

* `f_w`: the largest number of fractional bits that keeps max|w| in int16.
* `f_out`: the largest that keeps the calibration set's largest |output| in
  int16 (times `headroom`); lowered if that would need a negative shift.
* then the accumulators must fit: the calibration set's largest
  |bias + x @ w| (computed exactly, in the integer domain) times
  `acc_headroom` must stay below 2**31, else `f_w` drops a bit at a time
  (and the shift with it). The worst-case bound sum|w|*max|x| + |b| is
  reported too, beside it.

Saturation (an int16 clamp in the post-processing, or on the input) is not an
error: it is counted per tensor by `QuantizedNetwork.run_reference` /
`count_saturation` and reported. Weights or biases that cannot be represented
at all are errors: non-finite values, a format outside FRAC_RANGE, or (with a
fixed `weight_frac_bits`) a weight beyond int16 in that format.

numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.hw.descriptor import LayerDescriptor
from fluidnpu.hw.reference import INT16_MAX, INT16_MIN, im2col, layer_reference
from fluidnpu.workload import Layer, Workload

FRAC_RANGE = (-16, 30)     # fractional bits a tensor's format may have
ACC_LIMIT = 1 << 31


# ---------------------------------------------------------------- host operations between NPU layers
HOST_OPS = ("gap", "fold_rows")


def host_op(op: str | None, x: np.ndarray, stem: Layer | None = None) -> np.ndarray:
    """A host operation on a batch (n, h, w, c): float, or int16 (exact, round half up, same format).

    "gap": global average pooling to (n, 1, 1, c).
    "fold_rows": the network input folded for the first layer, `stem` (fluidnpu/lowering.py).
    """
    if op is None:
        return x
    if op == "fold_rows":
        from fluidnpu.lowering import fold_input

        if stem is None:
            raise FluidError("fold_rows: the workload has no folded stem")
        return fold_input(stem, x)
    if op == "gap":
        if x.dtype == np.int16:
            n = x.shape[1] * x.shape[2]
            s = x.astype(np.int64).sum(axis=(1, 2), keepdims=True)
            return np.floor_divide(2 * s + n, 2 * n).astype(np.int16)
        return x.mean(axis=(1, 2), keepdims=True)
    raise FluidError(f"unknown host operation {op!r}")


# ---------------------------------------------------------------- float network
@dataclass(frozen=True)
class FloatLayer:
    """A float GEMM layer: weights P x C with P ordered (ky, kx, cin) as the NPU reads them."""

    layer: Layer
    weight: np.ndarray
    bias: np.ndarray
    relu: bool
    pre: str | None = None        # host operation on the layer's input (HOST_OPS), e.g. "gap"

    def __post_init__(self) -> None:
        L = self.layer
        if self.pre is not None and self.pre not in HOST_OPS:
            raise FluidError(f"layer {L.name!r}: unknown host operation {self.pre!r}; known: {', '.join(HOST_OPS)}")
        if self.weight.shape != (L.P, L.C):
            raise FluidError(f"layer {L.name!r}: weights must be {L.P}x{L.C} (P x C), got {self.weight.shape}")
        if self.bias.shape != (L.C,):
            raise FluidError(f"layer {L.name!r}: bias must have {L.C} values, got {self.bias.shape}")


def layer_sources(workload: Workload) -> list[int]:
    """For each layer in execution order, the index of the layer whose output it reads (-1: the input).

    Within a segment, a layer reads the previous one (the exit head reads the
    segment's last backbone layer); a segment's first layer reads the previous
    segment's last backbone layer, not its exit head.
    """
    sched = workload.schedule()
    src: list[int] = []
    last_backbone = -1
    prev = -1
    for s in sched:
        if not s.in_head and (s.index == 0 or sched[s.index - 1].segment != s.segment):
            src.append(last_backbone)
        else:
            src.append(prev)
        if not s.in_head:
            last_backbone = s.index
        prev = s.index
    return src


def exit_layers(workload: Workload) -> list[int]:
    """Index (execution order) of the layer that produces each exit's logits."""
    out = []
    for seg in workload.segments():
        out.append(seg[-1].index)
    return out


def geometry(layer: Layer, index: int, relu: bool = False, shift: int = 0) -> LayerDescriptor:
    return LayerDescriptor.from_layer(layer, index, relu=relu, shift=shift)


def _as_input(x: np.ndarray, g: LayerDescriptor, name: str) -> np.ndarray:
    n = x.shape[0]
    if int(np.prod(x.shape[1:])) != g.in_h * g.in_w * g.cin:
        raise FluidError(f"layer {name!r} expects {g.in_h}x{g.in_w}x{g.cin} inputs, got {x.shape[1:]}")
    return x.reshape(n, g.in_h, g.in_w, g.cin)


@dataclass(frozen=True)
class FloatNetwork:
    """A trained float early-exit network: layers in execution order (`Workload.schedule()`)."""

    workload: Workload
    layers: tuple[FloatLayer, ...]
    input_hwc: tuple[int, int, int]

    def __post_init__(self) -> None:
        names = [s.layer.name for s in self.workload.schedule()]
        if [fl.layer.name for fl in self.layers] != names:
            raise FluidError("float layers must follow the workload's execution order")
        for fl in self.layers:
            if not (np.all(np.isfinite(fl.weight)) and np.all(np.isfinite(fl.bias))):
                raise FluidError(f"layer {fl.layer.name!r}: weights or bias contain NaN or Inf")

    @property
    def sources(self) -> list[int]:
        return layer_sources(self.workload)

    @property
    def exit_layers(self) -> list[int]:
        return exit_layers(self.workload)

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's float output (n, oh, ow, C) for inputs (n, H, W, C)."""
        x = np.asarray(x, dtype=np.float64)
        outs: list[np.ndarray] = []
        for i, (fl, src) in enumerate(zip(self.layers, self.sources)):
            inp = host_op(fl.pre, x if src < 0 else outs[src], self.workload.stem)
            g = geometry(fl.layer, i)
            xin = _as_input(inp, g, fl.layer.name)
            cols = im2col(xin, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.out_h, g.out_w)
            y = cols @ fl.weight + fl.bias
            if fl.relu:
                y = np.maximum(y, 0.0)
            outs.append(y.reshape(len(x), g.out_h, g.out_w, g.cout))
        return outs

    def exit_logits(self, x: np.ndarray) -> list[np.ndarray]:
        outs = self.forward(x)
        return [outs[i].reshape(len(x), -1) for i in self.exit_layers]


# ---------------------------------------------------------------- quantised network
def frac_bits_for(max_abs: float, limit: int = INT16_MAX) -> int:
    """Largest f with max_abs * 2**f <= limit (FRAC_RANGE[1] for an all-zero tensor)."""
    if max_abs <= 0:
        return FRAC_RANGE[1]
    return min(FRAC_RANGE[1], math.floor(math.log2(limit / max_abs)))


def to_fixed(x: np.ndarray, frac: int) -> tuple[np.ndarray, int]:
    """Round-to-nearest int16 with saturation; returns (values, how many saturated)."""
    v = np.rint(np.asarray(x, dtype=np.float64) * 2.0 ** frac)
    sat = int(np.count_nonzero((v > INT16_MAX) | (v < INT16_MIN)))
    return np.clip(v, INT16_MIN, INT16_MAX).astype(np.int16), sat


def from_fixed(x: np.ndarray, frac: int) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) * 2.0 ** -frac


@dataclass(frozen=True)
class QLayer:
    """One quantised layer: the NPU's operands plus the formats they are in."""

    name: str
    layer: Layer
    geometry: LayerDescriptor     # relu and shift set, addresses not
    weights: np.ndarray           # int16 P x C
    bias: np.ndarray              # int32 C
    source: int
    frac_in: int
    frac_w: int
    frac_out: int
    acc_max: int                  # largest |accumulator| seen on the calibration set
    acc_bound: int                # worst case sum|w| * max|x| + max|b| over any int16 input the layer can see
    pre: str | None = None        # host operation on the input (HOST_OPS)

    @property
    def shift(self) -> int:
        return self.geometry.shift

    def params(self):
        from fluidnpu.host_driver.memory_plan import LayerParams

        return LayerParams(self.geometry, self.weights, self.bias)


@dataclass
class SaturationReport:
    """int16 clamps seen per tensor: the input and every layer's output."""

    names: list[str]
    saturated: list[int]
    total: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {n: {"saturated": s, "values": t, "rate": s / t if t else 0.0}
                for n, s, t in zip(self.names, self.saturated, self.total)}

    @property
    def any(self) -> bool:
        return any(self.saturated)

    def add(self, other: SaturationReport) -> None:
        self.saturated = [a + b for a, b in zip(self.saturated, other.saturated)]
        self.total = [a + b for a, b in zip(self.total, other.total)]


@dataclass
class QuantizedNetwork:
    """A network in the NPU's numbers; `run_reference` is its bit-exact golden model."""

    workload: Workload
    input_hwc: tuple[int, int, int]
    input_frac: int
    layers: list[QLayer]
    calibration_saturation: SaturationReport | None = field(default=None, repr=False)

    @property
    def exit_layers(self) -> list[int]:
        return exit_layers(self.workload)

    @property
    def sources(self) -> list[int]:
        return [q.source for q in self.layers]

    def check_input(self, x: Any) -> np.ndarray:
        """Float samples (n, H, W, C) (or one (H, W, C)) as float64; clear errors for anything else."""
        if not isinstance(x, np.ndarray):
            raise FluidError(f"inputs must be a numpy array, got {type(x).__name__}")
        if x.dtype.kind not in "fiu" or x.dtype == np.bool_:
            raise FluidError(f"inputs must be a real numeric array, got dtype {x.dtype}")
        if x.ndim == 3:
            x = x[None]
        if x.ndim != 4 or tuple(x.shape[1:]) != tuple(self.input_hwc):
            raise FluidError(f"inputs must have shape (n, {', '.join(map(str, self.input_hwc))}) (HWC), "
                             f"got {tuple(x.shape)}")
        x = x.astype(np.float64)
        if not np.all(np.isfinite(x)):
            bad = int(np.count_nonzero(~np.isfinite(x)))
            raise FluidError(f"inputs contain {bad} NaN/Inf value(s)")
        return x

    def quantize_input(self, x: Any) -> tuple[np.ndarray, int]:
        """(int16 inputs, how many values saturated)."""
        return to_fixed(self.check_input(x), self.input_frac)

    def logits(self, index: int, y: np.ndarray) -> np.ndarray:
        """Float logits of exit `index` from its layer's int16 output."""
        li = self.exit_layers[index]
        return from_fixed(y.reshape(len(y), -1), self.layers[li].frac_out)

    def run_reference(self, xq: np.ndarray) -> tuple[list[np.ndarray], SaturationReport]:
        """Every layer's int16 output for int16 inputs, exactly as the NPU computes them."""
        outs: list[np.ndarray] = []
        for q in self.layers:
            inp = host_op(q.pre, xq if q.source < 0 else outs[q.source], self.workload.stem)
            outs.append(layer_reference(_as_input(inp, q.geometry, q.name), q.geometry, q.weights, q.bias))
        return outs, count_saturation(self, xq, outs)

    def exit_logits_reference(self, xq: np.ndarray) -> list[np.ndarray]:
        outs, _ = self.run_reference(xq)
        return [self.logits(e, outs[li]) for e, li in enumerate(self.exit_layers)]

    def summary(self) -> list[dict[str, Any]]:
        return [{"layer": q.name, "frac_in": q.frac_in, "frac_w": q.frac_w, "frac_out": q.frac_out,
                 "shift": q.shift, "relu": q.geometry.relu, "acc_max": q.acc_max, "acc_bound": q.acc_bound,
                 "acc_headroom_bits": round(math.log2(ACC_LIMIT / max(q.acc_max, 1)), 2)} for q in self.layers]


def count_saturation(qnet: QuantizedNetwork, xq: np.ndarray, outs: Sequence[np.ndarray]) -> SaturationReport:
    """Values at the int16 limits, per layer output (a ReLU layer can only saturate high).

    A value exactly at the limit is counted as saturated: the hardware's clamp
    and an exact result of 32767 are indistinguishable from its output.
    """
    names = ["input"] + [q.name for q in qnet.layers]
    sat = [int(np.count_nonzero((xq == INT16_MAX) | (xq == INT16_MIN)))]
    tot = [int(xq.size)]
    for y in outs:
        sat.append(int(np.count_nonzero((y == INT16_MAX) | (y == INT16_MIN))))
        tot.append(int(y.size))
    return SaturationReport(names, sat, tot)


def quantize(net: FloatNetwork, calibration: np.ndarray, headroom: float = 1.0, acc_headroom: float = 2.0,
             weight_frac_bits: int | None = None, input_frac: int | None = None) -> QuantizedNetwork:
    """Quantise `net` with formats chosen on `calibration` inputs (n, H, W, C) float.

    `weight_frac_bits` fixes every layer's weight format (Q(15-f).f); a weight
    that does not fit is an error naming the layer. `input_frac` fixes the
    input format (default: from the calibration data's range).
    """
    if not headroom >= 1.0 or not acc_headroom >= 1.0:
        raise FluidError("headroom factors must be >= 1")
    cal = np.asarray(calibration, dtype=np.float64)
    if cal.ndim != 4 or tuple(cal.shape[1:]) != tuple(net.input_hwc) or len(cal) < 1:
        raise FluidError(f"calibration inputs must have shape (n, {', '.join(map(str, net.input_hwc))}), "
                         f"got {cal.shape}")
    if not np.all(np.isfinite(cal)):
        raise FluidError("calibration inputs contain NaN/Inf")
    float_outs = net.forward(cal)
    f_in0 = frac_bits_for(float(np.max(np.abs(cal))) * headroom) if input_frac is None else int(input_frac)
    _check_frac(f_in0, "the network input")
    xq, _ = to_fixed(cal, f_in0)

    fracs: list[int] = []
    qouts: list[np.ndarray] = []
    qlayers: list[QLayer] = []
    sources = net.sources
    for i, fl in enumerate(net.layers):
        name = fl.layer.name
        src = sources[i]
        f_in = f_in0 if src < 0 else fracs[src]
        x_in = host_op(fl.pre, xq if src < 0 else qouts[src], net.workload.stem)
        max_w = float(np.max(np.abs(fl.weight))) if fl.weight.size else 0.0
        if weight_frac_bits is None:
            f_w = frac_bits_for(max_w)
        else:
            f_w = int(weight_frac_bits)
            if max_w * 2.0 ** f_w > INT16_MAX + 0.5:
                lim = INT16_MAX * 2.0 ** -f_w
                raise FluidError(f"layer {name!r}: weight {max_w:g} overflows 16-bit fixed point Q{15 - f_w}.{f_w} "
                                 f"(largest {lim:g}); use a smaller weight format or per-layer scaling")
        _check_frac(f_w, f"weights of layer {name!r} (max |w| = {max_w:g})")
        f_out = frac_bits_for(float(np.max(np.abs(float_outs[i]))) * headroom)
        g0 = geometry(fl.layer, i, fl.relu)
        xin = _as_input(x_in, g0, name).astype(np.int64)
        cols = im2col(xin, g0.kh, g0.kw, g0.sh, g0.sw, g0.ph, g0.pw, g0.out_h, g0.out_w)
        x_absmax = int(np.max(np.abs(xin))) if xin.size else 0
        while True:
            f_out = min(f_out, f_in + f_w)                 # no negative shift
            shift = f_in + f_w - f_out
            if shift > 31:
                f_w -= shift - 31
                continue
            _check_frac(f_w, f"weights of layer {name!r} (max |w| = {max_w:g})")
            _check_frac(f_out, f"the output of layer {name!r}")
            wq = np.rint(fl.weight * 2.0 ** f_w)
            bq = np.rint(fl.bias * 2.0 ** (f_in + f_w))
            if np.any(np.abs(wq) > INT16_MAX):
                raise FluidError(f"layer {name!r}: weights overflow 16-bit fixed point")
            acc = cols @ wq.astype(np.int64) + bq.astype(np.int64) if cols.size else np.zeros(1, np.int64)
            acc_max = int(np.max(np.abs(acc)))
            if acc_max * acc_headroom < ACC_LIMIT and np.all(np.abs(bq) < ACC_LIMIT):
                break
            if weight_frac_bits is not None and f_w <= FRAC_RANGE[0]:
                break
            f_w -= 1
            if f_w < FRAC_RANGE[0]:
                raise FluidError(f"layer {name!r}: its accumulators overflow 32 bits at any weight format "
                                 f"(largest |accumulator| {acc_max}); the weights overflow 16-bit fixed point")
        if acc_max >= ACC_LIMIT or np.any(np.abs(bq) >= ACC_LIMIT):
            raise FluidError(f"layer {name!r}: the accumulator or bias overflows 32 bits in Q{15 - f_w}.{f_w}")
        wq16 = wq.astype(np.int16)
        bq32 = bq.astype(np.int32)
        bound = int(np.max(np.sum(np.abs(wq16.astype(np.int64)), axis=0)) * max(x_absmax, 1)
                    + int(np.max(np.abs(bq32.astype(np.int64))))) if wq16.size else 0
        g = replace(g0, shift=shift)
        y = layer_reference(xin, g, wq16, bq32)
        fracs.append(f_out)
        qouts.append(y)
        qlayers.append(QLayer(name, fl.layer, g, wq16, bq32, src, f_in, f_w, f_out, acc_max, bound, fl.pre))
    qnet = QuantizedNetwork(net.workload, tuple(net.input_hwc), f_in0, qlayers)
    qnet.calibration_saturation = count_saturation(qnet, xq, qouts)
    return qnet


def _check_frac(f: int, what: str) -> None:
    lo, hi = FRAC_RANGE
    if not lo <= f <= hi:
        raise FluidError(f"{what} overflows 16-bit fixed point: it would need 2^{-f} per LSB "
                         f"(formats with {lo}..{hi} fractional bits are supported)")


# ---------------------------------------------------------------- exit decisions
def softmax_confidence(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top-1 class, top-1 softmax probability) per row."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p.argmax(axis=1), p.max(axis=1)


def check_tau(tau: float) -> float:
    try:
        t = float(tau)
    except (TypeError, ValueError):
        raise FluidError(f"the exit threshold tau must be a number in (0, 1], got {tau!r}") from None
    if not 0.0 < t <= 1.0:
        raise FluidError(f"the exit threshold tau must be in (0, 1], got {tau!r}")
    return t


def early_exit_eval(exit_logits: Sequence[np.ndarray], labels: np.ndarray, tau: float) -> dict[str, Any]:
    """Per-exit accuracy (every sample classified at that exit) and, with threshold tau, the exit
    each sample takes, the exit rates, per-exit accuracy of the samples that exit there, and overall accuracy."""
    tau = check_tau(tau)
    labels = np.asarray(labels)
    n = len(labels)
    preds, confs = zip(*(softmax_confidence(z) for z in exit_logits))
    taken = np.full(n, len(exit_logits) - 1)
    left = np.ones(n, dtype=bool)
    for e in range(len(exit_logits) - 1):
        go = left & (confs[e] >= tau)
        taken[go] = e
        left &= ~go
    final_pred = np.choose(taken, np.stack(preds)) if n else np.zeros(0, int)
    per_exit = []
    for e in range(len(exit_logits)):
        m = taken == e
        per_exit.append({"accuracy_all": float(np.mean(preds[e] == labels)) if n else 0.0,
                         "exit_rate": float(np.mean(m)) if n else 0.0,
                         "accuracy_exited": float(np.mean(preds[e][m] == labels[m])) if m.any() else None})
    return {"tau": tau, "samples": n, "accuracy": float(np.mean(final_pred == labels)) if n else 0.0,
            "exits": per_exit, "taken": taken, "pred": final_pred}
