"""`fluidnpu serve`: one device, one scheduler, HTTP and gRPC in one asyncio loop.

`serve_on_driver(driver, cfg)` is module-level so that `--device rtl` runs the
whole server inside the cocotb + Verilator simulation (as `fluidnpu run`
does); the other devices call it with their NpuDriver directly. The latency
table is measured on the device at start-up (scheduler_fw/device_backend.py
`measure_table`); with `--pace board` each run is held for the device's
modelled cycles at the board clock and the table is the larger of the
measured and the modelled one, so the scheduler plans with board latencies.

SIGTERM or SIGINT: stop admitting (new requests: 503 / UNAVAILABLE
"draining"), let every admitted sample leave, close both transports, exit 0.
On start it prints one JSON line (`{"serving": ..., "http_port": ..., ...}`)
to stdout, so a parent process knows the ports and that it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from fluidnpu.errors import FluidError

if TYPE_CHECKING:   # the devices are imported where one is chosen, so a server loads only its own
    from fluidnpu.host_driver.device import Device

POLICY_SLO_SHARE = 0.6


@dataclasses.dataclass
class Server:
    """What the transports share: the engine, the served model, auth and TLS, the metrics."""

    engine: Any
    model: Any
    token: str | None
    tls: tuple[str, str] | None
    metrics: Any


def read_token(token_file: str | None) -> str | None:
    """The bearer token in `--token-file` (None without one), or a one-line error."""
    if not token_file:
        return None
    try:
        token = open(token_file, encoding="utf-8").read().strip()
    except OSError as exc:
        raise FluidError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
    if not token:
        raise FluidError(f"--token-file {token_file} is empty")
    return token


def check_addresses(host: str, ports: dict[str, int]) -> None:
    """One-line FluidErrors, before minutes of start-up, for what would stop the transports binding: an
    unresolvable or foreign --host, two options on one port, a port in use or one that needs privileges.
    `ports`: option name -> port (0: any free port, not checked)."""
    import errno
    import socket

    fixed = {o: p for o, p in ports.items() if p}
    same = [o for o, p in fixed.items() if list(fixed.values()).count(p) > 1]
    if same:
        raise FluidError(f"{' and '.join(same)} are the same port ({fixed[same[0]]}): give each its own")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise FluidError(f"--host {host!r} is not an address or a name this machine can resolve "
                         f"({getattr(exc, 'strerror', None) or exc})") from None
    family, addr = infos[0][0], infos[0][4][0]
    for option, port in {**fixed, "--host": 0}.items():
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as uvicorn and grpc bind
            try:
                sock.bind((addr, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise FluidError(f"{option} {port}: the port is in use on {host} (another server?); "
                                     f"pick a free one (0: any)") from None
                if exc.errno == errno.EACCES:
                    raise FluidError(f"{option} {port}: ports below 1024 need privileges; pick one above "
                                     f"1023") from None
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise FluidError(f"--host {host}: not an address of this machine (127.0.0.1: this machine "
                                     f"only; 0.0.0.0: every interface)") from None
                raise FluidError(f"cannot bind {host}:{port} ({option}): {exc.strerror or exc}") from None


def _paced_table(table: Any, bundle: Any, bmax: int) -> Any:
    from fluidnpu.scheduler_fw.latency import LatencyTable

    board = LatencyTable.from_bundle(bundle, bmax)

    def mx(a: Any, b: Any) -> tuple:
        return tuple(tuple(max(x, y) for x, y in zip(r, s)) for r, s in zip(a, b))

    return dataclasses.replace(table, segment_seconds=mx(table.segment_seconds, board.segment_seconds),
                               layer_seconds=mx(table.layer_seconds, board.layer_seconds))


def build_engine(driver: Any, cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(engine, served model, metrics) on `driver`, latency table measured, not yet started."""
    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.scheduler_fw.device_backend import measure_table
    from fluidnpu.scheduler_fw.registry import make_policy
    from fluidnpu.serving.engine import ServingEngine
    from fluidnpu.serving.metrics import ServeMetrics
    from fluidnpu.serving.protocol import ServedModel

    qnet, bundle = cfg["qnet"], cfg["bundle"]
    rt = NetworkRuntime(qnet, driver, bmax=cfg["bmax"], tau=cfg["tau"], timeout_s=cfg["timeout_s"])
    table = measure_table(rt, bundle, batch_sizes=cfg["calib_sizes"], reps=cfg["calib_reps"],
                          warmup=cfg.get("calib_warmup", 1),
                          name=f"{cfg['model']} measured on {cfg['device']}")
    pace_hz = None
    if cfg["pace"] == "board":
        pace_hz = bundle.clock_mhz * 1e6
        table = _paced_table(table, bundle, rt.bmax)
    n_classes = int(rt.infer(cfg["probe"])[0].logits.size)
    metrics = ServeMetrics()
    # the policy plans with part of the SLO: the rest is the transports' (decode, event loop, encode) under load
    policy = make_policy(cfg["policy"], table, cfg["slo_s"] * POLICY_SLO_SHARE, rt.bmax)
    engine = ServingEngine(rt, table, policy, slo_s=cfg["slo_s"],
                           max_queue=cfg["max_queue"], pace_hz=pace_hz, metrics=metrics)
    model = ServedModel(cfg["model"], qnet.input_hwc, n_classes, len(rt.segment_stops))
    return engine, model, metrics


