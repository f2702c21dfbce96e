"""pyverilog reads the generated top back: ports, widths and wiring against hw/regmap.py, the wrapper and the Tcl."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyverilog")
pytest.importorskip("amaranth")

from fluidnpu.bundle import bundle_from_result, load_bundle  # noqa: E402
from fluidnpu.dse.search import DSEOptions, evaluate_design  # noqa: E402
from fluidnpu.errors import FluidError  # noqa: E402
from fluidnpu.hls_gen.vivado import write_vivado_project  # noqa: E402
from fluidnpu.hw.regmap import WINDOW_BYTES, NpuParams  # noqa: E402
from fluidnpu.hw.verilog_check import check_files, check_rtl, module_ports, parse_module  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """`fluidnpu vivado` of a 16-DSP digits-ee design: the RTL, the wrapper and the Tcl (seconds)."""
    from fluidnpu.boards import load_board
    from fluidnpu.zoo import zoo_model

    board = load_board(str(EXAMPLES / "zc706_16dsp.json"))
    bundle = bundle_from_result(evaluate_design(zoo_model("digits-ee"), board, 30, 4, 4, DSEOptions(bmax=2)))
    root = tmp_path_factory.mktemp("viv")
    bundle.save(root / "design.json")
    out = root / "viv"
    summary = write_vivado_project(load_bundle(root / "design.json"), out)
    return out, NpuParams.from_bundle(bundle, axi_dw=64), summary


def _read(out: Path) -> tuple[str, str, dict[str, str]]:
    return ((out / "rtl" / "fluidnpu_top.v").read_text(), (out / "rtl" / "fluidnpu_npu.v").read_text(),
            {n: (out / n).read_text() for n in ("package_ip.tcl", "block_design.tcl")})


def test_generated_project_passes(project):
    out, params, summary = project
    assert summary["verilog_check"] == {"parser": "pyverilog", "status": "ok"}  # vivado's own self-check
    assert check_files(out / "rtl", params) == []
    top_v, _, _ = _read(out)
    ports = module_ports(parse_module(top_v, "fluidnpu_top"))
    assert all(ports[f"m_axi{i}_wdata"].width == params.axi_dw for i in range(params.axi_ports))
    assert ports["s_axi_rdata"].width == 32
    assert ports["interrupt"].direction == "out" and ports["aresetn"].direction == "in"
    assert 1 << ports["s_axi_awaddr"].width >= WINDOW_BYTES


@pytest.mark.parametrize("edit, word", [
    (lambda t: t.replace("output wire [31:0] s_axi_rdata", "output wire [15:0] s_axi_rdata"),
     "s_axi_rdata is 16 bits, expected 32"),
    (lambda t: t.replace("output wire interrupt", "output wire irq_out").replace(".irq(interrupt)", ".irq(irq_out)"),
     "no port interrupt"),
    (lambda t: t.replace("    .rst(rst),\n", ""), "leaves fluidnpu_npu.rst unconnected"),
    (lambda t: t.replace("DATA_WIDTH 64", "DATA_WIDTH 32"), "DATA_WIDTH 32"),
    (lambda t: t.replace("input  wire aresetn", "output wire aresetn"), "aresetn is an output"),
])
def test_broken_tops_are_caught(project, edit, word):
    out, params, _ = project
    top_v, npu_v, tcl = _read(out)
    broken = edit(top_v)
    assert broken != top_v
    problems = check_rtl(broken, npu_v, params, tcl=tcl)
    assert any(word in p for p in problems), problems


def test_tcl_disagreement_is_caught(project):
    out, params, _ = project
    top_v, npu_v, tcl = _read(out)
    tcl["package_ip.tcl"] = tcl["package_ip.tcl"].replace("set fluidnpu_m_axi_addr_width 32",
                                                          "set fluidnpu_m_axi_addr_width 40")
    assert any("fluidnpu_m_axi_addr_width 40" in p for p in check_rtl(top_v, npu_v, params, tcl=tcl))
    wrong_width = NpuParams(params.TR, params.TP, params.TC, params.bmax, params.layers, axi_dw=128)
    assert any("m_axi0_wdata is 64 bits, expected 128" in p for p in check_rtl(top_v, npu_v, wrong_width))


def test_unparsable_verilog_is_one_line(project):
    out, params, _ = project
    top_v, npu_v, _ = _read(out)
    with pytest.raises(FluidError, match="does not parse"):
        check_rtl(top_v.replace("wire rst = ~aresetn;", "wire rst = ~;"), npu_v, params)
