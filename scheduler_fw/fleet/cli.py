"""`fluidnpu plan`: how many devices a set of sessions needs and what runs where (Nexus).

Registered by fluidnpu/cli.py through `commands`; output helpers come from fluidnpu.output.
"""

from __future__ import annotations

import sys

import click

from fluidnpu.output import FloatRange

# The defaults are the smallest round pair whose plan of docs/fleet.md's example keeps every session's SLO
# for >= 99 % of its requests under `--check` (docs/fleet.md, "Does a plan keep its SLOs?").
DEFAULT_HEADROOM = 0.5
DEFAULT_QUANTILE = 0.99


@click.command("plan", short_help="Nexus squishy bin packing of sessions over a fleet of NPUs and GPUs.")
@click.option("--sessions", "sessions_path", required=True, type=click.Path(dir_okay=False),
              help='JSON: [{"model": "resnet50", "rate": 60, "slo_ms": 400}, ...]')
@click.option("--fleet", "fleet_path", required=True, type=click.Path(dir_okay=False),
              help='JSON: {"devices": [{"name", "design" | "kind": "gpu" + "profile", "count"}, ...]}')
@click.option("--no-early-exit", is_flag=True, help="price every batch as if no sample left early")
@click.option("--headroom", type=FloatRange(min=0), default=DEFAULT_HEADROOM, show_default=True,
              help="size every node for rate x (1 + H): room for Poisson bursts (0 with --quantile 0: Nexus as "
                   "published, whose slots run at load 1 and miss most SLOs under Poisson arrivals)")
@click.option("--slo-margin", type=FloatRange(min=0, max=1, max_open=True), default=0.0, show_default=True,
              help="plan every session for SLO x (1 - M): room for what the model does not price (RPCs, jitter)")
@click.option("--jitter-ms", type=FloatRange(min=0), default=0.0, show_default=True,
              help="plan every session for SLO x (1 - M) - J ms: an absolute margin for dispatch jitter")
@click.option("--quantile", type=FloatRange(min=0, max=1, max_open=True), default=DEFAULT_QUANTILE, show_default=True,
              help="size residue slots for this quantile of Poisson arrivals per duty cycle (0: the mean, as Nexus)")
@click.option("--target", type=FloatRange(min=0, max=1), default=0.99, show_default=True,
              help="with --check/--run: the share of each session's requests that must meet its SLO; below it, "
                   "plan says which sessions missed and exits 1")
@click.option("--check", "check_s", type=FloatRange(min=0), default=0.0, show_default=True,
              help="replay the plan under Poisson arrivals for this many seconds and report SLO compliance")
@click.option("--run", "run_s", type=FloatRange(min=0), default=0.0, show_default=True,
              help="serve the plan on Ray (emulated boards, wall clock) under Poisson load for this many seconds; "
                   "needs the 'fleet' extra")
@click.option("--address", default=None, help="with --run: join this Ray cluster instead of starting a local one")
@click.option("--epoch", "epoch_s", type=FloatRange(min=0), default=0.0, show_default=True,
              help="with --run: re-plan every this many seconds on the measured rates (0: never)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the --check/--run arrivals and exits")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="write a PNG of the nodes' duty cycles")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan_cmd(sessions_path: str, fleet_path: str, no_early_exit: bool, headroom: float, slo_margin: float,
             jitter_ms: float, quantile: float, target: float, check_s: float,
             run_s: float, address: str | None, epoch_s: float, seed: int, plot: str | None, as_json: bool) -> None:
    """Place every session (model, rate, SLO) on the fleet's devices: nodes, batches, duty cycles."""
    from fluidnpu.output import emit_json, err, out
    from fluidnpu.scheduler_fw.fleet.check import check_plan
    from fluidnpu.scheduler_fw.fleet.inputs import device_kinds, load_fleet_file, load_sessions
    from fluidnpu.scheduler_fw.fleet.nexus import plan
    from fluidnpu.scheduler_fw.fleet.report import check_dict, check_text, missed_line, plan_dict, plan_text, plot_plan

    if run_s:
        from fluidnpu.scheduler_fw.fleet.ray_fleet import require_ray

        require_ray()
    sessions = load_sessions(sessions_path)
    kinds = device_kinds(load_fleet_file(fleet_path), [s.model for s in sessions], early_exit=not no_early_exit)
    p = plan(sessions, kinds, headroom, slo_margin, jitter_ms / 1e3, quantile)
    d = plan_dict(p, kinds) | {"headroom": headroom, "slo_margin": slo_margin, "jitter_ms": jitter_ms,
                               "quantile": quantile, "target": target}
    if check_s:
        from rich.progress import Progress

        with Progress(console=err, transient=True, disable=not err.is_terminal) as bar:
            task = bar.add_task("replaying the plan", total=len(p.nodes))
            checks = check_plan(p, kinds, check_s, seed, progress=lambda done, total: bar.update(task, completed=done))
        d["check"] = check_dict(checks, p, check_s, seed)
    if run_s:
        from fluidnpu.scheduler_fw.fleet.check import session_checks
        from fluidnpu.scheduler_fw.fleet.ray_fleet import Fleet, poisson_arrivals

        err.print(f"starting {len(p.nodes)} emulated boards on Ray ...", highlight=False)
        fleet = Fleet(p, kinds, address, seed, headroom, slo_margin, jitter_ms / 1e3)
        try:
            log = fleet.run(poisson_arrivals({s.index: s.rate for s in p.sessions}, run_s, seed), epoch_s or None)
        finally:
            fleet.shutdown()
        d["run"] = check_dict(session_checks(p, log.latencies, log.arrivals), p, run_s, seed) | {
            "rejected": sum(log.rejected.values()), "epochs": log.epochs}
    if plot:
        plot_plan(d, plot)
        d["plot"] = plot
    if as_json:
        emit_json(d)
    else:
        text = plan_text(d) + ("\n" + check_text(d["check"]) if check_s else "")
        if run_s:
            text += "\n" + check_text(d["run"], "Run on Ray, emulated boards, the sessions' full rates")
        out.print(text, highlight=False, soft_wrap=True)
    missed = [missed_line(d[k], target) for k in ("check", "run") if k in d]
    if any(missed):
        err.print(f"warning: {'; '.join(m for m in missed if m)}; plan with more --headroom or a higher --quantile",
                  markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)


commands = [plan_cmd]
