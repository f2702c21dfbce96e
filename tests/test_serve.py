"""`fluidnpu serve` as a real process on loopback, driven by tritonclient (HTTP JSON, HTTP binary, gRPC streams).

Each server binds 127.0.0.1 on free ports, is stopped by SIGTERM at the end
of its module-scoped fixture (which asserts exit code 0 and counters that add
up), and every request loop is bounded.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("grpc")
th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
from serve_helpers import ServeProcess, free_port as _free_port  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL = "digits-ee"


class ServerProcess(ServeProcess):
    """`fluidnpu serve --json` in a subprocess; `info` is its start-up JSON line."""

    def __init__(self, *args: str, ssl_ctx=None) -> None:
        self.ssl_ctx = ssl_ctx
        super().__init__("--json", *args)

    def stop(self) -> dict:
        """SIGTERM, wait for the drain; the final report (exit code must be 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        assert self.proc.returncode == 0, err[-2000:]
        return json.loads(out)


@pytest.fixture(scope="module")
def data():
    from fluidnpu.host_driver.serving import load_network

    _, qnet, xte, yte = load_network(MODEL)
    return qnet, np.ascontiguousarray(xte, dtype=np.float32), yte


@pytest.fixture(scope="module")
def wire(data):
    """The test split as a client sends it (the served model's InputContract: raw pixels 0-16)."""
    from fluidnpu.serving.protocol import input_contract

    return input_contract(MODEL, data[1].shape[1:]).to_wire(data[1])


@pytest.fixture(scope="module")
def reference(data):
    """What `fluidnpu run` computes for the test split: the same runtime on ModelDevice, default design."""
    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.runtime import NetworkRuntime

    qnet, xte, _ = data
    bundle = D.default_design(4)
    with NpuDriver(ModelDevice(bundle), bundle) as drv:
        states = NetworkRuntime(qnet, drv).infer(xte)
    return (np.array([s.pred for s in states]), np.array([s.exit for s in states]),
            np.stack([s.logits for s in states]).astype(np.float32))


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--slo", "10000", "--max-queue", "512")
    yield srv
    rep = srv.stop()
    c = rep["counters"]
    assert c["admitted"] == c["answered"] + c.get("errors", 0) and c["inflight"] == 0


def _conn(srv: ServerProcess) -> http.client.HTTPConnection:
    if srv.ssl_ctx is not None:
        return http.client.HTTPSConnection("127.0.0.1", srv.info["http_port"], timeout=10, context=srv.ssl_ctx)
    return http.client.HTTPConnection("127.0.0.1", srv.info["http_port"], timeout=10)


def _metrics(srv: ServerProcess, token: str | None = None) -> dict:
    from fluidnpu.serving.metrics import ServeMetrics

    conn = _conn(srv)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    body = conn.getresponse().read().decode()
    conn.close()
    return ServeMetrics.parse(body)


def _post(srv: ServerProcess, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    conn = _conn(srv)
    conn.request("POST", path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    status, payload = r.status, r.read()
    conn.close()
    return status, json.loads(payload)


# ---------------------------------------------------------------- predictions equal `fluidnpu run`'s
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_predictions_equal_run(server, data, wire, reference, binary):
    _, _, yte = data
    xte = wire
    pred, exits, logits = reference
    client = th.InferenceServerClient(server.http, concurrency=1)
    assert client.is_server_live() and client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL)
    assert meta["inputs"][0]["shape"] == [-1, 8, 8, 1] and meta["inputs"][0]["datatype"] == "FP32"
    got_c, got_e, got_l = [], [], []
    for k in range(0, len(xte), 32):                       # batches of 32: each sample queued on its own
        inp = th.InferInput("input", [len(xte[k:k + 32]), 8, 8, 1], "FP32")
        inp.set_data_from_numpy(xte[k:k + 32], binary_data=binary)
        outs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("class", "exit", "logits")]
        r = client.infer(MODEL, [inp], outputs=outs)
        got_c.append(r.as_numpy("class"))
        got_e.append(r.as_numpy("exit"))
        got_l.append(r.as_numpy("logits"))
        params = r.get_response()["parameters"]
        assert params["server_ms"] >= params["queue_to_exit_ms"] > 0
    client.close()
    np.testing.assert_array_equal(np.concatenate(got_c), pred)
    np.testing.assert_array_equal(np.concatenate(got_e), exits)
    np.testing.assert_array_equal(np.concatenate(got_l), logits)      # bit-identical
    acc = float(np.mean(np.concatenate(got_c) == yte))
    print(f"served accuracy {100 * acc:.2f} %, exits {np.bincount(np.concatenate(got_e)).tolist()}")
    assert acc > 0.9


def test_grpc_stream_predictions_equal_run(server, wire, reference):
    xte = wire
    pred, exits, logits = reference
    n = len(xte)
    got: dict[int, tuple] = {}
    errors = []
    done = threading.Event()

    def callback(result, error):
        if error is not None:
            errors.append(str(error))
        else:
            got[int(result.get_response().id)] = (result.as_numpy("class")[0], result.as_numpy("exit")[0],
                                                  result.as_numpy("logits")[0])
        if len(got) + len(errors) == n:
            done.set()

    client = tg.InferenceServerClient(server.grpc)
    assert client.is_server_live() and client.is_model_ready(MODEL)
    client.start_stream(callback=callback)
    for k in range(n):                                     # one edge device, one stream, many samples
        inp = tg.InferInput("input", [1, 8, 8, 1], "FP32")
        inp.set_data_from_numpy(xte[k:k + 1])
        client.async_stream_infer(MODEL, [inp], request_id=str(k))
    assert done.wait(60), f"{len(got)} of {n} answered"
    client.stop_stream()
    client.close()
    assert not errors
    np.testing.assert_array_equal([got[k][0] for k in range(n)], pred)
    np.testing.assert_array_equal([got[k][1] for k in range(n)], exits)
    np.testing.assert_array_equal(np.stack([got[k][2] for k in range(n)]), logits)


DOCS = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


def test_docs_example_accuracy_equals_run(server, data):
    """docs/serving.md's tritonclient example, run as written (only its address is this server's): it
    prints the accuracy that the runtime `fluidnpu run` serves through gives on the same raw images; the
    docs state the contract the metadata states."""
    import contextlib
    import io
    import re

    from sklearn.datasets import load_digits

    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.serving.protocol import input_contract

    text = DOCS.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert '"127.0.0.1:8001"' in code
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code.replace('"127.0.0.1:8001"', repr(server.grpc)), str(DOCS), "exec"), {})
    served = float(re.search(r"accuracy (\S+)", buf.getvalue()).group(1))
    digits = load_digits()
    n = int(re.search(r"range\(0, (\d+), 32\)", code).group(1))
    x = (digits.images[:n].astype(np.float32) / np.float32(D.PIXEL_MAX))[..., None]
    bundle = D.default_design(4)
    with NpuDriver(ModelDevice(bundle), bundle) as drv:
        states = NetworkRuntime(data[0], drv).infer(x)
    run = float(np.mean(np.array([s.pred for s in states]) == digits.target[:n]))
    print(f"docs example: served {served:.4f}, runtime {run:.4f} on {n} raw images")
    assert abs(served - round(run, 4)) <= 0.005
    contract = input_contract(MODEL, D.INPUT_HWC)
    meta = th.InferenceServerClient(server.http).get_model_metadata(MODEL)["inputs"][0]
    assert meta == contract.metadata() and meta["parameters"]["max"] == D.PIXEL_MAX
    assert contract.describe() in " ".join(text.split())


