"""FluidB ⟨Bmax, TSLO⟩: the exit-aware preemptive scheduler of §III-B.

* Launch as soon as the first sample is queued: an idle NPU takes
  min(NQ, Bmax) samples from the head of the queue.
* Run exit segment by exit segment. The only preemption points are the exits:
  that is where the batch size changes.
* At exit i, after the exiting samples have left (Brem remain):
  Bslack = Bmax − Brem, Bincr = min(NQ, Bslack). Preempt iff Bincr > 0 and

      Toverhead = T^{Bincr}_{0:i} + T^{Bmerged}_{i+1:L−1}  <  Tslack
      Tslack    = TSLO − (Twait + Texec_so_far)       (of the oldest active sample)
      Bmerged   = Brem + Bincr

  (Eqs. 3–4; our reading of the garbled Eq. 3 is in docs/interpretations.md).
  T^B_{i:j} comes from the Nexits × Bmax look-up table (prefix sums over its
  monotone envelope, so each evaluation is O(1)).
* On preemption the Bincr samples run segments 0..i as one catch-up batch
  (their own early exits drop out on the way: no nested preemption), then
  they merge with the held Brem samples and the merged batch continues with
  segment i+1. Backfilling happens at most once per exit (non-recursive).

Why Toverhead bounds the oldest sample's completion: the held samples stall
for the catch-up (≤ T^{Bincr}_{0:i}), then run the rest of the network with
at most Bmerged samples (≤ T^{Bmerged}_{i+1:L−1}, as exits only shrink the
batch and the envelope is non-decreasing in B). Every other sample involved
is younger than the oldest active one (the queue is FIFO), finishes no later,
and therefore meets the SLO too.

Board-side code: pure Python.
"""

from __future__ import annotations

from fluidnpu.scheduler_fw.backend import RunResult
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import IDLE, Action, Policy, Run, check_positive
from fluidnpu.scheduler_fw.samples import RequestQueue, Sample


class FluidB(Policy):
    """Exit-aware, SLO-aware preemptive batching (the paper's scheduler)."""

    name = "fluidb"

    def __init__(self, table: LatencyTable, slo_s: float, bmax: int | None = None) -> None:
        super().__init__(table, bmax)
        self.slo = check_positive(slo_s, "the latency SLO")
        self._active: list[Sample] = []
        self._next_seg = 0
        self._held: list[Sample] | None = None
        self._backfilled_at = -1
        stops = table.segment_stops
        self._seg_run = [(table.segment_start(s), stops[s]) for s in range(table.n_segments)]

    @property
    def busy(self) -> bool:
        return bool(self._active) or self._held is not None

    def preemption_size(self, now: float, exit_index: int, brem: int, nq: int, oldest_arrival: float) -> int:
        """Bincr if preempting at exit `exit_index` passes the SLO-aware criterion, else 0. O(1)."""
        bincr = self.bmax - brem
        if nq < bincr:
            bincr = nq
        if bincr <= 0:
            return 0
        tab = self.table
        overhead = tab.span(0, exit_index, bincr) + tab.span(exit_index + 1, self.last_segment, brem + bincr)
        slack = self.slo - (now - oldest_arrival)
        return bincr if overhead < slack else 0

    def decide(self, now: float, queue: RequestQueue) -> Action:
        active = self._active
        if not active:
            if not queue:
                return IDLE
            batch = queue.pop(min(len(queue), self.bmax))
            self._active, self._next_seg, self._backfilled_at = batch, 0, -1
            return Run(0, self._seg_run[0][1], tuple(batch), "launch")
        seg = self._next_seg
        at_exit = seg - 1
        if at_exit == self._backfilled_at:
            start, stop = self._seg_run[seg]  # merged after a backfill: no second preemption at this exit
            return Run(start, stop, tuple(active), "continue")
        self.preemption_points += 1
        if queue:
            bincr = self.preemption_size(now, at_exit, len(active), len(queue), active[0].arrival)
            if bincr:
                self._held = active
                self._backfilled_at = at_exit
                self.preemptions += 1
                fresh = queue.pop(bincr)
                return Run(0, self._seg_run[at_exit][1], tuple(fresh), "catch-up")
        start, stop = self._seg_run[seg]
        return Run(start, stop, tuple(active), "continue")

    def completed(self, run: Run, result: RunResult, now: float) -> None:
        if run.kind == "catch-up":
            assert self._held is not None
            # held samples are older than the backfill (FIFO), so the oldest stays first
            self._active = self._held + result.remaining
            self._held = None
            return
        self._active = result.remaining
        self._next_seg = self.table.segment_of_layer(run.stop - 1) + 1
