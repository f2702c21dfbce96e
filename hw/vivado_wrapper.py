"""A Verilog top for Vivado: standard AXI port names and bus-interface attributes around the NPU.

Amaranth names ports after the signature (`s_axi__awaddr`, `clk`, `rst`
active high). Vivado's IP packager and block designs expect `s_axi_awaddr`,
`aclk`, an active-low `aresetn` and `interrupt`, and infer the bus interfaces
from X_INTERFACE_INFO / X_INTERFACE_PARAMETER attributes. Each AXI master
`m_axi<i>` becomes the bus interface `m_axi<i>` (ports `m_axi<i>_awaddr`, ...). This module writes
`fluidnpu_top` with exactly those names and instantiates the converted NPU
inside, so the generated Verilog is never hand-edited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fluidnpu.hw.regmap import m_axi_name

WRAPPER_NAME = "fluidnpu_top"
_BUSES = {"s_axi": "slave AXI4-Lite", "m_axi": "master AXI4"}
# Optional AXI signals whose presence Vivado wants stated as HAS_* parameters.
_HAS = {"HAS_BURST": "awburst", "HAS_LOCK": "awlock", "HAS_CACHE": "awcache", "HAS_PROT": "awprot",
        "HAS_QOS": "awqos", "HAS_REGION": "awregion", "HAS_WSTRB": "wstrb", "HAS_BRESP": "bresp",
        "HAS_RRESP": "rresp"}


@dataclass(frozen=True)
class Port:
    """One port of the inner (Amaranth) module: member path, direction, width."""

    path: tuple[str, ...]
    direction: str  # "input" / "output", as seen from the module
    width: int

    @property
    def inner_name(self) -> str:
        return "__".join(self.path)

    @property
    def outer_name(self) -> str:
        return "interrupt" if self.path == ("irq",) else "_".join(self.path)


def master_buses(top: Any) -> list[str]:
    """The AXI master members of an NPU top, in port order: m_axi0, m_axi1, ..."""
    members = set(top.signature.members.keys())
    n = sum(1 for name in members if name.startswith("m_axi"))
    return [m_axi_name(i) for i in range(n)]


def top_ports(top: Any) -> list[Port]:
    """The signature ports of an Amaranth component, checked to be s_axi + m_axi0..m_axi{N-1} + irq."""
    from amaranth.lib.wiring import In

    members = set(top.signature.members.keys())
    masters = master_buses(top)
    if not masters or members != {"s_axi", "irq", *masters}:
        raise ValueError(f"the NPU top must have exactly the members s_axi, m_axi0 (.. m_axi<N-1>) and irq; "
                         f"it has {', '.join(sorted(members))}")
    ports = [Port(tuple(path), "input" if member.flow == In else "output", len(value))
             for path, member, value in top.signature.flatten(top)]
    _check_bus(ports, "s_axi", "awvalid", "input")
    for bus in masters:
        _check_bus(ports, bus, "awvalid", "output")
    irq = [p for p in ports if p.path == ("irq",)]
    if irq[0].direction != "output" or irq[0].width != 1:
        raise ValueError("irq must be a 1-bit output")
    return ports


def _check_bus(ports: list[Port], bus: str, probe: str, valid_dir: str) -> None:
    names = {p.path[1]: p for p in ports if p.path[0] == bus}
    if probe not in names or names[probe].direction != valid_dir:
        kind = _BUSES["s_axi" if bus == "s_axi" else "m_axi"]
        raise ValueError(f"{bus} must be the {kind} port ({bus}.{probe} an {valid_dir})")


def _bus_parameters(ports: list[Port], bus: str) -> str:
    sig = {p.path[1]: p for p in ports if p.path[0] == bus}
    params = [f"XIL_INTERFACENAME {bus}", f"PROTOCOL {'AXI4LITE' if bus == 's_axi' else 'AXI4'}",
              f"DATA_WIDTH {sig['wdata'].width}", f"ADDR_WIDTH {sig['awaddr'].width}",
              "READ_WRITE_MODE READ_WRITE"]
    if bus != "s_axi":
        params += [f"ID_WIDTH {sig['awid'].width if 'awid' in sig else 0}",
                   f"MAX_BURST_LENGTH {1 << sig['awlen'].width if 'awlen' in sig else 1}",
                   "SUPPORTS_NARROW_BURST 0"]
        params += [f"{key} {int(name in sig)}" for key, name in _HAS.items()]
    return ", ".join(params)


def vivado_wrapper(top: Any, inner_module: str, *, module_name: str = WRAPPER_NAME,
                   clock_hz: int | None = None) -> str:
    """Verilog of `module_name` wrapping `inner_module`, the Verilog that `top` was converted to.

    The inner module is expected to have Amaranth's `clk` and `rst` (sync
    domain) plus the flattened signature ports. `clock_hz`, when given, is
    stated as the clock's FREQ_HZ; left out, a block design propagates it.
    """
    ports = top_ports(top)
    masters = master_buses(top)
    clk_param = f"XIL_INTERFACENAME aclk, ASSOCIATED_BUSIF {':'.join(['s_axi', *masters])}, ASSOCIATED_RESET aresetn"
    if clock_hz is not None:
        clk_param += f", FREQ_HZ {int(clock_hz)}"
    decl = [
        '  (* X_INTERFACE_INFO = "xilinx.com:signal:clock:1.0 aclk CLK" *)',
        f'  (* X_INTERFACE_PARAMETER = "{clk_param}" *)',
        "  input  wire aclk,",
        '  (* X_INTERFACE_INFO = "xilinx.com:signal:reset:1.0 aresetn RST" *)',
        '  (* X_INTERFACE_PARAMETER = "XIL_INTERFACENAME aresetn, POLARITY ACTIVE_LOW" *)',
        "  input  wire aresetn,",
    ]
    seen_bus: set[str] = set()
    for p in ports:
        rng = f"[{p.width - 1}:0] " if p.width > 1 else ""
        if p.path == ("irq",):
            decl += ['  (* X_INTERFACE_INFO = "xilinx.com:signal:interrupt:1.0 interrupt INTERRUPT" *)',
                     '  (* X_INTERFACE_PARAMETER = "XIL_INTERFACENAME interrupt, SENSITIVITY LEVEL_HIGH" *)']
        else:
            bus, sig = p.path
            decl.append(f'  (* X_INTERFACE_INFO = "xilinx.com:interface:aximm:1.0 {bus} {sig.upper()}" *)')
            if bus not in seen_bus:
                seen_bus.add(bus)
                decl.append(f'  (* X_INTERFACE_PARAMETER = "{_bus_parameters(ports, bus)}" *)')
        decl.append(f"  {p.direction:<6} wire {rng}{p.outer_name},")
    decl[-1] = decl[-1].rstrip(",")
    conns = ["    .clk(aclk),", "    .rst(rst),"]
    conns += [f"    .{p.inner_name}({p.outer_name})," for p in ports]
    conns[-1] = conns[-1].rstrip(",")
    return "\n".join([
        f"// {module_name}: Vivado top of the fluidnpu NPU. Generated by fluidnpu.hw.vivado_wrapper; do not edit.",
        f"// s_axi: AXI4-Lite register slave (docs/register-map.md); {', '.join(masters)}: AXI4 masters to DDR",
        "// (one per HP port, DMA commands dealt round-robin);",
        "// interrupt: level, active high; aresetn: synchronous to aclk, active low.",
        f"module {module_name} (",
        *decl,
        ");",
        "  wire rst = ~aresetn;",
        "",
        f"  {inner_module} npu (",
        *conns,
        "  );",
        "endmodule",
        "",
    ])
