"""`fluidnpu serve --fleet`: the fleet behind one KServe v2 endpoint on Ray Serve (fluidnpu/serving/fleet.py).

Skipped without the 'fleet' extra (Ray Serve); runs in `make test-fleet`. One server for the whole check
(Ray and Serve take most of a minute to start on a loaded 2-core host): the CLI runs in this process's main
thread with --stop-after, a client thread drives it over HTTP and kills a device's actor mid-load.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
th = pytest.importorskip("tritonclient.http")

from serve_helpers import busy_port, free_port as _free_port  # noqa: E402

from fluidnpu.cli import main  # noqa: E402

STOP_AFTER_S = 28.0


@pytest.fixture(scope="module")
def fleet_files(tmp_path_factory):
    """Two ZC706 boards with a ResNet-50 design (digits-ee runs there on its bundle for that design) and one
    small board with digits-ee's own design; digits-ee and ResNet-50 sessions."""
    from fluidnpu import digits_ee as D
    from fluidnpu.boards import load_board
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.design import load_model
    from fluidnpu.dse.search import DSEOptions, evaluate_design

    d = tmp_path_factory.mktemp("fleet_serve")
    r50 = bundle_from_result(evaluate_design(load_model("resnet50"), load_board("zc706"), 3992, 14, 64,
                                             DSEOptions(bmax=8), allow_oversize=True))
    r50.save(d / "r50.json")
    D.default_design(4).save(d / "dg.json")
    (d / "fleet.json").write_text(json.dumps({"devices": [{"name": "zc706-r50", "design": "r50.json", "count": 2},
                                                          {"name": "small-dg", "design": "dg.json", "count": 1}]}))
    (d / "sessions.json").write_text(json.dumps([{"model": "digits-ee", "rate": 20, "slo_ms": 300},
                                                 {"model": "resnet50", "rate": 2, "slo_ms": 3000}]))
    return d, r50


@pytest.fixture(scope="module")
def digits():
    """Test inputs and what one device answers for them: the runtime on a ModelDevice of the default design."""
    from fluidnpu import digits_ee as D
    from fluidnpu.host_driver.driver import NpuDriver
    from fluidnpu.host_driver.model_device import ModelDevice
    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.host_driver.serving import load_network

    _, qnet, xte, _ = load_network("digits-ee")
    x = np.ascontiguousarray(xte[:12], dtype=np.float32)
    bundle = D.default_design(4)
    with NpuDriver(ModelDevice(bundle), bundle) as drv:
        states = NetworkRuntime(qnet, drv).infer(x)
    return x, np.array([s.pred for s in states]), np.stack([s.logits for s in states]).astype(np.float32)


def _post(port: int, model: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", f"/v2/models/{model}/infer", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    status, payload = r.status, r.read()
    conn.close()
    return status, json.loads(payload)


def _get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    status, payload = r.status, r.read()
    conn.close()
    return status, json.loads(payload)


def _drive(port: int, x: np.ndarray, r50_first_segment_s: float, seen: dict) -> None:
    """The client: answers, an emulated model, bad requests, then a load during which a device is killed."""
    client = th.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    end = time.monotonic() + 180.0         # Ray and Serve start first (tens of seconds on a loaded host)
    while time.monotonic() < end:
        try:
            if client.is_server_ready():
                break
        except Exception:          # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.2)
    seen["ready_at"] = time.monotonic()
    # digits-ee, one sample per request, through tritonclient (JSON tensors)
    answers = []
    for i in range(len(x)):
        inp = th.InferInput("input", [1, *x.shape[1:]], "FP32")
        inp.set_data_from_numpy(x[i:i + 1], binary_data=False)
        r = client.infer("digits-ee", [inp], outputs=[th.InferRequestedOutput(n, binary_data=False)
                                                      for n in ("class", "exit", "logits")])
        answers.append((r.as_numpy("class"), r.as_numpy("logits"), r.get_response()["parameters"]))
    seen["digits"] = answers
    # a zoo model without weights: emulated
    seen["r50_meta"] = client.get_model_metadata("resnet50")
    inp = th.InferInput("input", [1, 224, 224, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 224, 224, 3), np.float32), binary_data=False)
    r = client.infer("resnet50", [inp], outputs=[th.InferRequestedOutput("exit", binary_data=False)])
    seen["r50"] = (r.as_numpy("exit"), r.get_response()["parameters"])
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1], "data": x[0].ravel().tolist()}]}
    seen["bad"] = [_post(port, "nope", body)[0], _post(port, "digits-ee", body | {"parameters": {"session": 1}})[0],
                   _post(port, "resnet50", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 224, 224, 3],
                                                        "data": [0.0] * (224 * 224 * 3)}],
                                            "outputs": [{"name": "class"}]})[0]]
    # load from three clients; the device serving digits-ee is killed after 1.5 s
    status = _get(port, "/v2/fleet")[1]
    victim = status["routes"]["0"]["devices"][0]
    seen["victim"] = victim
    codes: list[int] = []
    stop_at = time.monotonic() + 5.0

    def load(k: int) -> None:
        i = k
        while time.monotonic() < stop_at:
            b = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8, 8, 1],
                             "data": x[i % len(x)].ravel().tolist()}]}
            codes.append(_post(port, "digits-ee", b)[0])
            i += 3

    loaders = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(3)]
    for t in loaders:
        t.start()
    time.sleep(1.5)
    ray.kill(ray.get_actor(status["devices"][victim]["name"], namespace="fluidnpu"))
    for t in loaders:
        t.join(60)
    seen["codes"] = codes
    time.sleep(1.0)
    seen["status_after"] = _get(port, "/v2/fleet")[1]
    seen["r50_first_segment_s"] = r50_first_segment_s


