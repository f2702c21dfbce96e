"""The baseline a Ray user has today: Ray Serve's static `@serve.batch` per model, one replica per device.

The fleet benchmarks compare the Nexus fleet (fleet/ray_fleet.py) with what Ray Serve
offers out of the box on the same devices and load: every session (a model
with its SLO) gets its own deployment(s) whose replicas are pinned one per
device by the kind's custom resource (`fluidnpu_<device>`), and each replica
batches with `@serve.batch(max_batch_size, batch_wait_timeout_s)`. Nothing
is re-planned and no device is shared between models; Ray Serve's router
spreads a deployment's requests over its replicas.

Static provisioning (`static_deployments`), stated in docs/fleet.md:
* max_batch_size = Nexus's saturate batch B = argmax_b 2ℓ(b) <= L' on the
  device kind (L' = the SLO with the same margins the Nexus plan uses), so
  that a request which arrives while a full batch runs still makes its SLO;
* batch_wait_timeout_s = L' - 2ℓ(B), the longest wait that keeps that worst
  case (wait, a running batch, its own batch) within L';
* replicas = ceil(peak rate x (1 + headroom) / (B/ℓ(B))): sized for the peak,
  as a static deployment must be; kinds cheapest first (ℓ(B)/B, the planner's
  order), sessions that can run on fewer kinds placed first, spilling to the
  next kind when a kind's devices run out.

The replicas are the same emulated boards as the Nexus path's: a batch of n
sleeps `node_loop.batch_seconds` (the perf model's segment times at the board
clock, samples leaving at exits drawn from the exit rates). Only this module,
ray_fleet.py and the fleet ingress (fluidnpu/serving/fleet.py) import Ray (the
'fleet' extra).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fluidnpu.scheduler_fw.fleet.nexus import (
    EPS,
    DeviceKind,
    Profile,
    Session,
    Unplaced,
    preferred_kinds,
    why_unplaceable,
)
from fluidnpu.scheduler_fw.fleet.ray_fleet import RunLog, require_ray, resource_name, start_ray


@dataclass(frozen=True)
class StaticDeployment:
    """One Ray Serve deployment of the baseline: a session's replicas on one device kind."""

    session: int
    model: str
    device: str
    replicas: int
    max_batch_size: int
    batch_wait_timeout_s: float
    latency_s: float            # ℓ(max_batch_size)

    @property
    def throughput(self) -> float:
        """Requests/s the replicas serve at full batches, back to back."""
        return self.replicas * self.max_batch_size / self.latency_s


def static_deployments(sessions: Sequence[Session], kinds: Sequence[DeviceKind], headroom: float = 0.0,
                       slo_margin: float = 0.0, jitter_s: float = 0.0) -> tuple[list[StaticDeployment], list[Unplaced]]:
    """Each session (rate = its peak) on devices of its own, provisioned once for the peak (module docstring).

    Returns the deployments and the sessions' load the fleet's devices could not take (refused when served).
    """
    free = {k.name: k.count for k in kinds}
    out: list[StaticDeployment] = []
    unplaced: list[Unplaced] = []
    indexed = [Session(s.model, s.rate, s.slo_s, i) for i, s in enumerate(sessions)]
    able = {s.index: sum(1 for k in kinds if s.model in k.profiles) for s in indexed}
    for s in sorted(indexed, key=lambda s: (able[s.index], s.index)):
        if s.rate <= 0:
            continue
        planned = Session(s.model, s.rate, max(0.0, s.slo_s * (1.0 - slo_margin) - jitter_s), s.index)
        prefs = preferred_kinds(planned, kinds)
        if not prefs:
            unplaced.append(Unplaced(s.index, s.model, s.rate, why_unplaceable(planned, kinds)))
            continue
        need = s.rate * (1.0 + headroom)
        for k in prefs:
            p = k.profiles[s.model]
            B = p.saturate_batch(planned.slo_s)
            assert B is not None        # preferred kinds meet the SLO at some batch
            n = min(free[k.name], math.ceil(need * p.latency(B) / B - EPS))
            if n > 0:
                out.append(StaticDeployment(s.index, s.model, k.name, n, B,
                                            max(0.0, planned.slo_s - 2 * p.latency(B)), p.latency(B)))
                free[k.name] -= n
                need -= n * B / p.latency(B)
            if need <= EPS:
                break
        if need > EPS:
            unplaced.append(Unplaced(s.index, s.model, need / (1.0 + headroom),
                                     f"no free device left for a static deployment of {s.model}"))
    return sorted(out, key=lambda d: (d.session, d.device)), sorted(unplaced, key=lambda u: u.session)


