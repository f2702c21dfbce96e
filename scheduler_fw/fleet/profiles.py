"""ℓ_m(b) of a model on a device, and what it costs to switch a device to that model.

An NPU device is a design bundle on a board. For the bundle's own model the
exit-segment table comes from the bundle as it is; for any other model m the
same <TR, TP, TC> at the bundle's clock, Bmax and batching runs m's workload
through the performance model (`fluidnpu.dse.search.evaluate_design`), which
is how the DSE built the bundle's table in the first place.

Exit-aware ℓ(b): a batch of b shrinks as samples leave at early exits, so the
planner prices it as Σ_s T_s(ceil(b · reach_s)), reach_s = 1 - Σ_{j<s} e_j the
share of samples that get to exit segment s (docs/fleet.md).

A model switch on an NPU reloads the FBCB (one AXI-Lite write per entry, L x
Bmax entries) and moves the incoming model's weight image through the board's
memory (read + write at the bandwidth the NPU sees), unless the device keeps
every model's weights resident. A GPU keeps its models loaded (Nexus's
assumption): switching is free unless the fleet file says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.fleet.nexus import Profile

# One AXI-Lite register write from the PS to the NPU's s_axi (a PS-to-PL general-purpose port round trip).
# An assumption, not a measurement: override it per device with "mmio_write_ns" (docs/fleet.md).
MMIO_WRITE_NS = 200.0


def monotone(values: Sequence[float]) -> list[float]:
    """The running maximum: a bigger batch is never priced faster than a smaller one."""
    out, top = [], 0.0
    for v in values:
        top = max(top, float(v))
        out.append(top)
    return out


def reach(exit_rates: Sequence[float]) -> list[float]:
    """reach_s: the share of samples that enter exit segment s."""
    out, left = [], 1.0
    for e in exit_rates:
        out.append(max(left, 0.0))
        left -= e
    return out


def exit_aware(segment_seconds: Sequence[Sequence[float]], exit_rates: Sequence[float],
               early_exit: bool = True) -> list[float]:
    """ℓ(b) for b = 1..Bmax from an exit-segment table T_s(b): segments at their expected surviving batch sizes.

    With early_exit=False every sample runs every segment (ℓ(b) = Σ_s T_s(b)).
    """
    env = [monotone(row) for row in segment_seconds]
    bmax = len(env[0])
    shares = reach(exit_rates) if early_exit else [1.0] * len(env)
    out = []
    for b in range(1, bmax + 1):
        total = 0.0
        for row, share in zip(env, shares):
            n = math.ceil(b * share - 1e-9)
            if n >= 1:
                total += row[min(n, bmax) - 1]
        out.append(total)
    return monotone(out)


def weight_bytes(workload: Any, word_bytes: int) -> int:
    return sum(layer.weight_count for layer in workload.layers()) * word_bytes


def npu_switch_seconds(bundle: Any, workload: Any, mmio_write_ns: float = MMIO_WRITE_NS,
                       weights_resident: bool = False) -> float:
    """FBCB reload plus, unless resident, the weight image moved through the board's memory."""
    fbcb_words = len(workload.layers()) * bundle.bmax
    t = fbcb_words * mmio_write_ns * 1e-9
    if not weights_resident:
        t += 2.0 * weight_bytes(workload, bundle.timing.word_bytes) / bundle.board.bandwidth_bytes_per_s(
            bundle.clock_mhz)
    return t


def design_result(bundle: Any, workload: Any) -> Any:
    """The DSE result of `workload` on the bundle's design: the same <TR, TP, TC> at the bundle's clock,
    Bmax, batching, stackable PEs, engine timing, banks and block input buffer
    (`fluidnpu.dse.search.evaluate_design`)."""
    from fluidnpu.dse.search import DSEOptions, evaluate_design

    have, need = len(bundle.workload.layers()), len(workload.layers())
    if need > have:
        raise FluidError(f"model {workload.name!r} has {need} layers; the FBCB of design {bundle.origin} holds "
                         f"{have} layers x Bmax entries")
    d = bundle.data["dse"]
    opts = DSEOptions(bmax=bundle.bmax, batching=d["batching"], stackable=d["stackable"], timing=bundle.timing,
                      clock_mhz=bundle.clock_mhz, banks=bundle.banks, ports=bundle.ports)
    TR, TP, TC = bundle.design
    return evaluate_design(workload, bundle.board, TR, TP, TC, opts, allow_oversize=True,
                           input_buffer=bundle.input_buffer)


def bundle_on_design(bundle: Any, workload: Any) -> Any:
    """The bundle of `workload` on `bundle`'s design (the bundle itself for its own model): what a device
    of that design loads to run the model (its FBCB, descriptors and tables)."""
    if workload.to_dict() == bundle.workload.to_dict():
        return bundle
    from fluidnpu.bundle import bundle_from_result

    return bundle_from_result(design_result(bundle, workload))


def npu_segment_seconds(bundle: Any, workload: Any) -> list[list[float]]:
    """T_s(b) of `workload` on the bundle's design: the bundle's own table, or the perf model's on that design."""
    if workload.to_dict() == bundle.workload.to_dict():
        return bundle.latency_table()
    res = design_result(bundle, workload)
    return [[c / (bundle.clock_mhz * 1e6) for c in row] for row in res.segment_cycles()]


def npu_profile(bundle: Any, workload: Any, early_exit: bool = True, mmio_write_ns: float = MMIO_WRITE_NS,
                weights_resident: bool = False, switch_s: float | None = None) -> Profile:
    """The planner's Profile of `workload` on the NPU of `bundle`."""
    segs = npu_segment_seconds(bundle, workload)
    sw = npu_switch_seconds(bundle, workload, mmio_write_ns, weights_resident) if switch_s is None else switch_s
    rates = [e.rate for e in workload.exits]
    return Profile(tuple(exit_aware(segs, rates, early_exit)), sw, tuple(tuple(monotone(r)) for r in segs),
                   tuple(rates))


def gpu_profile(stage_profile: Any, bmax: int | None = None, switch_s: float = 0.0) -> Profile:
    """ℓ(b) = Σ stages T[s](b) from a staged-engine StageProfile (host_driver/staged/slicing.py), b = 1..bmax."""
    top = int(bmax or max(stage_profile.batch_sizes))
    return Profile(tuple(monotone(stage_profile.total(b) for b in range(1, top + 1))), switch_s)
