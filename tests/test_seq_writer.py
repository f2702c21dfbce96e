"""The control unit's writer (hw/seq_writer.py) on its own, in Amaranth's simulator.

The testbench plays the fetcher (blocks), the core (`block_done` and a
staging buffer that answers a read a cycle late), the DMA's write port (with
random backpressure) and the loader's staging claims. Every write must go to
the address the output tensor's layout gives for its sample, pixel and
column, with the staging row's words of its group; rows past a short last
group's samples are not written; a block is drained only after the core
finished it; a drained block frees its staging half.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from fluidnpu.hw.descriptor import LayerDescriptor
from fluidnpu.hw.regmap import KCode
from fluidnpu.hw.seq_writer import SeqWriter
from fluidnpu.sim_tb.seq_bench import block_rows, plan_values

TR, TP, TC, NB, BMAX, NMAX = 4, 4, 4, 4, 4, 16


def staged(sb: int, j: int, c: int) -> int:
    """The word the core left in staging half sb, row j, column c."""
    return sb << 12 | j << 6 | c


def layer(cout: int) -> LayerDescriptor:
    return LayerDescriptor(layer=0, in_h=1, in_w=3, cin=2, out_h=1, out_w=3, cout=cout, dst_base=0x2000,
                           dst_sample_stride=0x100, dst_cpitch=8, dst_coff=1)


def blocks_of(desc: LayerDescriptor, plan: dict) -> list[dict]:
    """The blocks the fetcher announces for the layer (pass by pass, row block by row block, each row
    block in every column tile)."""
    out, sb = [], 0
    tiles = [(col0, min(plan["nPE"], desc.cout - col0)) for col0 in range(0, desc.cout, plan["nPE"])]
    for first_group in range(0, plan["BP"], plan["g"]):
        last = first_group + plan["g"] >= plan["BP"]
        for bi, t in enumerate(block_rows(plan, "last" if last else "full")):
            for ti, (col0, w) in enumerate(tiles):
                out.append({"t": t, "gp": plan["gl"] if last else plan["g"], "col0": col0, "w": w, "sb": sb,
                            "pass_start": int(bi == 0 and ti == 0),
                            "layer_start": int(bi == 0 and ti == 0 and first_group == 0), "again": int(ti > 0)})
                sb ^= 1
    return out


def expected_writes(desc: LayerDescriptor, plan: dict, blocks: list[dict]) -> list[tuple[int, int, list[int]]]:
    """(address, nwords, words) of every write, from the output tensor's layout."""
    writes, group0, r0, gp, prev_t = [], 0, 0, 0, 0
    b, BR, cw = plan["b"], plan["BR"], plan["cw"]
    for blk in blocks:
        if blk["pass_start"]:                    # the pass's groups follow the previous pass's
            group0 = 0 if blk["layer_start"] else group0 + gp
            r0 = 0
        elif not blk["again"]:                   # the next row block (its first tile)
            r0 += prev_t
        gp, prev_t = blk["gp"], blk["t"]
        for j in range(blk["t"]):
            for q in range(blk["gp"]):
                sample, pix = (group0 + q) * BR + (r0 + j) // desc.npix, (r0 + j) % desc.npix
                if sample < min((group0 + q + 1) * BR, b):
                    addr = (desc.dst_base + 2 * desc.dst_coff + sample * desc.dst_sample_stride
                            + pix * 2 * desc.out_pitch + 2 * blk["col0"])
                    writes.append((addr, blk["w"], [staged(blk["sb"], j, q * cw + c) for c in range(blk["w"])]))
    return writes


