"""``merge-linears``: linear layers reading the same input become one (inference, frozen params).

Attention's q, k and v projections (T5, Llama, DeBERTa-v2, BERT-like encoders) and the key and
value projections of every decoder layer's cross-attention (all reading the encoder's output)
are separate ``linear_pointwise`` nodes on one input x [M, K]. On the small shapes of the zoo a
layer is a few microseconds of arithmetic beside 2 to 4 microseconds of per-step cost, so one
GEMM ``x @ [W_1 | W_2 | ...]`` followed by a ``split`` of its columns (bound once as views of
the memory plan's buffer) does the same work in one step:

    linear_pointwise(x, W_i, b_i) {unary u}, i = 1..n
      ==  split(linear_pointwise(x, concat_i W_i, concat_i b_i) {unary u}, axis 1)

Each column of the result depends on its own weight column and bias only, so the split
pieces hold the same values as the separate layers (the same sums, in the same order). Taken
together: layers whose input is the same 2-d value (or equal reshapes of one value), whose weights (and biases, where they have
one) are params with values in ``graph.weights``, of one dtype, with the same weight layout and
bias presence. Layers with different activations (Llama's gate with SiLU beside its up
projection) share a GEMM without one, each piece followed by its own activation op, where
its one reader is an elementwise op that ``fuse-kernels`` joins it to (SiLU into the
gate-times-up product); an activation read otherwise keeps its layer with its own kind. It assumes what ``fold-params`` assumes: the params are the values
``graph.weights`` holds at every call (a frozen inference program); ``CompiledProgram`` runs
it only with ``freeze=True``. The old weights go when nothing else reads them.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..ir.graph import Graph, Node, Value, input_name
from ..ir.types import TensorType
from ..passes.manager import Pass, register_pass
from ..ops.registry import OPS
from .epilogue import CONV_UNARY
from .inference import known_value

__all__ = ["MergeLinears", "merge_sibling_linears", "single_op_unary", "source_of"]

# Layers wider than this (output columns) are left alone: the split pieces of a large GEMM
# gain nothing from one call, and the concatenated weight is a second copy until the old goes.
MAX_MERGED_COLUMNS = 4096


def _key(graph: Graph, node: Node) -> tuple | None:
    """What layers must share to be merged with ``node``; None when it cannot be merged."""
    x = node.operands[0]
    w = node.operands[1]
    if x.type.rank != 2 or w.type.rank != 2 or not w.is_input or known_value(graph, w) is None:
        return None
    bias = node.operands[2] if len(node.operands) > 2 else None
    if bias is not None and (not bias.is_input or known_value(graph, bias) is None):
        return None
    # an activation becomes a separate op only where an elementwise reader takes it in
    own = node.attrs.get("unary", "none") != "none" and not activation_can_follow(node)
    attrs = tuple(sorted((k, repr(v)) for k, v in node.attrs.items() if own or k != "unary"))
    return (source_of(x), w.type.dtype, bias is not None, attrs)


def activation_can_follow(node: Node) -> bool:
    """Whether ``node``'s activation can leave its GEMM for an op of its own, joined by
    ``fuse-kernels`` to its one reader (through reshapes), an elementwise product or kernel
    (Llama's ``silu(gate) * up``)."""
    if not single_op_unary(node.attrs.get("unary", "none")):
        return False
    r = node.results[0]
    while r.num_uses == 1 and not r.is_output:
        reader = next(iter(r.users))
        if reader.op != "reshape":
            return reader.op in FUSING_READERS
        r = reader.results[0]
    return False


# Readers that fuse-kernels joins an elementwise activation to.
FUSING_READERS = ("mul", "add", "fused")


def single_op_unary(unary: str) -> bool:
    """Whether the activation ``unary`` is one partita op (relu, gelu, silu, ...) that can
    follow a split piece; the chained ones (ReLU6, hardswish) are not merged across."""
    u = CONV_UNARY.get(unary)
    return u is not None and bool(u.op) and u.op in OPS


def source_of(x: Value) -> tuple:
    """``x`` as a key: a reshape's operand and shape, so that equal reshapes of one value (an
    input reshaped once per layer where CSE has not run) count as one input."""
    p = x.producer
    if p is not None and p.op == "reshape":
        return ("reshape", p.operands[0], x.type.shape)
    return ("value", x)


def _new_param(graph: Graph, like: Value, suffix: str, value: np.ndarray) -> Value:
    """A new param named after ``like`` with ``value`` in ``graph.weights``."""
    names = {input_name(v) for v in graph.inputs} | set(graph.weights)
    base = f"{input_name(like)}.{suffix}"
    name, i = base, 1
    while name in names:
        name, i = f"{base}.{i}", i + 1
    v = graph.add_input(name, TensorType(value.shape, like.type.dtype), "param")
    graph.weights[name] = value
    return v


def _known(graph: Graph, v: Value) -> np.ndarray:
    a = known_value(graph, v)
    assert a is not None, f"merge-linears: {v!r} has no known value"
    return a


def _drop_unused_param(graph: Graph, v: Value) -> None:
    if v.is_input and not v.has_uses:
        name = input_name(v)
        graph.remove_input(v)
        graph.weights.pop(name, None)


def merge_group(graph: Graph, layers: list[Node]) -> Node:
    """Replace ``layers`` (same input, weight layout and bias presence; known
    weights) by one ``linear_pointwise`` on their concatenated weights and a ``split`` of its
    columns; returns the new layer."""
    first = layers[0]
    kn = first.attrs.get("weight_layout", "nk") == "kn"
    widths = [n.results[0].type.shape[1] for n in layers]
    w: np.ndarray = np.ascontiguousarray(np.concatenate([_known(graph, n.operands[1]) for n in layers],
                                                        axis=1 if kn else 0))
    operands = [first.operands[0], _new_param(graph, first.operands[1], "merged", w)]
    if len(first.operands) > 2:
        b = np.concatenate([_known(graph, n.operands[2]) for n in layers])
        operands.append(_new_param(graph, first.operands[2], "merged", np.ascontiguousarray(b)))
    out = first.results[0].type
    m = out.shape[0]
    unaries = {n.attrs.get("unary", "none") for n in layers}
    shared = unaries.pop() if len(unaries) == 1 else "none"
    merged = Node("linear_pointwise", operands, {**first.attrs, "unary": shared},
                  [TensorType((m, sum(widths)), out.dtype)], first.loc)
    graph.insert_before(first, merged)
    split = Node("split", [merged.results[0]], {"axis": 1, "sizes": tuple(widths)},
                 [n.results[0].type for n in layers], first.loc)
    graph.insert_after(merged, split)
    old = []
    last = split
    for n, piece in zip(layers, split.results):
        unary = n.attrs.get("unary", "none")
        if unary != shared:   # this layer's own activation after its piece
            u = CONV_UNARY[unary]
            assert u is not None
            last = graph.insert_after(last, Node(u.op, [piece], dict(u.attrs), [piece.type], n.loc))
            piece = last.results[0]
        graph.replace_all_uses(n.results[0], piece)
        old.extend(n.operands[1:])
        graph.erase(n)
    for v in dict.fromkeys(old):
        _drop_unused_param(graph, v)
    return merged


def merge_sibling_linears(graph: Graph) -> int:
    """Merge every group of two or more mergeable ``linear_pointwise`` nodes on one input (see
    the module doc); returns how many layers went."""
    groups: dict[tuple, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        if node.op == "linear_pointwise" and len(node.operands) in (2, 3):
            key = _key(graph, node)
            if key is not None:
                groups[key].append(node)
    gone = 0
    for layers in groups.values():
        if len(layers) < 2 or sum(n.results[0].type.shape[1] for n in layers) > MAX_MERGED_COLUMNS:
            continue
        merge_group(graph, layers)
        gone += len(layers) - 1
    return gone


@register_pass
class MergeLinears(Pass):
    """Linear layers on one input with known weights become one layer and a split (see the
    module doc)."""

    name = "merge-linears"

    def run(self, graph: Graph) -> Graph:
        merge_sibling_linears(graph)
        return graph
