"""`fluidnpu vivado`: a scripted Vivado project (RTL, IP packaging, block design, build) for a design bundle.

Amaranth (for the RTL) is imported inside the command only, so the CLI keeps
working on a board image without it.
"""

from __future__ import annotations

from pathlib import Path

import click

from fluidnpu.output import emit_json
from fluidnpu.tables import say


@click.command("vivado")
@click.argument("bundle_path", metavar="DESIGN.json")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False),
              help="directory for the RTL, the Tcl scripts, build.sh and README.txt")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def vivado_cmd(bundle_path: str, outdir: str, as_json: bool) -> None:
    """Write a complete Vivado project for DESIGN.json's board (ZC706, ZCU104, or a Zynq board file)."""
    from fluidnpu.bundle import load_bundle
    from fluidnpu.hls_gen.vivado import write_vivado_project

    bundle = load_bundle(bundle_path)
    summary = write_vivado_project(bundle, Path(outdir), bundle_name=Path(bundle_path).name)
    if as_json:
        emit_json(summary)
        return
    say(f"{summary['board']} ({summary['part']}), {summary['ps']}: {summary['clock_pin']} at "
        f"{summary['clock_mhz']:g} MHz, NPU {', '.join(summary['m_axi'])} -> {', '.join(summary['hp_ports'])} "
        f"({summary['hp_width']} bits each), "
        f"registers on {summary['reg_port']} at {summary['reg_base']}, irq -> {summary['irq']}")
    say(f"IP {summary['vlnv']}, DESIGN_HASH {summary['design_hash']}")
    say(f"wrote to {summary['outdir']}: rtl/, package_ip.tcl, block_design.tcl, build.tcl, build.sh, "
        "README.txt")
    say(f"next: {Path(summary['outdir']) / 'build.sh'} (needs Vivado) -> npu.bit + npu.hwh; "
        "see docs/deploy.md")


commands = [vivado_cmd]
