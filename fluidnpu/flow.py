"""`fluidnpu flow`: the whole toolkit on the embedded default, one step after another (what `make run` runs).

1. DSE — the paper's setting: a 4-exit ResNet-50 on a ZC706, Bmax 8, fluid batching with Stackable PEs.
2. DSE — a network we can run end to end here: digits-ee (a 3-exit CNN trained on scikit-learn's digits),
   on a 16-DSP ZC706 cut-down board so that its RTL simulates in minutes.
3. RTL — that design as Verilog, a Vivado top wrapper and the register map (`fluidnpu rtl`), inside
   a scripted Vivado project for the board (`fluidnpu vivado`; building it needs Vivado).
4. Co-simulation — a few test images through the generated Verilog (cocotb + Verilator) and through the
   bit-accurate ModelDevice, by the same host driver: the exit logits must be bit-identical.
5. Serving — FluidB streams the test images at a Poisson rate through the NPU (ModelDevice, wall clock):
   latency, SLO violations, exit rates, accuracy, samples sent and answered.

Each step reads what the one before wrote (the design bundles), never re-deriving it. The summary at the
end says what happened in words a newcomer can follow, and where to go next.

What a person sees is one line as each step starts and that summary: the co-simulation's tools print
thousands of lines (Verilator's warnings on Yosys's Verilog, make's compile commands, cocotb's start-up
lines), which go to <out>/logs/cosim.log; if the step fails, the log's tail is printed and the error names
the log. `V=1` in the environment (`make run V=1`) shows them live instead.

`run_flow` is the library function; the `fluidnpu flow` command (fluidnpu/cli.py) calls it and prints
its report with `print_report`. Nothing here imports the command line.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.output import make_dir


def _step(out: Any, n: int, title: str) -> None:
    out.rule(f"[bold]{n}. {title}")


def main_design(outdir: Path, quiet: bool) -> dict[str, Any]:
    """Step 1: the paper's setting through the DSE; writes outdir/design.json."""
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result, design_summary
    from fluidnpu.design import explore_with_progress, load_model
    from fluidnpu.dse.search import DSEOptions

    result = explore_with_progress(load_model("resnet50"), load_board("zc706"), DSEOptions(bmax=8), quiet=quiet)
    bundle = bundle_from_result(result)
    path = outdir / "design.json"
    bundle.save(path)
    return {"bundle": bundle, "path": str(path), "summary": design_summary(bundle)}


def digits_design(outdir: Path, bmax: int) -> dict[str, Any]:
    """Step 2: digits-ee on the small board; writes outdir/digits/design.json."""
    from fluidnpu import digits_ee as D

    t0 = time.perf_counter()
    bundle = D.default_design(bmax)
    path = outdir / "digits" / "design.json"
    bundle.save(path)
    return {"bundle": bundle, "path": str(path), "seconds": time.perf_counter() - t0,
            "board": D.small_board().name, "dsp": D.SMALL_DSP}


def rtl(bundle: Any, outdir: Path) -> dict[str, Any]:
    """Step 3: `fluidnpu vivado` of the digits design: its RTL (`fluidnpu rtl`) and the scripted
    Vivado project around it, in outdir/digits/vivado."""
    from fluidnpu.hls_gen.vivado import write_vivado_project

    t0 = time.perf_counter()
    summary = write_vivado_project(bundle, outdir / "digits" / "vivado")
    return {"summary": summary, "dir": summary["outdir"], "seconds": time.perf_counter() - t0}


def cosim(bundle: Any, images: int, tau: float, verilog: Path | None = None,
          log_file: Path | None = None) -> dict[str, Any]:
    """Step 4: the same images through the RTL and ModelDevice; compares exits, predictions and logits.
    `verilog`: step 3's NPU Verilog, simulated as written (None: converted again). `log_file`: where the
    Verilator build and the simulator write (None: stderr)."""
    import numpy as np

    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.rtl_sim_device import run_with_rtl
    from fluidnpu.host_driver.runtime import infer_on_driver
    from fluidnpu.host_driver.serving import load_network

    _, qnet, xte, yte = load_network("digits-ee")
    x = xte[:images]
    t0 = time.perf_counter()
    hw = run_with_rtl(bundle, infer_on_driver, qnet, x, tau, bundle.bmax, verilog=verilog, log_file=log_file)
    rtl_s = time.perf_counter() - t0
    with NpuDriver(ModelDevice(bundle), bundle) as drv:
        model = infer_on_driver(drv, qnet, x, tau, bundle.bmax)
    identical = (hw["exit"] == model["exit"] and hw["pred"] == model["pred"]
                 and bool(np.array_equal(hw["logits"], model["logits"])))
    return {"images": images, "tau": tau, "bit_identical": identical, "exits": hw["exit"],
            "correct": int(sum(p == y for p, y in zip(hw["pred"], yte[:images].tolist()))),
            "rtl_cycles": hw["device_cycles"], "model_cycles": model["device_cycles"], "seconds": rtl_s,
            "log": None if log_file is None else str(log_file)}


