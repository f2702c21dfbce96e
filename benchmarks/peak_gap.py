"""Where the DSE picks lose the board's DSP peak: every cycle of ResNet-50 at b = 4..8, by part.

The target is >= 88 % of the board's DSP peak at every b from 4 to 8. This run prices each pick's
layers with the performance model (the plan the DSE chose: each layer's <BR, k> at each b) and
splits the cycles into the parts of `perf_model.LayerParts`:

    ideal     cycles at 100 % MAC use (`ideal_cycles`): what the peak would take
    edges     the passes' blocks beyond ideal with unlimited DDR and port bandwidth and no limit on
              the DMA commands a cycle: partly filled arrays (P, C, R against TP, TC, TR), step overheads
    commands  the blocks' extra with one DMA command a cycle (the control unit's rate), bandwidth unlimited
    bandwidth the blocks' extra beyond that: steps waiting on the DDR or the AXI ports
    prologue  each layer's first step, fetched before anything computes
    drain     each layer's last block: pipeline fill and write-out after the last row
    regroup   waits where a pass changes its group count
    control   planning, descriptor reads, per-layer overhead

and the share of the board's peak the design would reach with each part removed. It answers what an
RTL change is worth before it is built (e.g. overlapping a layer's prologue with the previous
layer's drain). The parts sum to the DSE's own cycle counts (checked on every run).

Two more figures say what the bandwidth part is made of. `memory_floor_share`: the share of the board's
peak that no design could beat while layers share no data on chip -- each layer at full DSP use or
moving its compulsory traffic at the board's memory rate (`perf_model.memory_floor_cycles`).
`bandwidth_by_cause`: the bandwidth part split by what the layers' input reads repeat (`cause`):
kernel windows, column tiles, or nothing (a layer bound by the traffic it must move).
`line_buffer`: what reading each input pixel of a window layer once could buy beside this pick: a
buffer on chip holding every input word a block's rows touch (`block_input_words`), in the BRAM and
URAM the pick leaves free (`free_ram36`); the windows' part of the layers whose blocks fit, and the
share of the board peak with that part removed (an upper bound: the buffer's fill is not priced).
`line_buffer` also prices the fill (`buffer_fill_cycles`): each block's input read once from DDR at the
board's memory rate, hidden behind the previous block where two blocks' buffers fit (double-buffered:
only the layer's first fill waits), waited for block by block where only one fits -- and, for a
simpler buffer, waited for block by block everywhere (`single_buffered_board_peak_share`). `as_built`:
the buffer as hw/buffered_input.py builds it (two halves), each window layer whose two halves fit
buffered where the performance model (`FillShape`, calibrated on the RTL's buffered layers) says it
is faster, at the layer's own <BR, k>: the share of the board peak, the layers, the halves' RAM36
(`input_buffer_bram36`: the banks as the RTL builds them and Yosys maps them).

The parts are what-ifs on a fixed design; the DSE would choose another once a part is cheaper. So the
run also re-runs the DSE for each control unit of `WHAT_IFS` (`repicked`: a fetcher with one
command stream, walkers of two commands a cycle each, and one command per input row), and for each
lowering of `WORKLOAD_WHAT_IFS` (the stem not folded: what the fold buys), and reports each pick's share of
the board peak at every b.

    .venv/bin/python benchmarks/peak_gap.py --out docs/figures     # peak_gap.json and peak_gap.png
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from fluidnpu.boards import load_board
from fluidnpu.dse.perf_model import Bus, ideal_cycles, layer_parts, memory_floor_cycles, row_blocks
from fluidnpu.dse.resource_model import bram36_for, input_buffer_bram36
from fluidnpu.dse.search import (
    Choice,
    DSEOptions,
    LayerShapes,
    buffered_modes,
    choice_setup,
    evaluate_design,
    explore,
    k_codes,
    modes_of,
)
from fluidnpu.hw.regmap import fill_regions
from fluidnpu.workload import Workload
from fluidnpu.zoo import zoo_model

PARTS = ("ideal", "edges", "commands", "bandwidth", "prologue", "drain", "regroup", "control")


def gap(model: str, board_name: str, bmax: int = 8, batches: range = range(4, 9),
        design: tuple[int, int, int, DSEOptions] | None = None) -> dict[str, Any]:
    """The pick of `model` on `board_name` and its cycles by part at each b in `batches`; `design`
    (TR, TP, TC, options): that design instead of the DSE's pick."""
    board = load_board(board_name)
    r = (explore(zoo_model(model), board, DSEOptions(bmax=bmax)) if design is None
         else evaluate_design(zoo_model(model), board, *design))
    layers = r.workload.layers()
    shapes = LayerShapes.of(layers)
    TR, TP, TC = (np.array([[v]]) for v in (r.TR, r.TP, r.TC))
    bus, timing = board.bus(r.clock_mhz, r.ports), r.options.timing
    ks = k_codes(r.options.given_stackable())
    fast_bus = Bus.of(1e12, bus.port_bytes, ports=r.ports)
    free_bus = Bus.of(1e12, bus.port_bytes, ports=r.ports, command_cycles=0.0)
    # each layer at its plan's choice: from DDR, or buffered where the pick's plan buffers it
    modes, unlimited, free = ({**modes_of(TP, TC, shapes, ks, x, timing),
                               **buffered_modes(TP, TC, shapes, ks, x, timing)} for x in (bus, fast_bus, free_bus))
    buffered_modes_ = modes_of(TP, TC, shapes, ks, bus, timing, fill=shapes.fills(r.TP, r.TC))
    board_peak = 2.0 * board.dsp * r.clock_mhz * 1e6 / 1e9
    memory_rate = board.bytes_per_cycle(r.clock_mhz)
    rows = []
    for b in batches:
        total = dict.fromkeys(PARTS, 0.0)
        by_cause = dict.fromkeys(CAUSES, 0.0)
        buffered, too_big, largest = 0.0, {}, 0.0   # windows' cycles of the layers whose blocks fit
        priced, kinds = 0.0, {"double": 0, "single": 0}     # what a buffer saves with its fill priced
        single_priced = 0.0                                  # ... a buffer never double-buffered
        built, built_layers, built_ram = 0.0, 0, 0.0         # the buffer as built, priced by the model
        ram_free = free_ram36(r, board)
        floor = 0.0
        for li in range(len(layers)):
            ch = Choice(r.plan.BR[li][b - 1], r.plan.k_code[li][b - 1], r.plan.serial[li][b - 1],
                        buffered=bool(r.plan.buffered) and r.plan.buffered[li][b - 1])
            n = b if ch.serial else 1
            setup = choice_setup(modes, shapes, b, ch, r.NB)
            p = layer_parts(setup, TR)
            G = float(setup.G[0, li])
            fast = choice_setup(unlimited, shapes, b, ch, r.NB)
            body_fast = G * float(layer_parts(fast, TR).body[0, li]) * n
            freed = choice_setup(free, shapes, b, ch, r.NB)
            body_free = G * float(layer_parts(freed, TR).body[0, li]) * n
            ideal = float(ideal_cycles(shapes.R[0, li], shapes.P[0, li], shapes.C[0, li], shapes.G[0, li], b,
                                       r.TP, r.TC))
            cycles = float(p.cycles(setup)[0, li]) * n
            assert abs(cycles - r.plan.cycles[li][b - 1]) < 1, (layers[li].name, b, cycles)
            part = {"body": G * float(p.body[0, li]) * n, "prologue": G * float(p.prologue[0, li]) * n,
                    "drain": G * float(p.drain[0, li]) * n, "regroup": G * float(p.regroup[0, li]) * n}
            total["ideal"] += ideal
            total["edges"] += body_free - ideal
            total["commands"] += body_fast - body_free
            total["bandwidth"] += part["body"] - body_fast
            why = cause(layers[li], r.TC)
            extra = part["body"] - body_fast               # the bandwidth part of this layer
            by_cause[why] += extra
            if why == "windows" and not ch.buffered:      # the what-ifs of a buffer beside a layer read from DDR
                rb = row_blocks(setup, TR)
                words = buffer_words(layers[li], setup, rb, li)
                need = float(bram36_for(np.ceil(words / r.TP), 16 * r.TP))
                if need <= ram_free:
                    buffered += extra
                    largest = max(largest, need)
                    blocks = blocks_of(setup, rb, li) * G * n
                    double = 2 * need <= ram_free
                    waits = buffer_fill_cycles(words, blocks, body_fast, double, memory_rate)
                    if waits < extra:
                        priced += extra - waits
                        kinds["double" if double else "single"] += 1
                    single_priced += max(0.0, extra - buffer_fill_cycles(words, blocks, body_fast, False, memory_rate))
                    halves = input_buffer_bram36(r.TP, words)      # both, as the RTL builds them
                    if halves <= ram_free:     # hw/buffered_input.py, the layer buffered where it pays
                        bset = choice_setup(buffered_modes_, shapes, b, replace(ch, buffered=False), r.NB)
                        saved = cycles - float(layer_parts(bset, TR).cycles(bset)[0, li]) * n
                        if saved > 0:
                            built += saved
                            built_layers += 1
                            built_ram = max(built_ram, halves)
                else:
                    too_big[layers[li].name] = need
            floor += memory_floor_cycles(layers[li], b, board.dsp, memory_rate)
            for k in ("prologue", "drain", "regroup"):
                total[k] += part[k]
            total["control"] += cycles - sum(part.values())
        cycles = sum(total.values())
        gops = 2.0 * b * r.workload.total_macs * r.clock_mhz * 1e6 / cycles / 1e9
        rows.append({"b": b, "cycles": cycles, "gops": gops, "board_peak_share": gops / board_peak,
                     "shares": {k: v / cycles for k, v in total.items()},
                     "without": {k: gops * cycles / (cycles - total[k]) / board_peak for k in PARTS[1:]},
                     "bandwidth_by_cause": {k: v / cycles for k, v in by_cause.items()},
                     "line_buffer": {"free_ram36": ram_free, "windows_covered": buffered / cycles,
                                     "board_peak_share_without": gops * cycles / (cycles - buffered) / board_peak,
                                     "largest_fitting_ram36": largest, "too_big_ram36": too_big,
                                     "fill_priced": {"windows_saved": priced / cycles,
                                                     "board_peak_share": gops * cycles / (cycles - priced) / board_peak,
                                                     "layers": kinds,
                                                     "single_buffered_board_peak_share":
                                                         gops * cycles / (cycles - single_priced) / board_peak},
                                     "as_built": {"board_peak_share": gops * cycles / (cycles - built) / board_peak,
                                                  "layers": built_layers, "ram36": built_ram}},
                     "memory_floor_share": b * r.workload.total_macs / (floor * board.dsp)})
    return {"model": model, "board": board_name, "design": [r.TR, r.TP, r.TC], "NB": r.NB, "ports": r.ports,
            "stackable": r.options.given_stackable(), "board_peak_gops": board_peak,
            "design_peak_share": r.TP * r.TC / board.dsp, "rows": rows}


