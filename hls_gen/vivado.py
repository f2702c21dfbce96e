"""A scripted Vivado project for a design bundle: IP packaging, block design, bitstream and .hwh.

`write_vivado_project(bundle, outdir)` writes into `outdir`:

* `rtl/` — the NPU Verilog, the `fluidnpu_top` wrapper and the register map
  (`hw/rtl_gen.generate_rtl`, exactly what `fluidnpu rtl` writes);
* `package_ip.tcl` — packages `fluidnpu_top` as the IP `hw/regmap.VLNV` into
  `ip/`: bus interfaces inferred from the wrapper's X_INTERFACE attributes and
  associated with `aclk`, the s_axi register window (`WINDOW_BYTES`), and a
  fixed `DESIGN_HASH` user parameter the host driver checks in the `.hwh`;
* `block_design.tcl` — the processing system of the bundle's board (board
  presets where Vivado has the board files), the NPU, a Processor System
  Reset, SmartConnects (registers on the PS's general-purpose master; one per
  NPU master port, `m_axi<i>` on HP port i: every port the board has, up to
  four), the interrupt, and the address map (DDR for each master);
* `build.tcl` — project, packaging, block design, synthesis and
  implementation runs, `write_bitstream`, then `npu.bit` + `npu.hwh` (same
  basename, as PYNQ wants them), `npu.xsa`, reports and `build_report.json`;
* `build.sh` (`vivado -mode batch -source build.tcl`) and `README.txt`.

Every number in the Tcl comes from the bundle, the generated RTL or
`hw/regmap.py`; the per-PS facts (IP names, pins, CONFIG keys, the default
register base address) are the tables below. Paths in the scripts are
relative to the script's own directory, so `outdir` can be copied to the
machine that has Vivado.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.hw.regmap import m_axi_name
from fluidnpu.output import make_dir, write_text

BD_NAME = "fluidnpu_bd"
NPU_CELL = "npu"
PS_CELL = "ps"
RESET_CELL = "rst_npu"
REG_SMC = "smc_regs"
MEM_SMC = "smc_mem"
ADDR_BLOCK = "reg0"
PROJECT = "fluidnpu"
OUTPUT_BASENAME = "npu"  # npu.bit + npu.hwh (+ npu.xsa): PYNQ finds the .hwh by the .bit's basename
MIN_VIVADO = "2020.1"    # write_hw_platform, <project>.gen/ directories


@dataclass(frozen=True)
class PsFamily:
    """What the block design needs to know about one processing system."""

    family: str                    # the board file's "family"
    title: str
    ip: str                        # vendor:library:name; the newest version in the catalog is used
    ipx_family: str                # supported_families name for ipx
    hp_widths: tuple[int, ...]     # data widths the HP ports can be set to
    clk: str                       # PL clock output pin
    resetn: str                    # PL reset output pin (active low)
    irq: str                       # PL-to-PS interrupt input
    gp_master: str                 # general-purpose master interface (registers)
    gp_aclk: str
    # HP port i (the NPU's m_axi<i>): names with {i} = port, {g} = the PS's S_AXI_GP index of that port
    hp_slave: str                  # high-performance slave interface (NPU memory)
    hp_aclk: str
    ddr_segment: str               # the HP port's DDR address segment, relative to the PS cell
    reg_base: int                  # register window base in the GP master's range (Vivado's default)
    automation_rule: str
    automation_config: str         # Tcl list elements; $preset is 1 (apply the board preset) or 0
    config: Callable[[float, int, int], dict[str, str]]  # clock MHz, HP width, HP ports -> CONFIG.* of the PS
    clock_key: str                 # CONFIG key of the requested PL clock
    clock_actual_key: str          # CONFIG key Vivado fills with the clock it can make
    hp_width_key: str
    hp_gp_base: int = 0            # {g} = hp_gp_base + i
    hp_ports: int = 4              # HP ports the PS has

    def hp(self, i: int, name: str) -> str:
        """HP port i's `hp_slave` / `hp_aclk` / `ddr_segment` / `hp_width_key`."""
        if not 0 <= i < self.hp_ports:
            raise FluidError(f"the {self.title} has HP ports 0..{self.hp_ports - 1}, not {i}")
        return getattr(self, name).format(i=i, g=self.hp_gp_base + i)


def _z7_config(clock_mhz: float, hp_width: int, ports: int) -> dict[str, str]:
    hp: dict[str, str] = {}
    for i in range(ports):
        hp |= {f"CONFIG.PCW_USE_S_AXI_HP{i}": "1", f"CONFIG.PCW_S_AXI_HP{i}_DATA_WIDTH": str(hp_width)}
    return {"CONFIG.PCW_USE_M_AXI_GP0": "1", **hp,
            "CONFIG.PCW_EN_CLK0_PORT": "1", "CONFIG.PCW_EN_RST0_PORT": "1",
            "CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ": f"{clock_mhz:g}",
            "CONFIG.PCW_USE_FABRIC_INTERRUPT": "1", "CONFIG.PCW_IRQ_F2P_INTR": "1"}


