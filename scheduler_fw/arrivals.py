"""Seeded request traces: Poisson arrivals, and each sample's exit drawn from
the model's exit rates (§IV: "arrival times ... following a Poisson
distribution, with an expected rate equal to the specified samples/s").

Why two independent streams per seed: the arrival stream is drawn once as
unit-rate exponential gaps and scaled by 1/rate, and the exits come from a
stream of their own. So for one seed every policy and every arrival rate sees
the same samples with the same exits (common random numbers), and differences
between policies are not noise from different draws.

Board-side code: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.policy import check_positive


def poisson_trace(rate: float, n_samples: int, exit_rates: Sequence[float], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times in seconds, exit index per sample) for n_samples Poisson arrivals at `rate`/s."""
    rate = check_positive(rate, "the arrival rate (samples/s)")
    if int(n_samples) < 1:
        raise FluidError(f"need at least one sample, got {n_samples}")
    p = np.asarray(exit_rates, dtype=float)
    if p.ndim != 1 or p.size < 1 or np.any(p < 0) or not np.isclose(p.sum(), 1.0, atol=1e-6):
        raise FluidError(f"exit rates must be >= 0 and sum to 1, got {list(exit_rates)}")
    gaps = np.random.default_rng([int(seed), 0]).standard_exponential(int(n_samples)) / rate
    exits = np.random.default_rng([int(seed), 1]).choice(p.size, size=int(n_samples), p=p / p.sum())
    return np.cumsum(gaps), exits.astype(np.int64)
