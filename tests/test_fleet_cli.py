"""`fluidnpu plan`: the issue's file formats, ℓ(b) from real design bundles and GPU profiles, bad input."""

from __future__ import annotations

import json
import math

import pytest

from fluidnpu.boards.catalog import load_board
from fluidnpu.bundle import bundle_from_result
from fluidnpu.cli import main
from fluidnpu.dse.search import DSEOptions, evaluate_design
from fluidnpu.scheduler_fw.fleet.profiles import MMIO_WRITE_NS, npu_segment_seconds, npu_switch_seconds
from fluidnpu.workload import Workload
from fluidnpu.zoo import zoo_model

# A staged-engine profile (host_driver/staged/slicing.py's JSON): two stages, 12 ms + 2 ms per sample.
GPU_PROFILE = {"batch_sizes": [1, 2, 4, 8], "bounds": [[0, 3], [3, 6]], "device": "cuda",
               "stage_seconds": [[0.008, 0.010, 0.014, 0.022], [0.006, 0.008, 0.012, 0.020]]}


@pytest.fixture(scope="module")
def digits_bundle():
    """digits-ee on a small ZCU104 NPU (no search: one evaluated design)."""
    return bundle_from_result(evaluate_design(zoo_model("digits-ee"), load_board("zcu104"), 32, 16, 16,
                                              DSEOptions(bmax=4)))


@pytest.fixture
def files(tmp_path, digits_bundle):
    digits_bundle.save(tmp_path / "digits_zcu104.json")
    (tmp_path / "r50_gpu.json").write_text(json.dumps(GPU_PROFILE))
    fleet = {"devices": [{"name": "zcu104-a", "board": "zcu104", "design": "digits_zcu104.json", "count": 2},
                         {"name": "gpu", "kind": "gpu", "profile": "r50_gpu.json", "model": "resnet50", "count": 2}]}
    sessions = [{"model": "digits-ee", "rate": 300000, "slo_ms": 1},
                {"model": "resnet50", "rate": 500, "slo_ms": 60},
                {"model": "digits-ee", "rate": 10, "slo_ms": 0.0001}]
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    (tmp_path / "sessions.json").write_text(json.dumps(sessions))
    return tmp_path


