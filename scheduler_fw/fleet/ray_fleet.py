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

On one machine `Fleet` starts a local Ray with those resources; `address`
joins a running cluster instead (which must declare them).

Not built yet (docs/fleet.md): the Ray Serve ingress behind `fluidnpu serve`,
re-planning, device failures, the @serve.batch baseline.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
import random
import re
import threading
import time
from typing import Any, Sequence

from fluidnpu.errors import FluidError
from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Node, Plan, Profile


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FluidError("running a fleet needs Ray: install fluidnpu's 'fleet' extra (pip install ray)") from None
    return ray


def resource_name(device: str) -> str:
    """The custom resource of a device kind: fluidnpu_<name> (Ray resource names: letters, digits, _ - .)."""
    return "fluidnpu_" + re.sub(r"[^A-Za-z0-9_.-]", "_", device)


class NodeWorker:
    """The body of a node's actor: a DutyCycleNode on a wall clock in a thread, requests as futures."""

    def __init__(self, node: Node, profiles: dict[str, Profile], seed: int = 0) -> None:
        from fluidnpu.scheduler_fw.fleet.node_loop import DutyCycleNode
        from fluidnpu.scheduler_fw.serving import WallClock

        self.loop = DutyCycleNode(node, profiles, WallClock(), random.Random(seed))
        self.answered = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            if not self.loop.pending:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            finished = self.loop.cycle()   # submit() appends to its deques meanwhile: thread-safe
            for _, arrival, done, fut in finished:
                fut.set_result(done)
            self.answered += len(finished)

    async def infer(self, session: int, sent: float) -> dict[str, float]:
        """Serve one request of `session`; `sent` is the driver's time.monotonic() (one host: one clock)."""
        fut: Future = Future()
        self.loop.submit(session, time.monotonic(), fut)
        self._wake.set()
        done = await asyncio.wrap_future(fut)
        return {"sent": sent, "done": done}

    def stats(self) -> dict[str, int]:
        return {"answered": self.answered, "pending": self.loop.pending}

    def stop(self) -> None:
        self._stop = True


class Fleet:
    """The plan's nodes as Ray actors and a router; `run_poisson` drives a seeded open-loop load."""

    def __init__(self, plan: Plan, kinds: Sequence[DeviceKind], address: str | None = None, seed: int = 0) -> None:
        ray = require_ray()
        self.ray, self.plan = ray, plan
        self._own = not ray.is_initialized()
        if self._own:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=2, resources={resource_name(k.name): float(k.count) for k in kinds},
                         include_dashboard=False, log_to_driver=False)
        by_name = {k.name: k for k in kinds}
        actor = ray.remote(NodeWorker)
        self.actors = [actor.options(num_cpus=0, resources={resource_name(n.device): 1}, max_concurrency=10_000)
                       .remote(n, by_name[n.device].profiles, seed + i) for i, n in enumerate(plan.nodes)]
        self.routes: dict[int, tuple[list[int], list[float]]] = {}
        for i, n in enumerate(plan.nodes):
            for s in n.slots:
                nodes, shares = self.routes.setdefault(s.session, ([], []))
                nodes.append(i)
                shares.append(s.rate)
        ray.get([a.stats.remote() for a in self.actors])   # every actor is up

    def route(self, session: int, rng: random.Random) -> int | None:
        """The node that takes this request: at random in proportion to the nodes' shares (None: unplaced)."""
        r = self.routes.get(session)
        return rng.choices(r[0], weights=r[1])[0] if r else None

    def run_poisson(self, seconds: float, seed: int = 0) -> tuple[dict[int, list[float]], dict[int, int]]:
        """Each session's placed rate as Poisson arrivals for `seconds` of wall time.

        Returns (latencies in seconds by session, arrivals by session); a request whose actor
        failed is an arrival without a latency, never silently lost.
        """
        rng = random.Random(seed)
        arrivals = []
        for s in self.plan.sessions:
            rate, t = self.plan.placed_rate(s.index), 0.0
            while rate > 0:
                t += rng.expovariate(rate)
                if t >= seconds:
                    break
                arrivals.append((t, s.index))
        arrivals.sort()
        counts = {s.index: 0 for s in self.plan.sessions}
        refs = []
        t0 = time.monotonic()
        for t, session in arrivals:
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            node = self.route(session, rng)
            counts[session] += 1
            refs.append((session, self.actors[node].infer.remote(session, time.monotonic())))
        lat: dict[int, list[float]] = {s.index: [] for s in self.plan.sessions}
        for session, ref in refs:
            try:
                r = self.ray.get(ref)
            except self.ray.exceptions.RayError:
                continue
            lat[session].append(r["done"] - r["sent"])
        return lat, counts

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                self.ray.get(a.stop.remote())
                self.ray.kill(a)
            except self.ray.exceptions.RayError:
                pass
        if self._own:
            self.ray.shutdown()
