"""Where a subnet's tensors, weights and descriptors live in the NPU's memory.

The host owns the NPU's off-chip memory: it places each layer's weights and
bias, one activation tensor per layer boundary (Bmax sample slots each, so
backfilled samples have a slot), and the subnet's descriptor table, then
starts the NPU on that table. The same plan feeds every device (RTL
simulation, the bit-accurate model, a real board), so it is pure numpy.

On a device, plan into a buffer: `plan_subnet(layers, bmax,
buffer=device.alloc(subnet_nbytes(layers, bmax)))` places the image at the
buffer's bus address, uploads it, and from then on `write_tensor` /
`read_tensor` go through the buffer (with its cache syncs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.hw.descriptor import DESC_STRIDE_BYTES, LayerDescriptor, pack_table

ALIGN = 64


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class LayerParams:
    """A quantised layer: its geometry (a descriptor without addresses) and its numbers."""

    geometry: LayerDescriptor
    weights: np.ndarray          # int16, P x C, P ordered (ky, kx, cin)
    bias: np.ndarray             # int32, C

    def __post_init__(self) -> None:
        g = self.geometry
        if self.weights.shape != (g.P, g.cout) or self.weights.dtype != np.int16:
            raise FluidError(f"layer {g.layer}: weights must be int16 {g.P}x{g.cout}, "
                             f"got {self.weights.dtype} {self.weights.shape}")
        if self.bias.shape != (g.cout,) or self.bias.dtype != np.int32:
            raise FluidError(f"layer {g.layer}: bias must be int32 of {g.cout}, "
                             f"got {self.bias.dtype} {self.bias.shape}")


@dataclass
class Tensor:
    """An activation tensor: Bmax HWC int16 sample slots."""

    addr: int
    shape: tuple[int, int, int]   # (h, w, c)
    sample_stride: int

    @property
    def sample_bytes(self) -> int:
        h, w, c = self.shape
        return h * w * c * 2


@dataclass
class SubnetImage:
    """A memory image: bytes from `base`, with the addresses a device needs."""

    base: int
    memory: bytearray
    desc_base: int
    descriptors: list[LayerDescriptor]
    tensors: list[Tensor]          # tensors[0] is the input, tensors[i + 1] layer i's output
    bmax: int
    extra: dict[str, int] = field(default_factory=dict)
    buffer: Any | None = None     # the device Buffer (host_driver/device.py) holding the image, if bound

    @property
    def desc_count(self) -> int:
        return len(self.descriptors)

    @property
    def nbytes(self) -> int:
        return len(self.memory)

    def bind(self, buffer: Any, upload: bool = True) -> SubnetImage:
        """Tie the image to a device buffer at its base address and copy it there."""
        if buffer.phys_addr != self.base:
            raise FluidError(f"image planned at {self.base:#x} cannot live in a buffer at {buffer.phys_addr:#x}; "
                             "plan it with base=buffer.phys_addr")
        if buffer.nbytes < len(self.memory):
            from fluidnpu.host_driver.device import BufferTooSmall
            raise BufferTooSmall(f"subnet image needs {len(self.memory)} bytes; the buffer at "
                                 f"{buffer.phys_addr:#x} has {buffer.nbytes}")
        self.buffer = buffer
        if upload:
            self.upload()
        return self

    def upload(self) -> None:
        """Copy the whole host image into the bound buffer and flush it to the device."""
        self.buffer.write(0, bytes(self.memory))
        self.buffer.sync_to_device()

    def download(self) -> None:
        """Refresh the host image from the bound buffer (what the NPU wrote)."""
        self.buffer.sync_from_device()
        self.memory[:] = self.buffer.read(0, len(self.memory))

    def _range(self, addr: int, n: int) -> int:
        off = addr - self.base
        if off < 0 or off + n > len(self.memory):
            from fluidnpu.host_driver.device import BufferTooSmall
            raise BufferTooSmall(f"{n} bytes at {addr:#x} lie outside the subnet image "
                                 f"[{self.base:#x}, {self.base + len(self.memory):#x})")
        return off

    def write(self, addr: int, data: bytes) -> None:
        off = self._range(addr, len(data))
        self.memory[off:off + len(data)] = data
        if self.buffer is not None:
            self.buffer.write(off, data)

    def read(self, addr: int, n: int) -> bytes:
        off = self._range(addr, n)
        if self.buffer is not None:
            return self.buffer.read(off, n)
        return bytes(self.memory[off:off + n])

    def write_input(self, x: np.ndarray, slots: list[int] | None = None) -> None:
        """Samples (n, h, w, c) int16 into the input tensor's slots (default 0..n-1)."""
        self.write_tensor(0, x, slots)

    def write_tensor(self, index: int, x: np.ndarray, slots: list[int] | None = None) -> None:
        t = self.tensors[index]
        if x.ndim != 4 or tuple(x.shape[1:]) != t.shape:
            raise FluidError(f"tensor {index} expects samples of shape {t.shape}, got {tuple(x.shape[1:])}")
        if x.dtype != np.int16:
            raise FluidError(f"tensor {index} expects int16 samples, got {x.dtype}")
        slots = list(range(len(x))) if slots is None else slots
        if len(slots) != len(x):
            raise FluidError(f"{len(x)} samples for {len(slots)} slots")
        for s, sample in zip(slots, x):
            if not 0 <= s < self.bmax:
                raise FluidError(f"sample slot {s} outside 0..{self.bmax - 1} (the image has Bmax = {self.bmax} slots)")
            self.write(t.addr + s * t.sample_stride, sample.astype("<i2").tobytes())
        if self.buffer is not None:
            self.buffer.sync_to_device()

    def read_tensor(self, index: int, n: int, slots: list[int] | None = None) -> np.ndarray:
        t = self.tensors[index]
        slots = list(range(n)) if slots is None else slots
        for s in slots:
            if not 0 <= s < self.bmax:
                raise FluidError(f"sample slot {s} outside 0..{self.bmax - 1} (the image has Bmax = {self.bmax} slots)")
        if self.buffer is not None:
            self.buffer.sync_from_device()
        return np.stack([np.frombuffer(self.read(t.addr + s * t.sample_stride, t.sample_bytes), dtype="<i2")
                         .reshape(t.shape) for s in slots]).astype(np.int16)


