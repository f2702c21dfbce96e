"""What the zoo's networks share: blocks with a known output, and exits hung on block ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fluidnpu.workload import Exit, Layer, Workload, equidistant_positions, exit_head


class Block(NamedTuple):
    """GEMM layers of one block/module in execution order plus the shape of its
    output, which is what an exit placed after it would read."""

    layers: list[Layer]
    out_ch: int
    out_hw: tuple[int, int]


def assemble(name: str, stem: list[Layer], blocks: list[Block], classifier: Layer,
             input_shape: tuple[int, ...], exit_rates: Sequence[float], num_classes: int) -> Workload:
    """Backbone = stem + blocks + classifier; len(exit_rates)-1 exits placed
    equidistantly in MACs, on block ends only.

    Only a block's output is a complete feature map: inside a residual block
    the identity path has not been added yet, and inside an Inception module a
    tensor is one branch of the concat. The stem end is excluded because it is
    too early to classify anything.
    """
    backbone = list(stem)
    ends: dict[int, Block] = {}
    for block in blocks:
        backbone.extend(block.layers)
        ends[len(backbone) - 1] = block
    backbone.append(classifier)

    positions = equidistant_positions(backbone, len(exit_rates) - 1, sorted(ends))
    exits = [Exit(f"exit{i}", pos, exit_head(f"exit{i}", ends[pos].out_ch, ends[pos].out_hw, num_classes), rate)
             for i, (pos, rate) in enumerate(zip(positions, exit_rates), start=1)]
    exits.append(Exit("final", len(backbone) - 1, (), exit_rates[-1]))
    return Workload(name=name, backbone=tuple(backbone), exits=tuple(exits), input_shape=input_shape, source="zoo")
