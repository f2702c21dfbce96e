"""LazyBatching [7] as the paper characterises it (§II-A, §IV, Table I).

* SLO-aware, launches as soon as a sample is queued (like FluidB).
* Preemption checks at *every layer* boundary: exit-unaware, it does not know
  where the batch size can change, so the scheduler is invoked ~Nlayers times
  per pass instead of ~Nexits.
* Coarse latency estimator: a batch of B costs B × the single-sample latency
  (T^B_{i:j} ≈ B·T^1_{i:j}), and the rest of the network is charged in full
  (no exits). This overestimates batched execution, so it preempts rarely.
* Once the batch has reached Bmax it is never preempted again, even after
  samples have left at exits.

Otherwise the mechanism mirrors FluidB's so that only those three traits
differ: at layer boundary l with Brem samples, Bincr = min(NQ, Bmax − Brem)
queued samples run layers 0..l−1 as a catch-up batch (non-recursive), then
merge and continue. Criterion:
    Bincr·T^1_{0:l} + (Brem + Bincr)·T^1_{l:L} < TSLO − (now − arrival of oldest)

Board-side code: pure Python.
"""

from __future__ import annotations

from fluidnpu.scheduler_fw.backend import RunResult
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import IDLE, Action, Policy, Run, check_positive
from fluidnpu.scheduler_fw.samples import RequestQueue, Sample


class LazyBatching(Policy):
    """Layer-granular, exit-unaware preemptive batching with a B × T^1 latency estimate."""

    name = "lazybatching"

    def __init__(self, table: LatencyTable, slo_s: float, bmax: int | None = None) -> None:
        super().__init__(table, bmax)
        self.slo = check_positive(slo_s, "the latency SLO")
        self._active: list[Sample] = []
        self._pos = 0
        self._held: list[Sample] | None = None
        self._locked = False            # the batch has reached Bmax: no more preemption
        self._backfilled_at = -1
        self._L = table.n_layers
        self._t1 = [table.layers_span(0, li, 1) for li in range(self._L + 1)]  # single-sample prefix sums

    @property
    def busy(self) -> bool:
        return bool(self._active) or self._held is not None

    def preemption_size(self, now: float, layer: int, brem: int, nq: int, oldest_arrival: float) -> int:
        """Bincr if preempting at boundary `layer` passes LazyBatching's coarse criterion, else 0."""
        bincr = self.bmax - brem
        if nq < bincr:
            bincr = nq
        if bincr <= 0:
            return 0
        t1 = self._t1
        estimate = bincr * t1[layer] + (brem + bincr) * (t1[self._L] - t1[layer])
        return bincr if estimate < self.slo - (now - oldest_arrival) else 0

    def decide(self, now: float, queue: RequestQueue) -> Action:
        active = self._active
        if not active:
            if not queue:
                return IDLE
            batch = queue.pop(min(len(queue), self.bmax))
            self._active, self._pos, self._backfilled_at = batch, 0, -1
            self._locked = len(batch) >= self.bmax
            return Run(0, 1, tuple(batch), "launch")
        pos = self._pos
        if pos != self._backfilled_at:
            self.preemption_points += 1  # invoked at every layer boundary, even when it cannot preempt
        if queue and not self._locked and pos != self._backfilled_at:
            bincr = self.preemption_size(now, pos, len(active), len(queue), active[0].arrival)
            if bincr:
                self._held = active
                self._backfilled_at = pos
                self.preemptions += 1
                return Run(0, pos, tuple(queue.pop(bincr)), "catch-up")
        return Run(pos, pos + 1, tuple(active), "continue")

    def completed(self, run: Run, result: RunResult, now: float) -> None:
        if run.kind == "catch-up":
            assert self._held is not None
            self._active = self._held + result.remaining
            self._held = None
            if len(self._active) >= self.bmax:
                self._locked = True
            return
        self._active = result.remaining
        self._pos = run.stop
