"""The one cocotb harness of the generated NPU (sim_tb/tb_npu.py, host_driver/_rtl_tb.py).

As cocotbext-axi's own tests wrap their DUT in a `TB` class, `TB` owns the
clock, the reset, an `AxiRam` on every `m_axi<i>` (one memory,
sim_tb/cocotb_ram.py), an `AxiLiteMaster` on `s_axi`, and the host driver's
`NpuDriver` over an `RtlSimDevice` on them: a test programs the NPU exactly
as software does (host_driver/driver.py), with 32-bit register accesses
through cocotbext-axi's `read_dword`/`write_dword`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from cocotb.clock import Clock
from cocotb.task import bridge
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from fluidnpu.host_driver.driver import NpuDriver
from fluidnpu.host_driver.rtl_sim_device import RamBuffer, RtlSimDevice
from fluidnpu.hw.regmap import NpuParams
from fluidnpu.sim_tb.cocotb_ram import axi_rams
from fluidnpu.sim_tb.npu_cases import Case, drive_case, make_case

MEM = 1 << 20


class TB:
    """The NPU toplevel `dut` built from `params`; `start()` before use.

    The driver is blocking code: `call(fn, ...)` runs `fn(driver, ...)` in a `cocotb.task.bridge`
    thread, where every register access is an AXI4-Lite transaction in simulated time.
    """

    def __init__(self, dut: Any, params: NpuParams, *, pause: float = 0.0, seed: int = 0,
                 mem_bytes: int = MEM) -> None:
        self.dut, self.params, self.pause, self.seed, self.mem_bytes = dut, params, pause, seed, mem_bytes
        self.ram: Any = None
        self.axil: Any = None
        self.device: Any = None
        self.driver: Any = None

    async def start(self, open_driver: bool = True) -> TB:
        """Clock, bus models (`pause`: random stalls on every AXI channel), reset, the device and
        (unless `open_driver` is False) the driver, which checks ID, VERSION and CFG_* on open."""
        dut = self.dut
        # the first rising edge half a period in: Icarus settles the design at time 0
        Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False)
        dut.rst.value = 1
        # Let reset settle before the bus models sample anything (Icarus shows undriven
        # nets as Z in the first delta cycles).
        await ClockCycles(dut.clk, 2)
        self.ram = axi_rams(dut, self.mem_bytes, pause=self.pause, seed=self.seed)[0]    # one per m_axi<i>
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi", bus_separator="__"), dut.clk, dut.rst)
        for obj in (self.axil.write_if, self.axil.read_if):
            obj.log.setLevel(logging.WARNING)
        await ClockCycles(dut.clk, 4)
        dut.rst.value = 0
        await ClockCycles(dut.clk, 2)
        self.device = RtlSimDevice(dut, self.ram, self.axil, mem_bytes=self.mem_bytes)
        if open_driver:
            self.driver = await bridge(lambda: NpuDriver(self.device, self.params, load=False))()
        return self

    async def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """fn(driver, *args, **kw) on the driver's thread."""
        return await bridge(fn)(self.driver, *args, **kw)

    async def run(self, case: Case, set_b: bool = True) -> dict:
        """Run a case through the driver (`npu_cases.drive_case`); a run that ended DONE must have
        bit-exact outputs. Returns the status word and the counter registers."""
        dev = self.device
        timeout_s = 20000 * dev.poll_cycles / (dev.clock_mhz * 1e6)
        result = await self.call(drive_case, case, self.window, timeout_s=timeout_s, set_b=set_b)
        outputs = result.pop("outputs")
        if result["status"] & 0b110 == 0b010:
            for i, (got, want) in enumerate(zip(outputs, case.expected)):
                bad = (got != want).sum()
                assert bad == 0, f"layer {i}: {bad} of {want.size} outputs differ (modes {case.modes}, b={case.b})"
        return result

    def window(self, base: int, nbytes: int) -> RamBuffer:
        """The AxiRam at bus address `base` as a buffer (a case's image lives where it was planned)."""
        return RamBuffer(self.ram, base, nbytes, lambda _buf: None)

    def case(self, rng: random.Random, **kw: Any) -> Case:
        """A random case (`npu_cases.make_case`) for this NPU's shape."""
        p = self.params
        return make_case(rng, bmax=p.bmax, TR=p.TR, TP=p.TP, TC=p.TC, **kw)
