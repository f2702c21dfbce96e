"""Resource model: RAM primitives at their real granularity, the TR search, and the LUT/FF terms
fitted to Yosys (docs/resources.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from fluidnpu.boards import load_board
from fluidnpu.dse.resource_model import (
    DEFAULT_LOGIC,
    DEFAULT_WIDE_PORTS,
    bram36_for,
    bram_reserve,
    control_logic,
    design_resources,
    dma_words,
    engine_logic,
    fbcb_bram36,
    fbcb_in_bram,
    fbcb_lutram,
    input_banks,
    logic_use,
    lutram_choice,
    max_tr,
    memories,
    memory_use,
    merge_luts,
    skew_bits,
    uram_for,
    zero_luts,
)
from fluidnpu.hw.regmap import CHAIN, fbcb_entry_bits, nmax


def test_bram_aspect_ratios():
    assert bram36_for(512, 72) == 1.0        # exactly one BRAM36 in 512x72
    assert bram36_for(1024, 18) == 0.5       # one BRAM18
    assert bram36_for(1025, 18) == 1.0       # spills into 2K x 18
    assert bram36_for(4652, 16) == 2.5       # five 1K x 18 BRAM18s beat three 2K x 18 BRAM36s
    assert bram36_for(100, 4096) == 57.0     # wide: 512 x 72 tiles, ceil(4096/72) = 57
    assert bram36_for(0, 16) == 0.0


def test_uram_granularity():
    assert uram_for(4096, 72) == 1
    assert uram_for(4097, 72) == 2
    assert uram_for(100, 4096) == 57


def test_fbcb_register_bits_match_paper():
    # The paper stores BR in log2(Bmax) bits and k in 2: 5 bits at Bmax = 8, so a
    # 62-layer FBCB is 62*8*5 = 2480 registers = 0.57% of ZC706's 437,200 FFs (Sec. IV).
    assert fbcb_entry_bits(8) == 5
    zc706 = load_board("zc706")
    res = design_resources(1024, 7, 128, zc706, 8, 62, True)
    assert res.fbcb_ff == 2480
    assert round(100 * res.fbcb_ff / zc706.ff, 2) == 0.57


def test_max_tr_is_largest_fitting(make_board):
    board = make_board(dsp=16, bram36=20)
    TP = np.array([1, 2, 4, 8])
    TC = np.array([16, 8, 4, 2])
    tr = max_tr(TP, TC, board, 4, 5, True, tr_cap=100_000)
    for i in range(len(TP)):
        _, _, ok_at = memory_use(np.array(tr[i]), TP[i], TC[i], board, 4)
        _, _, ok_next = memory_use(np.array(tr[i] + 1), TP[i], TC[i], board, 4)
        assert ok_at and not ok_next



@pytest.mark.parametrize("board_name", ["zc706", "zcu104"])
def test_max_tr_is_the_memories_tr_where_the_logic_fits(board_name):
    """`max_tr` (the memories' largest TR, shared by the DSE's spaces, where the TR-free logic fits) is
    the largest TR `feasible_designs` accepts, with and without the block input buffer, at every port
    count and PE kind; with the buffer, `feasible_designs` is exactly `buffer_room` >= 1."""
    from fluidnpu.dse.resource_model import buffer_room, feasible_designs
    from fluidnpu.dse.search import enumerate_tp_tc

    board = load_board(board_name)
    rng = np.random.default_rng(7)
    TP, TC = enumerate_tp_tc(board.limit("dsp"))
    pick = rng.choice(TP.size, 300, replace=False)
    TP, TC = TP[pick], TC[pick]
    cap = 20_000
    for ports, stackable, buffer in [(1, False, False), (4, True, False), (2, True, True), (4, False, True)]:
        kw = dict(banks=4, ports=ports)
        tr = max_tr(TP, TC, board, 8, 70, stackable, cap, buffer=buffer, **kw)
        assert (tr > 0).any()
        ok_at = feasible_designs(np.maximum(tr, 1), TP, TC, board, 8, 70, stackable, buffer=buffer, **kw)
        ok_next = feasible_designs(tr + 1, TP, TC, board, 8, 70, stackable, buffer=buffer, **kw)
        assert (ok_at == (tr > 0)).all() and not (ok_next & (tr < cap)).any()
        TR = rng.integers(1, 5_000, TP.size)
        if buffer:
            room = buffer_room(TR, TP, TC, board, 8, 70, stackable, **kw)
            plain = feasible_designs(TR, TP, TC, board, 8, 70, stackable, **kw)
            with_buffer = feasible_designs(TR, TP, TC, board, 8, 70, stackable, buffer=True, **kw)
            assert (with_buffer == (plain & (room >= 1))).all() and with_buffer.any() and (plain & ~with_buffer).any()


def test_uram_takes_big_buffers_on_ultrascale():
    zcu104 = load_board("zcu104")
    bram, uram, ok = memory_use(np.array(4096), np.array(27), np.array(64), zcu104, 8)
    assert ok and uram > 0 and bram <= zcu104.bram36
    # the paper's <6832, 10, 172> needs 48 bits per (row, PE) here: it does not fit (docs/dse.md)
    assert not memory_use(np.array(6832), np.array(10), np.array(172), zcu104, 8)[2]
    zc706 = load_board("zc706")
    _, uram7, _ = memory_use(np.array(1024), np.array(7), np.array(128), zc706, 8)
    assert uram7 == 0


# ---------------------------------------------------------------- LUT/FF model (docs/resources.md)
AXI_PORTS = Path(__file__).resolve().parent.parent / "docs" / "figures" / "resources" / "axi_ports.json"
AXI_PORT_FIELDS = ("lut_per_axi_port", "ff_per_axi_port", "lut_per_axi_port_word", "ff_per_axi_port_word",
                   "lut_per_merge_word", "lut_per_zero_word", "ff_per_split_word")
CALIBRATION = Path(__file__).resolve().parents[1] / "docs" / "figures" / "resources" / "calibration.json"


def test_rtl_parameters_mirror_the_rtl():
    # the vectorised NMAX of a design space is the RTL's scalar one, element by element
    tp, tc = np.array([1, 2, 7, 8, 9, 30])[:, None], np.array([1, 4, 8, 9, 128])[None, :]
    assert dma_words(tp, tc).tolist() == [[max(2 * p, 2 * c, 16) for c in tc[0]] for p in tp[:, 0]]
    assert [nmax(p, c) for p, c in ((1, 1), (9, 4), (3, 30))] == [16, 18, 60]


def _rtl_memories(core) -> list[tuple[int, int]]:
    """(depth, width) of every Memory the elaborated EngineCore instantiates."""
    from amaranth.lib.memory import Memory

    top = core.elaborate(None)
    subs = [entry[0] for entry in top._named_submodules.values()] + [entry[0] for entry in top._anon_submodules]
    return sorted((sub.depth, sub.shape.width) for sub in subs if isinstance(sub, Memory))


@pytest.mark.parametrize("TR,TP,TC,bmax,nb", [
    (1024, 2, 2, 2, 2), (1000, 3, 5, 3, 4), (37, 4, 4, 8, 8), (515, 7, 3, 8, 2), (64, 1, 9, 5, 8), (999, 5, 6, 8, 4),
])
def test_memories_are_the_rtls(TR, TP, TC, bmax, nb):
    """memories() lists exactly the buffers hw/engine_core.py builds, shape for shape, so the BRAM/URAM
    the DSE counts are the RTL's (tests/test_synth.py checks Yosys maps each shape as bram36_for says)."""
    pytest.importorskip("amaranth")
    from fluidnpu.hw.engine_core import EngineCore

    model = sorted((int(depth), int(width)) for _, count, depth, width in memories(TR, TP, TC, bmax, banks=nb)
                   for _ in range(count))
    assert model == _rtl_memories(EngineCore(TR=TR, TP=TP, TC=TC, NB=nb))


