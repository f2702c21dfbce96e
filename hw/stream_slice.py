"""A register slice on an `amaranth.lib.stream` valid/ready stream: one Component for every
stream the timing proxy cuts (docs/resources.md, "Timing proxy").

A stream's payload and its ready run in opposite directions, so a slice cuts
either or both:

* `forward`: the output's valid and payload are registers. The producer's
  logic (an im2col run, a write command's address) then ends at the slice
  instead of running on into the consumer's. `i.ready = ~o.valid | o.ready`
  stays one cycle a transfer at full rate; every item arrives one cycle later.
* `backward` (a skid buffer): `i.ready` is a register (`~skid_valid`). When
  the consumer refuses an item the producer offered while ready was high, the
  item waits in the skid register; the output is the skid register when it is
  full, else the input, so an item the consumer takes at once passes in the
  same cycle: no latency, full rate. The consumer's ready logic then ends at
  the slice instead of running on into the producer's (the DMA's R channel).

Both together give a fully registered slice (skid first, then the forward register).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out


class StreamSlice(wiring.Component):
    """Register slice `i` -> `o` on a stream of `shape`; see the module docstring.

    `busy`: an item is held inside the slice (what a drain check must wait for besides both ends).
    """

    def __init__(self, shape, *, forward: bool = True, backward: bool = False) -> None:
        if not (forward or backward):
            self._MustUse__silence = True          # never elaborated: no "created but never used" warning
            raise ValueError("a slice registers the forward path, the backward path or both")
        self.forward, self.backward = forward, backward
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)), "busy": Out(1)})

    def elaborate(self, platform) -> Module:
        m = Module()
        shape = self.i.payload.shape()
        valid, payload, ready = self.i.valid, Value.cast(self.i.payload), Signal()   # the middle of the slice
        held = []
        if self.backward:
            skid, skid_valid = Signal(shape), Signal()
            m.d.comb += self.i.ready.eq(~skid_valid)
            with m.If(skid_valid & ready):
                m.d.sync += skid_valid.eq(0)
            with m.Elif(self.i.valid & ~skid_valid & ~ready):
                m.d.sync += [skid_valid.eq(1), skid.eq(self.i.payload)]
            valid, payload = self.i.valid | skid_valid, Mux(skid_valid, Value.cast(skid), payload)
            held.append(skid_valid)
        else:
            m.d.comb += self.i.ready.eq(ready)
        if self.forward:
            m.d.comb += ready.eq(~self.o.valid | self.o.ready)
            with m.If(ready):
                m.d.sync += [self.o.valid.eq(valid), self.o.payload.eq(payload)]
            held.append(self.o.valid)
        else:
            m.d.comb += [self.o.valid.eq(valid), self.o.payload.eq(payload), ready.eq(self.o.ready)]
        m.d.comb += self.busy.eq(held[0] if len(held) == 1 else held[0] | held[1])
        return m


class OrderedPair(wiring.Component):
    """Two streams (`i0`, `i1` -> `o0`, `o1`) through one fully registered slice, kept in one order.

    The control unit's weight and input walkers issue side by side, and the DMA must deal every read
    of a step before any of the next (hw/sequencer.py). Items taken in one cycle travel as one pair
    (a StreamSlice of both, forward and backward, so both input readies are a register); the
    consumer sees only the head pair, and each half leaves when its stream takes it (`o0`/`o1`
    carry each half's valid, cleared once taken), the next pair only once both have left. So an
    item never reaches the consumer before one taken in an earlier cycle, and the two streams still
    move one item each a cycle. The slice takes a pair every cycle it can, an empty one where
    neither stream offers an item (it leaves at once), so no input valid is on the slice's own
    load path (the timing proxy's budget).
    """

    def __init__(self, shape0, shape1) -> None:
        self._pair = data.StructLayout({"v0": 1, "p0": shape0, "v1": 1, "p1": shape1})
        super().__init__({"i0": In(stream.Signature(shape0)), "i1": In(stream.Signature(shape1)),
                          "o0": Out(stream.Signature(shape0)), "o1": Out(stream.Signature(shape1))})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.slice = sl = StreamSlice(self._pair, forward=True, backward=True)
        m.d.comb += [sl.i.valid.eq(1),
                     sl.i.payload.v0.eq(self.i0.valid), sl.i.payload.p0.eq(self.i0.payload),
                     sl.i.payload.v1.eq(self.i1.valid), sl.i.payload.p1.eq(self.i1.payload),
                     self.i0.ready.eq(sl.i.ready), self.i1.ready.eq(sl.i.ready)]
        head = sl.o.payload
        done0, done1 = Signal(), Signal()          # the head pair's half already taken
        m.d.comb += [self.o0.valid.eq(sl.o.valid & head.v0 & ~done0), self.o0.payload.eq(head.p0),
                     self.o1.valid.eq(sl.o.valid & head.v1 & ~done1), self.o1.payload.eq(head.p1)]
        fire0 = self.o0.valid & self.o0.ready
        fire1 = self.o1.valid & self.o1.ready
        left = (~head.v0 | done0 | fire0) & (~head.v1 | done1 | fire1)
        m.d.comb += sl.o.ready.eq(left)
        with m.If(sl.o.valid & left):
            m.d.sync += [done0.eq(0), done1.eq(0)]
        with m.Else():
            with m.If(fire0):
                m.d.sync += done0.eq(1)
            with m.If(fire1):
                m.d.sync += done1.eq(1)
        return m
