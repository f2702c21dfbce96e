"""`fluidnpu vivado`: the generated Tcl runs in a real Tcl 8.6 interpreter against stand-in Vivado commands.

Vivado is not available here. Each script is `source`d by Python's Tcl
(tkinter.Tcl()) with an `unknown` proc routing every command Tcl does not
know to a Python recorder (`FakeVivado`) that keeps the state a real Vivado
would: the project and its part, the packaged IP (its bus interfaces are
inferred from the generated wrapper's X_INTERFACE_INFO attributes, as
Vivado's packager does), block design cells, nets, interface nets,
addresses, and runs. `launch_runs impl_1` writes a fake bitstream where
Vivado would; `generate_target` writes a .hwh from the recorded block
design in PYNQ's format, so the real `file copy` of build.tcl and the host
driver's .hwh check run on the results. Syntax errors and `error` calls in
the scripts fail the tests; `exit` is trapped. This checks the scripts'
logic and what they ask of Vivado, not that Vivado accepts every option.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

tkinter = pytest.importorskip("tkinter")
pytest.importorskip("amaranth")

from fluidnpu.boards.catalog import load_board  # noqa: E402
from fluidnpu.bundle import bundle_from_result, load_bundle  # noqa: E402
from fluidnpu.dse.search import DSEOptions, evaluate_design, explore  # noqa: E402
from fluidnpu.errors import FluidError  # noqa: E402
from fluidnpu.hls_gen.vivado import PS_FAMILIES, resolve_target, tcl_word  # noqa: E402
from fluidnpu.hw.regmap import VLNV, WINDOW_BYTES, design_hash  # noqa: E402

# per HP port i (the NPU's m_axi<i>): the four HP ports of each board, written out as UG585 / UG1085 name them
EXPECT = {
    "zc706": dict(part="xc7z045ffg900-2", board_part="xilinx.com:zc706:part0:1.4", ps="processing_system7",
                  clk="FCLK_CLK0", resetn="FCLK_RESET0_N", irq="IRQ_F2P", gp="M_AXI_GP0",
                  hp=["S_AXI_HP0", "S_AXI_HP1", "S_AXI_HP2", "S_AXI_HP3"], gp_aclk="M_AXI_GP0_ACLK",
                  hp_aclk=["S_AXI_HP0_ACLK", "S_AXI_HP1_ACLK", "S_AXI_HP2_ACLK", "S_AXI_HP3_ACLK"],
                  width_key=[f"CONFIG.PCW_S_AXI_HP{i}_DATA_WIDTH" for i in range(4)],
                  clock_key="CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ", clock=150, width=64,
                  ddr=["ps/S_AXI_HP0/HP0_DDR_LOWOCM", "ps/S_AXI_HP1/HP1_DDR_LOWOCM", "ps/S_AXI_HP2/HP2_DDR_LOWOCM",
                       "ps/S_AXI_HP3/HP3_DDR_LOWOCM"], family="zynq", ports=4),
    "zcu104": dict(part="xczu7ev-ffvc1156-2-e", board_part="xilinx.com:zcu104:part0:1.1", ps="zynq_ultra_ps_e",
                   clk="pl_clk0", resetn="pl_resetn0", irq="pl_ps_irq0", gp="M_AXI_HPM0_FPD",
                   hp=["S_AXI_HP0_FPD", "S_AXI_HP1_FPD", "S_AXI_HP2_FPD", "S_AXI_HP3_FPD"],
                   gp_aclk="maxihpm0_fpd_aclk",
                   hp_aclk=["saxihp0_fpd_aclk", "saxihp1_fpd_aclk", "saxihp2_fpd_aclk", "saxihp3_fpd_aclk"],
                   width_key=["CONFIG.PSU__SAXIGP2__DATA_WIDTH", "CONFIG.PSU__SAXIGP3__DATA_WIDTH",
                              "CONFIG.PSU__SAXIGP4__DATA_WIDTH", "CONFIG.PSU__SAXIGP5__DATA_WIDTH"],
                   clock_key="CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ", clock=200, width=128,
                   ddr=["ps/SAXIGP2/HP0_DDR_LOW", "ps/SAXIGP3/HP1_DDR_LOW", "ps/SAXIGP4/HP2_DDR_LOW",
                        "ps/SAXIGP5/HP3_DDR_LOW"], family="zynquplus", ports=2),
}
MASTERS = [f"m_axi{i}" for i in range(4)]      # both boards have four HP ports
INTERFACES = {"s_axi", *MASTERS, "aclk", "aresetn", "interrupt"}


def interfaces(ports: int) -> set[str]:
    """The NPU core's interfaces with `ports` AXI masters (the bundle's design.ports)."""
    return INTERFACES - set(MASTERS[ports:])


class FakeVivado:
    """Records the Vivado commands a script calls and answers like Vivado would, well enough for the scripts."""

    def __init__(self, tcl: Any, board_parts: tuple[str, ...] = (), wns: float = 0.25,
                 clock_actual: dict[str, str] | None = None, infer: str = "attributes") -> None:
        self.tcl = tcl
        self.infer = infer  # "attributes": package_project infers; "names": only infer_bus_interfaces; "none"
        self.board_parts = board_parts
        self.wns = wns
        self.clock_actual = clock_actual or {}
        self.calls: list[tuple[str, ...]] = []
        self.props: dict[str, dict[str, str]] = {}
        self.projects: list[dict[str, Any]] = []
        self.project: dict[str, Any] | None = None
        self.core: dict[str, Any] | None = None
        self.cores: list[dict[str, Any]] = []
        self.ip_repo: list[str] = []
        self.bd: str | None = None
        self.cells: dict[str, str] = {}
        self.nets: list[set[str]] = []
        self.intf_nets: list[tuple[str, str]] = []
        self.addresses: list[dict[str, str]] = []
        self.automation: list[dict[str, str]] = []

    # -- helpers ---------------------------------------------------------------------------------
    def _opts(self, args: tuple[str, ...], with_value: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
        opts, pos, i = {}, [], 0
        while i < len(args):
            a = args[i]
            if a.startswith("-") and len(a) > 1 and not a[1].isdigit():
                if a in with_value:
                    opts[a] = args[i + 1]
                    i += 2
                    continue
                opts[a] = "1"
            else:
                pos.append(a)
            i += 1
        return opts, pos

    def _list(self, text: str) -> list[str]:
        return list(self.tcl.splitlist(text))

    def _top_interfaces(self) -> dict[str, dict[str, str]]:
        """Bus interfaces Vivado infers from the top's X_INTERFACE_INFO / X_INTERFACE_PARAMETER attributes."""
        top = self.project["top"]
        src = next(Path(f) for f in self.project["files"] if Path(f).name == f"{top}.v")
        text = src.read_text()
        assert re.search(rf"^module {top} \(", text, re.M), f"{src} has no module {top}"
        infos = re.findall(r'X_INTERFACE_INFO = "\S+ (\w+) \w+"', text)
        params = dict(re.findall(r'X_INTERFACE_PARAMETER = "XIL_INTERFACENAME (\w+), ([^"]*)"', text))
        out = {}
        for name in dict.fromkeys(infos):
            kv = dict(item.strip().split(" ", 1) for item in params.get(name, "").split(",") if item.strip())
            out[name] = kv
        return out

    # -- dispatcher ------------------------------------------------------------------------------
    def __call__(self, cmd: str, *args: str) -> str:
        """The `unknown` proc's Python side; a failed check comes back as an error in the script."""
        try:
            return self._dispatch(cmd, *args)
        except Exception as exc:  # noqa: BLE001 - reported to Tcl, which raises it as TclError
            return f"__ERROR__{type(exc).__name__}: {exc}"

    def _dispatch(self, cmd: str, *args: str) -> str:
        self.calls.append((cmd, *args))
        name = cmd.lstrip(":").replace("::", "__")
        handler = getattr(self, "c_" + name, None)
        if handler is not None:
            return handler(*args)
        if cmd.startswith(("ipx::", "ipgui::")) or cmd in self.PASS:
            return ""
        raise AssertionError(f"the script called {cmd!r}, which neither Tcl nor the Vivado stand-in knows")

    PASS = {"update_compile_order", "update_ip_catalog", "validate_bd_design", "save_bd_design", "wait_on_run",
            "open_run", "close_project"}

    def c_version(self, *args: str) -> str:
        return "2022.2"

    def c_create_project(self, *args: str) -> str:
        opts, pos = self._opts(args, ("-part",))
        name, directory = pos
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.project = {"name": name, "dir": directory, "part": opts.get("-part"), "files": [], "top": None,
                        "props": {}}
        self.projects.append(self.project)
        return name

    def c_current_project(self, *args: str) -> str:
        return self.project["name"]

    def c_current_fileset(self, *args: str) -> str:
        return "sources_1"

    def c_get_runs(self, *args: str) -> str:
        return args[-1]

    def c_get_board_parts(self, *args: str) -> str:
        _, pos = self._opts(args, ())
        return " ".join(p for p in self.board_parts if fnmatch(p, pos[0]))

    def c_add_files(self, *args: str) -> str:
        _, pos = self._opts(args, ("-fileset",))
        for f in (x for p in pos for x in self._list(p)):
            assert Path(f).is_file(), f"add_files {f}: no such file"
            self.project["files"].append(f)
        return ""

    def c_get_files(self, *args: str) -> str:
        _, pos = self._opts(args, ("-of_objects",))
        return " ".join(f for f in self.project["files"] if fnmatch(Path(f).name, pos[0]))

    def c_set_property(self, *args: str) -> str:
        opts, pos = self._opts(args, ("-dict",))
        if "-dict" in opts:
            items = self._list(opts["-dict"])
            pairs = dict(zip(items[::2], items[1::2]))
            objs = pos
        else:
            pairs = {pos[0]: pos[1]}
            objs = pos[2:]
        for obj in (o for x in objs for o in self._list(x)):
            if obj == "sources_1" and "top" in pairs:
                self.project["top"] = pairs["top"]
            if obj == self.project["name"]:
                self.project["props"].update(pairs)
            if self.core is not None and obj == self.core["handle"]:
                self.core.update(pairs)
            self.props.setdefault(obj, {}).update(pairs)
        return ""

    def c_get_property(self, *args: str) -> str:
        _, pos = self._opts(args, ())
        prop, obj = pos[0], pos[1]
        if obj == "impl_1":
            return {"PROGRESS": "100%", "STATUS": "write_bitstream Complete!", "STATS.WNS": str(self.wns),
                    "STATS.WHS": "0.02", "DIRECTORY": self._run_dir("impl_1")}[prop]
        if obj == "synth_1":
            return {"PROGRESS": "100%", "STATUS": "synth_design Complete!"}[prop]
        if obj.startswith("/npu/m_axi") and prop == "CONFIG.DATA_WIDTH":
            return self.npu_core["interfaces"][obj.rsplit("/", 1)[1]]["DATA_WIDTH"]
        if prop in self.clock_actual:
            return self.clock_actual[prop]
        if "ACT_" in prop:  # the clock Vivado can make: here, exactly the one asked for
            return self.props.get(obj, {}).get(prop.replace("ACT_", ""), "")
        return self.props.get(obj, {}).get(prop, "")

    # -- IP packaging ----------------------------------------------------------------------------
    def c_ipx__package_project(self, *args: str) -> str:
        opts, _ = self._opts(args, ("-root_dir", "-vendor", "-library", "-taxonomy"))
        root = Path(opts["-root_dir"])
        root.mkdir(parents=True, exist_ok=True)
        self.core = {"handle": "ipx_core_0", "root": str(root), "vendor": opts["-vendor"],
                     "library": opts["-library"], "name": self.project["top"], "version": "1.0",
                     "interfaces": self._top_interfaces() if self.infer == "attributes" else {},
                     "associations": [], "memory_maps": {},
                     "address_spaces": {}, "user_parameters": {}, "saved": False}
        self.cores.append(self.core)
        return ""

    def c_ipx__infer_bus_interfaces(self, *args: str) -> str:
        if self.infer == "names":
            self.core["interfaces"] = self._top_interfaces()
        return ""

    def c_ipx__current_core(self, *args: str) -> str:
        return self.core["handle"]

    def c_ipx__get_bus_interfaces(self, *args: str) -> str:
        _, pos = self._opts(args, ("-of_objects",))
        return f"busif:{pos[0]}" if pos[0] in self.core["interfaces"] else ""

    def c_ipx__associate_bus_interfaces(self, *args: str) -> str:
        opts, _ = self._opts(args, ("-busif", "-clock", "-reset"))
        self.core["associations"].append(opts)
        return ""

    def _ipx_get(self, kind: str, args: tuple[str, ...]) -> str:
        _, pos = self._opts(args, ("-of_objects",))
        return f"{kind}:{pos[0]}" if pos[0] in self.core[kind] else ""

    def _ipx_add(self, kind: str, args: tuple[str, ...]) -> str:
        self.core[kind][args[0]] = {}
        return f"{kind}:{args[0]}"

    def c_ipx__get_memory_maps(self, *args: str) -> str:
        return self._ipx_get("memory_maps", args)

    def c_ipx__add_memory_map(self, *args: str) -> str:
        return self._ipx_add("memory_maps", args)

    def c_ipx__get_address_blocks(self, *args: str) -> str:
        _, pos = self._opts(args, ("-of_objects",))
        return f"address_block:{pos[0]}" if f"address_block:{pos[0]}" in self.props else ""

    def c_ipx__add_address_block(self, *args: str) -> str:
        self.props[f"address_block:{args[0]}"] = {"memory_map": args[1]}
        return f"address_block:{args[0]}"

    def c_ipx__get_address_spaces(self, *args: str) -> str:
        return self._ipx_get("address_spaces", args)

    def c_ipx__add_address_space(self, *args: str) -> str:
        return self._ipx_add("address_spaces", args)

    def c_ipx__get_user_parameters(self, *args: str) -> str:
        return self._ipx_get("user_parameters", args)

    def c_ipx__add_user_parameter(self, *args: str) -> str:
        return self._ipx_add("user_parameters", args)

    def c_ipx__save_core(self, *args: str) -> str:
        self.core["saved"] = True
        (Path(self.core["root"]) / "component.xml").write_text("<!-- stand-in -->\n")
        return ""

    @property
    def npu_core(self) -> dict[str, Any]:
        return self.cores[-1]

    def core_vlnv(self, core: dict[str, Any]) -> str:
        return ":".join(core[k] for k in ("vendor", "library", "name", "version"))

    # -- block design ----------------------------------------------------------------------------
    def c_get_ipdefs(self, *args: str) -> str:
        _, pos = self._opts(args, ())
        pattern = pos[0]
        known = [f"{vln}:{ver}" for vln, ver in (("xilinx.com:ip:processing_system7", "5.5"),
                                                  ("xilinx.com:ip:zynq_ultra_ps_e", "3.4"),
                                                  ("xilinx.com:ip:zynq_ultra_ps_e", "3.10"),
                                                  ("xilinx.com:ip:proc_sys_reset", "5.0"),
                                                  ("xilinx.com:ip:smartconnect", "1.0"))]
        known += [self.core_vlnv(c) for c in self.cores if c["saved"]]
        return " ".join(v for v in known if fnmatch(v, pattern))

    def c_create_bd_design(self, *args: str) -> str:
        self.bd = args[0]
        srcs = Path(self.project["dir"]) / f"{self.project['name']}.srcs"
        bd_file = srcs / "sources_1" / "bd" / args[0] / f"{args[0]}.bd"
        bd_file.parent.mkdir(parents=True, exist_ok=True)
        bd_file.write_text("{}")
        self.project["files"].append(str(bd_file))
        return args[0]

    def c_create_bd_cell(self, *args: str) -> str:
        opts, pos = self._opts(args, ("-type", "-vlnv"))
        vlnv = opts["-vlnv"]
        assert vlnv in self.c_get_ipdefs(vlnv).split(), f"create_bd_cell: {vlnv} is not in the catalog"
        if vlnv.startswith("fluidnpu."):
            assert self.core_vlnv(self.npu_core) == vlnv
            assert str(Path(self.npu_core["root"]).resolve()) in {str(Path(p).resolve()) for p in
                                                                 self._list(self.project["props"]["ip_repo_paths"])}
        self.cells[pos[0]] = vlnv
        return f"/{pos[0]}"

    def _pin(self, path: str, intf: bool) -> str:
        cell, pin = path.lstrip("/").split("/", 1)
        assert cell in self.cells, f"no cell {cell} for pin {path}"
        if self.cells[cell] == VLNV:  # the NPU's pins are the packaged interfaces
            interfaces = self.npu_core["interfaces"]
            is_intf = pin == "s_axi" or re.fullmatch(r"m_axi\d+", pin) is not None
            assert pin in interfaces and is_intf == intf, f"the NPU has no {'interface ' if intf else ''}pin {pin}"
        return f"/{cell}/{pin}"

    def c_get_bd_cells(self, *args: str) -> str:
        return f"/{args[-1]}" if args[-1] in self.cells else ""

    def c_get_bd_pins(self, *args: str) -> str:
        return self._pin(args[-1], False)

    def c_get_bd_intf_pins(self, *args: str) -> str:
        return self._pin(args[-1], True)

    def c_connect_bd_net(self, *args: str) -> str:
        self.nets.append(set(args))
        return ""

    def c_connect_bd_intf_net(self, *args: str) -> str:
        assert len(args) == 2
        self.intf_nets.append((args[0], args[1]))
        return ""

    def c_apply_bd_automation(self, *args: str) -> str:
        opts, pos = self._opts(args, ("-rule", "-config"))
        config = self._list(opts["-config"])
        self.automation.append({"rule": opts["-rule"], **dict(zip(config[::2], config[1::2])), "cell": pos[0]})
        return ""

    def c_get_bd_addr_spaces(self, *args: str) -> str:
        return f"/{args[-1]}"

    def c_get_bd_addr_segs(self, *args: str) -> str:
        cell = args[-1].split("/")[0]
        assert cell in self.cells
        return f"/{args[-1]}"

    def c_assign_bd_address(self, *args: str) -> str:
        opts, pos = self._opts(args, ("-offset", "-range", "-target_address_space"))
        self.addresses.append({**opts, "segment": pos[0]})
        return ""

    def c_generate_target(self, *args: str) -> str:
        gen = Path(self.project["dir"]) / f"{self.project['name']}.gen" / "sources_1" / "bd" / self.bd / "hw_handoff"
        gen.mkdir(parents=True, exist_ok=True)
        (gen / f"{self.bd}.hwh").write_text(self.hwh())
        return ""

    def hwh(self) -> str:
        """A .hwh of the recorded block design in the shape PYNQ (and host_driver.pynq_device) parses."""
        core = self.npu_core
        value = self.props.get("user_parameters:DESIGN_HASH", {}).get("value")
        params = "" if value is None else f'<PARAMETER NAME="DESIGN_HASH" VALUE="{value}"/>'
        ranges = ""
        for a in self.addresses:
            if a["segment"].startswith("/npu/s_axi/"):
                base = int(a["-offset"], 0)
                ranges += (f'<MEMRANGE INSTANCE="npu" MEMTYPE="REGISTER" BASEVALUE="0x{base:08X}" '
                           f'HIGHVALUE="0x{base + int(a["-range"], 0) - 1:08X}"/>')
        return (f'<?xml version="1.0"?><EDKSYSTEM><MODULES><MODULE FULLNAME="/npu" INSTANCE="npu" '
                f'VLNV="{self.core_vlnv(core)}"><PARAMETERS>{params}</PARAMETERS></MODULE></MODULES>'
                f'<MEMORYMAP>{ranges}</MEMORYMAP></EDKSYSTEM>')

    def c_make_wrapper(self, *args: str) -> str:
        wrapper = Path(self.project["dir"]) / "hdl" / f"{self.bd}_wrapper.v"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(f"module {self.bd}_wrapper(); endmodule\n")
        return str(wrapper)

    def _run_dir(self, run: str) -> str:
        return str(Path(self.project["dir"]) / f"{self.project['name']}.runs" / run)

    def c_launch_runs(self, *args: str) -> str:
        opts, pos = self._opts(args, ("-jobs", "-to_step"))
        if pos[0] == "impl_1":
            assert opts.get("-to_step") == "write_bitstream"
            run = Path(self._run_dir("impl_1"))
            run.mkdir(parents=True, exist_ok=True)
            (run / f"{self.project['top']}.bit").write_bytes(b"fake bitstream of " + self.project["top"].encode())
        return ""

    def _write_file_opt(self, *args: str) -> str:
        opts, _ = self._opts(args, ("-file",))
        Path(opts["-file"]).write_text("stand-in report\n")
        return ""

    c_report_utilization = c_report_timing_summary = c_write_hw_platform = _write_file_opt

    def called(self, cmd: str) -> list[tuple[str, ...]]:
        return [c[1:] for c in self.calls if c[0] == cmd]