def _board_class(serve: Any, profile: Profile, max_batch_size: int, batch_wait_timeout_s: float) -> type:
    """An emulated board as a Ray Serve replica: @serve.batch collects, the batch sleeps its modelled time."""

    class BatchedBoard:
        def __init__(self, seed: int) -> None:
            import os

            from fluidnpu.scheduler_fw.fleet.node_loop import batch_seconds  # imported before the load: no cold start

            self.batch_seconds = batch_seconds
            self.rng = random.Random(seed * 1_000_003 + os.getpid())   # one stream of exits per replica

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def infer(self, sent: list[float]) -> list[dict[str, float]]:
            start = time.monotonic()
            await asyncio.sleep(self.batch_seconds(profile, len(sent), self.rng))
            done = time.monotonic()
            return [{"sent": x, "start": start, "done": done, "batch": len(sent)} for x in sent]

    return BatchedBoard


class ServeBatchFleet:
    """The baseline on Ray Serve: one application per StaticDeployment, replicas pinned one per device."""

    def __init__(self, deployments: Sequence[StaticDeployment], kinds: Sequence[DeviceKind],
                 sessions: Sequence[Session], address: str | None = None, seed: int = 0) -> None:
        require_ray()
        from ray import serve

        self.serve, self.deployments, self.sessions, self.seed = serve, list(deployments), list(sessions), seed
        self._own = start_ray(kinds, address)
        serve.start(proxy_location="Disabled")
        by_name = {k.name: k for k in kinds}
        self.handles: dict[int, tuple[list[Any], list[float]]] = {}
        for i, d in enumerate(self.deployments):
            cls = _board_class(serve, by_name[d.device].profiles[d.model], d.max_batch_size, d.batch_wait_timeout_s)
            deployment = serve.deployment(name=f"board{i}", num_replicas=d.replicas, max_ongoing_requests=10_000,
                                          ray_actor_options={"num_cpus": 0, "resources": {resource_name(d.device): 1}})
            app = deployment(cls).bind(seed + i)
            handle = serve.run(app, name=f"static{i}", route_prefix=None)   # returns once its replicas are up
            hs, ws = self.handles.setdefault(d.session, ([], []))
            hs.append(handle)
            ws.append(d.throughput)

    @property
    def devices(self) -> int:
        return sum(d.replicas for d in self.deployments)

    def run(self, arrivals: Sequence[tuple[float, int]]) -> RunLog:
        """Send `arrivals` ((time s, session), sorted) in wall-clock time; a session with no deployment is refused.

        A session on deployments of several kinds is split among them in proportion to their throughput;
        within a deployment Ray Serve's router picks the replica.
        """
        rng = random.Random(self.seed + 1)
        idx = range(len(self.sessions))          # sessions by position, as the deployments name them
        counts = {i: 0 for i in idx}
        log = RunLog({i: [] for i in idx}, counts, {i: 0 for i in idx})
        sent: list[tuple[int, float, Any]] = []
        t0 = time.monotonic()
        for t, session in arrivals:
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            counts[session] += 1
            route = self.handles.get(session)
            if route is None:
                log.rejected[session] += 1
                log.answers.append((session, t, None))
                continue
            handle = rng.choices(route[0], weights=route[1])[0]
            sent.append((session, t, handle.infer.remote(t0 + t)))       # latency from the scheduled arrival
        for session, t, resp in sent:
            try:
                r = resp.result(timeout_s=600)
            except Exception:          # a replica's failure, whatever Serve raises: refused, counted, not lost
                log.rejected[session] += 1
                log.answers.append((session, t, None))
                continue
            log.latencies[session].append(r["done"] - r["sent"])
            log.answers.append((session, t, r["done"] - r["sent"]))
        return log

    def shutdown(self) -> None:
        self.serve.shutdown()
        if self._own:
            require_ray().shutdown()