def _zynqmp_config(clock_mhz: float, hp_width: int, ports: int) -> dict[str, str]:
    hp: dict[str, str] = {}
    for i in range(ports):      # S_AXI_HP<i>_FPD is S_AXI_GP<i+2>
        hp |= {f"CONFIG.PSU__USE__S_AXI_GP{i + 2}": "1", f"CONFIG.PSU__SAXIGP{i + 2}__DATA_WIDTH": str(hp_width)}
    return {"CONFIG.PSU__USE__M_AXI_GP0": "1", "CONFIG.PSU__USE__M_AXI_GP1": "0",
            "CONFIG.PSU__USE__M_AXI_GP2": "0", **hp,
            "CONFIG.PSU__FPGA_PL0_ENABLE": "1", "CONFIG.PSU__NUM_FABRIC_RESETS": "1",
            "CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ": f"{clock_mhz:g}",
            "CONFIG.PSU__USE__IRQ0": "1"}


PS_FAMILIES: dict[str, PsFamily] = {
    "zynq7000": PsFamily(
        family="zynq7000", title="Zynq-7000 (processing_system7)", ip="xilinx.com:ip:processing_system7",
        ipx_family="zynq", hp_widths=(32, 64), clk="FCLK_CLK0", resetn="FCLK_RESET0_N", irq="IRQ_F2P",
        gp_master="M_AXI_GP0", gp_aclk="M_AXI_GP0_ACLK", hp_slave="S_AXI_HP{i}", hp_aclk="S_AXI_HP{i}_ACLK",
        ddr_segment="S_AXI_HP{i}/HP{i}_DDR_LOWOCM", reg_base=0x43C0_0000,
        automation_rule="xilinx.com:bd_rule:processing_system7",
        automation_config="make_external {FIXED_IO, DDR} apply_board_preset $preset Master Disable Slave Disable",
        config=_z7_config, clock_key="CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ",
        clock_actual_key="CONFIG.PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ",
        hp_width_key="CONFIG.PCW_S_AXI_HP{i}_DATA_WIDTH"),
    "zynqmp": PsFamily(
        family="zynqmp", title="Zynq UltraScale+ MPSoC (zynq_ultra_ps_e)", ip="xilinx.com:ip:zynq_ultra_ps_e",
        ipx_family="zynquplus", hp_widths=(32, 64, 128), clk="pl_clk0", resetn="pl_resetn0", irq="pl_ps_irq0",
        gp_master="M_AXI_HPM0_FPD", gp_aclk="maxihpm0_fpd_aclk", hp_slave="S_AXI_HP{i}_FPD",
        hp_aclk="saxihp{i}_fpd_aclk", ddr_segment="SAXIGP{g}/HP{i}_DDR_LOW", reg_base=0xA000_0000,
        automation_rule="xilinx.com:bd_rule:zynq_ultra_ps_e", automation_config="apply_board_preset $preset",
        config=_zynqmp_config, clock_key="CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ",
        clock_actual_key="CONFIG.PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ",
        hp_width_key="CONFIG.PSU__SAXIGP{g}__DATA_WIDTH", hp_gp_base=2),
}

# Vivado board files (shipped with Vivado) of the built-in boards; the newest installed version is used.
BOARD_PARTS: dict[str, str] = {"zc706": "xilinx.com:zc706:part0:*", "zcu104": "xilinx.com:zcu104:part0:*"}


@dataclass(frozen=True)
class Target:
    """The resolved build target of a bundle."""

    board: str
    part: str
    ps: PsFamily
    board_part_pattern: str  # "" for a user board: part only, PS defaults
    clock_mhz: float
    hp_width: int
    hp_ports: int = 1        # NPU master ports = HP ports used (the board's, at most the PS's)


def resolve_target(bundle: Any) -> Target:
    """The board's PS family and HP width, or a one-line FluidError saying why it cannot be built."""
    board = bundle.board
    family = board.family
    if not family and board.name in BOARD_PARTS:  # bundles written before boards carried "family"
        from fluidnpu.boards.catalog import load_board

        family = load_board(board.name).family
    ps = PS_FAMILIES.get(family)
    if ps is None:
        supported = " or ".join(f'"{k}" ({v.title})' for k, v in PS_FAMILIES.items())
        named = f'has family "{family}"' if family else 'names no "family"'
        raise FluidError(f"board {board.name} ({board.part}) {named}; `fluidnpu vivado` builds only for the "
                         f"processing systems {supported}: if the board has one, name it as \"family\" in "
                         "the board file and re-run `fluidnpu dse`")
    width = int(board.hp_width_bits)
    if width not in ps.hp_widths:
        raise FluidError(f"board {board.name}: hp_width_bits {width} is not a width the {ps.title} HP port "
                         f"supports ({', '.join(map(str, ps.hp_widths))})")
    from fluidnpu.hw.regmap import NpuParams

    ports = NpuParams.from_bundle(bundle).axi_ports
    if ports > ps.hp_ports:
        raise FluidError(f"board {board.name}: {ports} HP ports, but the {ps.title} has {ps.hp_ports}")
    return Target(board=board.name, part=board.part, ps=ps, board_part_pattern=BOARD_PARTS.get(board.name, ""),
                  clock_mhz=float(bundle.clock_mhz), hp_width=width, hp_ports=ports)


