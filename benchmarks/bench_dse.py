"""Benchmark: the whole exhaustive DSE (every <TR, TP, TC> that fits, scored or bounded) with Bmax 8.

Target (issues 2 and 11): ResNet-50 on ZC706 under 10 s on a 2-core machine (the spaces are
searched by forked workers, one per core, dse/search.py `explore`). Runs the four
zoo model/board pairs of docs/dse.md by default (or one with --model/--board), prints the
median of --repeat runs per pair, the designs that fit, how many were scored exactly, the pick
and the machine.

    python benchmarks/bench_dse.py [--repeat 3] [--model resnet50 --board zc706] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from fluidnpu.boards import load_board
from fluidnpu.dse.search import DSEOptions, explore
from fluidnpu.zoo import zoo_model

PAIRS = (("resnet50", "zc706"), ("resnet50", "zcu104"), ("inceptionv3", "zc706"), ("inceptionv3", "zcu104"))


def bench(model: str, board_name: str, bmax: int, repeat: int) -> dict:
    workload, board = zoo_model(model), load_board(board_name)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = explore(workload, board, DSEOptions(bmax=bmax))
        times.append(time.perf_counter() - t0)
    return {
        "benchmark": "exhaustive DSE", "model": workload.name, "board": board.name, "bmax": bmax,
        "designs": result.n_designs, "scored": result.n_scored, "layers": len(workload.layers()),
        "median_s": statistics.median(times), "runs_s": times,
        "design": [result.TR, result.TP, result.TC], "NB": result.NB, "ports": result.ports,
        "stackable": result.options.stackable, "bram36": result.resources.bram36,
        "gops": [round(g, 2) for g in result.gops],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="one model (default: the four pairs)")
    ap.add_argument("--board")
    ap.add_argument("--bmax", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pairs = PAIRS if args.model is None and args.board is None else ((args.model or "resnet50", args.board or "zc706"),)
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    figures = [bench(model, board, args.bmax, args.repeat) for model, board in pairs]
    if args.json:
        print(json.dumps({"machine": machine, "runs": figures}, indent=1))
        return
    for f in figures:
        print(f"DSE {f['model']} on {f['board']}, Bmax={f['bmax']}: {f['median_s']:.2f} s median of {args.repeat} "
              f"({f['designs']:,} designs fit, {f['scored']:,} scored, the rest bounded; {f['layers']} layers, "
              f"every <k, BR>), best <{', '.join(map(str, f['design']))}> "
              f"({'Stackable' if f['stackable'] else 'plain'} PEs, NB {f['NB']}, {f['ports']} AXI ports), "
              f"{f['bram36']:g} BRAM36")
    print(f"[{machine}]")


if __name__ == "__main__":
    main()
