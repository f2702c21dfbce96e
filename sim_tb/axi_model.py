"""Amaranth-simulator models: an AXI4 slave RAM and stream drivers/sinks.

These run inside `amaranth.sim.Simulator` (as `add_process` coroutines), so
unit tests of AXI masters (the DMA engines, later the whole NPU) need no HDL
simulator. Every model is written as a synchronous circuit: at each clock
edge it looks at the values *sampled at that edge* (`ctx.tick().sample`),
decides which handshakes happened, and then drives its outputs for the next
cycle — exactly what a registered RTL slave would do, so a master that
relies on anything else (say, a valid that drops before ready) is caught.

`AxiRamModel` randomises AxREADY/WREADY, R/B valid gaps and latency per
channel from a seeded RNG, can answer SLVERR for chosen address ranges, checks
the master's side of the protocol (stable payloads while valid, burst type
and size, no 4 KiB crossing, WLAST placement) and records per-cycle
statistics that throughput tests read.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from amaranth.hdl import Value

AXI_RESP_SLVERR = 0b10


@dataclass(frozen=True)
class SlaveTiming:
    """Handshake behaviour of `AxiRamModel`.

    Probabilities are per cycle; latencies are extra cycles (drawn uniformly
    from the inclusive range) between an accepted AR (or a burst's last W
    beat, whichever of AW and last W comes later) and the first R beat (B).
    The defaults are an ideal pipelined memory: everything ready, one beat per
    cycle, data the cycle after the address.
    """

    ar_ready: float = 1.0
    r_valid: float = 1.0
    aw_ready: float = 1.0
    w_ready: float = 1.0
    b_valid: float = 1.0
    read_latency: tuple[int, int] = (0, 0)
    write_latency: tuple[int, int] = (0, 0)

    @classmethod
    def jittery(cls, p: float = 0.6, latency: tuple[int, int] = (0, 10)) -> SlaveTiming:
        """Random stalls on every channel and random latency: the stress setting."""
        return cls(p, p, p, p, p, latency, latency)


@dataclass
class _Burst:
    addr: int
    beats: int
    err: bool
    ready_at: int = 0
    done: int = 0


@dataclass
class AxiStats:
    """What happened on the bus, by clock edge (cycle) number."""

    ar_cycles: list[int] = field(default_factory=list)
    aw_cycles: list[int] = field(default_factory=list)
    r_cycles: list[int] = field(default_factory=list)
    w_cycles: list[int] = field(default_factory=list)
    b_cycles: list[int] = field(default_factory=list)
    max_reads_in_flight: int = 0
    max_writes_in_flight: int = 0


def beats_per_cycle(cycles: list[int]) -> float:
    """Sustained rate of a list of handshake cycles: beats / (last − first + 1)."""
    if not cycles:
        return 0.0
    return len(cycles) / (cycles[-1] - cycles[0] + 1)


class AxiRamModel:
    """An AXI4 slave backed by a bytearray, for Amaranth simulation.

    `axi` is a master-view interface object with AMBA member names (the
    `hw.axi.axi4_signature` members, or just the read or the write half); the
    model drives its `In` members. Addresses wrap modulo `size`. Bursts that
    touch any `[lo, hi)` in `error_ranges` answer SLVERR (reads still return
    data, writes are dropped). Protocol violations raise AssertionError inside
    the simulation. `mem`: share another model's bytearray (one model per port
    of a multi-port master, all on one memory).
    """

    def __init__(self, axi, *, size: int, data_width: int, timing: SlaveTiming = SlaveTiming(),
                 seed: int = 0, error_ranges: tuple[tuple[int, int], ...] = (), mem: bytearray | None = None):
        self.axi = axi
        self.mem = bytearray(size) if mem is None else mem
        self.size = size
        self.beat_bytes = data_width // 8
        self.timing = timing
        self.rng = random.Random(seed)
        self.error_ranges = tuple(error_ranges)
        self.stats = AxiStats()
        members = axi.signature.members
        self.has_read = "arvalid" in members
        self.has_write = "awvalid" in members
        self.cycle = 0
        # Read state.
        self._reads: deque[_Burst] = deque()
        self._r_beat: tuple[int, int, int] | None = None     # (data, resp, last) on the bus
        # Write state.
        self._writes: deque[_Burst] = deque()                # AW accepted, W not all in
        self._w_beats: deque[tuple[int, int, int]] = deque()  # (data, strb, last) not yet matched
        self._b_pending: deque[_Burst] = deque()
        self._b_on_bus: _Burst | None = None
        self._writes_in_flight = 0
        # Slave outputs for the current cycle.
        self._arready = self._awready = self._wready = 0
        # Protocol checker: payload of a valid not yet accepted, per channel.
        self._held: dict[str, tuple | None] = {"ar": None, "aw": None, "w": None}

    # -- helpers -------------------------------------------------------------

    def _err(self, addr: int, nbytes: int) -> bool:
        return any(addr < hi and lo < addr + nbytes for lo, hi in self.error_ranges)

    def _chance(self, p: float) -> bool:
        return p >= 1.0 or self.rng.random() < p

    def _latency(self, span: tuple[int, int]) -> int:
        return span[0] if span[0] == span[1] else self.rng.randint(*span)

    def _check_stable(self, ch: str, valid: int, ready: int, payload: tuple) -> None:
        held = self._held[ch]
        if held is not None:
            assert valid, f"{ch}valid dropped before the handshake (cycle {self.cycle})"
            assert payload == held, f"{ch} payload changed while waiting: {held} -> {payload}"
        self._held[ch] = payload if valid and not ready else None

    def _check_burst(self, ch: str, addr: int, length: int, size: int, burst: int) -> None:
        nbytes = (length + 1) * self.beat_bytes
        assert burst == 1, f"{ch}burst {burst} is not INCR"
        assert 1 << size == self.beat_bytes, f"{ch}size {size} is not the full bus width"
        assert addr % self.beat_bytes == 0, f"{ch}addr {addr:#x} is not beat-aligned"
        assert addr // 4096 == (addr + nbytes - 1) // 4096, f"{ch} burst {addr:#x}+{nbytes} crosses 4 KiB"

    def _read_beat(self, burst: _Burst) -> tuple[int, int, int]:
        a = (burst.addr + burst.done * self.beat_bytes) % self.size
        word = int.from_bytes(self.mem[a:a + self.beat_bytes], "little")
        return word, AXI_RESP_SLVERR if burst.err else 0, int(burst.done == burst.beats - 1)

    def _write_beat(self, addr: int, word: int, strb: int) -> None:
        a = addr % self.size
        raw = word.to_bytes(self.beat_bytes, "little")
        for b in range(self.beat_bytes):
            if strb >> b & 1:
                self.mem[a + b] = raw[b]

    # -- the clocked process --------------------------------------------------

    def _sampled(self) -> list[tuple[str, Value]]:
        names = []
        if self.has_read:
            names += ["arvalid", "araddr", "arlen", "arsize", "arburst", "rready"]
        if self.has_write:
            names += ["awvalid", "awaddr", "awlen", "awsize", "awburst", "wvalid", "wdata", "wstrb",
                      "wlast", "bready"]
        return [(n, getattr(self.axi, n)) for n in names]

    async def process(self, ctx) -> None:
        """Add with `sim.add_process(model.process)`; runs in the background forever."""
        sampled = self._sampled()
        self._drive(ctx)
        async for _clk, rst, *values in ctx.tick().sample(*(s for _, s in sampled)):
            self.cycle += 1
            if rst:
                continue
            v = dict(zip((n for n, _ in sampled), values))
            if self.has_read:
                self._edge_read(v)
            if self.has_write:
                self._edge_write(v)
            self._drive(ctx)

    def _edge_read(self, v: dict[str, int]) -> None:
        t, st = self.timing, self.stats
        self._check_stable("ar", v["arvalid"], self._arready,
                           (v["araddr"], v["arlen"], v["arsize"], v["arburst"]))
        if v["arvalid"] and self._arready:
            self._check_burst("ar", v["araddr"], v["arlen"], v["arsize"], v["arburst"])
            beats = v["arlen"] + 1
            self._reads.append(_Burst(v["araddr"], beats, self._err(v["araddr"], beats * self.beat_bytes),
                                      ready_at=self.cycle + 1 + self._latency(t.read_latency)))
            st.ar_cycles.append(self.cycle)
            st.max_reads_in_flight = max(st.max_reads_in_flight, len(self._reads))
        if self._r_beat is not None and v["rready"]:
            st.r_cycles.append(self.cycle)
            burst = self._reads[0]
            burst.done += 1
            if burst.done == burst.beats:
                self._reads.popleft()
            self._r_beat = None
        if (self._r_beat is None and self._reads and self._reads[0].ready_at <= self.cycle + 1
                and self._chance(t.r_valid)):
            self._r_beat = self._read_beat(self._reads[0])
        self._arready = int(self._chance(t.ar_ready))

    def _edge_write(self, v: dict[str, int]) -> None:
        t, st = self.timing, self.stats
        self._check_stable("aw", v["awvalid"], self._awready,
                           (v["awaddr"], v["awlen"], v["awsize"], v["awburst"]))
        self._check_stable("w", v["wvalid"], self._wready, (v["wdata"], v["wstrb"], v["wlast"]))
        if v["awvalid"] and self._awready:
            self._check_burst("aw", v["awaddr"], v["awlen"], v["awsize"], v["awburst"])
            beats = v["awlen"] + 1
            self._writes.append(_Burst(v["awaddr"], beats, self._err(v["awaddr"], beats * self.beat_bytes)))
            self._writes_in_flight += 1
            st.aw_cycles.append(self.cycle)
            st.max_writes_in_flight = max(st.max_writes_in_flight, self._writes_in_flight)
        if v["wvalid"] and self._wready:
            self._w_beats.append((v["wdata"], v["wstrb"], v["wlast"]))
            st.w_cycles.append(self.cycle)
        # Retire every burst whose address and data have all arrived, in order.
        while self._writes and len(self._w_beats) >= self._writes[0].beats:
            burst = self._writes.popleft()
            for k in range(burst.beats):
                word, strb, last = self._w_beats.popleft()
                assert last == int(k == burst.beats - 1), \
                    f"WLAST={last} on beat {k} of a {burst.beats}-beat burst at {burst.addr:#x}"
                if not burst.err:
                    self._write_beat(burst.addr + k * self.beat_bytes, word, strb)
            burst.ready_at = self.cycle + 1 + self._latency(t.write_latency)
            self._b_pending.append(burst)
        if self._b_on_bus is not None and v["bready"]:
            st.b_cycles.append(self.cycle)
            self._b_on_bus = None
            self._writes_in_flight -= 1
        if (self._b_on_bus is None and self._b_pending and self._b_pending[0].ready_at <= self.cycle + 1
                and self._chance(t.b_valid)):
            self._b_on_bus = self._b_pending.popleft()
        self._awready = int(self._chance(t.aw_ready))
        self._wready = int(self._chance(t.w_ready))

    def _drive(self, ctx) -> None:
        axi = self.axi
        if self.has_read:
            ctx.set(axi.arready, self._arready)
            data, resp, last = self._r_beat or (0, 0, 0)
            ctx.set(axi.rvalid, int(self._r_beat is not None))
            ctx.set(axi.rdata, data)
            ctx.set(axi.rresp, resp)
            ctx.set(axi.rlast, last)
        if self.has_write:
            ctx.set(axi.awready, self._awready)
            ctx.set(axi.wready, self._wready)
            b = self._b_on_bus
            ctx.set(axi.bvalid, int(b is not None))
            ctx.set(axi.bresp, AXI_RESP_SLVERR if b is not None and b.err else 0)


class StreamSource:
    """Feeds payloads (mappings for the stream's layout) into an `amaranth.lib.stream` input.

    `valid_prob` inserts random idle cycles between items; `accept_cycles`
    records the edge at which each item was taken.
    """

    def __init__(self, port, items, *, valid_prob: float = 1.0, seed: int = 0):
        self.port = port
        self.items = list(items)
        self.valid_prob = valid_prob
        self.rng = random.Random(seed)
        self.accept_cycles: list[int] = []

    async def process(self, ctx) -> None:
        port, pending, cycle = self.port, deque(self.items), 0
        presenting = False

        def present() -> bool:
            if pending and (self.valid_prob >= 1.0 or self.rng.random() < self.valid_prob):
                ctx.set(port.payload, pending[0])
                ctx.set(port.valid, 1)
                return True
            ctx.set(port.valid, 0)
            return False

        presenting = present()
        async for _clk, rst, ready in ctx.tick().sample(port.ready):
            cycle += 1
            if presenting and ready and not rst:
                self.accept_cycles.append(cycle)
                pending.popleft()
                presenting = False
            if not presenting:
                presenting = present()


class StreamSink:
    """Collects `count` payloads from an `amaranth.lib.stream` output, as raw ints.

    Critical while it runs, so `sim.run()` returns once everything has arrived;
    `ready_prob` adds random backpressure; `timeout` cycles bound a hang.
    """

    def __init__(self, port, count: int, *, ready_prob: float = 1.0, seed: int = 0, timeout: int = 100_000):
        self.port = port
        self.count = count
        self.ready_prob = ready_prob
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.items: list[int] = []
        self.cycles: list[int] = []

    def _ready(self) -> int:
        return int(self.ready_prob >= 1.0 or self.rng.random() < self.ready_prob)

    async def process(self, ctx) -> None:
        port, cycle = self.port, 0
        with ctx.critical():
            ready = self._ready()
            ctx.set(port.ready, ready)
            async for _clk, rst, valid, payload in ctx.tick().sample(port.valid, Value.cast(port.payload)):
                cycle += 1
                if valid and ready and not rst:
                    self.items.append(payload)
                    self.cycles.append(cycle)
                if len(self.items) == self.count:
                    break
                assert cycle < self.timeout, f"stream sink: only {len(self.items)}/{self.count} after {cycle} cycles"
                ready = self._ready()
                ctx.set(port.ready, ready)
