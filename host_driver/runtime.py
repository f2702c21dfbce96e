"""NetworkRuntime: a quantised early-exit network on an NPU, segment by segment.

The runtime owns what the scheduler's backfill and merge need from a real
device:

* **subnets**: layers [a, e) of one exit segment are one descriptor table
  (a chain: each layer reads the previous one's output, the exit head reads
  the segment's last backbone layer), planned by host_driver/memory_plan.py
  into a device buffer with Bmax sample slots per tensor, weights, biases.
  Images are built on first use and cached per layer range, so a policy that
  stops at every layer (LazyBatching) works as well as one that runs whole
  segments.
* **activation bookkeeping**: every sample carries a `SampleState` with the
  int16 tensors it still needs, keyed by the layer that produced them (-1:
  the input). After a run that stops at boundary e, a sample keeps exactly
  the tensors some layer >= e reads: at an exit that is the backbone output
  the next segment continues from (not the exit head's logits). So samples
  that stopped in different runs at the same boundary can be merged into one
  batch: their tensors are copied into slots 0..b-1 of the next subnet's
  input tensor (the NPU walks a batch's samples at a fixed stride).
* **exits**: at the end of segment s the exit head's int16 logits are
  dequantised with the layer's format and a sample leaves when its softmax
  top-1 probability is >= tau (the final exit takes everyone).
* **saturation**: every int16 value read back at the limits is counted per
  layer (`saturation`).

The device is an `NpuDriver` (host_driver/driver.py) over any `Device`
(ModelDevice, RtlSimDevice, a board); with `driver=None` the runtime computes
with the bit-exact golden model (hw/reference.py) on the host, which the tests
use as the reference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.hw.reference import INT16_MAX, INT16_MIN, layer_reference
from fluidnpu.quantize import QuantizedNetwork, SaturationReport, check_tau, host_op, softmax_confidence


@dataclass(eq=False)
class SampleState:
    """One sample's progress through the network."""

    acts: dict[int, np.ndarray]              # producer layer (-1: input) -> int16 tensor of this sample
    position: int = 0                        # the layer boundary the sample is at
    exit: int | None = None               # exit taken (None while in flight)
    pred: int | None = None
    confidence: float | None = None
    logits: np.ndarray | None = None      # float logits at the exit taken
    confidences: list[float] = field(default_factory=list)   # top-1 probability at every exit passed

    @property
    def done(self) -> bool:
        return self.exit is not None


@dataclass
class RunStats:
    """What one `NetworkRuntime.run` did on the device."""

    exited: list[tuple[int, int]] = field(default_factory=list)    # (index in the batch, exit)
    remaining: list[int] = field(default_factory=list)             # indices still in flight at stop
    device_cycles: int = 0
    subnet_runs: int = 0
    wall_s: float = 0.0
    device_wait_s: float = 0.0
    exit_offsets_s: list[float] = field(default_factory=list)       # wall time after start, per exited entry


