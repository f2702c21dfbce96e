"""The driver on the generated Verilog (cocotb + Verilator, cocotbext-axi memory and register master).

One simulation (random pauses on every m_axi channel) runs the whole driver scenario and every fault case through
RtlSimDevice, and the same scenario on ModelDevice must give identical
outputs (both equal to hw/reference's golden results).
"""

from __future__ import annotations

import numpy as np
import pytest

from fluidnpu.host_driver.driver import random_fbcb, stub_bundle
from fluidnpu.host_driver.model_device import ModelDevice
from fluidnpu.host_driver.scenario import model_and_rtl

pytest.importorskip("cocotb")
pytest.importorskip("cocotbext.axi")

TR, TP, TC, BMAX, LAYERS = 16, 4, 4, 4, 2
BUNDLE = stub_bundle(TR, TP, TC, BMAX, random_fbcb(LAYERS, BMAX, TR, TP, TC, seed=1))
WRONG = stub_bundle(TR, TP, TC, BMAX, random_fbcb(LAYERS, BMAX, TR, TP, TC, seed=2))
SEED = 3


@pytest.fixture(scope="module")
def rtl_result():
    from fluidnpu.host_driver.rtl_sim_device import run_with_rtl
    return run_with_rtl(BUNDLE, model_and_rtl, BUNDLE, WRONG, SEED, driver=False, pause=0.3)


def test_rtl_runs_the_driver_scenario_bit_exact(rtl_result):
    sub = rtl_result["subnet"]
    b0, b_mid, b1 = sub["bactive"]
    assert b_mid < b0 and b1 >= b_mid
    for run in sub["runs"]:
        for got, want in zip(run["outputs"], run["expected"]):
            assert np.array_equal(got, want)
        c = run["counters"]
        assert c["layers"] == 2 and 0 < c["mac"] <= c["busy"] and c["dma_stall"] <= c["busy"]


def test_rtl_and_model_give_identical_outputs(rtl_result):
    model = model_and_rtl(ModelDevice(BUNDLE), BUNDLE, WRONG, SEED)
    assert model["subnet"]["bactive"] == rtl_result["subnet"]["bactive"]
    for m, r in zip(model["subnet"]["runs"], rtl_result["subnet"]["runs"]):
        assert (m["b"], m["modes"]) == (r["b"], r["modes"])
        for a, b in zip(m["outputs"], r["outputs"]):
            assert np.array_equal(a, b)


def test_rtl_faults(rtl_result):
    f = rtl_result["faults"]
    kind, msg = f["mismatch"]
    assert kind == "DesignMismatch" and "CFG_DESIGN_HASH" in msg and "CFG_TC" not in msg
    kind, msg = f["timeout"]
    assert kind == "NpuTimeout" and "SOFT_RESET brought it back to idle" in msg and "hard reset" in msg
    assert f["status_after_timeout"] & 1 == 0 and f["bactive_after_timeout"] == BMAX
    assert f["recovered"]
    assert f["bad_descriptor"][0] == "NpuError" and "BAD_DESCRIPTOR" in f["bad_descriptor"][1]
    assert f["bad_bexit"][0] == "NpuError" and "BAD_BACTIVE_UPDATE" in f["bad_bexit"][1]
    assert f["bactive_after_bad_bexit"] == 1
    assert f["bad_bincr"][0] == "NpuError"
    assert f["small_buffer"][0] == "BufferTooSmall" and f["small_read"][0] == "BufferTooSmall"
