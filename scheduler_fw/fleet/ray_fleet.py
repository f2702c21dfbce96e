"""A plan on Ray: one actor per node, pinned to its device kind by a custom resource, emulated boards.

Optional extra `fleet` (`pip install 'fluidnpu[fleet]'`, Ray); nothing else in
fluidnpu imports Ray. Each node of the plan becomes an async Ray actor that
asks for one unit of its kind's custom resource (`fluidnpu_<device>`: a
cluster declares one unit per physical device of that kind, so an actor lands
where such a device is), and runs the node's duty-cycle round robin
(fleet/node_loop.py) on a wall clock in a thread: each batch sleeps for its
modelled time (the perf model's cycles at the board clock, samples leaving at
exits), i.e. an emulated board. A driver-side router sends every request of a
session to one of the session's nodes, at random in proportion to the
nodes' shares of its rate.

A node that serves a model with a runtime (digits-ee) and is sent the
request's input runs it for real: NetworkRuntime on an NpuDriver over a
ModelDevice of that model's bundle on the node's design, each batch held for
its modelled cycles at the board clock; other models (zoo models without
weights) and requests without inputs (`fluidnpu plan --run`) pace the perf
model's batch time and answer only the exit segment, drawn from the exit rates.

On one machine `Fleet` starts a local Ray with those resources; `address`
joins a running cluster instead (which must declare them). The epoch logic
(`Fleet.step`: measured rates, hysteresis, re-plan, a dead device) is shared by
the driver loop of `fluidnpu plan --run` (`Fleet.run`) and the KServe v2
ingress of `fluidnpu serve --fleet` (fluidnpu/serving/fleet.py).
The @serve.batch baseline on the same emulated boards is fleet/serve_batch.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Node, Plan, Profile


class SessionMoved(FluidError):
    """A request reached a device its session was just re-planned off: route it again (not a failure)."""


REROUTES = 4   # times one request may meet a device its session was re-planned off before it is refused


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FluidError("running a fleet needs Ray: install fluidnpu's 'fleet' extra (pip install ray)") from None
    return ray


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Keep this process's SIGINT and SIGTERM handlers across the block: Ray's start-up installs handlers of its
    own over them (a fatal-signal handler that aborts, a Python one that exits with the signal's number), where
    the command (fluidnpu.cli) must unwind and shut Ray down. A signal that Ray's handler turned into that exit
    inside the block leaves it as the KeyboardInterrupt the command's handler raises."""
    main = threading.current_thread() is threading.main_thread()
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    except SystemExit as exc:
        if exc.code in (signal.SIGINT, signal.SIGTERM):
            raise KeyboardInterrupt from None
        raise
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def start_ray(kinds: Sequence[DeviceKind], address: str | None = None) -> bool:
    """Start a local Ray (2 CPUs, `count` units of each kind's resource) or join `address`; True if this call
    started or joined it (so the caller shuts it down), False if Ray was already up in this process."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    try:
        with signal_handlers_kept():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=2, resources={resource_name(k.name): float(k.count) for k in kinds},
                         include_dashboard=False, log_to_driver=False)
    except KeyboardInterrupt:     # interrupted while starting: what did start is stopped
        ray.shutdown()
        raise
    return True


def resource_name(device: str) -> str:
    """The custom resource of a device kind: fluidnpu_<name> (Ray resource names: letters, digits, _ - .)."""
    return "fluidnpu_" + re.sub(r"[^A-Za-z0-9_.-]", "_", device)


ACTOR_NAMESPACE = "fluidnpu"


@dataclass(eq=False)
class Job:
    """One sample queued on a node: its input (None: emulated), the future its answer resolves, and the
    batch's figures the execute hook writes (exit, class scores, batch start, modelled seconds)."""

    fut: Future
    x: Any = None
    result: dict[str, Any] = field(default_factory=dict)


