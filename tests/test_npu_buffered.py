"""The whole NPU built with the block input buffer (NpuParams.input_buffer) against numpy.

A layer whose FBCB entry marks it buffered at the run's batch size has its input runs answered from the
buffer, which the fill walker fills a block ahead from DDR (hw/buffered_input.py); every other layer runs
as before. The cases: random subnets with every layer buffered or some, every <BR, k> at a batch where the last group is
short (its later blocks are padding rows, the fill walker's marker), AXI stalls on several ports,
buffered and unbuffered layers back to back on one NPU, and the DDR traffic a 3 x 3 layer saves.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest

from fluidnpu.hw.regmap import ErrorCode, NpuParams
from fluidnpu.sim_tb.agreement import PICK_ENGINE, PICK_LAYERS, case_model_cycles, one_layer_case
from fluidnpu.sim_tb.axi_model import SlaveTiming
from fluidnpu.sim_tb.npu_amaranth import run_case, run_cases
from fluidnpu.sim_tb.npu_cases import make_case

SMALL = NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=3, axi_dw=64, input_buffer=2048)
ODD = NpuParams(TR=12, TP=3, TC=5, bmax=3, layers=3, axi_dw=64, input_buffer=1536)


def _check(result, case) -> None:
    assert result.status & 0b111 == 0b010, f"status {result.status:#x}"
    for i, (got, want) in enumerate(zip(result.outputs, case.expected)):
        assert np.array_equal(got, want), f"layer {i}: {(got != want).sum()} outputs differ, modes {case.modes}"


@pytest.mark.parametrize("params,seed", [(SMALL, 2), (SMALL, 3), (ODD, 4), (ODD, 5)])
def test_buffered_subnets_are_bit_exact(params, seed):
    """Every layer buffered (even seeds) or the middle one from DDR between two buffered ones (odd)."""
    rng = random.Random(seed)
    case = make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=3,
                     buffered=True if seed % 2 == 0 else [True, False, True])
    _check(run_case(params, case), case)


def test_every_split_and_mode_with_a_short_last_group():
    """b = 3 on Bmax 4: BR = 2 leaves the last group one sample, so its blocks past that sample read
    nothing (these draws close three blocks with the fill walker's marker)."""
    rng = random.Random(12)
    cases = [make_case(rng, bmax=SMALL.bmax, TR=SMALL.TR, TP=SMALL.TP, TC=SMALL.TC, nlayers=1, b=3,
                       in_shape=(6, 4, 5), modes=[(br, k)], max_c=6, buffered=True)
             for br in (1, 2, 3) for k in (0, 1, 2)]
    for result, case in zip(run_cases(SMALL, cases), cases):
        _check(result, case)


def test_buffered_layers_on_several_ports_with_stalls():
    params = replace(ODD, axi_ports=3)
    rng = random.Random(8)
    case = make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=2, buffered=True)
    timings = [SlaveTiming.jittery(0.3, (0, 3)), SlaveTiming.jittery(0.6, (0, 12)), SlaveTiming()]
    _check(run_case(params, case, timing=timings, seed=6), case)


def test_a_3x3_layer_reads_its_input_once_and_unbuffered_layers_still_run():
    """The same 3 x 3, stride 1, pad 1 layer with and without `buffered`, back to back on one NPU: both
    bit-exact; buffered, the DDR read beats drop (each input row is read once a block, not once a
    window over it). The NPU without a buffer ignores the bit and runs the layer from DDR."""
    cases = []
    for buffered in (False, True):
        rng = random.Random(40)        # draws a 3 x 3, stride 1, pad 1 convolution to 5 channels
        case = make_case(rng, bmax=SMALL.bmax, TR=SMALL.TR, TP=SMALL.TP, TC=SMALL.TC, nlayers=1, b=2,
                         in_shape=(6, 6, 8), modes=[(2, 0)], max_c=6, buffered=buffered)
        g = case.layers[0].geometry
        assert (g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.cout, case.buffered) == (3, 3, 1, 1, 1, 1, 5, [buffered])
        cases.append(case)
    plain, buffered = run_cases(SMALL, cases)
    for result, case in zip((plain, buffered), cases):
        _check(result, case)
        # the model prices each as this NPU runs it (dse/perf_model.py's FillShape for the buffered one)
        assert abs(result.counters["CYC_BUSY"] / case_model_cycles(SMALL, case) - 1) < 0.05
    assert buffered.read_beats < 0.8 * plain.read_beats
    assert buffered.counters["CYC_BUSY"] < plain.counters["CYC_BUSY"]
    _check(run_case(replace(SMALL, input_buffer=0), cases[1]), cases[1])


