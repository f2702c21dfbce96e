"""The generated Verilog read back by an independent parser (pyverilog) and checked against what the
Python side assumes about it: hw/regmap.py, the Vivado wrapper's interface attributes and the Tcl.

The Vivado wrapper, package_ip.tcl / block_design.tcl and the host driver all rely on the top's ports:
their names, directions and widths (s_axi is the 32-bit AXI4-Lite register slave spanning at least the
register window, m_axi the AXI4 master as wide as the board's HP port, one level interrupt), and on
the wrapper wiring every port of the Amaranth module once, width for width. `check_rtl` parses the
files as Verilog and returns every disagreement in one line each; `fluidnpu rtl` runs it on what it
wrote (a self-check) and tests/test_verilog_check.py on a small design and on broken copies.

pyverilog parses Amaranth output only with `emit_src=False`; it does not take `(* ... *)` attributes
in port lists, so they are removed before parsing (their X_INTERFACE_PARAMETER figures are read
first, as data). Only the inner top module is parsed (the first module of the inner file): its
submodules are not needed for the ports and would cost seconds per megabyte.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.hw.regmap import m_axi_name

# The AXI signals the wrapper, the Tcl and the driver depend on (beyond them, optional ones may exist).
AXI_LITE_SIGNALS = {"awaddr": "in", "awvalid": "in", "awready": "out", "wdata": "in", "wstrb": "in",
                    "wvalid": "in", "wready": "out", "bresp": "out", "bvalid": "out", "bready": "in",
                    "araddr": "in", "arvalid": "in", "arready": "out", "rdata": "out", "rresp": "out",
                    "rvalid": "out", "rready": "in"}
AXI_MASTER_SIGNALS = {"awaddr": "out", "awlen": "out", "awsize": "out", "awburst": "out", "awvalid": "out",
                      "awready": "in", "wdata": "out", "wstrb": "out", "wlast": "out", "wvalid": "out",
                      "wready": "in", "bresp": "in", "bvalid": "in", "bready": "out", "araddr": "out",
                      "arlen": "out", "arsize": "out", "arburst": "out", "arvalid": "out", "arready": "in",
                      "rdata": "in", "rresp": "in", "rlast": "in", "rvalid": "in", "rready": "out"}
# Interface names the Tcl refers to on the packaged core (package_ip.tcl's busif list, block_design.tcl).
TCL_INTERFACES = ("s_axi", "m_axi0", "aclk", "aresetn", "interrupt")


@dataclass(frozen=True)
class VPort:
    """A module port as the Verilog declares it."""

    name: str
    direction: str  # "in" / "out" / "inout"
    width: int


@lru_cache(maxsize=1)
def _parser() -> Any:
    try:
        from pyverilog.vparser.parser import VerilogParser
    except ModuleNotFoundError:
        raise FluidError("the Verilog check needs pyverilog (pip install pyverilog)") from None
    # PLY writes its parse tables once into outputdir (never into the working directory).
    return VerilogParser(outputdir=str(Path(tempfile.gettempdir()) / "fluidnpu-pyverilog"), debug=False)


_ATTRIBUTE = re.compile(r"\(\*\s.*?\s\*\)", re.S)


def first_module(text: str, name: str) -> str:
    """The text of module `name` (from `module name` to its `endmodule`)."""
    m = re.search(rf"^module\s+{re.escape(name)}\b.*?^endmodule\b", text, re.S | re.M)
    if not m:
        raise FluidError(f"the generated Verilog has no module {name}")
    return m.group(0)


def parse_module(text: str, name: str) -> Any:
    """pyverilog's ModuleDef of module `name` in `text` (attributes removed)."""
    from pyverilog.vparser.parser import ParseError

    try:
        ast = _parser().parse(_ATTRIBUTE.sub("", first_module(text, name)))
    except ParseError as exc:
        raise FluidError(f"module {name} of the generated Verilog does not parse: {exc}") from None
    for d in ast.description.definitions:
        if d.name == name:
            return d
    raise FluidError(f"the generated Verilog has no module {name}")


