"""NpuDriver on ModelDevice: the driver scenario bit-exact, the register block's rules, every fault,
memory placement in device buffers, and a real DSE bundle end to end."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.device import BufferTooSmall
from fluidnpu.host_driver.driver import DesignMismatch, NpuDriver, NpuError, NpuTimeout, random_fbcb, stub_bundle
from fluidnpu.host_driver.memory_plan import LayerParams, plan_subnet, subnet_nbytes
from fluidnpu.host_driver.model_device import ModelDevice
from fluidnpu.host_driver.scenario import _case, fault_scenario, subnet_scenario
from fluidnpu.hw.regmap import REG, REGISTERS, Access, ErrorCode, NpuParams, fbcb_table

DESIGNS = [(16, 4, 4, 4), (12, 3, 5, 3), (8, 1, 1, 2)]


def bundle_of(TR, TP, TC, bmax, layers=2, seed=0, **kw):
    return stub_bundle(TR, TP, TC, bmax, random_fbcb(layers, bmax, TR, TP, TC, seed), **kw)


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_driver_scenario_is_bit_exact(design, seed):
    bundle = bundle_of(*design, seed=seed)
    with ModelDevice(bundle) as dev:
        driver = NpuDriver(dev, bundle)
        result = subnet_scenario(driver, seed)
    b0, b_mid, b1 = result["bactive"]
    assert b_mid <= b0
    for run in result["runs"]:
        for got, want in zip(run["outputs"], run["expected"]):
            assert np.array_equal(got, want)
        c = run["counters"]
        assert c["layers"] == 2 and 0 < c["mac"] <= c["busy"]


def test_counters_are_the_performance_model_at_the_run_s_fbcb_entry():
    from fluidnpu.sim_tb.agreement import model_layer_cycles
    TR, TP, TC, bmax = 16, 4, 4, 4
    bundle = bundle_of(TR, TP, TC, bmax, seed=3)
    dev = ModelDevice(bundle)
    driver = NpuDriver(dev, bundle)
    for b in range(1, bmax + 1):
        case = _case(driver, random.Random(b), b)
        image = driver.place(case.layers)
        image.write_input(case.x)
        counters = driver.run_subnet(image, b=b)
        assert counters["busy"] == sum(model_layer_cycles(TR, TP, TC, 64, case))
        assert counters["layers"] == 2


def test_model_register_block_follows_the_register_map():
    params = NpuParams(TR=16, TP=4, TC=4, bmax=4, layers=2, axi_dw=64, design_hash=0xDEADBEEF)
    dev = ModelDevice(params)
    for r in REGISTERS:
        want = 0 if r.access is Access.WO else (params.cfg_values[r.name] if r.reset is None else r.reset)
        assert dev.read32(r.offset) == want, r.name
    assert dev.read32(0x800) == 0                          # unmapped
    dev.write32(REG["ID"].offset, 0)                        # RO: ignored
    assert dev.reg("ID") == 0x464E5055
    dev.reg("BACTIVE", 0)
    dev.reg("CTRL", 1)                                      # START at Bactive 0: refused
    assert dev.reg("STATUS") == 0b100 | ErrorCode.BAD_BACTIVE << 8 and dev.reg("IRQ_STATUS") == 0b10
    dev.reg("IRQ_EN", 0b10)
    assert dev.irq
    dev.reg("IRQ_STATUS", 0b10)
    assert not dev.irq
    dev.reg("FBCB_ADDR", params.fbcb_depth)
    dev.reg("FBCB_DATA", 1)
    assert dev.reg("STATUS") >> 8 == ErrorCode.FBCB_INDEX
    dev.reg("CTRL", 0b010)                                  # SOFT_RESET clears STATUS
    assert dev.reg("STATUS") == 0
    # while busy, the run's registers are locked
    dev.hang = "soft"
    dev.reg("BACTIVE", 2)
    dev.reg("CTRL", 1)
    assert dev.reg("STATUS") & 1
    dev.reg("BACTIVE", 3)
    assert dev.reg("BACTIVE") == 2 and dev.reg("STATUS") >> 8 == ErrorCode.WRITE_WHILE_BUSY
    dev.reg("CTRL", 1)
    assert dev.reg("STATUS") >> 8 == ErrorCode.START_WHILE_BUSY
    dev.reg("CTRL", 0b011)                                  # SOFT_RESET wins over START
    assert dev.reg("STATUS") == 0
    dev.reset()
    assert dev.reg("BACTIVE") == 0


def test_fbcb_is_loaded_from_the_bundle():
    bundle = bundle_of(16, 4, 4, 4, seed=4)
    dev = ModelDevice(bundle, preload_fbcb=False)
    assert dev.fbcb == [0] * 8
    NpuDriver(dev, bundle)
    assert dev.fbcb == fbcb_table(bundle)


def test_faults_on_the_model():
    bundle = bundle_of(16, 4, 4, 4, seed=1)
    wrong = bundle_of(16, 4, 8, 4, seed=2)
    f = fault_scenario(ModelDevice(bundle), bundle, wrong, seed=3)
    kind, msg = f["mismatch"]
    assert kind == "DesignMismatch" and "CFG_TC is 4, the bundle says 8" in msg and "CFG_DESIGN_HASH" in msg
    kind, msg = f["timeout"]
    assert kind == "NpuTimeout" and "left it BUSY, then a hard reset" in msg
    assert f["status_after_timeout"] == 0 and f["bactive_after_timeout"] == 4 and f["recovered"]
    assert f["bad_descriptor"][0] == "NpuError" and "BAD_DESCRIPTOR" in f["bad_descriptor"][1]
    assert f["bad_bexit"][0] == "NpuError" and f["bactive_after_bad_bexit"] == 1
    assert f["bad_bincr"][0] == "NpuError" and "BINCR 4 with BACTIVE 1" in f["bad_bincr"][1]
    assert f["small_buffer"][0] == f["small_read"][0] == "BufferTooSmall"
    assert "outside 0..3" in f["too_many_samples"][1]


def test_a_hang_that_soft_reset_clears_is_reported_as_such():
    bundle = bundle_of(16, 4, 4, 4)
    dev = ModelDevice(bundle, hang="soft")
    driver = NpuDriver(dev, bundle)
    case = _case(driver, random.Random(0), 2, 1)
    image = driver.place(case.layers)
    with pytest.raises(NpuTimeout, match="SOFT_RESET brought it back to idle, then a hard reset"):
        driver.run_subnet(image, timeout_s=0.01, b=2)
    dev.hang = None
    image.write_input(case.x)
    driver.run_subnet(image)
    assert np.array_equal(image.read_tensor(1, 2), case.expected[0])


def test_wrong_device_and_wrong_map_version_are_refused():
    bundle = bundle_of(16, 4, 4, 4)

    class Blank(ModelDevice):
        def read32(self, offset):
            return 0xFFFFFFFF if offset == 0 else super().read32(offset)

    with pytest.raises(DesignMismatch, match="no fluidnpu NPU in this register window: ID reads 0xffffffff"):
        NpuDriver(Blank(bundle), bundle)

    class V2(ModelDevice):
        def read32(self, offset):
            return 0x00020000 if offset == REG["VERSION"].offset else super().read32(offset)

    with pytest.raises(DesignMismatch, match="version 2.x"):
        NpuDriver(V2(bundle), bundle)


def test_illegal_descriptors_are_refused_like_the_hardware():
    """A mode the engine lacks (k=2 with TC=1) and BR > Bactive in the FBCB: BAD_DESCRIPTOR."""
    bundle = stub_bundle(8, 1, 1, 2, [[[1, 0], [1, 0]]])
    dev = ModelDevice(bundle)
    driver = NpuDriver(dev, bundle)
    case = _case(driver, random.Random(0), 1, 1)
    image = driver.place(case.layers)
    image.write_input(case.x)
    driver.load_fbcb([1, 0])                   # layer 0, b=1: k code 1 (k=2) on a TC=1 engine
    with pytest.raises(NpuError, match="BAD_DESCRIPTOR") as e:
        driver.run_subnet(image, b=1)
    assert e.value.code == ErrorCode.BAD_DESCRIPTOR
    driver.load_fbcb([1 << 2, 0])              # BR = 2 at b = 1
    with pytest.raises(NpuError, match="BAD_DESCRIPTOR"):
        driver.run_subnet(image, b=1)
    driver.load_fbcb()
    driver.run_subnet(image, b=1)
    assert np.array_equal(image.read_tensor(1, 1), case.expected[0])


def test_out_of_memory_addresses_are_axi_errors():
    bundle = bundle_of(16, 4, 4, 4)
    dev = ModelDevice(bundle)
    driver = NpuDriver(dev, bundle)
    case = _case(driver, random.Random(0), 2, 1)
    image = driver.place(case.layers)
    d = image.descriptors[0]
    from dataclasses import replace
    image.write(image.desc_base, replace(d, weight_base=0x100).pack())
    with pytest.raises(NpuError, match="AXI_READ"):
        driver.run_subnet(image, b=2)
    image.write(image.desc_base, replace(d, dst_base=0x100).pack())
    with pytest.raises(NpuError, match="AXI_WRITE"):
        driver.run_subnet(image, b=2)
    dev.reg("DESC_BASE", 0x10)
    dev.reg("DESC_COUNT", 1)
    dev.reg("CTRL", 1)
    assert dev.reg("STATUS") >> 8 == ErrorCode.AXI_READ


def test_images_live_in_device_buffers():
    bundle = bundle_of(16, 4, 4, 4)
    dev = ModelDevice(bundle, mem_bytes=1 << 16)
    driver = NpuDriver(dev, bundle)
    case = _case(driver, random.Random(0), 3, 2)
    need = subnet_nbytes(case.layers, 4)
    buf = dev.alloc(need)
    image = plan_subnet(case.layers, 4, buffer=buf)
    assert image.base == buf.phys_addr and image.buffer is buf
    # the descriptors and weights are in device memory
    off = buf.phys_addr - dev.mem_base
    assert bytes(dev.memory[off:off + need]) == bytes(image.memory)
    with pytest.raises(FluidError, match="planned at"):
        plan_subnet(case.layers, 4, base=0x1000).bind(buf)
    with pytest.raises(BufferTooSmall, match="cannot allocate"):
        dev.alloc(1 << 17)
    with pytest.raises(FluidError, match="not placed in a device buffer"):
        driver.run_subnet(plan_subnet(case.layers, 4))
    buf.free()
    with pytest.raises(FluidError, match="freed"):
        buf.read(0, 4)
    again = dev.alloc(need)                    # freed memory is reused
    assert again.phys_addr == buf.phys_addr


def test_a_real_dse_bundle_end_to_end(tiny_board, tiny_workload):
    """DSE -> bundle -> ModelDevice: the bundle's own exit segment 0 (conv, then the exit's FC)."""
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.hw.descriptor import LayerDescriptor
    from fluidnpu.hw.reference import layer_reference

    bundle = bundle_from_result(explore(tiny_workload, tiny_board, DSEOptions(bmax=4)))
    dev = ModelDevice(bundle)
    driver = NpuDriver(dev, bundle)
    seg0 = [s for s in tiny_workload.schedule() if s.segment == 0]
    rng = np.random.default_rng(0)
    layers = []
    for s in seg0:
        g = replace_shift(LayerDescriptor.from_layer(s.layer, s.index))
        layers.append(LayerParams(g, rng.integers(-64, 64, (g.P, g.cout)).astype(np.int16),
                                  rng.integers(-999, 999, g.cout).astype(np.int32)))
    image = driver.place(layers)
    x = rng.integers(-2000, 2000, (3, *image.tensors[0].shape)).astype(np.int16)
    image.write_input(x)
    counters = driver.run_subnet(image, b=3)
    y = x
    for i, lp in enumerate(layers):
        g = lp.geometry
        y = layer_reference(y.reshape(3, g.in_h, g.in_w, g.cin), g, lp.weights, lp.bias)
        assert np.array_equal(image.read_tensor(i + 1, 3), y)
    assert counters["layers"] == len(layers)


def replace_shift(g):
    from dataclasses import replace
    return replace(g, shift=6, relu=True)
