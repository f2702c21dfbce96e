"""The control unit's response loader (hw/seq_loader.py) on its own, in Amaranth's simulator.

The testbench plays the DMA's two response streams, the fetcher's step stream,
the core (step handshake, `released`) and the writer's staging port, and
checks where each response lands, when a step reaches the core, and the
backpressure the loader applies to the DMA and the fetcher.
"""

from __future__ import annotations

from amaranth.sim import Simulator

from fluidnpu.hw.seq_loader import SeqLoader
from fluidnpu.hw.seq_streams import DESC_CMD_WORDS, KIND_BIAS, KIND_DESC, KIND_INPUT, KIND_WEIGHT

TR, TP, TC, NB, NMAX = 8, 4, 4, 4, 16


def words(values: list[int]) -> int:
    return sum((v & 0xFFFF) << (16 * i) for i, v in enumerate(values))


def simulate(bench) -> None:
    dut = SeqLoader(TR=TR, TP=TP, TC=TC, NB=NB, nmax=NMAX)

    async def tb(ctx):
        ctx.set(dut.staging.free, 0b11)
        await bench(ctx, dut)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def rsp(kind: int, data: list[int], **tag: int) -> dict:
    return {"data": words(data), "tag": {"kind": kind, **tag}}


def port(dut, payload: dict):
    """The stream a response comes on: inputs on `in_rsp`, the rest on `rd_rsp`."""
    return dut.in_rsp if payload["tag"]["kind"] == KIND_INPUT else dut.rd_rsp


async def send(ctx, dut, payload: dict) -> None:
    """One response, taken in the first cycle the loader is ready."""
    p = port(dut, payload)
    ctx.set(p.valid, 1)
    ctx.set(p.payload, payload)
    while not ctx.get(p.ready):
        await ctx.tick()
    await ctx.tick()
    ctx.set(p.valid, 0)


def test_responses_land_in_the_core_one_cycle_later():
    seen = {}

    async def bench(ctx, dut):
        await send(ctx, dut, rsp(KIND_WEIGHT, list(range(1, 9)), lane=5, q=2))
        seen["w"] = ctx.get(dut.w_wr.valid), ctx.get(dut.w_wr.lane), ctx.get(dut.w_wr.q), ctx.get(dut.w_wr.data)
        await send(ctx, dut, rsp(KIND_BIAS, list(range(16)), idx=8, q=1))
        seen["b"] = ctx.get(dut.b_wr.valid), ctx.get(dut.b_wr.base), ctx.get(dut.b_wr.q), ctx.get(dut.w_wr.valid)
        # an input row in two runs: 3 channels at lane 0, then 5 at lane 3
        await send(ctx, dut, rsp(KIND_INPUT, [11, 12, 13], lane=0, idx=6))
        seen["partial"] = ctx.get(dut.in_wr.valid)
        await send(ctx, dut, rsp(KIND_INPUT, [14, 15, 16, 17, 18], lane=3, idx=6, row_last=1))
        seen["in"] = ctx.get(dut.in_wr.valid), ctx.get(dut.in_wr.j), ctx.get(dut.in_wr.data)
        await ctx.tick()
        seen["after"] = ctx.get(dut.in_wr.valid)

    simulate(bench)
    assert seen["w"] == (1, 5, 2, words(list(range(1, 9))))
    assert seen["b"] == (1, 8, 1, 0)
    assert seen["partial"] == 0
    assert seen["in"] == (1, 6, words([11, 12, 13, 14, 15, 16, 17, 18])) and seen["after"] == 0


