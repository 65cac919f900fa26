"""``split-projections``: one projection per piece of a fused projection's split result.

GPT-2's attention computes q, k and v with one weight ``c_attn: [C, 3C]`` and splits the
result along its last dim. The graph means the same when each piece is computed by its own
slice of the weight (and of the bias): ``x @ W[:, a:b] + bias[a:b]``. This pass makes that
rewrite: the fused weight and bias become new params ``<name>.split<i>`` whose weights are
cut from the old ones, and the old params leave the signature.

Why: tensor parallelism splits a projection's output dim in contiguous blocks, one per rank;
a block of ``[q | k | v]`` is not a block of q, k and v, so the fused weight has to stay
whole, while each separate projection splits by attention heads (what Megatron-LM achieves
by storing the fused weight interleaved). Run it on the forward graph before
``training_step``; the new params change the checkpoint's names accordingly.

The pattern, each value used once along the chain: ``matmul(x, W)`` with ``W`` a rank-2
param, optionally ``add`` of a rank-1 param bias, optionally a ``reshape`` that keeps the
last dim, then ``split`` along the last dim.
"""

from __future__ import annotations

import numpy as np

from ..ir.builder import Builder
from ..ir.graph import Graph, Node, Value, input_name
from ..ir.types import TensorType
from ..ops.registry import normalize_axis
from .manager import Pass, register_pass


def _single_use(v: Value) -> bool:
    return not v.is_output and sum(v.users.values()) == 1


def _param(v: Value, rank: int) -> bool:
    return v.is_input and v.role == "param" and v.type.rank == rank and _single_use(v)


def _match(split: Node) -> tuple[Node, Node | None, Value | None, Node | None] | None:
    """(matmul, add, bias, reshape) of a fused projection feeding ``split``, or None."""
    (v,) = split.operands
    if normalize_axis(split.attrs["axis"], v.type.rank, "split") != v.type.rank - 1 or not _single_use(v):
        return None
    n = v.type.shape[-1]
    reshape = None
    if v.producer is not None and v.producer.op == "reshape":
        src = v.producer.operands[0]
        if src.type.rank == 0 or src.type.shape[-1] != n or not _single_use(src):
            return None
        reshape, v = v.producer, src
    add = bias = None
    if v.producer is not None and v.producer.op == "add":
        a, b = v.producer.operands
        if _param(b, 1) and b.type.shape == (n,) and a.producer is not None and a.producer.op == "matmul":
            add, bias, v = v.producer, b, a
        else:
            return None
        if not _single_use(v):
            return None
    mm = v.producer
    if mm is None or mm.op != "matmul":
        return None
    x, w = mm.operands
    if not _param(w, 2) or w.type.shape[1] != n or x.type.rank < 1 or w is x:
        return None
    return mm, add, bias, reshape


def split_projections(graph: Graph) -> int:
    """Rewrite every fused projection of ``graph`` (in place); returns how many."""
    count = 0
    for split in [n for n in graph.nodes if n.op == "split"]:
        found = _match(split)
        if found is None:
            continue
        mm, add, bias, reshape = found
        x, w = mm.operands
        b = Builder(graph).set_insertion_before(split)
        offset = 0
        new_params: list[Value] = []
        wname = input_name(w)
        bname = input_name(bias) if bias is not None else ""
        for i, (size, piece) in enumerate(zip(split.attrs["sizes"], split.results)):
            wi = graph.add_input(f"{wname}.split{i}", TensorType((w.type.shape[0], size), w.type.dtype), "param")
            new_params.append(wi)
            if wname in graph.weights:
                graph.weights[input_name(wi)] = np.ascontiguousarray(np.asarray(graph.weights[wname])[:, offset:offset + size])
            y = b.emit("matmul", x, wi, loc=mm.loc)
            if bias is not None:
                bi = graph.add_input(f"{bname}.split{i}", TensorType((size,), bias.type.dtype), "param")
                if bname in graph.weights:
                    graph.weights[input_name(bi)] = np.ascontiguousarray(np.asarray(graph.weights[bname])[offset:offset + size])
                assert add is not None
                y = b.emit("add", y, bi, loc=add.loc)
            if reshape is not None:
                shape = list(reshape.attrs["shape"])
                if shape[-1] != -1:
                    shape[-1] = size
                y = b.emit("reshape", y, shape=tuple(shape), loc=reshape.loc)
            if piece.name is not None:
                y.name = piece.name
            graph.replace_all_uses(piece, y)
            offset += size
        for node in (split, reshape, add, mm):
            if node is not None:
                graph.erase(node)
        for old in (w, bias):
            if old is not None:
                graph.remove_input(old)
                if input_name(old) in graph.weights:
                    del graph.weights[input_name(old)]
        count += 1
    return count


@register_pass
class SplitProjections(Pass):
    """``split-projections``: see the module docstring."""

    name = "split-projections"

    def run(self, graph: Graph) -> Graph:
        split_projections(graph)
        return graph
