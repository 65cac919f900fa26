"""Graph rewrites for inference: ``fold-params`` and ``fold-batch-norm``.

``fold-params``: a node with no effects whose operands are all known (params and state whose
values ``graph.weights`` holds, constants, or results folded before it), at least one of them a
param or state (or an ``iota``: values made from shapes alone, such as a causal mask), is
computed once, by its op's torch implementation (what the program would compute at every call),
and its results become new ``param`` inputs named ``<first param's name>.folded`` with their
values in ``graph.weights``. It is what torch's freezing does to an inference graph's
param-only subgraphs: a weight standardized at every call (BiT's convolutions), a weight
transposed or reshaped before its matmul, a bias scaled by a constant. A node is left when its
results are graph outputs, or when one of them holds more elements than its largest operand and
more than ``MAX_GROWTH`` (folding a bias broadcast to an activation's shape would store the
activation-sized copy). Like ``fold-batch-norm``, it assumes the params are the values
``graph.weights`` holds: a compiled inference program's. After folding, an ``index_select``
whose known index is ``0 .. n-1`` along its axis is dropped (its uses read its input).

``fold-batch-norm``: a ``batch_norm`` in inference mode (``training=false``: it normalizes with
its running statistics) whose input is a ``conv2d`` or ``conv3d`` read by nothing else becomes
part of that convolution. With ``s = gamma / sqrt(running_var + eps)``:

    conv(x, W, b) -> batch_norm   ==   conv(x, W * s[:, None, ...], (b - running_mean) * s + beta)

(``b`` is 0 for a convolution without a bias). It applies only where every value it reads is
known: params and state whose values ``graph.weights`` holds (by input name), and constants.
The new weight and bias are computed once, in float64, and stored in the convolution's dtype:

- for a convolution whose weight is a graph input, as new ``param`` inputs named
  ``<weight name>.bn_folded`` and ``<weight name>.bn_folded_bias`` with their values in
  ``graph.weights``;
- for a constant weight, as new ``constant`` nodes.

The batch_norm node goes. An input nothing reads any more (the old weight, the statistics) is
removed from the graph's inputs and from ``graph.weights``; one that something else still reads
stays. The folded graph computes the same function up to f32 rounding (about 1e-6 relative),
not bit for bit: the normalization's arithmetic moves into the convolution's sums.

It folds a ``batch_norm`` over a 2-d [M, C] value into a linear layer the same way (LeViT's
BatchNorm1d, inference only, every weight and statistic known):

- after the layer (``fold_into_matmul``): the value is a ``matmul``'s result, through an add of
  the layer's own known [C] bias and reshapes that keep C last, read by nothing else; the
  matmul's right operand is a known weight through transposes and leading broadcasts. The
  weight's output axis is scaled by ``s`` and an ``add`` of ``(b - mean) s + beta`` follows
  the matmul (``fuse-library`` takes it as the linear layer's bias);
- before the layer (``fold_into_next_matmul``): the value is read only as the left operand of
  a 2-d matmul with a known weight ``W`` [C, N] (through transposes): ``(x s + t) W`` is
  ``x (s W) + t W``, the weight's rows scaled and ``t W`` (plus the layer's own bias, when an
  add of it alone reads the matmul) added after it.
"""

from __future__ import annotations

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.graph import Graph, Node, Value, input_name
from ..ir.types import TensorType
from ..passes.manager import Pass, register_pass
from ..passes.rewrite import constant_array, erase_if_dead

__all__ = ["FoldBatchNorm", "FoldParams", "known_input_like", "fold_into_matmul", "fold_into_next_matmul", "known_value", "drop_identity_gathers", "MAX_GROWTH", "SHAPE_SOURCES"]

# Ops without operands whose results depend on their attributes alone (the counts a mask or a
# position index is built from): fold-params computes them, and what only they and params
# feed, once. (``full`` and splat constants stay: kernels read them as immediates.)
SHAPE_SOURCES = ("iota",)

# A folded node whose results hold more elements than its largest operand is kept only up to
# this many elements (a small table, not an activation-sized broadcast).
MAX_GROWTH = 4096

_CONVS = ("conv2d", "conv3d")