# ---- Tcl text ------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9_.:/*+\-]+")


def tcl_word(value: Any) -> str:
    """`value` as one Tcl word: bare when it is plain, braced otherwise."""
    text = str(value)
    if _PLAIN.fullmatch(text):
        return text
    if any(c in text for c in "{}\\\n\r") or text.count("{") != text.count("}"):
        raise FluidError(f"cannot write {text!r} into a Tcl script (braces, backslashes or newlines)")
    return "{" + text + "}"


def _tcl_dict(d: Mapping[str, str]) -> str:
    return "[list " + " ".join(f"{k} {{{v}}}" for k, v in d.items()) + "]"


_HEADER = """\
# {name}: {what}
# Generated by fluidnpu.hls_gen.vivado (`fluidnpu vivado`) from {bundle}; do not edit, regenerate.
# Board {board} ({part}), {ps}, PL clock {clock:g} MHz, design hash {hash}.
"""


def _header(name: str, what: str, ctx: Mapping[str, Any]) -> str:
    return _HEADER.format(name=name, what=what, **ctx)


def _vars(values: Mapping[str, Any]) -> str:
    return "\n".join(f"set {k} {tcl_word(v)}" for k, v in values.items()) + "\n"


def _m_axi_addr_width(top_v: str) -> int:
    widths = set(re.findall(r"XIL_INTERFACENAME m_axi\d+,[^\"]*ADDR_WIDTH (\d+)", top_v))
    if len(widths) != 1:
        raise FluidError("the generated fluidnpu_top.v states no single m_axi<i> ADDR_WIDTH; cannot package it")
    return int(widths.pop())


def package_ip_tcl(ctx: Mapping[str, Any]) -> str:
    from fluidnpu.hw.regmap import VLNV, WINDOW_BYTES

    vendor, library, name, version = VLNV.split(":")
    head = _header("package_ip.tcl", f"package fluidnpu_top as the IP {VLNV} into ip/", ctx)
    return head + "\n" + "set fluidnpu_here [file normalize [file dirname [info script]]]\n" + _vars({
        "fluidnpu_part": ctx["part"], "fluidnpu_vendor": vendor, "fluidnpu_library": library,
        "fluidnpu_name": name, "fluidnpu_version": version, "fluidnpu_family": ctx["ipx_family"],
        "fluidnpu_top": ctx["top_module"], "fluidnpu_window": WINDOW_BYTES,
        "fluidnpu_m_axi_addr_width": ctx["m_axi_addr_width"], "fluidnpu_design_hash": ctx["hash"],
    }) + _vars({"fluidnpu_sources": " ".join(ctx["rtl_files"]), "fluidnpu_masters": " ".join(ctx["m_axi"])}) + r"""
set fluidnpu_ip_dir [file join $fluidnpu_here ip]
file delete -force $fluidnpu_ip_dir
create_project -force fluidnpu_ip [file join $fluidnpu_here vivado_ip] -part $fluidnpu_part
set fluidnpu_files {}
foreach f $fluidnpu_sources { lappend fluidnpu_files [file join $fluidnpu_here rtl $f] }
add_files -norecurse $fluidnpu_files
set_property top $fluidnpu_top [current_fileset]
update_compile_order -fileset sources_1

ipx::package_project -root_dir $fluidnpu_ip_dir -vendor $fluidnpu_vendor -library $fluidnpu_library \
    -taxonomy /UserIP -import_files
set core [ipx::current_core]
set_property vendor $fluidnpu_vendor $core
set_property library $fluidnpu_library $core
set_property name $fluidnpu_name $core
set_property version $fluidnpu_version $core
set_property display_name "fluidnpu NPU" $core
set_property description "fluidnpu early-exit NPU (Fluid Batching, Stackable PEs); registers on s_axi, DDR on $fluidnpu_masters" $core
set_property supported_families [list $fluidnpu_family Production] $core

# Bus interfaces come from the wrapper's X_INTERFACE_INFO attributes; all must be there
# (if one is not, inference by port names is tried once).
set missing {}
foreach busif [list s_axi {*}$fluidnpu_masters aclk aresetn interrupt] {
    if {[llength [ipx::get_bus_interfaces $busif -of_objects $core]] == 0} { lappend missing $busif }
}
if {[llength $missing] > 0} {
    foreach def {xilinx.com:interface:aximm_rtl:1.0 xilinx.com:signal:clock_rtl:1.0
                 xilinx.com:signal:reset_rtl:1.0 xilinx.com:signal:interrupt_rtl:1.0} {
        ipx::infer_bus_interfaces $def $core
    }
    foreach busif $missing {
        if {[llength [ipx::get_bus_interfaces $busif -of_objects $core]] == 0} {
            error "fluidnpu: Vivado inferred no bus interface $busif on $fluidnpu_top"
        }
    }
}
ipx::associate_bus_interfaces -busif s_axi -clock aclk $core
foreach busif $fluidnpu_masters { ipx::associate_bus_interfaces -busif $busif -clock aclk $core }
ipx::associate_bus_interfaces -clock aclk -reset aresetn $core

# The register window: one address block of WINDOW_BYTES (hw/regmap.py).
set mm [ipx::get_memory_maps s_axi -of_objects $core]
if {[llength $mm] == 0} { set mm [ipx::add_memory_map s_axi $core] }
set_property slave_memory_map_ref s_axi [ipx::get_bus_interfaces s_axi -of_objects $core]
set blk [ipx::get_address_blocks reg0 -of_objects $mm]
if {[llength $blk] == 0} { set blk [ipx::add_address_block reg0 $mm] }
set_property range $fluidnpu_window $blk
set_property width 32 $blk
set_property usage register $blk

# The NPU's DMA address spaces: each master's whole address range.
foreach busif $fluidnpu_masters {
    set as [ipx::get_address_spaces $busif -of_objects $core]
    if {[llength $as] == 0} { set as [ipx::add_address_space $busif $core] }
    set_property master_address_space_ref $busif [ipx::get_bus_interfaces $busif -of_objects $core]
    set_property range [expr {wide(1) << $fluidnpu_m_axi_addr_width}] $as
    set_property width $fluidnpu_m_axi_addr_width $as
}

# DESIGN_HASH: the bundle's design_hash(); the host driver compares it with the bundle's before loading.
set p [ipx::get_user_parameters DESIGN_HASH -of_objects $core]
if {[llength $p] == 0} { set p [ipx::add_user_parameter DESIGN_HASH $core] }
set_property value_resolve_type user $p
set_property value_format string $p
set_property value $fluidnpu_design_hash $p
set_property enablement_value false $p
ipgui::add_param -name DESIGN_HASH -component $core

ipx::create_xgui_files $core
ipx::update_checksums $core
ipx::check_integrity $core
ipx::save_core $core
close_project
puts "fluidnpu: packaged $fluidnpu_vendor:$fluidnpu_library:$fluidnpu_name:$fluidnpu_version (DESIGN_HASH $fluidnpu_design_hash) into $fluidnpu_ip_dir"
"""  # noqa: E501 (Tcl lines kept whole, as the script Vivado reads)


