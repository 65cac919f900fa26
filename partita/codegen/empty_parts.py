"""Concats of an empty part and slices of a whole axis taken out before fuse-library (issue 37).

Phi-3 (and other models written for a partial rotary embedding) rotate ``x[..., :rd]`` and
concatenate ``x[..., rd:]`` back even when ``rd`` is the whole head: the concat then has an
empty operand and the slice keeps every element. Neither changes a value, but each is a step,
and together they hide the rotary embedding from ``fuse_rotary`` (codegen/rotary.py), so
attention, the rotation and grouped-query attention's k/v repeat stay a dozen steps per layer.

``drop_empty_parts`` rewrites, over a graph:

- ``concat(a, e)`` (any axis, any order) whose every operand but one has size 0 along the
  axis, to that operand (its type is the concat's);
- ``slice(x)`` with step 1 keeping the whole axis (its type is x's), to ``x``.

A value that is a graph output is left as it is (the outputs keep their own values). The nodes
left without users are erased. Run by ``fuse-library`` before its anchors.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ops.registry import normalize_axis
from ..passes.rewrite import erase_if_dead

__all__ = ["drop_empty_parts", "whole_part_of"]


def _static_dim(v: Value, axis: int) -> int | None:
    """v's size along ``axis`` where it is a known int."""
    d = v.type.shape[axis]
    return d if isinstance(d, int) else None


def whole_part_of(node: Node) -> Value | None:
    """The value ``node`` passes on unchanged: the one non-empty operand of a concat, or the
    sliced tensor of a slice that keeps its whole axis; None otherwise."""
    if len(node.results) != 1:
        return None
    y = node.results[0]
    if node.op == "concat" and node.operands:
        axis = normalize_axis(node.attrs["axis"], y.type.rank, "concat")
        full = [v for v in node.operands if _static_dim(v, axis) != 0]
        if len(full) == 1 and len(node.operands) > 1 and full[0].type == y.type:
            return full[0]
        return None
    if node.op == "slice" and node.attrs.get("step", 1) == 1:
        x = node.operands[0]
        axis = normalize_axis(node.attrs["axis"], x.type.rank, "slice")
        return x if _static_dim(x, axis) is not None and x.type == y.type else None
    return None


def drop_empty_parts(graph: Graph) -> int:
    """Every concat of one non-empty part and every whole-axis slice in ``graph`` replaced by
    the value it passes on (module doc); the number of nodes replaced."""
    done = 0
    for node in list(graph.nodes):
        if node.graph is not graph:
            continue   # erased with an earlier node
        keep = whole_part_of(node)
        y = node.results[0] if keep is not None else None
        if keep is None or y is None or any(v is y for v in graph.outputs):
            continue
        graph.replace_all_uses(y, keep)
        erase_if_dead(graph, node)
        done += 1
    return done
