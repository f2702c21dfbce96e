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
The images go on the wire as the served model's `InputContract` states
(serving/protocol.py). `failure(report)` is the rule by which `fluidnpu edge`
exits 1: it did not do its job. A device whose client cannot start or whose
stream broke fails its remaining requests at once, each counted, in words.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError

PROTOCOLS = ("http", "http-json", "grpc-stream")
MAX_REQUESTS = 10_000_000        # arrival times are drawn up front
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
              token: str | None = None, deadline_ms: float | None = None, slo_ms: float = 50.0,
              seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Run the swarm against `url` (host:port of HTTP or gRPC, by `protocol`) and report. The images go
    on the wire as the served model's `InputContract` states (digits-ee: raw pixels 0-16)."""
    from fluidnpu.host_driver.serving import load_network
    from fluidnpu.serving.protocol import check_runtime_model, input_contract

    for v, what in ((devices, "--devices"), (rate, "--rate"), (duration_s, "--duration")):
        if not (np.isfinite(v) and v > 0):
            raise FluidError(f"{what} must be a number > 0, got {v}")
    if deadline_ms is not None and not (np.isfinite(deadline_ms) and deadline_ms > 0):
        raise FluidError(f"--deadline must be a number of ms > 0, got {deadline_ms}")
    if not (np.isfinite(slo_ms) and slo_ms > 0):
        raise FluidError(f"--slo must be a number of ms > 0, got {slo_ms}")
    if rate * duration_s > MAX_REQUESTS:
        raise FluidError(f"--rate x --duration asks for {rate * duration_s:.3g} requests; at most {MAX_REQUESTS:,} "
                         f"in one run")
    if protocol not in PROTOCOLS:
        raise FluidError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if pattern not in ("poisson", "bursty"):
        raise FluidError(f"--pattern must be poisson or bursty, got {pattern!r}")
    _, _, xte, yte = load_network(check_runtime_model(model, "edge"))
    wire = input_contract(model, xte.shape[1:]).to_wire(xte)
    times = arrival_times(devices, rate, duration_s, pattern, seed)
    tally = _Tally()
    slo_s = (deadline_ms or slo_ms) / 1e3
    # gRPC metadata keys must be lower-case; HTTP headers are case-blind
    headers = {"authorization": f"Bearer {token}"} if token else None
    params = {"deadline_ms": float(deadline_ms)} if deadline_ms else None
    t0 = time.monotonic() + 0.2
    stop = threading.Event()
    worker = _grpc_device if protocol == "grpc-stream" else _http_device
    threads = [threading.Thread(target=_guarded, args=(worker, url, model, wire, yte, ts, d, t0, tally, headers,
                                                       params, slo_s, protocol == "http", stop), daemon=True)
               for d, ts in enumerate(times)]
    for th in threads:
        th.start()
    try:
        for th in threads:
            th.join(duration_s + 60)
    except KeyboardInterrupt:               # Ctrl-C / SIGTERM: stop sending, let the clients close
        stop.set()
        for th in threads:
            th.join(1.0)
        raise
    wall = time.monotonic() - t0
    return _report(tally, protocol, devices, rate, pattern, duration_s, slo_s, wall)


def _report(tally: _Tally, protocol: str, devices: int, rate: float, pattern: str, duration_s: float,
            slo_s: float, wall: float) -> dict[str, Any]:
    lat = np.asarray(tally.lat) * 1e3
    n_ans = len(tally.lat)
    n_rej = sum(tally.rejected.values())

    def pcts(v: Any, keys: tuple[str, ...] = ("p50", "p99")) -> dict[str, float | None]:
        q = {"p50": 50, "p99": 99, "max": 100}
        return {k: float(np.percentile(v, q[k])) if n_ans else None for k in keys}

    return {"protocol": protocol, "devices": devices, "rate": rate, "pattern": pattern, "duration_s": duration_s,
            "sent": tally.sent, "answered": n_ans, "rejected": n_rej, "rejected_by_reason": tally.rejected,
            "errors": len(tally.errors), "error_messages": sorted(set(tally.errors))[:3],
            "lost": tally.sent - n_ans - n_rej - len(tally.errors),
            "answered_per_s": n_ans / wall if wall > 0 else 0.0,
            "latency_ms": pcts(lat, ("p50", "p99", "max")),
            "server_latency_ms": pcts(tally.server_ms),
            "overhead_ms": pcts(np.subtract(tally.server_ms, tally.sched_ms)),
            "queue_to_exit_ms": pcts(tally.sched_ms),
            "slo_ms": slo_s * 1e3, "slo_violations": tally.violations,
            "accuracy": tally.correct / n_ans if n_ans else None,
            "exits": {str(k): v for k, v in sorted(tally.exits.items())}}