def read_ahead_bytes(cout: int, bmax: int) -> tuple[int, int]:
    """Bytes the NPU may read before a layer's weights and before its bias: (weights, bias).

    The control unit gives each of the g <= Bmax sample groups of a packed pass (C <= the
    PE count) its own copy of a weight row and of the bias by reading them once per group q,
    q*C words (int32 for the bias) early, so that the row lands in group q's columns
    (docs/hw-architecture.md, "EngineCore"). What those reads fetch before the row is never
    written into the core, but it must be memory the plan owns: a guard of (Bmax - 1) * C
    words before the weights and (Bmax - 1) * C int32 before the bias."""
    return 2 * (bmax - 1) * cout, 4 * (bmax - 1) * cout


def subnet_nbytes(layers: list[LayerParams], bmax: int) -> int:
    """Bytes of device memory `plan_subnet(layers, bmax)` needs (from a 64-byte aligned base)."""
    return len(plan_subnet(layers, bmax, base=0).memory)


def plan_subnet(layers: list[LayerParams], bmax: int, base: int = 0x1000, buffer: Any | None = None) -> SubnetImage:
    """Lay out a chain of layers (each reads the previous one's output) for up to Bmax samples.

    With `buffer` (a device Buffer), the image is placed at the buffer's bus
    address (`base` is ignored), checked to fit, and uploaded.
    """
    if buffer is not None:
        base = buffer.phys_addr
    if base % ALIGN:
        raise FluidError(f"subnet base {base:#x} must be {ALIGN}-byte aligned")
    if not layers:
        raise FluidError("a subnet needs at least one layer")
    g0 = layers[0].geometry
    shapes = [(g0.in_h, g0.in_w, g0.cin)]
    for i, lp in enumerate(layers):
        g = lp.geometry
        flattens = (g.in_h, g.in_w) == (1, 1) and g.cin == int(np.prod(shapes[-1]))   # FC after a conv
        if (g.in_h, g.in_w, g.cin) != shapes[-1] and not flattens:
            raise FluidError(f"layer {i} expects input {(g.in_h, g.in_w, g.cin)}, "
                             f"the previous layer gives {shapes[-1]}")
        shapes.append((g.out_h, g.out_w, g.cout))

    addr = base
    desc_base = addr
    addr = _align(addr + DESC_STRIDE_BYTES * len(layers))
    tensors = []
    for shp in shapes:
        stride = _align(int(np.prod(shp)) * 2)
        tensors.append(Tensor(addr=addr, shape=shp, sample_stride=stride))
        addr = _align(addr + stride * bmax)
    w_addr, b_addr = [], []
    for lp in layers:
        w_guard, b_guard = read_ahead_bytes(lp.geometry.cout, bmax)
        addr = _align(addr + w_guard)
        w_addr.append(addr)
        addr = _align(addr + lp.weights.nbytes + b_guard)
        b_addr.append(addr)
        addr = _align(addr + lp.bias.nbytes)

    descs = []
    for i, lp in enumerate(layers):
        descs.append(replace(
            lp.geometry, src_base=tensors[i].addr, src_sample_stride=tensors[i].sample_stride,
            dst_base=tensors[i + 1].addr, dst_sample_stride=tensors[i + 1].sample_stride,
            weight_base=w_addr[i], bias_base=b_addr[i]))
    image = SubnetImage(base=base, memory=bytearray(addr - base), desc_base=desc_base,
                        descriptors=descs, tensors=tensors, bmax=bmax)
    image.write(desc_base, pack_table(descs))
    for lp, wa, ba in zip(layers, w_addr, b_addr):
        image.write(wa, lp.weights.astype("<i2").tobytes())
        image.write(ba, lp.bias.astype("<i4").tobytes())
    if buffer is not None:
        image.bind(buffer)
    return image
