"""`fluidnpu run`: stream samples through a scheduling policy on a device, in wall-clock time.

    fluidnpu run --device model|rtl [--design design.json] --model digits-ee --rate R --slo S \
                 [--samples N] [--policy fluidb] [--tau 0.8] [--json]

The serving itself is host_driver/serving.py's `serve_report`. Registered by
fluidnpu/cli.py through `commands`.
"""

from __future__ import annotations

from typing import Any

import click

from fluidnpu.host_driver.serving import serve_report
from fluidnpu.output import MAX_BATCH, MAX_SAMPLES, FloatRange, emit_json, out


@click.command("run", short_help="Stream samples through a policy on a device (ModelDevice or RTL sim).")
@click.option("--device", "device", type=click.Choice(["model", "rtl"]), default="model", show_default=True,
              help="model: bit-accurate numpy NPU; rtl: the generated Verilog under cocotb + Verilator")
@click.option("--design", type=click.Path(dir_okay=False), default=None,
              help="design bundle (default: the DSE of the model on a 16-DSP ZC706-like board)")
@click.option("--model", "-m", default="digits-ee", show_default=True, help="runtime model: digits-ee")
@click.option("--policy", "-p", default="fluidb", show_default=True,
              help="fluidb, lazybatching, serial, fc-/r-adaptb-s|m|l")
@click.option("--rate", type=FloatRange(min=0, min_open=True), required=True,
              help="mean Poisson arrival rate (samples/s)")
@click.option("--slo", type=FloatRange(min=0, min_open=True), required=True, help="latency SLO (ms)")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=200, show_default=True,
              help="samples streamed (test split, cycled)")
@click.option("--tau", type=float, default=0.8, show_default=True, help="exit threshold on softmax top-1")
@click.option("--bmax", type=click.IntRange(1, MAX_BATCH), default=None,
              help="largest batch (default: the design's; without --design the default design is DSE'd at it, "
                   "default 4)")
@click.option("--seed", type=int, default=0, show_default=True, help="arrival-time seed")
@click.option("--timeout", "timeout_s", type=FloatRange(min=0, min_open=True), default=None,
              help="per-subnet device timeout in s (default 2 for model, 600 for rtl)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def run_cmd(device: str, design: str | None, model: str, policy: str, rate: float, slo: float, samples: int,
            tau: float, bmax: int | None, seed: int, timeout_s: float | None, as_json: bool) -> None:
    """Serve SAMPLES test images at Poisson RATE with POLICY on a device, in wall-clock time."""
    rep = serve_report(device=device, design=design, model=model, policy=policy, rate=rate, slo_ms=slo,
                       samples=samples, tau=tau, bmax=bmax, seed=seed, timeout_s=timeout_s)
    if as_json:
        emit_json(rep)
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