def test_a_row_block_is_filled_once_for_all_its_column_tiles():
    """A row block runs every column tile before the next (hw/seq_fetcher.py), so a buffered layer reads
    its input from DDR once whatever its tiles: a 1 x 1 layer to 12 channels (three tiles on TC 4) reads
    just its extra weights and biases more than the same layer to 4, where from DDR it also reads its
    input twice more (128 beats a sample and tile: 64 pixels of 8 words)."""
    cases = []
    for buffered in (False, True):
        for cout in (4, 12):
            geo = dict(in_h=8, in_w=8, cin=8, out_h=8, out_w=8, cout=cout, kh=1, kw=1)
            cases.append(one_layer_case(geo, SMALL.bmax, seed=3, b=2, mode=(1, 0), buffered=buffered))
    results = run_cases(SMALL, cases)
    for result, case in zip(results, cases):
        _check(result, case)
        assert abs(result.counters["CYC_BUSY"] / case_model_cycles(SMALL, case) - 1) < 0.05
    plain4, plain12, buf4, buf12 = (r.read_beats for r in results)
    assert (plain12 - plain4) - (buf12 - buf4) == 2 * 2 * 128


def test_a_block_larger_than_the_buffer_is_reported_and_the_npu_stays_usable():
    """A half of 64 words cannot hold this layer's blocks: the run ends with BUFFER_OVERFLOW (not a hang,
    not a silent result), and the next run on the same NPU, unbuffered, is bit-exact."""
    params = replace(SMALL, input_buffer=64)
    cases = []
    for buffered in (True, False):
        rng = random.Random(40)
        cases.append(make_case(rng, bmax=params.bmax, TR=params.TR, TP=params.TP, TC=params.TC, nlayers=1, b=2,
                               in_shape=(6, 6, 8), modes=[(2, 0)], max_c=6, buffered=buffered))
    over, plain = run_cases(params, cases)
    assert over.status & 0b100 and (over.status >> 8) & 0xFF == ErrorCode.BUFFER_OVERFLOW
    _check(plain, cases[1])


@pytest.mark.heavy(30)
def test_the_picks_engine_keeps_its_macs_busy_on_a_buffered_3x3_layer():
    """`layer1` conv2's shape (3 x 3, 16 x 16 x 64) on the ResNet-50/ZC706 pick's TP and ports (TR 64, so
    the fills of four blocks a sample overlap their compute): bit-exact, and MAC-active 87.7 % where the
    DDR path gives 69.7 % (docs/hw-architecture.md, "A block input buffer")."""
    params = replace(PICK_ENGINE, TR=64, input_buffer=8192)
    case = one_layer_case(PICK_LAYERS["3x3, cin 64 (layer1 conv2)"], params.bmax, seed=1, buffered=True)
    result = run_case(params, case)
    _check(result, case)
    assert result.counters["CYC_MAC"] >= 0.85 * result.counters["CYC_BUSY"]
    assert abs(result.counters["CYC_BUSY"] / case_model_cycles(params, case) - 1) < 0.05


