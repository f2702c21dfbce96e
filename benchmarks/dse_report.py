"""Regenerate the DSE figures in docs/: designs for both zoo models on both
boards under every batching scheme, GOp/s-vs-batch plots (the paper's Fig. 7
layout) and the per-layer mode study of ResNet-50 on ZC706.

    python benchmarks/dse_report.py --out docs/figures
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from rich.progress import track

from fluidnpu.boards import load_board
from fluidnpu.boards.catalog import BOARD_DIR, board_from_data
from fluidnpu.dse.report import mode_study, plot_gops
from fluidnpu.dse.resource_model import max_tr
from fluidnpu.dse.search import DSEOptions, evaluate_design, explore
from fluidnpu.zoo import zoo_model

# The pick (`fluidnpu dse`'s default: Fluid Batching, the DSE choosing whether to build Stackable PEs),
# on the models with exits; then, on the backbones, (label, options) of the designs compared: baselines
# are DSE'd at a fixed batch of 8 as in the paper.
PICK = ("FluidB pick (PEs searched)", dict(batching="fluid"))
SCHEMES = [
    ("Fluid + Stackable PEs", dict(batching="fluid", stackable=True)),
    ("Fluid Batching", dict(batching="fluid", stackable=False)),
    ("static R (b=8)", dict(batching="r", stackable=False, fixed_batch=8)),
    ("static P (b=8)", dict(batching="p", stackable=False, fixed_batch=8)),
    ("FC only (b=8)", dict(batching="fc", stackable=False, fixed_batch=8)),
]
PAPER = {("resnet50", "zc706"): (4652, 7, 128), ("resnet50", "zcu104"): (6832, 10, 172),
         ("inceptionv3", "zc706"): (2742, 4, 225), ("inceptionv3", "zcu104"): (6832, 10, 172)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    jobs = [(m, b, label, opts, backbone) for m in ("resnet50", "inceptionv3") for b in ("zc706", "zcu104")
            for backbone in (False, True) for label, opts in (SCHEMES if backbone else [PICK])]
    curves: dict[tuple[str, str], dict[str, list[float]]] = {}
    peaks: dict[tuple[str, str], float] = {}
    for model, board_name, label, opts, backbone in track(jobs, description="DSE runs"):
        workload = zoo_model(model)
        workload = workload.without_exits() if backbone else workload
        board = load_board(board_name)
        r = explore(workload, board, DSEOptions(bmax=8, **opts))
        row = _row(model, board_name, label, r, board)
        row["workload"] = "backbone" if backbone else "with exits"
        rows.append(row)
        if backbone:
            curves.setdefault((model, board_name), {})[f"{label} <{r.TR},{r.TP},{r.TC}>"] = r.gops
            peaks[model, board_name] = max(peaks.get((model, board_name), 0.0), r.peak_gops)
        elif model == "resnet50" and board_name == "zc706":
            study = {b: mode_study(r, b) for b in (1, 8)}
            with open(out / "mode_study_resnet50_zc706.csv", "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["b", "layer", "R", "P", "C", "r_batching", "fluid_only", "stackable_only", "both",
                            "ideal", "fluid_gain", "stackable_gain", "util_r", "util_both"])
                for b, layers in study.items():
                    for x in layers:
                        w.writerow([b, x.name, x.R, x.P, x.C, x.r_batching, x.fluid_only, x.stackable_only, x.both,
                                    round(x.ideal), round(x.fluid_gain, 3), round(x.stackable_gain, 3),
                                    round(x.ideal / x.r_batching, 3), round(x.ideal / x.both, 3)])
    rows += paper_points() + narrow_port_sensitivity()
    with open(out / "dse_designs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "dse_designs.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "dse_picks.md").write_text(picks_markdown(rows))
    print(picks_markdown(rows))
    for (model, board_name), series in curves.items():
        plot_gops(series, None, out / f"gops_vs_batch_{model}_{board_name}.png",
                  f"{model} backbone on {board_name}: each scheme's own DSE'd design")
    print(f"wrote {len(rows)} designs and {len(curves)} plots to {out}")


def _row(model: str, board_name: str, scheme: str, r, board) -> dict:
    util = r.resources.utilisation(board)
    board_peak = 2.0 * board.dsp * r.clock_mhz * 1e6 / 1e9
    return {"model": model, "board": board_name, "workload": "with exits", "scheme": scheme,
            "TR": r.TR, "TP": r.TP, "TC": r.TC, "NB": r.NB, "ports": r.ports, "input_buffer": r.input_buffer,
            "stackable": bool(r.options.stackable), "paper": "x".join(map(str, PAPER[model, board_name])),
            "dsp_pct": round(100 * util["dsp"], 2), "bram_pct": round(100 * util["bram36"], 2),
            "uram_pct": round(100 * util["uram"], 2), "lut_pct": round(100 * util["lut"], 2),
            "ff_pct": round(100 * util["ff"], 2), "gops_b1": round(r.gops[0], 1), "gops_b4": round(r.gops[3], 1),
            "gops_b8": round(r.gops[7], 1),
            "peak_gops": round(r.peak_gops, 1), "board_peak_gops": round(board_peak, 1),
            **{f"board_peak_frac_b{b}": round(r.gops[b - 1] / board_peak, 4) for b in range(1, len(r.gops) + 1)},
            "lut_levels": r.timing_proxy.lut_levels if r.timing_proxy else None,
            "designs": r.n_designs, "seconds": round(r.seconds, 2)}


def picks_markdown(rows: list[dict]) -> str:
    """The four picks (both zoo models with exits on both boards, `fluidnpu dse`'s default, Bmax 8) against
    the utilisation targets: DSP >= 98 %, LUT <= 80 %, the rest <= 100 %, >= 88 % of the board's DSP peak for
    ResNet-50 at b = 4..8."""
    out = ["| model / board | pick <TR, TP, TC> | PEs | banks NB | AXI ports P | input buffer (words a half) "
           "| DSP | LUT | FF | BRAM36 | URAM | GOp/s b=1 | b=4 | b=8 "
           "| share of board peak b=1 / b=4 / b=8 (min over b=4..8) | LUT levels | DSE s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["workload"] != "with exits" or r["scheme"] != PICK[0]:
            continue
        fr = [r[f"board_peak_frac_b{b}"] for b in range(1, 9)]
        pes = "stackable" if r["stackable"] else "plain"
        out.append(f"| {r['model']} / {r['board']} | <{r['TR']}, {r['TP']}, {r['TC']}> | {pes} | {r['NB']} | "
                   f"{r['ports']} | {r['input_buffer']:,} | {r['dsp_pct']:.1f} % | "
                   f"{r['lut_pct']:.1f} % | {r['ff_pct']:.1f} % | {r['bram_pct']:.1f} % | {r['uram_pct']:.1f} % | "
                   f"{r['gops_b1']:.1f} | {r['gops_b4']:.1f} | {r['gops_b8']:.1f} | "
                   f"{100 * fr[0]:.1f} / {100 * fr[3]:.1f} / {100 * fr[7]:.1f} % ({100 * min(fr[3:]):.1f} %) | "
                   f"{r['lut_levels']} | {r['seconds']:.1f} |")
    return "\n".join(out) + "\n"


def paper_points() -> list[dict]:
    """The paper's <TP, TC> in our model with the fewest input banks (the cheapest engine our RTL builds
    for it), at the largest TR that fits the board; where no TR does (the calibrated LUT cost of our
    RTL), at the paper's own TR, with its over-100 % utilisation."""
    rows = []
    for (model, board_name), (paper_tr, tp, tc) in PAPER.items():
        workload, board = zoo_model(model), load_board(board_name)
        tr = int(max_tr(np.array([tp]), np.array([tc]), board, 8, len(workload.layers()), True, 10**6, banks=2)[0])
        scheme = "paper's TPxTC at the largest TR that fits"
        if tr < 1:
            tr, scheme = paper_tr, "paper's design (does not fit our RTL on this board)"
        rows.append(_row(model, board_name, scheme,
                         evaluate_design(workload, board, tr, tp, tc, DSEOptions(bmax=8, banks=2, stackable=True),
                                         allow_oversize=True), board))
    return rows


def narrow_port_sensitivity() -> list[dict]:
    """ZCU104 with its HP ports at 64 bits (32 B/cycle): how bandwidth moves the pick."""
    data = json.loads((BOARD_DIR / "zcu104.json").read_text())
    data["axi_hp"]["width_bits"]["value"] = 64
    board = board_from_data(data, "zcu104 with 64-bit HP ports")
    return [_row(model, "zcu104", f"{PICK[0]} with 64-bit HP ports", explore(zoo_model(model), board), board)
            for model in ("resnet50", "inceptionv3")]


if __name__ == "__main__":
    main()
