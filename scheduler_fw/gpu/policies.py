"""DVABatch's policies (§7.2) and the single-entry single-exit baselines (§8.1).

A policy is driven by the load runner: `tick(now, pending, engine)` may issue
meta-operations (new, stretch; split orders) and returns the next time it
wants to be called without an arrival (or None). Policies that split install
`engine.split_hook`, which the engine calls whenever a whole batch is about
to enter the next stage (Fig. 12's Schedule()).

Interpretations (see docs/gpu.md):
* Policy I's batch window is "the duration of the first stage at bsmax": while
  queries are in the pipeline, the next batch(es) form when stage 0 is free and
  either the pipeline's room (bsmax minus active queries) is filled or the
  oldest query has waited one window; an idle pipeline takes queries at once
  (at low load DVABatch then behaves as ZeroBatch, as §8.2 reports).
* Clusters for Policy I are length buckets with edges at powers of two, so a
  batch pads to at most twice its shortest query.
* T_comp_wait for Policy III defaults to half the unsliced model's time at bsmax.
* Policy II splits a batch in halves at a boundary when T_remain(bs) >=
  2 T_remain(bs/2); the halves are checked again at later boundaries.
  T_remain sums the profiled stage times plus the engine's measured host cost
  per stage execution (which a split pays twice), since our per-module
  profile, unlike an end-to-end TensorRT profile, does not include it.
* The exit-aware split uses T_remain weighted by the survival fraction
  observed at each early exit so far.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.batch_table import BatchRow, Query


class GPUPolicy:
    name = "policy"
    n_stages = 1

    def __init__(self, bsmax: int = 64) -> None:
        if int(bsmax) < 1:
            raise FluidError(f"bsmax must be >= 1, got {bsmax}")
        self.bsmax = int(bsmax)

    def attach(self, engine) -> None:
        self.engine = engine

    def tick(self, now: float, pending: deque, engine) -> float | None:
        raise NotImplementedError

    @staticmethod
    def take(pending: deque, n: int) -> list[Query]:
        return [pending.popleft() for _ in range(min(n, len(pending)))]

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "bsmax": self.bsmax, "stages": self.n_stages}


class ZeroBatch(GPUPolicy):
    """Triton's dynamic batcher with a zero window: when the model is free, batch what is queued."""

    name = "zerobatch"

    def tick(self, now, pending, engine):
        if pending and engine.stage_free(0):
            engine.new(self.take(pending, self.bsmax), now)
        return None


class DelayBatch(GPUPolicy):
    """A batch time window: when the model is free, start a batch once bsmax queries are queued
    or the oldest has waited `window_s`."""

    name = "delaybatch"

    def __init__(self, bsmax: int = 64, window_s: float = 0.005) -> None:
        super().__init__(bsmax)
        if not window_s >= 0:
            raise FluidError(f"the batch window must be >= 0, got {window_s}")
        self.window_s = float(window_s)

    def tick(self, now, pending, engine):
        if not pending:
            return None
        due = pending[0].arrival + self.window_s
        if engine.stage_free(0) and (len(pending) >= self.bsmax or now >= due):
            engine.new(self.take(pending, self.bsmax), now)
            return pending[0].arrival + self.window_s if pending else None
        return due

    def describe(self):
        return {**super().describe(), "window_ms": self.window_s * 1e3}


def length_bucket(n: int) -> int:
    return max(0, int(math.ceil(math.log2(max(int(n), 1)))))


