"""One simulated serving experiment: a policy on a design, a Poisson trace,
seeded, averaged over seeds.

Board-side code: numpy only (the eval/DSE layers on top are host-side).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.arrivals import poisson_trace
from fluidnpu.scheduler_fw.backend import SimulatedNPU
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.metrics import average, summarise
from fluidnpu.scheduler_fw.policy import check_positive
from fluidnpu.scheduler_fw.registry import make_policy
from fluidnpu.scheduler_fw.serving import ServeReport, TraceSource, VirtualClock, serve

DEFAULT_SAMPLES = 4000
# NPU stall per scheduler invocation on the board (interrupt, decision, reprogramming); see docs/results.md
DEFAULT_DECISION_COST_S = 50e-6


@dataclass(frozen=True)
class Setting:
    """What one simulation runs: the policy, the load and the SLO."""

    policy: str
    rate: float
    slo_s: float
    bmax: int | None = None
    n_samples: int = DEFAULT_SAMPLES
    decision_cost_s: float = DEFAULT_DECISION_COST_S

    def validate(self, table: LatencyTable) -> None:
        check_positive(self.rate, "the arrival rate (samples/s)")
        check_positive(self.slo_s, "the latency SLO")
        if self.bmax is not None and not 1 <= self.bmax <= table.bmax:
            raise FluidError(f"Bmax {self.bmax} is outside [1, {table.bmax}] (the design's latency tables)")
        if self.n_samples < 1:
            raise FluidError(f"need at least one sample per run, got {self.n_samples}")
        if not self.decision_cost_s >= 0:
            raise FluidError(f"the decision cost must be >= 0, got {self.decision_cost_s}")


def run_once(setting: Setting, table: LatencyTable, seed: int, record_runs: bool = False
             ) -> tuple[dict[str, float], ServeReport]:
    """Serve one seeded trace; returns (metrics, the raw report)."""
    setting.validate(table)
    times, exits = poisson_trace(setting.rate, setting.n_samples, table.exit_rates, seed)
    policy = make_policy(setting.policy, table, setting.slo_s, setting.bmax)
    rep = serve(policy, SimulatedNPU(table), TraceSource(times.tolist(), exits.tolist()), VirtualClock(),
                decision_cost_s=setting.decision_cost_s, record_runs=record_runs)
    return summarise(rep, setting.slo_s, table.peak_ops_per_s), rep


@dataclass
class SimResult:
    setting: Setting
    seeds: tuple[int, ...]
    mean: dict[str, float]
    per_seed: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        s = self.setting
        return {"policy": s.policy, "rate": s.rate, "slo_ms": s.slo_s * 1e3, "bmax": s.bmax,
                "samples_per_seed": s.n_samples, "decision_cost_us": round(s.decision_cost_s * 1e6, 6),
                "seeds": list(self.seeds), "metrics": self.mean, "per_seed": self.per_seed}


def simulate(setting: Setting, table: LatencyTable, seeds: Sequence[int] = (0, 1, 2)) -> SimResult:
    """Run `setting` once per seed and average the metrics."""
    if not seeds:
        raise FluidError("need at least one seed")
    per_seed = [run_once(setting, table, s)[0] for s in seeds]
    return SimResult(setting, tuple(seeds), average(per_seed), per_seed)
