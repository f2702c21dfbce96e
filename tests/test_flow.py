"""`fluidnpu flow` (what `make run` runs): every step runs, each reads the bundle the one before wrote."""

from __future__ import annotations

import json
import os
import re

import pytest

from fluidnpu.bundle import load_bundle
from fluidnpu.cli import main


@pytest.mark.heavy(70)
def test_flow_runs_every_step(tmp_path, capsys):
    main(["flow", "--out", str(tmp_path), "--samples", "40", "--rate", "200", "--cosim-images", "2", "--json"])
    rep = json.loads(capsys.readouterr().out)
    main_bundle = load_bundle(tmp_path / "design.json")
    assert main_bundle.workload.name.lower().startswith("resnet") and main_bundle.bmax == 8
    keys = ("TR", "TP", "TC", "NB", "ports", "input_buffer")
    assert rep["main_design"]["design"] == dict(zip(keys, (*main_bundle.design, main_bundle.banks, main_bundle.ports,
                                                           main_bundle.input_buffer)))
    digits = load_bundle(tmp_path / "digits" / "design.json")
    assert rep["digits_design"]["design"] == dict(zip(keys, (*digits.design, digits.banks, digits.ports,
                                                             digits.input_buffer)))
    rtl_files = rep["rtl"]["files"]
    verilog = (tmp_path / "digits" / "vivado" / "rtl" / "fluidnpu_npu.v").read_text()
    assert str(tmp_path / "digits" / "vivado" / "rtl" / "fluidnpu_npu.v") in rtl_files.values()
    assert "module fluidnpu_npu" in verilog
    assert rep["rtl"]["design_hash"] in (tmp_path / "digits" / "vivado" / "package_ip.tcl").read_text()
    assert set(rep["rtl"]["vivado"]) >= {"package_ip", "block_design", "build"}
    assert rep["cosim"]["bit_identical"] is True and rep["cosim"]["images"] == 2
    assert rep["cosim"]["rtl_cycles"] > 0
    srv = rep["serving"]
    assert srv["sent"] == srv["answered"] == 40 and srv["policy"] == "fluidb"
    assert abs(sum(srv["exit_rates"]) - 1.0) < 1e-9 and srv["accuracy"] > 0.9
    # the same report as a person reads it at 80 columns: no line wider, nothing cut with "…"
    from rich.console import Console

    from fluidnpu.flow import print_report

    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    print_report(console, rep)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    assert {str(rep["main_design"]["dsp"]), f"{srv['answered']}/{srv['sent']}"} <= set(re.split(r"[\s│]+", text))


def test_flow_refuses_negative_cosim(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["flow", "--cosim-images", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
