"""Yosys `synth_xilinx` of one block-input-buffer bank (a memory as hw/input_buffer.py builds each bank:
BUFFER_LANES 16-bit words a row, written by 16-bit lanes, read a row a cycle) at many depths: the
BRAM36 Yosys maps it to beside `resource_model.buffer_bank_bram36`, and the read multiplexer's LUTs.

Yosys does not always take the fewest BRAM36: a deep bank may get one more in a shape whose depth
cascade, and read multiplexer, is shorter (docs/resources.md, "The block input buffer's resources").
About 3-6 min a depth past 8,192 rows on one core.

    .venv/bin/python benchmarks/synth_buffer_bank.py --out docs/figures/resources
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

from amaranth import Module, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from fluidnpu.dse.resource_model import buffer_bank_bram36
from fluidnpu.hw.regmap import BUFFER_LANES
from fluidnpu.hw.synth import synthesize

DEPTHS = (256, 1024, 1536, 2048, 2560, 3584, 4608, 5632, 7680, 9184, 9216, 9728, 10240, 12000, 16384, 18432,
          18822)


class BufferBank(wiring.Component):
    """One bank of `rows` rows of `lanes` 16-bit words, its ports as InputBuffer drives them."""

    def __init__(self, rows: int, lanes: int = BUFFER_LANES) -> None:
        self.rows, self.lanes = rows, lanes
        super().__init__({"waddr": In(range(rows)), "wdata": In(16 * lanes), "wen": In(lanes),
                          "raddr": In(range(rows)), "ren": In(1), "rdata": Out(16 * lanes)})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.mem = mem = Memory(shape=unsigned(16 * self.lanes), depth=self.rows, init=[])
        wp, rp = mem.write_port(granularity=16), mem.read_port()
        m.d.comb += [wp.addr.eq(self.waddr), wp.data.eq(self.wdata), wp.en.eq(self.wen),
                     rp.addr.eq(self.raddr), rp.en.eq(self.ren), self.rdata.eq(rp.data)]
        return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="bank rows (both halves), comma-separated")
    ap.add_argument("--workdir", default="build/synth_buffer_bank")
    ap.add_argument("--out", help="folder for buffer_bank_depths.json")
    args = ap.parse_args()
    points = []
    for rows in (int(d) for d in args.depths.split(",")):
        rep = synthesize(BufferBank(rows), "buffer_bank", "xc7", Path(args.workdir) / str(rows))
        model = float(buffer_bank_bram36(rows))
        points.append({"rows": rows, "bits": 16 * BUFFER_LANES, "bram36": rep.total.bram36, "lut": rep.total.lut,
                       "cells": {k: v.cells for k, v in rep.memories.items()}, "model_bram36": model,
                       "seconds": round(rep.seconds, 1)})
        print(f"{rows:>6} rows: Yosys {rep.total.bram36:>4.0f} BRAM36 ({rep.total.lut} LUT), model {model:.0f}"
              f"{'' if model == rep.total.bram36 else '  MISS'}", flush=True)
    if args.out:
        doc = {"what": "one block-input-buffer bank, Yosys synth_xilinx (xc7), by depth",
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
               "date": datetime.date.today().isoformat(), "yosys": rep.yosys, "points": points}
        path = Path(args.out) / "buffer_bank_depths.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written {path}")


if __name__ == "__main__":
    main()