def test_descriptor_words_go_to_the_planner_not_the_core():
    seen = {}

    async def bench(ctx, dut):
        ctx.set(dut.rd_rsp.valid, 1)
        ctx.set(dut.rd_rsp.payload, rsp(KIND_DESC, list(range(100, 116)), idx=DESC_CMD_WORDS))
        seen["desc"] = ctx.get(dut.desc.valid), ctx.get(dut.desc.payload.idx), ctx.get(dut.desc.payload.data)
        await ctx.tick()
        ctx.set(dut.rd_rsp.valid, 0)
        seen["core"] = [ctx.get(p.valid) for p in (dut.in_wr, dut.w_wr, dut.b_wr)] + [ctx.get(dut.desc.valid)]

    simulate(bench)
    assert seen["desc"] == (1, DESC_CMD_WORDS, words(list(range(100, 116))))
    assert seen["core"] == [0, 0, 0, 0]


def test_a_step_reaches_the_core_when_its_data_is_in_and_halves_alternate():
    seen: dict = {"valid_before": []}

    async def bench(ctx, dut):
        ctx.set(dut.step.valid, 1)
        ctx.set(dut.step.payload, {"t": 3, "first": 1, "last": 0, "sb": 0})
        ctx.set(dut.core_step.ready, 1)
        await send(ctx, dut, rsp(KIND_WEIGHT, [1], lane=0, step_last=1))
        seen["valid_before"].append(ctx.get(dut.core_step.valid))       # weights only: not yet
        await send(ctx, dut, rsp(KIND_INPUT, [2], lane=0, idx=2, row_last=1, step_last=1))
        seen["issue"] = (ctx.get(dut.core_step.valid), ctx.get(dut.core_step.ib), ctx.get(dut.core_step.t),
                         ctx.get(dut.core_step.first), ctx.get(dut.step.ready))
        await ctx.tick()
        seen["idle_out"] = ctx.get(dut.idle), ctx.get(dut.core_step.valid)
        ctx.set(dut.step.payload, {"t": 2, "first": 0, "last": 0, "sb": 0})
        await send(ctx, dut, rsp(KIND_WEIGHT, [4], lane=0, step_last=1))
        await send(ctx, dut, rsp(KIND_INPUT, [3], lane=0, idx=1, row_last=1, step_last=1))
        seen["second"] = ctx.get(dut.core_step.valid), ctx.get(dut.core_step.ib), ctx.get(dut.in_wr.ib)
        await ctx.tick()
        ctx.set(dut.step.valid, 0)
        ctx.set(dut.released, 1)
        await ctx.tick()
        await ctx.tick()
        ctx.set(dut.released, 0)
        await ctx.tick()
        seen["idle_end"] = ctx.get(dut.idle)

    simulate(bench)
    assert seen["valid_before"] == [0]
    assert seen["issue"] == (1, 0, 3, 1, 1)
    assert seen["idle_out"] == (0, 0)
    assert seen["second"] == (1, 1, 1)        # the next step's data and the step itself use the other half
    assert seen["idle_end"] == 1              # two steps handed over, two released


def test_the_next_steps_responses_wait_until_the_core_takes_the_step():
    seen: dict = {}

    async def bench(ctx, dut):
        ctx.set(dut.step.valid, 1)
        ctx.set(dut.step.payload, {"t": 1, "first": 1, "last": 0, "sb": 0})
        ctx.set(dut.core_step.ready, 0)                    # the core is busy
        await send(ctx, dut, rsp(KIND_WEIGHT, [5], lane=0, step_last=1))
        await send(ctx, dut, rsp(KIND_INPUT, [1], lane=0, idx=0, row_last=1, step_last=1))
        ctx.set(dut.rd_rsp.valid, 1)
        ctx.set(dut.rd_rsp.payload, rsp(KIND_WEIGHT, [7], lane=1))
        stalled = []
        for _ in range(4):
            stalled.append(ctx.get(dut.rd_rsp.ready))
            await ctx.tick()
        seen["stalled"] = stalled
        ctx.set(dut.core_step.ready, 1)                    # taken in the cycle the step is handed over
        seen["taken"] = ctx.get(dut.rd_rsp.ready), ctx.get(dut.core_step.valid)
        await ctx.tick()
        ctx.set(dut.rd_rsp.valid, 0)
        seen["landed"] = ctx.get(dut.w_wr.valid), ctx.get(dut.w_wr.wb), ctx.get(dut.w_wr.lane)

    simulate(bench)
    assert seen["stalled"] == [0, 0, 0, 0]
    assert seen["taken"] == (1, 1)
    assert seen["landed"] == (1, 1, 1)        # into the half the core releases


