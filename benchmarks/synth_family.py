"""The same EngineCore on 7-series and UltraScale+: what the family adds to the 7-series fit.

The resource model's LUT/FF constants are fitted on xc7 (benchmarks/synth_calibration.py). This run
synthesizes EngineCore twins, plain and Stackable PEs, with Yosys `synth_xilinx -family xc7` and
`-family xcup` (hw/synth.py packs the DSP48E2s by the DSP48E1 rules, as a vendor flow would), and
fits the per-MAC / per-PE excess that `FabricCosts.xcup_*` (dse/resource_model.py) prices:

    .venv/bin/python benchmarks/synth_family.py            # 12 syntheses, ~10 min on 2 cores
    .venv/bin/python benchmarks/synth_family.py --reuse    # refit from build/synth_family/*/report.json

Writes docs/figures/resources/xcup_engines.json; tests/test_resource_model.py checks the model
against it. Not in `make test`.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from synth_calibration import rtl_version, yosys_summary  # noqa: E402

TWINS = ((4, 8), (16, 8), (8, 16))        # (TP, TC): 32-128 MACs, 8-16 PEs
TR, NB = 1024, 2
FAMILIES = ("xc7", "xcup")


def synth(tp: int, tc: int, stackable: bool, family: str, root: Path, reuse: bool) -> dict[str, Any]:
    """Yosys summary of one EngineCore (cached in root/<name>/report.json)."""
    from fluidnpu.hw.engine_core import EngineCore
    from fluidnpu.hw.regmap import nmax
    from fluidnpu.hw.synth import synthesize

    wd = root / f"tp{tp}_tc{tc}_{'stack' if stackable else 'plain'}_{family}"
    cache = wd / "report.json"
    if reuse and cache.exists():
        rep = json.loads(cache.read_text())
    else:
        core = EngineCore(TR=TR, TP=tp, TC=tc, NB=NB, nmax=nmax(tp, tc), stackable=stackable)
        rep = synthesize(core, "core", family=family, workdir=wd).to_dict()
        cache.write_text(json.dumps(rep, indent=1))
    return yosys_summary(rep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=str(ROOT / "build" / "synth_family"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "resources" / "xcup_engines.json"))
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()

    root = Path(args.workdir)
    points = [(tp, tc, st) for tp, tc in TWINS for st in (False, True)]
    jobs = [(p, fam) for p in points for fam in FAMILIES]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = dict(zip(jobs, pool.map(lambda j: synth(*j[0], j[1], root, args.reuse), jobs)))
    rows = []
    for tp, tc, st in points:
        x7, xu = done[((tp, tc, st), "xc7")], done[((tp, tc, st), "xcup")]
        rows.append({"TR": TR, "TP": tp, "TC": tc, "NB": NB, "stackable": st,
                     "xc7_lut": x7["lut_priced"], "xc7_ff": x7["ff"], "xcup_lut": xu["lut_priced"],
                     "xcup_ff": xu["ff"], "excess_lut": xu["lut_priced"] - x7["lut_priced"],
                     "excess_ff": xu["ff"] - x7["ff"], "xc7_dsp": x7["dsp"], "xcup_dsp": xu["dsp"],
                     "buffers_in_bram": x7["buffers_in_bram"] and xu["buffers_in_bram"]})
    # excess = a * MACs + b * PEs, least squares over every twin
    X = np.array([[r["TP"] * r["TC"], r["TC"]] for r in rows], dtype=float)
    fit = {k: dict(zip(("per_mac", "per_pe"), np.linalg.lstsq(X, np.array([r[f"excess_{k}"] for r in rows],
                                                                            dtype=float), rcond=None)[0].round(2)))
           for k in ("lut", "ff")}
    doc = {"what": "EngineCore alone, plain and Stackable PEs, Yosys synth_xilinx -family xc7 vs -family xcup "
                   "(-uram; DSP48E2s packed by the DSP48E1 rules, hw/synth.py); LUT outside buffers "
                   "(benchmarks/synth_calibration.py yosys_summary). Fit of dse/resource_model.py "
                   "FabricCosts.xcup_*: excess = per_mac*MACs + per_pe*PEs.",
           "rtl": rtl_version("engine"), "yosys": next(iter(done.values()))["yosys"], "fit": fit, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    for r in rows:
        print(f"<{TR},{r['TP']},{r['TC']}> {'Stackable' if r['stackable'] else 'plain':9s} "
              f"LUT {r['xc7_lut']:>6} -> {r['xcup_lut']:>6} ({r['excess_lut']:+d})   "
              f"FF {r['xc7_ff']:>6} -> {r['xcup_ff']:>6} ({r['excess_ff']:+d})")
    print("fit:", json.dumps(fit))


if __name__ == "__main__":
    main()
