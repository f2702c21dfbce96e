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
from amaranth.lib import stream, wiring
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
