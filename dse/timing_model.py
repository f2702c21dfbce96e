"""Timing proxy model: the longest register-to-register path of the NPU, in LUT levels.

Yosys measures it on small NPUs (hw/timing.py, benchmarks/bench_timing.py): the
netlist's deepest path into each group of end points, grouped into the RTL
structures below. This module prices each structure's depth from the design
point, so the DSE can say, for designs far larger than anything synthesized
here, which path is the longest and whether it fits the budget of
`LEVEL_BUDGET` LUT levels (a 5 ns cycle on a 7-series -2 part; see
docs/resources.md, "Timing proxy").

Each structure's depth is `base + per_level * x`, where `x` is the structure's
count of serial logic that grows with the design (2:1 multiplexer levels, bits
of a comparison) taken from the RTL, and `base`, `per_level` are fitted to the
Yosys measurements (`TimingCosts`). Broadcasts over numpy arrays like the
resource model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fluidnpu.dse.resource_model import input_banks

LEVEL_BUDGET = 8

PARTS = ("core", "seq", "dma", "regs")


def _clog2(x: np.ndarray) -> np.ndarray:
    return np.ceil(np.log2(np.maximum(np.asarray(x, dtype=float), 1.0)))


def _bits_for(x: np.ndarray) -> np.ndarray:
    """Bits of an unsigned value up to x (amaranth.utils.bits_for)."""
    return np.floor(np.log2(np.maximum(np.asarray(x, dtype=float), 1.0))) + 1


@dataclass(frozen=True)
class Structure:
    """One group of paths in the RTL: where they end, what makes them deeper, and the fix."""

    name: str
    part: str                     # the submodule its end points are in
    ends: str                     # regex over end-point group names (hw/timing.py TimingReport.groups: '#' for digits)
    grows_with: str               # what x counts
    fix: str                      # the pipelining that brings it under the budget


STRUCTURES: tuple[Structure, ...] = (
    Structure("requantise", "core", r"^core\.y#_#\[", "nothing (34-bit add and shift | two saturation compares, ReLU)",
              "built: the shifted value `sh` is registered (+1 cycle of core latency); next, register the "
              "round add before the shift"),
    Structure("operand", "core", r"^core\.prod#_#\[", "log2 NB (the NB:1 bank select)",
              "none needed at NB <= 16"),
    Structure("accumulate", "core", r"^core\.(new|post)#_#\[", "nothing (32-bit add)", "none needed"),
    Structure("staging_read", "core", r"^core\._#_\[", "nothing (writer handshake -> staging address)",
              "none needed"),
    Structure("read_command", "dma", r"^(rd_cmd_|dma\.read#?\.(w_data|ar_p|nbeats|len|split|\$))",
              "bits of an input run (log2 2TP): the fetcher's run into the read slice (`rd_cmd_*`), the "
              "slice into the DMA's burst planning",
              "built: a register slice on the read-command stream (hw/stream_slice.py; +1 cycle of DMA latency); "
              "next, register the DMA's burst plan"),
    Structure("response_ready", "dma",
              r"^(m_axi#__rready|rd_rsp|rd_error|seq\.rtag|dma\.read#?\.(desc_q|slot|bidx|ar_inflight)"
              r"|seq\.(rd_out|rsp_slice)|relu|shift|(in|w|b)_wr__|step__)",
              "bits of the core's row counter (log2 TR): step.ready -> loader's take -> the registers it "
              "loads (the skid buffer, the core's buffer writes, the read counter, the planner's descriptor)",
              "built: a skid buffer on the read responses, so R ready is a register (no cycle); next, "
              "precompute the core's at_end (`j + 2 == t`, registered)"),
    Structure("write_data", "dma", r"^(wr_(addr|nwords|data)|dma\.write#?\.)",
              "bits of the writer's word offset (log2 2TC(NB+1)): the writer into the write slice, the "
              "slice into the DMA's burst planning and W queue",
              "built: a register slice on the write-command stream (+1 cycle a write); next, precompute the "
              "writer's address a cycle early"),
    Structure("sequencer", "seq", r"^seq\.", "bits of an input run (log2 2TP)",
              "built: the fetcher's channels left in a tap and kx_delta + ky_delta in registers, `drained` "
              "registered (+1 cycle a layer)"),
    Structure("registers", "regs", r"^regs\.", "nothing", "none needed"),
)


def structure_x(name: str, TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, bmax: int,
                banks: int | None = None) -> np.ndarray:
    """The growing count `x` of a structure at <TR, TP, TC>, Bmax, NB banks (None: the most Bmax
    uses; see `Structure.grows_with`)."""
    TR, TP, TC = (np.asarray(v) for v in (TR, TP, TC))
    nb = banks or input_banks(bmax)
    lg = int(math.log2(nb))
    zero = np.zeros(np.broadcast(TR, TP, TC).shape)
    if name == "operand":
        return zero + lg
    if name in ("read_command", "sequencer"):
        return zero + _bits_for(2 * TP)
    if name == "response_ready":
        return zero + _bits_for(TR)
    if name == "write_data":
        return zero + _bits_for(2 * TC * (nb + 1))
    return zero


@dataclass(frozen=True)
class TimingCosts:
    """(base, per_level) per structure: LUT levels = base + per_level * x. Fitted by
    benchmarks/bench_timing.py to Yosys 0.70 `synth_xilinx -family xc7` (depth-mapped, hw/synth.py
    timing=True) of the NPU at its POINTS; docs/resources.md has the table and the residuals."""

    base: tuple[tuple[str, float], ...] = (
        ("requantise", 7.0), ("operand", 3.0), ("accumulate", 4.0), ("staging_read", 7.0),
        ("read_command", 7.64), ("response_ready", 6.23), ("write_data", 7.0), ("sequencer", 8.0),
        ("registers", 8.0),
    )
    per_level: tuple[tuple[str, float], ...] = (
        ("requantise", 0.0), ("operand", 0.0), ("accumulate", 0.0), ("staging_read", 0.0),
        ("read_command", 0.119), ("response_ready", 0.11), ("write_data", 0.0), ("sequencer", 0.0),
        ("registers", 0.0),
    )

    def of(self, name: str) -> tuple[float, float]:
        return dict(self.base).get(name, 0.0), dict(self.per_level).get(name, 0.0)


DEFAULT_COSTS = TimingCosts()


def structure_levels(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, bmax: int,
                     costs: TimingCosts = DEFAULT_COSTS, banks: int | None = None) -> dict[str, np.ndarray]:
    """LUT levels of each structure's longest path (rounded to whole levels)."""
    out = {}
    for s in STRUCTURES:
        base, per = costs.of(s.name)
        out[s.name] = np.round(base + per * structure_x(s.name, TR, TP, TC, bmax, banks))
    return out


