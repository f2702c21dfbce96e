"""Per-exit accuracy and exit rates of digits-ee in float and in 16-bit fixed point (docs/runtime.md).

    .venv/bin/python scripts/digits_ee_report.py [--tau 0.8] [--json]

Fixed point is the bit-exact golden model of the NPU (identical to
ModelDevice and RtlSimDevice, see tests); float is the trained network.
"""

from __future__ import annotations

import argparse
import json
import sys

from fluidnpu import digits_ee as D
from fluidnpu.quantize import early_exit_eval, quantize


def report(tau: float) -> dict:
    net = D.load_float_network()
    xtr, _, xte, yte = D.load_dataset()
    q = quantize(net, xtr)
    xq, sat_in = q.quantize_input(xte)
    outs, sat = q.run_reference(xq)
    fixed = early_exit_eval([q.logits(e, outs[li]) for e, li in enumerate(q.exit_layers)], yte, tau)
    flt = early_exit_eval(net.exit_logits(xte), yte, tau)
    for r in (fixed, flt):
        r.pop("taken"), r.pop("pred")
    return {"tau": tau, "test_samples": len(yte), "float": flt, "fixed": fixed, "formats": q.summary(),
            "saturation_test": sat.to_dict()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tau", type=float, default=D.DEFAULT_TAU)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = report(args.tau)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    names = [e.name for e in D.digits_ee().exits]
    print(f"tau = {r['tau']}, {r['test_samples']} test images\n")
    print("| exit | accuracy, all samples (float / fixed) | exit rate (float / fixed) | "
          "accuracy of the samples exiting there (float / fixed) |")
    print("|---|---|---|---|")
    pct = lambda v: "–" if v is None else f"{100 * v:.2f} %"  # noqa: E731
    for name, a, b in zip(names, r["float"]["exits"], r["fixed"]["exits"]):
        print(f"| {name} | {pct(a['accuracy_all'])} / {pct(b['accuracy_all'])} | "
              f"{pct(a['exit_rate'])} / {pct(b['exit_rate'])} | {pct(a['accuracy_exited'])} / "
              f"{pct(b['accuracy_exited'])} |")
    print(f"| **early-exit network** | **{pct(r['float']['accuracy'])} / {pct(r['fixed']['accuracy'])}** | | |")
    print("\nformats:")
    for f in r["formats"]:
        print(f"  {f['layer']:9s} in Q.{f['frac_in']:<3d} w Q.{f['frac_w']:<3d} out Q.{f['frac_out']:<3d} "
              f"shift {f['shift']:2d}  max|acc| {f['acc_max']:>11d} ({f['acc_headroom_bits']:.2f} bits of headroom)")
    print("saturated values on the test split:", {k: v["saturated"] for k, v in r["saturation_test"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