class NetworkRuntime:
    """Runs layer ranges of `qnet` on `driver` for batches of up to Bmax samples."""

    def __init__(self, qnet: QuantizedNetwork, driver: Any = None, *, bmax: int | None = None,
                 tau: float = 0.8, timeout_s: float = 5.0) -> None:
        self.qnet = qnet
        self.driver = driver
        self.tau = check_tau(tau)
        self.timeout_s = timeout_s
        wl = qnet.workload
        if driver is not None:
            dev_bmax = driver.params.bmax
            self.bmax = dev_bmax if bmax is None else int(bmax)
            if not 1 <= self.bmax <= dev_bmax:
                raise FluidError(f"Bmax {self.bmax} is outside 1..{dev_bmax} (the NPU's Bmax)")
            if driver.params.layers < len(qnet.layers):
                raise FluidError(f"the NPU's FBCB holds {driver.params.layers} layers; {wl.name} has "
                                 f"{len(qnet.layers)}: build the design for this network")
        else:
            self.bmax = int(bmax or 8)
        sched = wl.schedule()
        self.n_layers = len(sched)
        self.segment_stops = tuple(max(s.index for s in sched if s.segment == e) + 1 for e in range(len(wl.exits)))
        self._segment_of = [s.segment for s in sched]
        self.sources = qnet.sources
        # needed[e]: producers a sample at boundary e must still hold
        self.needed: list[set[int]] = []
        for e in range(self.n_layers + 1):
            self.needed.append({self.sources[k] for k in range(e, self.n_layers) if self.sources[k] < e})
        self._images: dict[tuple[int, int], Any] = {}
        self.saturation = SaturationReport(["input"] + [q.name for q in qnet.layers], [0] * (len(qnet.layers) + 1),
                                           [0] * (len(qnet.layers) + 1))
        self.device_cycles = 0
        self.subnet_runs = 0

    # ---- samples ------------------------------------------------------------------------------
    def new_sample(self, x: Any) -> SampleState:
        """A fresh sample from one float input (H, W, C); FluidError on a bad shape, dtype, NaN or Inf."""
        arr = np.asarray(x) if not isinstance(x, np.ndarray) else x
        if not isinstance(arr, np.ndarray) or arr.ndim != 3:
            raise FluidError(f"a sample must be one HWC array of shape {tuple(self.qnet.input_hwc)}, "
                             f"got shape {getattr(arr, 'shape', None)}")
        xq, sat = self.qnet.quantize_input(arr)
        self.saturation.saturated[0] += sat
        self.saturation.total[0] += xq.size
        return SampleState({-1: xq[0]})

    def new_samples(self, x: Any) -> list[SampleState]:
        xq, sat = self.qnet.quantize_input(x)
        self.saturation.saturated[0] += sat
        self.saturation.total[0] += xq.size
        return [SampleState({-1: s}) for s in xq]

    # ---- images -------------------------------------------------------------------------------
    def _image(self, a: int, e: int) -> Any:
        key = (a, e)
        img = self._images.get(key)
        if img is None:
            for j in range(a + 1, e):
                if self.sources[j] != j - 1:
                    raise FluidError(f"layers {a}..{e - 1} are not a chain (layer {j} reads {self.sources[j]})")
            params = [self.qnet.layers[j].params() for j in range(a, e)]
            img = self.driver.place(params, self.bmax)
            self._images[key] = img
        return img

    def release(self) -> None:
        """Free every device buffer the runtime placed."""
        for img in self._images.values():
            if getattr(img, "buffer", None) is not None:
                img.buffer.free()
        self._images.clear()

    # ---- running ------------------------------------------------------------------------------
    def _run_piece(self, a: int, e: int, states: Sequence[SampleState]) -> dict[int, np.ndarray]:
        """Layers [a, e) of one segment on `states`; returns every layer's outputs (n, ...) int16.

        A layer with a host operation on its input (e.g. global average pooling
        before an exit's FC) starts a new subnet: the host applies it between
        the two NPU runs.
        """
        n = len(states)
        x = np.stack([st.acts[self.sources[a]] for st in states])
        outs: dict[int, np.ndarray] = {}
        lo = a
        while lo < e:
            hi = next((j for j in range(lo + 1, e) if self.qnet.layers[j].pre), e)
            cur = host_op(self.qnet.layers[lo].pre, x if lo == a else outs[lo - 1], self.qnet.workload.stem)
            if self.driver is None:
                for j in range(lo, hi):
                    q = self.qnet.layers[j]
                    g = q.geometry
                    cur = layer_reference(cur.reshape(n, g.in_h, g.in_w, g.cin), g, q.weights, q.bias)
                    outs[j] = cur
            else:
                img = self._image(lo, hi)
                img.write_tensor(0, cur.reshape((n,) + tuple(img.tensors[0].shape)))
                counters = self.driver.run_subnet(img, timeout_s=self.timeout_s, b=n)
                self.device_cycles += int(counters.get("busy", 0))
                for j in range(lo, hi):
                    outs[j] = img.read_tensor(j - lo + 1, n)
            self.subnet_runs += 1
            lo = hi
        for j, y in outs.items():
            self.saturation.saturated[j + 1] += int(np.count_nonzero((y == INT16_MAX) | (y == INT16_MIN)))
            self.saturation.total[j + 1] += int(y.size)
        return outs

    def run(self, start: int, stop: int, states: Sequence[SampleState]) -> RunStats:
        """Layers [start, stop) on `states` (all at boundary `start`), exits decided on the way.

        Updates each state in place (position, tensors held, exit and
        prediction); returns which batch entries exited where and which remain.
        """
        if not 0 <= start < stop <= self.n_layers:
            raise FluidError(f"layer range [{start}, {stop}) is outside [0, {self.n_layers})")
        if not 1 <= len(states) <= self.bmax:
            raise FluidError(f"batch of {len(states)} samples is outside [1, Bmax={self.bmax}]")
        for st in states:
            if st.done or st.position != start:
                raise FluidError(f"a sample at boundary {st.position}{' (already exited)' if st.done else ''} "
                                 f"cannot run from layer {start}")
        t0 = time.perf_counter()
        cyc0, runs0 = self.device_cycles, self.subnet_runs
        stats = RunStats()
        active = list(range(len(states)))
        pos = start
        while pos < stop and active:
            seg = self._segment_of[pos]
            seg_stop = self.segment_stops[seg]
            end = min(stop, seg_stop)
            batch = [states[i] for i in active]
            outs = self._run_piece(pos, end, batch)
            keep = self.needed[end]
            for k, st in enumerate(batch):
                acts = {p: (st.acts[p] if p < pos else outs[p][k]) for p in keep}
                st.acts = acts
                st.position = end
            if end == seg_stop:
                li = self.qnet.exit_layers[seg]
                logits = self.qnet.logits(seg, outs[li])
                pred, conf = softmax_confidence(logits)
                last = seg == len(self.segment_stops) - 1
                still = []
                for k, i in enumerate(active):
                    st = states[i]
                    st.confidences.append(float(conf[k]))
                    if last or conf[k] >= self.tau:
                        st.exit, st.pred, st.confidence = seg, int(pred[k]), float(conf[k])
                        st.logits = logits[k]
                        st.acts = {}
                        stats.exited.append((i, seg))
                        stats.exit_offsets_s.append(time.perf_counter() - t0)
                    else:
                        still.append(i)
                active = still
            pos = end
        stats.remaining = active
        stats.device_cycles = self.device_cycles - cyc0
        stats.subnet_runs = self.subnet_runs - runs0
        stats.wall_s = time.perf_counter() - t0
        return stats

    def infer(self, x: Any) -> list[SampleState]:
        """Run float inputs (n, H, W, C) through the network in batches of Bmax, whole segments at a time."""
        states = self.new_samples(x)
        pending = list(states)
        for seg, stop in enumerate(self.segment_stops):
            start = self.segment_stops[seg - 1] if seg else 0
            nxt = []
            for k in range(0, len(pending), self.bmax):
                chunk = pending[k:k + self.bmax]
                r = self.run(start, stop, chunk)
                nxt += [chunk[i] for i in r.remaining]
            pending = nxt
            if not pending:
                break
        return states


def infer_on_driver(driver: Any, qnet: QuantizedNetwork, x: np.ndarray, tau: float = 0.8,
                    bmax: int | None = None) -> dict[str, Any]:
    """Module-level (picklable) inference for `run_with_rtl`: exits, predictions, exit logits, counters."""
    rt = NetworkRuntime(qnet, driver, bmax=bmax, tau=tau)
    t0 = time.perf_counter()
    states = rt.infer(x)
    return {"exit": [s.exit for s in states], "pred": [s.pred for s in states],
            # every sample has exited, so each has its logits
            "logits": np.stack([cast(np.ndarray, s.logits) for s in states]), "device_cycles": rt.device_cycles,
            "subnet_runs": rt.subnet_runs, "wall_s": time.perf_counter() - t0,
            "saturation": rt.saturation.to_dict()}
