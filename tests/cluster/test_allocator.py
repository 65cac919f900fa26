"""The caching allocator model (partita/cluster/allocator.py) on hand-made sequences, and on a
small simulated step against the live bytes the memory report prices."""

from __future__ import annotations

import partita
from partita.cluster import simulate
from partita.cluster.allocator import (CachingAllocator, allocation_events, reserved_peak, round_size,
                                       run_allocator, segment_size)
from partita.cluster.memory_report import memory_report

MiB = 1 << 20


def test_sizes_round_as_torch_rounds_them():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(512) == 2 * MiB and segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB and segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(11 * MiB + 1) == 12 * MiB


def test_a_freed_block_is_reused():
    st = run_allocator([(1, 30 * MiB, 0), (1, -1, 0), (2, 30 * MiB, 0), (2, -1, 0), (3, 25 * MiB, 0)])
    assert st.segments == 1 and st.reserved_peak == 30 * MiB and st.allocated_peak == 30 * MiB


def test_fragmentation_holds_more_than_is_live():
    # A 30 MiB hole between two held blocks cannot serve 40 MiB: a new segment.
    st = run_allocator([(1, 30 * MiB, 0), (2, 30 * MiB, 0), (1, -1, 0), (3, 40 * MiB, 0)])
    assert st.reserved_peak == 100 * MiB and st.allocated_peak == 70 * MiB and st.segments == 3


def test_small_requests_share_a_two_mib_segment():
    st = run_allocator([(k, 1000, 0) for k in range(1, 100)])
    assert st.segments == 1 and st.reserved_peak == 2 * MiB and st.allocated_peak == 99 * 1024


def test_mid_sized_requests_share_a_twenty_mib_segment_and_merge_back():
    a = CachingAllocator()
    b1, b2 = a.malloc(3 * MiB), a.malloc(3 * MiB)
    assert a.stats.segments == 1 and a.stats.reserved == 20 * MiB
    a.free(b1)
    a.free(b2)
    assert len(a.pools[0, False]) == 1 and a.pools[0, False][0][0] == 20 * MiB      # merged into the whole segment
    a.malloc(18 * MiB)
    assert a.stats.segments == 1


def test_a_large_block_is_not_split_for_a_remainder_of_one_mib_or_less():
    a = CachingAllocator()
    a.free(a.malloc(12 * MiB))
    b = a.malloc(11 * MiB + 256 * 1024)       # remainder 768 KiB: the whole 12 MiB block
    assert b.size == 12 * MiB and not a.pools[0, False] and a.allocated == 12 * MiB
    a.free(b)
    c = a.malloc(10 * MiB)                    # remainder 2 MiB: split
    assert c.size == 10 * MiB and a.pools[0, False][0][0] == 2 * MiB
    a.malloc(512 * 1024)                      # a small request never takes a large pool's block
    assert a.stats.segments == 2 and a.stats.reserved == 14 * MiB


def test_cached_segments_are_released_when_a_new_one_would_not_fit():
    st = run_allocator([(1, 30 * MiB, 0), (1, -1, 0), (2, 40 * MiB, 0)], capacity=50 * MiB)
    assert st.releases == 1 and st.failures == 0 and st.reserved == 40 * MiB and st.reserved_peak == 40 * MiB
    st = run_allocator([(1, 30 * MiB, 0), (1, -1, 0), (2, 40 * MiB, 0)])
    assert st.releases == 0 and st.reserved == 70 * MiB
    st = run_allocator([(1, 30 * MiB, 0), (2, 40 * MiB, 0)], capacity=50 * MiB)
    assert st.releases == 1 and st.failures == 1


def test_a_split_segment_is_not_released():
    st = run_allocator([(1, 3 * MiB, 0), (2, 3 * MiB, 0), (1, -1, 0), (3, 40 * MiB, 0)], capacity=50 * MiB)
    assert st.releases == 1 and st.failures == 1 and st.reserved == 60 * MiB


def test_a_block_is_reused_on_its_own_stream_only():
    st = run_allocator([(1, 30 * MiB, 1), (1, -1, 1), (2, 30 * MiB, 0), (3, 30 * MiB, 1)])
    assert st.segments == 2 and st.reserved_peak == 60 * MiB


def test_reserved_holds_the_live_peak_of_a_simulated_step():
    fwd = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)
    prog = partita.parallelize(step, mesh="dp=4", strategy="zero3")
    res = simulate(prog, "selene", trace=False, memory=True)
    for r in res.ranks:
        assert r.memory is not None and r.memory.reserved is not None
        assert r.memory.reserved >= r.memory.peak
    g = prog.rank_graphs()[0] if hasattr(prog, "rank_graphs") else prog.local
    rep = memory_report(g)
    st = reserved_peak(g)
    assert rep.reserved is None
    # The model's live bytes, unrounded, peak where the memory report's do.
    live, peak = 0, 0
    sizes: dict[int, int] = {}
    for k, s, _ in allocation_events(g):
        if s < 0:
            live -= sizes.pop(k)
        else:
            sizes[k] = s
            live += s
            peak = max(peak, live)
    assert peak == rep.peak
    assert st.allocated_peak >= rep.peak and st.reserved_peak >= st.allocated_peak
    assert reserved_peak(g, streams=True).reserved_peak >= st.allocated_peak
