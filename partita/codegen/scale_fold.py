"""``scale-fold``: per-feature scales folded into the known weights of linear layers (frozen inference).

A frozen program's weights are constants, so a multiplication of a linear layer's input or
output by a known vector over its features is a change of the layer's weight, made once:

- a ``mul`` of a layer's output (through reshapes keeping the last axis, each value read by the
  next alone; the layer without an activation) by a known vector ``s`` over its N output
  features (a scalar, [N] or [1, ..., 1, N]): ``(x W^T + b) * s == x (W * s[:, None])^T + b * s``
  (ConvNeXt's layer scale ``gamma * pwconv2(x)``); likewise a scale of an ``embedding``'s
  rows into its table's columns (Gemma's ``embed_tokens(ids) * sqrt(d)``);
- a ``mul`` of a value by such a vector over its last axis, where every reader of the product
  is a layer taking it as its input (through such reshapes): ``(x * s) W^T == x (W * s)^T``
  (T5's ``* d_model ** -0.5`` before its LM head);
- the weight and bias of a ``rms_norm``, ``layer_norm`` or ``add_norm`` over the last axis,
  where every reader of the normalized result is such a layer: ``(n * g + beta) W^T + b ==
  n (W * g)^T + (b + W beta)``; the norm keeps no weight (T5's, Llama's and Qwen's RMSNorms
  before q/k/v and the MLP, BERT's and ViT's LayerNorms before their projections).

The new weights are computed in float64 and stored in the layer's dtype, as new params named
``<old name>.scaled`` (constants for a constant weight); an old weight or scale goes when
nothing else reads it, so a param read elsewhere (T5's head tied to its embedding) stays as it
was for its other readers. Nothing is folded where a scale is not known (a param or constant
whose value the graph holds), where a value on the way is read by anything else or is a graph
output, or where a scale is not finite. A weight read by something else too keeps its old
value for that reader and the layer gets a scaled copy, only up to ``MAX_SHARED_COPY`` elements. ``CompiledProgram(freeze=True)`` runs it after
``fuse-library`` (every linear layer is a ``linear_pointwise`` then, on both the import and
the torch.compile path) and before ``merge-linears``; ``PARTITA_SCALE_FOLD=0`` turns it off.
The folded program computes the same function up to f32 rounding (the scale multiplies the
weight instead of the activation).
"""

from __future__ import annotations

import os

import numpy as np

from ..ir.graph import Graph, Node, Value, input_name
from ..ir.types import TensorType
from ..passes.manager import Pass, register_pass
from ..passes.rewrite import erase_if_dead
from .inference import known_input_like, known_value

__all__ = ["ScaleFold", "fold_scales", "enabled", "ENV", "linear_readers"]

ENV = "PARTITA_SCALE_FOLD"
LINEAR = "linear_pointwise"
NORMS = ("rms_norm", "layer_norm", "add_norm")

# A weight also read by something that needs it unscaled (a head tied to its embedding) is
# folded into a second copy only up to this many elements (4 MiB of f32): beyond it, the copy's
# memory costs more than the elementwise step it saves.
MAX_SHARED_COPY = 1 << 20


def enabled() -> bool:
    """Whether the pass runs (``PARTITA_SCALE_FOLD=0`` turns it off, for comparisons)."""
    return os.environ.get(ENV, "1") != "0"


@register_pass
class ScaleFold(Pass):
    """Scales of linear layers' inputs and outputs by known vectors folded into their weights."""

    name = "scale-fold"

    def run(self, graph: Graph) -> Graph:
        if enabled():
            fold_scales(graph)
        return graph


def fold_scales(graph: Graph) -> int:
    """Every fold of the module doc, until none applies; returns how many were made."""
    total = 0
    for _ in range(4):   # a fold can open another (T5: the head's scale, then the norm before it)
        count = 0
        for node in list(graph.nodes):
            if node.graph is not graph:
                continue
            if node.op == "mul":
                count += fold_output_scale(graph, node) or fold_input_scale(graph, node)
            elif node.op in NORMS:
                count += fold_norm_affine(graph, node)
        total += count
        if not count:
            break
    return total


def _float(v: Value) -> bool:
    dt = v.type.dtype
    return bool(dt.is_float) and not dt.storage and v.type.rank > 0


def feature_scale(graph: Graph, s: Value, like: Value) -> np.ndarray | None:
    """``s``'s known value as a float64 vector over ``like``'s last axis, where ``like * s``
    scales that axis alone (``s`` a scalar, [C] or [1, ..., 1, C] of ``like``'s dtype), finite;
    else None."""
    a = known_value(graph, s)
    if a is None or not _float(like) or a.dtype != like.type.dtype.np or a.ndim > like.type.rank:
        return None
    c = like.type.shape[-1]
    if any(d != 1 for d in a.shape[:-1]) or (a.ndim and a.shape[-1] not in (1, c)):
        return None
    vec = np.broadcast_to(a.astype(np.float64).reshape(-1), (c,)).copy()
    return vec if np.all(np.isfinite(vec)) else None


