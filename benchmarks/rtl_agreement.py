"""RTL cycle counters against the DSE performance model, over many random layers.

Runs seeded random single-layer cases (convs and FCs, every <BR, k>, every
batch size) on the simulated NPU configurations of AGREEMENT_CONFIGS, four on
one AXI port and the others on two, three or four (Amaranth simulator, one AXI
RAM model per port), reads CYC_BUSY / CYC_MAC / CYC_DMA_STALL, prices each case
with dse.perf_model, and writes docs/figures/rtl/agreement.{csv,json,png}.
Prints the worst and mean disagreement. Then runs one compute-bound layer on
<128, 4, 16> on one 64-, 128- and 256-bit port and on two and four 64-bit
ports and prints its MAC-active share (CYC_MAC / CYC_BUSY) beside the model's
(`--no-compute-bound` skips it), and the pick-shaped layers (PICK_LAYERS on
PICK_ENGINE: the ResNet-50/ZC706 pick's TP and ports, steps of hundreds of
rows; `--no-pick-layers` skips them). `--configs 4,5,6` runs only those
entries of AGREEMENT_CONFIGS (the seeds stay the same) and keeps what
--out's agreement.json holds for the others, and the runs it skips.
`--reprice` simulates nothing: it takes the RTL counters recorded in --out's
agreement.json and prices the same cases with the current model (after a
change to dse/perf_model.py alone, which cannot move the RTL's counts: minutes
instead of half an hour).

    python benchmarks/rtl_agreement.py [--cases 12] [--configs 0,1] [--out docs/figures/rtl] [--reprice]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from fluidnpu.sim_tb.agreement import (
    AGREEMENT_CONFIGS,
    PICK_ENGINE,
    PICK_LAYERS,
    AgreementRow,
    agreement_cases,
    agreement_rows,
    case_model_cycles,
    compute_bound_buses,
    compute_bound_case,
    compute_bound_rows,
    config_name,
    model_mac_share,
    one_layer_case,
    pick_layer_rows,
)


def _row(record: dict) -> AgreementRow:
    """A recorded row (agreement.json) without its derived fields."""
    return AgreementRow(**{k: record[k] for k in AgreementRow.__dataclass_fields__})


def _recorded(doc: dict) -> list[AgreementRow]:
    return [_row(r) for r in doc["rows"]]


def _pick_records(rows: list[AgreementRow], names: list[str]) -> list[dict]:
    return [asdict(r) | {"layer": n, "error": r.error, "mac_share": r.mac_share} for n, r in zip(names, rows)]


def reprice(doc: dict, chosen: list[int]) -> tuple[list[AgreementRow], list[dict], list[dict]]:
    """The rows, compute-bound and pick-shaped runs recorded in `doc` (agreement.json), each case priced again
    by the current model (the cases are rebuilt from their seeds; a recorded case whose shape differs is an
    error)."""
    recorded = _recorded(doc)
    rows = []
    for i in chosen:
        params = AGREEMENT_CONFIGS[i]
        mine = [r for r in recorded if r.config == config_name(params)]
        cases = agreement_cases(params, len(mine), seed=1000 * (i + 1))
        for r, case in zip(mine, cases):
            g = case.layers[0].geometry
            if (r.R, r.P, r.C, r.b) != (g.npix, g.P, g.cout, case.b):
                raise SystemExit(f"recorded case {r} is not seed {1000 * (i + 1)}'s: simulate again")
            rows.append(replace(r, model_cycles=case_model_cycles(params, case)))
    case = compute_bound_case()
    cb = []
    for params, r in zip(compute_bound_buses(), doc["compute_bound"]):
        model = case_model_cycles(params, case)
        cb.append(r | {"model_cycles": model, "error": r["hw_cycles"] / model - 1,
                       "model_mac_share": model_mac_share(params, case)})
    pick = []
    for r in doc.get("pick_layers", []):
        case = one_layer_case(PICK_LAYERS[r["layer"]], PICK_ENGINE.bmax, seed=list(PICK_LAYERS).index(r["layer"]))
        pick += _pick_records([replace(_row(r), model_cycles=case_model_cycles(PICK_ENGINE, case))], [r["layer"]])
    return rows, cb, pick


def simulate(chosen: list[int], n_cases: int, compute_bound: bool,
             pick_layers: bool) -> tuple[list[AgreementRow], list[dict] | None, list[dict] | None]:
    """Each chosen configuration's seeded cases on the simulated NPU, the compute-bound runs and the
    pick-shaped layers (None: not run)."""
    rows = []
    with Progress(console=Console(stderr=True)) as prog:
        task = prog.add_task("simulating", total=len(chosen) + compute_bound + pick_layers)
        for i in chosen:
            params = AGREEMENT_CONFIGS[i]
            rows += agreement_rows(params, agreement_cases(params, n_cases, seed=1000 * (i + 1)))
            prog.advance(task)
        cb = None
        if compute_bound:
            case = compute_bound_case()
            cb = []
            for params, r in zip(compute_bound_buses(), compute_bound_rows()):
                share = model_mac_share(params, case)
                cb.append(asdict(r) | {"axi_dw": params.axi_dw, "axi_ports": params.axi_ports, "error": r.error,
                                       "mac_share": r.mac_share, "model_mac_share": share})
            prog.advance(task)
        pick = None
        if pick_layers:
            pick = _pick_records(pick_layer_rows(), list(PICK_LAYERS))
            prog.advance(task)
    return rows, cb, pick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=12, help="cases per configuration")
    ap.add_argument("--out", default="docs/figures/rtl")
    ap.add_argument("--no-compute-bound", action="store_true", help="skip the compute-bound MAC-share runs")
    ap.add_argument("--no-pick-layers", action="store_true", help="skip the pick-shaped layers")
    ap.add_argument("--configs", default=None, help="comma-separated indices into AGREEMENT_CONFIGS (default: all)")
    ap.add_argument("--reprice", action="store_true",
                    help="simulate nothing: price the RTL counts recorded in --out/agreement.json with the "
                         "current model")
    args = ap.parse_args()
    chosen = (list(range(len(AGREEMENT_CONFIGS))) if args.configs is None
              else [int(i) for i in args.configs.split(",")])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "agreement.json"
    doc = json.loads(path.read_text()) if path.exists() else {"rows": [], "compute_bound": [], "pick_layers": []}
    t0 = time.perf_counter()
    if args.reprice:
        rows, cb, pick = reprice(doc, chosen)
        seconds = doc["summary"]["seconds"]
    else:
        rows, cb, pick = simulate(chosen, args.cases, not args.no_compute_bound, not args.no_pick_layers)
        seconds = time.perf_counter() - t0
    # what was not run this time stays as recorded (the other configurations' rows, the other runs)
    names = {config_name(AGREEMENT_CONFIGS[i]) for i in chosen}
    kept = [r for r in _recorded(doc) if r.config not in names]
    order = {config_name(p): i for i, p in enumerate(AGREEMENT_CONFIGS)}
    rows = sorted(kept + rows, key=lambda r: order.get(r.config, len(order)))
    cb = doc["compute_bound"] if cb is None else cb
    pick = doc.get("pick_layers", []) if pick is None else pick
    records = [asdict(r) | {"error": r.error, "mac_share": r.mac_share} for r in rows]
    with open(out / "agreement.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)
    worst = max(rows, key=lambda r: abs(r.error))
    summary = {"cases": len(rows), "all_correct": all(r.correct for r in rows),
               "worst_error": worst.error, "mean_abs_error": sum(abs(r.error) for r in rows) / len(rows),
               "within_5pct": sum(abs(r.error) <= 0.05 for r in rows), "seconds": seconds,
               "repriced": args.reprice}
    path.write_text(json.dumps({"summary": summary, "rows": records, "compute_bound": cb, "pick_layers": pick},
                               indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 4.5))
        for cfg in sorted({r.config for r in rows}):
            sel = [r for r in rows if r.config == cfg]
            ax.scatter([r.model_cycles for r in sel], [r.hw_cycles for r in sel], s=14, label=cfg)
        lim = max(max(r.hw_cycles, r.model_cycles) for r in rows) * 1.1
        ax.plot([10, lim], [10, lim], "k-", lw=0.8)
        ax.plot([10, lim], [10 * 1.05, lim * 1.05], "k:", lw=0.6)
        ax.plot([10, lim], [10 * 0.95, lim * 0.95], "k:", lw=0.6)
        ax.set(xscale="log", yscale="log", xlabel="model cycles (dse.perf_model)", ylabel="RTL CYC_BUSY",
               title="RTL counters vs performance model")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "agreement.png", dpi=130)
    except ImportError:
        pass
    print(f"{summary['cases']} cases, all bit-exact: {summary['all_correct']}; "
          f"within 5%: {summary['within_5pct']}/{summary['cases']}; "
          f"worst {summary['worst_error']:+.1%} ({worst.config}, b={worst.b} BR={worst.BR} k={worst.k_code} "
          f"R={worst.R} P={worst.P} C={worst.C}); mean |error| {summary['mean_abs_error']:.1%}; "
          f"{seconds:.0f} s")
    for r in cb:
        print(f"compute-bound R={r['R']} P={r['P']} C={r['C']} on {r['config']}: CYC_MAC/CYC_BUSY "
              f"{r['mac_share']:.1%} (model {r['model_mac_share']:.1%}), cycles {r['hw_cycles']} vs model "
              f"{r['model_cycles']} ({r['error']:+.1%}), bit-exact {r['correct']}")
    for r in pick:
        print(f"pick-shaped {r['layer']} on {r['config']}: cycles {r['hw_cycles']} vs model {r['model_cycles']} "
              f"({r['error']:+.1%}), bit-exact {r['correct']}")


if __name__ == "__main__":
    main()
