"""Requests as the scheduler sees them: samples with IDs, the FIFO request
queue, and the reorder buffer that hands results back in ID order.

Why IDs: with early exits and preemption, samples finish out of order (a
sample admitted later can leave at exit 1 while an older one is still on its
way to the final exit). Clients expect answers in request order, so every
sample gets a sequential ID on admission and `ReorderBuffer` releases results
only when every smaller ID has been released.

Board-side code: pure Python, no numpy needed.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Sample:
    """One inference request.

    `payload` is whatever the backend needs to run it: an input buffer for a
    real NPU, the pre-drawn exit index for the simulated one.
    """

    __slots__ = ("id", "arrival", "payload")

    id: int
    arrival: float
    payload: Any

    def __repr__(self) -> str:
        return f"Sample({self.id}, t={self.arrival:.6f})"


class RequestQueue:
    """FIFO of waiting samples; assigns sequential IDs on admission.

    Every operation the scheduler uses on the hot path (length, oldest,
    popping k from the head) is O(1) per sample moved and never scans the
    queue, so the decision cost does not grow with the backlog.
    """

    def __init__(self, first_id: int = 0) -> None:
        self._q: deque[Sample] = deque()
        self._next_id = first_id

    def admit(self, arrival: float, payload: Any = None) -> Sample:
        """Append a new request arriving at `arrival` and return it with its ID."""
        if self._q and arrival < self._q[-1].arrival:
            raise ValueError(f"arrival {arrival} is earlier than the queue tail's {self._q[-1].arrival}")
        s = Sample(self._next_id, arrival, payload)
        self._next_id += 1
        self._q.append(s)
        return s

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self._q)

    def oldest(self) -> Sample:
        """The head of the queue (the sample that has waited longest)."""
        return self._q[0]

    def pop(self, n: int) -> list[Sample]:
        """Remove and return the n oldest samples (n <= len)."""
        if not 0 <= n <= len(self._q):
            raise ValueError(f"cannot pop {n} samples from a queue of {len(self._q)}")
        pop = self._q.popleft
        return [pop() for _ in range(n)]

    @property
    def admitted(self) -> int:
        """How many IDs have been handed out."""
        return self._next_id


class ReorderBuffer:
    """Holds out-of-order results and releases them in sample-ID order."""

    def __init__(self, first_id: int = 0) -> None:
        self._heap: list[tuple[int, Any]] = []
        self._next = first_id
        self._seen: set[int] = set()

    def add(self, sample_id: int, result: Any) -> list[tuple[int, Any]]:
        """Store one result; return every result that is now releasable, in ID order."""
        if sample_id < self._next or sample_id in self._seen:
            raise ValueError(f"result for sample {sample_id} delivered twice")
        self._seen.add(sample_id)
        heapq.heappush(self._heap, (sample_id, result))
        out: list[tuple[int, Any]] = []
        while self._heap and self._heap[0][0] == self._next:
            sid, res = heapq.heappop(self._heap)
            self._seen.discard(sid)
            out.append((sid, res))
            self._next += 1
        return out

    @property
    def next_id(self) -> int:
        """The ID the buffer is waiting for before it can release anything more."""
        return self._next

    def __len__(self) -> int:
        """Results held back because an earlier ID has not finished."""
        return len(self._heap)
