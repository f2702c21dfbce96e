"""From a model and a board to a design bundle: the library under `fluidnpu dse` and `fluidnpu flow`.

Either the exhaustive DSE picks the design (`explore_with_progress`), or the user names one
(`evaluate_given`, `fluidnpu dse --design TR,TP,TC`): the same code then computes its resources, FBCB
and latency tables, so the bundle is as consistent as a searched one — or the design is refused in
one line naming the resource it exceeds and by how much.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fluidnpu.errors import FluidError


def load_model(model: str, exits: tuple[str, ...] = (), exit_rates: tuple[float, ...] | None = None) -> Any:
    """A zoo model by name, or an ONNX file by path."""
    from fluidnpu.zoo import zoo_model

    if model.lower().endswith(".onnx"):
        from fluidnpu.onnx_import import load_onnx

        return load_onnx(model, exits=exits, exit_rates=exit_rates)
    if exits or exit_rates:
        raise FluidError("--exits/--exit-rates apply to ONNX models; zoo models carry their own exits")
    return zoo_model(model)


def explore_with_progress(wl: Any, brd: Any, opts: Any, quiet: bool = False) -> Any:
    """The exhaustive DSE with a progress bar on stderr (hidden when `quiet` and stderr is not a terminal)."""
    from fluidnpu.dse.search import explore
    from fluidnpu.output import err, progress_bar

    opts.validate(brd)
    with progress_bar(err, quiet, "[bold]DSE[/] {task.description}") as prog:
        task = prog.add_task(f"{wl.name} on {brd.name}", total=None)

        def progress(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        return explore(wl, brd, opts, progress=progress)


def parse_design(text: str) -> tuple[int, int, int]:
    """'TR,TP,TC' (as `--design` takes it) as three positive integers."""
    parts = [p.strip() for p in text.replace("<", "").replace(">", "").split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise FluidError(f"--design takes three positive integers TR,TP,TC (e.g. 4652,7,128), got {text!r}")
    return values[0], values[1], values[2]


def fit_report(TR: int, TP: int, TC: int, board: Any, bmax: int, n_layers: int, stackable: bool) -> list[str]:
    """What design <TR, TP, TC> exceeds on `board`, one phrase per resource ('' list: it fits).

    The same figures `feasible_designs` tests (DSPs, then on-chip memory and logic), with the amount."""
    from fluidnpu.dse.resource_model import design_resources

    res = design_resources(TR, TP, TC, board, bmax, n_layers, stackable)
    used = res.to_dict()
    over = []
    for key, label in (("dsp", "DSPs"), ("bram36", "BRAM36"), ("uram", "URAM"), ("lut", "LUTs"), ("ff", "FFs")):
        have = float(getattr(board, key))
        need = float(used[key])
        if not np.isfinite(need):
            if key == "bram36":
                over.append(_memory_shortfall(TR, TP, TC, board, bmax))
        elif need > have:
            over.append(f"{label}: needs {need:g} of {have:g} ({need - have:g} over, {100 * need / have:.0f} %)"
                        if have else f"{label}: needs {need:g}, {board.name} has none")
    return over


def _memory_shortfall(TR: int, TP: int, TC: int, board: Any, bmax: int) -> str:
    """The on-chip buffers' need when no BRAM/URAM placement fits (reported as all in BRAM36)."""
    from fluidnpu.dse.resource_model import bram36_for, memories

    need = float(sum(count * bram36_for(depth, width) for _, count, depth, width in memories(TR, TP, TC, bmax)))
    have = float(board.bram36)
    extra = f" (nor in BRAM36 + {board.uram:g} URAM)" if board.uram else ""
    return (f"on-chip buffers: need {need:g} BRAM36 of {have:g} ({need - have:g} over, "
            f"{100 * need / max(have, 1):.0f} %){extra}")


def evaluate_given(wl: Any, brd: Any, opts: Any, design: tuple[int, int, int]) -> Any:
    """The DSE result of exactly `design` on `brd` (no search), or a one-line FluidError naming the
    resource it exceeds and by how much."""
    from fluidnpu.dse.resource_model import feasible_designs
    from fluidnpu.dse.search import evaluate_design

    opts.validate(brd)
    TR, TP, TC = design
    n_layers = len(wl.layers())
    if not feasible_designs(np.array(TR), np.array(TP), np.array(TC), brd, opts.bmax, n_layers, opts.stackable):
        over = fit_report(TR, TP, TC, brd, opts.bmax, n_layers, opts.stackable)
        why = "; ".join(over) if over else "the resource model refuses it"
        raise FluidError(f"design <{TR}, {TP}, {TC}> does not fit {brd.name} at Bmax {opts.bmax}: {why} "
                         "(run `fluidnpu dse` without --design for the best design that fits)")
    return evaluate_design(wl, brd, TR, TP, TC, opts)
