"""TurboTransformers' sequence-length-aware allocator (Algorithm 1), and the plain caching allocator it
is compared with.

Why: with variable-length requests the intermediate tensors change size with every batch. A plain
caching allocator (cub's, PyTorch's) keeps freed blocks for reuse but sizes them for the request that
created them, so a stream of lengths leaves it holding blocks for every size seen; Algorithm 1 plans
all of one inference's tensors at once, from their lifetimes in the computation graph, into a few
large chunks that persist across inferences, so tensors whose lifetimes do not overlap share memory.

Algorithm 1 as written, with the three points the paper leaves open (docs/gpu.md, interpretation 10):
* FindGapFromChunk walks the chunk's records in increasing offset order (the Greedy-by-Size offset
  calculation it modifies requires it; otherwise `prev_offset` is meaningless);
* the records a chunk holds are this inference's only: each MemAllocate plans from scratch into the
  cached chunks, whose sizes (the device memory) are what persists;
* a chunk that receives no tensor in an inference is released then (the paper's default), or after
  `max_idle` such inferences (its alternative).

Pure bookkeeping (sizes and offsets, no device memory), so it is tested and measured on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fluidnpu.errors import FluidError

DEFAULT_CHUNK_SIZE = 2 * 1024 * 1024   # 2 MB, as in the paper
K_SCALE = 1.2


@dataclass(frozen=True)
class TensorUsage:
    """A tensor's lifetime: the first and last operator (topological indices) that use it, and its bytes."""

    first_op: int
    last_op: int
    size: int

    def overlaps(self, other: TensorUsage) -> bool:
        return max(self.first_op, other.first_op) <= min(self.last_op, other.last_op)


@dataclass
class Chunk:
    size: int
    records: list[tuple[int, int]] = field(default_factory=list)   # (tensor index, offset), by offset
    idle: int = 0


@dataclass(frozen=True)
class Placement:
    chunk: int
    offset: int


class SequenceLengthAwareAllocator:
    """Algorithm 1 over a persistent chunk list. `allocate(usages)` plans one inference."""

    def __init__(self, default_chunk_size: int = DEFAULT_CHUNK_SIZE, k_scale: float = K_SCALE,
                 max_idle: int = 0) -> None:
        if default_chunk_size < 1 or not k_scale >= 1.0 or max_idle < 0:
            raise FluidError("the chunk size must be >= 1 byte, K_SCALE >= 1 and the idle limit >= 0")
        self.default_chunk_size = int(default_chunk_size)
        self.k_scale = float(k_scale)
        self.max_idle = int(max_idle)
        self.chunks: list[Chunk] = []
        self.device_allocs = 0      # chunks obtained from the device (cudaMalloc calls)
        self.device_frees = 0
        self.peak_reserved = 0
        self.peak_after_last = 0

    @property
    def reserved(self) -> int:
        return sum(c.size for c in self.chunks)

    @staticmethod
    def find_gap(t: TensorUsage, chunk: Chunk, usages: Sequence[TensorUsage]) -> int | None:
        """FindGapFromChunk: the offset of the smallest gap that fits t between the chunk's tensors whose
        lifetimes overlap t's, or after the last of them; None if there is none."""
        smallest, prev, best = math.inf, 0, None
        for idx, off in chunk.records:
            x = usages[idx]
            if t.overlaps(x):
                gap = off - prev
                if t.size <= gap < smallest:
                    smallest, best = gap, prev
                prev = max(prev, off + x.size)
        if best is None and chunk.size - prev >= t.size:
            best = prev
        return best

    def allocate(self, usages: Sequence[TensorUsage]) -> list[Placement]:
        """MemAllocate: a (chunk, offset) for every tensor of one inference, biggest first."""
        for u in usages:
            if u.size < 0 or u.first_op > u.last_op:
                raise FluidError(f"bad tensor usage record {u}")
        for c in self.chunks:
            c.records = []
        placed: list[Placement | None] = [None] * len(usages)
        for i in sorted(range(len(usages)), key=lambda k: -usages[k].size):
            t = usages[i]
            for ci, c in enumerate(self.chunks):  # noqa: B007 (ci, the chunk found, is read after the loop)
                off = self.find_gap(t, c, usages)
                if off is not None:
                    break
            else:
                ci, off = len(self.chunks), 0
                self.chunks.append(Chunk(max(self.default_chunk_size, int(math.ceil(t.size * self.k_scale)))))
                self.device_allocs += 1
            c = self.chunks[ci]
            c.records.append((i, off))
            c.records.sort(key=lambda r: r[1])
            placed[i] = Placement(ci, off)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_after_last = self.reserved      # what this inference ran in
        # release chunks unused in this inference (renumbering the placements of the kept ones)
        keep = []
        for c in self.chunks:
            c.idle = 0 if c.records else c.idle + 1
            if c.idle > self.max_idle:
                self.device_frees += 1
            else:
                keep.append(c)
        renum = {id(c): k for k, c in enumerate(keep)}
        old = self.chunks
        self.chunks = keep
        return [Placement(renum[id(old[p.chunk])], p.offset) for p in placed]  # type: ignore[union-attr]


