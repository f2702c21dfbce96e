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

from dataclasses import dataclass, field
import math
from typing import Sequence, cast

EPS = 1e-9


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
    kinds: dict[str, str] = field(default_factory=dict)        # session's preferred kind, by session index
    lower_bound: float = 0.0
    bound: int = 0

    def placed_rate(self, session: int) -> float:
        return sum(s.rate for n in self.nodes for s in n.slots if s.session == session)


def switch_cost(models: Sequence[str], profiles: dict[str, Profile]) -> float:
    """Model switches per duty cycle: each model is switched in once when a node holds two or more."""
    distinct = sorted(set(models))
    return sum(profiles[m].switch_s for m in distinct) if len(distinct) > 1 else 0.0


def residue_slot(p: Profile, session: Session, rate: float) -> tuple[int, float] | None:
    """(b, d) of a residue alone on a node, or None if no b keeps occupancy <= 1 and d + ℓ(b) <= L.

    Nexus: b = argmax_b ℓ(b) + b/r <= L with d = b/r. When that b would need
    occupancy > 1 (r close to T) or no b qualifies (r so low that even one
    request takes longer than L - ℓ(1) to arrive), the feasible b with the
    largest d = min(b/r, L - ℓ(b)) >= ℓ(b) is taken: its batch need not fill.
    """
    L = session.slo_s
    nexus = [b for b in range(1, p.bmax + 1) if p.latency(b) + b / rate <= L + EPS and p.latency(b) <= b / rate + EPS]
    if nexus:
        b = max(nexus)
        return b, b / rate
    best = None
    for b in range(1, p.bmax + 1):
        d = min(b / rate, L - p.latency(b))
        if d + EPS >= p.latency(b) and (best is None or d > best[1] + EPS):
            best = (b, d)
    return best


def merge(node: Node, slot_session: Session, rate: float, kind: DeviceKind,
          alone: tuple[int, float] | None = None) -> Node | None:
    """MergeNodes: the node with the residue added, or None if a duty cycle or SLO would break.

    `alone` is the residue's residue_slot on this kind, if the caller already has it.
    """
    p = kind.profiles.get(slot_session.model)
    if p is None:
        return None
    alone = alone or residue_slot(p, slot_session, rate)
    if alone is None:
        return None
    d = min(node.duty_s, alone[1])
    if d >= node.duty_s and p.latency(max(1, math.ceil(rate * d - EPS))) + node.busy_s - node.switch_s > d + EPS:
        return None   # the duty cycle stays, so do the node's batches: the new batch alone overflows it
    slots = []
    for s in [*node.slots, Slot(slot_session.index, slot_session.model, rate, slot_session.slo_s, 0, 0.0)]:
        prof = kind.profiles[s.model]
        b = max(1, math.ceil(s.rate * d - EPS))
        if b > prof.bmax or d + prof.latency(b) > s.slo_s + EPS:
            return None
        slots.append(Slot(s.session, s.model, s.rate, s.slo_s, b, prof.latency(b)))
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
         slo_margin: float = 0.0) -> Plan:
    """SquishyBinPacking: ScheduleSaturate, then ScheduleResidue, within the fleet's device counts.

    headroom h sizes every node for rate x (1 + h) (Poisson bursts, fleet/check.py); the plan reports
    the sessions' own rates, each node's share scaled back, so served rates exceed them by 1 + h.
    slo_margin m plans every session for SLO x (1 - m), leaving m of it to what the model does not
    price (RPCs, a wall clock's jitter); slots keep the SLO they were planned for.
    """
    if headroom or slo_margin:
        scale = 1.0 + headroom
        p = plan([Session(s.model, s.rate * scale, s.slo_s * (1.0 - slo_margin)) for s in sessions], kinds)
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
    # ---- ScheduleSaturate
    for s in sessions:
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
            n = int(math.floor(left / T + EPS))
            take = min(n, free[k.name])
            for _ in range(take):
                nodes.append(Node(k.name, prof.latency(B), [Slot(s.index, s.model, T, s.slo_s, B, prof.latency(B))],
                                  saturated=True))
            free[k.name] -= take
            left = max(0.0, left - take * T)
            bound += take
            if take == n:
                break
        if left > EPS * max(1.0, s.rate):
            residues.append((s, left))
            bound += 1
    # ---- ScheduleResidue
    def alone_occupancy(item: tuple[Session, float]) -> float:
        s, r = item
        p = prefs[s.index][0].profiles[s.model]
        slot = residue_slot(p, s, r)
        return p.latency(slot[0]) / slot[1] if slot else 1.0

    shared: list[Node] = []
    for s, r in sorted(residues, key=lambda it: (-alone_occupancy(it), it[0].index)):
        best, best_i = None, -1
        alone = {k.name: residue_slot(k.profiles[s.model], s, r) for k in kinds if s.model in k.profiles}
        for i, n in enumerate(shared):
            if alone.get(n.device) is None:
                continue
            m = merge(n, s, r, by_name[n.device], alone[n.device])
            if m is not None and (best is None or m.occupancy > best.occupancy + EPS):
                best, best_i = m, i
        if best is not None:
            shared[best_i] = best
            continue
        opened = None
        for k in prefs[s.index]:
            if free[k.name] < 1:
                continue
            opened = merge(Node(k.name, math.inf, []), s, r, k)
            if opened is not None:
                free[k.name] -= 1
                break
        if opened is None:
            busy = all(free[k.name] < 1 for k in prefs[s.index])
            reason = (f"no free device: every device of kind {', '.join(k.name for k in prefs[s.index])} is in use"
                      if busy else f"rate {r:.4g}/s left over needs more than one node of any free kind")
            unplaced.append(Unplaced(s.index, s.model, r, reason))
        else:
            shared.append(opened)
    return Plan(nodes + shared, sorted(unplaced, key=lambda u: u.session), sessions,
                {s.index: prefs[s.index][0].name for s in sessions if prefs[s.index]}, lower, bound)
