"""`fluidnpu plan`: how many devices a set of sessions needs and what runs where (Nexus).

Registered by fluidnpu/cli.py through `commands`; fluidnpu.cli's helpers are
imported inside the command body because fluidnpu.cli imports this module.
"""

from __future__ import annotations

import click


@click.command("plan", short_help="Nexus squishy bin packing of sessions over a fleet of NPUs and GPUs.")
@click.option("--sessions", "sessions_path", required=True, type=click.Path(dir_okay=False),
              help='JSON: [{"model": "resnet50", "rate": 60, "slo_ms": 400}, ...]')
@click.option("--fleet", "fleet_path", required=True, type=click.Path(dir_okay=False),
              help='JSON: {"devices": [{"name", "design" | "kind": "gpu" + "profile", "count"}, ...]}')
@click.option("--no-early-exit", is_flag=True, help="price every batch as if no sample left early")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="write a PNG of the nodes' duty cycles")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan_cmd(sessions_path: str, fleet_path: str, no_early_exit: bool, plot: str | None, as_json: bool) -> None:
    """Place every session (model, rate, SLO) on the fleet's devices: nodes, batches, duty cycles."""
    from fluidnpu.cli import _emit_json, out
    from fluidnpu.scheduler_fw.fleet.inputs import device_kinds, load_fleet_file, load_sessions
    from fluidnpu.scheduler_fw.fleet.nexus import plan
    from fluidnpu.scheduler_fw.fleet.report import plan_dict, plan_text, plot_plan

    sessions = load_sessions(sessions_path)
    kinds = device_kinds(load_fleet_file(fleet_path), [s.model for s in sessions], early_exit=not no_early_exit)
    d = plan_dict(plan(sessions, kinds), kinds)
    if plot:
        plot_plan(d, plot)
        d["plot"] = plot
    if as_json:
        _emit_json(d)
    else:
        out.print(plan_text(d), highlight=False, soft_wrap=True)


commands = [plan_cmd]
