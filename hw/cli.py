"""`fluidnpu rtl`: the NPU's Verilog, its Vivado top and the register map exports from a design bundle.

Amaranth is imported inside the command only, so the CLI (and the rest of
fluidnpu) keeps working on a board image without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fluidnpu.errors import FluidError

INNER_MODULE = "fluidnpu_npu"


def _build_top(bundle: Any) -> Any:
    """The NPU top component from hw/npu.py, or a one-line error saying what is missing."""
    try:
        import amaranth  # noqa: F401
    except ModuleNotFoundError:
        raise FluidError("`fluidnpu rtl` needs amaranth (pip install 'amaranth>=0.5,<0.6')") from None
    try:
        from fluidnpu.hw.npu import build_npu
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("fluidnpu.hw."):
            raise
        missing = "" if exc.name == "fluidnpu.hw.npu" else f" (it needs {exc.name}, which is missing)"
        raise FluidError(f"the NPU top module fluidnpu.hw.npu (hw/npu.py, build_npu) cannot be imported"
                         f"{missing}, so there is no RTL to generate") from None
    return build_npu(bundle)


def _to_verilog(top: Any) -> str:
    """The top as Verilog: hw/npu.py's fast-memory-init conversion (plain
    `amaranth.back.verilog.convert` would write the same text, minutes slower at
    full size)."""
    from fluidnpu.hw.npu import to_verilog

    return to_verilog(top, INNER_MODULE, emit_src=False)


def generate_rtl(bundle: Any, outdir: Path) -> dict[str, Any]:
    """Write every output for `bundle` into `outdir`; returns the summary `--json` prints."""
    from fluidnpu.hw.export import write_exports
    from fluidnpu.hw.regmap import NpuParams
    from fluidnpu.hw.vivado_wrapper import WRAPPER_NAME, master_buses, top_ports, vivado_wrapper

    top = _build_top(bundle)
    try:
        top_ports(top)
    except ValueError as exc:
        raise FluidError(f"fluidnpu.hw.npu.build_npu returned an unusable top: {exc}") from None
    # The register block is built from the same parameters; reading them back from the top (when it
    # exposes them) keeps the summary honest about what was generated.
    params = getattr(top, "params", None)
    masters = master_buses(top)
    if not isinstance(params, NpuParams):
        params = NpuParams.from_bundle(bundle, axi_dw=len(getattr(top, masters[0]).wdata), axi_ports=len(masters))
    outdir.mkdir(parents=True, exist_ok=True)
    npu_v = outdir / f"{INNER_MODULE}.v"
    top_v = outdir / f"{WRAPPER_NAME}.v"
    npu_v.write_text(_to_verilog(top))
    top_v.write_text(vivado_wrapper(top, INNER_MODULE))
    exports = write_exports(outdir, params)
    TR, TP, TC = bundle.design
    return {
        "outdir": str(outdir),
        "files": {"npu_verilog": str(npu_v), "vivado_top": str(top_v),
                  **{k: str(v) for k, v in exports.items()}},
        "top_module": WRAPPER_NAME, "inner_module": INNER_MODULE,
        "design": {"TR": TR, "TP": TP, "TC": TC}, "bmax": params.bmax, "layers": params.layers,
        "axi_dw": params.axi_dw, "axi_ports": len(masters), "m_axi": masters, "clock_mhz": bundle.clock_mhz,
        "fbcb": {"entries": params.fbcb_depth, "entry_bits": params.fbcb_width,
                 "bits": params.fbcb_depth * params.fbcb_width},
        "design_hash": f"0x{params.design_hash:08X}",
    }


@click.command("rtl")
@click.argument("bundle_path", metavar="DESIGN.json")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False),
              help="directory for the Verilog, the Vivado top and the register map files")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def rtl_cmd(bundle_path: str, outdir: str, as_json: bool) -> None:
    """Generate the NPU's Verilog, a Vivado top (fluidnpu_top) and the register map for DESIGN.json."""
    from fluidnpu.bundle import load_bundle

    bundle = load_bundle(bundle_path)
    summary = generate_rtl(bundle, Path(outdir))
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    d = summary["design"]
    fb = summary["fbcb"]
    click.echo(f"NPU <TR, TP, TC> = <{d['TR']}, {d['TP']}, {d['TC']}>, Bmax = {summary['bmax']}, "
               f"L = {summary['layers']} layers, {summary['axi_ports']} x {summary['axi_dw']}-bit m_axi, design hash "
               f"{summary['design_hash']}")
    click.echo(f"FBCB: {fb['entries']} entries x {fb['entry_bits']} bits = {fb['bits']} bits")
    click.echo(f"wrote to {summary['outdir']}:")
    for kind, path in summary["files"].items():
        click.echo(f"  {Path(path).name:<22} {kind}")


commands = [rtl_cmd]