def scaled_operand(graph: Graph, mul: Node) -> tuple[Value, Value, np.ndarray] | None:
    """(the scaled value, the scale, the scale as a vector) of a ``mul`` by a known feature
    scale whose result has the scaled value's type; None otherwise."""
    if len(mul.operands) != 2 or len(mul.results) != 1:
        return None
    out = mul.results[0]
    for i in (0, 1):
        x, s = mul.operands[i], mul.operands[1 - i]
        if x is s or x.type != out.type or known_value(graph, x) is not None:
            continue
        vec = feature_scale(graph, s, x)
        if vec is not None:
            return x, s, vec
    return None


def producing_layer(v: Value, reader: Node) -> Node | None:
    """The ``linear_pointwise`` without an activation, or the ``embedding``, whose result
    becomes ``v`` through reshapes keeping the last axis, each value on the way read by the
    next alone; or None."""
    c = v.type.shape[-1]
    while True:
        if v.is_output or len(v.users) != 1 or v.users.get(reader) != 1 or v.type.shape[-1] != c:
            return None
        p = v.producer
        if p is None or len(p.results) != 1:
            return None
        if p.op == LINEAR:
            return p if p.attrs.get("unary", "none") == "none" else None
        if p.op == "embedding":
            return p
        if p.op != "reshape":
            return None
        reader, v = p, p.operands[0]


def linear_readers(v: Value) -> list[Node] | None:
    """The ``linear_pointwise`` nodes reading ``v`` as their input, directly or through
    reshapes keeping the last axis; None where anything else reads ``v`` or a reshape of it,
    or where one is a graph output."""
    if v.is_output or not v.has_uses or v.type.rank == 0:
        return None
    c = v.type.shape[-1]
    found: list[Node] = []
    for user in v.users:
        if user.op == LINEAR and user.operands[0] is v and all(o is not v for o in user.operands[1:]):
            found.append(user)
        elif user.op == "reshape" and user.results[0].type.rank and user.results[0].type.shape[-1] == c:
            sub = linear_readers(user.results[0])
            if sub is None:
                return None
            found += sub
        else:
            return None
    return found


def new_known(graph: Graph, like: Value, value: np.ndarray, anchor: Node, type_: TensorType | None = None) -> Value:
    """A new param ``<like's name>.scaled`` holding ``value`` (a constant before ``anchor``
    where ``like`` is not a graph input), of ``type_`` (default ``like``'s type)."""
    return known_input_like(graph, like, "scaled", value, anchor, type_)


def drop_if_unused(graph: Graph, v: Value) -> None:
    """Remove ``v`` (a graph input with its weight, or a dead node's result) once nothing reads it."""
    if v.has_uses or v.is_output:
        return
    if v.is_input:
        name = input_name(v)
        graph.remove_input(v)
        graph.weights.pop(name, None)
    elif v.producer is not None and v.producer.graph is graph:
        erase_if_dead(graph, v.producer)


def copy_allowed(v: Value, rewritten: list[Node]) -> bool:
    """Whether a scaled copy of the known ``v`` may be made: nothing but ``rewritten`` reads it
    (the old one goes), or it is small (``MAX_SHARED_COPY``)."""
    return (all(u in rewritten for u in v.users) and not v.is_output) or v.type.numel <= MAX_SHARED_COPY


def _weight(graph: Graph, node: Node, rewritten: list[Node]) -> tuple[np.ndarray, int, np.ndarray | None] | None:
    """(the layer's known 2-d weight, its output axis, its known bias or None) or None when
    the weight or a bias it has is unknown, or a large one is read by more than ``rewritten``."""
    w = known_value(graph, node.operands[1])
    if w is None or w.ndim != 2 or not copy_allowed(node.operands[1], rewritten):
        return None
    b = None
    if len(node.operands) > 2:
        b = known_value(graph, node.operands[2])
        if b is None or not copy_allowed(node.operands[2], rewritten):
            return None
    return w, (0 if node.attrs.get("weight_layout", "kn") == "nk" else 1), b


def _along(vec: np.ndarray, axis: int) -> np.ndarray:
    return vec.reshape((-1, 1) if axis == 0 else (1, -1))


def fold_output_scale(graph: Graph, mul: Node) -> bool:
    """``mul(layer(x), s)`` (through reshapes) into the layer's weight rows and bias."""
    found = scaled_operand(graph, mul)
    if found is None:
        return False
    x, s, vec = found
    node = producing_layer(x, mul)
    if node is not None and node.op == "embedding":
        return fold_into_table(graph, mul, node, x, s, vec)
    parts = None if node is None else _weight(graph, node, [node])
    if node is None or parts is None:
        return False
    w, out_axis, b = parts
    if w.shape[out_axis] != vec.size or (b is not None and b.shape != vec.shape):
        return False
    old = list(node.operands[1:])
    graph.set_operand(node, 1, new_known(graph, node.operands[1], (w * _along(vec, out_axis)).astype(w.dtype), node))
    if b is not None:
        graph.set_operand(node, 2, new_known(graph, node.operands[2], (b * vec).astype(b.dtype), node))
    graph.replace_all_uses(mul.results[0], x)
    graph.erase(mul)
    for v in dict.fromkeys([*old, s]):
        drop_if_unused(graph, v)
    return True


