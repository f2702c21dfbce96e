"""The design bundle: round trip, schema and cross checks."""

from __future__ import annotations

import json

import pytest

from fluidnpu.bundle import Bundle, bundle_from_result, load_bundle
from fluidnpu.dse.search import DSEOptions, explore
from fluidnpu.errors import FluidError


@pytest.fixture
def bundle(tiny_board, tiny_workload) -> Bundle:
    return bundle_from_result(explore(tiny_workload, tiny_board, DSEOptions(bmax=4)))


def test_round_trip(bundle, tmp_path):
    path = tmp_path / "d.json"
    bundle.save(path)
    again = load_bundle(path)
    assert again.data == json.loads(path.read_text())
    assert again.workload == bundle.workload
    assert again.board == bundle.board
    assert again.design == bundle.design
    for s in bundle.workload.schedule():
        for b in range(1, 5):
            assert again.fbcb(s.index, b) == bundle.fbcb(s.index, b)
            assert again.layer_cycles(s.index, b) == bundle.layer_cycles(s.index, b)
    assert again.latency_table() == bundle.latency_table()


def test_latency_table_is_nexits_by_bmax(bundle):
    table = bundle.latency_table()
    assert len(table) == len(bundle.workload.exits) and all(len(r) == 4 for r in table)
    # a bigger batch never finishes a segment sooner
    for row in table:
        assert all(a <= b for a, b in zip(row, row[1:]))
    seg0 = [s.index for s in bundle.workload.schedule() if s.segment == 0]
    assert bundle.segment_seconds(0, 2) == pytest.approx(
        sum(bundle.layer_cycles(i, 2) for i in seg0) / (bundle.clock_mhz * 1e6))


def _corrupt(bundle, tmp_path, mutate):
    data = json.loads(json.dumps(bundle.data))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("mutate,word", [
    (lambda d: d.pop("fbcb"), "fbcb"),
    (lambda d: d.__setitem__("version", 99), "version 99"),
    (lambda d: d["design"].__setitem__("TP", 0), "design.TP"),
    (lambda d: d["fbcb"]["entries"][0][1].__setitem__(0, 7), "FBCB entry"),
    (lambda d: d["fbcb"]["entries"][0][0].__setitem__(1, 3), "FBCB entry"),
    (lambda d: d["latency"]["segment_seconds"].pop(), "segment_seconds"),
    (lambda d: d["latency"]["layer_cycles"][0].pop(), "layer_cycles"),
    (lambda d: d["design"].__setitem__("TC", 10**6), "DSPs"),
    (lambda d: d["workload"]["exits"][0].__setitem__("rate", 0.9), "exit rates"),
    (lambda d: d["latency"]["segment_seconds"][0].__setitem__(0, 1.0), "disagrees"),
])
def test_corrupt_bundles_are_refused(bundle, tmp_path, mutate, word):
    with pytest.raises(FluidError, match=word):
        load_bundle(_corrupt(bundle, tmp_path, mutate))


def test_not_json_and_missing(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(FluidError, match="not valid JSON"):
        load_bundle(bad)
    with pytest.raises(FluidError, match="does not exist"):
        load_bundle(tmp_path / "nope.json")


def test_a_design_with_the_block_input_buffer_carries_it_to_the_npu(make_board, tiny_workload, tmp_path):
    """A DSE result with the block input buffer (a board whose DDR is slow enough for it to pay): the bundle
    records its words a half and marks the buffered FBCB entries [BR, k, 1]; NpuParams builds the buffer
    and packs each BUFFERED bit where the plan has it; the design hash covers the buffer; a buffered entry
    on a bundle without a buffer is refused in one line."""
    from fluidnpu.hw.regmap import NpuParams, decode_fbcb_entry, design_hash, fbcb_buffered, fbcb_entry_bits

    result = explore(tiny_workload, make_board(dsp=4, bram36=16, hp_ports=2, ddr_mts=60),
                     DSEOptions(bmax=3, buffer=True, stackable=True))
    assert result.input_buffer > 0 and any(any(row) for row in result.plan.buffered)
    path = tmp_path / "design.json"
    bundle_from_result(result).save(path)
    b = load_bundle(path)
    assert b.input_buffer == result.input_buffer and b.data["fbcb"]["bits_per_entry"] == fbcb_entry_bits(3) + 1
    params = NpuParams.from_bundle(b)
    assert params.input_buffer == result.input_buffer and params.fbcb_width == fbcb_entry_bits(3) + 1
    for li, row in enumerate(result.plan.buffered):
        for bb, buffered in enumerate(row, start=1):
            word = params.fbcb[li * 3 + bb - 1]
            assert fbcb_buffered(word, 3) == buffered and b.fbcb(li, bb).buffered == buffered
            assert decode_fbcb_entry(word, 3) == (result.plan.BR[li][bb - 1], result.plan.k_code[li][bb - 1])
    data = json.loads(path.read_text())
    without = json.loads(path.read_text())
    del without["design"]["input_buffer"]
    assert design_hash(data) != design_hash(without)
    with pytest.raises(FluidError, match="buffered but design.input_buffer"):
        Bundle(without)
