"""Elementwise chains priced as the code generator's fusion pass groups them.

``plan_groups`` (partita/codegen/fusion.py, the ``fuse-kernels`` pass) finds the groups of
elementwise ops that run as one generated kernel; for pricing, bf16 and f16 pass its support
check as f32 (``any_float``), since a GPU's kernels take them, while what the code generator
compiles is unchanged. Each group is priced as one memory pass: every distinct input read once,
every output that leaves the group (read outside it, or a program output) written once, the
members' FLOPs summed, no intermediate materialized, at the memory roofline of the cost model
(``CostModel.roofline``) with one launch. The group's root (its last member in program order,
where the fused kernel runs) carries the time; the other members cost nothing.

The grouping depends on the graph alone and is computed once per graph object by
``fused_time``, which keeps it in ``CostModel.group_cache`` (``CostModel.groupings`` counts
the runs).
"""

from __future__ import annotations

from typing import Hashable, Mapping

from ..codegen.fusion import Group, plan_groups
from ..ir.graph import Graph, Node
from ..ops.kinds import FREE_OPS, P2P_OPS, VIEW_OPS
from ..parallel.pipeline.local_unroll import microbatch_sums, schedule_actions
from .cost import CostModel, OpTime

__all__ = ["fused_time", "group_prices", "group_sections", "group_time", "pricing_groups"]


def pricing_groups(graph: Graph, sections: Mapping[Node, Hashable] | None = None) -> list[Group]:
    """The groups ``fuse-kernels`` would make of ``graph``, bf16 and f16 accepted as f32, each
    inside one stretch between sends and recvs and, in an unrolled pp rank program, inside one
    schedule action: a pipeline's microbatches run apart, each when its data has arrived. The
    adds that sum a gradient or the loss shares over the microbatches (``microbatch_sums``)
    join no group: they are one add per microbatch where the pipeline runs them (under
    zero-bubble schedules the last stage's W passes run back to back, and their sums would
    otherwise chain into one group). The section templates the pipeline simulation prices
    are one action each, and it prices those sums alone, so the two group alike. ``sections`` (a pipeline template's nodes -> the section each is priced in)
    keeps each group inside one section the same way."""
    actions: Mapping[Node, Hashable] = sections if sections is not None else (schedule_actions(graph) or {})
    sums = microbatch_sums(graph)
    keys: dict[tuple, int] = {}
    segment: dict[Node, int] = {}
    k = 0
    for n in graph.nodes:
        if n.op in P2P_OPS:
            k += 1
        # A sum over the microbatches is priced alone: a segment of its own (negative ids).
        segment[n] = -1 - len(segment) if n in sums else keys.setdefault((k, actions.get(n)), len(keys))
    return plan_groups(graph, any_float=True, segment=segment)


def group_time(model: CostModel, group: Group) -> OpTime:
    """One fused kernel's time: its inputs read once and its outputs written once at the memory
    roofline, its members' FLOPs summed, one launch."""
    flops = sum(model.record_cost(n).flops for n in group.members
                if n.operands and n.op not in VIEW_OPS and n.op not in FREE_OPS)
    moved = sum(v.type.nbytes for v in group.inputs) + sum(v.type.nbytes for v in group.outputs)
    t, kind = model.roofline(moved, flops, group.root.op)
    return OpTime(t + model.eff.op_overhead, kind, flops, moved)


def group_prices(model: CostModel, graph: Graph,
                 sections: Mapping[Node, Hashable] | None = None) -> dict[Node, OpTime]:
    """Every grouped node of ``graph`` -> its price: a group's root the whole group's time, its
    other members (constants copied in as immediates aside) nothing."""
    out: dict[Node, OpTime] = {}
    for g in pricing_groups(graph, sections):
        whole = group_time(model, g)
        none = OpTime(0.0, whole.kind)
        for n in g.members:
            if n.operands:
                out[n] = none
        out[g.root] = whole
    return out


def group_sections(model: CostModel, graph: Graph, sections: Mapping[Node, Hashable]) -> None:
    """Group ``graph`` (a pipeline template) once with each group inside one of ``sections``
    (node -> the section it is priced in), for ``fused_time`` to answer from; nothing when
    ``model.groups`` is off."""
    if model.groups:
        model.group_cache[id(graph)] = (graph, group_prices(model, graph, sections))
        model.groupings += 1


def fused_time(model: CostModel, node: Node) -> OpTime | None:
    """``node``'s price as a member of a fused group of its graph, or None when it is in none
    (or ``model.groups`` is off); the graph is grouped once, on its first node asked."""
    g = node.graph
    if not model.groups or g is None:
        return None
    got = model.group_cache.get(id(g))
    if got is None or got[0] is not g:
        got = model.group_cache[id(g)] = (g, group_prices(model, g))
        model.groupings += 1
    return got[1].get(node)
