"""Benchmark of `fluidnpu serve` on loopback against in-process `fluidnpu run` at the same rate.

    python benchmarks/bench_serving.py [--rate 400] [--duration 5] [--out docs/figures/serving]

Starts `fluidnpu serve --device model` as a real process (127.0.0.1, free
ports), then drives it with `fluidnpu edge` (tritonclient) over HTTP JSON,
HTTP binary and gRPC streams at RATE requests/s, one sample per request;
then a sustained run at 1,100 samples/s offered over gRPC streams for 10 s
(the target is >= 1,000 answered per second, nothing rejected), and two overload
runs with the server's resident memory before and after: 5,000/s offered to the
default design under --pace board (whose modelled board is faster than the host:
the server's CPU is the capacity, and a client on the same cores offers ~1.4x it),
and 10x the capacity of a slow board (digits-ee DSE'd for 1 DSP at 1.5 MHz, ~110
samples/s, --pace board, SLO 200 ms), the issue's overload test. Prints a table and writes
serving.json and serving.md to --out. Figures: requests/s answered, client
p50/p99, the server's own overhead per request (handling time minus the
scheduler's admission-to-exit time, from the response parameters), and the
host's load average over each run (the machine is shared: other jobs' load
shows there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

SUSTAINED = 1100.0
OVERLOAD = "overload: 5000/s offered for 10 s, --max-queue 16"
# A board slow enough that a client on the same cores can offer 10x its capacity: digits-ee DSE'd for one
# DSP at 1.5 MHz (~110 samples/s), served with --pace board so each run takes the board's modelled time.
SLOW_DSP, SLOW_CLOCK_MHZ, SLOW_SLO_MS = 1, 1.5, 200.0


def slow_board_design(path: Path) -> float:
    """Write the slow board's design bundle to `path`; returns its full-batch capacity (samples/s)."""
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.digits_ee import digits_ee, small_board
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.scheduler_fw.latency import LatencyTable

    bundle = bundle_from_result(explore(digits_ee(), small_board(SLOW_DSP), DSEOptions(bmax=4,
                                                                                     clock_mhz=SLOW_CLOCK_MHZ)))
    bundle.save(path)
    return LatencyTable.from_bundle(bundle).full_batch_capacity()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*args: str) -> tuple[subprocess.Popen, dict, int]:
    gport = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fluidnpu.cli", "serve", "--http-port", "0", "--grpc-port",
                             str(gport), "--json", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = [""]
    t = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
    t.start()
    t.join(120)
    if not line[0]:
        proc.kill()
        raise SystemExit(f"server did not start: {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line[0]), gport


def stop_server(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"server exited {proc.returncode}: {err[-2000:]}")
    return json.loads(out)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    from fluidnpu.host_driver.serving import serve_report
    from fluidnpu.serving.edge import run_swarm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=400.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--slo", type=float, default=50.0)
    ap.add_argument("--out", default="docs/figures/serving")
    a = ap.parse_args()
    con = Console()
    rows: dict[str, dict] = {}
    with Progress(console=con) as prog:
        task = prog.add_task("serving benchmark", total=7)
        n = int(a.rate * a.duration)
        rep = serve_report(device="model", rate=a.rate, slo_ms=a.slo, samples=n)
        rows["in-process fluidnpu run"] = {"sent": rep["sent"], "answered": rep["answered"], "rejected": 0,
                                           "lost": rep["sent"] - rep["answered"] - rep["rejected"],
                                           "answered_per_s": rep["throughput"],
                                           "p50_ms": rep["latency_ms"]["p50"], "p99_ms": rep["latency_ms"]["p99"],
                                           "overhead_p50_ms": None, "overhead_p99_ms": None,
                                           "load_avg": os.getloadavg()[0]}
        prog.advance(task)
        proc, info, gport = start_server("--slo", str(a.slo), "--max-queue", "256")
        try:
            for name, proto, url in (("HTTP JSON", "http-json", f"127.0.0.1:{info['http_port']}"),
                                     ("HTTP binary", "http", f"127.0.0.1:{info['http_port']}"),
                                     ("gRPC stream", "grpc-stream", f"127.0.0.1:{gport}")):
                r = run_swarm(url, protocol=proto, devices=8, rate=a.rate, duration_s=a.duration, slo_ms=a.slo)
                rows[name] = _row(r)
                prog.advance(task)
            r = run_swarm(f"127.0.0.1:{gport}", protocol="grpc-stream", devices=8, rate=SUSTAINED,
                          duration_s=max(a.duration, 10.0), slo_ms=a.slo)
            rows[f"gRPC stream, {SUSTAINED:g}/s offered for 10 s"] = _row(r)
            prog.advance(task)
        finally:
            final = stop_server(proc)
        proc, info, gport = start_server("--slo", str(a.slo), "--max-queue", "16", "--pace", "board")
        try:
            rss0 = rss_kib(proc.pid)
            r = run_swarm(f"127.0.0.1:{gport}", protocol="grpc-stream", devices=8, rate=5000.0,
                          duration_s=10.0, slo_ms=a.slo)
            rss1 = rss_kib(proc.pid)
            rows[OVERLOAD] = _row(r) | {
                "server_rss_mib_before": rss0 / 1024, "server_rss_mib_after": rss1 / 1024,
                "server_p99_ms": r["server_latency_ms"]["p99"], "rejected_by_reason": r["rejected_by_reason"]}
            prog.advance(task)
        finally:
            final_overload = stop_server(proc)
        with tempfile.TemporaryDirectory() as tmp:
            design = Path(tmp) / "slow.json"
            capacity = slow_board_design(design)
            name = (f"overload: 10x a slow board's capacity ({capacity:.0f}/s: 1 DSP at {SLOW_CLOCK_MHZ:g} MHz), "
                    f"10 s, SLO {SLOW_SLO_MS:g} ms, --max-queue 16")
            proc, info, gport = start_server("--design", str(design), "--slo", str(SLOW_SLO_MS), "--max-queue", "16",
                                             "--pace", "board")
            try:
                rss0 = rss_kib(proc.pid)
                r = run_swarm(f"127.0.0.1:{gport}", protocol="grpc-stream", devices=8, rate=10 * capacity,
                              duration_s=10.0, slo_ms=SLOW_SLO_MS)
                rss1 = rss_kib(proc.pid)
                rows[name] = _row(r) | {
                    "capacity_per_s": capacity, "offered_per_s": r["sent"] / 10.0,
                    "server_rss_mib_before": rss0 / 1024, "server_rss_mib_after": rss1 / 1024,
                    "server_p99_ms": r["server_latency_ms"]["p99"], "rejected_by_reason": r["rejected_by_reason"]}
                prog.advance(task)
            finally:
                stop_server(proc)
    machine = (f"{platform.machine()}, {platform.processor() or platform.node()}, Python {platform.python_version()}, "
               f"{os.cpu_count()} logical CPUs")
    from rich.table import Table

    t = Table(title=f"fluidnpu serve on loopback, ModelDevice, digits-ee, {a.rate:g} req/s offered, SLO {a.slo:g} ms")
    for c in ("path", "sent", "answered", "rejected", "lost", "answered/s", "p50 ms", "p99 ms",
              "server overhead p50/p99 ms"):
        t.add_column(c)
    md = ["| path | sent | answered | rejected | lost | answered/s | p50 ms | p99 ms | server overhead p50 / p99 ms "
          "| server p99 ms | load avg |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, r in rows.items():
        ov = "-" if r["overhead_p50_ms"] is None else f"{r['overhead_p50_ms']:.3f} / {r['overhead_p99_ms']:.3f}"
        cells = [k, str(r["sent"]), str(r["answered"]), str(r["rejected"]), str(r["lost"]),
                 f"{r['answered_per_s']:.1f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", ov]
        t.add_row(*cells)
        sp = r.get("server_p99_ms_all")
        md.append("| " + " | ".join(cells + ["-" if sp is None else f"{sp:.2f}", f"{r['load_avg']:.1f}"]) + " |")
    con.print(t)
    ov = rows[OVERLOAD]
    con.print(f"overload: server RSS {ov['server_rss_mib_before']:.1f} -> {ov['server_rss_mib_after']:.1f} MiB, "
              f"admitted p99 in the server {ov['server_p99_ms']:.2f} ms, rejected {ov['rejected_by_reason']}")
    slow = rows[name]
    con.print(f"slow board: capacity {slow['capacity_per_s']:.0f}/s, offered {slow['offered_per_s']:.0f}/s "
              f"({slow['offered_per_s'] / slow['capacity_per_s']:.1f}x), server RSS {slow['server_rss_mib_before']:.1f}"
              f" -> {slow['server_rss_mib_after']:.1f} MiB, admitted p99 in the server {slow['server_p99_ms']:.2f} ms "
              f"(SLO {SLOW_SLO_MS:g}), rejected {slow['rejected_by_reason']}, lost {slow['lost']}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving.json").write_text(json.dumps({"machine": machine, "rate": a.rate, "slo_ms": a.slo, "rows": rows,
                                                  "server_counters": final["counters"],
                                                  "overload_server_counters": final_overload["counters"]},
                                                 indent=1))
    (out / "serving.md").write_text(f"Machine: {machine}\n\n" + "\n".join(md) + "\n")
    con.print(f"wrote {out}/serving.json and serving.md ({machine})")


def _row(r: dict) -> dict:
    return {"sent": r["sent"], "answered": r["answered"], "rejected": r["rejected"], "lost": r["lost"],
            "errors": r["errors"], "answered_per_s": r["answered_per_s"], "p50_ms": r["latency_ms"]["p50"] or 0.0,
            "p99_ms": r["latency_ms"]["p99"] or 0.0, "overhead_p50_ms": r["overhead_ms"]["p50"],
            "overhead_p99_ms": r["overhead_ms"]["p99"], "server_p50_ms": r["server_latency_ms"]["p50"],
            "server_p99_ms_all": r["server_latency_ms"]["p99"],
            "load_avg": os.getloadavg()[0]}        # the host's 1-min load average right after the run


if __name__ == "__main__":
    main()
