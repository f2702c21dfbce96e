"""Benchmark: the whole exhaustive DSE for ResNet-50 on ZC706 with Bmax 8.

Target (issue 2): under 10 s on a 2-core machine. Prints the median of
--repeat runs and the machine it ran on.

    python benchmarks/bench_dse.py [--repeat 3] [--model resnet50] [--board zc706] [--json]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--board", default="zc706")
    ap.add_argument("--bmax", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    workload, board = zoo_model(args.model), load_board(args.board)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = explore(workload, board, DSEOptions(bmax=args.bmax))
        times.append(time.perf_counter() - t0)
    figure = {
        "benchmark": "exhaustive DSE", "model": workload.name, "board": board.name, "bmax": args.bmax,
        "designs": result.n_designs, "layers": len(workload.layers()),
        "median_s": statistics.median(times), "runs_s": times,
        "design": [result.TR, result.TP, result.TC],
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    if args.json:
        print(json.dumps(figure, indent=1))
    else:
        print(f"DSE {workload.name} on {board.name}, Bmax={args.bmax}: {figure['median_s']:.2f} s median of "
              f"{args.repeat} ({result.n_designs} designs x {len(workload.layers())} layers, every <k, BR>), "
              f"best <{result.TR}, {result.TP}, {result.TC}>  [{figure['machine']}]")


if __name__ == "__main__":
    main()
