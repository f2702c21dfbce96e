"""The NPU's Verilog, its Vivado top and the register map exports from a design bundle (what
`fluidnpu rtl` and `fluidnpu vivado` write).

Amaranth is imported inside the functions only, so the rest of fluidnpu keeps
working on a board image without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.output import make_dir, write_text

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


def self_check(outdir: Path, params: Any) -> dict[str, Any]:
    """hw/verilog_check.py on the files in `outdir` (and the Tcl next to it, if any): a one-line
    FluidError when the generated Verilog disagrees with the register map, the wrapper or the Tcl."""
    try:
        import pyverilog  # noqa: F401
    except ModuleNotFoundError:
        return {"parser": "pyverilog", "status": "skipped: pyverilog is not installed"}
    from fluidnpu.hw.verilog_check import check_files

    problems = check_files(outdir, params)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise FluidError(f"the generated RTL in {outdir} fails its pyverilog self-check: {problems[0]}{more}")
    return {"parser": "pyverilog", "status": "ok"}


def generate_rtl(bundle: Any, outdir: Path, *, check: bool = True) -> dict[str, Any]:
    """Write every output for `bundle` into `outdir`; returns the summary `--json` prints.
    `check`: parse what was written with pyverilog and check it (`self_check`)."""
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
    make_dir(outdir)
    npu_v = outdir / f"{INNER_MODULE}.v"
    top_v = outdir / f"{WRAPPER_NAME}.v"
    write_text(npu_v, _to_verilog(top))
    write_text(top_v, vivado_wrapper(top, INNER_MODULE))
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
        "verilog_check": self_check(outdir, params) if check else None,
    }