def serve(bundle: Any, rate: float, slo_ms: float, samples: int) -> dict[str, Any]:
    """Step 5: FluidB on ModelDevice in wall-clock time (the `fluidnpu run` report)."""
    from fluidnpu.host_driver.serving import serve_report

    return serve_report(device="model", design=bundle, policy="fluidb", rate=rate, slo_ms=slo_ms, samples=samples)


def _timed(out: Any, n: int, title: str, fn: Callable[[], dict[str, Any]], quiet: bool) -> dict[str, Any]:
    if not quiet:
        _step(out, n, title)
    t0 = time.perf_counter()
    res = fn()
    res.setdefault("seconds", time.perf_counter() - t0)
    return res


def verbose_from_env() -> bool:
    """Whether the tools' own output is shown live: `V=1` (what `make run V=1` passes on)."""
    return os.environ.get("V", "") not in ("", "0")


def _tail(path: Path, lines: int = 40) -> str:
    with open(path, errors="replace") as fh:
        return "".join(deque(fh, maxlen=lines))


def _logged(n: int, title: str, log_file: Path | None, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`fn`, whose tools write to `log_file`; if it fails, the log's tail on stderr and an error naming it.
    The failures caught are the simulation's (a build that failed, a simulator missing or crashing, a
    cocotb test that failed); anything else is a bug and stays itself."""
    if log_file is None:
        return fn()
    log_file.unlink(missing_ok=True)   # the tools append: one run's log, not every run's
    try:
        return fn()
    except (AssertionError, RuntimeError) as exc:
        if log_file.exists():
            sys.stderr.write(f"--- the last lines of {log_file} ---\n{_tail(log_file)}--- end of {log_file} ---\n")
        msg = str(exc).strip()
        first = msg.splitlines()[0] if msg else type(exc).__name__
        raise FluidError(f"step {n} ({title}) failed: {first}; its whole log: {log_file}") from exc


def run_flow(outdir: str | Path, *, rate: float = 150.0, slo_ms: float = 50.0, samples: int = 450,
             cosim_images: int = 8, console: Any = None, verbose: bool | None = None) -> dict[str, Any]:
    """Every step of the flow into `outdir`; returns the report (`fluidnpu flow --json` prints it).
    `console`: where the step headings go (None: no headings). `verbose`: the co-simulation's tools print
    live instead of into outdir/logs/cosim.log (None: `verbose_from_env`)."""
    if cosim_images < 0:
        raise FluidError(f"--cosim-images must be >= 0, got {cosim_images}")
    quiet = console is None
    base = make_dir(outdir)
    log = None if (verbose_from_env() if verbose is None else verbose) else base / "logs" / "cosim.log"
    main = _timed(console, 1, "DSE: ResNet-50 (4 exits) on ZC706, Bmax 8", lambda: main_design(base, quiet), quiet)
    dig = _timed(console, 2, "DSE: digits-ee on a 16-DSP ZC706 (small enough to simulate)",
                 lambda: digits_design(base, 4), quiet)
    gen = _timed(console, 3, "RTL: Verilog, Vivado wrapper, register map, Vivado project",
                 lambda: rtl(dig["bundle"], base), quiet)
    co: dict[str, Any] | None = None
    if cosim_images:
        verilog = Path(gen["summary"]["files"]["rtl"]["npu_verilog"])
        co = _timed(console, 4, f"co-simulation: {cosim_images} images, RTL vs ModelDevice (first build: minutes)",
                    lambda: _logged(4, "co-simulation", log,
                                    lambda: cosim(dig["bundle"], cosim_images, 0.9999, verilog, log)), quiet)
        if not co["bit_identical"]:
            raise FluidError("the RTL and ModelDevice disagree on the co-simulation images: "
                             f"RTL exits {co['exits']}")
    srv = _timed(console, 5, f"serving: FluidB, {samples} images at {rate:g}/s, SLO {slo_ms:g} ms, on ModelDevice",
                 lambda: serve(dig["bundle"], rate, slo_ms, samples), quiet)
    return _report(main, dig, gen, co, srv)


def _report(main: dict, dig: dict, gen: dict, co: dict | None, srv: dict) -> dict[str, Any]:
    from fluidnpu.bundle import design_summary

    s = main["summary"]
    return {
        "main_design": {"path": main["path"], "design": s["design"], "gops_b1": s["gops"][0],
                        "gops_bmax": s["gops"][-1], "peak_gops": s["peak_gops"], "dsp": s["resources"]["dsp"],
                        "dsp_util": s["utilisation"].get("dsp"), "seconds": main["seconds"]},
        "digits_design": {"path": dig["path"], "board": dig["board"], "design": design_summary(dig["bundle"])["design"],
                          "bmax": dig["bundle"].bmax, "seconds": dig["seconds"]},
        "rtl": {"dir": gen["dir"], "seconds": gen["seconds"], "files": gen["summary"]["files"]["rtl"],
                "vivado": {k: v for k, v in gen["summary"]["files"].items() if k != "rtl"},
                "design_hash": gen["summary"]["design_hash"]},
        "cosim": co,
        "serving": {k: srv[k] for k in ("policy", "rate", "slo_ms", "sent", "answered", "rejected", "latency_ms",
                                       "slo_violations", "slo_violation_rate", "exit_rates", "accuracy",
                                       "throughput") if k in srv},
    }


def print_report(out: Any, r: dict[str, Any]) -> None:
    """The report of `run_flow` as one table and where to go next."""
    from rich.table import Table

    from fluidnpu.tables import print_table

    m, d, g, c, s = r["main_design"], r["digits_design"], r["rtl"], r["cosim"], r["serving"]
    t = Table(title="fluidnpu flow: what just happened", show_lines=True)
    t.add_column("step")
    t.add_column("result")

    def row(step: str, result: str, path: str = "") -> None:
        # where a step wrote goes under its result, whole: a path is one word that a column cannot wrap
        t.add_row(step, result + (f"\n→ {path}" if path else ""))

    md, dd = m["design"], d["design"]
    row("1. DSE, ResNet-50 on ZC706",
        f"best NPU <TR, TP, TC> = <{md['TR']}, {md['TP']}, {md['TC']}> with {md['NB']} input banks and "
        f"{md['ports']} AXI ports, "
        f"using {m['dsp']} DSPs "
        f"({100 * (m['dsp_util'] or 0):.1f} %): {m['gops_b1']:.0f} GOp/s at batch 1, {m['gops_bmax']:.0f} at "
        f"batch 8, of {m['peak_gops']:.0f} peak", m["path"])
    row("2. DSE, digits-ee on a 16-DSP board",
        f"<{dd['TR']}, {dd['TP']}, {dd['TC']}>, Bmax {d['bmax']}: small enough to simulate cycle by cycle",
        d["path"])
    row("3. RTL generation", f"Verilog + Vivado wrapper + register map in rtl/, and the Vivado project "
        f"scripts (build.sh needs Vivado) in {g['seconds']:.1f} s", g["dir"])
    if c is None:
        row("4. co-simulation", "skipped (--cosim-images 0)")
    else:
        row("4. co-simulation",
            f"{c['images']} images through the Verilog and the bit-accurate model: "
            f"{'[green]bit-identical[/]' if c['bit_identical'] else '[red]DIFFERENT[/]'} exit logits; "
            f"{c['correct']}/{c['images']} correct; {c['rtl_cycles']:,} NPU cycles "
            f"(model: {c['model_cycles']:,})", c.get("log") or "")
    lat = s.get("latency_ms", {})
    row("5. serving with FluidB",
        f"{s['answered']}/{s['sent']} answered; latency mean {lat.get('mean', float('nan')):.1f} ms, "
        f"p99 {lat.get('p99', float('nan')):.1f} ms; {100 * s['slo_violation_rate']:.1f} % over the "
        f"{s['slo_ms']:g} ms SLO; exits " + "/".join(f"{100 * e:.0f}" for e in s["exit_rates"])
        + f" %; accuracy {100 * (s.get('accuracy') or 0):.1f} %")
    print_table(out, t)
    out.print("Next: `fluidnpu show build/design.json --layers` (the FBCB per layer), "
              "`fluidnpu simulate -m resnet50 -b zc706 -p fluidb --rate 15 --slo 400` (the paper's scheduler "
              "against its baselines), `fluidnpu run --help` (serve on the RTL), "
              "`fluidnpu vivado build/design.json -o build/vivado` (the full-size NPU's Vivado project, a few "
              "minutes), docs/deploy.md (a real board).")

