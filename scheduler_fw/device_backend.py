"""A `Backend` on a real device: the scheduler's runs go to a NetworkRuntime (host_driver/runtime.py).

`DeviceBackend.run(start, stop, batch)` runs the layers on the device through
the runtime, and the exit heads decide (softmax top-1 >= tau) which samples
leave; each sample's activations stay with it between runs, so the policies'
backfill and merge work unchanged. `RunResult.seconds` is the wall time the
run took (the serving loop runs on a `WallClock`), and each exited sample's
offset is when its exit was decided.

`serve_stream` is the wall-clock serving experiment behind `fluidnpu run`:
it checks every input, streams the valid ones at Poisson arrival times to
the policy, and reports latency percentiles, SLO violations, exit rates,
accuracy and how many samples were sent, rejected and answered (each
exactly once). A device fault (NpuTimeout, NpuError) during a run answers
that run's samples with the error instead of losing them.

Because the policies estimate run times from a latency table, and the
device's wall time is not the design bundle's modelled FPGA time (a numpy
model or an RTL simulation is much slower than the FPGA), `measure_table`
times each exit segment on the device itself at start-up and builds the
table from those measurements (per-layer times split by the bundle's cycles).

Board-side code: numpy + the host driver.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.backend import Backend, RunResult
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.samples import Sample


@dataclass(eq=False)
class Request:
    """One client request: its input, its label if known, and (once admitted) its runtime state."""

    index: int                    # position in the client's stream
    state: Any                    # host_driver.runtime.SampleState
    label: int | None = None
    error: str | None = None   # set when a device fault answered it with an error
    answered: int = 0             # how many times a result was handed back (must end as 1)


class DeviceBackend(Backend):
    """Runs the scheduler's layer ranges on a NetworkRuntime; exits decided by the exit heads."""

    def __init__(self, runtime: Any, table: LatencyTable) -> None:
        if tuple(table.segment_stops) != tuple(runtime.segment_stops):
            raise FluidError(f"the latency table's segments {table.segment_stops} do not match the network's "
                             f"{runtime.segment_stops}")
        self.runtime = runtime
        self.table = table
        self.faults = 0

    @property
    def bmax(self) -> int:
        return self.runtime.bmax

    @property
    def segment_stops(self) -> tuple[int, ...]:
        return tuple(self.runtime.segment_stops)

    @property
    def peak_ops_per_s(self) -> float:
        return self.table.peak_ops_per_s

    def run(self, start: int, stop: int, batch: Sequence[Sample]) -> RunResult:
        self.check_run(start, stop, batch)
        t0 = time.perf_counter()
        states = [s.payload.state for s in batch]
        try:
            stats = self.runtime.run(start, stop, states)
        except FluidError as exc:          # NpuTimeout / NpuError / device faults: answer, never lose
            self.faults += 1
            seconds = time.perf_counter() - t0
            seg = self.table.segment_of_layer(start)
            exited = []
            for s in batch:
                s.payload.error = f"{type(exc).__name__}: {exc}"
                s.payload.state.exit = seg
                exited.append((s, seg, seconds))
            return RunResult(seconds, exited, [], 0)
        seconds = time.perf_counter() - t0
        exited = [(batch[i], ex, off) for (i, ex), off in zip(stats.exited, stats.exit_offsets_s)]
        macs = 0
        for _, ex in stats.exited:
            macs += self.table.macs_span(start, min(stop, self.table.segment_stops[ex]))
        macs += len(stats.remaining) * self.table.macs_span(start, stop)
        return RunResult(seconds, exited, [batch[i] for i in stats.remaining], macs)


# ---------------------------------------------------------------- latency table from the device
def calibration(device: str, bmax: int) -> dict[str, Any]:
    """`measure_table`'s settings for a device kind, as the serving configs carry them: every b = 1..Bmax,
    fastest of 5 after a warm-up on ModelDevice (milliseconds a run, on a host that may be loaded); b = 1
    and Bmax, one run each, on a board or the RTL simulation (seconds a run there, with nothing to warm up)."""
    return {"calib_sizes": None if device == "model" else [1, bmax], "calib_reps": 5 if device == "model" else 1,
            "calib_warmup": 0 if device == "rtl" else 1}


