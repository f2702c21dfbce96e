"""Run the whole NPU in Amaranth's simulator against the AXI RAM model.

Fast to start (no HDL compile), so it is where most functional cases run;
the cocotb testbench (sim_tb/tb_npu.py) runs the generated Verilog the same
way with cocotbext-axi. Both program the NPU through the host driver's
`NpuDriver` (`npu_cases.drive_case`), over a `Device` that turns its register
accesses into AXI4-Lite transactions in the simulation.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from amaranth.sim import Simulator

from fluidnpu.host_driver.device import Buffer, BumpAllocator, BytesBuffer, Device
from fluidnpu.host_driver.driver import NpuDriver
from fluidnpu.hw.npu import Npu
from fluidnpu.hw.regmap import REG, NpuParams, m_axi_name
from fluidnpu.sim_tb.axi_model import AxiRamModel, SlaveTiming
from fluidnpu.sim_tb.axil_master import AxiLiteMaster
from fluidnpu.sim_tb.npu_cases import Case, drive_case

_STATUS = REG["STATUS"]
_BUSY = _STATUS.field("BUSY").mask
MEM_BASE = 0x1000          # allocations start here (address 0 stays unused)


@dataclass
class RunResult:
    outputs: list[np.ndarray]       # per layer (b, h, w, c)
    status: int
    counters: dict[str, int]
    cycles: int                     # START to DONE as seen by the testbench
    read_beats: int = 0             # AXI read data beats of the run, all ports


def _mem_size(n: int) -> int:
    size = 1 << 12
    while size < n:
        size *= 2
    return size


class AmaranthSimDevice(Device):
    """The NPU in Amaranth's simulator behind the `Device` interface, so `NpuDriver` drives it.

    The driver is blocking code and the simulator runs coroutines, so `drive` runs the driver in
    a thread of its own and the simulator's testbench (`serve`) carries out each register access
    it asks for on `s_axi` with the AXI4-Lite master (sim_tb/axil_master.py), then hands the
    answer back; the two threads take turns, so the simulation stays deterministic. Memory is the
    AXI RAM model's; `wait_done` polls STATUS every `poll_cycles` cycles and counts *simulated*
    time at `clock_hz`. A hard reset is not modelled: a run that never finishes raises.
    """

    name = "amaranth"

    def __init__(self, dut: Npu, mem: bytearray, *, clock_hz: float = 100e6, poll_cycles: int = 16) -> None:
        self.axil = AxiLiteMaster(dut.s_axi)
        self.mem = mem
        self.clock_hz = clock_hz
        self.poll_cycles = poll_cycles
        self.last_wait_cycles = 0
        self._alloc = BumpAllocator(MEM_BASE, len(mem) - MEM_BASE, what="simulated memory")
        self._req: queue.Queue = queue.Queue(maxsize=1)
        self._rsp: queue.Queue = queue.Queue(maxsize=1)

    def _call(self, *op: Any) -> Any:
        self._req.put(op)
        ok, value = self._rsp.get()
        if not ok:
            raise value
        return value

    def read32(self, offset: int) -> int:
        return self._call("read", offset)

    def write32(self, offset: int, value: int) -> None:
        self._call("write", offset, value)

    def wait_done(self, timeout_s: float) -> bool:
        return self._call("wait", int(timeout_s * self.clock_hz))

    def alloc(self, nbytes: int) -> Buffer:
        off = self._alloc.alloc(nbytes)
        return BytesBuffer(self.mem, MEM_BASE + off, nbytes, on_free=lambda b, off=off: self._alloc.free(off))

    def window(self, base: int, nbytes: int) -> Buffer:
        """The memory at bus address `base` as a buffer (for an image planned there)."""
        return BytesBuffer(self.mem, base, nbytes)

    def reset(self) -> None:
        raise TimeoutError("the NPU did not finish and the Amaranth simulation models no hard reset")

    async def serve(self, ctx: Any) -> None:
        """The simulator's side: carry out the driver thread's requests until it is done."""
        while (op := self._req.get()) is not None:
            try:
                if op[0] == "read":
                    value: Any = await self.axil.read(ctx, op[1])
                elif op[0] == "write":
                    value = await self.axil.write(ctx, op[1], op[2])
                else:
                    value, waited = False, 0
                    while waited <= op[1]:
                        if not await self.axil.read(ctx, _STATUS.offset) & _BUSY:
                            value = True
                            break
                        await ctx.tick().repeat(self.poll_cycles)
                        waited += self.poll_cycles
                    self.last_wait_cycles = waited
                self._rsp.put((True, value))
            except Exception as exc:  # noqa: BLE001 - raised in the driver's thread
                self._rsp.put((False, exc))

    def drive(self, sim: Simulator, fn: Callable[[AmaranthSimDevice], Any]) -> Any:
        """Run `fn(self)` (blocking driver code) against the simulation; returns its result."""
        result: dict[str, Any] = {}

        def body() -> None:
            try:
                result["value"] = fn(self)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                result["error"] = exc
            finally:
                self._req.put(None)

        thread = threading.Thread(target=body, name="npu-driver", daemon=True)

        async def testbench(ctx: Any) -> None:
            thread.start()
            await self.serve(ctx)

        sim.add_testbench(testbench)
        sim.run()
        thread.join()
        if "error" in result:
            raise result["error"]
        return result["value"]


def run_cases(params: NpuParams, cases: list[Case], *, timing: SlaveTiming | Sequence[SlaveTiming] = SlaveTiming(),
              seed: int = 0, max_cycles: int = 2_000_000) -> list[RunResult]:
    """Run `cases` back to back on one simulated NPU (one elaboration, one memory).

    Each AXI port `m_axi<i>` gets its own RAM model on the one memory, with its own
    random stream (`seed`) and `timing` (one for all ports, or one per port).
    Each case runs through `NpuDriver` (`npu_cases.drive_case`): its image, its FBCB
    entries, BACTIVE, START, wait, the counters and the outputs.
    """
    dut = Npu(params)
    lo = min(c.image.base for c in cases)
    hi = max(c.image.base + len(c.image.memory) for c in cases)
    size = _mem_size(hi)
    timings = [timing] * params.axi_ports if isinstance(timing, SlaveTiming) else list(timing)
    if len(timings) != params.axi_ports:
        raise ValueError(f"{len(timings)} port timings for {params.axi_ports} AXI ports")
    # memory the plans do not own answers SLVERR on every port: a read or write outside them fails the case
    ports: list[AxiRamModel] = []
    for i, port_timing in enumerate(timings):
        ports.append(AxiRamModel(getattr(dut, m_axi_name(i)), size=size, data_width=params.axi_dw,
                                 timing=port_timing, seed=seed + 7919 * i, mem=ports[0].mem if ports else None,
                                 error_ranges=((0, lo), (hi, size))))
    device = AmaranthSimDevice(dut, ports[0].mem)

    def body(dev: AmaranthSimDevice) -> list[RunResult]:
        driver = NpuDriver(dev, params, load=False)
        results = []
        for case in cases:
            beats = sum(len(p.stats.r_cycles) for p in ports)
            run = drive_case(driver, case, dev.window, timeout_s=max_cycles / dev.clock_hz)
            results.append(RunResult(run.pop("outputs"), run.pop("status"), run, dev.last_wait_cycles,
                                     sum(len(p.stats.r_cycles) for p in ports) - beats))
        return results

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for port in ports:
        sim.add_process(port.process)
    return device.drive(sim, body)


def run_case(params: NpuParams, case: Case, **kw) -> RunResult:
    """One case on a fresh simulated NPU."""
    return run_cases(params, [case], **kw)[0]
