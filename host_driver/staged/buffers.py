"""Buffer slots between stages and their states (DVABatch §6.1).

Boundary b (1 <= b < N) sits between stage b-1 (its producer) and stage b
(its consumer) and owns a ring of slots, two by default (the paper finds two
buffer pairs best, §8.6). The buffer pair of an executor is (a slot of its
input boundary, a slot of its output boundary). Slot states:

* AVAILABLE  — no executor uses it and it holds nothing: it may be claimed as an output.
* IN_WRITING — claimed as the output of a batch whose stage work is enqueued; its
  CUDA event is recorded on the producer's stream after the stage's kernels.
* INVALID    — holds activations some batch-queue item (or a held stretch part)
  has not read yet: it must not be overwritten, i.e. it is invalid as an output.
* IN_READING — the input of an enqueued stage execution; back to INVALID while
  other items (split parts) still refer to it, else to AVAILABLE.

A pair is legitimate when its input slot's write has been observed complete
(the item was pushed only then) and an AVAILABLE output slot exists. An
executor that pulled an item without a legitimate pair is CHECKING. Stream
order is enforced on the device: the consumer's stream waits on the slot's
write event (cudaStreamWaitEvent), and tensors used across streams are
`record_stream`-ed so the caching allocator does not hand their memory out
early (our slots hold PyTorch tensors rather than fixed preallocated arrays,
because activation shapes change with batch size and sequence length).

Deadlock freedom with stretch: a stretched batch holds its finished rows in a
slot until the catch-up rows arrive, and those need slots at the same
boundaries. When no slot is AVAILABLE and at least one slot of the ring is
held for a stretch, the ring grows by one slot (counted in `grown`).
"""

from __future__ import annotations

from enum import Enum


class BufState(str, Enum):
    AVAILABLE = "available"
    INVALID = "invalid"
    IN_READING = "in-reading"
    IN_WRITING = "in-writing"


class BufferSlot:
    def __init__(self, boundary: int, index: int) -> None:
        self.boundary = boundary
        self.index = index
        self.state = BufState.AVAILABLE
        self.data = None          # the state tuple written by the producer
        self.event = None         # write-complete event (recorded on the producer stream)
        self.refs = 0             # parts referring to the data and not yet read
        self.reading = 0          # enqueued reads not yet observed complete
        self.held = 0             # parts held for a stretch catch-up

    def __repr__(self) -> str:
        return f"Slot(b{self.boundary}#{self.index} {self.state.value} refs={self.refs} held={self.held})"


class BufferRing:
    def __init__(self, boundary: int, capacity: int = 2) -> None:
        if capacity < 1:
            raise ValueError("a boundary needs at least one buffer slot")
        self.boundary = boundary
        self.slots = [BufferSlot(boundary, i) for i in range(capacity)]
        self.grown = 0

    def claim(self) -> BufferSlot | None:
        """An AVAILABLE slot, now IN_WRITING; None if the executor must keep CHECKING."""
        for s in self.slots:
            if s.state is BufState.AVAILABLE:
                s.state = BufState.IN_WRITING
                return s
        if any(s.held for s in self.slots):
            s = BufferSlot(self.boundary, len(self.slots))
            self.slots.append(s)
            self.grown += 1
            s.state = BufState.IN_WRITING
            return s
        return None

    def has_available(self) -> bool:
        return any(s.state is BufState.AVAILABLE for s in self.slots) or any(s.held for s in self.slots)

    @staticmethod
    def written(slot: BufferSlot, data, event, refs: int) -> None:
        """The producer's write was observed complete; `refs` parts now refer to the slot."""
        slot.data, slot.event, slot.refs = data, event, refs
        slot.state = BufState.INVALID if refs else BufState.AVAILABLE
        if not refs:
            slot.data = None

    @staticmethod
    def begin_read(slot: BufferSlot) -> None:
        slot.reading += 1
        slot.state = BufState.IN_READING

    @staticmethod
    def end_read(slot: BufferSlot) -> None:
        """One part's read was observed complete."""
        slot.reading -= 1
        slot.refs -= 1
        if slot.reading == 0:
            slot.state = BufState.INVALID if slot.refs > 0 else BufState.AVAILABLE
        BufferRing._free_if_unused(slot)

    @staticmethod
    def drop(slot: BufferSlot) -> None:
        """One part is discarded without being read (its queries failed)."""
        slot.refs -= 1
        BufferRing._free_if_unused(slot)

    @staticmethod
    def _free_if_unused(slot: BufferSlot) -> None:
        """No part left to read it and no read in flight: the slot is available again."""
        if slot.refs <= 0 and slot.reading == 0:
            slot.refs = 0
            slot.data = None
            slot.event = None
            slot.held = 0
            slot.state = BufState.AVAILABLE
