"""The interface every scheduling policy implements, and the actions it returns.

A policy is a state machine driven by the serving loop (`serving.serve`):

* `decide(now, queue)` is called whenever the NPU is free to be told what to
  do: after every run it finished, and while it is idle whenever a request
  arrives or a timer the policy asked for expires. It returns one action:
  `Run(start, stop, batch)` (run layers [start, stop) on those samples),
  `Wait(until)` (nothing now; call again at `until` or at the next arrival),
  or `IDLE` (nothing until the next arrival).
* `completed(run, result, now)` tells it what the run did (which samples
  exited, which remain at `stop`).

Policies own the batching decisions only; the loop owns the queue, the clock
and the results. That split is what lets the same policy objects run in the
discrete-event simulator and on a board with a real device.

Board-side code: pure Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.backend import RunResult
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.samples import RequestQueue, Sample


class RunKind(str, Enum):
    """What a Run is: a new batch, the active batch going on, or a backfill batch catching up to it.
    A str enum: run logs and JSON reports keep the plain names."""

    LAUNCH = "launch"
    CONTINUE = "continue"
    CATCH_UP = "catch-up"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Run:
    """Run layers [start, stop) on `batch`, a run of `kind`."""

    start: int
    stop: int
    batch: tuple[Sample, ...]
    kind: RunKind = RunKind.CONTINUE


@dataclass(frozen=True)
class Wait:
    """Nothing to run before `until` (e.g. a batch-forming timeout) unless a request arrives."""

    until: float


class _Idle:
    def __repr__(self) -> str:
        return "IDLE"


IDLE = _Idle()
Action = Run | Wait | _Idle


def check_positive(value: float, what: str) -> float:
    """A parameter that must be a finite number > 0 (SLOs, rates): else a one-line FluidError."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise FluidError(f"{what} must be a number > 0, got {value!r}") from None
    if not v > 0 or v == float("inf"):
        raise FluidError(f"{what} must be > 0, got {value!r}")
    return v


class Policy(ABC):
    """A scheduling policy bound to one design's latency table and a Bmax."""

    name = "policy"

    def __init__(self, table: LatencyTable, bmax: int | None = None) -> None:
        bmax = table.bmax if bmax is None else int(bmax)
        if bmax < 1:
            raise FluidError(f"Bmax must be >= 1, got {bmax}")
        if bmax > table.bmax:
            raise FluidError(f"Bmax {bmax} is beyond the latency tables of {table.name} (Bmax {table.bmax})")
        self.table = table
        self.bmax = bmax
        self.preemptions = 0
        self.preemption_points = 0   # times the preemption logic ran at a preemption point
        self.last_segment = table.n_segments - 1

    @abstractmethod
    def decide(self, now: float, queue: RequestQueue) -> Action:
        """What the NPU does next (see the module docstring)."""

    @abstractmethod
    def completed(self, run: Run, result: RunResult, now: float) -> None:
        """Take note of a finished run."""

    @property
    @abstractmethod
    def busy(self) -> bool:
        """True while samples are in flight (started and not finished)."""
