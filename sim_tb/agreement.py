"""Hardware counters against the DSE performance model, case by case.

The model (dse/perf_model.py) prices the engine that docs/interpretations.md
defines; the RTL implements it. `model_layer_cycles` prices a testbench case
the way the DSE prices a layer, and `agreement_rows` runs cases on the
simulated NPU and lines the two up (docs/rtl-agreement.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from fluidnpu.dse.perf_model import DEFAULT_TIMING, EngineTiming, descriptor_cycles
from fluidnpu.hw.regmap import NpuParams
from fluidnpu.sim_tb.npu_cases import Case, make_case

# Engines small enough to simulate, shaped like the DSE's picks (wide TC, narrow TP) and not;
# the last three with several AXI ports (the boards have four HP ports).
AGREEMENT_CONFIGS: tuple[NpuParams, ...] = (
    NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=1, axi_dw=64),
    NpuParams(TR=12, TP=3, TC=5, bmax=8, layers=1, axi_dw=64),
    NpuParams(TR=64, TP=4, TC=16, bmax=4, layers=1, axi_dw=64),
    NpuParams(TR=32, TP=8, TC=8, bmax=2, layers=1, axi_dw=128),
    NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=1, axi_dw=64, axi_ports=2),
    NpuParams(TR=12, TP=3, TC=5, bmax=8, layers=1, axi_dw=64, axi_ports=4),
    NpuParams(TR=64, TP=4, TC=16, bmax=4, layers=1, axi_dw=64, axi_ports=4),
    NpuParams(TR=32, TP=4, TC=16, bmax=8, layers=1, axi_dw=64, nb=2),    # fewer banks than Bmax: g <= 2
    # the ResNet-50/ZC706 pick's ports and TP (3 x 64-bit, TP = 14: a row step of 14 words is
    # 3.5 beats, the ports bind), its TC cut to 4 to simulate
    NpuParams(TR=64, TP=14, TC=4, bmax=4, layers=1, axi_dw=64, axi_ports=3),
)


def model_layer_cycles(TR: int, TP: int, TC: int, data_width: int, case: Case,
                       timing: EngineTiming = DEFAULT_TIMING, exact: bool = True, ports: int = 1,
                       banks: int | None = None, input_buffer: bool = False) -> list[int]:
    """The model's cycles for each layer of `case` at its batch and <BR, k> (`ports` AXI ports,
    `banks` input banks, `input_buffer`: the NPU has the block input buffer, so its buffered layers
    are priced as such; without it they run from DDR).

    `exact`: price the input reads from the descriptor's geometry (their actual
    alignments); False: at their average alignment, as the DSE does."""
    return [descriptor_cycles(TR, TP, TC, data_width / 8, lp.geometry, case.b, br, k, timing, exact, ports, banks,
                              buffered=input_buffer and case.is_buffered(i))
            for i, (lp, (br, k)) in enumerate(zip(case.layers, case.modes))]


def bus_name(params: NpuParams) -> str:
    """"AXI 64" for one 64-bit port, "AXI 4x64" for four."""
    return f"AXI {params.axi_dw}" if params.axi_ports == 1 else f"AXI {params.axi_ports}x{params.axi_dw}"


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


# A compute-bound layer: 3x3 conv, 16 -> 16 channels on a 16x8 image (R = 128, P = 144, C = 16)
# on an engine whose weight steps are long (TR = 128 rows) against their TPk weight rows.
COMPUTE_BOUND_ENGINE = dict(TR=128, TP=4, TC=16, bmax=2, layers=1)
COMPUTE_BOUND_WIDTHS = (64, 128, 256)
COMPUTE_BOUND_PORTS = (2, 4)            # of 64 bits: ZC706's HP ports


def one_layer_case(geometry: dict, bmax: int, seed: int = 0, b: int = 1, mode: tuple[int, int] = (1, 0),
                   buffered: bool = False) -> Case:
    """b samples (one by default) through one layer of the given geometry (LayerDescriptor fields), random
    weights and input, at <BR, k_code> = `mode` (<1, 1> by default), `buffered` or not, with
    hw/reference's expected output."""
    import numpy as np

    from fluidnpu.host_driver.memory_plan import plan_subnet
    from fluidnpu.hw.descriptor import LayerDescriptor
    from fluidnpu.hw.reference import layer_reference
    from fluidnpu.sim_tb.npu_cases import random_layer

    geo = LayerDescriptor(layer=0, shift=8, **geometry)
    lp = random_layer(random.Random(seed), geo)
    image = plan_subnet([lp], bmax)
    x = np.random.default_rng(seed).integers(-32768, 32768, size=(b, *image.tensors[0].shape),
                                             dtype=np.int64).astype(np.int16)
    image.write_input(x)
    case = Case(layers=[lp], image=image, b=b, modes=[mode], x=x, buffered=[buffered])
    case.expected.append(layer_reference(x, geo, lp.weights, lp.bias))
    return case


