"""From a model and a board to a design bundle: the library under `fluidnpu dse` and `fluidnpu flow`.

Either the exhaustive DSE picks the design (`explore_with_progress`), or the user names one
(`evaluate_given`, `fluidnpu dse --design TR,TP,TC`): the same code then computes its resources, FBCB
and latency tables, so the bundle is as consistent as a searched one — or the design is refused in
one line naming the resource it exceeds and by how much.
"""

from __future__ import annotations

from typing import Any

from fluidnpu.errors import FluidError


def load_model(model: str, exits: tuple[str, ...] = (), exit_rates: tuple[float, ...] | None = None) -> Any:
    """A zoo model by name, or an ONNX file by path; its stem folded where it folds (fluidnpu/lowering.py), as
    the NPU runs it."""
    from fluidnpu.zoo import zoo_model

    if model.lower().endswith(".onnx"):
        from fluidnpu.lowering import fold_stem
        from fluidnpu.onnx_import import load_onnx

        return fold_stem(load_onnx(model, exits=exits, exit_rates=exit_rates))
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


def parse_share(text: str, what: str) -> float:
    """'0.9' or '90%' as a share (0.9); a clear one-line error naming the option `what` otherwise."""
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        share = float("nan")
    if share != share:
        raise FluidError(f"{what}: expected a share, e.g. 0.9 or 90%, got {text!r}")
    return share


def parse_ceilings(items: tuple[str, ...]) -> dict[str, float]:
    """`--ceiling lut=0.9 --ceiling ff=85%` -> {"lut": 0.9, "ff": 0.85} (validated by the Board)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise FluidError(f"--ceiling {item!r}: expected RESOURCE=SHARE, e.g. lut=0.9 or lut=90%")
        out[name.strip().lower()] = parse_share(value, f"--ceiling {item!r}")
    return out


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


def evaluate_given(wl: Any, brd: Any, opts: Any, design: tuple[int, int, int]) -> Any:
    """The DSE result of exactly `design` on `brd` (no search), or a one-line FluidError naming the
    resource it exceeds and by how much (`over_limits`, the DSE's own test)."""
    from fluidnpu.dse.search import evaluate_design

    try:
        return evaluate_design(wl, brd, *design, opts)
    except FluidError as exc:
        if "does not fit" not in str(exc):
            raise
        raise FluidError(f"{exc} (run `fluidnpu dse` without --design for the best design that fits)") from None
