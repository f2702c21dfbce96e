"""The cocotb test `run_with_rtl` (host_driver/rtl_sim_device.py) runs inside the simulator.

It sets up the clock, cocotbext-axi's AxiRam on each m_axi<i> and AxiLiteMaster on
s_axi (as sim_tb/tb_npu.py does), then runs the pickled job's function in a
`cocotb.task.bridge` thread against an RtlSimDevice and pickles its result (or
exception) back.
"""

from __future__ import annotations

import logging
import pickle
import traceback
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.task import bridge
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from fluidnpu.host_driver.rtl_sim_device import RtlSimDevice, _env_job
from fluidnpu.sim_tb.cocotb_ram import axi_rams


@cocotb.test()
async def run_job(dut):
    paths = _env_job()
    job = pickle.loads(Path(paths["job"]).read_bytes())
    Clock(dut.clk, 10, unit="ns", impl="gpi").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    # one AxiRam per m_axi<i>, all on one memory, each port paused on its own
    ram = axi_rams(dut, job["mem_bytes"], pause=job["pause"], seed=job["seed"])[0]
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi", bus_separator="__"), dut.clk, dut.rst)
    for obj in (axil.write_if, axil.read_if):
        obj.log.setLevel(logging.WARNING)
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)
    device = RtlSimDevice(dut, ram, axil, mem_bytes=job["mem_bytes"])

    def body():
        target = device
        if job["driver"]:
            from fluidnpu.host_driver.driver import NpuDriver
            target = NpuDriver(device, job["bundle"])
        return job["fn"](target, *job["args"], **job["kwargs"])

    try:
        result = (True, await bridge(body)())
    except Exception as exc:  # noqa: BLE001 - shipped back to the caller
        exc.__traceback_text__ = traceback.format_exc()
        try:
            pickle.dumps(exc)
            result = (False, exc)
        except Exception:  # noqa: BLE001
            result = (False, RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    Path(paths["out"]).write_bytes(pickle.dumps(result))
