"""The paper's evaluation (§IV) as runnable experiments: Figs. 4–7 and Table I.

Each figure is a list of panels (a model on a board, swept over arrival rate
or SLO, for a set of policies). Every policy runs on its own DSE'd design
(`registry`, `designs`), with Bmax = 8 and three seeds averaged unless told
otherwise. Simulations are independent, so they run in a process pool.

Panels marked `control` also run every baseline on FluidB's own design (rows
with hardware "fluidb", as `fluidnpu simulate --design` does), which separates
the scheduler's gain from the hardware's, and measure every policy's capacity
(served throughput when offered far more) so that the headline figures can
leave out saturated points (`headline.py`). Every row carries t intervals
over the seeds.

Host-side code (runs the DSE; matplotlib only for plots).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.output import write_text, writing
from fluidnpu.scheduler_fw.headline import (
    CAPACITY_SAMPLES,
    LEVEL,
    OVERLOAD,
    OWN,
    RHO_MAX,
    SAME,
    add_point_intervals,
    all_points_gain,
    compare,
    mark_saturation,
    ratio_interval,
)
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.metrics import average
from fluidnpu.scheduler_fw.registry import FLUID, POLICIES, DesignKind, policy_spec
from fluidnpu.scheduler_fw.simulation import DEFAULT_DECISION_COST_S, DEFAULT_SAMPLES, Setting, run_once

FIGURES = ("fig4", "fig5", "fig6", "fig7", "table1")
SWEEP_POLICIES = ("serial", "fc-adaptb-s", "fc-adaptb-m", "fc-adaptb-l", "r-adaptb-s", "r-adaptb-m", "r-adaptb-l",
                  "lazybatching", "fluidb")
BASELINES = tuple(p for p in SWEEP_POLICIES if p != "fluidb")

# The paper's Table I: (model, board, rate, SLO ms) -> (LazyBatching, FluidB) x (avg latency ms, violation rate)
PAPER_TABLE1: dict[tuple[str, str, float, float], dict[str, tuple[float, float]]] = {
    ("resnet50", "zc706", 15.0, 200.0): {"lazybatching": (173.0, 0.2353), "fluidb": (121.0, 0.1033)},
    ("resnet50", "zcu104", 40.0, 100.0): {"lazybatching": (143.0, 0.3548), "fluidb": (57.0, 0.0838)},
    ("inceptionv3", "zc706", 15.0, 400.0): {"lazybatching": (287.0, 0.1594), "fluidb": (213.0, 0.0793)},
    ("inceptionv3", "zcu104", 40.0, 200.0): {"lazybatching": (216.0, 0.1420), "fluidb": (97.0, 0.0621)},
}


@dataclass(frozen=True)
class Panel:
    """One model on one board, swept over rates × SLOs, for some policies."""

    key: str
    model: str
    board: str
    rates: tuple[float, ...]
    slos_ms: tuple[float, ...]
    policies: tuple[str, ...] = SWEEP_POLICIES
    x: str = "rate"          # the swept axis in plots: "rate" or "slo_ms"
    control: bool = False    # also run every baseline on FluidB's design, and measure capacities

    def hardware(self) -> tuple[str, ...]:
        return (OWN, SAME) if self.control else (OWN,)

    def settings(self) -> list[tuple[str, float, float, str]]:
        """(policy, rate, SLO ms, hardware); FluidB runs once (its own design is FluidB's)."""
        return [(p, r, s, hw) for hw in self.hardware() for p in self.policies for r in self.rates
                for s in self.slos_ms if hw == OWN or p != "fluidb"]


def _frange(lo: float, hi: float, step: float) -> tuple[float, ...]:
    n = int(round((hi - lo) / step))
    return tuple(round(lo + i * step, 6) for i in range(n + 1))


LOAD_LEVELS = (0.45, 0.55, 0.65, 0.75, 0.85, 0.95)


def load_panels(tables: dict[tuple[str, str, str], LatencyTable], bmax: int) -> list[Panel]:
    """Table I's four settings swept over offered load: rate = ρ × FluidB's full-batch capacity.

    Our modelled NPUs are faster than the paper's measured systems, so its
    arrival rates are a lighter load for us; this sweep shows where the
    paper's regime lies (docs/results.md).
    """
    from fluidnpu.scheduler_fw.registry import FLUID

    out = []
    for (m, b, _rate, slo) in PAPER_TABLE1:
        cap = tables[(m, b, FLUID.key)].full_batch_capacity(bmax)
        out.append(Panel(f"load:{m}-{b}", m, b, tuple(round(rho * cap, 3) for rho in LOAD_LEVELS), (slo,),
                         ("lazybatching", "fluidb")))
    return out


def figure_panels(name: str) -> list[Panel]:
    """The panels of one reproduction (fig4, fig5, fig6, table1)."""
    if name == "fig4":
        return [Panel("resnet50-zc706", "resnet50", "zc706", _frange(5, 25, 2.5), (400.0,), control=True)]
    if name == "fig5":
        return [Panel("inceptionv3-zcu104", "inceptionv3", "zcu104", _frange(20, 60, 5), (200.0,), control=True)]
    if name == "fig6":
        return [Panel("resnet50-zc706@15", "resnet50", "zc706", (15.0,), _frange(100, 600, 50), x="slo_ms"),
                Panel("inceptionv3-zcu104@35", "inceptionv3", "zcu104", (35.0,), _frange(50, 300, 25), x="slo_ms")]
    if name == "table1":
        return [Panel(f"{m}-{b}", m, b, (rate,), (slo,), ("lazybatching", "fluidb"), control=True)
                for (m, b, rate, slo) in PAPER_TABLE1]
    raise FluidError(f"unknown reproduction {name!r}; choose from {', '.join(FIGURES)}")


@dataclass
class EvalConfig:
    seeds: int = 3
    n_samples: int = DEFAULT_SAMPLES
    bmax: int = 8
    decision_cost_s: float = DEFAULT_DECISION_COST_S
    cache_dir: Path | None = None
    jobs: int = field(default_factory=lambda: max(1, min(2, os.cpu_count() or 1)))

    def validate(self) -> None:
        if self.seeds < 1:
            raise FluidError(f"--seeds must be >= 1, got {self.seeds}")
        if self.n_samples < 100:
            raise FluidError(f"--samples must be >= 100 for a p99, got {self.n_samples}")
        if not 1 <= self.bmax <= 64:
            raise FluidError(f"Bmax must be in [1, 64], got {self.bmax}")
        if self.jobs < 1:
            raise FluidError(f"--jobs must be >= 1, got {self.jobs}")
        if not self.decision_cost_s >= 0:
            raise FluidError(f"the decision cost must be >= 0, got {self.decision_cost_s}")


Progress = Callable[[str, int, int], None]


def design_tables(panels: Sequence[Panel], cfg: EvalConfig, progress: Progress | None = None
                  ) -> tuple[dict[tuple[str, str, str], LatencyTable], list[dict[str, Any]]]:
    """Every (model, board, design kind) the panels need, DSE'd or from the cache."""
    from fluidnpu.boards import load_board
    from fluidnpu.scheduler_fw.designs import design_for
    from fluidnpu.zoo import zoo_model

    need: dict[tuple[str, str, str], DesignKind] = {}
    for p in panels:
        for pol in p.policies:
            kind = policy_spec(pol).design
            need[(p.model, p.board, kind.key)] = kind
        if p.control:
            need[(p.model, p.board, FLUID.key)] = FLUID
    tables: dict[tuple[str, str, str], LatencyTable] = {}
    info = []
    for i, ((model, board, key), kind) in enumerate(need.items()):
        if progress:
            progress(f"DSE {model} on {board} ({key})", i, len(need))
        bundle, cached = design_for(zoo_model(model), load_board(board), kind, cfg.bmax, cfg.cache_dir)
        tables[(model, board, key)] = LatencyTable.from_bundle(bundle, cfg.bmax)
        TR, TP, TC = bundle.design
        info.append({"model": model, "board": board, "design_kind": key, "TR": TR, "TP": TP, "TC": TC,
                     "full_batch_capacity": tables[(model, board, key)].full_batch_capacity(),
                     "gops": bundle.data["performance"]["gops"], "peak_gops": bundle.data["performance"]["peak_gops"],
                     "from_cache": cached,
                     "segment_latency_ms": [[1e3 * x for x in row] for row in bundle.latency_table()]})
    if progress:
        progress("DSE done", len(need), len(need))
    return tables, info


# worker-process state: the tables are sent once per worker, not once per job
_TABLES: dict[tuple[str, str, str], LatencyTable] = {}


def _init_worker(tables: dict[tuple[str, str, str], LatencyTable]) -> None:
    _TABLES.clear()
    _TABLES.update(tables)


def _job(args: tuple[tuple[str, str, str], Setting, int]) -> dict[str, float]:
    key, setting, seed = args
    return run_once(setting, _TABLES[key], seed)[0]


def _design_key(p: Panel, pol: str, hardware: str) -> tuple[str, str, str]:
    return (p.model, p.board, FLUID.key if hardware == SAME else policy_spec(pol).design.key)


def run_panels(panels: Sequence[Panel], cfg: EvalConfig, progress: Progress | None = None,
               tables: dict[tuple[str, str, str], LatencyTable] | None = None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per panel × policy × rate × SLO × hardware with seed-averaged metrics, t intervals
    over seeds, and for control panels the measured capacity and saturation; the designs used)."""
    cfg.validate()
    designs: list[dict[str, Any]] = []
    if tables is None:
        tables, designs = design_tables(panels, cfg, progress)
    jobs: list[tuple[tuple[str, str, str], Setting, int]] = []
    meta: list[tuple[Panel, str, float, float, str]] = []
    for p in panels:
        for pol, rate, slo, hw in p.settings():
            key = _design_key(p, pol, hw)
            setting = Setting(pol, rate, slo / 1e3, cfg.bmax, cfg.n_samples, cfg.decision_cost_s)
            setting.validate(tables[key])
            meta.append((p, pol, rate, slo, hw))
            jobs += [(key, setting, seed) for seed in range(cfg.seeds)]
    # capacity runs: each policy offered OVERLOAD x its design's full-batch capacity; what it serves is its capacity
    caps: list[tuple[str, str, str]] = []
    for p in panels:
        if not p.control:
            continue
        for hw in p.hardware():
            for pol in p.policies:
                if hw == SAME and pol == "fluidb":
                    continue
                key = _design_key(p, pol, hw)
                rate = OVERLOAD * tables[key].full_batch_capacity(cfg.bmax)
                setting = Setting(pol, rate, p.slos_ms[0] / 1e3, cfg.bmax, min(cfg.n_samples, CAPACITY_SAMPLES),
                                  cfg.decision_cost_s)
                caps.append((p.key, pol, hw))
                jobs += [(key, setting, seed) for seed in range(cfg.seeds)]
    total = len(jobs)
    if progress:
        progress("simulations", 0, total)
    # LazyBatching stops at every layer and is the slowest: start long jobs first for a tighter schedule
    order = sorted(range(total), key=lambda i: jobs[i][1].policy != "lazybatching")
    out: list[dict[str, float] | None] = [None] * total
    if cfg.jobs == 1 or total < 4:
        _init_worker(tables)
        for n, i in enumerate(order, start=1):
            out[i] = _job(jobs[i])
            if progress:
                progress("simulations", n, total)
    else:
        with ProcessPoolExecutor(cfg.jobs, initializer=_init_worker, initargs=(tables,)) as ex:
            futs = {ex.submit(_job, jobs[i]): i for i in order}
            for n, fut in enumerate(as_completed(futs), start=1):
                out[futs[fut]] = fut.result()
                if progress:
                    progress("simulations", n, total)
    results = [r for r in out if r is not None]
    rows = []
    for j, (p, pol, rate, slo, hw) in enumerate(meta):
        per_seed = results[j * cfg.seeds:(j + 1) * cfg.seeds]
        mean = average(per_seed)
        std = {k: float(np.std([m[k] for m in per_seed])) for k in ("mean_latency_ms", "p99_latency_ms",
                                                                      "slo_violation_rate", "utilisation")}
        row = {"panel": p.key, "model": p.model, "board": p.board, "policy": pol,
               "label": POLICIES[pol].label, "hardware": hw, "design": _design_key(p, pol, hw)[2],
               "rate": rate, "slo_ms": slo, **mean, **{f"{k}_std": v for k, v in std.items()}, "per_seed": per_seed}
        add_point_intervals(row)
        rows.append(row)
    base = len(meta) * cfg.seeds
    capacity = {}
    for j, key in enumerate(caps):
        per_seed = results[base + j * cfg.seeds:base + (j + 1) * cfg.seeds]
        capacity[key] = float(np.mean([m["throughput"] for m in per_seed]))
    for p in panels:   # FluidB's row is the same on both hardware columns
        if p.control and (p.key, "fluidb", OWN) in capacity:
            capacity[(p.key, "fluidb", SAME)] = capacity[(p.key, "fluidb", OWN)]
    mark_saturation(rows, capacity)
    return rows, designs


# ---- summaries -----------------------------------------------------------------

def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else float("nan")


def _own(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("hardware", OWN) == OWN]


def sweep_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """FluidB against the baselines over a sweep (the paper's headline figures, our reading of them).

    Top-level figures: each policy on its own DSE'd design, over the points where every policy is below
    saturation (`headline.compare`), with t intervals over seeds; `same_hardware`: the same with every
    baseline on FluidB's design; `all_points_mean_latency_gain`: the old, run-length-dependent geomean
    over every point, for reference only.
    """
    out = compare(rows, OWN, BASELINES)
    if any(r.get("hardware") == SAME for r in rows):
        out["same_hardware"] = compare(rows, SAME, BASELINES)
    out["all_points_mean_latency_gain"] = all_points_gain(rows, OWN)
    own = _own(rows)
    flu = [r for r in own if r["policy"] == "fluidb"]
    lazy = {(r["panel"], r["rate"], r["slo_ms"]): r for r in own if r["policy"] == "lazybatching"}
    inv = [(lazy[(r["panel"], r["rate"], r["slo_ms"])], r) for r in flu if (r["panel"], r["rate"], r["slo_ms"]) in lazy]
    if inv:
        out["lazy_vs_fluidb_invocations"] = _geomean([a["invocations"] / b["invocations"] for a, b in inv])
        out["lazy_vs_fluidb_preemption_points"] = _geomean([a["preemption_points"] / b["preemption_points"]
                                                            for a, b in inv if b["preemption_points"]])
    return out


def table1_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Table I beside the paper, with the paper's derived figures (latency ratios, pp reductions)."""
    by = {(r["model"], r["board"], r["policy"]): r for r in _own(rows)}
    same = {(r["model"], r["board"]): r for r in rows if r.get("hardware") == SAME and r["policy"] == "lazybatching"}
    table = []
    for (m, b, rate, slo), paper in PAPER_TABLE1.items():
        lz, fl = by[(m, b, "lazybatching")], by[(m, b, "fluidb")]
        paired = zip(lz.get("per_seed", []), fl.get("per_seed", []))
        extra: dict[str, Any] = {"ours_ci": {k: [x.get("mean_latency_ms_ci_lo"), x.get("mean_latency_ms_ci_hi"),
                                                 x.get("slo_violation_rate_ci_lo"), x.get("slo_violation_rate_ci_hi")]
                                             for k, x in (("lazybatching", lz), ("fluidb", fl))},
                                 "ours_latency_ratio_ci": list(ratio_interval(
                                     [x["mean_latency_ms"] / y["mean_latency_ms"] for x, y in paired])[1:])}
        if (m, b) in same:
            sl = same[(m, b)]
            extra["same_hardware"] = {"lazybatching": [sl["mean_latency_ms"], sl["slo_violation_rate"]],
                                      "latency_ratio": sl["mean_latency_ms"] / fl["mean_latency_ms"],
                                      "violation_pp": 100 * (sl["slo_violation_rate"] - fl["slo_violation_rate"])}
        table.append({"model": m, "board": b, "rate": rate, "slo_ms": slo,
                      "ours": {"lazybatching": [lz["mean_latency_ms"], lz["slo_violation_rate"]],
                               "fluidb": [fl["mean_latency_ms"], fl["slo_violation_rate"]]},
                      "paper": {k: list(v) for k, v in paper.items()},
                      "ours_latency_ratio": lz["mean_latency_ms"] / fl["mean_latency_ms"],
                      "paper_latency_ratio": paper["lazybatching"][0] / paper["fluidb"][0],
                      "ours_violation_pp": 100 * (lz["slo_violation_rate"] - fl["slo_violation_rate"]),
                      "paper_violation_pp": 100 * (paper["lazybatching"][1] - paper["fluidb"][1]),
                      "ours_invocation_ratio": lz["invocations"] / fl["invocations"],
                      "ours_preemption_point_ratio": lz["preemption_points"] / max(fl["preemption_points"], 1e-9),
                      **extra})
    return {"rows": table,
            "ours_latency_ratio_geomean": _geomean([r["ours_latency_ratio"] for r in table]),
            "paper_latency_ratio_geomean": _geomean([r["paper_latency_ratio"] for r in table]),
            "ours_violation_pp_mean": float(np.mean([r["ours_violation_pp"] for r in table])),
            "paper_violation_pp_mean": float(np.mean([r["paper_violation_pp"] for r in table])),
            **({"same_hardware_latency_ratio_geomean": _geomean([r["same_hardware"]["latency_ratio"] for r in table]),
                "same_hardware_violation_pp_mean": float(np.mean([r["same_hardware"]["violation_pp"] for r in table]))}
               if all("same_hardware" in r for r in table) else {})}


def load_summary(rows: list[dict[str, Any]], tables: dict[tuple[str, str, str], LatencyTable],
                 bmax: int) -> list[dict[str, Any]]:
    """Table I's comparison at each offered load ρ of the load sweep."""
    from fluidnpu.scheduler_fw.registry import FLUID

    out = []
    for r in rows:
        if not r["panel"].startswith("load:") or r["policy"] != "fluidb":
            continue
        lz = next(x for x in rows if x["panel"] == r["panel"] and x["policy"] == "lazybatching"
                  and x["rate"] == r["rate"])
        cap = tables[(r["model"], r["board"], FLUID.key)].full_batch_capacity(bmax)
        out.append({"model": r["model"], "board": r["board"], "slo_ms": r["slo_ms"], "rate": r["rate"],
                    "load": r["rate"] / cap,
                    "lazybatching": [lz["mean_latency_ms"], lz["slo_violation_rate"]],
                    "fluidb": [r["mean_latency_ms"], r["slo_violation_rate"]],
                    "latency_ratio": lz["mean_latency_ms"] / r["mean_latency_ms"],
                    "violation_pp": 100 * (lz["slo_violation_rate"] - r["slo_violation_rate"])})
    return out


def write_headline(out_dir: Path) -> dict[str, Any] | None:
    """FluidB against every baseline over Figs. 4 and 5 together (the abstract's 1.97x / 6.7x, our reading).

    Needs fig4.json and fig5.json in out_dir; writes headline.json there.
    """
    out_dir = Path(out_dir)
    rows: list[dict[str, Any]] = []
    per_figure: dict[str, Any] = {}
    seeds = set()
    for name in ("fig4", "fig5"):
        f = out_dir / f"{name}.json"
        if not f.is_file():
            return None
        doc = json.loads(f.read_text())
        seeds.add(doc.get("config", {}).get("seeds"))
        rows += doc["rows"]
        per_figure[name] = {"own": compare(doc["rows"], OWN, BASELINES)}
        if any(r.get("hardware") == SAME for r in doc["rows"]):
            per_figure[name]["same_hardware"] = compare(doc["rows"], SAME, BASELINES)
    summary = sweep_summary(rows)
    summary["per_figure"] = per_figure
    summary["seeds"] = seeds.pop() if len(seeds) == 1 else sorted(seeds, key=str)
    summary["rho_max"] = RHO_MAX
    summary["interval_level"] = LEVEL
    summary["paper"] = {"mean_latency_gain": 1.97, "tail_slo_satisfaction_gain": 6.7}
    write_text(out_dir / "headline.json", json.dumps(_json_safe(summary), indent=1) + "\n")
    return summary


# ---- writing -------------------------------------------------------------------

def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    flat = [{k: v for k, v in r.items() if not isinstance(v, (list, dict))} for r in rows]
    if not flat:
        return
    with writing(path, "CSV") as tmp, open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(flat[0]))
        w.writeheader()
        for r in flat:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _json_safe(obj: Any) -> Any:
    """Non-finite floats as strings, and floats to 6 significant digits (the files are committed)."""
    if isinstance(obj, float):
        return float(f"{obj:.6g}") if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def run_figure(name: str, out_dir: Path, cfg: EvalConfig, progress: Progress | None = None,
               plots: bool = True) -> dict[str, Any]:
    """Run one reproduction, write <name>.csv/.json (+ PNGs) under out_dir, return its summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if name == "fig7":
        from fluidnpu.scheduler_fw.fig7 import run_fig7

        result = run_fig7(out_dir, cfg, progress, plots)
    else:
        panels = figure_panels(name)
        cfg.validate()
        tables, designs = design_tables(panels, cfg, progress)
        if name == "table1":
            panels = panels + load_panels(tables, cfg.bmax)
        rows, _ = run_panels(panels, cfg, progress, tables)
        if name == "table1":
            summary = table1_summary([r for r in rows if not r["panel"].startswith("load:")])
            summary["load_sweep"] = load_summary(rows, tables, cfg.bmax)
        else:
            summary = sweep_summary(rows)
        files = [f"{name}.csv", f"{name}.json"]
        if plots:
            from fluidnpu.scheduler_fw import plots as pl

            files += pl.plot_figure(name, panels, rows, out_dir, summary)
        _csv(out_dir / f"{name}.csv", rows)
        result = {"figure": name, "summary": summary, "designs": designs, "rows": rows, "files": files}
    result["config"] = {"seeds": cfg.seeds, "samples_per_seed": cfg.n_samples, "bmax": cfg.bmax,
                        "decision_cost_us": cfg.decision_cost_s * 1e6, "jobs": cfg.jobs}
    result["seconds"] = time.perf_counter() - t0
    write_text(out_dir / f"{name}.json", json.dumps(_json_safe(result), indent=1) + "\n")
    return result
