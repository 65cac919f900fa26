"""``zero1``, ``zero2``, ``zero3`` (each includes ``dp``): the optimizer state of each param is
split over the data-parallel axis on its first dim that divides; each rank updates its slice
of the param and the new params are all-gathered. ``zero1`` annotates the gradients whole
(all_reduce, then each rank slices its part), ``zero2`` annotates them split (reduce_scatter:
each rank receives only its part's sum). ``zero3`` also keeps each param split between steps:
the forward reads a gathered copy and the backward gathers again (two all_gathers per param
per step, as FSDP does), each right before its first reader, so a gathered param is alive
only while it is used.

``zero3`` on a mesh with both a ``dp`` and an ``fsdp`` axis is hybrid sharding (HSDP, FSDP2's
``HYBRID_SHARD``; the word ``hsdp`` asks for it and refuses a mesh without both axes): the
batch is split over ``dp`` x ``fsdp``, the params, gradients and optimizer state over ``fsdp``
only and replicated over ``dp``; each gradient is reduce-scattered over ``fsdp`` and its
shard all-reduced over ``dp``, each param all-gathered over ``fsdp`` only."""

from __future__ import annotations

import math

from ...ir.graph import Node, Value
from ...ir.placement import Placement
from .base import UPDATE_OPS, AnnotationContext, StrategyError, register

SHARD_AXIS = "fsdp"  # the mesh axis zero3 shards over inside a group when the mesh has it beside 'dp' 
from .dp import DataParallel


class Zero(DataParallel):
    """ZeRO stage ``stage`` on top of data parallelism."""

    stage = 0
    aliases: tuple[str, ...] = ()

    def annotate(self, ctx: AnnotationContext) -> None:
        super().annotate(ctx)
        self.shard(ctx, ctx.axis(self))

    def shard(self, ctx: AnnotationContext, axis: str) -> None:
        from ...autodiff.recompute import backward_start

        g, mesh = ctx.graph, ctx.mesh
        n = mesh.axis_size(axis)
        updates = [node for node in g.nodes if node.op in UPDATE_OPS]
        if not updates:
            raise StrategyError(f"strategy {self.name} shards the optimizer state, but @{g.name} has no "
                                "optimizer update; build the graph with partita.training_step(..., optimizer='adamw')")
        # Found once: the copies gather_point inserts read only their own param, so they do not
        # change which readers of another param come before the backward section.
        stop = backward_start(g) if self.stage == 3 else None
        # With master weights (adamw's master_weights) the update reads the f32 master
        # <p>.master, not the param: the master is sharded as the moments, and the param
        # and its new version (cast(master')) are placed as a param would be.
        by_name = {str(v.name): v for v in g.inputs}
        new_version = {a: v for v, a in zip(g.outputs, g.output_aliases) if a is not None}
        for node in updates:
            w, grad = node.operands[0], node.operands[1]
            p = w
            if w.role == "state" and str(w.name).endswith(".master"):
                p = by_name.get(str(w.name)[:-len(".master")], w)
            tp = ctx.fixed.get(p) or Placement.replicated(p.type.rank)
            dims = [d for d in range(p.type.rank) if not tp.dims[d] and p.type.shape[d] %
                    (n * math.prod(mesh.axis_size(a) for a in tp.dims[d])) == 0]
            if not dims:
                ctx.notes.append(f"%{ctx.name(p)} {p.type} is not sharded over '{axis}': no dim divides by {n}")
                continue
            d = dims[0]
            sharded = Placement(tuple(tp.dims[i] + ((axis,) if i == d else ()) for i in range(p.type.rank)))
            for s in node.operands[2:] if p is w else [w, *node.operands[2:]]:
                if s.type.shape == p.type.shape:
                    ctx.place(s, sharded)
            if self.stage < 3:
                # Pinned: left free, the param would take the split of its sharded state.
                ctx.place(p, tp)
            if grad.producer is not None:
                ctx.late[grad] = tp if self.stage == 1 else sharded
            new_p = node.results[0] if p is w else new_version.get(p, node.results[0])
            if p is not w:
                ctx.late[node.results[0]] = sharded
            if self.stage == 3:
                ctx.place(p, sharded)
                ctx.late[new_p] = sharded
                gather_point(ctx, p, node, tp, stop)
            else:
                ctx.late[new_p] = tp


@register
class Zero1(Zero):
    name = "zero1"
    stage = 1