def known_value(graph: Graph, v: Value) -> np.ndarray | None:
    """The value ``v`` has at every call, when the graph knows it: a param or state input's
    array in ``graph.weights``, or a constant's. None otherwise (or when the stored array does
    not have ``v``'s type)."""
    if v.is_input:
        if v.role not in ("param", "state"):
            return None
        a = graph.weights.get(input_name(v))
    else:
        p = v.producer
        a = None if p is None else constant_array(p)
    if a is None:
        return None
    a = np.asarray(a)
    if a.shape != v.type.shape or a.dtype != v.type.dtype.np:
        return None
    return a


def _unique_input_name(graph: Graph, name: str) -> str:
    names = {input_name(v) for v in graph.inputs} | set(graph.weights)
    if name not in names:
        return name
    i = 1
    while f"{name}.{i}" in names:
        i += 1
    return f"{name}.{i}"


def _drop_if_unused(graph: Graph, v: Value) -> None:
    if v.has_uses:
        return
    if v.is_input:
        name = input_name(v)
        graph.remove_input(v)
        if name in graph.weights:
            del graph.weights[name]
    elif v.producer is not None and v.producer.graph is graph:
        erase_if_dead(graph, v.producer)


@register_pass
class FoldParams(Pass):
    """Nodes computed from params (and constants) alone are computed once; their results
    become params (see the module doc)."""

    name = "fold-params"

    def run(self, graph: Graph) -> Graph:
        from ..ops.registry import OPS
        from ..passes.rewrite import has_effects

        folded: dict[Value, np.ndarray] = {}
        outputs = set(graph.outputs)
        for node in list(graph.nodes):
            if node.graph is not graph or has_effects(node) or node.op not in OPS:
                continue
            if not node.operands and node.op not in SHAPE_SOURCES:
                continue
            if any(r in outputs for r in node.results):
                continue
            if node.operands and not any(v in folded or (v.is_input and v.role in ("param", "state"))
                                         for v in node.operands):
                continue
            maybe = [folded.get(v) if v in folded else known_value(graph, v) for v in node.operands]
            args = [a for a in maybe if a is not None]
            if len(args) != len(maybe):
                continue
            biggest = max((a.size for a in args), default=0)
            # per result: a fused node with two operand-sized results (BiT's sub and its square) is no growth
            if max((r.type.numel for r in node.results), default=0) > max(biggest, MAX_GROWTH):
                continue
            results = _compute(node, args)
            if results is None:
                continue
            base = next(input_name(v) for v in node.operands if v.is_input) if any(
                v.is_input for v in node.operands) else ("param" if node.operands else node.op)
            for r, a in zip(node.results, results):
                name = base if base.endswith(".folded") else f"{base}.folded"   # a chain: one suffix
                nv = graph.add_input(_unique_input_name(graph, name), r.type, "param")
                graph.weights[input_name(nv)] = a
                folded[nv] = a
                graph.replace_all_uses(r, nv)
            operands = list(node.operands)
            graph.erase(node)
            for v in dict.fromkeys(operands):
                _drop_if_unused(graph, v)
        drop_identity_gathers(graph, folded)
        return graph


def drop_identity_gathers(graph: Graph, folded: dict[Value, np.ndarray]) -> int:
    """An ``index_select`` whose index is known and counts 0, 1, ..., n - 1 along an axis of
    length n returns its input unchanged: its uses read the input (a causal mask gathered
    row by row through indices made from shapes). Returns how many went."""
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "index_select" or len(node.operands) != 2:
            continue
        x, idx, r = node.operands[0], node.operands[1], node.results[0]
        if r.is_output or r.type != x.type:
            continue
        a = folded.get(idx) if idx in folded else known_value(graph, idx)
        axis = node.attrs.get("axis", 0)
        n = x.type.shape[axis] if -len(x.type.shape) <= axis < len(x.type.shape) else None
        if a is None or n is None or a.shape != (n,) or not np.array_equal(a, np.arange(n)):
            continue
        graph.replace_all_uses(r, x)
        graph.erase(node)
        _drop_if_unused(graph, idx)
        count += 1
    return count


