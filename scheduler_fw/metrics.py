"""Serving metrics from a `ServeReport`: the figures of the paper's Figs. 4–6
and Table I.

* latency: completion (the sample's exit) − arrival; mean and 99th percentile.
* SLO violation rate: fraction of samples whose latency exceeds the SLO.
* NPU utilisation: useful operations / (peak ops/s × busy time), i.e. how well
  the MAC array is used while it runs. This is the reading under which the
  paper's statements hold (SERIAL lowest; FluidB "close to 95 %" at high
  traffic while every policy is busy all the time); `busy_fraction` (busy
  time / makespan) is reported beside it.
* throughput: completed samples / (last completion − first arrival).
* scheduler invocations (see `serving`), in total and per sample.

Board-side code: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fluidnpu.scheduler_fw.serving import ServeReport

METRICS: dict[str, str] = {
    "mean_latency_ms": "mean latency (ms)",
    "p99_latency_ms": "p99 latency (ms)",
    "slo_violation_rate": "SLO violation rate",
    "utilisation": "NPU utilisation (useful ops / peak while busy)",
    "throughput": "throughput (samples/s)",
    "invocations": "scheduler invocations",
    "invocations_per_sample": "scheduler invocations per sample",
    "busy_fraction": "NPU busy fraction",
    "preemptions": "preemptions",
    "preemption_points_per_sample": "preemption-point evaluations per sample",
    "mean_run_batch": "mean batch size per run",
}


def summarise(rep: ServeReport, slo_s: float, peak_ops_per_s: float) -> dict[str, float]:
    """The metrics of one served trace."""
    n = len(rep.done)
    if n == 0:
        raise ValueError("nothing was served")
    arrival = np.asarray(rep.arrival)
    lat = np.asarray(rep.done) - arrival
    makespan = max(float(np.max(rep.done) - np.min(arrival)), 1e-12)
    return {
        "samples": n,
        "mean_latency_ms": float(lat.mean() * 1e3),
        "p50_latency_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_latency_ms": float(np.percentile(lat, 99) * 1e3),
        "max_latency_ms": float(lat.max() * 1e3),
        "slo_violation_rate": float(np.mean(lat > slo_s)),
        "utilisation": float(2.0 * rep.macs / (peak_ops_per_s * rep.busy_seconds)) if peak_ops_per_s and
        rep.busy_seconds else 0.0,
        "busy_fraction": float(rep.busy_seconds / makespan),
        "throughput": float(n / makespan),
        "invocations": rep.invocations,
        "invocations_per_sample": rep.invocations / n,
        "preemptions": rep.preemptions,
        "preemption_points": rep.preemption_points,
        "preemption_points_per_sample": rep.preemption_points / n,
        "runs": rep.runs,
        "mean_run_batch": rep.batch_sum / rep.runs if rep.runs else 0.0,
        "max_run_batch": rep.max_batch,
    }


def average(per_seed: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean of every numeric metric over seeds (the paper averages three runs)."""
    keys = [k for k, v in per_seed[0].items() if isinstance(v, (int, float))]
    return {k: float(np.mean([m[k] for m in per_seed])) for k in keys}