def _hp_ports_tcl(target: Target) -> tuple[str, str, str]:
    """Per NPU master port its SmartConnect to its HP port (Tcl), and the clock and reset pins they add."""
    ps, lines = target.ps, []
    smcs = [f"{MEM_SMC}{i}" for i in range(target.hp_ports)]
    clocks = " ".join(f"[get_bd_pins {smc}/aclk]" for smc in smcs)
    hp_clocks = " ".join(f"[get_bd_pins {PS_CELL}/{ps.hp(i, 'hp_aclk')}]" for i in range(target.hp_ports))
    resets = " ".join(f"[get_bd_pins {smc}/aresetn]" for smc in smcs)
    for i, smc in enumerate(smcs):
        master = m_axi_name(i)
        lines += [
            f"# NPU {master} (AXI4) -> SmartConnect -> PS {ps.hp(i, 'hp_slave')} (DDR).",
            f"set smc [create_bd_cell -type ip -vlnv [fluidnpu_ipdef xilinx.com:ip:smartconnect] {smc}]",
            "set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] $smc",
            f"connect_bd_intf_net [get_bd_intf_pins {NPU_CELL}/{master}] [get_bd_intf_pins {smc}/S00_AXI]",
            f"connect_bd_intf_net [get_bd_intf_pins {smc}/M00_AXI] [get_bd_intf_pins {PS_CELL}/{ps.hp(i, 'hp_slave')}]",
        ]
    return "\n".join(lines) + "\n", clocks + " " + hp_clocks, resets


def _hp_address_and_width_tcl(target: Target) -> str:
    """DDR in each NPU master's address space, and each HP port's width checked against the NPU's."""
    ps, lines = target.ps, []
    for i in range(target.hp_ports):
        master = m_axi_name(i)
        lines += [
            f"assign_bd_address -target_address_space [get_bd_addr_spaces {NPU_CELL}/{master}] \\",
            f"    [get_bd_addr_segs {PS_CELL}/{ps.hp(i, 'ddr_segment')}]",
        ]
    lines.append("# Every HP port must be as wide as the NPU's masters (CFG_AXI_DW) and the board's hp_width_bits.")
    for i in range(target.hp_ports):
        master = m_axi_name(i)
        lines += [
            f"set hp_width [get_property {ps.hp(i, 'hp_width_key')} $ps]",
            f"set npu_width [get_property CONFIG.DATA_WIDTH [get_bd_intf_pins {NPU_CELL}/{master}]]",
            "if {$hp_width != $fluidnpu_hp_width || $npu_width != $fluidnpu_hp_width} {",
            f'    error "fluidnpu: {ps.hp(i, "hp_slave")} is $hp_width bits and NPU {master} $npu_width bits; '
            'the bundle wants $fluidnpu_hp_width"',
            "}",
        ]
    return "\n".join(lines) + "\n"