def _int(node: Any) -> int:
    value = str(node.value).replace("_", "")
    if "'" in value:
        base, digits = value.split("'", 1)[1][0].lower(), value.split("'", 1)[1][1:]
        return int(digits, {"d": 10, "h": 16, "b": 2, "o": 8}[base])
    return int(value)


def _width(node: Any) -> int:
    w = getattr(node, "width", None)
    return 1 if w is None else abs(_int(w.msb) - _int(w.lsb)) + 1


def module_ports(module: Any) -> dict[str, VPort]:
    """Every port of a parsed module with its direction and width (ANSI and non-ANSI declarations)."""
    from pyverilog.vparser import ast as A

    kinds = {A.Input: "in", A.Output: "out", A.Inout: "inout"}
    ports: dict[str, VPort] = {}

    def walk(node: Any) -> None:
        for cls, direction in kinds.items():
            if type(node) is cls:
                ports[node.name] = VPort(node.name, direction, _width(node))
                return
        if isinstance(node, (A.InstanceList, A.Always, A.Assign)):
            return
        for child in node.children():
            walk(child)

    walk(module.portlist)
    for item in module.items:
        walk(item)
    return ports


def instance_connections(module: Any, of_module: str) -> dict[str, str]:
    """{inner port: outer signal} of the one instance of `of_module` in `module`."""
    from pyverilog.vparser import ast as A

    found = [inst for item in module.items if isinstance(item, A.InstanceList) and item.module == of_module
             for inst in item.instances]
    if len(found) != 1:
        raise FluidError(f"{module.name} instantiates {of_module} {len(found)} times, expected once")
    return {p.portname: getattr(p.argname, "name", str(p.argname)) for p in found[0].portlist}


def _stated(text: str, bus: str) -> dict[str, int]:
    """The X_INTERFACE_PARAMETER figures the wrapper states for `bus` (DATA_WIDTH, ADDR_WIDTH, ...)."""
    m = re.search(rf'XIL_INTERFACENAME {bus},([^"]*)"', text)
    if not m:
        return {}
    pairs = (item.strip().split(" ", 1) for item in m.group(1).split(","))
    return {k: int(v) for k, v in (p for p in pairs if len(p) == 2) if v.strip().isdigit()}


