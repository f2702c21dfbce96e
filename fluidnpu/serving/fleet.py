"""`fluidnpu serve --fleet F.json --sessions S.json`: a fleet behind one KServe v2 endpoint on Ray Serve.

The Nexus plan of the sessions over the fleet (scheduler_fw/fleet) is served by
the device actors of `ray_fleet.Fleet` (one per device, pinned by its kind's
custom resource); the ingress is a Ray Serve deployment (one replica) that
owns the Fleet and answers the Open Inference protocol over HTTP with the
parsing and encoding of `fluidnpu serve` (serving/http_api.py). A request
names a model; the model's session (the first of the sessions file that names
it, or the request parameter `session`) is routed to one of the plan's nodes
for that session in proportion to their rate shares.

Why a deployment whose `__call__` takes Starlette requests: Ray Serve hands an
HTTP request to a deployment's `__call__` as a `starlette.requests.Request` and
sends back the Starlette `Response` it returns (its plain HTTP path in every
Ray 2.x); `@serve.ingress` takes an ASGI app or a builder that runs on the
replica without the replica's state, and the routes need the Fleet this
replica owns. So `__call__` runs a Starlette Router bound to that state.

The ingress counts each session's samples; every epoch `Fleet.step` (the code
path of `fluidnpu plan --run`) re-plans on the measured rates when the
hysteresis says so, and four health probes per epoch find dead devices. A
request whose device dies under it (or that reaches a device the session has
just moved off) re-plans at once and is retried on a live node; a session
with no live node is answered 503 with the reason. Every request ends
answered or refused, counted: requests = answered + rejected_* + errors.

Models with a runtime (digits-ee) run on the devices for real (NpuDriver on a
ModelDevice of the model's bundle on the node's design, held for its modelled
cycles at the board clock); zoo models without weights are emulated: paced to
the perf model's batch time, answering only the exit segment, and their
responses say `"emulated": true`.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError

# The planner's margins for wall-clock serving: those of benchmarks/fleet_scenarios.py (docs/fleet.md),
# the settings under which the scenarios keep >= 99 % of requests within their SLOs.
HEADROOM = 0.5
SLO_MARGIN = 0.1
JITTER_S = 0.020
QUANTILE = 0.99
SESSION_PARAM = "session"
LAT_WINDOW = 100_000


class Unavailable(Exception):
    """A request the fleet cannot serve now (503): draining, or no live device serves its session."""


@dataclass
class FleetConfig:
    """What the ingress replica needs to build the Fleet: picklable, made by `prepare` in the CLI process."""

    plan: Any
    kinds: list[Any]
    models: dict[str, Any]                    # served name -> ServedModel
    session_models: list[str]                 # served name of each session (sessions-file order)
    runtimes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    epoch_s: float = 5.0
    seed: int = 0
    tau: float = 0.8
    actor_prefix: str = "fluidnpu-device-"


def served_name(model: str) -> str:
    """The KServe model name of a session's model: the zoo name, or an ONNX file's stem."""
    return Path(model).stem if model.lower().endswith(".onnx") else model


def runtime_key(model: str) -> str | None:
    """The runtime model (`fluidnpu.host_driver.serving.MODELS`) a session model names, or None."""
    from fluidnpu.host_driver.serving import MODELS

    key = model.lower().replace("_", "-")
    return key if key in MODELS else None


def prepare(fleet_path: str, sessions_path: str, epoch_s: float, seed: int, tau: float) -> FleetConfig:
    """Read and plan (one-line FluidErrors), and make every model's served metadata and every NPU kind's
    runtime bundles (the runtime model on the kind's design)."""
    from fluidnpu.design import load_model
    from fluidnpu.host_driver.runtime import NetworkRuntime
    from fluidnpu.host_driver.serving import load_network
    from fluidnpu.scheduler_fw.fleet.inputs import device_kinds, load_fleet_file, load_sessions
    from fluidnpu.scheduler_fw.fleet.nexus import plan
    from fluidnpu.scheduler_fw.fleet.profiles import bundle_on_design
    from fluidnpu.scheduler_fw.latency import load_design
    from fluidnpu.serving.protocol import ServedModel

    sessions = load_sessions(sessions_path)
    devices = load_fleet_file(fleet_path)
    kinds = device_kinds(devices, [s.model for s in sessions])
    p = plan(sessions, kinds, HEADROOM, SLO_MARGIN, JITTER_S, QUANTILE)
    models: dict[str, ServedModel] = {}
    names = [served_name(s.model) for s in sessions]
    for s, name in zip(sessions, names):
        if name in models:
            continue
        key = runtime_key(s.model)
        if key is not None:
            _, qnet, xte, _ = load_network(key)
            n_classes = int(NetworkRuntime(qnet).infer(xte[:1])[0].logits.size)
            models[name] = ServedModel(name, qnet.input_hwc, n_classes, len(qnet.workload.exits))
        else:
            wl = load_model(s.model)
            c, h, w = wl.input_shape
            models[name] = ServedModel(name, (h, w, c), 0, len(wl.exits), emulated=True)
    runtimes: dict[str, dict[str, dict[str, Any]]] = {}
    for d, k in zip(devices, kinds):
        if d["kind"] != "npu":
            continue
        bundle = load_design(d["design"])
        for m in dict.fromkeys(s.model for s in sessions):
            key = runtime_key(m)
            if key is not None and m in k.profiles:
                runtimes.setdefault(k.name, {})[key] = bundle_on_design(bundle, load_model(m)).data
    return FleetConfig(p, kinds, models, names, runtimes, epoch_s, seed, tau)


class FleetService:
    """The ingress's state (in the Serve replica): the Fleet, the sessions' rate windows, the counters.

    Everything runs in the replica's event loop (requests and the epoch ticker), so the Fleet is never
    touched from two threads."""

    def __init__(self, cfg: FleetConfig) -> None:
        from fluidnpu.scheduler_fw.fleet.ray_fleet import Fleet

        self.cfg = cfg
        self.fleet = Fleet(cfg.plan, cfg.kinds, seed=cfg.seed, headroom=HEADROOM, slo_margin=SLO_MARGIN,
                           jitter_s=JITTER_S, runtimes=cfg.runtimes, tau=cfg.tau, actor_prefix=cfg.actor_prefix)
        self.ray = self.fleet.ray
        self.models = cfg.models
        self.sessions_of: dict[str, list[int]] = {}
        for i, name in enumerate(cfg.session_models):
            self.sessions_of.setdefault(name, []).append(i)
        self.slo_s = {s.index: s.slo_s for s in cfg.plan.sessions}
        self.counters: Counter[str] = Counter()
        self.window = {i: 0 for i in range(len(cfg.session_models))}
        self.rng = random.Random(cfg.seed + 1)
        self.t0 = time.monotonic()
        self.draining = False
        self.inflight = 0
        # per answered request: session, server s, device s (arrival at the actor to its batch's end),
        # modelled s (its batch's), emulated
        self.timings: deque[tuple[int, float, float, float, bool]] = deque(maxlen=LAT_WINDOW)
        self._ticker: asyncio.Task | None = None

    # ---- epochs
    def start(self) -> None:
        """Start the epoch ticker in the running event loop (once)."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        epoch_s = self.cfg.epoch_s
        health_s = epoch_s / 4 if epoch_s else 1.0
        epoch_start = next_epoch = time.monotonic()
        next_epoch += epoch_s if epoch_s else float("inf")
        while not self.draining:
            await asyncio.sleep(health_s)
            now = time.monotonic()
            due = now >= next_epoch
            self.fleet.probe(now - self.t0, self.window if due else None, now - epoch_start)
            if due:
                self.window = {k: 0 for k in self.window}
                epoch_start, next_epoch = now, next_epoch + epoch_s

    def _lost(self, device: int) -> None:
        """A request found `device` dead: it leaves the fleet and the plan is re-made at once."""
        if self.fleet.mark_dead(device):
            self.counters["deaths_found_by_requests"] += 1
            self.fleet.step(time.monotonic() - self.t0, [device])

    # ---- requests
    def session_for(self, model: str, params: Any) -> int:
        """The session a request of `model` goes to: parameter `session` (its index in the sessions file),
        else the first session of that model."""
        mine = self.sessions_of[model]
        if not isinstance(params, dict) or SESSION_PARAM not in params:
            return mine[0]
        from fluidnpu.serving.protocol import BadRequest

        s = params[SESSION_PARAM]
        if not isinstance(s, int) or isinstance(s, bool) or s not in mine:
            raise BadRequest(f"parameter {SESSION_PARAM!r} must be one of the sessions of {model!r} "
                             f"({', '.join(map(str, mine))}), got {s!r}")
        return s

    async def infer(self, session: int, xs: Any, emulated: bool) -> tuple[list[dict[str, Any]], int, int]:
        """Each sample of `xs` through a node of `session`: (answers, device, retries). Unavailable when the
        fleet is draining or no live device serves the session (counted); a device that dies under the
        request re-plans and the request is retried on a live node (at most once per device)."""
        self.counters["requests"] += 1
        self.window[session] += len(xs)
        if self.draining:
            self.counters["rejected_draining"] += 1
            raise Unavailable("the fleet is shutting down")
        from fluidnpu.scheduler_fw.fleet.ray_fleet import SessionMoved

        exc_t = self.ray.exceptions
        self.inflight += 1
        retries = 0
        try:
            sent = time.monotonic()
            for _ in range(len(self.fleet.actors) + 1):
                node = self.fleet.route(session, self.rng)
                if node is None or node in self.fleet.dead:
                    break
                actor = self.fleet.actors[node]
                try:
                    answers = await asyncio.gather(*(actor.infer.remote(session, sent, None if emulated else x)
                                                     for x in xs))
                except exc_t.RayActorError:
                    self._lost(node)
                except exc_t.RayTaskError as exc:
                    if not isinstance(exc.cause, SessionMoved):
                        self.counters["errors"] += 1
                        raise
                    # the session moved off this device between routing and arrival: route again
                else:
                    self.counters["answered"] += 1
                    self.counters["retried"] += retries
                    return answers, node, retries
                retries += 1
            self.counters["rejected_no_device"] += 1
            self.counters["retried"] += retries
            raise Unavailable(f"no live device serves session {session} ({self.cfg.session_models[session]}) "
                              f"in the current plan")
        finally:
            self.inflight -= 1

    # ---- reports
    def status(self) -> dict[str, Any]:
        """The plan, the routes, the dead devices and the counters (GET /v2/fleet)."""
        f = self.fleet
        return {"devices": [{"id": i, "kind": k, "name": f"{self.cfg.actor_prefix}{i}", "dead": i in f.dead,
                             "sessions": sorted(f.actor_sessions.get(i, set()))} for i, k in enumerate(f.actor_kind)],
                "routes": {str(s): {"devices": r[0], "shares": r[1]} for s, r in f.routes.items()},
                "nodes": len(f.plan.nodes), "unplaced": [u.session for u in f.plan.unplaced],
                "epochs": len(f.epochs), "counters": self.check_counters(), "inflight": self.inflight}

    def check_counters(self) -> dict[str, int]:
        """The counters, after asserting requests = answered + rejected_* + errors + in flight."""
        c = dict(self.counters)
        ended = c.get("answered", 0) + c.get("errors", 0) + sum(v for k, v in c.items() if k.startswith("rejected_"))
        if c.get("requests", 0) != ended + self.inflight:
            raise RuntimeError(f"fleet counters do not add up: {c}, {self.inflight} in flight")
        return c

    def report(self) -> dict[str, Any]:
        """Counters, epochs and latency figures (ms): the server's time per request, the device's (arrival
        at the actor to the batch's end), the modelled batch time, and the overhead (server - device)."""
        from fluidnpu.serving.percentiles import percentiles

        def pct(xs: Sequence[float]) -> dict[str, float]:
            return percentiles(xs, scale=1e3)

        out: dict[str, Any] = {"counters": self.check_counters(), "uptime_s": time.monotonic() - self.t0,
                               "epochs": self.fleet.epochs, "dead": sorted(self.fleet.dead), "timing_ms": {}}
        for label, keep in (("runtime", False), ("emulated", True)):
            rows = [t for t in self.timings if t[4] == keep]
            if rows:
                out["timing_ms"][label] = {"requests": len(rows), "server": pct([r[1] for r in rows]),
                                           "device": pct([r[2] for r in rows]),
                                           "modelled": pct([r[3] for r in rows]),
                                           "overhead": pct([r[1] - r[2] for r in rows])}
        return out

    async def drain(self, timeout_s: float) -> dict[str, Any]:
        """Stop admitting (503), wait for the requests in flight (bounded), stop the ticker; the report."""
        self.draining = True
        end = time.monotonic() + timeout_s
        while self.inflight and time.monotonic() < end:
            await asyncio.sleep(0.02)
        if self._ticker is not None:
            self._ticker.cancel()
        return self.report()


def build_fleet_app(svc: FleetService) -> Any:
    """The KServe v2 routes of the fleet (Starlette), with serving/http_api.py's parsing and encoding."""
    import numpy as np
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route, Router

    from fluidnpu.serving.http_api import (
        HEADER_LEN,
        decode_request,
        encode_response,
        error_response,
        read_body,
        split_body,
        v2_routes,
    )
    from fluidnpu.serving.protocol import BadRequest, NotFound

    def model_of(request: Request) -> Any:
        name, version = request.path_params["name"], request.path_params.get("version")
        m = svc.models.get(name)
        if m is None:
            raise NotFound(f"unknown model {name!r}; this fleet serves {', '.join(svc.models)}")
        m.check_name(name, version)
        return m

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    def is_ready() -> bool:
        return not svc.draining and len(svc.fleet.dead) < len(svc.fleet.actors)

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": is_ready()}, status_code=200 if is_ready() else 503)

    async def server_meta(request: Request) -> Response:
        return JSONResponse({"name": "fluidnpu-fleet", "version": "0.1.0", "extensions": ["binary_tensor_data"]})

    async def model_meta(request: Request) -> Response:
        try:
            return JSONResponse(model_of(request).metadata())
        except NotFound as exc:
            return error_response(404, str(exc))

    async def model_ready(request: Request) -> Response:
        try:
            m = model_of(request)
        except NotFound as exc:
            return error_response(404, str(exc))
        return JSONResponse({"name": m.name, "ready": is_ready()}, status_code=200 if is_ready() else 503)

    async def fleet_status(request: Request) -> Response:
        return JSONResponse(svc.status())

    async def infer(request: Request) -> Response:
        t_recv = time.monotonic()
        try:
            model = model_of(request)
            body = await read_body(request)
            req, binary = split_body(body, request.headers.get(HEADER_LEN))
            session = svc.session_for(model.name, req.get("parameters"))
            x, deadline, want_binary, outs = decode_request(model, req, binary, svc.slo_s[session])
        except NotFound as exc:
            return error_response(404, str(exc))
        except BadRequest as exc:
            svc.counters["bad_requests"] += 1
            return error_response(400, str(exc))
        try:
            answers, device, retries = await svc.infer(session, x, model.emulated)
        except Unavailable as exc:
            return error_response(503, f"unavailable: {exc}")
        except svc.ray.exceptions.RayError as exc:
            return error_response(500, f"device error: {str(exc).splitlines()[0]}")
        t_sent = time.monotonic()
        server_s = t_sent - t_recv
        device_s = max(a["done"] - a["arrived"] for a in answers)
        modelled_s = max(a["modelled_s"] for a in answers)
        svc.timings.append((session, server_s, device_s, modelled_s, model.emulated))
        arrays = {"exit": np.array([a["exit"] for a in answers], np.int32)}
        if not model.emulated:
            arrays["class"] = np.array([a["class"] for a in answers], np.int32)
            arrays["logits"] = np.array([a["logits"] for a in answers], np.float32)
        params = {"session": session, "device": svc.fleet.actor_kind[device], "device_id": device,
                  "emulated": model.emulated, "retried": retries, "batch": max(a["batch"] for a in answers),
                  "modelled_ms": round(modelled_s * 1e3, 4), "device_ms": round(device_s * 1e3, 4),
                  "server_ms": round(server_s * 1e3, 4), "overhead_ms": round((server_s - device_s) * 1e3, 4),
                  "deadline_ms": round(deadline * 1e3, 4), "deadline_missed": bool(server_s > deadline)}
        return encode_response(model, req.get("id"), arrays, outs, want_binary, params)

    return Router(routes=v2_routes(server_meta, live, ready, model_meta, model_ready, infer,
                                   [Route("/v2/fleet", fleet_status)]))


async def asgi_response(app: Any, request: Any) -> Any:
    """Run the ASGI `app` on a Starlette request and return what it sent as one Starlette Response."""
    from starlette.responses import Response

    start: dict[str, Any] = {"status": 500, "headers": []}
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(request.scope, request.receive, send)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]
               if k.lower() != b"content-length"}
    return Response(b"".join(chunks), status_code=start["status"], headers=headers)


