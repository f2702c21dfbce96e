"""The whole NPU (registers + control unit + DMA + EngineCore) against numpy.

Most cases run in Amaranth's simulator with the AXI RAM model (no HDL build);
one cocotb run checks the generated Verilog under Verilator with
cocotbext-axi, with pauses on every AXI channel.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest

from fluidnpu.hw.regmap import ErrorCode, NpuParams
from fluidnpu.sim_tb.axi_model import SlaveTiming
from fluidnpu.sim_tb.npu_amaranth import run_case, run_cases
from fluidnpu.sim_tb.npu_cases import make_case

SMALL = NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=3, axi_dw=64)
ODD = NpuParams(TR=12, TP=3, TC=5, bmax=3, layers=3, axi_dw=64)


def _check_result(result, case) -> dict:
    assert result.status & 0b111 == 0b010, f"status {result.status:#x}"
    for i, (got, want) in enumerate(zip(result.outputs, case.expected)):
        assert np.array_equal(got, want), f"layer {i}: {(got != want).sum()} outputs differ, modes {case.modes}"
    return result.counters


def _check(params: NpuParams, case, **kw) -> dict:
    return _check_result(run_case(params, case, **kw), case)


@pytest.mark.parametrize("params,seed", [(SMALL, 1), (SMALL, 2), (ODD, 3), (ODD, 4)])
def test_random_subnets(params, seed):
    rng = random.Random(seed)
    case = make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=3)
    counters = _check(params, case)
    assert counters["CYC_LAYERS"] == 3
    macs_rows = counters["CYC_MAC"]
    assert 0 < macs_rows <= counters["CYC_BUSY"]


@pytest.mark.heavy(36)
def test_every_split_and_mode_at_every_batch():
    """Every BR in [1, b] and every k for every b <= Bmax, back to back on one NPU, on
    convs whose R, P, C fit no tile evenly."""
    rng = random.Random(100)
    cases = [make_case(rng, bmax=SMALL.bmax, TR=SMALL.TR, TP=SMALL.TP, TC=SMALL.TC, nlayers=1, b=b,
                       in_shape=(3, 2, 5), modes=[(br, k)], max_c=6)
             for b in range(1, SMALL.bmax + 1) for br in range(1, b + 1) for k in (0, 1, 2)]
    for result, case in zip(run_cases(SMALL, cases), cases):
        _check_result(result, case)


def test_random_backpressure_and_latency_on_every_channel():
    rng = random.Random(7)
    case = make_case(rng, bmax=SMALL.bmax, TR=SMALL.TR, TP=SMALL.TP, TC=SMALL.TC, nlayers=2)
    _check(SMALL, case, timing=SlaveTiming.jittery(0.5, (0, 12)), seed=5)


def test_several_ports_each_with_its_own_backpressure():
    """Three AXI ports, each stalling and delaying on its own: bit-exact, as on one port."""
    params = replace(ODD, axi_ports=3)
    rng = random.Random(8)
    case = make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=2)
    timings = [SlaveTiming.jittery(0.3, (0, 3)), SlaveTiming.jittery(0.6, (0, 12)), SlaveTiming()]
    counters = _check(params, case, timing=timings, seed=6)
    assert counters["CYC_LAYERS"] == 2


def test_bad_descriptor_and_bad_bactive_are_reported():
    rng = random.Random(9)
    case = make_case(rng, bmax=SMALL.bmax, TR=SMALL.TR, TP=SMALL.TP, TC=SMALL.TC, nlayers=1, b=2)
    # a layer index beyond the FBCB's depth
    words = bytearray(case.image.read(case.image.desc_base, 4))
    words[0:2] = (SMALL.layers + 5).to_bytes(2, "little")
    case.image.write(case.image.desc_base, bytes(words))
    result = run_case(SMALL, case)
    assert result.status & 0b100
    assert (result.status >> 8) & 0xFF == ErrorCode.BAD_DESCRIPTOR


def test_plain_pe_npu_runs_k1_and_refuses_stacked_modes():
    """An NPU built without Stackable PEs (NpuParams.stackable False, from the bundle's DSE
    options) runs k = 1 layers bit-exact and reports a k = 2 or k = 1/2 FBCB entry as
    BAD_DESCRIPTOR."""
    from dataclasses import replace

    params = replace(SMALL, stackable=False)
    rng = random.Random(12)
    cases = [make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=1, b=2,
                       in_shape=(3, 2, 5), modes=[(1, k)], max_c=6) for k in (0, 1, 2)]
    ok, stacked2, stacked_half = run_cases(params, cases)
    _check_result(ok, cases[0])
    for result in (stacked2, stacked_half):
        assert result.status & 0b100
        assert (result.status >> 8) & 0xFF == ErrorCode.BAD_DESCRIPTOR


@pytest.mark.heavy(90)
@pytest.mark.parametrize("sim,cases", [("verilator", 4), ("icarus", 1)])
def test_generated_verilog_with_cocotb(tmp_path, sim, cases):
    """The generated Verilog, cocotbext-axi memory and register master, pauses on every channel:
    random subnets back to back, Bactive changed by BEXIT/BINCR between subnets, soft and
    hard reset in the middle of a run. Icarus (built with -g2005, see sim_tb/runner.py) runs when
    `iverilog` is installed, and is skipped otherwise."""
    from fluidnpu.hw.npu import Npu
    from fluidnpu.sim_tb.runner import run_cocotb

    params = NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=3, axi_dw=64)
    cfg = {"TR": 16, "TP": 4, "TC": 4, "bmax": 4, "layers": 3, "seed": 11, "cases": cases}
    out = tmp_path / "runs.jsonl"
    run_cocotb(Npu(params), "fluidnpu_npu", "fluidnpu.sim_tb.tb_npu", sim=sim,
               extra_env={"FLUIDNPU_NPU_TB": json.dumps(cfg), "FLUIDNPU_NPU_TB_OUT": str(out)})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == cfg["cases"]
    assert all(r["CYC_BUSY"] > 0 for r in rows)


@pytest.mark.heavy(20)
def test_hardware_counters_agree_with_the_performance_model():
    """CYC_BUSY against dse.perf_model on random small layers (docs/rtl-agreement.md has the full
    table): within the issue's 5 % on every case, 2 % on average."""
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_cases, agreement_rows

    params = AGREEMENT_CONFIGS[0]
    rows = agreement_rows(params, agreement_cases(params, 6, seed=42))
    assert all(r.correct for r in rows)
    errors = [abs(r.error) for r in rows]
    assert max(errors) <= 0.05, max(rows, key=lambda r: abs(r.error))
    assert sum(errors) / len(errors) <= 0.02
    # the counters are consistent with each other
    assert all(0 < r.mac_cycles + r.stall_cycles <= r.hw_cycles for r in rows)