def block_input_words(layer: Any, b: int, t: int) -> int:
    """The most input words (all channels) any block of t output pixels touches, the blocks cut from the b
    samples' pixels in raster order: for each sample a block reaches, the input rows its output rows'
    windows cover, whole. What an on-chip buffer must hold to read each input pixel of the block once
    (the fetcher's steps revisit every row of the block, so a rolling buffer of kh rows would not do)."""
    (kh, _), (sh, _), (dh, _), ph = layer.kernel, layer.stride, layer.dilation, layer.pads[0]
    (h, w), (hi, wi) = layer.out_hw, layer.in_hw
    npix = h * w
    return max(sum(words for _, _, words in fill_regions(w, h, hi, sh, (kh - 1) * dh + 1, ph, wi * layer.in_ch,
                                                         start // npix, start % npix, t, b))
               for start in range(0, b * npix, t))


def buffer_words(layer: Any, setup: Any, rb: Any, li: int) -> int:
    """The words a block's input buffer holds in this layer's mode and split (`rb`: its `row_blocks`):
    each of a full pass's g groups (BR samples each) brings the input its largest block of rows touches."""
    at = np.broadcast_to
    g, t = int(at(setup.g, rb.exists.shape)[0, li]), int(at(rb.t0_first, rb.exists.shape)[0, li])
    split = int(np.max(setup.BR))
    return g * block_input_words(layer, min(split, setup.b), t)


def blocks_of(setup: Any, rb: Any, li: int) -> int:
    """How many blocks the layer runs (per convolution group; `rb`: its `row_blocks`): every column tile
    walks every pass's blocks."""
    per_tile = (setup.npass - 1) * rb.full[0] + rb.last[0]
    n = setup.mode.nct * per_tile
    return int(np.broadcast_to(n, rb.exists.shape)[0, li])


def buffer_fill_cycles(words: int, blocks: int, body: float, double: bool, bytes_per_cycle: float,
                       word_bytes: int = 2) -> float:
    """Cycles a layer waits on its input buffer's fill: every block's input (`words`, an upper bound per
    block) read once from DDR. Double-buffered, the next block's fill runs behind the current block's
    steps (`body` / `blocks` cycles each), so the layer waits on its first fill and on any fill longer
    than a block; single-buffered it waits on every fill."""
    fill = words * word_bytes / bytes_per_cycle
    if not double:
        return blocks * fill
    return fill + (blocks - 1) * max(0.0, fill - body / blocks)


def free_ram36(r: Any, board: Any) -> float:
    """BRAM36 the pick leaves free, URAMs counted as the 8 BRAM36 of data each holds (288 Kb)."""
    return (board.bram36 - r.resources.bram36) + 8 * (board.uram - r.resources.uram)


CAUSES = ("windows", "column tiles", "one read")
"""Why a layer's steps wait on memory (`cause`): the bandwidth part split by what its input reads repeat."""


def cause(layer: Any, TC: int) -> str:
    """What a layer's input reads repeat: "windows" -- a kernel of more than one tap reads each input
    pixel once for every window over it (the fetcher walks im2col rows); "column tiles" -- a 1x1 or FC
    layer of more output channels than TC reads its input once a column tile; "one read" -- the input
    is read once, so the layer is bound by the traffic it must move (`memory_floor_cycles`)."""
    if layer.kernel[0] * layer.kernel[1] > 1:
        return "windows"
    return "column tiles" if layer.C > TC else "one read"


WHAT_IFS: dict[str, dict[str, Any]] = {
    "the RTL (two walkers side by side, one command a run)": {},
    "one walker (weights, then inputs, on one stream)": {"walkers": 1},
    "two walkers, each 2 commands a cycle": {"command_cycles": 0.5},
    "two walkers + one command per input row (gather)": {"gather": True},
}
"""Control units the re-picked what-ifs price: `Bus` fields over the RTL's (dse/perf_model.py)."""


def plain_stem(workload: Workload) -> Workload:
    """The workload with its first layer as the network defines it, not folded (fluidnpu/lowering.py)."""
    if workload.stem is None:
        return workload
    return replace(workload, backbone=(workload.stem,) + workload.backbone[1:], stem=None)


WORKLOAD_WHAT_IFS: dict[str, Callable[[Workload], Workload]] = {
    "the RTL, the stem not folded": plain_stem,
}
"""Workloads the re-picked what-ifs price on the RTL's control unit: the same network lowered otherwise."""


def repicked(model: str, board_name: str, bus_fields: dict[str, Any], bmax: int = 8,
             lowered: Callable[[Workload], Workload] | None = None) -> dict[str, Any]:
    """The DSE's pick and its share of the board peak at b = 1..bmax if the control unit were the one
    `bus_fields` describes (every bus the search prices gets those `Bus` fields), or the network were
    `lowered` (its shares count the network's own MACs, not the lowered one's)."""
    board = load_board(board_name)
    cls = type(board)
    rtl_bus = cls.bus

    def bus(self: Any, clock_mhz: float | None = None, ports: int | None = None) -> Bus:
        return replace(rtl_bus(self, clock_mhz, ports), **bus_fields)

    workload = zoo_model(model)
    run = lowered(workload) if lowered else workload
    with mock.patch.object(cls, "bus", bus):
        r = explore(run, board, DSEOptions(bmax=bmax))
    board_peak = 2.0 * board.dsp * r.clock_mhz * 1e6 / 1e9
    useful = workload.total_macs / run.total_macs
    return {"model": model, "board": board_name, "bus": bus_fields, "design": [r.TR, r.TP, r.TC],
            "NB": r.NB, "ports": r.ports, "stackable": r.options.given_stackable(),
            "board_peak_share": [g * useful / board_peak for g in r.gops]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--boards", default="zc706,zcu104")
    ap.add_argument("--out", help="folder for peak_gap.json and peak_gap.png")
    args = ap.parse_args()
    out = [gap(args.model, name) for name in args.boards.split(",")]
    what_if = [dict(repicked(args.model, name, fields), what_if=label)
               for label, fields in WHAT_IFS.items() for name in args.boards.split(",")]
    what_if += [dict(repicked(args.model, name, {}, lowered=fn), what_if=label)
                for label, fn in WORKLOAD_WHAT_IFS.items() for name in args.boards.split(",")]
    print("| pick | b | share of board peak | " + " | ".join(PARTS[1:]) + " | share of board peak without "
          "bandwidth / commands / edges / prologue + drain |")
    print("|---" * (len(PARTS) + 3) + "|")
    for g in out:
        for row in g["rows"]:
            s, w = row["shares"], row["without"]
            both = row["board_peak_share"] / (1 - s["prologue"] - s["drain"])
            print(f"| {args.model} / {g['board']} <{', '.join(map(str, g['design']))}> | {row['b']} "
                  f"| {100 * row['board_peak_share']:.1f} % | "
                  + " | ".join(f"{100 * s[k]:.1f} %" for k in PARTS[1:])
                  + f" | {100 * w['bandwidth']:.1f} / {100 * w['commands']:.1f} / {100 * w['edges']:.1f} / "
                    f"{100 * both:.1f} % |")
    print()
    print("| pick | b | share of board peak | memory floor | bandwidth part: " + " / ".join(CAUSES) + " |")
    print("|---|---|---|---|---|")
    for g in out:
        for row in g["rows"]:
            c = row["bandwidth_by_cause"]
            print(f"| {args.model} / {g['board']} <{', '.join(map(str, g['design']))}> | {row['b']} "
                  f"| {100 * row['board_peak_share']:.1f} % | {100 * row['memory_floor_share']:.1f} % | "
                  + " / ".join(f"{100 * c[k]:.1f}" for k in CAUSES) + " % |")
    print()
    print("| pick | b | RAM36 free | largest block that fits (RAM36) | windows' part in blocks that fit / all "
          "| board peak without it | with the fill priced (layers double / single-buffered) | single-buffered "
          "| as built, by the model (layers, RAM36) | blocks too big (RAM36) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for g in out:
        for row in g["rows"]:
            lb, big = row["line_buffer"], row["line_buffer"]["too_big_ram36"]
            fp = lb["fill_priced"]
            print(f"| {args.model} / {g['board']} <{', '.join(map(str, g['design']))}> | {row['b']} "
                  f"| {lb['free_ram36']:.0f} | {lb['largest_fitting_ram36']:.0f} | {100 * lb['windows_covered']:.1f} / "
                  f"{100 * row['bandwidth_by_cause']['windows']:.1f} % | {100 * lb['board_peak_share_without']:.1f} % "
                  f"| {100 * fp['board_peak_share']:.1f} % ({fp['layers']['double']} / {fp['layers']['single']}) "
                  f"| {100 * fp['single_buffered_board_peak_share']:.1f} % "
                  f"| {100 * lb['as_built']['board_peak_share']:.1f} % ({lb['as_built']['layers']}, "
                  f"{lb['as_built']['ram36']:.0f}) "
                  f"| {', '.join(f'{k} {v:.0f}' for k, v in sorted(big.items(), key=lambda kv: -kv[1])[:3]) or '-'}"
                  + (f" (+{len(big) - 3})" if len(big) > 3 else "") + " |")
    print()
    print("| control unit, DSE re-run | pick | PEs, NB, P | share of board peak b = 1..8 | min over b = 4..8 |")
    print("|---|---|---|---|---|")
    for w in what_if:
        share = w["board_peak_share"]
        print(f"| {w['what_if']} | {args.model} / {w['board']} <{', '.join(map(str, w['design']))}> "
              f"| {'Stackable' if w['stackable'] else 'plain'}, {w['NB']}, {w['ports']} | "
              + " / ".join(f"{100 * x:.1f}" for x in share) + f" % | {100 * min(share[3:8]):.1f} % |")
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "peak_gap.json").write_text(json.dumps(out, indent=1))
        (folder / "peak_gap_repicked.json").write_text(json.dumps(what_if, indent=1))
        plot(out, folder / "peak_gap.png")


def plot(out: list[dict[str, Any]], path: Path) -> None:
    """Stacked shares of the cycles per pick and b: what each part costs against the peak."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(out), figsize=(5 * len(out), 4), sharey=True, squeeze=False)
    for ax, g in zip(axes[0], out):
        bs = [row["b"] for row in g["rows"]]
        bottom = np.zeros(len(bs))
        for k in PARTS:
            v = np.array([100 * row["shares"][k] for row in g["rows"]])
            ax.bar(bs, v, bottom=bottom, label=k)
            bottom += v
        ax.set_title(f"{g['model']} / {g['board']} <{', '.join(map(str, g['design']))}>")
        ax.set_xlabel("batch size b")
    axes[0][0].set_ylabel("% of the cycles")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

if __name__ == "__main__":
    main()
