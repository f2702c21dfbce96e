"""Nexus's squishy bin packing (SOSP 2019, Algorithm 1) over a fleet of device kinds.

A session (model, rate R, SLO L) is served by nodes (one device each) that run
batches round robin with a period, the duty cycle d. A request waits at most
one duty cycle for its session's next batch and then runs, so a session with
batch b on a node with duty cycle d meets its SLO when d + ℓ(b) <= L. A node
is feasible when its sessions' batch times plus its model switches fit in d.

* ScheduleSaturate: B = argmax_b 2ℓ(b) <= L (a node running only this session
  back to back has d = ℓ(B)), throughput T = B/ℓ(B); floor(R/T) full nodes.
* ScheduleResidue: the leftover rate r gets b = argmax_b ℓ(b) + b/r <= L and
  d = b/r, occupancy ℓ(b)/d; residues go in descending occupancy, each merged
  into the existing node whose merged occupancy is highest (MergeNodes: the
  smaller duty cycle wins, every session's batch shrinks to ceil(r·d), and the
  merge must keep Σ ℓ(b) + switches <= d and d + ℓ(b) <= L for all), else it
  opens a node of its own.

Device kinds differ in ℓ(b) and in count; docs/fleet.md states how a session
picks its kind, the two cases Nexus leaves open (a residue too slow to fill
even a batch of one within its SLO, and one too fast for any b with
occupancy <= 1) and the node-count bound the tests check.

Pure Python (no numpy): it is small enough to re-plan on a board's ARM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import cast

EPS = 1e-9


def poisson_cdf(k: int, lam: float) -> float:
    """P(N <= k) for N ~ Poisson(lam), summed in log space (no underflow at large lam)."""
    if lam <= 0:
        return 1.0
    log_lam, total = math.log(lam), 0.0
    for i in range(k + 1):
        total += math.exp(-lam + i * log_lam - math.lgamma(i + 1))
    return min(1.0, total)


def per_cycle(mean: float, quantile: float = 0.0, cap: int = 1 << 30) -> int:
    """The batch a slot needs for `mean` arrivals per duty cycle (at least 1).

    quantile 0 is Nexus: ceil(mean), a bulk server at load 1. A quantile q in (0, 1) sizes the slot for
    the q-quantile of Poisson(mean) arrivals per cycle, so that a burst overflows the slot (and waits a
    cycle more) with probability at most 1 - q. Returns cap + 1 when the batch would exceed `cap`.
    """
    base = max(1, math.ceil(mean - EPS))
    if not quantile or mean <= 0:
        return base
    k = base
    while poisson_cdf(k, mean) < quantile:
        k += 1
        if k > cap:
            return cap + 1
    return k


@lru_cache(maxsize=4096)
def mean_for(batch: int, quantile: float = 0.0) -> float:
    """The largest mean arrivals per cycle that a slot of `batch` covers: per_cycle's inverse.

    quantile 0: the batch itself. Otherwise the largest lam with P(Poisson(lam) <= batch) >= q (bisection;
    the CDF falls as lam grows).
    """
    if not quantile:
        return float(batch)
    lo, hi = 0.0, float(batch) + 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if poisson_cdf(batch, mid) >= quantile:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Profile:
    """ℓ(b) of one model on one device kind (seconds, b = 1..len), and the seconds to switch this model in.

    `segments` (T_s(b), monotone in b) and `exit_rates` keep what ℓ(b) was priced from, so that a
    check can replay batches whose samples really leave early (fleet/check.py); empty for a GPU.
    """

    seconds: tuple[float, ...]
    switch_s: float = 0.0
    segments: tuple[tuple[float, ...], ...] = ()
    exit_rates: tuple[float, ...] = ()

    @property
    def bmax(self) -> int:
        return len(self.seconds)

    def latency(self, b: int) -> float:
        return self.seconds[b - 1]

    def saturate_batch(self, slo_s: float) -> int | None:
        """B = argmax_b 2ℓ(b) <= L, or None if even a batch of one misses it."""
        best = None
        for b in range(1, self.bmax + 1):
            if 2.0 * self.latency(b) <= slo_s + EPS:
                best = b
        return best

    def cost_per_request(self, slo_s: float) -> float | None:
        """ℓ(B)/B: node-seconds per request at the saturate batch (the lower bound's term)."""
        B = self.saturate_batch(slo_s)
        return None if B is None else self.latency(B) / B


@dataclass(frozen=True)
class DeviceKind:
    """Devices that share ℓ(b): a design bundle on a board, or a GPU with its profile."""

    name: str
    count: int
    profiles: dict[str, Profile]       # by model
    kind: str = "npu"
    detail: str = ""


@dataclass(frozen=True)
class Session:
    model: str
    rate: float        # requests/s
    slo_s: float
    index: int = 0


@dataclass
class Slot:
    """One session's share of a node: its assigned rate and its batch per duty cycle."""

    session: int
    model: str
    rate: float
    slo_s: float
    batch: int
    latency_s: float
    quantile: float = 0.0      # the Poisson quantile its batch was sized for (0: the mean, as Nexus)


@dataclass
class Node:
    device: str
    duty_s: float
    slots: list[Slot]
    switch_s: float = 0.0
    saturated: bool = False

    @property
    def busy_s(self) -> float:
        return sum(s.latency_s for s in self.slots) + self.switch_s

    @property
    def occupancy(self) -> float:
        return self.busy_s / self.duty_s


@dataclass
class Unplaced:
    session: int
    model: str
    rate: float
    reason: str


@dataclass
class Plan:
    nodes: list[Node]
    unplaced: list[Unplaced]
    sessions: list[Session]
    kinds: dict[int, str] = field(default_factory=dict)        # session's preferred kind, by session index
    lower_bound: float = 0.0
    bound: int = 0
    quantile: float = 0.0          # the residue slots' Poisson quantile (0: Nexus's mean, b = ceil(r·d))

    def capacity(self, session: int) -> float:
        """Requests/s the plan carries for a session: Σ over its nodes of the mean rate its batch covers."""
        return sum(mean_for(s.batch, s.quantile) / n.duty_s for n in self.nodes for s in n.slots
                   if s.session == session)

    def placed_rate(self, session: int) -> float:
        return sum(s.rate for n in self.nodes for s in n.slots if s.session == session)


def switch_cost(models: Sequence[str], profiles: dict[str, Profile]) -> float:
    """Model switches per duty cycle: each model is switched in once when a node holds two or more."""
    distinct = sorted(set(models))
    return sum(profiles[m].switch_s for m in distinct) if len(distinct) > 1 else 0.0


def residue_slot(p: Profile, session: Session, rate: float, quantile: float = 0.0) -> tuple[int, float] | None:
    """(b, d) of a residue alone on a node, or None if no b keeps occupancy <= 1 and d + ℓ(b) <= L.

    Nexus: b = argmax_b ℓ(b) + b/r <= L with d = b/r. When that b would need
    occupancy > 1 (r close to T) or no b qualifies (r so low that even one
    request takes longer than L - ℓ(1) to arrive), the feasible b with the
    largest d = min(b/r, L - ℓ(b)) >= ℓ(b) is taken: its batch need not fill.
    With a quantile, b/r becomes mean_for(b)/r: the cycle in which b covers the q-quantile of arrivals.
    """
    L = session.slo_s
    cycle = {b: mean_for(b, quantile) / rate for b in range(1, p.bmax + 1)}
    nexus = [b for b, d in cycle.items() if p.latency(b) + d <= L + EPS and p.latency(b) <= d + EPS]
    if nexus:
        b = max(nexus)
        return b, cycle[b]
    best = None
    for b in range(1, p.bmax + 1):
        d = min(cycle[b], L - p.latency(b))
        if d + EPS >= p.latency(b) and (best is None or d > best[1] + EPS):
            best = (b, d)
    return best


def merge(node: Node, slot_session: Session, rate: float, kind: DeviceKind,
          alone: tuple[int, float] | None = None, quantile: float = 0.0) -> Node | None:
    """MergeNodes: the node with the residue added, or None if a duty cycle or SLO would break.

    `alone` is the residue's residue_slot on this kind, if the caller already has it. Every batch is
    per_cycle(rate·d, q) with its slot's own quantile q (the residue's: `quantile`): ceil(rate·d) for Nexus.
    """
    p = kind.profiles.get(slot_session.model)
    if p is None:
        return None
    alone = alone or residue_slot(p, slot_session, rate, quantile)
    if alone is None:
        return None
    d = min(node.duty_s, alone[1])
    if d >= node.duty_s:
        b = per_cycle(rate * d, quantile, p.bmax)
        if b > p.bmax or p.latency(b) + node.busy_s - node.switch_s > d + EPS:
            return None   # the duty cycle stays, so do the node's batches: the new batch alone overflows it
    slots = []
    new = Slot(slot_session.index, slot_session.model, rate, slot_session.slo_s, 0, 0.0, quantile)
    for s in [*node.slots, new]:
        prof = kind.profiles[s.model]
        b = per_cycle(s.rate * d, s.quantile, prof.bmax)
        if b > prof.bmax or d + prof.latency(b) > s.slo_s + EPS:
            return None
        slots.append(Slot(s.session, s.model, s.rate, s.slo_s, b, prof.latency(b), s.quantile))
    sw = switch_cost([s.model for s in slots], kind.profiles)
    merged = Node(node.device, d, slots, sw)
    return merged if merged.busy_s <= d + EPS else None


def preferred_kinds(session: Session, kinds: Sequence[DeviceKind]) -> list[DeviceKind]:
    """Kinds that can serve the session, cheapest first: ℓ(B)/B ascending, ties in fleet order."""
    able = [(k.profiles[session.model].cost_per_request(session.slo_s), i, k) for i, k in enumerate(kinds)
            if session.model in k.profiles]
    return [k for cost, _, k in sorted((c, i, k) for c, i, k in able if c is not None)]


def why_unplaceable(session: Session, kinds: Sequence[DeviceKind]) -> str:
    able = [k for k in kinds if session.model in k.profiles]
    if not able:
        return f"model {session.model!r} runs on no device kind of the fleet"
    l1 = min(k.profiles[session.model].latency(1) for k in able)
    L = session.slo_s * 1e3
    if session.slo_s < l1:
        return f"SLO {L:g} ms is below ℓ(1) = {l1 * 1e3:.3g} ms on every device kind"
    return (f"SLO {L:g} ms is below 2ℓ(1) = {2 * l1 * 1e3:.3g} ms on every device kind: a request may wait one "
            f"duty cycle before its batch runs")


def plan(sessions: Sequence[Session], kinds: Sequence[DeviceKind], headroom: float = 0.0,
         slo_margin: float = 0.0, jitter_s: float = 0.0, quantile: float = 0.0) -> Plan:
    """SquishyBinPacking: ScheduleSaturate, then ScheduleResidue, within the fleet's device counts.

    headroom h sizes every node for rate x (1 + h) (Poisson bursts, fleet/check.py); the plan reports
    the sessions' own rates, each node's share scaled back, so served rates exceed them by 1 + h.
    slo_margin m and jitter_s j plan every session for SLO x (1 - m) - j, leaving that much to what
    the model does not price (RPCs, a wall clock's dispatch jitter: absolute, so it weighs most on
    short SLOs); slots keep the SLO they were planned for. quantile q sizes each residue slot for the
    q-quantile of Poisson arrivals per duty cycle instead of the mean (per_cycle, mean_for); saturated
    nodes run back to back, where a burst waits one batch more, not a whole idle period, and keep B/ℓ(B).
    """
    if headroom or slo_margin or jitter_s:
        scale = 1.0 + headroom
        planned = [Session(s.model, s.rate * scale, max(0.0, s.slo_s * (1.0 - slo_margin) - jitter_s))
                   for s in sessions]
        p = plan(planned, kinds, quantile=quantile)
        for n in p.nodes:
            for slot in n.slots:
                slot.rate /= scale
        for u in p.unplaced:
            u.rate /= scale
        p.sessions = [Session(s.model, s.rate, s.slo_s, i) for i, s in enumerate(sessions)]
        p.lower_bound /= scale
        return p
    sessions = [Session(s.model, s.rate, s.slo_s, i) for i, s in enumerate(sessions)]
    free = {k.name: k.count for k in kinds}
    by_name = {k.name: k for k in kinds}
    nodes: list[Node] = []
    unplaced: list[Unplaced] = []
    prefs = {s.index: preferred_kinds(s, kinds) for s in sessions}
    residues: list[tuple[Session, float]] = []
    lower = 0.0
    bound = 0
    # ---- ScheduleSaturate: sessions that fewer kinds can serve first, so that a session with a choice does
    # not take the only kind another one can run on
    # a residue of a session that only one kind can serve keeps one device of that kind from the other
    # sessions' saturate nodes and new residue nodes until it is placed
    reserved = {k.name: 0 for k in kinds}
    for s in sorted(sessions, key=lambda s: (len(prefs[s.index]), s.index)):
        if s.rate <= 0:
            continue
        if not prefs[s.index]:
            unplaced.append(Unplaced(s.index, s.model, s.rate, why_unplaceable(s, kinds)))
            continue
        # preferred kinds are those whose profile meets the SLO at some batch: never None here
        lower += s.rate * cast(float, prefs[s.index][0].profiles[s.model].cost_per_request(s.slo_s))
        left = s.rate
        for k in prefs[s.index]:
            prof = k.profiles[s.model]
            B = cast(int, prof.saturate_batch(s.slo_s))
            T = B / prof.latency(B)
            saturated = int(math.floor(left / T + EPS))
            take = max(0, min(saturated, free[k.name] - (reserved[k.name] if len(prefs[s.index]) > 1 else 0)))
            for _ in range(take):
                nodes.append(Node(k.name, prof.latency(B), [Slot(s.index, s.model, T, s.slo_s, B, prof.latency(B))],
                                  saturated=True))
            free[k.name] -= take
            left = max(0.0, left - take * T)
            bound += take
            if take == saturated:
                break
        if left > EPS * max(1.0, s.rate):
            residues.append((s, left))
            bound += 1
            if len(prefs[s.index]) == 1 and free[prefs[s.index][0].name] > reserved[prefs[s.index][0].name]:
                reserved[prefs[s.index][0].name] += 1
    # ---- ScheduleResidue
    def residue_quantile(s: Session, r: float) -> float:
        """The residue's quantile: `quantile`, or Nexus's mean when no slot on one node covers the quantile
        (a residue between B/ℓ(B) at the quantile and at the mean): it is not left out for that."""
        return quantile if residue_slot(prefs[s.index][0].profiles[s.model], s, r, quantile) else 0.0

    def alone_occupancy(item: tuple[Session, float]) -> float:
        s, r = item
        p = prefs[s.index][0].profiles[s.model]
        slot = residue_slot(p, s, r, residue_quantile(s, r))
        return p.latency(slot[0]) / slot[1] if slot else 1.0

    shared: list[Node] = []
    pending = sorted(residues, key=lambda it: (-alone_occupancy(it), it[0].index))
    while pending:
        s, r = pending.pop(0)
        best, best_i = None, -1
        q = residue_quantile(s, r)
        only = prefs[s.index][0].name if len(prefs[s.index]) == 1 else None
        if only is not None and reserved[only] > 0:
            reserved[only] -= 1               # its own reservation is free for it now
        alone = {k.name: residue_slot(k.profiles[s.model], s, r, q) for k in kinds if s.model in k.profiles}
        for i, n in enumerate(shared):
            if alone.get(n.device) is None:
                continue
            m = merge(n, s, r, by_name[n.device], alone[n.device], q)
            if m is not None and (best is None or m.occupancy > best.occupancy + EPS):
                best, best_i = m, i
        if best is not None:
            shared[best_i] = best
            continue
        opened = None
        for k in prefs[s.index]:
            if free[k.name] - (reserved[k.name] if only is None else 0) < 1:
                continue
            opened = merge(Node(k.name, math.inf, []), s, r, k, quantile=q)
            if opened is not None:
                free[k.name] -= 1
                break
        spill = next((k for k in prefs[s.index] if free[k.name] - (reserved[k.name] if only is None else 0) >= 1),
                     None) if opened is None else None
        if spill is not None:
            # the residue (sized on its preferred kind) exceeds one node of the kinds still free: one more
            # saturated node of the next free kind takes B/ℓ(B) of it, and the rest is a residue again
            prof = spill.profiles[s.model]
            B = cast(int, prof.saturate_batch(s.slo_s))
            T = B / prof.latency(B)
            if T < r:
                nodes.append(Node(spill.name, prof.latency(B), [Slot(s.index, s.model, T, s.slo_s, B,
                                                                     prof.latency(B))], saturated=True))
                free[spill.name] -= 1
                bound += 1
                if only is not None:
                    reserved[only] += 1
                pending.insert(0, (s, r - T))
                continue
        if opened is None:
            busy = all(free[k.name] < 1 for k in prefs[s.index])
            reason = (f"no free device: every device of kind {', '.join(k.name for k in prefs[s.index])} is in use"
                      if busy else f"rate {r:.4g}/s left over needs more than one node of any free kind")
            unplaced.append(Unplaced(s.index, s.model, r, reason))
        else:
            shared.append(opened)
    return Plan(nodes + shared, sorted(unplaced, key=lambda u: u.session), sessions,
                {s.index: prefs[s.index][0].name for s in sessions if prefs[s.index]}, lower, bound, quantile)