def test_grpc_unary_infer(server, wire, reference):
    xte = wire
    client = tg.InferenceServerClient(server.grpc)
    inp = tg.InferInput("input", [5, 8, 8, 1], "FP32")
    inp.set_data_from_numpy(xte[:5])
    r = client.infer(MODEL, [inp], parameters={"deadline_ms": 500.0})
    np.testing.assert_array_equal(r.as_numpy("class"), reference[0][:5])
    assert r.get_response().parameters["deadline_ms"].double_param == 500.0
    client.close()


# ------------------------------------------------ bad requests: 400 / INVALID_ARGUMENT, server keeps serving
def test_bad_requests_are_refused_and_server_keeps_serving(server, wire):
    xte = wire
    ok = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1], "data": xte[0].ravel().tolist()}]}
    infer = f"/v2/models/{MODEL}/infer"
    before = _metrics(server)["fluidnpu_admitted_total"]
    cases = [
        ("/v2/models/nope/infer", json.dumps(ok).encode(), 404, "unknown model"),
        (infer, b"{not json", 400, "malformed JSON"),
        (infer, json.dumps({"inputs": [ok["inputs"][0] | {"shape": [1, 8, 8]}]}).encode(), 400, "input shape"),
        (infer, json.dumps({"inputs": [ok["inputs"][0] | {"datatype": "INT32"}]}).encode(), 400, "FP32"),
        (infer, json.dumps({"inputs": [ok["inputs"][0] | {"data": [1.0] * 63}]}).encode(), 400, "64 values"),
        (infer, json.dumps({"inputs": [ok["inputs"][0] | {"data": ["x"] * 64}]}).encode(), 400, "not a list"),
        (infer, json.dumps(ok | {"parameters": {"deadline_ms": -1}}).encode(), 400, "deadline_ms"),
        (infer, json.dumps(ok | {"outputs": [{"name": "probs"}]}).encode(), 400, "unknown output"),
        (infer, b" " * (5 << 20), 400, "exceeds the limit"),
    ]
    for path, body, status, words in cases:
        code, payload = _post(server, path, body)
        assert code == status and words in payload["error"], (words, code, payload)
    # the binary extension with a wrong header length or size
    hdr = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1],
                                  "parameters": {"binary_data_size": 256}}]}).encode()
    code, payload = _post(server, infer, hdr + b"\0" * 100, {"Inference-Header-Content-Length": str(len(hdr))})
    assert code == 400 and "binary_data_size" in payload["error"]
    assert _metrics(server)["fluidnpu_admitted_total"] == before          # nothing reached the queue
    client = tg.InferenceServerClient(server.grpc)
    inp = tg.InferInput("input", [1, 8, 8], "FP32")
    inp.set_data_from_numpy(xte[:1, :, :, 0])
    with pytest.raises(InferenceServerException) as exc:
        client.infer(MODEL, [inp])
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "input shape" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        client.get_model_metadata("nope")
    assert exc.value.status() == "StatusCode.NOT_FOUND"
    code, payload = _post(server, infer, json.dumps(ok).encode())        # still serving
    assert code == 200 and payload["outputs"][0]["name"] == "class"
    client.close()


