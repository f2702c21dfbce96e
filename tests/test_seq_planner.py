"""The control unit's planner (hw/seq_planner.py) on its own, in Amaranth's simulator.

The testbench plays the DMA (descriptor read commands taken with random
backpressure, their words answered in order after a random latency), the
FBCB (a synchronous-read table) and the other three machines (`drained`).
Checked: the descriptor reads, the plan against the DSE's explicit block
schedule (dse/tiling.py), the planning time against the DSE's model of it,
the layer loop, and the errors.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from fluidnpu.dse.tiling import layer_schedule, planning_cycles
from fluidnpu.hw.descriptor import DESC_STRIDE_BYTES, LayerDescriptor
from fluidnpu.hw.regmap import K_CODES, ErrorCode, KCode, encode_fbcb_entry
from fluidnpu.hw.seq_planner import SeqPlanner
from fluidnpu.hw.seq_streams import DESC_CMD_WORDS, KIND_DESC
from fluidnpu.sim_tb.seq_bench import block_rows, plan_values

TR, TP, TC, NB, BMAX, NMAX = 16, 4, 4, 4, 4, 16
BASE = 0x1000


def conv(layer: int, cout: int, hw: int = 3, cin: int = 5) -> LayerDescriptor:
    return LayerDescriptor(layer=layer, in_h=hw, in_w=hw, cin=cin, out_h=hw, out_w=hw, cout=cout, kh=3, kw=3,
                           ph=1, pw=1, src_base=0x8000, src_sample_stride=2 * hw * hw * cin,
                           dst_base=0xA000, dst_sample_stride=2 * hw * hw * cout, weight_base=0xC000,
                           bias_base=0xE000)


def run(descs: list[LayerDescriptor], modes: list[tuple[int, int]], b: int, *, stackable: bool = True,
        seed: int = 0, ready_prob: float = 0.5) -> dict:
    """Run a subnet of `descs` with FBCB <BR, k> `modes` (one per layer) at batch b."""
    dut = SeqPlanner(TR=TR, TP=TP, TC=TC, NB=NB, bmax=BMAX, layers=3, nmax=NMAX, stackable=stackable)
    fbcb = [0] * (3 * BMAX)
    for i, (br, k) in enumerate(modes):
        # a k code the map does not define (3) is written raw, as a corrupted FBCB would hold it
        fbcb[descs[i].layer * BMAX + b - 1] = encode_fbcb_entry(br, k, BMAX) if k in K_CODES else k | (br - 1) << 2
    memory = {BASE + i * DESC_STRIDE_BYTES: d.words() for i, d in enumerate(descs)}
    rng = random.Random(seed)
    out: dict = {"cmds": [], "plans": [], "go": [], "last_chunk": [], "layer_done": 0}

    async def bench(ctx):
        ctx.set(dut.desc_base, BASE)
        ctx.set(dut.desc_count, len(descs))
        ctx.set(dut.bactive, b)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        answers: list[tuple[int, dict]] = []       # (due cycle, chunk), in command order
        drain_at = None
        for cycle in range(5000):
            ready = rng.random() < ready_prob
            ctx.set(dut.desc_cmd.ready, ready)
            due = answers and answers[0][0] <= cycle
            ctx.set(dut.desc_rsp.valid, bool(due))
            if due:
                ctx.set(dut.desc_rsp.payload, answers.pop(0)[1])
                if not answers and len(out["cmds"]) % 3 == 0:
                    out["last_chunk"].append(cycle)
            ctx.set(dut.drained, drain_at is not None and cycle >= drain_at)
            _, _, valid, cmd, go, addr, done, error, code, layer_done = await ctx.tick().sample(
                dut.desc_cmd.valid, dut.desc_cmd.payload, dut.go, dut.fbcb_addr, dut.done, dut.error,
                dut.error_code, dut.layer_done)
            ctx.set(dut.fbcb_data, fbcb[addr])                    # the FBCB answers a cycle later
            if valid and ready:
                out["cmds"].append({"addr": cmd.addr, "nwords": cmd.nwords, "kind": cmd.tag.kind,
                                    "idx": cmd.tag.idx})
                words = memory[cmd.addr & ~(DESC_STRIDE_BYTES - 1)]
                halves = [(w >> s) & 0xFFFF for w in words for s in (0, 16)]
                first = cmd.tag.idx
                data = sum(h << (16 * i) for i, h in enumerate(halves[first:first + DESC_CMD_WORDS]))
                answers.append((cycle + rng.randint(2, 9), {"idx": first, "data": data}))
            if go:
                out["go"].append(cycle)
                out["plans"].append(ctx.get(dut.plan))
                drain_at = cycle + rng.randint(1, 20)
            if layer_done:
                out["layer_done"] += 1
                drain_at = None
            if done or error:
                out["result"] = ("done", 0) if done else ("error", code)
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def _as_dict(view_const, like: dict) -> dict:
    """The fields of a sampled plan that `like` names, as ints (nested for the block plans)."""
    return {k: (_as_dict(getattr(view_const, k), v) if isinstance(v, dict) else int(getattr(view_const, k)))
            for k, v in like.items()}


CASES = [  # (descriptor, b, BR, k): packed groups, several passes, column tiles, each mode
    (conv(0, cout=2), 4, 1, KCode.K1),           # 4 groups of 1 sample, 2 per pass (C=2 of 4 PEs)
    (conv(0, cout=1, hw=4), 3, 1, KCode.KHALF),  # 8 PEs of TP/2: 3 groups in one pass
    (conv(0, cout=6), 3, 2, KCode.K1),           # C > TC: one group per pass, last pass shorter
    (conv(0, cout=2, hw=5), 4, 2, KCode.K2),     # 2 PEs of 2TP: groups of 2 samples, 25*2 rows > TR/2
    (conv(0, cout=3, hw=2), 1, 1, KCode.K1),     # one block
]


@pytest.mark.parametrize("desc,b,BR,k", CASES)
def test_plan_matches_the_dse_schedule(desc, b, BR, k):
    out = run([desc], [(BR, k)], b, seed=b * 10 + BR)
    assert out["result"] == ("done", 0) and out["layer_done"] == 1
    assert [c["addr"] for c in out["cmds"]] == [BASE + 2 * DESC_CMD_WORDS * i for i in range(3)]
    assert {(c["kind"], c["nwords"]) for c in out["cmds"]} == {(KIND_DESC, DESC_CMD_WORDS)}
    want = plan_values(desc, TR=TR, TP=TP, TC=TC, NB=NB, b=b, BR=BR, k=k)
    got = out["plans"][0]
    npass = -(-want["BP"] // want["g"])
    keys = [k for k in want if k not in ("desc", "full", "last")] + ["last"] + (["full"] if npass > 1 else [])
    assert _as_dict(got, {k: want[k] for k in keys}) == {k: want[k] for k in keys}
    assert {k: int(getattr(got.desc, k)) for k in want["desc"]} == want["desc"]

    # the DSE's explicit schedule has the same passes and blocks
    sched = layer_schedule(TR, TP, TC, desc.npix, desc.P, desc.cout, b, BR, k)
    assert sched.groups_per_pass == want["g"] and sched.TPk == want["TPk"] and sched.TCk == want["nPE"]
    tile0 = [blk for blk in sched.blocks if blk.c0 == 0]
    expect = block_rows(want, "full") * (npass - 1) + block_rows(want, "last")
    assert [blk.rows for blk in tile0] == expect


def test_planning_time_follows_the_dse_model():
    """From the descriptor's last word to `go`: the DSE's planning_cycles plus a constant."""
    gaps = set()
    for desc, b, BR, k in CASES:
        out = run([desc], [(BR, k)], b, ready_prob=1.0)
        sched = layer_schedule(TR, TP, TC, desc.npix, desc.P, desc.cout, b, BR, k)
        gaps.add(out["go"][0] - out["last_chunk"][0] - planning_cycles(sched))
    assert len(gaps) == 1, gaps


def test_layer_loop_reads_each_descriptor_and_waits_for_the_drain():
    descs = [conv(0, cout=2), conv(1, cout=6), conv(2, cout=3, hw=2)]
    out = run(descs, [(1, KCode.K1), (2, KCode.KHALF), (1, KCode.K2)], 2, seed=5, ready_prob=0.3)
    assert out["result"] == ("done", 0) and out["layer_done"] == 3 and len(out["go"]) == 3
    assert [c["addr"] for c in out["cmds"]] == [BASE + i * DESC_STRIDE_BYTES + 2 * DESC_CMD_WORDS * j
                                               for i in range(3) for j in range(3)]
    assert [int(p.desc.layer) for p in out["plans"]] == [0, 1, 2]


@pytest.mark.parametrize("modes,b,stackable", [
    ([(1, KCode.K2)], 2, False),      # a plain-PE engine has k = 1 only
    ([(3, KCode.K1)], 2, True),       # BR > b
    ([(1, 3)], 2, True),              # no such k code
])
def test_unrunnable_fbcb_entries_are_bad_descriptors(modes, b, stackable):
    out = run([conv(0, cout=2)], modes, b, stackable=stackable)
    assert out["result"] == ("error", ErrorCode.BAD_DESCRIPTOR) and not out["go"]


def test_bad_bactive_is_refused_before_any_read():
    out = run([conv(0, cout=2)], [(1, KCode.K1)], 0)
    assert out["result"] == ("error", ErrorCode.BAD_BACTIVE) and not out["cmds"]
