"""Pipelined building blocks of the EngineCore datapath: delay lines and adder
trees.

The adder tree is built as sum(lanes[0, h)) + sum(lanes[h, n)) with
h = n // 2, recursively, with a register after every adder level. The top
split is exactly the Stackable-PE split of docs/interpretations.md: in k = 1/2
the two half trees are two PEs, so the tree exposes its two top operands
(balanced to the same depth) next to the root. All arithmetic is 32-bit
two's complement that wraps, like the accumulator, so associativity holds and
where the bias enters the tree does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Module, Signal, Value, signed


def delay(m: Module, sig: Value, n: int, name: str) -> Value:
    """`sig` delayed by n registers (n = 0 returns sig itself)."""
    for i in range(n):
        reg = Signal.like(sig, name=f"{name}_d{i}")
        m.d.sync += reg.eq(sig)
        sig = reg
    return sig


@dataclass(frozen=True)
class AdderTree:
    """A pipelined tree's outputs.

    root: sum of all leaves, `depth` cycles after the leaves.
    halves: (sum of leaves[0, h), sum of leaves[h, n)) at depth - 1, or None for one leaf.
    """

    root: Value
    depth: int
    halves: tuple[Value, Value] | None


def adder_tree(m: Module, leaves: list[Value], name: str, width: int = 32) -> AdderTree:
    """Registered-per-level adder tree over `leaves` (depth ceil(log2 len(leaves)))."""
    if not leaves:
        raise ValueError("an adder tree needs at least one leaf")

    def build(lo: int, hi: int) -> AdderTree:
        if hi - lo == 1:
            return AdderTree(leaves[lo], 0, None)
        mid = lo + (hi - lo) // 2
        left, right = build(lo, mid), build(mid, hi)
        d = max(left.depth, right.depth)
        a = delay(m, left.root, d - left.depth, f"{name}_l{lo}_{mid}")
        b = delay(m, right.root, d - right.depth, f"{name}_l{mid}_{hi}")
        s = Signal(signed(width), name=f"{name}_s{lo}_{hi}")
        m.d.sync += s.eq(a + b)
        return AdderTree(s, d + 1, (a, b))

    return build(0, len(leaves))
