"""Import an ATen-level FX graph (from AOTAutograd, ``make_fx``, ...) into a partita graph.

``import_fx(gm)`` converts a functional FX ``GraphModule`` whose ``call_function`` nodes are
ATen ops (the core ATen set left by ``decomposition_table()``) into a ``Graph``:

- every placeholder becomes an ``input`` in placeholder order, named as the placeholder;
  parameters and buffers lifted by AOTAutograd are plain inputs here (their values come with
  each call), so the graph has no weights;
- each ``call_function`` node is converted with the converters of ``torch_export``
  (``ATEN_TO_PARTITA``) plus ``FX_CONVERTERS``' additions for ops that appear in training
  graphs (AOTAutograd's backward ops and the random ops of dropout), with the same type
  check against the node's ``meta["val"]`` and the same source locations;
- random ops (``native_dropout`` in training mode, ``rand``, ``randn``, ``bernoulli``) do not
  become partita ops: their random tensor, which depends only on a shape, becomes one more
  graph input after the placeholders, described by a ``RandomInput`` that the caller draws
  with torch's generator for every run (``FxImport.draw_random``);
- the output node's entries become the graph's outputs; ``None`` entries (AOTAutograd's
  backward returns one for an input that needs no gradient) are kept in ``FxImport.layout``.

Ops without a converter, or cases a converter cannot express, are collected and reported in
one ``UnsupportedGraph`` error (a ``FrontendError``) listing each use with its source line.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..ir.dtypes import bool_, f32, i32, i64
from ..ir.graph import Graph, Value
from ..ir.types import Location, TensorType
from . import FrontendError
from .torch_export import ATEN_TO_PARTITA, AtenConverter, Conv, Unsupported, convert_call, tensor_type_of, wrap_dim
from .torch_export import emit_concat, emit_layer_norm, ntuple, repeat_kv
from .torch_export import decomposition_table as _export_decompositions, linearize_index
from .fx_interpolate import INTERPOLATE_OP, convert_interpolate

aten = torch.ops.aten

__all__ = ["import_fx", "FxImport", "RandomInput", "UnsupportedGraph", "FX_CONVERTERS", "converters_for",
           "decomposition_table"]


class UnsupportedGraph(FrontendError):
    """An FX graph with ops partita cannot convert; ``problems`` lists (op, location, why)."""

    def __init__(self, message: str, problems: list[tuple[str, Location | None, str]]) -> None:
        super().__init__(message)
        self.problems = problems
        self.ops = tuple(sorted({p[0] for p in problems}))


@dataclass(frozen=True)
class RandomInput:
    """A random tensor a graph reads as an input, drawn with torch's generator on every run.

    ``kind`` is ``"bernoulli"`` (True, or 1, with probability ``p``), ``"rand"`` (uniform on
    [0, 1)) or ``"randn"`` (standard normal)."""

    kind: str
    shape: tuple[int, ...]
    dtype: Any  # a torch.dtype
    p: float = 0.5

    def draw(self) -> Any:
        if self.kind == "bernoulli":
            return torch.empty(self.shape, dtype=self.dtype).bernoulli_(self.p)
        if self.kind == "rand":
            return torch.rand(self.shape, dtype=self.dtype)
        return torch.randn(self.shape, dtype=self.dtype)


@dataclass
class FxImport:
    """The result of ``import_fx``.

    ``graph`` takes the FX graph's placeholders in order, then one input per entry of
    ``random`` (draw them with ``draw_random``). ``layout`` has one entry per element of the FX
    graph's output: the index of the graph output holding it, or None where the FX graph
    returns None. ``output_list`` says whether the FX graph returns a list (else a tuple)."""

    graph: Graph
    layout: list[int | None]
    random: list[RandomInput] = field(default_factory=list)
    output_list: bool = False
    # Per graph output, the FX node it is a view of (through view ops only; the node itself
    # otherwise) and whether that node is a placeholder. partita may return an operand as a
    # result where FX copies (clone, a no-op cast or reshape): a caller that needs the FX
    # graph's aliasing copies an output sharing memory with an input, or with an output of
    # another root, unless its root is a placeholder.
    roots: list[tuple[str, bool]] = field(default_factory=list)

    def draw_random(self) -> list:
        return [r.draw() for r in self.random]


class _FxConverter(AtenConverter):
    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.random: list[RandomInput] = []

    def random_input(self, spec: RandomInput, dtype: Any) -> Value:
        """A new graph input that the caller fills with ``spec.draw()`` on every run."""
        self.random.append(spec)
        return self.b.input(f"{self.node.name}_random", TensorType(spec.shape, dtype), "input")


def decomposition_table() -> Any:
    """The decompositions for AOTAutograd: ``torch_export``'s table (core ATen without the ops
    partita converts whole), without ``_scaled_dot_product_flash_attention_for_cpu`` as well.
    Its backward has no decomposition and stays whole in training graphs anyway; converting
    both to partita's ``attention`` and ``attention_grad`` runs the kernels eager runs."""
    table = _export_decompositions()
    for op in _KEEP_WHOLE:
        table.pop(op, None)
    return table