def block_design_tcl(ctx: Mapping[str, Any], target: Target) -> str:
    from fluidnpu.hw.regmap import VLNV, WINDOW_BYTES

    ps = target.ps
    ports_tcl, mem_clocks, mem_resets = _hp_ports_tcl(target)
    head = _header("block_design.tcl", "the block design (run from build.tcl, in its project)", ctx)
    return head + "\n" + _vars({
        "fluidnpu_bd": BD_NAME, "fluidnpu_vlnv": VLNV, "fluidnpu_ps_ip": ps.ip,
        "fluidnpu_clock_mhz": f"{target.clock_mhz:g}", "fluidnpu_hp_width": target.hp_width,
        "fluidnpu_hp_ports": target.hp_ports,
        "fluidnpu_reg_base": f"0x{ps.reg_base:08X}", "fluidnpu_window": f"0x{WINDOW_BYTES:X}",
    }) + f"""\
if {{![info exists fluidnpu_board_part]}} {{ set fluidnpu_board_part "" }}

proc fluidnpu_ipdef {{vln}} {{
    set defs [lsort -dictionary [get_ipdefs -all -quiet "$vln:*"]]
    if {{[llength $defs] == 0}} {{ error "fluidnpu: the IP $vln is not in the Vivado IP catalog" }}
    return [lindex $defs end]
}}

create_bd_design $fluidnpu_bd

# Processing system: the board's presets (DDR, MIO, clocks) when Vivado has its board files, then our ports.
set ps [create_bd_cell -type ip -vlnv [fluidnpu_ipdef $fluidnpu_ps_ip] {PS_CELL}]
set preset [expr {{$fluidnpu_board_part ne "" ? 1 : 0}}]
apply_bd_automation -rule {ps.automation_rule} -config [list {ps.automation_config}] $ps
set_property -dict {_tcl_dict(ps.config(target.clock_mhz, target.hp_width, target.hp_ports))} $ps

set npu [create_bd_cell -type ip -vlnv $fluidnpu_vlnv {NPU_CELL}]
set rst [create_bd_cell -type ip -vlnv [fluidnpu_ipdef xilinx.com:ip:proc_sys_reset] {RESET_CELL}]
set smc_regs [create_bd_cell -type ip -vlnv [fluidnpu_ipdef xilinx.com:ip:smartconnect] {REG_SMC}]
set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] $smc_regs
# Memory: one SmartConnect per NPU master (all HP ports reach the same DDR, so one interconnect
# with several masters and slaves could not route by address).
{ports_tcl}
# One clock (the PS's PL clock at the bundle's clock) for the NPU, the interconnects and all PS ports.
connect_bd_net [get_bd_pins {PS_CELL}/{ps.clk}] [get_bd_pins {NPU_CELL}/aclk] \\
    [get_bd_pins {RESET_CELL}/slowest_sync_clk] [get_bd_pins {REG_SMC}/aclk] \\
    [get_bd_pins {PS_CELL}/{ps.gp_aclk}] {mem_clocks}
# Reset: the PS's PL reset through a Processor System Reset (a PL reset pulse from software reaches the NPU).
connect_bd_net [get_bd_pins {PS_CELL}/{ps.resetn}] [get_bd_pins {RESET_CELL}/ext_reset_in]
connect_bd_net [get_bd_pins {RESET_CELL}/peripheral_aresetn] [get_bd_pins {NPU_CELL}/aresetn]
connect_bd_net [get_bd_pins {RESET_CELL}/interconnect_aresetn] [get_bd_pins {REG_SMC}/aresetn] {mem_resets}
# Registers: PS general-purpose master -> SmartConnect -> NPU s_axi (AXI4-Lite).
connect_bd_intf_net [get_bd_intf_pins {PS_CELL}/{ps.gp_master}] [get_bd_intf_pins {REG_SMC}/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins {REG_SMC}/M00_AXI] [get_bd_intf_pins {NPU_CELL}/s_axi]
# Interrupt: level, active high.
connect_bd_net [get_bd_pins {NPU_CELL}/interrupt] [get_bd_pins {PS_CELL}/{ps.irq}]

# Address map: the register window (hw/regmap.py WINDOW_BYTES) in the PS's data space; DDR for each NPU master.
assign_bd_address -offset $fluidnpu_reg_base -range $fluidnpu_window \\
    -target_address_space [get_bd_addr_spaces {PS_CELL}/Data] [get_bd_addr_segs {NPU_CELL}/s_axi/{ADDR_BLOCK}]
{_hp_address_and_width_tcl(target)}
# The clock the PS can actually make (PLL dividers) may differ from the bundle's.
set fluidnpu_clock_actual [get_property {ps.clock_actual_key} $ps]
if {{$fluidnpu_clock_actual eq "" || abs($fluidnpu_clock_actual - $fluidnpu_clock_mhz) > 0.01 * $fluidnpu_clock_mhz}} {{
    puts "WARNING: fluidnpu: the PS makes $fluidnpu_clock_actual MHz for {ps.clk}, the bundle asks $fluidnpu_clock_mhz MHz; latencies scale accordingly"
}}

validate_bd_design
save_bd_design
puts "fluidnpu: block design $fluidnpu_bd: {ps.clk} $fluidnpu_clock_actual MHz, $fluidnpu_hp_ports HP ports of $fluidnpu_hp_width bits, registers at $fluidnpu_reg_base ($fluidnpu_window bytes)"
"""  # noqa: E501 (Tcl lines kept whole, as the script Vivado reads)