def _compute(node: Node, args: list[np.ndarray]) -> list[np.ndarray] | None:
    """``node``'s results on ``args`` by its op's torch implementation, as NumPy arrays of the
    results' types; None when it raises or gives another shape or dtype (left for run time)."""
    from ..backend.common import to_numpy
    from ..backend.torch_exec import to_tensor
    from ..ops._lazy import torch
    from ..ops.registry import OPS

    try:
        with torch.inference_mode():
            res = OPS[node.op].torch([to_tensor(np.ascontiguousarray(a)) for a in args], dict(node.attrs))
    except Exception:
        return None
    if not isinstance(res, (list, tuple)):
        res = (res,)
    out = []
    for r, t in zip(node.results, res):
        a = np.ascontiguousarray(to_numpy(t))
        if a.shape != r.type.shape or a.dtype != r.type.dtype.np:
            return None
        out.append(a)
    return out if len(out) == len(node.results) else None


@register_pass
class FoldBatchNorm(Pass):
    """batch_norm in inference mode after a convolution (read by nothing else), with every
    weight and statistic known, is folded into the convolution's weight and bias."""

    name = "fold-batch-norm"

    def run(self, graph: Graph) -> Graph:
        for bn in list(graph.nodes):
            if bn.graph is graph and bn.op == "batch_norm" and not bn.attrs["training"]:
                if not _fold(graph, bn) and not fold_into_matmul(graph, bn):
                    fold_into_next_matmul(graph, bn)
        return graph


def _fold(graph: Graph, bn: Node) -> bool:
    y = bn.operands[0]
    conv = y.producer
    if conv is None or conv.op not in _CONVS or len(conv.results) != 1:
        return False
    if y.is_output or len(y.users) != 1 or y.users.get(bn) != 1:
        return False  # the unnormalized result is read elsewhere
    dt = y.type.dtype
    if not dt.is_float or dt.storage:
        return False
    w = conv.operands[1]
    b = conv.operands[2] if len(conv.operands) > 2 else None
    stats = bn.operands[1:5]
    values: list[np.ndarray] = []
    for v in [w, *stats] + ([b] if b is not None else []):
        a = known_value(graph, v)
        if a is None:
            return False
        values.append(a.astype(np.float64))
    W, gamma, beta, mean, var = values[:5]
    B = values[5] if b is not None else np.zeros(W.shape[0])
    scale = gamma / np.sqrt(var + float(bn.attrs["eps"]))
    w_new = (W * scale.reshape((-1,) + (1,) * (W.ndim - 1))).astype(dt.np)
    b_new = ((B - mean) * scale + beta).astype(dt.np)
    btype = bn.operands[2].type  # [O], the convolution's dtype
    before: list[Node] = []
    if w.is_input:
        base = input_name(w)
        wv = graph.add_input(_unique_input_name(graph, f"{base}.bn_folded"), w.type, "param")
        graph.weights[input_name(wv)] = w_new
        bv = graph.add_input(_unique_input_name(graph, f"{base}.bn_folded_bias"), btype, "param")
        graph.weights[input_name(bv)] = b_new
    else:
        cw = Node("constant", [], {"value": DenseAttr(w_new)}, [w.type], conv.loc)
        cb = Node("constant", [], {"value": DenseAttr(b_new)}, [btype], bn.loc)
        before += [cw, cb]
        wv, bv = cw.results[0], cb.results[0]
    new = Node(conv.op, [conv.operands[0], wv, bv], dict(conv.attrs), [bn.results[0].type], conv.loc)
    for n in before:
        graph.insert_before(conv, n)
    graph.insert_before(conv, new)
    graph.replace_all_uses(bn.results[0], new.results[0])
    graph.erase(bn)
    graph.erase(conv)
    for v in dict.fromkeys([w, *stats] + ([b] if b is not None else [])):
        _drop_if_unused(graph, v)
    return True