_KEEP_WHOLE = (aten._scaled_dot_product_flash_attention_for_cpu.default,)


# --- converters for ops of training graphs ------------------------------------------------------

def _native_dropout(cx: _FxConverter, x: Value, p: float, train: bool | None) -> tuple:
    t = x.type
    if not train or p == 0:
        return (x, cx.emit("full", shape=t.shape, value=True, dtype=bool_))
    if not t.dtype.is_float:
        raise Unsupported(f"dropout of a {t.dtype} tensor")
    if p >= 1:
        zero = cx.emit("full", shape=t.shape, value=0.0, dtype=t.dtype)
        return (zero, cx.emit("full", shape=t.shape, value=False, dtype=bool_))
    keep = cx.random_input(RandomInput("bernoulli", t.shape, torch.bool, 1.0 - p), bool_)
    # As ATen: x * mask * (1 / (1 - p)).
    y = cx.emit("mul", x, cx.emit("cast", keep, dtype=t.dtype))
    return (cx.emit("mul", y, cx.scalar(1.0 / (1.0 - p), t.dtype)), keep)


def _random(kind: str) -> Conv:
    def conv(cx: _FxConverter, *args: Any, generator: Any = None, **kwargs: Any) -> Value:
        if generator is not None:
            raise Unsupported(f"{kind} with an explicit generator")
        t = cx.out_type()
        if not t.dtype.is_float:
            raise Unsupported(f"{kind} of dtype {t.dtype}")
        return cx.random_input(RandomInput(kind, t.shape, cx.node.meta["val"].dtype), t.dtype)
    return conv


def _bernoulli_p(cx: _FxConverter, x: Value, p: float = 0.5, generator: Any = None) -> Value:
    if generator is not None:
        raise Unsupported("bernoulli with an explicit generator")
    t = cx.out_type()
    return cx.random_input(RandomInput("bernoulli", t.shape, cx.node.meta["val"].dtype, float(p)), t.dtype)