def fold_into_table(graph: Graph, mul: Node, emb: Node, x: Value, s: Value, vec: np.ndarray) -> bool:
    """``mul(embedding(T, ids), s)`` (through reshapes) into ``embedding(T * s, ids)`` (Gemma's
    embedding scale); the table is copied only as ``copy_allowed`` says."""
    table = emb.operands[0]
    t = known_value(graph, table)
    if t is None or t.ndim != 2 or t.shape[1] != vec.size or not copy_allowed(table, [emb]):
        return False
    graph.set_operand(emb, 0, new_known(graph, table, (t * vec.reshape(1, -1)).astype(t.dtype), emb))
    graph.replace_all_uses(mul.results[0], x)
    graph.erase(mul)
    for v in dict.fromkeys([table, s]):
        drop_if_unused(graph, v)
    return True


def fold_into_columns(graph: Graph, layers: list[Node], scale: np.ndarray, shift: np.ndarray | None) -> bool:
    """Each layer's input ``n`` becomes ``n * scale + shift`` inside it: the weight's input
    columns scaled, ``W shift`` added to the bias. False (nothing changed) where a layer's
    weight or bias is unknown or its width is not ``scale``'s."""
    parts = [_weight(graph, n, layers) for n in layers]
    if not layers or any(p is None or p[0].shape[1 - p[1]] != scale.size for p in parts):
        return False
    for node, p in zip(layers, parts):
        assert p is not None
        w, out_axis, b = p
        in_axis = 1 - out_axis
        old = list(node.operands[1:])
        ops = [node.operands[0], new_known(graph, node.operands[1], (w * _along(scale, in_axis)).astype(w.dtype), node)]
        if shift is not None and np.any(shift != 0.0):
            w64 = w.astype(np.float64)
            add = w64 @ shift if out_axis == 0 else shift @ w64
            total = add if b is None else b.astype(np.float64) + add
            btype = TensorType((w.shape[out_axis],), node.results[0].type.dtype)
            ops.append(new_known(graph, node.operands[2] if b is not None else node.operands[1],
                                 total.astype(w.dtype), node, btype))
        elif b is not None:
            ops.append(node.operands[2])
        new = Node(LINEAR, ops, dict(node.attrs), [node.results[0].type], node.loc)
        graph.insert_before(node, new)
        graph.replace_all_uses(node.results[0], new.results[0])
        graph.erase(node)
        for v in dict.fromkeys(old):
            drop_if_unused(graph, v)
    return True


def fold_input_scale(graph: Graph, mul: Node) -> bool:
    """``mul(x, s)`` read only by layers (through reshapes) into their weights' input columns."""
    found = scaled_operand(graph, mul)
    if found is None:
        return False
    x, s, vec = found
    layers = linear_readers(mul.results[0])
    if layers is None or not fold_into_columns(graph, layers, vec, None):
        return False
    graph.replace_all_uses(mul.results[0], x)
    graph.erase(mul)
    drop_if_unused(graph, s)
    return True


def fold_norm_affine(graph: Graph, norm: Node) -> bool:
    """A norm's weight (and bias) over the last axis into the layers that alone read its
    normalized result; the norm keeps none."""
    k = 2 if norm.op == "add_norm" else 1
    y = norm.results[0]
    if len(norm.operands) <= k or len(norm.attrs.get("axes", (-1,))) != 1 or not _float(y):
        return False
    affine = [known_value(graph, v) for v in norm.operands[k:]]
    c = y.type.shape[-1]
    if any(a is None or a.shape != (c,) for a in affine):
        return False
    gamma = np.asarray(affine[0], np.float64)
    shift = np.asarray(affine[1], np.float64) if len(affine) > 1 else None
    if not np.all(np.isfinite(gamma)) or (shift is not None and not np.all(np.isfinite(shift))):
        return False
    layers = linear_readers(y)
    if layers is None or not fold_into_columns(graph, layers, gamma, shift):
        return False
    old = list(norm.operands[k:])
    new = Node(norm.op, list(norm.operands[:k]), dict(norm.attrs), [r.type for r in norm.results], norm.loc)
    graph.insert_before(norm, new)
    for r, nr in zip(norm.results, new.results):
        graph.replace_all_uses(r, nr)
    graph.erase(norm)
    for v in dict.fromkeys(old):
        drop_if_unused(graph, v)
    return True
