"""Workloads: a DNN lowered to a sequence of GEMMs, plus its early exits.

Every stage of fluidnpu (DSE, RTL generator, driver, scheduler) sees a network
only as this: an ordered backbone of GEMM layers and a list of exits. A layer
keeps its original convolution parameters so that later stages can generate
im2col addresses without going back to the model file.

GEMM view of a layer (per convolution group):
    R = output pixels (out_h * out_w; 1 for a fully-connected layer)
    P = kh * kw * in_ch / groups   (reduction length)
    C = out_ch / groups            (output channels)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluidnpu.errors import FluidError

LAYER_KINDS = ("conv", "fc", "matmul")


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


def _pads(v: int | Sequence[int]) -> tuple[int, int, int, int]:
    """Padding as (top, left, bottom, right), ONNX order."""
    if isinstance(v, int):
        return (v, v, v, v)
    v = tuple(int(x) for x in v)
    if len(v) == 2:
        return (v[0], v[1], v[0], v[1])
    if len(v) == 4:
        return v  # type: ignore[return-value]
    raise FluidError(f"padding must have 1, 2 or 4 values, got {v}")


@dataclass(frozen=True)
class Layer:
    """One GEMM-lowered layer (conv, fully-connected or plain matmul)."""

    name: str
    kind: str
    R: int
    P: int
    C: int
    groups: int = 1
    in_ch: int = 0
    out_ch: int = 0
    in_hw: tuple[int, int] = (1, 1)
    out_hw: tuple[int, int] = (1, 1)
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise FluidError(f"layer {self.name!r}: unknown kind {self.kind!r}")
        for dim in ("R", "P", "C", "groups"):
            if getattr(self, dim) < 1:
                raise FluidError(f"layer {self.name!r}: {dim} must be >= 1, got {getattr(self, dim)}")

    @classmethod
    def conv(
        cls,
        name: str,
        in_ch: int,
        out_ch: int,
        in_hw: int | Sequence[int],
        kernel: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        groups: int = 1,
        dilation: int | Sequence[int] = 1,
    ) -> Layer:
        """A 2-D convolution; output size follows the usual floor formula."""
        ih, iw = _pair(in_hw)
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        dh, dw = _pair(dilation)
        pt, pl, pb, pr = _pads(padding)
        if in_ch % groups or out_ch % groups:
            raise FluidError(f"layer {name!r}: channels {in_ch}->{out_ch} not divisible by groups={groups}")
        oh = (ih + pt + pb - dh * (kh - 1) - 1) // sh + 1
        ow = (iw + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise FluidError(f"layer {name!r}: kernel {kh}x{kw} does not fit input {ih}x{iw}")
        return cls(
            name=name, kind="conv", R=oh * ow, P=kh * kw * in_ch // groups, C=out_ch // groups,
            groups=groups, in_ch=in_ch, out_ch=out_ch, in_hw=(ih, iw), out_hw=(oh, ow),
            kernel=(kh, kw), stride=(sh, sw), pads=(pt, pl, pb, pr), dilation=(dh, dw),
        )

    @classmethod
    def fc(cls, name: str, in_features: int, out_features: int) -> Layer:
        """A fully-connected layer: R = 1 per sample, which is why batching matters for it."""
        return cls(name=name, kind="fc", R=1, P=in_features, C=out_features,
                   in_ch=in_features, out_ch=out_features)

    @classmethod
    def matmul(cls, name: str, rows: int, inner: int, cols: int) -> Layer:
        """A plain (rows x inner) @ (inner x cols) product with constant weights."""
        return cls(name=name, kind="matmul", R=rows, P=inner, C=cols, in_ch=inner, out_ch=cols,
                   in_hw=(rows, 1), out_hw=(rows, 1))

    @property
    def macs(self) -> int:
        """Multiply-accumulates for one sample."""
        return self.groups * self.R * self.P * self.C

    @property
    def weight_count(self) -> int:
        return self.groups * self.P * self.C

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "R": self.R, "P": self.P, "C": self.C,
            "groups": self.groups, "in_ch": self.in_ch, "out_ch": self.out_ch,
            "in_hw": list(self.in_hw), "out_hw": list(self.out_hw), "kernel": list(self.kernel),
            "stride": list(self.stride), "pads": list(self.pads), "dilation": list(self.dilation),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layer:
        return cls(
            name=d["name"], kind=d["kind"], R=d["R"], P=d["P"], C=d["C"], groups=d["groups"],
            in_ch=d["in_ch"], out_ch=d["out_ch"], in_hw=tuple(d["in_hw"]), out_hw=tuple(d["out_hw"]),
            kernel=tuple(d["kernel"]), stride=tuple(d["stride"]), pads=tuple(d["pads"]),
            dilation=tuple(d["dilation"]),
        )


@dataclass(frozen=True)
class Exit:
    """An exit: taps the output of backbone layer `position`, runs `head`, and
    is where a fraction `rate` of all samples leave the network.

    The final exit sits on the last backbone layer and has an empty head (the
    backbone's own classifier is its head).
    """

    name: str
    position: int
    head: tuple[Layer, ...]
    rate: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "position": self.position, "rate": self.rate,
                "head": [layer.to_dict() for layer in self.head]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Exit:
        return cls(name=d["name"], position=d["position"], rate=d["rate"],
                   head=tuple(Layer.from_dict(x) for x in d["head"]))


@dataclass(frozen=True)
class ScheduledLayer:
    """A layer in the order the NPU runs it, with the exit segment it belongs to."""

    index: int
    layer: Layer
    segment: int
    in_head: bool


@dataclass(frozen=True)
class Workload:
    """An early-exit network: backbone GEMMs in execution order plus exits."""

    name: str
    backbone: tuple[Layer, ...]
    exits: tuple[Exit, ...]
    input_shape: tuple[int, ...] = field(default=())
    source: str = ""
    # the network's own first layer where backbone[0] is it folded (fluidnpu/lowering.py)
    stem: Layer | None = None

    def __post_init__(self) -> None:
        if not self.backbone:
            raise FluidError(f"workload {self.name!r} has no GEMM layers")
        if not self.exits:
            raise FluidError(f"workload {self.name!r} has no exits (the final exit is required)")
        last = len(self.backbone) - 1
        positions = [e.position for e in self.exits]
        if positions != sorted(set(positions)):
            raise FluidError(f"workload {self.name!r}: exit positions must be strictly increasing, got {positions}")
        if positions[0] < 0 or positions[-1] != last:
            raise FluidError(f"workload {self.name!r}: the last exit must sit on the last backbone layer ({last})")
        if self.exits[-1].head:
            raise FluidError(f"workload {self.name!r}: the final exit has no head of its own")
        if any(e.rate < 0 for e in self.exits) or abs(sum(e.rate for e in self.exits) - 1.0) > 1e-6:
            raise FluidError(f"workload {self.name!r}: exit rates must be >= 0 and sum to 1, got "
                             f"{[e.rate for e in self.exits]}")
        names = [layer.name for layer in self.layers()]
        if len(set(names)) != len(names):
            raise FluidError(f"workload {self.name!r}: layer names must be unique")
        if self.stem is not None:
            from fluidnpu.lowering import fold_rows

            try:
                folded = fold_rows(self.stem)
            except FluidError:
                folded = None
            if folded != self.backbone[0]:
                raise FluidError(f"workload {self.name!r}: its stem {self.stem.name!r} does not fold into its first "
                                 f"layer {self.backbone[0].name!r} (fluidnpu/lowering.py)")

    def layers(self) -> list[Layer]:
        """All GEMM layers in execution order (backbone segments interleaved with exit heads)."""
        return [s.layer for s in self.schedule()]

    def schedule(self) -> list[ScheduledLayer]:
        """Execution order: segment i = backbone layers up to exit i, then exit i's head.

        This order indexes the Fluid Batching Control Block and the latency tables.
        """
        out: list[ScheduledLayer] = []
        start = 0
        for seg, ex in enumerate(self.exits):
            for layer in self.backbone[start:ex.position + 1]:
                out.append(ScheduledLayer(len(out), layer, seg, False))
            for layer in ex.head:
                out.append(ScheduledLayer(len(out), layer, seg, True))
            start = ex.position + 1
        return out

    def segments(self) -> Iterator[list[ScheduledLayer]]:
        sched = self.schedule()
        for seg in range(len(self.exits)):
            yield [s for s in sched if s.segment == seg]

    def without_exits(self) -> Workload:
        """The backbone alone (every sample runs to the end), as the paper's NPU ablation uses."""
        return Workload(f"{self.name} backbone", self.backbone,
                        (Exit("final", len(self.backbone) - 1, (), 1.0),), self.input_shape, self.source, self.stem)

    @property
    def backbone_macs(self) -> int:
        return sum(layer.macs for layer in self.backbone)

    @property
    def total_macs(self) -> int:
        """MACs of every layer, exit heads included (what a sample that goes to the end computes)."""
        return sum(layer.macs for layer in self.layers())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "input_shape": list(self.input_shape),
                "backbone": [layer.to_dict() for layer in self.backbone],
                "exits": [e.to_dict() for e in self.exits], **({"stem": self.stem.to_dict()} if self.stem else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        return cls(name=d["name"], source=d.get("source", ""), input_shape=tuple(d.get("input_shape", ())),
                   backbone=tuple(Layer.from_dict(x) for x in d["backbone"]),
                   exits=tuple(Exit.from_dict(x) for x in d["exits"]),
                   stem=Layer.from_dict(d["stem"]) if d.get("stem") else None)


def equidistant_positions(backbone: Sequence[Layer], n: int, allowed: Sequence[int]) -> list[int]:
    """Pick n exit positions splitting the backbone's MACs into n+1 equal parts.

    Only indices in `allowed` (e.g. ends of residual blocks or Inception modules)
    may carry an exit; each target k/(n+1) of the cumulative MACs goes to the
    nearest allowed index, keeping positions strictly increasing.
    """
    cum: list[int] = []
    total = 0
    for layer in backbone:
        total += layer.macs
        cum.append(total)
    candidates = sorted(i for i in set(allowed) if 0 <= i < len(backbone) - 1)
    if len(candidates) < n:
        raise FluidError(f"only {len(candidates)} places can take an exit, {n} requested")
    chosen: list[int] = []
    for k in range(1, n + 1):
        target = total * k / (n + 1)
        pool = [i for i in candidates if not chosen or i > chosen[-1]]
        # leave room for the exits still to place
        pool = pool[: len(pool) - (n - k)] if n - k else pool
        chosen.append(min(pool, key=lambda i: abs(cum[i] - target)))
    return chosen


def exit_head(prefix: str, in_ch: int, in_hw: int | Sequence[int], num_classes: int,
              width: int = 128) -> tuple[Layer, ...]:
    """The intermediate classifier used by the built-in zoo: three GEMM layers.

    2x2 average pool (not a GEMM), 1x1 conv in_ch->width, 3x3 stride-2 conv
    width->width, global average pool (not a GEMM), FC width->num_classes.
    Three GEMMs per head is what the paper's FBCB register counts imply
    (see docs/interpretations.md); the shape keeps each head near 1% of the backbone.
    """
    ih, iw = _pair(in_hw)
    pooled = (max(1, ih // 2), max(1, iw // 2))
    c1 = Layer.conv(f"{prefix}.conv1", in_ch, width, pooled, 1)
    c2 = Layer.conv(f"{prefix}.conv2", width, width, c1.out_hw, 3, stride=2, padding=1)
    fc = Layer.fc(f"{prefix}.fc", width, num_classes)
    return (c1, c2, fc)