@pytest.mark.heavy(40)
def test_hardware_counters_agree_with_the_performance_model_on_several_ports():
    """The same on two and four 64-bit ports (commands dealt round-robin): within 5 % on every
    case, 2 % on average (docs/rtl-agreement.md, "Several AXI ports", has the full table)."""
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_cases, agreement_rows

    rows = []
    for params in (AGREEMENT_CONFIGS[4], AGREEMENT_CONFIGS[6]):     # <16,4,4> on 2 ports, <64,4,16> on 4
        rows += agreement_rows(params, agreement_cases(params, 3, seed=43))
    assert {r.config.rsplit(" ", 1)[1] for r in rows} == {"2x64", "4x64"}
    assert all(r.correct for r in rows)
    errors = [abs(r.error) for r in rows]
    assert max(errors) <= 0.05, max(rows, key=lambda r: abs(r.error))
    assert sum(errors) / len(errors) <= 0.02


def test_fewer_banks_than_bmax_cap_the_groups_of_a_pass():
    """An engine built with NB = 2 banks for Bmax 8 (what the DSE picks when the NB:1 operand
    multiplexers cost more than the packing gains): narrow layers at b = 8, BR = 1 would pack 4 or 8
    groups a pass, the RTL packs 2, bit-exact, and its counters agree with the model priced at NB = 2,
    not with the model of an engine that packs them all."""
    import random

    from fluidnpu.dse.perf_model import descriptor_cycles
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_rows
    from fluidnpu.sim_tb.npu_cases import make_case

    params = AGREEMENT_CONFIGS[7]
    assert params.banks == 2 and params.bmax == 8
    rng = random.Random(5)
    cases = [make_case(rng, bmax=8, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=1, b=8, max_c=c,
                       in_shape=(4, 4, 3), modes=[(1, k)]) for c, k in ((4, 0), (3, 2), (8, 1))]
    rows = agreement_rows(params, cases)
    assert all(r.correct for r in rows)
    assert max(abs(r.error) for r in rows) <= 0.05, rows
    geo = cases[0].layers[0].geometry
    at = {nb: descriptor_cycles(params.TR, params.TP, params.TC, 8, geo, 8, 1, 0, banks=nb) for nb in (2, 8)}
    assert abs(rows[0].hw_cycles - at[2]) < abs(rows[0].hw_cycles - at[8]) / 4