def test_bank_count_sets_the_operand_multiplexers():
    from fluidnpu.errors import FluidError
    from fluidnpu.hw.regmap import NpuParams, bank_choices

    assert input_banks(8, packing=False) == 2 and input_banks(8) == 8 and input_banks(5) == 8
    assert bank_choices(8) == [2, 4, 8] and bank_choices(5) == [2, 4, 8] and bank_choices(8, False) == [2]
    assert bank_choices(1) == [2] and bank_choices(2) == [2]
    assert NpuParams(TR=64, TP=2, TC=2, bmax=8, layers=3, nb=2).banks == 2
    assert NpuParams(TR=64, TP=2, TC=2, bmax=8, layers=3).banks == 8
    for bad in (1, 3, 16):
        with pytest.raises(FluidError, match="input banks"):
            NpuParams(TR=64, TP=2, TC=2, bmax=8, layers=3, nb=bad)
    tp, tc = np.array([16, 24]), np.array([32, 37])
    packed, _ = engine_logic(tp, tc, 8, True)
    unpacked, _ = engine_logic(tp, tc, 8, True, banks=2)
    # 2 instead of 8 operand-multiplexer inputs per lane bit, and 6 banks' rows less to read
    saved = (DEFAULT_LOGIC.lut_per_mux_input_bit * 16 * tp * tc + DEFAULT_LOGIC.lut_per_bank_word * tp) * (8 - 2)
    assert np.allclose(packed - unpacked, saved)


