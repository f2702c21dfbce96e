"""RtlSimDevice: the generated NPU Verilog under cocotb + Verilator, behind the `Device` interface.

cocotb runs the test from inside the simulator, while the driver is ordinary
blocking code. `run_with_rtl` bridges the two: it builds the NPU's Verilog
for a design bundle (sim_tb/runner.py, the build is cached per design), and
in the simulator's cocotb test (host_driver/_rtl_tb.py) calls your function
in a `cocotb.task.bridge` thread. There every `read32`/`write32` is a real
AXI4-Lite transaction by cocotbext-axi's `AxiLiteMaster`, run on the
simulator's thread through `cocotb.task.resume` (the calling thread blocks while
simulated time advances), memory is cocotbext-axi's `AxiRam` on `m_axi`, and
`reset()` pulses the NPU's reset. The function and its arguments travel to
the simulator process by pickle (so: a module-level function), its result or
exception comes back the same way.

    from fluidnpu.host_driver.rtl_sim_device import run_with_rtl
    result = run_with_rtl(bundle, my_fn, arg)      # my_fn(NpuDriver(device, bundle), arg)
    result = run_with_rtl(bundle, my_fn, driver=False)   # my_fn(device)

`wait_done(timeout_s)` counts *simulated* time at the device's clock
(default 100 MHz) and also stops after `wall_limit_s` of real time.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluidnpu.host_driver.device import Buffer, BumpAllocator, Device
from fluidnpu.hw.regmap import REG, NpuParams

_ENV = "FLUIDNPU_RTL_DEVICE"
_BUSY = REG["STATUS"].field("BUSY").mask
MEM_BYTES = 4 << 20
MEM_BASE = 0x1000          # the first allocation starts here (address 0 stays unused)


class RamBuffer(Buffer):
    """A window of the AxiRam; reads and writes go straight to the memory model (no simulated time)."""

    def __init__(self, ram: Any, phys_addr: int, nbytes: int, on_free: Callable[[RamBuffer], None]) -> None:
        self._ram = ram
        self.phys_addr = phys_addr
        self.nbytes = nbytes
        self._on_free = on_free

    def _write(self, offset: int, data: bytes) -> None:
        self._ram.write(self.phys_addr + offset, bytes(data))

    def _read(self, offset: int, n: int) -> bytes:
        return bytes(self._ram.read(self.phys_addr + offset, n))

    def _free(self) -> None:
        self._on_free(self)


class RtlSimDevice(Device):
    """The NPU Verilog in a cocotb simulation. Made by `run_with_rtl` (or a cocotb test) and used from a
    `cocotb.bridge` thread; `dut`, `ram` (AxiRam) and `axil` (AxiLiteMaster) are the test's handles."""

    name = "rtl"

    def __init__(self, dut: Any, ram: Any, axil: Any, *, mem_bytes: int = MEM_BYTES, clock_mhz: float = 100.0,
                 poll_cycles: int = 128, wall_limit_s: float = 120.0) -> None:
        from cocotb.task import resume  # cocotb 2: cocotb.task.bridge / cocotb.task.resume
        from cocotb.triggers import ClockCycles

        self.dut, self.ram, self.axil = dut, ram, axil
        self.clock_mhz = clock_mhz
        self.poll_cycles = poll_cycles
        self.wall_limit_s = wall_limit_s
        self._alloc = BumpAllocator(MEM_BASE, mem_bytes - MEM_BASE, what="RTL simulation memory")
        self.transactions = 0         # AXI4-Lite transactions, polling included
        me = self

        async def aread(off: int) -> int:
            return int(await axil.read_dword(off))

        async def awrite(off: int, value: int) -> None:
            await axil.write_dword(off, int(value & 0xFFFFFFFF))

        async def cycles(n: int) -> None:
            await ClockCycles(dut.clk, n)

        async def wait_idle(max_cycles: float, poll: int, wall_end: float) -> bool:
            """The whole polling loop on the simulator's thread: one bridge round trip per wait."""
            waited = 0
            while True:
                me.transactions += 1
                if not await aread(REG["STATUS"].offset) & _BUSY:
                    return True
                if waited >= max_cycles or time.monotonic() >= wall_end:
                    return False
                await ClockCycles(dut.clk, poll)
                waited += poll

        async def pulse_reset(n: int) -> None:
            dut.rst.value = 1
            await ClockCycles(dut.clk, n)
            dut.rst.value = 0
            await ClockCycles(dut.clk, 2)

        self._read = resume(aread)
        self._write = resume(awrite)
        self.cycles = resume(cycles)
        self._reset = resume(pulse_reset)
        self._wait_idle = resume(wait_idle)
        from cocotb.utils import get_sim_time
        self._sim_ns = lambda: get_sim_time("ns")

    def sim_time_ns(self) -> float:
        return float(self._sim_ns())

    def read32(self, offset: int) -> int:
        self.transactions += 1
        return self._read(offset)

    def write32(self, offset: int, value: int) -> None:
        self.transactions += 1
        self._write(offset, value)

    def alloc(self, nbytes: int) -> Buffer:
        off = self._alloc.alloc(nbytes)
        return RamBuffer(self.ram, MEM_BASE + off, nbytes, lambda b, off=off: self._alloc.free(off))

    def reset(self) -> None:
        """Hard reset: the NPU's (and the memory model's AXI state's) reset held for 4 cycles."""
        self._reset(4)

    def wait_done(self, timeout_s: float) -> bool:
        """Poll STATUS every `poll_cycles` cycles until BUSY = 0; False after `timeout_s` of simulated
        time at `clock_mhz`, or after `wall_limit_s` of real time."""
        return self._wait_idle(timeout_s * self.clock_mhz * 1e6, self.poll_cycles,
                               time.monotonic() + self.wall_limit_s)