def failure(rep: dict[str, Any]) -> str | None:
    """Why a swarm did not do its job (`fluidnpu edge` then exits 1), or None. The rule: every request
    sent must come back answered or explicitly refused by the server (a rejection, with its reason, is
    the protocol's answer under overload), and at least one must be answered. Errors (a closed port, a
    wrong token, a broken stream) and requests never heard of again fail it."""
    if rep["sent"] == 0:
        return "no request was sent"
    if rep["errors"] or rep["lost"]:
        what = [f"{rep[k]} of {rep['sent']} requests {w}" for k, w in (("errors", "failed"), ("lost", "got no answer"))
                if rep[k]]
        return (", ".join(what)
                + (f" (first error: {rep['error_messages'][0]})" if rep["error_messages"] else ""))
    if rep["answered"] == 0:
        return f"none of {rep['sent']} requests was answered ({rep['rejected']} rejected)"
    return None


def _guarded(worker: Any, url: str, model: str, xte: np.ndarray, yte: np.ndarray, ts: np.ndarray, dev: int,
             t0: float, tally: _Tally, headers: Any, params: Any, slo_s: float, binary: bool,
             stop: threading.Event) -> None:
    """One device's worker; a client that cannot even start (a bad URL, no server) fails the device's
    requests not yet sent as errors, in one line each, instead of a thread's traceback."""
    sent = [0]
    try:
        worker(url, model, xte, yte, ts, dev, t0, tally, headers, params, slo_s, binary, stop, sent)
    except Exception as exc:                                     # noqa: BLE001 - counted, never lost
        msg = f"{type(exc).__name__}: {exc}"
        left = len(ts) - sent[0]
        with tally.lock:
            tally.sent += left
        for _ in range(left):
            tally.failed(msg)


def _paced(ts: np.ndarray, t0: float, dev: int, n_images: int,
           stop: threading.Event) -> Iterator[tuple[int, int]]:
    """(request k, test image j) of device `dev`, each yielded at its scheduled time t0 + ts[k] (until
    `stop` is set); devices walk the test split from different places."""
    for k, t in enumerate(ts):
        dt = t0 + t - time.monotonic()
        if dt > 0 and stop.wait(dt):
            return
        if stop.is_set():
            return
        yield k, (dev * 7919 + k) % n_images


def _http_device(url: str, model: str, xte: np.ndarray, yte: np.ndarray, ts: np.ndarray, dev: int, t0: float,
                 tally: _Tally, headers: Any, params: Any, slo_s: float, binary: bool, stop: threading.Event,
                 sent: list[int]) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    client = th.InferenceServerClient(url, connection_timeout=10, network_timeout=30)
    outs = [th.InferRequestedOutput("class", binary_data=binary), th.InferRequestedOutput("exit", binary_data=binary)]
    try:
        for _k, j in _paced(ts, t0, dev, len(xte), stop):
            inp = th.InferInput("input", [1, *xte.shape[1:]], "FP32")
            inp.set_data_from_numpy(xte[j:j + 1], binary_data=binary)
            with tally.lock:
                tally.sent += 1
            sent[0] += 1
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
                 tally: _Tally, headers: Any, params: Any, slo_s: float, binary: bool, stop: threading.Event,
                 sent: list[int]) -> None:
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(url)
    sent_at: dict[str, tuple[float, int]] = {}
    lock = threading.Lock()
    done = threading.Semaphore(0)
    broken: list[str] = []
    refused = [0]                             # error responses: they carry no id, so sent_at keeps theirs

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            if error.status() is not None:   # the stream itself failed (no server, auth): nothing more comes
                with lock:
                    broken.append(str(error))
                    left = len(sent_at) - refused[0]
                    sent_at.clear()
                for _ in range(left):
                    tally.failed(str(error))
                    done.release()
                return
            with lock:
                refused[0] += 1
            tally.failed(str(error))          # an error response in the stream: rejected or failed
        else:
            resp = result.get_response()
            with lock:
                s, label = sent_at.pop(resp.id)
            tally.answered(time.monotonic() - s, result.as_numpy("class"), result.as_numpy("exit"), label, slo_s,
                           resp.parameters["server_ms"].double_param, resp.parameters["queue_to_exit_ms"].double_param)
        done.release()

    client.start_stream(callback=callback, headers=headers)
    outs = [tg.InferRequestedOutput("class"), tg.InferRequestedOutput("exit")]
    try:
        for k, j in _paced(ts, t0, dev, len(xte), stop):
            if broken:                        # the rest are failed by _guarded, with the stream's reason
                raise ConnectionError(broken[0].splitlines()[0])
            inp = tg.InferInput("input", [1, *xte.shape[1:]], "FP32")
            inp.set_data_from_numpy(xte[j:j + 1])
            rid = f"{dev}-{k}"
            with lock:
                sent_at[rid] = (time.monotonic(), int(yte[j]))
            with tally.lock:
                tally.sent += 1
            sent[0] += 1
            try:
                client.async_stream_infer(model, [inp], request_id=rid, outputs=outs, parameters=params)
            except Exception as exc:         # the stream is gone: this one failed, _guarded fails the rest
                with lock:
                    mine = sent_at.pop(rid, None) is not None     # else the stream's failure counted it
                if mine:
                    tally.failed(f"{type(exc).__name__}: {exc}")
                raise
        deadline = time.monotonic() + 30
        for _ in range(sent[0]):
            if stop.is_set() or not done.acquire(timeout=max(deadline - time.monotonic(), 0.01)):
                break
    finally:
        client.stop_stream(cancel_requests=bool(broken) or stop.is_set())
        client.close()