def path_levels(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, bmax: int,
                costs: TimingCosts = DEFAULT_COSTS, banks: int | None = None) -> dict[str, np.ndarray]:
    """LUT levels of the longest path ending in each part (core, seq, dma, regs)."""
    per = structure_levels(TR, TP, TC, bmax, costs, banks)
    out = {}
    for part in PARTS:
        vals = [per[s.name] for s in STRUCTURES if s.part == part]
        out[part] = np.maximum.reduce(vals) if vals else np.zeros(np.shape(vals[0]))
    return out


@dataclass(frozen=True)
class TimingEstimate:
    """The proxy at one design: the longest path's LUT levels, the structure it is in, and
    every structure over the budget with its fix."""

    lut_levels: int
    structure: str
    budget: int
    over_budget: dict[str, int]
    fixes: dict[str, str]
    levels: dict[str, int]

    @property
    def meets_budget(self) -> bool:
        return self.lut_levels <= self.budget

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"meets_budget": self.meets_budget, "model": "dse/timing_model.py"}


# The block input buffer (hw/buffered_input.py), measured by Yosys (docs/resources.md, "The block input
# buffer's resources"): InputBuffer 4 levels up to 4 BRAM36 a bank (each bank split by width), 6 at 18 a
# bank (cascaded in depth behind a read mux: a LUT6 and MUXF7/F8 select one of up to 16 more levels'
# worth); FillWalker 4; the control unit with the buffer joined 8 (its fetcher, as without it).
BUFFER_JOIN_LEVELS = 8


def input_buffer_levels(per_bank: float) -> int:
    """LUT levels of the block input buffer's read path at `per_bank` BRAM36 a bank: 4, and 2 more for
    each 16:1 read mux level the depth cascade needs past 4 a bank."""
    return 4 if per_bank <= 4 else 4 + 2 * math.ceil(math.log(per_bank / 4, 16))


def design_timing(TR: int, TP: int, TC: int, bmax: int, costs: TimingCosts = DEFAULT_COSTS,
                  banks: int | None = None, buffer_per_bank: float = 0) -> TimingEstimate:
    """The timing proxy of one design with NB = `banks` input banks (None: the most Bmax uses) and a
    block input buffer of `buffer_per_bank` BRAM36 a bank (0: none)."""
    per = {k: int(v) for k, v in structure_levels(np.array(TR), np.array(TP), np.array(TC), bmax, costs,
                                                  banks).items()}
    if buffer_per_bank:
        per["input_buffer"] = input_buffer_levels(buffer_per_bank)
        per["buffer_join"] = BUFFER_JOIN_LEVELS
    worst = max(per, key=lambda k: per[k])
    over = {k: v for k, v in per.items() if v > LEVEL_BUDGET}
    fixes = {s.name: s.fix for s in STRUCTURES if s.name in over}
    return TimingEstimate(lut_levels=per[worst], structure=worst, budget=LEVEL_BUDGET, over_budget=over,
                          fixes=fixes, levels=per)