def measure_table(runtime: Any, bundle: Any, batch_sizes: Sequence[int] | None = None, reps: int = 3,
                  name: str = "measured", warmup: int = 1) -> LatencyTable:
    """Wall-time latency table of the device: each exit segment timed at the given batch sizes
    (default all 1..Bmax; others interpolated linearly), fastest of `reps` runs after `warmup` untimed
    ones (0 for the RTL simulation, where a run is seconds of simulation and nothing warms up)."""
    from fluidnpu.host_driver.runtime import SampleState

    bmax = runtime.bmax
    base = LatencyTable.from_bundle(bundle, bmax)
    if tuple(base.segment_stops) != tuple(runtime.segment_stops):
        raise FluidError("the design bundle's workload does not match the network's exit segments")
    sizes = sorted(set(batch_sizes or range(1, bmax + 1)) | {1, bmax})
    qnet = runtime.qnet
    shapes = {-1: tuple(qnet.input_hwc)}
    for i, q in enumerate(qnet.layers):
        shapes[i] = (q.geometry.out_h, q.geometry.out_w, q.geometry.cout)
    seg_rows = []
    for s, stop in enumerate(runtime.segment_stops):
        start = runtime.segment_stops[s - 1] if s else 0
        src = runtime.sources[start]
        measured = {}
        for b in sizes:
            times = []
            for r in range(warmup + reps):
                states = [SampleState({src: np.zeros(shapes[src], np.int16)}, position=start) for _ in range(b)]
                t0 = time.perf_counter()
                runtime._run_piece(start, stop, states)
                if r >= warmup:
                    times.append(time.perf_counter() - t0)
            measured[b] = float(np.min(times))      # the least-disturbed run: robust to a loaded host
        row = list(np.interp(np.arange(1, bmax + 1), sizes, [measured[b] for b in sizes]))
        seg_rows.append(row)
    # per-layer: each segment's measured time split by the bundle's modelled cycles of its layers
    layer_rows = []
    for s, stop in enumerate(runtime.segment_stops):
        start = runtime.segment_stops[s - 1] if s else 0
        for li in range(start, stop):
            layer_rows.append([seg_rows[s][b] * base.layer_seconds[li][b]
                               / max(base.layers_span(start, stop, b + 1), 1e-30) for b in range(bmax)])
    return LatencyTable(tuple(tuple(r) for r in seg_rows), tuple(tuple(r) for r in layer_rows),
                        base.segment_stops, base.layer_macs, base.exit_rates, base.peak_ops_per_s, name)


# ---------------------------------------------------------------- the wall-clock serving experiment
def serve_stream(runtime: Any, table: LatencyTable, inputs: Sequence[Any], labels: Sequence[int] | None,
                 policy: str, rate: float, slo_s: float, seed: int = 0) -> dict[str, Any]:
    """Stream `inputs` at Poisson `rate` through `policy` on the runtime's device, in wall-clock time.

    Every input is checked first: a bad one (shape, dtype, NaN/Inf) is
    rejected with its error and not streamed. Returns the figures of the run.
    """
    from fluidnpu.scheduler_fw.metrics import summarise
    from fluidnpu.scheduler_fw.policy import check_positive
    from fluidnpu.scheduler_fw.registry import make_policy
    from fluidnpu.scheduler_fw.serving import TraceSource, WallClock, serve

    rate = check_positive(rate, "--rate (samples/s)")
    slo_s = check_positive(slo_s, "--slo")
    pol = make_policy(policy, table, slo_s, runtime.bmax)
    backend = DeviceBackend(runtime, table)
    requests: list[Request] = []
    rejected: list[dict[str, Any]] = []
    for i, x in enumerate(inputs):
        try:
            st = runtime.new_sample(x)
        except FluidError as exc:
            rejected.append({"index": i, "error": str(exc)})
            continue
        requests.append(Request(i, st, None if labels is None else int(labels[i])))
    n = len(requests)
    report: dict[str, Any] = {"sent": len(inputs), "rejected": len(rejected), "rejections": rejected,
                              "admitted": n, "policy": policy, "rate": rate, "slo_ms": slo_s * 1e3,
                              "tau": runtime.tau, "bmax": runtime.bmax}
    if n == 0:
        report |= {"answered": 0, "errors": 0}
        return report
    gaps = np.random.default_rng([int(seed), 0]).standard_exponential(n) / rate
    t_start = time.monotonic() + 0.005
    times = (t_start + np.cumsum(gaps)).tolist()
    answered: dict[int, Request] = {}

    def on_result(sid: int, result: Any) -> None:
        req = requests[sid]
        req.answered += 1
        answered[sid] = req

    cyc0 = runtime.device_cycles
    wall0 = time.monotonic()
    rep = serve(pol, backend, TraceSource(times, requests), WallClock(), on_result=on_result)
    wall = time.monotonic() - wall0
    twice = [r.index for r in requests if r.answered > 1]
    lost = [r.index for r in requests if r.answered == 0]
    if twice or lost:
        raise RuntimeError(f"serving lost samples {lost} or answered {twice} twice")   # a bug, never a user error
    m = summarise(rep, slo_s, table.peak_ops_per_s)
    ok = [r for r in requests if r.error is None]
    exits = np.array([r.state.exit for r in ok], dtype=int)
    n_exits = len(runtime.segment_stops)
    labelled = [r for r in ok if r.label is not None]
    report |= {
        "answered": len(answered), "errors": n - len(ok),
        "error_messages": sorted({r.error for r in requests if r.error})[:3],
        "wall_s": wall, "throughput": m["throughput"],
        "latency_ms": {"mean": m["mean_latency_ms"], "p50": m["p50_latency_ms"],
                       "p90": float(np.percentile((np.asarray(rep.done) - np.asarray(rep.arrival)), 90) * 1e3),
                       "p99": m["p99_latency_ms"], "max": m["max_latency_ms"]},
        "slo_violation_rate": m["slo_violation_rate"],
        "slo_violations": int(round(m["slo_violation_rate"] * m["samples"])),
        "exit_rates": [float(np.mean(exits == e)) if len(exits) else 0.0 for e in range(n_exits)],
        "accuracy": float(np.mean([r.state.pred == r.label for r in labelled])) if labelled else None,
        "runs": rep.runs, "mean_run_batch": m["mean_run_batch"], "max_run_batch": m["max_run_batch"],
        "invocations": rep.invocations, "preemptions": rep.preemptions,
        "device_busy_s": rep.busy_seconds, "modelled_device_cycles": runtime.device_cycles - cyc0,
        "saturation": {k: v["saturated"] for k, v in runtime.saturation.to_dict().items()},
    }
    return report
