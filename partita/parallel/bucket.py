"""Gradient buckets and one collective order, for per-rank (partitioned) graphs.

Two passes over the program every rank runs, as the multi-device graph passes of the
classic data-parallel executors did:

- ``bucket-gradients`` coalesces independent ``all_reduce`` nodes (and ``reduce_scatter``
  nodes of dim 0, ZeRO-2's gradients) that agree on op, axis, group and dtype into buckets
  of at most ``size_mb``: the members' operands are flattened and concatenated, reduced by
  one collective, and cut back apart. Buckets fill in the order the operands become ready
  (gradients come out in reverse layer order), and a bucket's collective is issued right
  after its last member's operand is produced, so communication overlaps the rest of the
  backward pass instead of waiting for the whole of it.
- ``order-collectives`` fixes one order of the collectives that depends only on the program,
  never on the order its nodes happened to be inserted in: every rank that builds the same
  program (or its own stage of it) derives the same sequence, so no group waits in one
  collective while a member waits in another. The order itself is
  partita/parallel/collective_order.py (``order_collectives``, re-exported here with
  ``check_collective_order``, the static check of that property over the per-rank graphs of
  an MPMD program), which the section-level simulator calls too.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Container, Mapping

from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.dtypes import DType
from ..ir.graph import Graph, Node, Value
from ..ir.printer import format_attr, value_names
from ..passes.manager import Pass, register_pass
from .collective_order import (CollectiveOrderError, apply_order, check_collective_order, effect_chain,
                               input_cone, order_collectives)

MB = 1 << 20  # size_mb counts mebibytes, as DDP's bucket_cap_mb does


class BucketError(PartitaError):
    """Gradient bucketing was asked for something it cannot do (a size limit that is not a
    positive number)."""


# --- fusion rules ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _FusionRule:
    """How members of one collective op are fused into one: ``accepts`` says whether a node
    may join a bucket at all, ``member_attrs`` names the attributes that may differ between
    members (they are fixed by ``emit``), and ``emit`` writes the fused collective for the
    members' operands and returns the value replacing each member's result."""

    accepts: Callable[[Node], bool]
    member_attrs: frozenset[str]
    emit: Callable[[Builder, list[Node]], list[Value]]


def _flat_shape(v: Value) -> tuple[int, ...]:
    return (v.type.numel,)


def _reshaped(b: Builder, v: Value, shape: tuple[int, ...]) -> Value:
    return v if v.type.shape == shape else b.emit("reshape", v, shape=shape)


def _fuse_all_reduce(b: Builder, members: list[Node]) -> list[Value]:
    """Flatten each operand, concatenate, reduce once, cut apart, and give each piece its
    member's shape back: an all_reduce is elementwise over ranks, so the layout is free."""
    flat = [_reshaped(b, m.operands[0], _flat_shape(m.operands[0])) for m in members]
    joined = b.emit("concat", *flat, axis=0)
    reduced = b.emit_node("all_reduce", [joined], dict(members[0].attrs), loc=members[0].loc).results[0]
    pieces = b.emit("split", reduced, axis=0, sizes=tuple(m.operands[0].type.numel for m in members))
    return [_reshaped(b, p, m.results[0].type.shape) for p, m in zip(pieces, members)]


def _scatters_dim0(node: Node) -> bool:
    t = node.operands[0].type
    return t.rank >= 1 and node.attrs["dim"] % t.rank == 0


