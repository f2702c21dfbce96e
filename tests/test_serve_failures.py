"""`fluidnpu serve` and `fluidnpu edge` when things go wrong: bad addresses, failing clients, tokens on
every protocol, signals, and the server's part of the bad-input matrix (every route, bad payloads: a
clear 4xx / INVALID_ARGUMENT, no traceback in the server's log, and a good request answered right
after each bad one).

One token server (a subprocess on 127.0.0.1, free ports, stderr to a file) serves the module; its
fixture stops it by SIGTERM while its --stop-after timer still runs, and it must exit at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("grpc")
th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
from serve_helpers import CLI, ServeProcess, busy_port, free_port as _free_port  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from fluidnpu.cli import main  # noqa: E402

MODEL = "digits-ee"
TOKEN = "s3cret-token"


def _one_line_exit(args: list[str], capsys, code: int = 2) -> str:
    """Run the CLI in process: it must exit `code` with one line on stderr, no traceback."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == code, (args, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, (args, err)
    return lines[0]


# ---------------------------------------------------------------- addresses: checked before start-up
def test_serve_bad_addresses_one_line_exit_2(capsys):
    with busy_port() as busy:
        port = str(busy)
        cases = [(["--http-port", port], "--http-port " + port),
                 (["--http-port", "0", "--grpc-port", port], "--grpc-port " + port),
                 (["--http-port", "9100", "--grpc-port", "9100"], "same port"),
                 (["--host", "256.0.0.1"], "--host"),
                 (["--host", "no-such-host.invalid"], "--host"),
                 (["--host", "192.0.2.1"], "not an address of this machine"),
                 (["--http-port", "70000"], "--http-port"),
                 (["-m", "nosuch"], "`fluidnpu serve` serves digits-ee")]
        if os.geteuid() != 0:
            cases.append((["--http-port", "80"], "privileges"))
        for args, words in cases:
            t0 = time.monotonic()
            line = _one_line_exit(["serve", *args], capsys)
            assert words in line and "fluidnpu run" not in line, (args, line)
            assert time.monotonic() - t0 < 5, args                 # before the network is loaded


def test_serve_bad_numbers_one_line_exit_2(capsys):
    for opt, values in (("--slo", ("0", "-1", "nan", "inf", "1e308", "x")), ("--stop-after", ("0", "nan", "inf")),
                        ("--max-queue", ("0", "-3", "1e9", "2.5")), ("--tau", ("0", "1.5", "nan")),
                        ("--bmax", ("0", "99999")), ("--http-port", ("-1", "65536")), ("--grpc-port", ("nan",))):
        for v in values:
            line = _one_line_exit(["serve", opt, v], capsys)
            assert opt in line, (opt, v, line)


def test_edge_bad_numbers_one_line_exit_2(capsys):
    for args in (["--rate", "nan"], ["--rate", "0"], ["--rate", "-1"], ["--rate", "inf"], ["--duration", "nan"],
                 ["--duration", "1e12"], ["--rate", "1e6", "--duration", "1e5"], ["--devices", "0"],
                 ["--devices", "100000"], ["--deadline", "nan"], ["--slo", "-5"], ["--token-file", "/nonexistent"],
                 ["--token-file", "/"], ["-m", "nosuch"]):
        line = _one_line_exit(["edge", *args], capsys)
        assert "--" in line, (args, line)


# ---------------------------------------------------------------- a token server for the module
class TokenServer(ServeProcess):
    def __init__(self, tmp) -> None:
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.log_file = open(tmp / "server.err", "w+")
        super().__init__("--token-file", str(self.token_file), "--slo", "10000", "--max-queue", "512",
                         "--stop-after", "600", stderr=self.log_file)

    def log(self) -> str:
        return self.stderr()

    def stderr(self) -> str:
        self.log_file.flush()
        self.log_file.seek(0)
        return self.log_file.read()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = TokenServer(tmp_path_factory.mktemp("token_server"))
    yield s
    try:            # SIGTERM while the --stop-after timer runs: out at once, every counter in words
        line = _stop(s, signal.SIGTERM)
        assert line.startswith("drained in ") and ", rejected " in line and not line.endswith("rejected "), line
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.communicate()


