"""The generated parts of docs/results.md: tables written from the evaluation's JSON, spliced between
markers, so that `fluidnpu eval all --out docs/figures/eval` updates them and no re-run leaves a
hand-typed number behind.

A block is everything between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`; the rest of
the page (the prose) is left as it is.

Host-side code.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.output import write_text
from fluidnpu.scheduler_fw.registry import POLICIES


def _x(v: Any) -> str:
    return f"{v:.2f}×" if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _ci(pair: Any, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    if not pair or any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in pair):
        return "n/a (one seed)"
    return f"[{fmt.format(pair[0] * scale)}, {fmt.format(pair[1] * scale)}]"


def _pct(v: Any) -> str:
    return f"{100 * v:.2f} %" if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _way(h: dict[str, Any]) -> list[str]:
    if "mean_latency_gain" not in h:
        return ["–"] * 6
    return [f"{h['points']} of {h['points_total']}",
            f"**{_x(h['mean_latency_gain'])}** {_ci(h['mean_latency_gain_ci'])}",
            f"{_x(h['p99_latency_gain'])} {_ci(h['p99_latency_gain_ci'])}",
            f"{_pct(h['baseline_violation_rate'])} {_ci(h['baseline_violation_rate_ci'], '{:.2f}', 100)}",
            f"{_pct(h['fluidb_violation_rate'])} {_ci(h['fluidb_violation_rate_ci'], '{:.2f}', 100)}",
            f"{h['violation_gap_pp']:.2f} {_ci(h['violation_gap_pp_ci'])}"]


def headline_markdown(h: dict[str, Any]) -> str:
    """The headline tables: FluidB against the baselines, both ways, with intervals; saturated points apart."""
    level = 100 * float(h.get("interval_level", 0.95))
    rho = h.get("rho_max", "?")
    seeds = h.get("seeds", "?")
    lines = [f"Figures over the points of Figs. 4 and 5 where FluidB and every baseline are below saturation "
             f"(offered rate ≤ {rho} × the policy's measured capacity); brackets: {level:g} % t intervals over "
             f"the {seeds} seeds (ratios: geometric means, intervals in log space). Written by `fluidnpu eval` "
             f"from `headline.json`.", "",
             "| | points | mean latency, baseline / FluidB | p99, baseline / FluidB | baseline violations | "
             "FluidB violations | gap (pp) |", "|---|---|---|---|---|---|---|"]
    ways = [("each policy on its own DSE'd design", h)]
    if "same_hardware" in h:
        ways.append(("every policy on FluidB's design (same-hardware control)", h["same_hardware"]))
    for label, w in ways:
        lines.append(f"| {label} | " + " | ".join(_way(w)) + " |")
    for fig, per in h.get("per_figure", {}).items():
        for label, key in (("own designs", "own"), ("FluidB's design", "same_hardware")):
            if key in per:
                lines.append(f"| {fig} alone, {label} | " + " | ".join(_way(per[key])) + " |")
    lines += ["", f"For reference only, the old aggregate over *every* point, saturated ones included (it grows "
                  f"with the run length): {_x(h.get('all_points_mean_latency_gain'))} (paper: 1.97×).", ""]
    lines += ["Per baseline (mean-latency ratio baseline / FluidB over the points where both are below "
              "saturation; own design | FluidB's design):", "", "| baseline | own design | points | "
              "FluidB's design | points |", "|---|---|---|---|---|"]
    same = h.get("same_hardware", {}).get("per_baseline", {})
    for b, v in h.get("per_baseline", {}).items():
        s = same.get(b, {})
        lines.append(f"| {POLICIES[b].label} | {_x(v['mean_latency_gain'])} {_ci(v['mean_latency_gain_ci'])} | "
                     f"{v['pairs']} | {_x(s.get('mean_latency_gain'))} {_ci(s.get('mean_latency_gain_ci'))} | "
                     f"{s.get('pairs', '–')} |")
    for label, w in ways:
        sat = w.get("saturated_points", [])
        lines += ["", f"Saturated points left out ({label}): " + ("none" if not sat else "; ".join(
            f"{p['panel']} {p['rate']:g}/s ({', '.join(POLICIES[x].label for x in p['saturated'])})" for p in sat))
                  + "."]
    return "\n".join(lines) + "\n"


def table1_markdown(t: dict[str, Any]) -> str:
    """Table I with intervals and the same-hardware control column."""
    lines = ["| model | board | rate | SLO | LazyBatching own design | LazyBatching on FluidB's design | FluidB | "
             "latency ratio, own [95 % CI] | latency ratio, FluidB's design | paper |", "|---" * 10 + "|"]
    for r in t["rows"]:
        o, s = r["ours"], r.get("same_hardware")
        lines.append(f"| {r['model']} | {r['board']} | {r['rate']:g}/s | {r['slo_ms']:g} ms | "
                     f"{o['lazybatching'][0]:.0f} ms / {100 * o['lazybatching'][1]:.1f} % | "
                     + (f"{s['lazybatching'][0]:.0f} ms / {100 * s['lazybatching'][1]:.1f} % | " if s else "– | ")
                     + f"{o['fluidb'][0]:.0f} ms / {100 * o['fluidb'][1]:.1f} % | "
                     f"{_x(r['ours_latency_ratio'])} {_ci(r.get('ours_latency_ratio_ci'))} | "
                     + (f"{_x(s['latency_ratio'])} | " if s else "– | ") + f"{_x(r['paper_latency_ratio'])} |")
    lines += ["", f"Geometric mean latency ratio: {_x(t['ours_latency_ratio_geomean'])} on each policy's own design, "
                  f"{_x(t.get('same_hardware_latency_ratio_geomean'))} with LazyBatching on FluidB's design "
                  f"(paper: {_x(t['paper_latency_ratio_geomean'])}). Written by `fluidnpu eval table1`."]
    return "\n".join(lines) + "\n"


def splice(text: str, name: str, block: str) -> str:
    """`text` with the generated block NAME replaced by `block`; FluidError if its markers are missing."""
    pat = re.compile(rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)", re.S)
    if not pat.search(text):
        raise FluidError(f"no <!-- generated:{name} --> ... <!-- /generated:{name} --> markers to fill")
    return pat.sub(lambda m: m.group(1) + block + m.group(2), text, count=1)


def update_results_md(md_path: Path, out_dir: Path) -> list[str]:
    """Fill docs/results.md's generated blocks from the JSON in out_dir; returns the blocks written."""
    md_path, out_dir = Path(md_path), Path(out_dir)
    text = md_path.read_text()
    done = []
    head = out_dir / "headline.json"
    if head.is_file() and "<!-- generated:headline -->" in text:
        text = splice(text, "headline", headline_markdown(json.loads(head.read_text())))
        done.append("headline")
    t1 = out_dir / "table1.json"
    if t1.is_file() and "<!-- generated:table1 -->" in text:
        text = splice(text, "table1", table1_markdown(json.loads(t1.read_text())["summary"]))
        done.append("table1")
    write_text(md_path, text, "results page")
    return done
