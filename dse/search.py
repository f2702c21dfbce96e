"""Exhaustive design-space exploration (the paper's Eq. 2).

    d* = argmax_d  sum_b  w_b * max_{k, BR} perf_W(d, b, k, BR)

Every <TP, TC> with TP*TC <= DSPs is visited. For each, TR is the largest
that fits the board: the performance model is non-decreasing in TR (row
blocks are balanced and a block's cost is convex and subadditive in its rows,
see docs/interpretations.md), so no smaller TR can score higher and the
search is exact. For each design, batch size b and layer, the best <BR, k>
is taken per layer, which maximises the workload's GOp/s at b because the
layers' times add up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import Callable, Sequence

import numpy as np

from fluidnpu.boards.catalog import Board
from fluidnpu.dse.perf_model import DEFAULT_TIMING, K_CODES, Bus, EngineTiming, layer_cycles, layer_inside
from fluidnpu.dse.resource_model import Resources, design_resources, feasible_designs, max_tr
from fluidnpu.dse.timing_model import TimingEstimate, design_timing
from fluidnpu.errors import FluidError
from fluidnpu.workload import Layer, Workload

BATCHING_MODES: dict[str, str] = {
    "fluid": "Fluid Batching: best BR per layer and batch size",
    "r": "static R-batching on all layers (BR = b)",
    "p": "static P-batching on all layers (BR = 1)",
    "fc": "batching on FC layers only; other layers run one sample at a time",
}
MAX_BMAX = 64

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class DSEOptions:
    """What to search for. `weights[b-1]` is w_b; `fixed_batch` makes it one-hot."""

    bmax: int = 8
    batching: str = "fluid"
    stackable: bool = True
    weights: tuple[float, ...] | None = None
    fixed_batch: int | None = None
    clock_mhz: float | None = None
    timing: EngineTiming = DEFAULT_TIMING

    def batch_weights(self) -> np.ndarray:
        if self.fixed_batch is not None:
            w = np.zeros(self.bmax)
            w[self.fixed_batch - 1] = 1.0
            return w
        if self.weights is not None:
            return np.asarray(self.weights, dtype=float)
        return np.ones(self.bmax)

    def validate(self, board: Board) -> None:
        if not 1 <= self.bmax <= MAX_BMAX:
            raise FluidError(f"Bmax must be in [1, {MAX_BMAX}], got {self.bmax}")
        if self.batching not in BATCHING_MODES:
            raise FluidError(f"unknown batching {self.batching!r}; choose from {', '.join(BATCHING_MODES)}")
        if self.fixed_batch is not None and not 1 <= self.fixed_batch <= self.bmax:
            raise FluidError(f"fixed batch size {self.fixed_batch} is outside [1, Bmax={self.bmax}]")
        if self.weights is not None:
            if len(self.weights) != self.bmax:
                raise FluidError(f"need {self.bmax} batch weights w_b, got {len(self.weights)}")
            if any(w < 0 for w in self.weights) or not any(w > 0 for w in self.weights):
                raise FluidError("batch weights w_b must be >= 0 with at least one > 0")
        board.check_clock(self.clock_mhz or board.clock_mhz)


@dataclass(frozen=True)
class Choice:
    """One way to run a layer at batch b: split BR, Stackable-PE mode, or one sample at a time."""

    BR: int
    k_code: int
    serial: bool = False
    fc_only: bool | None = None  # None: any layer; True: FC layers only; False: non-FC only


def choices(batching: str, b: int, stackable: bool) -> list[Choice]:
    """Candidate <BR, k> for batch b under a batching mode, in tie-break order."""
    ks = K_CODES if stackable else (0,)
    if batching == "fluid":
        return [Choice(BR, k) for k in ks for BR in range(b, 0, -1)]
    if batching == "r":
        return [Choice(b, k) for k in ks]
    if batching == "p":
        return [Choice(1, k) for k in ks]
    if batching == "fc":
        return [Choice(b, k, fc_only=True) for k in ks] + [Choice(1, k, serial=True, fc_only=False) for k in ks]
    raise FluidError(f"unknown batching {batching!r}")


@dataclass(frozen=True)
class LayerShapes:
    """Layer GEMM shapes as row vectors for broadcasting."""

    R: np.ndarray
    P: np.ndarray
    C: np.ndarray
    G: np.ndarray
    is_fc: np.ndarray
    taps: np.ndarray          # kh*kw: where a weight step's im2col read splits into runs
    inside: np.ndarray        # fraction of im2col runs outside the zero padding

    @classmethod
    def of(cls, layers: Sequence[Layer]) -> "LayerShapes":
        def row(values: list[int]) -> np.ndarray:
            return np.asarray(values, dtype=np.int64)[None, :]
        return cls(row([x.R for x in layers]), row([x.P for x in layers]), row([x.C for x in layers]),
                   row([x.groups for x in layers]), np.asarray([x.kind == "fc" for x in layers])[None, :],
                   row([x.kernel[0] * x.kernel[1] if x.kind == "conv" else 1 for x in layers]),
                   np.asarray([layer_inside(x) for x in layers], dtype=float)[None, :])


def choice_cycles(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, shapes: LayerShapes, b: int, ch: Choice,
                  bus: Bus, timing: EngineTiming) -> np.ndarray:
    """Cycles of every (design, layer) under one choice; inf where it does not apply."""
    if ch.serial:
        cyc = b * layer_cycles(TR, TP, TC, shapes.R, shapes.P, shapes.C, shapes.G, 1, 1, ch.k_code,
                               bus.bytes_per_cycle, timing, shapes.taps, bus.port_bytes, shapes.inside)
    else:
        cyc = layer_cycles(TR, TP, TC, shapes.R, shapes.P, shapes.C, shapes.G, b, ch.BR, ch.k_code,
                           bus.bytes_per_cycle, timing, shapes.taps, bus.port_bytes, shapes.inside)
    if ch.fc_only is not None:
        cyc = np.where(shapes.is_fc == ch.fc_only, cyc, np.inf)
    return cyc


def best_cycles(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, shapes: LayerShapes, b: int, cands: list[Choice],
                bus: Bus, timing: EngineTiming) -> tuple[np.ndarray, np.ndarray]:
    """(min cycles, index of the winning choice) over the candidates, per (design, layer)."""
    best = None
    arg = None
    for i, ch in enumerate(cands):
        cyc = choice_cycles(TR, TP, TC, shapes, b, ch, bus, timing)
        if best is None:
            best, arg = cyc, np.zeros(cyc.shape, dtype=np.int64)
        else:
            better = cyc < best
            best = np.where(better, cyc, best)
            arg = np.where(better, i, arg)
    assert best is not None and arg is not None
    return best, arg


@dataclass
class LayerPlan:
    """How the chosen design runs every layer at every batch size (index [layer][b-1])."""

    cycles: list[list[int]]
    BR: list[list[int]]
    k_code: list[list[int]]
    serial: list[list[bool]]


@dataclass
class DSEResult:
    board: Board
    options: DSEOptions
    clock_mhz: float
    workload: Workload
    TR: int
    TP: int
    TC: int
    resources: Resources
    plan: LayerPlan
    total_cycles: list[int]          # per batch size
    gops: list[float]                # per batch size
    peak_gops: float
    score: float | None              # Eq. 2's objective; None when the design was given, not searched
    n_designs: int
    seconds: float
    runners_up: list[dict] = field(default_factory=list)
    timing_proxy: TimingEstimate | None = None   # longest path in LUT levels (dse/timing_model.py)

    def segment_cycles(self) -> list[list[int]]:
        """Nexits x Bmax: cycles of each exit segment (backbone part + exit head) at each b."""
        out = []
        for seg in self.workload.segments():
            out.append([int(sum(self.plan.cycles[s.index][b] for s in seg)) for b in range(self.options.bmax)])
        return out


def enumerate_tp_tc(dsp: int) -> tuple[np.ndarray, np.ndarray]:
    """Every <TP, TC> with TP * TC <= dsp, ordered by TP then TC."""
    tp = np.concatenate([np.full(dsp // p, p) for p in range(1, dsp + 1)])
    tc = np.concatenate([np.arange(1, dsp // p + 1) for p in range(1, dsp + 1)])
    return tp.astype(np.int64), tc.astype(np.int64)


def unique_layers(layers: Sequence[Layer]) -> tuple[list[Layer], np.ndarray]:
    """Distinct GEMM shapes with their multiplicities (many layers repeat)."""
    seen: dict[tuple, int] = {}
    reps: list[Layer] = []
    counts: list[int] = []
    for layer in layers:
        key = (layer.R, layer.P, layer.C, layer.groups, layer.kind == "fc")
        if key not in seen:
            seen[key] = len(reps)
            reps.append(layer)
            counts.append(0)
        counts[seen[key]] += 1
    return reps, np.asarray(counts, dtype=np.float64)


def explore(workload: Workload, board: Board, options: DSEOptions = DSEOptions(),
            progress: ProgressFn | None = None) -> DSEResult:
    """Run the exhaustive DSE and return the best design with its tables."""
    options.validate(board)
    t0 = time.perf_counter()
    clock = options.clock_mhz or board.clock_mhz
    bpc = board.bus(clock)
    layers = workload.layers()
    n_layers = len(layers)
    weights = options.batch_weights()

    TP, TC = enumerate_tp_tc(board.dsp)
    tr_cap = max(2, options.bmax * max(x.R for x in layers))
    TR = max_tr(TP, TC, board, options.bmax, n_layers, options.stackable, tr_cap)
    keep = TR >= 1
    TR, TP, TC = TR[keep], TP[keep], TC[keep]
    if TR.size == 0:
        raise FluidError(f"no NPU design fits {board.name} with Bmax={options.bmax}")

    reps, counts = unique_layers(layers)
    shapes = LayerShapes.of(reps)
    macs = float(workload.total_macs)
    col = (TR[:, None], TP[:, None], TC[:, None])
    score = np.zeros(TR.size)
    per_b = [choices(options.batching, b, options.stackable) for b in range(1, options.bmax + 1)]
    steps, done = sum(len(c) for c in per_b), 0
    for b, cands in enumerate(per_b, start=1):
        if weights[b - 1] == 0:
            done += len(cands)
            if progress:
                progress(done, steps)
            continue
        best = None
        for ch in cands:
            cyc = choice_cycles(*col, shapes, b, ch, bpc, options.timing)
            best = cyc if best is None else np.minimum(best, cyc)
            done += 1
            if progress:
                progress(done, steps)
        total = best @ counts
        score += weights[b - 1] * 2.0 * b * macs * clock * 1e6 / total / 1e9
    order = np.lexsort((TC, TP, -score))  # best score first; ties to smaller TP, then TC
    i = int(order[0])
    result = _finish(workload, board, options, clock, int(TR[i]), int(TP[i]), int(TC[i]), float(score[i]),
                     n_designs=int(TR.size), t0=t0)
    result.runners_up = [{"TR": int(TR[j]), "TP": int(TP[j]), "TC": int(TC[j]), "score": float(score[j])}
                         for j in order[1:6]]
    return result


def evaluate_design(workload: Workload, board: Board, TR: int, TP: int, TC: int,
                    options: DSEOptions = DSEOptions(), allow_oversize: bool = False) -> DSEResult:
    """The tables and figures of one given design (no search).

    A design that does not fit the board is refused unless allow_oversize
    (for studies of other people's design points); its memory use is then
    reported as infinite.
    """
    options.validate(board)
    if min(TR, TP, TC) < 1:
        raise FluidError(f"design <{TR}, {TP}, {TC}>: every size must be >= 1")
    n_layers = len(workload.layers())
    if not allow_oversize and not feasible_designs(np.array(TR), np.array(TP), np.array(TC), board, options.bmax,
                                                   n_layers, options.stackable):
        raise FluidError(f"design <{TR}, {TP}, {TC}> does not fit {board.name} "
                         f"({TP * TC} of {board.dsp} DSPs; see `fluidnpu dse` for what does)")
    clock = options.clock_mhz or board.clock_mhz
    return _finish(workload, board, options, clock, TR, TP, TC, score=None, n_designs=1,
                   t0=time.perf_counter())


def _finish(workload: Workload, board: Board, options: DSEOptions, clock: float, TR: int, TP: int, TC: int,
            score: float | None, n_designs: int, t0: float) -> DSEResult:
    layers = workload.layers()
    bpc = board.bus(clock)
    shapes = LayerShapes.of(layers)
    plan = LayerPlan([[0] * options.bmax for _ in layers], [[0] * options.bmax for _ in layers],
                     [[0] * options.bmax for _ in layers], [[False] * options.bmax for _ in layers])
    d = (np.array([[TR]]), np.array([[TP]]), np.array([[TC]]))
    for b in range(1, options.bmax + 1):
        cands = choices(options.batching, b, options.stackable)
        best, arg = best_cycles(*d, shapes, b, cands, bpc, options.timing)
        for li in range(len(layers)):
            if not np.isfinite(best[0, li]):
                raise FluidError(f"layer {layers[li].name!r} cannot run on <{TR}, {TP}, {TC}>")
            ch = cands[int(arg[0, li])]
            plan.cycles[li][b - 1] = int(best[0, li])
            plan.BR[li][b - 1] = ch.BR
            plan.k_code[li][b - 1] = ch.k_code
            plan.serial[li][b - 1] = ch.serial
    total = [int(sum(plan.cycles[li][b] for li in range(len(layers)))) for b in range(options.bmax)]
    macs = workload.total_macs
    gops = [2.0 * (b + 1) * macs * clock * 1e6 / total[b] / 1e9 for b in range(options.bmax)]
    resources = design_resources(TR, TP, TC, board, options.bmax, len(layers), options.stackable)
    return DSEResult(board=board, options=options, clock_mhz=clock, workload=workload, TR=TR, TP=TP, TC=TC,
                     resources=resources, plan=plan, total_cycles=total, gops=gops,
                     peak_gops=2.0 * TP * TC * clock * 1e6 / 1e9, score=score, n_designs=n_designs,
                     seconds=time.perf_counter() - t0,
                     timing_proxy=design_timing(TR, TP, TC, options.bmax))
