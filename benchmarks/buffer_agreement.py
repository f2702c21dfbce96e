"""Buffered layers against DDR and the model: what the block input buffer buys in the RTL.

Runs sim_tb/agreement.py's BUFFERED_CASES (3 x 3 convolutions on three engines: one 64-bit port, four
64-bit ports, and the ResNet-50/ZC706 pick's TP on its three ports) on the simulated NPU built with the
buffer (Amaranth simulator), each layer from DDR and buffered, back to back, and prints per case the
RTL's busy cycles, its MAC-active share and its AXI read beats beside the model's cycles
(dse/perf_model.py; a buffered layer as `FillShape` prices it). Writes --out/buffered.json and
buffered.png; `--json` prints the rows as JSON. About five minutes on one core.

    python benchmarks/buffer_agreement.py [--out docs/figures/rtl] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fluidnpu.sim_tb.agreement import BUFFER_ENGINES, BUFFERED_CASES, buffered_rows


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{r['engine']} #{r['case']}" for r in rows]
    xs = range(len(rows))
    for off, kind in ((-0.2, "ddr"), (0.2, "buffered")):
        ax0.bar([x + off for x in xs], [r[kind]["mac_cycles"] / r[kind]["hw_cycles"] for r in rows], 0.4, label=kind)
        ax1.bar([x + off for x in xs], [r[kind]["hw_cycles"] / r[kind]["model_cycles"] - 1 for r in rows], 0.4,
                label=kind)
    ax0.set_ylabel("MAC-active share (RTL)")
    ax1.set_ylabel("RTL / model - 1")
    ax1.axhline(0.05, ls=":", c="k")
    ax1.axhline(-0.05, ls=":", c="k")
    for ax in (ax0, ax1):
        ax.set_xticks(list(xs), labels, rotation=30, ha="right")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/figures/rtl"))
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    console = Console(stderr=args.json)
    t0 = time.perf_counter()
    rows = []
    with console.status("simulating") as status:
        for name in BUFFER_ENGINES:
            status.update(f"simulating the {name} engine's buffered cases")
            rows += buffered_rows((name,))
    seconds = time.perf_counter() - t0
    doc = {"engines": {name: {"TR": p.TR, "TP": p.TP, "TC": p.TC, "bmax": p.bmax, "axi_dw": p.axi_dw,
                              "axi_ports": p.axi_ports, "input_buffer": p.input_buffer}
                       for name, p in BUFFER_ENGINES.items()},
           "cases": [{"engine": e, "geometry": g, "b": b, "mode": list(m)} for e, g, b, m in BUFFERED_CASES],
           "rows": rows, "seconds": seconds}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "buffered.json").write_text(json.dumps(doc, indent=1) + "\n")
    _plot(rows, args.out / "buffered.png")
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    table = Table(title=f"buffered layers ({seconds:.0f} s)")
    for col in ("case", "engine", "b, BR", "DDR cycles", "model", "buffered cycles", "model", "MAC-active",
                "read beats"):
        table.add_column(col)
    for r in rows:
        d, bf = r["ddr"], r["buffered"]
        table.add_row(str(r["case"]), r["engine"], f"{d['b']}, {d['BR']}",
                      f"{d['hw_cycles']:,}", f"{d['hw_cycles'] / d['model_cycles'] - 1:+.1%}",
                      f"{bf['hw_cycles']:,} ({bf['hw_cycles'] / d['hw_cycles'] - 1:+.1%})",
                      f"{bf['hw_cycles'] / bf['model_cycles'] - 1:+.1%}",
                      f"{d['mac_cycles'] / d['hw_cycles']:.1%} -> {bf['mac_cycles'] / bf['hw_cycles']:.1%}",
                      f"{d['read_beats']:,} -> {bf['read_beats']:,}")
    console.print(table)
    if not all(r[k]["correct"] for r in rows for k in ("ddr", "buffered")):
        raise SystemExit("a case's outputs were wrong")


if __name__ == "__main__":
    main()
