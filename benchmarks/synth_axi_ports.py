"""What the DMA costs per AXI port and per data bit: Yosys `synth_xilinx` of `AxiDma` alone.

The NPU has one AXI master per HP port (hw/dma.py `AxiDma(ports=N, read_streams=2)`: a ReadEngine
and a WriteEngine per port, each read through a command slice, a dealer of up to two reads a cycle
and a per-stream response merge, one N:1 select a stream). The resource
model's DMA terms (`LogicCosts.*_axi_port*`, `lut_per_merge_word`: `dma_logic`; and
`WidePortCosts`: `wide_port_logic`) are this sweep's fit: one 64-bit port at NMAX = 32 and
128 gives a port's cost per NMAX word and its fixed part; 2 and 4 ports at NMAX 32 and 128
give the merger (the mean over the four); 4 ports of 128 bits against 4 of 64 at NMAX 32
and 128 give the cost per port per data bit beyond 64, fixed and per NMAX word. NMAX 128 with 4 ports is the ResNet-50 /
ZC706 pick's DMA (ZCU104's picks have 128-bit ports). xc7, tag width 12 (the engines carry
the tag in their queues; the pick's 23 bits are in the calibration's control points).

    python benchmarks/synth_axi_ports.py            # synthesizes (~15 min on 2 loaded cores)
    python benchmarks/synth_axi_ports.py --reuse    # refit from build/synth_axi_ports/*/

Writes docs/figures/resources/axi_ports.json (the points, the fit, and whether
`LogicCosts`/`WidePortCosts` equal it; tests/test_resource_model.py checks that they do).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress

from fluidnpu.dse.resource_model import (
    DEFAULT_LOGIC,
    DEFAULT_WIDE_PORTS,
    LogicCosts,
    WidePortCosts,
    dma_logic,
    merge_luts,
    zero_luts,
)
from fluidnpu.hw.dma import AxiDma
from fluidnpu.hw.synth import _to_verilog, find_yosys, parse_results, synthesize

POINTS = ((32, 1, 64), (32, 2, 64), (32, 4, 64), (128, 1, 64), (128, 2, 64), (128, 4, 64),
          (32, 4, 128), (128, 4, 128))   # (NMAX, ports, data bits)
TAG_WIDTH = 12
FIELDS = ("lut_per_axi_port", "ff_per_axi_port", "lut_per_axi_port_word", "ff_per_axi_port_word",
          "lut_per_merge_word", "lut_per_zero_word", "ff_per_split_word")
WIDE_FIELDS = ("lut_per_port_bit", "lut_per_port_bit_word", "ff_per_port_bit")
Point = tuple[int, int, int]


def _dma(nmax: int, ports: int, dw: int) -> AxiDma:
    """The DMA as hw/npu.py builds it: two read streams (the weight and the input walker's)."""
    return AxiDma(data_width=dw, nmax=nmax, tag_width=TAG_WIDTH, ports=ports, read_streams=2)


def _name(nmax: int, ports: int, dw: int) -> str:
    return f"n{nmax}_p{ports}" + (f"_w{dw}" if dw != 64 else "")


def measure(root: Path, reuse: bool) -> dict[Point, dict[str, float]]:
    out = {}
    with Progress(console=Console(stderr=True)) as prog:
        task = prog.add_task("yosys synth_xilinx", total=len(POINTS))
        for pt in POINTS:
            wd = root / _name(*pt)
            t0 = time.perf_counter()
            if reuse:
                rep = parse_results(wd, "dma", "xc7", _to_verilog(_dma(*pt), "dma"), 0.0, find_yosys())
            else:
                rep = synthesize(_dma(*pt), "dma", "xc7", wd)
            out[pt] = {"lut": rep.total.lut, "ff": rep.total.ff, "lutram": rep.total.lutram,
                       "seconds": rep.seconds or time.perf_counter() - t0}
            prog.advance(task)
    return out


def fit(points: dict[Point, dict[str, float]]) -> dict[str, float]:
    """One port: fixed + per-word from NMAX 32 and 128; the deal and merge: what 2 ports add beyond a
    whole extra port (mean over NMAX 32 and 128, per NMAX word and select LUT level, `merge_luts`: flat
    from 2 to 4 ports); the input stream's zero answer: what 4 ports add beyond that (per NMAX word,
    `zero_luts`: none on 2 ports, where it packs into the select's LUT); the data width: 4 ports at 128
    against 64 bits, per port per bit; the FFs several ports add a port (a response register per stream, the
    command slice's skid register), per NMAX word: the mean over the 64-bit points of 2 and 4 ports."""
    def one(n: int, key: str) -> float:
        return points[(n, 1, 64)][key]

    per_word = {k: (one(128, k) - one(32, k)) / 96 for k in ("lut", "ff")}
    fixed = {k: one(32, k) - 32 * per_word[k] for k in ("lut", "ff")}
    merge = [(v["lut"] - p * one(n, "lut")) / (merge_luts(p) * n) for (n, p, dw), v in points.items()
             if p > 1 and dw == 64 and not zero_luts(p)]
    merge_word = round(sum(merge) / len(merge), 1)
    zero = [(v["lut"] - p * one(n, "lut") - merge_luts(p) * merge_word * n) / (zero_luts(p) * n)
            for (n, p, dw), v in points.items() if dw == 64 and zero_luts(p)]
    split = [(v["ff"] - p * one(n, "ff")) / (p * n) for (n, p, dw), v in points.items() if p > 1 and dw == 64]
    def wide(n: int, k: str) -> float:
        return (points[(n, 4, 128)][k] - points[(n, 4, 64)][k]) / (4 * 64)

    wide_word = (wide(128, "lut") - wide(32, "lut")) / 96
    return {"lut_per_axi_port": round(fixed["lut"], 0), "ff_per_axi_port": round(fixed["ff"], 0),
            "lut_per_axi_port_word": round(per_word["lut"], 1), "ff_per_axi_port_word": round(per_word["ff"], 1),
            "lut_per_merge_word": merge_word, "lut_per_zero_word": round(sum(zero) / len(zero), 1),
            "ff_per_split_word": round(sum(split) / len(split), 1),
            "lut_per_port_bit": round(wide(32, "lut") - 32 * wide_word, 2),
            "lut_per_port_bit_word": round(wide_word, 4),
            "ff_per_port_bit": round((wide(32, "ff") + wide(128, "ff")) / 2, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", action="store_true", help="re-read the Yosys results in --build")
    ap.add_argument("--build", default="build/synth_axi_ports")
    ap.add_argument("--out", default="docs/figures/resources/axi_ports.json")
    args = ap.parse_args()
    points = measure(Path(args.build), args.reuse)
    costs = fit(points)
    current = {**{k: asdict(DEFAULT_LOGIC)[k] for k in FIELDS},
               **{k: asdict(DEFAULT_WIDE_PORTS)[k] for k in WIDE_FIELDS}}
    # the model as the DSE prices it (dma_logic), with this fit's constants
    logic = LogicCosts(**{**asdict(DEFAULT_LOGIC), **{k: costs[k] for k in FIELDS}})
    wide = WidePortCosts(**{k: costs[k] for k in WIDE_FIELDS})
    rows = []
    for (nmax, ports, dw), p in points.items():
        lut, ff = (float(v) for v in dma_logic(np.array(nmax), ports, logic, dw, wide))
        rows.append({"nmax": nmax, "ports": ports, "data_width": dw, **p, "lut_model": lut,
                     "lut_err": lut / p["lut"] - 1, "ff_model": ff, "ff_err": ff / p["ff"] - 1})
    doc = {"points": rows, "fit": costs, "model_up_to_date": costs == current, "tag_width": TAG_WIDTH}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    for row in rows:
        print(f"NMAX {row['nmax']:>3}, {row['ports']} x {row['data_width']}-bit port(s): LUT {row['lut']:>6} "
              f"(model {row['lut_model']:>8.0f}, {row['lut_err']:+.1%}), "
              f"FF {row['ff']:>5} (model {row['ff_model']:.0f}, "
              f"{row['ff_err']:+.1%})")
    print(f"fit: {costs}; LogicCosts/WidePortCosts {'equal' if doc['model_up_to_date'] else 'DIFFER from'} it")


if __name__ == "__main__":
    main()
