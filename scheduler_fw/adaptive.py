"""The model-level baselines: adaptive batching ⟨Bmax, Ttimeout⟩ and SERIAL.

AdaptB (§II-A), as used by Clipper/TF-Serving-style systems: once the NPU is
free, dispatch Bmax samples as soon as that many are queued, or whatever is
queued once the oldest sample has waited Ttimeout. The batch then runs the
whole network with no preemption; samples leave at their exits and the rest
of the batch carries on smaller (which is exactly the underutilisation the
paper's Fig. 1a shows). FC-AdaptB and R-AdaptB are this policy on an NPU DSE'd
for FC-only or R-dimension batching; the NPU design, not the policy, differs.

SERIAL is AdaptB with Bmax = 1 and no timeout: one sample at a time.

Board-side code: pure Python.
"""

from __future__ import annotations

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.backend import RunResult
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import IDLE, Action, Policy, Run, RunKind, Wait
from fluidnpu.scheduler_fw.samples import RequestQueue

# S/M/L batch-forming timeouts as fractions of the p99 latency SLO (§IV, Baselines)
TIMEOUT_FRACTIONS: dict[str, float] = {"s": 0.05, "m": 0.45, "l": 0.95}


class AdaptiveBatching(Policy):
    """Model-level adaptive batching with a batch-forming timeout."""

    name = "adaptb"

    def __init__(self, table: LatencyTable, timeout_s: float, bmax: int | None = None, name: str | None = None) -> None:
        super().__init__(table, bmax)
        timeout_s = float(timeout_s)
        if not 0.0 <= timeout_s < float("inf"):
            raise FluidError(f"the batch-forming timeout must be >= 0 seconds, got {timeout_s!r}")
        self.timeout = timeout_s
        self._running = False
        if name:
            self.name = name

    @property
    def busy(self) -> bool:
        return self._running

    def decide(self, now: float, queue: RequestQueue) -> Action:
        if not queue:
            return IDLE
        nq = len(queue)
        deadline = queue.oldest().arrival + self.timeout
        if nq >= self.bmax or now >= deadline:
            self._running = True
            return Run(0, self.table.n_layers, tuple(queue.pop(min(nq, self.bmax))), RunKind.LAUNCH)
        return Wait(deadline)

    def completed(self, run: Run, result: RunResult, now: float) -> None:
        self._running = False



class Serial(AdaptiveBatching):
    """One sample at a time (B = 1), run to its exit as soon as the NPU is free."""

    name = "serial"

    def __init__(self, table: LatencyTable) -> None:
        super().__init__(table, timeout_s=0.0, bmax=1)
