"""What the DSE's results look like to people: the per-mode study and plots.

matplotlib is an optional extra ('plot'); it is imported only when a plot is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fluidnpu.dse.search import Choice, DSEResult, LayerShapes, best_cycles
from fluidnpu.errors import FluidError
from fluidnpu.hw.regmap import KCode


@dataclass(frozen=True)
class LayerModeStudy:
    """Cycles of one layer at batch b on a fixed design under each restriction."""

    name: str
    R: int
    P: int
    C: int
    r_batching: int        # BR = b, k = 1: the status quo
    fluid_only: int        # best BR, k = 1
    stackable_only: int    # BR = b, best k
    both: int              # best BR and k
    ideal: float           # 100% MAC utilisation

    @property
    def fluid_gain(self) -> float:
        return self.r_batching / self.fluid_only

    @property
    def stackable_gain(self) -> float:
        return self.r_batching / self.stackable_only


def mode_study(result: DSEResult, b: int) -> list[LayerModeStudy]:
    """For the chosen design, what Fluid Batching and Stackable PEs each buy every layer at batch b."""
    layers = result.workload.layers()
    shapes = LayerShapes.of(layers)
    d = (np.array([[result.TR]]), np.array([[result.TP]]), np.array([[result.TC]]))
    bpc = result.board.bus(result.clock_mhz, result.ports)
    timing = result.options.timing

    def best(cands: list[Choice]) -> np.ndarray:
        # on a design with the block input buffer every choice may also run buffered where it fits
        both = cands + [replace(ch, buffered=True) for ch in cands] if result.input_buffer else cands
        return best_cycles(*d, shapes, b, both, bpc, timing, result.NB, result.input_buffer)[0][0]

    r = best([Choice(b, 0)])
    fluid = best([Choice(br, 0) for br in range(b, 0, -1)])
    stack = best([Choice(b, k) for k in KCode])
    both = best([Choice(br, k) for k in KCode for br in range(b, 0, -1)])
    return [LayerModeStudy(x.name, x.R, x.P, x.C, int(r[i]), int(fluid[i]), int(stack[i]), int(both[i]),
                           x.groups * x.R * x.P * x.C * b / (result.TP * result.TC))
            for i, x in enumerate(layers)]


def plot_gops(series: dict[str, Sequence[float]], peak: float | None, path: str | Path, title: str) -> None:
    """GOp/s against batch size, one line per design (the paper's Fig. 7 layout)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FluidError("plots need matplotlib: pip install 'fluidnpu[plot]'") from None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, gops in series.items():
        ax.plot(range(1, len(gops) + 1), gops, marker="o", label=label)
    if peak:
        ax.axhline(peak, color="grey", linestyle="--", label="device peak 2·TP·TC·f")
    ax.set_xlabel("batch size")
    ax.set_ylabel("GOp/s")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from fluidnpu.output import writing

    try:
        with writing(path, "plot") as target:
            fig.savefig(target, dpi=120)
    finally:
        plt.close(fig)
