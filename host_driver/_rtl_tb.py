"""The cocotb test `run_with_rtl` (host_driver/rtl_sim_device.py) runs inside the simulator.

It sets up the NPU with the cocotb harness every NPU testbench uses (sim_tb/cocotb_tb.py:
clock, reset, cocotbext-axi's AxiRam on each m_axi<i> and AxiLiteMaster on s_axi), then runs the
pickled job's function in a `cocotb.task.bridge` thread against an RtlSimDevice and pickles its result (or
exception) back.
"""

from __future__ import annotations

import pickle
import traceback
from pathlib import Path

import cocotb
from cocotb.task import bridge

from fluidnpu.host_driver.driver import bundle_params
from fluidnpu.host_driver.rtl_sim_device import _env_job
from fluidnpu.sim_tb.cocotb_tb import TB


@cocotb.test()
async def run_job(dut):
    paths = _env_job()
    job = pickle.loads(Path(paths["job"]).read_bytes())
    # the driver (if any) is opened in `body`, so a DesignMismatch goes back to the caller
    tb = await TB(dut, bundle_params(job["bundle"]), pause=job["pause"], seed=job["seed"],
                  mem_bytes=job["mem_bytes"]).start(open_driver=False)
    device = tb.device

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
