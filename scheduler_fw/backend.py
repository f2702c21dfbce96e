"""What a scheduler drives: a device that runs layers [start, stop) of the
resident early-exit model on a batch of samples.

This is the one interface between scheduling policies and hardware. The
simulated NPU below implements it from the design bundle's latency tables;
the host driver's devices (PYNQ, /dev/mem, RTL simulation, ...) implement the
same `Backend` so that every policy runs unchanged on real hardware.

Contract of `Backend.run(start, stop, batch)`:

* Layers are indexed in execution order (`Workload.schedule()`): exit segment
  by exit segment, the backbone layers up to exit i and then exit i's head.
  Segment s ends at `segment_stops[s]` (exclusive).
* Every sample in `batch` is at layer boundary `start`: either `start == 0`
  (a fresh sample; the backend loads its input) or the sample stopped there
  in an earlier `run` (its activations are already in off-chip memory, which
  is why preempting at an exit needs no checkpointing). Samples that stopped
  in different runs at the same boundary can be merged into one batch.
* Whenever the run passes the end of a segment s, the backend decides which
  samples leave at exit s (a real device: the exit head's confidence against
  the threshold; the simulated one: the exit drawn for the sample) and drops
  them from the batch for the rest of the run. A run ends early if the batch
  empties. Samples still in the batch at `stop` are returned in input order.
* `1 <= len(batch) <= bmax`. The backend picks the per-layer batching
  configuration (the FBCB entry for the active batch size) itself.
* `run` returns when the device is done. `RunResult.seconds` is the device
  time it took; for a simulated device it is the only notion of time.

Board-side code: pure Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.samples import Sample


@dataclass
class RunResult:
    """What one `Backend.run` did.

    exited: (sample, exit index, seconds after the run started at which its
    result was ready). remaining: samples that reached `stop`, in input order.
    macs: useful multiply-accumulates performed (0 if the device cannot tell).
    """

    seconds: float
    exited: list[tuple[Sample, int, float]] = field(default_factory=list)
    remaining: list[Sample] = field(default_factory=list)
    macs: int = 0


class Backend(ABC):
    """A device running layer ranges of one early-exit model on batches."""

    @property
    @abstractmethod
    def bmax(self) -> int:
        """The largest batch the device's tables and buffers were built for."""

    @property
    @abstractmethod
    def segment_stops(self) -> tuple[int, ...]:
        """One past the last layer of each exit segment; the last one is the layer count."""

    @property
    def n_layers(self) -> int:
        return self.segment_stops[-1]

    @property
    def peak_ops_per_s(self) -> float:
        """Peak throughput (2 x MACs/s) used to report utilisation; 0 if unknown."""
        return 0.0

    @abstractmethod
    def run(self, start: int, stop: int, batch: Sequence[Sample]) -> RunResult:
        """Run layers [start, stop) on `batch`, dropping samples at the exits passed."""

    def check_run(self, start: int, stop: int, batch: Sequence[Sample]) -> None:
        """Argument checks shared by implementations (a violation is a scheduler bug)."""
        if not 0 <= start < stop <= self.n_layers:
            raise ValueError(f"layer range [{start}, {stop}) is outside [0, {self.n_layers})")
        if not 1 <= len(batch) <= self.bmax:
            raise ValueError(f"batch of {len(batch)} samples is outside [1, Bmax={self.bmax}]")


class SimulatedNPU(Backend):
    """The NPU of a design bundle, timed by its latency tables.

    Each sample's payload is the index of the exit it leaves at (drawn by the
    workload generator from the model's exit rates). A whole exit segment at
    batch b costs exactly `segment_seconds[s][b-1]`, the entry the scheduler's
    look-up table holds, so "exact latency table" holds by construction; a
    partial segment (LazyBatching stops at every layer) costs the sum of its
    layers at the current batch size.
    """

    def __init__(self, table: LatencyTable) -> None:
        self.table = table

    @property
    def bmax(self) -> int:
        return self.table.bmax

    @property
    def segment_stops(self) -> tuple[int, ...]:
        return self.table.segment_stops

    @property
    def peak_ops_per_s(self) -> float:
        return self.table.peak_ops_per_s

    def run(self, start: int, stop: int, batch: Sequence[Sample]) -> RunResult:
        self.check_run(start, stop, batch)
        tab = self.table
        stops = tab.segment_stops
        active = list(batch)
        exited: list[tuple[Sample, int, float]] = []
        t = 0.0
        macs = 0
        pos = start
        while pos < stop and active:
            s = tab.segment_of_layer(pos)
            seg_stop = stops[s]
            end = stop if stop < seg_stop else seg_stop
            b = len(active)
            if end == seg_stop and pos == (stops[s - 1] if s else 0):
                t += tab.segment_seconds[s][b - 1]
            else:
                t += tab.layers_span(pos, end, b)
            macs += b * tab.macs_span(pos, end)
            if end == seg_stop:
                keep = []
                for smp in active:
                    if smp.payload == s:
                        exited.append((smp, s, t))
                    else:
                        keep.append(smp)
                active = keep
            pos = end
        if active and stop == self.n_layers:
            raise FluidError(f"samples {[x.id for x in active]} carry exits beyond the model's last exit")
        return RunResult(t, exited, active, macs)