def build_tcl(ctx: Mapping[str, Any], target: Target) -> str:
    head = _header("build.tcl", "the whole build: vivado -mode batch -source build.tcl", ctx)
    return head + "\n" + "set fluidnpu_here [file normalize [file dirname [info script]]]\n" + _vars({
        "fluidnpu_part": target.part, "fluidnpu_board": target.board,
        "fluidnpu_board_pattern": target.board_part_pattern or "-",
        "fluidnpu_project": PROJECT, "fluidnpu_bd": BD_NAME, "fluidnpu_out": OUTPUT_BASENAME,
        "fluidnpu_min_vivado": MIN_VIVADO, "fluidnpu_clock_mhz": f"{target.clock_mhz:g}",
        "fluidnpu_design_hash": ctx["hash"], "fluidnpu_hp_width": target.hp_width,
    }) + r"""
set fluidnpu_jobs [expr {[info exists ::env(FLUIDNPU_JOBS)] ? $::env(FLUIDNPU_JOBS) : 4}]
set fluidnpu_vivado [version -short]
if {[package vcompare [lindex [split $fluidnpu_vivado "_"] 0] $fluidnpu_min_vivado] < 0} {
    puts "WARNING: fluidnpu: written for Vivado $fluidnpu_min_vivado or later; this is $fluidnpu_vivado"
}
puts "fluidnpu: building for $fluidnpu_board ($fluidnpu_part) at $fluidnpu_clock_mhz MHz with Vivado $fluidnpu_vivado"

# 1. The NPU as an IP (its own throw-away project).
source [file join $fluidnpu_here package_ip.tcl]

# 2. The project, with the board's presets when Vivado has its board files.
set fluidnpu_proj_dir [file join $fluidnpu_here vivado]
create_project -force $fluidnpu_project $fluidnpu_proj_dir -part $fluidnpu_part
set fluidnpu_board_part ""
if {$fluidnpu_board_pattern ne "-"} {
    set fluidnpu_board_part [lindex [lsort -dictionary [get_board_parts -quiet $fluidnpu_board_pattern]] end]
    if {$fluidnpu_board_part eq ""} {
        puts "WARNING: fluidnpu: no Vivado board files for $fluidnpu_board ($fluidnpu_board_pattern); the PS keeps its defaults (check DDR/MIO)"
    } else {
        set_property board_part $fluidnpu_board_part [current_project]
    }
}
set_property ip_repo_paths [list [file join $fluidnpu_here ip]] [current_project]
update_ip_catalog

# 3. The block design and its wrapper.
source [file join $fluidnpu_here block_design.tcl]
set fluidnpu_bd_file [get_files $fluidnpu_bd.bd]
generate_target all $fluidnpu_bd_file
set fluidnpu_wrapper [make_wrapper -files $fluidnpu_bd_file -top]
add_files -norecurse $fluidnpu_wrapper
set_property top ${fluidnpu_bd}_wrapper [current_fileset]
update_compile_order -fileset sources_1

# 4. Synthesis, implementation, bitstream.
launch_runs synth_1 -jobs $fluidnpu_jobs
wait_on_run synth_1
if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} {
    error "fluidnpu: synthesis failed ([get_property STATUS [get_runs synth_1]]); see [file join $fluidnpu_proj_dir $fluidnpu_project.runs synth_1 runme.log]"
}
launch_runs impl_1 -to_step write_bitstream -jobs $fluidnpu_jobs
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {
    error "fluidnpu: implementation failed ([get_property STATUS [get_runs impl_1]]); see [file join $fluidnpu_proj_dir $fluidnpu_project.runs impl_1 runme.log]"
}
open_run impl_1
report_utilization -file [file join $fluidnpu_here utilization.rpt]
report_timing_summary -file [file join $fluidnpu_here timing_summary.rpt]
set fluidnpu_wns [get_property STATS.WNS [get_runs impl_1]]
set fluidnpu_whs [get_property STATS.WHS [get_runs impl_1]]
set fluidnpu_timing_met [expr {$fluidnpu_wns >= 0 && $fluidnpu_whs >= 0}]
if {!$fluidnpu_timing_met && ![info exists ::env(FLUIDNPU_IGNORE_TIMING)]} {
    error "fluidnpu: timing not met at $fluidnpu_clock_mhz MHz (WNS $fluidnpu_wns ns, WHS $fluidnpu_whs ns; timing_summary.rpt): run the DSE with a lower --clock, or set FLUIDNPU_IGNORE_TIMING=1 to keep this bitstream"
}

# 5. npu.bit and npu.hwh side by side (PYNQ loads the .hwh with the .bit's basename), npu.xsa for PetaLinux.
set fluidnpu_bit [file join [get_property DIRECTORY [get_runs impl_1]] ${fluidnpu_bd}_wrapper.bit]
set fluidnpu_hwh ""
foreach sub {gen srcs} {
    set f [file join $fluidnpu_proj_dir $fluidnpu_project.$sub sources_1 bd $fluidnpu_bd hw_handoff $fluidnpu_bd.hwh]
    if {[file exists $f]} { set fluidnpu_hwh $f; break }
}
if {![file exists $fluidnpu_bit]} { error "fluidnpu: no bitstream at $fluidnpu_bit" }
if {$fluidnpu_hwh eq ""} { error "fluidnpu: no $fluidnpu_bd.hwh under $fluidnpu_proj_dir" }
file copy -force $fluidnpu_bit [file join $fluidnpu_here $fluidnpu_out.bit]
file copy -force $fluidnpu_hwh [file join $fluidnpu_here $fluidnpu_out.hwh]
write_hw_platform -fixed -include_bit -force -file [file join $fluidnpu_here $fluidnpu_out.xsa]

set fh [open [file join $fluidnpu_here build_report.json] w]
puts $fh "\{"
puts $fh "  \"vivado\": \"$fluidnpu_vivado\", \"part\": \"$fluidnpu_part\", \"board_part\": \"$fluidnpu_board_part\","
puts $fh "  \"clock_mhz\": $fluidnpu_clock_mhz, \"clock_mhz_actual\": \"$fluidnpu_clock_actual\", \"hp_width\": $fluidnpu_hp_width,"
puts $fh "  \"design_hash\": \"$fluidnpu_design_hash\", \"wns_ns\": \"$fluidnpu_wns\", \"whs_ns\": \"$fluidnpu_whs\", \"timing_met\": [expr {$fluidnpu_timing_met ? "true" : "false"}],"
puts $fh "  \"reg_base\": \"$fluidnpu_reg_base\", \"reg_range\": \"$fluidnpu_window\","
puts $fh "  \"bit\": \"$fluidnpu_out.bit\", \"hwh\": \"$fluidnpu_out.hwh\", \"xsa\": \"$fluidnpu_out.xsa\""
puts $fh "\}"
close $fh
puts "fluidnpu: wrote [file join $fluidnpu_here $fluidnpu_out.bit], $fluidnpu_out.hwh and $fluidnpu_out.xsa (WNS $fluidnpu_wns ns)"
"""  # noqa: E501 (Tcl lines kept whole, as the script Vivado reads)