def _fuse_reduce_scatter(b: Builder, members: list[Node]) -> list[Value]:
    """Each operand as ``[g, -1]``: row j is the rows of dim 0 that rank j keeps (a dim-0
    piece is contiguous in row-major order). Concatenated along dim 1, one reduce_scatter
    of dim 0 hands rank j its row of every member; dim 1 is then cut per member and each
    piece takes its member's local result shape."""
    g = members[0].attrs["group_size"]
    rows = [_reshaped(b, m.operands[0], (g, m.operands[0].type.numel // g)) for m in members]
    joined = b.emit("concat", *rows, axis=1)
    attrs = dict(members[0].attrs)
    attrs["dim"] = 0
    scattered = b.emit_node("reduce_scatter", [joined], attrs, loc=members[0].loc).results[0]
    pieces = b.emit("split", scattered, axis=1, sizes=tuple(m.operands[0].type.numel // g for m in members))
    return [_reshaped(b, p, m.results[0].type.shape) for p, m in zip(pieces, members)]


# The collectives bucketing fuses, by op; any other op is left where it is.
FUSION_RULES: dict[str, _FusionRule] = {
    "all_reduce": _FusionRule(lambda node: True, frozenset(), _fuse_all_reduce),
    "reduce_scatter": _FusionRule(_scatters_dim0, frozenset({"dim"}), _fuse_reduce_scatter),
}


# --- the bucket report -----------------------------------------------------------------------

@dataclass(frozen=True)
class Bucket:
    """One fused collective: ``members`` are the printed names (before the pass) of the
    values the member collectives reduced, in bucket order; ``bytes`` their operand bytes."""

    op: str
    axis: str
    dtype: DType
    members: tuple[str, ...]
    bytes: int

    def __str__(self) -> str:
        names = ", ".join(f"%{m}" for m in self.members)
        return f"{self.op} over {self.axis} ({self.dtype.name}, {self.bytes} bytes): {names}"


@dataclass
class BucketReport:
    """What ``bucket_gradients`` did: every bucket (a bucket of one member is the untouched
    collective), and the number of collectives of each fusable op before and after."""

    size_limit: int
    buckets: list[Bucket] = field(default_factory=list)
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)

    @property
    def fused(self) -> list[Bucket]:
        """The buckets of two or more members (those the pass rewrote)."""
        return [b for b in self.buckets if len(b.members) > 1]

    def text(self) -> str:
        """A human-readable summary."""
        counts = ", ".join(f"{op}: {self.before.get(op, 0)} -> {self.after.get(op, 0)}" for op in FUSION_RULES)
        lines = [f"bucket-gradients (limit {self.size_limit} bytes): {counts}"]
        lines += [f"  {b}" for b in self.buckets]
        return "\n".join(lines)


# --- bucket-gradients ----------------------------------------------------------------------------

def _count(graph: Graph) -> dict[str, int]:
    counts = dict.fromkeys(FUSION_RULES, 0)
    for n in graph.nodes:
        if n.op in counts:
            counts[n.op] += 1
    return counts


def _fusion_key(node: Node) -> tuple:
    """Members of one bucket agree on all of this: op, dtype and the group attributes."""
    rule = FUSION_RULES[node.op]
    attrs = tuple(sorted((k, format_attr(v)) for k, v in node.attrs.items() if k not in rule.member_attrs))
    return (node.op, node.operands[0].type.dtype.name, attrs)


def bucket_gradients(graph: Graph, size_mb: float = 25.0, first_mb: float | None = None,
                     only: "Container[Node] | None" = None) -> BucketReport:
    """Coalesce the independent all_reduce (and dim-0 reduce_scatter) nodes of the per-rank
    ``graph`` into buckets of at most ``size_mb`` MiB, in place; returns the BucketReport.

    Members of a bucket agree on op, axis, group size, reduction and dtype; a tensor larger
    than the limit gets a bucket of its own; two collectives where one depends on the other
    (directly, or through another bucket) never share a bucket. Each fused collective sits
    right after its last member's operand is produced; nodes that used a member's result
    move after it when they have to, everything else keeps its place.

    ``first_mb``: the first bucket of each kind holds at most this many MiB (DDP's 1 MiB
    first bucket): its collective then starts early in the backward pass, while the rest of
    the backward runs (with an executor that overlaps, TorchProgram(overlap=True)).

    ``only``: the candidates are these nodes (a pipeline rank's once-per-step sections: its
    gradient reductions), the others keep their collectives.
    """
    if not isinstance(size_mb, (int, float)) or isinstance(size_mb, bool) or not size_mb > 0 \
            or math.isinf(size_mb):
        raise BucketError(f"@{graph.name}: bucket-gradients needs size_mb > 0 (the most MiB one fused "
                          f"collective carries, e.g. 25.0), got {size_mb!r}")
    limit = max(1, int(size_mb * MB))
    if first_mb is not None and (not isinstance(first_mb, (int, float)) or isinstance(first_mb, bool)
                                 or not first_mb > 0 or math.isinf(first_mb)):
        raise BucketError(f"@{graph.name}: bucket-gradients needs first_mb > 0 (the most MiB the first bucket "
                          f"carries, e.g. 1.0), got {first_mb!r}")
    first_limit = min(limit, max(1, int(first_mb * MB))) if first_mb is not None else limit
    opened: dict[tuple, int] = {}  # buckets opened so far per fusion key
    report = BucketReport(limit, before=_count(graph))
    names = value_names(graph)
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}

    def ready(n: Node) -> int:
        p = n.operands[0].producer
        return -1 if p is None else pos[p]

    # Nothing to move for an empty tensor; it keeps its own collective.
    cands = [n for n in nodes if n.op in FUSION_RULES and FUSION_RULES[n.op].accepts(n)
             and n.operands[0].type.numel > 0 and (only is None or n in only)]
    bit = {n: 1 << i for i, n in enumerate(cands)}
    up = _upstream_masks(nodes, bit)

    order = sorted(cands, key=lambda n: (ready(n), pos[n]))
    members: list[list[Node]] = []
    member_mask: list[int] = []
    up_mask: list[int] = []  # every candidate upstream of some member's operand
    sizes: list[int] = []
    bucket_no: list[int] = []  # per bucket: how many of its kind were opened before it
    open_by_key: dict[tuple, int] = {}
    for c in order:
        key = _fusion_key(c)
        size = c.operands[0].type.nbytes
        b = open_by_key.get(key)
        cap = limit
        if b is not None:
            cap = first_limit if bucket_no[b] == 0 else limit
        if b is not None and (sizes[b] + size > cap
                              or _effective_upstream(up[c], member_mask, up_mask) & member_mask[b]):
            b = None
        if b is None:
            bucket_no.append(opened.get(key, 0))
            opened[key] = opened.get(key, 0) + 1
            b = len(members)
            members.append([])
            member_mask.append(0)
            up_mask.append(0)
            sizes.append(0)
            open_by_key[key] = b
        members[b].append(c)
        member_mask[b] |= bit[c]
        up_mask[b] |= up[c]
        sizes[b] += size
        if sizes[b] >= (first_limit if bucket_no[b] == 0 else limit):
            del open_by_key[key]

    for ms, size in zip(members, sizes):
        report.buckets.append(Bucket(ms[0].op, ms[0].attrs["axis"], ms[0].operands[0].type.dtype,
                                     tuple(names[m.operands[0]] for m in ms), size))
    fused = [i for i, ms in enumerate(members) if len(ms) > 1]
    if fused:
        _place_buckets(graph, nodes, pos, [members[i] for i in fused], ready)
        for ms in (members[i] for i in fused):
            builder = Builder(graph).set_insertion_before(ms[0])
            replacements = FUSION_RULES[ms[0].op].emit(builder, ms)
            for m, new in zip(ms, replacements):
                if m.results[0].name is not None:
                    new.name = m.results[0].name
                graph.replace_all_uses(m.results[0], new)
            for m in ms:
                graph.erase(m)
    report.after = _count(graph)
    return report


# --- bucket-gathers --------------------------------------------------------------------------------

def _gathered_param(n: Node) -> list[Node] | None:
    """For an all_gather along dim 0 of a graph input or a view of one (zero3's gathered
    copy of a param, a reshape of it), the view nodes between (``input_cone``); else None."""
    if n.op != "all_gather" or not n.operands or n.operands[0].type.numel == 0:
        return None
    t = n.operands[0].type
    if t.rank < 1 or n.attrs["dim"] % t.rank != 0:
        return None
    return input_cone(n)


def bucket_gathers(graph: Graph, size_mb: float = 4.0) -> BucketReport:
    """Coalesce the param all_gathers of the per-rank ``graph`` (zero3's) into buckets of at
    most ``size_mb`` MiB of gathered result (and at most a sixteenth of all the program's
    gathered bytes), in place; returns the BucketReport.

    Members are taken in the order the program first reads them, consecutive ones sharing a
    bucket while they agree on axis, group size and dtype: a bucket is the params one stretch
    of the program uses, gathered by one collective as FSDP gathers a unit's flat buffer. The
    members' pieces are flattened and concatenated as ``[1, K]``; one all_gather of dim 0
    gives ``[g, K]``, whose row j is rank j's pieces; its columns are cut per member and each
    ``[g, k]`` piece reshaped to the member's gathered shape (rank-major along dim 0, as the
    member's own all_gather gives it). The bucket sits right before the first read of any
    member; order-collectives then issues it just in time or prefetched.
    """
    if not isinstance(size_mb, (int, float)) or isinstance(size_mb, bool) or not size_mb > 0 \
            or math.isinf(size_mb):
        raise BucketError(f"@{graph.name}: bucket-gathers needs size_mb > 0 (the most MiB one fused all_gather "
                          f"gathers, e.g. 4.0), got {size_mb!r}")
    limit = max(1, int(size_mb * MB))
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    names = value_names(graph)
    report = BucketReport(limit, before={"all_gather": sum(n.op == "all_gather" for n in nodes)})

    def first_read(n: Node) -> int:
        users = [pos[u] for u in n.results[0].users]
        return min(users) if users else len(nodes)

    cones: dict[Node, list[Node]] = {}
    for n in nodes:
        cone = _gathered_param(n)
        if cone is not None and n.results[0].users:
            cones[n] = cone
    cands = sorted(cones, key=lambda n: (first_read(n), pos[n]))
    # A bucket never holds more than a sixteenth of all the gathered bytes (about an eighth
    # of the params, gathered twice a step): on a small model a whole-model bucket would
    # undo what zero3 saves.
    limit = min(limit, max(1, sum(n.results[0].type.nbytes for n in cands) // 16))
    report.size_limit = limit
    buckets: list[list[Node]] = []
    key_of: tuple | None = None
    size = 0
    for c in cands:
        key = (c.attrs["axis"], c.attrs["group_size"], c.operands[0].type.dtype.name)
        nbytes = c.results[0].type.nbytes
        if buckets and key == key_of and size + nbytes <= limit:
            buckets[-1].append(c)
            size += nbytes
        else:
            buckets.append([c])
            key_of, size = key, nbytes
    for ms in buckets:
        report.buckets.append(Bucket("all_gather", ms[0].attrs["axis"], ms[0].operands[0].type.dtype,
                                     tuple(names[m.results[0]] for m in ms), sum(m.results[0].type.nbytes for m in ms)))
        if len(ms) < 2:
            continue
        first = min((u for m in ms for u in m.results[0].users), key=lambda u: pos[u])
        # The members' operands view graph inputs only: their nodes may move up to the bucket.
        for m in ms:
            for v in sorted(cones[m], key=pos.__getitem__):
                if pos[v] > pos[first]:
                    graph.move_before(first, v)
        b = Builder(graph).set_insertion_before(first)
        g = ms[0].attrs["group_size"]
        flat = [_reshaped(b, m.operands[0], (1, m.operands[0].type.numel)) for m in ms]
        joined = b.emit("concat", *flat, axis=1)
        attrs = dict(ms[0].attrs)
        attrs["dim"] = 0
        gathered = b.emit_node("all_gather", [joined], attrs, loc=ms[0].loc).results[0]
        pieces = b.emit("split", gathered, axis=1, sizes=tuple(m.operands[0].type.numel for m in ms))
        for m, piece in zip(ms, pieces):
            assert piece.type.shape == (g, m.operands[0].type.numel)
            new = _reshaped(b, piece, m.results[0].type.shape)
            if m.results[0].name is not None:
                new.name = m.results[0].name
            graph.replace_all_uses(m.results[0], new)
            graph.erase(m)
    report.after = {"all_gather": sum(n.op == "all_gather" for n in graph.nodes)}
    return report


def _upstream_masks(nodes: list[Node], bit: Mapping[Node, int]) -> dict[Node, int]:
    """Per node, the bit set of the candidate collectives whose results reach its operands,
    or reach an effectful node that comes before it (a send before a recv: fusing collectives
    on both sides of a point-to-point exchange would wait for itself)."""
    up: dict[Node, int] = {}
    out: dict[Node, int] = {}
    chain = effect_chain(nodes)
    for n in nodes:
        m = 0
        for v in n.operands:
            p = v.producer
            if p is not None:
                m |= out[p]
        if n in chain:
            m |= out[chain[n]]
        up[n] = m
        out[n] = m | bit.get(n, 0)
    return up


def _effective_upstream(mask: int, member_mask: list[int], up_mask: list[int]) -> int:
    """``mask`` closed over buckets: a fused collective waits for all its members' operands,
    so reaching one member of a bucket means reaching everything upstream of the others."""
    seen: set[int] = set()
    changed = True
    while changed:
        changed = False
        for b, mm in enumerate(member_mask):
            if b not in seen and mask & mm:
                seen.add(b)
                grown = mask | mm | up_mask[b]
                changed = changed or grown != mask
                mask = grown
    return mask


def _place_buckets(graph: Graph, nodes: list[Node], pos: dict[Node, int], buckets: list[list[Node]],
                   ready: Callable[[Node], int]) -> None:
    """Reorder ``graph`` so that each bucket's members sit together right after the last of
    their operands' producers, and every node that needs a member's result comes after them.

    A stable list schedule: nodes keep their positions as priorities, a bucket takes the
    slot just after its last operand, and a node whose operands are late waits for them.
    """
    item_of: dict[Node, int] = {n: i for i, n in enumerate(nodes)}
    base = len(nodes)
    for k, ms in enumerate(buckets):
        for m in ms:
            item_of[m] = base + k
    prio: list[tuple[int, int, int]] = [(i, 0, 0) for i in range(len(nodes))]
    prio += [(max(ready(m) for m in ms), 1, k) for k, ms in enumerate(buckets)]
    chain = effect_chain(nodes)
    preds: list[set[int]] = [set() for _ in prio]
    for n in nodes:
        me = item_of[n]
        deps = [v.producer for v in n.operands if v.producer is not None]
        if n in chain:
            deps.append(chain[n])
        for dep in deps:
            if item_of[dep] != me:
                preds[me].add(item_of[dep])
    succs: list[list[int]] = [[] for _ in prio]
    for item, ps in enumerate(preds):
        for q in sorted(ps):
            succs[q].append(item)
    indeg = [len(ps) for ps in preds]
    live = set(item_of.values())
    heap = [(prio[i], i) for i in live if indeg[i] == 0]
    heapq.heapify(heap)
    schedule: list[Node] = []
    while heap:
        _, i = heapq.heappop(heap)
        schedule.extend(buckets[i - base] if i >= base else [nodes[i]])
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (prio[s], s))
    # The bucketing refuses every member that would close a cycle, so this cannot happen.
    assert len(schedule) == len(nodes), "bucket-gradients: the buckets formed a dependency cycle"
    apply_order(graph, schedule)


# --- passes -------------------------------------------------------------------------------------

@dataclass
class BucketSizeOptions:
    """The options of the bucketing passes: the most MiB one fused collective holds."""

    size_mb: float = 25.0

    def __post_init__(self) -> None:
        if not self.size_mb > 0 or math.isinf(self.size_mb):
            raise ValueError(f"size-mb must be a positive number of MiB, got {self.size_mb}")


class BucketingPass(Pass):
    """A pass that fuses collectives into buckets with ``fuse(graph, size_mb)``; the report
    of the last run is ``self.report``."""

    Options = BucketSizeOptions
    fuse: Callable[[Graph, float], BucketReport]

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.report: BucketReport | None = None

    def run(self, graph: Graph) -> Graph:
        self.report = type(self).fuse(graph, self.options.size_mb)
        return graph


@register_pass
class BucketGradientsPass(BucketingPass):
    """``bucket-gradients{size-mb=25.0}``: coalesce independent all_reduce / dim-0
    reduce_scatter nodes into fused buckets (see ``bucket_gradients``)."""

    name = "bucket-gradients"
    fuse = staticmethod(bucket_gradients)


@register_pass
class BucketGathersPass(BucketingPass):
    """``bucket-gathers{size-mb=4.0}``: fuse zero3's param all_gathers into buckets of at most
    ``size-mb`` MiB of gathered params, in the order the program reads them (see
    ``bucket_gathers``)."""

    name = "bucket-gathers"
    fuse = staticmethod(bucket_gathers)

    @dataclass
    class Options(BucketSizeOptions):
        size_mb: float = 4.0


@register_pass
class OrderCollectivesPass(Pass):
    """``order-collectives{prefetch=1}``: one program-determined order of the collectives
    (see ``order_collectives``; ``prefetch``: param all_gathers issued that many gathers
    ahead, 0 just in time). The order of the last run is ``self.order``."""

    name = "order-collectives"

    @dataclass
    class Options:
        prefetch: int = 1

        def __post_init__(self) -> None:
            if self.prefetch < 0:
                raise ValueError(f"prefetch must be 0 (just in time) or more gathers ahead, got {self.prefetch}")

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.order: list[Node] = []

    def run(self, graph: Graph) -> Graph:
        self.order = order_collectives(graph, self.options.prefetch)
        return graph


__all__ = ["Bucket", "BucketError", "BucketGradientsPass", "BucketReport", "CollectiveOrderError",
           "BucketGathersPass", "BucketSizeOptions", "BucketingPass", "FUSION_RULES", "MB", "OrderCollectivesPass", "bucket_gathers", "bucket_gradients",
           "check_collective_order", "order_collectives"]