def compute_bound_case(seed: int = 0) -> Case:
    """One sample through the compute-bound layer (its model MAC share is >= 90 % at 256 bits)."""
    return one_layer_case(dict(in_h=16, in_w=8, cin=16, out_h=16, out_w=8, cout=16, kh=3, kw=3, ph=1, pw=1),
                          COMPUTE_BOUND_ENGINE["bmax"], seed)


def compute_bound_buses(widths: tuple[int, ...] = COMPUTE_BOUND_WIDTHS,
                        ports: tuple[int, ...] = COMPUTE_BOUND_PORTS) -> list[NpuParams]:
    """<128, 4, 16> on one port of each width, then on several 64-bit ports."""
    return ([NpuParams(**COMPUTE_BOUND_ENGINE, axi_dw=dw) for dw in widths]
            + [NpuParams(**COMPUTE_BOUND_ENGINE, axi_dw=64, axi_ports=n) for n in ports])


def compute_bound_rows(widths: tuple[int, ...] = COMPUTE_BOUND_WIDTHS,
                       ports: tuple[int, ...] = COMPUTE_BOUND_PORTS) -> list[AgreementRow]:
    """The compute-bound layer on <128, 4, 16> at each bus (`compute_bound_buses`): MAC-active share and model."""
    rows = []
    for params in compute_bound_buses(widths, ports):
        rows += agreement_rows(params, [compute_bound_case()])
    return rows


# Layers shaped like the ResNet-50/ZC706 pick's bandwidth-bound ones: its TP = 14 on its three 64-bit
# ports (a row's 14 words are four beats, so the ports bind) and steps of hundreds of rows; TC cut to 4
# to simulate. The random cases above are a few rows a step, where latencies dominate instead.
PICK_ENGINE = NpuParams(TR=256, TP=14, TC=4, bmax=2, layers=1, axi_dw=64, axi_ports=3)
PICK_LAYERS: dict[str, dict] = {
    "3x3, cin 64 (layer1 conv2)": dict(in_h=16, in_w=16, cin=64, out_h=16, out_w=16, cout=4, kh=3, kw=3,
                                       ph=1, pw=1),
    "1x1, cin 256 (layer1 conv1)": dict(in_h=16, in_w=16, cin=256, out_h=16, out_w=16, cout=4, kh=1, kw=1),
    "3x3, cin 32, two column tiles": dict(in_h=12, in_w=12, cin=32, out_h=12, out_w=12, cout=8, kh=3, kw=3,
                                          ph=1, pw=1),
    # ResNet-50's stem on a 16 x 16 image, as the network defines it and as the host feeds it (fluidnpu/lowering.py)
    "7x7 stride-2 stem, cin 3 (conv1)": dict(in_h=16, in_w=16, cin=3, out_h=8, out_w=8, cout=4, kh=7, kw=7, sh=2,
                                             sw=2, ph=3, pw=3),
    "the stem folded: 1x7 stride (1, 2), cin 21": dict(in_h=8, in_w=16, cin=21, out_h=8, out_w=8, cout=4, kh=1, kw=7,
                                                       sh=1, sw=2, ph=0, pw=3),
}


def pick_layer_rows(names: tuple[str, ...] | None = None, params: NpuParams = PICK_ENGINE) -> list[AgreementRow]:
    """`PICK_LAYERS` (all, or `names`) on `params`, one sample each, counters beside the model."""
    chosen = list(PICK_LAYERS) if names is None else list(names)
    return agreement_rows(params, [one_layer_case(PICK_LAYERS[n], params.bmax, seed=i) for i, n in enumerate(chosen)])


def config_name(params: NpuParams) -> str:
    """How the agreement tables name an NPU configuration."""
    return f"<{params.TR},{params.TP},{params.TC}> Bmax {params.bmax} {bus_name(params)}"


def case_model_cycles(params: NpuParams, case: Case, timing: EngineTiming = DEFAULT_TIMING) -> int:
    """The model's cycles of a one-layer case on the NPU `params` (its own bus, ports and banks)."""
    return int(sum(model_layer_cycles(params.TR, params.TP, params.TC, params.axi_dw, case, timing,
                                      ports=params.axi_ports, banks=params.banks,
                                      input_buffer=params.input_buffer > 0)))