@pytest.mark.heavy(15)
@pytest.mark.parametrize("config, seed, index, mode, shape", [
    # packed group copies: a one-row FC layer whose pass packs two groups: every step is four weight
    # copies (3 and 6 beats, group 1's twice as long) and four one-beat input runs, dealt over the ports
    # the same way every step, so the long copies always queue on ports 1 and 3 and the inputs wait
    # behind them. The model's port skew prices the copies (docs/rtl-agreement.md, "The miss, fixed");
    # it priced the rows as single copies before and was 13.8 % fast here
    (6, 7000, 5, (2, 2), (1, 78, 12, 3)),
    # short steps: 280 one-row weight steps (TPk = 1 in mode k = 2 on <12,3,5>), each one 1-beat weight
    # read and one 1-beat input read; the fetcher runs two steps ahead, so the layer is paced by the
    # reads' round trip, timed from the step's last command. Priced from the next step's start (the
    # weight walker's spare cycle and one more for the hand-over), the model would be 9.4 % slow here
    # (1,458 cycles against the RTL's 1,321; docs/rtl-agreement.md)
    (5, 6000, 3, (1, 2), (1, 280, 2, 1)),
], ids=["packed-group-copies", "short-steps-from-their-last-command"])
def test_fc_layers_on_four_ports_priced_within_five_percent(config, seed, index, mode, shape):
    """One-row FC layers on four 64-bit ports, each the traced case of a fix to the model's several-port
    terms: bit-exact, and the counters within 5 % of the model."""
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_cases, agreement_rows

    params = AGREEMENT_CONFIGS[config]
    case = agreement_cases(params, 12, seed=seed)[index]
    geo = case.layers[0].geometry
    assert params.axi_ports == 4 and case.modes == [mode] and (geo.npix, geo.P, geo.cout, case.b) == shape
    (row,) = agreement_rows(params, [case])
    assert row.correct and abs(row.error) <= 0.05, row


@pytest.mark.parametrize("index, shape, mode", [(0, (6, 6, 14, 2), (1, 0)), (11, (5, 5, 8, 3), (2, 1))],
                         ids=["one-step-blocks", "one-step-blocks-in-four-tiles"])
def test_blocks_of_one_step_wait_for_their_staging_half(index, shape, mode):
    """Blocks of one weight step and a few rows (<64, 14, 4> on three 64-bit ports, the agreement's seeds): a
    block's step is handed to the core only once its staging half is written out, so two blocks take
    the staging loop (`LayerCosts.staging`), not the fetch. Without that loop the model is 14 % and 30 %
    fast here (docs/rtl-agreement.md); bit-exact and within 5 %."""
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_cases, agreement_rows

    params = AGREEMENT_CONFIGS[8]
    case = agreement_cases(params, 12, seed=9000)[index]
    geo = case.layers[0].geometry
    assert (params.axi_ports, params.TP) == (3, 14) and case.modes == [mode]
    assert (geo.npix, geo.P, geo.cout, case.b) == shape
    (row,) = agreement_rows(params, [case])
    assert row.correct and abs(row.error) <= 0.05, row


@pytest.mark.heavy(55)
def test_compute_bound_layer_keeps_the_macs_busy():
    """On a layer the model calls compute-bound (long weight steps: 128 rows against 4 weight
    rows), at ZC706's real bus (four 64-bit HP ports; one such port reaches 78 %, see
    docs/rtl-agreement.md), the MACs are active >= 90 % of the busy cycles, bit-exact."""
    from fluidnpu.sim_tb.agreement import compute_bound_case, compute_bound_rows, model_mac_share

    (row,) = compute_bound_rows(widths=(), ports=(4,))
    assert row.correct and row.config.endswith("AXI 4x64")
    params = NpuParams(TR=128, TP=4, TC=16, bmax=2, layers=1, axi_dw=64, axi_ports=4)
    assert model_mac_share(params, compute_bound_case()) >= 0.9
    assert row.mac_share >= 0.9, (row.mac_cycles, row.hw_cycles)
    assert abs(row.error) <= 0.05


