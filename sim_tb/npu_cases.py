"""Random subnets for the NPU testbenches, with their numpy golden results.

Both the Amaranth-simulator tests and the cocotb testbenches of the
generated Verilog draw their cases here, so the two check the same thing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fluidnpu.host_driver.memory_plan import LayerParams, SubnetImage, plan_subnet
from fluidnpu.hw.descriptor import LayerDescriptor
from fluidnpu.hw.reference import layer_reference
from fluidnpu.hw.regmap import supported_k_codes


@dataclass
class Case:
    """One run: a subnet, its memory image, the batch and each layer's <BR, k_code> (and whether its
    FBCB entry marks it buffered: its input runs from the block input buffer of an NPU built with one)."""

    layers: list[LayerParams]
    image: SubnetImage
    b: int
    modes: list[tuple[int, int]]            # per layer (BR, k_code)
    x: np.ndarray                           # (b, h, w, c) int16 inputs
    expected: list[np.ndarray] = field(default_factory=list)   # per layer output (b, h, w, c)
    buffered: list[bool] = field(default_factory=list)          # per layer; [] = none

    def is_buffered(self, i: int) -> bool:
        return bool(self.buffered) and self.buffered[i]

    def fbcb_words(self, layers: int, bmax: int) -> dict[int, int]:
        """FBCB_ADDR -> FBCB_DATA writes this case needs."""
        from fluidnpu.hw.regmap import encode_fbcb_entry, fbcb_index
        return {fbcb_index(i, self.b, bmax): encode_fbcb_entry(br, k, bmax, self.is_buffered(i))
                for i, (br, k) in enumerate(self.modes)}


def random_geometry(rng: random.Random, index: int, in_shape: tuple[int, int, int], *,
                    max_c: int = 12, max_k: int = 3, fc: bool = False) -> LayerDescriptor:
    """A conv (k x k, stride 1-2, some padding) or an FC layer reading `in_shape`."""
    h, w, c = in_shape
    cout = rng.randint(1, max_c)
    shift = rng.randint(0, 9)
    relu = rng.random() < 0.5
    if fc:
        return LayerDescriptor(layer=index, in_h=1, in_w=1, cin=h * w * c, out_h=1, out_w=1, cout=cout,
                               shift=shift, relu=relu)
    kh, kw = rng.randint(1, min(max_k, h + 1)), rng.randint(1, min(max_k, w + 1))
    sh, sw = rng.randint(1, 2), rng.randint(1, 2)
    ph, pw = rng.randint(0, kh - 1), rng.randint(0, kw - 1)
    out_h = (h + 2 * ph - kh) // sh + 1
    out_w = (w + 2 * pw - kw) // sw + 1
    if out_h < 1 or out_w < 1:
        kh = kw = 1
        ph = pw = 0
        out_h, out_w = (h - 1) // sh + 1, (w - 1) // sw + 1
    return LayerDescriptor(layer=index, in_h=h, in_w=w, cin=c, out_h=out_h, out_w=out_w, cout=cout,
                           kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, shift=shift, relu=relu)


def random_layer(rng: random.Random, geometry: LayerDescriptor) -> LayerParams:
    nrng = np.random.default_rng(rng.getrandbits(32))
    wmax = rng.choice([7, 127, 32767])
    W = nrng.integers(-wmax - 1, wmax + 1, size=(geometry.P, geometry.cout), dtype=np.int64).astype(np.int16)
    bias = nrng.integers(-(1 << 12), 1 << 12, size=geometry.cout).astype(np.int32)
    return LayerParams(geometry, W, bias)


def random_modes(rng: random.Random, n: int, b: int, TR: int, TP: int, TC: int) -> list[tuple[int, int]]:
    """A random <BR, k_code> per layer that exists on the engine (`supported_k_codes`)."""
    codes = [int(c) for c in supported_k_codes(TR, TP, TC)]
    return [(rng.randint(1, b), rng.choice(codes)) for _ in range(n)]


def make_case(rng: random.Random, *, bmax: int, TR: int, TP: int, TC: int, nlayers: int = 2,
              b: int | None = None, in_shape: tuple[int, int, int] | None = None,
              modes: list[tuple[int, int]] | None = None, max_c: int = 12,
              buffered: bool | list[bool] = False) -> Case:
    """A random chain of layers (the last may be FC) and random inputs; `buffered`: every layer's FBCB
    entry asks for the block input buffer (or, a list, each layer's)."""
    shape = in_shape or (rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 9))
    geos = []
    for i in range(nlayers):
        g = random_geometry(rng, i, shape, max_c=max_c, fc=(i == nlayers - 1 and rng.random() < 0.3))
        geos.append(g)
        shape = (g.out_h, g.out_w, g.cout)
    layers = [random_layer(rng, g) for g in geos]
    b = b or rng.randint(1, bmax)
    image = plan_subnet(layers, bmax)
    x = np.random.default_rng(rng.getrandbits(32)).integers(
        -32768, 32768, size=(b, *image.tensors[0].shape), dtype=np.int64).astype(np.int16)
    image.write_input(x)
    case = Case(layers=layers, image=image, b=b,
                modes=modes or random_modes(rng, nlayers, b, TR, TP, TC), x=x,
                buffered=list(buffered) if isinstance(buffered, list) else [buffered] * nlayers)
    y = x
    for lp in layers:
        y = layer_reference(y.reshape(b, lp.geometry.in_h, lp.geometry.in_w, lp.geometry.cin),
                            lp.geometry, lp.weights, lp.bias)
        case.expected.append(y)
    return case


def load_case(driver: Any, case: Case, window: Callable[[int, int], Any]) -> None:
    """Bind the case's image where it was planned (`window(base, nbytes)` is the device buffer
    there), upload it, and load an FBCB with the case's entries (the rest k = 1, BR = 1)."""
    p = driver.params
    img = case.image
    img.bind(window(img.base, len(img.memory)))
    table = [0] * p.fbcb_depth
    for addr, word in case.fbcb_words(p.layers, p.bmax).items():
        table[addr] = word
    driver.load_fbcb(table)


def drive_case(driver: Any, case: Case, window: Callable[[int, int], Any], *, timeout_s: float,
               set_b: bool = True) -> dict:
    """Run `case` on an NPU through its `NpuDriver` (host_driver/driver.py), the one place the
    programming sequence is written; every testbench runs its cases through here.

    `load_case`, then BACTIVE = b unless `set_b` is False (a Bactive the test set by BEXIT/BINCR), then
    `run_subnet`. A run the NPU refuses (STATUS.ERROR) is a result, not an exception: its `status` says which error.
    Returns {"status", counter registers..., "outputs"}.
    """
    from fluidnpu.host_driver.driver import COUNTERS, NpuError

    img = case.image
    load_case(driver, case, window)
    if set_b:
        driver.reg("BACTIVE", case.b)     # unchecked, so a test can ask for a Bactive the NPU refuses
    try:
        driver.run_subnet(img, timeout_s=timeout_s)
    except NpuError:
        pass
    counters = {reg: driver.reg(reg) for reg in COUNTERS.values()}
    img.download()
    outputs = [img.read_tensor(i + 1, case.b) for i in range(len(case.layers))]
    return {"status": driver.status(), **counters, "outputs": outputs}
