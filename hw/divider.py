"""A small sequential unsigned divider for the control unit's per-layer planning.

The sequencer divides a handful of times per layer (groups per pass, rows per
block, balanced block sizes); a restoring divider costs no DSPs and `width`
cycles a division, which the performance model's per-layer overhead absorbs.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class SeqDivider(wiring.Component):
    """quotient, remainder = divmod(dividend, divisor), `width` cycles after `start`.

    `done` pulses for one cycle when the result is ready; results hold until
    the next start. Division by zero gives quotient all-ones (the caller checks
    divisors before it divides).
    """

    def __init__(self, width: int) -> None:
        self.width = width
        super().__init__({
            "start": In(1), "dividend": In(width), "divisor": In(width),
            "busy": Out(1), "done": Out(1), "quotient": Out(width), "remainder": Out(width),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        w = self.width
        rem = Signal(w + 1)
        quo = Signal(w)
        den = Signal(w)
        count = Signal(range(w + 1))
        trial = Signal(w + 2)
        shifted = Signal(w + 1)

        m.d.comb += [
            self.quotient.eq(quo),
            self.remainder.eq(rem[:w]),
            shifted.eq((rem << 1) | quo[w - 1]),
            trial.eq(shifted - den),
        ]
        m.d.sync += self.done.eq(0)
        with m.If(self.start):
            m.d.sync += [rem.eq(0), quo.eq(self.dividend), den.eq(self.divisor),
                         count.eq(w), self.busy.eq(1)]
        with m.Elif(self.busy):
            with m.If(trial[w + 1]):            # negative: keep the shifted remainder
                m.d.sync += [rem.eq(shifted), quo.eq(quo << 1)]
            with m.Else():
                m.d.sync += [rem.eq(trial[:w + 1]), quo.eq((quo << 1) | 1)]
            m.d.sync += count.eq(count - 1)
            with m.If(count == 1):
                m.d.sync += [self.busy.eq(0), self.done.eq(1)]
        return m
