"""`fluidnpu rtl`: the NPU's Verilog, its Vivado top and the register map exports from a design bundle.

The generation itself is hw/rtl_gen.py's `generate_rtl`; Amaranth is imported
inside it only, so the CLI keeps working on a board image without it.
"""

from __future__ import annotations

from pathlib import Path

import click

from fluidnpu.output import emit_json
from fluidnpu.tables import say


@click.command("rtl")
@click.argument("bundle_path", metavar="DESIGN.json")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False),
              help="directory for the Verilog, the Vivado top and the register map files")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def rtl_cmd(bundle_path: str, outdir: str, as_json: bool) -> None:
    """Generate the NPU's Verilog, a Vivado top (fluidnpu_top) and the register map for DESIGN.json."""
    from fluidnpu.bundle import load_bundle
    from fluidnpu.hw.rtl_gen import generate_rtl
    from fluidnpu.output import make_dir

    bundle = load_bundle(bundle_path)
    make_dir(outdir)  # an unwritable -o fails before the RTL is built
    summary = generate_rtl(bundle, Path(outdir))
    if as_json:
        emit_json(summary)
        return
    d = summary["design"]
    fb = summary["fbcb"]
    say(f"NPU <TR, TP, TC> = <{d['TR']}, {d['TP']}, {d['TC']}>, Bmax = {summary['bmax']}, "
        f"L = {summary['layers']} layers, {summary['axi_ports']} x {summary['axi_dw']}-bit m_axi, design hash "
        f"{summary['design_hash']}")
    say(f"FBCB: {fb['entries']} entries x {fb['entry_bits']} bits = {fb['bits']} bits")
    say(f"wrote to {summary['outdir']}:")
    for kind, path in summary["files"].items():
        say(f"  {Path(path).name:<22} {kind}")


commands = [rtl_cmd]
