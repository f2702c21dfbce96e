"""End-to-end driver scenarios that run unchanged on every device (tests and benchmarks share them).

`subnet_scenario(driver, seed)`: Bactive set, a random 2-layer subnet
(sim_tb/npu_cases.py) run with the bundle's FBCB modes at that Bactive,
samples exit (BEXIT) and are backfilled (BINCR), a second random subnet runs
at the new Bactive; outputs come back with the numpy golden results.

`fault_scenario(device, bundle, wrong_bundle, seed)`: every fault the driver
reports, on one device: a bundle that does not match the bitstream, a run
that does not finish in time (then recovery: the same subnet runs right),
an illegal descriptor, a refused BEXIT, a buffer too small.

Both are module-level functions so `run_with_rtl` can ship them into the
simulator. sim_tb needs only numpy here (no amaranth).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.device import Device
from fluidnpu.host_driver.driver import NpuDriver, _data
from fluidnpu.host_driver.memory_plan import plan_subnet, subnet_nbytes


def _modes(driver: NpuDriver, n: int, b: int) -> list[tuple[int, int]]:
    entries = _data(driver.bundle)["fbcb"]["entries"]
    return [(entries[i][b - 1][0], entries[i][b - 1][1]) for i in range(n)]


def _case(driver: NpuDriver, rng: random.Random, b: int, nlayers: int = 2, **kw: Any):
    from fluidnpu.sim_tb.npu_cases import make_case
    p = driver.params
    return make_case(rng, bmax=p.bmax, TR=p.TR, TP=p.TP, TC=p.TC, nlayers=nlayers, b=b,
                     modes=_modes(driver, nlayers, b), **kw)


def run_case(driver: NpuDriver, case: Any, timeout_s: float = 5.0, set_b: bool = True) -> dict:
    """Place a sim_tb Case in device memory, run it, read every layer's output back."""
    image = driver.place(case.layers)
    image.write_input(case.x)
    counters = driver.run_subnet(image, timeout_s=timeout_s, b=case.b if set_b else None)
    outputs = [image.read_tensor(i + 1, case.b) for i in range(len(case.layers))]
    image.buffer.free()
    return {"b": case.b, "modes": case.modes, "counters": counters, "outputs": outputs,
            "expected": case.expected, "host_s": driver.last_host_s}


def subnet_scenario(driver: NpuDriver, seed: int = 0) -> dict:
    """Two subnets with an exit and a backfill between them (see the module docstring)."""
    rng = random.Random(seed)
    bmax = driver.params.bmax
    nl = min(2, driver.params.layers)
    b0 = rng.randint(min(2, bmax), bmax)
    driver.set_bactive(b0)
    first = run_case(driver, _case(driver, rng, b0, nl), set_b=False)
    exited = rng.randint(1, b0 - 1) if b0 > 1 else 0
    b_mid = driver.exit(exited)
    back = rng.randint(0, exited)
    b1 = driver.backfill(back)
    if b1 == 0:                       # everything left and nothing came back: a new batch
        driver.set_bactive(1)
        b1 = 1
    second = run_case(driver, _case(driver, rng, b1, nl), set_b=False)
    return {"runs": [first, second], "bactive": [b0, b_mid, b1]}


def _message(fn, *args: Any, **kw: Any) -> tuple[str, str]:
    try:
        fn(*args, **kw)
    except FluidError as exc:
        return type(exc).__name__, str(exc)
    return "none", ""


