"""RTL cycle counters against the DSE performance model, over many random layers.

Runs seeded random single-layer cases (convs and FCs, every <BR, k>, every
batch size) on seven simulated NPU configurations, four on one AXI port and
three on two or four (Amaranth simulator, one AXI RAM model per port), reads
CYC_BUSY / CYC_MAC / CYC_DMA_STALL, prices each case with dse.perf_model, and
writes docs/figures/rtl/agreement.{csv,json,png}. Prints the worst and mean
disagreement. Then runs one compute-bound layer on <128, 4, 16> on one 64-,
128- and 256-bit port and on two and four 64-bit ports and prints its
MAC-active share (CYC_MAC / CYC_BUSY) beside the model's
(`--no-compute-bound` skips it). `--configs 4,5,6` runs only those entries
of AGREEMENT_CONFIGS (the seeds stay the same). `--reprice` simulates nothing: it
takes the RTL counters recorded in --out's agreement.json and prices the same
cases with the current model (after a change to dse/perf_model.py alone, which
cannot move the RTL's counts: minutes instead of half an hour).

    python benchmarks/rtl_agreement.py [--cases 12] [--configs 0,1] [--out docs/figures/rtl] [--reprice]
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import asdict, replace
import json
from pathlib import Path
import time

from rich.console import Console
from rich.progress import Progress

from fluidnpu.sim_tb.agreement import (AGREEMENT_CONFIGS, AgreementRow, agreement_cases, agreement_rows,
                                       case_model_cycles, compute_bound_buses, compute_bound_case, compute_bound_rows,
                                       config_name, model_mac_share)


def reprice(out: Path, chosen: list[int]) -> tuple[list[AgreementRow], list[dict], float]:
    """The rows and compute-bound runs recorded in out/agreement.json, each case priced again by the current
    model (the cases are rebuilt from their seeds; a recorded case whose shape differs is an error)."""
    doc = json.loads((out / "agreement.json").read_text())
    fields = list(AgreementRow.__dataclass_fields__)
    recorded = [AgreementRow(**{k: r[k] for k in fields}) for r in doc["rows"]]
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
    return rows, cb, doc["summary"]["seconds"]


def simulate(chosen: list[int], n_cases: int, compute_bound: bool) -> tuple[list[AgreementRow], list[dict], float]:
    """Each chosen configuration's seeded cases on the simulated NPU, and the compute-bound runs."""
    rows = []
    t0 = time.perf_counter()
    with Progress(console=Console(stderr=True)) as prog:
        task = prog.add_task("simulating", total=len(chosen))
        for i in chosen:
            params = AGREEMENT_CONFIGS[i]
            rows += agreement_rows(params, agreement_cases(params, n_cases, seed=1000 * (i + 1)))
            prog.advance(task)
    seconds = time.perf_counter() - t0
    cb = []
    if compute_bound:
        case = compute_bound_case()
        for params, r in zip(compute_bound_buses(), compute_bound_rows()):
            share = model_mac_share(params, case)
            cb.append(asdict(r) | {"axi_dw": params.axi_dw, "axi_ports": params.axi_ports, "error": r.error,
                                   "mac_share": r.mac_share, "model_mac_share": share})
    return rows, cb, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=12, help="cases per configuration")
    ap.add_argument("--out", default="docs/figures/rtl")
    ap.add_argument("--no-compute-bound", action="store_true", help="skip the compute-bound MAC-share runs")
    ap.add_argument("--configs", default=None, help="comma-separated indices into AGREEMENT_CONFIGS (default: all)")
    ap.add_argument("--reprice", action="store_true",
                    help="simulate nothing: price the RTL counts recorded in --out/agreement.json with the current model")
    args = ap.parse_args()
    chosen = (range(len(AGREEMENT_CONFIGS)) if args.configs is None
              else [int(i) for i in args.configs.split(",")])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.reprice:
        rows, cb, seconds = reprice(out, list(chosen))
    else:
        rows, cb, seconds = simulate(list(chosen), args.cases, not args.no_compute_bound)
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
    (out / "agreement.json").write_text(json.dumps({"summary": summary, "rows": records, "compute_bound": cb},
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


if __name__ == "__main__":
    main()