def run(desc: LayerDescriptor, b: int, BR: int, *, seed: int = 0, wr_ready: float = 1.0,
        done_delay: int = 0) -> dict:
    dut = SeqWriter(TR=TR, TP=TP, TC=TC, NB=NB, bmax=BMAX, nmax=NMAX)
    plan = plan_values(desc, TR=TR, TP=TP, TC=TC, NB=NB, b=b, BR=BR, k=KCode.K1)
    blocks = blocks_of(desc, plan)
    rng = random.Random(seed)
    out: dict = {"writes": [], "plan": plan, "blocks": blocks, "early": 0, "free": []}

    async def bench(ctx):
        ctx.set(dut.plan, plan)
        pending, done_at, taken, finished = list(blocks), [], 0, 0
        quiet = 0
        for cycle in range(20000):
            if pending:
                ctx.set(dut.block.valid, 1)
                ctx.set(dut.block.payload, pending[0])
            else:
                ctx.set(dut.block.valid, 0)
            ctx.set(dut.block_done, bool(done_at) and done_at[0] <= cycle)
            ready = rng.random() < wr_ready
            ctx.set(dut.wr.ready, ready)
            _, _, bv, br, done, wv, wr, sb, j, idle, free = await ctx.tick().sample(
                dut.block.valid, dut.block.ready, dut.block_done, dut.wr.valid, dut.wr.payload, dut.st_sb,
                dut.st_j, dut.idle, dut.staging.free)
            ctx.set(dut.st_data, sum(staged(sb, j, c) << (16 * c) for c in range(2 * TC)))
            if done:
                done_at.pop(0)
            if bv and br:
                pending.pop(0)
                taken += 1
            if finished < len(blocks) and not done_at:     # the core finishes the next block
                done_at.append(cycle + 1 + done_delay)
                finished += 1
            if wv and ready:
                data = [(wr.data >> (16 * c)) & 0xFFFF for c in range(wr.nwords)]
                out["writes"].append((wr.addr, wr.nwords, data))
            out["free"].append(free)
            quiet = quiet + 1 if idle and not pending and not done_at else 0
            if quiet == 5:
                break
        out["taken"] = taken
        assert quiet == 5, "the writer never went idle"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


@pytest.mark.parametrize("cout,b,BR,wr_ready,seed", [
    (2, 3, 2, 1.0, 0),      # two packed groups, the second one sample short: its rows are skipped
    (2, 3, 2, 0.3, 1),      # the same under backpressure
    (6, 2, 1, 0.5, 2),      # C > TC: two column tiles, two passes each
    (3, 4, 1, 0.7, 3),      # one group per pass (3 columns of 4 PEs), four passes
])
def test_every_row_of_every_group_goes_to_its_place(cout, b, BR, wr_ready, seed):
    desc = layer(cout)
    out = run(desc, b, BR, seed=seed, wr_ready=wr_ready)
    assert out["taken"] == len(out["blocks"])
    assert out["writes"] == expected_writes(desc, out["plan"], out["blocks"])
    assert out["free"][-1] == 0b11


def test_a_block_is_drained_only_after_the_core_finished_it():
    desc = layer(2)
    slow = run(desc, 3, 2, done_delay=40)
    fast = run(desc, 3, 2)
    assert slow["writes"] == fast["writes"]
    assert len(slow["free"]) > len(fast["free"]) + 40 * (len(slow["blocks"]) - 1)


def test_claimed_halves_are_freed_when_drained():
    seen: dict = {}
    dut = SeqWriter(TR=TR, TP=TP, TC=TC, NB=NB, bmax=BMAX, nmax=NMAX)
    desc = layer(2)
    plan = plan_values(desc, TR=TR, TP=TP, TC=TC, NB=NB, b=1, BR=1, k=KCode.K1)

    async def bench(ctx):
        ctx.set(dut.plan, plan)
        ctx.set(dut.wr.ready, 1)
        seen["reset"] = ctx.get(dut.staging.free)
        ctx.set(dut.staging.claim, 0b10)         # the loader hands the core a block's last step, half 1
        await ctx.tick()
        ctx.set(dut.staging.claim, 0)
        seen["claimed"] = ctx.get(dut.staging.free)
        ctx.set(dut.block.valid, 1)
        ctx.set(dut.block.payload, {"t": 3, "gp": 1, "col0": 0, "w": 2, "sb": 1, "pass_start": 1,
                                    "layer_start": 1, "again": 0})
        ctx.set(dut.block_done, 1)
        await ctx.tick()
        ctx.set(dut.block_done, 0)
        await ctx.tick()
        ctx.set(dut.block.valid, 0)
        for _ in range(20):
            await ctx.tick()
            if ctx.get(dut.idle):
                break
        seen["drained"] = ctx.get(dut.staging.free), ctx.get(dut.idle)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == {"reset": 0b11, "claimed": 0b01, "drained": (0b11, 1)}