# ---------------------------------------------------------------- disconnects
def test_client_disconnect_leaves_others_unaffected(server, wire, reference):
    xte = wire
    m0 = _metrics(server)
    # HTTP: send a batch and hang up before the answer
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [64, 8, 8, 1],
                                   "data": xte[:64].ravel().tolist()}]}).encode()
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", server.info["http_port"], timeout=10)
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers={"Content-Type": "application/json"})
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
    # gRPC: a stream cancelled mid-way
    client = tg.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: None)
    for k in range(100):
        inp = tg.InferInput("input", [1, 8, 8, 1], "FP32")
        inp.set_data_from_numpy(xte[k:k + 1])
        client.async_stream_infer(MODEL, [inp], request_id=str(k))
    client.stop_stream(cancel_requests=True)
    client.close()
    # another client is served correctly, and every admitted sample is accounted for
    c2 = th.InferenceServerClient(server.http)
    inp = th.InferInput("input", [8, 8, 8, 1], "FP32")
    inp.set_data_from_numpy(xte[100:108])
    np.testing.assert_array_equal(c2.infer(MODEL, [inp]).as_numpy("class"), reference[0][100:108])
    c2.close()
    deadline = time.monotonic() + 20
    while _metrics(server)["fluidnpu_queue_depth"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    m = _metrics(server)
    assert m["fluidnpu_queue_depth"] == 0
    answered = sum(v for k, v in m.items() if k.startswith("fluidnpu_exits_total"))
    assert m["fluidnpu_admitted_total"] == answered + m["fluidnpu_device_errors_total"]
    assert m["fluidnpu_admitted_total"] - m0["fluidnpu_admitted_total"] >= 8


# ---------------------------------------------------------------- auth and TLS
@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A server with a bearer token and TLS on both ports (a self-signed certificate for 127.0.0.1)."""
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("auth")
    (d / "token").write_text("s3cret\n")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    srv = ServerProcess("--token-file", str(d / "token"), "--tls-cert", str(cert), "--tls-key", str(key),
                        ssl_ctx=ssl.create_default_context(cafile=str(cert)))
    srv.cert = cert
    yield srv
    srv.stop()


def test_token_auth_and_tls_http_and_grpc(secured, wire):
    xte = wire
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1],
                                   "data": xte[0].ravel().tolist()}]}).encode()
    path = f"/v2/models/{MODEL}/infer"
    code, payload = _post(secured, path, body)
    assert code == 401 and "token" in payload["error"]
    code, _ = _post(secured, path, body, {"Authorization": "Bearer wrong"})
    assert code == 401
    code, payload = _post(secured, path, body, {"Authorization": "Bearer s3cret"})
    assert code == 200
    assert _metrics(secured, "s3cret")["fluidnpu_admitted_total"] == 1       # the refused ones never queued
    with pytest.raises(http.client.RemoteDisconnected):              # plain HTTP on the TLS port: refused
        plain = http.client.HTTPConnection("127.0.0.1", secured.info["http_port"], timeout=10)
        plain.request("GET", "/v2/health/live")
        plain.getresponse()
    client = tg.InferenceServerClient(secured.grpc, ssl=True, root_certificates=str(secured.cert))
    inp = tg.InferInput("input", [1, 8, 8, 1], "FP32")
    inp.set_data_from_numpy(xte[:1])
    with pytest.raises(InferenceServerException) as exc:
        client.infer(MODEL, [inp])
    assert exc.value.status() == "StatusCode.UNAUTHENTICATED"
    r = client.infer(MODEL, [inp], headers={"authorization": "Bearer s3cret"})
    assert r.as_numpy("class").shape == (1,)
    client.close()


# ---------------------------------------------------------------- overload, then SIGTERM drains
def test_overload_rejects_explicitly_and_sigterm_drains(wire):
    from fluidnpu.serving.edge import run_swarm

    srv = ServerProcess("--max-queue", "16", "--slo", "250", "--pace", "board")
    try:
        rep = run_swarm(srv.grpc, protocol="grpc-stream", devices=4, rate=3000, duration_s=2.0, slo_ms=250)
        assert rep["lost"] == 0 and rep["errors"] == 0
        assert rep["sent"] == rep["answered"] + rep["rejected"]
        assert rep["rejected"] > 0 and set(rep["rejected_by_reason"]) <= {"queue_full", "deadline"}
        # the server's own latency of admitted requests stays within the SLO
        assert rep["server_latency_ms"]["p99"] < 250
        m = _metrics(srv)
        rejected = sum(v for k, v in m.items() if k.startswith("fluidnpu_rejected_total"))
        assert rejected == rep["rejected"] and m["fluidnpu_admitted_total"] == rep["answered"]
        # SIGTERM while a stream is busy: every admitted sample is answered before the exit (code 0)
        got, errs = [], []

        def callback(result, error):
            if error is not None:
                errs.append(str(error))
            elif result is not None:
                got.append(result.get_response().id)

        client = tg.InferenceServerClient(srv.grpc)
        client.start_stream(callback=callback)
        xte = wire
        for k in range(60):
            inp = tg.InferInput("input", [1, 8, 8, 1], "FP32")
            inp.set_data_from_numpy(xte[k:k + 1])
            client.async_stream_infer(MODEL, [inp], request_id=str(k))
            if k == 30:
                t_end = time.monotonic() + 20
                while len(got) < 10 and time.monotonic() < t_end:
                    time.sleep(0.005)
                srv.proc.send_signal(signal.SIGTERM)
        final = srv.stop()
        client.stop_stream()
        client.close()
        c = final["counters"]
        assert c["inflight"] == 0 and c["admitted"] == c["answered"]
        assert len(set(got)) == len(got) == c["admitted"] - rep["answered"] >= 10     # none lost, none twice
        assert all("draining" in e or "UNAVAILABLE" in e or "closed" in e.lower() for e in errs), errs[:3]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.communicate()


def test_serve_bad_options_exit_2(tmp_path):
    empty = tmp_path / "t"
    empty.write_text("")
    for args, words in ((["--slo", "0"], "--slo"), (["--token-file", str(empty)], "empty"),
                        (["--tls-cert", "c.pem"], "--tls-key"), (["--device", "pynq"], "--design")):
        r = subprocess.run([sys.executable, "-m", "fluidnpu.cli", "serve", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


# ---------------------------------------------------------------- device fault (in process: ModelDevice hangs)
def test_device_fault_answers_with_error_and_serving_resumes(data):
    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.serving.server import build_engine

    qnet, xte, _ = data
    bundle = D.default_design(4)
    dev = ModelDevice(bundle)
    cfg = {"qnet": qnet, "bundle": bundle, "bmax": 4, "tau": 0.8, "model": MODEL, "device": "model",
           "policy": "fluidb", "slo_s": 5.0, "max_queue": 64, "pace": None, "probe": xte[:1], "timeout_s": 0.05,
           "calib_sizes": [1, 4], "calib_reps": 1}
    with NpuDriver(dev, bundle) as drv:
        engine, _, _ = build_engine(drv, cfg)
        engine.start()
        try:
            dev.hang = "soft"
            bad = [engine.submit(x).result(30) for x in xte[:3]]
            assert all(r.error and "Timeout" in r.error for r in bad)
            dev.hang = None
            good = [engine.submit(x).result(30) for x in xte[:3]]
            assert all(r.error is None for r in good)
        finally:
            assert engine.drain(30)
        c = engine.check_counters()
        assert c["errors"] == 3 and c["answered"] == 3 and c["inflight"] == 0


# ---------------------------------------------------------------- admission and the hand-off (in process)
def _engine(data, **kw):
    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.serving.server import build_engine

    qnet, xte, _ = data
    bundle = D.default_design(4)
    drv = NpuDriver(ModelDevice(bundle), bundle)
    cfg = {"qnet": qnet, "bundle": bundle, "bmax": 4, "tau": 0.8, "model": MODEL, "device": "model",
           "policy": "fluidb", "slo_s": 5.0, "max_queue": 64, "pace": None, "probe": xte[:1], "timeout_s": 2.0,
           "calib_sizes": [1, 4], "calib_reps": 1} | kw
    return build_engine(drv, cfg)[0], drv


def test_admission_estimate_covers_the_last_exit_and_the_batches_ahead(data):
    """On a slow board (1 DSP at 1.5 MHz: batches take tens of ms) a lone sample is priced for its whole
    path, not its first exit (the exit is unknown at admission), and a queue of k samples for the batches of
    Bmax ahead through the first segment plus its own batch's whole path: what the benchmark's overload at
    10x this board's capacity needs for admitted requests to meet the SLO."""
    from fluidnpu import digits_ee as D
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.scheduler_fw.latency import LatencyTable
    from fluidnpu.serving.server import build_engine

    qnet, xte, _ = data
    bundle = bundle_from_result(explore(D.digits_ee(), D.small_board(1), DSEOptions(bmax=4, clock_mhz=1.5)))
    drv = NpuDriver(ModelDevice(bundle), bundle)
    cfg = {"qnet": qnet, "bundle": bundle, "bmax": 4, "tau": 0.8, "model": MODEL, "device": "model",
           "policy": "fluidb", "slo_s": 0.2, "max_queue": 16, "pace": "board", "probe": xte[:1],
           "timeout_s": 2.0, "calib_sizes": [1], "calib_reps": 1}
    engine = build_engine(drv, cfg)[0]
    t = engine.table                                              # paced: at least the board's modelled times
    assert t.span(0, 0, 1) >= LatencyTable.from_bundle(bundle).span(0, 0, 1)
    last = t.n_segments - 1
    assert t.span(0, last, 1) > 2 * t.span(0, 0, 1)            # the last exit is far behind the first
    raw, _ = engine.predicted_s(1)
    assert raw >= t.span(0, last, 1)
    engine.inflight = 12                                          # 13 samples: 3 batches of 4 ahead
    raw, _ = engine.predicted_s(1)
    assert raw >= 3 * t.span(0, 0, 4) + t.span(0, last, 4) > 12 * (1 / t.full_batch_capacity())
    engine.inflight = 0


def test_admission_rejects_what_cannot_meet_its_deadline(data):
    """A request whose predicted completion (queue ahead at the measured service time, plus the measured
    residual) is past its deadline, or beyond the in-flight limit that admitted requests' missed deadlines
    set, is refused at admission with reason `deadline`, nothing of it queued; a request larger than the
    room left is refused whole (`queue_full`); with nothing in flight a request is admitted whatever its
    deadline (it is the fastest it can be)."""
    from fluidnpu.serving.engine import Rejected, Ticket

    xte = data[1]
    engine, drv = _engine(data, max_queue=8)
    with drv:
        raw, est = engine.predicted_s(1)
        assert est == raw > 0
        first = engine.submit(xte[0], deadline_s=1e-6)           # idle: admitted, answered (late)
        engine.start()
        try:
            assert first.result(30).error is None
            held = threading.Event()
            real_run = engine.backend.run

            def slow_run(*a):
                held.wait(30)                                   # the device is busy: samples stay in flight
                return real_run(*a)
            engine.backend.run = slow_run
            futs = [engine.submit(x) for x in xte[1:5]]
            assert engine.inflight == 4
            raw, est = engine.predicted_s(1)
            with pytest.raises(Rejected) as exc:
                engine.submit(xte[5], deadline_s=est * 0.5)
            assert exc.value.reason == "deadline" and "predicted" in str(exc.value)
            engine.calib_residual_s = 10.0                      # measured: the server adds 10 s over the queue
            with pytest.raises(Rejected) as exc:
                engine.submit(xte[5], deadline_s=5.0)
            assert exc.value.reason == "deadline"
            engine.calib_residual_s = 0.0
            with pytest.raises(Rejected) as exc:                # 4 in flight + 5 > 8: none of the 5 admitted
                engine.submit_request(xte[5:10], None, lambda t: None)
            assert exc.value.reason == "queue_full" and engine.inflight == 4
            # each admitted request that missed its deadline lowers the in-flight limit by one: 8 -> 4
            late = Ticket(1, lambda t: None, deadline_s=5.0)
            for _ in range(4):
                engine.note_response(late, 6.0)
            assert engine.limit == 4.0
            with pytest.raises(Rejected) as exc:
                engine.submit(xte[5], deadline_s=5.0)
            assert exc.value.reason == "deadline" and "missed" in str(exc.value)
            for _ in range(200):                                # met deadlines raise it again, slowly
                engine.note_response(late, 0.001)
            assert 5.0 < engine.limit < 5.01
            ok = engine.submit(xte[5], deadline_s=5.0)
            held.set()
            assert all(f.result(30).error is None for f in futs + [ok])
        finally:
            held.set()
            assert engine.drain(30)
        c = engine.check_counters()
        assert c["rejected_deadline"] == 3 and c["rejected_queue_full"] == 1     # requests refused
        assert c["admitted"] == c["answered"] == 6 and c["inflight"] == 0


def test_answers_reach_the_loop_in_one_hand_off_per_run(data):
    """Requests answered by one device run reach their asyncio loop in one call_soon_threadsafe, and the
    transports' measured time calibrates admission (the residual over the queue estimate)."""
    xte = data[1]
    engine, drv = _engine(data)
    calls = []

    class Loop:                                                  # stands in for the transports' loop
        def call_soon_threadsafe(self, fn, *args):
            calls.append(len(args[0]))
            fn(*args)

    got, loop = [], Loop()
    with drv:
        tickets = [engine.submit_request(xte[k:k + 1], None, got.append, loop) for k in range(40)]
        cancelled = engine.submit_request(xte[40:42], None, got.append, loop)
        cancelled.cancel()
        engine.start()
        assert engine.drain(30)
    assert sorted(map(id, got)) == sorted(map(id, tickets))     # each once, the cancelled one dropped
    assert len(calls) <= engine.report.runs and sum(calls) == 40 and max(calls) > 1
    assert engine.check_counters()["dropped"] == 2
    for t in tickets:                                            # each took 20 ms more than admission predicted
        engine.note_response(t, t.predicted_s + 0.02)
    assert engine.calib_residual_s == pytest.approx(0.02)
    raw, est = engine.predicted_s(1)
    assert est == pytest.approx(raw + 0.02)


# ---------------------------------------------------------------- the RTL simulation behind the server
@pytest.mark.heavy(120)
def test_rtl_server_logits_bit_identical_to_model_device(wire, reference, tmp_path):
    """`fluidnpu serve --device rtl`: the server runs inside the cocotb + Verilator simulation of the
    generated Verilog; a handful of images over HTTP and a gRPC stream, then SIGTERM drains it."""
    pytest.importorskip("cocotb")
    xte = wire
    pred, exits, logits = reference
    pick = np.concatenate([np.flatnonzero(exits == e)[:2] for e in range(exits.max() + 1)])   # every exit
    hport, gport = _free_port(), _free_port()
    # stderr to a file: a fresh Verilator build writes more than a pipe holds while nobody reads it
    err_file = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "fluidnpu.cli", "serve", "--device", "rtl", "--http-port",
                             str(hport), "--grpc-port", str(gport), "--slo", "100000", "--json"],
                            stdout=subprocess.PIPE, stderr=err_file, text=True, start_new_session=True)

    def err_tail() -> str:
        return (tmp_path / "stderr").read_text()[-3000:]
    try:
        client = th.InferenceServerClient(f"127.0.0.1:{hport}", network_timeout=300)
        t_end = time.monotonic() + 600                     # a fresh Verilator build takes minutes on 2 cores
        while True:
            assert proc.poll() is None, err_tail()
            try:
                if client.is_model_ready(MODEL):
                    break
            except Exception:                              # not listening yet
                pass
            assert time.monotonic() < t_end, "RTL server did not become ready"
            time.sleep(0.5)
        inp = th.InferInput("input", [len(pick), 8, 8, 1], "FP32")
        inp.set_data_from_numpy(xte[pick])
        r = client.infer(MODEL, [inp])
        client.close()
        np.testing.assert_array_equal(r.as_numpy("logits"), logits[pick])            # bit-identical
        np.testing.assert_array_equal(r.as_numpy("exit"), exits[pick])
        got = {}
        g = tg.InferenceServerClient(f"127.0.0.1:{gport}")
        g.start_stream(callback=lambda result, error: got.__setitem__(result.get_response().id, result))
        for k in pick[:3]:
            gi = tg.InferInput("input", [1, 8, 8, 1], "FP32")
            gi.set_data_from_numpy(xte[k:k + 1])
            g.async_stream_infer(MODEL, [gi], request_id=str(k))
        t_end = time.monotonic() + 120
        while len(got) < 3 and time.monotonic() < t_end:
            time.sleep(0.05)
        g.stop_stream()
        g.close()
        for k in pick[:3]:
            np.testing.assert_array_equal(got[str(k)].as_numpy("logits")[0], logits[k])
        proc.send_signal(signal.SIGTERM)                   # the parent relays it into the simulation
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, err_tail()
        rep = json.loads(out[out.index('{\n'):])
        assert rep["counters"]["admitted"] == rep["counters"]["answered"] == len(pick) + 3
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        err_file.close()