def _bn_scale_shift(graph: Graph, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(gamma / sqrt(var + eps), beta - mean * scale) in float64, or None when a statistic is unknown."""
    if len(bn.operands) != 5:
        return None
    stats = [known_value(graph, v) for v in bn.operands[1:5]]
    if any(a is None for a in stats):
        return None
    gamma, beta, mean, var = (np.asarray(a, np.float64) for a in stats)
    scale = gamma / np.sqrt(var + float(bn.attrs["eps"]))
    return scale, beta - mean * scale


def _matmul_before(bn: Node) -> tuple[Node, list[Node]] | None:
    """The matmul whose 2-d result [M, C] the batch norm normalizes, through reshapes that keep
    the last axis (C), each value on the way read by the next alone; None if there is none."""
    v = bn.operands[0]
    c = v.type.shape[1]
    reshapes: list[Node] = []
    reader = bn
    while True:
        if v.is_output or len(v.users) != 1 or v.users.get(reader) != 1 or v.type.shape[-1] != c:
            return None
        p = v.producer
        if p is None or len(p.results) != 1:
            return None
        if p.op == "matmul":
            return p, reshapes
        if p.op == "add" and p.operands[0].producer is not None and p.operands[0].producer.op == "matmul":
            return p.operands[0].producer, reshapes + [p]  # the linear layer's own bias
        if p.op != "reshape":
            return None
        reshapes.append(p)
        reader, v = p, p.operands[0]


def _weight_source(graph: Graph, rhs: Value, axis: int) -> tuple[Value, int, list[Node]] | None:
    """(the known value the matmul's right operand is made of, its axis that becomes ``rhs``'s
    ``axis``, the transposes and leading broadcasts between them, last first), or None."""
    path: list[Node] = []
    u = rhs
    while known_value(graph, u) is None:
        p = u.producer
        if p is None or len(p.results) != 1:
            return None
        src = p.operands[0]
        if p.op == "transpose":
            axis = list(p.attrs["perm"])[axis]
        elif p.op == "broadcast_to":
            axis -= u.type.rank - src.type.rank
            if axis < 0 or src.type.shape[axis] != u.type.shape[axis + u.type.rank - src.type.rank]:
                return None  # the columns come from a broadcast itself
        else:
            return None
        path.append(p)
        u = src
    return u, axis, path


def known_input_like(graph: Graph, like: Value, name: str, value: np.ndarray, anchor: Node,
                      type_: "Value | TensorType | None" = None) -> Value:
    """A new param named after ``like`` (when it is an input) or a constant before ``anchor``,
    holding ``value`` with the type ``type_`` (a value's; default ``like``'s)."""
    t = type_ if isinstance(type_, TensorType) else (type_ or like).type
    if like.is_input:
        v = graph.add_input(_unique_input_name(graph, f"{input_name(like)}.{name}"), t, "param")
        graph.weights[input_name(v)] = value
        return v
    c = Node("constant", [], {"value": DenseAttr(value)}, [t], anchor.loc)
    graph.insert_before(anchor, c)
    return c.results[0]


def fold_into_matmul(graph: Graph, bn: Node) -> bool:
    """Fold an inference batch_norm over a 2-d [M, C] result of a matmul (BatchNorm1d after a
    Linear, through reshapes keeping C last) into the matmul's known weight and a bias add."""
    y = bn.operands[0]
    dt = y.type.dtype
    if y.type.rank != 2 or not dt.is_float or dt.storage:
        return False
    found = _matmul_before(bn)
    if found is None:
        return False
    mm, reshapes = found
    src = _weight_source(graph, mm.operands[1], mm.operands[1].type.rank - 1)
    ss = _bn_scale_shift(graph, bn)
    if src is None or ss is None:
        return False
    w, axis, path = src
    wv = known_value(graph, w)
    assert wv is not None
    if wv.dtype != dt.np or wv.shape[axis] != y.type.shape[1]:
        return False
    scale, shift = ss
    out = mm.results[0]
    old_add = reshapes[-1] if reshapes and reshapes[-1].op == "add" else None
    if old_add is not None:
        found_bias = _bias_add_after(graph, out)
        if found_bias[0] is not old_add or found_bias[1] is None:
            return False
        shift = shift + found_bias[1] * scale  # (b - mean) s + beta
        out = old_add.results[0]
    shape = [1] * wv.ndim
    shape[axis] = -1
    w_new = (wv.astype(np.float64) * scale.reshape(shape)).astype(dt.np)
    cur = _rebuild(graph, known_input_like(graph, w, "bn_folded", w_new, mm), path, mm)
    bias = known_input_like(graph, w, "bn_folded_bias", shift.astype(dt.np), mm, bn.operands[2])
    new = Node("matmul", [mm.operands[0], cur], dict(mm.attrs), [out.type], mm.loc)
    graph.insert_before(mm, new)
    add = Node("add", [new.results[0], bias], {}, [out.type], bn.loc)
    graph.insert_before(mm, add)
    graph.replace_all_uses(out, add.results[0])
    graph.replace_all_uses(bn.results[0], bn.operands[0])  # the add, or the last reshape
    dead = [mm.operands[1], w, *bn.operands[1:5]]
    graph.erase(bn)
    if old_add is not None:
        dead.append(old_add.operands[1])
        graph.erase(old_add)
    graph.erase(mm)
    for v in dict.fromkeys(dead):
        _drop_if_unused(graph, v)
    return True


def _rebuild(graph: Graph, start: Value, path: list[Node], anchor: Node) -> Value:
    """The nodes of ``path`` (last first) made again on ``start``, before ``anchor``."""
    cur = start
    for p in reversed(path):
        n = Node(p.op, [cur, *p.operands[1:]], dict(p.attrs), [p.results[0].type], p.loc)
        graph.insert_before(anchor, n)
        cur = n.results[0]
    return cur


def fold_into_next_matmul(graph: Graph, bn: Node) -> bool:
    """Fold an inference batch_norm over a 2-d [M, C] value read only as the left operand of a
    2-d matmul with a known weight (BatchNorm1d before a Linear) into the weight's rows and a
    bias add: ``(x s + t) W == x (s W) + t W``."""
    y = bn.results[0]
    dt = y.type.dtype
    if y.type.rank != 2 or not dt.is_float or dt.storage or y.is_output or len(y.users) != 1:
        return False
    mm = next(iter(y.users))
    if mm.op != "matmul" or mm.operands[0] is not y or mm.operands[1] is y or mm.results[0].type.rank != 2:
        return False
    rhs = mm.operands[1]
    src = _weight_source(graph, rhs, 0)
    ss = _bn_scale_shift(graph, bn)
    if src is None or ss is None or any(p.op != "transpose" for p in src[2]):
        return False
    w, axis, path = src
    wv = known_value(graph, w)
    assert wv is not None
    if wv.dtype != dt.np or wv.ndim != 2:
        return False
    scale, shift = ss
    shape = [1, 1]
    shape[axis] = -1
    w64 = wv.astype(np.float64)
    mat = w64 if axis == 0 else w64.T  # the right operand's value, [C, N]
    w_new = (w64 * scale.reshape(shape)).astype(dt.np)
    out = mm.results[0]
    btype = TensorType((out.type.shape[1],), dt)
    b_new = shift @ mat
    old_add, old_bias = _bias_add_after(graph, out)
    if old_add is not None and old_bias is not None:
        b_new = b_new + old_bias  # the linear layer's own bias joins the folded one
    cur = _rebuild(graph, known_input_like(graph, w, "bn_folded", w_new, mm), path, mm)
    bias = known_input_like(graph, w, "bn_folded_bias", b_new.astype(dt.np), mm, btype)
    new = Node("matmul", [bn.operands[0], cur], dict(mm.attrs), [out.type], mm.loc)
    graph.insert_before(mm, new)
    add = Node("add", [new.results[0], bias], {}, [out.type], bn.loc)
    graph.insert_before(mm, add)
    dead = [rhs, w, *bn.operands[1:5]]
    if old_add is not None:
        dead.append(old_add.operands[1])
        graph.replace_all_uses(old_add.results[0], add.results[0])
        graph.erase(old_add)
    graph.replace_all_uses(out, add.results[0])
    graph.erase(mm)
    graph.erase(bn)
    for v in dict.fromkeys(dead):
        _drop_if_unused(graph, v)
    return True


def _bias_add_after(graph: Graph, out: Value) -> tuple[Node | None, np.ndarray | None]:
    """The ``add(out, b)`` with a known [N] ``b`` that alone reads the matmul result ``out``,
    and ``b`` in float64; (None, None) if there is none."""
    if out.is_output or len(out.users) != 1:
        return None, None
    add = next(iter(out.users))
    if add.op != "add" or len(add.operands) != 2 or add.operands[0] is not out or add.operands[1] is out:
        return None, None
    b = known_value(graph, add.operands[1])
    if b is None or b.shape != (out.type.shape[-1],) or add.results[0].type != out.type:
        return None, None
    return add, b.astype(np.float64)
