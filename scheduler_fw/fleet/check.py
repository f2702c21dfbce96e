"""Replay a plan under Poisson arrivals: does each session keep its SLO on the nodes it was given?

The planner sizes every batch to a session's *mean* rate (b = ceil(r·d)), so
each session's slot is a bulk server at load 1: a Poisson burst above b waits
one more duty cycle, and the backlog drifts like a random walk. This check
measures what that costs, and what planning with headroom (sessions sized for
rate x (1 + h)) buys back (docs/fleet.md).

Each node runs on its own virtual clock (fleet/node_loop.py, the loop an
emulated board runs in wall-clock time): a session's Poisson stream split
among its nodes in proportion to their shares is a Poisson stream per node
(thinning), so nodes are independent. Samples of an NPU batch leave at exit
s with the model's exit rates, so the batch shrinks as it runs.

Pure Python and seeded (random.Random): reproducible everywhere.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Plan
from fluidnpu.scheduler_fw.fleet.node_loop import DutyCycleNode
from fluidnpu.scheduler_fw.serving import VirtualClock


@dataclass
class SessionCheck:
    session: int
    arrivals: int
    answered: int
    within_slo: int
    p99_ms: float
    max_ms: float

    @property
    def compliance(self) -> float:
        return self.within_slo / self.arrivals if self.arrivals else 1.0


def _poisson(rate: float, seconds: float, rng: random.Random) -> list[float]:
    out, t = [], 0.0
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        out.append(t)
    return out


def check_plan(plan: Plan, kinds: Sequence[DeviceKind], seconds: float = 60.0, seed: int = 0,
               drain_cycles: int = 100_000, progress: Callable[[int, int], None] | None = None) -> list[SessionCheck]:
    """Per session: arrivals over `seconds`, answered (after draining), within SLO, p99 and max latency.

    Only the placed load is replayed (an unplaced share has no node); a node still busy `drain_cycles`
    duty cycles after the horizon leaves the rest unanswered (reported). `progress(done, total)` per node.
    """
    rng = random.Random(seed)
    by_name = {k.name: k for k in kinds}
    lat: dict[int, list[float]] = {s.index: [] for s in plan.sessions}
    arrived: dict[int, int] = {s.index: 0 for s in plan.sessions}
    for done, node in enumerate(plan.nodes):
        if progress:
            progress(done, len(plan.nodes))
        loop = DutyCycleNode(node, by_name[node.device].profiles, VirtualClock(), rng)
        for slot in node.slots:
            times = _poisson(slot.rate, seconds, rng)
            arrived[slot.session] += len(times)
            for t in times:
                loop.submit(slot.session, t)
        cycles = 0
        while loop.pending and cycles < drain_cycles:
            loop.skip_idle()
            for session, arrival, end, _ in loop.cycle():
                lat[session].append(end - arrival)
            cycles += loop.next_start > seconds
    return session_checks(plan, lat, arrived)


def session_checks(plan: Plan, lat: dict[int, list[float]], arrived: dict[int, int]) -> list[SessionCheck]:
    """Per-session figures from latencies (seconds) and arrival counts, by session index."""
    out = []
    for s in plan.sessions:
        xs = sorted(lat[s.index])
        p99 = xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)] if xs else 0.0
        out.append(SessionCheck(s.index, arrived[s.index], len(xs), sum(1 for x in xs if x <= s.slo_s + 1e-12),
                                p99 * 1e3, (xs[-1] if xs else 0.0) * 1e3))
    return out
