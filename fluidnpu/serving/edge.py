"""`fluidnpu edge`: a swarm of simulated edge devices sending the test split to a KServe v2 server.

Built on tritonclient, so it is also the reference client: each device is a
thread with its own client. Arrival times are drawn up front (Poisson at
rate/devices per device, or bursty: the same mean with on/off phases at 5x
the rate for a fifth of each second). With `--protocol http` a device sends
one request at a time (an edge camera waits for its answer; `http` sends
binary tensors, `http-json` pure JSON); with
`grpc-stream` each device holds one bidirectional stream and sends at its
arrival times without waiting (open loop). Every request ends answered,
rejected (with the server's reason) or an error, and the report says how
many of each, with latency p50/p99 (client side, and the server's own
`server_ms` from the response parameters: an overloaded client's queueing
shows in the first only), SLO violations (client side) and accuracy.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

from fluidnpu.errors import FluidError

PROTOCOLS = ("http", "http-json", "grpc-stream")
_REASON = re.compile(r"rejected \((\w+)\)")


def arrival_times(n_devices: int, rate: float, duration_s: float, pattern: str, seed: int) -> list[np.ndarray]:
    """Send offsets (s) of each device: total mean rate `rate` over `duration_s`."""
    rng = np.random.default_rng([int(seed), 12])
    per = rate / n_devices
    out = []
    for _ in range(n_devices):
        if pattern == "poisson":
            t = np.cumsum(rng.standard_exponential(int(per * duration_s * 2 + 20)) / per)
        else:   # bursty: 5x the rate in the first 0.2 s of every second, nothing in the rest
            t = np.cumsum(rng.standard_exponential(int(per * duration_s * 2 + 20)) / (5 * per))
            t = np.floor(t / 0.2) + (t % 0.2)          # each 0.2 s of "burst time" maps into one second
        out.append(t[t < duration_s])
    return out


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: list[float] = []
        self.correct = 0
        self.rejected: dict[str, int] = {}
        self.errors: list[str] = []
        self.sent = 0
        self.exits: dict[int, int] = {}
        self.violations = 0
        self.server_ms: list[float] = []
        self.sched_ms: list[float] = []

    def answered(self, latency: float, cls: np.ndarray, ex: np.ndarray, label: int, slo_s: float,
                 server_ms: float, sched_ms: float) -> None:
        with self.lock:
            self.lat.append(latency)
            self.server_ms.append(server_ms)
            self.sched_ms.append(sched_ms)
            self.correct += int(int(cls[0]) == label)
            self.exits[int(ex[0])] = self.exits.get(int(ex[0]), 0) + 1
            self.violations += int(latency > slo_s)

    def failed(self, msg: str) -> None:
        m = _REASON.search(msg)
        with self.lock:
            if m:
                self.rejected[m.group(1)] = self.rejected.get(m.group(1), 0) + 1
            else:
                self.errors.append(msg.strip().splitlines()[0][:200] if msg.strip() else "error")


def run_swarm(url: str, *, protocol: str = "grpc-stream", devices: int = 4, rate: float = 200.0,
              duration_s: float = 5.0, pattern: str = "poisson", model: str = "digits-ee",
              token: Optional[str] = None, deadline_ms: Optional[float] = None, slo_ms: float = 50.0,
              seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Run the swarm against `url` (host:port of HTTP or gRPC, by `protocol`) and report."""
    from fluidnpu.host_driver.serving import load_network

    if devices < 1 or rate <= 0 or duration_s <= 0:
        raise FluidError("--devices, --rate and --duration must be > 0")
    if protocol not in PROTOCOLS:
        raise FluidError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if pattern not in ("poisson", "bursty"):
        raise FluidError(f"--pattern must be poisson or bursty, got {pattern!r}")
    _, _, xte, yte = load_network(model)
    xte = np.ascontiguousarray(xte, dtype=np.float32)
    times = arrival_times(devices, rate, duration_s, pattern, seed)
    tally = _Tally()
    slo_s = (deadline_ms or slo_ms) / 1e3
    headers = {"Authorization": f"Bearer {token}"} if token else None
    params = {"deadline_ms": float(deadline_ms)} if deadline_ms else None
    t0 = time.monotonic() + 0.2
    worker = _grpc_device if protocol == "grpc-stream" else _http_device
    threads = [threading.Thread(target=worker, args=(url, model, xte, yte, ts, d, t0, tally, headers, params,
                                                     slo_s, protocol == "http"), daemon=True)
               for d, ts in enumerate(times)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(duration_s + 60)
    wall = time.monotonic() - t0
    lat = np.asarray(tally.lat) * 1e3
    n_ans = len(tally.lat)
    n_rej = sum(tally.rejected.values())
    return {"protocol": protocol, "devices": devices, "rate": rate, "pattern": pattern, "duration_s": duration_s,
            "sent": tally.sent, "answered": n_ans, "rejected": n_rej, "rejected_by_reason": tally.rejected,
            "errors": len(tally.errors), "error_messages": sorted(set(tally.errors))[:3],
            "lost": tally.sent - n_ans - n_rej - len(tally.errors),
            "answered_per_s": n_ans / wall if wall > 0 else 0.0,
            "latency_ms": {"p50": float(np.percentile(lat, 50)) if n_ans else None,
                           "p99": float(np.percentile(lat, 99)) if n_ans else None,
                           "max": float(lat.max()) if n_ans else None},
            "server_latency_ms": {"p50": float(np.percentile(tally.server_ms, 50)) if n_ans else None,
                                  "p99": float(np.percentile(tally.server_ms, 99)) if n_ans else None},
            "overhead_ms": {"p50": float(np.percentile(np.subtract(tally.server_ms, tally.sched_ms), 50))
                            if n_ans else None,
                            "p99": float(np.percentile(np.subtract(tally.server_ms, tally.sched_ms), 99))
                            if n_ans else None},
            "queue_to_exit_ms": {"p50": float(np.percentile(tally.sched_ms, 50)) if n_ans else None,
                                 "p99": float(np.percentile(tally.sched_ms, 99)) if n_ans else None},
            "slo_ms": slo_s * 1e3, "slo_violations": tally.violations,
            "accuracy": tally.correct / n_ans if n_ans else None,
            "exits": {str(k): v for k, v in sorted(tally.exits.items())}}


def _paced(ts: np.ndarray, t0: float, dev: int, n_images: int) -> Iterator[tuple[int, int]]:
    """(request k, test image j) of device `dev`, each yielded at its scheduled time t0 + ts[k]; devices
    walk the test split from different places."""
    for k, t in enumerate(ts):
        dt = t0 + t - time.monotonic()
        if dt > 0:
            time.sleep(dt)
        yield k, (dev * 7919 + k) % n_images


def _http_device(url: str, model: str, xte: np.ndarray, yte: np.ndarray, ts: np.ndarray, dev: int, t0: float,
                 tally: _Tally, headers: Any, params: Any, slo_s: float, binary: bool) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(url, connection_timeout=10, network_timeout=30)
    outs = [th.InferRequestedOutput("class", binary_data=binary), th.InferRequestedOutput("exit", binary_data=binary)]
    try:
        for k, j in _paced(ts, t0, dev, len(xte)):
            inp = th.InferInput("input", [1, *xte.shape[1:]], "FP32")
            inp.set_data_from_numpy(xte[j:j + 1], binary_data=binary)
            with tally.lock:
                tally.sent += 1
            s = time.monotonic()
            try:
                r = client.infer(model, [inp], outputs=outs, headers=headers, parameters=params)
            except InferenceServerException as exc:
                tally.failed(str(exc))
                continue
            except Exception as exc:                     # connection errors count, never vanish
                tally.failed(f"{type(exc).__name__}: {exc}")
                continue
            tally.answered(time.monotonic() - s, r.as_numpy("class"), r.as_numpy("exit"), int(yte[j]), slo_s,
                           float(r.get_response()["parameters"]["server_ms"]),
                           float(r.get_response()["parameters"]["queue_to_exit_ms"]))
    finally:
        client.close()


def _grpc_device(url: str, model: str, xte: np.ndarray, yte: np.ndarray, ts: np.ndarray, dev: int, t0: float,
                 tally: _Tally, headers: Any, params: Any, slo_s: float, binary: bool) -> None:
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(url)
    sent_at: dict[str, tuple[float, int]] = {}
    done = threading.Semaphore(0)

    def callback(result: Any, error: Any) -> None:
        if error is not None:             # the stream's error responses carry no id: rejected or failed
            tally.failed(str(error))
        else:
            s, label = sent_at.pop(result.get_response().id)
            resp = result.get_response()
            tally.answered(time.monotonic() - s, result.as_numpy("class"), result.as_numpy("exit"), label, slo_s,
                           resp.parameters["server_ms"].double_param, resp.parameters["queue_to_exit_ms"].double_param)
        done.release()

    client.start_stream(callback=callback, headers=headers)
    outs = [tg.InferRequestedOutput("class"), tg.InferRequestedOutput("exit")]
    try:
        for k, j in _paced(ts, t0, dev, len(xte)):
            inp = tg.InferInput("input", [1, *xte.shape[1:]], "FP32")
            inp.set_data_from_numpy(xte[j:j + 1])
            rid = f"{dev}-{k}"
            sent_at[rid] = (time.monotonic(), int(yte[j]))
            with tally.lock:
                tally.sent += 1
            client.async_stream_infer(model, [inp], request_id=rid, outputs=outs, parameters=params)
        deadline = time.monotonic() + 30
        for _ in range(len(ts)):
            if not done.acquire(timeout=max(deadline - time.monotonic(), 0.01)):
                break
    finally:
        client.stop_stream(cancel_requests=False)
        client.close()
