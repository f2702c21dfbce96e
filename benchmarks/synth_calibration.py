"""Calibrate the DSE resource model (dse/resource_model.py) against Yosys synthesis of the NPU RTL.

Synthesizes the full `fluidnpu.hw.npu.Npu` for a sweep of small design points
with Yosys `synth_xilinx` (hw/synth.py), prices the same points with the DSE
resource model, fits the model's LUT/FF constants (`LogicCosts`) to the Yosys
counts by least squares, and writes

    docs/figures/synth/calibration.csv    one row per design point: Yosys, model, calibrated model
    docs/figures/synth/calibration.json   everything, incl. per-module and per-memory counts and the fits
    docs/figures/synth/calibration.png    model vs Yosys per resource

    .venv/bin/python benchmarks/synth_calibration.py            # the sweep, ~40 min on 2 cores
    .venv/bin/python benchmarks/synth_calibration.py --reuse    # refit/replot from build/synth/*/report.json

docs/resources.md explains the method and the results.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor, as_completed
import csv
from dataclasses import asdict, dataclass, fields, replace
import json
import os
from pathlib import Path
import platform
import sys
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fluidnpu.boards import load_board
from fluidnpu.dse.resource_model import (DEFAULT_LOGIC, LogicCosts, bram36_for, design_resources, logic_use,
                                         memories, uram_for)

AXI_DW = 64
BUFFER_CLASSES = ("input", "accumulator", "output")
# Every RTL build has Stackable PEs (EngineCore supports k = 2 and 1/2 whenever TP, TC >= 2), so the
# stacking cost cannot be told apart from the per-PE cost: the fit holds these at their current values.
HELD = ("lut_per_stack_pair",)


@dataclass(frozen=True)
class Config:
    """One design point of the sweep."""

    TR: int
    TP: int
    TC: int
    bmax: int
    layers: int = 8
    family: str = "xc7"
    flatten: bool = False

    @property
    def name(self) -> str:
        extra = ("_" + self.family if self.family != "xc7" else "") + ("_flat" if self.flatten else "")
        return f"tr{self.TR}_tp{self.TP}_tc{self.TC}_b{self.bmax}_l{self.layers}{extra}"

    @property
    def label(self) -> str:
        extra = (" " + self.family if self.family != "xc7" else "") + (" flat" if self.flatten else "")
        return f"<{self.TR},{self.TP},{self.TC}> B{self.bmax} L{self.layers}{extra}"

    @property
    def board(self) -> str:
        return "zcu104" if self.family == "xcup" else "zc706"


# TR is large enough that the engine's buffers are BRAM (as in every DSE design), except the first
# two points, the tiny examples, where Yosys puts them in LUT RAM (shown, not fitted).
CONFIGS = [
    Config(16, 2, 2, 2), Config(128, 8, 8, 8),
    Config(1024, 2, 2, 2), Config(1024, 4, 4, 2), Config(1024, 4, 4, 4), Config(2048, 4, 4, 8),
    Config(1024, 8, 4, 2), Config(1024, 4, 8, 2), Config(1024, 8, 8, 2), Config(1024, 8, 8, 4),
    Config(2048, 8, 8, 8), Config(1024, 16, 4, 4), Config(1024, 4, 16, 4), Config(1024, 3, 5, 3),
    Config(1024, 4, 4, 4, layers=64), Config(4096, 8, 8, 4, family="xcup"),
    Config(2048, 8, 8, 8, flatten=True),
]


# ---------------------------------------------------------------- synthesis
def synth_one(cfg: Config, root: Path, reuse: bool) -> dict[str, Any]:
    """Yosys counts of the NPU at `cfg` (cached in root/<name>/report.json)."""
    cache = root / cfg.name / "report.json"
    if reuse and cache.exists():
        return json.loads(cache.read_text())
    from fluidnpu.hw.npu import Npu
    from fluidnpu.hw.regmap import NpuParams
    from fluidnpu.hw.synth import synthesize

    top = Npu(NpuParams(TR=cfg.TR, TP=cfg.TP, TC=cfg.TC, bmax=cfg.bmax, layers=cfg.layers, axi_dw=AXI_DW))
    rep = synthesize(top, "npu", family=cfg.family, workdir=root / cfg.name, flatten=cfg.flatten).to_dict()
    cache.write_text(json.dumps(rep, indent=1))
    return rep


def buffer_class(memory: str) -> str:
    """Which of the model's memories an RTL memory is (docs/hw-architecture.md names)."""
    leaf = memory.rsplit(".", 1)[-1]
    if memory.startswith("npu.core.") and leaf.startswith("in"):
        return "input"
    if memory.startswith("npu.core.acc"):
        return "accumulator"
    if memory.startswith("npu.core.stage"):
        return "output"
    return "control"