def test_a_blocks_last_step_waits_for_its_staging_half_and_claims_it():
    seen: dict = {}

    async def bench(ctx, dut):
        ctx.set(dut.staging.free, 0b01)                    # half 1 still being drained
        ctx.set(dut.step.valid, 1)
        ctx.set(dut.step.payload, {"t": 1, "first": 1, "last": 1, "sb": 1})
        ctx.set(dut.core_step.ready, 1)
        await send(ctx, dut, rsp(KIND_WEIGHT, [5], lane=0, step_last=1))
        await send(ctx, dut, rsp(KIND_INPUT, [1], lane=0, idx=0, row_last=1, step_last=1))
        held = []
        for _ in range(3):
            held.append((ctx.get(dut.core_step.valid), ctx.get(dut.staging.claim)))
            await ctx.tick()
        seen["held"] = held
        ctx.set(dut.staging.free, 0b11)                    # the writer frees it
        seen["claim"] = ctx.get(dut.core_step.valid), ctx.get(dut.staging.claim), ctx.get(dut.core_step.sb)
        await ctx.tick()
        ctx.set(dut.step.valid, 0)
        seen["after"] = ctx.get(dut.staging.claim)

    simulate(bench)
    assert seen["held"] == [(0, 0)] * 3
    assert seen["claim"] == (1, 0b10, 1)
    assert seen["after"] == 0


def test_both_streams_land_in_one_cycle_and_a_finished_stream_waits_for_the_other():
    """A weight row and an input row taken in the same cycle both land a cycle later; once the
    weights' step is complete their next response waits, while the inputs go on."""
    seen: dict = {}

    async def bench(ctx, dut):
        ctx.set(dut.step.valid, 1)
        ctx.set(dut.step.payload, {"t": 2, "first": 0, "last": 0, "sb": 0})
        ctx.set(dut.core_step.ready, 1)
        ctx.set(dut.rd_rsp.valid, 1)
        ctx.set(dut.rd_rsp.payload, rsp(KIND_WEIGHT, [9], lane=1, step_last=1))
        ctx.set(dut.in_rsp.valid, 1)
        ctx.set(dut.in_rsp.payload, rsp(KIND_INPUT, [8], lane=0, idx=0, row_last=1))
        seen["both_ready"] = ctx.get(dut.rd_rsp.ready), ctx.get(dut.in_rsp.ready)
        await ctx.tick()
        seen["landed"] = ctx.get(dut.w_wr.valid), ctx.get(dut.in_wr.valid), ctx.get(dut.in_wr.j)
        ctx.set(dut.rd_rsp.payload, rsp(KIND_WEIGHT, [7], lane=0))           # the next step's
        ctx.set(dut.in_rsp.payload, rsp(KIND_INPUT, [6], lane=0, idx=1, row_last=1, step_last=1))
        seen["second"] = ctx.get(dut.rd_rsp.ready), ctx.get(dut.in_rsp.ready), ctx.get(dut.core_step.valid)
        await ctx.tick()
        ctx.set(dut.in_rsp.valid, 0)
        seen["handed"] = ctx.get(dut.core_step.valid), ctx.get(dut.rd_rsp.ready)

    simulate(bench)
    assert seen["both_ready"] == (1, 1)
    assert seen["landed"] == (1, 1, 0)
    assert seen["second"] == (0, 1, 0)       # weights done: wait; inputs still taken
    assert seen["handed"] == (1, 1)          # both in: the step goes, the weights' next is taken
