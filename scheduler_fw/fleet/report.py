"""A plan as JSON (a fixed format, for other tools to read) and as the seed write-up prints it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fluidnpu.output import writing
from fluidnpu.scheduler_fw.fleet.check import SessionCheck
from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Plan


def plan_dict(plan: Plan, kinds: Sequence[DeviceKind]) -> dict[str, Any]:
    """{"nodes": [...], "sessions": [...], "unplaced": [...], "devices": [...], "node_count", "lower_bound", ...}.

    A session's rate on a node is the share of its load the node takes; its
    served rate is batch / duty cycle (>= rate).
    """
    by_name = {k.name: k for k in kinds}
    nodes = []
    for n in plan.nodes:
        nodes.append({
            "device": n.device, "kind": by_name[n.device].kind, "duty_cycle_ms": n.duty_s * 1e3,
            "switch_ms": n.switch_s * 1e3, "occupancy": n.occupancy, "saturated": n.saturated,
            "sessions": [{"session": s.session, "model": s.model, "rate": s.rate, "batch": s.batch,
                          "latency_ms": s.latency_s * 1e3, "occupancy": s.latency_s / n.duty_s,
                          "served_rate": s.batch / n.duty_s, "slo_ms": s.slo_s * 1e3, "quantile": s.quantile,
                          "worst_latency_ms": (n.duty_s + s.latency_s) * 1e3} for s in n.slots]})
    sessions = []
    for s in plan.sessions:
        sessions.append({"session": s.index, "model": s.model, "rate": s.rate, "slo_ms": s.slo_s * 1e3,
                         "placed_rate": plan.placed_rate(s.index), "device": plan.kinds.get(s.index),
                         "nodes": [i for i, n in enumerate(plan.nodes) if any(x.session == s.index for x in n.slots)]})
    used = {k.name: sum(1 for n in plan.nodes if n.device == k.name) for k in kinds}
    return {
        "nodes": nodes, "sessions": sessions,
        "unplaced": [{"session": u.session, "model": u.model, "rate": u.rate, "reason": u.reason}
                     for u in plan.unplaced],
        "devices": [{"name": k.name, "kind": k.kind, "count": k.count, "used": used[k.name], "detail": k.detail,
                     "latency_ms": {m: [t * 1e3 for t in p.seconds] for m, p in k.profiles.items()},
                     "switch_ms": {m: p.switch_s * 1e3 for m, p in k.profiles.items()}} for k in kinds],
        "node_count": len(plan.nodes), "lower_bound": plan.lower_bound, "bound": plan.bound,
    }


def plan_text(d: dict[str, Any]) -> str:
    """The seed's example format, one block per node, then the node count against its lower bound."""
    kinds = {k["name"]: k for k in d["devices"]}
    lines = []
    for n in d["nodes"]:
        k = kinds[n["device"]]
        lines.append(f"Node device: {n['device']} ({k['detail']}), model switches: {n['switch_ms']:.2f}ms")
        lines.append(f"Node duty cycle: {n['duty_cycle_ms']:.1f}ms, occupancy: {100 * n['occupancy']:.1f}%")
        lines.append(f"Node sessions: {len(n['sessions'])}")
        for i, s in enumerate(n["sessions"], start=1):
            lines.append(f"session number {i} has occupancy: {100 * s['occupancy']:.1f}%")
            lines.append(f"Model name: {s['model']}, SLO: {s['slo_ms']:g}ms, request rate: {s['rate']:.1f}, "
                         f"batch size: {s['batch']}, batch latency: {s['latency_ms']:.2f}ms")
    for u in d["unplaced"]:
        lines.append(f"Unplaced: {u['model']} (session {u['session']}), request rate: {u['rate']:.1f}: {u['reason']}")
    used = ", ".join(f"{k['name']} {k['used']}/{k['count']}" for k in d["devices"])
    lines.append(f"Nodes: {d['node_count']} ({used}); lower bound Σ rate·ℓ(B)/B = {d['lower_bound']:.2f}; "
                 f"Nexus bound (saturated nodes + one per residue) = {d['bound']}")
    return "\n".join(lines)


