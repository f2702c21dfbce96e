"""PynqDevice against a fake `pynq` module (pynq is not installed off-board; no Overlay or allocate
is ever called for real). The fake's buffers keep a separate CPU copy, like a non-coherent cache, so
outputs are only right if the driver syncs in both directions."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.driver import DesignMismatch, NpuDriver, NpuTimeout, random_fbcb, stub_bundle
from fluidnpu.host_driver.model_device import ModelDevice
from fluidnpu.host_driver.scenario import subnet_scenario
from fluidnpu.hw.regmap import VLNV

TR, TP, TC, BMAX, LAYERS = 16, 4, 4, 4, 2
BUNDLE = stub_bundle(TR, TP, TC, BMAX, random_fbcb(LAYERS, BMAX, TR, TP, TC, seed=5), axi_dw=128)
NPU_BASE = 0xA000_0000


def _hwh(vlnv: str = VLNV, base: int = NPU_BASE, high: int = NPU_BASE + 0xFFF, extra: str = "") -> str:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<EDKSYSTEM>
  <MODULES>
    <MODULE FULLNAME="/zynq_ultra_ps_e_0" INSTANCE="zynq_ultra_ps_e_0" VLNV="xilinx.com:ip:zynq_ultra_ps_e:3.5">
      <MEMORYMAP>
        <MEMRANGE ADDRESSBLOCK="reg0" BASENAME="C_BASEADDR" BASEVALUE="{base:#x}" HIGHNAME="C_HIGHADDR"
                  HIGHVALUE="{high:#x}" INSTANCE="npu_0" IS_DATA="TRUE" IS_INSTRUCTION="TRUE"
                  MASTERBUSINTERFACE="M_AXI_HPM0_FPD" MEMTYPE="REGISTER" SLAVEBUSINTERFACE="s_axi"/>
      </MEMORYMAP>
    </MODULE>
    <MODULE FULLNAME="/npu_0" INSTANCE="npu_0" VLNV="{vlnv}">
      <PARAMETERS><PARAMETER NAME="Component_Name" VALUE="design_1_npu_0_0"/>{extra}</PARAMETERS>
    </MODULE>
  </MODULES>
</EDKSYSTEM>
"""


def make_fake_pynq(model: ModelDevice) -> types.ModuleType:
    """A `pynq` with Overlay, DefaultIP (VLNV registry as in pynq.overlay), MMIO and allocate."""
    pynq = types.ModuleType("pynq")
    pynq._ip_drivers = {}
    pynq.calls = {"overlay": 0, "download": 0, "allocate": 0, "to_device": 0, "from_device": 0, "free": 0}

    class RegisterIP(type):
        def __init__(cls, name, bases, attrs):
            if "bindto" in attrs:
                for vlnv in cls.bindto:
                    pynq._ip_drivers[vlnv] = cls
                    pynq._ip_drivers[vlnv.rpartition(":")[0]] = cls
            super().__init__(name, bases, attrs)

    class MMIO:
        def __init__(self, base_addr, length):
            assert base_addr == NPU_BASE and length >= 0x1000
            self.base_addr, self.length = base_addr, length

        def read(self, offset, length=4):
            return model.read32(offset)

        def write(self, offset, value):
            model.write32(offset, value)

    class DefaultIP(metaclass=RegisterIP):
        def __init__(self, description):
            self.mmio = MMIO(description["phys_addr"], description["addr_range"])

        def read(self, offset=0):
            return self.mmio.read(offset)

        def write(self, offset, value):
            self.mmio.write(offset, value)

    class Overlay:
        def __init__(self, bitfile_name, download=True):
            pynq.calls["overlay"] += 1
            self.ip_dict = {"npu_0": {"type": VLNV, "phys_addr": NPU_BASE, "addr_range": 0x1000,
                                      "fullpath": "npu_0"},
                            "axi_gpio_0": {"type": "xilinx.com:ip:axi_gpio:2.0", "phys_addr": 0xA0010000,
                                           "addr_range": 0x1000}}
            drv = pynq._ip_drivers.get(VLNV, DefaultIP)
            self.npu_0 = drv(self.ip_dict["npu_0"])
            if download:
                self.download()

        def download(self):
            pynq.calls["download"] += 1
            model.reset()

    class PynqBuffer(np.ndarray):
        def sync_to_device(self):
            pynq.calls["to_device"] += 1
            o = self.device_address - model.mem_base
            model.memory[o:o + self.nbytes] = self.tobytes()

        def sync_from_device(self):
            pynq.calls["from_device"] += 1
            o = self.device_address - model.mem_base
            self[:] = np.frombuffer(bytes(model.memory[o:o + self.nbytes]), dtype=self.dtype)

        def freebuffer(self):
            pynq.calls["free"] += 1
            model._alloc.free(self.device_address - model.mem_base)

    def allocate(shape, dtype="u4", target=None, **kw):
        pynq.calls["allocate"] += 1
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        off = model._alloc.alloc(n)
        buf = np.zeros(shape, dtype=dtype).view(PynqBuffer)   # the CPU's (cached) copy
        buf.device_address = model.mem_base + off
        return buf

    pynq.Overlay, pynq.DefaultIP, pynq.MMIO, pynq.allocate = Overlay, DefaultIP, MMIO, allocate
    return pynq