def test_logic_is_control_plus_engine():
    tp, tc = np.array([2, 7, 13]), np.array([2, 128, 132])
    lut, ff = logic_use(tp, tc, 8, 54, True)
    cl, cf = control_logic(tp, tc, 8, 54)
    el, ef = engine_logic(tp, tc, 8, True)
    assert (lut == np.ceil(cl + el)).all() and (ff == np.ceil(cf + ef)).all()


def test_engine_terms():
    c = DEFAULT_LOGIC
    lut = lambda tp, tc, bmax: float(engine_logic(tp, tc, bmax, True)[0])  # noqa: E731
    ff = lambda tp, tc, bmax: float(engine_logic(tp, tc, bmax, True)[1])  # noqa: E731
    # the bank multiplexers (each PE lane picks its row from NB banks; NB = 4 at Bmax 3 and 4) and
    # each bank's row read
    assert lut(4, 8, 4) - lut(4, 8, 2) == pytest.approx((c.lut_per_mux_input_bit * 16 * 4 * 8 + c.lut_per_bank_word * 4)
                                                        * (4 - 2))
    assert lut(4, 8, 3) == lut(4, 8, 4)
    # one more PE of TP lanes: its PE, MAC and multiplexer terms and its one fabric adder (the root
    # over its two DSP chains), nothing that grows faster (the engine has no weight replication
    # network: hw/engine_core.py, docs/hw-architecture.md)
    assert lut(4, 9, 2) - lut(4, 8, 2) == pytest.approx(c.lut_per_pe + 4 * c.lut_per_mac + c.lut_per_tree_adder
                                                        + c.lut_per_mux_input_bit * 16 * 4 * 2)
    for nb_bmax in (2, 8):
        assert lut(4, 256, nb_bmax) - lut(4, 128, nb_bmax) == pytest.approx(lut(4, 128, nb_bmax) - lut(4, 0, nb_bmax))
    # and its registers, with its two delayed bank selects (one bit each at NB 2: k = 1 and k = 1/2)
    assert ff(4, 9, 2) - ff(4, 8, 2) == pytest.approx(c.ff_per_pe + 4 * c.ff_per_mac + c.ff_per_tree_adder
                                                      + 2 * c.ff_per_skew_bit)
    # a PE of 2 * CHAIN + 1 lanes has three chains (two fabric adders), one lane less only two
    assert lut(2 * CHAIN + 1, 1, 2) - lut(2 * CHAIN, 1, 2) == pytest.approx(
        c.lut_per_mac + c.lut_per_tree_adder + c.lut_per_mux_input_bit * 16 * 2 + c.lut_per_bank_word * 2)
    # banks cost the engine multiplexers and the skewed copies of their words, no other register
    assert ff(4, 8, 8) - ff(4, 8, 2) == pytest.approx(
        c.ff_per_skew_bit * float(skew_bits(np.array(4), np.array(8), 8, True)
                                  - skew_bits(np.array(4), np.array(8), 2, True)))
    # plain PEs (k = 1 only) save half the bank-multiplexer inputs and the stacking logic per PE pair,
    # and half the skew (no k = 2 upper lanes, no k = 1/2 upper bank selects)
    plain_lut, plain_ff = (float(v) for v in engine_logic(7, 128, 8, False))
    assert lut(7, 128, 8) - plain_lut == pytest.approx(c.lut_per_mux_input_bit * 16 * 7 * 128 * 8 / 2
                                                       + 64 * c.lut_per_stack_pair)
    assert ff(7, 128, 8) - plain_ff == pytest.approx(64 * c.ff_per_stack_pair + c.ff_per_skew_bit
                                                     * float(skew_bits(np.array(7), np.array(128), 8, False)))


def test_control_terms():
    c = DEFAULT_LOGIC
    lut = lambda tp, tc, bmax, layers=8: float(control_logic(tp, tc, bmax, layers)[0])  # noqa: E731
    # NMAX is 16 words until 2TP or 2TC exceed it; the port words grow with TP and TC from the start
    assert lut(2, 4, 2) - lut(2, 2, 2) == pytest.approx(4 * c.lut_per_port_word)
    assert lut(2, 8, 2) - lut(2, 7, 2) == pytest.approx(2 * c.lut_per_port_word)           # NMAX = 16 both
    assert lut(2, 16, 2) - lut(2, 15, 2) == pytest.approx(2 * c.lut_per_port_word
                                                        + 2 * (c.lut_per_dma_word + c.lut_per_axi_port_word))
    assert lut(2, 2, 8) - lut(2, 2, 4) == pytest.approx(4 * c.lut_per_bank + fbcb_lutram(8, 8) - fbcb_lutram(8, 4))