class _Uvicorn:
    """uvicorn.Server without its own signal handling (the serve loop drains first, then stops it)."""

    @staticmethod
    def make(app: Any, host: str, port: int, tls: tuple[str, str] | None) -> Any:
        import uvicorn

        class Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # type: ignore[override]
                yield

        kw: dict[str, Any] = {}
        if tls:
            kw = {"ssl_certfile": tls[0], "ssl_keyfile": tls[1]}
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=10, **kw)
        return Quiet(config)


async def _transports(server: Server, cfg: dict[str, Any], started: threading.Event,
                      stop: list) -> dict[str, Any]:
    """HTTP and gRPC in one asyncio loop (a thread beside the scheduler's) until `stop[0]` is set."""
    from fluidnpu.serving.grpc_api import start_grpc
    from fluidnpu.serving.http_api import build_app

    http = _Uvicorn.make(build_app(server), cfg["host"], cfg["http_port"], server.tls)
    http_task = asyncio.ensure_future(http.serve())
    while not http.started:
        if http_task.done():
            try:
                http_task.result()
            except (SystemExit, OSError):   # uvicorn exits(3) when it cannot bind; it logged why
                pass
            raise FluidError(f"cannot serve HTTP on {cfg['host']}:{cfg['http_port']} (in use, or not an "
                             f"address of this machine)")
        await asyncio.sleep(0.01)
    try:
        grpc_srv, grpc_port = await start_grpc(server, cfg["host"], cfg["grpc_port"])
    except BaseException:
        http.should_exit = True
        await http_task
        raise
    stop.append(asyncio.Event())
    stop.append(asyncio.get_running_loop())
    stop.append(http.servers[0].sockets[0].getsockname()[1])
    stop.append(grpc_port)
    started.set()
    await stop[0].wait()
    await asyncio.sleep(0.05)                  # let the last answers be written
    await grpc_srv.stop(5.0)
    http.should_exit = True
    await http_task
    return {}


def _watch_stop_file(path: str, engine: Any) -> None:
    while not os.path.exists(path) and not engine.draining:
        time.sleep(0.05)
    engine.begin_drain()


