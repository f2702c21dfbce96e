"""The `fluidnpu` command line.

User mistakes (FluidError, bad options) end with one line on stderr and exit
code 2; figures go to stdout as rich tables, or as JSON with --json.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console  # noqa: F401  (tests build their own consoles through cli.Console)
from rich.markup import escape
from rich.table import Table

from fluidnpu.design import evaluate_given, explore_with_progress, load_model, parse_ceilings, parse_design, parse_share
from fluidnpu.errors import FluidError
from fluidnpu.output import MAX_BATCH, MAX_SAMPLES, FloatRange, check_writable, emit_json, err, os_error_message, out
from fluidnpu.tables import print_table

_emit_json = emit_json  # for callers of this module's private name; fluidnpu.output.emit_json is the one


def _csv_floats(value: str | None, what: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        values = tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
        values = (math.nan,)
    if not all(map(math.isfinite, values)):
        raise FluidError(f"{what} must be comma-separated finite numbers, got {value!r}")
    return values


class _Interrupted(BaseException):
    """KeyboardInterrupt once the command has unwound: click turns a KeyboardInterrupt into Abort after
    printing an empty line, and main() reports the interruption in one line of its own."""


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fluidnpu")
def cli() -> None:
    """fluidnpu: FPGA NPU co-design for serving early-exit DNNs."""


@cli.command()
@click.option("--model", "-m", required=True, help="resnet50, inceptionv3, or a path to an .onnx file")
@click.option("--board", "-b", required=True, help="zc706, zcu104, or a path to a board .json file")
@click.option("--bmax", default=8, show_default=True, type=click.IntRange(min=1),
              help="largest batch size the NPU serves")
@click.option("--batching", default="fluid", show_default=True,
              type=click.Choice(["fluid", "r", "p", "fc"]), help="batching scheme the design is explored for")
@click.option("--stackable/--no-stackable", default=None,
              help="build Stackable PEs (k = 2 and 1/2 besides 1) or plain PEs only (k = 1) "
                   "(default: searched, both priced)")
@click.option("--fixed-batch", type=click.IntRange(1, MAX_BATCH), default=None,
              help="optimise for this one batch size only (baselines)")
@click.option("--weights", default=None, help="w_b for b = 1..Bmax, comma-separated (default all 1)")
@click.option("--clock", type=FloatRange(min=0, min_open=True), default=None,
              help="PL clock in MHz (default: the board's)")
@click.option("--exits", default=None, help="ONNX only: comma-separated exit node/output names")
@click.option("--exit-rates", default=None, help="ONNX only: exit probabilities incl. the final exit")
@click.option("--ceiling", "ceilings", multiple=True, metavar="RES=SHARE",
              help="largest share of a resource (dsp, bram36, uram, lut, ff) a design may use, e.g. lut=0.9 or "
                   "lut=90%; repeatable (default: the board file's, else LUT/FF 80 %, the rest 100 %)")
@click.option("--min-dsp", default=None, metavar="SHARE",
              help="search only designs using at least this share of the board's DSPs, e.g. 0.98 or 98% "
                   "(default: any; the pick maximises Eq. 2's GOp/s)")
@click.option("--design", "given", default=None, metavar="TR,TP,TC",
              help="evaluate exactly this design (no search): its resources, FBCB and tables, or why it does not fit")
@click.option("--banks", type=click.Choice(["2", "4", "8", "16", "32", "64"]), default=None,
              help="input banks NB (power of two, at most Bmax rounded up): the most groups a pass packs "
                   "(default: searched; with --design, the count that fits and scores best)")
@click.option("--ports", type=click.IntRange(1, 64), default=None,
              help="AXI master ports P, 1 .. the board's HP ports: more buy memory bandwidth (up to the DDR's) "
                   "and cost LUTs (default: searched; with --design, the count that fits and scores best)")
@click.option("--input-buffer/--no-input-buffer", "buffer", default=None,
              help="build a block input buffer, which each layer may read its input runs from at each batch size "
                   "(default: searched, both priced)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="write the design bundle here")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="write a GOp/s-vs-batch PNG here")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def dse(model: str, board: str, bmax: int, batching: str, stackable: bool | None, fixed_batch: int | None,
        weights: str | None, clock: float | None, exits: str | None, exit_rates: str | None,
        ceilings: tuple[str, ...], min_dsp: str | None, given: str | None, banks: str | None, ports: int | None,
        buffer: bool | None, output: str | None, plot: str | None, as_json: bool) -> None:
    """Pick the best NPU design for MODEL on BOARD by exhaustive DSE (Eq. 2), or evaluate the one --design names."""
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result, design_summary
    from fluidnpu.dse.search import DSEOptions

    design = parse_design(given) if given else None
    for path, what in ((output, "design bundle"), (plot, "plot")):
        if path:
            check_writable(path, what)
    wl = load_model(model, tuple(x.strip() for x in exits.split(",")) if exits else (),
                    _csv_floats(exit_rates, "--exit-rates"))
    brd = load_board(board).with_ceilings(**parse_ceilings(ceilings))
    opts = DSEOptions(bmax=bmax, batching=batching, stackable=stackable,
                      weights=_csv_floats(weights, "--weights"), fixed_batch=fixed_batch, clock_mhz=clock,
                      banks=int(banks) if banks else None, ports=ports, buffer=buffer,
                      min_dsp=parse_share(min_dsp, "--min-dsp") if min_dsp else 0.0)
    if design:
        result = evaluate_given(wl, brd, opts, design)
    else:
        result = explore_with_progress(wl, brd, opts, quiet=as_json)
    bundle = bundle_from_result(result)
    if output:
        bundle.save(output)
    if plot:
        from fluidnpu.dse.report import plot_gops

        TR, TP, TC = bundle.design
        plot_gops({f"<{TR}, {TP}, {TC}> {batching}": result.gops}, result.peak_gops, plot,
                  f"{wl.name} on {brd.name}")
    summary = design_summary(bundle)
    if as_json:
        emit_json(summary | {"bundle": output, "plot": plot})
        return
    print_summary(bundle)
    if output:
        out.print(f"design bundle written to [bold]{output}[/]")
    if plot:
        out.print(f"plot written to [bold]{plot}[/]")


def _buffer_words(bundle) -> str:
    return f", a block input buffer of {bundle.input_buffer:,} words a half" if bundle.input_buffer else ""


def print_summary(bundle) -> None:
    from fluidnpu.bundle import stem_summary

    d = bundle.data
    TR, TP, TC = bundle.design
    util = d.get("utilisation", {})
    res = d["resources"]
    out.print(f"[bold]{bundle.workload.name}[/] on [bold]{bundle.board.name}[/] ({bundle.board.part}) at "
              f"{bundle.clock_mhz:g} MHz, batching={d['dse']['batching']}, "
              f"stackable={'yes' if d['dse']['stackable'] else 'no'}, Bmax={bundle.bmax}")
    if d["dse"].get("score_gops") is None:
        out.print(f"the given design (fluidnpu dse --design): [bold green]<TR, TP, TC> = <{TR}, {TP}, {TC}>[/], "
                  f"{bundle.banks} input banks, {bundle.ports} AXI ports{_buffer_words(bundle)}")
    elif d["dse"].get("designs_evaluated"):
        out.print(f"best of {d['dse']['designs_evaluated']} designs in {d['dse']['seconds']:.2f} s: "
                  f"[bold green]<TR, TP, TC> = <{TR}, {TP}, {TC}>[/], {bundle.banks} input banks, "
                  f"{bundle.ports} AXI ports{_buffer_words(bundle)}")
    stem = stem_summary(bundle.workload)
    if stem:
        n, f = stem["network"], stem["npu"]
        out.print(f"stem {stem['layer']} folded by the host: {'x'.join(map(str, n['kernel']))} stride "
                  f"{n['stride'][0]} over {n['in_ch']} channels runs as {'x'.join(map(str, f['kernel']))} over "
                  f"{f['in_ch']} (docs/interpretations.md)")
    rt = Table(title="resources")
    for col in ("", "DSP", "BRAM36", "URAM", "LUT", "FF"):
        rt.add_column(col, justify="right")
    rt.add_row("used", str(res["dsp"]), f"{res['bram36']:g}", f"{res['uram']:g}", str(res["lut"]), str(res["ff"]))
    rt.add_row("of board", *(f"{100 * util.get(k, 0):.1f}%" for k in ("dsp", "bram36", "uram", "lut", "ff")))
    ceil = bundle.board.ceilings
    rt.add_row("ceiling", *(f"{100 * getattr(ceil, k):.0f}%" for k in ("dsp", "bram36", "uram", "lut", "ff")))
    if d["dse"].get("min_dsp"):
        rt.add_row("floor (--min-dsp)", f"{100 * d['dse']['min_dsp']:.0f}%", "", "", "", "")
    print_table(out, rt)
    if res.get("placement"):
        out.print("buffers (built with ram_style): " + ", ".join(f"{name} in {kind.upper()}"
                                                                 for name, kind in res["placement"].items()))
    tp = d.get("timing_proxy")
    if tp:
        verdict = "[green]within[/]" if tp["meets_budget"] else "[bold red]over[/]"
        out.print(f"timing proxy: longest path {tp['lut_levels']} LUT levels ({tp['structure']}), {verdict} the "
                  f"{tp['budget']}-level budget" + "".join(f"\n  {k} ({tp['levels'][k]} levels): {fix}"
                                                          for k, fix in tp["fixes"].items()))
    pt = Table(title=f"performance (peak {d['performance']['peak_gops']:.1f} GOp/s)")
    pt.add_column("batch", justify="right")
    pt.add_column("GOp/s", justify="right")
    pt.add_column("% peak", justify="right")
    for b, g in enumerate(d["performance"]["gops"], start=1):
        pt.add_row(str(b), f"{g:.1f}", f"{100 * g / d['performance']['peak_gops']:.1f}")
    print_table(out, pt)
    lt = Table(title="exit-segment latency (ms): the scheduler's Nexits x Bmax table")
    lt.add_column("segment")
    lt.add_column("exit rate", justify="right")
    for b in range(1, bundle.bmax + 1):
        lt.add_column(f"b={b}", justify="right")
    for ex, row in zip(bundle.workload.exits, bundle.latency_table()):
        lt.add_row(ex.name, f"{100 * ex.rate:.1f}%", *(f"{1e3 * s:.2f}" for s in row))
    print_table(out, lt)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def models(as_json: bool) -> None:
    """List the built-in models."""
    from fluidnpu.zoo import MODELS

    rows: list[dict[str, Any]] = []
    for name, build in MODELS.items():
        wl = build()
        rows.append({"name": name, "gemm_layers": len(wl.backbone), "gmac": wl.backbone_macs / 1e9,
                     "gmac_with_exit_heads": wl.total_macs / 1e9, "input_shape": list(wl.input_shape),
                     "exits": [{"name": e.name, "after": wl.backbone[e.position].name, "rate": e.rate}
                               for e in wl.exits]})
    if as_json:
        emit_json(rows)
        return
    t = Table(title="built-in models (any .onnx file works too)")
    for col in ("model", "GEMM layers", "GMAC", "input", "exits (after layer: rate)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], str(r["gemm_layers"]), f"{r['gmac']:.3f}", "x".join(map(str, r["input_shape"])),
                  ", ".join(f"{e['after']}: {100 * e['rate']:.1f}%" for e in r["exits"]))
    print_table(out, t)


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
            emit_json(info | {"sources": sources})
            return
        t = Table(title=f"{brd.name}: {brd.part}")
        t.add_column("figure")
        t.add_column("value [source]")
        for key, val in (sources or {k: str(v) for k, v in info.items()}).items():
            t.add_row(key, val)
        t.add_row("effective bandwidth", f"{info['bandwidth_gb_s']:.2f} GB/s at {brd.clock_mhz:g} MHz")
        print_table(out, t)
        return
    rows = [load_board(b) for b in builtin_boards()]
    if as_json:
        emit_json([b.to_dict() | {"bandwidth_gb_s": b.bandwidth_bytes_per_s() / 1e9} for b in rows])
        return
    t = Table(title="built-in boards (copy boards/*.json for your own)")
    for col in ("board", "part", "DSP", "BRAM36", "URAM", "LUT", "FF", "clock MHz", "GB/s"):
        t.add_column(col, justify="right")
    for b in rows:
        t.add_row(b.name, b.part, str(b.dsp), str(b.bram36), str(b.uram), str(b.lut), str(b.ff),
                  f"{b.clock_mhz:g}", f"{b.bandwidth_bytes_per_s() / 1e9:.2f}")
    print_table(out, t)


@cli.command()
@click.argument("bundle_path", metavar="DESIGN.json")
@click.option("--layers", is_flag=True, help="also print every layer's FBCB entries and cycles")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def show(bundle_path: str, layers: bool, as_json: bool) -> None:
    """Show a design bundle written by `fluidnpu dse`."""
    from fluidnpu.bundle import design_summary, load_bundle
    from fluidnpu.hw.regmap import K_CODES

    bundle = load_bundle(bundle_path)
    if as_json:
        summary = design_summary(bundle)
        if layers:
            summary["layers"] = [
                {"name": s.layer.name, "segment": s.segment, "R": s.layer.R, "P": s.layer.P, "C": s.layer.C,
                 "fbcb": [{"BR": e[0], "k": K_CODES[e[1]], "buffered": e[2:3] == [1]}
                          for e in bundle.data["fbcb"]["entries"][s.index]],
                 "cycles": bundle.data["latency"]["layer_cycles"][s.index]}
                for s in bundle.workload.schedule()]
        emit_json(summary)
        return
    print_summary(bundle)
    if layers:
        t = Table(title="FBCB <BR, k> per layer and batch size (S: one sample at a time, ·B: buffered)")
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
                cells.append(f"{'S' if e.serial else e.BR},{k}{'·B' if e.buffered else ''}")
            t.add_row(str(s.index), s.layer.name, f"{s.layer.R}x{s.layer.P}x{s.layer.C}", *cells)
        print_table(out, t, key=2)


@cli.command("flow", short_help="The whole flow on the embedded default (what `make run` runs).")
@click.option("--out", "outdir", type=click.Path(file_okay=False), default="build", show_default=True,
              help="where the design bundles and the RTL go")
@click.option("--rate", type=FloatRange(min=0, min_open=True), default=150.0, show_default=True,
              help="serving: Poisson rate (samples/s)")
@click.option("--slo", type=FloatRange(min=0, min_open=True), default=50.0, show_default=True,
              help="serving: latency SLO (ms)")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=450, show_default=True,
              help="serving: samples streamed")
@click.option("--cosim-images", type=int, default=8, show_default=True,
              help="images in the RTL co-simulation check (0 skips it)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def flow_cmd(outdir: str, rate: float, slo: float, samples: int, cosim_images: int, as_json: bool) -> None:
    """DSE -> RTL -> RTL co-simulation check -> samples served by FluidB -> a summary (fluidnpu/flow.py)."""
    from fluidnpu.flow import print_report, run_flow

    report = run_flow(outdir, rate=rate, slo_ms=slo, samples=samples, cosim_images=cosim_images,
                      console=None if as_json else out)
    if as_json:
        emit_json(report)
        return
    print_report(out, report)


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
    "fluidnpu.serving.cli",
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


def _stop_on_signal(signum: int, frame: Any) -> None:
    """SIGINT and SIGTERM alike: stop the command's worker processes, then unwind the main thread by
    KeyboardInterrupt so every `finally` and context manager runs (the writers drop their temporary
    files, pools shut down) before main() reports it in one line. A forked worker inherits this
    handler; there it just ends, quietly, for its parent is stopping anyway."""
    import multiprocessing

    global _INTERRUPTED
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)
    _INTERRUPTED = True
    for child in multiprocessing.active_children():
        child.terminate()
    raise KeyboardInterrupt


_INTERRUPTED = False   # a signal arrived: whatever the command then ends with is the interrupt


def _drop_interrupts(unraisable: Any, fallback: Any = sys.unraisablehook) -> None:
    """An interrupt raised where Python cannot raise it (a fork's at-fork hook, a finaliser) is ignored
    there and printed: `_INTERRUPTED` carries it to main() instead, so it is neither printed nor lost."""
    if not (_INTERRUPTED and isinstance(unraisable.exc_value, KeyboardInterrupt)):
        fallback(unraisable)


_MAIN_PID = os.getpid()


@contextmanager
def _signals_stop_the_command() -> Iterator[None]:
    global _MAIN_PID, _INTERRUPTED
    _INTERRUPTED = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _MAIN_PID = os.getpid()
    previous = {sig: signal.signal(sig, _stop_on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    hook, sys.unraisablehook = sys.unraisablehook, _drop_interrupts
    try:
        yield
    except Exception:
        # a signal's effects (workers killed under a pool, a KeyboardInterrupt lost in a fork's hook) end the
        # command with some other error: it stopped because it was interrupted
        if _INTERRUPTED:
            raise KeyboardInterrupt from None
        raise
    finally:
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _INTERRUPTED:       # the interrupt was swallowed where it was raised, and the command ran on
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors and exit code 2 for anything the user got wrong; Ctrl-C or SIGTERM
    end any command in one line with exit code 130, its workers stopped and no partial file left."""
    try:
        with _signals_stop_the_command():
            # without standalone mode click returns, not raises, a command's `ctx.exit(code)`
            code = cli.main(args=argv, prog_name="fluidnpu", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except FluidError as exc:
        # escaped: a message quoting a list ("got [nan, 0.5]") is not rich markup
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except (_Interrupted, click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted: stopped, no output file left half-written", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `fluidnpu ... | head`: the reader left; nothing to report
        sys.exit(1)
    except OSError as exc:
        # The last net under fluidnpu.output: a writer that did not go through it still ends in one line.
        what = os_error_message(exc, exc.filename, "access") if exc.filename else (exc.strerror or str(exc))
        err.print(f"[bold red]error:[/] {escape(what)}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
