"""The batch table and batch queues (DVABatch §5.2).

A batch-table row: id, bs (live queries), time (creation), statusmap (queries
completed per stage), plus what the engine needs: the queries in row order,
each query's position (the stage it is in or waiting for), held parts (rows
that finished a stage and wait at that boundary for a stretch's catch-up
rows), and the no-stretch mark (set once a split is known; inherited by the
split-off batches).

A batch-queue row: (id, start, num) — the batch, the index of its first
to-be-processed query and how many — with the data parts it reads: (slot,
lo, hi) row ranges of buffer slots, or the collated input at stage 0.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fluidnpu.host_driver.staged.buffers import BufferSlot


@dataclass(eq=False)
class Query:
    """One user query. payload: the workload's input (token ids, an image)."""

    id: int
    payload: Any
    arrival: float = 0.0
    length: int = 1


@dataclass(eq=False)
class Part:
    """Rows [lo, hi) of a slot's data, or of `data` itself when slot is None (stage-0 inputs)."""

    slot: BufferSlot | None
    lo: int
    hi: int
    data: Any = None
    event: Any = None

    def state(self, ops):
        src = self.slot.data if self.slot is not None else self.data
        if self.lo == 0 and self.hi == ops.rows(src):
            return src
        return ops.take(src, self.lo, self.hi)


@dataclass(eq=False)
class QueueItem:
    batch_id: int
    start: int
    num: int
    queries: list[Query]
    parts: list[Part]


@dataclass(eq=False)
class BatchRow:
    id: int
    time: float
    n_stages: int
    queries: list[Query] = field(default_factory=list)
    statusmap: list[int] = field(default_factory=list)
    pos: dict[int, int] = field(default_factory=dict)            # query id -> stage it is in / waiting for
    held: dict[int, list[tuple[list[Query], Part]]] = field(default_factory=dict)  # boundary -> parts
    no_stretch: bool = False
    split_order: list[int] | None = None
    split_at: int | None = None
    failed: str | None = None
    parent: int | None = None
    answered: int = 0
    stretches: int = 0

    def __post_init__(self) -> None:
        if not self.statusmap:
            self.statusmap = [0] * self.n_stages

    @property
    def bs(self) -> int:
        return len(self.queries)

    def behind(self, boundary: int) -> int:
        """Live queries that have not yet reached `boundary` (still in an earlier stage or queue)."""
        return sum(1 for q in self.queries if self.pos[q.id] < boundary)

    def index(self, q: Query) -> int:
        return self.queries.index(q)


class BatchTable:
    def __init__(self, n_stages: int) -> None:
        self.n_stages = n_stages
        self.rows: dict[int, BatchRow] = {}
        self._next = 0
        self.created: list[int] = []   # ids in creation order (new and split)

    def _add(self, now: float, queries: list[Query], parent: int | None = None) -> BatchRow:
        row = BatchRow(self._next, now, self.n_stages, list(queries), parent=parent)
        self._next += 1
        self.rows[row.id] = row
        self.created.append(row.id)
        return row

    def new(self, queries: list[Query], now: float) -> BatchRow:
        row = self._add(now, queries)
        for q in queries:
            row.pos[q.id] = 0
        return row

    def stretch(self, row: BatchRow, queries: list[Query]) -> None:
        row.queries.extend(queries)
        row.stretches += 1
        for q in queries:
            row.pos[q.id] = 0

    def split(self, row: BatchRow, groups: list[list[Query]], boundary: int, now: float) -> list[BatchRow]:
        """Replace `row` by one row per group (all at `boundary`); children keep no-stretch."""
        out = []
        for g in groups:
            child = self._add(row.time, g, parent=row.id)
            child.no_stretch = True
            child.statusmap = [len(g) if s < boundary else 0 for s in range(self.n_stages)]
            for q in g:
                child.pos[q.id] = boundary
            out.append(child)
        self.retire(row)
        return out

    def retire(self, row: BatchRow) -> None:
        self.rows.pop(row.id, None)

    def latest(self) -> BatchRow | None:
        """The latest batch stored in the batch table (§5.2.2: the only one a stretch may grow), i.e. the
        most recently created row that is still there, not only the most recently created row."""
        return next(reversed(self.rows.values()), None)   # rows are kept in creation order

    def view(self) -> list[dict]:
        return [{"id": r.id, "bs": r.bs, "time": r.time, "statusmap": list(r.statusmap)} for r in self.rows.values()]


class BatchQueue:
    """FIFO of QueueItems in front of one stage executor."""

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.items: deque[QueueItem] = deque()

    def push(self, item: QueueItem) -> None:
        # Rows of a batch already waiting here (not started) are merged into its item.
        for it in self.items:
            if it.batch_id == item.batch_id:
                it.queries.extend(item.queries)
                it.parts.extend(item.parts)
                it.num += item.num
                it.start = min(it.start, item.start)
                return
        self.items.append(item)

    def get(self) -> QueueItem:
        return self.items.popleft()

    def peek(self) -> QueueItem | None:
        return self.items[0] if self.items else None

    def __len__(self) -> int:
        return len(self.items)

    def rows(self) -> int:
        return sum(it.num for it in self.items)

    def view(self) -> list[dict]:
        return [{"id": it.batch_id, "start": it.start, "num": it.num} for it in self.items]
