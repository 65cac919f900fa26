"""``ep``: expert parallelism for mixture-of-experts layers, as GShard and DeepSpeed-MoE do it.

The experts of each MoE layer are split across the ranks of the ``ep`` axis (E / n experts
per rank), and so is the batch: outside the expert FFNs an ``ep`` rank is a data-parallel
rank (DeepSpeed-MoE's expert-parallel group inside the data-parallel group). Between the two
the tokens travel with ``all_to_all``: each rank builds, for its own token groups, every
expert's buffer (the dispatch einsum of partita/frontend/moe.py), sends each expert's part to
the rank holding that expert, runs its experts' FFNs on the tokens of every group, and sends
the results back, where the combine einsum weights and sums them. The backward pass does
the same in reverse, so a layer's step has four all_to_all; the non-expert parameters'
gradients are all-reduced over ``ep`` like data parallelism's, the experts' need none (each
expert's gradient is complete on the rank that holds it).

What the strategy recognizes: a batched matmul ``x_e @ W`` whose right operand is (a
transpose of) a rank-3 param ``[E, ., .]`` and whose left operand ``[E, G*C, H]`` comes from
GShard's dispatch (``reshape(transpose(reshape(matmul(dispatch^T, tokens))))``): the form the
importer gives transformers' MoE layers (Mixtral, Qwen-MoE: ``static_experts``) and that
``partita.frontend.moe.dispatch_experts_forward`` writes. It places the expert weights (and
their optimizer state) split on dim 0, each expert FFN's input split on experts, and each
layer's dispatch and combine tensors split on token groups; propagation places the rest and
the partition turns the changes from groups to experts and back into all_to_all.

Composes with ``dp`` (the batch split over ``dp`` x ``ep``, the experts replicated over
``dp`` with their gradients all-reduced there) and with ``megatron`` (attention and dense
layers split over ``tp``; the experts stay whole over ``tp``). The number of experts must
divide by the ``ep`` size and the number of token groups (``moe_groups`` at import) by the
data-parallel width (``dp`` x ``ep``).
"""

from __future__ import annotations

import math

from ...ir.graph import Node, Value
from ...ir.placement import Placement
from .base import UPDATE_OPS, AnnotationContext, Strategy, StrategyError, register


def _through(v: Value, *ops: str) -> Value | None:
    """Walk back from ``v`` through producers of the given ops in order; None if they differ."""
    for op in ops:
        p = v.producer
        if p is None or p.op != op:
            return None
        v = p.operands[0]
    return v


def expert_weight(node: Node) -> Value | None:
    """The rank-3 param a batched matmul multiplies by on the right (directly or transposed)."""
    if node.op != "matmul" or node.operands[0].type.rank != 3:
        return None
    rhs = node.operands[1]
    if rhs.producer is not None and rhs.producer.op == "transpose":
        rhs = rhs.producer.operands[0]
    if rhs.is_input and rhs.role == "param" and rhs.type.rank == 3 and rhs.type.shape[0] == node.operands[0].type.shape[0]:
        return rhs
    return None


class _Layer:
    """One MoE layer's values: the expert weights, their FFN input, the dispatch and combine."""

    def __init__(self) -> None:
        self.weights: list[Value] = []
        self.expert_values: list[Value] = []
        self.group_values: list[Value] = []
        # The experts' outputs regrouped by token group, on their way back to their groups.
        self.returns: list[Value] = []


def find_layers(graph) -> list[_Layer]:
    """The MoE layers of ``graph``: expert matmuls grouped by the dispatch they read from."""
    layers: dict[Node, _Layer] = {}
    for node in graph.nodes:
        w = expert_weight(node)
        if w is None:
            continue
        xe = node.operands[0]
        # First FFN matmul: its input comes from the dispatch einsum.
        src = _through(xe, "reshape", "transpose", "reshape")
        d = src.producer if src is not None else None
        if d is not None and d.op == "matmul" and d.operands[0].type.rank == 3 and d.operands[1].type.rank == 3:
            layer = layers.setdefault(d, _Layer())
            layer.expert_values.append(xe)
            disp = d.operands[0]
            if disp.producer is not None and disp.producer.op == "transpose":
                disp = disp.producer.operands[0]
            layer.group_values += [disp, d.operands[1]]
            layer.weights.append(w)
            continue
        # A later FFN matmul of the same experts (the down projection) reads the first's result.
        for layer in layers.values():
            if any(_reads(xe, v) for v in layer.expert_values):
                layer.weights.append(w)
                layer.expert_values.append(xe)
                found = _combine_of(node.result)
                if found is not None:
                    combine, ye, out = found
                    layer.group_values += [combine, out]
                    # The combined output leaves through reshapes back to [T, H] / [B, S, H]:
                    # they stay split by tokens too (else propagation may pick another split).
                    v = out
                    while True:
                        nxt = [u for u in v.users if u.op in ("reshape", "cast")]
                        if len(nxt) != 1:
                            break
                        v = nxt[0].result
                        layer.group_values.append(v)
                    layer.returns.append(ye)
                break
    return [layer for layer in layers.values() if layer.weights]


