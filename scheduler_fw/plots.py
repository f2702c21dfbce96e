"""Plots of the scheduler evaluation (Figs. 4–6, Table I) with matplotlib.

matplotlib is an optional extra ('plot'); it is imported only here, inside
the functions, so the board-side scheduler never needs it.

Host-side code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.output import writing
from fluidnpu.scheduler_fw.headline import LEVEL, RHO_MAX
from fluidnpu.scheduler_fw.registry import POLICIES

# one look per policy: FluidB stands out, FC dashed, R dotted, timeouts S/M/L in lighter shades
STYLE: dict[str, dict[str, Any]] = {
    "serial": dict(color="black", linestyle="-", marker="o"),
    "fc-adaptb-s": dict(color="#1f77b4", linestyle="--", marker="^"),
    "fc-adaptb-m": dict(color="#6baed6", linestyle="--", marker="^"),
    "fc-adaptb-l": dict(color="#bdd7e7", linestyle="--", marker="^"),
    "r-adaptb-s": dict(color="#2ca02c", linestyle=":", marker="s"),
    "r-adaptb-m": dict(color="#74c476", linestyle=":", marker="s"),
    "r-adaptb-l": dict(color="#bae4b3", linestyle=":", marker="s"),
    "lazybatching": dict(color="#9467bd", linestyle="-.", marker="D"),
    "fluidb": dict(color="#d62728", linestyle="-", marker="*", linewidth=2.4, markersize=9),
}

SWEEP_METRICS = (("mean_latency_ms", "mean latency (ms)", False), ("p99_latency_ms", "p99 latency (ms)", False),
                 ("slo_violation_rate", "SLO violation rate", False), ("utilisation", "NPU utilisation", False),
                 ("throughput", "throughput (samples/s)", False),
                 ("invocations_per_sample", "scheduler invocations / sample", True))


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FluidError("plots need matplotlib: pip install 'fluidnpu[plot]'") from None
    return plt


def _on(rows: Sequence[dict[str, Any]], hardware: str) -> list[dict[str, Any]]:
    """The rows of one hardware column; FluidB's own row belongs to both."""
    return [r for r in rows if r.get("hardware", "own") == hardware or r["policy"] == "fluidb"]


