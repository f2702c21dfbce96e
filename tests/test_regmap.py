"""The register map definition (pure Python) and its exports: JSON, C header, Markdown."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from fluidnpu.bundle import Bundle, bundle_from_result
from fluidnpu.dse import resource_model
from fluidnpu.dse.search import DSEOptions, explore
from fluidnpu.errors import FluidError
from fluidnpu.hw import export, regmap
from fluidnpu.hw.regmap import (
    REG,
    REGISTERS,
    Access,
    ErrorCode,
    KCode,
    NpuParams,
    bank_choices,
    bank_select_bits,
    chain_count,
    chain_position,
    chains,
    decode_fbcb_entry,
    design_hash,
    encode_fbcb_entry,
    fbcb_entry_bits,
    fbcb_index,
    fbcb_table,
    longest_chain,
    mode_depth,
    skew_words,
    sum_depth,
)


@pytest.fixture
def tiny_bundle(tiny_board, tiny_workload) -> Bundle:
    return bundle_from_result(explore(tiny_workload, tiny_board, DSEOptions(bmax=4)))


def test_regmap_imports_without_amaranth_or_numpy():
    code = ("import sys, fluidnpu.hw.regmap, fluidnpu.hw.export; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('amaranth', 'numpy')]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_offsets_are_the_documented_ones():
    expected = {"ID": 0x00, "VERSION": 0x04, "CTRL": 0x08, "IRQ_EN": 0x0C, "STATUS": 0x10, "IRQ_STATUS": 0x14,
                "DESC_BASE": 0x18, "DESC_COUNT": 0x1C, "BACTIVE": 0x20, "BEXIT": 0x24, "BINCR": 0x28,
                "FBCB_ADDR": 0x2C, "FBCB_DATA": 0x30, "LAYER": 0x34, "CYC_BUSY": 0x40, "CYC_MAC": 0x44,
                "CYC_DMA_STALL": 0x48, "CYC_LAYERS": 0x4C, "CFG_TR": 0x60, "CFG_TP": 0x64, "CFG_TC": 0x68,
                "CFG_BMAX": 0x6C, "CFG_LAYERS": 0x70, "CFG_AXI_DW": 0x74, "CFG_DESIGN_HASH": 0x78}
    assert {r.name: r.offset for r in REGISTERS} == expected
    access = {"CTRL": Access.WO, "BEXIT": Access.WO, "BINCR": Access.WO, "FBCB_DATA": Access.WO,
              "IRQ_STATUS": Access.W1C, "IRQ_EN": Access.RW, "DESC_BASE": Access.RW, "DESC_COUNT": Access.RW,
              "BACTIVE": Access.RW, "FBCB_ADDR": Access.RW}
    for r in REGISTERS:
        assert r.access is access.get(r.name, Access.RO), r.name
    assert REG["ID"].reset == 0x464E5055 == int.from_bytes(b"FNPU", "big")
    assert REG["VERSION"].reset == 1 << 16
    st = REG["STATUS"]
    assert [(f.name, f.lsb, f.width) for f in st.fields] == [("BUSY", 0, 1), ("DONE", 1, 1), ("ERROR", 2, 1),
                                                            ("ERROR_CODE", 8, 8)]


def test_fields_fit_and_do_not_overlap():
    offsets = [r.offset for r in REGISTERS]
    assert len(set(offsets)) == len(offsets)
    for r in REGISTERS:
        assert r.offset % 4 == 0 and r.offset < regmap.WINDOW_BYTES
        assert r.fields, r.name
        used = 0
        for f in r.fields:
            assert f.width >= 1 and f.msb <= 31, (r.name, f.name)
            assert used & f.mask == 0, (r.name, f.name)
            used |= f.mask
        if r.reset:
            assert r.reset & ~r.mask == 0, r.name


def test_field_helpers():
    code = REG["STATUS"].field("ERROR_CODE")
    assert code.mask == 0xFF00
    word = code.put(ErrorCode.AXI_WRITE) | 0b101
    assert code.get(word) == 5 and REG["STATUS"].field("BUSY").get(word) == 1
    with pytest.raises(FluidError):
        code.put(256)
    with pytest.raises(KeyError):
        REG["STATUS"].field("NOPE")


def test_error_codes():
    fixed = {"NONE": 0, "BAD_BACTIVE": 1, "BAD_BACTIVE_UPDATE": 2, "BAD_DESCRIPTOR": 3, "AXI_READ": 4,
             "AXI_WRITE": 5, "START_WHILE_BUSY": 6}
    for name, value in fixed.items():
        assert ErrorCode[name] == value
    assert all(e.message and "\n" not in e.message for e in ErrorCode)
    assert max(ErrorCode) < 1 << REG["STATUS"].field("ERROR_CODE").width


@pytest.mark.parametrize("bmax,bits", [(1, 2), (2, 3), (3, 4), (4, 4), (5, 5), (8, 5), (9, 6), (16, 6)])
def test_fbcb_entry_width_and_round_trip(bmax, bits):
    assert fbcb_entry_bits(bmax) == bits
    # the resource model prices the very entries the RTL stores (one definition, regmap's)
    assert resource_model.fbcb_entry_bits is fbcb_entry_bits
    seen = set()
    for br in range(1, bmax + 1):
        for k in (0, 1, 2):
            word = encode_fbcb_entry(br, k, bmax)
            assert word < 1 << bits
            assert decode_fbcb_entry(word, bmax) == (br, k)
            seen.add(word)
    assert len(seen) == 3 * bmax
    assert encode_fbcb_entry(3, 2, 8) == 2 | 2 << 2


def test_fbcb_encode_refuses_bad_entries():
    with pytest.raises(FluidError):
        encode_fbcb_entry(1, 3, 4)
    with pytest.raises(FluidError):
        encode_fbcb_entry(5, 0, 4)
    with pytest.raises(FluidError):
        encode_fbcb_entry(0, 0, 4)
    with pytest.raises(FluidError):
        fbcb_index(0, 5, 4)
    assert fbcb_index(2, 3, 4) == 10


def test_fbcb_table_and_params_from_bundle(tiny_bundle):
    table = fbcb_table(tiny_bundle)
    n_layers = len(tiny_bundle.workload.layers())
    assert len(table) == n_layers * 4
    for layer in range(n_layers):
        for b in range(1, 5):
            e = tiny_bundle.fbcb(layer, b)
            assert decode_fbcb_entry(table[fbcb_index(layer, b, 4)], 4) == (e.BR, e.k_code)
    p = NpuParams.from_bundle(tiny_bundle)
    assert (p.TR, p.TP, p.TC) == tiny_bundle.design and p.bmax == 4 and p.layers == n_layers
    assert p.axi_dw == tiny_bundle.board.hp_width_bits and p.fbcb == tuple(table)
    assert p.design_hash == design_hash(tiny_bundle) == design_hash(tiny_bundle.data)
    assert p.cfg_values["CFG_DESIGN_HASH"] == p.design_hash
    # Stackable PEs as the bundle's DSE options say (the baselines' engines are built without)
    assert p.stackable == tiny_bundle.data["dse"]["stackable"]
    plain = json.loads(json.dumps(tiny_bundle.data))
    plain["dse"]["stackable"] = not p.stackable
    assert NpuParams.from_bundle(plain).stackable == (not p.stackable)
    assert p.banks == tiny_bundle.banks == tiny_bundle.data["design"]["NB"]
    with pytest.raises(FluidError):
        NpuParams(TR=1, TP=1, TC=1, bmax=2, layers=2, fbcb=(0, 1, 2))



def test_params_carry_the_memory_placement(tiny_bundle):
    """The bundle's resources.placement (what the DSE priced) reaches the RTL's parameters; a bundle
    without one leaves the placement to the tool; a placement naming no buffer or kind is refused."""
    d = json.loads(json.dumps(tiny_bundle.data))
    assert NpuParams.from_bundle(d).placement == tuple(sorted(d["resources"]["placement"].items()))
    d["resources"]["placement"] = {"accumulator": "uram", "input": "bram"}
    assert NpuParams.from_bundle(d).placement == (("accumulator", "uram"), ("input", "bram"))
    del d["resources"]["placement"]
    assert NpuParams.from_bundle(d).placement == ()
    for bad in ((("weights", "bram"),), (("input", "lutram"),)):
        with pytest.raises(FluidError, match="placement"):
            NpuParams(TR=8, TP=2, TC=2, bmax=2, layers=1, placement=bad)

def test_design_hash_spec_and_sensitivity(tiny_bundle):
    d = tiny_bundle.data
    words = [d["design"]["TR"], d["design"]["TP"], d["design"]["TC"], 4, len(d["fbcb"]["entries"]),
             d["design"]["NB"], d["design"]["ports"], *fbcb_table(d)]
    assert design_hash(d) == zlib.crc32(struct.pack(f"<{len(words)}I", *words))
    changed = json.loads(json.dumps(d))
    row = changed["fbcb"]["entries"][0]
    row[3] = [row[3][0], (row[3][1] + 1) % 3]
    assert design_hash(changed) != design_hash(d)
    changed = json.loads(json.dumps(d))
    changed["design"]["TR"] += 1
    assert design_hash(changed) != design_hash(d)
    changed = json.loads(json.dumps(d))
    changed["design"]["NB"] = 8 if d["design"]["NB"] != 8 else 4
    assert design_hash(changed) != design_hash(d)
    # a bundle from before design.NB: the most banks its batching uses
    del changed["design"]["NB"]
    assert NpuParams.from_bundle(changed).banks == 4
    changed["dse"]["batching"] = "r"
    assert NpuParams.from_bundle(changed).banks == 2
    # the AXI master count P: in the hash and in the RTL's parameters; a bundle from before
    # design.ports uses every HP port of its board
    changed = json.loads(json.dumps(d))
    changed["design"]["ports"] = 1 if d["design"]["ports"] != 1 else 2
    assert design_hash(changed) != design_hash(d)
    assert NpuParams.from_bundle(changed).axi_ports == changed["design"]["ports"]
    del changed["design"]["ports"]
    assert NpuParams.from_bundle(changed).axi_ports == min(d["board"]["hp_ports"], 4)
    # things that do not reach the RTL do not change it
    changed = json.loads(json.dumps(d))
    changed["clock_mhz"] = 123.0
    changed["performance"]["peak_gops"] = 1.0
    assert design_hash(changed) == design_hash(d)
    with pytest.raises(FluidError):
        design_hash([1, 2])


PARAMS = NpuParams(TR=8, TP=4, TC=3, bmax=4, layers=3, axi_dw=128, design_hash=0x1234ABCD)


def test_json_export_matches_definition():
    data = json.loads(export.regmap_json(PARAMS))
    assert data["format"] == "fluidnpu-regmap" and data["id"] == 0x464E5055
    assert [r["name"] for r in data["registers"]] == [r.name for r in REGISTERS]
    by_name = {r["name"]: r for r in data["registers"]}
    assert by_name["STATUS"]["fields"][3] == {"name": "ERROR_CODE", "lsb": 8, "width": 8, "mask": 0xFF00,
                                              "desc": REG["STATUS"].field("ERROR_CODE").desc}
    assert by_name["CFG_AXI_DW"]["reset"] == 128 and by_name["CFG_DESIGN_HASH"]["reset"] == 0x1234ABCD
    assert {e["name"]: e["code"] for e in data["error_codes"]} == {e.name: int(e) for e in ErrorCode}
    assert data["design"]["fbcb_entry_bits"] == 4 and data["design"]["fbcb_depth"] == 12
    generic = json.loads(export.regmap_json())
    assert "design" not in generic and {r["name"]: r["reset"] for r in generic["registers"]}["CFG_TR"] is None


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_c_header_compiles_and_agrees(tmp_path):
    header = tmp_path / "fluidnpu_regs.h"
    header.write_text(export.c_header(PARAMS))
    proc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only",
                           "-x", "c", str(header)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # compile and run a program that prints what the header says, and compare with Python
    prog = tmp_path / "check.c"
    prog.write_text('#include <stdio.h>\n#include "fluidnpu_regs.h"\nint main(void) {\n'
                    '  printf("%u %u %u %u %u\\n", FLUIDNPU_REG_FBCB_DATA, FLUIDNPU_REG_STATUS_ERROR_CODE_MASK,\n'
                    '         FLUIDNPU_REG_STATUS_ERROR_CODE_SHIFT, FLUIDNPU_FBCB_ENTRY(3, FLUIDNPU_K_CODE_HALF),\n'
                    '         FLUIDNPU_CFG_DESIGN_HASH);\n'
                    '  printf("%s\\n", fluidnpu_error_message(FLUIDNPU_ERR_BAD_BACTIVE_UPDATE));\n'
                    '  return 0;\n}\n')
    exe = tmp_path / "check"
    proc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(prog)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, timeout=10).stdout.splitlines()
    assert lines[0].split() == [str(v) for v in (0x30, 0xFF00, 8, encode_fbcb_entry(3, 2, 4), 0x1234ABCD)]
    assert lines[1] == ErrorCode.BAD_BACTIVE_UPDATE.message


def test_markdown_has_every_register_and_code():
    md = export.markdown(PARAMS)
    for r in REGISTERS:
        assert f"### {r.name}\n" in md and f"| 0x{r.offset:02X} | [{r.name}]" in md
    for e in ErrorCode:
        assert f"| {int(e)} | {e.name} |" in md
    assert "## This build" in md and "0x1234abcd" in md
    assert "## This build" not in export.markdown()


def test_committed_register_map_doc_is_current():
    committed = export.DOC_PATH.read_text()
    assert committed == export.markdown(), \
        "docs/register-map.md is stale: run `python -m fluidnpu.hw.export docs/register-map.md`"


def _tree_depth(depths: list[int], split: int | None = None) -> int:
    """The depth hw/mac_tree.adder_tree builds over leaves of these depths (halving, top at split)."""
    def build(lo: int, hi: int, mid: int | None = None) -> int:
        if hi - lo == 1:
            return depths[lo]
        mid = lo + (hi - lo) // 2 if mid is None else mid
        return max(build(lo, mid), build(mid, hi)) + 1
    return build(0, len(depths), split)


@pytest.mark.parametrize("chain", [1, 2, 8])
def test_dsp_chains_cover_each_half_and_their_depth_is_what_the_engine_builds(chain):
    """regmap's chain facts (the engine builds from them, the DSE prices them) against their
    definitions: the chains partition each half's lanes in runs of at most `chain`; positions,
    counts, skew and the root's depth follow; with one-lane chains the depth is ceil(log2 TP)."""
    TPs = np.arange(1, 81)
    for TP in TPs.tolist():
        runs = chains(TP, chain)
        h = TP // 2
        assert [i for s, e in runs for i in range(s, e)] == list(range(TP))
        assert all(e - s <= chain and (s < h) == (e <= h) for s, e in runs)
        pos = [chain_position(TP, i, chain) for i in range(TP)]
        assert pos == [i - s for s, e in runs for i in range(s, e)]
        assert chain_count(TP, chain) == len(runs)
        assert longest_chain(TP, chain) == max(e - s for s, e in runs)
        assert skew_words(TP, chain) == sum(pos)
        lower = sum(1 for s, _ in runs if s < h)
        built = _tree_depth([e - s - 1 for s, e in runs], lower if 0 < lower < len(runs) else None)
        assert sum_depth(TP, chain) == built
        if chain == 1:
            assert built == (TP - 1).bit_length()
    for fn in (chain_count, longest_chain, skew_words, sum_depth):
        assert fn(TPs, chain).tolist() == [fn(int(t), chain) for t in TPs]
    assert mode_depth(TPs, KCode.K2).tolist() == (sum_depth(TPs) + 1).tolist()


def test_bank_select_bits_is_log2_of_every_buildable_bank_count():
    """The engine's bank-select width, which the resource model's skew registers count: log2 NB for
    every NB the RTL builds; a count it cannot build is refused."""
    for nb in bank_choices(16):
        assert 1 << bank_select_bits(nb) == nb
    for bad in (0, 1, 3, 6):
        with pytest.raises(ValueError):
            bank_select_bits(bad)