def test_fbcb_lut_ram():
    # RAM32M: 32 x 6 bits, RAM64M: 64 x 3 bits, 4 LUTs each, in the shape Yosys scores cheapest
    assert fbcb_entry_bits(2) == 3 and fbcb_lutram(8, 2) == 4          # 16 x 3: one RAM32M
    assert fbcb_lutram(54, 8) == 56                              # 432 x 5: 14 RAM32M = 7 x 2 RAM64M
    assert fbcb_lutram(120, 4) == 64                             # 480 x 4: 16 RAM64M (15 RAM32M score more)
    assert fbcb_lutram(1, 1) == 4


def test_fbcb_is_lut_ram_or_a_ramb18_where_yosys_puts_it():
    """Every FBCB shape synthesized (docs/figures/resources/fbcb_shapes.json: Yosys 0.23 and 0.70, xc7 and
    xcup) is where Yosys's memory_libmap cost puts it, and its LUT RAM is the model's 4 LUTs a cell."""
    rows = json.loads(Path("docs/figures/resources/fbcb_shapes.json").read_text())["rows"]
    assert {r["mapped_to"] for r in rows} == {"LUT RAM", "RAMB18"} and {r["family"] for r in rows} == {"xc7", "xcup"}
    for r in rows:
        shape = (r["layers"], r["bmax"], r["buffer"], r["family"])
        assert fbcb_in_bram(*shape) == (r["mapped_to"] == "RAMB18"), r
        assert fbcb_bram36(*shape) == (0.5 if r["mapped_to"] == "RAMB18" else 0.0)
        if r["mapped_to"] == "RAMB18":
            assert fbcb_lutram(*shape) == 0
        else:   # RAM32M / RAM64M: 4 LUTs (xc7); RAM32M16 / RAM64M8: 8 (xcup)
            assert fbcb_lutram(*shape) == {"xc7": 4, "xcup": 8}[r["family"]] * r["lutram_cells"], r


def test_lutram_cost_is_memory_libmaps():
    # 480 x 5 on xc7: 8 chunks of 64 x 3 (16 RAM64M): 16 + 7*8*5/3 + 0.5*7*5 + 0.5*8 + 2
    assert lutram_choice(480, 5)[0] == pytest.approx(16 + 7 * 8 * 5 / 3 + 17.5 + 4 + 2)
    assert lutram_choice(448, 5)[0] < 129 < lutram_choice(480, 5)[0]
    # UltraScale+'s wider LUT RAM keeps 480 x 5 (63 x 8 layers' FBCB without the buffer bit) in LUTs
    assert lutram_choice(504, 5, "xcup")[0] < 129 < lutram_choice(504, 6, "xcup")[0]


def test_the_fbcbs_ramb18_counts_in_the_design_and_its_bram_ceiling():
    zc706 = load_board("zc706")
    small, big = (design_resources(1024, 8, 16, zc706, 8, layers, True) for layers in (8, 63))
    assert big.bram36 - small.bram36 == 0.5 and big.lut < small.lut
    assert bram_reserve(np.array([8]), False, 63, 8, zc706) == 0.5
    assert bram_reserve(np.array([8]), False, 8, 8, zc706) == 0
    # at the ceiling: the largest TR the 8-layer design fits leaves less than half a BRAM36 for the FBCB
    tr8, tr63 = (int(max_tr(np.array([8]), np.array([16]), zc706, 8, layers, True, 1 << 16)[0]) for layers in (8, 63))
    assert tr63 <= tr8
    assert design_resources(tr63, 8, 16, zc706, 8, 63, True).bram36 <= zc706.limit("bram36")