def _combine_of(y: Value) -> tuple[Value, Value, Value] | None:
    """(combine, the experts' output regrouped by token group, the combined output) of the
    einsum ``matmul(combine, reshape(transpose(reshape(y))))`` that reads the experts'
    output ``y``, or None."""
    v = y
    for op in ("reshape", "transpose", "reshape"):
        # In a training step the backward pass reads these values too: follow the one user
        # of the op the forward einsum is made of.
        nxt = [u for u in v.users if u.op == op]
        if len(nxt) != 1:
            return None
        v = nxt[0].result
    for u in v.users:
        if u.op == "matmul" and u.operands[1] is v and u.operands[0].type.rank == 3:
            return u.operands[0], v, u.result
    return None


def _reads(v: Value, src: Value, depth: int = 6) -> bool:
    """Whether ``v`` is computed from ``src`` within ``depth`` elementwise/shape steps."""
    frontier = [v]
    for _ in range(depth):
        nxt = []
        for x in frontier:
            p = x.producer
            if p is None:
                continue
            if any(o.producer is not None and o.producer.op == "matmul" and o.producer.operands[0] is src
                   for o in p.operands) or any(o is src for o in p.operands):
                return True
            nxt += list(p.operands)
        frontier = nxt
    return False


@register
class ExpertParallel(Strategy):
    name = "ep"
    aliases = ("expert-parallel",)
    axis = "ep"
    order = 35   # after the data-parallel presets (30): it adds its axis to their batch split

    def annotate(self, ctx: AnnotationContext) -> None:
        axis = ctx.axis(self)
        n = ctx.mesh.axis_size(axis)
        g = ctx.graph
        layers = find_layers(g)
        if not layers:
            raise StrategyError(f"strategy {self.name}: @{g.name} has no mixture-of-experts layer in the dispatch "
                                "form (a batched matmul by a rank-3 [experts, ., .] param fed by a dispatch "
                                "einsum); import the model with partita.import_torch, which writes transformers' "
                                "MoE layers that way, or use partita.frontend.moe.dispatch_experts_forward")
        dp = ctx.strategy.dp_axis
        lead = ((dp,) if dp else ()) + (axis,)
        width = math.prod(ctx.mesh.axis_size(a) for a in lead)
        placed: set[Value] = set()
        for layer in layers:
            for w in layer.weights:
                experts = w.type.shape[0]
                if experts % n:
                    raise StrategyError(f"strategy {self.name}: %{ctx.name(w)} holds {experts} experts, which the "
                                        f"mesh axis '{axis}' of size {n} does not divide; use an '{axis}' size "
                                        f"dividing {experts}")
                if w not in placed:
                    ctx.place(w, Placement.split(w.type.rank, {0: axis}))
                    placed.add(w)
            # The split changes between token groups and experts at these two values: the
            # expert input [E, G*C, H] is split by experts (on dp too, each replica keeps its
            # own groups' tokens), the experts' output regrouped [G, E*C, H] by groups again;
            # each change is one all_to_all over ep.
            for v in layer.expert_values:
                ctx.place(v, Placement.split(v.type.rank, {0: axis, 1: dp} if dp else {0: axis}))
            for v in layer.returns:
                ctx.place(v, Placement(((lead),) + ((),) * (v.type.rank - 1)))
            for v in layer.group_values:
                groups = v.type.shape[0]
                if groups % width:
                    raise StrategyError(f"strategy {self.name}: an MoE layer routes its tokens in {groups} groups, "
                                        f"which {' x '.join(lead)} = {width} does not divide; import the model "
                                        f"with moe_groups={width} (or a multiple of it)")
                ctx.place(v, Placement(((lead),) + ((),) * (v.type.rank - 1)))
        # The batch: split over the data-parallel width, as dp does.
        for v in [v for v in g.inputs if v.role == "input"]:
            if v.type.rank == 0:
                continue
            if v.type.shape[0] % width:
                raise StrategyError(f"strategy {self.name}: %{ctx.name(v)} has {v.type.shape[0]} rows in dim 0, "
                                    f"which {' x '.join(lead)} = {width} does not divide; use a batch that is a "
                                    f"multiple of {width}")
            ctx.place(v, Placement(((lead),) + ((),) * (v.type.rank - 1)))
        ctx.notes.append(f"ep: {len(placed)} expert weight(s) split over '{axis}', {len(layers)} dispatch einsum(s) "
                         "(forward and backward) between token groups and experts")
        # Optimizer state follows its expert weight.
        for node in g.nodes:
            if node.op in UPDATE_OPS and node.operands[0] in placed:
                for st in node.operands[2:]:
                    if st.type.shape == node.operands[0].type.shape:
                        ctx.place(st, ctx.fixed[node.operands[0]])
