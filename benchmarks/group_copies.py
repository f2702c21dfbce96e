"""What giving every packed sample group its own copy of the weights costs in cycles.

The EngineCore has no replication network (docs/hw-architecture.md, "Giving every
group its weights"): in a pass of g packed groups the control unit reads each weight
row and bias chunk once per group, group q's read q*C words early. This prices the
DSE's designs (docs/figures/dse_designs.json: Fluid + Stackable PEs with exits) and
the paper's, with the model as it is and with those copies made free (every tile's
weights read once, as when a fabric network replicated them), FBCB re-chosen for
each, and prints GOp/s at b = 1 and b = 8 and how many layers pack groups.

    python benchmarks/group_copies.py [--json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fluidnpu.boards import load_board
from fluidnpu.dse import perf_model
from fluidnpu.dse.search import DSEOptions, evaluate_design
from fluidnpu.zoo import zoo_model

PAPER = {("resnet50", "zc706"): (4652, 7, 128), ("resnet50", "zcu104"): (6832, 10, 172),
         ("inceptionv3", "zc706"): (2742, 4, 225), ("inceptionv3", "zcu104"): (6832, 10, 172)}


@contextmanager
def free_copies() -> Iterator[None]:
    """Price every column tile as if its weights reached all groups with one read."""
    tile = perf_model.LayerCosts.tile
    perf_model.LayerCosts.tile = lambda self, w, groups=1: tile(self, w, 1)     # type: ignore[method-assign]
    try:
        yield
    finally:
        perf_model.LayerCosts.tile = tile                                         # type: ignore[method-assign]


def designs() -> list[tuple[str, str, str, tuple[int, int, int]]]:
    picks = json.loads(Path("docs/figures/dse_designs.json").read_text())
    out = [("DSE pick", d["model"], d["board"], (d["TR"], d["TP"], d["TC"])) for d in picks
           if d["scheme"] == "Fluid + Stackable PEs" and d["workload"] == "with exits"]
    return out + [("paper", m, b, trc) for (m, b), trc in PAPER.items()]


def packed_groups(trc: tuple[int, int, int], C: int, BR: int, k_code: int, serial: bool, b: int = 8) -> int:
    """Groups sharing a pass (g of docs/interpretations.md) for a layer run at batch b."""
    TCk = int(perf_model.mode_dims(*trc, k_code)[2])
    return 1 if serial or C > TCk else min(-(-b // BR), TCk // C)


def evaluate(model: str, board_name: str, trc: tuple[int, int, int]) -> dict[str, Any]:
    workload, board = zoo_model(model), load_board(board_name)
    row: dict[str, Any] = {"model": model, "board": board_name, "design": list(trc)}
    for label in ("copies", "free"):
        if label == "free":
            with free_copies():
                r = evaluate_design(workload, board, *trc, DSEOptions(bmax=8), allow_oversize=True)
        else:
            r = evaluate_design(workload, board, *trc, DSEOptions(bmax=8), allow_oversize=True)
        row[f"gops_{label}"] = [round(g, 1) for g in r.gops]
        row[f"cycles_{label}"] = r.total_cycles
        if label == "copies":
            row["packed_layers_b8"] = sum(packed_groups(trc, layer.C, r.plan.BR[li][7], r.plan.k_code[li][7],
                                                        r.plan.serial[li][7]) > 1
                                          for li, layer in enumerate(workload.layers()))
            row["layers"] = len(workload.layers())
    row["slowdown_b1"] = row["cycles_copies"][0] / row["cycles_free"][0] - 1
    row["slowdown_b8"] = row["cycles_copies"][7] / row["cycles_free"][7] - 1
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    rows = [{"which": which, **evaluate(m, b, trc)} for which, m, b, trc in designs()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    t = Table(title="per-group weight reads vs free replication (model, FBCB re-chosen)")
    for h in ("design", "model / board", "GOp/s b=1 copies / free", "GOp/s b=8 copies / free",
              "slower b=1", "slower b=8", "packed layers b=8"):
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(f"{r['which']} <{', '.join(map(str, r['design']))}>", f"{r['model']} {r['board']}",
                  f"{r['gops_copies'][0]} / {r['gops_free'][0]}", f"{r['gops_copies'][7]} / {r['gops_free'][7]}",
                  f"{r['slowdown_b1']:+.2%}", f"{r['slowdown_b8']:+.2%}", f"{r['packed_layers_b8']} / {r['layers']}")
    Console(width=180).print(t)


if __name__ == "__main__":
    main()