def _any_all(op: str) -> Conv:
    def conv(cx: _FxConverter, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
        if not x.type.dtype.is_bool:
            x = cx.emit("not_equal", x, cx.scalar(0, x.type.dtype))
        if dim is None or (not isinstance(dim, int) and len(dim) == 0):
            axes = None
        else:
            dims = [dim] if isinstance(dim, int) else list(dim)
            axes = tuple(sorted({wrap_dim(d, x.type.rank) for d in dims}))
        if x.type.rank == 0:
            return x
        return cx.emit(op, x, axes=axes, keepdim=keepdim)
    return conv


def _max_min_dim(op: str) -> Conv:
    def conv(cx: _FxConverter, x: Value, dim: int, keepdim: bool = False) -> tuple:
        axes = (wrap_dim(dim, x.type.rank),)
        # partita's argmax/argmin take no bool tensor; torch's max/min do.
        xi = cx.emit("cast", x, dtype=i32) if x.type.dtype.is_bool else x
        return (cx.emit(op, x, axes=axes, keepdim=keepdim), cx.emit(f"arg{op}", xi, axes=axes, keepdim=keepdim))
    return conv


def _bitwise_not(cx: _FxConverter, x: Value) -> Value:
    dt = x.type.dtype
    if dt.is_bool:
        return cx.emit("logical_not", x)
    if dt.is_int and dt.name.startswith("i"):
        # Two's complement: ~x == -x - 1.
        return cx.emit("sub", cx.emit("neg", x), cx.scalar(1, dt))
    raise Unsupported(f"bitwise_not of {dt}")


def _linear_index(cx: _FxConverter, x: Value, indices: Sequence[Value | None], op: str) -> tuple[Value, int]:
    """The index tensors on x's leading dims as one i64 index into x flattened over them."""
    if not indices or any(i is None for i in indices):
        raise Unsupported(f"{op}: index tensors must cover the leading dims (no slices between them)")
    if any(not i.type.dtype.is_int for i in indices if i is not None):
        raise Unsupported(f"{op}: boolean-mask indices are not supported")
    k = len(indices)
    return linearize_index(cx, [i for i in indices if i is not None], x.type.shape[:k]), k


def _index_put(cx: _FxConverter, x: Value, indices: Sequence[Value | None], values: Value,
               accumulate: bool = False) -> Value:
    """x[..., i0, i1, ...] = values, or += with accumulate (the gradient of indexing and of
    embedding, and of ``F.fold``'s im2col). A boolean mask takes ``_index_put_mask``; integer
    indices on the leading dims with accumulate take ``index_add`` over x flattened across the
    indexed dims; any other form (an assignment, or full slices before the indices) the
    torch.export converter, one scatter_elements over the indexed dims."""
    present = [i for i in indices if i is not None]
    if any(i.type.dtype.is_bool for i in present):
        return _index_put_mask(cx, x, indices, values, accumulate)
    if not accumulate or not indices or any(i is None for i in indices):
        return ATEN_TO_PARTITA[aten.index_put.default](cx, x, indices, values, accumulate)
    linear, k = _linear_index(cx, x, indices, "aten.index_put.default")
    rest = x.type.shape[k:]
    batch = linear.type.shape
    if values.type.dtype != x.type.dtype:
        values = cx.emit("cast", values, dtype=x.type.dtype)
    if values.type.shape != batch + rest:
        values = cx.emit("broadcast_to", values, shape=batch + rest)
    n = math.prod(batch)
    flat_x = cx.emit("reshape", x, shape=(-1,) + rest) if k != 1 else x
    flat_src = cx.emit("reshape", values, shape=(n,) + rest) if len(batch) != 1 else values
    flat_idx = cx.emit("reshape", linear, shape=(n,)) if len(batch) != 1 else linear
    y = cx.emit("index_add", flat_x, flat_idx, flat_src, axis=0)
    return cx.emit("reshape", y, shape=x.type.shape) if k != 1 else y


def _index_put_mask(cx: _FxConverter, x: Value, indices: Sequence[Value | None], values: Value,
                    accumulate: bool) -> Value:
    """x[..., mask] = values (or +=) with one boolean mask over adjacent dims of x: where the
    mask holds, the value (or x plus it), else x. The values must be the same for every
    selected position (broadcast along the selection); one value per selected position has a
    count only known at run time, which a static graph cannot take."""
    lead = 0
    while lead < len(indices) and indices[lead] is None:
        lead += 1
    mask = indices[lead]
    if mask is None or not mask.type.dtype.is_bool or any(i is not None for i in indices[lead + 1:]):
        raise Unsupported("aten.index_put.default: a boolean mask mixed with other index tensors is not supported")
    m, rank = mask.type.rank, x.type.rank
    shape = x.type.shape
    if tuple(mask.type.shape) != tuple(shape[lead:lead + m]):
        raise Unsupported(f"aten.index_put.default: mask {mask.type} does not match dims {lead}.."
                          f"{lead + m - 1} of {x.type}")
    # Values broadcast to [lead dims, count, rest dims]: the count dim must be absent or 1.
    vshape = tuple(values.type.shape)
    after = rank - lead - m
    if len(vshape) > after:
        count_at = len(vshape) - after - 1
        if vshape[count_at] != 1:
            raise Unsupported(f"aten.index_put.default: values {values.type} give each position the mask "
                              "selects its own value; their number depends on the data (only values shared "
                              "by all selected positions are supported)")
        lead_v, rest_v = vshape[:count_at], vshape[count_at + 1:]
        values = cx.emit("reshape", values, shape=lead_v + (1,) * m + rest_v)
    if values.type.dtype != x.type.dtype:
        values = cx.emit("cast", values, dtype=x.type.dtype)
    keep = cx.emit("reshape", mask, shape=(1,) * lead + tuple(mask.type.shape) + (1,) * after)
    if accumulate:
        values = cx.emit("add", x, values)
    if values.type.shape != shape:
        values = cx.emit("broadcast_to", values, shape=shape)
    return cx.emit("where", keep, values, x)


def _group_mask(cx: _FxConverter, offs: Value, rows: int) -> Value:
    """[E, S, 1] bool: row s belongs to group e, offs[e-1] <= s < offs[e] (offs[-1] read as 0):
    the groups of a grouped matmul, whose ``offs`` are the cumulative row counts."""
    e = offs.type.shape[0]
    ends = offs if offs.type.dtype == i64 else cx.emit("cast", offs, dtype=i64)
    zero = cx.emit("full", shape=(1,), value=0, dtype=i64)
    starts = cx.emit("concat", zero, cx.emit("slice", ends, axis=0, start=0, end=e - 1), axis=0) if e > 1 else zero
    row = cx.emit("iota", shape=(1, rows, 1), axis=1, dtype=i64)
    after_start = cx.emit("less_equal", cx.emit("reshape", starts, shape=(e, 1, 1)), row)
    before_end = cx.emit("less", row, cx.emit("reshape", ends, shape=(e, 1, 1)))
    return cx.emit("logical_and", after_start, before_end)


def _pick_group(cx: _FxConverter, mask: Value, per_group: Value) -> Value:
    """Each row of ``per_group`` ([E, S, N]: every group's result for every row) from its own
    group: exact, the other groups' entries are dropped by ``where``, not multiplied by 0."""
    zero = cx.scalar(0.0, per_group.type.dtype)
    return cx.emit("sum", cx.emit("where", mask, per_group, zero), axes=(0,), keepdim=False)


def _check_grouped(x: Value, w: Value, offs: Value, op: str) -> None:
    if x.type.rank != 2 or w.type.rank != 3 or offs.type.rank != 1 or offs.type.shape[0] != w.type.shape[0]:
        raise Unsupported(f"{op}: takes input [S, D], weight [E, D, O] and offs [E]; got {x.type}, {w.type}, "
                          f"{offs.type}")
    if not x.type.dtype.is_float or x.type.dtype != w.type.dtype:
        raise Unsupported(f"{op}: input {x.type} and weight {w.type} must share one float dtype")


def _grouped_mm(cx: _FxConverter, x: Value, w: Value, offs: Value | None = None, bias: Value | None = None,
                out_dtype: Any = None) -> Value:
    """A grouped matmul: rows offs[e-1]:offs[e] of x ([S, D]) times w[e] ([E, D, O]); rows after
    the last group are 0 (transformers' ``grouped_mm_fallback``, and ``aten._grouped_mm`` of a
    2-D input and 3-D weight). Without a loop: every group's product for every row, one
    batched matmul [E, S, O], from which each row keeps its own group's (``_pick_group``)."""
    if offs is None or bias is not None or (out_dtype is not None and out_dtype != cx.node.meta["val"].dtype):
        raise Unsupported("a grouped matmul without offs, with a bias or with another out_dtype")
    _check_grouped(x, w, offs, "grouped matmul")
    mask = _group_mask(cx, offs, x.type.shape[0])
    return _pick_group(cx, mask, cx.emit("matmul", x, w))


def _grouped_mm_backward(cx: _FxConverter, x: Value, w: Value, offs: Value, dy: Value) -> tuple:
    """The gradients of ``_grouped_mm`` (transformers' ``grouped_mm_fallback_backward``):
    dx[s] = dy[s] w[e]^T for row s of group e, dw[e] = x[group e]^T dy[group e]."""
    _check_grouped(x, w, offs, "grouped matmul backward")
    mask = _group_mask(cx, offs, x.type.shape[0])
    dx = _pick_group(cx, mask, cx.emit("matmul", dy, cx.emit("transpose", w, perm=(0, 2, 1))))
    zero = cx.scalar(0.0, x.type.dtype)
    rows = cx.emit("where", mask, cx.emit("broadcast_to", x, shape=(w.type.shape[0],) + x.type.shape), zero)
    dw = cx.emit("matmul", cx.emit("transpose", rows, perm=(0, 2, 1)), dy)
    return (dx, dw)


# Converters of custom ops, by qualified name: the op exists only once its library registered it.
_CUSTOM_OPS: dict[str, Conv] = {
    "transformers::grouped_mm_fallback": _grouped_mm,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_backward,
    INTERPOLATE_OP: convert_interpolate,
}


def converters_for(nodes: Sequence[Any]) -> dict[Any, Conv]:
    """``FX_CONVERTERS`` plus the converters of the custom ops (``_CUSTOM_OPS``) the nodes call."""
    extra: dict[Any, Conv] = {}
    for node in nodes:
        name = getattr(getattr(node.target, "_schema", None), "name", None) if node.op == "call_function" else None
        if name in _CUSTOM_OPS:
            extra[node.target] = _CUSTOM_OPS[name]
    return {**FX_CONVERTERS, **extra} if extra else FX_CONVERTERS


def _constant_pad_nd(cx: _FxConverter, x: Value, pad: Sequence[int], value: Any = 0) -> Value:
    """torch's constant pad, whose negative entries crop (``F.fold`` with padding crops its
    padded image so): the cropped ends become slices, the rest the torch.export converter."""
    if all(p >= 0 for p in pad):
        return ATEN_TO_PARTITA[aten.constant_pad_nd.default](cx, x, pad, value)
    for i in range(len(pad) // 2):
        d = x.type.rank - 1 - i
        lo, hi = -min(pad[2 * i], 0), -min(pad[2 * i + 1], 0)
        if lo or hi:
            x = cx.emit("slice", x, axis=d, start=lo, end=x.type.shape[d] - hi)
    return ATEN_TO_PARTITA[aten.constant_pad_nd.default](cx, x, [max(p, 0) for p in pad], value)


def _scatter_value(cx: _FxConverter, x: Value, dim: int, index: Value, value: Any, reduce: Any = None) -> Value:
    """x with ``value`` written where ``index`` points along ``dim``: a count of the hits by
    ``scatter_add`` selects between value and x (exact, repeated indices included)."""
    if reduce is not None:
        raise Unsupported(f"aten.scatter.value with reduce={reduce!r}")
    axis = wrap_dim(dim, x.type.rank)
    zeros = cx.emit("full", shape=x.type.shape, value=0.0, dtype=f32)
    ones = cx.emit("full", shape=index.type.shape, value=1.0, dtype=f32)
    hits = cx.emit("scatter_add", zeros, index, ones, axis=axis)
    hit = cx.emit("greater", hits, cx.scalar(0.0, f32))
    return cx.emit("where", hit, cx.scalar(value, x.type.dtype), x)


def _scatter_add(cx: _FxConverter, x: Value, dim: int, index: Value, src: Value) -> Value:
    return cx.emit("scatter_add", x, index, src, axis=wrap_dim(dim, x.type.rank))


def _index_add(cx: _FxConverter, x: Value, dim: int, index: Value, src: Value, alpha: Any = 1) -> Value:
    if alpha != 1:
        src = cx.emit("mul", src, cx.scalar(alpha, src.type.dtype))
    return cx.emit("index_add", x, index, src, axis=wrap_dim(dim, x.type.rank))


def _flash_attention(cx: _FxConverter, q: Value, k: Value, v: Value, dropout_p: float = 0.0,
                     is_causal: bool = False, *, attn_mask: Value | None = None, scale: float | None = None) -> tuple:
    """The CPU flash attention as ``attention`` (out and logsumexp). Grouped-query attention
    (``enable_gqa``: fewer key/value heads than query heads) repeats each key/value head for
    its group of query heads first, as the torch.export path does."""
    if dropout_p:
        raise Unsupported("attention with dropout_p > 0")
    k, v = _grouped(cx, q, k), _grouped(cx, q, v)
    operands = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    out, lse = cx.emit("attention", *operands, scale=scale, causal=bool(is_causal))
    return (out, lse)


def _grouped(cx: _FxConverter, q: Value, kv: Value) -> Value:
    """``kv`` with its heads repeated to q's (grouped-query attention), or as it is."""
    heads, kv_heads = q.type.shape[-3], kv.type.shape[-3]
    if kv.type.rank < 3 or heads == kv_heads:
        return kv
    if kv_heads == 0 or heads % kv_heads:
        raise Unsupported(f"attention with {heads} query heads and {kv_heads} key/value heads: grouped-query "
                          "attention needs the query heads to be a multiple of the key/value heads")
    return repeat_kv(cx, kv, heads)


def _ungrouped(cx: _FxConverter, grad: Value, kv: Value) -> Value:
    """The gradient of a repeated key/value (``_grouped``) summed back over each group of
    query heads, to ``kv``'s shape."""
    if grad.type.shape == kv.type.shape:
        return grad
    *lead, heads, sl, e = grad.type.shape
    kv_heads = kv.type.shape[-3]
    g = cx.emit("reshape", grad, shape=(*lead, kv_heads, heads // kv_heads, sl, e))
    return cx.emit("sum", g, axes=(len(lead) + 1,), keepdim=False)


def _flash_attention_backward(cx: _FxConverter, dout: Value, q: Value, k: Value, v: Value, out: Value, lse: Value,
                              dropout_p: float, is_causal: bool, *, attn_mask: Value | None = None,
                              scale: float | None = None) -> tuple:
    """``attention_grad``: dq, dk, dv; with grouped key/value heads the gradients of the
    repeated heads are summed back over each group."""
    if dropout_p:
        raise Unsupported("attention backward with dropout_p > 0")
    kr, vr = _grouped(cx, q, k), _grouped(cx, q, v)
    operands = [dout, q, kr, vr, out, lse] + ([attn_mask] if attn_mask is not None else [])
    dq, dk, dv = cx.emit("attention_grad", *operands, scale=scale, causal=bool(is_causal))
    return (dq, _ungrouped(cx, dk, k), _ungrouped(cx, dv, v))


def _cat(cx: _FxConverter, tensors: Sequence[Value], dim: int = 0) -> Value:
    """torch.cat, which skips 1-d empty operands whatever the others' rank (a legacy rule that
    code growing a tensor from ``torch.tensor([])`` relies on, as a key/value cache does)."""
    kept = [t for t in tensors if t.type.shape != (0,)] or list(tensors[:1])
    if len(kept) == 1:
        return kept[0]
    return emit_concat(cx, kept, dim)


def _native_layer_norm(cx: _FxConverter, x: Value, normalized_shape: Sequence[int], w: Value | None,
                       b: Value | None, eps: float) -> tuple:
    """layer_norm, and its mean and 1/std over the normalized dims (kept, as ATen returns them):
    a forward graph returns them for the backward's decomposition. Unused, dce drops them."""
    y = emit_layer_norm(cx, x, normalized_shape, w, b, eps)[0]
    k = len(normalized_shape)
    axes = tuple(range(x.type.rank - k, x.type.rank))
    stat_dtype = cx.out_type(1).dtype
    xs = x if x.type.dtype == stat_dtype else cx.emit("cast", x, dtype=stat_dtype)
    mean = cx.emit("mean", xs, axes=axes, keepdim=True)
    d = cx.emit("sub", xs, mean)
    var = cx.emit("mean", cx.emit("mul", d, d), axes=axes, keepdim=True)
    rstd = cx.emit("rsqrt", cx.emit("add", var, cx.scalar(eps, stat_dtype)))
    return (y, mean, rstd)


def _batch_norm_functional(cx: _FxConverter, x: Value, w: Value | None, b: Value | None, running_mean: Value,
                           running_var: Value, training: bool, momentum: float, eps: float) -> tuple:
    """Training-mode batch norm as AOTAutograd functionalizes it: y, the batch mean and 1/std
    (which the backward's decomposition reads) and the new running statistics."""
    if not training:
        y = cx.emit("batch_norm", x, *_affine(cx, x, w, b), running_mean, running_var, eps=float(eps))
        c = x.type.shape[1]
        return (y, cx.emit("full", shape=(c,), value=0.0, dtype=x.type.dtype),
                cx.emit("full", shape=(c,), value=0.0, dtype=x.type.dtype), running_mean, running_var)
    y, rm, rv = cx.emit("batch_norm", x, *_affine(cx, x, w, b), running_mean, running_var, eps=float(eps),
                        momentum=float(momentum), training=True)
    axes = (0,) + tuple(range(2, x.type.rank))
    mean = cx.emit("mean", x, axes=axes, keepdim=True)
    d = cx.emit("sub", x, mean)
    var = cx.emit("mean", cx.emit("mul", d, d), axes=axes)
    invstd = cx.emit("rsqrt", cx.emit("add", var, cx.scalar(eps, x.type.dtype)))
    return (y, cx.emit("reshape", mean, shape=(x.type.shape[1],)), invstd, rm, rv)


def _affine(cx: _FxConverter, x: Value, w: Value | None, b: Value | None) -> tuple[Value, Value]:
    c = x.type.shape[1]
    w = w if w is not None else cx.emit("full", shape=(c,), value=1.0, dtype=x.type.dtype)
    b = b if b is not None else cx.emit("full", shape=(c,), value=0.0, dtype=x.type.dtype)
    return w, b


def _convolution_backward(cx: _FxConverter, dy: Value, x: Value, w: Value, bias_sizes: Any, stride: Sequence[int],
                          padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                          output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]) -> tuple:
    if transposed:
        raise Unsupported("the gradient of a transposed convolution")
    nd = x.type.rank - 2
    mask = tuple(int(bool(m)) for m in output_mask)
    dx, dw, db = cx.emit("conv2d_grad", dy, x, w, stride=ntuple(stride, nd), padding=ntuple(padding, nd),
                         dilation=ntuple(dilation, nd), groups=groups, mask=mask)
    return (dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None)


def _max_pool_backward(cx: _FxConverter, dy: Value, x: Value, kernel: Sequence[int], stride: Sequence[int],
                       padding: Any, dilation: Any, ceil_mode: bool, indices: Value) -> Value:
    nd = x.type.rank - 2
    return cx.emit("max_pool2d_grad", dy, x, indices, kernel=ntuple(kernel, nd),
                   stride=ntuple(stride, nd) if len(stride) else None, padding=ntuple(padding, nd),
                   dilation=ntuple(dilation, nd), ceil_mode=ceil_mode)


def _avg_pool_backward(cx: _FxConverter, dy: Value, x: Value, kernel: Sequence[int], stride: Sequence[int],
                       padding: Any, ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> Value:
    if divisor_override is not None:
        raise Unsupported("avg_pool backward with divisor_override")
    nd = x.type.rank - 2
    return cx.emit("avg_pool2d_grad", dy, x, kernel=ntuple(kernel, nd),
                   stride=ntuple(stride, nd) if len(stride) else None, padding=ntuple(padding, nd),
                   ceil_mode=ceil_mode, count_include_pad=count_include_pad)


def _detach(cx: _FxConverter, x: Value) -> Value:
    return x


def _copy(cx: _FxConverter, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    # The functional aten.copy: src's values in dst's dtype and shape.
    if src.type.dtype != dst.type.dtype:
        src = cx.emit("cast", src, dtype=dst.type.dtype)
    return src if src.type.shape == dst.type.shape else cx.emit("broadcast_to", src, shape=dst.type.shape)


# ATen ops partita converts in FX graphs beyond torch_export's table: what AOTAutograd's
# functionalized training graphs add (backward decompositions, dropout).
_FX_ONLY: dict[Any, Conv] = {
    aten.native_dropout.default: _native_dropout,
    aten.rand.default: _random("rand"),
    aten.randn.default: _random("randn"),
    aten.rand_like.default: _random("rand"),
    aten.randn_like.default: _random("randn"),
    aten.bernoulli.p: _bernoulli_p,
    aten.any.dim: _any_all("max"),
    aten.any.dims: _any_all("max"),
    aten.any.default: _any_all("max"),
    aten.all.dim: _any_all("min"),
    aten.all.default: _any_all("min"),
    aten.max.dim: _max_min_dim("max"),
    aten.min.dim: _max_min_dim("min"),
    aten.bitwise_not.default: _bitwise_not,
    aten.index_put.default: _index_put,
    aten.scatter.value: _scatter_value,
    aten.scatter_add.default: _scatter_add,
    aten.index_add.default: _index_add,
    aten._grouped_mm.default: _grouped_mm,
    aten.constant_pad_nd.default: _constant_pad_nd,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _flash_attention_backward,
    aten.cat.default: _cat,
    aten.native_layer_norm.default: _native_layer_norm,
    aten._native_batch_norm_legit_functional.default: _batch_norm_functional,
    aten.convolution_backward.default: _convolution_backward,
    aten.max_pool2d_with_indices_backward.default: _max_pool_backward,
    aten.max_pool3d_with_indices_backward.default: _max_pool_backward,
    aten.avg_pool2d_backward.default: _avg_pool_backward,
    aten.avg_pool3d_backward.default: _avg_pool_backward,
    aten.detach.default: _detach,
    aten.copy.default: _copy,
}

FX_CONVERTERS: dict[Any, Conv] = {**ATEN_TO_PARTITA, **_FX_ONLY}


# --- the walk ----------------------------------------------------------------------------------

def import_fx(gm: Any, *, name: str = "fx_graph") -> FxImport:
    """Convert the ATen-level FX GraphModule ``gm`` to a partita graph (see the module doc).

    Raises ``UnsupportedGraph`` listing every op use partita cannot convert, with its source
    line, and ``FrontendError`` for a graph it cannot take at all (symbolic shapes, non-tensor
    inputs or outputs)."""
    from ..backend.torch_exec import to_numpy
    from ..ir.attrs import DenseAttr

    graph = Graph(name)
    cx = _FxConverter(graph)
    nodes = list(gm.graph.nodes)
    # Placeholders first, so that the random inputs made during the walk come after them.
    for node in nodes:
        if node.op != "placeholder":
            continue
        cx.node = node
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            what = "no recorded value" if val is None else f"a {type(val).__name__} ({val!r})"
            raise FrontendError(f"input '{node.name}' of the FX graph is {what}, not a tensor; partita compiles "
                                "graphs of tensors with static shapes (compile with dynamic=False)")
        cx.env[node] = cx.b.input(node.name, tensor_type_of(val, node), "input")
    table = converters_for(nodes)
    layout: list[int | None] = []
    roots: list[tuple[str, bool]] = []
    output_list = False
    for node in nodes:
        cx.node = node
        if node.op == "placeholder":
            continue
        if node.op == "call_function":
            convert_call(cx, node, table)
        elif node.op == "get_attr":
            value = _attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise FrontendError(f"FX node '{node.name}' reads attribute '{node.target}', a "
                                    f"{type(value).__name__}; partita takes tensor constants only")
            cx.env[node] = cx.b.emit("constant", value=DenseAttr(to_numpy(value.detach())))
        elif node.op == "output":
            if cx.problems:
                raise UnsupportedGraph(_unsupported_message(name, cx.problems), cx.problems)
            result = node.args[0]
            output_list = isinstance(result, list)
            entries = list(result) if isinstance(result, (list, tuple)) else [result]
            outs: list[Value] = []
            for i, a in enumerate(entries):
                if a is None:
                    layout.append(None)
                    continue
                out = cx.env.get(a) if isinstance(a, torch.fx.Node) else None
                if not isinstance(out, Value):
                    raise FrontendError(f"output {i} of the FX graph is {a!r}, not a tensor; partita graphs "
                                        "return tensors only")
                layout.append(len(outs))
                outs.append(out)
                root = _view_root(a)
                roots.append((root.name, root.op == "placeholder"))
            cx.b.loc = None
            cx.b.ret(*outs)
        else:
            raise FrontendError(f"FX node '{node.name}' has kind '{node.op}', which the FX importer does not handle "
                                "(it takes ATen-level graphs: call_function, get_attr, placeholder, output)")
    return FxImport(graph, layout, cx.random, output_list, roots)


# ATen ops whose result is a view of their first operand (in a functionalized graph).
_VIEW_OPS = frozenset({
    aten.view.default, aten.permute.default, aten.expand.default, aten.slice.Tensor, aten.select.int,
    aten.unsqueeze.default, aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default, aten.alias.default,
    aten.t.default, aten.transpose.int, aten.as_strided.default, aten.diagonal.default, aten.unfold.default,
})
_MULTI_VIEW_OPS = frozenset({aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int, aten.chunk.default})


def _view_root(node: Any) -> Any:
    """The FX node whose memory ``node`` views (``node`` itself when it is no view)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target in _VIEW_OPS:
            node = node.args[0]
        elif node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
                and node.args[0].target in _MULTI_VIEW_OPS:
            node = node.args[0].args[0]
        else:
            break
    return node


def _attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _unsupported_message(name: str, problems: list[tuple[str, Location | None, str]]) -> str:
    ops = sorted({p[0] for p in problems})
    lines = [f"cannot convert {name}: {len(problems)} unsupported op use(s) of {len(ops)} op(s) "
             f"({', '.join(ops)}):"]
    for op, loc, why in problems:
        where = str(loc) if loc else "<unknown location>"
        lines.append(f"  {where}: {op}" + ("" if why == "no converter" else f": {why}"))
    return "\n".join(lines)