def serve_on_driver(driver: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Serve until SIGTERM on one NpuDriver (module-level: it also runs inside the RTL simulation).

    The scheduler loop runs in this thread (the only one that touches the device); the transports
    run in a second thread. SIGTERM/SIGINT (when this is the main thread) start the drain."""
    engine, model, metrics = build_engine(driver, cfg)
    # the scheduler thread shares the GIL with the transports' event loop: hand it over every 0.5 ms, not 5 ms
    switch = sys.getswitchinterval()
    sys.setswitchinterval(5e-4)
    try:
        return _serve(engine, model, metrics, cfg)
    finally:
        sys.setswitchinterval(switch)


def _serve(engine: Any, model: Any, metrics: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    server = Server(engine, model, cfg["token"], cfg["tls"], metrics)
    started, failed = threading.Event(), []
    stop: list = []                     # the transports' event, loop and ports, as `_transports` appends them

    def transports() -> None:
        try:
            asyncio.run(_transports(server, cfg, started, stop))
        except BaseException as exc:   # noqa: BLE001 - reported by the main thread
            failed.append(exc)
            started.set()

    th = threading.Thread(target=transports, name="fluidnpu-transports", daemon=True)
    th.start()
    started.wait()
    if failed:
        raise failed[0]
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            # SIGINT and SIGTERM both drain (replacing the CLI's SIGTERM -> KeyboardInterrupt while serving);
            # never drain inside the handler: it may interrupt the loop while it holds the engine's lock
            previous[sig] = signal.signal(
                sig, lambda *_: threading.Thread(target=engine.begin_drain, daemon=True).start())
    timer = None
    if cfg.get("stop_after_s"):
        timer = threading.Timer(cfg["stop_after_s"], engine.begin_drain)
        timer.daemon = True
        timer.start()
    if cfg.get("stop_file"):                            # inside the RTL simulation: the parent's SIGTERM
        threading.Thread(target=_watch_stop_file, args=(cfg["stop_file"], engine), daemon=True).start()
    print(json.dumps({"serving": model.name, "host": cfg["host"], "http_port": stop[2], "grpc_port": stop[3],
                      "device": cfg["device"], "policy": cfg["policy"], "bmax": engine.runtime.bmax,
                      "slo_ms": cfg["slo_s"] * 1e3}), flush=True)
    try:
        engine.run()                                    # until drained
        if timer is not None:                           # drained by a signal: exit now, not at the timer
            timer.cancel()
        t0 = time.monotonic()
        stop[1].call_soon_threadsafe(stop[0].set)
        th.join(30)
        counters = engine.check_counters()
        engine.runtime.release()
    finally:
        # a second signal while the transports close only asks for the drain again
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if timer is not None:
            timer.cancel()
    return {"drained_s": time.monotonic() - t0, "counters": counters,
            "loop_error": None if engine.loop_error is None else repr(engine.loop_error)}


def serve_command(*, device: str, design: str | None, bitstream: str | None, model: str, policy: str,
                  slo_ms: float, max_queue: int, tau: float, bmax: int | None, host: str, http_port: int,
                  grpc_port: int, token_file: str | None, tls_cert: str | None, tls_key: str | None,
                  pace: str | None, uio: str, stop_after_s: float | None = None,
                  stop_file: str | None = None) -> dict[str, Any]:
    """Check the options, open the device, serve until SIGTERM (or `stop_file` appears: for callers that
    run the server in a thread of their own); the final counters."""
    from fluidnpu.host_driver.serving import _check_design, load_network
    from fluidnpu.quantize import check_tau
    from fluidnpu.scheduler_fw.policy import check_positive
    from fluidnpu.scheduler_fw.registry import policy_spec
    from fluidnpu.serving.protocol import check_runtime_model

    check_runtime_model(model, "serve")
    policy = policy_spec(policy).name
    check_positive(slo_ms, "--slo (ms)")
    if stop_after_s is not None:
        check_positive(stop_after_s, "--stop-after (s)")
    check_tau(tau)
    for port, what in ((http_port, "--http-port"), (grpc_port, "--grpc-port")):
        if not 0 <= port <= 65535:
            raise FluidError(f"{what} must be in 0..65535, got {port}")
    check_addresses(host, {"--http-port": http_port, "--grpc-port": grpc_port})
    token = read_token(token_file)
    if bool(tls_cert) != bool(tls_key):
        raise FluidError("--tls-cert and --tls-key go together")
    tls = (tls_cert, tls_key) if tls_cert else None
    if device in ("pynq", "devmem") and not design:
        raise FluidError(f"--device {device} needs --design (the bundle the bitstream was built from)")
    if device == "pynq" and not bitstream:
        raise FluidError("--device pynq needs --bitstream npu.bit (its .hwh beside it)")
    if bitstream and device != "pynq":
        raise FluidError(f"--bitstream is flashed by --device pynq only, not --device {device}")
    _, qnet, xte, _ = load_network(model)
    if design:
        from fluidnpu.scheduler_fw.latency import load_design

        bundle = load_design(design)
        _check_design(bundle, qnet)
    else:
        from fluidnpu import digits_ee as D

        bundle = D.default_design(bmax or 4)
    if bmax is not None and not 1 <= bmax <= bundle.bmax:
        raise FluidError(f"--bmax must be in 1..{bundle.bmax} (the design's Bmax), got {bmax}")
    from fluidnpu.scheduler_fw.device_backend import calibration

    cfg = {"qnet": qnet, "bundle": bundle, "bmax": bmax or bundle.bmax, "tau": tau, "model": qnet.workload.name,
           "device": device, "policy": policy, "slo_s": slo_ms / 1e3, "max_queue": max_queue, "pace": pace,
           "host": host, "http_port": http_port, "grpc_port": grpc_port, "token": token, "tls": tls,
           "probe": xte[:1], "timeout_s": 2.0 if device != "rtl" else 600.0,
           "stop_after_s": stop_after_s, "stop_file": stop_file, **calibration(device, bmax or bundle.bmax)}
    if device == "rtl":
        import tempfile

        from fluidnpu.host_driver.rtl_sim_device import run_with_rtl

        # the server runs inside the simulator's bridge thread, where no signal handler can be set: this
        # process turns SIGTERM/SIGINT into a file the server watches, then waits for its drain
        with tempfile.TemporaryDirectory(prefix="fluidnpu_serve_") as tmp:
            cfg["stop_file"] = os.path.join(tmp, "stop")
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: open(cfg["stop_file"], "w").close())
            return run_with_rtl(bundle.data, serve_on_driver, cfg)
    from fluidnpu.host_driver.driver import NpuDriver

    dev: Device
    if device == "model":
        from fluidnpu.host_driver.model_device import ModelDevice

        dev = ModelDevice(bundle)
    elif device == "pynq":
        from fluidnpu.host_driver.pynq_device import PynqDevice

        dev = PynqDevice(bitstream, bundle=bundle)        # flashes the bitstream after checking its .hwh
    else:
        from fluidnpu.host_driver.devmem_device import DevMemDevice

        dev = DevMemDevice(uio=uio)
    with NpuDriver(dev, bundle) as drv:
        return serve_on_driver(drv, cfg)

