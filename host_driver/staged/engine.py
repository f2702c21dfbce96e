"""The staged engine: stage executors, buffer slots, the batch table and batch
queues, and the meta-operations new, stretch and split (DVABatch §5–§6).

Executor states (§6.2): INACTIVE (nothing queued), ACTIVE (an item queued and
a legitimate buffer pair can be had), CHECKING (pulled an item but no output
slot is AVAILABLE: waits, re-checked on every step), WORKING (the stage's
kernels are enqueued on the executor's stream; it stays WORKING until its
completion event is observed with a non-blocking `event.query()`).

One host thread drives all executors cooperatively (`step`): on CUDA a stage
is launched asynchronously on its executor's stream, so stages of different
batches run concurrently on the GPU while the host only enqueues and polls;
the host never calls a device-wide synchronize. A stage whose result the host
does not need (no exit head, not the last stage) passes its batch to the next
batch queue at launch, and the next stage's stream waits on its event on the
device: dependent stages are enqueued back to back, the host off the critical
path (DVABatch). The batch table still tells where every query is (its
position advances at launch), which is what stretch needs. Exit confidences
and final outputs come back through non-blocking copies into pinned memory,
read once the stage's event completed. `serial=True` launches nothing while a
stage execution is in flight (strictly serial). On CPU the streams and events
are no-ops and every stage runs synchronously inside `step`; a fake device in
the tests makes the events asynchronous.

Meta-operations:
* new(queries): a batch-table row and an item in batch queue 0.
* stretch(row, queries): the row grows; an item (id, start=old bs, num) goes to
  queue 0 so the new queries catch up. Rows that finish a stage while some of
  the batch's queries are still behind it are *held* at that boundary; when
  the last one arrives they are merged into one item (§5.2.2).
* split(row, sizes) (or the engine's `split_hook`, called whenever a whole batch
  is about to enter the next stage): the row is replaced by one row per group,
  all marked no-stretch, pushed one by one into the next queue.
* early exits: at a stage that ends with an exit head, queries whose confidence
  reaches the threshold are answered there and the rest continue (a split that
  removes them).

Every query is answered exactly once, with its output row or with the error
of the stage that failed on it; a failing stage never blocks the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.batch_table import BatchQueue, BatchRow, BatchTable, Part, Query, QueueItem
from fluidnpu.host_driver.staged.buffers import BufferRing
from fluidnpu.host_driver.staged.model import ModelSpec, call_module
from fluidnpu.host_driver.staged.slicing import StageProfile
from fluidnpu.host_driver.staged.torchutil import StreamShim, require_torch, to_host_async

# Host overhead is counted in this thread's CPU time, so that a busy machine's preemptions do not count.
_cpu = time.thread_time


class ExecState(str, Enum):
    ACTIVE = "active"
    CHECKING = "checking"
    WORKING = "working"
    INACTIVE = "inactive"


@dataclass
class Result:
    query_id: int
    output: Any = None         # CPU tensor (the model's output row, or the exit head's logits)
    error: str | None = None
    done: float = 0.0          # engine clock when answered
    exit: int | None = None    # index of the early exit taken, None for the final output


@dataclass
class _Inflight:
    item: QueueItem
    slot: Any
    out: Any
    logits: Any            # host copy of the exit head's logits (in flight until `event` completes)
    event: Any
    forwarded: bool = False   # the batch already went on to the next stage's queue at launch
    conf: Any = None       # host copy of the exit confidences
    rows: Any = None       # host copy of the final outputs (last stage)


class StageExecutor:
    def __init__(self, engine: StagedEngine, index: int, modules: Sequence[Any], stream: StreamShim,
                 exit_head=None, exit_index: int | None = None) -> None:
        self.engine = engine
        self.index = index
        self.modules = list(modules)
        self.stream = stream
        self.exit_head = exit_head
        self.exit_index = exit_index
        self.state = ExecState.INACTIVE
        self.inflight: _Inflight | None = None
        self.executions = 0
        self.rows = 0
        self.overhead_s = 0.0      # host time outside the modules' forward calls
        self.transitions: list[ExecState] = []

    @property
    def queue(self) -> BatchQueue:
        return self.engine.queues[self.index]

    @property
    def out_ring(self) -> BufferRing | None:
        return self.engine.rings[self.index + 1] if self.index + 1 < self.engine.n_stages else None

    def _set(self, st: ExecState) -> None:
        if st is not self.state:
            self.state = st
            if self.engine.trace_states:
                self.transitions.append(st)

    def busy(self) -> bool:
        return self.state is ExecState.WORKING or len(self.queue) > 0

    def step(self) -> bool:
        progress = False
        eng = self.engine
        if self.state is ExecState.WORKING:
            t0 = _cpu()
            try:
                done = self.inflight.event.query()
            except Exception as exc:  # noqa: BLE001 - an asynchronous device error surfaces here
                self._fail_inflight(exc)
                done = False
                progress = True
            if done:
                self._complete()
                progress = True
            self.overhead_s += _cpu() - t0
            if self.state is ExecState.WORKING:
                return progress
        if not self.queue:
            self._set(ExecState.INACTIVE)
            return progress
        self._set(ExecState.ACTIVE)
        if eng.serial and eng.working():   # strictly serial: one stage execution on the device at a time
            return progress
        ring = self.out_ring
        slot = None
        if ring is not None:
            slot = ring.claim()
            if slot is None:
                self._set(ExecState.CHECKING)
                return progress
        item = self.queue.get()
        self._launch(item, slot)
        return True

    # -- execution -------------------------------------------------------
    def _launch(self, item: QueueItem, slot) -> None:
        eng = self.engine
        t0 = _cpu()
        compute = 0.0
        for p in item.parts:
            if p.slot is not None:
                BufferRing.begin_read(p.slot)
        try:
            torch = require_torch()
            with torch.inference_mode(), self.stream.context():
                for p in item.parts:
                    self.stream.wait(p.slot.event if p.slot is not None else p.event)

                if self.stream.cuda:   # tensors written on other streams are now read on this one
                    for p in item.parts:
                        src = p.slot.data if p.slot is not None else p.data
                        self.stream.keep_alive([t for t in src if hasattr(t, "record_stream")])
                x = eng.spec.ops.merge([p.state(eng.spec.ops) for p in item.parts])
                if eng.spec.length is not None and hasattr(eng.spec.ops, "trim"):
                    x = eng.spec.ops.trim(x, max(eng.spec.length(q.payload) for q in item.queries))
                if eng.fail_stage is not None and eng.fail_stage(self.index, item):
                    raise RuntimeError(f"injected failure in stage {self.index}")
                c0 = _cpu()
                for m in self.modules:
                    x = call_module(m, x)
                logits = conf = rows = None
                if self.index == eng.n_stages - 1:
                    rows = to_host_async(eng.spec.output(x), self.stream)
                elif self.exit_head is not None:   # confidences and logits read back without blocking
                    lg = self.exit_head.head(x[0] if len(x) == 1 else x)
                    conf = to_host_async(torch.softmax(lg.float(), -1).amax(-1), self.stream)
                    logits = to_host_async(lg, self.stream)
                compute = _cpu() - c0
                ev = self.stream.record()
        except Exception as exc:  # noqa: BLE001 - the stage's queries fail with this error
            for p in item.parts:
                if p.slot is not None:
                    BufferRing.end_read(p.slot)
            if slot is not None:
                BufferRing.written(slot, None, None, 0)
            eng._fail(item, f"stage {self.index} failed: {type(exc).__name__}: {exc}")
            self._set(ExecState.ACTIVE if self.queue else ExecState.INACTIVE)
            self.overhead_s += _cpu() - t0 - compute
            return
        self.inflight = _Inflight(item, slot, x, logits, ev, conf=conf, rows=rows)
        self.executions += 1
        self.rows += item.num
        eng.launch_log.append((self.index, item.batch_id, item.num))
        self._set(ExecState.WORKING)
        if slot is not None and conf is None:
            # Nothing here needs the host to see the result: the batch goes on to the next queue now, and
            # the next stage's stream waits on `ev` on the device (DVABatch enqueues dependent stages at once).
            self.inflight.forwarded = True
            eng._forward(self, item, slot, x, ev)
        self.overhead_s += _cpu() - t0 - compute

    def _fail_inflight(self, exc: Exception) -> None:
        inf = self.inflight
        self.inflight = None
        for p in inf.item.parts:
            if p.slot is not None:
                BufferRing.end_read(p.slot)
        if not inf.forwarded:
            # A forwarded batch is already in a later stage, whose own event reports the (sticky) device error.
            if inf.slot is not None:
                BufferRing.written(inf.slot, None, None, 0)
            self.engine._fail(inf.item, f"stage {self.index} failed: {type(exc).__name__}: {exc}")
        self._set(ExecState.ACTIVE if self.queue else ExecState.INACTIVE)

    def _complete(self) -> None:
        eng = self.engine
        inf = self.inflight
        self.inflight = None
        item = inf.item
        for p in item.parts:
            if p.slot is not None:
                BufferRing.end_read(p.slot)
        self._set(ExecState.ACTIVE if self.queue else ExecState.INACTIVE)
        row = eng.table.rows.get(item.batch_id)
        if row is not None:
            row.statusmap[self.index] += item.num
        if not inf.forwarded:
            eng._stage_done(self, inf)


class StagedEngine:
    """N stage executors over a model sliced by `profile.bounds`.

    split_hook(engine, row, boundary) -> list of group sizes or None: called when
    a whole batch is about to enter stage `boundary` (the Schedule() of Fig. 12).
    fail_stage(stage, item) -> bool: test hook that makes a stage raise.
    """

    def __init__(self, spec: ModelSpec, profile: StageProfile, device, n_buffers: int = 2, max_batch: int = 64,
                 split_hook: Callable | None = None, clock: Callable[[], float] = time.perf_counter,
                 trace_states: bool = False, serial: bool = False,
                 stream_factory: Callable[[Any], StreamShim] = StreamShim) -> None:
        require_torch()
        if n_buffers < 1:
            raise FluidError(f"need at least one buffer pair, got {n_buffers}")
        if max_batch < 1:
            raise FluidError(f"the largest batch must be >= 1, got {max_batch}")
        bounds = list(profile.bounds)
        if not bounds or bounds[0][0] != 0 or bounds[-1][1] != len(spec.modules) or any(
                a[1] != b[0] or a[0] >= a[1] for a, b in zip(bounds, bounds[1:] + [(bounds[-1][1], None)])):
            raise FluidError(f"stage bounds {bounds} do not cover {spec.name}'s {len(spec.modules)} modules")
        exits = spec.exit_after
        for e in spec.exits:
            if not any(hi == e.after + 1 for _, hi in bounds):
                raise FluidError(f"the exit after module {e.after} is not at a stage boundary {bounds}")
        self.spec = spec
        self.profile = profile
        self.device = device
        self.n_stages = len(bounds)
        self.max_batch = int(max_batch)
        self.split_hook = split_hook
        self.fail_stage = None
        self.clock = clock
        self.trace_states = trace_states
        self.serial = bool(serial)
        self.table = BatchTable(self.n_stages)
        self.queues = [BatchQueue(s) for s in range(self.n_stages)]
        self.rings: list[BufferRing | None] = [None] + [BufferRing(b, n_buffers) for b in range(1, self.n_stages)]
        exit_ids = {e.after: k for k, e in enumerate(spec.exits)}
        self.executors = []
        for s, (lo, hi) in enumerate(bounds):
            head = exits.get(hi - 1)
            self.executors.append(StageExecutor(self, s, spec.modules[lo:hi], stream_factory(device), head,
                                                exit_ids.get(hi - 1)))
        self.input_stream = stream_factory(device)
        self.results: dict[int, Result] = {}
        self._live_ids: set[int] = set()
        self.submitted = 0
        self.launch_log: list[tuple[int, int, int]] = []
        self.meta_log: list[tuple[str, int, int]] = []   # (op, batch id, queries)
        self.meta_overhead_s = 0.0
        self.collate_s = 0.0       # input preparation (tokens to padded tensors, host to device), not scheduling

    # -- meta-operations -------------------------------------------------
    def _inputs(self, queries: list[Query]) -> Part:
        if not queries:
            raise FluidError("an empty batch cannot be scheduled")
        for q in queries:
            self.spec.check_payload(q.payload)
        torch = require_torch()
        t0 = _cpu()
        with torch.inference_mode(), self.input_stream.context():
            data = self.spec.collate([q.payload for q in queries], self.device)
            ev = self.input_stream.record()
        self.collate_s += _cpu() - t0
        return Part(None, 0, len(queries), data, ev)

    def new(self, queries: Sequence[Query], now: float | None = None) -> BatchRow:
        """Meta-operation new: a batch of these queries enters stage 0."""
        t0 = _cpu()
        queries = list(queries)
        if len(queries) > self.max_batch:
            raise FluidError(f"a batch of {len(queries)} queries is larger than the maximum {self.max_batch}")
        self._check_fresh(queries)
        part = self._inputs(queries)
        row = self.table.new(queries, self.clock() if now is None else now)
        self.submitted += len(queries)
        self.queues[0].push(QueueItem(row.id, 0, len(queries), list(queries), [part]))
        self.meta_log.append(("new", row.id, len(queries)))
        self.meta_overhead_s += _cpu() - t0
        return row

    def can_stretch(self, row: BatchRow | None, n: int = 1) -> bool:
        return (row is not None and row.id in self.table.rows and not row.no_stretch and row.split_order is None
                and row.answered == 0 and row.bs > 0 and row.bs + n <= self.max_batch)

    def stretch(self, row: BatchRow, queries: Sequence[Query]) -> None:
        """Meta-operation stretch: these queries join `row` and catch up with its progress."""
        t0 = _cpu()
        queries = list(queries)
        if not queries:
            raise FluidError("an empty batch cannot be scheduled")
        if not self.can_stretch(row, len(queries)):
            raise FluidError(f"batch {getattr(row, 'id', None)} cannot be stretched (finished, split, answering, "
                             f"or beyond the maximum batch {self.max_batch})")
        self._check_fresh(queries)
        part = self._inputs(queries)
        start = row.bs
        self.table.stretch(row, queries)
        self.submitted += len(queries)
        self.queues[0].push(QueueItem(row.id, start, len(queries), list(queries), [part]))
        self.meta_log.append(("stretch", row.id, len(queries)))
        self.meta_overhead_s += _cpu() - t0

    def split(self, row: BatchRow, sizes: Sequence[int], at: int | None = None) -> None:
        """Meta-operation split: when `row` next enters a stage as a whole (stage `at` or later if
        given), break it into batches of these sizes."""
        if row.id not in self.table.rows:
            raise FluidError(f"batch {row.id} is no longer in the batch table")
        sizes = [int(s) for s in sizes]
        if not sizes or any(s < 1 for s in sizes):
            raise FluidError(f"split sizes must be >= 1, got {sizes}")
        row.split_order = sizes
        row.split_at = at
        row.no_stretch = True

    def _check_fresh(self, queries: list[Query]) -> None:
        ids = {q.id for q in queries}
        if len(ids) != len(queries) or any(i in self.results or i in self._live_ids for i in ids):
            raise FluidError("a query was submitted twice")
        self._live_ids |= ids

    # -- completion, holding, release ----------------------------------
    def _answer(self, q: Query, output=None, error: str | None = None, exit_index: int | None = None,
                now: float | None = None) -> None:
        if q.id in self.results:
            raise RuntimeError(f"query {q.id} answered twice")
        self.results[q.id] = Result(q.id, output, error, self.clock() if now is None else now, exit_index)
        self._live_ids.discard(q.id)

    def _remove(self, row: BatchRow, queries: Sequence[Query]) -> None:
        drop = {q.id for q in queries}
        row.queries = [q for q in row.queries if q.id not in drop]
        for i in drop:
            row.pos.pop(i, None)

    def _fail(self, item: QueueItem, msg: str) -> None:
        for p in item.parts:
            if p.slot is not None:
                BufferRing.drop(p.slot)
        for q in item.queries:
            self._answer(q, error=msg)
        row = self.table.rows.get(item.batch_id)
        if row is not None:
            self._remove(row, item.queries)
            self._after_membership_change(row)

    def _after_membership_change(self, row: BatchRow) -> None:
        if row.bs == 0:
            for parts in list(row.held.values()):
                for _qs, p in parts:
                    p.slot.held -= 1
                    BufferRing.drop(p.slot)
            row.held.clear()
            self.table.retire(row)
            return
        for b in sorted(row.held):
            self._try_release(row, b)

    def _stage_done(self, ex: StageExecutor, inf: _Inflight) -> None:
        """A stage whose result the host needs (an exit's confidences, the final outputs) completed: its
        host copies are ready, nothing blocks."""
        t0 = _cpu()
        s, item = ex.index, inf.item
        row = self.table.rows.get(item.batch_id)
        queries = item.queries
        n = len(queries)
        if s == self.n_stages - 1:
            now = self.clock()
            for q, r in zip(queries, inf.rows.unbind(0)):
                self._answer(q, r, now=now)
            if row is not None:
                row.answered += n
                self._remove(row, queries)
                self._after_membership_change(row)
            self.meta_overhead_s += _cpu() - t0
            return
        out, ev = inf.out, inf.event
        thr = ex.exit_head.threshold
        exited = [i for i in range(n) if bool(inf.conf[i] >= thr)]
        for i in exited:
            self._answer(queries[i], inf.logits[i], exit_index=ex.exit_index)
        gone = set(exited)
        keep = [i for i in range(n) if i not in gone]
        if exited:
            if row is not None:
                row.answered += len(exited)
                self._remove(row, [queries[i] for i in exited])
            if keep:
                torch = require_torch()
                with torch.inference_mode(), ex.stream.context():
                    idx = torch.tensor(keep, device=out[0].device)
                    out = self.spec.ops.select(out, idx)
                    ev = ex.stream.record()
        if not keep:
            BufferRing.written(inf.slot, None, None, 0)
            if row is not None:
                self._after_membership_change(row)
            self.meta_overhead_s += _cpu() - t0
            return
        self._forward(ex, QueueItem(item.batch_id, item.start, len(keep), [queries[i] for i in keep], item.parts),
                      inf.slot, out, ev)
        self.meta_overhead_s += _cpu() - t0

    def _forward(self, ex: StageExecutor, item: QueueItem, slot, out, ev) -> None:
        """The item's queries are through stage ex.index (or will be, once `ev` completes on the device):
        its output slot goes to the next boundary, held there while some of the batch is still behind."""
        t0 = _cpu()
        s = ex.index
        row = self.table.rows.get(item.batch_id)
        BufferRing.written(slot, out, ev, 1)
        if row is None:   # cannot happen: a batch with live queries stays in the table
            raise RuntimeError(f"batch {item.batch_id} vanished with live queries")
        slot.held += 1
        for q in item.queries:
            row.pos[q.id] = s + 1
        row.held.setdefault(s + 1, []).append((list(item.queries), Part(slot, 0, len(item.queries))))
        self._after_membership_change(row)
        self.meta_overhead_s += _cpu() - t0

    def _try_release(self, row: BatchRow, b: int) -> None:
        if b not in row.held or row.behind(b) > 0:
            return
        held = row.held.pop(b)
        queries: list[Query] = []
        parts: list[Part] = []
        for qs, p in held:
            p.slot.held -= 1
            queries.extend(qs)
            parts.append(p)
        whole = len(queries) == row.bs
        sizes = None
        if whole:
            if row.split_order is not None and (row.split_at is None or b >= row.split_at):
                sizes = row.split_order
                row.split_order = None
            elif self.split_hook is not None:
                sizes = self.split_hook(self, row, b)
        if sizes and len(sizes) > 1 and sum(sizes) == len(queries) and all(x >= 1 for x in sizes):
            groups, subparts = [], []
            flat = [(p, r) for p in parts for r in range(p.lo, p.hi)]
            at = 0
            for size in sizes:
                groups.append(queries[at:at + size])
                subparts.append(_ranges(flat[at:at + size]))
                at += size
            for sp in subparts:
                for p in sp:
                    p.slot.refs += 1
            for p in parts:
                p.slot.refs -= 1
            children = self.table.split(row, groups, b, self.clock())
            self.meta_log.append(("split", row.id, len(queries)))
            for child, g, sp in zip(children, groups, subparts):
                self.queues[b].push(QueueItem(child.id, 0, len(g), list(g), sp))
            return
        start = min(row.index(q) for q in queries)
        self.queues[b].push(QueueItem(row.id, start, len(queries), queries, parts))

    # -- driving ---------------------------------------------------------
    def step(self) -> bool:
        """One pass over the executors, last stage first (so that slots free up early)."""
        progress = False
        for ex in reversed(self.executors):
            progress |= ex.step()
        return progress

    def live(self) -> int:
        return self.submitted - len(self.results)

    def working(self) -> bool:
        return any(ex.state is ExecState.WORKING for ex in self.executors)

    def stage_free(self, s: int = 0) -> bool:
        ex = self.executors[s]
        return ex.state is not ExecState.WORKING and not ex.queue

    def run_until_done(self, timeout_s: float = 600.0) -> None:
        """Step until every submitted query is answered (raises if the engine is stuck)."""
        deadline = time.perf_counter() + timeout_s
        while self.live() > 0:
            if not self.step():
                if not self.working():
                    raise RuntimeError(f"staged engine stuck with {self.live()} queries unanswered: "
                                       f"table={self.table.view()} queues={[q.view() for q in self.queues]}")
                if time.perf_counter() > deadline:
                    raise RuntimeError("staged engine timed out")

    def overhead_per_stage_s(self) -> float:
        n = sum(ex.executions for ex in self.executors)
        sched = sum(ex.overhead_s for ex in self.executors) + self.meta_overhead_s - self.collate_s
        return sched / n if n else 0.0

    def grown_slots(self) -> int:
        return sum(r.grown for r in self.rings if r is not None)


def _ranges(rows: list[tuple[Part, int]]) -> list[Part]:
    """Coalesce (part, row) pairs into contiguous Parts over the same slots."""
    out: list[Part] = []
    for p, r in rows:
        if out and out[-1].slot is p.slot and out[-1].hi == r:
            out[-1].hi = r + 1
        else:
            out.append(Part(p.slot, r, r + 1))
    return out
