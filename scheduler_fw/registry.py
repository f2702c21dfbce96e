"""Every policy by name, with the NPU design it is evaluated on.

The paper evaluates each system on "the highest performing NPU design" from a
DSE "using a batch size of 8" under its own batching scheme (§IV, Baselines).
`DesignKind` records which DSE that is; `fluidnpu.scheduler_fw.designs` runs
(and caches) it. Our choices, with reasons (docs/interpretations.md):

| policy        | NPU design                                                        |
|---------------|-------------------------------------------------------------------|
| fluidb        | Fluid Batching + Stackable PEs, w_b = 1 for b = 1..Bmax (the paper's own DSE) |
| fc-adaptb-*   | FC-only batching, plain PEs, DSE'd at batch Bmax                  |
| r-adaptb-*    | static R batching, plain PEs, DSE'd at batch Bmax                 |
| lazybatching  | static R batching, plain PEs, DSE'd at batch Bmax (the status-quo NPU) |
| serial        | plain PEs, DSE'd at batch 1 (it never batches)                    |

Board-side code: pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.adaptive import TIMEOUT_FRACTIONS, AdaptiveBatching, Serial
from fluidnpu.scheduler_fw.fluidb import FluidB
from fluidnpu.scheduler_fw.latency import LatencyTable
from fluidnpu.scheduler_fw.lazybatching import LazyBatching
from fluidnpu.scheduler_fw.policy import Policy, check_positive


@dataclass(frozen=True)
class DesignKind:
    """Which DSE a policy's NPU comes from. batch: 'all' (w_b = 1), 'bmax' or 'one' (fixed batch);
    stackable None: the DSE decides whether Stackable PEs are built (`fluidnpu dse`'s default)."""

    batching: str
    stackable: bool | None
    batch: str

    @property
    def key(self) -> str:
        pes = {True: "+stackable", False: "", None: "+pe-searched"}[self.stackable]
        return f"{self.batching}{pes}@{self.batch}"


FLUID = DesignKind("fluid", None, "all")            # FluidB's: `fluidnpu dse`'s pick
FLUID_STACKABLE = DesignKind("fluid", True, "all")  # Fig. 7's "Fluid + Stackable PEs"
FC_B8 = DesignKind("fc", False, "bmax")
R_B8 = DesignKind("r", False, "bmax")
SERIAL_B1 = DesignKind("r", False, "one")

Builder = Callable[[LatencyTable, float, int], Policy]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    label: str
    design: DesignKind
    build: Builder


def _adaptb(name: str, frac: float) -> Builder:
    return lambda table, slo, bmax: AdaptiveBatching(table, frac * slo, bmax, name=name)


def _specs() -> dict[str, PolicySpec]:
    out = {"serial": PolicySpec("serial", "SERIAL", SERIAL_B1, lambda t, slo, bmax: Serial(t))}
    for base, design in (("fc", FC_B8), ("r", R_B8)):
        for size, frac in TIMEOUT_FRACTIONS.items():
            name = f"{base}-adaptb-{size}"
            out[name] = PolicySpec(name, f"{base.upper()}-AdaptB-{size.upper()}", design, _adaptb(name, frac))
    out["lazybatching"] = PolicySpec("lazybatching", "LazyBatching", R_B8,
                                     lambda t, slo, bmax: LazyBatching(t, slo, bmax))
    out["fluidb"] = PolicySpec("fluidb", "FluidB", FLUID, lambda t, slo, bmax: FluidB(t, slo, bmax))
    return out


POLICIES: dict[str, PolicySpec] = _specs()


def policy_spec(name: str) -> PolicySpec:
    """The spec of a policy name (case-insensitive); unknown names are a one-line FluidError."""
    key = name.strip().lower()
    if key not in POLICIES:
        raise FluidError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[key]


def make_policy(name: str, table: LatencyTable, slo_s: float, bmax: int | None = None) -> Policy:
    """A fresh policy object (policies keep state: one per simulation)."""
    spec = policy_spec(name)
    slo_s = check_positive(slo_s, "the latency SLO")
    return spec.build(table, slo_s, table.bmax if bmax is None else bmax)