def _lines(ax, rows: Sequence[dict[str, Any]], panel: str, x: str, metric: str) -> None:
    """One line per policy, with error bars (the rows' t intervals over seeds) where the rows have them,
    and a grey ring on every point where that policy is saturated (left out of the headline)."""
    for pol, style in STYLE.items():
        pts = sorted((r[x], r[metric], r.get(f"{metric}_ci_lo"), r.get(f"{metric}_ci_hi"), r.get("saturated", False))
                     for r in rows if r["panel"] == panel and r["policy"] == pol)
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if all(p[2] is not None and p[2] == p[2] for p in pts):   # intervals known (NaN with one seed)
            err = [[max(y - p[2], 0.0) for y, p in zip(ys, pts)], [max(p[3] - y, 0.0) for y, p in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, label=POLICIES[pol].label, capsize=2.5, **style)
        else:
            ax.plot(xs, ys, label=POLICIES[pol].label, **style)
        sat = [(p[0], p[1]) for p in pts if p[4]]
        if sat:
            ax.scatter([p[0] for p in sat], [p[1] for p in sat], s=110, facecolors="none", edgecolors="grey",
                       linewidths=1.0, zorder=5)


def plot_sweep(rows: Sequence[dict[str, Any]], panel: Any, path: Path, title: str) -> None:
    """Figs. 4/5: every metric against the arrival rate, one line per policy, 95 % intervals over seeds as
    error bars, saturated points ringed."""
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    slo = panel.slos_ms[0]
    for ax, (metric, label, logy) in zip(axes.flat, SWEEP_METRICS):
        _lines(ax, rows, panel.key, "rate", metric)
        if metric == "p99_latency_ms":
            ax.axhline(slo, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        if metric == "throughput":
            ax.plot(panel.rates, panel.rates, color="grey", linestyle="--", linewidth=1, label="offered load")
        ax.set_xlabel("arrival rate (samples/s)")
        ax.set_ylabel(label)
        if logy:
            ax.set_yscale("log")
        elif metric.endswith("latency_ms"):
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    h, lab = axes.flat[1].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=6, fontsize=9)
    fig.suptitle(title)
    fig.text(0.5, 0.935, f"error bars: {100 * LEVEL:g} % t intervals over seeds; grey rings: saturated (rate > "
             f"{RHO_MAX:g} x the policy's measured capacity), left out of the headline", ha="center", fontsize=8,
             color="dimgrey")
    fig.tight_layout(rect=(0, 0.07, 1, 0.93))
    with writing(path, "plot") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def plot_slo_sweep(rows: Sequence[dict[str, Any]], panels: Sequence[Any], path: Path) -> None:
    """Fig. 6: violation rate against the tail-latency SLO, one panel per (model, board, rate)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.6))
    for ax, panel in zip(list(axes) if len(panels) > 1 else [axes], panels):
        _lines(ax, rows, panel.key, "slo_ms", "slo_violation_rate")
        ax.set_xlabel("p99 latency SLO (ms)")
        ax.set_ylabel("SLO violation rate")
        ax.set_title(f"{panel.model} on {panel.board}, {panel.rates[0]:g} samples/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    h, lab = (axes[0] if len(panels) > 1 else axes).get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=5, fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    with writing(path, "plot") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def plot_table1(summary: dict[str, Any], path: Path) -> None:
    """Table I as bars: ours beside the paper's, LazyBatching and FluidB, latency and violation rate."""
    plt = _plt()
    rows = summary["rows"]
    labels = [f"{r['model']}\n{r['board']} {r['rate']:g}/s\nSLO {r['slo_ms']:g} ms" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    series = [("paper LazyBatching", "paper", "lazybatching", "#c5b0d5"), ("ours LazyBatching", "ours", "lazybatching",
               "#9467bd"), ("paper FluidB", "paper", "fluidb", "#ff9896"), ("ours FluidB", "ours", "fluidb", "#d62728")]
    if all("same_hardware" in r for r in rows):
        series.insert(2, ("ours LazyBatching on FluidB's design", "same_hardware", "lazybatching", "#dadaeb"))
    width = 0.8 / len(series)
    panels = ((axes[0], 0, "average latency (ms)", 1.0), (axes[1], 1, "SLO violation rate (%)", 100.0))
    for ax, col, ylabel, scale in panels:
        for i, (name, src, pol, color) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
            ys = [r[src][pol][col] * scale for r in rows]
            ci: list[list[Any]] = [r.get("ours_ci", {}).get(pol, [None, None, None, None])[2 * col:2 * col + 2]
                                   if src == "ours" else [None, None] for r in rows]
            yerr = None
            if all(c[0] is not None and c[0] == c[0] for c in ci):
                yerr = [[max(y - c[0] * scale, 0) for y, c in zip(ys, ci)], [max(c[1] * scale - y, 0)
                                                                            for y, c in zip(ys, ci)]]
            ax.bar(xs, ys, width, label=name, color=color, yerr=yerr, capsize=2)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle("Table I: LazyBatching vs FluidB, ours beside the paper's")
    fig.tight_layout()
    with writing(path, "plot") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def plot_load_sweep(rows: Sequence[dict[str, Any]], panels: Sequence[Any], path: Path,
                    capacity: dict[str, float]) -> None:
    """Table I's settings across offered load: LazyBatching vs FluidB, mean latency and violation rate."""
    plt = _plt()
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7), squeeze=False)
    for j, panel in enumerate(panels):
        cap = capacity[panel.key]
        for i, (metric, label) in enumerate((("mean_latency_ms", "mean latency (ms)"),
                                             ("slo_violation_rate", "SLO violation rate"))):
            ax = axes[i][j]
            for pol in ("lazybatching", "fluidb"):
                pts = sorted((r["rate"] / cap, r[metric]) for r in rows
                             if r["panel"] == panel.key and r["policy"] == pol)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=POLICIES[pol].label, **STYLE[pol])
            ax.set_xlabel("offered load ρ (rate / FluidB full-batch capacity)")
            ax.set_ylabel(label)
            if metric == "mean_latency_ms":
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(f"{panel.model} {panel.board}, SLO {panel.slos_ms[0]:g} ms\n"
                             f"(capacity {cap:.1f} samples/s)", fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    with writing(path, "plot") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def plot_figure(name: str, panels: Sequence[Any], rows: Sequence[dict[str, Any]], out_dir: Path,
                summary: dict[str, Any]) -> list[str]:
    """Draw one reproduction's PNGs; returns their file names."""
    files = []
    if name in ("fig4", "fig5"):
        for p in panels:
            stem = name if len(panels) == 1 else f"{name}_{p.key}"
            title = (f"{'Fig. 4' if name == 'fig4' else 'Fig. 5'}: 4-exit {p.model} on {p.board}, "
                     f"p99 SLO {p.slos_ms[0]:g} ms")
            plot_sweep(_on(rows, "own"), p, out_dir / f"{stem}.png", title + ", each policy on its own DSE'd design")
            files.append(f"{stem}.png")
            if p.control:
                plot_sweep(_on(rows, "fluidb"), p, out_dir / f"{stem}_same_hardware.png",
                           title + ", every policy on FluidB's design (same-hardware control)")
                files.append(f"{stem}_same_hardware.png")
    elif name == "fig6":
        plot_slo_sweep(_on(rows, "own"), panels, out_dir / "fig6.png")
        files.append("fig6.png")
    elif name == "table1":
        plot_table1(summary, out_dir / "table1.png")
        files.append("table1.png")
        load = [p for p in panels if p.key.startswith("load:")]
        if load:
            cap = {p.key: next(x["rate"] / x["load"] for x in summary["load_sweep"]
                               if f"load:{x['model']}-{x['board']}" == p.key) for p in load}
            plot_load_sweep(rows, load, out_dir / "table1_load.png", cap)
            files.append("table1_load.png")
    return files
