"""p50 / p99 / max of a latency sample: the one summary the serving reports and the fleet benchmarks print."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentiles(xs: Sequence[float], scale: float = 1.0, digits: int = 3, suffix: str = "",
                empty: float | None = None) -> dict[str, float]:
    """{"p50", "p99", "max"} (each + `suffix`) of xs * scale, rounded to `digits` (numpy's linear
    interpolation). An empty sample gives {} or, with `empty`, that value for each key (for reports
    that print the keys unconditionally)."""
    keys = [f"{k}{suffix}" for k in ("p50", "p99", "max")]
    if not len(xs):
        return {} if empty is None else dict.fromkeys(keys, empty)
    a = scale * np.asarray(xs, dtype=float)
    return dict(zip(keys, (round(float(v), digits) for v in (*np.percentile(a, (50, 99)), a.max()))))