class DVABatch(GPUPolicy):
    """DVABatch on the staged engine: Policy I (input diversity), II (operator diversity),
    III (load diversity); each can be switched off (the DVABatch-split variant of §8.5
    is ``DVABatch(..., input_div=False, stretch=False)``)."""

    name = "dva"

    def __init__(self, profile, bsmax: int = 64, n_stages: int = 2, input_div: bool = True, split: bool = True,
                 stretch: bool = True, comp_wait_s: float | None = None, window_s: float | None = None,
                 stage_overhead_s: float = 50e-6) -> None:
        super().__init__(bsmax)
        self.profile = profile
        self.n_stages = int(n_stages)
        self.input_div = input_div
        self.split_enabled = split
        self.stretch_enabled = stretch
        self.comp_wait_s = 0.5 * profile.total(self.bsmax) if comp_wait_s is None else float(comp_wait_s)
        self.window_s = profile.time(0, self.bsmax) if window_s is None else float(window_s)
        self.default_overhead_s = float(stage_overhead_s)
        self.stretches = 0
        self.splits = 0
        self.buckets: dict[int, int] = {}   # batch id -> length bucket

    def attach(self, engine) -> None:
        super().attach(engine)
        if self.split_enabled:
            engine.split_hook = self.split_hook

    # Policy II -----------------------------------------------------------
    def overhead(self) -> float:
        eng = self.engine
        n = sum(ex.executions for ex in eng.executors)
        return eng.overhead_per_stage_s() if n >= 20 else self.default_overhead_s

    def remain(self, boundary: int, bs: float) -> float:
        eng = self.engine
        return eng.profile.remain(boundary, bs) + self.overhead() * (eng.n_stages - boundary)

    def split_hook(self, engine, row: BatchRow, boundary: int):
        bs = row.bs
        if bs < 2 or boundary >= engine.n_stages:
            return None
        half = bs // 2
        if self.remain(boundary, bs) >= 2.0 * self.remain(boundary, half) - 1e-15:
            self.splits += 1
            return [half, bs - half]
        return None

    # Policies I and III ---------------------------------------------------
    def _bucket(self, q: Query) -> int:
        return length_bucket(q.length) if self.input_div else 0

    def tick(self, now, pending, engine):
        if not pending:
            return None
        if self.stretch_enabled:
            row = engine.table.latest()
            if row is not None and engine.can_stretch(row) and now - row.time < self.comp_wait_s:
                front = max(row.pos.values()) if row.pos else engine.n_stages   # furthest rows
                if front < engine.n_stages - 1:
                    b = self.buckets.get(row.id, 0)
                    room = self.bsmax - row.bs
                    join = [q for q in pending if self._bucket(q) == b][:room]
                    if join:
                        for q in join:
                            pending.remove(q)
                        engine.stretch(row, join)
                        self.stretches += 1
        if pending and engine.stage_free(0):
            live = engine.live()
            room = self.bsmax - live
            if room <= 0:
                return None
            due = pending[0].arrival + self.window_s
            if live > 0 and len(pending) < room and now < due:
                return due
            batch = self.take(pending, room)
            groups: dict[int, list[Query]] = {}
            for q in sorted(batch, key=lambda q: q.length):
                groups.setdefault(self._bucket(q), []).append(q)
            for b, qs in sorted(groups.items()):
                row = engine.new(qs, now)
                self.buckets[row.id] = b
        return None

    def describe(self):
        return {**super().describe(), "input_div": self.input_div, "split": self.split_enabled,
                "stretch": self.stretch_enabled, "comp_wait_ms": self.comp_wait_s * 1e3,
                "window_ms": self.window_s * 1e3,
                "stretches": self.stretches, "splits": self.splits}


class ExitAwareDVA(DVABatch):
    """DVABatch for early-exit models: Policy II's T_remain counts only the queries
    expected to survive the exits ahead (survival fractions learned online)."""

    name = "dva-exit"

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.seen: dict[int, int] = {}

    def survival(self, stage: int) -> float:
        eng = self.engine
        entered = eng.executors[0].rows
        if entered == 0:
            return 1.0
        return max(eng.executors[stage].rows / entered, 1e-3)

    def remain(self, boundary: int, bs: float) -> float:
        eng = self.engine
        base = self.survival(boundary)
        return sum(eng.profile.time(s, max(bs * self.survival(s) / base, 1.0)) + self.overhead()
                   for s in range(boundary, eng.n_stages))


POLICIES = ("dva", "zerobatch", "delaybatch", "dp", "naive", "nobatch")