BUILD_SH = """\
#!/bin/sh
# Builds npu.bit, npu.hwh and npu.xsa from this directory's Tcl (generated by `fluidnpu vivado`).
# Needs Vivado ({min} or later) on PATH (source <Vivado>/settings64.sh). FLUIDNPU_JOBS=N: parallel runs.
set -e
cd "$(dirname "$0")"
command -v vivado >/dev/null 2>&1 || {{ echo "build.sh: vivado is not on PATH (source <Vivado install>/settings64.sh)" >&2; exit 127; }}
exec vivado -mode batch -nojournal -log build.log -source build.tcl
"""  # noqa: E501 (Tcl lines kept whole, as the script Vivado reads)


def _port_list(target: Target) -> str:
    return ", ".join(f"{m_axi_name(i)} -> {target.ps.hp(i, 'hp_slave')}" for i in range(target.hp_ports))


def readme_txt(ctx: Mapping[str, Any], target: Target) -> str:
    ps = target.ps
    preset = (f"Vivado's {target.board} board files ({target.board_part_pattern}, newest installed) preset the PS"
              if target.board_part_pattern else
              f"{target.board} is a user board: no Vivado board preset is applied, so the PS keeps its\n"
              "default DDR/MIO settings; open vivado/fluidnpu.xpr and set them before using npu.xsa")
    deploy = ("ZCU104 with PYNQ: copy npu.bit, npu.hwh and the design bundle to the board, then\n"
              "    PynqDevice(\"npu.bit\", bundle=load_bundle(\"design.json\"))"
              if ps.family == "zynqmp" else
              "ZC706 / Zynq-7000 without PYNQ: build Linux from npu.xsa (PetaLinux), load npu.bit\n"
              f"(fpgautil -b npu.bit), then DevMemDevice(reg_base=0x{ps.reg_base:08X}) or UIO")
    return f"""\
fluidnpu Vivado project for {ctx['bundle']}
Generated by `fluidnpu vivado`; regenerate rather than edit.

Board {target.board} ({target.part}), {ps.title}
NPU <TR, TP, TC> = <{ctx['TR']}, {ctx['TP']}, {ctx['TC']}>, Bmax {ctx['bmax']}, design hash {ctx['hash']}
PL clock {ps.clk} at {target.clock_mhz:g} MHz; NPU {_port_list(target)} ({target.hp_width} bits each);
registers on {ps.gp_master} at 0x{ps.reg_base:08X} ({ctx['window']} bytes); interrupt -> {ps.irq}.
{preset}.

Build (Vivado {MIN_VIVADO} or later on PATH; takes tens of minutes to hours):

    ./build.sh                 # = vivado -mode batch -source build.tcl

It writes npu.bit and npu.hwh (same basename: PYNQ needs the .hwh beside the .bit),
npu.xsa (PetaLinux / Vitis), utilization.rpt, timing_summary.rpt and build_report.json.
The build stops if timing is not met (FLUIDNPU_IGNORE_TIMING=1 keeps the bitstream).
The Vivado project is in vivado/, the packaged NPU IP in ip/, the Verilog in rtl/.

Deploy: see docs/deploy.md in fluidnpu.
{deploy}
The driver checks the .hwh (VLNV, register range, DESIGN_HASH) and the NPU's CFG_* registers
against the bundle before it runs anything.

What was checked without Vivado: these Tcl scripts run in a Tcl 8.6 interpreter against
stand-ins for the Vivado commands (tests/test_hls_gen.py). Nothing here has been synthesised,
placed, routed or timed by the generator.
"""