def test_rtl_agreement_reprice_keeps_the_rtl_counts_and_prices_again(tmp_path, monkeypatch, benchmark_module):
    """benchmarks/rtl_agreement.py --reprice: the recorded RTL counters stay, each case (and each pick-shaped
    layer) is priced again by the current model, a record that is not its seed's case is refused (the counts
    would be another layer's), and the configurations not chosen keep their rows as recorded."""
    import json
    import sys
    from dataclasses import asdict

    from fluidnpu.sim_tb.agreement import (
        AGREEMENT_CONFIGS,
        PICK_ENGINE,
        PICK_LAYERS,
        AgreementRow,
        agreement_cases,
        case_model_cycles,
        config_name,
        model_layer_cycles,
        one_layer_case,
    )

    mod = benchmark_module("rtl_agreement")

    def record(i: int, hw: int) -> dict:
        params = AGREEMENT_CONFIGS[i]
        case = agreement_cases(params, 1, seed=1000 * (i + 1))[0]
        g = case.layers[0].geometry
        return asdict(AgreementRow(config_name(params), case.b, *case.modes[0], g.npix, g.P, g.cout, g.kh * g.kw,
                                   hw, 1, 600, 7, True))

    params = AGREEMENT_CONFIGS[0]
    case = agreement_cases(params, 1, seed=1000)[0]
    cb = [record(0, 5000) | {"mac_share": 0.12}] * len(mod.compute_bound_buses())
    name = list(PICK_LAYERS)[1]
    pick = [record(0, 7000) | {"config": config_name(PICK_ENGINE), "layer": name}]
    doc = {"summary": {"seconds": 9.0}, "rows": [record(0, 12345), record(1, 999)], "compute_bound": cb,
           "pick_layers": pick}
    rows, bound, picked = mod.reprice(doc, [0])
    model = sum(model_layer_cycles(params.TR, params.TP, params.TC, params.axi_dw, case, ports=params.axi_ports,
                                   banks=params.banks))
    assert [(r.hw_cycles, r.mac_cycles, r.model_cycles) for r in rows] == [(12345, 600, int(model))]
    assert all(b["hw_cycles"] == 5000 and b["model_cycles"] > 1 for b in bound)
    pick_model = case_model_cycles(PICK_ENGINE, one_layer_case(PICK_LAYERS[name], PICK_ENGINE.bmax, seed=1))
    assert [(p["hw_cycles"], p["model_cycles"], p["layer"]) for p in picked] == [(7000, pick_model, name)]
    (tmp_path / "agreement.json").write_text(json.dumps(doc))
    monkeypatch.setattr(sys, "argv", ["rtl_agreement.py", "--reprice", "--configs", "0", "--out", str(tmp_path)])
    mod.main()
    written = json.loads((tmp_path / "agreement.json").read_text())
    assert [(r["hw_cycles"], r["model_cycles"]) for r in written["rows"]] == [(12345, int(model)), (999, 1)]
    assert written["summary"]["seconds"] == 9.0 and written["pick_layers"][0]["model_cycles"] == pick_model
    doc["rows"] = [record(0, 12345) | {"P": case.layers[0].geometry.P + 1}]
    with pytest.raises(SystemExit, match="simulate again"):
        mod.reprice(doc, [0])


@pytest.mark.heavy(10)
def test_reads_that_wait_in_the_ports_restart_when_the_staging_half_is_released():
    """A 2 x 2 kernel at b = 4 on two 64-bit ports (<16, 4, 4>, the agreement's seed 5000, case 0): the steps
    are short (TPk = 2, six rows) and their beats bind, so each step's reads wait in the ports while the core
    works through the step two before, and restart when it releases their staging half. The model without
    that restart (`EngineTiming.port_restart`) is 15.0 % fast here (2,397 cycles against the RTL's 2,757;
    docs/rtl-agreement.md); bit-exact and within 5 %."""
    from dataclasses import replace

    from fluidnpu.dse.perf_model import DEFAULT_TIMING
    from fluidnpu.sim_tb.agreement import case_model_cycles

    params, case, row = _two_port_agreement_case(0, (1, 2), (18, 52, 7, 4))
    without = case_model_cycles(params, case, replace(DEFAULT_TIMING, port_restart=0))
    assert row.hw_cycles / without - 1 > 0.10, (row.hw_cycles, without)


@pytest.mark.heavy(6)
def test_steps_of_two_kinds_each_pay_their_own_restart():
    """A 3 x 1 kernel over cin 7 at b = 2 on two 64-bit ports (<16, 4, 4>, the agreement's seed 5000, case 1):
    of a block's six steps two hold a kernel row's end, read two runs a row and wait on their commands; the
    other four read one run a row and wait on their beats. Each kind pays its own bound (the longer of its
    walk and its beats + the restart), not the block its longer sum: priced by the sums the model is 7.1 %
    fast here (1,695 cycles against the RTL's 1,815; docs/rtl-agreement.md); bit-exact and within 5 %."""
    _two_port_agreement_case(1, (1, 0), (48, 21, 5, 2))


def _two_port_agreement_case(index: int, mode: tuple[int, int], shape: tuple[int, int, int, int]):
    """Case `index` of the agreement's <16, 4, 4> engine on two 64-bit ports (seed 5000), checked to be
    the layer (R, P, C, b) and <BR, k> a test names, simulated: bit-exact and within 5 % of the model.
    Returns (the engine, the case, its agreement row)."""
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_cases, agreement_rows

    params = AGREEMENT_CONFIGS[4]
    case = agreement_cases(params, 12, seed=5000)[index]
    geo = case.layers[0].geometry
    assert params.axi_ports == 2 and case.modes == [mode] and (geo.npix, geo.P, geo.cout, case.b) == shape
    (row,) = agreement_rows(params, [case])
    assert row.correct and abs(row.error) <= 0.05, row
    return params, case, row
