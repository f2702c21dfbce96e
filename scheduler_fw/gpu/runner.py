"""One seeded Poisson load against one policy on the staged engine, in wall-clock time.

MLPerf-server-style: arrival times are Poisson (reusing
`scheduler_fw.arrivals.poisson_trace`, so one seed gives every policy and
rate the same unit-rate gap stream), query payloads come from the workload's
own sampler on a second stream of the seed. The runner releases each query at
its arrival time, calls the policy, steps the engine and records each
answer's time; after the last arrival it drains (up to `drain_s`).

Loads: low / medium / high are 1/4, 3/5 and 9/10 of the peak throughput
(DVABatch §8.1); the peak comes from the profile (`estimate_peak`) unless given.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.batch_table import Query
from fluidnpu.scheduler_fw.arrivals import poisson_trace

LOAD_FRACTIONS = {"low": 0.25, "medium": 0.6, "high": 0.9}
DEFAULT_STAGES = {"bert": 2, "cnn": 4, "unet": 4, "eecnn": 3}   # DVABatch §8.7: 2 for BertBase, 4 for LinkNet/ResNet152


def parse_load(load: str | float, peak: float) -> float:
    """Queries/s for low|medium|high (fractions of `peak`) or a number."""
    s = str(load).strip().lower()
    if s in LOAD_FRACTIONS:
        return LOAD_FRACTIONS[s] * peak
    try:
        v = float(s)
    except ValueError:
        raise FluidError(f"--load must be low, medium, high or a rate in queries/s, got {load!r}") from None
    if not v > 0 or math.isinf(v):
        raise FluidError(f"--load rate must be > 0, got {load!r}")
    return v


def make_trace(spec, rate: float, duration_s: float, seed: int) -> tuple[np.ndarray, list]:
    n = max(1, int(round(rate * duration_s)))
    arrivals, _ = poisson_trace(rate, n, [1.0], seed)
    payloads = spec.sample(np.random.default_rng([int(seed), 2]), n)
    return arrivals, payloads


@dataclass
class LoadResult:
    policy: str
    workload: str
    device: str
    rate: float
    sent: int
    answered: int
    failed: int
    latencies: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    wall_s: float = 0.0
    overhead_per_stage_ms: float = 0.0
    stage_executions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        lat = self.latencies
        span = self.wall_s
        return {
            "policy": self.policy, "workload": self.workload, "device": self.device,
            "rate_qps": self.rate, "sent": self.sent, "answered": self.answered, "failed": self.failed,
            "mean_latency_ms": float(lat.mean() * 1e3) if lat.size else float("nan"),
            "p99_latency_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else float("nan"),
            "throughput_qps": float(self.answered / span) if span > 0 else 0.0,
            "overhead_per_stage_ms": self.overhead_per_stage_ms,
            "stage_executions": self.stage_executions,
            **self.extra,
        }


def serve_load(spec, policy, engine, arrivals: np.ndarray, payloads: list, drain_s: float = 60.0,
               clock=time.perf_counter) -> LoadResult:
    """Serve the trace; every query is answered (output or error) or counted as unanswered."""
    n = len(arrivals)
    queries = [Query(k, payloads[k], float(arrivals[k]), spec.length(payloads[k]) if spec.length else 1)
               for k in range(n)]
    for q in queries:
        spec.check_payload(q.payload)
    policy.attach(engine)
    t0 = clock()
    engine.clock = lambda: clock() - t0
    pending: deque[Query] = deque()
    i = 0
    wake = None
    end_by = float(arrivals[-1]) + drain_s
    while True:
        now = clock() - t0
        while i < n and arrivals[i] <= now:
            pending.append(queries[i])
            i += 1
        if i >= n and not pending and engine.live() == 0:
            break
        if now > end_by:
            break
        wake = policy.tick(now, pending, engine)
        progressed = engine.step()
        if progressed or engine.working():
            continue
        nxt = [t for t in (float(arrivals[i]) if i < n else None, wake) if t is not None and t > now]
        if not nxt:
            if pending and engine.live() == 0 and engine.stage_free(0):
                # a policy that declines to run an idle engine with queued work: give it the next tick
                time.sleep(0.0002)
            continue
        gap = min(nxt) - (clock() - t0)
        if gap > 0.0005:
            time.sleep(gap - 0.0003)
    wall = (max((r.done for r in engine.results.values()), default=0.0) - float(arrivals[0]))
    lat = np.array([engine.results[q.id].done - q.arrival for q in queries
                    if q.id in engine.results and engine.results[q.id].error is None])
    failed = sum(1 for r in engine.results.values() if r.error is not None)
    res = LoadResult(policy.name, spec.name, str(engine.device), float(n / max(float(arrivals[-1]), 1e-9)), n,
                     len(lat), failed, lat, wall, engine.overhead_per_stage_s() * 1e3,
                     sum(ex.executions for ex in engine.executors))
    res.extra = {k: v for k, v in policy.describe().items() if k not in ("policy",)}
    res.extra["unanswered"] = n - len(engine.results)
    return res