def run_tcl(script: Path, **kw: Any) -> FakeVivado:
    tcl = tkinter.Tcl()
    assert tcl.eval("info patchlevel").startswith("8.6")
    fake = FakeVivado(tcl, **kw)
    tcl.createcommand("__fake_vivado", fake)
    tcl.eval("proc exit {{code 0}} {error \"script called exit $code\"}")  # tkinter has removed the real one
    tcl.eval("proc unknown {args} { set r [__fake_vivado {*}$args]\n"
             "  if {[string match __ERROR__* $r]} { error [string range $r 9 end] }\n  return $r }")
    tcl.setvar("__script_text", script.read_text())
    assert tcl.eval("info complete $__script_text") == "1", f"{script.name} is not complete Tcl"
    try:
        tcl.eval(f"source {{{script}}}")
    finally:
        tcl.eval("flush stdout")
    return fake


# ---- fixtures ------------------------------------------------------------------------------------

def _tiny_workload():
    from fluidnpu.workload import Exit, Layer, Workload

    c1 = Layer.conv("c1", 3, 4, 5, 3, padding=1)
    c2 = Layer.conv("c2", 4, 9, 5, 3, stride=2)
    return Workload("tiny", (c1, c2, Layer.fc("fc", 9 * 4, 5)),
                    (Exit("e1", 0, (Layer.fc("e1.fc", 4 * 25, 3),), 0.4), Exit("final", 2, (), 0.6)))


