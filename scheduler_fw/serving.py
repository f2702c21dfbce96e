"""The serving loop: requests in, policy decisions, backend runs, results out.

One loop serves both worlds. With a `VirtualClock` and a `TraceSource` it is a
discrete-event simulation: a run advances the clock by the device time the
backend reports, and idle periods jump straight to the next arrival. With a
`WallClock`, a real device's blocking `run` and a source fed by clients, the
same code is the board-side server.

Scheduler invocations are counted the way the paper compares FluidB with
LazyBatching: every time the NPU stops and the scheduler must decide what it
does next (after every run), plus every time the scheduler starts an idle
NPU. Polls of an idle policy that decide nothing are not invocations.
`decision_cost_s` charges each invocation as NPU stall time on a virtual
clock (the ARM deciding and reprogramming the NPU); on a wall clock the real
cost is already in the elapsed time.

Board-side code: pure Python.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluidnpu.scheduler_fw.backend import Backend
from fluidnpu.scheduler_fw.policy import Policy, Run, RunKind, Wait
from fluidnpu.scheduler_fw.samples import ReorderBuffer, RequestQueue


class Clock(ABC):
    """Time as the serving loop sees it, in seconds."""

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def elapse(self, seconds: float) -> None:
        """Account for work of `seconds` that the clock has not seen pass (a simulated run)."""

    @abstractmethod
    def sleep_until(self, t: float) -> None: ...


class VirtualClock(Clock):
    """Simulated time: moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def elapse(self, seconds: float) -> None:
        self._t += seconds

    def sleep_until(self, t: float) -> None:
        if t > self._t:
            self._t = t


class WallClock(Clock):
    """Real time (time.monotonic); a blocking device's run time has already passed."""

    def now(self) -> float:
        return time.monotonic()

    def elapse(self, seconds: float) -> None:
        pass

    def sleep_until(self, t: float) -> None:
        dt = t - time.monotonic()
        if dt > 0:
            time.sleep(dt)


class ArrivalSource(ABC):
    """Where requests come from."""

    @abstractmethod
    def poll(self, now: float) -> list[tuple[float, Any]]:
        """(arrival time, payload) of every request that arrived by `now` and was not yet returned."""

    @abstractmethod
    def wait(self, clock: Clock, until: float | None) -> bool:
        """Block until the next arrival or `until`, whichever is first.

        Returns False (without waiting) when `until` is None and no request
        will ever arrive again: the loop then ends once the system is empty.
        """


class TraceSource(ArrivalSource):
    """A pre-generated arrival trace (times non-decreasing) with one payload per request."""

    def __init__(self, times: Sequence[float], payloads: Sequence[Any]) -> None:
        if len(times) != len(payloads):
            raise ValueError("need one payload per arrival time")
        self._t = [float(t) for t in times]
        if any(b < a for a, b in zip(self._t, self._t[1:])):
            raise ValueError("arrival times must be non-decreasing")
        self._p = list(payloads)
        self._i = 0

    def poll(self, now: float) -> list[tuple[float, Any]]:
        i, t = self._i, self._t
        j = i
        n = len(t)
        while j < n and t[j] <= now:
            j += 1
        self._i = j
        return list(zip(t[i:j], self._p[i:j]))

    def wait(self, clock: Clock, until: float | None) -> bool:
        nxt = self._t[self._i] if self._i < len(self._t) else None
        if nxt is None and until is None:
            return False
        target = until if nxt is None else (nxt if until is None else min(nxt, until))
        clock.sleep_until(target)
        return True


@dataclass
class RunRecord:
    """One backend run, for traces and tests."""

    kind: RunKind
    start: int
    stop: int
    batch: tuple[int, ...]
    remaining: tuple[int, ...]
    t0: float
    t1: float


@dataclass
class ServeReport:
    """Everything the loop observed; `metrics.summarise` turns it into figures."""

    ids: list[int] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    exit: list[int] = field(default_factory=list)
    invocations: int = 0
    runs: int = 0
    busy_seconds: float = 0.0
    macs: int = 0
    max_batch: int = 0
    batch_sum: int = 0
    preemptions: int = 0
    preemption_points: int = 0
    released_in_order: int = 0
    runs_log: list[RunRecord] | None = None


def serve(policy: Policy, backend: Backend, source: ArrivalSource, clock: Clock | None = None,
          decision_cost_s: float = 0.0, on_result: Callable[[int, Any], None] | None = None,
          record_runs: bool = False) -> ServeReport:
    """Serve every request from `source` with `policy` on `backend` until the source is exhausted."""
    if policy.bmax > backend.bmax:
        raise ValueError(f"policy Bmax {policy.bmax} exceeds the backend's {backend.bmax}")
    clock = clock or VirtualClock()
    queue = RequestQueue()
    rob = ReorderBuffer()
    rep = ServeReport(runs_log=[] if record_runs else None)
    after_run = False
    while True:
        for t, payload in source.poll(clock.now()):
            queue.admit(t, payload)
        now = clock.now()
        action = policy.decide(now, queue)
        is_run = isinstance(action, Run)
        if after_run or is_run:
            rep.invocations += 1
            if decision_cost_s:
                clock.elapse(decision_cost_s)
        after_run = False
        if is_run:
            batch = action.batch  # type: ignore[union-attr]
            t0 = clock.now()
            res = backend.run(action.start, action.stop, batch)  # type: ignore[union-attr]
            clock.elapse(res.seconds)
            t1 = clock.now()
            rep.runs += 1
            rep.busy_seconds += res.seconds
            rep.macs += res.macs
            rep.batch_sum += len(batch)
            if len(batch) > rep.max_batch:
                rep.max_batch = len(batch)
            for smp, ex, offset in res.exited:
                done = t0 + offset if offset <= res.seconds else t1
                rep.ids.append(smp.id)
                rep.arrival.append(smp.arrival)
                rep.done.append(done)
                rep.exit.append(ex)
                for sid, result in rob.add(smp.id, (ex, done)):
                    rep.released_in_order += 1
                    if on_result is not None:
                        on_result(sid, result)
            if rep.runs_log is not None:
                rep.runs_log.append(RunRecord(action.kind, action.start, action.stop,  # type: ignore[union-attr]
                                              tuple(s.id for s in batch), tuple(s.id for s in res.remaining),
                                              t0, t1))
            policy.completed(action, res, t1)  # type: ignore[arg-type]
            after_run = True
        elif isinstance(action, Wait):
            if action.until <= now:
                raise RuntimeError(f"{policy.name} waits for t={action.until}, which has passed (now {now})")
            source.wait(clock, action.until)
        else:
            if queue:
                raise RuntimeError(f"{policy.name} left {len(queue)} queued samples idle")
            if not source.wait(clock, None):
                if policy.busy:
                    raise RuntimeError(f"{policy.name} went idle with samples in flight")
                break
    rep.preemptions = policy.preemptions
    rep.preemption_points = policy.preemption_points
    return rep