@register
class Zero2(Zero):
    name = "zero2"
    stage = 2


@register
class Zero3(Zero):
    name = "zero3"
    aliases: tuple[str, ...] = ("fsdp", "hsdp")
    stage = 3
    word_axes = {"hsdp": ("dp", SHARD_AXIS)}
    axes_why = "'dp' replicates across groups, 'fsdp' shards inside a group"

    def annotate(self, ctx: AnnotationContext) -> None:
        outer = ctx.axis(self)
        inner = hybrid_shard_axis(ctx, outer)
        if inner is None:
            super().annotate(ctx)
            return
        split_batch(ctx, self.name, (outer, inner))
        self.shard(ctx, inner)


def hybrid_shard_axis(ctx: AnnotationContext, outer: str) -> str | None:
    """The axis zero3 shards over inside a group (HSDP): ``fsdp`` when the mesh has it beside
    zero3's own axis and no other strategy of the combination works on it; else None."""
    if outer == SHARD_AXIS or SHARD_AXIS not in ctx.mesh.names:
        return None
    if SHARD_AXIS in ctx.strategy.axes:
        return None
    return SHARD_AXIS


def split_batch(ctx: AnnotationContext, who: str, axes: tuple[str, ...]) -> None:
    """Split every ``input``-role graph input on dim 0 over ``axes`` (major to minor)."""
    g, mesh = ctx.graph, ctx.mesh
    batch = [v for v in g.inputs if v.role == "input"]
    if not batch:
        raise StrategyError(f"strategy {who}: @{g.name} has no 'input'-role graph input to split over the batch; "
                            "data parallelism needs the batch as an input")
    sizes = [mesh.axis_size(a) for a in axes]
    n = math.prod(sizes)
    for v in batch:
        if v.type.rank == 0:
            continue
        rows = v.type.shape[0]
        if rows % n:
            named = " x ".join(f"'{a}'" for a in axes)
            raise StrategyError(
                f"strategy {who}: %{ctx.name(v)} has {rows} rows in dim 0 ({v.type}), which the mesh axes {named} "
                f"({' x '.join(map(str, sizes))} = {n} ranks) do not divide; use a batch that is a multiple of {n}, "
                f"or smaller '{axes[-1]}' or '{axes[0]}' axes")
        ctx.place(v, Placement.split(v.type.rank, {0: axes}))


def gather_point(ctx: AnnotationContext, p: Value, update: Node, whole: Placement, stop: Node | None) -> None:
    """Every reader of a zero3-sharded param but its update reads a gathered copy: a
    same-shape reshape whose result is annotated whole over the data axis, which the
    partition turns into one all_gather right before the first reader. The forward's
    readers and the backward's get one copy each, as FSDP gathers twice: the forward's
    copy dies after its last forward reader instead of living until the backward.
    ``stop``: the first node of the backward section (``backward_start``), or None."""
    from ...ir.builder import Builder

    g = ctx.graph
    readers = [u for u in list(p.users) if u is not update]
    if not readers:
        return
    forward = [u for u in readers if stop is None or u.is_before(stop)]
    backward = [u for u in readers if u not in forward]
    if forward and backward and not _reads_param_between(max(forward, key=lambda u: u._order),
                                                          min(backward, key=lambda u: u._order), p):
        # No other param is read from the forward's last use to the backward's first (the
        # LM head's matmul, the loss, the head's gradient): a second gather would fetch
        # the same rows again with nothing gained, so one copy serves both, as FSDP keeps
        # its root unit's params (the embedding, the tied head) for the backward.
        forward, backward = forward + backward, []
    groups = [forward, backward]
    for k, group in enumerate(x for x in groups if x):
        first = min(group, key=lambda u: u._order)
        b = Builder(g).set_insertion_before(first)
        suffix = ".gathered" if k == 0 else ".regathered"
        copy = b.reshape(p, shape=tuple(p.type.shape), name=f"{p.name}{suffix}", loc=first.loc)
        for u in group:
            for i, o in enumerate(list(u.operands)):
                if o is p:
                    g.set_operand(u, i, copy)
        ctx.place(copy, whole)


def _reads_param_between(first: Node, last: Node, p: Value) -> bool:
    """Whether a node after ``first`` and before ``last`` reads a param other than ``p``."""
    n = first.next
    while n is not None and n is not last:
        if any(o.is_input and o.role == "param" and o is not p for o in n.operands):
            return True
        n = n.next
    return False
