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


_KINDS = {"fluid+pe-searched@all": "FluidB", "r@one": "SERIAL", "fc@bmax": "FC-AdaptB",
          "r@bmax": "R-AdaptB, LazyBatching"}


def designs_markdown(figures: list[dict[str, Any]]) -> str:
    """Each policy's NPU design per model and board, from the figures' `designs` (the first figure naming one)."""
    lines = ["| model | board | policies | design ⟨TR, TP, TC⟩ | GOp/s b = 1 / Bmax | of peak at Bmax | "
             "full-batch capacity |", "|---|---|---|---|---|---|---|"]
    seen = set()
    for fig in figures:
        for d in fig.get("designs", []):
            key = (d["model"], d["board"], d["design_kind"])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"| {d['model']} | {d['board']} | {_KINDS.get(d['design_kind'], d['design_kind'])} | "
                         f"⟨{d['TR']}, {d['TP']}, {d['TC']}⟩ | {d['gops'][0]:.1f} / {d['gops'][-1]:.1f} | "
                         f"{_pct(d['gops'][-1] / d['peak_gops'])} | {d['full_batch_capacity']:.1f} samples/s |")
    return "\n".join(lines) + "\n"


_SWEEP_POLICIES = ("fluidb", "serial", "r-adaptb-s", "lazybatching")


def sweep_markdown(fig: dict[str, Any]) -> str:
    """Fig. 4 or 5: mean / p99 latency and SLO violations per offered rate, each policy on its own design."""
    rows = [r for r in fig["rows"] if r["hardware"] == "own" and r["policy"] in _SWEEP_POLICIES]
    rates = sorted({r["rate"] for r in rows})
    lines = ["| mean / p99 latency (ms), violations | " + " | ".join(f"{x:g}/s" for x in rates) + " |",
             "|---" * (len(rates) + 1) + "|"]
    for pol in _SWEEP_POLICIES:
        at = {r["rate"]: r for r in rows if r["policy"] == pol}
        if not at:
            continue
        label = next(iter(at.values()))["label"]
        cells = [f"{at[x]['mean_latency_ms']:.0f} / {at[x]['p99_latency_ms']:.0f}, "
                 f"{_pct(at[x]['slo_violation_rate'])}" if x in at else "–" for x in rates]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Written by `fluidnpu eval {fig.get('figure', '')}`: {fig['config'].get('seeds', '?')} seeds × "
                  f"{fig['config'].get('samples_per_seed', '?')} samples a point; every policy and the "
                  "same-hardware runs are in the JSON."]
    return "\n".join(lines) + "\n"


def fig7_markdown(fig: dict[str, Any]) -> str:
    """Fig. 7: GOp/s at b = 1 / 2 / 8 of each scheme on its own design, per model and board."""
    pairs = list(fig["summary"])
    schemes = list(next(iter(fig["summary"].values()))["gops"]) if pairs else []
    lines = ["| GOp/s at b = 1 / 2 / 8 | " + " | ".join(pairs) + " |", "|---" * (len(pairs) + 1) + "|"]
    for sch in schemes:
        cells = []
        for p in pairs:
            g = fig["summary"][p]["gops"][sch]
            cells.append(f"{g['b1']:.1f} / {g['b2']:.1f} / {g['b8']:.1f}")
        lines.append(f"| {sch} | " + " | ".join(cells) + " |")
    summ = [fig["summary"][p] for p in pairs]
    beats = ("yes" if s["fluid_stackable_beats_every_static_at_every_b"] else "no" for s in summ)
    lines.append("| Fluid + Stackable above every static scheme at every b | " + " | ".join(beats) + " |")
    lines.append("| Stackable gain on the same design, b = 1 | "
                 + " | ".join(_pct(s["same_design_stackable_gain_b1"] - 1) for s in summ) + " |")
    lines.append("| Fluid + Stackable at b = 8, of its peak | "
                 + " | ".join(_pct(s["fluid_stackable_fraction_of_peak_bmax"]) for s in summ) + " |")
    lines += ["", "Written by `fluidnpu eval fig7` from `fig7.json`."]
    return "\n".join(lines) + "\n"


def fig6_markdown(fig: dict[str, Any]) -> str:
    """Fig. 6: SLO violations against the SLO, one table per panel, each policy on its own design."""
    rows = [r for r in fig["rows"] if r["hardware"] == "own" and r["policy"] in _SWEEP_POLICIES]
    lines: list[str] = []
    for panel in dict.fromkeys(r["panel"] for r in rows):
        mine = [r for r in rows if r["panel"] == panel]
        slos = sorted({r["slo_ms"] for r in mine})
        lines += [f"| {panel}, violations at SLO (ms) | " + " | ".join(f"{x:g}" for x in slos) + " |",
                  "|---" * (len(slos) + 1) + "|"]
        for pol in _SWEEP_POLICIES:
            at = {r["slo_ms"]: r for r in mine if r["policy"] == pol}
            if at:
                label = next(iter(at.values()))["label"]
                lines.append(f"| {label} | " + " | ".join(
                    _pct(at[x]["slo_violation_rate"]) if x in at else "–" for x in slos) + " |")
        lines.append("")
    lines.append("Written by `fluidnpu eval fig6` from `fig6.json` (every policy is in the JSON).")
    return "\n".join(lines) + "\n"


def load_sweep_markdown(t: dict[str, Any]) -> str:
    """Table I's settings swept over offered load: latency ratio / violation gap (pp), LazyBatching against FluidB."""
    sweep = t.get("load_sweep", [])
    settings = list(dict.fromkeys((r["model"], r["board"], r["slo_ms"]) for r in sweep))
    loads = sorted({round(r["load"], 2) for r in sweep})
    lines = ["| ρ | " + " | ".join(f"{m} {b}, {slo:g} ms" for m, b, slo in settings) + " |",
             "|---" * (len(settings) + 1) + "|"]
    for rho in loads:
        at = {(r["model"], r["board"], r["slo_ms"]): r for r in sweep if round(r["load"], 2) == rho}
        lines.append(f"| {rho:g} | " + " | ".join(
            f"{at[k]['rate']:.1f}/s: {_x(at[k]['latency_ratio'])} / {at[k]['violation_pp']:.1f}" if k in at else "–"
            for k in settings) + " |")
    lines += ["", "Rate = ρ × FluidB's full-batch capacity. Written by `fluidnpu eval table1`."]
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
    figs = {n: json.loads((out_dir / f"{n}.json").read_text())
            for n in ("fig4", "fig5", "fig6", "fig7", "table1") if (out_dir / f"{n}.json").is_file()}
    blocks = {"designs": lambda: designs_markdown([figs[n] for n in ("fig4", "fig5", "table1") if n in figs]),
              "fig4": lambda: sweep_markdown(figs["fig4"]), "fig5": lambda: sweep_markdown(figs["fig5"]),
              "fig6": lambda: fig6_markdown(figs["fig6"]), "fig7": lambda: fig7_markdown(figs["fig7"]),
              "load_sweep": lambda: load_sweep_markdown(figs["table1"]["summary"])}
    for name, make in blocks.items():
        source = {"designs": "fig4", "load_sweep": "table1"}.get(name, name)
        if f"<!-- generated:{name} -->" in text and source in figs:
            text = splice(text, name, make())
            done.append(name)
    write_text(md_path, text, "results page")
    return done
