"""Yosys `synth_xilinx` of the block input buffer (hw/input_buffer.py) and its fill walker
(hw/fill_walker.py) at a pick's size: their BRAM, LUT and FF counts beside what benchmarks/peak_gap.py
charged for the buffer, and each one's longest register-to-register path in LUT levels (the timing
proxy, hw/timing.py; the budget is 8).

The default is what ZC706's ResNet-50 pick would carry: TP 14, TC 64, NMAX 128, halves of 146,944 words
(`layer1.*.conv2`'s largest block at b = 4, peak_gap's `buffer_words`), 4 lanes a bank. About 17 min
on 2 cores (the halves' 144 BRAM36 cascades dominate).

    .venv/bin/python benchmarks/synth_input_buffer.py --out docs/figures/resources
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from fluidnpu.dse.resource_model import bram36_for
from fluidnpu.hw.fill_walker import FillWalker
from fluidnpu.hw.input_buffer import InputBuffer
from fluidnpu.hw.regmap import nmax
from fluidnpu.hw.seq_streams import tag_layout
from fluidnpu.hw.synth import synthesize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--TP", type=int, default=14)
    ap.add_argument("--TC", type=int, default=64)
    ap.add_argument("--TR", type=int, default=2091)
    ap.add_argument("--NB", type=int, default=2)
    ap.add_argument("--depth", type=int, default=146_944, help="words a half holds")
    ap.add_argument("--lanes", type=int, default=4, help="16-bit words a bank row (power of two)")
    ap.add_argument("--bmax", type=int, default=8)
    ap.add_argument("--workdir", default="build/synth_input_buffer")
    ap.add_argument("--out", help="folder for input_buffer.json")
    args = ap.parse_args()
    n = nmax(args.TP, args.TC)
    dut = InputBuffer(TP=args.TP, nmax=n, depth=args.depth, tag=tag_layout(args.NB, args.TR, args.TP, args.TC, n),
                      lanes=args.lanes)
    rep = synthesize(dut, "input_buffer", family="xc7", workdir=args.workdir, timing=True)
    walker = synthesize(FillWalker(TR=args.TR, bmax=args.bmax, nmax=n, depth=dut.depth, window=dut.window),
                        "fill_walker", family="xc7", workdir=f"{args.workdir}_walker", timing=True)
    out = {"TP": args.TP, "nmax": n, "depth_words": dut.depth, "lanes": args.lanes, "banks": dut.nbank,
           "counts": asdict(rep.total), "cells": rep.cells,
           "priced_bram36": 2 * float(bram36_for(np.ceil(args.depth / args.TP), 16 * args.TP)),
           "lut_levels": rep.timing.critical.lut_levels if rep.timing else None, "seconds": rep.seconds,
           "fill_walker": {"counts": asdict(walker.total),
                           "lut_levels": walker.timing.critical.lut_levels if walker.timing else None,
                           "seconds": walker.seconds}}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "input_buffer.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