def test_constants_are_the_documented_fit():
    """LogicCosts holds exactly what the committed sweep fitted, and the agreement figures in
    docs/figures/resources (hence docs/resources.md) are those of the current model."""
    doc = json.loads(CALIBRATION.read_text())
    def one_port(costs: dict) -> dict:     # the per-port terms have their own fit (next test)
        return {k: v for k, v in costs.items() if k not in AXI_PORT_FIELDS}

    assert doc["model_up_to_date"] and one_port(doc["refit_costs"]) == one_port(asdict(DEFAULT_LOGIC))
    assert all(v >= 0 for v in asdict(DEFAULT_LOGIC).values())
    for row in doc["rows"]:
        banks, ports, fabric = row["banks"], row["ports"], row["family"]
        if row["scope"] == "engine":          # an EngineCore synthesized alone: the engine terms only
            lut, ff = (np.ceil(v) for v in engine_logic(row["TP"], row["TC"], row["bmax"], True, banks=banks))
        elif row["scope"] == "control":       # sequencer, registers and DMA alone: the control terms only
            lut, ff = (np.ceil(v) for v in control_logic(row["TP"], row["TC"], row["bmax"], row["layers"],
                                                         axi_ports=ports, banks=banks, fabric=fabric))
            assert row["model_bram36"] == fbcb_bram36(row["layers"], row["bmax"], False, fabric) == row["yosys_bram36"]
        else:
            lut, ff = logic_use(row["TP"], row["TC"], row["bmax"], row["layers"], True, axi_ports=ports, banks=banks,
                                fabric=fabric)
        assert (row["model_lut"], row["model_ff"]) == (int(lut), int(ff)), row["config"]
        macs = 0 if row["scope"] == "control" else row["TP"] * row["TC"]
        assert row["model_dsp"] == macs == row["yosys_dsp"], row["config"]


def test_fit_recovers_known_constants(benchmark_module):
    """The benchmark's least squares returns the constants that generated its data."""
    bench = benchmark_module("synth_calibration")
    truth = replace(DEFAULT_LOGIC, lut_base=3000.0, lut_per_pe=50.0, lut_per_mac=40.0, lut_per_mux_input_bit=0.4,
                    lut_per_dma_word=20.0, lut_per_port_word=10.0, lut_per_bank=30.0, ff_base=2000.0,
                    ff_per_pe=150.0, ff_per_mac=60.0, ff_per_dma_word=40.0, ff_per_port_word=5.0,
                    ff_per_bank=9.0, lut_core_base=100.0, ff_core_base=50.0)
    cfgs = [c for c in bench.CONFIGS if c.fit]
    ys = {}
    for c in cfgs:     # each point measures its own part (scope), as the synthesized units do
        ys[c] = {part: ({"lut": float(v[0]), "ff": float(v[1])} if c.scope in (part, "npu") else None)
                 for part, v in ((p, bench.PART_FN[p](c, truth)) for p in bench.PARTS)}
    raw = bench.fit_costs(cfgs, ys)["raw"]
    for name, want in asdict(truth).items():
        assert raw[name] == pytest.approx(want, rel=1e-6, abs=1e-6), name


