"""Pipelined building blocks of the EngineCore datapath: delay lines, adder
trees, word-vector shifts and the group replication network.

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

from amaranth import Const, Module, Mux, Signal, Value, signed


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


def _materialise(m: Module, values: list[Value], name: str) -> list[Signal]:
    """Each value driven onto its own comb signal.

    Amaranth emits an expression afresh at every place it is used, so a
    network whose stages reuse the previous stage's *expressions* (a barrel
    shifter reads each slot twice per level) grows exponentially in the
    number of levels in the generated netlist: before this, ⟨16, 4, 16⟩'s
    core emitted 35 MB of Verilog. A signal per slot and level keeps the
    netlist at the size of the network.
    """
    out = []
    for c, v in enumerate(values):
        sig = Signal(v.shape(), name=f"{name}_{c}")
        m.d.comb += sig.eq(v)
        out.append(sig)
    return out


def shift_words_up(m: Module, words: list[Value], amount: Value, name: str, lsb: int = 0) -> list[Value]:
    """out[c] = words[c - (amount << lsb)] (zero below), a logarithmic barrel
    shifter over word slots (one signal per slot and level). Passing the shift's
    known-zero low bits as `lsb` rather than in `amount` drops those levels.
    Only shifts below len(words) matter here: the caller masks larger amounts."""
    n = len(words)
    cur = list(words)
    for bit in range(len(amount)):
        step = 1 << (bit + lsb)
        if step >= n:
            break
        zero = Const(0, len(words[0]))
        cur = _materialise(m, [Mux(amount[bit], cur[c - step] if c >= step else zero, cur[c])
                               for c in range(n)], f"{name}_b{bit + lsb}")
    return cur


def replicate_groups(m: Module, words: list[Value], period: Value, stages: int, name: str) -> list[Value]:
    """out[c] = words[c mod period] for c < 2**stages * period (other slots: don't care).

    Recursive doubling: after stage s the first 2**(s+1) periods are right,
    each stage copying the first 2**s periods up by 2**s * period. This is
    how one weight (or bias) vector written for group 0 lands in every group
    of a packed pass at a runtime group width `cw`, in O(n log n log NB)
    multiplexers instead of an n x n crossbar. Every stage's slots are
    signals (see `_materialise`), so the netlist is that size too.
    """
    cur = list(words)
    n = len(words)
    for s in range(stages):
        dist = Signal(len(period) + s, name=f"{name}_dist{s}")
        m.d.comb += dist.eq(period << s)
        up = shift_words_up(m, cur, period, f"{name}_s{s}", lsb=s)
        cur = _materialise(m, [Mux(dist <= c, up[c], cur[c]) for c in range(n)], f"{name}_r{s}")
    return cur
