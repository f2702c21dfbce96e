"""The `fluidnpu` command line.

User mistakes (FluidError, bad options) end with one line on stderr and exit
code 2; figures go to stdout as rich tables, or as JSON with --json.
"""

from __future__ import annotations

import json
from pathlib import Path
import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fluidnpu.errors import FluidError

# Piped or redirected output keeps whole tables rather than folding them at 80 columns.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1))


def load_model(model: str, exits: tuple[str, ...] = (), exit_rates: tuple[float, ...] | None = None):
    """A zoo model by name, or an ONNX file by path."""
    from fluidnpu.zoo import zoo_model

    if model.lower().endswith(".onnx"):
        from fluidnpu.onnx_import import load_onnx

        return load_onnx(model, exits=exits, exit_rates=exit_rates)
    if exits or exit_rates:
        raise FluidError("--exits/--exit-rates apply to ONNX models; zoo models carry their own exits")
    return zoo_model(model)


def _csv_floats(value: str | None, what: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        return tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise FluidError(f"{what} must be comma-separated numbers, got {value!r}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fluidnpu")
def cli() -> None:
    """fluidnpu: FPGA NPU co-design for serving early-exit DNNs."""


@cli.command()
@click.option("--model", "-m", required=True, help="resnet50, inceptionv3, or a path to an .onnx file")
@click.option("--board", "-b", required=True, help="zc706, zcu104, or a path to a board .json file")
@click.option("--bmax", default=8, show_default=True, type=int, help="largest batch size the NPU serves")
@click.option("--batching", default="fluid", show_default=True,
              type=click.Choice(["fluid", "r", "p", "fc"]), help="batching scheme the design is explored for")
@click.option("--no-stackable", is_flag=True, help="plain PEs only (k = 1)")
@click.option("--fixed-batch", type=int, default=None, help="optimise for this one batch size only (baselines)")
@click.option("--weights", default=None, help="w_b for b = 1..Bmax, comma-separated (default all 1)")
@click.option("--clock", type=float, default=None, help="PL clock in MHz (default: the board's)")
@click.option("--exits", default=None, help="ONNX only: comma-separated exit node/output names")
@click.option("--exit-rates", default=None, help="ONNX only: exit probabilities incl. the final exit")
@click.option("--ceiling", "ceilings", multiple=True, metavar="RES=SHARE",
              help="largest share of a resource (dsp, bram36, uram, lut, ff) a design may use, e.g. lut=0.9 or "
                   "lut=90%; repeatable (default: the board file's, else LUT/FF 80 %, the rest 100 %)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="write the design bundle here")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="write a GOp/s-vs-batch PNG here")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def dse(model: str, board: str, bmax: int, batching: str, no_stackable: bool, fixed_batch: int | None,
        weights: str | None, clock: float | None, exits: str | None, exit_rates: str | None,
        ceilings: tuple[str, ...], output: str | None, plot: str | None, as_json: bool) -> None:
    """Pick the best NPU design for MODEL on BOARD by exhaustive DSE (Eq. 2)."""
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions

    wl = load_model(model, tuple(x.strip() for x in exits.split(",")) if exits else (),
                    _csv_floats(exit_rates, "--exit-rates"))
    brd = load_board(board).with_ceilings(**parse_ceilings(ceilings))
    opts = DSEOptions(bmax=bmax, batching=batching, stackable=not no_stackable,
                      weights=_csv_floats(weights, "--weights"), fixed_batch=fixed_batch, clock_mhz=clock)
    result = explore_with_progress(wl, brd, opts, quiet=as_json)
    bundle = bundle_from_result(result)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        bundle.save(output)
    if plot:
        from fluidnpu.dse.report import plot_gops

        TR, TP, TC = bundle.design
        plot_gops({f"<{TR}, {TP}, {TC}> {batching}": result.gops}, result.peak_gops, plot,
                  f"{wl.name} on {brd.name}")
    summary = design_summary(bundle)
    if as_json:
        _emit_json(summary | {"bundle": output, "plot": plot})
        return
    print_summary(bundle)
    if output:
        out.print(f"design bundle written to [bold]{output}[/]")
    if plot:
        out.print(f"plot written to [bold]{plot}[/]")


def parse_ceilings(items: tuple[str, ...]) -> dict[str, float]:
    """`--ceiling lut=0.9 --ceiling ff=85%` -> {"lut": 0.9, "ff": 0.85} (validated by the Board)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            share = float("nan")
        if not sep or share != share:
            raise FluidError(f"--ceiling {item!r}: expected RESOURCE=SHARE, e.g. lut=0.9 or lut=90%")
        out[name.strip().lower()] = share
    return out


def explore_with_progress(wl: Any, brd: Any, opts: Any, quiet: bool = False) -> Any:
    """The exhaustive DSE with a progress bar on stderr (hidden when `quiet` and stderr is not a terminal)."""
    from fluidnpu.dse.search import explore

    opts.validate(brd)
    with Progress(TextColumn("[bold]DSE[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True, disable=quiet and not err.is_terminal) as prog:
        task = prog.add_task(f"{wl.name} on {brd.name}", total=None)

        def progress(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        return explore(wl, brd, opts, progress=progress)


def design_summary(bundle) -> dict[str, Any]:
    """The figures people look at, as a JSON-able dict."""
    d = bundle.data
    TR, TP, TC = bundle.design
    return {
        "model": bundle.workload.name, "board": bundle.board.name, "clock_mhz": bundle.clock_mhz,
        "bmax": bundle.bmax, "batching": d["dse"]["batching"], "stackable": d["dse"]["stackable"],
        "design": {"TR": TR, "TP": TP, "TC": TC},
        "designs_evaluated": d["dse"].get("designs_evaluated"), "dse_seconds": d["dse"].get("seconds"),
        "resources": d["resources"], "utilisation": d.get("utilisation", {}),
        "gops": d["performance"]["gops"], "peak_gops": d["performance"]["peak_gops"],
        "segment_latency_ms": [[s * 1e3 for s in row] for row in bundle.latency_table()],
        "exits": [{"name": e.name, "position": e.position, "rate": e.rate} for e in bundle.workload.exits],
    }


def print_summary(bundle) -> None:
    d = bundle.data
    TR, TP, TC = bundle.design
    util = d.get("utilisation", {})
    res = d["resources"]
    out.print(f"[bold]{bundle.workload.name}[/] on [bold]{bundle.board.name}[/] ({bundle.board.part}) at "
              f"{bundle.clock_mhz:g} MHz, batching={d['dse']['batching']}, "
              f"stackable={'yes' if d['dse']['stackable'] else 'no'}, Bmax={bundle.bmax}")
    if d["dse"].get("designs_evaluated"):
        out.print(f"best of {d['dse']['designs_evaluated']} designs in {d['dse']['seconds']:.2f} s: "
                  f"[bold green]<TR, TP, TC> = <{TR}, {TP}, {TC}>[/]")
    rt = Table(title="resources")
    for col in ("", "DSP", "BRAM36", "URAM", "LUT", "FF"):
        rt.add_column(col, justify="right")
    rt.add_row("used", str(res["dsp"]), f"{res['bram36']:g}", f"{res['uram']:g}", str(res["lut"]), str(res["ff"]))
    rt.add_row("of board", *(f"{100 * util.get(k, 0):.1f}%" for k in ("dsp", "bram36", "uram", "lut", "ff")))
    ceil = bundle.board.ceilings
    rt.add_row("ceiling", *(f"{100 * getattr(ceil, k):.0f}%" for k in ("dsp", "bram36", "uram", "lut", "ff")))
    out.print(rt)
    pt = Table(title=f"performance (peak {d['performance']['peak_gops']:.1f} GOp/s)")
    pt.add_column("batch", justify="right")
    pt.add_column("GOp/s", justify="right")
    pt.add_column("% peak", justify="right")
    for b, g in enumerate(d["performance"]["gops"], start=1):
        pt.add_row(str(b), f"{g:.1f}", f"{100 * g / d['performance']['peak_gops']:.1f}")
    out.print(pt)
    lt = Table(title="exit-segment latency (ms): the scheduler's Nexits x Bmax table")
    lt.add_column("segment")
    lt.add_column("exit rate", justify="right")
    for b in range(1, bundle.bmax + 1):
        lt.add_column(f"b={b}", justify="right")
    for ex, row in zip(bundle.workload.exits, bundle.latency_table()):
        lt.add_row(ex.name, f"{100 * ex.rate:.1f}%", *(f"{1e3 * s:.2f}" for s in row))
    out.print(lt)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def models(as_json: bool) -> None:
    """List the built-in models."""
    from fluidnpu.zoo import MODELS

    rows = []
    for name, build in MODELS.items():
        wl = build()
        rows.append({"name": name, "gemm_layers": len(wl.backbone), "gmac": wl.backbone_macs / 1e9,
                     "gmac_with_exit_heads": wl.total_macs / 1e9, "input_shape": list(wl.input_shape),
                     "exits": [{"name": e.name, "after": wl.backbone[e.position].name, "rate": e.rate}
                               for e in wl.exits]})
    if as_json:
        _emit_json(rows)
        return
    t = Table(title="built-in models (any .onnx file works too)")
    for col in ("model", "GEMM layers", "GMAC", "input", "exits (after layer: rate)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], str(r["gemm_layers"]), f"{r['gmac']:.3f}", "x".join(map(str, r["input_shape"])),
                  ", ".join(f"{e['after']}: {100 * e['rate']:.1f}%" for e in r["exits"]))
    out.print(t)


@cli.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def boards(name: str | None, as_json: bool) -> None:
    """List the built-in boards, or show one board's figures with their sources."""
    from fluidnpu.boards.catalog import board_sources, builtin_boards, load_board

    if name:
        brd = load_board(name)
        info = brd.to_dict() | {"bandwidth_gb_s": brd.bandwidth_bytes_per_s() / 1e9}
        sources = board_sources(brd.name) if brd.name in builtin_boards() else {}
        if as_json:
            _emit_json(info | {"sources": sources})
            return
        t = Table(title=f"{brd.name}: {brd.part}")
        t.add_column("figure")
        t.add_column("value [source]")
        for key, val in (sources or {k: str(v) for k, v in info.items()}).items():
            t.add_row(key, val)
        t.add_row("effective bandwidth", f"{info['bandwidth_gb_s']:.2f} GB/s at {brd.clock_mhz:g} MHz")
        out.print(t)
        return
    rows = [load_board(b) for b in builtin_boards()]
    if as_json:
        _emit_json([b.to_dict() | {"bandwidth_gb_s": b.bandwidth_bytes_per_s() / 1e9} for b in rows])
        return
    t = Table(title="built-in boards (copy boards/*.json for your own)")
    for col in ("board", "part", "DSP", "BRAM36", "URAM", "LUT", "FF", "clock MHz", "GB/s"):
        t.add_column(col, justify="right")
    for b in rows:
        t.add_row(b.name, b.part, str(b.dsp), str(b.bram36), str(b.uram), str(b.lut), str(b.ff),
                  f"{b.clock_mhz:g}", f"{b.bandwidth_bytes_per_s() / 1e9:.2f}")
    out.print(t)


@cli.command()
@click.argument("bundle_path", metavar="DESIGN.json")
@click.option("--layers", is_flag=True, help="also print every layer's FBCB entries and cycles")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def show(bundle_path: str, layers: bool, as_json: bool) -> None:
    """Show a design bundle written by `fluidnpu dse`."""
    from fluidnpu.bundle import load_bundle
    from fluidnpu.dse.perf_model import K_CODE_TO_K

    bundle = load_bundle(bundle_path)
    if as_json:
        summary = design_summary(bundle)
        if layers:
            summary["layers"] = [
                {"name": s.layer.name, "segment": s.segment, "R": s.layer.R, "P": s.layer.P, "C": s.layer.C,
                 "fbcb": [{"BR": e[0], "k": K_CODE_TO_K[e[1]]} for e in bundle.data["fbcb"]["entries"][s.index]],
                 "cycles": bundle.data["latency"]["layer_cycles"][s.index]}
                for s in bundle.workload.schedule()]
        _emit_json(summary)
        return
    print_summary(bundle)
    if layers:
        t = Table(title="FBCB <BR, k> per layer and batch size")
        t.add_column("#", justify="right")
        t.add_column("layer")
        t.add_column("R x P x C")
        for b in range(1, bundle.bmax + 1):
            t.add_column(f"b={b}", justify="right")
        for s in bundle.workload.schedule():
            cells = []
            for b in range(1, bundle.bmax + 1):
                e = bundle.fbcb(s.index, b)
                k = {1.0: "1", 2.0: "2", 0.5: "½"}[e.k]
                cells.append(f"{'S' if e.serial else e.BR},{k}")
            t.add_row(str(s.index), s.layer.name, f"{s.layer.R}x{s.layer.P}x{s.layer.C}", *cells)
        out.print(t)


# Commands of later stages live in their own modules, each exporting `commands`
# (a list of click commands); heavy imports stay inside the command bodies so
# the board-side CLI stays light.
_COMMAND_MODULES = (
    "fluidnpu.scheduler_fw.cli",
    "fluidnpu.hw.cli",
    "fluidnpu.hls_gen.cli",
    "fluidnpu.scheduler_fw.gpu.cli",
    "fluidnpu.scheduler_fw.fleet.cli",
    "fluidnpu.host_driver.cli",
    "fluidnpu.flow",
)


def _register_stage_commands() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        for command in module.commands:
            cli.add_command(command)


_register_stage_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors and exit code 2 for anything the user got wrong."""
    try:
        cli.main(args=argv, prog_name="fluidnpu", standalone_mode=False)
    except FluidError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
