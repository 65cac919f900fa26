"""A model of PyTorch's CUDA caching allocator, run over one rank's allocations in program order:
what ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]`` would say, beside the live peak
``memory_report`` prices.

What is modelled follows c10/cuda/CUDACachingAllocator.cpp (its constants and its
``round_size``, ``get_pool``, ``get_allocation_size``, ``get_free_block``, ``should_split``,
``try_merge_blocks``, ``release_cached_blocks``), with the default configuration
(no ``max_split_size_mb``, no ``expandable_segments``, one stream):

- a request is rounded up to a multiple of 512 B (``kMinBlockSize``);
- a rounded request of at most 1 MiB (``kSmallSize``) is served from the small pool, whose
  segments are 2 MiB (``kSmallBuffer``); a larger one from the large pool, whose new segments are
  20 MiB (``kLargeBuffer``) for requests under 10 MiB (``kMinLargeAlloc``) and the request
  rounded up to 2 MiB (``kRoundLarge``) otherwise;
- a request takes the smallest cached free block of its pool that holds it (best fit; ties by
  address), split when the remainder is at least 512 B (small pool) or over 1 MiB (large pool);
- a freed block goes back to its pool, merged with its free neighbours in the same segment;
- a segment is never given back to the device, except when a new one would not fit in the
  device's memory: then every cached segment that is wholly free is released and the
  allocation tried again (``release_cached_blocks``). If it still does not fit, torch raises an
  out-of-memory error; the model counts the failure and allocates anyway.

**Reserved** is the bytes of the segments held; its peak is what TorchTitan publishes as its
memory. Not modelled: several streams (a block freed by one stream is reusable only by it),
``record_stream``, the CUDA context, NCCL's own buffers.

``allocation_events(graph, eager)`` gives the sequence the memory report walks (the step's
inputs and constants first, then each node's results, a send's copy and an eager chain's
intermediates, then the buffers last read at that node freed); ``reserved_peak`` runs the model
over it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..ir.graph import Graph, Node, Value
from ..ops.kinds import VIEW_OPS as VIEWS
from ..ops.registry import OPS
from .eager import transient_bytes

MIN_BLOCK = 512                 # kMinBlockSize: every size is rounded up to a multiple of it
SMALL_SIZE = 1 << 20            # kSmallSize: the largest request served from the small pool
SMALL_BUFFER = 2 << 20          # kSmallBuffer: the small pool's segment size
LARGE_BUFFER = 20 << 20         # kLargeBuffer: the large pool's segment for requests under ...
MIN_LARGE_ALLOC = 10 << 20      # kMinLargeAlloc: ... 10 MiB
ROUND_LARGE = 2 << 20           # kRoundLarge: larger requests' segments are rounded up to 2 MiB
# The stream each kind of collective allocates its result on with ``streams`` (0: compute).
STREAMS = {"all_gather": 1, "reduce_scatter": 2, "all_reduce": 2}


def round_size(size: int) -> int:
    """A request's size as the allocator serves it (``round_size``)."""
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The size of the segment a rounded request that finds no cached block allocates
    (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class Block:
    """A piece of a segment: its place, its size, whether it is allocated, its neighbours."""

    __slots__ = ("segment", "offset", "size", "used", "prev", "next", "pool")

    def __init__(self, segment: int, offset: int, size: int, pool: tuple[int, bool]) -> None:
        self.segment, self.offset, self.size, self.used = segment, offset, size, False
        self.pool = pool                  # (stream, small): the pool it belongs to
        self.prev: Block | None = None
        self.next: Block | None = None

    def key(self) -> tuple[int, int, int]:
        """Its place in a pool: by size, then by address (segment, offset)."""
        return (self.size, self.segment, self.offset)


@dataclass
class AllocatorStats:
    """What a run of the model gives, in bytes (rounded, as torch's stats count)."""

    reserved_peak: int = 0          # reserved_bytes.all.peak
    reserved: int = 0               # reserved_bytes.all.current at the end
    allocated_peak: int = 0         # allocated_bytes.all.peak
    segments: int = 0               # segments allocated (cudaMalloc calls)
    releases: int = 0               # times cached segments were released to retry an allocation
    failures: int = 0               # allocations that did not fit even after the release


class CachingAllocator:
    """PyTorch's caching allocator on one device and one stream (see the module docstring)."""

    def __init__(self, capacity: float = float("inf")) -> None:
        self.capacity = capacity
        self.pools: dict[tuple[int, bool], list[tuple[int, int, int, Block]]] = {}
        self.stats = AllocatorStats()
        self.allocated = 0

    def pool(self, key: tuple[int, bool]) -> list[tuple[int, int, int, Block]]:
        """The free blocks of pool ``(stream, small)`` (``get_pool``; a block is reused on the
        stream that allocated it only)."""
        got = self.pools.get(key)
        if got is None:
            got = self.pools[key] = []
        return got

    def cache(self, b: Block) -> None:
        """Put free block ``b`` in its pool."""
        insort(self.pool(b.pool), (*b.key(), b))

    def uncache(self, b: Block) -> None:
        """Take free block ``b`` out of its pool."""
        pool = self.pool(b.pool)
        del pool[self.index(pool, b)]

    @staticmethod
    def index(pool: list[tuple[int, int, int, Block]], b: Block) -> int:
        """Where ``b`` is in ``pool`` (sorted by its key)."""
        k = b.key()
        i = bisect_left(pool, k)
        while pool[i][3] is not b:
            i += 1
        return i

    def malloc(self, size: int, stream: int = 0) -> Block:
        """Allocate ``size`` bytes on ``stream``; the block that holds them."""
        size = round_size(size)
        key = (stream, size <= SMALL_SIZE)
        pool = self.pool(key)
        i = bisect_left(pool, (size,))
        if i < len(pool):
            b = pool.pop(i)[3]
        else:
            b = self.new_segment(size, key)
        remaining = b.size - size
        if remaining >= MIN_BLOCK if size <= SMALL_SIZE else remaining > SMALL_SIZE:
            rest = Block(b.segment, b.offset + size, remaining, key)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next, b.size = rest, size
            self.cache(rest)
        b.used = True
        self.allocated += b.size
        if self.allocated > self.stats.allocated_peak:
            self.stats.allocated_peak = self.allocated
        return b

    def new_segment(self, size: int, key: tuple[int, bool]) -> Block:
        """A new segment for a rounded request no cached block holds, released cached segments
        first if it would not fit (``alloc_block``, then ``release_cached_blocks``)."""
        st = self.stats
        seg = segment_size(size)
        if st.reserved + seg > self.capacity:
            st.releases += 1
            self.release_cached()
            if st.reserved + seg > self.capacity:
                st.failures += 1
        st.segments += 1
        st.reserved += seg
        if st.reserved > st.reserved_peak:
            st.reserved_peak = st.reserved
        return Block(st.segments, 0, seg, key)

    def release_cached(self) -> None:
        """Give back every cached segment that is wholly free (``release_cached_blocks``)."""
        for pool in self.pools.values():
            keep = []
            for entry in pool:
                b = entry[3]
                if b.prev is None and b.next is None:
                    self.stats.reserved -= b.size
                else:
                    keep.append(entry)
            pool[:] = keep

    def free(self, b: Block) -> None:
        """Free block ``b``: back to its pool, merged with its free neighbours
        (``free_block``, ``try_merge_blocks``)."""
        b.used = False
        self.allocated -= b.size
        p, n = b.prev, b.next
        if p is not None and not p.used:
            self.uncache(p)
            p.size += b.size
            p.next = n
            if n is not None:
                n.prev = p
            b = p
        if n is not None and not n.used:
            self.uncache(n)
            b.size += n.size
            b.next = n.next
            if n.next is not None:
                n.next.prev = b
        self.cache(b)


def run_allocator(events: Iterable[tuple[int, int, int]], capacity: float = float("inf")) -> AllocatorStats:
    """Run the model over ``events``: ``(key, size, stream)`` allocates ``size`` bytes as ``key``
    on ``stream``, ``(key, -1, stream)`` frees what ``key`` holds. An empty tensor allocates
    nothing, as in torch."""
    a = CachingAllocator(capacity)
    held: dict[int, Block] = {}
    for key, size, stream in events:
        if size < 0:
            b = held.pop(key, None)
            if b is not None:
                a.free(b)
        elif size:
            held[key] = a.malloc(size, stream)
    return a.stats


def last_reads(graph: Graph, nodes: list[Node]) -> dict[Value, int]:
    """The index in ``nodes`` (the graph's nodes in order) of the last node that reads each
    buffer, a view counting as a read of the buffer it views; ``len(nodes)`` for a buffer the
    graph returns (held past the step)."""
    root: dict[Value, Value] = {}
    last: dict[Value, int] = {}
    for i, n in enumerate(nodes):
        for v in n.operands:
            last[root.get(v, v)] = i
        if n.op in VIEWS and n.operands:
            src = root.get(n.operands[0], n.operands[0])
            for r in n.results:
                root[r] = src
    for v in graph.outputs:
        last[root.get(v, v)] = len(nodes)
    return last


def allocation_events(graph: Graph, eager: frozenset[str] = frozenset(),
                      streams: bool = False) -> Iterator[tuple[int, int, int]]:
    """The allocations and frees of one run of ``graph`` on one rank, in the order
    ``memory_report.live_bytes`` walks them: ``(key, bytes, stream)`` or ``(key, -1, stream)``.
    ``streams``: a collective's result is allocated on that collective's own stream (FSDP2
    runs its all-gathers and reduce-scatters each on a stream of its own), else all on one."""
    nodes = list(graph.nodes)
    outputs = set(graph.outputs)
    aliased = {v for v, a in zip(graph.outputs, graph.output_aliases or []) if a is not None}
    last = last_reads(graph, nodes)
    key = 0
    for v in graph.inputs:        # params, optimizer state and batch: held through the step
        key += 1
        yield key, v.type.nbytes, 0
    frees: dict[int, list[tuple[int, int]]] = {}
    for i, n in enumerate(nodes):
        if n.op in VIEWS:
            continue
        if not n.operands and len(n.results) == 1 and not OPS[n.op].effects_of(n.attrs) and n.results[0] not in outputs:
            key += 1
            yield key, n.results[0].type.nbytes, 0     # a constant: computed once, held
            continue
        stream = STREAMS.get(n.op, 0) if streams else 0
        here = []
        for r in n.results:
            if r in aliased:
                continue
            key += 1
            yield key, r.type.nbytes, stream
            frees.setdefault(max(last.get(r, i), i), []).append((key, stream))
        if n.op == "send":
            key += 1
            yield key, n.operands[0].type.nbytes, 0
            here.append((key, 0))
        if n.op in eager and (t := transient_bytes(n)):
            key += 1
            yield key, t, 0
            here.append((key, 0))
        for k, st in here:
            yield k, -1, st
        for k, st in frees.pop(i, ()):
            yield k, -1, st


def reserved_peak(graph: Graph, eager: frozenset[str] = frozenset(), capacity: float = float("inf"),
                  streams: bool = False) -> AllocatorStats:
    """The caching allocator model run over one rank's step (see the module docstring);
    ``capacity``: the device's memory, where cached segments are released to retry;
    ``streams``: collectives allocate on streams of their own (``allocation_events``)."""
    return run_allocator(allocation_events(graph, eager, streams), capacity)
