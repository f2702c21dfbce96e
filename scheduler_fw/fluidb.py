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

from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import Run
from fluidnpu.scheduler_fw.preemptive import PreemptiveBatching


class FluidB(PreemptiveBatching):
    """Exit-aware, SLO-aware preemptive batching (the paper's scheduler).

    Positions are exit segments: position s runs segment s, and the
    preemption point before it is exit s − 1.
    """

    name = "fluidb"

    def __init__(self, table: LatencyTable, slo_s: float, bmax: int | None = None) -> None:
        super().__init__(table, slo_s, bmax)
        stops = table.segment_stops
        self._seg_run = [(table.segment_start(s), stops[s]) for s in range(table.n_segments)]

    def span(self, pos: int) -> tuple[int, int]:
        return self._seg_run[pos]

    def point(self, pos: int) -> int:
        return pos - 1

    def catch_up_stop(self, pos: int) -> int:
        return self._seg_run[pos - 1][1]

    def next_pos(self, run: Run) -> int:
        return self.table.segment_of_layer(run.stop - 1) + 1

    def preemption_size(self, now: float, exit_index: int, brem: int, nq: int, oldest_arrival: float) -> int:
        """Bincr if preempting at exit `exit_index` passes the SLO-aware criterion (Eqs. 3–4), else 0. O(1)."""
        bincr = self.bincr(brem, nq)
        if bincr <= 0:
            return 0
        tab = self.table
        overhead = tab.span(0, exit_index, bincr) + tab.span(exit_index + 1, self.last_segment, brem + bincr)
        slack = self.slo - (now - oldest_arrival)
        return bincr if overhead < slack else 0