def _build_dir(params: NpuParams, sim: str) -> Path:
    from fluidnpu.sim_tb.runner import DEFAULT_BUILD_ROOT
    tag = f"{params.TR}x{params.TP}x{params.TC}_b{params.bmax}_l{params.layers}_dw{params.axi_dw}_p{params.axi_ports}"
    return DEFAULT_BUILD_ROOT / f"host_driver_{tag}_{params.design_hash:08x}_{sim}"


class RtlRunError(AssertionError):
    """The simulation did not return a result (build failure, crash, cocotb error)."""


def run_with_rtl(bundle: Any, fn: Callable[..., Any], *args: Any, driver: bool = True, sim: str = "verilator",
                 pause: float = 0.0, seed: int = 1, mem_bytes: int = MEM_BYTES, verilog: Path | None = None,
                 log_file: Path | None = None, **kwargs: Any) -> Any:
    """Build the NPU Verilog of `bundle` and run `fn(NpuDriver(device, bundle), *args, **kwargs)`
    (or `fn(device, ...)` with driver=False) inside the simulation; returns fn's result.

    `fn`, the arguments and the result must pickle (fn: a module-level function). An exception in
    `fn` is re-raised here. `pause` adds random AXI pauses on every m_axi channel.
    `verilog`: the NPU Verilog `fluidnpu rtl` already wrote for this bundle (hw/rtl_gen.py, the same
    text), simulated instead of converting the design again (~15 s for the digits design).
    `log_file`: where the Verilator build's and the simulator's output is appended; None: stderr (never
    stdout, which carries a command's results, `--json`).
    Under pytest a missing simulator skips the test (sim_tb/runner.py).
    """
    from fluidnpu.host_driver.driver import _data, bundle_params
    from fluidnpu.hw.npu import Npu
    from fluidnpu.sim_tb.runner import fds_to, run_cocotb

    params = bundle_params(bundle)
    payload = {"bundle": bundle if isinstance(bundle, NpuParams) else dict(_data(bundle)), "fn": fn,
               "args": args, "kwargs": kwargs, "driver": driver, "pause": pause, "seed": seed,
               "mem_bytes": mem_bytes}
    # the simulator's own output (a subprocess writing to fd 1) goes to stderr, or to log_file
    with tempfile.TemporaryDirectory(prefix="fluidnpu_rtl_") as tmp, fds_to(2, fds=(1,)):
        job, out = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        job.write_bytes(pickle.dumps(payload))
        try:
            run_cocotb(Npu(params) if verilog is None else Path(verilog), "fluidnpu_npu",
                       "fluidnpu.host_driver._rtl_tb", sim=sim,
                       build_dir=_build_dir(params, sim), log_file=log_file,
                       extra_env={_ENV: json.dumps({"job": str(job), "out": str(out)}),
                                  "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING"),
                                  "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore::DeprecationWarning")})
        except AssertionError as exc:
            if not out.exists():
                raise RtlRunError(f"the RTL simulation did not complete: {exc}") from None
        if not out.exists():
            raise RtlRunError("the RTL simulation returned no result")
        ok, value = pickle.loads(out.read_bytes())
    if not ok:
        raise value
    return value


def _env_job() -> dict:
    return json.loads(os.environ[_ENV])