@pytest.fixture
def fake(tmp_path, monkeypatch):
    model = ModelDevice(BUNDLE)
    pynq = make_fake_pynq(model)
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    bit = tmp_path / "npu.bit"
    bit.write_bytes(b"\0" * 16)
    (tmp_path / "npu.hwh").write_text(_hwh())
    return types.SimpleNamespace(model=model, pynq=pynq, bit=bit, hwh=tmp_path / "npu.hwh")


def test_pynq_is_imported_only_by_pynq_device():
    import importlib
    for mod in ("driver", "device", "model_device", "memory_plan", "devmem_device", "scenario"):
        importlib.import_module(f"fluidnpu.host_driver.{mod}")
    assert "pynq" not in sys.modules


def test_driver_scenario_on_a_pynq_overlay(fake):
    from fluidnpu.host_driver.pynq_device import PynqDevice
    dev = PynqDevice(str(fake.bit), bundle=BUNDLE)
    assert dev.ip_name == "npu_0" and type(dev.ip).__name__ == "FluidNpuIP"
    assert fake.pynq.calls["overlay"] == 1 and fake.pynq.calls["download"] == 1
    driver = NpuDriver(dev, BUNDLE)
    result = subnet_scenario(driver, seed=4)
    for run in result["runs"]:
        for got, want in zip(run["outputs"], run["expected"]):
            assert np.array_equal(got, want)
    calls = fake.pynq.calls
    assert calls["allocate"] == 2 and calls["to_device"] >= 4 and calls["from_device"] >= 2
    assert calls["free"] == 2
    dev.close()


def test_without_syncs_the_outputs_would_be_stale(fake):
    """The fake really is non-coherent: skipping sync_from_device leaves the CPU copy unchanged."""
    from fluidnpu.host_driver.pynq_device import PynqDevice
    dev = PynqDevice(str(fake.bit), bundle=BUNDLE)
    buf = dev.alloc(64)
    buf.write(0, b"\1" * 64)
    o = buf.phys_addr - fake.model.mem_base
    assert bytes(fake.model.memory[o:o + 64]) == b"\0" * 64
    buf.sync_to_device()
    assert bytes(fake.model.memory[o:o + 64]) == b"\1" * 64


def test_hard_reset_redownloads_the_bitstream(fake):
    from fluidnpu.host_driver.pynq_device import PynqDevice
    dev = PynqDevice(str(fake.bit), bundle=BUNDLE)
    driver = NpuDriver(dev, BUNDLE)
    fake.model.hang = "hard"
    import random

    from fluidnpu.host_driver.scenario import _case
    case = _case(driver, random.Random(1), 2, 1)
    image = driver.place(case.layers)
    image.write_input(case.x)
    with pytest.raises(NpuTimeout, match="left it BUSY, then a hard reset"):
        driver.run_subnet(image, timeout_s=0.01, b=2)
    assert fake.pynq.calls["download"] == 2
    assert driver.bactive == 2 and not driver.status() & 1


def test_hwh_is_checked_before_the_overlay_loads(fake):
    from fluidnpu.host_driver.pynq_device import PynqDevice, check_hwh
    cell = check_hwh(fake.hwh, BUNDLE)
    assert (cell.name, cell.base, cell.size) == ("npu_0", NPU_BASE, 0x1000)
    fake.hwh.write_text(_hwh(vlnv="xilinx.com:ip:axi_gpio:2.0"))
    with pytest.raises(FluidError, match="no fluidnpu NPU"):
        PynqDevice(str(fake.bit), bundle=BUNDLE)
    assert fake.pynq.calls["overlay"] == 0
    fake.hwh.write_text(_hwh(vlnv="fluidnpu.org:fluidnpu:npu:2.0"))
    with pytest.raises(FluidError, match="IP version 2.0"):
        PynqDevice(str(fake.bit), bundle=BUNDLE)
    fake.hwh.write_text(_hwh(high=NPU_BASE + 0x7FF))
    with pytest.raises(FluidError, match="2048 bytes"):
        PynqDevice(str(fake.bit), bundle=BUNDLE)
    fake.hwh.write_text(_hwh(extra='<PARAMETER NAME="DESIGN_HASH" VALUE="0x12345678"/>'))
    with pytest.raises(DesignMismatch, match="0x12345678"):
        PynqDevice(str(fake.bit), bundle=BUNDLE)
    fake.hwh.unlink()
    with pytest.raises(FluidError, match="npu.hwh not found"):
        PynqDevice(str(fake.bit), bundle=BUNDLE)


def test_a_bitstream_of_another_bundle_is_refused(fake):
    from fluidnpu.host_driver.pynq_device import PynqDevice
    other = stub_bundle(TR, TP, TC, BMAX, random_fbcb(LAYERS, BMAX, TR, TP, TC, seed=6), axi_dw=64)
    dev = PynqDevice(str(fake.bit), bundle=other)     # the .hwh carries no hash: the registers tell
    with pytest.raises(DesignMismatch, match=r"CFG_AXI_DW is 128, the bundle says 64; CFG_DESIGN_HASH"):
        NpuDriver(dev, other)
