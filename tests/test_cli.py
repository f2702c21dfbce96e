"""The `fluidnpu` CLI: figures with --json, and bad input as one line + exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fluidnpu.bundle import load_bundle


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fluidnpu.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def resnet_bundle(tmp_path_factory):
    path = tmp_path_factory.mktemp("dse") / "design.json"
    proc = run("dse", "--model", "resnet50", "--board", "zc706", "--bmax", "8", "-o", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return path, json.loads(proc.stdout)


def test_dse_json_and_bundle(resnet_bundle):
    path, summary = resnet_bundle
    assert summary["model"] == "ResNet-50" and summary["board"] == "zc706"
    d = summary["design"]
    assert d["TP"] * d["TC"] <= 900
    # every resource under the board's default ceilings (LUT/FF 80 %, the hard blocks 100 %)
    ceilings = {"dsp": 1.0, "bram36": 1.0, "uram": 1.0, "lut": 0.8, "ff": 0.8}
    assert all(summary["utilisation"][k] <= share for k, share in ceilings.items()), summary["utilisation"]
    assert len(summary["gops"]) == 8 and all(0 < g <= summary["peak_gops"] for g in summary["gops"])
    assert len(summary["segment_latency_ms"]) == 4
    bundle = load_bundle(path)
    assert bundle.design == (d["TR"], d["TP"], d["TC"])
    # the stem as the host feeds it: conv1's 7 x 7 stride 2 over 3 channels runs as 1 x 7 over 21
    assert summary["stem"] == {"layer": "conv1", "network": {"kernel": [7, 7], "stride": [2, 2], "in_ch": 3},
                               "npu": {"kernel": [1, 7], "stride": [1, 2], "in_ch": 21, "in_hw": [112, 224]}}
    assert bundle.workload.stem is not None and bundle.workload.backbone[0].kernel == (1, 7)


def test_dse_reports_the_timing_proxy(resnet_bundle):
    from fluidnpu.dse.resource_model import input_buffer_per_bank
    from fluidnpu.dse.timing_model import design_timing

    path, summary = resnet_bundle
    d = summary["design"]
    per_bank = input_buffer_per_bank(d["TP"], d["input_buffer"])
    expect = design_timing(d["TR"], d["TP"], d["TC"], 8, banks=d["NB"], buffer_per_bank=per_bank).to_dict()
    assert summary["timing_proxy"] == expect
    assert load_bundle(path).data["timing_proxy"] == expect


def test_show_reads_the_bundle(resnet_bundle):
    path, summary = resnet_bundle
    proc = run("show", str(path), "--json", "--layers")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["design"] == summary["design"]
    assert len(shown["layers"]) == 54 + 3 * 3
    human = run("show", str(path), "--layers")
    assert human.returncode == 0 and "FBCB" in human.stdout and "layer1.0.conv2" in human.stdout


def test_dse_human_summary_for_inception_on_zcu104():
    proc = run("dse", "--model", "inceptionv3", "--board", "zcu104", "--bmax", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    pick = json.loads(proc.stdout)
    placement = pick["resources"]["placement"]
    # the human summary of the same design, evaluated (the search ran above)
    d = pick["design"]
    proc = run("dse", "--model", "inceptionv3", "--board", "zcu104", "--bmax", "4", "--design",
               f"{d['TR']},{d['TP']},{d['TC']}", "--banks", str(d["NB"]), "--ports", str(d["ports"]),
               "--stackable" if pick["stackable"] else "--no-stackable")
    assert proc.returncode == 0, proc.stderr
    assert "<TR, TP, TC>" in proc.stdout and "GOp/s" in proc.stdout
    flat = " ".join(proc.stdout.split())  # the sentences as written, wrapped at 80 columns when piped
    assert "stem Conv2d_1a_3x3 folded by the host: 3x3 stride 2 over 3 channels runs as 1x3 over 9" in flat
    # where the buffers go, as the bundle tells the RTL to build them
    line = flat[flat.index("buffers (built with ram_style)"):].split(" timing proxy")[0]
    assert all(f"{name} in {kind.upper()}" in line for name, kind in placement.items()) and placement


def test_dse_pe_kind_flag():
    """--stackable / --no-stackable fix the PE kind a design is built with (the bundle and the summary
    say which); a plain-PE engine costs fewer LUTs; without either flag the DSE picks the kind."""
    def summary(*flags: str) -> dict:
        proc = run("dse", "--model", "digits-ee", "--board", "zc706", "--bmax", "4", "--design", "64,4,8",
                   "--json", *flags)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    stack, plain, free = summary("--stackable"), summary("--no-stackable"), summary()
    assert stack["stackable"] is True and plain["stackable"] is False
    assert plain["resources"]["lut"] < stack["resources"]["lut"]
    assert free["stackable"] in (True, False)
    chosen = stack if free["stackable"] else plain
    assert free["gops"] == chosen["gops"] and free["resources"] == chosen["resources"]


def test_models_and_boards_json():
    models = json.loads(run("models", "--json").stdout)
    assert {m["name"] for m in models} == {"resnet50", "inceptionv3", "digits-ee"}
    assert [m["gemm_layers"] for m in models] == [54, 95, 4]
    boards = json.loads(run("boards", "--json").stdout)
    assert [b["name"] for b in boards] == ["zc706", "zcu104"]
    one = json.loads(run("boards", "zcu104", "--json").stdout)
    assert one["dsp"] == 1728 and "resources.dsp" in one["sources"]


@pytest.mark.parametrize("args,word", [
    (["dse", "--model", "vgg16", "--board", "zc706"], "unknown model"),
    (["dse", "--model", "resnet50", "--board", "vcu118"], "unknown board"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--bmax", "0"], "--bmax"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--bmax", "500"], "Bmax"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--clock", "900"], "clock"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--clock", "-3"], "clock"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--weights", "1,x"], "--weights"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--fixed-batch", "9"], "fixed batch"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--exits", "a"], "ONNX"),
    (["dse", "--model", "missing.onnx", "--board", "zc706"], "missing.onnx"),
    (["dse", "--model", "resnet50"], "--board"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--ports", "5"], "AXI ports P = 5"),
    (["dse", "--model", "resnet50", "--board", "zc706", "--ports", "0"], "--ports"),
    (["show", "nope.json"], "does not exist"),
    (["boards", "nope"], "unknown board"),
])
def test_bad_input_is_one_line_and_exit_2(args, word, tmp_path):
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert word in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_files_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "board.json").write_text(json.dumps({"format": "fluidnpu-board", "version": 1}))
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    (tmp_path / "design.json").write_text('{"format": "fluidnpu-design", "version": 2}')
    (tmp_path / "old.json").write_text('{"format": "fluidnpu-design", "version": 1}')
    for args, word in [(["dse", "-m", "resnet50", "-b", "board.json"], "missing"),
                       (["dse", "-m", "garbage.onnx", "-b", "zc706"], "garbage.onnx"),
                       (["show", "design.json"], "missing"),
                       (["show", "old.json"], "version 1 predates")]:
        proc = run(*args, cwd=tmp_path)
        assert proc.returncode == 2 and word in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_dse_on_an_onnx_model_with_an_exit(tmp_path):
    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "ee_cnn_onnx.py"
    model = tmp_path / "ee.onnx"
    assert subprocess.run([sys.executable, str(example), str(model)], capture_output=True).returncode == 0
    proc = run("dse", "-m", str(model), "-b", "zc706", "--bmax", "4", "--exits", "exit1_logits",
               "--exit-rates", "0.3,0.7", "-o", str(tmp_path / "d.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert [(e["name"], e["rate"]) for e in summary["exits"]] == [("exit1_logits", 0.3), ("final", 0.7)]
    bundle = load_bundle(tmp_path / "d.json")
    assert [layer.name for layer in bundle.workload.exits[0].head] == ["exit1.conv", "exit1.fc"]
    assert len(bundle.workload.backbone) == 5


def test_dse_dsp_floor(tmp_path):
    """`--min-dsp 98%`: ResNet-50 on ZCU104 then takes a design using at least 98 % of the DSPs, the bundle
    records the floor and the summary shows it."""
    path = tmp_path / "floor.json"
    proc = run("dse", "-m", "resnet50", "-b", "zcu104", "--min-dsp", "98%", "-o", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["resources"]["dsp"] >= 0.98 * 1728 and summary["min_dsp"] == 0.98
    assert load_bundle(path).data["dse"]["min_dsp"] == 0.98
    shown = run("show", str(path))
    assert shown.returncode == 0 and "floor (--min-dsp)" in shown.stdout


@pytest.mark.parametrize("arg", ["1.5", "abc", "-1%"])
def test_dse_bad_dsp_floor_is_one_line(arg):
    proc = run("dse", "-m", "resnet50", "-b", "zc706", "--min-dsp", arg)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and ("DSP floor" in proc.stderr or "--min-dsp" in proc.stderr)


@pytest.mark.parametrize("arg", ["lut=1.5", "lut", "lut=abc", "luts=0.5", "lut=0%"])
def test_dse_bad_ceiling_is_one_line(arg):
    proc = run("dse", "-m", "resnet50", "-b", "zc706", "--ceiling", arg)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "ceiling" in proc.stderr
