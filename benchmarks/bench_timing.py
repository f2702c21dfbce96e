"""Timing proxy of the NPU RTL: the longest register-to-register path after Yosys `synth_xilinx`.

Synthesizes `fluidnpu.hw.npu.Npu` at small design points (hw/synth.py with
timing=True: the mapped netlist is flattened and walked by hw/timing.py),
prints per design the longest path in LUT levels and carry cells, where it
starts and ends, the longest path ending in each part (core, seq, dma, regs),
and the structural model's figure (dse/timing_model.py) next to it; writes

    docs/figures/timing/timing.csv|json    one row per design point: measured and modelled
    docs/figures/timing/timing.png         LUT levels per part, measured vs model

    .venv/bin/python benchmarks/bench_timing.py             # synthesize what is not cached yet (minutes each)
    .venv/bin/python benchmarks/bench_timing.py --reuse     # only the cached points (build/timing/*/report.json)
    .venv/bin/python benchmarks/bench_timing.py --only tr64_tp2_tc2_b2

docs/resources.md ("Timing proxy") has the results and what they mean.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fluidnpu.dse.timing_model import (
    DEFAULT_COSTS,
    LEVEL_BUDGET,
    STRUCTURES,
    TimingCosts,
    design_timing,
    structure_levels,
    structure_x,
)

AXI_DW = 64
SYNTH_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Point:
    TR: int
    TP: int
    TC: int
    bmax: int
    layers: int = 8

    @property
    def name(self) -> str:
        return f"tr{self.TR}_tp{self.TP}_tc{self.TC}_b{self.bmax}"

    @property
    def label(self) -> str:
        return f"<{self.TR},{self.TP},{self.TC}> B{self.bmax}"


# small NPUs: TP, TC, NB (Bmax) and TR (the address width) varied one or two at a time
POINTS = [
    Point(64, 2, 2, 2), Point(64, 2, 8, 2), Point(64, 8, 2, 2), Point(64, 2, 2, 8), Point(1024, 2, 2, 2),
    Point(64, 4, 4, 4), Point(64, 2, 16, 2), Point(64, 2, 8, 8), Point(256, 4, 8, 8), Point(64, 16, 2, 2),
]


def synth_point(p: Point, root: Path, reuse: bool, reanalyse: bool = False) -> dict[str, Any] | None:
    """Yosys timing report of the NPU at `p` (cached in root/<name>/report.json; `reanalyse` walks the
    kept netlist.json again, for a change in hw/timing.py without a new synthesis)."""
    cache = root / p.name / "report.json"
    if cache.exists():
        rep = json.loads(cache.read_text())
        netlist = root / p.name / "netlist.json"
        if (reanalyse or "groups" not in (rep.get("timing") or {})) and netlist.exists():
            from fluidnpu.hw.timing import analyse_netlist
            rep["timing"] = analyse_netlist(netlist, "npu").to_dict()
            cache.write_text(json.dumps(rep, indent=1))
        return rep
    if reuse:
        return None
    from fluidnpu.hw.npu import Npu
    from fluidnpu.hw.regmap import NpuParams, input_banks, nmax
    from fluidnpu.hw.synth import synthesize

    rep = synthesize(Npu(NpuParams(TR=p.TR, TP=p.TP, TC=p.TC, bmax=p.bmax, layers=p.layers, axi_dw=AXI_DW)), "npu",
                     workdir=root / p.name, timing=True, timeout=SYNTH_TIMEOUT_S)
    out = {"point": p.__dict__, "NB": input_banks(p.bmax), "NMAX": nmax(p.TP, p.TC), "yosys": rep.yosys,
           "seconds": rep.seconds, "lut": rep.total.lut, "ff": rep.total.ff, "carry_cells": rep.total.carry,
           "timing": rep.timing.to_dict() if rep.timing else None}
    cache.write_text(json.dumps(out, indent=1))
    return out


def measured_structures(timing: dict[str, Any]) -> dict[str, tuple[int, int, str]]:
    """Per structure of dse/timing_model.py, the deepest path into its end points:
    (LUT levels, carry cells, 'start -> end group')."""
    out: dict[str, tuple[int, int, str]] = {}
    for st in STRUCTURES:
        pat = re.compile(st.ends)
        for group, (levels, carry, _muxf, start) in timing["groups"].items():
            if pat.search(group) and (st.name not in out or (levels, carry) > out[st.name][:2]):
                out[st.name] = (levels, carry, f"{start} -> {group}")
    return out


def fit(points: list[Point], reports: list[dict[str, Any]]) -> tuple[TimingCosts, dict[str, dict[str, Any]]]:
    """Per structure, base + per_level * x by least squares, then the base raised so that the model
    is at or above every measurement (a conservative envelope: the proxy must not miss a long path)."""
    base, per, info = [], [], {}
    for st in STRUCTURES:
        xs, ys = [], []
        for p, rep in zip(points, reports):
            got = measured_structures(rep["timing"]).get(st.name)
            if got is not None:
                xs.append(float(structure_x(st.name, p.TR, p.TP, p.TC, p.bmax)))
                ys.append(float(got[0]))
        if not xs:
            continue
        x, y = np.array(xs), np.array(ys)
        slope = 0.0
        if np.ptp(x) > 0:
            slope = max(0.0, float(np.polyfit(x, y, 1)[0]))
        b = float(np.max(y - slope * x))
        base.append((st.name, round(b, 2)))
        per.append((st.name, round(slope, 3)))
        info[st.name] = {"n": len(xs), "x": xs, "levels": ys}
    return TimingCosts(tuple(base), tuple(per)), info


def row(p: Point, rep: dict[str, Any], costs: TimingCosts) -> dict[str, Any]:
    t = rep["timing"]
    model = structure_levels(p.TR, p.TP, p.TC, p.bmax, costs)
    got = measured_structures(t)
    worst = max(model, key=lambda k: float(model[k]))
    r = {"design": p.label, "TR": p.TR, "TP": p.TP, "TC": p.TC, "NB": rep["NB"], "NMAX": rep["NMAX"],
         "lut_levels": t["critical"]["lut_levels"], "carry": t["critical"]["carry"],
         "model": int(model[worst]), "model_structure": worst,
         "path": f"{t['critical']['start']['net']} -> {t['critical']['end']['net']}",
         "longest_carry": t["carry_path"]["carry"], "yosys_s": round(rep["seconds"])}
    for st in STRUCTURES:
        g = got.get(st.name)
        r[f"{st.name}_levels"] = g[0] if g else None
        r[f"{st.name}_carry"] = g[1] if g else None
        r[f"{st.name}_model"] = int(model[st.name])
        r[f"{st.name}_path"] = g[2] if g else ""
    return r


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = np.arange(len(rows))
    for i, st in enumerate(STRUCTURES):
        meas = [r[f"{st.name}_levels"] for r in rows]
        if all(v is None for v in meas):
            continue
        line, = ax.plot(xs + 0.06 * (i - 4), [np.nan if v is None else v for v in meas], "o", label=st.name)
        ax.plot(xs + 0.06 * (i - 4), [r[f"{st.name}_model"] for r in rows], "_", color=line.get_color(), ms=14)
    ax.axhline(LEVEL_BUDGET, color="red", linestyle="--", label=f"budget {LEVEL_BUDGET}")
    ax.set_xticks(xs, [r["design"] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("LUT levels (o Yosys, - model)")
    ax.set_title("Longest path per structure: Yosys (depth-mapped) vs model")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", action="store_true", help="only report points already synthesized")
    ap.add_argument("--reanalyse", action="store_true", help="walk the kept netlists again (hw/timing.py changed)")
    ap.add_argument("--only", nargs="*", help="point names to synthesize (default: all)")
    ap.add_argument("--root", type=Path, default=Path("build/timing"))
    ap.add_argument("--out", type=Path, default=Path("docs/figures/timing"))
    args = ap.parse_args(argv)
    console = Console()
    pts = [p for p in POINTS if not args.only or p.name in args.only]
    done: list[tuple[Point, dict[str, Any]]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        task = prog.add_task("synth_xilinx", total=len(pts))
        for p in pts:
            prog.update(task, description=f"synth_xilinx {p.label}")
            rep = synth_point(p, args.root, args.reuse, args.reanalyse)
            if rep is not None and rep.get("timing"):
                done.append((p, rep))
            prog.advance(task)
    if not done:
        console.print("no measured points")
        return 1
    costs, _ = fit([p for p, _ in done], [r for _, r in done])
    rows = [row(p, rep, DEFAULT_COSTS if DEFAULT_COSTS.base else costs) for p, rep in done]
    table = Table(title=f"Timing proxy: longest register-to-register path, LUT levels (budget {LEVEL_BUDGET})")
    cols = ["design", "NB", "NMAX", "lut_levels", "carry", "model", "model_structure", "path"]
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*(str(r[c]) for c in cols))
    console.print(table)
    st_table = Table(title="per structure: Yosys levels (carry) / model")
    st_table.add_column("design")
    for st in STRUCTURES:
        st_table.add_column(st.name)
    for r in rows:
        st_table.add_row(r["design"], *(f"{r[f'{s.name}_levels']} ({r[f'{s.name}_carry']}) / {r[f'{s.name}_model']}"
                                        if r[f"{s.name}_levels"] is not None else "-" for s in STRUCTURES))
    console.print(st_table)
    for r in rows:
        console.print(f"{r['design']}: " + "; ".join(f"{s.name}: {r[f'{s.name}_path']}" for s in STRUCTURES
                                                      if r[f"{s.name}_path"]), style="dim")
    errs = [r[f"{s.name}_model"] - r[f"{s.name}_levels"] for r in rows for s in STRUCTURES
            if r[f"{s.name}_levels"] is not None]
    crit_err = [r["model"] - r["lut_levels"] for r in rows]
    console.print(f"model - Yosys per structure: mean {np.mean(errs):+.2f}, "
                  f"max |err| {np.max(np.abs(errs)):.0f} levels; "
                  f"longest path: {', '.join(f'{e:+d}' for e in crit_err)}")
    loo = []
    for i, (p, rep) in enumerate(done):
        rest = done[:i] + done[i + 1:]
        c_i, _ = fit([q for q, _ in rest], [r for _, r in rest])
        pred = structure_levels(p.TR, p.TP, p.TC, p.bmax, c_i)
        got = measured_structures(rep["timing"])
        loo.append({"design": p.label, "longest": int(max(pred.values())) - rep["timing"]["critical"]["lut_levels"],
                    "worst_structure": max((abs(int(pred[k]) - v[0]) for k, v in got.items()), default=0)})
    console.print("leave-one-out, model - Yosys on the longest path: "
                  + ", ".join(f"{x['design']} {x['longest']:+d}" for x in loo)
                  + f"; worst structure |err| {max(x['worst_structure'] for x in loo)}")
    console.print(f"fitted TimingCosts(base={costs.base!r},\n            per_level={costs.per_level!r})")
    console.print("DEFAULT_COSTS " + ("equals the fit" if costs == DEFAULT_COSTS else "differs from the fit: paste it"))
    # four full-size design points the fit is checked on: <TR, TP, TC>, Bmax, input banks
    picks = [(2091, 14, 64, 8, 2), (778, 27, 64, 8, 2), (1224, 16, 56, 8, 2), (1224, 36, 48, 8, 2)]
    for TR, TP, TC, bmax, nb in picks:
        est = design_timing(TR, TP, TC, bmax, DEFAULT_COSTS if DEFAULT_COSTS.base else costs, banks=nb)
        console.print(f"DSE pick <{TR},{TP},{TC}> B{bmax} NB {nb}: {est.lut_levels} levels ({est.structure}); "
                      f"over {LEVEL_BUDGET}: {est.over_budget}")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "timing.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    meta = {"machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
            "python": sys.version.split()[0], "yosys": done[0][1].get("yosys", ""),
            "fit": {"base": dict(costs.base), "per_level": dict(costs.per_level)}, "leave_one_out": loo}
    (args.out / "timing.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, args.out / "timing.png")
    (args.out / "timing.md").write_text(markdown(rows, costs, loo, meta))
    return 0


def markdown(rows: list[dict[str, Any]], costs: TimingCosts, loo: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The tables of docs/resources.md's "Timing proxy" section."""
    out = [f"Yosys: {meta['yosys']}; machine: {meta['machine']}", "",
           "| design | NB | NMAX | LUT levels | carry | longest path (start -> end) | model | leave-one-out "
           "| Yosys s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r, lo in zip(rows, loo):
        out.append(f"| {r['design']} | {r['NB']} | {r['NMAX']} | {r['lut_levels']} | {r['carry']} | "
                   f"`{r['path']}` | {r['model']} ({r['model_structure']}) | {lo['longest']:+d} | {r['yosys_s']} |")
    out += ["", "| design | " + " | ".join(s.name for s in STRUCTURES) + " |",
            "|---|" + "---|" * len(STRUCTURES)]
    for r in rows:
        cells = [f"{r[f'{s.name}_levels']} ({r[f'{s.name}_carry']}) / {r[f'{s.name}_model']}"
                 if r[f"{s.name}_levels"] is not None else "–" for s in STRUCTURES]
        out.append(f"| {r['design']} | " + " | ".join(cells) + " |")
    out += ["", "| structure | part | grows with | base | per level |", "|---|---|---|---|---|"]
    for s in STRUCTURES:
        b, per = costs.of(s.name)
        out.append(f"| {s.name} | {s.part} | {s.grows_with} | {b:g} | {per:g} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
