"""cocotb test of the generated `AxiDma` Verilog against cocotbext-axi's `AxiRam`.

Run by tests/test_dma.py through `fluidnpu.sim_tb.runner.run_cocotb`; the
engine parameters arrive as JSON in `FLUIDNPU_DMA_PARAMS` (`ports`: AXI
ports, default 1; `read_streams`: 2 drives the second read stream `rd_cmd1`/`rd_rsp1`
beside the first, as the NPU's two walkers do, each with its own idle cycles and
backpressure, each checked in its own order). Each port `m_axi<i>` gets its own `AxiRam`, all on one
memory (`sim_tb/cocotb_ram.py`); every AXI channel of every port gets its own
random pause generator (a different stall probability per port, so the ports
run out of step), the command inputs random idle cycles and the response
output random backpressure. Reads and writes run
concurrently on disjoint regions, then everything written is read back
(through the DMA and directly from the RAM) and compared.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from fluidnpu.hw.axi import m_axi_name
from fluidnpu.hw.dma import read_cmd_layout, read_rsp_layout, write_cmd_layout
from fluidnpu.sim_tb.cocotb_ram import axi_rams

PAGE = 4096
MEM = 4 * PAGE
WRITE_REGION = (0, 2 * PAGE)           # written, then read back
READ_REGION = (2 * PAGE, 4 * PAGE)     # read while the writes are going on


def _params() -> dict:
    return json.loads(os.environ["FLUIDNPU_DMA_PARAMS"])


def _addr(rng: random.Random, region: tuple[int, int], nwords: int) -> int:
    """2-aligned address in region; a third of them straddle the page boundary inside it."""
    lo, hi = region
    if rng.random() < 0.35:
        return lo + PAGE - 2 * rng.randint(1, nwords)
    return lo + 2 * rng.randrange((hi - lo - 2 * nwords) // 2)


async def _send(dut, prefix: str, layout, items: list[dict], rng: random.Random) -> None:
    """Drive a valid/ready stream input; handshakes are sampled at the rising edge."""
    valid, ready, payload = (getattr(dut, f"{prefix}__{n}") for n in ("valid", "ready", "payload"))
    for item in items:
        while rng.random() < 0.3:
            valid.value = 0
            await RisingEdge(dut.clk)
        payload.value = layout.const(item).as_value().value
        valid.value = 1
        await RisingEdge(dut.clk)
        while not ready.value:
            await RisingEdge(dut.clk)
    valid.value = 0


async def _receive(dut, layout, count: int, rng: random.Random, out: list, prefix: str = "rd_rsp") -> None:
    """Collect `count` read responses with random backpressure."""
    valid, ready, payload = (getattr(dut, f"{prefix}__{n}") for n in ("valid", "ready", "payload"))
    while len(out) < count:
        ready.value = int(rng.random() < 0.7)
        await RisingEdge(dut.clk)
        if valid.value and ready.value:
            c = layout.from_bits(payload.value.to_unsigned())
            out.append((list(c.data), int(c.nwords), int(c.tag)))
    ready.value = 0


async def _count_bursts(dut, prefix: str, counts: dict) -> None:
    """Count AR and AW handshakes on one port (each port must carry its share)."""
    arv, arr, awv, awr = (getattr(dut, f"{prefix}__{n}") for n in ("arvalid", "arready", "awvalid", "awready"))
    while True:
        await RisingEdge(dut.clk)
        counts["ar"] += int(arv.value and arr.value)
        counts["aw"] += int(awv.value and awr.value)


async def _reads(dut, cmds: list[dict], rsp_layout, cmd_layout, rng: random.Random, streams: int = 1) -> list:
    """Every command answered, in order per stream: with two streams the odd-numbered commands go
    on the second, both streams driven at once; the responses come back in `cmds`' order."""
    parts = [cmds[s::streams] for s in range(streams)]
    got: list[list] = [[] for _ in parts]
    rx = [cocotb.start_soon(_receive(dut, rsp_layout, len(part), random.Random(rng.random()), out, f"rd_rsp{sfx}"))
          for part, out, sfx in zip(parts, got, ("", "1"))]
    tx = [cocotb.start_soon(_send(dut, f"rd_cmd{sfx}", cmd_layout, part, random.Random(rng.random())))
          for part, sfx in zip(parts, ("", "1"))]
    for task in tx + rx:
        await task
    return [got[k % streams][k // streams] for k in range(len(cmds))]


def _expect(mem: bytes, cmd: dict, nmax: int) -> tuple[list[int], int, int]:
    words = [] if cmd["zero"] else [int.from_bytes(mem[cmd["addr"] + 2 * i: cmd["addr"] + 2 * i + 2], "little")
                                    for i in range(cmd["nwords"])]
    return words + [0] * (nmax - len(words)), cmd["nwords"], cmd["tag"]


@cocotb.test()
async def dma_against_cocotbext_axi_ram(dut):
    p = _params()
    nmax, tag_width = p["nmax"], p["tag_width"]
    rng = random.Random(p.get("seed", 1))
    rd_cmd_l = read_cmd_layout(32, nmax, tag_width)
    rd_rsp_l = read_rsp_layout(nmax, tag_width)
    wr_cmd_l = write_cmd_layout(32, nmax)

    # the first rising edge half a period in: Icarus settles the design (initial values,
    # continuous assignments) at time 0, after a clock edge at 0 would have been sampled
    Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False)
    dut.rst.value = 1
    dut.rd_cmd__valid.value = 0
    dut.wr_cmd__valid.value = 0
    dut.rd_rsp__ready.value = 0
    streams = p.get("read_streams", 1)
    if streams == 2:
        dut.rd_cmd1__valid.value = 0
        dut.rd_rsp1__ready.value = 0
        dut.rd_restart.value = 0
    rams = axi_rams(dut, MEM, pause=0.4, seed=10)
    assert len(rams) == p.get("ports", 1)
    ram = rams[0]
    bursts = [{"ar": 0, "aw": 0} for _ in rams]
    for i, counts in enumerate(bursts):
        cocotb.start_soon(_count_bursts(dut, m_axi_name(i), counts))
    image = bytearray(rng.randbytes(MEM))
    ram.write(0, bytes(image))
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)

    # Phase 1: writes into one region while reads stream from the other.
    writes: list[dict] = []
    written: set[int] = set()
    while len(writes) < 60:
        n = rng.randint(1, nmax)
        addr = _addr(rng, WRITE_REGION, n)
        span = set(range(addr, addr + 2 * n))
        if len(rams) > 1 and span & written:
            continue        # writes on different ports finish in no fixed order: keep them disjoint
        written |= span
        writes.append({"addr": addr, "nwords": n, "data": [rng.randrange(1 << 16) for _ in range(nmax)]})
    reads = []
    for k in range(60):
        n = rng.randint(1, nmax)
        reads.append({"addr": _addr(rng, READ_REGION, n), "nwords": n, "zero": int(rng.random() < 0.15),
                      "tag": k % (1 << tag_width)})
    writer = cocotb.start_soon(_send(dut, "wr_cmd", wr_cmd_l, writes, random.Random(rng.random())))
    got = await _reads(dut, reads, rd_rsp_l, rd_cmd_l, rng, streams)
    await writer
    for k, (cmd, rsp) in enumerate(zip(reads, got)):
        assert rsp == _expect(image, cmd, nmax), f"read {k} {cmd}: got {rsp}"

    for w in writes:
        for i in range(w["nwords"]):
            image[w["addr"] + 2 * i: w["addr"] + 2 * i + 2] = w["data"][i].to_bytes(2, "little")
    for _ in range(2000):
        await RisingEdge(dut.clk)
        if dut.wr_idle.value:
            break
    assert dut.wr_idle.value, "write engine never became idle"
    assert ram.read(0, MEM) == bytes(image), "memory differs from the expected image after the writes"

    # Phase 2: read the written region back through the DMA.
    back = []
    for k in range(40):
        n = rng.randint(1, nmax)
        back.append({"addr": _addr(rng, WRITE_REGION, n), "nwords": n, "zero": 0, "tag": k % (1 << tag_width)})
    got = await _reads(dut, back, rd_rsp_l, rd_cmd_l, rng, streams)
    for k, (cmd, rsp) in enumerate(zip(back, got)):
        assert rsp == _expect(image, cmd, nmax), f"read-back {k} {cmd}: got {rsp}"
    await ClockCycles(dut.clk, 2)
    assert dut.rd_idle.value == 1
    assert dut.rd_error.value == 0 and dut.wr_error.value == 0
    # round-robin: every port carried reads and writes (a write crossing 4 KiB is two bursts)
    assert all(c["ar"] > 0 and c["aw"] >= len(writes) // len(rams) for c in bursts), bursts