def fault_scenario(device: Device, bundle: Any, wrong_bundle: Any, seed: int = 0, timeout_s: float = 2e-6) -> dict:
    """Every reported fault on one device; returns {fault: (exception class name, message), ...}."""
    out: dict[str, Any] = {}
    out["mismatch"] = _message(NpuDriver, device, wrong_bundle)
    driver = NpuDriver(device, bundle)
    rng = random.Random(seed)
    p = driver.params
    b = p.bmax
    # a subnet long enough that `timeout_s` passes first; then the same subnet runs right
    big = _case(driver, rng, b, 1, in_shape=(6, 6, 8), max_c=12)
    image = driver.place(big.layers)
    image.write_input(big.x)
    hang = hasattr(device, "hang")        # the model finishes at START: make it hang instead
    if hang:
        setattr(device, "hang", "hard")  # noqa: B010 (a model device's attribute, not Device's)
    out["timeout"] = _message(driver.run_subnet, image, timeout_s=timeout_s, b=b)
    if hang:
        setattr(device, "hang", None)  # noqa: B010
    out["status_after_timeout"] = driver.status()
    out["bactive_after_timeout"] = driver.bactive
    image.upload()
    counters = driver.run_subnet(image, timeout_s=5.0)
    got = image.read_tensor(1, b)
    out["recovered"] = bool(np.array_equal(got, big.expected[0])) and counters["layers"] == 1
    # an illegal descriptor: a layer index beyond the FBCB
    small = _case(driver, rng, b, 1)
    img2 = driver.place(small.layers)
    img2.write_input(small.x)
    bad = replace(img2.descriptors[0], layer=p.layers + 3)
    img2.write(img2.desc_base, bad.pack())
    out["bad_descriptor"] = _message(driver.run_subnet, img2, timeout_s=5.0)
    # Bactive updates the NPU refuses
    driver.set_bactive(1)
    out["bad_bexit"] = _message(driver.exit, 2)
    out["bactive_after_bad_bexit"] = driver.bactive
    out["bad_bincr"] = _message(driver.backfill, p.bmax)
    # buffers too small: the image, a tensor write, a read
    need = subnet_nbytes(small.layers, p.bmax)
    tiny = device.alloc(need // 2)
    out["small_buffer"] = _message(plan_subnet, small.layers, p.bmax, buffer=tiny)
    out["small_read"] = _message(tiny.read, 0, tiny.nbytes + 1)
    tiny.free()
    out["too_many_samples"] = _message(img2.write_input, np.zeros((p.bmax + 1, *img2.tensors[0].shape), np.int16))
    return out


def model_and_rtl(target: Device, bundle: Any, wrong_bundle: Any, seed: int) -> dict:
    """Both scenarios on one device (one RTL simulation start for all of them)."""
    driver = NpuDriver(target, bundle)
    return {"subnet": subnet_scenario(driver, seed), "faults": fault_scenario(target, bundle, wrong_bundle, seed)}


def timed_runs(driver: NpuDriver, seed: int = 0, n: int = 3, in_shape: tuple = (8, 8, 16), max_c: int = 16) -> dict:
    """Benchmark body (benchmarks/bench_host_driver.py): `n` launches of one placed 2-layer subnet at Bmax.

    Returns per launch the wall seconds of run_subnet, the driver's host-side seconds (register
    traffic and checks, the wait excluded), the counters, the simulated ns (RTL) and the device's
    own compute seconds (model)."""
    import time
    dev = driver.device
    b = driver.params.bmax
    case = _case(driver, random.Random(seed), b, min(2, driver.params.layers), in_shape=in_shape, max_c=max_c)
    image = driver.place(case.layers)
    image.write_input(case.x)
    rows = []
    for _ in range(n):
        sim0 = dev.sim_time_ns() if hasattr(dev, "sim_time_ns") else 0.0
        acc0 = getattr(dev, "accesses", getattr(dev, "transactions", 0))
        t0 = time.perf_counter()
        counters = driver.run_subnet(image, timeout_s=1.0, b=b)
        wall = time.perf_counter() - t0
        rows.append({"wall_s": wall, "host_s": driver.last_host_s, "wait_s": driver.last_wait_s,
                     "device_s": getattr(dev, "last_run_s", 0.0), "counters": counters,
                     "sim_ns": (dev.sim_time_ns() - sim0) if hasattr(dev, "sim_time_ns") else 0.0,
                     "accesses": getattr(dev, "accesses", getattr(dev, "transactions", 0)) - acc0})
    ok = all(np.array_equal(image.read_tensor(i + 1, b), e) for i, e in enumerate(case.expected))
    return {"rows": rows, "correct": ok, "layers": [lp.geometry.__dict__ for lp in case.layers], "b": b}
