"""ResNet-50 (torchvision v1.5) lowered to GEMMs, with three early exits.

v1.5 puts the stride-2 of a down-sampling bottleneck on its 3x3 conv (not on
the first 1x1 as in the original paper); that is the variant torchvision ships
and the one its 4.09 GMAC figure refers to, so the DSE sees the same shapes a
user's exported model would have.
"""

from __future__ import annotations

from fluidnpu.workload import Layer, Workload
from fluidnpu.zoo.blocks import Block, assemble

NUM_CLASSES = 1000
INPUT_HW = 224
# Fraction of samples leaving at exit1..exit3 and the final classifier (paper, ResNet-50).
EXIT_RATES = (0.051, 0.169, 0.090, 0.690)
# (blocks, bottleneck width) per stage; output channels are 4 x width.
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
EXPANSION = 4



def bottleneck(prefix: str, in_ch: int, width: int, in_hw: tuple[int, int], stride: int) -> Block:
    """One v1.5 bottleneck: 1x1 reduce, 3x3 (carries the stride), 1x1 expand.

    The projection shortcut ("downsample") exists whenever the block changes the
    shape of its input; it runs after conv3 in torchvision's forward(), so it is
    the block's last GEMM and the place an exit may attach.
    """
    out_ch = width * EXPANSION
    c1 = Layer.conv(f"{prefix}.conv1", in_ch, width, in_hw, 1)
    c2 = Layer.conv(f"{prefix}.conv2", width, width, c1.out_hw, 3, stride=stride, padding=1)
    c3 = Layer.conv(f"{prefix}.conv3", width, out_ch, c2.out_hw, 1)
    layers = [c1, c2, c3]
    if stride != 1 or in_ch != out_ch:
        layers.append(Layer.conv(f"{prefix}.downsample", in_ch, out_ch, in_hw, 1, stride=stride))
    return Block(layers, out_ch, c3.out_hw)


def resnet50() -> Workload:
    """ResNet-50 at 224x224x3: 53 convs + 1 FC, about 4.09 GMAC per image."""
    conv1 = Layer.conv("conv1", 3, 64, INPUT_HW, 7, stride=2, padding=3)
    # 3x3/2 max pool (pad 1): 112 -> 56; not a GEMM, only the spatial size changes.
    hw = ((conv1.out_hw[0] + 2 - 3) // 2 + 1, (conv1.out_hw[1] + 2 - 3) // 2 + 1)
    ch = conv1.out_ch

    blocks: list[Block] = []
    for stage, (n_blocks, width) in enumerate(STAGES, start=1):
        for b in range(n_blocks):
            stride = 2 if (b == 0 and stage > 1) else 1
            block = bottleneck(f"layer{stage}.{b}", ch, width, hw, stride)
            blocks.append(block)
            ch, hw = block.out_ch, block.out_hw

    # Global average pool (not a GEMM) then the classifier.
    fc = Layer.fc("fc", ch, NUM_CLASSES)
    return assemble("ResNet-50", [conv1], blocks, fc, (3, INPUT_HW, INPUT_HW),
                    EXIT_RATES, NUM_CLASSES)
