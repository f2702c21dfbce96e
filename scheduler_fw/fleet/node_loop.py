"""One node of a plan, run as Nexus runs it: a round robin of its sessions' batches with period d.

Slot i takes its session's queued requests (up to its batch b) at start +
offset_i, offset_i being the reserved ℓ(b) and model switches of the slots
before it (later if an earlier batch overran), then runs them; the next cycle
starts d after this one (or when this one ends, if it overran). This is the
schedule docs/fleet.md's latency rule d + ℓ(b) <= L assumes.

The same loop runs on any `Clock` of the serving loop (scheduler_fw/serving.py):
on a VirtualClock it is the plan's replay (fleet/check.py); on a WallClock it
sleeps through each batch's modelled time, i.e. an emulated board paced to
the perf model's cycles at the board clock.

Pure Python: board-side friendly.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from fluidnpu.scheduler_fw.fleet.nexus import Node, Profile
from fluidnpu.scheduler_fw.serving import Clock


def batch_seconds(p: Profile, n: int, rng: random.Random) -> float:
    """One batch of n samples: each exit segment at the samples still in the batch (drawn), or ℓ(n)."""
    return batch_exits(p, n, rng)[0]


def batch_exits(p: Profile, n: int, rng: random.Random) -> tuple[float, list[int]]:
    """One batch of n samples on the perf model: (seconds, each sample's exit segment, drawn from the exit
    rates). A profile without segments (a GPU's) takes ℓ(n) and answers every sample at its last exit (0)."""
    if not p.segments:
        return p.latency(n), [0] * n
    t, reach = 0.0, 1.0
    left = list(range(n))
    exits = [len(p.segments) - 1] * n
    for s, (row, e) in enumerate(zip(p.segments, p.exit_rates)):
        if not left:
            break
        t += row[min(len(left), len(row)) - 1]
        q = min(1.0, e / reach) if reach > 0 else 1.0
        stay = []
        for i in left:
            if rng.random() < q:
                exits[i] = s
            else:
                stay.append(i)
        left = stay
        reach -= e
    return t, exits


class DutyCycleNode:
    """A plan's node over a clock: `submit` requests by session, `cycle()` runs one duty cycle."""

    def __init__(self, node: Node, profiles: dict[str, Profile], clock: Clock, rng: random.Random,
                 execute: Callable[[str, Profile, list[Any], random.Random], float] | None = None) -> None:
        self.node, self.profiles, self.clock, self.rng = node, profiles, clock, rng
        # execute(model, profile, tokens, rng) runs one batch (e.g. on a device) and returns its modelled
        # seconds, which the loop holds the batch for; without it a batch takes batch_seconds
        self.execute = execute
        self.order = sorted(range(len(node.slots)), key=lambda i: (node.slots[i].model, i))
        self.multi = len({s.model for s in node.slots}) > 1
        self.offsets: list[float] = []
        acc, prev = 0.0, None
        for i in self.order:
            s = node.slots[i]
            if self.multi and s.model != prev:
                acc += profiles[s.model].switch_s
            prev = s.model
            self.offsets.append(acc)
            acc += s.latency_s
        self.slot_of = {node.slots[i].session: j for j, i in enumerate(self.order)}
        self.queues: list[deque[tuple[float, Any]]] = [deque() for _ in self.order]
        self.next_start = clock.now()
        self.loaded: str | None = None
        self.lateness: deque[float] = deque(maxlen=4096)   # s a slot's take came after its offset (dispatch jitter)

    def submit(self, session: int, arrival: float, token: Any = None) -> None:
        """Queue a request of `session` that arrives at `arrival` (arrivals per session in order)."""
        self.queues[self.slot_of[session]].append((arrival, token))

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self.queues)

    def skip_idle(self) -> None:
        """Jump whole periods ahead to the one before the next queued arrival (a virtual clock's idle time)."""
        first = min((q[0][0] for q in self.queues if q), default=None)
        d = self.node.duty_s
        if first is not None and first > self.next_start + d:
            self.next_start += d * math.floor((first - self.next_start) / d)

    def cycle(self) -> list[tuple[int, float, float, Any]]:
        """Run one duty cycle; (session, arrival, done, token) of every request it answered."""
        clock, node = self.clock, self.node
        start = self.next_start
        clock.sleep_until(start)
        done: list[tuple] = []
        for j, i in enumerate(self.order):
            s = node.slots[i]
            p = self.profiles[s.model]
            if self.multi and self.loaded != s.model:
                clock.sleep_until(clock.now() + p.switch_s)
                self.loaded = s.model
            clock.sleep_until(start + self.offsets[j])
            now, q = clock.now(), self.queues[j]
            batch: list = []
            self.lateness.append(now - start - self.offsets[j])
            while q and q[0][0] <= now and len(batch) < s.batch:
                batch.append(q.popleft())
            if batch:
                run_s = (batch_seconds(p, len(batch), self.rng) if self.execute is None
                         else self.execute(s.model, p, [tok for _, tok in batch], self.rng))
                clock.sleep_until(now + run_s)
                end = clock.now()
                done.extend((s.session, a, end, tok) for a, tok in batch)
        self.next_start = max(clock.now(), start + node.duty_s)
        return done
