"""Build a workload, its profile and a policy + engine by name (shared by the CLI and the benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.slicing import (
    DEFAULT_BATCH_SIZES,
    StageProfile,
    choose_stage_count,
    profile_from_module_times,
    profile_modules,
    stage_cuts,
    stage_tries,
)
from fluidnpu.scheduler_fw.gpu.policies import POLICIES, DelayBatch, DVABatch, ExitAwareDVA, ZeroBatch
from fluidnpu.scheduler_fw.gpu.runner import DEFAULT_STAGES
from fluidnpu.scheduler_fw.gpu.turbo import CostTable, NaiveBatch, NoBatch, TurboDP, warmup_cost_table


@dataclass
class Bench:
    """A workload on a device with its per-module profile (sliced per policy on demand)."""

    name: str
    spec: Any
    device: Any
    batch_sizes: tuple[int, ...]
    module_seconds: np.ndarray
    # `peak`'s measured throughput by bsmax, so that a Bench measures it once
    _peak: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def profile(self, n_stages: int) -> StageProfile:
        """Sliced into n_stages at the exits and, where the balance allows, at preferred-batch-size changes."""
        cuts = stage_cuts(self.module_seconds, self.batch_sizes, n_stages, [e.after + 1 for e in self.spec.exits])
        return profile_from_module_times(self.module_seconds, self.batch_sizes, n_stages, cuts, str(self.device))

    def search_stages(self, bsmax: int, duration_s: float = 2.0, seed: int = 0, evaluate=None
                      ) -> tuple[int, list[dict]]:
        """DVABatch §7.1's profiling search for the stage count: serve a short saturating load with DVABatch
        at each tried N (up to 8 tries) and keep the best (`choose_stage_count`)."""
        if evaluate is None:
            def evaluate(n: int) -> dict:
                from fluidnpu.scheduler_fw.gpu.runner import make_trace, serve_load

                pol, prof = make_policy(self, "dva", bsmax, n)
                arrivals, payloads = make_trace(self.spec, 1.5 * self.peak(bsmax), duration_s, seed)
                s = serve_load(self.spec, pol, make_engine(self, prof, bsmax), arrivals, payloads).summary()
                return {"throughput_qps": s["throughput_qps"], "mean_latency_ms": s["mean_latency_ms"]}
        tries = [{"stages": n, **evaluate(n)} for n in stage_tries(len(self.spec.modules), len(self.spec.exits) + 1)]
        return choose_stage_count(tries), tries

    def peak(self, bsmax: int, batches: int = 4, seed: int = 7) -> float:
        """Saturated throughput (queries/s) of the unsliced model on back-to-back batches of the
        workload's own queries (collate + forward + copy-out), best of bsmax/4, bsmax/2, bsmax.

        The per-module profile alone misses input preparation and, for BERT, the real length mix,
        so the load levels low/medium/high are fractions of this measured figure."""
        if self._peak.get(bsmax):
            return self._peak[bsmax]
        import time

        from fluidnpu.host_driver.staged.model import call_module
        from fluidnpu.host_driver.staged.torchutil import require_torch, synchronize

        torch = require_torch()
        rng = np.random.default_rng(seed)
        best = 0.0
        with torch.inference_mode():
            for bs in sorted({max(1, bsmax // 4), max(1, bsmax // 2), bsmax}):
                runs = []
                for k in range(batches + 1):
                    payloads = self.spec.sample(rng, bs)
                    synchronize(self.device)
                    t0 = time.perf_counter()
                    state = self.spec.collate(payloads, self.device)
                    for m in self.spec.modules:
                        state = call_module(m, state)
                    self.spec.output(state).to("cpu")
                    if k:
                        runs.append(time.perf_counter() - t0)
                best = max(best, bs / float(np.median(runs)))
        self._peak[bsmax] = best
        return best


def prepare(workload: str, device: str = "cpu", size: str | None = None, seed: int = 0, bsmax: int = 64,
            repeats: int | None = None, lengths: str | None = None, **kw) -> Bench:
    from fluidnpu.host_driver.staged.torchutil import require_torch, resolve_device
    from fluidnpu.host_driver.staged.workloads import build_workload

    torch = require_torch()
    dev = resolve_device(device)
    size = size or ("full" if dev.type == "cuda" else "tiny")
    if lengths is not None:
        kw["lengths"] = lengths
    spec = build_workload(workload, size=size, seed=seed, **kw).to(dev)
    bss = tuple(b for b in DEFAULT_BATCH_SIZES if b <= max(bsmax, 1)) or (1,)
    if bss[-1] < bsmax:
        bss = bss + (int(bsmax),)
    with torch.inference_mode():
        ms = profile_modules(spec, dev, bss, repeats or (5 if dev.type == "cuda" else 2))
    return Bench(workload, spec, dev, bss, ms)


def make_policy(bench: Bench, policy: str, bsmax: int = 64, stages: int | None = None,
                window_s: float | None = None, cost_table: str | Path | CostTable | None = None,
                trigger: str = "hungry", slo_s: float = 0.2, dp_bsmax: int | None = None):
    """(policy object, StageProfile for its engine)."""
    if policy not in POLICIES and policy not in ("dva-split", "dva-exit"):
        raise FluidError(f"unknown policy {policy!r}: {', '.join(POLICIES)}")
    if policy in ("dva", "dva-split", "dva-exit"):
        n = stages or min(DEFAULT_STAGES.get(bench.name, 2), len(bench.spec.modules))
        if n > len(bench.spec.modules):
            raise FluidError(f"cannot slice {bench.spec.name}'s {len(bench.spec.modules)} modules into {n} stages: "
                             "more stages than modules")
        prof = bench.profile(n)
        if policy == "dva-split":
            return DVABatch(prof, bsmax, n, input_div=False, stretch=False), prof
        cls = ExitAwareDVA if (policy == "dva-exit" or bench.spec.exits) else DVABatch
        return cls(prof, bsmax, n, input_div=bench.spec.length is not None), prof
    prof = bench.profile(1)
    if policy == "zerobatch":
        return ZeroBatch(bsmax), prof
    if policy == "delaybatch":
        w = 0.5 * prof.total(bsmax) if window_s is None else window_s
        return DelayBatch(bsmax, w), prof
    if policy in ("dp", "naive", "nobatch"):
        if bench.spec.length is None and policy == "dp":
            raise FluidError(f"dp batching needs a variable-length workload (bert), not {bench.name}")
        cap = dp_bsmax or min(bsmax, 20)
        if policy == "naive":
            return NaiveBatch(cap), prof
        if policy == "nobatch":
            return NoBatch(1), prof
        table = cost_table if isinstance(cost_table, CostTable) else load_or_warm_cost_table(bench, cost_table, cap)
        return TurboDP(table, cap, trigger=trigger, slo_s=slo_s), prof
    raise FluidError(f"unknown policy {policy!r}")


def load_or_warm_cost_table(bench: Bench, path: str | Path | None, cap: int) -> CostTable:
    if path is not None and Path(path).exists():
        return CostTable.load(path)
    max_len = bench.spec.max_length or 64
    lengths = sorted({max(1, int(x)) for x in np.linspace(1, max_len, 9)} | {8, 16, 32} - {0})
    lengths = [L for L in lengths if L <= max_len]
    bss = [b for b in (1, 2, 4, 8, 12, 16, 20, 32, 64) if b <= cap] or [1]
    if bss[-1] < cap:
        bss.append(cap)
    table = warmup_cost_table(bench.spec, bench.device, lengths, bss, repeats=2 if bench.device.type == "cpu" else 3)
    if path is not None:
        table.save(path)
    return table


def make_engine(bench: Bench, prof: StageProfile, bsmax: int, n_buffers: int = 2):
    from fluidnpu.host_driver.staged.engine import StagedEngine

    return StagedEngine(bench.spec, prof, bench.device, n_buffers=n_buffers, max_batch=bsmax)