def model_mac_share(params: NpuParams, case: Case, timing: EngineTiming = DEFAULT_TIMING) -> float:
    """The model's MAC-active share (row-cycles of compute / cycles) of a one-layer case."""
    from fluidnpu.dse.perf_model import mode_dims
    from fluidnpu.dse.tiling import layer_schedule

    g = case.layers[0].geometry
    br, k = case.modes[0]
    sched = layer_schedule(params.TR, params.TP, params.TC, g.npix, g.P, g.cout, case.b, br, k, params.banks)
    n_p = -(-g.P // int(mode_dims(params.TR, params.TP, params.TC, k)[1]))
    busy_rows = sum(blk.rows * n_p for blk in sched.blocks)
    return busy_rows / case_model_cycles(params, case, timing)


def agreement_rows(params: NpuParams, cases: list[Case], timing: EngineTiming = DEFAULT_TIMING) -> list[AgreementRow]:
    """Run the cases back to back on the simulated NPU; counters beside the model."""
    from fluidnpu.sim_tb.npu_amaranth import run_cases

    return [_row(params, case, res, case_model_cycles(params, case, timing))
            for case, res in zip(cases, run_cases(params, cases))]


def _row(params: NpuParams, case: Case, res: Any, model: int) -> AgreementRow:
    """A one-layer case's run (`npu_amaranth.RunResult`) beside the model's cycles."""
    g = case.layers[0].geometry
    br, k = case.modes[0]
    ok = all((o == e).all() for o, e in zip(res.outputs, case.expected)) and res.status & 0b110 == 0b010
    return AgreementRow(config_name(params), case.b, br, k, g.npix, g.P, g.cout, g.kh * g.kw,
                        res.counters["CYC_BUSY"], model, res.counters["CYC_MAC"], res.counters["CYC_DMA_STALL"],
                        bool(ok))


# Buffered layers (hw/buffered_input.py): 3 x 3 convolutions on three engines, each run from DDR and
# buffered on the same NPU, both beside the model (docs/rtl-agreement.md, "Buffered layers").
BUFFER_ENGINES: dict[str, NpuParams] = {
    "small": NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=1, axi_dw=64, input_buffer=2048),
    "mid": NpuParams(TR=64, TP=4, TC=16, bmax=4, layers=1, axi_dw=64, axi_ports=4, input_buffer=4096),
    "pick": replace(PICK_ENGINE, TR=64, input_buffer=8192),
}
_CONV8 = dict(in_h=8, in_w=8, cin=8, out_h=8, out_w=8, cout=4, kh=3, kw=3, ph=1, pw=1)
BUFFERED_CASES: tuple[tuple[str, dict, int, tuple[int, int]], ...] = (   # (engine, geometry, b, <BR, k_code>)
    ("small", _CONV8, 2, (1, 0)),
    ("small", _CONV8, 3, (2, 0)),
    ("mid", dict(_CONV8, cin=16, cout=16), 2, (2, 0)),
    ("mid", dict(in_h=9, in_w=9, cin=16, out_h=4, out_w=4, cout=16, kh=3, kw=3, sh=2, sw=2), 4, (2, 0)),
    ("pick", PICK_LAYERS["3x3, cin 64 (layer1 conv2)"], 2, (2, 0)),
    ("pick", PICK_LAYERS["3x3, cin 32, two column tiles"], 1, (1, 0)),
)


def buffered_rows(engines: tuple[str, ...] | None = None) -> list[dict]:
    """`BUFFERED_CASES` (of all engines, or `engines`): each layer from DDR and buffered, back to back on
    its NPU; per case the agreement row of each (`AgreementRow` fields) and the AXI read beats."""
    from dataclasses import asdict

    from fluidnpu.sim_tb.npu_amaranth import run_cases

    out = []
    for name, params in BUFFER_ENGINES.items():
        if engines is not None and name not in engines:
            continue
        chosen = [(i, c) for i, c in enumerate(BUFFERED_CASES) if c[0] == name]
        cases = [one_layer_case(geo, params.bmax, seed=i, b=b, mode=mode, buffered=buffered)
                 for i, (_, geo, b, mode) in chosen for buffered in (False, True)]
        results = run_cases(params, cases)
        for j, (i, _) in enumerate(chosen):
            pair = []
            for case, res in zip(cases[2 * j:2 * j + 2], results[2 * j:2 * j + 2]):
                row = _row(params, case, res, case_model_cycles(params, case))
                pair.append(asdict(row) | {"read_beats": res.read_beats})
            out.append({"case": i, "engine": name, "ddr": pair[0], "buffered": pair[1]})
    return out
