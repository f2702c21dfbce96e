"""TurboTransformers' sequence-length-aware batch scheduler (§5, Algorithm 2).

cached_cost: the time of one inference of the unsliced model at (sequence
length, batch size), measured in a warm-up phase over a grid of lengths and
batch sizes, saved to disk (JSON) and reloaded on restart; lengths and batch
sizes between the profiled points are interpolated linearly (the paper's
"sample the parameter space and use the interpolation method").

Algorithm 2 sorts the queued requests by length and finds, by DP, the split
of the sorted list into consecutive batches with the least total time:

    states[i] = min_j  states[j-1] + cost(len(req[i-1]), i-j+1)

where cost(L, b) is the *batch's* time at length L (the longest in it) and
batch size b. The paper writes cached_cost[len][b] x b, i.e. it stores a
per-request cost; we store batch times and drop the x b (docs/gpu.md). A
batch-size cap (the paper serves with max batch 20) bounds the inner loop.

Triggers: hungry (run the scheduler whenever the runtime is idle) and lazy
(wait until max batch requests are queued or a timeout passes), with the
half-SLO guard: schedule at once when the oldest request's wait plus the
estimated time of the queued requests exceeds half the latency SLO.
Baselines: naive batching (the whole queue as one batch) and no batching.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.output import write_text
from fluidnpu.scheduler_fw.gpu.policies import GPUPolicy


class CostTable:
    def __init__(self, lengths: Sequence[int], batch_sizes: Sequence[int], seconds, device: str = "",
                 workload: str = "") -> None:
        self.lengths = np.asarray(lengths, dtype=float)
        self.batch_sizes = np.asarray(batch_sizes, dtype=float)
        self.seconds = np.asarray(seconds, dtype=float)
        if self.seconds.shape != (len(self.lengths), len(self.batch_sizes)):
            raise FluidError(f"cost table must be {len(self.lengths)} x {len(self.batch_sizes)}")
        if len(self.lengths) < 1 or np.any(np.diff(self.lengths) <= 0) or np.any(np.diff(self.batch_sizes) <= 0):
            raise FluidError("cost table lengths and batch sizes must be increasing")
        self.device = device
        self.workload = workload
        self._memo: dict[tuple[int, int], float] = {}

    @staticmethod
    def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
        if len(xs) == 1:
            return float(ys[0] * (x / xs[0]))
        if x <= xs[0]:
            return float(ys[0] * x / xs[0]) if x < xs[0] else float(ys[0])
        if x >= xs[-1]:
            slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
            return float(ys[-1] + slope * (x - xs[-1]))
        return float(np.interp(x, xs, ys))

    def cost(self, length: int, bs: int) -> float:
        """Seconds of one batch of bs requests padded to `length` (bilinear interpolation)."""
        key = (int(length), int(bs))
        v = self._memo.get(key)
        if v is None:
            per_len = np.array([self._interp(bs, self.batch_sizes, row) for row in self.seconds])
            v = max(self._interp(length, self.lengths, per_len), 1e-9)
            self._memo[key] = v
        return v

    def to_json(self) -> dict:
        return {"format": "fluidnpu-turbo-cost-table/1", "device": self.device, "workload": self.workload,
                "lengths": self.lengths.astype(int).tolist(), "batch_sizes": self.batch_sizes.astype(int).tolist(),
                "seconds": self.seconds.tolist()}

    def save(self, path: str | Path) -> None:
        write_text(path, json.dumps(self.to_json(), indent=1), "cost table")

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        try:
            d = json.loads(Path(path).read_text())
            if d.get("format") != "fluidnpu-turbo-cost-table/1":
                raise ValueError("not a fluidnpu cost table")
            return cls(d["lengths"], d["batch_sizes"], d["seconds"], d.get("device", ""), d.get("workload", ""))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FluidError(f"cannot read cost table {path}: {exc}") from None


def warmup_cost_table(spec, device, lengths: Sequence[int], batch_sizes: Sequence[int], repeats: int = 2) -> CostTable:
    """Time the unsliced model at every (length, batch size) of the grid (the warm-up phase)."""
    from fluidnpu.host_driver.staged.model import call_module
    from fluidnpu.host_driver.staged.torchutil import require_torch, synchronize

    torch = require_torch()
    if spec.max_length is not None and max(lengths) > spec.max_length:
        raise FluidError(f"cost-table length {max(lengths)} exceeds the model's maximum {spec.max_length}")
    rng = np.random.default_rng(0)
    out = np.zeros((len(lengths), len(batch_sizes)))
    with torch.inference_mode():
        for i, L in enumerate(lengths):
            for j, bs in enumerate(batch_sizes):
                payloads = [rng.integers(1, 100, size=int(L)) for _ in range(int(bs))]
                samples = []
                for r in range(repeats + 1):
                    synchronize(device)
                    t0 = time.perf_counter()
                    state = spec.collate(payloads, device)
                    for m in spec.modules:
                        state = call_module(m, state)
                    synchronize(device)
                    if r:
                        samples.append(time.perf_counter() - t0)
                out[i, j] = float(np.median(samples))
    return CostTable(lengths, batch_sizes, out, str(device), spec.name)


def dp_schedule(lengths: Sequence[int], cost, max_batch: int) -> tuple[list[list[int]], float]:
    """Algorithm 2: (batches as lists of indices into `lengths`, sorted by length; total seconds)."""
    n = len(lengths)
    if n == 0:
        return [], 0.0
    order = sorted(range(n), key=lambda k: lengths[k])
    L = [lengths[k] for k in order]
    states = [0.0] * (n + 1)
    start = [0] * (n + 1)
    for i in range(1, n + 1):
        cur = L[i - 1]
        best = states[i - 1] + cost(cur, 1)
        arg = i - 1
        j = i - 1
        while j > 0 and i - j + 1 <= max_batch:
            c = states[j - 1] + cost(cur, i - j + 1)
            if c < best:
                best, arg = c, j - 1
            j -= 1
        states[i] = best
        start[i] = arg
    batches = []
    i = n
    while i > 0:
        s = start[i]
        batches.append([order[k] for k in range(s, i)])
        i = s
    return batches[::-1], states[n]


class TurboDP(GPUPolicy):
    """DP batching on the unsliced model (a one-stage engine)."""

    name = "dp"

    def __init__(self, cost: CostTable, bsmax: int = 20, trigger: str = "hungry", timeout_s: float = 0.01,
                 slo_s: float = 0.2, max_queue: int | None = None) -> None:
        super().__init__(bsmax)
        if trigger not in ("hungry", "lazy"):
            raise FluidError(f"trigger must be hungry or lazy, got {trigger!r}")
        self.cost = cost
        self.trigger = trigger
        self.timeout_s = float(timeout_s)
        self.slo_s = float(slo_s)
        self.max_queue = max_queue or 8 * self.bsmax
        self.guard_fired = 0
        self.dp_seconds = 0.0
        self.dp_calls = 0

    def _schedule(self, now, pending, engine) -> None:
        reqs = self.take(pending, self.max_queue)
        t0 = time.perf_counter()
        batches, _ = dp_schedule([q.length for q in reqs], self.cost.cost, self.bsmax)
        self.dp_seconds += time.perf_counter() - t0
        self.dp_calls += 1
        for b in batches:
            engine.new([reqs[k] for k in b], now)

    def estimate(self, pending) -> float:
        reqs = list(pending)[: self.max_queue]
        return dp_schedule([q.length for q in reqs], self.cost.cost, self.bsmax)[1]

    def tick(self, now, pending, engine):
        if not pending or not engine.stage_free(0) or engine.live() > 0:
            return None
        if self.trigger == "hungry":
            self._schedule(now, pending, engine)
            return None
        due = pending[0].arrival + self.timeout_s
        if len(pending) >= self.bsmax or now >= due:
            self._schedule(now, pending, engine)
            return None
        if now - pending[0].arrival + self.estimate(pending) > 0.5 * self.slo_s:
            self.guard_fired += 1
            self._schedule(now, pending, engine)
            return None
        return due

    def describe(self):
        return {**super().describe(), "trigger": self.trigger, "guard_fired": self.guard_fired,
                "dp_ms_per_call": 1e3 * self.dp_seconds / self.dp_calls if self.dp_calls else 0.0}


class NaiveBatch(GPUPolicy):
    """TurboTransformers' naive batching: the whole message queue (up to bsmax) as one padded batch."""

    name = "naive"

    def tick(self, now, pending, engine):
        if pending and engine.stage_free(0) and engine.live() == 0:
            engine.new(self.take(pending, self.bsmax), now)
        return None


class NoBatch(GPUPolicy):
    """One request at a time."""

    name = "nobatch"

    def tick(self, now, pending, engine):
        if pending and engine.stage_free(0) and engine.live() == 0:
            engine.new(self.take(pending, 1), now)
        return None


_ = deque
