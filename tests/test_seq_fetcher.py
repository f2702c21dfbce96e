"""The control unit's im2col fetcher (hw/seq_fetcher.py) on its own, in Amaranth's simulator.

Given a known plan (sim_tb/seq_bench.py), the fetcher's read commands must be
exactly those a direct im2col walk of the layer gives, on its two command
streams (the weight walker's: weights per step, the bias on a block's first
step; the input walker's: input runs per kernel tap or kernel row, padding as
zero fills), whatever backpressure its four output streams see; the walkers
must issue side by side, but never a step's read before the previous step's
last; its steps and blocks must describe the plan; and it must not run more
than two steps ahead of a loader that takes none.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from fluidnpu.hw.descriptor import LayerDescriptor
from fluidnpu.hw.regmap import FETCH_AHEAD, KCode
from fluidnpu.hw.seq_fetcher import SeqFetcher
from fluidnpu.hw.seq_streams import KIND_BIAS, KIND_INPUT, KIND_WEIGHT
from fluidnpu.sim_tb.seq_bench import block_rows, plan_values

TR, TP, TC, NB, BMAX, NMAX = 8, 4, 4, 2, 2, 16

LAYERS = [
    # 3x3 conv, padding 1: zero-filled taps, runs that end at a tap, 2 column tiles, 2 row blocks
    LayerDescriptor(layer=0, in_h=4, in_w=4, cin=3, out_h=4, out_w=4, cout=6, kh=3, kw=3, ph=1, pw=1,
                    src_base=0x1000, src_sample_stride=96, dst_base=0x2000, weight_base=0x3000, bias_base=0x4000),
    # strided 2x2 conv, runs of 5 channels across 4-lane steps
    LayerDescriptor(layer=0, in_h=5, in_w=5, cin=5, out_h=2, out_w=2, cout=3, kh=2, kw=2, sh=2, sw=2,
                    src_base=0x1100, src_sample_stride=250, dst_base=0x2000, weight_base=0x3000, bias_base=0x4040),
    # 3x3 conv, padding 1, cin 6 > TP: most rows that cross a tap are one read, except at a kernel
    # row's end, at the padding's edge and in each step's first row
    LayerDescriptor(layer=0, in_h=3, in_w=4, cin=6, out_h=3, out_w=4, cout=5, kh=3, kw=3, ph=1, pw=1,
                    src_base=0x1200, src_sample_stride=144, dst_base=0x2000, weight_base=0x3000, bias_base=0x4000),
    # one channel (a first layer's shape): a run reads several taps of a kernel row
    LayerDescriptor(layer=0, in_h=4, in_w=5, cin=1, out_h=4, out_w=5, cout=3, kh=3, kw=3, ph=1, pw=1,
                    src_base=0x1300, src_sample_stride=40, dst_base=0x2000, weight_base=0x3000, bias_base=0x4000),
    # the same on a channel slice of wider pixels (pitch 8 > cin 6): taps are not contiguous, nothing merges
    LayerDescriptor(layer=0, in_h=3, in_w=4, cin=6, out_h=3, out_w=4, cout=5, kh=3, kw=3, ph=1, pw=1,
                    src_base=0x1200, src_sample_stride=192, src_cpitch=8, src_coff=2, dst_base=0x2000,
                    weight_base=0x3000, bias_base=0x4000),
]


def expected(desc: LayerDescriptor, plan: dict) -> tuple[list[tuple], list[tuple], list[tuple], list[tuple]]:
    """(weight reads, input reads, steps, blocks) of one sample, one group per pass, by a direct walk
    of the layer; a weight read ends with its step_last mark."""
    C, P, TPk, nPE = desc.cout, desc.P, plan["TPk"], plan["nPE"]
    weights: list[tuple] = []
    reads, steps, blocks, sb = [], [], [], 0
    r0 = 0
    for bi, t in enumerate(block_rows(plan, "full" if plan["BP"] > plan["g"] else "last")):
        for col0 in range(0, C, nPE):          # a row block runs every column tile before the next
            w = min(nPE, C - col0)
            blocks.append((t, 1, col0, w, sb, int(bi == 0 and col0 == 0), int(bi == 0 and col0 == 0),
                           int(col0 > 0)))
            for p0 in range(0, P, TPk):
                nl = min(TPk, P - p0)
                steps.append((t, int(p0 == 0), int(p0 + TPk >= P), sb))
                wreads = [(KIND_WEIGHT, desc.weight_base + 2 * ((p0 + ln) * C + col0), w, 0, ln, 0)
                          for ln in range(nl)]
                if p0 == 0:
                    wreads += [(KIND_BIAS, desc.bias_base + 4 * (col0 + c), min(2 * (w - c), NMAX), 0, 0, c)
                               for c in range(0, w, NMAX // 2)]
                weights += [(*r, int(i + 1 == len(wreads))) for i, r in enumerate(wreads)]
                for j in range(t):
                    oy, ox = divmod(r0 + j, desc.out_w)
                    y0, x0 = oy * desc.sh - desc.ph, ox * desc.sw - desc.pw
                    # past a step's first row, where the pixel pitch is cin and the whole window reads
                    # the input, the rest of each kernel row is one read
                    merge = (j > 0 and desc.in_pitch == desc.cin and 0 <= y0 <= desc.in_h - desc.kh
                             and 0 <= x0 <= desc.in_w - desc.kw)
                    p, lane = p0, 0
                    while p < p0 + nl:
                        ky, kx, ci = p // (desc.kw * desc.cin), p // desc.cin % desc.kw, p % desc.cin
                        left, rest = desc.cin - ci, p0 + nl - p
                        iy, ix = y0 + ky, x0 + kx
                        zero = not (0 <= iy < desc.in_h and 0 <= ix < desc.in_w)
                        run = min(left + (desc.kw - 1 - kx) * desc.cin if merge else left, rest)
                        pitch = desc.in_pitch
                        addr = None if zero else (desc.src_base + 2 * desc.src_coff
                                                  + 2 * ((iy * desc.in_w + ix) * pitch + ci))
                        last = p + run == p0 + nl
                        reads.append((KIND_INPUT, addr, run, int(zero), lane, j, int(last),
                                      int(last and j + 1 == t)))
                        p, lane = p + run, lane + run
            sb ^= 1
        r0 += t
    return weights, reads, steps, blocks


def run(desc: LayerDescriptor, *, seed: int = 0, cmd_ready: float = 1.0, step_ready: float = 1.0,
        block_ready: float = 1.0, cycles: int = 20000) -> dict:
    dut = SeqFetcher(TR=TR, TP=TP, TC=TC, NB=NB, bmax=BMAX, nmax=NMAX)
    plan = plan_values(desc, TR=TR, TP=TP, TC=TC, NB=NB, b=1, BR=1, k=KCode.K1)
    rng = random.Random(seed)
    out: dict = {"weights": [], "reads": [], "steps": [], "blocks": [], "plan": plan, "idle_end": 0,
                 "w_cycles": [], "in_cycles": []}

    async def bench(ctx):
        ctx.set(dut.plan, plan)
        ctx.set(dut.core_idle, 1)
        await ctx.tick()
        ctx.set(dut.go, 1)
        await ctx.tick()
        ctx.set(dut.go, 0)
        quiet = 0
        for cycle in range(cycles):
            ready = [rng.random() < p for p in (cmd_ready, cmd_ready, step_ready, block_ready)]
            for port, r in zip((dut.rd_cmd, dut.in_cmd, dut.step, dut.block), ready):
                ctx.set(port.ready, r)
            _, _, wv, wcmd, cv, cmd, sv, step, bv, blk, idle = await ctx.tick().sample(
                dut.rd_cmd.valid, dut.rd_cmd.payload, dut.in_cmd.valid, dut.in_cmd.payload, dut.step.valid,
                dut.step.payload, dut.block.valid, dut.block.payload, dut.idle)
            if wv and ready[0]:
                tag = wcmd.tag
                out["weights"].append((tag.kind, wcmd.addr, wcmd.nwords, tag.q, tag.lane,
                                       tag.idx if tag.kind == KIND_BIAS else 0, tag.step_last))
                out["w_cycles"].append(cycle)
            if cv and ready[1]:
                tag = cmd.tag
                out["reads"].append((tag.kind, None if cmd.zero else cmd.addr, cmd.nwords, cmd.zero,
                                     tag.lane, tag.idx, tag.row_last, tag.step_last))
                out["in_cycles"].append(cycle)
            if sv and ready[2]:
                out["steps"].append((step.t, step.first, step.last, step.sb))
            if bv and ready[3]:
                out["blocks"].append((blk.t, blk.gp, blk.col0, blk.w, blk.sb, blk.pass_start, blk.layer_start,
                                       blk.again))
            quiet = quiet + 1 if idle else 0
            if quiet == 5:
                break
        out["idle_end"] = quiet

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


@pytest.mark.parametrize("desc", LAYERS)
def test_reads_are_the_layers_im2col_walk(desc):
    out = run(desc)
    weights, reads, steps, blocks = expected(desc, out["plan"])
    assert out["weights"] == weights
    assert out["reads"] == reads
    assert out["steps"] == steps and out["blocks"] == blocks
    assert out["idle_end"] == 5


@pytest.mark.parametrize("seed", [1, 2])
def test_backpressure_on_every_stream_changes_no_command(seed):
    desc = LAYERS[seed - 1]
    out = run(desc, seed=seed, cmd_ready=0.4, step_ready=0.3, block_ready=0.2)
    assert (out["weights"], out["reads"], out["steps"], out["blocks"]) == expected(desc, out["plan"])
    assert out["idle_end"] == 5


@pytest.mark.parametrize("seed", [0, 3])
def test_walkers_issue_side_by_side_but_never_ahead_of_a_step(seed):
    """Weight and input reads go out in the same cycles; yet every read of a step is issued no
    later than the first read of the next (the two streams share the DMA ports' one order)."""
    desc = LAYERS[2]
    out = run(desc, seed=seed, cmd_ready=1.0 if seed == 0 else 0.5)
    assert set(out["w_cycles"]) & set(out["in_cycles"])
    steps: list[list[int]] = []            # the cycles of each step's reads, both streams
    wi = ii = 0
    for _ in out["steps"]:
        cyc = []
        while True:
            cyc.append(out["w_cycles"][wi])
            wi += 1
            if out["weights"][wi - 1][-1]:
                break
        while True:
            cyc.append(out["in_cycles"][ii])
            ii += 1
            if out["reads"][ii - 1][-1]:
                break
        steps.append(cyc)
    assert wi == len(out["weights"]) and ii == len(out["reads"])
    for a, b in zip(steps, steps[1:]):
        assert max(a) <= min(b)


def test_runs_at_most_fetch_ahead_steps_ahead_of_the_loader():
    """With no step handed over, the fetcher issues FETCH_AHEAD steps' reads and then waits."""
    out = run(LAYERS[0], step_ready=0.0, cycles=600)
    step_ends = [r for r in out["reads"] if r[0] == KIND_INPUT and r[-1]]
    assert len(step_ends) == FETCH_AHEAD == 3 and out["steps"] == [] and out["idle_end"] == 0


def test_a_row_that_ends_in_the_next_contiguous_tap_is_one_read():
    """Reading a kernel row's taps as one run is what saves commands: on contiguous pixels (pitch = cin)
    the layer takes fewer input reads than its twin on a wider pitch, for the same words."""
    merged, sliced = (run(d)["reads"] for d in (LAYERS[2], LAYERS[4]))

    def inputs(reads: list[tuple]) -> list[tuple]:
        return [r for r in reads if r[0] == KIND_INPUT]
    assert len(inputs(merged)) < len(inputs(sliced))
    assert sum(r[2] for r in inputs(merged)) == sum(r[2] for r in inputs(sliced))
