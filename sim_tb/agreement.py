"""Hardware counters against the DSE performance model, case by case.

The model (dse/perf_model.py) prices the engine that docs/interpretations.md
defines; the RTL implements it. `model_layer_cycles` prices a testbench case
the way the DSE prices a layer, and `agreement_rows` runs cases on the
simulated NPU and lines the two up (docs/rtl-agreement.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fluidnpu.dse.perf_model import DEFAULT_TIMING, EngineTiming, layer_cycles
from fluidnpu.hw.regmap import NpuParams
from fluidnpu.sim_tb.npu_cases import Case, make_case

# Engines small enough to simulate, shaped like the DSE's picks (wide TC, narrow TP) and not.
AGREEMENT_CONFIGS: tuple[NpuParams, ...] = (
    NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=1, axi_dw=64),
    NpuParams(TR=12, TP=3, TC=5, bmax=8, layers=1, axi_dw=64),
    NpuParams(TR=64, TP=4, TC=16, bmax=4, layers=1, axi_dw=64),
    NpuParams(TR=32, TP=8, TC=8, bmax=2, layers=1, axi_dw=128),
)


def model_layer_cycles(TR: int, TP: int, TC: int, data_width: int, case: Case,
                       timing: EngineTiming = DEFAULT_TIMING) -> list[int]:
    """The model's cycles for each layer of `case` at its batch and <BR, k> (one AXI port)."""
    out = []
    for lp, (br, k) in zip(case.layers, case.modes):
        g = lp.geometry
        c = layer_cycles(TR, TP, TC, g.npix, g.P, g.cout, 1, case.b, br, k, data_width / 8, timing,
                         taps=g.kh * g.kw)
        out.append(int(c))
    return out


@dataclass
class AgreementRow:
    config: str
    b: int
    BR: int
    k_code: int
    R: int
    P: int
    C: int
    taps: int
    hw_cycles: int
    model_cycles: int
    mac_cycles: int
    stall_cycles: int
    correct: bool

    @property
    def error(self) -> float:
        return self.hw_cycles / self.model_cycles - 1

    @property
    def mac_share(self) -> float:
        return self.mac_cycles / self.hw_cycles


def agreement_cases(params: NpuParams, n: int, seed: int) -> list[Case]:
    """Single-layer random cases (convs and FCs, every mode) sized to keep simulation short."""
    rng = random.Random(seed)
    return [make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=1,
                      max_c=rng.choice([8, 16, 2 * params.TC + 3]),
                      in_shape=(rng.randint(2, 8), rng.randint(2, 8), rng.randint(1, 4 * params.TP + 5)))
            for _ in range(n)]


def agreement_rows(params: NpuParams, cases: list[Case], timing: EngineTiming = DEFAULT_TIMING) -> list[AgreementRow]:
    """Run the cases back to back on the simulated NPU; counters beside the model."""
    from fluidnpu.sim_tb.npu_amaranth import run_cases

    rows = []
    name = f"<{params.TR},{params.TP},{params.TC}> Bmax {params.bmax} AXI {params.axi_dw}"
    for case, res in zip(cases, run_cases(params, cases)):
        g = case.layers[0].geometry
        br, k = case.modes[0]
        ok = all((o == e).all() for o, e in zip(res.outputs, case.expected)) and res.status & 0b110 == 0b010
        model = sum(model_layer_cycles(params.TR, params.TP, params.TC, params.axi_dw, case, timing))
        rows.append(AgreementRow(name, case.b, br, k, g.npix, g.P, g.cout, g.kh * g.kw,
                                 res.counters["CYC_BUSY"], model, res.counters["CYC_MAC"],
                                 res.counters["CYC_DMA_STALL"], bool(ok)))
    return rows