@pytest.fixture(scope="module")
def wire():
    from fluidnpu.host_driver.serving import load_network
    from fluidnpu.serving.protocol import input_contract

    _, _, xte, yte = load_network(MODEL)
    return input_contract(MODEL, xte.shape[1:]).to_wire(xte), yte


AUTH = {"authorization": f"Bearer {TOKEN}"}


def _edge(srv, protocol: str, *extra: str, token: bool = True, url: str | None = None) -> subprocess.CompletedProcess:
    url = url or (srv.grpc if protocol == "grpc-stream" else srv.http)
    args = [*CLI, "edge", "--url", url, "--protocol", protocol, "--devices", "2", "--rate", "40", "--duration",
            "0.5", "--json", *extra]
    if token:
        args += ["--token-file", str(srv.token_file)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("protocol", ["grpc-stream", "http", "http-json"])
def test_edge_token_file_works_on_every_protocol(srv, protocol):
    """The token `--token-file` reads (test_edge_text_report_in_words_at_80_columns runs the command with
    it) is accepted on every protocol; in process: the same run_swarm."""
    from fluidnpu.serving.edge import failure, run_swarm
    from fluidnpu.serving.server import read_token

    rep = run_swarm(srv.grpc if protocol == "grpc-stream" else srv.http, protocol=protocol, devices=2, rate=40,
                    duration_s=0.5, token=read_token(str(srv.token_file)))
    assert failure(rep) is None, rep
    assert rep["sent"] == rep["answered"] >= 10 and rep["errors"] == rep["lost"] == rep["rejected"] == 0


def test_edge_exits_1_when_it_could_not_do_its_job(srv, capfd):
    """No token, a closed port, a host that does not resolve: every request an error in words, the rule of
    `serving.edge.failure` says why, no thread traceback; the command exits 1 (one subprocess, the rest in
    process: the same run_swarm and failure; `--url` without a port is bad input, exit 2, in the matrix)."""
    from fluidnpu.serving.edge import failure, run_swarm

    closed = f"127.0.0.1:{_free_port()}"
    for protocol, url, token in (("grpc-stream", srv.grpc, None), ("http", srv.http, None),
                                 ("http-json", srv.http, "wrong"), ("grpc-stream", closed, TOKEN),
                                 ("http-json", closed, TOKEN), ("http", "nosuch.invalid:8000", TOKEN)):
        t0 = time.monotonic()
        rep = run_swarm(url, protocol=protocol, devices=2, rate=40, duration_s=0.5, token=token)
        assert rep["answered"] == 0 and rep["errors"] + rep["lost"] == rep["sent"] > 0, (protocol, url, rep)
        assert failure(rep) and time.monotonic() - t0 < 10, (protocol, url)     # a dead stream is not waited for
    assert "Traceback" not in capfd.readouterr().err
    r = _edge(srv, "grpc-stream", url=closed)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("edge failed: ")
    assert json.loads(r.stdout)["errors"] > 0


def test_edge_text_report_in_words_at_80_columns(srv):
    r = subprocess.run([*CLI, "edge", "--url", srv.http, "--protocol", "http", "--devices", "1", "--rate", "20",
                        "--duration", "0.5", "--token-file", str(srv.token_file)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "{" not in r.stdout and "'" not in r.stdout, r.stdout
    assert "rejected 0," in r.stdout and "samples by exit: exit " in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout


# ---------------------------------------------------------------- the server's part of the bad-input matrix
def _http(srv, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict]:
    import http.client

    host, port = srv.http.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(method, path, body=body or None, headers={**AUTH, **(headers or {})})
    r = conn.getresponse()
    status, payload = r.status, r.read()
    conn.close()
    return status, (json.loads(payload) if payload[:1] == b"{" else {"raw": payload[:200]})


def _good_http(srv, x: np.ndarray, want: int) -> None:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1], "data": x.ravel().tolist()}]}
    status, resp = _http(srv, "POST", f"/v2/models/{MODEL}/infer", json.dumps(body).encode())
    assert status == 200, resp
    assert {o["name"]: o["data"] for o in resp["outputs"]}["class"] == [want]


