"""Slice a model into N stages of about equal time by profiling (DVABatch §7.1).

Each module is timed alone at the profiled batch sizes (1, 2, 4, ..., 64 by
default) on the workload's example input. The module costs used for slicing
are the times summed over the profiled batch sizes, so a stage split is about
even at every batch size rather than only at one. Stages are contiguous, cut
by a DP that minimises the slowest stage; the end of every early-exit module
is forced to be a stage boundary (an exit is decided when a stage completes).

Operator diversity (§7.1): a module's preferred batch size is the smallest profiled
batch size whose throughput (bs / time) reaches PREFERRED_FRACTION of its best; where
consecutive modules' preferred sizes differ by PREFERRED_RATIO or more, a cut is
forced there too (largest differences first, as many as the stage count allows),
as long as the slowest stage stays within BALANCE_SLACK of the unconstrained
optimum — so Policy II can split a batch right before the modules that prefer
smaller ones. `choose_stage_count` picks N from measured tries (§7.1: "we
determine the optimal Nst through profiling ... 8 tries").

`StageProfile` keeps the per-stage times T[s][bs] (sums of their modules'
times), linearly interpolated between profiled batch sizes and extrapolated
linearly beyond the largest; it answers T_remain(s, bs) for the split policy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.model import ModelSpec, call_module
from fluidnpu.host_driver.staged.torchutil import require_torch, synchronize
from fluidnpu.output import write_text

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
PREFERRED_FRACTION = 0.9   # "the smallest batch size that fully utilizes the GPU": 90 % of the best throughput
PREFERRED_RATIO = 4        # preferred sizes this far apart (two profiled steps) are a diversity worth a cut
BALANCE_SLACK = 1.25       # a preferred-size cut may make the slowest stage at most 25 % slower
STAGE_TRIES = (1, 2, 3, 4, 6, 8, 12, 16)   # the paper's 8 tries


def profile_modules(spec: ModelSpec, device, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                    repeats: int = 3, warmup: int = 1) -> np.ndarray:
    """Seconds per module (rows) at each batch size (columns), median of `repeats` timed runs."""
    torch = require_torch()
    times = np.zeros((len(spec.modules), len(batch_sizes)))
    with torch.inference_mode():
        for j, bs in enumerate(batch_sizes):
            state = spec.collate(spec.example(int(bs)), device)
            for i, m in enumerate(spec.modules):
                samples = []
                out = state
                for r in range(warmup + repeats):
                    synchronize(device)
                    t0 = time.perf_counter()
                    try:
                        out = call_module(m, state)
                    except Exception as exc:  # noqa: BLE001 - reported as a user error with the module named
                        raise FluidError(f"{spec.name}: module {i} ({type(m).__name__}) fails on the example "
                                         f"input at batch {bs}, so the model cannot be sliced: {exc}") from None
                    synchronize(device)
                    if r >= warmup:
                        samples.append(time.perf_counter() - t0)
                times[i, j] = float(np.median(samples))
                state = out
    return times


def partition(costs: Sequence[float], n_stages: int, cuts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) module ranges, n_stages of them, minimising the largest summed cost.

    cuts: module positions p that must be a stage boundary (a stage ends before module p)."""
    m = len(costs)
    n = int(n_stages)
    if n < 1:
        raise FluidError(f"need at least one stage, got {n_stages}")
    if n > m:
        raise FluidError(f"cannot slice {m} modules into {n} stages: more stages than modules")
    forced = sorted(set(int(c) for c in cuts if 0 < int(c) < m))
    if n < len(forced) + 1:
        raise FluidError(f"{len(forced)} early exits need at least {len(forced) + 1} stages, got {n}")
    pre = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    inf = float("inf")

    def ok(lo: int, hi: int) -> bool:
        return not any(lo < c < hi for c in forced)

    best = np.full((n + 1, m + 1), inf)
    arg = np.zeros((n + 1, m + 1), dtype=int)
    best[0, 0] = 0.0
    for k in range(1, n + 1):
        for j in range(k, m + 1):
            for i in range(k - 1, j):
                if best[k - 1, i] == inf or not ok(i, j):
                    continue
                v = max(best[k - 1, i], pre[j] - pre[i])
                if v < best[k, j]:
                    best[k, j] = v
                    arg[k, j] = i
    if best[n, m] == inf:
        raise FluidError(f"cannot place {n} stages with stage boundaries at every early exit {forced}")
    bounds = []
    j = m
    for k in range(n, 0, -1):
        i = int(arg[k, j])
        bounds.append((i, j))
        j = i
    return bounds[::-1]