def test_fleet_ingress_answers_like_one_device_emulates_zoo_models_and_survives_a_killed_board(
        fleet_files, digits, capsys):
    d, r50 = fleet_files
    x, classes, logits = digits
    port = _free_port()
    seen: dict = {}
    from fluidnpu.serving.protocol import input_contract

    sent = input_contract("digits-ee", x.shape[1:]).to_wire(x)       # what a client sends: raw pixels 0-16
    client = threading.Thread(target=_drive, args=(port, sent, r50.latency_table()[0][0], seen), daemon=True)
    client.start()
    t0 = time.monotonic()
    try:
        main(["serve", "--fleet", str(d / "fleet.json"), "--sessions", str(d / "sessions.json"),
              "--http-port", str(port), "--epoch", "2", "--stop-after", str(STOP_AFTER_S), "--json"])
    except SystemExit as exc:
        pytest.fail(f"serve --fleet exited with {exc.code}: {capsys.readouterr().err[-2000:]}")
    client.join(30)
    out = capsys.readouterr().out
    start = out.index('{"serving"')                     # the start-up line, then the final report
    first, rest = out[start:].split("\n", 1)
    info, rep = json.loads(first), json.loads(rest[rest.index("{\n"):])   # Ray's raylet may print in between
    assert info["http_port"] == port and set(info["serving"]) == {"digits-ee", "resnet50"}
    assert info["emulated"] == ["resnet50"] and info["devices"] == 3
    assert time.monotonic() - t0 < STOP_AFTER_S + 120           # it stopped by itself
    assert "codes" in seen, f"the client did not finish: {sorted(seen)}"

    # digits-ee: bit-exact with one ModelDevice (the fleet runs it on its bundle for the ResNet-50 design)
    got_cls = np.concatenate([a[0] for a in seen["digits"]])
    got_logits = np.concatenate([a[1] for a in seen["digits"]])
    assert np.array_equal(got_cls, classes) and np.array_equal(got_logits, logits)
    for _, _, p in seen["digits"]:
        assert p["emulated"] is False and p["device_ms"] >= p["modelled_ms"] > 0
    # ResNet-50 has no weights: emulated, the exit only, held at least for its modelled batch time
    assert seen["r50_meta"]["parameters"] == {"emulated": True}
    assert [o["name"] for o in seen["r50_meta"]["outputs"]] == ["exit"]
    ex, p = seen["r50"]
    assert p["emulated"] is True and 0 <= int(ex[0]) <= 3
    assert p["modelled_ms"] >= seen["r50_first_segment_s"] * 1e3 * 0.999
    assert p["server_ms"] >= p["device_ms"] >= p["modelled_ms"] * 0.99
    # unknown model 404; a session of another model 400; class scores of an emulated model 400
    assert seen["bad"] == [404, 400, 400]

    # the kill: every request answered or explicitly refused, and the counters add up
    codes = seen["codes"]
    assert len(codes) > 20 and set(codes) <= {200, 503}
    c = rep["counters"]
    n_client = len(seen["digits"]) + 1 + len(codes)
    assert c["requests"] == n_client == c["answered"] + sum(v for k, v in c.items() if k.startswith("rejected_")) \
        + c.get("errors", 0)
    assert c["answered"] == len(seen["digits"]) + 1 + codes.count(200)
    assert sum(v for k, v in c.items() if k.startswith("rejected_")) == codes.count(503)
    # the ingress measured the load's rate (samples/s of session 0 over an epoch) and re-planned on it
    assert max(e["rates"]["0"] for e in rep["epochs"] if not e["died"]) > 5
    assert rep["dead"] == [seen["victim"]]
    assert any(seen["victim"] in e["died"] for e in rep["epochs"])       # re-planned on the death
    assert seen["status_after"]["devices"][seen["victim"]]["dead"]
    assert seen["victim"] not in {dv for r in seen["status_after"]["routes"].values() for dv in r["devices"]}
    assert rep["timing_ms"]["runtime"]["requests"] == c["answered"] - 1