def test_extra_axi_ports_are_the_documented_fit():
    """The DMA's terms (per port, per NMAX word, the merger, per data bit beyond 64) are
    benchmarks/synth_axi_ports.py's fit (docs/figures/resources/axi_ports.json), within 5 % of every
    AxiDma it synthesized; each further port is a ReadEngine + WriteEngine, plus, on more than one, the
    per-stream merge: one N:1 select of NMAX words a stream, a LUT level for 2 to 4 ports, and on 4 ports,
    whose select fills its LUT6s, a LUT a bit more for the input stream's zero-read answer; and each port on
    more than one keeps a response register per stream (FFs, per NMAX word)."""
    doc = json.loads(AXI_PORTS.read_text())
    assert doc["model_up_to_date"] and doc["fit"] == {**{k: asdict(DEFAULT_LOGIC)[k] for k in AXI_PORT_FIELDS},
                                                      **asdict(DEFAULT_WIDE_PORTS)}
    assert all(abs(p["lut_err"]) < 0.05 for p in doc["points"])
    assert all(abs(p["ff_err"]) < 0.05 for p in doc["points"] if p["data_width"] == 64)
    tp, tc = np.array([4, 8]), np.array([16, 64])
    one, two, four = (np.array(control_logic(tp, tc, 8, 54, axi_ports=n)) for n in (1, 2, 4))
    nmax = dma_words(tp, tc)
    port = DEFAULT_LOGIC.lut_per_axi_port + DEFAULT_LOGIC.lut_per_axi_port_word * nmax
    merge = DEFAULT_LOGIC.lut_per_merge_word * nmax        # once, with more than one port (up to 4)
    assert np.allclose(two[0] - one[0], port + merge)
    assert np.allclose(four[0] - two[0], 2 * port + DEFAULT_LOGIC.lut_per_zero_word * nmax) and (four[1] > two[1]).all()
    ff_port = DEFAULT_LOGIC.ff_per_axi_port + DEFAULT_LOGIC.ff_per_axi_port_word * nmax
    assert np.allclose(two[1] - one[1], ff_port + 2 * DEFAULT_LOGIC.ff_per_split_word * nmax)
    assert [merge_luts(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]
    assert [zero_luts(n) for n in (1, 2, 3, 4)] == [0, 0, 0, 1]


@pytest.mark.parametrize("name", ["synth_mid_zc706_plain", "synth_mid_zcu104_64bit_plain", "synth_mid_zcu104_plain"])
def test_whole_npu_on_both_families_within_five_percent(name):
    """The whole-NPU syntheses of docs/resources.md ("Whole NPUs at 128 MACs on both families"): the same
    plain-PE <1024, 8, 16> NPU on xc7 with 64-bit ports, xcup with 64-bit and xcup with 128-bit ports. The
    model, with its port-width term, prices each within 5 % of Yosys's LUTs and FFs (the 64-bit-port fit
    alone is ~10 % low on the last), and every buffer's BRAM36/URAM exactly."""
    from fluidnpu.bundle import load_bundle
    from fluidnpu.dse.resource_model import design_resources

    folder = Path(__file__).resolve().parents[1] / "docs" / "figures" / "resources"
    bundle = load_bundle(folder / f"{name}.bundle.json")
    report = json.loads((folder / f"{name}.json").read_text())
    yosys = {r["resource"].split()[0].lower(): r["yosys"] for r in report["rows"]}
    TR, TP, TC = bundle.design
    res = design_resources(TR, TP, TC, bundle.board, bundle.bmax, len(bundle.workload.layers()),
                           bundle.data["dse"]["stackable"], banks=bundle.banks, ports=bundle.ports)
    assert not bundle.data["dse"]["stackable"] and bundle.ports == 4
    assert abs(res.lut / yosys["lut"] - 1) <= 0.05 and abs(res.ff / yosys["ff"] - 1) <= 0.05, (res, yosys)
    # the buffers, built with the bundle's placement (ram_style): each one's BRAM36 and URAM exactly as priced
    assert res.placement == bundle.data["resources"]["placement"]
    for name, n, depth, width in memories(*map(np.array, bundle.design), bundle.bmax, banks=bundle.banks):
        in_uram = res.placement[name] == "uram"
        want = {"bram36": 0.0 if in_uram else float(n * bram36_for(depth, width)),
                "uram": float(n * uram_for(depth, width)) if in_uram else 0.0, "lutram": 0}
        assert report["memories"][name] == want, (name, report["memories"][name], want)


def test_same_engine_on_both_families():
    """The model prices an engine the same on xc7 and xcup: measured, the six EngineCore twins (plain and
    Stackable PEs, 32-128 MACs) map to the same FFs and DSPs on both families and to LUTs within 5 %
    (docs/figures/resources/xcup_engines.json, DSP48E2s packed as hw/synth.py packs them); with 64-bit
    ports the family adds nothing to a design's LUTs or FFs."""
    from fluidnpu.dse.resource_model import wide_port_logic

    doc = json.loads((CALIBRATION.parent / "xcup_engines.json").read_text())
    assert {(r["TP"], r["TC"], r["stackable"]) for r in doc["rows"]} == {
        (tp, tc, st) for tp, tc in ((4, 8), (16, 8), (8, 16)) for st in (False, True)}
    for r in doc["rows"]:
        assert r["xcup_ff"] == r["xc7_ff"] and r["xcup_dsp"] == r["xc7_dsp"] == r["TP"] * r["TC"], r
        assert abs(r["xcup_lut"] / r["xc7_lut"] - 1) <= 0.05, r
    assert wide_port_logic(64, 4, 32) == (0, 0) and wide_port_logic(128, 4, 32)[0] > 0
    zc706, zcu104 = load_board("zc706"), load_board("zcu104")
    a = design_resources(2048, 8, 16, zc706, 8, 54, True, banks=2, ports=4)
    b = design_resources(2048, 8, 16, zcu104, 8, 54, True, banks=2, ports=4)
    wl, wf = wide_port_logic(zcu104.hp_width_bits, 4, 32)
    assert b.lut - a.lut == pytest.approx(wl, abs=1) and b.ff - a.ff == pytest.approx(wf, abs=1)


def test_memory_placement_is_what_memory_use_priced():
    """design_resources' placement names where each buffer goes, and re-pricing the buffers that way gives
    its BRAM36 and URAM counts: URAM for some buffers of a deep ZCU104 design, BRAM only on ZC706 (no URAM),
    nothing for a design that fits no placement."""
    from fluidnpu.dse.resource_model import memory_placement

    for board, design in ((load_board("zcu104"), (2788, 26, 64)), (load_board("zc706"), (3992, 14, 64))):
        res = design_resources(*design, board, 8, 54, False, banks=2, ports=4)
        assert set(res.placement) == {name for name, *_ in memories(*map(np.array, design), 8, banks=2)}
        bram = sum(n * bram36_for(d, w) for name, n, d, w in memories(*map(np.array, design), 8, banks=2)
                   if res.placement[name] == "bram")
        uram = sum(n * uram_for(d, w) for name, n, d, w in memories(*map(np.array, design), 8, banks=2)
                   if res.placement[name] == "uram")
        assert (float(bram), float(uram)) == (res.bram36, res.uram)
        assert ("uram" in res.placement.values()) == (board.uram > 0)
    assert memory_placement(10 ** 6, 64, 64, load_board("zc706"), 8, banks=2)[2] == {}


@pytest.mark.parametrize("TP,TC,NB", [(19, 3, 2), (32, 2, 4), (4, 5, 2)])
@pytest.mark.parametrize("stackable", [True, False])
def test_skew_register_bits_are_the_rtls(TP, TC, NB, stackable):
    """The model's operand-skew registers of the DSP chains (`skew_bits`, priced one FF a bit)
    are the delay registers the generated engine declares, bit for bit: the bank words' copies
    (`in{b}_{lo,hi}{i}_d*`) and the PEs' delayed bank selects (`sel{A,B}{p}_d*`)."""
    import re

    from amaranth.back import verilog

    from fluidnpu.hw.engine_core import EngineCore

    text = verilog.convert(EngineCore(TR=8, TP=TP, TC=TC, NB=NB, stackable=stackable), name="core", emit_src=False)
    bits = 0
    for m in re.finditer(r"^\s*reg\s*(?:signed\s*)?(\[(\d+):(\d+)\])?\s*(\\?[\w$.]+)", text, re.M):
        if re.fullmatch(r"\\?(in\d+_(lo|hi)\d+|sel[AB]\d+)_d\d+", m.group(4)):
            bits += int(m.group(2)) - int(m.group(3)) + 1 if m.group(1) else 1
    assert bits > 0
    assert skew_bits(np.array(TP), np.array(TC), NB, stackable) == bits


def test_plain_and_stackable_twins_are_priced_within_five_percent():
    """`lut_per_stack_pair` is measured, not fitted: the six EngineCore twins of
    docs/figures/resources/xcup_engines.json (benchmarks/synth_family.py, the DSP-cascade RTL) are what
    hold it. Each engine, plain or Stackable, is priced within 5 % of Yosys's xc7 LUTs and FFs."""
    doc = json.loads((CALIBRATION.parent / "xcup_engines.json").read_text())
    for r in doc["rows"]:
        lut, ff = engine_logic(np.array(r["TP"]), np.array(r["TC"]), 8, r["stackable"], banks=r["NB"])
        assert abs(float(lut) / r["xc7_lut"] - 1) <= 0.05, r
        assert abs(float(ff) / r["xc7_ff"] - 1) <= 0.05, r


def test_the_block_input_buffers_bram_is_what_yosys_mapped():
    """`input_buffer_bram36` against the Yosys run of the buffer at the ResNet-50/ZC706 pick's size
    (benchmarks/synth_input_buffer.py, recorded in docs/figures/resources/input_buffer.json): exact. And
    it moves by whole bank rows: one word more than a 512-row bank holds costs every bank more BRAM."""
    import json
    from pathlib import Path

    from fluidnpu.dse.resource_model import input_buffer_bram36
    from fluidnpu.hw.regmap import buffer_banks

    rec = json.loads((Path(__file__).parents[1] / "docs/figures/resources/input_buffer.json").read_text())
    assert buffer_banks(rec["TP"], rec["lanes"]) == rec["banks"]
    assert input_buffer_bram36(rec["TP"], rec["depth_words"]) == rec["counts"]["bram36"]
    window = rec["banks"] * rec["lanes"]
    full = 256 * window                    # 2 x 256 rows a bank: one BRAM36 in 512 x 72
    assert input_buffer_bram36(rec["TP"], full) == rec["banks"]
    assert input_buffer_bram36(rec["TP"], full + 1) > rec["banks"]



def test_a_buffer_bank_maps_as_yosys_maps_it():
    """`buffer_bank_bram36` equals Yosys's BRAM36 for one bank at every synthesized depth
    (docs/figures/resources/buffer_bank_depths.json, benchmarks/synth_buffer_bank.py), where the fewest
    BRAM36 that hold the rows do not; and `input_buffer_words` is its inverse: the most words a half
    whose banks take at most n BRAM36 each, one window more taking more."""
    import json
    from pathlib import Path

    from fluidnpu.dse.perf_model import windows
    from fluidnpu.dse.resource_model import buffer_bank_bram36, input_buffer_bram36, input_buffer_words

    doc = json.loads((Path(__file__).parents[1] / "docs/figures/resources/buffer_bank_depths.json").read_text())
    fewest = 0
    for pt in doc["points"]:
        assert float(buffer_bank_bram36(pt["rows"])) == pt["bram36"], pt
        fewest += float(bram36_for(np.asarray(pt["rows"]), pt["bits"])) == pt["bram36"]
    assert fewest < len(doc["points"])
    for TP in (7, 14, 28):
        window = int(windows(np.array(TP)))
        banks = window // 4
        for n in (1, 4, 17, 37, 38, 39, 120):
            words = int(input_buffer_words(np.array(TP), np.array(n)))
            assert input_buffer_bram36(TP, words) <= banks * n < input_buffer_bram36(TP, words + window)


def test_the_block_input_buffer_model_matches_yosys():
    """`input_buffer_logic` (less its walker and join) within 8 % of every Yosys point of the buffer
    (docs/figures/resources/input_buffer_points.json), the walker as recorded; the buffer with its
    walker and join within 1 % of what it adds to the two control units the join is fitted on and
    within 10 % at the ResNet-50/ZC706 pick's <1372, 14, 64> Bmax 8 (a check); a design's resources with
    a buffer add exactly its BRAM36 and logic; `buffer_room` gives back a buffer that fits what the
    design leaves."""
    import json
    from pathlib import Path

    from fluidnpu.boards import load_board
    from fluidnpu.dse.resource_model import (
        BUFFER_WALKER,
        buffer_banks_of,
        buffer_join_logic,
        buffer_room,
        design_resources,
        input_buffer_bram36,
        input_buffer_logic,
        input_buffer_per_bank,
        input_buffer_words,
    )

    doc = json.loads((Path(__file__).parents[1] / "docs/figures/resources/input_buffer_points.json").read_text())
    for pt in doc["points"]:
        tp, tc = np.array(pt["TP"]), np.array(64)        # benchmarks/synth_input_buffer.py's TC
        assert int(buffer_banks_of(tp)) == pt["banks"]
        bram = input_buffer_bram36(pt["TP"], pt["depth_words"])
        lut, ff = input_buffer_logic(tp, tc, bram / pt["banks"])
        join_lut, join_ff = buffer_join_logic(tp, tc)
        lut -= join_lut + BUFFER_WALKER[0]
        assert abs(ff - join_ff - BUFFER_WALKER[1] - pt["ff"]) <= 0.08 * pt["ff"] + 1, pt
        assert abs(BUFFER_WALKER[0] - pt["fill_walker"]["lut"]) <= 30
        assert bram == pt["bram36"], pt
        if pt["fit"]:
            assert abs(lut - pt["lut"]) <= 0.08 * pt["lut"], pt
        else:
            # a pick's buffer, outside the fit: its read muxes cost fewer LUTs than
            # the fit's slope (the model is above by at most a quarter)
            assert pt["lut"] <= lut <= 1.25 * pt["lut"], pt
    for cu in doc["control_units"]:
        per_bank = input_buffer_per_bank(cu["TP"], cu["buffer_words"])
        model = input_buffer_logic(np.array(cu["TP"]), np.array(cu["TC"]), per_bank)
        for i, res in enumerate(("lut", "ff")):
            added = cu["with_buffer"][res] - cu["without"][res]
            assert abs(model[i] - added) <= (0.01 if cu["fit"] else 0.10) * added, (cu, res, model[i], added)
    board = load_board("zc706")
    plain = design_resources(1372, 14, 64, board, 8, 70, True, banks=2, ports=3)
    words = 301_152
    built = design_resources(1372, 14, 64, board, 8, 70, True, banks=2, ports=3, input_buffer=words)
    assert built.bram36 - plain.bram36 == input_buffer_bram36(14, words)
    assert built.lut > plain.lut + buffer_join_logic(np.array(14), np.array(64))[0] + BUFFER_WALKER[0]
    room = int(buffer_room(np.array(1372), np.array(14), np.array(64), board, 8, 70, True, banks=2, ports=3))
    assert room >= 1 and int(input_buffer_words(np.array(14), room)) >= words
    fits = design_resources(1372, 14, 64, board, 8, 70, True, banks=2, ports=3,
                            input_buffer=int(input_buffer_words(np.array(14), room)))
    assert fits.bram36 <= board.limit("bram36") and fits.lut <= board.limit("lut")