def test_edge_cli_json_report(server, data, reference):
    for proto, url in (("http-json", server.http), ("grpc-stream", server.grpc)):
        r = subprocess.run([sys.executable, "-m", "fluidnpu.cli", "edge", "--url", url, "--protocol", proto,
                            "--pattern", "bursty", "--devices", "2", "--rate", "100", "--duration", "1", "--json"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        rep = json.loads(r.stdout)
        assert rep["sent"] == rep["answered"] > 20 and rep["lost"] == rep["errors"] == rep["rejected"] == 0
        # the accuracy is the runtime's on exactly the images the swarm sent (device d's k-th request:
        # image (d * 7919 + k) mod n, fluidnpu/serving/edge.py _paced)
        from fluidnpu.serving.edge import arrival_times

        n = len(data[2])
        idx = np.array([(d * 7919 + k) % n for d, ts in enumerate(arrival_times(2, 100, 1, "bursty", 0))
                        for k in range(len(ts))])
        assert rep["accuracy"] == pytest.approx(float(np.mean(reference[0][idx] == data[2][idx])), abs=1e-12)
        assert sum(rep["exits"].values()) == rep["answered"]
        assert rep["latency_ms"]["p50"] > 0 and rep["overhead_ms"]["p50"] >= 0


# ---------------------------------------------------------------- "flash with PYNQ, then stream" against the fake pynq
def test_pynq_server_flashes_then_serves(wire, reference, tmp_path, monkeypatch):
    """`serve --device pynq --bitstream --design`: the .hwh is checked, the overlay downloaded, then the
    server answers tritonclient with ModelDevice's results (the suite's fake pynq over a ModelDevice)."""
    import importlib.util

    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.serving.server import serve_command

    spec = importlib.util.spec_from_file_location("_fake_pynq", Path(__file__).with_name("test_pynq_device.py"))
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    bundle = D.default_design(4)
    pynq = fake.make_fake_pynq(ModelDevice(bundle))
    monkeypatch.setitem(sys.modules, "pynq", pynq)
    (tmp_path / "design.json").write_text(json.dumps(bundle.data))
    (tmp_path / "npu.bit").write_bytes(b"\0" * 16)
    (tmp_path / "npu.hwh").write_text(fake._hwh())
    hport, gport, stop = _free_port(), _free_port(), tmp_path / "stop"
    result: dict = {}

    def run():
        try:
            result["rep"] = serve_command(device="pynq", design=str(tmp_path / "design.json"),
                                          bitstream=str(tmp_path / "npu.bit"), model=MODEL, policy="fluidb",
                                          slo_ms=5000, max_queue=64, tau=0.8, bmax=None, host="127.0.0.1",
                                          http_port=hport, grpc_port=gport, token_file=None, tls_cert=None,
                                          tls_key=None, pace=None, uio="", stop_file=str(stop))
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["exc"] = exc

    th_ = threading.Thread(target=run, daemon=True)
    th_.start()
    try:
        client = th.InferenceServerClient(f"127.0.0.1:{hport}")
        t_end = time.monotonic() + 60
        while "exc" not in result and time.monotonic() < t_end:
            try:
                if client.is_model_ready(MODEL):
                    break
            except Exception:
                time.sleep(0.1)
        assert "exc" not in result, result.get("exc")
        assert pynq.calls["overlay"] == 1 and pynq.calls["download"] == 1
        xte = wire
        inp = th.InferInput("input", [16, 8, 8, 1], "FP32")
        inp.set_data_from_numpy(xte[:16])
        r = client.infer(MODEL, [inp])
        client.close()
        np.testing.assert_array_equal(r.as_numpy("logits"), reference[2][:16])
    finally:
        stop.write_text("")
        th_.join(60)
    assert result["rep"]["counters"]["answered"] == 16


def test_percentiles_summary():
    """The one latency summary of the fleet reports and benchmarks: scaled, interpolated, rounded; an
    empty sample is {} unless the caller asks for a fill value."""
    from fluidnpu.serving.percentiles import percentiles

    assert percentiles([0.001, 0.002, 0.010], scale=1e3) == {"p50": 2.0, "p99": 9.84, "max": 10.0}
    assert percentiles([3.14159], digits=2, suffix="_ms") == {"p50_ms": 3.14, "p99_ms": 3.14, "max_ms": 3.14}
    assert percentiles([]) == {} and percentiles([], empty=0.0) == {"p50": 0.0, "p99": 0.0, "max": 0.0}
