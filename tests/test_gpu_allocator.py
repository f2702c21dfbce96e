"""TurboTransformers' Algorithm 1 (sequence-length-aware allocator) under random request streams, and
against the plain caching allocator. Pure bookkeeping: no torch needed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.allocator import (
    CachingAllocator,
    SequenceLengthAwareAllocator,
    TensorUsage,
    bert_usages,
    compare_allocators,
    live_peak,
)

USAGE = st.builds(lambda a, d, s: TensorUsage(a, a + d, s), st.integers(0, 20), st.integers(0, 8),
                  st.integers(1, 3000))


def check_plan(usages, plan, alloc) -> None:
    assert len(plan) == len(usages)
    for i, (u, p) in enumerate(zip(usages, plan)):
        assert 0 <= p.chunk < len(alloc.chunks)
        assert 0 <= p.offset and p.offset + u.size <= alloc.chunks[p.chunk].size
        for j in range(i):
            v, q = usages[j], plan[j]
            if q.chunk == p.chunk and u.overlaps(v):   # alive together in one chunk: disjoint bytes
                assert p.offset + u.size <= q.offset or q.offset + v.size <= p.offset, (u, p, v, q)


@settings(max_examples=60, deadline=None)
@given(stream=st.lists(st.lists(USAGE, min_size=1, max_size=25), min_size=1, max_size=6),
       chunk=st.integers(64, 8192), idle=st.integers(0, 2))
def test_algorithm1_never_overlaps_live_tensors_over_a_request_stream(stream, chunk, idle):
    alloc = SequenceLengthAwareAllocator(default_chunk_size=chunk, max_idle=idle)
    for usages in stream:
        plan = alloc.allocate(usages)
        check_plan(usages, plan, alloc)
        assert alloc.reserved >= live_peak(usages)
    assert alloc.device_allocs - alloc.device_frees == len(alloc.chunks)


def test_tensors_with_disjoint_lifetimes_share_memory_and_chunks_are_reused():
    alloc = SequenceLengthAwareAllocator(default_chunk_size=1000)
    chain = [TensorUsage(k, k + 1, 400) for k in range(10)]     # each alive with its neighbours only
    plan = alloc.allocate(chain)
    assert alloc.reserved == 1000 and len({p.offset for p in plan}) == 2   # two offsets, ping-pong
    # the paper's Fig. 6: the same length again needs no device memory; a longer one adds a chunk
    a = SequenceLengthAwareAllocator()
    a.allocate(bert_usages(1, 200, layers=2))
    n = a.device_allocs
    a.allocate(bert_usages(1, 200, layers=2))
    assert a.device_allocs == n
    a.allocate(bert_usages(1, 240, layers=2))
    assert a.device_allocs > n


def test_unused_chunks_are_released_at_once_or_after_the_idle_limit():
    two, small = [TensorUsage(0, 1, 5000), TensorUsage(1, 2, 5000)], [TensorUsage(0, 1, 10)]
    for idle, kept in ((0, [1, 1, 1, 1]), (2, [2, 2, 1, 1])):
        a = SequenceLengthAwareAllocator(default_chunk_size=100, max_idle=idle)
        a.allocate(two)                  # alive together, 6000-byte chunks (K_SCALE 1.2): one each
        assert len(a.chunks) == 2
        counts = []
        for _ in range(4):
            a.allocate(small)            # uses the first chunk only
            counts.append(len(a.chunks))
        assert counts == kept
    with pytest.raises(FluidError):
        a.allocate([TensorUsage(3, 1, 10)])


def test_caching_allocator_rounds_to_size_classes_and_reuses_freed_blocks():
    c = CachingAllocator(min_block=16)
    c.run([TensorUsage(0, 0, 100), TensorUsage(1, 1, 120)])   # same 128-byte class, disjoint lifetimes
    assert (c.device_allocs, c.reserved) == (1, 128)
    c.run([TensorUsage(0, 1, 100), TensorUsage(1, 1, 120)])   # alive together: a second block
    assert (c.device_allocs, c.reserved) == (2, 256)


def test_algorithm1_reserves_less_than_a_caching_allocator_on_variable_lengths():
    lengths = np.random.default_rng(0).integers(5, 501, 60)
    r = compare_allocators(lengths, batch=1, layers=4)
    assert r["alg1"]["peak_reserved_mib"] < 0.8 * r["caching"]["peak_reserved_mib"]
    assert r["alg1"]["fragmentation_mean"] < r["caching"]["fragmentation_mean"]
