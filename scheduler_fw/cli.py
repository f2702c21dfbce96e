"""`fluidnpu simulate` and `fluidnpu eval`: the scheduler's command line.

Registered by fluidnpu/cli.py through `commands`. Consoles and JSON output come
from fluidnpu.output, model loading from fluidnpu.design (never from fluidnpu.cli).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fluidnpu.errors import FluidError
from fluidnpu.output import MAX_SAMPLES, MAX_SEEDS, FloatRange, emit_json, err, make_dir, out, progress_bar, read_text
from fluidnpu.scheduler_fw.experiments import FIGURES
from fluidnpu.scheduler_fw.simulation import DEFAULT_DECISION_COST_S, DEFAULT_SAMPLES
from fluidnpu.tables import print_table

_POLICY_HELP = ("serial, fc-adaptb-s|m|l, r-adaptb-s|m|l, lazybatching or fluidb "
                "(S/M/L: batch-forming timeout of 5/45/95% of the SLO)")


@click.command("simulate", short_help="Serve a seeded Poisson trace with one policy; latency, SLO, utilisation.")
@click.option("--model", "-m", default=None, help="resnet50 or inceptionv3 (with --board; not with --design)")
@click.option("--board", "-b", default=None, help="zc706, zcu104 or a board .json")
@click.option("--design", type=click.Path(dir_okay=False), default=None,
              help="run on this design bundle instead of the policy's own DSE'd design")
@click.option("--policy", "-p", required=True, help=_POLICY_HELP)
@click.option("--rate", type=FloatRange(min=0, min_open=True), required=True,
              help="mean Poisson arrival rate (samples/s)")
@click.option("--slo", type=FloatRange(min=0, min_open=True), required=True, help="p99 latency SLO (ms)")
@click.option("--seeds", type=click.IntRange(1, MAX_SEEDS), default=3, show_default=True,
              help="number of seeds to average")
@click.option("--seed", "first_seed", type=int, default=0, show_default=True, help="first seed")
@click.option("--bmax", type=click.IntRange(min=1), default=None,
              help="largest batch (default 8, or the bundle's with --design)")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=DEFAULT_SAMPLES, show_default=True,
              help="requests per seed")
@click.option("--decision-cost-us", type=FloatRange(min=0), default=DEFAULT_DECISION_COST_S * 1e6,
              show_default=True, help="NPU stall per scheduler invocation (µs)")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="DSE cache (default $FLUIDNPU_CACHE_DIR or ~/.cache/fluidnpu)")
@click.option("--json", "as_json", is_flag=True, help="print every metric as JSON")
def simulate_cmd(model: str | None, board: str | None, design: str | None, policy: str, rate: float, slo: float,
                 seeds: int, first_seed: int, bmax: int | None, samples: int, decision_cost_us: float,
                 cache_dir: str | None, as_json: bool) -> None:
    """Serve a seeded Poisson trace with one POLICY and report latency, SLO violations, utilisation."""
    from fluidnpu.design import load_model
    from fluidnpu.scheduler_fw.latency import LatencyTable, load_design
    from fluidnpu.scheduler_fw.registry import policy_spec
    from fluidnpu.scheduler_fw.simulation import Setting, simulate

    spec = policy_spec(policy)
    cached = None
    if design:
        if model or board:
            raise FluidError("give either --design or --model/--board, not both")
        if cache_dir:
            raise FluidError("--cache-dir holds the DSE of --model/--board; a --design needs none")
        bundle = load_design(design)
        source = design
    else:
        if not model or not board:
            raise FluidError("need --model and --board (or --design)")
        from fluidnpu.boards import load_board
        from fluidnpu.scheduler_fw.designs import default_cache_dir, design_for

        wl = load_model(model)
        brd = load_board(board)
        told: list[bool] = []

        def searching(done: int, total: int) -> None:
            # called only on a cache miss: say once why the first run of a setting takes its while
            if not told:
                told.append(True)
                where = cache_dir or default_cache_dir()
                err.print(f"searching the designs for {spec.label} on {wl.name} / {brd.name} (the DSE, once: "
                          f"its pick is cached in {where})", highlight=False)
            prog.update(task, completed=done, total=total)

        with progress_bar(err, as_json) as prog:
            task = prog.add_task(f"DSE {wl.name} on {brd.name} ({spec.design.key})", total=None)
            bundle, cached = design_for(wl, brd, spec.design, bmax or 8, Path(cache_dir) if cache_dir else None,
                                        progress=searching)
        source = f"DSE {spec.design.key}" + (" (cached)" if cached else "")
    table = LatencyTable.from_bundle(bundle, bmax)
    setting = Setting(spec.name, rate, slo / 1e3, table.bmax, samples, decision_cost_us * 1e-6)
    setting.validate(table)
    with progress_bar(err, as_json) as prog:
        prog.add_task(f"simulating {spec.label} at {rate:g}/s", total=None)
        res = simulate(setting, table, tuple(range(first_seed, first_seed + seeds)))
    TR, TP, TC = bundle.design
    report: dict[str, Any] = {
        "model": bundle.workload.name, "board": bundle.board.name, "policy": spec.name, "label": spec.label,
        "design": {"TR": TR, "TP": TP, "TC": TC, "kind": bundle.data["dse"]["batching"],
                   "stackable": bundle.data["dse"]["stackable"], "source": source,
                   "peak_gops": table.peak_ops_per_s / 1e9},
    } | res.to_dict()
    if as_json:
        emit_json(report)
        return
    from rich.table import Table

    m = res.mean
    out.print(f"[bold]{spec.label}[/] on {report['model']} / {report['board']} <{TR}, {TP}, {TC}> ({source}), "
              f"{rate:g} samples/s, p99 SLO {slo:g} ms, Bmax {table.bmax}, {seeds} seed(s) x {samples} requests")
    t = Table(title="metrics (mean over seeds)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("mean latency", f"{m['mean_latency_ms']:.1f} ms"), ("p99 latency", f"{m['p99_latency_ms']:.1f} ms"),
            ("SLO violation rate", f"{100 * m['slo_violation_rate']:.2f} %"),
            ("NPU utilisation (busy)", f"{100 * m['utilisation']:.1f} %"),
            ("NPU busy fraction", f"{100 * m['busy_fraction']:.1f} %"),
            ("throughput", f"{m['throughput']:.2f} samples/s"),
            ("scheduler invocations", f"{m['invocations']:.0f} ({m['invocations_per_sample']:.2f} / sample)"),
            ("preemption-point evaluations", f"{m['preemption_points']:.0f}"),
            ("preemptions", f"{m['preemptions']:.0f}"), ("mean batch per run", f"{m['mean_run_batch']:.2f}")]
    for k, v in rows:
        t.add_row(k, v)
    print_table(out, t)


@click.command("eval", short_help="Reproduce the paper's Figs 4-7 or Table I as CSV, JSON and PNG.")
@click.argument("what", type=click.Choice([*FIGURES, "all"]))
@click.option("--seeds", type=click.IntRange(1, MAX_SEEDS), default=3, show_default=True,
              help="seeds averaged per point")
@click.option("--samples", type=click.IntRange(100, MAX_SAMPLES), default=DEFAULT_SAMPLES, show_default=True,
              help="requests per seed (>= 100 for a p99)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="build/eval", show_default=True,
              help="where the CSV/JSON/PNG files go")
@click.option("--jobs", type=click.IntRange(1, 256), default=None, help="worker processes (default: up to 2)")
@click.option("--bmax", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--decision-cost-us", type=FloatRange(min=0), default=DEFAULT_DECISION_COST_S * 1e6,
              show_default=True, help="NPU stall per scheduler invocation (µs)")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="DSE cache (default $FLUIDNPU_CACHE_DIR or ~/.cache/fluidnpu)")
@click.option("--no-plots", is_flag=True, help="CSV/JSON only")
@click.option("--results-md", type=click.Path(dir_okay=False), default=None,
              help="Markdown page whose generated blocks are filled from the results (default: <out>/../../results.md "
                   "when it exists, i.e. docs/results.md for --out docs/figures/eval)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def eval_cmd(what: str, seeds: int, samples: int, out_dir: str, jobs: int | None, bmax: int, decision_cost_us: float,
             cache_dir: str | None, no_plots: bool, results_md: str | None, as_json: bool) -> None:
    """Reproduce the paper's Fig. 4, 5, 6, 7 or Table I (or all) into --out."""
    from fluidnpu.scheduler_fw.experiments import EvalConfig, run_figure, write_headline

    cfg = EvalConfig(seeds=seeds, n_samples=samples, bmax=bmax, decision_cost_s=decision_cost_us * 1e-6,
                     cache_dir=Path(cache_dir) if cache_dir else None)
    if jobs is not None:
        cfg.jobs = jobs
    cfg.validate()
    if results_md:  # checked before minutes of work that would end in filling it
        read_text(results_md, "--results-md page")
    if cache_dir:  # before --out is made: a bad cache folder must not leave an empty --out behind
        make_dir(cache_dir, "DSE cache folder")
    make_dir(out_dir)
    names = list(FIGURES) if what == "all" else [what]
    results = {}
    with progress_bar(err, as_json) as prog:
        task = prog.add_task("", total=None)
        for name in names:
            def progress(desc: str, done: int, total: int, _name: str = name) -> None:
                prog.update(task, description=f"[bold]{_name}[/] {desc}", completed=done, total=total)

            results[name] = run_figure(name, Path(out_dir), cfg, progress, plots=not no_plots)
    headline = write_headline(Path(out_dir)) if {"fig4", "fig5"} & set(names) else None
    md = Path(results_md) if results_md else Path(out_dir).resolve().parent.parent / "results.md"
    if results_md or md.is_file():
        from fluidnpu.scheduler_fw.results_doc import update_results_md

        if not md.is_file():
            raise FluidError(f"--results-md {md}: no such file")
        written = update_results_md(md, Path(out_dir))
        if written and not as_json:
            out.print(f"{md}: generated blocks {', '.join(written)} updated")
    if as_json:
        doc = {n: {"summary": r["summary"], "files": [str(Path(out_dir) / f) for f in r["files"]],
                   "seconds": r["seconds"]} for n, r in results.items()}
        if headline:
            doc["headline"] = headline
        emit_json(doc)
        return
    for name, r in results.items():
        _print_summary(out, name, r)
        out.print(f"{name}: {len(r['files'])} files in [bold]{out_dir}[/] ({r['seconds']:.1f} s)")
    if headline:
        for key, what in (("", "each on its own design"), ("same_hardware", "all on FluidB's design")):
            h = headline.get(key, {}) if key else headline
            if "mean_latency_gain" in h:
                out.print(f"headline (Figs. 4 + 5, {what}): {_gain_line(h)} (paper 1.97x; headline.json)")


