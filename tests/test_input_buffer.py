"""hw/input_buffer.py in the Amaranth simulator: runs answered from the halves as a DMA would answer them.

A Python model holds what each half was filled with; blocks are filled and read in turn through both
halves, with random run offsets and lengths (any start word, 1..2 TP words), zero runs, fills of the buffer's
chunk (whole windows, or part of one where NMAX is shorter), and random stalls on every stream. Each
answer must equal the model's words, in command order, with the command's tag; a half is never read
before its fill nor refilled before its last run.
"""

from __future__ import annotations

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from fluidnpu.hw.input_buffer import InputBuffer, buffer_banks, fill_chunk
from fluidnpu.sim_tb.axi_model import StreamSink, StreamSource

TAG = data.StructLayout({"idx": 12})


def test_fills_are_whole_windows_or_a_power_of_two_inside_one():
    assert fill_chunk(128, 32) == 128 and fill_chunk(40, 16) == 32 and fill_chunk(28, 32) == 16
    assert fill_chunk(16, 16) == 16


def test_banks_cover_any_run_once():
    """Any run of up to 2 TP words touches ceil((2 TP + lanes - 1) / lanes) rows of `lanes` words at
    most; the banks are that, rounded up to a power of two (TP = 14, 4 lanes: 31 words -> 8 rows)."""
    assert buffer_banks(14, 4) == 8
    assert buffer_banks(14, 1) == 32
    assert buffer_banks(4, 2) == 8
    assert buffer_banks(3, 4) == 4


def _blocks(rng: random.Random, depth: int, TP: int, n_blocks: int) -> list[tuple[list[int], list[dict]]]:
    """Each block: the words its half is filled with, and its runs (the last one releases the half)."""
    out = []
    for _ in range(n_blocks):
        words = [rng.randrange(1 << 16) for _ in range(rng.randint(depth // 2, depth))]
        runs = []
        for _ in range(rng.randint(3, 40)):
            n = rng.randint(1, 2 * TP)
            runs.append({"offset": rng.randrange(len(words) - n + 1), "nwords": n, "zero": rng.random() < 0.15})
        out.append((words, runs))
    return out


def _simulate(TP: int, nmax: int, depth: int, lanes: int, seed: int, stall: float) -> None:
    rng = random.Random(seed)
    dut = InputBuffer(TP=TP, nmax=nmax, depth=depth, tag=TAG, lanes=lanes)
    blocks = _blocks(rng, dut.depth, TP, 6)
    fills, runs, expected, fill_of, run_of = [], [], [], [], []
    for bi, (words, block_runs) in enumerate(blocks):
        chunks = [words[i: i + dut.chunk] for i in range(0, len(words), dut.chunk)]
        for ci, chunk in enumerate(chunks):
            fills.append({"half": bi % 2, "offset": ci * dut.chunk, "nwords": len(chunk), "last": ci == len(chunks) - 1,
                          "data": sum(w << (16 * i) for i, w in enumerate(chunk))})
            fill_of.append(bi)
        for ri, r in enumerate(block_runs):
            tag = (bi * 64 + ri) % 4096
            runs.append({**r, "half": bi % 2, "last": ri == len(block_runs) - 1, "tag": {"idx": tag}})
            run_of.append(bi)
            got = [0] * r["nwords"] if r["zero"] else words[r["offset"]: r["offset"] + r["nwords"]]
            expected.append((got + [0] * (nmax - r["nwords"]), tag))
    filler = StreamSource(dut.fill, fills, valid_prob=1 - stall, seed=seed + 1)
    reader = StreamSource(dut.cmd, runs, valid_prob=1 - stall, seed=seed + 2)
    sink = StreamSink(dut.rsp, len(runs), ready_prob=1 - stall, seed=seed + 3, timeout=200_000)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for proc in (filler, reader, sink):
        sim.add_process(proc.process)
    sim.run()
    layout = dut.rsp.payload.shape()
    got = [([(c.data >> (16 * i)) & 0xFFFF for i in range(nmax)], c.tag.idx)
           for c in (layout.from_bits(raw) for raw in sink.items)]
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"run {i}: {g} != {e}"
    # a block's first run is taken only after its fill's last response; a half is refilled only
    # after the run that released it
    for bi in range(len(blocks)):
        fill_cycles = [c for c, b in zip(filler.accept_cycles, fill_of) if b == bi]
        run_cycles = [c for c, b in zip(reader.accept_cycles, run_of) if b == bi]
        assert fill_cycles[-1] < run_cycles[0]
        if bi >= 2:
            assert max(c for c, b in zip(reader.accept_cycles, run_of) if b == bi - 2) < fill_cycles[0]


@pytest.mark.parametrize("TP,nmax,depth,lanes,seed,stall", [
    (4, 16, 200, 2, 1, 0.0),          # window 16 words = nmax
    (4, 16, 200, 4, 2, 0.4),          # 4 banks of 4 lanes
    (14, 128, 700, 4, 3, 0.3),        # the ZC706 pick's TP: 8 banks of 4 lanes, nmax 4 windows
    (3, 24, 90, 1, 4, 0.5),           # one lane a bank, nmax not a multiple of the window (8)
    (14, 28, 300, 4, 5, 0.3),         # nmax shorter than the window (32): fills of 16 words inside one
])
def test_runs_answered_from_the_halves(TP, nmax, depth, lanes, seed, stall):
    _simulate(TP, nmax, depth, lanes, seed, stall)
