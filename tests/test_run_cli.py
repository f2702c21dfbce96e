"""`fluidnpu run`: wall-clock serving on ModelDevice, and bad CLI input as one line + exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fluidnpu.cli", "run", *args], capture_output=True, text=True,
                          timeout=300)


def test_run_model_json():
    proc = run("--device", "model", "--model", "digits-ee", "--rate", "400", "--slo", "100", "--samples", "60",
               "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["device"] == "model" and rep["policy"] == "fluidb" and rep["model"] == "digits-ee"
    assert "default" in rep["design"]["source"]
    assert rep["sent"] == rep["answered"] == 60 and rep["rejected"] == 0 and rep["errors"] == 0
    assert sum(rep["exit_rates"]) == pytest.approx(1.0) and len(rep["exit_rates"]) == 3
    assert rep["accuracy"] > 0.9
    lat = rep["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert 0 <= rep["slo_violation_rate"] <= 1


def test_run_with_a_design_bundle(tmp_path):
    path = tmp_path / "d.json"
    proc = subprocess.run([sys.executable, "-m", "fluidnpu.cli", "dse", "--model", "digits-ee", "--board", "zc706",
                           "--bmax", "4", "--design", "64,8,8", "-o", str(path), "--json"],   # no search: seconds
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = run("--design", str(path), "--rate", "300", "--slo", "50", "--samples", "20", "--policy", "lazybatching")
    assert proc.returncode == 0, proc.stderr
    assert "lazybatching" in proc.stdout and "20 / 0 / 20" in proc.stdout and str(path) in proc.stdout


@pytest.mark.parametrize("args,msg", [
    (["--rate", "-1", "--slo", "10"], "--rate"),
    (["--rate", "10", "--slo", "0"], "--slo"),
    (["--rate", "10", "--slo", "10", "--tau", "1.5"], "tau"),
    (["--rate", "10", "--slo", "10", "--samples", "0"], "--samples"),
    (["--rate", "10", "--slo", "10", "--model", "resnet50"], "runtime model"),
    (["--rate", "10", "--slo", "10", "--policy", "nope"], "unknown policy"),
    (["--rate", "10", "--slo", "10", "--device", "gpu"], "device"),
    (["--rate", "10", "--slo", "10", "--design", "/nonexistent/d.json"], "d.json"),
    (["--rate", "10", "--slo", "10", "--bmax", "99"], "--bmax"),
    (["--rate", "fast", "--slo", "10"], "rate"),
])
def test_bad_input_is_one_line(args, msg, capsys):
    from fluidnpu.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and msg in lines[0], err


def test_design_of_another_model_is_refused(tmp_path):
    path = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "fluidnpu.cli", "dse", "--model", "resnet50", "--board", "zc706",
                           "--bmax", "2", "-o", str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = run("--design", str(path), "--rate", "10", "--slo", "10")
    assert proc.returncode == 2 and "not for 'digits-ee'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_design_of_another_lowering_of_the_same_network_is_refused(tmp_path):
    """A bundle whose layers have the network's names but not its shapes (e.g. made before the stem was
    folded, or folded where the network is not) is refused in one line, not run with the wrong plan."""
    from dataclasses import replace

    from fluidnpu import digits_ee as D
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.workload import Layer

    wl = D.digits_ee()
    other = replace(wl, backbone=(Layer.conv("conv1", 1, 8, 8, (3, 1), 1, (1, 0, 1, 0)),) + wl.backbone[1:])
    assert other.backbone[0].out_hw == wl.backbone[0].out_hw
    path = tmp_path / "o.json"
    bundle_from_result(explore(other, D.small_board(), DSEOptions(bmax=4))).save(path)
    proc = run("--design", str(path), "--rate", "10", "--slo", "10")
    assert proc.returncode == 2 and "another lowering of 'digits-ee'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
