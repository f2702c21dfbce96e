"""Pipelined building blocks of the EngineCore datapath: delay lines, DSP
cascade chains and adder trees.

A PE's dot product over its TP lanes is cut at the Stackable-PE split
h = TP // 2 (docs/interpretations.md: in k = 1/2 the two halves are two PEs),
and each half into chains of at most `regmap.CHAIN` lanes (`regmap.chains`).
A chain (`dsp_chain`) is a systolic multiply-add: lane r adds its product to
the partial sum lane r - 1 registered the cycle before, so its operands arrive
r cycles after the chain's first lane's (the core skews them). That is the
DSP48's own post-adder with its P output cascaded into the next slice's PCIN,
so a chain's adders cost no LUTs; Yosys `synth_xilinx` packs them
(docs/resources.md, "DSP cascades"). Each half's chain outputs go through a
registered-per-level adder tree; the two half sums are exposed next to the
root. All arithmetic is 32-bit two's complement that wraps, like the
accumulator, so associativity holds and where the bias enters does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Module, Signal, Value, signed


def delay_taps(m: Module, sig: Value, n: int, name: str) -> list[Value]:
    """[sig, sig delayed 1, ..., sig delayed n]: one register chain, tapped."""
    taps = [sig]
    for i in range(n):
        reg = Signal.like(taps[-1], name=f"{name}_d{i}")
        m.d.sync += reg.eq(taps[-1])
        taps.append(reg)
    return taps


def delay(m: Module, sig: Value, n: int, name: str) -> Value:
    """`sig` delayed by n registers (n = 0 returns sig itself)."""
    return delay_taps(m, sig, n, name)[-1]


def dsp_chain(m: Module, lanes: list[tuple[Value, Value]], name: str, first: list[Value] | None = None,
              width: int = 32, index0: int = 0) -> list[Signal]:
    """One DSP cascade over `lanes` [(x, w), ...] whose lane r operands arrive r cycles after
    lane 0's: register r holds x_r * w_r + register r - 1 (lane 0: + each of `first`, e.g. a
    bias), so the last register holds the dot product len(lanes) - 1 cycles after lane 0's
    product. Every adder is the post-adder of the DSP its product is in, its partial sum on the
    previous DSP's PCOUT. Returns the registers, one per lane (named `{name}_{index0 + r}`)."""
    regs: list[Signal] = []
    for r, (x, w) in enumerate(lanes):
        reg = Signal(signed(width), name=f"{name}_{index0 + r}")
        e: Value = x * w
        for addend in (first or []) if r == 0 else [regs[-1]]:
            e = e + addend
        m.d.sync += reg.eq(e)
        regs.append(reg)
    return regs


@dataclass(frozen=True)
class AdderTree:
    """A pipelined tree's outputs.

    root: sum of all leaves, `depth` cycles after the leaves at depth 0.
    halves: (sum of leaves[0, split), sum of leaves[split, n)) at depth - 1, or None for one leaf.
    """

    root: Value
    depth: int
    halves: tuple[Value, Value] | None


def adder_tree(m: Module, leaves: list[Value], name: str, width: int = 32, *,
               depths: list[int] | None = None, split: int | None = None) -> AdderTree:
    """Registered-per-level adder tree over `leaves`, each `depths[i]` cycles late (default 0);
    shallower operands are delayed to meet at each adder. The top adder splits at `split`
    (default the middle), the levels below at their middles."""
    if not leaves:
        raise ValueError("an adder tree needs at least one leaf")
    depths = depths or [0] * len(leaves)

    def build(lo: int, hi: int, mid: int | None = None) -> AdderTree:
        if hi - lo == 1:
            return AdderTree(leaves[lo], depths[lo], None)
        mid = lo + (hi - lo) // 2 if mid is None else mid
        left, right = build(lo, mid), build(mid, hi)
        d = max(left.depth, right.depth)
        a = delay(m, left.root, d - left.depth, f"{name}_l{lo}_{mid}")
        b = delay(m, right.root, d - right.depth, f"{name}_l{mid}_{hi}")
        s = Signal(signed(width), name=f"{name}_s{lo}_{hi}")
        m.d.sync += s.eq(a + b)
        return AdderTree(s, d + 1, (a, b))

    if split is not None and not 0 < split < len(leaves):
        raise ValueError(f"split {split} must leave leaves on both sides of {len(leaves)}")
    return build(0, len(leaves), split)