class DeviceRuntime:
    """A runtime model on the node's device: NetworkRuntime on an NpuDriver over a ModelDevice of the model's
    bundle on the node's design, and that design's clock (to turn modelled cycles into seconds)."""

    def __init__(self, model: str, bundle_data: dict[str, Any], tau: float) -> None:
        from fluidnpu.bundle import Bundle
        from fluidnpu.host_driver.driver import NpuDriver
        from fluidnpu.host_driver.model_device import ModelDevice
        from fluidnpu.host_driver.runtime import NetworkRuntime
        from fluidnpu.host_driver.serving import load_network

        bundle = Bundle(bundle_data)
        self.hz = bundle.clock_mhz * 1e6
        self.runtime = NetworkRuntime(load_network(model)[1], NpuDriver(ModelDevice(bundle), bundle), tau=tau)

    def run(self, xs: Any) -> tuple[float, list[Any]]:
        """(modelled seconds, sample states) of one batch: every segment at the samples still in it."""
        import numpy as np

        rt = self.runtime
        cyc0 = rt.device_cycles
        states = rt.infer(np.stack(xs))
        return (rt.device_cycles - cyc0) / self.hz, states


class NodeWorker:
    """The body of a node's actor: DutyCycleNodes on a wall clock in a thread, requests as futures.

    `reconfigure` gives the device a new node of a new plan at a cycle boundary: queued requests of
    sessions that stay move to the new loop; the old loop keeps the others and drains first (its
    cycles run before the new loop's), so no admitted request is dropped. A request for a session
    the device no longer serves is refused with an error, explicitly.

    `runtimes` ({model: bundle data of that model on this device's design}) are built before any load:
    a batch of such a model whose samples all carry inputs runs on them (real answers, held for the
    modelled time); any other batch sleeps its modelled time and draws its samples' exits.
    """

    def __init__(self, node: Node | None, profiles: dict[str, Profile], seed: int = 0,
                 runtimes: dict[str, dict[str, Any]] | None = None, tau: float = 0.8) -> None:
        self.rng = random.Random(seed)
        self.runtimes = {m: DeviceRuntime(m, data, tau) for m, data in (runtimes or {}).items()}
        self.loops: list[Any] = []          # draining loops first, the active one last
        self.answered = 0
        self.late: deque[float] = deque(maxlen=4096)      # dispatch lateness of replaced loops' slots (s)
        self.transit: deque[float] = deque(maxlen=4096)   # s from a request's arrival to its reaching this actor
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self.reconfigure(node, profiles)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _execute(self, model: str, profile: Profile, jobs: list[Job], rng: random.Random) -> float:
        """One batch (the node loop's execute hook): on the device when it can, else emulated."""
        from fluidnpu.scheduler_fw.fleet.node_loop import batch_exits

        start = time.monotonic()
        rt = self.runtimes.get(model)
        if rt is not None and all(j.x is not None for j in jobs):
            run_s, states = rt.run([j.x for j in jobs])
            for j, st in zip(jobs, states):
                j.result = {"exit": int(st.exit), "class": int(st.pred), "logits": st.logits.tolist(),
                            "emulated": False}
        else:
            run_s, exits = batch_exits(profile, len(jobs), rng)
            for j, e in zip(jobs, exits):
                j.result = {"exit": e, "emulated": True}
        for j in jobs:
            j.result |= {"start": start, "modelled_s": run_s, "batch": len(jobs)}
        return run_s

    def reconfigure(self, node: Node | None, profiles: dict[str, Profile]) -> int:
        """Serve `node` from the next cycle on (None: idle after draining); returns requests still draining."""
        from fluidnpu.scheduler_fw.fleet.node_loop import DutyCycleNode
        from fluidnpu.scheduler_fw.serving import WallClock

        with self._lock:
            new = (DutyCycleNode(node, profiles, WallClock(), self.rng, self._execute)
                   if node is not None and node.slots else None)
            if self.loops and new is not None:
                old = self.loops[-1]
                for session, j in new.slot_of.items():
                    if session in old.slot_of:
                        new.queues[j].extend(old.queues[old.slot_of[session]])
                        old.queues[old.slot_of[session]].clear()
            for lp in self.loops:
                self.late.extend(lp.lateness)
                lp.lateness.clear()
            self.loops = [lp for lp in self.loops if lp.pending] + ([new] if new is not None else [])
            draining = self.loops if new is None else self.loops[:-1]
            return sum(lp.pending for lp in draining)

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                loop = next((lp for lp in self.loops if lp.pending), None)
            wait = 0.05 if loop is None else loop.next_start - time.monotonic()
            if wait > 0:     # idle, or before the cycle's start: wait unlocked, so that reconfigure never waits long
                self._wake.wait(min(wait, 0.05))
                self._wake.clear()
                continue
            with self._lock:
                if loop not in self.loops:
                    continue
                finished = loop.cycle()   # submit() appends meanwhile: deques are thread-safe
                self.loops = [lp for lp in self.loops[:-1] if lp.pending] + self.loops[-1:]
            for _, _arrival, done, job in finished:
                job.fut.set_result(done)
            self.answered += len(finished)

    async def infer(self, session: int, sent: float, x: Any = None) -> dict[str, Any]:
        """Serve one sample of `session` that arrived at `sent` (the sender's time.monotonic(): one host, one
        clock); `x` its input (H, W, C), or None to emulate it. Its answer: sent, start (its batch's), done,
        modelled_s (its batch's modelled time), batch, exit, and with a runtime class and logits."""
        job = Job(Future(), x)
        loop = next((lp for lp in reversed(self.loops) if session in lp.slot_of), None)
        if loop is None:
            raise SessionMoved(f"session {session} is not served by this device any more (re-planned)")
        now = time.monotonic()
        self.transit.append(now - sent)
        loop.submit(session, now, job)
        self._wake.set()
        done = await asyncio.wrap_future(job.fut)
        return job.result | {"sent": sent, "arrived": now, "done": done}

    def stats(self) -> dict[str, int]:
        return {"answered": self.answered, "pending": sum(lp.pending for lp in self.loops)}

    def jitter(self) -> dict[str, list[float]]:
        """The last few thousand slots' dispatch lateness (a take after its offset) and requests' transit
        (arrival to this actor), seconds: what a plan's jitter margin must cover."""
        return {"lateness": [*self.late, *(x for lp in self.loops for x in lp.lateness)],
                "transit": list(self.transit)}

    def stop(self) -> None:
        self._stop = True


