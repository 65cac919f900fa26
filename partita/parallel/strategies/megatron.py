"""``megatron``: tensor parallelism in pairs, as Megatron-LM does for transformer layers, and
``sp``, its sequence parallelism.

A matmul by a weight whose input is whole on the tensor axis is column-parallel (the weight
split on its output dim); a matmul whose input arrives split on its contracted dim is
row-parallel (the weight split on its input dim; the result is a partial sum, reduced where
a consumer needs it). Attention heads split through the reshapes that follow the
column-parallel projections. Embedding tables are vocab-parallel (split by rows: a rank looks
up its rows, the lookup is a partial sum), and a column weight whose split reaches a
cross_entropy's classes (an LM head) stays split: the loss runs on the rank's logits with its
log-sum-exp all-reduced, so the logits are never gathered. A vocabulary that the tensor axis
does not divide is padded first (``vocab.pad_vocabulary``). A column weight that neither a row
weight nor a loss follows is left whole.

``sp`` (``sequence-parallel``, with ``megatron``): the values where a row-parallel partial sum
is reduced are split on their token dim, so the reduction is a reduce_scatter, the norms and
residual adds between the parallel regions run on a slice of the tokens, and the next
column-parallel matmul gathers its input (all_gather) instead.
"""

from __future__ import annotations

import math

from ...ir.graph import Node, Value
from ...ir.placement import Placement
from ..propagate import placement_from_labels
from ..sharding import Conflict, result_placements, sharding_spec
from .base import UPDATE_OPS, AnnotationContext, Strategy, register
from .vocab import pad_vocabulary, vocab_parallel

# Where megatron leaves, for sp, the values at which its row-parallel partial sums are reduced.
REDUCED = "megatron.reduced"


@register
class Megatron(Strategy):
    name = "megatron"
    aliases = ("tp",)
    axis = "tp"
    order = 10

    def annotate(self, ctx: AnnotationContext) -> None:
        axis = ctx.axis(self)
        pad_vocabulary(ctx, axis)
        walk = _Walk(ctx, axis)
        excluded: set[Value] = set()
        for _ in range(8):
            walk.followers = {}
            cols, rows, confirmed, reduced = walk.track(excluded)
            loose = set(cols) - confirmed
            if not loose:
                break
            excluded |= loose
        for w, p in list(cols.items()) + list(rows.items()) + list(walk.followers.items()):
            if w not in ctx.fixed:
                ctx.place(w, p)
        vocab_parallel(ctx, axis)
        for w in sorted(excluded, key=lambda v: v.index):
            why = f"its column split stops at {walk.blocked[w]}, which needs that dim whole" if w in walk.blocked \
                else "no row-parallel matmul follows its column-parallel use"
            if w in walk.blocked and walk.blocked[w].endswith("= split"):
                why += " (a fused projection: run the split-projections pass on the forward graph first)"
            ctx.notes.append(f"%{ctx.name(w)} kept whole over '{axis}': {why}")
        ctx.shared[REDUCED] = reduced
        # Optimizer state follows its param (a ZeRO preset shards it further). With master
        # weights the update reads the f32 master <p>.master, which is placed as <p> too:
        # otherwise every rank would update the whole param, its gradient gathered first.
        by_name = {str(v.name): v for v in ctx.graph.inputs}
        for node in ctx.graph.nodes:
            if node.op not in UPDATE_OPS:
                continue
            w = node.operands[0]
            p = by_name.get(str(w.name)[:-len(".master")], w) \
                if w.role == "state" and str(w.name).endswith(".master") else w
            if p not in ctx.fixed:
                continue
            for st in ([w] if w is not p else []) + list(node.operands[2:]):
                if st.type.shape == p.type.shape and st not in ctx.fixed and st.producer is None:
                    ctx.place(st, ctx.fixed[p])


