"""The launch / backfill / merge mechanism that FluidB and LazyBatching share.

Both launch as soon as a sample is queued, run the batch from one preemption
point to the next, and at a point with Brem samples left may backfill
Bincr = min(NQ, Bmax − Brem) queued samples: the held batch waits while the
fresh samples run a catch-up from layer 0 to the point (non-recursive: their
own exits drop out on the way, no nested preemption), then the two merge and
continue. They differ only in where the points are, in the criterion that
decides a preemption, and in whether a full batch may still be backfilled;
the subclasses say just that, so the comparison in the evaluation measures
those traits and nothing else.

Board-side code: pure Python.
"""

from __future__ import annotations

from abc import abstractmethod

from fluidnpu.scheduler_fw.backend import RunResult
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.policy import IDLE, Action, Policy, Run, RunKind, check_positive
from fluidnpu.scheduler_fw.samples import RequestQueue, Sample


class PreemptiveBatching(Policy):
    """Preemptive batching with one backfill per preemption point.

    The batch's progress is a position: 0 before the first run, then one per
    preemption point passed. Subclasses map a position to the layers it runs
    (`span`), to the point index their criterion takes (`point`) and to where
    a catch-up batch stops (`catch_up_stop`).
    """

    def __init__(self, table: LatencyTable, slo_s: float, bmax: int | None = None) -> None:
        super().__init__(table, bmax)
        self.slo = check_positive(slo_s, "the latency SLO")
        self._active: list[Sample] = []
        self._pos = 0
        self._held: list[Sample] | None = None
        self._backfilled_at = -1

    @property
    def busy(self) -> bool:
        return bool(self._active) or self._held is not None

    def bincr(self, brem: int, nq: int) -> int:
        """How many queued samples a backfill would take: min(NQ, Bmax − Brem), at least 0."""
        return max(0, min(nq, self.bmax - brem))

    @abstractmethod
    def span(self, pos: int) -> tuple[int, int]:
        """Layers [start, stop) the active batch runs from position `pos`."""

    @abstractmethod
    def point(self, pos: int) -> int:
        """The preemption point at position `pos`, as `preemption_size` takes it."""

    @abstractmethod
    def catch_up_stop(self, pos: int) -> int:
        """The layer a catch-up batch started at position `pos` runs up to (exclusive)."""

    @abstractmethod
    def next_pos(self, run: Run) -> int:
        """The position after the active batch finished `run`."""

    @abstractmethod
    def preemption_size(self, now: float, point: int, brem: int, nq: int, oldest_arrival: float) -> int:
        """Bincr if preempting at `point` passes the policy's criterion, else 0."""

    def may_preempt(self) -> bool:
        """Whether the active batch may be backfilled at all (LazyBatching: not once it is full)."""
        return True

    def batch_formed(self) -> None:
        """Hook: the active batch was just formed, by a launch or by a merge after a backfill."""

    def decide(self, now: float, queue: RequestQueue) -> Action:
        active = self._active
        if not active:
            if not queue:
                return IDLE
            batch = queue.pop(min(len(queue), self.bmax))
            self._active, self._pos, self._backfilled_at = batch, 0, -1
            self.batch_formed()
            start, stop = self.span(0)
            return Run(start, stop, tuple(batch), RunKind.LAUNCH)
        pos = self._pos
        if pos != self._backfilled_at:   # merged after a backfill: no second preemption at this point
            self.preemption_points += 1
            if queue and self.may_preempt():
                bincr = self.preemption_size(now, self.point(pos), len(active), len(queue), active[0].arrival)
                if bincr:
                    self._held = active
                    self._backfilled_at = pos
                    self.preemptions += 1
                    return Run(0, self.catch_up_stop(pos), tuple(queue.pop(bincr)), RunKind.CATCH_UP)
        start, stop = self.span(pos)
        return Run(start, stop, tuple(active), RunKind.CONTINUE)

    def completed(self, run: Run, result: RunResult, now: float) -> None:
        if run.kind is RunKind.CATCH_UP:
            assert self._held is not None
            # held samples are older than the backfill (FIFO), so the oldest stays first
            self._active = self._held + result.remaining
            self._held = None
            self.batch_formed()
            return
        self._active = result.remaining
        self._pos = self.next_pos(run)