@pytest.mark.parametrize("args, words", [
    (["--fleet", "f.json"], "go together"),
    (["--sessions", "s.json"], "go together"),
    (["--epoch", "3"], "options of a fleet"),
    (["--fleet", "f.json", "--sessions", "s.json", "--device", "model"], "--device"),
    (["--fleet", "missing.json", "--sessions", "missing.json"], "does not exist"),
    (["--fleet", "f.json", "--sessions", "s.json", "--epoch", "-1"], "--epoch"),
    (["--fleet", "f.json", "--sessions", "s.json", "--http-port", "0"], "--http-port"),
])
def test_fleet_serve_bad_options_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_fleet_serve_busy_port_exits_2_before_ray_starts(capsys):
    with busy_port() as busy:
        port = str(busy)
        t0 = time.monotonic()
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--fleet", "f.json", "--sessions", "s.json", "--http-port", port])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"--http-port {port}" in err and "in use" in err, err
    assert len(err.strip().splitlines()) == 1 and time.monotonic() - t0 < 5


@contextmanager
def _fleet_in_its_session(d) -> Iterator[subprocess.Popen]:
    """`serve --fleet` with a long --stop-after in a session of its own; after the block nothing of that
    session (Ray's local processes included) may be left, and whatever is, is killed."""
    p = subprocess.Popen([sys.executable, "-m", "fluidnpu.cli", "serve", "--fleet", str(d / "fleet.json"),
                          "--sessions", str(d / "sessions.json"), "--http-port", str(_free_port()),
                          "--stop-after", "600"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield p
        time.sleep(2.0)
        with pytest.raises(ProcessLookupError):   # no process left in its session's group
            os.killpg(p.pid, 0)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_fleet_serve_stops_on_a_signal_and_leaves_no_process(fleet_files, sig):
    """`serve --fleet` in its own session, a long --stop-after: the signal drains it, it exits 0 with one
    line, and nothing of its session (Ray's local processes included) outlives it."""
    d, _ = fleet_files
    with _fleet_in_its_session(d) as p:
        t_end = time.monotonic() + 180            # Ray and Serve start first
        line = ""
        while time.monotonic() < t_end and p.poll() is None:
            line = p.stdout.readline()
            if line.startswith('{"serving"'):
                break
        assert line.startswith('{"serving"'), p.stderr.read()[-2000:] if p.poll() is not None else "not ready"
        t0 = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        took = time.monotonic() - t0
        assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
        assert "drained" in err.strip().splitlines()[-1], err[-2000:]
        print(f"serve --fleet stopped {took:.1f} s after {sig.name}")


def test_fleet_serve_stops_on_sigterm_during_rays_start_up(fleet_files):
    """SIGTERM while Ray's and Serve's processes come up (their start-up installs a fatal-signal handler that
    would abort): the command unwinds, says so in one line, exits 130 and shuts the local Ray down."""
    d, _ = fleet_files
    with _fleet_in_its_session(d) as p:
        t_end = time.monotonic() + 120
        err = ""
        while time.monotonic() < t_end and p.poll() is None and "Started a local Ray instance" not in err:
            err += p.stderr.readline()
        assert p.poll() is None and "Started a local Ray instance" in err, err[-2000:]
        p.send_signal(signal.SIGTERM)
        out, rest = p.communicate(timeout=120)
        err += rest
        assert p.returncode == 130 and "Traceback" not in err and "SIGTERM received" not in err, err[-2000:]
        assert err.strip().splitlines()[-1].startswith("interrupted"), err[-2000:]
        assert '"serving"' not in out
