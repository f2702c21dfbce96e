"""Board catalog: built-in figures and user board validation."""

from __future__ import annotations

import json

import pytest

from fluidnpu.boards.catalog import BOARD_DIR, board_sources, builtin_boards, load_board
from fluidnpu.errors import FluidError


def test_builtin_boards_match_datasheets():
    zc706 = load_board("zc706")
    assert (zc706.part, zc706.dsp, zc706.bram36, zc706.uram, zc706.lut, zc706.ff, zc706.clock_mhz) == \
        ("xc7z045ffg900-2", 900, 545, 0, 218600, 437200, 150)
    zcu104 = load_board("ZCU104")
    assert (zcu104.part, zcu104.dsp, zcu104.bram36, zcu104.uram, zcu104.clock_mhz) == \
        ("xczu7ev-ffvc1156-2-e", 1728, 312, 96, 200)
    assert builtin_boards() == ["zc706", "zcu104"]


def test_every_figure_has_a_source():
    for name in builtin_boards():
        sources = board_sources(name)
        assert len(sources) >= 12
        assert all("[" in v and len(v.split("[", 1)[1]) > 10 for v in sources.values())


def test_bandwidth_is_the_lesser_of_hp_ports_and_ddr():
    zc706 = load_board("zc706")
    # DDR3 32-bit at 1066 MT/s x 0.8 = 3.41 GB/s < 4 x 64-bit HP ports at 150 MHz = 4.8 GB/s
    assert zc706.bandwidth_bytes_per_s() == pytest.approx(4 * 1066e6 * 0.8)
    zcu104 = load_board("zcu104")
    # 4 x 128-bit HP at 200 MHz = 12.8 GB/s < DDR4 64-bit at 2400 MT/s x 0.8 = 15.36 GB/s
    assert zcu104.bandwidth_bytes_per_s() == pytest.approx(12.8e9)
    assert zcu104.bytes_per_cycle() == pytest.approx(64.0)


def test_user_board_file(tmp_path):
    data = json.loads((BOARD_DIR / "zc706.json").read_text())
    data["name"] = "myboard"
    data["resources"]["dsp"]["value"] = 220
    path = tmp_path / "myboard.json"
    path.write_text(json.dumps(data))
    assert load_board(str(path)).dsp == 220


@pytest.mark.parametrize("mutate,word", [
    (lambda d: d["resources"].pop("dsp"), "dsp"),
    (lambda d: d.pop("clock_mhz"), "clock_mhz"),
    (lambda d: d["resources"]["lut"].__setitem__("value", -5), "resources.lut.value"),
    (lambda d: d["axi_hp"]["width_bits"].__setitem__("value", 48), "width_bits"),
    (lambda d: d.__setitem__("format", "something"), "format"),
    (lambda d: d["clock_mhz"].__setitem__("value", 400), "max_clock_mhz"),
])
def test_bad_board_files(tmp_path, mutate, word):
    data = json.loads((BOARD_DIR / "zc706.json").read_text())
    mutate(data)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FluidError, match=word) as exc:
        load_board(str(path))
    assert "\n" not in str(exc.value)


def test_unknown_board_and_bad_json(tmp_path):
    with pytest.raises(FluidError, match="unknown board"):
        load_board("vcu118")
    bad = tmp_path / "b.json"
    bad.write_text("[1, 2")
    with pytest.raises(FluidError, match="not valid JSON"):
        load_board(str(bad))


def test_resource_ceilings_default_and_from_the_board_file(tmp_path):
    zc706 = load_board("zc706")
    # LUT/FF at 80 % leave room to route and close timing; the hard blocks may fill
    assert zc706.limit("lut") == 174_880 and zc706.limit("ff") == 349_760
    assert zc706.limit("dsp") == 900 and zc706.limit("bram36") == 545
    data = json.loads((BOARD_DIR / "zc706.json").read_text())
    data["ceilings"] = {"lut": 0.7, "bram36": 0.9}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    board = load_board(str(path))
    assert board.limit("lut") == 153_020 and board.limit("bram36") == 490 and board.limit("ff") == 349_760
    # a command-line override replaces one ceiling and keeps the rest; the bundle carries them
    tight = board.with_ceilings(lut=0.5, ff=None)
    assert tight.limit("lut") == 109_300 and tight.limit("bram36") == 490
    from fluidnpu.boards.catalog import Board
    assert Board.from_dict(tight.to_dict()) == tight
    old = tight.to_dict()
    del old["ceilings"]                   # a bundle written before ceilings existed
    assert Board.from_dict(old).ceilings == zc706.ceilings


@pytest.mark.parametrize("ceilings,msg", [({"lut": 1.5}, "ceilings"), ({"lut": 0}, "ceilings"),
                                          ({"luts": 0.5}, "ceilings")])
def test_bad_ceilings_are_refused(tmp_path, ceilings, msg):
    data = json.loads((BOARD_DIR / "zc706.json").read_text())
    data["ceilings"] = ceilings
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FluidError, match=msg):
        load_board(str(path))
    with pytest.raises(FluidError, match="ceiling"):
        load_board("zc706").with_ceilings(lut=1.2)
