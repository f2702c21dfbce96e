"""Serving samples through a scheduling policy on a device, in wall-clock time (what `fluidnpu run`
and `fluidnpu flow` report).

    fluidnpu run --device model|rtl [--design design.json] --model digits-ee --rate R --slo S \
                 [--samples N] [--policy fluidb] [--tau 0.8] [--json]

The network is quantised to 16-bit fixed point (fluidnpu/quantize.py), the
scheduler's latency table is measured on the device at start-up, and the
test split of the digits data set is streamed at Poisson rate R. With
`--device rtl` the whole serving loop runs inside the cocotb + Verilator
simulation of the design's generated Verilog (host_driver/rtl_sim_device.py).
The command itself is host_driver/cli.py.
"""

from __future__ import annotations

import functools
from typing import Any

from fluidnpu.errors import FluidError

MODELS = ("digits-ee",)


@functools.cache
def load_network(model: str):
    """(float network, quantised network, test inputs, test labels) of a runtime model; quantised once
    per process (`fluidnpu flow` serves and co-simulates the same network)."""
    key = model.lower().replace("_", "-")
    if key not in MODELS:
        raise FluidError(f"unknown runtime model {model!r}; `fluidnpu run` serves: {', '.join(MODELS)}")
    from fluidnpu import digits_ee as D
    from fluidnpu.quantize import quantize

    net = D.load_float_network()
    xtr, _, xte, yte = D.load_dataset()
    return net, quantize(net, xtr), xte, yte


def _check_design(bundle: Any, qnet: Any) -> None:
    names = [s.layer.name for s in bundle.workload.schedule()]
    want = [q.name for q in qnet.layers]
    if names != want:
        raise FluidError(f"design bundle is for {bundle.workload.name!r} ({len(names)} layers), not for "
                         f"{qnet.workload.name!r} ({len(want)} layers): run `fluidnpu dse --model "
                         f"{qnet.workload.name}` for it")
    for s, q in zip(bundle.workload.schedule(), qnet.layers):
        if s.layer != q.layer:
            g, h = s.layer, q.layer
            raise FluidError(f"design bundle's layer {g.name!r} ({'x'.join(map(str, g.kernel))} over {g.in_ch} "
                             f"channels) is not the network's ({'x'.join(map(str, h.kernel))} over {h.in_ch}): "
                             f"the bundle is for another lowering of {qnet.workload.name!r} (a stem folded or not, "
                             f"docs/interpretations.md); run `fluidnpu dse --model {qnet.workload.name}` again")


def serve_on_driver(driver: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The whole run on one NpuDriver (module-level: it also runs inside the RTL simulation)."""
    import time

    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.scheduler_fw.device_backend import measure_table, serve_stream

    rt = NetworkRuntime(cfg["qnet"], driver, bmax=cfg["bmax"], tau=cfg["tau"], timeout_s=cfg["timeout_s"])
    t0 = time.perf_counter()
    table = measure_table(rt, cfg["bundle"], batch_sizes=cfg["calib_sizes"], reps=cfg["calib_reps"],
                          warmup=cfg.get("calib_warmup", 1),
                          name=f"{cfg['model']} measured on {cfg['device']}")
    calib_s = time.perf_counter() - t0
    rt.saturation.saturated = [0] * len(rt.saturation.saturated)
    rt.saturation.total = [0] * len(rt.saturation.total)
    rep = serve_stream(rt, table, cfg["inputs"], cfg["labels"], cfg["policy"], cfg["rate"], cfg["slo_s"], cfg["seed"])
    rep["calibration_s"] = calib_s
    rep["segment_ms_b1_bmax"] = [[row[0] * 1e3, row[-1] * 1e3] for row in table.segment_seconds]
    rt.release()
    return rep


def serve_report(*, device: str, design: Any = None, model: str = "digits-ee", policy: str = "fluidb",
                 rate: float, slo_ms: float, samples: int = 200, tau: float = 0.8, bmax: int | None = None,
                 seed: int = 0, timeout_s: float | None = None) -> dict[str, Any]:
    """The report of `fluidnpu run` (also used by `fluidnpu flow`). `design`: a bundle path, a Bundle,
    or None for the model's default small design."""
    import numpy as np

    from fluidnpu.quantize import check_tau
    from fluidnpu.scheduler_fw.policy import check_positive
    from fluidnpu.scheduler_fw.registry import policy_spec

    policy = policy_spec(policy).name
    check_positive(rate, "--rate (samples/s)")
    check_positive(slo_ms, "--slo (ms)")
    check_tau(tau)
    if samples < 1:
        raise FluidError(f"--samples must be >= 1, got {samples}")
    if timeout_s is not None:
        check_positive(timeout_s, "--timeout (s)")
    if bmax is not None and not 1 <= bmax <= (64 if design else 16):
        raise FluidError(f"--bmax must be in 1..{64 if design else 16}, got {bmax}")
    if isinstance(design, str):  # a bad file is refused before the network is trained and quantised
        from fluidnpu.scheduler_fw.latency import load_design

        design_path, design = design, load_design(design)
    else:
        design_path = None
    _, qnet, xte, yte = load_network(model)
    if design_path is not None:
        bundle = design
        source = design_path
        _check_design(bundle, qnet)
    elif design is not None:
        bundle = design
        source = "given bundle"
        _check_design(bundle, qnet)
    else:
        from fluidnpu import digits_ee as D

        bundle = D.default_design(bmax or 4)
        source = (f"default: DSE of {qnet.workload.name} on {D.small_board().name} ({D.SMALL_DSP} DSPs, "
                  f"{D.SMALL_BRAM36} BRAM36, as docs/examples/zc706_16dsp.json), Bmax {bundle.bmax}")
    if bmax is not None and not 1 <= bmax <= bundle.bmax:
        raise FluidError(f"--bmax must be in 1..{bundle.bmax} (the design's Bmax), got {bmax}")
    idx = np.arange(samples) % len(xte)
    from fluidnpu.scheduler_fw.device_backend import calibration

    cfg = {"qnet": qnet, "bundle": bundle, "bmax": bmax or bundle.bmax, "tau": tau, "model": qnet.workload.name,
           "device": device, "inputs": list(xte[idx]), "labels": yte[idx].tolist(), "policy": policy, "rate": rate,
           "slo_s": slo_ms / 1e3, "seed": seed,
           "timeout_s": timeout_s or (2.0 if device == "model" else 600.0),
           **calibration(device, bmax or bundle.bmax)}
    if device == "model":
        from fluidnpu.host_driver.driver import NpuDriver
        from fluidnpu.host_driver.model_device import ModelDevice

        with NpuDriver(ModelDevice(bundle), bundle) as drv:
            rep = serve_on_driver(drv, cfg)
    else:
        from fluidnpu.host_driver.rtl_sim_device import run_with_rtl

        rep = run_with_rtl(bundle.data, serve_on_driver, cfg)
    TR, TP, TC = bundle.design
    return {"model": qnet.workload.name, "device": device, "design": {"TR": TR, "TP": TP, "TC": TC, "source": source}}\
        | rep