def yosys_summary(rep: dict[str, Any]) -> dict[str, Any]:
    """The figures compared with the model, from one SynthReport dict."""
    tot = rep["total"]
    per: dict[str, dict[str, float]] = {c: {"bram36": 0.0, "uram": 0, "lutram": 0} for c in (*BUFFER_CLASSES, "control")}
    for name, mem in rep["memories"].items():
        c = per[buffer_class(name)]
        for k in c:
            c[k] += mem[k]
    in_bram = all(per[c]["lutram"] == 0 for c in BUFFER_CLASSES)
    mods = rep["modules"]
    part = {p: mods.get(f"npu.{p}", {}) for p in ("core", "seq", "dma", "regs")}
    dsp_outside_core = {src: n for src, n in rep["dsp_sources"].items() if not src.startswith("npu.core:")}
    return {
        "lut": tot["lut"], "lut_logic": tot["lut_logic"], "lutram": tot["lutram"], "srl": tot["srl"],
        "ff": tot["ff"], "dsp": tot["dsp"], "bram36": tot["bram36"], "uram": tot["uram"],
        # LUTs outside the engine's buffers: what the model's LUT terms stand for
        "lut_ctrl": tot["lut"] - sum(per[c]["lutram"] for c in BUFFER_CLASSES),
        "buffers_in_bram": in_bram, "memories": per,
        "modules": {p: {"lut": v.get("lut", 0), "ff": v.get("ff", 0)} for p, v in part.items()},
        "dsp_outside_core": dsp_outside_core, "seconds": rep["seconds"], "yosys": rep["yosys"],
    }


# ---------------------------------------------------------------- model
def model_one(cfg: Config, costs: LogicCosts = DEFAULT_LOGIC) -> dict[str, Any]:
    """The DSE resource model's figures for `cfg` (its functions, called as the DSE calls them)."""
    board = load_board(cfg.board)
    res = design_resources(cfg.TR, cfg.TP, cfg.TC, board, cfg.bmax, cfg.layers, stackable=True)
    lut, ff = logic_use(np.array(cfg.TP), np.array(cfg.TC), cfg.bmax, cfg.layers, True, costs)
    per = {name: {"bram36": float(count * bram36_for(depth, width)), "uram": int(count * uram_for(depth, width)),
                  "count": count, "depth": int(depth), "width": int(width)}
           for name, count, depth, width in memories(cfg.TR, cfg.TP, cfg.TC, cfg.bmax)}
    return {"dsp": res.dsp, "bram36": res.bram36, "uram": res.uram, "lut": int(lut), "ff": int(ff), "memories": per}


def cost_columns(cfgs: list[Config]) -> tuple[dict[str, tuple[str, np.ndarray]], np.ndarray, np.ndarray]:
    """The model's LUT/FF as linear functions of the LogicCosts fields, read off `logic_use` itself:
    {field: (output 'lut'|'ff', column)} and the cost-independent parts (lut0, ff0).
    logic_use is linear in the constants, so column j = logic_use(e_j) - logic_use(0)."""
    tp = np.array([c.TP for c in cfgs])
    tc = np.array([c.TC for c in cfgs])
    zero = LogicCosts(**{f.name: 0 for f in fields(LogicCosts)})

    def run(costs: LogicCosts) -> tuple[np.ndarray, np.ndarray]:
        out = [logic_use(tp[i], tc[i], c.bmax, c.layers, True, costs) for i, c in enumerate(cfgs)]
        return np.array([o[0] for o in out], float), np.array([o[1] for o in out], float)

    lut0, ff0 = run(zero)
    cols = {}
    for f in fields(LogicCosts):
        lut1, ff1 = run(replace(zero, **{f.name: 1}))
        dl, df = lut1 - lut0, ff1 - ff0
        if dl.any() and df.any():
            raise ValueError(f"LogicCosts.{f.name} feeds both LUT and FF; the fit assumes one")
        cols[f.name] = ("lut", dl) if dl.any() else ("ff", df)
    return cols, lut0, ff0