@pytest.mark.heavy(60)
def test_generated_verilog_with_the_buffer_under_verilator(tmp_path):
    """The generated Verilog of the NPU with the buffer, cocotbext-axi memory and register master, pauses
    on every AXI channel: random buffered subnets back to back, bit-exact (checked inside the testbench)."""
    from fluidnpu.hw.npu import Npu
    from fluidnpu.sim_tb.runner import run_cocotb

    cfg = {"TR": 16, "TP": 4, "TC": 4, "bmax": 4, "layers": 3, "seed": 13, "cases": 3,
           "input_buffer": SMALL.input_buffer, "buffered": True}
    out = tmp_path / "runs.jsonl"
    run_cocotb(Npu(SMALL), "fluidnpu_npu", "fluidnpu.sim_tb.tb_npu", sim="verilator",
               build_dir=tmp_path / "build", testcase="random_subnets_back_to_back",
               extra_env={"FLUIDNPU_NPU_TB": json.dumps(cfg), "FLUIDNPU_NPU_TB_OUT": str(out)})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == cfg["cases"] and all(r["CYC_BUSY"] > 0 for r in rows)
    assert all(layer["buffered"] for r in rows for layer in r["layers"])



def test_the_model_says_where_the_buffer_pays():
    """dse/perf_model.py prices a buffered layer as the RTL runs it (docs/rtl-agreement.md, "Buffered
    layers"): on the pick's TP and three 64-bit ports the bandwidth-bound 3 x 3 layer gets faster; on four
    ports a stride-2 layer whose passes are one block each gets slower: the layer's first fill waits, and
    each later one hides behind a single short block. Both as the simulated RTL measured (23,833 vs 30,611
    and 2,634 vs 2,453 cycles)."""
    from fluidnpu.dse.perf_model import descriptor_cycles
    from fluidnpu.hw.descriptor import LayerDescriptor
    from fluidnpu.sim_tb.agreement import BUFFER_ENGINES, BUFFERED_CASES

    for index, faster in ((4, True), (3, False)):
        engine, geo, b, (br, k) = BUFFERED_CASES[index]
        p = BUFFER_ENGINES[engine]
        ddr, buf = (descriptor_cycles(p.TR, p.TP, p.TC, p.axi_dw / 8, LayerDescriptor(layer=0, **geo),
                                      b, br, k, ports=p.axi_ports, buffered=bf) for bf in (False, True))
        assert (buf < ddr) == faster, (engine, ddr, buf)


def _model_device_run(params: NpuParams, case) -> dict:
    """The case on the bit-accurate model device (host_driver/model_device.py) of the same NPU."""
    from fluidnpu.host_driver.device import BytesBuffer
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.sim_tb.npu_cases import drive_case

    dev = ModelDevice(params, mem_bytes=1 << 20, mem_base=0)
    return drive_case(NpuDriver(dev, params, load=False), case,
                      lambda base, n: BytesBuffer(dev.memory, base, n, 0), timeout_s=1.0)


@pytest.mark.parametrize("b", [2, 3])
def test_the_model_device_reports_an_overflow_exactly_where_the_rtl_does(b):
    """The smallest buffer the model device runs the 3 x 3 layer in without BUFFER_OVERFLOW (its plan's
    blocks, each block's regions as the fill walker reads them), and one window less: the RTL agrees on
    both, bit-exact where it fits. At b = 3 (BR 2, one group a pass: 5 columns on TC 4) the last pass
    holds the short group alone."""
    from fluidnpu.hw.regmap import buffer_window

    rng = random.Random(40)
    case = make_case(rng, bmax=SMALL.bmax, TR=SMALL.TR, TP=SMALL.TP, TC=SMALL.TC, nlayers=1, b=b,
                     in_shape=(6, 6, 8), modes=[(2, 0)], max_c=6, buffered=True)
    window = buffer_window(SMALL.TP)
    depth = next(d for d in range(window, SMALL.input_buffer + 1, window)
                 if _model_device_run(replace(SMALL, input_buffer=d), case)["status"] & 0b110 == 0b010)
    short = _model_device_run(replace(SMALL, input_buffer=depth - window), case)
    assert short["status"] & 0b100 and (short["status"] >> 8) & 0xFF == ErrorCode.BUFFER_OVERFLOW
    fits, over = run_cases(replace(SMALL, input_buffer=depth), [case]) + run_cases(
        replace(SMALL, input_buffer=depth - window), [case])
    _check(fits, case)
    assert over.status & 0b100 and (over.status >> 8) & 0xFF == ErrorCode.BUFFER_OVERFLOW
