"""Benchmark: the whole exhaustive DSE (every <TR, TP, TC> that fits, scored or bounded) with Bmax 8.

Targets: ResNet-50 on ZC706 under 10 s on a 2-core machine (the spaces are
searched by forked workers, one per core, dse/search.py `explore`), and the small models on both
boards each under 10 s (`digits-ee` and the two-exit ONNX CNN of
docs/examples/ee_cnn_onnx.py, layers small against the array). Runs the four zoo model/board
pairs of docs/dse.md by default, the small-model pairs with --small (or one with --model/--board;
a model is a zoo name or a .onnx path), prints the median of --repeat runs per pair, the designs
that fit, how many were scored exactly, the pick, the CPU time (user + sys, workers included:
the figure a shared machine disturbs least) and the machine.

    python benchmarks/bench_dse.py [--repeat 3] [--small] [--model resnet50 --board zc706] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fluidnpu.boards import load_board
from fluidnpu.design import load_model
from fluidnpu.dse.search import DSEOptions, explore

PAIRS = (("resnet50", "zc706"), ("resnet50", "zcu104"), ("inceptionv3", "zc706"), ("inceptionv3", "zcu104"))
EE_CNN = "ee_cnn.onnx"   # docs/examples/ee_cnn_onnx.py's model, written to a temporary folder
SMALL = (("digits-ee", "zc706"), ("digits-ee", "zcu104"), (EE_CNN, "zc706"), (EE_CNN, "zcu104"))


def cpu_seconds() -> float:
    """User + sys time of this process and its reaped children (the search's forked workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def model_path(model: str, folder: Path) -> str:
    """A zoo name as it is; EE_CNN written by docs/examples/ee_cnn_onnx.py into `folder`."""
    if model != EE_CNN:
        return model
    path = folder / EE_CNN
    if not path.exists():
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "examples"))
        import onnx
        from ee_cnn_onnx import build

        onnx.save(build(), path)
    return str(path)


def bench(model: str, board_name: str, bmax: int, repeat: int) -> dict:
    # the ONNX CNN with its early exit, as docs/examples/ee_cnn_onnx.py's docstring runs it
    exits = (("exit1_logits",), (0.4, 0.6)) if Path(model).name == EE_CNN else ((), None)
    workload, board = load_model(model, *exits), load_board(board_name)
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), cpu_seconds()
        result = explore(workload, board, DSEOptions(bmax=bmax))
        times.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds() - c0)
    return {
        "benchmark": "exhaustive DSE", "model": workload.name, "board": board.name, "bmax": bmax,
        "designs": result.n_designs, "scored": result.n_scored, "layers": len(workload.layers()),
        "median_s": statistics.median(times), "runs_s": times, "cpu_s": statistics.median(cpu),
        "design": [result.TR, result.TP, result.TC], "NB": result.NB, "ports": result.ports,
        "stackable": result.options.stackable, "bram36": result.resources.bram36,
        "gops": [round(g, 2) for g in result.gops],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="one model, a zoo name or a .onnx path (default: the four pairs)")
    ap.add_argument("--small", action="store_true", help="the small-model pairs (digits-ee, the ONNX CNN)")
    ap.add_argument("--board")
    ap.add_argument("--bmax", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pairs = (SMALL if args.small else PAIRS) if args.model is None and args.board is None else \
        ((args.model or "resnet50", args.board or "zc706"),)
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as folder:
        figures = [bench(model_path(model, Path(folder)), board, args.bmax, args.repeat) for model, board in pairs]
    if args.json:
        print(json.dumps({"machine": machine, "runs": figures}, indent=1))
        return
    for f in figures:
        print(f"DSE {f['model']} on {f['board']}, Bmax={f['bmax']}: {f['median_s']:.2f} s median of {args.repeat} "
              f"(CPU {f['cpu_s']:.2f} s) "
              f"({f['designs']:,} designs fit, {f['scored']:,} scored, the rest bounded; {f['layers']} layers, "
              f"every <k, BR>), best <{', '.join(map(str, f['design']))}> "
              f"({'Stackable' if f['stackable'] else 'plain'} PEs, NB {f['NB']}, {f['ports']} AXI ports), "
              f"{f['bram36']:g} BRAM36")
    print(f"[{machine}]")


if __name__ == "__main__":
    main()