@register
class SequenceParallel(Strategy):
    name = "sp"
    aliases = ("sequence-parallel",)
    axis = "tp"
    requires = ("megatron",)
    requires_why = "sequence parallelism splits what megatron's row-parallel layers reduce"
    order = 20

    def annotate(self, ctx: AnnotationContext) -> None:
        split = False
        for v in ctx.shared[REDUCED]:
            p = self.token_split(ctx, v)
            if p is not None and v not in ctx.fixed:
                ctx.place(v, p)
                ctx.sinks.add(v)
                split = True
        if not split:
            return
        # Megatron-LM's all_gather before each column-parallel layer: the activation it reads is
        # gathered (once, for every projection that reads it), rather than the projections'
        # weights; priced one consumer at a time, gathering a q, k or v weight looks cheaper
        # than the activation the three share.
        from ...autodiff.recompute import backward_start

        tp = ctx.axis(self)
        stop = backward_start(ctx.graph)
        for node in ctx.graph.nodes:
            if node is stop:
                break
            w = weight_of(node)
            if w is None or w[0] not in ctx.fixed:
                continue
            param, transposed = w
            col = 0 if transposed else 1
            x = node.operands[0]
            if ctx.fixed[param].dims[col] == (tp,) and x not in ctx.fixed and x.producer is not None:
                ctx.place(x, Placement(tuple(() if d != 0 or not ctx.strategy.dp_axis else (ctx.strategy.dp_axis,)
                                             for d in range(x.type.rank))) if self._batch_lead(ctx, x)
                          else Placement.replicated(x.type.rank))
                ctx.sinks.add(x)

    def _batch_lead(self, ctx: AnnotationContext, x: Value) -> bool:
        """Whether ``x``'s leading dim also carries the data-parallel split (kept when gathering
        over the tensor axis)."""
        dp = ctx.strategy.dp_axis
        return dp is not None and x.type.rank >= 1 and x.type.shape[0] % ctx.mesh.axis_size(dp) == 0

    def token_split(self, ctx: AnnotationContext, v: Value) -> Placement | None:
        """The sequence-parallel placement of activation ``v``: its leading dim (the batch, or
        batch x sequence once flattened) split over the data axis and then the tensor axis,
        which stays contiguous through the reshapes that flatten [B, S, C] to [B*S, C]; else
        its dim 1 (the sequence of [B, S, C])."""
        tp = ctx.axis(self)
        dp = ctx.strategy.dp_axis
        lead = ((dp,) if dp else ()) + (tp,)
        shape = v.type.shape
        if not shape:
            return None
        if shape[0] % math.prod(ctx.mesh.axis_size(a) for a in lead) == 0:
            return Placement(((lead),) + ((),) * (len(shape) - 1))
        if len(shape) == 3 and shape[1] % ctx.mesh.axis_size(tp) == 0:
            return Placement((lead[:-1], (tp,), ()))
        return None


def weight_of(node: Node) -> tuple[Value, bool] | None:
    """The param a matmul multiplies by on the right (directly or transposed), if any."""
    if node.op != "matmul" or len(node.operands) != 2:
        return None
    rhs = node.operands[1]
    if rhs.is_input and rhs.role == "param" and rhs.type.rank == 2:
        return rhs, False
    prod = rhs.producer
    if prod is not None and prod.op == "transpose" and prod.operands[0].is_input and \
            prod.operands[0].role == "param" and prod.operands[0].type.rank == 2:
        return prod.operands[0], True
    return None