def check_dict(checks: Sequence[SessionCheck], plan: Plan, seconds: float, seed: int) -> dict[str, Any]:
    """The replay's figures per session (fleet/check.py)."""
    rows = []
    for c in checks:
        s = plan.sessions[c.session]
        rows.append({"session": c.session, "model": s.model, "slo_ms": s.slo_s * 1e3, "placed_rate": plan.placed_rate(
            c.session), "arrivals": c.arrivals, "answered": c.answered, "within_slo": c.within_slo,
            "slo_compliance": c.compliance if c.arrivals else None, "p99_ms": c.p99_ms, "max_ms": c.max_ms})
    total = sum(c.arrivals for c in checks)
    return {"seconds": seconds, "seed": seed, "arrivals": total, "answered": sum(c.answered for c in checks),
            "slo_compliance": sum(c.within_slo for c in checks) / total if total else 1.0, "sessions": rows}


def missed_line(c: dict[str, Any], target: float) -> str:
    """The sessions of a check (check_dict) that kept their SLO for fewer than `target` of their requests,
    in one line ("" if none)."""
    low = [r for r in c["sessions"] if r["arrivals"] and r["slo_compliance"] < target]
    if not low:
        return ""
    return (f"{len(low)} of {len(c['sessions'])} sessions kept their SLO for under {100 * target:g} % of their "
            f"requests in the {c['seconds']:g} s replay (" + ", ".join(
                f"session {r['session']} {r['model']}: {100 * r['slo_compliance']:.1f} %" for r in low) + ")")


def check_text(c: dict[str, Any], title: str = "Check: replayed, placed load only") -> str:
    lines = [f"{title}: Poisson arrivals for {c['seconds']:g} s (seed {c['seed']})"]
    for r in c["sessions"]:
        if not r["arrivals"]:
            lines.append(f"session {r['session']} {r['model']}: no placed load, nothing replayed")
            continue
        lines.append(f"session {r['session']} {r['model']} (SLO {r['slo_ms']:g}ms, "
                     f"{r['placed_rate']:.1f} req/s placed): {r['arrivals']} arrivals, {r['answered']} answered, "
                     "SLO compliance "
                     f"{100 * r['slo_compliance']:.1f}%, p99 {r['p99_ms']:.1f}ms")
    refused = f", {c['rejected']} refused with an error" if "rejected" in c else ""
    lines.append(f"All: {c['arrivals']} arrivals, {c['answered']} answered{refused}, SLO compliance "
                 f"{100 * c['slo_compliance']:.2f}%")
    if c.get("epochs"):
        lines.append(f"Re-planned {len(c['epochs'])} times; devices in use per epoch: "
                     + " ".join(str(e["devices"]) for e in c["epochs"]))
    return "\n".join(lines)


def plot_plan(d: dict[str, Any], path: str) -> None:
    """One bar per node: each session's share of the duty cycle (labelled with its batch), then model switches."""
    from fluidnpu.scheduler_fw.plots import _plt

    plt = _plt()
    models = sorted({s["model"] for n in d["nodes"] for s in n["sessions"]})
    colours = {m: plt.cm.tab10(i % 10) for i, m in enumerate(models)}
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * max(1, len(d["nodes"]))))
    for i, n in enumerate(d["nodes"]):
        left = 0.0
        for s in n["sessions"]:
            ax.barh(i, s["occupancy"], left=left, color=colours[s["model"]], edgecolor="white")
            if s["occupancy"] > 0.06:
                ax.text(left + s["occupancy"] / 2, i, f"b={s['batch']}", ha="center", va="center", fontsize=8)
            left += s["occupancy"]
        sw = n["switch_ms"] / n["duty_cycle_ms"]
        if sw > 0:
            ax.barh(i, sw, left=left, color="lightgrey", hatch="//", edgecolor="grey")
        ax.text(1.01, i, f"d={n['duty_cycle_ms']:.3g} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(d["nodes"])), [f"{i}: {n['device']}" for i, n in enumerate(d["nodes"])])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2)
    ax.set_xlabel("share of the duty cycle (occupancy); hatched: model switches")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[m]) for m in models]
    ax.legend(handles, models, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(f"{d['node_count']} nodes, lower bound {d['lower_bound']:.2f}")
    fig.tight_layout()
    with writing(path, "plot") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
