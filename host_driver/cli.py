"""`fluidnpu run`: stream samples through a scheduling policy on a device, in wall-clock time.

    fluidnpu run --device model|rtl [--design design.json] --model digits-ee --rate R --slo S \
                 [--samples N] [--policy fluidb] [--tau 0.8] [--json]

The network is quantised to 16-bit fixed point (fluidnpu/quantize.py), the
scheduler's latency table is measured on the device at start-up, and the
test split of the digits data set is streamed at Poisson rate R. With
`--device rtl` the whole serving loop runs inside the cocotb + Verilator
simulation of the design's generated Verilog (host_driver/rtl_sim_device.py).
Registered by fluidnpu/cli.py through `commands`.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import click

from fluidnpu.errors import FluidError

MODELS = ("digits-ee",)


@functools.lru_cache(maxsize=None)
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


def serve_on_driver(driver: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The whole run on one NpuDriver (module-level: it also runs inside the RTL simulation)."""
    import time

    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.scheduler_fw.device_backend import measure_table, serve_stream

    rt = NetworkRuntime(cfg["qnet"], driver, bmax=cfg["bmax"], tau=cfg["tau"], timeout_s=cfg["timeout_s"])
    t0 = time.perf_counter()
    table = measure_table(rt, cfg["bundle"], batch_sizes=cfg["calib_sizes"], reps=cfg["calib_reps"],
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
                 rate: float, slo_ms: float, samples: int = 200, tau: float = 0.8, bmax: Optional[int] = None,
                 seed: int = 0, timeout_s: Optional[float] = None) -> dict[str, Any]:
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
    _, qnet, xte, yte = load_network(model)
    if isinstance(design, str):
        from fluidnpu.scheduler_fw.latency import load_design

        bundle = load_design(design)
        source = design
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
    cfg = {"qnet": qnet, "bundle": bundle, "bmax": bmax or bundle.bmax, "tau": tau, "model": qnet.workload.name,
           "device": device, "inputs": list(xte[idx]), "labels": yte[idx].tolist(), "policy": policy, "rate": rate,
           "slo_s": slo_ms / 1e3, "seed": seed,
           "timeout_s": timeout_s or (2.0 if device == "model" else 600.0),
           "calib_sizes": None if device == "model" else [1, bmax or bundle.bmax],
           "calib_reps": 5 if device == "model" else 1}
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


@click.command("run", short_help="Stream samples through a policy on a device (ModelDevice or RTL sim).")
@click.option("--device", "device", type=click.Choice(["model", "rtl"]), default="model", show_default=True,
              help="model: bit-accurate numpy NPU; rtl: the generated Verilog under cocotb + Verilator")
@click.option("--design", type=click.Path(dir_okay=False), default=None,
              help="design bundle (default: the DSE of the model on a 16-DSP ZC706-like board)")
@click.option("--model", "-m", default="digits-ee", show_default=True, help="runtime model: digits-ee")
@click.option("--policy", "-p", default="fluidb", show_default=True,
              help="fluidb, lazybatching, serial, fc-/r-adaptb-s|m|l")
@click.option("--rate", type=float, required=True, help="mean Poisson arrival rate (samples/s)")
@click.option("--slo", type=float, required=True, help="latency SLO (ms)")
@click.option("--samples", type=int, default=200, show_default=True, help="samples streamed (test split, cycled)")
@click.option("--tau", type=float, default=0.8, show_default=True, help="exit threshold on softmax top-1")
@click.option("--bmax", type=int, default=None,
              help="largest batch (default: the design's; without --design the default design is DSE'd at it, default 4)")
@click.option("--seed", type=int, default=0, show_default=True, help="arrival-time seed")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="per-subnet device timeout in s (default 2 for model, 600 for rtl)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def run_cmd(device: str, design: Optional[str], model: str, policy: str, rate: float, slo: float, samples: int,
            tau: float, bmax: Optional[int], seed: int, timeout_s: Optional[float], as_json: bool) -> None:
    """Serve SAMPLES test images at Poisson RATE with POLICY on a device, in wall-clock time."""
    from fluidnpu.cli import _emit_json, out

    rep = serve_report(device=device, design=design, model=model, policy=policy, rate=rate, slo_ms=slo,
                       samples=samples, tau=tau, bmax=bmax, seed=seed, timeout_s=timeout_s)
    if as_json:
        _emit_json(rep)
        return
    _print_report(out, rep)


def _print_report(out: Any, rep: dict[str, Any]) -> None:
    from rich.table import Table

    d = rep["design"]
    out.print(f"[bold]{rep['policy']}[/] on {rep['model']}, device [bold]{rep['device']}[/], "
              f"<TR, TP, TC> = <{d['TR']}, {d['TP']}, {d['TC']}> ({d['source']}), Bmax {rep['bmax']}, "
              f"tau {rep['tau']:g}")
    out.print(f"{rep['rate']:g} samples/s Poisson, SLO {rep['slo_ms']:g} ms; latency table measured on the device "
              f"in {rep.get('calibration_s', 0):.2f} s (segment ms at b=1 / Bmax: "
              + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in rep.get("segment_ms_b1_bmax", [])) + ")")
    t = Table(title="wall-clock serving")
    t.add_column("metric")
    t.add_column("value", justify="right")
    lat = rep.get("latency_ms", {})
    rows = [("sent / rejected / answered", f"{rep['sent']} / {rep['rejected']} / {rep['answered']}"),
            ("device errors", str(rep.get("errors", 0)))]
    if lat:
        rows += [("latency mean / p50 / p90 / p99 / max",
                  " / ".join(f"{lat[k]:.2f}" for k in ("mean", "p50", "p90", "p99", "max")) + " ms"),
                 ("SLO violations", f"{rep['slo_violations']} ({100 * rep['slo_violation_rate']:.2f} %)"),
                 ("exit rates", ", ".join(f"{100 * r:.1f} %" for r in rep["exit_rates"])),
                 ("accuracy", f"{100 * rep['accuracy']:.2f} %" if rep.get("accuracy") is not None else "-"),
                 ("throughput", f"{rep['throughput']:.1f} samples/s over {rep['wall_s']:.2f} s"),
                 ("runs / mean batch / max batch", f"{rep['runs']} / {rep['mean_run_batch']:.2f} / "
                                                   f"{rep['max_run_batch']}"),
                 ("preemptions", str(rep["preemptions"])),
                 ("int16 saturations", str(sum(rep["saturation"].values())))]
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


commands = [run_cmd]