def ingress_deployment(serve: Any) -> Any:
    """The ingress as a Ray Serve deployment: one replica (it owns the Fleet), no CPU reserved (the
    local cluster's two CPUs are Ray's own), thousands of requests in flight (it only awaits devices)."""

    @serve.deployment(name="fluidnpu-fleet-ingress", num_replicas=1, max_ongoing_requests=10_000,
                      ray_actor_options={"num_cpus": 0})
    class FleetIngress:
        def __init__(self, cfg: FleetConfig) -> None:
            self.svc = FleetService(cfg)
            self.app = build_fleet_app(self.svc)

        async def __call__(self, request: Any) -> Any:
            self.svc.start()
            return await asgi_response(self.app, request)

        async def ready(self) -> bool:
            self.svc.start()
            return True

        async def drain(self, timeout_s: float) -> dict[str, Any]:
            return await self.svc.drain(timeout_s)

    return FleetIngress


def serve_fleet_command(*, fleet_path: str, sessions_path: str, address: str | None, epoch_s: float,
                        host: str, http_port: int, stop_after_s: float | None, tau: float = 0.8,
                        seed: int = 0) -> dict[str, Any]:
    """Plan, start (or join) Ray, deploy the ingress, serve until SIGTERM/SIGINT or `stop_after_s`; the report.

    Prints one JSON line when ready (`{"serving": [...], "http_port": ..., ...}`), as `fluidnpu serve` does."""
    from fluidnpu.quantize import check_tau
    from fluidnpu.scheduler_fw.fleet.ray_fleet import require_ray, signal_handlers_kept, start_ray
    from fluidnpu.scheduler_fw.policy import check_positive

    ray = require_ray()
    try:
        from ray import serve
    except ImportError:
        raise FluidError("serving a fleet needs Ray Serve: install fluidnpu's 'fleet' extra "
                         "(pip install 'fluidnpu[fleet]')") from None
    if epoch_s < 0:
        raise FluidError(f"--epoch must be >= 0 s, got {epoch_s}")
    if stop_after_s is not None:
        check_positive(stop_after_s, "--stop-after (s)")
    if not 1 <= http_port <= 65535:
        raise FluidError(f"--http-port must be in 1..65535 with --fleet (Ray Serve binds a fixed port), "
                         f"got {http_port}")
    check_tau(tau)
    from fluidnpu.serving.server import check_addresses

    check_addresses(host, {"--http-port": http_port})      # before Ray's start-up, not in Serve's log
    cfg = prepare(fleet_path, sessions_path, epoch_s, seed, tau)
    # a signal during Ray's and Serve's start-up ends in KeyboardInterrupt (fluidnpu.cli; their own handlers
    # are not kept): the finally below still shuts Serve and the local Ray down, so no raylet or worker
    # outlives the command
    own = start_ray(cfg.kinds, address)
    try:
        with signal_handlers_kept():
            serve.start(http_options={"host": host, "port": http_port})
            handle = serve.run(ingress_deployment(serve).bind(cfg), name="fluidnpu-fleet", route_prefix="/")
            handle.ready.remote().result()
        stop = threading.Event()
        with signal_handlers_kept():
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):     # from here a signal drains the fleet
                    signal.signal(sig, lambda *_: stop.set())
            p = cfg.plan
            print(json.dumps({"serving": list(cfg.models), "host": host, "http_port": http_port,
                              "devices": sum(k.count for k in cfg.kinds), "nodes": len(p.nodes),
                              "unplaced": [u.session for u in p.unplaced],
                              "emulated": [n for n, m in cfg.models.items() if m.emulated], "epoch_s": epoch_s}),
                  flush=True)
            stop.wait(stop_after_s)
        rep = handle.drain.remote(30.0).result()
    finally:
        serve.shutdown()
        if own:
            ray.shutdown()
    return dict(rep)