class CachingAllocator:
    """The plain caching allocator: a tensor gets a block when its first operator runs and gives it back
    to the cache after its last; a request is served from a cached free block of its size class (sizes
    rounded up to a power of two, cub's bins with growth 2) or, failing that, from the device. Cached
    blocks are never returned to the device."""

    def __init__(self, min_block: int = 512) -> None:
        self.min_block = int(min_block)
        self.free: dict[int, int] = {}      # size class -> cached free blocks
        self.blocks = 0
        self.reserved = 0
        self.device_allocs = 0
        self.peak_reserved = 0

    def size_class(self, size: int) -> int:
        return max(self.min_block, 1 << max(0, int(size - 1).bit_length()))

    def run(self, usages: Sequence[TensorUsage]) -> None:
        """One inference, operator by operator: allocate at first use, free after last use."""
        if not usages:
            return
        last = max(u.last_op for u in usages)
        for op in range(min(u.first_op for u in usages), last + 1):
            for u in usages:
                if u.first_op == op:
                    b = self.size_class(u.size)
                    if self.free.get(b, 0):
                        self.free[b] -= 1
                    else:
                        self.device_allocs += 1
                        self.reserved += b
            for u in usages:
                if u.last_op == op:
                    b = self.size_class(u.size)
                    self.free[b] = self.free.get(b, 0) + 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)


def live_peak(usages: Sequence[TensorUsage]) -> int:
    """The least memory any allocator needs for one inference: the most bytes alive at one operator."""
    if not usages:
        return 0
    return max(sum(u.size for u in usages if u.first_op <= op <= u.last_op)
               for op in range(min(u.first_op for u in usages), max(u.last_op for u in usages) + 1))


def bert_usages(batch: int, seq_len: int, hidden: int = 768, heads: int = 12, layers: int = 12,
                bytes_per: int = 4) -> list[TensorUsage]:
    """The intermediate tensors of a BERT encoder inference and their lifetimes (operator indices), the
    paper's Fig. 6 example: per layer QKV, scores, probabilities, context, attention output, the FFN's
    intermediate and output; each layer's output is the next layer's input."""
    b, s, h = batch, seq_len, hidden
    act = b * s * h * bytes_per
    out: list[TensorUsage] = []
    op = 0
    for _ in range(layers):
        # ops: 0 qkv gemm, 1 scores, 2 softmax, 3 context, 4 attn-out gemm + layernorm, 5 ffn1, 6 ffn2 + layernorm
        out += [TensorUsage(op + 0, op + 3, 3 * act),                        # QKV
                TensorUsage(op + 1, op + 2, b * heads * s * s * bytes_per),  # scores
                TensorUsage(op + 2, op + 3, b * heads * s * s * bytes_per),  # probabilities
                TensorUsage(op + 3, op + 4, act),                            # context
                TensorUsage(op + 4, op + 6, act),                            # attention output (residual)
                TensorUsage(op + 5, op + 6, 4 * act),                        # FFN intermediate
                TensorUsage(op + 6, op + 7, act)]                            # layer output -> next layer
        op += 7
    return out


def compare_allocators(lengths: Sequence[int], batch: int = 1, max_idle: int = 0,
                       **bert) -> dict[str, dict[str, float]]:
    """Algorithm 1 against the caching allocator over a stream of BERT inferences (one per length):
    peak device memory reserved, device allocations, reuse (the share of tensors served without a
    device allocation), and fragmentation (1 - the inference's live peak / memory reserved while it
    ran, averaged over the stream)."""
    alg, cache = SequenceLengthAwareAllocator(max_idle=max_idle), CachingAllocator()
    frag: dict[str, list[float]] = {"alg1": [], "caching": []}
    tensors = 0
    for n in lengths:
        us = bert_usages(batch, int(n), **bert)
        tensors += len(us)
        need = live_peak(us)
        alg.allocate(us)
        frag["alg1"].append(1.0 - need / max(alg.peak_after_last, 1))
        cache.run(us)
        frag["caching"].append(1.0 - need / max(cache.reserved, 1))
    out = {}
    for name, a in (("alg1", alg), ("caching", cache)):
        out[name] = {"peak_reserved_mib": a.peak_reserved / 2 ** 20, "device_allocs": a.device_allocs,
                     "reuse": 1.0 - a.device_allocs / tensors if tensors else 0.0,
                     "fragmentation_mean": float(sum(frag[name]) / len(frag[name])) if len(frag[name]) else 0.0}
    return out
