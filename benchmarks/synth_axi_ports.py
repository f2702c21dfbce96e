"""What each extra AXI port costs: Yosys `synth_xilinx` of `AxiDma` alone at 1, 2 and 4 ports.

The NPU has one AXI master per HP port (hw/dma.py `AxiDma(ports=N)`: a ReadEngine and a
WriteEngine per port, a round-robin dealer and an N:1 response merger). The resource
model's control terms (`LogicCosts`, fitted on one-port NPUs by synth_calibration.py)
get the extra ports from this sweep: one port at NMAX = 32 and 128 gives a port's cost
per NMAX word and its fixed part; 2 and 4 ports at NMAX 32 (and 2 at 128) give the
merger. 64-bit ports, xc7, tag width 12 (the sequencer's at these sizes).

    python benchmarks/synth_axi_ports.py            # synthesizes (~20 min on 2 loaded cores)
    python benchmarks/synth_axi_ports.py --reuse    # refit from build/synth_axi_ports/*/

Writes docs/figures/resources/axi_ports.json (the points, the fit, and whether
`LogicCosts` equals it; tests/test_resource_model.py checks that it does).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
import json
from pathlib import Path
import time

from rich.console import Console
from rich.progress import Progress

from fluidnpu.dse.resource_model import DEFAULT_LOGIC
from fluidnpu.hw.dma import AxiDma
from fluidnpu.hw.synth import _to_verilog, find_yosys, parse_results, synthesize

POINTS = ((32, 1), (32, 2), (32, 4), (128, 1), (128, 2))   # (NMAX, ports)
DATA_WIDTH, TAG_WIDTH = 64, 12
FIELDS = ("lut_per_axi_port", "ff_per_axi_port", "lut_per_axi_port_word", "ff_per_axi_port_word",
          "lut_per_merge_word")


def _dma(nmax: int, ports: int) -> AxiDma:
    return AxiDma(data_width=DATA_WIDTH, nmax=nmax, tag_width=TAG_WIDTH, ports=ports)


def measure(root: Path, reuse: bool) -> dict[tuple[int, int], dict[str, float]]:
    out = {}
    with Progress(console=Console(stderr=True)) as prog:
        task = prog.add_task("yosys synth_xilinx", total=len(POINTS))
        for nmax, ports in POINTS:
            wd = root / f"n{nmax}_p{ports}"
            t0 = time.perf_counter()
            if reuse:
                rep = parse_results(wd, "dma", "xc7", _to_verilog(_dma(nmax, ports), "dma"), 0.0, find_yosys())
            else:
                rep = synthesize(_dma(nmax, ports), "dma", "xc7", wd)
            out[(nmax, ports)] = {"lut": rep.total.lut, "ff": rep.total.ff, "lutram": rep.total.lutram,
                                  "seconds": rep.seconds or time.perf_counter() - t0}
            prog.advance(task)
    return out


def fit(points: dict[tuple[int, int], dict[str, float]]) -> dict[str, float]:
    """One port: fixed + per-word from NMAX 32 and 128; the merger: what 2 and 4 ports at NMAX 32
    add beyond whole extra ports (mean of the two, per NMAX word)."""
    def one(n: int, key: str) -> float:
        return points[(n, 1)][key]

    per_word = {k: (one(128, k) - one(32, k)) / 96 for k in ("lut", "ff")}
    fixed = {k: one(32, k) - 32 * per_word[k] for k in ("lut", "ff")}
    merge = [(points[(32, p)]["lut"] - p * one(32, "lut")) / 32 for p in (2, 4)]
    return {"lut_per_axi_port": round(fixed["lut"], 0), "ff_per_axi_port": round(fixed["ff"], 0),
            "lut_per_axi_port_word": round(per_word["lut"], 1), "ff_per_axi_port_word": round(per_word["ff"], 1),
            "lut_per_merge_word": round(sum(merge) / len(merge), 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", action="store_true", help="re-read the Yosys results in --build")
    ap.add_argument("--build", default="build/synth_axi_ports")
    ap.add_argument("--out", default="docs/figures/resources/axi_ports.json")
    args = ap.parse_args()
    points = measure(Path(args.build), args.reuse)
    costs = fit(points)
    current = {k: asdict(DEFAULT_LOGIC)[k] for k in FIELDS}
    model = {}
    for (nmax, ports), p in points.items():
        extra = ports - 1
        lut = (ports * (costs["lut_per_axi_port"] + costs["lut_per_axi_port_word"] * nmax)
               + (extra > 0) * costs["lut_per_merge_word"] * nmax)
        model[f"{nmax},{ports}"] = {"lut_model": lut, "lut_err": lut / p["lut"] - 1,
                                    "ff_model": ports * (costs["ff_per_axi_port"] + costs["ff_per_axi_port_word"] * nmax)}
    doc = {"points": [{"nmax": n, "ports": k, **v, **model[f"{n},{k}"]} for (n, k), v in points.items()],
           "fit": costs, "model_up_to_date": costs == current, "data_width": DATA_WIDTH}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    for row in doc["points"]:
        print(f"NMAX {row['nmax']:>3}, {row['ports']} port(s): LUT {row['lut']:>6} (model {row['lut_model']:>8.0f}, "
              f"{row['lut_err']:+.1%}), FF {row['ff']:>5} (model {row['ff_model']:.0f})")
    print(f"fit: {costs}; LogicCosts {'equals' if doc['model_up_to_date'] else 'DIFFERS from'} it")


if __name__ == "__main__":
    main()