def _http_cases(x: np.ndarray) -> list[tuple[str, str, bytes, dict, int, str]]:
    """(method, path, body, headers, status, words in the error) for every route."""
    infer = f"/v2/models/{MODEL}/infer"
    good = {"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1], "data": x.ravel().tolist()}

    def body(**over) -> bytes:
        return json.dumps({"inputs": [{**good, **over}]}).encode()

    head = json.dumps({"inputs": [{**{k: v for k, v in good.items() if k != "data"},
                                   "parameters": {"binary_data_size": 300}}]}).encode()
    raw = x.astype("<f4").tobytes()
    cases = [
        ("GET", "/v2/nope", b"", {}, 404, "Not Found: GET /v2/nope"),
        ("GET", infer, b"", {}, 405, "Method Not Allowed"),
        ("DELETE", f"/v2/models/{MODEL}", b"", {}, 405, "Method Not Allowed"),
        ("GET", "/v2/models/nosuch", b"", {}, 404, "unknown model"),
        ("GET", "/v2/models/nosuch/ready", b"", {}, 404, "unknown model"),
        ("GET", f"/v2/models/{MODEL}/versions/7", b"", {}, 404, "unknown version"),
        ("POST", "/v2/models/nosuch/infer", body(), {}, 404, "unknown model"),
        ("POST", f"/v2/models/{MODEL}/versions/7/infer", body(), {}, 404, "unknown version"),
        ("POST", infer, b"{not json", {}, 400, "malformed JSON"),
        ("POST", infer, b"\xff\xfe", {}, 400, "malformed JSON"),
        ("POST", infer, b"[1, 2]", {}, 400, "JSON object"),
        ("POST", infer, b"{}", {}, 400, "exactly one input"),
        ("POST", infer, json.dumps({"inputs": [good, good]}).encode(), {}, 400, "exactly one input"),
        ("POST", infer, body(name="x"), {}, 400, "unknown input"),
        ("POST", infer, body(datatype="INT8"), {}, 400, "must be FP32"),
        ("POST", infer, body(datatype=None), {}, 400, "must be FP32"),
        ("POST", infer, body(shape=[1, 8, 8]), {}, 400, "input shape"),
        ("POST", infer, body(shape=[0, 8, 8, 1], data=[]), {}, 400, "input shape"),
        ("POST", infer, body(shape=[-1, 8, 8, 1]), {}, 400, "input shape"),
        ("POST", infer, body(shape="1,8,8,1"), {}, 400, "'shape'"),
        ("POST", infer, body(shape=[1.5, 8, 8, 1]), {}, 400, "'shape'"),
        ("POST", infer, body(shape=[10**6, 8, 8, 1]), {}, 400, "at most"),
        ("POST", infer, body(data=[1.0] * 63), {}, 400, "needs 64 values"),
        ("POST", infer, body(data=["a"] * 64), {}, 400, "not a list of numbers"),
        ("POST", infer, body(data=[[1.0], 2.0] * 32), {}, 400, "not a list of numbers"),
        ("POST", infer, body(data=None), {}, 400, "needs 64 values"),
        ("POST", infer, body(data=[1e39] * 64), {}, 400, "NaN or Inf"),
        ("POST", infer, body(data=[-1.0] * 64), {}, 400, "raw pixel values 0-16"),
        ("POST", infer, body(data=[17.0] * 64), {}, 400, "raw pixel values 0-16"),
        ("POST", infer, body(parameters=[1]), {}, 400, "'parameters'"),
        ("POST", infer, json.dumps({"inputs": [good]}).replace("1.0,", "NaN,", 1).encode(), {}, 400, "NaN"),
        ("POST", infer, json.dumps({"inputs": [good], "parameters": {"deadline_ms": "soon"}}).encode(), {}, 400,
         "deadline_ms"),
        ("POST", infer, json.dumps({"inputs": [good], "parameters": {"deadline_ms": -3}}).encode(), {}, 400,
         "deadline_ms"),
        ("POST", infer, json.dumps({"inputs": [good], "parameters": 5}).encode(), {}, 400, "'parameters'"),
        ("POST", infer, json.dumps({"inputs": [good], "outputs": [{"name": "nope"}]}).encode(), {}, 400,
         "unknown output"),
        ("POST", infer, json.dumps({"inputs": [good], "outputs": "class"}).encode(), {}, 400, "'outputs'"),
        ("POST", infer, b"x" * (5 << 20), {}, 400, "exceeds the limit"),
        ("POST", infer, head + raw, {"Inference-Header-Content-Length": str(len(head))}, 400, "binary_data_size"),
        ("POST", infer, head + raw, {"Inference-Header-Content-Length": "abc"}, 400, "not an integer"),
        ("POST", infer, head + raw, {"Inference-Header-Content-Length": str(10**9)}, 400, "outside the body"),
        ("POST", infer, head + raw[:100], {"Inference-Header-Content-Length": str(len(head))}, 400,
         "binary_data_size"),
        ("POST", infer, body() + b"junk", {"Inference-Header-Content-Length": str(len(body()))}, 400,
         "binary data sent"),
        ("POST", infer, body(), {"authorization": "Bearer wrong"}, 401, "bearer token"),
        ("GET", "/metrics", b"", {"authorization": ""}, 401, "bearer token"),
    ]
    return cases


def test_server_bad_input_matrix_http_and_grpc(srv, wire):
    """Every route with bad input: a clear one-line error, nothing queued, no traceback, still serving."""
    xs, ys = wire
    x = xs[0]
    want = int(_reference_class(x))
    t0 = time.monotonic()
    for method, path, body, headers, status, words in _http_cases(x):
        got, resp = _http(srv, method, path, body, headers)
        assert got == status and words in resp.get("error", ""), (method, path, body[:80], got, resp)
        assert "\n" not in resp["error"]
        _good_http(srv, x, want)
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/ready",
                 "/metrics"):
        assert _http(srv, "GET", path)[0] == 200, path
    http_s = time.monotonic() - t0

    client = tg.InferenceServerClient(srv.grpc)

    def infer(arr: np.ndarray, shape: list[int] | None = None, dtype: str = "FP32", model: str = MODEL,
              headers: dict | None = AUTH, **kw):
        inp = tg.InferInput("input", shape or list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        return client.infer(model, [inp], headers=headers, **kw)

    one = xs[:1]
    grpc_cases = [
        (lambda: infer(one, model="nosuch"), "NOT_FOUND", "unknown model"),
        (lambda: infer(one, model_version="7"), "NOT_FOUND", "unknown version"),
        (lambda: infer(one.astype(np.float64), dtype="FP64"), "INVALID_ARGUMENT", "must be FP32"),
        (lambda: infer(one[:, :, :, 0]), "INVALID_ARGUMENT", "input shape"),
        (lambda: infer(np.full_like(one, np.nan)), "INVALID_ARGUMENT", "NaN or Inf"),
        (lambda: infer(np.full_like(one, np.inf)), "INVALID_ARGUMENT", "NaN or Inf"),
        (lambda: infer(np.full_like(one, 99.0)), "INVALID_ARGUMENT", "raw pixel values 0-16"),
        (lambda: infer(np.zeros((300, 8, 8, 1), np.float32)), "INVALID_ARGUMENT", "at most"),
        (lambda: infer(np.zeros((20000, 8, 8, 1), np.float32)), "RESOURCE_EXHAUSTED", "larger than max"),
        (lambda: infer(one, parameters={"deadline_ms": -1.0}), "INVALID_ARGUMENT", "deadline_ms"),
        (lambda: infer(one, outputs=[tg.InferRequestedOutput("nope")]), "INVALID_ARGUMENT", "unknown output"),
        (lambda: infer(one, headers=None), "UNAUTHENTICATED", "bearer token"),
        (lambda: client.get_model_metadata("nosuch", headers=AUTH), "NOT_FOUND", "unknown model"),
    ]
    for call, code, words in grpc_cases:
        with pytest.raises(InferenceServerException) as exc:
            call()
        assert code in str(exc.value.status()) and words in exc.value.message(), (code, words, str(exc.value))
        assert int(infer(one).as_numpy("class")[0]) == want
    # the same in one stream: each bad request is that response's error, the stream goes on
    got: dict[str, int] = {}
    errs: list[str] = []
    done = threading.Semaphore(0)

    def callback(result, error):
        if error is not None:
            errs.append(str(error))
        else:
            got[result.get_response().id] = int(result.as_numpy("class")[0])
        done.release()

    stream_bad = [(np.full_like(one, np.nan), "FP32"), (one[:, :, :, 0], "FP32"), (np.full_like(one, 20.0), "FP32"),
                  (one.astype(np.float64), "FP64")]
    client.start_stream(callback=callback, headers=AUTH)
    for k, (arr, dtype) in enumerate(stream_bad):
        for rid, (a, dt) in ((f"bad{k}", (arr, dtype)), (f"good{k}", (one, "FP32"))):
            inp = tg.InferInput("input", list(a.shape), dt)
            inp.set_data_from_numpy(a)
            client.async_stream_infer(MODEL, [inp], request_id=rid)
    for _ in range(2 * len(stream_bad)):
        assert done.acquire(timeout=30)
    client.stop_stream()
    assert got == {f"good{k}": want for k in range(len(stream_bad))}
    assert len(errs) == len(stream_bad) and all("INVALID_ARGUMENT" in e for e in errs), errs
    meta = client.get_model_metadata(MODEL, headers=AUTH, as_json=True)
    assert meta["inputs"][0]["shape"] == ["-1", "8", "8", "1"]
    client.close()
    log = srv.stderr()
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]
    assert srv.proc.poll() is None
    print(f"bad-input matrix: {len(_http_cases(x))} HTTP cases in {http_s:.1f} s, {len(grpc_cases)} gRPC cases")


