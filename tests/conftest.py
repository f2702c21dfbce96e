"""Shared fixtures: a tiny board and a tiny early-exit workload small enough for brute force."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fluidnpu.boards.catalog import BOARD_DIR, board_from_data
from fluidnpu.workload import Exit, Layer, Workload

# modules beside the tests (serve_helpers) import by name: --import-mode=importlib adds no path
sys.path.insert(0, str(Path(__file__).parent))

# the suite's simulations are short: a Verilator build at -O0 takes half the time of -Os and runs them at most a
# third slower (docs/deploy.md); set here, so that the servers the tests start as subprocesses build alike
os.environ.setdefault("FLUIDNPU_VERILATOR_OPT", "-O0")


def pytest_collection_modifyitems(config, items) -> None:
    """The tests marked `heavy(seconds)` first, longest first: pytest-xdist deals the collection to its workers
    in order and a worker that runs out steals from the end of the other's share, so a long test left near the
    end runs alone while the other core idles (37 s of a 744 s run on 2 cores, 2026-11-28)."""
    def seconds(item) -> float:
        mark = item.get_closest_marker("heavy")
        return -float(mark.args[0]) if mark else 0.0
    items.sort(key=seconds)


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (registered in sys.modules: dataclasses look their module up while
    being created)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def benchmark_module():
    """A benchmark script as a module, by name: `benchmark_module("peak_gap")` (what a benchmark computes is
    tested through its own code)."""
    return load_benchmark


def tiny_board_data(dsp: int = 6, bram36: int = 8, uram: int = 0, hp_ports: int | None = None,
                    ddr_mts: float | None = None) -> dict:
    data = json.loads((BOARD_DIR / "zc706.json").read_text())
    data["name"] = "tiny"
    if hp_ports is not None:
        data["axi_hp"]["ports"]["value"] = hp_ports
    if ddr_mts is not None:
        data["ddr"]["mega_transfers"]["value"] = ddr_mts
    data["resources"]["dsp"]["value"] = dsp
    data["resources"]["bram36"]["value"] = bram36
    data["resources"]["uram"]["value"] = uram
    return data


@pytest.fixture(scope="session")
def shared_dse_cache(tmp_path_factory) -> Path:
    """One DSE cache for the tests that evaluate the zoo's designs (`--cache-dir`, EvalConfig.cache_dir): each
    design is searched once per run, not once per test. Under pytest-xdist every worker's base temporary
    directory has the same parent, so a design one worker searched is a hit for the others; entries are
    written atomically (scheduler_fw/designs.py), and two workers missing at once both search and agree."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / "shared-dse-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def make_board():
    """Factory: a board like ZC706 with the given DSP/BRAM/URAM counts."""
    return lambda **kw: board_from_data(tiny_board_data(**kw), "tiny board")


@pytest.fixture
def tiny_board():
    return board_from_data(tiny_board_data(), "tiny board")


@pytest.fixture
def tiny_workload() -> Workload:
    """Conv (C < TC territory), a wide conv, an exit head FC and a final FC."""
    c1 = Layer.conv("c1", 3, 4, 5, 3, padding=1)          # R=25, P=27, C=4
    c2 = Layer.conv("c2", 4, 9, 5, 3, stride=2)           # R=4,  P=36, C=9
    head = (Layer.fc("e1.fc", 4 * 25, 3),)
    fc = Layer.fc("fc", 9 * 4, 5)
    return Workload("tiny", (c1, c2, fc), (Exit("e1", 0, head, 0.4), Exit("final", 2, (), 0.6)))


@pytest.fixture
def zc706_path() -> Path:
    return BOARD_DIR / "zc706.json"