class _Walk:
    """Megatron's forward walk over the sharding rules on ``axis``: which weights are column-
    and which row-parallel (see the module docstring)."""

    def __init__(self, ctx: AnnotationContext, axis: str) -> None:
        self.ctx = ctx
        self.axis = axis
        # Params the walk split to match a split weight (the bias of a column layer).
        self.followers: dict[Value, Placement] = {}
        # Column weights whose split a node could not carry on (for the plan's notes).
        self.blocked: dict[Value, str] = {}

    def track(self, excluded: set[Value]):
        """One forward walk deciding column and row weights; see the module docstring."""
        from ...autodiff.recompute import backward_start

        ctx, axis = self.ctx, self.axis
        stop = backward_start(ctx.graph)
        n = ctx.mesh.axis_size(axis)
        embedded = {node.operands[0] for node in ctx.graph.nodes if node.op == "embedding"}
        state: dict[Value, Placement] = {}
        origin: dict[Value, frozenset] = {}
        cols: dict[Value, Placement] = {}
        rows: dict[Value, Placement] = {}
        confirmed: set[Value] = set()
        reduced: list[Value] = []
        weight_transposes = {}
        for node in ctx.graph.nodes:
            w = weight_of(node)
            if w is not None and w[1]:
                weight_transposes[node.operands[1].producer] = w[0]

        def pl(v: Value) -> Placement:
            if v in state:
                return state[v]
            if v in cols:
                return cols[v]
            if v in rows:
                return rows[v]
            return Placement.replicated(v.type.rank)

        def on_axis(p: Placement) -> Placement:
            return Placement(tuple(tuple(a for a in d if a == axis) for d in p.dims),
                             tuple(a for a in p.partial if a == axis))

        for node in ctx.graph.nodes:
            if node is stop:
                break
            if node in weight_transposes and weight_transposes[node] not in cols and \
                    weight_transposes[node] not in rows:
                continue  # decided at its matmul
            w = weight_of(node)
            if w is not None and w[0] not in cols and w[0] not in rows and w[0] not in excluded \
                    and w[0] not in embedded:
                param, transposed = w
                xs = pl(node.operands[0])
                k_dim = node.operands[0].type.rank - 1
                if xs.is_replicated:
                    d = 0 if transposed else 1
                    if param.type.shape[d] % n == 0:
                        cols[param] = Placement.split(2, {d: axis})
                elif xs.dims[k_dim] == (axis,) and not xs.partial and \
                        all(not a for i, a in enumerate(xs.dims) if i != k_dim):
                    d = 1 if transposed else 0
                    if param.type.shape[d] % n == 0:
                        rows[param] = Placement.split(2, {d: axis})
                        confirmed |= origin.get(node.operands[0], frozenset())
                if transposed:
                    tnode = node.operands[1].producer
                    assert tnode is not None  # weight_of found the transpose
                    state[tnode.results[0]] = Placement(tuple(reversed(pl(param).dims)))
            results = self.infer(node, [pl(o) for o in node.operands])
            if results is None:
                for o in node.operands:
                    if any(pl(o).dims):
                        for w0 in origin.get(o, frozenset()):
                            self.blocked.setdefault(w0, f"%{ctx.name(node.results[0])} = {node.op}" if node.results
                                                    else node.op)
                # The rule rejects the partial sums: they are reduced here.
                if any(pl(o).partial for o in node.operands):
                    reduced.extend(o for o in node.operands if pl(o).partial and o not in reduced)
                ops = [Placement(pl(o).dims, ()) for o in node.operands]
                results = self.infer(node, ops)
            if results is None:
                results = [Placement.replicated(r.type.rank) for r in node.results]
            if node.op == "cross_entropy" and node.operands[0] in origin:
                # Logits split on the classes: the vocab-parallel loss takes them as they are.
                logits = node.operands[0]
                if pl(logits).dims[1 if logits.type.rank >= 2 else 0] == (axis,):
                    confirmed |= origin[logits]
            src = frozenset().union(*(origin.get(o, frozenset()) for o in node.operands))
            if w is not None and w[0] in cols:
                src = frozenset({w[0]})
            for r, p in zip(node.results, results):
                state[r] = on_axis(p)
                if not state[r].is_replicated:
                    origin[r] = src
        return cols, rows, confirmed, reduced

    def infer(self, node: Node, placements: list[Placement]) -> list[Placement] | None:
        ctx = self.ctx
        spec = sharding_spec(node.op, [o.type for o in node.operands], node.attrs)
        if spec is None:
            return None if any(not p.is_replicated for p in placements) else \
                [Placement.replicated(r.type.rank) for r in node.results]
        # Operands that are still free (biases, norm weights) follow the split of the others.
        label_axes: dict[str, tuple[str, ...]] = {}
        for labels, o, p in zip(spec.operands, node.operands, placements):
            if (o.is_input and o.role == "param" and o not in ctx.fixed) or \
                    (o.producer is not None and o.producer.op == "constant"):
                continue
            for lab, axes in zip(labels, p.dims):
                if lab is not None and axes:
                    label_axes.setdefault(lab, axes)
        ops = []
        for labels, o, p in zip(spec.operands, node.operands, placements):
            if o.is_input and o.role == "param" and o not in ctx.fixed and p.is_replicated:
                p = placement_from_labels(labels, label_axes, o.type.shape, ctx.mesh)
                if not p.is_replicated:
                    self.followers.setdefault(o, p)
            elif o.producer is not None and o.producer.op == "constant" and p.is_replicated:
                # A constant (the padded vocabulary's mask) is cut to whatever split it meets.
                p = placement_from_labels(labels, label_axes, o.type.shape, ctx.mesh)
            ops.append(p)
        got = result_placements(spec, ops, [o.type for o in node.operands], ctx.mesh,
                                [r.type for r in node.results])
        return None if isinstance(got, Conflict) else got
