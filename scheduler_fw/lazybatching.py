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

The mechanism is FluidB's (scheduler_fw/preemptive.py), so only those three traits
differ: at layer boundary l with Brem samples, Bincr = min(NQ, Bmax − Brem)
queued samples run layers 0..l−1 as a catch-up batch (non-recursive), then
merge and continue. Criterion:
    Bincr·T^1_{0:l} + (Brem + Bincr)·T^1_{l:L} < TSLO − (now − arrival of oldest)

Board-side code: pure Python.
"""

from __future__ import annotations

from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import Run
from fluidnpu.scheduler_fw.preemptive import PreemptiveBatching


class LazyBatching(PreemptiveBatching):
    """Layer-granular, exit-unaware preemptive batching with a B × T^1 latency estimate.

    Positions are layers: position l runs layer l, and the preemption point
    before it is the boundary at layer l.
    """

    name = "lazybatching"

    def __init__(self, table: LatencyTable, slo_s: float, bmax: int | None = None) -> None:
        super().__init__(table, slo_s, bmax)
        self._locked = False            # the batch has reached Bmax: no more preemption
        self._L = table.n_layers
        self._t1 = [table.layers_span(0, li, 1) for li in range(self._L + 1)]  # single-sample prefix sums

    def span(self, pos: int) -> tuple[int, int]:
        return pos, pos + 1

    def point(self, pos: int) -> int:
        return pos

    def catch_up_stop(self, pos: int) -> int:
        return pos

    def next_pos(self, run: Run) -> int:
        return run.stop

    def may_preempt(self) -> bool:
        return not self._locked

    def batch_formed(self) -> None:
        self._locked = len(self._active) >= self.bmax

    def preemption_size(self, now: float, layer: int, brem: int, nq: int, oldest_arrival: float) -> int:
        """Bincr if preempting at layer boundary `layer` passes LazyBatching's coarse criterion, else 0."""
        bincr = self.bincr(brem, nq)
        if bincr <= 0:
            return 0
        t1 = self._t1
        estimate = bincr * t1[layer] + (brem + bincr) * (t1[self._L] - t1[layer])
        return bincr if estimate < self.slo - (now - oldest_arrival) else 0