def plan_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(["plan", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_plan_json(files, capsys):
    """Nexus as published (no headroom, slots at the mean rate): the figures below are its rules'."""
    code, out, err = plan_cli(capsys, "--sessions", str(files / "sessions.json"), "--fleet",
                              str(files / "fleet.json"), "--headroom", "0", "--quantile", "0", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert set(d) >= {"nodes", "sessions", "unplaced", "node_count", "lower_bound"}
    for n in d["nodes"]:
        assert n["device"] in ("zcu104-a", "gpu") and n["duty_cycle_ms"] > 0
        assert sum(s["occupancy"] for s in n["sessions"]) + n["switch_ms"] / n["duty_cycle_ms"] <= 1 + 1e-9
        for s in n["sessions"]:
            assert set(s) >= {"model", "rate", "batch", "latency_ms", "occupancy"}
            assert s["batch"] / (n["duty_cycle_ms"] / 1e3) >= s["rate"] * (1 - 1e-9)
            assert n["duty_cycle_ms"] + s["latency_ms"] <= s["slo_ms"] + 1e-9
            assert (s["model"] == "resnet50") == (n["device"] == "gpu")   # the digits FBCB cannot hold ResNet-50
    # ResNet-50 on the GPU profile: ℓ(b) = both stages, interpolated; B = 5 (2 x 30 ms <= 60 ms), T = 5/30 ms:
    # the 2 GPUs take 333.3/s and the rest has no free device.
    r50 = [s for n in d["nodes"] for s in n["sessions"] if s["session"] == 1]
    assert [s["batch"] for s in r50] == [5, 5] and r50[0]["latency_ms"] == pytest.approx(30.0)
    assert [(u["session"], u["rate"]) for u in d["unplaced"]] == [(1, pytest.approx(500 - 2 * 5 / 0.030)), (2, 10)]
    assert "no free device" in d["unplaced"][0]["reason"] and "below ℓ(1)" in d["unplaced"][1]["reason"]
    assert d["sessions"][0]["placed_rate"] == pytest.approx(300000)
    # digits-ee: floor(rate / T) saturated nodes at T = B / l(B), and one for the residue
    digits = [n["sessions"][0] for n in d["nodes"] if n["device"] == "zcu104-a"]
    assert len(digits) == math.ceil(300000 * digits[0]["latency_ms"] / 1e3 / digits[0]["batch"] - 1e-9)
    assert d["node_count"] == len(d["nodes"]) == 2 + len(digits)  # the lower bound counts what the fleet cannot take


def test_plan_prints_the_seed_format_and_plots(files, capsys):
    png = files / "plan.png"
    code, out, err = plan_cli(capsys, "--sessions", str(files / "sessions.json"), "--fleet", str(files / "fleet.json"),
                              "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for text in ("Node duty cycle:", "session number 1 has occupancy:", "Model name: resnet50", "lower bound",
                 "Unplaced: digits-ee"):
        assert text in out


def test_plan_check_and_headroom_json(files, capsys):
    code, out, err = plan_cli(capsys, "--sessions", str(files / "sessions.json"), "--fleet", str(files / "fleet.json"),
                              "--headroom", "0.5", "--check", "0.2", "--json")
    assert code == 0, err
    d = json.loads(out)
    c = d["check"]
    assert d["headroom"] == 0.5 and c["arrivals"] == c["answered"] > 0
    rows = {r["session"]: r for r in c["sessions"]}
    assert rows[2]["arrivals"] == 0 and rows[2]["slo_compliance"] is None        # nothing placed, nothing replayed
    assert rows[0]["arrivals"] > 0 and 0 <= rows[0]["slo_compliance"] <= 1
    code, out, err = plan_cli(capsys, "--sessions", str(files / "sessions.json"), "--fleet", str(files / "fleet.json"),
                              "--headroom", "-1")
    assert code == 2 and "--headroom" in err


def test_jitter_margin_and_quantile_from_the_cli(files, capsys):
    """--jitter-ms shortens every planned SLO by that much; --quantile sizes residue slots for Poisson bursts."""
    args = ["--sessions", str(files / "sessions.json"), "--fleet", str(files / "fleet.json"), "--json"]
    code, out, err = plan_cli(capsys, *args, "--jitter-ms", "5", "--quantile", "0.99")
    assert code == 0, err
    d = json.loads(out)
    assert d["jitter_ms"] == 5 and d["quantile"] == 0.99
    gpu = [s for n in d["nodes"] for s in n["sessions"] if s["model"] == "resnet50"]
    assert gpu and all(s["slo_ms"] == pytest.approx(55.0) and s["worst_latency_ms"] <= 55.0 + 1e-6 for s in gpu)
    assert any(s["quantile"] == 0.99 for s in gpu) or all(n["saturated"] for n in d["nodes"]
                                                          if any(s["model"] == "resnet50" for s in n["sessions"]))
    code, out, err = plan_cli(capsys, *args, "--quantile", "1.5")
    assert code == 2 and "--quantile" in err and len(err.strip().splitlines()) == 1


def test_other_model_latency_matches_the_bundle_table(digits_bundle):
    """The perf-model path for a model that is not the bundle's reproduces the bundle's table on its own model."""
    wl = digits_bundle.workload
    renamed = Workload("digits copy", wl.backbone, wl.exits, wl.input_shape, wl.source)
    got, want = npu_segment_seconds(digits_bundle, renamed), digits_bundle.latency_table()
    assert [pytest.approx(row, rel=1e-9) for row in want] == got


def test_switch_cost_counts_fbcb_writes_and_the_weight_image(digits_bundle):
    wl = digits_bundle.workload
    fbcb = len(wl.layers()) * digits_bundle.bmax * MMIO_WRITE_NS * 1e-9
    assert npu_switch_seconds(digits_bundle, wl, weights_resident=True) == pytest.approx(fbcb)
    words = sum(x.weight_count for x in wl.layers())
    moved = npu_switch_seconds(digits_bundle, wl) - fbcb
    assert moved == pytest.approx(2 * 2 * words / digits_bundle.board.bandwidth_bytes_per_s(200.0))


@pytest.mark.parametrize("what, sessions, fleet, message", [
    ("missing", None, None, "does not exist"),
    ("not json", "[{", None, "not valid JSON"),
    ("negative rate", [{"model": "digits-ee", "rate": -1, "slo_ms": 5}], None, "sessions file"),
    ("unknown model", [{"model": "vgg", "rate": 1, "slo_ms": 5}], None, "unknown model"),
    ("no devices", None, {"devices": []}, "fleet file"),
    ("duplicate names", None, {"devices": [{"name": "a", "design": "digits_zcu104.json", "count": 1}] * 2},
     "unique"),
    ("gpu without model", None, {"devices": [{"name": "g", "kind": "gpu", "profile": "r50_gpu.json", "count": 1}]},
     "which model"),
    ("wrong board", None, {"devices": [{"name": "a", "board": "zc706", "design": "digits_zcu104.json",
                                        "count": 1}]}, "built for"),
    ("bad profile", None, {"devices": [{"name": "g", "kind": "gpu", "profile": "fleet.json", "model": "resnet50",
                                        "count": 1}]}, "staged-engine profile"),
])
def test_bad_input_is_one_line_and_exit_2(files, capsys, what, sessions, fleet, message):
    s_path, f_path = files / "sessions.json", files / "fleet.json"
    if what == "missing":
        s_path = files / "nope.json"
    elif sessions is not None:
        s_path = files / "bad_sessions.json"
        s_path.write_text(sessions if isinstance(sessions, str) else json.dumps(sessions))
    if fleet is not None:
        f_path = files / "bad_fleet.json"
        f_path.write_text(json.dumps(fleet))
    code, out, err = plan_cli(capsys, "--sessions", str(s_path), "--fleet", str(f_path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_gpu_only_model_needs_no_npu_workload(files, capsys):
    fleet = {"devices": [{"name": "zcu104-a", "design": "digits_zcu104.json", "count": 1},
                         {"name": "gpu", "kind": "gpu", "profile": {"cnn": "r50_gpu.json"}, "count": 1}]}
    (files / "fleet2.json").write_text(json.dumps(fleet))
    (files / "s2.json").write_text(json.dumps([{"model": "cnn", "rate": 20, "slo_ms": 200}]))
    code, out, err = plan_cli(capsys, "--sessions", str(files / "s2.json"), "--fleet", str(files / "fleet2.json"),
                              "--json")
    assert code == 0, err
    d = json.loads(out)
    assert [n["device"] for n in d["nodes"]] == ["gpu"] and d["unplaced"] == []


def test_run_without_ray_says_how_to_get_it(files, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)      # as if the 'fleet' extra were not installed
    code, out, err = plan_cli(capsys, "--sessions", str(files / "sessions.json"), "--fleet", str(files / "fleet.json"),
                              "--run", "1")
    assert code == 2 and "'fleet' extra" in err and len(err.strip().splitlines()) == 1


def test_serve_fleet_without_ray_is_one_line_exit_2(monkeypatch, capsys):
    """`fluidnpu serve --fleet` where Ray is not installed: one line naming the 'fleet' extra, exit 2."""
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` raises ImportError
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--fleet", "f.json", "--sessions", "s.json"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "'fleet' extra" in err and len(err.strip().splitlines()) == 1


def test_bundle_on_another_design_is_what_the_planner_priced():
    """A device runs a model on its design from `bundle_on_design`: that bundle's table is the ℓ the planner
    priced for the pair, and its design, clock and Bmax are the device's."""
    from fluidnpu.scheduler_fw.fleet.profiles import bundle_on_design

    r50 = bundle_from_result(evaluate_design(zoo_model("resnet50"), load_board("zc706"), 3992, 14, 64,
                                             DSEOptions(bmax=8), allow_oversize=True))
    digits = zoo_model("digits-ee")
    b = bundle_on_design(r50, digits)
    assert bundle_on_design(r50, r50.workload) is r50
    assert b.workload.to_dict() == digits.to_dict()
    assert (b.design, b.clock_mhz, b.bmax, b.board.name) == (r50.design, r50.clock_mhz, r50.bmax, "zc706")
    for got, want in zip(b.latency_table(), npu_segment_seconds(r50, digits), strict=True):
        assert got == pytest.approx(want, rel=1e-9)


def test_a_design_not_built_yet_is_looked_for_beside_the_fleet_file(tmp_path, monkeypatch):
    """A relative design path is the fleet file's even before the bundle exists (benchmarks build the
    example's bundles there); the working folder's file is taken only where the fleet file's is missing."""
    from fluidnpu.scheduler_fw.fleet.inputs import load_fleet_file

    (tmp_path / "examples" / "fleet").mkdir(parents=True)
    fleet = tmp_path / "examples" / "fleet" / "fleet.json"
    fleet.write_text(json.dumps({"devices": [{"name": "a", "design": "../../build/a.json", "count": 1},
                                             {"name": "b", "design": "b.json", "count": 1}]}))
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    (elsewhere / "b.json").write_text("{}")
    monkeypatch.chdir(elsewhere)
    a, b = load_fleet_file(fleet)
    assert a["design"] == str(tmp_path / "examples" / "fleet" / "../../build/a.json")
    assert b["design"] == "b.json"                 # only the working folder has it
    (tmp_path / "examples" / "fleet" / "b.json").write_text("{}")
    assert load_fleet_file(fleet)[1]["design"] == str(tmp_path / "examples" / "fleet" / "b.json")


@pytest.mark.heavy(20)
def test_the_defaults_keep_the_documented_examples_slos_and_a_miss_exits_1(capsys, tmp_path):
    """docs/fleet.md's example on its two designs (the DSE's picks, from the design cache as
    benchmarks/plan_headroom.py takes them; cold, two searches): the defaults' plan keeps every placed
    session's SLO for >= 99 % of its requests in a 20 s replay (exit 0); Nexus as published (no headroom,
    mean-rate slots) misses most, and plan says which in one line on stderr and exits 1."""
    from pathlib import Path

    from fluidnpu.boards import load_board
    from fluidnpu.scheduler_fw.designs import design_for
    from fluidnpu.scheduler_fw.registry import FLUID

    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "fleet"
    fleet = json.loads((example / "fleet.json").read_text())
    for d, (model, board) in zip(fleet["devices"], (("resnet50", "zc706"), ("inceptionv3", "zcu104"))):
        assert d["board"] == board
        design_for(zoo_model(model), load_board(board), FLUID, bmax=8)[0].save(tmp_path / f"{model}.json")
        d["design"] = f"{model}.json"
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    args = ["--sessions", str(example / "sessions.json"), "--fleet", str(tmp_path / "fleet.json"), "--check", "20"]
    code, out, err = plan_cli(capsys, *args, "--json")
    assert code == 0 and not err.strip(), err
    d = json.loads(out)
    assert (d["headroom"], d["quantile"], d["target"]) == (0.5, 0.99, 0.99)
    placed = [r for r in d["check"]["sessions"] if r["arrivals"]]
    assert len(placed) == 4 and min(r["slo_compliance"] for r in placed) >= 0.99, placed
    code, out, err = plan_cli(capsys, *args, "--headroom", "0", "--quantile", "0")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("warning: 4 of 5 sessions"), err
    assert "session 3 digits-ee" in lines[0] and "--headroom" in lines[0]
