"""`fluidnpu gpu bench`: one seeded Poisson load against one batching policy on the staged engine.

Registered by fluidnpu/cli.py through `commands`. Torch is imported inside the
command; without it (or with --device cuda and no GPU) the command ends with
one line on stderr and exit code 2.
"""

from __future__ import annotations

import click

from fluidnpu.errors import FluidError
from fluidnpu.output import FloatRange


@click.group("gpu", short_help="Staged (DVABatch) and DP (TurboTransformers) batching on PyTorch.")
def gpu() -> None:
    """Batching policies on the staged PyTorch engine (CUDA, or CPU for checks)."""


@gpu.command("bench", short_help="Serve one seeded Poisson load with one policy; latency and throughput.")
@click.option("--workload", "-w", type=click.Choice(["bert", "cnn", "unet", "eecnn"]), required=True)
@click.option("--policy", "-p", type=click.Choice(["dva", "zerobatch", "delaybatch", "dp", "naive", "nobatch",
                                                   "dva-split", "dva-exit"]), required=True)
@click.option("--load", "load", default="medium", show_default=True,
              help="low|medium|high (1/4, 3/5, 9/10 of the profiled peak) or a rate in queries/s")
@click.option("--device", default="cuda", show_default=True, help="cuda or cpu")
@click.option("--duration", type=FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="seconds of arrivals")
@click.option("--size", type=click.Choice(["tiny", "small", "full"]), default=None,
              help="model size (default: full on cuda, tiny on cpu)")
@click.option("--lengths", default=None, help="bert length distribution: rte, sst2, mrpc, uniform-2-100, uniform-5-500")
@click.option("--bsmax", type=click.IntRange(1, 4096), default=64, show_default=True, help="largest batch")
@click.option("--stages", default=None, help="stages for dva: N, or auto for DVABatch's profiling search over "
              "up to 8 tries (default: 2 for bert, 4 for cnn/unet, as the paper's §8.7 found)")
@click.option("--window-ms", type=FloatRange(min=0), default=None,
              help="delaybatch window (default: half the bsmax batch time)")
@click.option("--trigger", type=click.Choice(["hungry", "lazy"]), default="hungry", show_default=True,
              help="dp scheduler trigger")
@click.option("--slo-ms", type=FloatRange(min=0, min_open=True), default=200.0, show_default=True,
              help="latency SLO (dp's half-SLO guard)")
@click.option("--cost-table", type=click.Path(dir_okay=False), default=None,
              help="dp: load the cached-cost table from here, or warm up and save it here")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="torch CPU threads (default 1 with --device cpu)")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def bench_cmd(workload, policy, load, device, duration, size, lengths, bsmax, stages, window_ms, trigger, slo_ms,
              cost_table, seed, threads, as_json) -> None:
    """Serve a seeded Poisson load of WORKLOAD with POLICY and report mean/p99 latency and throughput."""
    from fluidnpu.host_driver.staged.torchutil import device_name, require_torch
    from fluidnpu.output import emit_json as _emit_json, out

    torch = require_torch()
    if threads or device.strip().lower() == "cpu":   # CPU: one intra-op thread unless told otherwise
        torch.set_num_threads(int(threads or 1))
    if lengths is not None and workload != "bert":
        raise FluidError("--lengths applies to the bert workload")
    from fluidnpu.scheduler_fw.gpu.runner import make_trace, parse_load, serve_load
    from fluidnpu.scheduler_fw.gpu.setup import make_engine, make_policy, prepare

    parse_load(load, 1.0)   # a malformed --load fails before any profiling
    if policy == "dp" and workload != "bert":
        raise FluidError(f"dp batching needs a variable-length workload (bert), not {workload}")

    if stages is not None and str(stages).strip().lower() != "auto":
        try:
            stages = int(stages)
        except ValueError:
            raise FluidError(f"--stages must be a number or auto, got {stages!r}") from None
        if stages < 1:
            raise FluidError(f"--stages must be >= 1, got {stages}")
    bench = prepare(workload, device, size=size, seed=seed, bsmax=bsmax, lengths=lengths)
    stage_search = None
    if isinstance(stages, str):
        stages, stage_search = bench.search_stages(bsmax, duration_s=min(duration, 2.0), seed=seed)
    pol, prof = make_policy(bench, policy, bsmax, stages, None if window_ms is None else window_ms / 1e3,
                            cost_table, trigger, slo_ms / 1e3)
    peak = bench.peak(bsmax)
    rate = parse_load(load, peak)
    arrivals, payloads = make_trace(bench.spec, rate, duration, seed)
    engine = make_engine(bench, prof, max(bsmax, pol.bsmax))
    res = serve_load(bench.spec, pol, engine, arrivals, payloads, drain_s=max(30.0, 3 * duration))
    summary = {**res.summary(), "load": str(load), "profiled_peak_qps": peak, "gpu": device_name(bench.device),
               "stage_bounds": [list(b) for b in prof.bounds], "stage_search": stage_search}
    if as_json:
        _emit_json(summary)
        return
    from rich.table import Table

    t = Table(title=f"{workload} / {policy} on {summary['gpu']} at {rate:.1f} q/s ({load})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k in ("sent", "answered", "failed", "unanswered", "mean_latency_ms", "p99_latency_ms", "throughput_qps",
              "overhead_per_stage_ms", "stage_executions"):
        v = summary.get(k)
        t.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    out.print(t)


commands = [gpu]