# ---------------------------------------------------------------- fitting
def fit_nonneg(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a cost cannot be negative): solve, pin the most
    negative coefficient to zero, repeat."""
    free = np.ones(X.shape[1], bool)
    while True:
        coef = np.zeros(X.shape[1])
        if free.any():
            coef[free] = np.linalg.lstsq(X[:, free], y, rcond=None)[0]
        if (coef >= 0).all():
            return coef
        free[np.argmin(coef)] = False


def fit_model_form(cfgs: list[Config], y_lut: np.ndarray, y_ff: np.ndarray) -> dict[str, Any]:
    """Fit LogicCosts (the model's own form) to Yosys; HELD fields keep their current values."""
    cols, lut0, ff0 = cost_columns(cfgs)
    fitted: dict[str, float] = {}
    for out, y, base in (("lut", y_lut, lut0), ("ff", y_ff, ff0)):
        names = [n for n, (o, _) in cols.items() if o == out]
        held = [n for n in names if n in HELD]
        free = [n for n in names if n not in HELD]
        target = y - base - sum(getattr(DEFAULT_LOGIC, n) * cols[n][1] for n in held)
        X = np.column_stack([cols[n][1] for n in free])
        coef = fit_nonneg(X, target)
        fitted |= dict(zip(free, coef.tolist())) | {n: float(getattr(DEFAULT_LOGIC, n)) for n in held}
    # integer fields are proposed as integers (the dataclass's types), the rest to 3 decimals
    proposed = {f.name: (int(round(fitted[f.name])) if f.type in (int, "int") else round(fitted[f.name], 3))
                for f in fields(LogicCosts)}
    return {"raw": fitted, "proposed": proposed, "held": list(HELD)}


# A structural proposal: terms the RTL actually has (docs/resources.md explains each).
PROPOSED_TERMS = {
    "lut": ("base", "per_bank", "per_pe", "per_lane", "per_mux_bit", "per_nmax_word"),
    "ff": ("base", "per_bank", "per_pe", "per_lane", "per_nmax_word"),
}


def proposed_features(cfg: Config) -> dict[str, float]:
    """Regressors of the proposed form. NB is the RTL's bank count (power of two >= max(2, Bmax));
    NMAX the DMA vector length max(2TP, 2TC, 16) that sizes the sequencer's and DMA's data paths."""
    nb = 2
    while nb < cfg.bmax:
        nb *= 2
    nmax = max(2 * cfg.TP, 2 * cfg.TC, 16)
    return {"base": 1.0, "per_bank": nb, "per_pe": cfg.TC, "per_lane": cfg.TP * cfg.TC,
            "per_mux_bit": 16 * cfg.TP * cfg.TC * nb, "per_nmax_word": nmax}


def fit_proposed(cfgs: list[Config], y_lut: np.ndarray, y_ff: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    feats = [proposed_features(c) for c in cfgs]
    for res, y in (("lut", y_lut), ("ff", y_ff)):
        names = PROPOSED_TERMS[res]
        X = np.array([[f[n] for n in names] for f in feats])
        coef = fit_nonneg(X, y)
        out[res] = dict(zip(names, np.round(coef, 3).tolist()))
    return out


def predict_proposed(coefs: dict[str, Any], cfg: Config) -> tuple[float, float]:
    f = proposed_features(cfg)
    return (sum(v * f[n] for n, v in coefs["lut"].items()), sum(v * f[n] for n, v in coefs["ff"].items()))


# ---------------------------------------------------------------- outputs
def residual_stats(pred: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    rel = (pred - actual) / actual
    return {"rms_rel": float(np.sqrt(np.mean(rel ** 2))), "max_abs_rel": float(np.max(np.abs(rel))),
            "mean_rel": float(np.mean(rel))}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4.4))
    specs = [("LUT", "yosys_lut", [("model_lut", "model (current)", "o"), ("calib_lut", "model (fitted)", "s"),
                                   ("prop_lut", "proposed form", "^")]),
             ("FF", "yosys_ff", [("model_ff", "model (current)", "o"), ("calib_ff", "model (fitted)", "s"),
                                 ("prop_ff", "proposed form", "^")]),
             ("DSP", "yosys_dsp", [("model_dsp", "model", "o")]),
             ("BRAM36", "yosys_bram36", [("model_bram36", "model", "o")])]
    for ax, (title, ykey, series) in zip(axes, specs):
        xs_all = [r[ykey] for r in rows]
        for key, lab, mk in series:
            for fitted in (True, False):
                sel = [r for r in rows if r["fit"] == fitted and r[key] is not None]
                ax.scatter([r[ykey] for r in sel], [r[key] for r in sel], marker=mk,
                           facecolors=None if fitted else "none",
                           edgecolors=None if fitted else "k", s=30,
                           label=lab if fitted else None, alpha=0.8)
        lim = max(max(xs_all), max(r[k] for r in rows for k, _, _ in series if r[k] is not None)) * 1.08
        ax.plot([0, lim], [0, lim], "k:", lw=1)
        ax.set_xlim(0, lim)
        ax.set_ylim(0, lim)
        ax.set_xlabel(f"Yosys synth_xilinx {title}")
        ax.set_ylabel(f"resource model {title}")
        ax.set_title(title)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("DSE resource model vs Yosys synthesis of the NPU (open markers: not in the fit)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gb, 1), "python": sys.version.split()[0],
            "platform": platform.platform()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures/synth")
    ap.add_argument("--work", default="build/synth", help="Yosys working folders and cached reports")
    ap.add_argument("--jobs", type=int, default=2, help="syntheses run at once (each uses one core)")
    ap.add_argument("--reuse", action="store_true", help="reuse cached reports instead of resynthesizing")
    args = ap.parse_args()
    out, root = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    console = Console()

    reports: dict[Config, dict[str, Any]] = {}
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"))
    with Progress(*cols, console=console) as progress:
        task = progress.add_task("synth_xilinx", total=len(CONFIGS), last="")
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # biggest first, so the two workers finish together
            order = sorted(CONFIGS, key=lambda c: -c.TP * c.TC * max(2, c.bmax))
            futs = {pool.submit(synth_one, c, root, args.reuse): c for c in order}
            for fut in as_completed(futs):
                cfg = futs[fut]
                reports[cfg] = fut.result()
                progress.update(task, advance=1, last=f"{cfg.label}: {reports[cfg]['seconds']:.0f} s")

    ys = {c: yosys_summary(reports[c]) for c in CONFIGS}
    models = {c: model_one(c) for c in CONFIGS}
    # fit on the design points the model describes: buffers in BRAM, hierarchy kept
    fit_cfgs = [c for c in CONFIGS if ys[c]["buffers_in_bram"] and not c.flatten]
    y_lut = np.array([ys[c]["lut_ctrl"] for c in fit_cfgs], float)
    y_ff = np.array([ys[c]["ff"] for c in fit_cfgs], float)
    model_fit = fit_model_form(fit_cfgs, y_lut, y_ff)
    calib = LogicCosts(**model_fit["proposed"])
    prop = fit_proposed(fit_cfgs, y_lut, y_ff)

    rows = []
    for c in CONFIGS:
        y, mo, ca = ys[c], models[c], model_one(c, calib)
        pl, pf = predict_proposed(prop, c)
        row = {"config": c.label, "TR": c.TR, "TP": c.TP, "TC": c.TC, "bmax": c.bmax, "layers": c.layers,
               "family": c.family, "flatten": c.flatten, "fit": c in fit_cfgs,
               "yosys_lut": y["lut"], "yosys_lut_ctrl": y["lut_ctrl"], "yosys_lutram": y["lutram"],
               "yosys_ff": y["ff"], "yosys_dsp": y["dsp"], "yosys_bram36": y["bram36"], "yosys_uram": y["uram"],
               "model_lut": mo["lut"], "model_ff": mo["ff"], "model_dsp": mo["dsp"], "model_bram36": mo["bram36"],
               "model_uram": mo["uram"], "calib_lut": ca["lut"], "calib_ff": ca["ff"],
               "prop_lut": round(pl), "prop_ff": round(pf)}
        for cls in BUFFER_CLASSES:
            row[f"yosys_bram36_{cls}"] = y["memories"][cls]["bram36"]
            row[f"yosys_lutram_{cls}"] = y["memories"][cls]["lutram"]
            row[f"model_bram36_{cls}"] = mo["memories"][cls]["bram36"]
        row["yosys_bram36_control"] = y["memories"]["control"]["bram36"]
        row["yosys_lutram_control"] = y["memories"]["control"]["lutram"]
        for p, v in y["modules"].items():
            row[f"yosys_lut_{p}"], row[f"yosys_ff_{p}"] = v["lut"], v["ff"]
        row["dsp_outside_core"] = sum(y["dsp_outside_core"].values())
        row["synth_seconds"] = round(y["seconds"], 1)
        rows.append(row)

    fr = [r for r in rows if r["fit"]]
    a = {k: np.array([r[k] for r in fr], float) for k in fr[0] if isinstance(fr[0][k], (int, float))}
    stats = {
        "lut_current": residual_stats(a["model_lut"], a["yosys_lut_ctrl"]),
        "lut_fitted": residual_stats(a["calib_lut"], a["yosys_lut_ctrl"]),
        "lut_proposed": residual_stats(a["prop_lut"], a["yosys_lut_ctrl"]),
        "ff_current": residual_stats(a["model_ff"], a["yosys_ff"]),
        "ff_fitted": residual_stats(a["calib_ff"], a["yosys_ff"]),
        "ff_proposed": residual_stats(a["prop_ff"], a["yosys_ff"]),
    }
    with (out / "calibration.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    doc = {
        "what": "DSE resource model vs Yosys synth_xilinx of fluidnpu.hw.npu.Npu (benchmarks/synth_calibration.py)",
        "machine": machine(), "yosys": ys[CONFIGS[0]]["yosys"], "axi_dw": AXI_DW,
        "current_costs": asdict(DEFAULT_LOGIC), "fit_model_form": model_fit, "fit_proposed_form": prop,
        "residuals": stats, "rows": rows,
        "details": {c.name: {"config": asdict(c), "yosys": ys[c], "model": models[c],
                             "cells": reports[c]["cells"], "memories": reports[c]["memories"],
                             "dsp_sources": reports[c]["dsp_sources"]} for c in CONFIGS},
    }
    (out / "calibration.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, out / "calibration.png")

    t = Table(title="Yosys vs resource model (LUT = Yosys LUTs outside the engine buffers)")
    for h in ("config", "fit", "LUT yosys", "model", "fitted", "FF yosys", "model", "fitted", "DSP y/m",
              "BRAM y/m", "s"):
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(r["config"], "y" if r["fit"] else "", str(r["yosys_lut_ctrl"]), str(r["model_lut"]),
                  str(r["calib_lut"]), str(r["yosys_ff"]), str(r["model_ff"]), str(r["calib_ff"]),
                  f"{r['yosys_dsp']}/{r['model_dsp']}", f"{r['yosys_bram36']:g}/{r['model_bram36']:g}",
                  f"{r['synth_seconds']:.0f}")
    console.print(t)
    console.print("fitted LogicCosts (model form):", model_fit["proposed"])
    console.print("proposed form:", prop)
    console.print("residuals:", json.dumps(stats, indent=1))
    console.print(f"wrote {out}/calibration.csv, .json, .png")


if __name__ == "__main__":
    main()
