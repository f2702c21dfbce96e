"""Study: SLO compliance of Nexus plans under Poisson arrivals, against planning headroom.

The example sessions (docs/examples/fleet/sessions.json) on the example's two
designs with 20 devices of each kind (so that nothing spills for lack of
devices), planned with headroom h = 0 ... 1 and with exit-aware or worst-case
ℓ(b), each plan replayed for 120 s of Poisson arrivals (fleet/check.py).
Writes docs/figures/fleet/headroom.{csv,json,png} and prints the table.

    python benchmarks/plan_headroom.py [--seconds 120] [--out docs/figures/fleet]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from fluidnpu.scheduler_fw.fleet.check import check_plan
from fluidnpu.scheduler_fw.fleet.inputs import device_kinds, load_fleet_file, load_sessions
from fluidnpu.scheduler_fw.fleet.nexus import plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "fleet"
HEADROOMS = (0.0, 0.1, 0.25, 0.5, 1.0)


def ensure_designs(devices: list[dict]) -> None:
    """The example's bundles (build/fleet/): `fluidnpu dse`'s pick of each, through the evaluation's design
    cache (scheduler_fw/designs.py: keyed by the model's source, so a bundle an earlier model built is never
    replayed), written over whatever build/fleet/ holds."""
    from fluidnpu.boards import load_board
    from fluidnpu.scheduler_fw.designs import design_for
    from fluidnpu.scheduler_fw.registry import FLUID
    from fluidnpu.zoo import zoo_model

    wanted = {"r50_zc706.json": ("resnet50", "zc706"), "iv3_zcu104.json": ("inceptionv3", "zcu104")}
    for d in devices:
        path = Path(d["design"])
        model, board = wanted[path.name]
        bundle, _ = design_for(zoo_model(model), load_board(board), FLUID, bmax=8)
        path.parent.mkdir(parents=True, exist_ok=True)
        bundle.save(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "fleet")
    args = ap.parse_args()
    sessions = load_sessions(EXAMPLE / "sessions.json")
    devices = [dict(d, count=20) for d in load_fleet_file(EXAMPLE / "fleet.json")]
    ensure_designs(devices)
    rows = []
    for early_exit in (True, False):
        kinds = device_kinds(devices, [s.model for s in sessions], early_exit=early_exit)
        for h in HEADROOMS:
            p = plan(sessions, kinds, h)
            checks = check_plan(p, kinds, args.seconds, seed=0)
            arrivals = sum(c.arrivals for c in checks)
            row = {"pricing": "exit-aware" if early_exit else "no early exit", "headroom": h, "nodes": len(p.nodes),
                   "lower_bound": round(p.lower_bound, 3), "arrivals": arrivals,
                   "answered": sum(c.answered for c in checks),
                   "compliance": sum(c.within_slo for c in checks) / arrivals}
            for c in checks:
                if c.arrivals:
                    s = sessions[c.session]
                    row[f"s{c.session} {s.model} {s.slo_s * 1e3:g}ms"] = round(c.compliance, 4)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.out / "headroom.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        w.writerows(rows)
    (args.out / "headroom.json").write_text(json.dumps({"seconds": args.seconds, "seed": 0, "rows": rows}, indent=1))
    plot(rows, args.out / "headroom.png")
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r.get(k, ''):.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys))


def plot(rows: list[dict], path: Path) -> None:
    from fluidnpu.scheduler_fw.plots import _plt

    plt = _plt()
    series = [k for k in rows[0] if k.startswith("s")] + ["compliance"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, pricing in zip(axes, ("exit-aware", "no early exit")):
        sub = [r for r in rows if r["pricing"] == pricing]
        for k in series:
            ax.plot([r["headroom"] for r in sub], [100 * r[k] for r in sub], marker="o",
                    label="all requests" if k == "compliance" else k, linewidth=2.5 if k == "compliance" else 1.2)
        for r in sub:
            ax.annotate(f"{r['nodes']}", (r["headroom"], 2), ha="center", fontsize=8)
        ax.set_title(f"ℓ(b) {pricing} (numbers: nodes)")
        ax.set_xlabel("headroom h (nodes sized for rate × (1 + h))")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SLO compliance under Poisson arrivals (%)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
