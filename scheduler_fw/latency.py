"""The scheduler's latency look-up tables, loaded from a design bundle.

The paper's scheduler keeps an Nexits x Bmax table of per-exit-segment
latencies and evaluates T^B_{i:j} (segments i..j inclusive at batch B) from it
at every preemption point. Doing that with a loop over segments would make the
decision cost grow with the network; instead the table is turned into prefix
sums once, at load time, so every T^B_{i:j} is one subtraction.

Two refinements over reading the raw table (see docs/interpretations.md):

* The prefix sums are built over the *monotone envelope* in B,
  T̂^B_s = max_{b <= B} T^b_s. Eq. 4 is an upper bound only if a segment never
  gets faster when the batch grows; early exits shrink the merged batch, so
  with a non-monotone table the real time could exceed the estimate. On the
  DSE's tables the envelope equals the table (a bigger batch is never faster).
* A per-layer table (the bundle's layer cycles / clock) serves policies that
  stop at every layer (LazyBatching) and the simulated NPU.

Board-side code: pure Python (lists of floats), no numpy needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fluidnpu.errors import FluidError


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    acc = 0.0
    for v in values:
        acc += v
        out.append(acc)
    return out


@dataclass(frozen=True)
class LatencyTable:
    """Latencies of one design, by exit segment and by layer, for b = 1..Bmax.

    segment_seconds[s][b-1]: exit segment s (backbone layers up to exit s, then
    exit s's head) at batch b.  layer_seconds[l][b-1]: layer l in execution
    order.  segment_stops[s]: one past the last layer of segment s.
    """

    segment_seconds: tuple[tuple[float, ...], ...]
    layer_seconds: tuple[tuple[float, ...], ...]
    segment_stops: tuple[int, ...]
    layer_macs: tuple[int, ...]
    exit_rates: tuple[float, ...]
    peak_ops_per_s: float
    name: str = "design"

    def __post_init__(self) -> None:
        n_seg, n_layers = len(self.segment_seconds), len(self.layer_seconds)
        if n_seg < 1 or n_layers < 1:
            raise FluidError(f"{self.name}: latency tables are empty")
        bmax = len(self.segment_seconds[0])
        if bmax < 1 or any(len(r) != bmax for r in self.segment_seconds) or \
                any(len(r) != bmax for r in self.layer_seconds):
            raise FluidError(f"{self.name}: latency tables need Bmax = {bmax} columns in every row")
        if len(self.segment_stops) != n_seg or list(self.segment_stops) != sorted(set(self.segment_stops)) \
                or self.segment_stops[0] < 1 or self.segment_stops[-1] != n_layers:
            raise FluidError(f"{self.name}: segment boundaries {self.segment_stops} do not split {n_layers} layers")
        if len(self.layer_macs) != n_layers or len(self.exit_rates) != n_seg:
            raise FluidError(f"{self.name}: need one MAC count per layer and one exit rate per segment")
        for row in (*self.segment_seconds, *self.layer_seconds):
            if any(not (t > 0.0) or t == float("inf") for t in row):
                raise FluidError(f"{self.name}: latencies must be finite and > 0")
        # derived, O(1)-lookup tables (frozen dataclass: set through object.__setattr__)
        env = [[max(row[:b]) for b in range(1, bmax + 1)] for row in self.segment_seconds]
        cum = [_prefix([env[s][b] for s in range(n_seg)]) for b in range(bmax)]
        layer_cum = [_prefix([self.layer_seconds[li][b] for li in range(n_layers)]) for b in range(bmax)]
        seg_of_layer: list[int] = []
        for s, stop in enumerate(self.segment_stops):
            seg_of_layer += [s] * (stop - len(seg_of_layer))
        object.__setattr__(self, "_cum", cum)
        object.__setattr__(self, "_layer_cum", layer_cum)
        object.__setattr__(self, "_seg_of_layer", tuple(seg_of_layer))
        object.__setattr__(self, "_macs_cum", [int(x) for x in _prefix(self.layer_macs)])

    # ---- shape -------------------------------------------------------------
    @property
    def bmax(self) -> int:
        return len(self.segment_seconds[0])

    @property
    def n_segments(self) -> int:
        return len(self.segment_seconds)

    @property
    def n_layers(self) -> int:
        return len(self.layer_seconds)

    def segment_start(self, s: int) -> int:
        """First layer of exit segment s."""
        return self.segment_stops[s - 1] if s else 0

    def segment_of_layer(self, layer: int) -> int:
        return self._seg_of_layer[layer]  # type: ignore[attr-defined]

    # ---- the scheduler's estimates (O(1)) ----------------------------------
    def span(self, first: int, last: int, b: int) -> float:
        """T^b_{first:last}: segments first..last inclusive at batch b (monotone envelope); 0 if empty."""
        if last < first:
            return 0.0
        cum = self._cum[b - 1]  # type: ignore[attr-defined]
        return cum[last + 1] - cum[first]

    def layers_span(self, start: int, stop: int, b: int) -> float:
        """Layers [start, stop) at batch b, from the per-layer table; 0 if empty."""
        if stop <= start:
            return 0.0
        cum = self._layer_cum[b - 1]  # type: ignore[attr-defined]
        return cum[stop] - cum[start]

    def macs_span(self, start: int, stop: int) -> int:
        """MACs one sample computes in layers [start, stop)."""
        cum = self._macs_cum  # type: ignore[attr-defined]
        return cum[stop] - cum[start] if stop > start else 0

    def full_batch_capacity(self, bmax: int | None = None) -> float:
        """Samples/s if every segment always ran with a full batch of Bmax (a load scale).

        Bmax / sum_s reach_s * T^Bmax_s, where reach_s is the fraction of samples
        that get to segment s given the exit rates.
        """
        b = self.bmax if bmax is None else bmax
        reach, left = 0.0, 1.0
        for s in range(self.n_segments):
            reach += left * self.segment_seconds[s][b - 1]
            left -= self.exit_rates[s]
        return b / reach

    # ---- construction --------------------------------------------------------
    @classmethod
    def from_bundle(cls, bundle: Any, bmax: int | None = None) -> LatencyTable:
        """The tables of a loaded design bundle (fluidnpu.bundle.Bundle), cut to Bmax columns."""
        have = bundle.bmax
        bmax = have if bmax is None else bmax
        if bmax < 1:
            raise FluidError(f"Bmax must be >= 1, got {bmax}")
        if bmax > have:
            raise FluidError(f"Bmax {bmax} is beyond the design bundle's latency tables (they stop at Bmax {have}); "
                             f"run the DSE with --bmax {bmax}")
        wl = bundle.workload
        sched = wl.schedule()
        clock_hz = bundle.clock_mhz * 1e6
        stops = []
        for s in range(len(wl.exits)):
            stops.append(max(x.index for x in sched if x.segment == s) + 1)
        TR, TP, TC = bundle.design
        table = bundle.latency_table()
        return cls(
            segment_seconds=tuple(tuple(row[:bmax]) for row in table),
            layer_seconds=tuple(tuple(bundle.layer_cycles(x.index, b) / clock_hz for b in range(1, bmax + 1))
                                for x in sched),
            segment_stops=tuple(stops),
            layer_macs=tuple(x.layer.macs for x in sched),
            exit_rates=tuple(e.rate for e in wl.exits),
            peak_ops_per_s=2.0 * TP * TC * clock_hz,
            name=f"{wl.name} <{TR},{TP},{TC}> on {bundle.board.name}",
        )

    @classmethod
    def from_segments(cls, segment_seconds: Sequence[Sequence[float]], exit_rates: Sequence[float],
                      layers_per_segment: int = 1, peak_ops_per_s: float = 1e12, name: str = "synthetic",
                      macs_per_layer: int = 1_000_000) -> LatencyTable:
        """A table without a bundle (tests, what-if studies): each segment split into equal layers."""
        n = layers_per_segment
        layer_seconds = tuple(tuple(t / n for t in row) for row in segment_seconds for _ in range(n))
        return cls(tuple(tuple(float(t) for t in row) for row in segment_seconds), layer_seconds,
                   tuple(n * (s + 1) for s in range(len(segment_seconds))), (macs_per_layer,) * len(layer_seconds),
                   tuple(float(r) for r in exit_rates), peak_ops_per_s, name)


def load_design(path: Any) -> Any:
    """Load a design bundle for scheduling; a bundle without latency tables is refused in one line."""
    import json
    from pathlib import Path

    from fluidnpu.bundle import load_bundle

    p = Path(path)
    try:
        data = json.loads(p.read_text()) if p.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None  # load_bundle reports it
    if isinstance(data, dict) and data.get("format") == "fluidnpu-design":
        lat = data.get("latency")
        if not isinstance(lat, dict) or not lat.get("segment_seconds") or not lat.get("layer_cycles"):
            raise FluidError(f"design bundle {p} has no latency tables (latency.segment_seconds/layer_cycles); "
                             f"the scheduler needs them: regenerate it with `fluidnpu dse -o`")
    return load_bundle(p)