def _reference_class(x_wire: np.ndarray) -> int:
    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.host_driver.serving import load_network
    from fluidnpu.serving.protocol import input_contract

    qnet = load_network(MODEL)[1]
    bundle = D.default_design(4)
    x = input_contract(MODEL, x_wire.shape).to_network(x_wire[None])
    with NpuDriver(ModelDevice(bundle), bundle) as drv:
        return NetworkRuntime(qnet, drv).infer(x)[0].pred


# ---------------------------------------------------------------- signals
def test_edge_stops_on_sigint_and_sigterm(srv):
    procs = {sig: subprocess.Popen([*CLI, "edge", "--url", srv.grpc, "--protocol", "grpc-stream", "--devices", "2",
                                    "--rate", "50", "--duration", "60", "--token-file", str(srv.token_file)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for sig in (signal.SIGINT, signal.SIGTERM)}
    time.sleep(4.0)                           # started, streaming
    for sig, p in procs.items():
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        assert time.monotonic() - t0 < 3.0, (sig, err[-2000:])
        assert p.returncode != 0 and "Traceback" not in err, (sig, p.returncode, err[-2000:])
        assert len(err.strip().splitlines()) <= 1, err


def _stop(server: TokenServer, sig: int) -> str:
    """Signal a server whose --stop-after timer still runs: it must drain and exit at once, code 0, and say so
    in one line; that line."""
    t0 = time.monotonic()
    server.proc.send_signal(sig)
    server.proc.communicate(timeout=30)
    took = time.monotonic() - t0
    log = server.stderr()
    assert took < 5.0 and server.proc.returncode == 0, (took, server.proc.returncode, log[-2000:])
    assert "Traceback" not in log, log[-2000:]
    return log.strip().splitlines()[-1]


def test_serve_stops_on_sigint_right_after_the_drain(tmp_path):
    line = _stop(TokenServer(tmp_path), signal.SIGINT)
    assert line == "drained in " + line[len("drained in "):] and line.endswith(": admitted 0, answered 0, errors 0, "
                                                                               "rejected 0"), line
