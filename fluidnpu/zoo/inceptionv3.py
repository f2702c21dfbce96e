"""Inception-v3 (torchvision, no auxiliary classifier) lowered to GEMMs, with three early exits.

Branch definitions, layer names and the order of the GEMMs follow torchvision's
modules and their forward(), so the schedule matches what an exported model
runs. The asymmetric (1,7)/(7,1)/(1,3)/(3,1) kernels are kept as such: their
reduction length P (7*c or 3*c) differs from a square kernel's, which is what
the DSE's tiling cares about. Pools are not GEMMs and only change the size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fluidnpu.workload import Layer, Workload
from fluidnpu.zoo.blocks import Block, assemble

NUM_CLASSES = 1000
INPUT_HW = 299
# Fraction of samples leaving at exit1..exit3 and the final classifier (paper, Inception-v3).
EXIT_RATES = (0.145, 0.186, 0.222, 0.447)

Kernel = int | tuple[int, int]
# One conv of a branch: (name, out_ch, kernel, stride, padding); padding as (pad_h, pad_w) like torch.
ConvSpec = tuple[str, int, Kernel, int, Kernel]



def _conv(name: str, out_ch: int, kernel: Kernel, stride: int = 1, padding: Kernel = 0) -> ConvSpec:
    return (name, out_ch, kernel, stride, padding)


def _chain(prefix: str, in_ch: int, hw: tuple[int, int], *specs: ConvSpec) -> list[Layer]:
    """A branch: convs applied one after another to the module input (prefix "" for the stem)."""
    layers: list[Layer] = []
    for name, out_ch, kernel, stride, padding in specs:
        layer = Layer.conv(f"{prefix}.{name}" if prefix else name, in_ch, out_ch, hw, kernel, stride=stride,
                           padding=padding)
        layers.append(layer)
        in_ch, hw = out_ch, layer.out_hw
    return layers


def _pool_hw(hw: tuple[int, int], k: int = 3, s: int = 2) -> tuple[int, int]:
    """Output size of an unpadded k x k / s pool."""
    return ((hw[0] - k) // s + 1, (hw[1] - k) // s + 1)


def _concat(layers: list[Layer], outputs: Sequence[Layer], pooled: tuple[int, tuple[int, int]] | None = None
            ) -> Block:
    """Close a module: its output is the channel concat of `outputs` (and of a
    max-pooled copy of the input for the grid-reduction modules)."""
    shapes = {o.out_hw for o in outputs} | ({pooled[1]} if pooled else set())
    assert len(shapes) == 1, f"branches disagree on spatial size: {shapes}"
    out_ch = sum(o.out_ch for o in outputs) + (pooled[0] if pooled else 0)
    return Block(layers, out_ch, shapes.pop())


def inception_a(prefix: str, in_ch: int, hw: tuple[int, int], pool_features: int) -> Block:
    """35x35 module: 1x1 | 1x1->5x5 | 1x1->3x3->3x3 | avgpool->1x1."""
    b1 = _chain(prefix, in_ch, hw, _conv("branch1x1", 64, 1))
    b5 = _chain(prefix, in_ch, hw, _conv("branch5x5_1", 48, 1), _conv("branch5x5_2", 64, 5, padding=2))
    b3 = _chain(prefix, in_ch, hw, _conv("branch3x3dbl_1", 64, 1), _conv("branch3x3dbl_2", 96, 3, padding=1),
                _conv("branch3x3dbl_3", 96, 3, padding=1))
    bp = _chain(prefix, in_ch, hw, _conv("branch_pool", pool_features, 1))  # after a 3x3/1 pad-1 avg pool
    return _concat(b1 + b5 + b3 + bp, [b1[-1], b5[-1], b3[-1], bp[-1]])


def inception_b(prefix: str, in_ch: int, hw: tuple[int, int]) -> Block:
    """35->17 grid reduction: 3x3/2 | 1x1->3x3->3x3/2 | maxpool 3x3/2 (passes in_ch through)."""
    b3 = _chain(prefix, in_ch, hw, _conv("branch3x3", 384, 3, stride=2))
    bd = _chain(prefix, in_ch, hw, _conv("branch3x3dbl_1", 64, 1), _conv("branch3x3dbl_2", 96, 3, padding=1),
                _conv("branch3x3dbl_3", 96, 3, stride=2))
    return _concat(b3 + bd, [b3[-1], bd[-1]], pooled=(in_ch, _pool_hw(hw)))


def inception_c(prefix: str, in_ch: int, hw: tuple[int, int], c7: int) -> Block:
    """17x17 module with factorised 7x7s: 1x1 | 1x7 then 7x1 | two of (7x1, 1x7) | avgpool->1x1."""
    b1 = _chain(prefix, in_ch, hw, _conv("branch1x1", 192, 1))
    b7 = _chain(prefix, in_ch, hw, _conv("branch7x7_1", c7, 1), _conv("branch7x7_2", c7, (1, 7), padding=(0, 3)),
                _conv("branch7x7_3", 192, (7, 1), padding=(3, 0)))
    bd = _chain(prefix, in_ch, hw, _conv("branch7x7dbl_1", c7, 1),
                _conv("branch7x7dbl_2", c7, (7, 1), padding=(3, 0)),
                _conv("branch7x7dbl_3", c7, (1, 7), padding=(0, 3)),
                _conv("branch7x7dbl_4", c7, (7, 1), padding=(3, 0)),
                _conv("branch7x7dbl_5", 192, (1, 7), padding=(0, 3)))
    bp = _chain(prefix, in_ch, hw, _conv("branch_pool", 192, 1))  # after a 3x3/1 pad-1 avg pool
    return _concat(b1 + b7 + bd + bp, [b1[-1], b7[-1], bd[-1], bp[-1]])


def inception_d(prefix: str, in_ch: int, hw: tuple[int, int]) -> Block:
    """17->8 grid reduction: 1x1->3x3/2 | 1x1->1x7->7x1->3x3/2 | maxpool 3x3/2 (passes in_ch through)."""
    b3 = _chain(prefix, in_ch, hw, _conv("branch3x3_1", 192, 1), _conv("branch3x3_2", 320, 3, stride=2))
    b7 = _chain(prefix, in_ch, hw, _conv("branch7x7x3_1", 192, 1),
                _conv("branch7x7x3_2", 192, (1, 7), padding=(0, 3)),
                _conv("branch7x7x3_3", 192, (7, 1), padding=(3, 0)),
                _conv("branch7x7x3_4", 192, 3, stride=2))
    return _concat(b3 + b7, [b3[-1], b7[-1]], pooled=(in_ch, _pool_hw(hw)))


def inception_e(prefix: str, in_ch: int, hw: tuple[int, int]) -> Block:
    """8x8 module whose 3x3 branches end in parallel 1x3 and 3x1 convs that are concatenated."""
    b1 = _chain(prefix, in_ch, hw, _conv("branch1x1", 320, 1))
    b3 = _chain(prefix, in_ch, hw, _conv("branch3x3_1", 384, 1))
    b3 += [Layer.conv(f"{prefix}.branch3x3_2a", 384, 384, b3[0].out_hw, (1, 3), padding=(0, 1)),
           Layer.conv(f"{prefix}.branch3x3_2b", 384, 384, b3[0].out_hw, (3, 1), padding=(1, 0))]
    bd = _chain(prefix, in_ch, hw, _conv("branch3x3dbl_1", 448, 1), _conv("branch3x3dbl_2", 384, 3, padding=1))
    bd += [Layer.conv(f"{prefix}.branch3x3dbl_3a", 384, 384, bd[-1].out_hw, (1, 3), padding=(0, 1)),
           Layer.conv(f"{prefix}.branch3x3dbl_3b", 384, 384, bd[-1].out_hw, (3, 1), padding=(1, 0))]
    bp = _chain(prefix, in_ch, hw, _conv("branch_pool", 192, 1))  # after a 3x3/1 pad-1 avg pool
    return _concat(b1 + b3 + bd + bp, [b1[-1], b3[-2], b3[-1], bd[-2], bd[-1], bp[-1]])


def inceptionv3() -> Workload:
    """Inception-v3 at 299x299x3: 94 convs + 1 FC, about 5.71 GMAC per image."""
    stem = _chain("", 3, (INPUT_HW, INPUT_HW),
                  _conv("Conv2d_1a_3x3", 32, 3, stride=2),
                  _conv("Conv2d_2a_3x3", 32, 3),
                  _conv("Conv2d_2b_3x3", 64, 3, padding=1))
    hw = _pool_hw(stem[-1].out_hw)  # maxpool 3x3/2: 147 -> 73
    stem += _chain("", 64, hw, _conv("Conv2d_3b_1x1", 80, 1), _conv("Conv2d_4a_3x3", 192, 3))
    ch, hw = stem[-1].out_ch, _pool_hw(stem[-1].out_hw)  # maxpool 3x3/2: 71 -> 35

    modules: list[tuple[str, Callable[..., Block], dict[str, Any]]] = [
        ("Mixed_5b", inception_a, {"pool_features": 32}),
        ("Mixed_5c", inception_a, {"pool_features": 64}),
        ("Mixed_5d", inception_a, {"pool_features": 64}),
        ("Mixed_6a", inception_b, {}),
        ("Mixed_6b", inception_c, {"c7": 128}),
        ("Mixed_6c", inception_c, {"c7": 160}),
        ("Mixed_6d", inception_c, {"c7": 160}),
        ("Mixed_6e", inception_c, {"c7": 192}),
        ("Mixed_7a", inception_d, {}),
        ("Mixed_7b", inception_e, {}),
        ("Mixed_7c", inception_e, {}),
    ]
    blocks: list[Block] = []
    for name, make, kwargs in modules:
        block = make(name, ch, hw, **kwargs)
        blocks.append(block)
        ch, hw = block.out_ch, block.out_hw

    # Global average pool (and dropout) are not GEMMs; then the classifier.
    fc = Layer.fc("fc", ch, NUM_CLASSES)
    return assemble("Inception-v3", stem, blocks, fc, (3, INPUT_HW, INPUT_HW),
                    EXIT_RATES, NUM_CLASSES)