@dataclass
class RunLog:
    """What a run did: per session latencies (s), arrivals, refusals (errors, never silent), and each epoch."""

    latencies: dict[int, list[float]]
    arrivals: dict[int, int]
    rejected: dict[int, int]
    epochs: list[dict[str, Any]] = field(default_factory=list)
    answers: list[tuple[int, float, float | None]] = field(default_factory=list)   # session, arrival, latency
    jitter: dict[str, list[float]] = field(default_factory=dict)   # NodeWorker.jitter over the live devices
    retried: dict[int, int] = field(default_factory=dict)   # requests moved off a dead device, by session


class Fleet:
    """A plan's nodes as Ray actors on emulated devices, a router, and re-planning every epoch.

    Each device of each kind is one actor, started idle before any load and standing for that
    device for its whole life; a plan (and every re-plan) hands its nodes to the live actors of
    their kind and idles the rest. A device whose actor died is out of the fleet.

    `runtimes` ({kind name: {model: bundle data on that kind's design}}) gives each device the runtime
    models it computes for real (NodeWorker); `actor_prefix` names the actors (`<prefix><i>` in the
    namespace ACTOR_NAMESPACE), so that an operator or a fault test can find a device's actor.
    """

    def __init__(self, plan: Plan, kinds: Sequence[DeviceKind], address: str | None = None, seed: int = 0,
                 headroom: float = 0.0, slo_margin: float = 0.0, jitter_s: float = 0.0,
                 runtimes: dict[str, dict[str, dict[str, Any]]] | None = None, tau: float = 0.8,
                 actor_prefix: str | None = None) -> None:
        ray = require_ray()
        self.ray, self.plan, self.kinds, self.seed = ray, plan, list(kinds), seed
        self.headroom, self.slo_margin, self.jitter_s, self.quantile = headroom, slo_margin, jitter_s, plan.quantile
        self.runtimes, self.tau, self.actor_prefix = runtimes or {}, tau, actor_prefix
        self.sessions = list(plan.sessions)
        self._own = start_ray(kinds, address)
        self._actor_cls = ray.remote(NodeWorker)
        self.actors: list[Any] = []
        self.actor_kind: list[str] = []
        self.dead: set[int] = set()
        self.routes: dict[int, tuple[list[int], list[float]]] = {}
        self._probes: dict[Any, int] = {}
        self.actor_sessions: dict[int, set[int]] = {}
        self.epochs: list[dict[str, Any]] = []
        self.planned = {s.index: s.rate for s in plan.sessions}     # the rates the current plan was made for
        for k in self.kinds:                      # every device is up (idle) before the load: no cold starts
            for _ in range(k.count):
                self._new_actor(k, None)
        ray.get([a.stats.remote() for a in self.actors])
        self.apply(plan)

    # ---- placing a plan on the devices
    def _new_actor(self, kind: DeviceKind, node: Node | None) -> int:
        opts: dict[str, Any] = {"num_cpus": 0, "resources": {resource_name(kind.name): 1}, "max_concurrency": 10_000}
        if self.actor_prefix is not None:
            opts |= {"name": f"{self.actor_prefix}{len(self.actors)}", "namespace": ACTOR_NAMESPACE}
        a = self._actor_cls.options(**opts).remote(node, kind.profiles, self.seed + len(self.actors),
                                                   self.runtimes.get(kind.name), self.tau)
        self.actors.append(a)
        self.actor_kind.append(kind.name)
        return len(self.actors) - 1

    def apply(self, plan: Plan) -> None:
        """Give every node of `plan` a live device of its kind and route sessions to them."""
        self.plan = plan
        routes: dict[int, tuple[list[int], list[float]]] = {}
        node_actor: dict[int, int] = {}
        for k in self.kinds:
            live = [i for i, kind in enumerate(self.actor_kind) if kind == k.name and i not in self.dead]
            nodes = [(i, n) for i, n in enumerate(plan.nodes) if n.device == k.name]
            free = list(live)
            # sticky: a node goes to the device that already serves most of its sessions (fewest moves)
            for i, n in sorted(nodes, key=lambda x: -len(x[1].slots)):
                mine = {s.session for s in n.slots}
                if free:
                    idx = max(free, key=lambda a: (len(mine & self.actor_sessions.get(a, set())), -a))
                    free.remove(idx)
                    self.actors[idx].reconfigure.remote(n, k.profiles)
                else:
                    idx = self._new_actor(k, n)
                node_actor[i] = idx
                self.actor_sessions[idx] = mine
                for s in n.slots:
                    routes.setdefault(s.session, ([], []))
                    routes[s.session][0].append(idx)
                    routes[s.session][1].append(s.rate)
            for idx in free:                      # devices this plan leaves idle
                self.actor_sessions[idx] = set()
                self.actors[idx].reconfigure.remote(None, k.profiles)
        # No wait: an actor runs one caller's calls in order, so its reconfigure comes before the requests
        # routed to it by this plan; the load goes on meanwhile.
        self.routes, self.node_actor = routes, node_actor

    def check_health(self) -> list[int]:
        """Actors found dead since the last check (their devices leave the fleet). Never blocks the load:
        it reads the answers to the previous check's probes that have come, and probes again."""
        probes = self._probes
        ready, _ = self.ray.wait(list(probes), num_returns=len(probes), timeout=0) if probes else ([], [])
        died = []
        for r in ready:
            i = probes.pop(r)
            try:
                self.ray.get(r)
            except self.ray.exceptions.RayActorError:
                if self.mark_dead(i):
                    died.append(i)
        probed = set(probes.values())
        for i, a in enumerate(self.actors):
            if i not in self.dead and i not in probed:
                probes[a.stats.remote()] = i
        self._probes = probes
        return sorted(died)

    def mark_dead(self, device: int) -> bool:
        """`device` left the fleet (its actor died: found by a probe, or by a request sent to it);
        True if that is news (the caller re-plans: `step(..., died=[device])`)."""
        if device in self.dead:
            return False
        self.dead.add(device)
        return True

    def probe(self, now: float, window: dict[int, int] | None = None, span_s: float = 0.0) -> list[int]:
        """One health probe at `now` (s), the schedule `run` and the ingress's ticker share: at an epoch's
        end (`window`, the samples each session sent over its `span_s` seconds) the epoch's `step`, else
        a re-plan at once if a device died. Returns the devices found dead (their requests are retried)."""
        died = self.check_health()
        if window is not None:
            self.step(now, died, window, span_s)
        elif died:
            self.step(now, died)
        return died

    def step(self, now: float, died: Sequence[int] = (), window: dict[int, int] | None = None,
             span_s: float = 0.0) -> dict[str, Any]:
        """One epoch's decision, shared by `run` and the KServe v2 ingress; returns its record (also in
        `epochs`).

        `window`: the samples each session sent over the last `span_s` seconds (an epoch's end); None for a
        death found mid-epoch, which keeps the last full epoch's rates. A rising rate is extrapolated to the
        end of the next epoch (r + 1.5 Δr: the new plan serves until then, 1.5 epochs after the middle of
        the measured one; never below what was measured); `died` re-plans at once, else `should_move`
        decides. A re-plan to grow (or after a death) keeps every session's planned rate where it was or
        higher: one session outgrowing its nodes does not resize the others to a noisy dip of their
        measured rates; sessions shrink only when a device can be freed.
        """
        if window is not None:
            rates = {k: v / max(span_s, 1e-9) for k, v in window.items()}
        else:
            rates = self.epochs[-1]["rates"] if self.epochs else {
                s.index: self.plan.placed_rate(s.index) for s in self.sessions}
        before = self.epochs[-1]["rates"] if self.epochs else rates
        ahead = {k: r + 1.5 * max(0.0, r - before.get(k, r)) for k, r in rates.items()}
        why = "died" if died else self.should_move(ahead)
        if why:
            if why != "shrink":
                ahead = {k: max(r, self.planned.get(k, 0.0)) for k, r in ahead.items()}
            self.apply(self.replan(ahead, rates))
            self.planned = ahead
        rec = {"t": now, "died": sorted(died), "rates": rates, "planned_rates": ahead, "replan": why,
               "nodes": len(self.plan.nodes), "devices": len(set(self.node_actor.values())),
               "batches": {s.session: s.batch for n in self.plan.nodes for s in n.slots},
               "unplaced": [u.session for u in self.plan.unplaced]}
        self.epochs.append(rec)
        return rec

    def replan(self, rates: dict[int, float], measured: dict[int, float] | None = None,
               min_rate: float = 1.0) -> Plan:
        """Nexus again on `rates` (each at least `min_rate`), over the devices still alive.

        When that plan leaves load unplaced and `measured` rates are given, the fleet is short of devices
        for the extrapolated rates with headroom: the measured rates are planned with the headroom, half
        of it, then none, and the first plan that places everything is taken (else the one that leaves
        the fewest sessions without a node, then the least rate unplaced), so that a burst of one session
        does not take every device and leave another with none.
        """
        from fluidnpu.scheduler_fw.fleet.nexus import Session, plan

        lost = {k.name: sum(1 for i in self.dead if self.actor_kind[i] == k.name) for k in self.kinds}
        kinds = [replace(k, count=k.count - lost[k.name]) for k in self.kinds]
        tries = [(rates, self.headroom)]
        if measured is not None:
            tries += [(measured, self.headroom), (measured, self.headroom / 2), (measured, 0.0)]
        best: tuple[tuple[int, float], Plan] | None = None
        for r, h in tries:
            sessions = [Session(s.model, max(r.get(s.index, 0.0), min_rate), s.slo_s) for s in self.sessions]
            p = plan(sessions, kinds, h, self.slo_margin, self.jitter_s, self.quantile)
            if not p.unplaced:
                return p
            served = {x.session for n in p.nodes for x in n.slots}
            score = (sum(1 for s in p.sessions if s.index not in served), sum(u.rate for u in p.unplaced))
            if best is None or score < best[0]:
                best = (score, p)
        assert best is not None
        return best[1]

    def should_move(self, rates: dict[int, float]) -> str | None:
        """Hysteresis: "grow" when a session outgrows the current plan (its capacity falls below
        rate x (1 + headroom/2)), "shrink" when a re-plan would free a device and every session's capacity
        exceeds twice its rate x (1 + headroom), else None; not on every wiggle of a measured rate, since
        moving sessions costs queues and model switches."""
        need = {k: max(r, 1.0) for k, r in rates.items()}
        if any(self.plan.capacity(k) < r * (1 + self.headroom / 2) for k, r in need.items()):
            return "grow"
        slack = all(self.plan.capacity(k) > 2 * r * (1 + self.headroom) for k, r in need.items())
        return "shrink" if slack and len(self.replan(rates).nodes) < len(self.plan.nodes) else None

    def route(self, session: int, rng: random.Random) -> int | None:
        """The device that takes this request: at random in proportion to its share (None: unplaced)."""
        r = self.routes.get(session)
        return rng.choices(r[0], weights=r[1])[0] if r else None

    # ---- load
    def run(self, arrivals: Sequence[tuple[float, int]], epoch_s: float | None = None,
            kill: tuple[float, int] | None = None) -> RunLog:
        """Send `arrivals` ((time s, session), sorted) in wall-clock time; every `epoch_s` re-plan.

        `kill` = (time, node index of the current plan): fault injection, that node's actor is killed.
        Each epoch measures the rates and `step` re-plans when it should; a health check (four per epoch)
        that finds a device dead re-plans at once, and the requests in flight on the dead device (or sent
        to it before its death was found) go to a live node of their session in the new plan (`_retry`).
        A device found dead only when its answers are collected (after the last health check) is handled
        the same way there. A request of a session that has no live node is refused with an error: counted
        in `rejected`, never lost.
        """
        rng = random.Random(self.seed + 1)
        counts = {s.index: 0 for s in self.sessions}
        window = dict(counts)
        refs: list[tuple[int, float, Any, int]] = []     # session, arrival, answer, device
        rejected = dict(counts)
        log = RunLog({s.index: [] for s in self.sessions}, counts, rejected, epochs=self.epochs)
        t0 = time.monotonic()
        next_epoch = epoch_s if epoch_s else math.inf
        health_s = epoch_s / 4 if epoch_s else math.inf
        next_health, epoch_start = health_s, 0.0
        killed = False
        for t, session in arrivals:
            while t >= min(next_epoch, next_health):
                now = min(next_epoch, next_health)
                due = now == next_epoch
                died = self.probe(now, window if due else None, now - epoch_start)
                if due:
                    window, epoch_start = {k: 0 for k in window}, now
                    next_epoch += epoch_s or math.inf
                if died:
                    self._retry(refs, set(died), rng, t0, log)
                next_health = now + health_s if now == next_health else next_health
            if kill is not None and not killed and t >= kill[0]:
                if kill[1] in self.node_actor:
                    self.ray.kill(self.actors[self.node_actor[kill[1]]])
                killed = True
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            counts[session] += 1
            window[session] += 1
            node = self.route(session, rng)
            if node is None or node in self.dead:
                rejected[session] += 1
                log.answers.append((session, t, None))
                continue
            refs.append((session, t, self.actors[node].infer.remote(session, t0 + t), node))   # latency from arrival
        pending = deque((*ref, 0) for ref in refs)     # the last field: times re-sent already
        while pending:
            session, t, ref, device, tries = pending.popleft()
            try:
                r = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                # its device died after the last health check: re-plan and retry it on a live node. A device
                # its session was re-planned off (SessionMoved, not a failure) sends it on to the current
                # plan's node, up to REROUTES times. Any other failure (a worker lost under load) is retried
                # once on a live node of the current plan, then refused.
                lost = isinstance(exc, self.ray.exceptions.RayActorError)
                moved = isinstance(exc, SessionMoved)
                if lost and self.mark_dead(device):
                    self.step(time.monotonic() - t0, [device])
                node = self.route(session, rng)
                again = lost or (moved and tries < REROUTES) or tries == 0
                if again and node is not None and node not in self.dead:
                    pending.append((session, t, self.actors[node].infer.remote(session, t0 + t), node, tries + 1))
                    log.retried[session] = log.retried.get(session, 0) + 1
                    continue
                rejected[session] += 1
                log.answers.append((session, t, None))
                continue
            log.latencies[session].append(r["done"] - r["sent"])
            log.answers.append((session, t, r["done"] - r["sent"]))
        for i, a in enumerate(self.actors):
            if i not in self.dead:
                for key, xs in self.ray.get(a.jitter.remote()).items():
                    log.jitter.setdefault(key, []).extend(xs)
        return log

    def _retry(self, refs: list[tuple[int, float, Any, int]], died: set[int], rng: random.Random, t0: float,
               log: RunLog) -> None:
        """Send the requests that devices just found dead had not answered to a live node of their session
        in the current plan (counted in log.retried); a session with no live node keeps them, and they are
        refused when collected. Their latency still counts from their first arrival."""
        for i, (session, t, ref, device) in enumerate(refs):
            if device not in died:
                continue
            ready, _ = self.ray.wait([ref], timeout=0)
            if ready:
                try:
                    self.ray.get(ref)
                    continue                   # answered before the death
                except self.ray.exceptions.RayError:
                    pass
            node = self.route(session, rng)
            if node is None or node in self.dead:
                continue
            refs[i] = (session, t, self.actors[node].infer.remote(session, t0 + t), node)
            log.retried[session] = log.retried.get(session, 0) + 1

    def run_poisson(self, seconds: float, seed: int = 0) -> tuple[dict[int, list[float]], dict[int, int]]:
        """Each session's placed rate as Poisson arrivals for `seconds`, no re-planning: (latencies, arrivals)."""
        log = self.run(poisson_arrivals({s.index: self.plan.placed_rate(s.index) for s in self.sessions},
                                        seconds, seed))
        return log.latencies, log.arrivals

    def shutdown(self) -> None:
        for i, a in enumerate(self.actors):
            if i in self.dead:
                continue
            try:
                self.ray.get(a.stop.remote())
                self.ray.kill(a)
            except self.ray.exceptions.RayError:
                pass
        if self._own:
            self.ray.shutdown()


def poisson_arrivals(rates: dict[int, float] | dict[int, Any], seconds: float, seed: int = 0,
                     peak: dict[int, float] | None = None) -> list[tuple[float, int]]:
    """Sorted (time, session) of Poisson arrivals; a rate may be a function of time (thinning, under `peak`)."""
    rng = random.Random(seed)
    out = []
    for session, rate in rates.items():
        top = float(rate) if not callable(rate) else float((peak or {})[session])
        t = 0.0
        while top > 0:
            t += rng.expovariate(top)
            if t >= seconds:
                break
            if not callable(rate) or rng.random() * top < rate(t):
                out.append((t, session))
    return sorted(out)
