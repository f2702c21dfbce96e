"""The in-root half of scripts/arm64_board_check.sh: run on the board's architecture (aarch64, under qemu-user),
it imports every board-side module and names what each pulls in beyond the board side, measures FluidB's
decision cost with benchmarks/bench_scheduler.py's own measurement, and prints one JSON object with those
figures and the test counts from pytest's JUnit XML. Run on the host as well (without --junit), it gives the
same decision cost there, which the in-root run embeds (--host) for a like-for-like ratio.

    python scripts/arm64_board_check.py --design design.json [--junit junit.xml] [--host host.json] [--repeat 5000]
    python scripts/arm64_board_check.py --summary docs/figures/arm64/board_check.json \\
        [--markdown docs/figures/arm64/board_check.md docs/deploy.md]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import re
import statistics
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# The code that runs on the board: register map, driver, devices, runtime, scheduler policies, the serving loop.
BOARD_SIDE = (
    "fluidnpu.hw.regmap", "fluidnpu.hw.descriptor", "fluidnpu.bundle",
    "fluidnpu.host_driver.device", "fluidnpu.host_driver.driver", "fluidnpu.host_driver.memory_plan",
    "fluidnpu.host_driver.model_device", "fluidnpu.host_driver.devmem_device", "fluidnpu.host_driver.pynq_device",
    "fluidnpu.host_driver.runtime", "fluidnpu.host_driver.serving",
    "fluidnpu.scheduler_fw.policy", "fluidnpu.scheduler_fw.samples", "fluidnpu.scheduler_fw.latency",
    "fluidnpu.scheduler_fw.fluidb", "fluidnpu.scheduler_fw.lazybatching", "fluidnpu.scheduler_fw.adaptive",
    "fluidnpu.scheduler_fw.preemptive", "fluidnpu.scheduler_fw.registry", "fluidnpu.scheduler_fw.backend",
    "fluidnpu.scheduler_fw.serving", "fluidnpu.scheduler_fw.device_backend",
    "fluidnpu.serving.protocol", "fluidnpu.serving.percentiles", "fluidnpu.serving.metrics",
    "fluidnpu.serving.engine", "fluidnpu.serving.http_api", "fluidnpu.serving.grpc_api", "fluidnpu.serving.server",
)
# What the board side must not import: heavy libraries, and the host-side parts of the project.
HEAVY = ("amaranth", "torch", "ray", "onnx", "cocotb", "cocotbext", "sklearn", "scipy", "matplotlib")
HOST_SIDE = ("fluidnpu.dse", "fluidnpu.sim_tb", "fluidnpu.hls_gen", "fluidnpu.scheduler_fw.experiments",
             "fluidnpu.scheduler_fw.fleet", "fluidnpu.scheduler_fw.gpu")


def _outside(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in HEAVY + HOST_SIDE)


def board_imports() -> dict:
    """Each board-side module imported in turn: what it brought in from outside the board side (attributed to
    the first board-side module that loaded it), and the modules that failed to import."""
    pulled: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    for name in BOARD_SIDE:
        before = set(sys.modules)
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing dependency is the finding, not a crash
            failed[name] = f"{type(exc).__name__}: {exc}"
        new = sorted(m for m in set(sys.modules) - before if _outside(m))
        if new:
            pulled[name] = new
    return {"modules": len(BOARD_SIDE), "failed": failed, "outside_board_side": pulled}


def decision_cost(design: Path, repeat: int) -> dict:
    """FluidB's decide() at an exit, as benchmarks/bench_scheduler.py measures it, on the bundle it uses."""
    from fluidnpu.bundle import load_bundle
    from fluidnpu.scheduler_fw.latency import LatencyTable

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scheduler.py"
    spec = importlib.util.spec_from_file_location("bench_scheduler", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    table = LatencyTable.from_bundle(load_bundle(design))
    costs = {}
    for n in (10, 1_000, 100_000):
        for preempt in (True, False):
            xs = bench.decision_cost(table, n, preempt, repeat)
            costs[f"queue={n},{'preempt' if preempt else 'continue'}"] = {
                "median_us": round(statistics.median(xs) * 1e6, 2),
                "p99_us": round(sorted(xs)[int(0.99 * len(xs))] * 1e6, 2)}
    return costs


def test_counts(junit: Path, rc: int, times: list[float]) -> dict:
    """Passed, failed (failures and errors) and skipped from pytest's JUnit XML, in all and per test file, with
    the seconds pytest gives each file; the whole run's wall and CPU seconds (measured around it by the shell)."""
    files: dict[str, dict] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        f = files.setdefault(case.get("classname", "?").replace(".", "/") + ".py",
                             {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0})
        outcome = {c.tag for c in case} & {"failure", "error", "skipped"}
        f["failed" if outcome - {"skipped"} else "skipped" if outcome else "passed"] += 1
        f["seconds"] = round(f["seconds"] + float(case.get("time", 0.0)), 1)
    total = {k: sum(f[k] for f in files.values()) for k in ("passed", "failed", "skipped")}
    return {**total, "pytest_rc": rc, "wall_s": times[0], "cpu_user_s": times[1], "cpu_sys_s": times[2],
            "by_file": files}


def summary(path: Path) -> None:
    """The figures of a finished check as a person reads them (what the shell script prints last)."""
    r = json.loads(path.read_text())
    t, imp = r["tests"], r["board_imports"]
    print(f"{r['machine']}: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped "
          f"in {t['wall_s']:.0f} s ({t['cpu_user_s'] + t['cpu_sys_s']:.0f} s CPU)")
    print(f"board-side modules: {imp['modules']} imported, {len(imp['failed'])} failed; "
          f"from outside the board side: {_outside_text(imp)}")
    print("FluidB decide() at an exit, median (p99) us:  aarch64 under qemu      host")
    for k, v, h in _costs(r):
        print(f"  {k:24s} {v['median_us']:9.2f} ({v['p99_us']:6.2f}) {h['median_us']:7.2f} ({h['p99_us']:5.2f})")
    print(f"figures: {path}")


def _outside_text(imp: dict) -> str:
    return "; ".join(f"{k} → {', '.join(v)}" for k, v in imp["outside_board_side"].items()) or "nothing"


def _costs(r: dict):
    """(queue=N,outcome, on the board's architecture, on the host) for each decision-cost case."""
    host = r["host"]["decision_cost_resnet50_zc706"]
    return [(k, v, host[k]) for k, v in r["decision_cost_resnet50_zc706"].items() if k != "repeat"]


def markdown(r: dict) -> str:
    """docs/deploy.md's block: the tests per file and the decision cost beside the host's."""
    t, imp = r["tests"], r["board_imports"]
    lines = ["| test file | passed | skipped | failed | s |", "|---|---|---|---|---|"]
    for name, f in t["by_file"].items():
        lines.append(f"| {name} | {f['passed']} | {f['skipped']} | {f['failed']} | {f['seconds']:.0f} |")
    lines += [f"| all, {t['cpu_user_s'] + t['cpu_sys_s']:.0f} s CPU | {t['passed']} | {t['skipped']} | "
              f"{t['failed']} | {t['wall_s']:.0f} |", "",
              textwrap.fill(f"{imp['modules']} board-side modules import there ({len(imp['failed'])} fail); "
                            f"from outside the board side they pull in: {_outside_text(imp)}.", 79), "",
              textwrap.fill(f"FluidB's `decide()` at an exit, µs, median / p99 of "
                            f"{r['decision_cost_resnet50_zc706']['repeat']:,} calls; arm64 root: {r['machine']}; "
                            f"host: {r['host']['machine']}:", 79), "",
              "| queue, outcome | aarch64 under qemu-user | x86-64 host |", "|---|---|---|"]
    for k, v, h in _costs(r):
        n, outcome = k.removeprefix("queue=").split(",")
        lines.append(f"| {int(n):,}, {outcome} | {v['median_us']:.1f} / {v['p99_us']:.1f} | "
                     f"{h['median_us']:.1f} / {h['p99_us']:.1f} |")
    return "\n".join(lines) + "\n"


def publish(path: Path, md: Path, page: Path) -> None:
    """Write the block to `md` and paste it into `page` between its include markers."""
    block = markdown(json.loads(path.read_text()))
    md.write_text(block)
    rel = md.resolve().relative_to(page.resolve().parent).as_posix()
    text = page.read_text()
    pat = re.compile(rf"(<!-- include:{re.escape(rel)} -->\n).*?(<!-- /include:{re.escape(rel)} -->)", re.S)
    if not pat.search(text):
        sys.exit(f"arm64-check: {page} has no <!-- include:{rel} --> markers")
    page.write_text(pat.sub(lambda m: m.group(1) + block + m.group(2), text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", type=Path, help="print a finished check's JSON for a person, and stop")
    ap.add_argument("--markdown", type=Path, nargs=2, metavar=("MD", "PAGE"),
                    help="with --summary: also write its Markdown block to MD and paste it into PAGE")
    ap.add_argument("--design", type=Path, help="the bundle the decision cost is measured on")
    ap.add_argument("--junit", type=Path, help="pytest's --junitxml output (the tests' counts)")
    ap.add_argument("--host", type=Path, help="this script's JSON from the host, embedded as `host`")
    ap.add_argument("--where", default="", help="how the machine runs, for the record (e.g. 'under qemu-user')")
    ap.add_argument("--pytest-rc", type=int, default=0)
    ap.add_argument("--pytest-times", type=float, nargs=3, default=[0.0, 0.0, 0.0], metavar=("WALL", "USER", "SYS"))
    ap.add_argument("--repeat", type=int, default=5000, help="decide() calls per queue length and outcome")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary)
        if args.markdown:
            publish(args.summary, *args.markdown)
        return
    if args.design is None:
        ap.error("--design is required")
    t0 = time.perf_counter()
    imports = board_imports()
    figure = {"machine": " ".join(filter(None, (platform.machine(), args.where))) + f", {os.cpu_count()} cores, "
                         f"Python {platform.python_version()}",
              "board_imports": imports,
              "decision_cost_resnet50_zc706": {"repeat": args.repeat, **decision_cost(args.design, args.repeat)}}
    if args.junit:
        figure["tests"] = test_counts(args.junit, args.pytest_rc, args.pytest_times)
    if args.host:
        figure["host"] = json.loads(args.host.read_text())
    figure["check_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(figure, indent=1))


if __name__ == "__main__":
    main()
