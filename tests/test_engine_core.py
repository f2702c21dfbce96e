"""EngineCore against the numpy golden model, in the Amaranth simulator.

A small Python sequencer (`CoreDriver`) plays the control unit's part: it
writes weights, bias and input rows into the free double-buffer half (after
the step that used it has been `released`), issues steps, drains staging after
`block_done`, and records what the core did every cycle. A `Plan` builds the
steps of a layer and, alongside, what staging must hold, straight from
fluidnpu.hw.reference. Words the core must ignore (lanes beyond TPk, weight
columns beyond C, bias words beyond the tile) are random junk, not zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings, strategies as st

from fluidnpu.hw.engine_core import K1, K2, KHALF, EngineCore
from fluidnpu.hw.reference import (
    INT16_MAX,
    INT16_MIN,
    block_output,
    pack_bias,
    pack_words,
    postprocess,
    unpack_words,
    wrap32,
)
from fluidnpu.hw.regmap import chain_position, chains

SMALL = dict(TR=8, TP=4, TC=4, NB=4)
ODD = dict(TR=6, TP=3, TC=5, NB=2)
LONG = dict(TR=8, TP=35, TC=3, NB=2)    # halves of 17 and 18 lanes: two DSP chains each, skews up to 15


def sized(**cfg) -> EngineCore:
    """A core only inspected for its parameters (not simulated): no unused-elaboratable warning."""
    core = EngineCore(**cfg)
    core._MustUse__silence = True
    return core


def mode_dims(core: EngineCore, k: int) -> tuple[int, int, int]:
    """(nPE, TPk, TRk) of mode k (docs/hw-architecture.md, "Modes")."""
    TR, TP, TC = core.TR, core.TP, core.TC
    return {K1: (TC, TP, TR), K2: (TC // 2, 2 * TP, TR // 2), KHALF: (2 * TC, TP // 2, TR // 2)}[k]


# ---------------------------------------------------------------------------
# what the sequencer does: steps with their buffer writes, and the expected staging
# ---------------------------------------------------------------------------
@dataclass
class Job:
    t: int
    first: bool
    last: bool
    w_writes: list[tuple[int, int, int]] = field(default_factory=list)     # (q, lane, data)
    b_writes: list[tuple[int, int, int]] = field(default_factory=list)     # (q, base, data)
    in_writes: list[tuple[int, int, int]] = field(default_factory=list)    # (q, j, data)
    expect: np.ndarray | None = None     # last step: rows x 2TC expected words
    check: np.ndarray | None = None      # last step: rows x 2TC bool, which words are defined

    def writes_left(self) -> int:
        return len(self.w_writes) + len(self.b_writes) + len(self.in_writes)


@dataclass
class Layer:
    k: int
    g: int
    cw: int
    shift: int
    relu: bool
    jobs: list[Job]
    g_after: int | None = None    # set g to this as soon as the last step is released (next pass)


class Plan:
    """Builds a layer's jobs for one core, tracking what each double-buffer half
    holds so that steps may also reuse a half without rewriting it."""

    def __init__(self, core: EngineCore, k: int, g: int, cw: int, shift: int, relu: bool,
                 rng: np.random.Generator, n_before: int = 0, extreme: float = 0.2) -> None:
        self.core, self.k, self.g, self.cw, self.shift, self.relu = core, k, g, cw, shift, relu
        self.rng, self.extreme = rng, extreme
        self.n_before = n_before              # jobs of earlier layers: halves alternate globally
        self.nPE, self.TPk, self.TRk = mode_dims(core, k)
        assert 1 <= g <= core.NB and g * cw <= self.nPE and self.TRk // g >= 1
        self.jobs: list[Job] = []
        self.half: dict[int, dict] = {}       # half -> {"X": [g x rows x TPk], "W": TPk x C, "bias": C}

    def int16(self, shape) -> np.ndarray:
        """Random int16, a share of them at the extremes (-32768 included)."""
        v = self.rng.integers(INT16_MIN, INT16_MAX + 1, size=shape, dtype=np.int64)
        ext = self.rng.random(shape) < self.extreme
        return np.where(ext, self.rng.choice([INT16_MIN, INT16_MAX, -1, 0, 1], size=shape), v)

    def layer(self) -> Layer:
        return Layer(self.k, self.g, self.cw, self.shift, self.relu, self.jobs)

    def _half(self) -> int:
        return (self.n_before + len(self.jobs)) % 2

    def step_data(self, t: int, C: int, bias: np.ndarray | None) -> tuple[list[np.ndarray], np.ndarray, Job]:
        """A step writing fresh data: g groups' rows (t x TPk), weights (TPk x C), optional bias."""
        TP = self.core.TP
        X = [self.int16((t, self.TPk)) for _ in range(self.g)]
        Wt = self.int16((self.TPk, C))
        job = Job(t=t, first=False, last=False)
        for lane in range(self.TPk):
            job.w_writes += [(q, lane, pack_words(w)) for q, w in self.group_copies(Wt[lane])]
        if bias is not None:
            job.b_writes += self.bias_copies(bias)
        for q in range(self.g):
            for j in range(t):
                lanes = self.int16(2 * TP)
                lanes[:self.TPk] = X[q][j]
                job.in_writes.append((q, j, pack_words(lanes)))
        return X, Wt, job

    def group_copies(self, row: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """What the control unit writes for one weight row: one 2TC-word vector per group q,
        the row at columns [q*cw, q*cw + C) (the read moved back by q*cw words), other
        columns random (the words before and after the row in memory)."""
        out = []
        for q in range(self.g):
            words = self.int16(2 * self.core.TC)
            words[q * self.cw:q * self.cw + len(row)] = row
            out.append((q, words))
        return out

    def bias_copies(self, bias: np.ndarray) -> list[tuple[int, int, int]]:
        """(q, base, data) of the b_wr writes: per group q, the NMAX/2-column chunks at logical
        bases (multiples of NMAX/2) covering [q*cw, q*cw + C), each read q*cw int32 early."""
        bw, C, out = self.core.nmax // 2, len(bias), []
        for q in range(self.g):
            lo = q * self.cw
            for base in range(lo // bw * bw, lo + C, bw):
                chunk = self.rng.integers(-(1 << 31), 1 << 31, size=bw, dtype=np.int64)
                for i in range(bw):
                    if 0 <= base + i - lo < C:
                        chunk[i] = bias[base + i - lo]
                out.append((q, base, pack_bias(chunk)))
        return out

    def block(self, t: int, steps: int, C: int, reuse: bool = False) -> None:
        """One row block of `steps` weight steps with t rows per group and C real columns.

        reuse: the block writes nothing and runs on whatever the halves hold
        (its bias is the one stored with its first step's half).
        """
        assert 1 <= t <= self.TRk // self.g and C <= self.cw
        acc = None
        for s in range(steps):
            half = self._half()
            if reuse:
                d = self.half[half]
                job = Job(t=t, first=False, last=False)
                X, Wt, bias = [x[:t] for x in d["X"]], d["W"][:, :C], d["bias"][:C]
            else:
                bias = self.rng.integers(-(1 << 31), 1 << 31, size=C, dtype=np.int64) if s == 0 else None
                if s == 0 and self.rng.random() < 0.3:
                    bias = np.where(self.rng.random(C) < 0.5, -(1 << 31), (1 << 31) - 1)
                X, Wt, job = self.step_data(t, C, bias)
                self.half[half] = {"X": X, "W": Wt, "bias": bias if bias is not None else
                                   self.half.get(half, {}).get("bias")}
            job.first, job.last = s == 0, s == steps - 1
            if s == 0:
                acc = [np.broadcast_to(np.asarray(bias, np.int64), (t, C)).copy() for _ in range(self.g)]
            for q in range(self.g):
                acc[q] = acc[q] + X[q].astype(np.int64) @ Wt.astype(np.int64)
            if job.last:
                job.expect, job.check = self._expect(acc, t, C)
            self.jobs.append(job)

    def _expect(self, acc: list[np.ndarray], t: int, C: int) -> tuple[np.ndarray, np.ndarray]:
        TC = self.core.TC
        exp = np.zeros((t, 2 * TC), np.int64)
        chk = np.zeros((t, 2 * TC), bool)
        for q in range(self.g):
            cols = slice(q * self.cw, q * self.cw + C)
            exp[:, cols] = postprocess(wrap32(acc[q]), self.shift, self.relu)
            chk[:, cols] = True
        chk[:, self.nPE:] = True                # columns beyond the mode's PEs read as zero
        return exp, chk


# ---------------------------------------------------------------------------
# the cycle-level driver
# ---------------------------------------------------------------------------
@dataclass
class Trace:
    cycle: int = 0
    accepts: list[int] = field(default_factory=list)
    mac_cycles: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    done: list[tuple[int, int]] = field(default_factory=list)      # (cycle, sb)
    results: list[tuple[Job, np.ndarray]] = field(default_factory=list)


class CoreDriver:
    """Plays the sequencer: double-buffer writes after release, steps, staging drain."""

    def __init__(self, core: EngineCore, preload: bool = False) -> None:
        self.core = core
        self.preload = preload     # hold the first step until every job's writes are done
        self.trace = Trace()
        self.n_issued = 0          # jobs issued so far (all layers)
        self.n_blocks = 0          # blocks so far: staging halves alternate globally

    async def run(self, ctx, layers: list[Layer]) -> Trace:
        core = self.core
        for layer in layers:
            await self._wait_idle(ctx)
            ctx.set(core.k, layer.k)
            ctx.set(core.g, layer.g)
            ctx.set(core.cw, layer.cw)
            ctx.set(core.shift, layer.shift)
            ctx.set(core.relu, int(layer.relu))
            for _ in range(3):
                await self._tick(ctx)
            await self._layer(ctx, layer.jobs, layer.g_after)
        await self._wait_idle(ctx)
        return self.trace

    async def _tick(self, ctx) -> None:
        await ctx.tick()
        self.trace.cycle += 1

    async def _wait_idle(self, ctx) -> None:
        while not ctx.get(self.core.idle):
            await self._tick(ctx)

    async def _layer(self, ctx, jobs: list[Job], g_after: int | None) -> None:  # noqa: C901 - one cycle loop
        core, tr = self.core, self.trace
        base = self.n_issued                       # global index of jobs[0]: its half = index % 2
        n_rel = 0                                  # releases seen in this layer
        nxt = 0                                    # next job to issue
        stage_busy = [False, False]
        sb_of: dict[int, int] = {}                 # job index -> staging half
        blocks_issued = 0
        waiting: list[int] = []                    # last jobs issued, block_done pending (in order)
        drain: list[tuple[int, int]] = []          # (job index, next row) being read back
        rows: dict[int, list] = {}
        pending_read: tuple[int, int] | None = None
        for i, job in enumerate(jobs):
            if job.last:
                sb_of[i] = (self.n_blocks + blocks_issued) % 2
                blocks_issued += 1
        self.n_blocks += blocks_issued
        finished = 0
        n_blocks = blocks_issued
        ports = (("w", core.w_wr), ("b", core.b_wr), ("in", core.in_wr))

        def half_free(i: int) -> bool:
            return i < 2 or n_rel >= i - 1      # job i-2 (same half) has been released

        while finished < n_blocks:
            # --- outputs of this cycle ---
            if ctx.get(core.released):
                n_rel += 1
                tr.released.append(tr.cycle)
                if n_rel == len(jobs) and g_after is not None:
                    ctx.set(core.g, g_after)        # every step released: the next pass may regroup
            if ctx.get(core.mac_active):
                tr.mac_cycles.append(tr.cycle)
            if ctx.get(core.block_done):
                i = waiting.pop(0)
                assert ctx.get(core.block_sb) == sb_of[i]
                tr.done.append((tr.cycle, sb_of[i]))
                drain.append((i, 0))
                rows[i] = []
            if pending_read is not None:
                i, _ = pending_read
                rows[i].append(unpack_words(ctx.get(core.st_data), 2 * core.TC))
                if len(rows[i]) == jobs[i].t:
                    tr.results.append((jobs[i], np.array(rows[i])))
                    stage_busy[sb_of[i]] = False
                    finished += 1
                pending_read = None

            # --- writes: each port serves the earliest job with work left on it, if its half is free ---
            wrote_last: set[int] = set()
            for name, port in ports:
                ctx.set(port.valid, 0)
                for i, job in enumerate(jobs):
                    lst = {"w": job.w_writes, "b": job.b_writes, "in": job.in_writes}[name]
                    if not lst:
                        continue
                    if not half_free(i):
                        break
                    item = lst.pop(0)
                    half = (base + i) % 2
                    ctx.set(port.valid, 1)
                    if name == "w":
                        ctx.set(port.wb, half), ctx.set(port.q, item[0]), ctx.set(port.lane, item[1])
                        ctx.set(port.data, item[2])
                    elif name == "b":
                        ctx.set(port.wb, half), ctx.set(port.q, item[0]), ctx.set(port.base, item[1])
                        ctx.set(port.data, item[2])
                    else:
                        ctx.set(port.ib, half), ctx.set(port.q, item[0]), ctx.set(port.j, item[1])
                        ctx.set(port.data, item[2])
                    wrote_last.add(i)
                    break

            # --- staging read-back, one row a cycle ---
            if drain:
                i, r = drain[0]
                ctx.set(core.st_sb, sb_of[i])
                ctx.set(core.st_j, r)
                pending_read = (i, r)
                drain[0] = (i, r + 1)
                if r + 1 == jobs[i].t:
                    drain.pop(0)

            # --- step issue: its data written (this cycle's writes count), staging half free ---
            ctx.set(core.step.valid, 0)
            if nxt < len(jobs):
                job = jobs[nxt]
                ready_data = job.writes_left() == 0
                if self.preload and nxt == 0:
                    ready_data = all(j.writes_left() == 0 for j in jobs)
                ok_stage = not job.last or not stage_busy[sb_of[nxt]]
                if ready_data and ok_stage and half_free(nxt):
                    half = (base + nxt) % 2
                    s = core.step
                    ctx.set(s.valid, 1), ctx.set(s.ib, half), ctx.set(s.wb, half), ctx.set(s.t, job.t)
                    ctx.set(s.first, int(job.first)), ctx.set(s.last, int(job.last))
                    ctx.set(s.sb, sb_of.get(nxt, 0))
                    if ctx.get(s.ready):
                        tr.accepts.append(tr.cycle)
                        if job.last:
                            stage_busy[sb_of[nxt]] = True
                            waiting.append(nxt)
                        nxt += 1
                        self.n_issued += 1
            await self._tick(ctx)
            assert tr.cycle < 100_000, "core stopped making progress"
        for _, port in ports:
            ctx.set(port.valid, 0)


def simulate(core: EngineCore, layers: list[Layer], preload: bool = False) -> Trace:
    drv = CoreDriver(core, preload)
    out: dict[str, Trace] = {}

    async def bench(ctx):
        out["t"] = await drv.run(ctx, layers)

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out["t"]


def check_results(trace: Trace, layers: list[Layer]) -> None:
    n_blocks = sum(j.last for layer in layers for j in layer.jobs)
    assert len(trace.results) == n_blocks
    for job, got in trace.results:
        assert got.shape == job.expect.shape
        bad = job.check & (got != job.expect)
        assert not bad.any(), f"staging mismatch at {np.argwhere(bad)[:5].tolist()}:\n{got}\nexpected\n{job.expect}"


def run_and_check(core: EngineCore, layers: list[Layer], preload: bool = False) -> Trace:
    trace = simulate(core, layers, preload)
    check_results(trace, layers)
    # every issued row entered the multipliers exactly once
    assert len(trace.mac_cycles) == sum(j.t for layer in layers for j in layer.jobs)
    assert len(trace.released) == sum(len(layer.jobs) for layer in layers)
    return trace


def plan_layer(core, k, g, C, shift, relu, rng, n_before, blocks) -> Layer:
    """blocks: list of (t, steps); cw = C when packing groups, nPE when g = 1."""
    nPE, _, _ = mode_dims(core, k)
    cw = C if g > 1 else nPE
    p = Plan(core, k, g, cw, shift, relu, rng, n_before)
    for t, steps in blocks:
        p.block(t, steps, C)
    return p.layer()


# ---------------------------------------------------------------------------
# reference model
# ---------------------------------------------------------------------------
def test_postprocess_matches_scalar_formula():
    rng = np.random.default_rng(1)
    acc = np.concatenate([rng.integers(-(1 << 31), 1 << 31, 500), [-(1 << 31), (1 << 31) - 1, 0, -1, 1]])
    for shift in (0, 1, 7, 15, 16, 30, 31):
        for relu in (False, True):
            got = postprocess(acc, shift, relu)
            for a, y in zip(acc.tolist(), got.tolist()):
                v = (a + ((1 << (shift - 1)) if shift else 0)) >> shift
                v = max(-32768, min(32767, v))
                assert y == (max(v, 0) if relu else v)
    assert postprocess(np.array([1 << 32]), 0, False)[0] == 0         # wraps to 32 bits first
    assert postprocess(np.array([3, -3, 2, -2]), 1, False).tolist() == [2, -1, 1, -1]   # half rounds up


def test_reference_wrap_and_packing():
    assert wrap32(np.array([(1 << 31), -(1 << 31) - 1])).tolist() == [-(1 << 31), (1 << 31) - 1]
    x = np.array([[-32768, -32768]] * 3)
    w = np.array([[-32768], [-32768]])
    # 2 * (-32768)^2 = 2^31 wraps to -2^31 in the accumulator, which saturates low
    assert block_output(x, w, np.array([0]), 0, False).tolist() == [[-32768]] * 3
    vals = [-32768, 32767, -1, 0, 5]
    assert unpack_words(pack_words(vals), 5).tolist() == vals
    assert unpack_words(pack_bias([-(1 << 31), 7]), 4).tolist() == [0, -32768, 7, 0]


# ---------------------------------------------------------------------------
# the core
# ---------------------------------------------------------------------------
def test_parameters_and_latency():
    core = sized(**SMALL)
    assert core.modes == (K1, K2, KHALF)
    assert core.latency == {K1: 5 + 2, K2: 5 + 3, KHALF: 5 + 1}      # chains of 2 lanes, the root
    assert sized(TR=4, TP=1, TC=1, NB=2).modes == (K1,)
    assert sized(TR=6, TP=3, TC=5, NB=2).latency == {K1: 7, K2: 8, KHALF: 6}
    # TP = 35: chains of 16 + 1 and 16 + 2 lanes (15 cycles), a tree level over each half's two, the root
    assert sized(**LONG).latency == {K1: 5 + 17, K2: 5 + 18, KHALF: 5 + 16}
    assert chains(35) == [(0, 16), (16, 17), (17, 33), (33, 35)]
    assert [chain_position(35, i) for i in (0, 15, 16, 17, 32, 33, 34)] == [0, 15, 0, 0, 15, 0, 1]
    with pytest.raises(ValueError):
        EngineCore(TR=8, TP=4, TC=4, NB=3)
    with pytest.raises(ValueError):
        EngineCore(TR=8, TP=4, TC=4, NB=4, nmax=8)


@pytest.mark.parametrize("cfg", [dict(TR=4, TP=1, TC=1, NB=2), dict(TR=3, TP=1, TC=2, NB=2),
                                 dict(TR=2, TP=2, TC=1, NB=4)])
def test_degenerate_sizes_compute(cfg):
    """TP = 1 (no k=1/2) and TC = 1 (no k=2) elaborate and compute in every mode they have."""
    core = EngineCore(**cfg)
    rng = np.random.default_rng(3)
    layers, n = [], 0
    for k in core.modes:
        nPE, _, TRk = mode_dims(core, k)
        layers.append(plan_layer(core, k, 1, nPE, 3, False, rng, n, [(TRk, 2), (1, 1)]))
        n += len(layers[-1].jobs)
    run_and_check(core, layers)


@pytest.mark.parametrize("cfg", [SMALL, LONG], ids=["small", "long-chains"])
def test_every_mode_and_group_count(cfg):
    """Every k, every g in 1..min(NB, nPE) with cw = C = nPE // g, t = 1 and t = TRk // g.
    LONG: DSP chains of up to 16 lanes, their operands skewed up to 15 cycles."""
    core = EngineCore(**cfg)
    rng = np.random.default_rng(7)
    layers, n = [], 0
    for k in core.modes:
        nPE, _, TRk = mode_dims(core, k)
        for g in range(1, min(core.NB, nPE, TRk) + 1):
            C = nPE // g
            tmax = TRk // g
            layers.append(plan_layer(core, k, g, C, 12, bool(g % 2), rng, n, [(tmax, 2), (1, 2)]))
            n += len(layers[-1].jobs)
    run_and_check(core, layers)


@pytest.mark.parametrize("descending", [False, True])
def test_each_group_takes_only_its_own_copy(descending):
    """The loader writes every group's copy of a weight row and a bias chunk (w_wr/b_wr with q),
    the row at columns [q*cw, q*cw + C) and other words in every other column: only group q's
    columns may take it. Ascending writes catch a copy leaking into lower groups, descending
    ones into higher groups (a later write would hide it otherwise); an odd bias chunk and
    C < cw put chunk boundaries inside groups. Shift 18 keeps the outputs off saturation."""
    core = EngineCore(TR=8, TP=4, TC=5, NB=4, nmax=16)
    rng = np.random.default_rng(11)
    layers, n = [], 0
    for k in core.modes:
        nPE, _, TRk = mode_dims(core, k)
        for g in sorted({2, min(core.NB, nPE, TRk)}):
            if g > min(nPE, TRk):
                continue
            cw = nPE // g
            plan = Plan(core, k, g, cw, 18, False, rng, n)
            for t, steps in ((1, 2), (TRk // g, 1)):
                plan.block(t, steps, max(1, cw - 1))        # C < cw: columns of no group in between
            layer = plan.layer()
            if descending:
                for job in layer.jobs:
                    job.w_writes.sort(key=lambda wr: -wr[0])
                    job.b_writes.sort(key=lambda wr: -wr[0])
            layers.append(layer)
            n += len(layer.jobs)
    run_and_check(core, layers)


def test_plain_pe_engine_has_k1_only_and_computes():
    """stackable=False (the baselines' engines): k = 1 only, bit-exact, and no pair adders, k=1/2
    halves or their multiplexers in the netlist."""
    core = EngineCore(**SMALL, stackable=False)
    assert core.modes == (K1,)
    rng = np.random.default_rng(3)
    layers, n = [], 0
    for g in (1, 2, 4):
        layers.append(plan_layer(core, K1, g, core.TC // g, 12, False, rng, n, [(core.TR // g, 2), (1, 1)]))
        n += len(layers[-1].jobs)
    run_and_check(core, layers)
    plain = verilog.convert(core, name="core", emit_src=False)
    full = verilog.convert(EngineCore(**SMALL), name="core", emit_src=False)
    assert "pair0" in full and "pair0" not in plain and "cb0" in full and "cb0" not in plain
    assert len(plain) < 0.9 * len(full)


def test_odd_sizes():
    """Odd TP (k=1/2 idles lane 2h) and odd TC (k=2 idles the last PE), C < cw leftovers."""
    core = EngineCore(**ODD)
    rng = np.random.default_rng(11)
    layers, n = [], 0
    for k, g, C, blocks in [(K1, 1, 4, [(6, 2), (1, 1)]), (K1, 2, 2, [(3, 3)]),
                            (K2, 1, 2, [(3, 2), (2, 1)]), (KHALF, 2, 5, [(1, 2), (1, 1)]),
                            (KHALF, 1, 7, [(3, 3)]), (KHALF, 2, 3, [(1, 1)])]:
        layers.append(plan_layer(core, k, g, C, 9, False, rng, n, blocks))
        n += len(layers[-1].jobs)
    run_and_check(core, layers)


def test_group_count_may_change_while_rows_are_in_flight():
    """The control unit moves to a pass with fewer groups once every step is
    released: rows still in the trees and the staging drain must not see the new g."""
    core = EngineCore(**SMALL)
    rng = np.random.default_rng(5)
    layers, n = [], 0
    for k, g, g_after in [(K1, 4, 1), (KHALF, 3, 2), (K2, 2, 1)]:
        nPE, _, TRk = mode_dims(core, k)
        C = nPE // g
        layer = plan_layer(core, k, g, C, 10, False, rng, n, [(TRk // g, 1), (TRk // g, 2)])
        layer.g_after = g_after
        layers.append(layer)
        n += len(layer.jobs)
    run_and_check(core, layers)


@pytest.mark.parametrize("cfg", [SMALL, LONG], ids=["small", "long-chains"])
@pytest.mark.parametrize("k", [K1, K2, KHALF])
@pytest.mark.parametrize("t", [1, 2])
def test_back_to_back_steps_have_no_bubble(k, t, cfg):
    """Steps on preloaded halves stream one row per cycle, across steps and blocks
    (the second block reuses both halves, with a different row count):
    block_done comes sum(t) + latency + 1 cycles after the first step is accepted,
    mac_active is high in exactly sum(t) consecutive cycles. With t = 1 every cycle
    accumulates into the same row (the transparent read-modify-write)."""
    core = EngineCore(**cfg)
    rng = np.random.default_rng(100 + 10 * k + t)
    nPE, _, TRk = mode_dims(core, k)
    g = 2
    C = nPE // g
    p = Plan(core, k, g, C, 14, True, rng)
    p.block(t, 2, C)                  # writes both halves (bias in both via step 0 / reuse below)
    p.half[1]["bias"] = p.half[0]["bias"]
    p.jobs[1].b_writes = list(p.jobs[0].b_writes)     # the same bias with the second half's weights
    p.block(1, 5, C, reuse=True)      # a one-row block of 5 steps straight after, no writes
    layer = p.layer()
    sum_t = sum(j.t for j in layer.jobs)
    trace = run_and_check(core, [layer], preload=True)
    a0 = trace.accepts[0]
    lat = core.latency[k]
    assert trace.accepts == list(range(a0, a0 + 1)) + [a0 + sum(j.t for j in layer.jobs[:i])
                                                         for i in range(1, len(layer.jobs))]
    assert trace.mac_cycles == list(range(a0 + 3, a0 + 3 + sum_t))
    ends = [a0 + sum(j.t for j in layer.jobs[:i + 1]) for i, j in enumerate(layer.jobs) if j.last]
    assert [c for c, _ in trace.done] == [e + lat + 1 for e in ends]
    assert trace.done[-1][0] - a0 == sum_t + lat + 1
    assert [sb for _, sb in trace.done] == [0, 1]


@st.composite
def layer_specs(draw, cfg: dict):
    core = sized(**cfg)
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.sampled_from(core.modes))
        nPE, _, TRk = mode_dims(core, k)
        g = draw(st.integers(1, min(core.NB, nPE, TRk)))
        C = draw(st.integers(1, nPE // g))
        blocks = [(draw(st.integers(1, TRk // g)), draw(st.integers(1, 3)))
                  for _ in range(draw(st.integers(1, 3)))]
        shift = draw(st.sampled_from([0, 1, 5, 15, 16, 20, 31]))
        specs.append((k, g, C, shift, draw(st.booleans()), blocks))
    return specs, draw(st.integers(0, 2**32 - 1))


def _run_specs(cfg, specs, seed):
    core = EngineCore(**cfg)
    rng = np.random.default_rng(seed)
    layers, n = [], 0
    for k, g, C, shift, relu, blocks in specs:
        layers.append(plan_layer(core, k, g, C, shift, relu, rng, n, blocks))
        n += len(layers[-1].jobs)
    run_and_check(core, layers)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_specs(SMALL))
def test_random_layers_small(case):
    _run_specs(SMALL, *case)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_specs(ODD))
def test_random_layers_odd(case):
    _run_specs(ODD, *case)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_specs(LONG))
def test_random_layers_long_chains(case):
    _run_specs(LONG, *case)


def test_converts_to_verilog():
    core = EngineCore(TR=4, TP=2, TC=2, NB=2)
    text = verilog.convert(core, name="engine_core")
    assert "module engine_core" in text
    for port in ("step__valid", "step__ready", "in_wr__data", "w_wr__lane", "b_wr__base", "st_data", "block_done"):
        assert port in text


# ---------------------------------------------------------------------------
# the netlist's size
# ---------------------------------------------------------------------------
def test_netlist_grows_linearly_in_tc():
    """Doubling TC at most about doubles the core's Verilog. Before the replication
    network drove a signal per level, every level re-emitted the previous one's
    expressions: <16, 4, 8> was 3.7 MB and <16, 4, 16> 35 MB, and the paper's
    full-size designs never finished generating."""
    sizes = [len(verilog.convert(EngineCore(TR=16, TP=2, TC=tc, NB=8), name="core", emit_src=False))
             for tc in (8, 16)]
    assert sizes[1] < 2.3 * sizes[0], sizes
