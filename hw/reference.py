"""Numpy golden model of the NPU's arithmetic (docs/hw-architecture.md, "Numbers").

The RTL accumulates in 32-bit two's complement that wraps, adds the bias on
the first weight step, and post-processes once per block:

    y = clamp((acc + (1 << (shift-1) if shift else 0)) >> shift, -32768, 32767)
    y = max(y, 0) if relu

The rounding add and the arithmetic shift are exact (no wrap): the RTL does
them in 34 bits. Everything here works on int64 arrays so that products and
sums are exact until the explicit 32-bit wrap, which is the only place the
hardware loses information. Also here: the little-endian word packing the
core's flat ports use (word i in bits [16i, 16i+16)), shared by the tests and
the host driver.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def wrap32(x: np.ndarray | int) -> np.ndarray:
    """Two's-complement wrap to int32, returned as int64 (the accumulator register's view)."""
    x = np.asarray(x, dtype=np.int64)
    return ((x + (1 << 31)) & 0xFFFF_FFFF) - (1 << 31)


def accumulate(acc: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """acc + x @ w with the accumulator's 32-bit wrap (x: rows x P int16, w: P x C int16)."""
    prod = np.asarray(x, dtype=np.int64) @ np.asarray(w, dtype=np.int64)
    return wrap32(np.asarray(acc, dtype=np.int64) + prod)


def gemm_bias(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """What the accumulators hold after a whole block: bias + x @ w, wrapped to 32 bits."""
    x = np.asarray(x, dtype=np.int64)
    return accumulate(np.broadcast_to(np.asarray(bias, dtype=np.int64), (x.shape[0], len(bias))), x, w)


def postprocess(acc: np.ndarray, shift: int, relu: bool) -> np.ndarray:
    """Round-half-up shift, saturate to int16, optional ReLU.

    `acc` may be an int32 array or unwrapped int64 sums; either way it is first
    wrapped to 32 bits, as the accumulator is.
    """
    if not 0 <= shift <= 31:
        raise ValueError(f"shift {shift} outside 0..31")
    a = wrap32(acc)
    rnd = (1 << (shift - 1)) if shift else 0
    y = np.clip((a + rnd) >> shift, INT16_MIN, INT16_MAX)
    if relu:
        y = np.maximum(y, 0)
    return y.astype(np.int16)


def block_output(x: np.ndarray, w: np.ndarray, bias: np.ndarray, shift: int, relu: bool) -> np.ndarray:
    """The staging rows of one block: postprocess(bias + x @ w)."""
    return postprocess(gemm_bias(x, w, bias), shift, relu)


def pack_words(values: Iterable[int], width: int = 16) -> int:
    """Little-endian packing of signed or unsigned words into one integer (word 0 lowest)."""
    mask = (1 << width) - 1
    out = 0
    for i, v in enumerate(values):
        out |= (int(v) & mask) << (width * i)
    return out


def unpack_words(value: int, n: int, width: int = 16, signed: bool = True) -> np.ndarray:
    """Inverse of pack_words: n words of `width` bits, sign-extended when `signed`."""
    mask = (1 << width) - 1
    words = [(int(value) >> (width * i)) & mask for i in range(n)]
    if signed:
        words = [w - (1 << width) if w >> (width - 1) else w for w in words]
    return np.array(words, dtype=np.int64)


def pack_bias(bias: Iterable[int]) -> int:
    """int32 biases as the b_wr port reads them: each one a little-endian pair of 16-bit words."""
    return pack_words(bias, width=32)


def im2col(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, ph: int, pw: int,
           out_h: int, out_w: int) -> np.ndarray:
    """(n, H, W, C) -> (n, out_h*out_w, kh*kw*C), P ordered (ky, kx, c) as the DMA reads it."""
    n, H, W, C = x.shape
    pad_b = max(0, (out_h - 1) * sh + kh - ph - H)
    pad_r = max(0, (out_w - 1) * sw + kw - pw - W)
    xp = np.pad(x, ((0, 0), (ph, pad_b), (pw, pad_r), (0, 0)))
    taps = [xp[:, ky:ky + sh * (out_h - 1) + 1:sh, kx:kx + sw * (out_w - 1) + 1:sw, :]
            for ky in range(kh) for kx in range(kw)]
    return np.concatenate(taps, axis=-1).reshape(n, out_h * out_w, kh * kw * C)


def layer_reference(x: np.ndarray, geometry, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """What the NPU writes for one layer: (n, H, W, cin) int16 -> (n, out_h, out_w, cout) int16.

    `geometry` is a LayerDescriptor (hw/descriptor.py). Accumulation wraps at
    32 bits, as the hardware's accumulators do.
    """
    g = geometry
    cols = im2col(x.astype(np.int64), g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.out_h, g.out_w)
    acc = cols @ weights.astype(np.int64) + bias.astype(np.int64)
    acc = wrap32(acc)
    return postprocess(acc, g.shift, g.relu).reshape(x.shape[0], g.out_h, g.out_w, g.cout)
