"""`fluidnpu flow` (what `make run` runs): every step runs, each reads the bundle the one before wrote."""

from __future__ import annotations

import json
import os
import re

import pytest

from fluidnpu.bundle import load_bundle
from fluidnpu.cli import main
from fluidnpu.errors import FluidError

# what the co-simulation's tools print: Verilator's warnings and errors, cocotb's GPI start-up lines
TOOL_NOISE = re.compile(r"%Warning|%Error|\bINFO\b|\bgpi\b")


@pytest.mark.heavy(70)
def test_flow_runs_every_step(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("V", raising=False)
    main(["flow", "--out", str(tmp_path), "--samples", "40", "--rate", "200", "--cosim-images", "2", "--json"])
    out, err = capfd.readouterr()   # at the file descriptors: the simulator is a subprocess
    rep = json.loads(out)
    # the simulator's output went to the step's log, none of it to the terminal (the build's too, if it ran)
    log = tmp_path / "logs" / "cosim.log"
    assert rep["cosim"]["log"] == str(log)
    assert TOOL_NOISE.search(log.read_text()) and "$finish" in log.read_text()
    assert not TOOL_NOISE.search(out + err) and "$finish" not in out + err
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


def test_flow_failed_step_prints_its_log_tail(tmp_path, capfd):
    """A co-simulation whose build fails (Verilator refusing a broken module, a second's work): the tools'
    output is in the step's log, the terminal gets the log's tail and one error naming the log."""
    from fluidnpu.flow import _logged
    from fluidnpu.sim_tb.runner import run_cocotb

    broken = tmp_path / "broken.v"
    broken.write_text("module broken(input clk);\n  assign = ;\nendmodule\n")
    log = tmp_path / "logs" / "cosim.log"
    log.parent.mkdir()
    log.write_text("a previous run's log\n")
    with pytest.raises(FluidError) as exc:
        _logged(4, "co-simulation", log, lambda: run_cocotb(broken, "broken", "fluidnpu.sim_tb.tb_dma",
                                                            build_dir=tmp_path / "sim", log_file=log))
    assert str(exc.value).startswith("step 4 (co-simulation) failed: ") and str(exc.value).endswith(str(log))
    text = log.read_text()
    assert "%Error" in text and "previous run" not in text
    out, err = capfd.readouterr()
    assert out == ""
    tail = err.split(f"--- the last lines of {log} ---\n")[1].split(f"--- end of {log} ---")[0]
    assert tail == "".join(text.splitlines(keepends=True)[-40:])


def test_flow_refuses_negative_cosim(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["flow", "--cosim-images", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