def _gain_line(h: dict[str, Any]) -> str:
    """One headline aggregate (scheduler_fw/headline.py) as a sentence."""
    lo, hi = h["mean_latency_gain_ci"]
    return (f"{h['points']} of {h['points_total']} points below saturation: FluidB mean latency "
            f"{h['mean_latency_gain']:.2f}x lower (geomean, 95% CI {lo:.2f}-{hi:.2f}), "
            f"p99 {h['p99_latency_gain']:.2f}x; "
            f"violation rate {100 * h['baseline_violation_rate']:.1f}% vs {100 * h['fluidb_violation_rate']:.2f}%")


def _print_summary(out, name: str, r: dict[str, Any]) -> None:
    from rich.table import Table

    s = r["summary"]
    if name == "table1":
        t = Table(title="Table I: LazyBatching vs FluidB, mean latency (ms) / SLO violation rate, ours beside "
                        "the paper's", caption="ratio: LazyBatching's mean latency over FluidB's; "
                                               "pp: its violation rate above FluidB's, in percentage points")
        for col in ("setting", "source", "LazyBatching", "FluidB", "ratio", "pp"):
            t.add_column(col, justify="left" if col in ("setting", "source") else "right")
        for row in s["rows"]:
            setting = f"{row['model']} {row['board']} {row['rate']:g}/s SLO {row['slo_ms']:g} ms"
            for source, v, prefix in (("ours", row["ours"], "ours"), ("paper", row["paper"], "paper")):
                t.add_row(setting if source == "ours" else "", source,
                          *(f"{v[p][0]:.0f} / {100 * v[p][1]:.1f}%" for p in ("lazybatching", "fluidb")),
                          f"{row[f'{prefix}_latency_ratio']:.2f}x", f"{row[f'{prefix}_violation_pp']:.1f}",
                          end_section=source == "paper")
        print_table(out, t, key=2)  # a split table keeps each figure beside its setting and source
        return
    if name == "fig7":
        t = Table(title="Fig. 7: GOp/s at b = 1 / 2 / Bmax, each scheme on its own design")
        t.add_column("model / board")
        t.add_column("scheme")
        t.add_column("GOp/s", justify="right")
        for pair, v in s.items():
            for lab, g in v["gops"].items():
                t.add_row(pair, lab, " / ".join(f"{x:.1f}" for x in g.values()))
        print_table(out, t)
        return
    rows = r["rows"]
    xkey = "slo_ms" if name == "fig6" else "rate"
    metric = "slo_violation_rate" if name == "fig6" else "mean_latency_ms"
    hardware = {"own": "each on its own design", "fluidb": "all on FluidB's design"}
    # one table per panel and hardware: a policy's row on its own design and on FluidB's are two figures
    for panel, hw in dict.fromkeys((x["panel"], x.get("hardware", "own")) for x in rows):
        prow = [x for x in rows if x["panel"] == panel and x.get("hardware", "own") == hw]
        xs = sorted({x[xkey] for x in prow})
        t = Table(title=f"{name} {panel}, {hardware.get(hw, hw)}: "
                        f"{'SLO violation rate (%)' if name == 'fig6' else 'mean latency (ms)'} "
                        f"by {'SLO (ms)' if name == 'fig6' else 'rate (samples/s)'}")
        t.add_column("policy")
        for x in xs:
            t.add_column(f"{x:g}", justify="right")
        for pol in dict.fromkeys(x["label"] for x in prow):
            vals = {x[xkey]: x[metric] for x in prow if x["label"] == pol}
            t.add_row(pol, *(f"{(100 * vals[x]) if name == 'fig6' else vals[x]:.1f}" if x in vals else "–"
                             for x in xs))
        print_table(out, t)
    if "mean_latency_gain" in s:
        out.print(f"FluidB vs the baselines: {_gain_line(s)}")


commands: list[click.Command] = [simulate_cmd, eval_cmd]