@dataclass
class StageProfile:
    """Per-stage times T[s][bs] over profiled batch sizes, and the module ranges of the stages."""

    batch_sizes: tuple[int, ...]
    stage_seconds: np.ndarray                  # (n_stages, len(batch_sizes))
    bounds: tuple[tuple[int, int], ...]
    module_seconds: np.ndarray | None = None   # (n_modules, len(batch_sizes))
    device: str = ""

    @property
    def n_stages(self) -> int:
        return len(self.bounds)

    def time(self, stage: int, bs: float) -> float:
        """Interpolated seconds of one stage at batch size bs (linear beyond the ends)."""
        x = np.asarray(self.batch_sizes, dtype=float)
        y = self.stage_seconds[stage]
        if len(x) == 1:
            return float(y[0] * bs / x[0])
        if bs <= x[0]:
            return float(y[0])
        if bs >= x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            return float(y[-1] + max(slope, 0.0) * (bs - x[-1]))
        return float(np.interp(bs, x, y))

    def remain(self, stage: int, bs: float) -> float:
        """T_remain: seconds of stages stage..N-1 at batch size bs."""
        return sum(self.time(s, bs) for s in range(stage, self.n_stages))

    def total(self, bs: float) -> float:
        return self.remain(0, bs)

    def peak_throughput(self, bsmax: int) -> float:
        """Queries/s of back-to-back batches of the best size <= bsmax, limited by the slowest stage."""
        best = 0.0
        for bs in range(1, int(bsmax) + 1):
            slowest = max(self.time(s, bs) for s in range(self.n_stages))
            best = max(best, bs / max(slowest, 1e-12))
        return best

    def to_json(self) -> dict:
        return {"batch_sizes": list(self.batch_sizes), "stage_seconds": self.stage_seconds.tolist(),
                "bounds": [list(b) for b in self.bounds], "device": self.device,
                "module_seconds": None if self.module_seconds is None else self.module_seconds.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> StageProfile:
        ms = d.get("module_seconds")
        return cls(tuple(d["batch_sizes"]), np.asarray(d["stage_seconds"], dtype=float),
                   tuple(tuple(b) for b in d["bounds"]), None if ms is None else np.asarray(ms), d.get("device", ""))

    def save(self, path: str | Path) -> None:
        write_text(path, json.dumps(self.to_json(), indent=1), "GPU profile")


def profile_from_module_times(module_seconds: np.ndarray, batch_sizes: Sequence[int], n_stages: int,
                              cuts: Sequence[int] = (), device: str = "") -> StageProfile:
    ms = np.asarray(module_seconds, dtype=float)
    bounds = partition(ms.sum(axis=1), n_stages, cuts)
    stage = np.stack([ms[lo:hi].sum(axis=0) for lo, hi in bounds])
    return StageProfile(tuple(int(b) for b in batch_sizes), stage, tuple(bounds), ms, device)


def preferred_batch_sizes(module_seconds: np.ndarray, batch_sizes: Sequence[int],
                          fraction: float = PREFERRED_FRACTION) -> list[int]:
    """Each module's preferred batch size: the smallest profiled size reaching `fraction` of its best
    throughput (bs / seconds)."""
    ms = np.asarray(module_seconds, dtype=float)
    bss = np.asarray(batch_sizes, dtype=float)
    out = []
    for row in ms:
        thr = bss / np.maximum(row, 1e-12)
        out.append(int(bss[int(np.argmax(thr >= fraction * thr.max()))]))
    return out


def stage_cuts(module_seconds: np.ndarray, batch_sizes: Sequence[int], n_stages: int,
               exit_cuts: Sequence[int] = ()) -> list[int]:
    """The forced stage boundaries: every exit, then preferred-batch-size changes (largest first) while
    stages remain and the slowest stage stays within BALANCE_SLACK of the best split without them."""
    ms = np.asarray(module_seconds, dtype=float)
    cuts = sorted(set(int(c) for c in exit_cuts))
    costs = ms.sum(axis=1)
    pre = np.concatenate([[0.0], np.cumsum(costs)])

    def slowest(cs: list[int]) -> float:
        return max(pre[hi] - pre[lo] for lo, hi in partition(costs, n_stages, cs))

    base = slowest(cuts)
    prefs = preferred_batch_sizes(ms, batch_sizes)
    changes = sorted((max(a, b) / min(a, b), p) for p, (a, b) in enumerate(zip(prefs, prefs[1:]), start=1)
                     if max(a, b) / min(a, b) >= PREFERRED_RATIO)
    for _, p in reversed(changes):
        if len(cuts) + 1 >= n_stages or p in cuts:
            continue
        if slowest(sorted(cuts + [p])) <= BALANCE_SLACK * base:
            cuts = sorted(cuts + [p])
    return cuts


def choose_stage_count(tries: Sequence[dict], tolerance: float = 0.05) -> int:
    """The stage count of the best try: the highest throughput; among tries within `tolerance` of it, the
    lowest mean latency, then the fewest stages (DVABatch Fig. 20 judges both)."""
    if not tries:
        raise FluidError("no stage counts were tried")
    best = max(t["throughput_qps"] for t in tries)
    close = [t for t in tries if t["throughput_qps"] >= (1.0 - tolerance) * best]
    return int(min(close, key=lambda t: (t["mean_latency_ms"], t["stages"]))["stages"])


def stage_tries(n_modules: int, min_stages: int = 1) -> list[int]:
    return [n for n in STAGE_TRIES if min_stages <= n <= n_modules] or [max(1, min(min_stages, n_modules))]


def slice_model(spec: ModelSpec, n_stages: int, device, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                repeats: int = 3, module_seconds: np.ndarray | None = None) -> StageProfile:
    """Profile `spec` (unless module_seconds is given) and cut it into n_stages stages of about equal time."""
    m = len(spec.modules)
    if int(n_stages) > m:
        raise FluidError(f"cannot slice {spec.name}'s {m} modules into {n_stages} stages: more stages than modules")
    if module_seconds is None:
        module_seconds = profile_modules(spec, device, batch_sizes, repeats)
    elif np.asarray(module_seconds).shape != (m, len(batch_sizes)):
        raise FluidError(f"module_seconds must be {m} x {len(batch_sizes)}")
    cuts = stage_cuts(module_seconds, batch_sizes, n_stages, [e.after + 1 for e in spec.exits])
    return profile_from_module_times(module_seconds, batch_sizes, n_stages, cuts, str(device))
