"""Replay a plan under Poisson arrivals: does each session keep its SLO on the nodes it was given?

The planner sizes every batch to a session's *mean* rate (b = ceil(r·d)), so
each session's slot is a bulk server at load 1: a Poisson burst above b waits
one more duty cycle, and the backlog drifts like a random walk. This check
measures what that costs, and what planning with headroom (sessions sized for
rate x (1 + h)) buys back (docs/fleet.md).

Each node runs on its own clock: a session's Poisson stream split among its
nodes in proportion to their shares is a Poisson stream per node (thinning),
so nodes are independent. A node's period is its duty cycle d; slot i takes
its batch at start + offset_i, offset_i being the reserved ℓ(b) and model
switches of the slots before it (later if an earlier batch overran), as
docs/fleet.md's latency rule assumes. Samples of an NPU batch leave at exit
s with the model's exit rates, so the batch shrinks as it runs.

Pure Python and seeded (random.Random): reproducible everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
import random
from typing import Callable, Sequence

from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Plan, Profile


def batch_seconds(p: Profile, n: int, rng: random.Random) -> float:
    """One batch of n samples: each exit segment at the samples still in the batch (drawn), or ℓ(n)."""
    if not p.segments:
        return p.latency(n)
    t, left, reach = 0.0, n, 1.0
    for row, e in zip(p.segments, p.exit_rates):
        if left <= 0:
            break
        t += row[min(left, len(row)) - 1]
        q = min(1.0, e / reach) if reach > 0 else 1.0
        left -= sum(1 for _ in range(left) if rng.random() < q)
        reach -= e
    return t


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
    for done, node in enumerate(plan.nodes, start=1):
        if progress:
            progress(done - 1, len(plan.nodes))
        prof = by_name[node.device].profiles
        order = sorted(range(len(node.slots)), key=lambda i: (node.slots[i].model, i))
        multi = len({s.model for s in node.slots}) > 1
        offsets, acc, prev = [], 0.0, None
        for i in order:
            s = node.slots[i]
            if multi and s.model != prev:
                acc += prof[s.model].switch_s
            prev = s.model
            offsets.append(acc)
            acc += s.latency_s
        queues = [_poisson(node.slots[i].rate, seconds, rng) for i in order]
        for i, q in zip(order, queues):
            arrived[node.slots[i].session] += len(q)
        heads = [0] * len(order)
        start, loaded, cycles = 0.0, None, 0
        while any(h < len(q) for h, q in zip(heads, queues)) and cycles < drain_cycles:
            t = start
            for j, i in enumerate(order):
                s = node.slots[i]
                p = prof[s.model]
                if multi and loaded != s.model:
                    t += p.switch_s
                    loaded = s.model
                t = max(t, start + offsets[j])
                q, h = queues[j], heads[j]
                n = 0
                while h + n < len(q) and q[h + n] <= t and n < s.batch:
                    n += 1
                if n:
                    t += batch_seconds(p, n, rng)
                    lat[s.session].extend(t - a for a in q[h:h + n])
                    heads[j] = h + n
            start = max(t, start + node.duty_s)
            cycles += start > seconds
            pending = [q[h] for h, q in zip(heads, queues) if h < len(q)]
            if pending and min(pending) > start + node.duty_s:   # idle cycles: skip them, keeping the phase
                start += node.duty_s * math.floor((min(pending) - start) / node.duty_s)
    out = []
    for s in plan.sessions:
        xs = sorted(lat[s.index])
        p99 = xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)] if xs else 0.0
        out.append(SessionCheck(s.index, arrived[s.index], len(xs), sum(1 for x in xs if x <= s.slo_s + 1e-12),
                                p99 * 1e3, (xs[-1] if xs else 0.0) * 1e3))
    return out