@pytest.fixture(scope="module", params=["zc706", "zcu104"])
def project(request, tmp_path_factory):
    """`fluidnpu vivado --json` on a small bundle for each built-in board (real RTL generation): all four
    AXI masters on ZC706, two on ZCU104 (the block design wires exactly the bundle's design.ports)."""
    board = request.param
    tmp = tmp_path_factory.mktemp(board)
    # a small design, not the board's DSE pick: its RTL generates in seconds
    bundle = bundle_from_result(evaluate_design(_tiny_workload(), load_board(board), 32, 4, 8,
                                                DSEOptions(bmax=4, ports=EXPECT[board]["ports"])))
    path = tmp / "design.json"
    bundle.save(path)
    out = tmp / "viv"
    proc = subprocess.run([sys.executable, "-m", "fluidnpu.cli", "vivado", str(path), "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return board, load_bundle(path), out, json.loads(proc.stdout)


# ---- tests ---------------------------------------------------------------------------------------

def test_outputs_and_summary(project):
    board, bundle, out, summary = project
    exp = EXPECT[board]
    names = {p.name for p in out.iterdir()}
    assert {"rtl", "package_ip.tcl", "block_design.tcl", "build.tcl", "build.sh", "README.txt"} <= names
    assert {"fluidnpu_top.v", "fluidnpu_npu.v", "regmap.json"} <= {p.name for p in (out / "rtl").iterdir()}
    assert summary["part"] == exp["part"] and summary["hp_width"] == exp["width"] == bundle.board.hp_width_bits
    P = bundle.ports
    assert summary["m_axi"] == MASTERS[:P] and summary["hp_ports"] == exp["hp"][:P]     # the design's P HP ports
    assert summary["design_hash"] == f"0x{design_hash(bundle):08X}" and summary["vlnv"] == VLNV
    assert summary["outputs"]["bit"].rsplit(".", 1)[0] == summary["outputs"]["hwh"].rsplit(".", 1)[0]
    assert json.loads((out / "rtl" / "regmap.json").read_text())["design"]["design_hash"] == design_hash(bundle)
    sh = (out / "build.sh").read_text()
    assert "vivado -mode batch" in sh and "-source build.tcl" in sh and (out / "build.sh").stat().st_mode & 0o111
    readme = (out / "README.txt").read_text()
    assert "build.sh" in readme and "docs/deploy.md" in readme and exp["part"] in readme


def test_package_ip_tcl(project):
    board, bundle, out, _ = project
    exp = EXPECT[board]
    fake = run_tcl(out / "package_ip.tcl")
    assert fake.projects[0]["part"] == exp["part"]
    assert {Path(f).name for f in fake.projects[0]["files"]} == {"fluidnpu_top.v", "fluidnpu_npu.v"}
    assert fake.projects[0]["top"] == "fluidnpu_top"
    core = fake.npu_core
    assert fake.core_vlnv(core) == VLNV and core["saved"]
    assert Path(core["root"]) == out / "ip" and (out / "ip" / "component.xml").exists()
    assert set(core["interfaces"]) == interfaces(bundle.ports)
    assert {"-busif": "s_axi", "-clock": "aclk"} in core["associations"]
    for m in MASTERS[:bundle.ports]:
        assert {"-busif": m, "-clock": "aclk"} in core["associations"]
    assert {"-clock": "aclk", "-reset": "aresetn"} in core["associations"]
    assert int(fake.props["address_block:reg0"]["range"]) == WINDOW_BYTES
    hash_param = fake.props["user_parameters:DESIGN_HASH"]
    assert int(hash_param["value"], 0) == design_hash(bundle) and hash_param["value_format"] == "string"
    assert fake.props[core["handle"]]["supported_families"].split()[0] == exp["family"]
    for m in MASTERS[:bundle.ports]:    # every master: the HP width, and an address space over its whole range
        assert core["interfaces"][m]["DATA_WIDTH"] == str(exp["width"])
        assert int(fake.props[f"address_spaces:{m}"]["range"]) == 1 << int(core["interfaces"][m]["ADDR_WIDTH"])
    assert fake.called("close_project")


def test_package_ip_falls_back_to_name_inference_then_stops(project):
    _, bundle, out, _ = project
    fake = run_tcl(out / "package_ip.tcl", infer="names")
    assert set(fake.npu_core["interfaces"]) == interfaces(bundle.ports)
    assert fake.called("ipx::infer_bus_interfaces")
    with pytest.raises(tkinter.TclError, match="inferred no bus interface s_axi"):
        run_tcl(out / "package_ip.tcl", infer="none")


@pytest.mark.parametrize("have_board_files", [True, False])
def test_build_tcl_runs_end_to_end(project, have_board_files, capfd):
    board, bundle, out, _ = project
    exp = EXPECT[board]
    for f in ("npu.bit", "npu.hwh", "npu.xsa", "build_report.json"):
        (out / f).unlink(missing_ok=True)
    fake = run_tcl(out / "build.tcl", board_parts=(exp["board_part"],) if have_board_files else ())
    printed = capfd.readouterr().out
    # two projects: the throw-away IP project and the build project, both on the board's part
    assert [p["part"] for p in fake.projects] == [exp["part"], exp["part"]]
    ip_dir, proj_dir = (Path(p["dir"]).resolve() for p in fake.projects)
    assert ip_dir != proj_dir and proj_dir not in ip_dir.parents and ip_dir not in proj_dir.parents
    assert not fake.called("ipx::infer_bus_interfaces")  # the wrapper's attributes were enough
    main_proj = fake.projects[1]
    assert main_proj["props"].get("board_part") == (exp["board_part"] if have_board_files else None)
    assert (out / "ip").resolve() == Path(fake.tcl.eval("file normalize [lindex [get_property ip_repo_paths "
                                                         "[current_project]] 0]"))
    # the PS: board preset exactly when Vivado has the board files, our clock and HP width
    ps_vlnv = fake.cells["ps"]
    assert ps_vlnv.rsplit(":", 1)[0] == f"xilinx.com:ip:{exp['ps']}"
    if exp["ps"] == "zynq_ultra_ps_e":
        assert ps_vlnv.endswith(":3.10")  # the newest in the catalog, by version order, not string order
    assert fake.automation[0]["apply_board_preset"] == ("1" if have_board_files else "0")
    ps_props = fake.props["/ps"]
    assert float(ps_props[exp["clock_key"]]) == bundle.clock_mhz == exp["clock"]
    P = bundle.ports
    for key in exp["width_key"][:P]:    # every HP port the design uses enabled at the board's width
        assert int(ps_props[key]) == exp["width"] == bundle.board.hp_width_bits
    assert "the PS makes" not in printed  # the stand-in makes the clock asked for
    # every NPU interface is connected, and to the right place
    assert fake.cells["npu"] == VLNV

    def net_of(pin):
        nets = [n for n in fake.nets if pin in n]
        assert len(nets) == 1, f"{pin} is on {len(nets)} nets"
        return nets[0]

    clk_net = net_of("/npu/aclk")
    assert {f"/ps/{exp['clk']}", f"/ps/{exp['gp_aclk']}", "/rst_npu/slowest_sync_clk", "/smc_regs/aclk",
            *(f"/ps/{a}" for a in exp["hp_aclk"][:P]), *(f"/smc_mem{i}/aclk" for i in range(P))} <= clk_net
    assert net_of("/rst_npu/interconnect_aresetn") == {"/rst_npu/interconnect_aresetn", "/smc_regs/aresetn",
                                                       *(f"/smc_mem{i}/aresetn" for i in range(P))}
    assert net_of("/npu/aresetn") == {"/rst_npu/peripheral_aresetn", "/npu/aresetn"}
    assert net_of("/rst_npu/ext_reset_in") == {f"/ps/{exp['resetn']}", "/rst_npu/ext_reset_in"}
    assert net_of("/npu/interrupt") == {"/npu/interrupt", f"/ps/{exp['irq']}"}
    intf = set(fake.intf_nets)
    assert {(f"/ps/{exp['gp']}", "/smc_regs/S00_AXI"), ("/smc_regs/M00_AXI", "/npu/s_axi"),
            *((f"/npu/m_axi{i}", f"/smc_mem{i}/S00_AXI") for i in range(P)),
            *((f"/smc_mem{i}/M00_AXI", f"/ps/{hp}") for i, hp in enumerate(exp["hp"][:P]))} == intf
    npu_pins = {p for n in fake.nets for p in n if p.startswith("/npu/")}
    npu_pins |= {p for pair in fake.intf_nets for p in pair if p.startswith("/npu/")}
    assert npu_pins == {f"/npu/{i}" for i in fake.npu_core["interfaces"]}
    # the address map: the register window of hw/regmap's size, DDR for the NPU's master
    reg = [a for a in fake.addresses if a["segment"] == "/npu/s_axi/reg0"]
    assert len(reg) == 1 and int(reg[0]["-range"], 0) == WINDOW_BYTES and reg[0]["-target_address_space"] == "/ps/Data"
    for m, seg in zip(MASTERS[:P], exp["ddr"]):     # each master reaches DDR through its own HP port
        ddr = [a for a in fake.addresses if a["-target_address_space"] == f"/npu/{m}"]
        assert [a["segment"] for a in ddr] == [f"/{seg}"]
    # runs, bitstream, hwh with the same basename, and the driver accepts that hwh for this bundle
    assert [c[0] for c in fake.called("launch_runs")] == ["synth_1", "impl_1"]
    assert (out / "npu.bit").read_bytes() == b"fake bitstream of fluidnpu_bd_wrapper"
    assert (out / "npu.hwh").exists() and (out / "npu.xsa").exists()
    from fluidnpu.host_driver.pynq_device import check_hwh

    cell = check_hwh(out / "npu.hwh", bundle)
    assert cell.vlnv == VLNV and cell.size == WINDOW_BYTES and cell.base == int(reg[0]["-offset"], 0)
    report = json.loads((out / "build_report.json").read_text())
    assert report["part"] == exp["part"] and report["timing_met"] is True
    assert report["bit"] == "npu.bit" and report["hwh"] == "npu.hwh"
    assert float(report["clock_mhz_actual"]) == bundle.clock_mhz
    assert report["design_hash"] == f"0x{design_hash(bundle):08X}"
    assert int(report["reg_base"], 0) == cell.base and int(report["reg_range"], 0) == WINDOW_BYTES


def test_build_stops_when_timing_fails(project, monkeypatch):
    board, _, out, _ = project
    (out / "npu.bit").unlink(missing_ok=True)
    monkeypatch.delenv("FLUIDNPU_IGNORE_TIMING", raising=False)
    with pytest.raises(tkinter.TclError, match="timing not met"):
        run_tcl(out / "build.tcl", wns=-0.3)
    assert not (out / "npu.bit").exists()


def test_clock_the_ps_cannot_make_is_reported(project, capfd):
    board, _, out, _ = project
    key = PS_FAMILIES["zynq7000" if board == "zc706" else "zynqmp"].clock_actual_key
    run_tcl(out / "build.tcl", clock_actual={key: "142.857"})
    assert "WARNING: fluidnpu: the PS makes 142.857 MHz" in capfd.readouterr().out
    assert json.loads((out / "build_report.json").read_text())["clock_mhz_actual"] == "142.857"


def test_syntax_error_is_caught(tmp_path):
    bad = tmp_path / "bad.tcl"
    bad.write_text("set x {unclosed\n")
    with pytest.raises(AssertionError, match="not complete Tcl"):
        run_tcl(bad)
    bad.write_text("create_bd_cell_typo -x\n")
    with pytest.raises(tkinter.TclError, match="neither Tcl nor the Vivado stand-in"):
        run_tcl(bad)


def test_tcl_word_quotes_or_refuses():
    assert tcl_word("xc7z045ffg900-2") == "xc7z045ffg900-2"
    assert tcl_word("a b") == "{a b}"
    with pytest.raises(FluidError):
        tcl_word("a}b")


# ---- refusals ------------------------------------------------------------------------------------

def _user_bundle(tmp_path: Path, family: str | None, hp_width: int = 64) -> Path:
    from fluidnpu.boards.catalog import Board

    zc706 = load_board("zc706")
    board = Board.from_dict(zc706.to_dict() | {"name": "myboard", "family": family or "", "hp_width_bits": hp_width})
    bundle = bundle_from_result(evaluate_design(_tiny_workload(), board, 16, 4, 4, DSEOptions(bmax=2)))
    path = tmp_path / "design.json"
    bundle.save(path)
    load_bundle(path)  # still a valid bundle
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fluidnpu.cli", "vivado", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("family", [None, "virtex7", "versal"])
def test_unsupported_board_is_one_line_exit_2(tmp_path, family):
    path = _user_bundle(tmp_path, family)
    proc = _cli(str(path), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "myboard" in lines[0] and "zynq7000" in lines[0] and "zynqmp" in lines[0]
    assert not (tmp_path / "out").exists()


def test_hp_width_the_ps_lacks_is_refused(tmp_path):
    path = _user_bundle(tmp_path, "zynq7000", hp_width=128)  # Zynq-7000 HP ports are 32 or 64 bits
    with pytest.raises(FluidError, match="hp_width_bits 128"):
        resolve_target(load_bundle(path))


def test_user_board_with_known_family_builds_without_board_preset(tmp_path):
    bundle = load_bundle(_user_bundle(tmp_path, "zynq7000"))
    target = resolve_target(bundle)
    assert target.board_part_pattern == "" and target.ps.ip.endswith("processing_system7")


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"format": "other"})])
def test_missing_or_corrupt_bundle_is_one_line_exit_2(tmp_path, content):
    path = tmp_path / "design.json"
    if content is not None:
        path.write_text(content)
    proc = _cli(str(path), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "design bundle" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_command_is_registered():
    from click.testing import CliRunner

    from fluidnpu.cli import cli

    result = CliRunner().invoke(cli, ["vivado", "--help"])
    assert result.exit_code == 0 and "DESIGN.json" in result.output


@pytest.mark.parametrize("base, family, part, hp_width, clock", [
    ("zcu104", "zynqmp", "xczu9eg-ffvb1156-2-e", 64, 100.0),
    ("zc706", "zynq7000", "xc7z020clg400-1", 32, 125.0),
])
def test_user_board_numbers_follow_the_bundle(tmp_path, base, family, part, hp_width, clock, capfd):
    """A user board of a known PS family: its part, clock and HP width reach the Tcl; no board preset."""
    from fluidnpu.boards.catalog import BOARD_DIR, board_from_data
    from fluidnpu.hls_gen.vivado import write_vivado_project

    data = json.loads((BOARD_DIR / f"{base}.json").read_text())
    data.update(name="myboard", part=part, family=family)
    data["resources"]["dsp"]["value"] = 8  # a small NPU: its RTL generates in seconds
    data["axi_hp"]["width_bits"]["value"] = hp_width
    bundle = bundle_from_result(explore(_tiny_workload(), board_from_data(data, "myboard"),
                                        DSEOptions(bmax=2, clock_mhz=clock)))
    out = tmp_path / "viv"
    summary = write_vivado_project(bundle, out)
    assert summary["board_part"] is None and summary["hp_width"] == hp_width and summary["part"] == part
    fake = run_tcl(out / "build.tcl", board_parts=tuple(p for e in EXPECT.values() for p in [e["board_part"]]))
    ps = PS_FAMILIES[family]
    assert [p["part"] for p in fake.projects] == [part, part]
    assert "board_part" not in fake.projects[1]["props"] and not fake.called("get_board_parts")
    assert fake.automation[0]["apply_board_preset"] == "0"
    assert float(fake.props["/ps"][ps.clock_key]) == clock
    for i in range(bundle.ports):
        assert int(fake.props["/ps"][ps.hp(i, "hp_width_key")]) == hp_width
        assert fake.npu_core["interfaces"][f"m_axi{i}"]["DATA_WIDTH"] == str(hp_width)
    assert int(fake.props["user_parameters:DESIGN_HASH"]["value"], 0) == design_hash(bundle)
    from fluidnpu.host_driver.pynq_device import check_hwh

    assert check_hwh(out / "npu.hwh", bundle).base == ps.reg_base
    assert "user board" in (out / "README.txt").read_text()