def check_rtl(top_v: str, npu_v: str, params: Any, *, top_name: str = "fluidnpu_top",
              inner_name: str = "fluidnpu_npu", tcl: Mapping[str, str] | None = None) -> list[str]:
    """Disagreements (one line each) between the generated Verilog and regmap / wrapper / Tcl; [] when none.

    `params`: the NpuParams the RTL was built with; `tcl`: {file name: text} of the Vivado scripts."""
    from fluidnpu.hw.regmap import WINDOW_BYTES

    problems: list[str] = []
    top = module_ports(parse_module(top_v, top_name))
    inner = module_ports(parse_module(npu_v, inner_name))

    def need(name: str, direction: str, width: int | None = None) -> VPort | None:
        p = top.get(name)
        if p is None:
            problems.append(f"{top_name} has no port {name}")
        elif p.direction != direction:
            problems.append(f"{top_name}.{name} is an {p.direction}put, expected {direction}put")
        elif width is not None and p.width != width:
            problems.append(f"{top_name}.{name} is {p.width} bits, expected {width}")
        return p

    for name in ("aclk", "aresetn"):
        need(name, "in", 1)
    need("interrupt", "out", 1)
    masters = [m_axi_name(i) for i in range(params.axi_ports)]
    for sig, direction in AXI_LITE_SIGNALS.items():
        need(f"s_axi_{sig}", direction)
    for sig in ("wdata", "rdata"):
        need(f"s_axi_{sig}", AXI_LITE_SIGNALS[sig], 32)           # the registers are 32-bit words
    need("s_axi_wstrb", "in", 4)
    for m in masters:
        for sig, direction in AXI_MASTER_SIGNALS.items():
            need(f"{m}_{sig}", direction)
        for sig in ("wdata", "rdata"):
            need(f"{m}_{sig}", AXI_MASTER_SIGNALS[sig], params.axi_dw)  # CFG_AXI_DW, the HP port's width
        need(f"{m}_wstrb", "out", params.axi_dw // 8)
    window_bits = (WINDOW_BYTES - 1).bit_length()
    for sig in ("awaddr", "araddr"):
        p = top.get(f"s_axi_{sig}")
        if p is not None and p.width < window_bits:
            problems.append(f"{top_name}.s_axi_{sig} is {p.width} bits: too narrow for the {WINDOW_BYTES}-byte "
                            f"register window of hw/regmap.py ({window_bits} bits)")
    widths = {top[f"{m}_{sig}"].width for m in masters for sig in ("awaddr", "araddr") if f"{m}_{sig}" in top}
    if len(widths) > 1:
        problems.append(f"{top_name}: the masters' awaddr and araddr differ in width ({sorted(widths)})")

    # the wrapper's interface attributes state the same widths as the ports
    for bus in ("s_axi", *masters):
        stated = _stated(top_v, bus)
        for key, sig in (("DATA_WIDTH", "wdata"), ("ADDR_WIDTH", "awaddr")):
            port = top.get(f"{bus}_{sig}")
            if port is not None and stated.get(key) != port.width:
                problems.append(f"{top_name}: {bus}'s X_INTERFACE_PARAMETER says {key} {stated.get(key)}, "
                                f"the port {bus}_{sig} is {port.width} bits")

    # the wrapper wires every inner port once, width for width, to a signal of the same width
    conns = instance_connections(parse_module(top_v, top_name), inner_name)
    for name, port in inner.items():
        outer = conns.get(name)
        if outer is None:
            problems.append(f"{top_name} leaves {inner_name}.{name} unconnected")
            continue
        if outer in top and top[outer].width != port.width:
            problems.append(f"{top_name} connects {inner_name}.{name} ({port.width} bits) to {outer} "
                            f"({top[outer].width} bits)")
    for name in conns:
        if name not in inner:
            problems.append(f"{top_name} connects {inner_name}.{name}, which {inner_name} does not have")

    if tcl is not None:
        problems += _check_tcl(tcl, top, top_name)
    return problems


def _check_tcl(tcl: Mapping[str, str], top: Mapping[str, VPort], top_name: str) -> list[str]:
    from fluidnpu.hw.regmap import WINDOW_BYTES

    problems = []
    values: dict[str, str] = {}
    for text in tcl.values():
        values |= dict(re.findall(r"^set (fluidnpu_\w+) (\S+)$", text, re.M))
    checks = {"fluidnpu_top": top_name, "fluidnpu_window": str(WINDOW_BYTES)}
    if f"{m_axi_name(0)}_awaddr" in top:
        checks["fluidnpu_m_axi_addr_width"] = str(top[f"{m_axi_name(0)}_awaddr"].width)
    def same(a: str, b: str) -> bool:
        try:
            return int(a, 0) == int(b, 0)
        except ValueError:
            return a == b

    for var, want in checks.items():
        if var in values and not same(values[var], want):
            problems.append(f"the Tcl sets {var} {values[var]}, the generated Verilog says {want}")
        elif var not in values:
            problems.append(f"the Tcl does not set {var}")
    prefixes = {"s_axi", m_axi_name(0)}
    every = " ".join(tcl.values())
    for busif in TCL_INTERFACES:
        if busif in prefixes:
            if not any(n.startswith(busif + "_") for n in top):
                problems.append(f"the Tcl uses the interface {busif}, {top_name} has no {busif}_* port")
        elif busif not in top:
            problems.append(f"the Tcl uses {busif}, {top_name} has no such port")
        if busif not in every:
            problems.append(f"the Tcl never refers to {busif}")
    return problems


def check_files(outdir: str | Path, params: Any, *, top_name: str = "fluidnpu_top",
                inner_name: str = "fluidnpu_npu") -> list[str]:
    """`check_rtl` on the files `fluidnpu rtl` (and, where present, `fluidnpu vivado`) wrote."""
    d = Path(outdir)
    tcl_dir = d.parent if d.name == "rtl" else d
    tcl = {p.name: p.read_text() for p in (tcl_dir / "package_ip.tcl", tcl_dir / "block_design.tcl") if p.is_file()}
    return check_rtl((d / f"{top_name}.v").read_text(), (d / f"{inner_name}.v").read_text(), params,
                     top_name=top_name, inner_name=inner_name, tcl=tcl or None)