def write_vivado_project(bundle: Any, outdir: Path, *, bundle_name: str = "design.json") -> dict[str, Any]:
    """Write the RTL and the Vivado scripts for `bundle` into `outdir`; returns the `--json` summary."""
    from fluidnpu.hw.regmap import VLNV, WINDOW_BYTES, NpuParams, design_hash
    from fluidnpu.hw.rtl_gen import generate_rtl, self_check

    target = resolve_target(bundle)  # refuse before the (slow) RTL generation
    outdir = make_dir(outdir)
    rtl = generate_rtl(bundle, outdir / "rtl", check=False)  # checked below, with the Tcl
    if rtl["axi_dw"] != target.hp_width:
        raise FluidError(f"the generated NPU's m_axi is {rtl['axi_dw']} bits (CFG_AXI_DW) but board "
                         f"{target.board}'s HP port is {target.hp_width} bits (hp_width_bits)")
    if rtl["axi_ports"] != target.hp_ports:
        raise FluidError(f"the generated NPU has {rtl['axi_ports']} AXI masters but board {target.board} "
                         f"gives it {target.hp_ports} HP ports")
    want_hash = f"0x{design_hash(bundle):08X}"
    if rtl["design_hash"] != want_hash:
        raise FluidError(f"the generated NPU reports design hash {rtl['design_hash']}, the bundle's is {want_hash}")
    top_v = Path(rtl["files"]["vivado_top"])
    npu_v = Path(rtl["files"]["npu_verilog"])
    TR, TP, TC = bundle.design
    ctx = {"bundle": bundle_name, "board": target.board, "part": target.part, "ps": target.ps.title,
           "clock": target.clock_mhz, "hash": want_hash, "ipx_family": target.ps.ipx_family,
           "top_module": rtl["top_module"], "rtl_files": [top_v.name, npu_v.name],
           "m_axi_addr_width": _m_axi_addr_width(top_v.read_text()), "m_axi": rtl["m_axi"],
           "TR": TR, "TP": TP, "TC": TC, "bmax": rtl["bmax"], "window": WINDOW_BYTES}
    files = {
        "package_ip": ("package_ip.tcl", package_ip_tcl(ctx)),
        "block_design": ("block_design.tcl", block_design_tcl(ctx, target)),
        "build": ("build.tcl", build_tcl(ctx, target)),
        "build_sh": ("build.sh", BUILD_SH.format(min=MIN_VIVADO)),
        "readme": ("README.txt", readme_txt(ctx, target)),
    }
    written = {}
    for key, (name, text) in files.items():
        path = outdir / name
        write_text(path, text)
        written[key] = str(path)
    (outdir / "build.sh").chmod(0o755)
    rtl["verilog_check"] = self_check(outdir / "rtl", NpuParams.from_bundle(bundle, axi_dw=rtl["axi_dw"]))
    ps = target.ps
    return {
        "outdir": str(outdir), "board": target.board, "part": target.part, "ps": ps.ip.rpartition(":")[2],
        "board_part": target.board_part_pattern or None, "clock_mhz": target.clock_mhz,
        "clock_pin": ps.clk, "hp_port": ps.hp(0, "hp_slave"),
        "hp_ports": [ps.hp(i, "hp_slave") for i in range(target.hp_ports)], "hp_width": target.hp_width,
        "m_axi": rtl["m_axi"], "reg_port": ps.gp_master,
        "reg_base": f"0x{ps.reg_base:08X}", "reg_range": WINDOW_BYTES, "irq": ps.irq, "vlnv": VLNV,
        "design_hash": want_hash, "outputs": {"bit": f"{OUTPUT_BASENAME}.bit", "hwh": f"{OUTPUT_BASENAME}.hwh",
                                              "xsa": f"{OUTPUT_BASENAME}.xsa"},
        "files": {**written, "rtl": {k: v for k, v in rtl["files"].items()}},
        "verilog_check": rtl["verilog_check"],
    }
