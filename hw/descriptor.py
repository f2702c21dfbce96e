"""Layer descriptors: how the host tells the NPU what one layer is.

A subnet (the layers between two exits) is a table of descriptors in off-chip
memory; one START runs all of them. The format is defined here, once, in pure
Python (no amaranth import) because the host driver packs descriptors on the
board's ARM and the RTL's sequencer (hw/sequencer.py) decodes the same words.

The host precomputes every product the hardware would otherwise need a
multiplier for (byte strides of the im2col walk), so the sequencer only adds.
Convolution inputs are read in im2col order straight from the previous
layer's HWC output: P is ordered (ky, kx, cin), a row is one output pixel.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import Any

from fluidnpu.errors import FluidError

DESC_WORDS = 24                 # 32-bit words the sequencer reads
DESC_STRIDE_BYTES = 128         # descriptors are 128-byte aligned in the table
WORD_BYTES = 2                  # int16 activations and weights

# (name, word, lsb, width, signed): the packed layout. Everything not listed is zero.
LAYOUT: tuple[tuple[str, int, int, int, bool], ...] = (
    ("layer", 0, 0, 16, False),          # FBCB row of this layer
    ("relu", 0, 16, 1, False),
    ("shift", 0, 24, 5, False),          # requantisation right shift
    ("npix", 1, 0, 24, False),           # R: output pixels per sample
    ("out_w", 2, 0, 16, False),
    ("out_h", 2, 16, 16, False),
    ("cin", 3, 0, 16, False),
    ("cout", 3, 16, 16, False),          # C: output channels (GEMM columns)
    ("kh", 4, 0, 8, False),
    ("kw", 4, 8, 8, False),
    ("sh", 4, 16, 8, False),
    ("sw", 4, 24, 8, False),
    ("in_h", 5, 0, 16, False),
    ("in_w", 5, 16, 16, False),
    ("ph", 6, 0, 16, False),             # top padding
    ("pw", 6, 16, 16, False),            # left padding
    ("src_base", 7, 0, 32, False),       # sample 0's input tensor (+ channel offset)
    ("src_sample_stride", 8, 0, 32, False),
    ("x_step", 9, 0, 32, True),          # bytes between horizontally adjacent output pixels' windows
    ("y_wrap", 10, 0, 32, True),         # bytes from the last pixel of an output row to the next row's first
    ("origin", 11, 0, 32, True),         # byte offset of output pixel (0,0)'s window origin (may be padding)
    ("kx_delta", 12, 0, 32, True),       # after the last channel of a kernel tap, to the next tap
    ("ky_delta", 13, 0, 32, True),       # after the last tap of a kernel row, to the next kernel row
    ("dst_base", 14, 0, 32, False),      # sample 0's output tensor (+ channel offset)
    ("dst_sample_stride", 15, 0, 32, False),
    ("dst_pix_step", 16, 0, 32, False),  # bytes between consecutive output pixels
    ("weight_base", 17, 0, 32, False),   # int16 P x C, row-major, P ordered (ky, kx, cin)
    ("bias_base", 18, 0, 32, False),     # int32 x C
    ("P", 19, 0, 24, False),             # kh*kw*cin: the GEMM's inner dimension
    ("row_words", 20, 0, 24, False),     # kw*cin: words of one kernel row of the im2col window
)
# Decoded only by an NPU built with a block input buffer (hw/input_buffer.py; NpuParams.input_buffer), so
# that the others' RTL does not carry them; used at the batch sizes whose FBCB entry marks the layer
# BUFFERED (hw/regmap.py, `encode_fbcb_entry`).
BUFFER_LAYOUT: tuple[tuple[str, int, int, int, bool], ...] = (
    ("in_row_words", 21, 0, 24, False),  # in_w * pixel pitch: words of one input row (the fill walker's step)
)


@dataclass(frozen=True)
class LayerDescriptor:
    """One GEMM layer as the hardware runs it (a 1x1 conv or FC is a 1x1 kernel).

    Geometry and memory placement are what the host decides; the packed
    strides are derived from them by `words()`.
    """

    layer: int
    in_h: int
    in_w: int
    cin: int
    out_h: int
    out_w: int
    cout: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    ph: int = 0
    pw: int = 0
    relu: bool = False
    shift: int = 0
    src_base: int = 0
    src_sample_stride: int = 0
    src_cpitch: int = 0       # words per input pixel (0: cin)
    src_coff: int = 0         # first channel read within a pixel
    dst_base: int = 0
    dst_sample_stride: int = 0
    dst_cpitch: int = 0       # words per output pixel (0: cout)
    dst_coff: int = 0
    weight_base: int = 0
    bias_base: int = 0

    @property
    def npix(self) -> int:
        return self.out_h * self.out_w

    @property
    def P(self) -> int:
        return self.kh * self.kw * self.cin

    @property
    def in_pitch(self) -> int:
        return self.src_cpitch or self.cin

    @property
    def out_pitch(self) -> int:
        return self.dst_cpitch or self.cout

    @classmethod
    def from_layer(cls, layer: Any, index: int, **placement: Any) -> LayerDescriptor:
        """Descriptor of a workload `Layer` (conv, fc or matmul) at FBCB row `index`."""
        if layer.groups != 1:
            raise FluidError(f"layer {layer.name!r}: grouped convolutions (groups={layer.groups}) "
                             "run as one descriptor per group; split the layer first")
        if tuple(layer.dilation) != (1, 1):
            raise FluidError(f"layer {layer.name!r}: dilated convolutions are not supported by the NPU")
        if layer.kind == "conv":
            (ih, iw), (oh, ow) = layer.in_hw, layer.out_hw
            (kh, kw), (sh, sw) = layer.kernel, layer.stride
            ph, pw = layer.pads[0], layer.pads[1]
            cin, cout = layer.in_ch, layer.out_ch
        else:  # fc / matmul: each output row reads one P-long input row
            ih, iw, oh, ow = layer.R, 1, layer.R, 1
            kh = kw = sh = sw = 1
            ph = pw = 0
            cin, cout = layer.P, layer.C
        return cls(layer=index, in_h=ih, in_w=iw, cin=cin, out_h=oh, out_w=ow, cout=cout,
                   kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, **placement)

    def check(self) -> None:
        """Refuse what the hardware cannot run, naming the field."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise FluidError(f"descriptor field {f.name} must be >= 0, got {v}")
        for name in ("in_h", "in_w", "cin", "out_h", "out_w", "cout", "kh", "kw", "sh", "sw"):
            if getattr(self, name) < 1:
                raise FluidError(f"descriptor field {name} must be >= 1, got {getattr(self, name)}")
        if self.in_pitch < self.src_coff + self.cin:
            raise FluidError(f"input channel slice {self.src_coff}+{self.cin} exceeds pixel pitch {self.in_pitch}")
        if self.out_pitch < self.dst_coff + self.cout:
            raise FluidError(f"output channel slice {self.dst_coff}+{self.cout} exceeds pixel pitch {self.out_pitch}")
        for name in ("src_base", "dst_base", "weight_base", "bias_base"):
            if getattr(self, name) % 2:
                raise FluidError(f"descriptor field {name} must be 2-byte aligned, got {getattr(self, name):#x}")
        if self.bias_base % 4:
            raise FluidError(f"bias_base must be 4-byte aligned, got {self.bias_base:#x}")

    def fields_packed(self) -> dict[str, int]:
        """Every packed field's value, derived strides included."""
        pitch = self.in_pitch * WORD_BYTES
        x_step = self.sw * pitch
        return {
            "layer": self.layer, "relu": int(self.relu), "shift": self.shift, "npix": self.npix,
            "out_w": self.out_w, "out_h": self.out_h, "cin": self.cin, "cout": self.cout,
            "kh": self.kh, "kw": self.kw, "sh": self.sh, "sw": self.sw,
            "in_h": self.in_h, "in_w": self.in_w, "ph": self.ph, "pw": self.pw,
            "src_base": self.src_base + self.src_coff * WORD_BYTES,
            "src_sample_stride": self.src_sample_stride,
            "x_step": x_step,
            "y_wrap": self.sh * self.in_w * pitch - (self.out_w - 1) * x_step,
            "origin": -(self.ph * self.in_w + self.pw) * pitch,
            "kx_delta": pitch - self.cin * WORD_BYTES,
            "ky_delta": (self.in_w - self.kw) * pitch,
            "dst_base": self.dst_base + self.dst_coff * WORD_BYTES,
            "dst_sample_stride": self.dst_sample_stride,
            "dst_pix_step": self.out_pitch * WORD_BYTES,
            "weight_base": self.weight_base,
            "bias_base": self.bias_base,
            "P": self.P,
            "row_words": self.kw * self.cin,
            # 0 where a row exceeds the field: no buffer half holds such a row, so the layer is never buffered
            "in_row_words": row if (row := self.in_w * self.in_pitch) < 1 << 24 else 0,
        }

    def words(self) -> list[int]:
        """The DESC_WORDS 32-bit words the sequencer reads."""
        self.check()
        out = [0] * DESC_WORDS
        values = self.fields_packed()
        for name, word, lsb, width, signed in LAYOUT + BUFFER_LAYOUT:
            v = values[name]
            lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
            if not lo <= v <= hi:
                raise FluidError(f"descriptor field {name}={v} does not fit its {width}-bit field")
            out[word] |= (v & ((1 << width) - 1)) << lsb
        return out

    def pack(self) -> bytes:
        """Little-endian bytes, padded to DESC_STRIDE_BYTES."""
        return struct.pack(f"<{DESC_WORDS}I", *self.words()).ljust(DESC_STRIDE_BYTES, b"\0")


def unpack_fields(words: list[int]) -> dict[str, int]:
    """Decode packed words back into field values (signed fields sign-extended)."""
    values = {}
    for name, word, lsb, width, signed in LAYOUT + BUFFER_LAYOUT:
        v = (words[word] >> lsb) & ((1 << width) - 1)
        if signed and v >= 1 << (width - 1):
            v -= 1 << width
        values[name] = v
    return values


def pack_table(descriptors: list[LayerDescriptor]) -> bytes:
    """A subnet's descriptor table, ready to copy to DESC_BASE."""
    return b"".join(d.pack() for d in descriptors)
