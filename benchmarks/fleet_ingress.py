"""The fleet's KServe v2 ingress on Ray Serve (`fluidnpu serve --fleet`): requests/s and overhead.

Three emulated boards on a local Ray (two ZC706 boards with a ResNet-50 design, one small board with
digits-ee's own design), the sessions digits-ee (RATE req/s, SLO 200 ms) and ResNet-50 (2 req/s, SLO 3 s).
CLIENTS threads send digits-ee requests back to back (one sample each, JSON tensors) for SECONDS, and one
more thread sends a ResNet-50 request (emulated: no weights) every 0.5 s. Prints requests/s answered, the
client's latency, and from the responses' parameters the ingress's overhead (overhead_ms: the ingress
replica's time minus the device's, i.e. decoding, the Ray RPC to the device actor and back, encoding;
client_overhead_ms: the client's latency minus the device's, adding HTTP and Serve's proxy) against the
modelled batch time and the device's time (its arrival at the actor to its batch's end: the wait for its
session's slot in the duty cycle, then the batch). The clients share the host's CPUs
with Ray, so on a small machine the figures are a floor.

    python benchmarks/fleet_ingress.py [--clients 8] [--seconds 20] [--rate 200] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

from fluidnpu.serving.percentiles import percentiles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(d: Path, rate: float) -> None:
    from fluidnpu import digits_ee as D
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.design import load_model
    from fluidnpu.dse.search import DSEOptions, evaluate_design

    bundle_from_result(evaluate_design(load_model("resnet50"), load_board("zc706"), 3992, 14, 64,
                                       DSEOptions(bmax=8), allow_oversize=True)).save(d / "r50.json")
    D.default_design(4).save(d / "dg.json")
    (d / "fleet.json").write_text(json.dumps({"devices": [{"name": "zc706-r50", "design": "r50.json", "count": 2},
                                                          {"name": "small-dg", "design": "dg.json", "count": 1}]}))
    (d / "sessions.json").write_text(json.dumps([{"model": "digits-ee", "rate": rate, "slo_ms": 200},
                                                 {"model": "resnet50", "rate": 2, "slo_ms": 3000}]))


def _wait_ready(port: int, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v2/health/ready")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _client(port: int, model: str, bodies: list[bytes], until: float, pause_s: float, rows: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    i = 0
    while time.monotonic() < until:
        t = time.monotonic()
        conn.request("POST", f"/v2/models/{model}/infer", body=bodies[i % len(bodies)],
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        payload = json.loads(r.read())
        rows.append((r.status, time.monotonic() - t, payload.get("parameters", {})))
        i += 1
        if pause_s:
            time.sleep(pause_s)
    conn.close()


def _pct(xs: list[float]) -> dict[str, float]:
    return percentiles(xs, digits=2, empty=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=200.0, help="digits-ee's planned rate (req/s)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    from fluidnpu.cli import main as cli
    from fluidnpu.host_driver.serving import load_network
    from fluidnpu.serving.protocol import input_contract

    _, _, xte, _ = load_network("digits-ee")
    xte = input_contract("digits-ee", xte.shape[1:]).to_wire(xte)      # raw pixels 0-16, as a client sends
    digits = [json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1],
                                      "data": x.ravel().tolist()}]}).encode() for x in xte[:64]]
    r50 = [json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 224, 224, 3],
                                   "data": [0.0] * (224 * 224 * 3)}]}).encode()]
    rows: dict[str, list] = {"digits-ee": [], "resnet50": []}
    port = _free_port()
    warmup_s = 3.0
    stop_after = 600.0

    def drive() -> None:
        if not _wait_ready(port, 300):
            return
        time.sleep(warmup_s)
        until = time.monotonic() + args.seconds
        threads = [threading.Thread(target=_client, args=(port, "digits-ee", digits, until, 0.0, rows["digits-ee"]))
                   for _ in range(args.clients)]
        threads.append(threading.Thread(target=_client, args=(port, "resnet50", r50, until, 0.5, rows["resnet50"])))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows["elapsed"] = [time.monotonic() - t0]
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)          # the server drains and returns

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _files(d, args.rate)
        threading.Thread(target=drive, daemon=True).start()
        try:
            cli(["serve", "--fleet", str(d / "fleet.json"), "--sessions", str(d / "sessions.json"),
                 "--http-port", str(port), "--stop-after", str(stop_after)])
        except SystemExit:
            pass
    elapsed = rows.pop("elapsed", [float("nan")])[0]
    out: dict = {"clients": args.clients, "seconds": round(elapsed, 2), "digits_rate_planned": args.rate}
    for model, rs in rows.items():
        ok = [r for r in rs if r[0] == 200]
        out[model] = {"requests": len(rs), "answered": len(ok), "per_s": round(len(ok) / elapsed, 1),
                      "client_ms": _pct([1e3 * r[1] for r in ok]),
                      "overhead_ms": _pct([r[2]["overhead_ms"] for r in ok]),
                      "client_overhead_ms": _pct([1e3 * r[1] - r[2]["device_ms"] for r in ok]),
                      "device_ms": _pct([r[2]["device_ms"] for r in ok]),
                      "modelled_ms": _pct([r[2]["modelled_ms"] for r in ok]),
                      "batch": _pct([r[2]["batch"] for r in ok]),
                      "statuses": sorted({r[0] for r in rs})}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
