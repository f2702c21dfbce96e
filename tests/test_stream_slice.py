"""hw/stream_slice.py: every kind of slice passes every item once, in order, at full rate, with the
latency it promises, and the backward kind's `i.ready` does not follow `o.ready` combinationally."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from fluidnpu.hw.stream_slice import StreamSlice

KINDS = {"forward": dict(forward=True, backward=False), "backward": dict(forward=False, backward=True),
         "both": dict(forward=True, backward=True)}
LATENCY = {"forward": 1, "backward": 0, "both": 1}


def run(kind: str, n: int, p_valid: float, p_ready: float, seed: int) -> tuple[list[int], list[int], int]:
    """Random valid/ready on both sides: (items sent, items received, cycles)."""
    dut = StreamSlice(12, **KINDS[kind])
    rng = random.Random(seed)
    sent, got, cycles = [], [], [0]

    async def tb(ctx):
        nxt = 0
        while len(got) < n:
            offer = nxt < n and rng.random() < p_valid
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, nxt)
            take = rng.random() < p_ready
            before = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, take)
            if KINDS[kind]["backward"]:
                assert ctx.get(dut.i.ready) == before          # a register, not o.ready
            if offer and ctx.get(dut.i.ready):
                sent.append(nxt)
                nxt += 1
            if take and ctx.get(dut.o.valid):
                got.append(ctx.get(dut.o.payload))
            await ctx.tick()
            cycles[0] += 1
            assert cycles[0] < 20 * n + 10

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return sent, got, cycles[0]


@pytest.mark.parametrize("kind", KINDS)
def test_every_item_once_in_order_under_random_stalls(kind: str) -> None:
    for seed in range(3):
        sent, got, _ = run(kind, 60, 0.7, 0.5, seed)
        assert got == sent == list(range(60))


@pytest.mark.parametrize("kind", KINDS)
def test_full_rate_with_the_promised_latency(kind: str) -> None:
    _, got, cycles = run(kind, 40, 1.0, 1.0, 0)
    assert got == list(range(40)) and cycles == 40 + LATENCY[kind]


def test_a_slice_registers_something() -> None:
    with pytest.raises(ValueError):
        StreamSlice(8, forward=False, backward=False)
