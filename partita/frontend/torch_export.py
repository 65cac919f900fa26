"""Import a PyTorch module through ``torch.export`` into a partita graph.

``import_torch(module, args)`` exports the module, decomposes the program to the core ATen op
set, and walks the FX graph once:

- placeholders become graph inputs: parameters with role ``param``, buffers with role
  ``state``, user inputs with role ``input``; parameter and buffer values go into
  ``graph.weights`` under the input's name (the module's dotted attribute path);
- each ``call_function`` node is converted by its entry in the one table ``ATEN_TO_PARTITA``
  (ATen overload -> converter); the partita type inferred by the op record is checked against
  the FX node's ``meta["val"]``;
- every node carries the source location of the innermost frame of the model's own code in
  the node's stack trace (frames inside torch are skipped);
- ops without a converter, or that a converter cannot express, are all collected and
  reported in one ``FrontendError``, each with its source line.
"""

from __future__ import annotations

import contextlib
import math

import operator
import os
import re
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError, TypeRuleError
from ..ir.dtypes import DType, bool_, f32, i64
from ..ir.graph import Graph, Value
from ..ir.types import Location, TensorType
from ..ops._lazy import from_torch_dtype
from ..ops.registry import OPS
from . import FrontendError
from .moe import static_experts

aten = torch.ops.aten

# Frames in these directories are library internals, never the model's code.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


class Unsupported(Exception):
    """Raised by a converter for a case of its op that partita cannot express; the importer
    collects it with the others rather than stopping at the first."""


# The result of an FX node that could not be converted: its users are skipped, not reported.
_POISON = object()


class AtenConverter:
    """State of one import: the builder, the FX node -> partita value map and the problems."""

    def __init__(self, graph: Graph) -> None:
        self.b = Builder(graph)
        self.env: dict[Any, Any] = {}
        self.node: Any = None
        self.problems: list[tuple[str, Location | None, str]] = []

    # --- helpers for converters ---------------------------------------------------------------
    def emit(self, op: str, *operands: Value, **attrs: Any) -> Any:
        return self.b.emit(op, *operands, **attrs)

    def scalar(self, value: Any, dtype: DType) -> Value:
        """A rank-0 ``full`` holding a Python scalar at ``dtype``."""
        if dtype.is_float:
            value = float(value)
        elif dtype.is_bool:
            value = bool(value)
        else:
            value = int(value)
        return self.emit("full", shape=(), value=value, dtype=dtype)

    def operand(self, x: Any, other: Any) -> Value:
        """``x`` as a Value; a Python scalar becomes a constant at the dtype PyTorch's scalar
        promotion gives it against the tensor ``other``: a scalar never raises the tensor's
        dtype within its category (f16 * 2.0 stays f16), it only lifts the category (an
        integer tensor times 0.5 is f32, the default float dtype)."""
        if isinstance(x, Value):
            return x
        if not isinstance(other, Value):
            raise Unsupported(f"{_target_name(self.node)}: both operands are Python scalars")
        return self.scalar(x, scalar_dtype(other.type.dtype, x))

    def out_type(self, index: int | None = None) -> TensorType:
        """The type torch.export recorded for the current node (or its ``index``-th result)."""
        val = self.node.meta["val"]
        if index is not None:
            val = val[index]
        return tensor_type_of(val, self.node)


def scalar_dtype(tensor: DType, scalar: Any) -> DType:
    """The dtype a Python scalar takes in a binary op with a tensor of dtype ``tensor``."""
    if isinstance(scalar, bool):
        return tensor
    if isinstance(scalar, int):
        return i64 if tensor.is_bool else tensor
    if isinstance(scalar, float):
        return tensor if tensor.is_float else f32
    raise Unsupported(f"a scalar operand of type {type(scalar).__name__} ({scalar!r}) is not supported")


def _target_name(node: Any) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


def tensor_type_of(val: Any, node: Any) -> TensorType:
    """The partita type of the example tensor ``val`` of FX node ``node``; an error naming the node otherwise."""
    if not isinstance(val, torch.Tensor):
        raise FrontendError(f"{node.name}: expected a tensor, found {type(val).__name__}")
    try:
        dt = from_torch_dtype(val.dtype)
    except KeyError:
        raise FrontendError(f"{node.name}: dtype {val.dtype} has no partita equivalent") from None
    try:
        shape = tuple(int(d) for d in val.shape)
    except TypeError:
        raise FrontendError(f"{node.name}: the shape {tuple(val.shape)} is symbolic; partita needs static shapes "
                            "(export without dynamic_shapes)") from None
    return TensorType(shape, dt)


def _data_dependent_shape(val: Any) -> str | None:
    """The shape of ``val`` as text when a dimension is symbolic (it depends on the data)."""
    if not isinstance(val, torch.Tensor) or all(isinstance(d, int) for d in val.shape):
        return None
    return "[" + ", ".join(str(d) for d in val.shape) + "]"


def module_scope(node: Any) -> str:
    """The module path of the innermost module that ran ``node`` (``"lm.transformer.h.3.attn"``),
    from torch.export's module stack; empty for the top-level module or when it is unknown."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    last = list(stack.values())[-1]
    path = last[0] if isinstance(last, tuple) and last and isinstance(last[0], str) else ""
    return _plain_module_path(path)


def _plain_module_path(path: str) -> str:
    """A module path as the model names it (``"block.0.attn"``): torch.compile's module stack
    spells it from dynamo's source (``L['self'].block.0``, ``L['self'].layers[0]``,
    ``getattr(L['self'].h, '0')``, ``L['self']._modules['h']``), torch.export's plainly."""
    if "L[" not in path and "[" not in path and "getattr(" not in path:
        return path
    p = re.sub(r"getattr\((.*?), '([^']*)'\)", r"\1.\2", path)
    p = re.sub(r"\._modules\['([^']*)'\]", r".\1", p)
    p = re.sub(r"^L\['[^']*'\]\.?", "", p)
    p = re.sub(r"\[['\"]?([^'\"\]]*)['\"]?\]", r".\1", p)
    return p.strip(".")


def source_location(node: Any) -> Location | None:
    """The innermost frame of the model's own code in ``node``'s stack trace (not torch's),
    with the module path that ran it (``Location.scope``)."""
    trace = node.meta.get("stack_trace")
    scope = module_scope(node)
    loc = None
    for m in _FRAME.finditer(trace or ""):
        path = m.group(1)
        if not path.startswith(_TORCH_DIR) and not path.startswith("<"):
            loc = Location(path, int(m.group(2)), 0, scope)
    if loc is None and scope:
        loc = Location("<module>", 0, 0, scope)
    return loc


# --- converters --------------------------------------------------------------------------------
# Each takes the converter state and the node's arguments (FX nodes already replaced by their
# partita Values) and returns a Value, or a tuple for a multi-result op (None for a result
# partita does not compute; using it is an error).

Conv = Callable[..., Any]


def _unary(op: str) -> Conv:
    def conv(cx: AtenConverter, x: Value) -> Value:
        return cx.emit(op, x)
    return conv


def _binary(op: str) -> Conv:
    def conv(cx: AtenConverter, a: Any, b: Any) -> Value:
        return cx.emit(op, cx.operand(a, b), cx.operand(b, a))
    return conv


def _add_sub(op: str) -> Conv:
    def conv(cx: AtenConverter, a: Any, b: Any, alpha: Any = 1) -> Value:
        lhs, rhs = cx.operand(a, b), cx.operand(b, a)
        if alpha != 1:
            rhs = cx.emit("mul", rhs, cx.operand(alpha, rhs))
        return cx.emit(op, lhs, rhs)
    return conv


def _identity(cx: AtenConverter, x: Value, *args: Any, **kwargs: Any) -> Value:
    return x


def _to_copy(cx: AtenConverter, x: Value, dtype: Any = None, **kwargs: Any) -> Value:
    if dtype is None:
        return x
    dt = _partita_dtype(dtype)
    return x if dt == x.type.dtype else cx.emit("cast", x, dtype=dt)


def _partita_dtype(dtype: Any) -> DType:
    try:
        return from_torch_dtype(dtype)
    except KeyError:
        raise Unsupported(f"dtype {dtype} has no partita equivalent") from None


def _addmm(cx: AtenConverter, bias: Value, a: Value, b: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    y = cx.emit("matmul", a, b)
    if alpha != 1:
        y = cx.emit("mul", y, cx.operand(alpha, y))
    if beta == 0:
        return y
    if beta != 1:
        bias = cx.emit("mul", bias, cx.operand(beta, bias))
    return cx.emit("add", y, bias)


def _matmul(cx: AtenConverter, a: Value, b: Value) -> Value:
    return cx.emit("matmul", a, b)


def wrap_dim(d: int, rank: int) -> int:
    """A dim index as ATen takes them (negative counts from the end) as a non-negative one."""
    return d + rank if d < 0 else d


def _permute(cx: AtenConverter, x: Value, dims: Sequence[int]) -> Value:
    return cx.emit("transpose", x, perm=tuple(wrap_dim(d, x.type.rank) for d in dims))


def _reshape(cx: AtenConverter, x: Value, shape: Sequence[int]) -> Value:
    return cx.emit("reshape", x, shape=tuple(shape))


def _expand(cx: AtenConverter, x: Value, sizes: Sequence[int], implicit: bool = False) -> Value:
    # -1 keeps the input's size; sizes are aligned on the right, as in broadcasting.
    lead = len(sizes) - x.type.rank
    shape = tuple(x.type.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    return x if shape == x.type.shape else cx.emit("broadcast_to", x, shape=shape)


def _unsqueeze(cx: AtenConverter, x: Value, dim: int) -> Value:
    return cx.emit("unsqueeze", x, axes=(wrap_dim(dim, x.type.rank + 1),))


def _squeeze(cx: AtenConverter, x: Value, dims: Any = None) -> Value:
    # torch ignores named dims whose size is not 1; partita's squeeze rejects them.
    shape = x.type.shape
    if dims is None:
        axes = tuple(i for i, s in enumerate(shape) if s == 1)
    else:
        dims = [dims] if isinstance(dims, int) else dims
        axes = tuple(sorted({wrap_dim(d, x.type.rank) for d in dims if shape[wrap_dim(d, x.type.rank)] == 1}))
    return cx.emit("squeeze", x, axes=axes) if axes else x


def _gelu(cx: AtenConverter, x: Value, approximate: str = "none") -> Value:
    return cx.emit("gelu", x, approximate=approximate)


def _pair(v: Any) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def ntuple(v: Any, nd: int) -> tuple[int, ...]:
    """An int or a list of ints as ``nd`` ints (one value is repeated, as ATen does)."""
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v) * nd if len(v) == 1 else tuple(v)


def _convolution(cx: AtenConverter, x: Value, w: Value, b: Value | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Value:
    nd = x.type.rank - 2
    if nd not in (1, 2, 3):
        raise Unsupported(f"aten.convolution: only 1-d, 2-d and 3-d convolution (3-d to 5-d input) is "
                          f"supported, got {x.type}")
    attrs: dict[str, Any] = dict(stride=ntuple(stride, nd), padding=ntuple(padding, nd),
                                 dilation=ntuple(dilation, nd), groups=groups)
    if transposed:
        attrs["output_padding"] = ntuple(output_padding, nd)
    if nd == 1:
        # partita's convolutions are 2-d and 3-d: run a 1-d one over a unit height.
        x, w = cx.emit("unsqueeze", x, axes=(2,)), cx.emit("unsqueeze", w, axes=(2,))
        for key, unit in (("stride", 1), ("padding", 0), ("dilation", 1), ("output_padding", 0)):
            if key in attrs:
                attrs[key] = (unit,) + attrs[key]
    operands = (x, w) if b is None else (x, w, b)
    y = cx.emit(f"conv_transpose{max(nd, 2)}d" if transposed else f"conv{max(nd, 2)}d", *operands, **attrs)
    return cx.emit("squeeze", y, axes=(2,)) if nd == 1 else y


def _max_pool_with_indices(nd: int) -> Callable[..., tuple]:
    def conv(cx: AtenConverter, x: Value, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
             dilation: Any = 1, ceil_mode: bool = False) -> tuple:
        attrs = dict(kernel=ntuple(kernel, nd), stride=ntuple(stride, nd) if len(stride) else None,
                     padding=ntuple(padding, nd), dilation=ntuple(dilation, nd), ceil_mode=ceil_mode)
        # The values-only op when nobody reads the indices (the common case: nn.MaxPool*d).
        if any(user.target is operator.getitem and user.args[1] == 1 and user.users for user in cx.node.users):
            return cx.emit(f"max_pool{nd}d_with_indices", x, **attrs)
        return (cx.emit(f"max_pool{nd}d", x, **attrs), None)
    return conv


def _avg_pool(nd: int) -> Callable[..., Value]:
    def conv(cx: AtenConverter, x: Value, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
             ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Value:
        if divisor_override is not None:
            raise Unsupported(f"aten.avg_pool{nd}d: divisor_override is not supported")
        return cx.emit(f"avg_pool{nd}d", x, kernel=ntuple(kernel, nd),
                       stride=ntuple(stride, nd) if len(stride) else None, padding=ntuple(padding, nd),
                       ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    return conv


def _adaptive_avg_pool2d(cx: AtenConverter, x: Value, output_size: Sequence[int]) -> Value:
    oh, ow = _pair(output_size)
    h, w = x.type.shape[-2:]
    if (oh, ow) == (1, 1):
        return cx.emit("mean", x, axes=(x.type.rank - 2, x.type.rank - 1), keepdim=True)
    if x.type.rank == 4 and h % oh == 0 and w % ow == 0:
        # Equal windows: the adaptive pool is a plain average pool.
        return cx.emit("avg_pool2d", x, kernel=(h // oh, w // ow))
    # Unequal windows (PyTorch's [floor(i * n / o), ceil((i + 1) * n / o))): the average over
    # each axis is a product with a constant averaging matrix.
    y = cx.emit("matmul", x, _const(cx, _adaptive_matrix(w, ow, x.type.dtype).T))
    return cx.emit("matmul", _const(cx, _adaptive_matrix(h, oh, x.type.dtype)), y)


def _adaptive_matrix(n: int, o: int, dtype: DType) -> np.ndarray:
    m = np.zeros((o, n), dtype=np.float64)
    for i in range(o):
        lo, hi = (i * n) // o, -(-((i + 1) * n) // o)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m.astype(dtype.np)


def _const(cx: AtenConverter, arr: np.ndarray) -> Value:
    return cx.emit("constant", value=DenseAttr(np.ascontiguousarray(arr)))


def _ones_or_zeros(cx: AtenConverter, like: Value, n: int, value: float) -> Value:
    return cx.emit("full", shape=(n,), value=value, dtype=like.type.dtype)


def _batch_norm_no_training(cx: AtenConverter, x: Value, w: Value | None, b: Value | None, mean: Value, var: Value,
                            momentum: float, eps: float) -> tuple:
    c = x.type.shape[1]
    w = w if w is not None else _ones_or_zeros(cx, x, c, 1.0)
    b = b if b is not None else _ones_or_zeros(cx, x, c, 0.0)
    return (cx.emit("batch_norm", x, w, b, mean, var, eps=float(eps)), None, None)


def _batch_norm_no_stats(cx: AtenConverter, x: Value, w: Value | None, b: Value | None, training: bool,
                         momentum: float, eps: float) -> tuple:
    """Batch norm without running statistics (``track_running_stats=False``, or BiT's weight
    standardization, which normalizes a weight per output channel): always by the statistics
    of ``x`` over every dim but 1. (y, mean, 1/std), the two per channel, as ATen returns them."""
    c = x.type.shape[1]
    dt = x.type.dtype
    axes = (0,) + tuple(range(2, x.type.rank))
    mean = cx.emit("mean", x, axes=axes, keepdim=True)
    d = cx.emit("sub", x, mean)
    var = cx.emit("mean", cx.emit("mul", d, d), axes=axes, keepdim=True)
    rstd = cx.emit("rsqrt", cx.emit("add", var, cx.scalar(float(eps), dt)))
    y = cx.emit("mul", d, rstd)
    per_channel = (1, c) + (1,) * (x.type.rank - 2)
    if w is not None:
        y = cx.emit("mul", y, cx.emit("reshape", w, shape=per_channel))
    if b is not None:
        y = cx.emit("add", y, cx.emit("reshape", b, shape=per_channel))
    return (y, cx.emit("reshape", mean, shape=(c,)), cx.emit("reshape", rstd, shape=(c,)))


def emit_layer_norm(cx: AtenConverter, x: Value, normalized_shape: Sequence[int], w: Value | None, b: Value | None,
                    eps: float) -> tuple:
    """aten.layer_norm as partita's layer_norm over the last dims: (y, None, None), as ATen's
    native_layer_norm returns (the mean and rstd are not computed)."""
    k = len(normalized_shape)
    if b is not None and w is None:
        w = cx.emit("full", shape=tuple(normalized_shape), value=1.0, dtype=x.type.dtype)
    operands = [x] + [v for v in (w, b) if v is not None]
    y = cx.emit("layer_norm", *operands, axes=tuple(range(-k, 0)), eps=float(eps))
    return (y, None, None)


def _softmax(op: str) -> Conv:
    def conv(cx: AtenConverter, x: Value, dim: int, half_to_float: bool = False) -> Value:
        if half_to_float:
            x = cx.emit("cast", x, dtype=f32)
        return cx.emit(op, x, axis=dim)
    return conv


def _embedding(cx: AtenConverter, table: Value, indices: Value, *args: Any) -> Value:
    return cx.emit("embedding", table, indices)


def _reduce_axes(x: Value, dims: Any) -> tuple[int, ...] | None:
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return None
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(wrap_dim(d, x.type.rank) for d in dims)


def _mean(cx: AtenConverter, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    if dtype is not None:
        x = _to_copy(cx, x, dtype)
    return cx.emit("mean", x, axes=_reduce_axes(x, dims), keepdim=keepdim)


def _sum(cx: AtenConverter, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    if dtype is not None:
        x = _to_copy(cx, x, dtype)
    elif not x.type.dtype.is_float and x.type.dtype != i64:
        # torch sums bool and integer tensors in i64.
        x = cx.emit("cast", x, dtype=i64)
    return cx.emit("sum", x, axes=_reduce_axes(x, dims), keepdim=keepdim)


def _mean_all(cx: AtenConverter, x: Value, dtype: Any = None) -> Value:
    return _mean(cx, x, None, False, dtype)


def _amax_amin(op: str) -> Conv:
    def conv(cx: AtenConverter, x: Value, dims: Any = (), keepdim: bool = False) -> Value:
        return cx.emit(op, x, axes=_reduce_axes(x, dims), keepdim=keepdim)
    return conv


def _vector_norm(cx: AtenConverter, x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Value:
    """torch.linalg.vector_norm: sum(|x|^ord)^(1/ord) over ``dim`` (all dims when None), with
    ord 2 as sqrt(sum(x*x)), 1 as sum(|x|), inf / -inf as max / min |x|, 0 as the count of
    nonzeros."""
    if dtype is not None:
        x = _to_copy(cx, x, dtype)
    if not x.type.dtype.is_float:
        raise Unsupported(f"aten.linalg_vector_norm of a {x.type.dtype} tensor (torch takes float or complex only)")
    axes = _reduce_axes(x, dim)
    p = float(ord)
    if p == 2:
        return cx.emit("sqrt", cx.emit("sum", cx.emit("mul", x, x), axes=axes, keepdim=keepdim))
    a = cx.emit("abs", x)
    if p == 1:
        return cx.emit("sum", a, axes=axes, keepdim=keepdim)
    if math.isinf(p):
        return cx.emit("max" if p > 0 else "min", a, axes=axes, keepdim=keepdim)
    if p == 0:
        nz = cx.emit("cast", cx.emit("not_equal", x, cx.scalar(0.0, x.type.dtype)), dtype=x.type.dtype)
        return cx.emit("sum", nz, axes=axes, keepdim=keepdim)
    dt = x.type.dtype
    total = cx.emit("sum", cx.emit("pow", a, cx.scalar(p, dt)), axes=axes, keepdim=keepdim)
    return cx.emit("pow", total, cx.scalar(1.0 / p, dt))


def _argmax_argmin(op: str) -> Conv:
    def conv(cx: AtenConverter, x: Value, dim: int | None = None, keepdim: bool = False) -> Value:
        return cx.emit(op, x, axes=None if dim is None else (wrap_dim(dim, x.type.rank),), keepdim=keepdim)
    return conv


def emit_concat(cx: AtenConverter, tensors: Sequence[Value], dim: int = 0) -> Value:
    """aten.cat as partita's concat."""
    return cx.emit("concat", *tensors, axis=wrap_dim(dim, tensors[0].type.rank))


def _split_sizes(cx: AtenConverter, x: Value, sizes: Sequence[int], dim: int = 0) -> tuple:
    out = cx.emit("split", x, axis=wrap_dim(dim, x.type.rank), sizes=tuple(sizes))
    return out if isinstance(out, tuple) else (out,)


def _slice(cx: AtenConverter, x: Value, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Value:
    axis = wrap_dim(dim, x.type.rank)
    size = x.type.shape[axis]
    start = 0 if start is None else start
    # torch.export writes "to the end" as the largest int64; partita clamps like Python.
    end = None if end is None or end >= size else end
    if start == 0 and end is None and step == 1:
        return x
    return cx.emit("slice", x, axis=axis, start=start, end=end, step=step)


def _select(cx: AtenConverter, x: Value, dim: int, index: int) -> Value:
    axis = wrap_dim(dim, x.type.rank)
    index = index + x.type.shape[axis] if index < 0 else index
    y = cx.emit("slice", x, axis=axis, start=index, end=index + 1)
    return cx.emit("squeeze", y, axes=(axis,))


def _full(cx: AtenConverter, size: Sequence[int], value: Any, **kwargs: Any) -> Value:
    t = cx.out_type()
    return cx.scalar(value, t.dtype) if not size else cx.emit(
        "full", shape=tuple(size), value=_fill(value, t.dtype), dtype=t.dtype)


def _fill(value: Any, dt: DType) -> Any:
    return float(value) if dt.is_float else (bool(value) if dt.is_bool else int(value))


def _full_like(cx: AtenConverter, x: Value, value: Any, **kwargs: Any) -> Value:
    t = cx.out_type()
    return cx.emit("full", shape=t.shape, value=_fill(value, t.dtype), dtype=t.dtype)


def _scalar_tensor(cx: AtenConverter, value: Any, **kwargs: Any) -> Value:
    return cx.scalar(value, cx.out_type().dtype)


def _arange(cx: AtenConverter, start: Any, end: Any, step: Any = 1, **kwargs: Any) -> Value:
    # The decompositions turn arange(end) and arange(start, end) into this overload.
    t = cx.out_type()
    y = cx.emit("iota", shape=t.shape, dtype=t.dtype)
    if step != 1:
        y = cx.emit("mul", y, cx.scalar(step, t.dtype))
    if start != 0:
        y = cx.emit("add", y, cx.scalar(start, t.dtype))
    return y


def _where(cx: AtenConverter, cond: Value, x: Any, y: Any) -> Value:
    return cx.emit("where", cond, cx.operand(x, y), cx.operand(y, x))


def _index_select(cx: AtenConverter, x: Value, dim: int, index: Value) -> Value:
    return cx.emit("index_select", x, index, axis=wrap_dim(dim, x.type.rank))


def _gather(cx: AtenConverter, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    return cx.emit("gather", x, index, axis=wrap_dim(dim, x.type.rank))


def _cumsum(cx: AtenConverter, x: Value, dim: int, dtype: Any = None) -> Value:
    if dtype is not None:
        x = _to_copy(cx, x, dtype)
    y = cx.emit("cumsum", x, axis=wrap_dim(dim, x.type.rank))
    if y.type.dtype != x.type.dtype and dtype is not None:
        # partita's cumsum sums integers in i64; torch keeps the dtype asked for (the i64 sum
        # cast back wraps as a sum in that dtype does)
        y = cx.emit("cast", y, dtype=x.type.dtype)
    return y


def _constant_pad_nd(cx: AtenConverter, x: Value, pad: Sequence[int], value: Any = 0) -> Value:
    if any(p < 0 for p in pad):
        raise Unsupported("aten.constant_pad_nd: negative padding (cropping) is not supported")
    # torch lists (before, after) pairs from the last dim backwards; partita from the first.
    pads = [0] * (2 * x.type.rank)
    for i in range(len(pad) // 2):
        d = x.type.rank - 1 - i
        pads[2 * d], pads[2 * d + 1] = pad[2 * i], pad[2 * i + 1]
    return cx.emit("pad", x, pads=tuple(pads), value=_fill(value, x.type.dtype))


def _cumsum_cast(cx: AtenConverter, x: Value, dim: int, dtype: Any = None) -> Value:
    if dtype is None and not x.type.dtype.is_float and x.type.dtype != i64:
        # torch accumulates bool and integer tensors in i64.
        x = cx.emit("cast", x, dtype=i64)
    return _cumsum(cx, x, dim, dtype)


def _bitwise(op: str) -> Conv:
    # On bools (masks, the common use) the logical op; on integers the bitwise one.
    def conv(cx: AtenConverter, a: Any, b: Any) -> Value:
        lhs, rhs = cx.operand(a, b), cx.operand(b, a)
        if lhs.type.dtype.is_bool and rhs.type.dtype.is_bool:
            return cx.emit(op, lhs, rhs)
        return cx.emit(op.replace("logical_", "bitwise_"), lhs, rhs)
    return conv


def _shift(op: str) -> Conv:
    # partita's shifts take one dtype: both operands in the dtype torch promotes them to.
    def conv(cx: AtenConverter, a: Any, b: Any) -> Value:
        dt = cx.out_type().dtype
        lhs, rhs = cx.operand(a, b), cx.operand(b, a)
        lhs, rhs = (v if v.type.dtype == dt else cx.emit("cast", v, dtype=dt) for v in (lhs, rhs))
        return cx.emit(op, lhs, rhs)
    return conv


def _round(cx: AtenConverter, x: Value, decimals: int = 0) -> Value:
    # torch rounds x * 10**d (x / 10**-d for d < 0) half to even and scales back.
    if decimals == 0:
        return cx.emit("round", x)
    if not x.type.dtype.is_float:
        raise Unsupported(f"round with decimals={decimals} on {x.type.dtype} (torch takes floats only)")
    scale = cx.operand(10.0 ** abs(decimals), x)
    if decimals > 0:
        return cx.emit("div", cx.emit("round", cx.emit("mul", x, scale)), scale)
    return cx.emit("mul", cx.emit("round", cx.emit("div", x, scale)), scale)


def _no_result(cx: AtenConverter, *args: Any, **kwargs: Any) -> None:
    # Run-time metadata assertions: the types were checked when the graph was exported.
    return None


def _index_run(indices: Sequence[Value | None], op: str, form: tuple[str, str]) -> tuple[int, list[Value]]:
    """(how many full slices lead, the index tensors) of an advanced-indexing argument: the
    tensors must form one run of adjacent dims of integers (``form`` shows the refused forms)."""
    lead = 0
    while lead < len(indices) and indices[lead] is None:
        lead += 1
    idx = list(indices[lead:])
    while idx and idx[-1] is None:
        idx.pop()
    if not idx or any(i is None for i in idx):
        raise Unsupported(f"{op}: index tensors separated by a slice ({form[0]}) are not supported")
    if any(i is None or not i.type.dtype.is_int for i in idx):
        raise Unsupported(f"{op}: boolean-mask indexing{form[1]} is not supported")
    return lead, [i for i in idx if i is not None]


def linearize_index(cx: AtenConverter, idx: Sequence[Value], dims: Sequence[int]) -> Value:
    """Index tensors into dims ``dims`` (negative ones counted from the end, as in Python) as
    one broadcast i64 index into those dims flattened."""
    linear: Value | None = None
    for d, (i, size) in enumerate(zip(idx, dims)):
        if i.type.dtype != i64:
            i = cx.emit("cast", i, dtype=i64)
        i = cx.emit("where", cx.emit("less", i, cx.scalar(0, i64)), cx.emit("add", i, cx.scalar(size, i64)), i)
        stride = int(np.prod(dims[d + 1:], dtype=np.int64))
        term = i if stride == 1 else cx.emit("mul", i, cx.scalar(stride, i64))
        linear = term if linear is None else cx.emit("add", linear, term)
    assert linear is not None
    return linear


def _index(cx: AtenConverter, x: Value, indices: Sequence[Value | None]) -> Value:
    """x[..., i0, i1, ...] with index tensors (advanced indexing) on one run of adjacent dims,
    after any number of full slices (None). The indexed dims are moved to the front and
    flattened, the broadcast, linearized index picks rows with ``index_select``, and the
    index's dims are moved back to where the first indexed dim was, as PyTorch places them."""
    lead, idx = _index_run(indices, "aten.index.Tensor", ("x[i, :, j]", ""))
    k, rank = len(idx), x.type.rank
    if lead:
        front = tuple(range(lead, lead + k)) + tuple(range(lead)) + tuple(range(lead + k, rank))
        x = cx.emit("transpose", x, perm=front)
    dims = x.type.shape[:k]
    rest = x.type.shape[k:]
    linear = linearize_index(cx, idx, dims)
    batch = linear.type.shape
    flat = cx.emit("reshape", x, shape=(-1,) + rest) if k != 1 else x
    picked = cx.emit("index_select", flat, cx.emit("reshape", linear, shape=(-1,)), axis=0)
    y = cx.emit("reshape", picked, shape=batch + rest)
    if lead:
        r = len(batch)
        back = tuple(range(r, r + lead)) + tuple(range(r)) + tuple(range(r + lead, y.type.rank))
        y = cx.emit("transpose", y, perm=back)
    return y


def _sdpa(cx: AtenConverter, q: Value, k: Value, v: Value, attn_mask: Value | None = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Value:
    """Attention as one fused ``attention`` node (its out; GQA's key/value heads repeated first),
    which the torch executor runs with the CPU flash kernel eager runs. A call its type rule
    cannot express (q, k, v of different ranks or of batch dims that only broadcast, a float
    mask of another dtype than q) is spelled out as softmax(q k^T * scale + mask) v instead."""
    if dropout_p:
        raise Unsupported("aten.scaled_dot_product_attention: dropout_p > 0 is not supported (use eval mode)")
    if enable_gqa and k.type.shape[-3] != q.type.shape[-3]:
        k, v = repeat_kv(cx, k, q.type.shape[-3]), repeat_kv(cx, v, q.type.shape[-3])
    operands = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    attrs = {"scale": scale, "causal": bool(is_causal)}
    attention = OPS["attention"]
    try:
        attention.infer_types([x.type for x in operands], attention.normalize_attrs(attrs))
    except TypeRuleError:
        return _sdpa_spelled_out(cx, q, k, v, attn_mask, is_causal, scale)
    if attn_mask is not None and not is_causal:
        # Exported models compute their masks from index arithmetic even when the mask is
        # plain causal (eager code passes is_causal=True there instead); such a mask becomes
        # the causal flag, or nothing when it keeps every score, which lets the kernel skip
        # the masked blocks and read no mask. The nodes that computed it are left to dce.
        pattern = _mask_pattern(attn_mask, q.type.shape[-2], k.type.shape[-2])
        if pattern is not None:
            operands, attrs["causal"] = operands[:3], pattern == "causal"
    return cx.emit("attention", *operands, **attrs)[0]


# Limits on folding a mask at import: nodes in the computation and elements of any value.
_MASK_FOLD_NODES = 512
_MASK_FOLD_ELEMENTS = 1 << 22
_MASK_PATTERNS: "weakref.WeakKeyDictionary[Value, str | None]" = weakref.WeakKeyDictionary()


def _mask_pattern(mask: Value, tq: int, tk: int) -> str | None:
    """The pattern of a mask that depends on no graph input: "causal" when it keeps exactly the
    scores j <= i of each [Tq, Tk] block, "all" when it keeps every score (kept is bool true, or
    float 0 with -inf elsewhere); else None. Remembered per value: every layer reads one mask."""
    if mask in _MASK_PATTERNS:
        return _MASK_PATTERNS[mask]
    pattern = None
    m = _constant_value(mask)
    if m is not None:
        keep = m if m.dtype == np.bool_ else (m == 0)
        if m.dtype == np.bool_ or np.all(keep | (m == -np.inf)):
            if keep.all():
                pattern = "all"
            elif np.all(keep == np.tril(np.ones((tq, tk), dtype=bool))):
                pattern = "causal"
    _MASK_PATTERNS[mask] = pattern
    return pattern


def _constant_value(v: Value) -> np.ndarray | None:
    """The value of ``v`` computed with the op records' NumPy references when it depends on no
    graph input and no effect, within the folding limits; else None."""
    order: list = []
    seen: set = set()
    stack: list = [(v.producer, False)] if v.producer is not None else []
    if not stack:
        return None
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        op = OPS.get(node.op)
        if op is None or op.effects_of(node.attrs) or len(seen) > _MASK_FOLD_NODES:
            return None
        if any(r.type.numel > _MASK_FOLD_ELEMENTS for r in node.results):
            return None
        stack.append((node, True))
        for x in node.operands:
            if x.producer is None:
                return None
            if x.producer not in seen:
                stack.append((x.producer, False))
    values: dict = {}
    for node in order:
        try:
            res = OPS[node.op].reference([values[x] for x in node.operands], node.attrs)
        except Exception:  # a computation the reference cannot run is simply not folded
            return None
        res = res if isinstance(res, (tuple, list)) else (res,)
        for r, a in zip(node.results, res):
            values[r] = np.asarray(a).astype(r.type.dtype.np, copy=False)
    return values[v]


def _sdpa_spelled_out(cx: AtenConverter, q: Value, k: Value, v: Value, attn_mask: Value | None, is_causal: bool,
                      scale: float | None) -> Value:
    """softmax(q k^T * scale + mask) v in matmul/mul/where/softmax ops, with broadcasting."""
    rank = q.type.rank
    e = q.type.shape[-1]
    dt = q.type.dtype
    perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    s = cx.emit("matmul", q, cx.emit("transpose", k, perm=perm))
    s = cx.emit("mul", s, cx.scalar(scale if scale is not None else 1.0 / e ** 0.5, dt))
    if is_causal:
        shape = (q.type.shape[-2], k.type.shape[-2])
        causal = cx.emit("greater_equal", cx.emit("iota", shape=shape, axis=0), cx.emit("iota", shape=shape, axis=1))
        s = cx.emit("where", causal, s, cx.scalar(float("-inf"), dt))
    if attn_mask is not None:
        if attn_mask.type.dtype.is_bool:
            s = cx.emit("where", attn_mask, s, cx.scalar(float("-inf"), dt))
        else:
            s = cx.emit("add", s, attn_mask)
    p = cx.emit("softmax", s, axis=-1)
    return cx.emit("matmul", p, v)


def repeat_kv(cx: AtenConverter, x: Value, heads: int) -> Value:
    """[B, Hkv, S, E] -> [B, H, S, E]: query head h reads key/value head h // (H / Hkv)."""
    *lead, hkv, sl, e = x.type.shape
    y = cx.emit("unsqueeze", x, axes=(len(lead) + 1,))
    y = cx.emit("broadcast_to", y, shape=(*lead, hkv, heads // hkv, sl, e))
    return cx.emit("reshape", y, shape=(*lead, heads, sl, e))


def _clamp(cx: AtenConverter, x: Value, lo: Any = None, hi: Any = None) -> Value:
    # min(max(x, lo), hi), as torch.clamp orders the bounds when lo > hi.
    y = x
    if lo is not None:
        y = cx.emit("maximum", y, cx.operand(lo, x))
    if hi is not None:
        y = cx.emit("minimum", y, cx.operand(hi, x))
    return y


def _leaky_relu(cx: AtenConverter, x: Value, slope: float = 0.01) -> Value:
    zero = cx.scalar(0, x.type.dtype)
    return cx.emit("where", cx.emit("greater", x, zero), x, cx.emit("mul", x, cx.scalar(slope, x.type.dtype)))


def _elu(cx: AtenConverter, x: Value, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Value:
    dt = x.type.dtype
    xs = x if input_scale == 1 else cx.emit("mul", x, cx.scalar(input_scale, dt))
    neg = cx.emit("mul", cx.emit("sub", cx.emit("exp", xs), cx.scalar(1, dt)), cx.scalar(alpha, dt))
    y = cx.emit("where", cx.emit("greater", x, cx.scalar(0, dt)), x, neg)
    return y if scale == 1 else cx.emit("mul", y, cx.scalar(scale, dt))


def _var(cx: AtenConverter, x: Value, dims: Any = None, correction: Any = None, keepdim: bool = False) -> Value:
    """sum((x - mean)^2) / (N - correction); correction defaults to 1 (Bessel's)."""
    axes = _reduce_axes(x, dims)
    reduced = range(x.type.rank) if axes is None else axes
    n = 1
    for a in reduced:
        n *= x.type.shape[a]
    c = 1 if correction is None else correction
    d = cx.emit("sub", x, cx.emit("mean", x, axes=axes, keepdim=True))
    total = cx.emit("sum", cx.emit("mul", d, d), axes=axes, keepdim=keepdim)
    return cx.emit("div", total, cx.scalar(max(n - c, 0), x.type.dtype))


def _pow(cx: AtenConverter, a: Any, b: Any) -> Value:
    return cx.emit("pow", cx.operand(a, b), cx.operand(b, a))


_COMPARISONS = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
                "ge": "greater_equal"}

ATEN_TO_PARTITA: dict[Any, Conv] = {
    # linear algebra
    aten.addmm.default: _addmm,
    aten.mm.default: _matmul,
    aten.bmm.default: _matmul,
    # movement
    aten.permute.default: _permute,
    aten.view.default: _reshape,
    aten.reshape.default: _reshape,
    aten.expand.default: _expand,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dims: _squeeze,
    aten.cat.default: emit_concat,
    aten.split_with_sizes.default: _split_sizes,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.index_select.default: _index_select,
    aten.gather.default: _gather,
    aten.constant_pad_nd.default: _constant_pad_nd,
    # copies and casts
    aten.clone.default: _identity,
    aten.alias.default: _identity,
    aten.lift_fresh_copy.default: _identity,
    aten._to_copy.default: _to_copy,
    # activations and unary math
    aten.relu.default: _unary("relu"),
    aten.gelu.default: _gelu,
    aten.tanh.default: _unary("tanh"),
    aten.sigmoid.default: _unary("sigmoid"),
    aten.silu.default: _unary("silu"),
    aten.exp.default: _unary("exp"),
    aten.log.default: _unary("log"),
    aten.sqrt.default: _unary("sqrt"),
    aten.rsqrt.default: _unary("rsqrt"),
    aten.neg.default: _unary("neg"),
    aten.abs.default: _unary("abs"),
    aten.erf.default: _unary("erf"),
    aten.sin.default: _unary("sin"),
    aten.cos.default: _unary("cos"),
    aten.logical_not.default: _unary("logical_not"),
    aten.clamp.default: _clamp,
    aten.clamp.Tensor: _clamp,
    aten.hardtanh.default: _clamp,
    aten.leaky_relu.default: _leaky_relu,
    aten.elu.default: _elu,
    # binary arithmetic (tensor or Python scalar operands)
    aten.add.Tensor: _add_sub("add"),
    aten.add.Scalar: _add_sub("add"),
    aten.sub.Tensor: _add_sub("sub"),
    aten.sub.Scalar: _add_sub("sub"),
    aten.mul.Tensor: _binary("mul"),
    aten.mul.Scalar: _binary("mul"),
    aten.div.Tensor: _binary("div"),
    aten.div.Scalar: _binary("div"),
    aten.pow.Tensor_Scalar: _pow,
    aten.pow.Tensor_Tensor: _pow,
    aten.pow.Scalar: _pow,
    aten.maximum.default: _binary("maximum"),
    aten.minimum.default: _binary("minimum"),
    aten.logical_and.default: _binary("logical_and"),
    aten.logical_or.default: _binary("logical_or"),
    aten.where.self: _where,
    aten.bitwise_and.Tensor: _bitwise("logical_and"),
    aten.bitwise_or.Tensor: _bitwise("logical_or"),
    aten.index.Tensor: _index,
    aten._assert_tensor_metadata.default: _no_result,
    aten.scaled_dot_product_attention.default: _sdpa,
    # comparisons (filled in below for each of .Tensor and .Scalar)
    # normalization, softmax, embedding
    aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,
    aten.native_layer_norm.default: emit_layer_norm,
    aten._softmax.default: _softmax("softmax"),
    aten._log_softmax.default: _softmax("log_softmax"),
    aten.embedding.default: _embedding,
    # convolution and pooling
    aten.convolution.default: _convolution,
    aten.max_pool2d_with_indices.default: _max_pool_with_indices(2),
    aten.max_pool3d_with_indices.default: _max_pool_with_indices(3),
    aten.avg_pool2d.default: _avg_pool(2),
    aten.avg_pool3d.default: _avg_pool(3),
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
    # reductions
    aten.mean.dim: _mean,
    aten.mean.default: _mean_all,
    aten.sum.dim_IntList: _sum,
    aten.amax.default: _amax_amin("max"),
    aten.linalg_vector_norm.default: _vector_norm,
    aten.amin.default: _amax_amin("min"),
    aten.argmax.default: _argmax_argmin("argmax"),
    aten.argmin.default: _argmax_argmin("argmin"),
    aten.cumsum.default: _cumsum_cast,
    aten.var.correction: _var,
    # creation
    aten.full.default: _full,
    aten.full_like.default: _full_like,
    aten.scalar_tensor.default: _scalar_tensor,
    aten.arange.start_step: _arange,
}
for _name, _op in _COMPARISONS.items():
    for _overload in ("Tensor", "Scalar"):
        ATEN_TO_PARTITA[getattr(getattr(aten, _name), _overload)] = _binary(_op)

# rounding, inverse and hyperbolic functions, float classes, bitwise ops, remainders
for _name in ("floor", "ceil", "trunc", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
              "isnan", "isinf", "bitwise_not"):
    ATEN_TO_PARTITA[getattr(aten, _name).default] = _unary(_name)
ATEN_TO_PARTITA[aten.round.default] = _round
ATEN_TO_PARTITA[aten.round.decimals] = _round
for _name in ("and", "or", "xor"):
    for _overload in ("Tensor", "Scalar"):
        ATEN_TO_PARTITA[getattr(getattr(aten, f"bitwise_{_name}"), _overload)] = (
            _bitwise(f"logical_{_name}") if _name != "xor" else _binary("bitwise_xor"))
for _name, _dunder in (("bitwise_left_shift", "__lshift__"), ("bitwise_right_shift", "__rshift__")):
    for _overload in ("Tensor", "Tensor_Scalar"):
        ATEN_TO_PARTITA[getattr(getattr(aten, _name), _overload)] = _shift(_name)
    # x << y and x >> y export as the operator overloads, which no decomposition rewrites
    for _overload in ("Tensor", "Scalar"):
        ATEN_TO_PARTITA[getattr(getattr(aten, _dunder), _overload)] = _shift(_name)
ATEN_TO_PARTITA[aten.reciprocal.default] = lambda cx, x: cx.emit("div", cx.operand(1.0, x), x)
for _name in ("remainder", "fmod"):
    for _overload in ("Tensor", "Scalar"):
        ATEN_TO_PARTITA[getattr(getattr(aten, _name), _overload)] = _binary(_name)


def _topk(cx: AtenConverter, x: Value, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    return tuple(cx.emit("topk", x, k=int(k), axis=wrap_dim(dim, x.type.rank), largest=bool(largest), sorted=bool(sorted)))


def _sort(cx: AtenConverter, x: Value, dim: int = -1, descending: bool = False, stable: bool | None = None) -> tuple:
    # partita's sort is always stable, which is also a correct unstable sort.
    return tuple(cx.emit("sort", x, axis=wrap_dim(dim, x.type.rank), descending=bool(descending)))


def _sort_stable(cx: AtenConverter, x: Value, *, stable: bool | None = None, dim: int = -1,
                 descending: bool = False) -> tuple:
    return _sort(cx, x, dim, descending)


ATEN_TO_PARTITA.update({
    aten.topk.default: _topk,
    aten.sort.default: _sort,
    aten.sort.stable: _sort_stable,
})


def _repeat(cx: AtenConverter, x: Value, repeats: Sequence[int]) -> Value:
    """x.repeat(r0, ..., rk): new leading dims for the extra counts, then every dim tiled,
    as one reshape to [1, s0, 1, s1, ...], a broadcast to [r0, s0, r1, s1, ...] and a reshape
    to [r0 * s0, r1 * s1, ...]."""
    reps = [int(r) for r in repeats]
    extra = len(reps) - x.type.rank
    if extra < 0:
        raise Unsupported(f"aten.repeat: {len(reps)} repeat counts for a rank-{x.type.rank} tensor; torch "
                          "needs at least one per dim")
    shape = [1] * extra + list(x.type.shape)
    if all(r == 1 for r in reps):
        return x if not extra else cx.emit("reshape", x, shape=tuple(shape))
    inter = tuple(d for s in shape for d in (1, s))
    y = cx.emit("reshape", x, shape=inter)
    y = cx.emit("broadcast_to", y, shape=tuple(d for r, s in zip(reps, shape) for d in (r, s)))
    return cx.emit("reshape", y, shape=tuple(r * s for r, s in zip(reps, shape)))


def _copy(cx: AtenConverter, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    """aten.copy (the functional form of ``dst.copy_(src)``): src broadcast to dst's shape,
    in dst's dtype."""
    if src.type.dtype is not dst.type.dtype:
        src = cx.emit("cast", src, dtype=dst.type.dtype)
    if src.type.shape != dst.type.shape:
        src = cx.emit("broadcast_to", src, shape=dst.type.shape)
    return src


def _empty(cx: AtenConverter, *args: Any, **kwargs: Any) -> Value:
    """aten.empty / empty_permuted: an uninitialized tensor, which the program overwrites
    before reading; partita makes it zeros (its layout is partita's own, so the permutation
    is irrelevant)."""
    t = cx.out_type()
    return cx.emit("full", shape=t.shape, value=_fill(0, t.dtype), dtype=t.dtype)


def _as_strided(cx: AtenConverter, x: Value, size: Sequence[int], stride: Sequence[int],
                storage_offset: int | None = None) -> Value:
    """as_strided over the contiguous storage of ``x`` (what the exported functional program
    holds): the flat positions offset + sum(i_k * stride_k), computed at import, pick the
    elements with one index_select."""
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    if len(size) != len(stride):
        raise Unsupported(f"aten.as_strided: size {size} and stride {stride} differ in length")
    pos = np.full(size, int(storage_offset or 0), dtype=np.int64)
    for k, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[k] = n
        pos = pos + (np.arange(n, dtype=np.int64) * st).reshape(shape)
    total = int(np.prod(x.type.shape))
    if pos.size and (pos.min() < 0 or pos.max() >= total):
        raise Unsupported(f"aten.as_strided: size {size}, stride {stride}, offset {storage_offset or 0} reach "
                          f"past the {total} elements of the input {x.type}")
    flat = cx.emit("reshape", x, shape=(total,))
    idx = cx.emit("constant", value=DenseAttr(pos.reshape(-1)))
    y = cx.emit("index_select", flat, idx, axis=0)
    return cx.emit("reshape", y, shape=tuple(size))


def _histc(cx: AtenConverter, x: Value, bins: int = 100, min: Any = 0, max: Any = 0) -> Value:
    """torch.histc: ``bins`` equal bins over [min, max] (the data's own range when both are
    0), elements outside ignored, the maximum counted in the last bin. An element's bin is
    trunc((x - lo) / (hi - lo) * bins) as torch computes it, so "bin >= i" is exactly
    "t >= i" for t = (x - lo) / (hi - lo) * bins; each count is a sum of comparisons."""
    dtype = x.type.dtype
    if not dtype.is_float:
        raise Unsupported(f"aten.histc: a {dtype.name} input; torch's histc takes floating point tensors")
    bins = int(bins)
    flat = cx.emit("reshape", x, shape=(int(np.prod(x.type.shape)),))
    if float(min) == 0 and float(max) == 0:
        lo = cx.emit("min", flat, axes=None, keepdim=False)
        hi = cx.emit("max", flat, axes=None, keepdim=False)
        same = cx.emit("equal", lo, hi)
        one = cx.scalar(1.0, dtype)
        lo = cx.emit("where", same, cx.emit("sub", lo, one), lo)
        hi = cx.emit("where", same, cx.emit("add", hi, one), hi)
    else:
        if float(min) > float(max):
            raise Unsupported(f"aten.histc: min {min} is greater than max {max}")
        lo_v, hi_v = float(min), float(max)
        if lo_v == hi_v:
            lo_v, hi_v = lo_v - 1, hi_v + 1
        lo, hi = cx.scalar(lo_v, dtype), cx.scalar(hi_v, dtype)
    t = cx.emit("mul", cx.emit("div", cx.emit("sub", flat, lo), cx.emit("sub", hi, lo)), cx.scalar(float(bins), dtype))
    inside = cx.emit("logical_and", cx.emit("greater_equal", flat, lo), cx.emit("less_equal", flat, hi))
    edges = cx.emit("constant", value=DenseAttr(np.arange(bins, dtype=dtype.np).reshape(bins, 1)))
    at_least = cx.emit("greater_equal", cx.emit("reshape", t, shape=(1, t.type.shape[0])), edges)   # [bins, N]
    nxt = cx.emit("constant", value=DenseAttr(np.concatenate([np.arange(1, bins, dtype=dtype.np),
                                                              np.array([np.inf], dtype.np)]).reshape(bins, 1)))
    below = cx.emit("less", cx.emit("reshape", t, shape=(1, t.type.shape[0])), nxt)
    hit = cx.emit("logical_and", cx.emit("logical_and", at_least, below), inside)
    counts = cx.emit("sum", cx.emit("cast", hit, dtype=dtype), axes=(1,), keepdim=False)
    return counts


ATEN_TO_PARTITA.update({
    aten.repeat.default: _repeat,
    aten.copy.default: _copy,
    aten.empty.memory_format: _empty,
    aten.empty_permuted.default: _empty,
    aten.empty_strided.default: _empty,
    aten.as_strided.default: _as_strided,
    aten.histc.default: _histc,
})


def _any(cx: AtenConverter, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    b = x if x.type.dtype.is_bool else cx.emit("not_equal", x, cx.scalar(0, x.type.dtype))
    axes = None if dim is None else tuple(wrap_dim(d, x.type.rank) for d in ([dim] if isinstance(dim, int) else dim))
    count = cx.emit("sum", cx.emit("cast", b, dtype=i64), axes=axes, keepdim=bool(keepdim))
    return cx.emit("greater", count, cx.scalar(0, i64))


def _logical_xor(cx: AtenConverter, a: Value, b: Value) -> Value:
    def as_bool(v: Value) -> Value:
        return v if v.type.dtype.is_bool else cx.emit("not_equal", v, cx.scalar(0, v.type.dtype))
    return cx.emit("not_equal", as_bool(a), as_bool(b))


def _positions(cx: AtenConverter, x: Value, pos: np.ndarray) -> Value:
    """The elements of ``x`` (contiguous) at flat positions ``pos``, in pos's shape."""
    total = int(np.prod(x.type.shape))
    flat = cx.emit("reshape", x, shape=(total,))
    y = cx.emit("index_select", flat, _const(cx, pos.reshape(-1).astype(np.int64)), axis=0)
    return cx.emit("reshape", y, shape=tuple(pos.shape))


def _diagonal(cx: AtenConverter, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    """torch.diagonal: the other dims in order, then the diagonal; positions computed at import."""
    r = x.type.rank
    d1, d2 = wrap_dim(dim1, r), wrap_dim(dim2, r)
    pos = np.arange(int(np.prod(x.type.shape)), dtype=np.int64).reshape(x.type.shape)
    return _positions(cx, x, np.ascontiguousarray(np.diagonal(pos, offset=int(offset), axis1=d1, axis2=d2)))


def _flip(cx: AtenConverter, x: Value, dims: Sequence[int]) -> Value:
    for d in dims:
        axis = wrap_dim(d, x.type.rank)
        n = x.type.shape[axis]
        if n > 1:
            x = cx.emit("index_select", x, _const(cx, np.arange(n - 1, -1, -1, dtype=np.int64)), axis=axis)
    return x


def _max_min_dim(op: str, arg: str) -> Conv:
    def conv(cx: AtenConverter, x: Value, dim: int, keepdim: bool = False) -> tuple:
        axis = wrap_dim(dim, x.type.rank)
        return (cx.emit(op, x, axes=(axis,), keepdim=bool(keepdim)),
                cx.emit(arg, x, axes=(axis,), keepdim=bool(keepdim)))
    return conv


def _prod(cx: AtenConverter, x: Value, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    if dtype is not None:
        x = _to_copy(cx, x, dtype)
    elif not x.type.dtype.is_float:
        x = cx.emit("cast", x, dtype=i64)          # torch.prod of integers (and bools) is i64
    axes = None if dim is None else (wrap_dim(dim, x.type.rank),)
    return cx.emit("prod", x, axes=axes, keepdim=bool(keepdim))


def _log_base(base: float) -> Conv:
    def conv(cx: AtenConverter, x: Value) -> Value:
        y = cx.emit("log", x)
        return cx.emit("div", y, cx.scalar(float(np.log(base)), y.type.dtype))
    return conv


def _log1p(cx: AtenConverter, x: Value) -> Value:
    """log(1 + x) accurate for small x: log(u) * x / (u - 1) with u = 1 + x (x where u == 1)."""
    one = cx.scalar(1.0, x.type.dtype)
    u = cx.emit("add", x, one)
    um1 = cx.emit("sub", u, one)
    same = cx.emit("equal", um1, cx.scalar(0.0, x.type.dtype))
    safe = cx.emit("where", same, one, um1)
    y = cx.emit("div", cx.emit("mul", cx.emit("log", u), x), safe)
    inf = cx.emit("equal", u, cx.scalar(float("inf"), x.type.dtype))
    return cx.emit("where", same, x, cx.emit("where", inf, u, y))


def _expm1(cx: AtenConverter, x: Value) -> Value:
    """exp(x) - 1 accurate for small x: (u - 1) * x / log(u) with u = exp(x) (x where u == 1,
    u - 1 where u is 0 or inf)."""
    one = cx.scalar(1.0, x.type.dtype)
    u = cx.emit("exp", x)
    um1 = cx.emit("sub", u, one)
    same = cx.emit("equal", um1, cx.scalar(0.0, x.type.dtype))
    lg = cx.emit("log", u)
    edge = cx.emit("logical_or", cx.emit("equal", u, cx.scalar(0.0, x.type.dtype)),
                   cx.emit("equal", u, cx.scalar(float("inf"), x.type.dtype)))
    safe = cx.emit("where", cx.emit("logical_or", same, edge), one, lg)
    y = cx.emit("div", cx.emit("mul", um1, x), safe)
    return cx.emit("where", same, x, cx.emit("where", edge, um1, y))


def _group_norm(cx: AtenConverter, x: Value, w: Value | None, b: Value | None, n: int, c: int, hw: int,
                group: int, eps: float) -> tuple:
    """native_group_norm: statistics over each group of C // group channels and every
    spatial position; returns (out, mean, rstd) as torch does, mean and rstd [N, group]."""
    shape = x.type.shape
    g = cx.emit("reshape", x, shape=(int(n), int(group), (int(c) // int(group)) * int(hw)))
    mean = cx.emit("mean", g, axes=(2,), keepdim=True)
    d = cx.emit("sub", g, mean)
    var = cx.emit("mean", cx.emit("mul", d, d), axes=(2,), keepdim=True)
    rstd = cx.emit("rsqrt", cx.emit("add", var, cx.scalar(float(eps), x.type.dtype)))
    y = cx.emit("reshape", cx.emit("mul", d, rstd), shape=shape)
    bshape = (1, int(c)) + (1,) * (len(shape) - 2)
    if w is not None:
        y = cx.emit("mul", y, cx.emit("reshape", w, shape=bshape))
    if b is not None:
        y = cx.emit("add", y, cx.emit("reshape", b, shape=bshape))
    return (y, cx.emit("reshape", mean, shape=(int(n), int(group))), cx.emit("reshape", rstd, shape=(int(n), int(group))))


def _upsample_sizes(x: Value, output_size: Any, scale_factors: Any) -> tuple[list[int], list[float | None]]:
    ins = list(x.type.shape[2:])
    if output_size is not None:
        return [int(o) for o in output_size], [None] * len(ins)
    scales: list[float | None] = [float(s) for s in scale_factors]
    return [int(np.floor(i * float(s or 1.0))) for i, s in zip(ins, scales)], scales


def _upsample_nearest(cx: AtenConverter, x: Value, output_size: Any, scale_factors: Any = None) -> Value:
    """Nearest: source index min(floor(dst * scale), in - 1), scale = in / out (or 1 / the
    given factor), in float32 as PyTorch computes it; one index_select per spatial axis."""
    outs, factors = _upsample_sizes(x, output_size, scale_factors)
    for k, (o, f) in enumerate(zip(outs, factors)):
        axis = 2 + k
        n = x.type.shape[axis]
        scale = np.float32(1.0 / f) if f is not None else np.float32(n / o)
        idx = np.minimum(np.floor(np.arange(o, dtype=np.float32) * scale).astype(np.int64), n - 1)
        x = cx.emit("index_select", x, _const(cx, idx), axis=axis)
    return x


def _linear_matrix(n: int, o: int, align: bool, factor: float | None) -> np.ndarray:
    """The [o, n] matrix of PyTorch's linear interpolation along one axis."""
    m = np.zeros((o, n), dtype=np.float64)
    for i in range(o):
        if align:
            src = i * (n - 1) / (o - 1) if o > 1 else 0.0
        else:
            scale = 1.0 / factor if factor is not None else n / o
            src = max((i + 0.5) * scale - 0.5, 0.0)
        lo = min(int(np.floor(src)), n - 1)
        hi = min(lo + 1, n - 1)
        t = src - lo
        m[i, lo] += 1.0 - t
        m[i, hi] += t
    return m


def _upsample_bilinear(cx: AtenConverter, x: Value, output_size: Any, align_corners: bool,
                       scale_factors: Any = None) -> Value:
    """Bilinear: along each axis a product with the constant interpolation matrix."""
    (oh, ow), (fh, fw) = _upsample_sizes(x, output_size, scale_factors)
    h, w = x.type.shape[2:]
    dtype = x.type.dtype.np
    y = cx.emit("matmul", x, _const(cx, _linear_matrix(w, ow, bool(align_corners), fw).T.astype(dtype)))
    return cx.emit("matmul", _const(cx, _linear_matrix(h, oh, bool(align_corners), fh).astype(dtype)), y)


def _masked_scatter(cx: AtenConverter, x: Value, mask: Value, source: Value) -> Value:
    """x with the positions where ``mask`` holds taking ``source``'s elements in order: the
    k-th true position (in row-major order) reads source.flatten()[k]."""
    shape = x.type.shape
    m = mask if mask.type.shape == shape else cx.emit("broadcast_to", mask, shape=shape)
    total = int(np.prod(shape))
    mflat = cx.emit("reshape", m, shape=(total,))
    k = cx.emit("sub", cx.emit("cumsum", cx.emit("cast", mflat, dtype=i64), axis=0), cx.scalar(1, i64))
    src_total = int(np.prod(source.type.shape))
    k = cx.emit("minimum", cx.emit("maximum", k, cx.scalar(0, i64)), cx.scalar(max(src_total - 1, 0), i64))
    vals = cx.emit("index_select", cx.emit("reshape", source, shape=(src_total,)), k, axis=0)
    out = cx.emit("where", mflat, vals, cx.emit("reshape", x, shape=(total,)))
    return cx.emit("reshape", out, shape=shape)


def _cdist(cx: AtenConverter, a: Value, b: Value, p: float = 2.0, compute_mode: Any = None) -> Value:
    """Pairwise p-norm distances [..., P, M] x [..., R, M] -> [..., P, R] from the differences."""
    d = cx.emit("sub", cx.emit("unsqueeze", a, axes=(a.type.rank - 1,)), cx.emit("unsqueeze", b, axes=(b.type.rank - 2,)))
    ad = cx.emit("abs", d)
    last = (d.type.rank - 1,)
    p = float(p)
    if p == 0:
        nz = cx.emit("cast", cx.emit("not_equal", ad, cx.scalar(0.0, ad.type.dtype)), dtype=ad.type.dtype)
        return cx.emit("sum", nz, axes=last, keepdim=False)
    if p == float("inf"):
        return cx.emit("max", ad, axes=last, keepdim=False)
    if p == 1:
        return cx.emit("sum", ad, axes=last, keepdim=False)
    if p == 2:
        return cx.emit("sqrt", cx.emit("sum", cx.emit("mul", d, d), axes=last, keepdim=False))
    s = cx.emit("sum", cx.emit("pow", ad, cx.scalar(p, ad.type.dtype)), axes=last, keepdim=False)
    return cx.emit("pow", s, cx.scalar(1.0 / p, ad.type.dtype))


def _adaptive_avg_pool3d(cx: AtenConverter, x: Value, output_size: Sequence[int]) -> Value:
    """Over the last three dims, each a product with its averaging matrix (the depth moved
    next to last for its product, then back)."""
    od, oh, ow = ntuple(output_size, 3)
    d, h, w = x.type.shape[-3:]
    dt = x.type.dtype
    y = cx.emit("matmul", x, _const(cx, _adaptive_matrix(w, ow, dt).T))
    y = cx.emit("matmul", _const(cx, _adaptive_matrix(h, oh, dt)), y)
    r = y.type.rank
    perm = tuple(range(r - 3)) + (r - 2, r - 3, r - 1)          # [.., D, oh, ow] -> [.., oh, D, ow]
    y = cx.emit("matmul", _const(cx, _adaptive_matrix(d, od, dt)), cx.emit("transpose", y, perm=perm))
    return cx.emit("transpose", y, perm=perm)


def _pdist(cx: AtenConverter, x: Value, p: float = 2.0) -> Value:
    """The distances between rows i < j of x [N, M], in row-major order of the pairs."""
    n = x.type.shape[0]
    full = _cdist(cx, x, x, p)
    iu = np.triu_indices(n, 1)
    return _positions(cx, full, (iu[0] * n + iu[1]).astype(np.int64))


def _div_mode(cx: AtenConverter, a: Any, b: Any, *, rounding_mode: str | None = None) -> Value:
    """div with rounding_mode None (true division), "trunc" or "floor", as PyTorch computes
    them. Floats: trunc(a / b); floor by Python's algorithm, which PyTorch follows
    ((a - fmod(a, b)) / b, one down when the remainder's sign differs from b's, then the
    nearest integer), a / b where b is 0. Integers: partita's exact int_div (a zero divisor
    raises at run time, as eager does; INT_MIN / -1 wraps); bool operands count as integers."""
    x, y = cx.operand(a, b), cx.operand(b, a)
    if rounding_mode is None:
        return cx.emit("div", x, y)
    if rounding_mode not in ("trunc", "floor"):
        raise Unsupported(f"aten.div: rounding_mode {rounding_mode!r}; torch takes None, 'trunc' or 'floor'")
    out = cx.out_type().dtype
    if not out.is_float:
        x, y = (v if v.type.dtype is out else cx.emit("cast", v, dtype=out) for v in (x, y))
        return cx.emit("int_div", x, y, rounding=rounding_mode)
    if x.type.dtype is not out:
        x = cx.emit("cast", x, dtype=out)
    if y.type.dtype is not out:
        y = cx.emit("cast", y, dtype=out)
    if rounding_mode == "trunc":
        return cx.emit("trunc", cx.emit("div", x, y))
    zero, one, half = cx.scalar(0.0, out), cx.scalar(1.0, out), cx.scalar(0.5, out)
    mod = cx.emit("fmod", x, y)
    q = cx.emit("div", cx.emit("sub", x, mod), y)
    adjust = cx.emit("logical_and", cx.emit("not_equal", mod, zero),
                     cx.emit("not_equal", cx.emit("less", y, zero), cx.emit("less", mod, zero)))
    q = cx.emit("where", adjust, cx.emit("sub", q, one), q)
    fl = cx.emit("floor", q)
    fl = cx.emit("where", cx.emit("greater", cx.emit("sub", q, fl), half), cx.emit("add", fl, one), fl)
    # b == 0: a / b (inf or nan); a zero quotient keeps the sign of a / b.
    true = cx.emit("div", x, y)
    fl = cx.emit("where", cx.emit("equal", fl, zero), cx.emit("mul", zero, true), fl)
    return cx.emit("where", cx.emit("equal", y, zero), true, fl)


def _atan2(cx: AtenConverter, y: Value, x: Value) -> Value:
    """atan2 from atan(y / x) with the quadrant added: +pi (y >= 0) or -pi (y < 0) where x < 0,
    +-pi/2 or 0 where x == 0."""
    dt = cx.out_type().dtype
    y, x = (v if v.type.dtype is dt else cx.emit("cast", v, dtype=dt) for v in (y, x))
    zero = cx.scalar(0.0, dt)
    r = cx.emit("atan", cx.emit("div", y, x))
    neg_x = cx.emit("less", x, zero)
    pi = cx.emit("where", cx.emit("less", y, zero), cx.scalar(-np.pi, dt), cx.scalar(np.pi, dt))
    r = cx.emit("where", neg_x, cx.emit("add", r, pi), r)
    on_axis = cx.emit("where", cx.emit("greater", y, zero), cx.scalar(np.pi / 2, dt),
                      cx.emit("where", cx.emit("less", y, zero), cx.scalar(-np.pi / 2, dt),
                              cx.emit("where", neg_x, pi, zero)))
    return cx.emit("where", cx.emit("equal", x, zero), on_axis, r)


ATEN_TO_PARTITA.update({
    aten.div.Tensor_mode: _div_mode,
    aten.div.Scalar_mode: _div_mode,
    aten.atan2.default: _atan2,
    aten.sign.default: _unary("sign"),
    aten._adaptive_avg_pool3d.default: _adaptive_avg_pool3d,
    aten._pdist_forward.default: _pdist,
    aten.any.default: _any,
    aten.any.dim: _any,
    aten.any.dims: _any,
    aten.logical_xor.default: _logical_xor,
    aten.diagonal.default: _diagonal,
    aten.flip.default: _flip,
    aten.max.dim: _max_min_dim("max", "argmax"),
    aten.min.dim: _max_min_dim("min", "argmin"),
    aten.prod.default: _prod,
    aten.prod.dim_int: _prod,
    aten.log2.default: _log_base(2.0),
    aten.log10.default: _log_base(10.0),
    aten.log1p.default: _log1p,
    aten.expm1.default: _expm1,
    aten.native_group_norm.default: _group_norm,
    aten.upsample_nearest2d.vec: _upsample_nearest,
    aten.upsample_bilinear2d.vec: _upsample_bilinear,
    aten.masked_scatter.default: _masked_scatter,
    aten._cdist_forward.default: _cdist,
})


def core_aten_missing() -> list[str]:
    """The overloads of torch's core ATen opset (tagged ``core``) that neither a converter
    handles nor the decomposition table breaks up, by name (``aten.flip.default``); the list,
    with the reason for each, is in docs/frontend.md and a test keeps the two equal."""
    table = decomposition_table()
    missing = []
    # Every aten operator registered, not only those some code has looked up already
    # (``torch.ops.aten`` makes its packets on first access, so ``dir`` alone depends on what ran).
    names = {s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")}
    for name in sorted(names | set(dir(aten))):
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags and op not in ATEN_TO_PARTITA and op not in table:
                missing.append(str(op))
    return sorted(missing)


# --- scatters, index_put, slice_scatter, cumprod ---------------------------------------------------
# (aten.select_scatter needs no converter: the core table spells it where(arange == index, src, x),
# all ops converted above.)

def _scatter_src(cx: AtenConverter, x: Value, dim: int, index: Value, src: Value, reduce: str | None = None) -> Value:
    red = {None: "none", "add": "add", "multiply": "mul"}.get(reduce)
    if red is None:
        raise Unsupported(f"aten.scatter: reduce='{reduce}' is not one of 'add', 'multiply'")
    if src.type.dtype != x.type.dtype:
        src = cx.emit("cast", src, dtype=x.type.dtype)
    return cx.emit("scatter_elements", x, index, src, axis=wrap_dim(dim, x.type.rank), reduction=red)


def _scatter_value(cx: AtenConverter, x: Value, dim: int, index: Value, value: Any, reduce: str | None = None) -> Value:
    src = cx.emit("full", shape=index.type.shape, value=_fill(value, x.type.dtype), dtype=x.type.dtype)
    return _scatter_src(cx, x, dim, index, src, reduce)


def _scatter_add(cx: AtenConverter, x: Value, dim: int, index: Value, src: Value) -> Value:
    return cx.emit("scatter_add", x, index, src, axis=wrap_dim(dim, x.type.rank))


_SCATTER_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


def _scatter_reduce(cx: AtenConverter, x: Value, dim: int, index: Value, src: Value, reduce: str,
                    include_self: bool = True) -> Value:
    """torch.scatter_reduce: partita's scatter_elements combines with x's value; without
    include_self the positions the index reaches are first reset to the reduction's identity
    (a plain scatter of it), which leaves what the reduction sees exactly the sources."""
    axis = wrap_dim(dim, x.type.rank)
    dt = x.type.dtype
    if reduce == "mean":
        if not dt.is_float:
            raise Unsupported(f"aten.scatter_reduce: reduce='mean' on {dt} (torch floors integer means) is not "
                              "supported; cast to a float dtype first")
        ones = cx.emit("full", shape=index.type.shape, value=1.0, dtype=dt)
        count = cx.emit("scatter_add", cx.emit("full", shape=x.type.shape, value=0.0, dtype=dt), index, ones, axis=axis)
        base = x if include_self else cx.emit("scatter_elements", x, index,
                                              cx.emit("full", shape=index.type.shape, value=0.0, dtype=dt), axis=axis)
        total = cx.emit("scatter_add", base, index, src, axis=axis)
        denom = (cx.emit("add", count, cx.scalar(1.0, dt)) if include_self
                 else cx.emit("maximum", count, cx.scalar(1.0, dt)))
        return cx.emit("div", total, denom)
    if reduce not in _SCATTER_REDUCE:
        raise Unsupported(f"aten.scatter_reduce: reduce='{reduce}' is not one of sum, prod, mean, amax, amin")
    red = _SCATTER_REDUCE[reduce]
    if not include_self:
        if red in ("add", "mul"):
            ident: Any = 0 if red == "add" else 1
        elif dt.is_float:
            ident = float("-inf") if red == "max" else float("inf")
        elif dt.is_bool:
            ident = red == "min"
        else:
            info = np.iinfo(dt.np)
            ident = int(info.min if red == "max" else info.max)
        fill = cx.emit("full", shape=index.type.shape, value=_fill(ident, dt), dtype=dt)
        x = cx.emit("scatter_elements", x, index, fill, axis=axis)
    return cx.emit("scatter_elements", x, index, src, axis=axis, reduction=red)


def _index_put(cx: AtenConverter, x: Value, indices: Sequence[Value | None], values: Value,
               accumulate: bool = False) -> Value:
    """x[..., i0, i1, ...] = values (or +=, with accumulate): the index tensors on one run of
    adjacent dims after any number of full slices (None), as ``_index`` reads them. The
    indexed dims go to the front and are flattened, values are broadcast to the indexing
    result and laid out the same way, and one scatter_elements along the flattened dim writes
    (or adds) each row."""
    lead, idx = _index_run(indices, "aten.index_put", ("x[i, :, j] = v", " (x[mask] = v)"))
    k, rank = len(idx), x.type.rank
    front = tuple(range(lead, lead + k)) + tuple(range(lead)) + tuple(range(lead + k, rank))
    xt = cx.emit("transpose", x, perm=front) if lead else x
    dims, rest = xt.type.shape[:k], xt.type.shape[k:]
    linear = linearize_index(cx, idx, dims)
    batch = linear.type.shape
    # torch places the index dims where the first indexed dim was: values broadcast to that.
    target = x.type.shape[:lead] + batch + x.type.shape[lead + k:]
    if values.type.dtype != x.type.dtype:
        values = cx.emit("cast", values, dtype=x.type.dtype)
    if values.type.shape != target:
        values = cx.emit("broadcast_to", values, shape=target)
    if lead:
        r = len(batch)
        to_front = tuple(range(lead, lead + r)) + tuple(range(lead)) + tuple(range(lead + r, len(target)))
        values = cx.emit("transpose", values, perm=to_front)
    m, width = int(np.prod(batch, dtype=np.int64)), int(np.prod(rest, dtype=np.int64))
    rows = int(np.prod(dims, dtype=np.int64))
    where = cx.emit("broadcast_to", cx.emit("reshape", linear, shape=(m, 1)), shape=(m, width))
    y = cx.emit("scatter_elements", cx.emit("reshape", xt, shape=(rows, width)), where,
                cx.emit("reshape", values, shape=(m, width)), axis=0, reduction="add" if accumulate else "none")
    y = cx.emit("reshape", y, shape=xt.type.shape)
    if lead:
        back = tuple(range(k, k + lead)) + tuple(range(k)) + tuple(range(k + lead, rank))
        y = cx.emit("transpose", y, perm=back)
    return y


def _slice_scatter(cx: AtenConverter, x: Value, src: Value, dim: int = 0, start: int | None = None,
                   end: int | None = None, step: int = 1) -> Value:
    """x with x[start:end:step] along dim replaced by src: a scatter whose index along the
    axis is start + step * position (each target once)."""
    axis = wrap_dim(dim, x.type.rank)
    lo, hi, st = slice(start, end, step).indices(x.type.shape[axis])
    if len(range(lo, hi, st)) != src.type.shape[axis]:
        raise Unsupported(f"aten.slice_scatter: src {src.type} does not fit the slice {lo}:{hi}:{st} of {x.type}")
    idx = cx.emit("iota", shape=src.type.shape, axis=axis, dtype=i64)
    if st != 1:
        idx = cx.emit("mul", idx, cx.scalar(st, i64))
    if lo:
        idx = cx.emit("add", idx, cx.scalar(lo, i64))
    if src.type.dtype != x.type.dtype:
        src = cx.emit("cast", src, dtype=x.type.dtype)
    return cx.emit("scatter_elements", x, idx, src, axis=axis)


def _cumprod(cx: AtenConverter, x: Value, dim: int, dtype: Any = None) -> Value:
    if dtype is not None:
        x = _to_copy(cx, x, dtype)
    return cx.emit("cumprod", x, axis=wrap_dim(dim, x.type.rank))


ATEN_TO_PARTITA.update({
    aten.scatter.src: _scatter_src,
    aten.scatter.value: _scatter_value,
    aten.scatter.reduce: _scatter_src,
    aten.scatter.value_reduce: _scatter_value,
    aten.scatter_add.default: _scatter_add,
    aten.scatter_reduce.two: _scatter_reduce,
    aten.index_put.default: _index_put,
    aten.slice_scatter.default: _slice_scatter,
    aten.cumprod.default: _cumprod,
})


def _getitem(cx: AtenConverter, results: Any, index: int) -> Any:
    value = results[index]
    if value is None:
        raise Unsupported(f"result {index} of {_target_name(cx.node.args[0])} is used, but partita "
                          "computes only its first result")
    return value


_PYTHON_FUNCTIONS: dict[Any, Conv] = {operator.getitem: _getitem}


# --- the walk ----------------------------------------------------------------------------------

def _map_args(cx: AtenConverter, a: Any) -> Any:
    fx = torch.fx
    if isinstance(a, fx.Node):
        return cx.env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_map_args(cx, x) for x in a)
    return a


def _has_poison(a: Any) -> bool:
    if a is _POISON:
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_poison(x) for x in a)
    return False


def _check_type(node: Any, result: Any, loc: Location | None) -> None:
    """The inferred partita type of each result must match what torch.export recorded."""
    val = node.meta.get("val")
    if val is None:
        return
    pairs = list(zip(result, val)) if isinstance(result, tuple) else [(result, val)]
    for i, (v, tv) in enumerate(pairs):
        if not isinstance(v, Value) or not isinstance(tv, torch.Tensor):
            continue
        expected = tensor_type_of(tv, node)
        if v.type != expected:
            which = f" result {i}" if isinstance(result, tuple) else ""
            where = f"{loc}: " if loc else ""
            raise FrontendError(
                f"{where}{_target_name(node)} ({node.name}){which}: partita inferred {v.type} but torch.export "
                f"recorded {expected}; the converter for this op disagrees with PyTorch's semantics")


def _input_roles(ep: Any) -> dict[str, tuple[str, Any]]:
    """placeholder name -> (role, value or None) from the export's graph signature."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    roles: dict[str, tuple[str, Any]] = {}
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            # A bool, None, int, float or str argument: torch.export specialized the program
            # on its value, so it is a constant of the export, not an input of the graph.
            roles[name] = ("python", spec.arg.value)
        elif spec.kind == InputKind.USER_INPUT:
            roles[name] = ("input", None)
        elif spec.kind == InputKind.PARAMETER:
            roles[name] = ("param", ep.state_dict[spec.target])
        elif spec.kind == InputKind.BUFFER:
            value = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            roles[name] = ("state", value)
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            roles[name] = ("constant", ep.constants[spec.target])
        else:
            raise FrontendError(f"input '{name}' of kind {spec.kind.name} is not supported by the importer")
    return roles


def _weight_names(ep: Any) -> dict[str, str]:
    """placeholder name -> the module's dotted attribute path (e.g. ``layer1.0.conv1.weight``)."""
    return {spec.arg.name: spec.target for spec in ep.graph_signature.input_specs if spec.target is not None}


def _configs(module: Any) -> list[Any]:
    """Every model config reachable from ``module``: each submodule's ``config`` (T5's and
    BART's stacks keep their own copies) and the configs nested in them (a decoder's, a
    text model's)."""
    found: dict[int, Any] = {}

    def visit(c: Any) -> None:
        if id(c) in found:
            return
        found[id(c)] = c
        for v in vars(c).values():
            if hasattr(v, "to_dict") and hasattr(v, "use_cache"):
                visit(v)
    for m in module.modules() if hasattr(module, "modules") else ():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "to_dict"):
            visit(c)
    return list(found.values())


@contextlib.contextmanager
def _without_kv_cache(module: Any) -> Iterator[None]:
    """Export a Hugging Face model without its key/value cache, restoring the configs after.

    With ``use_cache`` on, such a model returns a cache object that torch.export cannot
    flatten. partita imports the model's computation (the logits and hidden states), which
    the cache does not change, so the user can pass the model as it is. Every config of the
    model is switched off, not only the top one: T5's decoder stack keeps its own copy.
    """
    switched = [c for c in _configs(module) if getattr(c, "use_cache", False) is True]
    for c in switched:
        c.use_cache = False
    try:
        yield
    finally:
        for c in switched:
            c.use_cache = True


def convert_call(cx: AtenConverter, node: Any, converters: dict[Any, Conv] | None = None) -> None:
    """Convert one ``call_function`` node with its entry in ``converters`` (default
    ``ATEN_TO_PARTITA``; ``operator.getitem`` always has its own), binding its result in
    ``cx.env``. An op without a converter, or a case its converter cannot express, is recorded
    in ``cx.problems`` with its source line and its result poisoned; nodes that read only
    poisoned results are skipped. Shared by ``import_torch`` and the FX importer
    (``partita.frontend.fx``)."""
    table = ATEN_TO_PARTITA if converters is None else converters
    loc = source_location(node)
    dynamic = _data_dependent_shape(node.meta.get("val"))
    if dynamic is not None:
        where = f"{loc}: " if loc else ""
        raise FrontendError(
            f"{where}{_target_name(node)} ({node.name}) makes a tensor of shape {dynamic}, which depends "
            "on the input data; partita needs static shapes. Compute it with a fixed shape instead "
            "(for example a mask and where() in place of nonzero() or boolean indexing), or keep this "
            "step outside the imported module")
    args = _map_args(cx, node.args)
    kwargs = {k: _map_args(cx, a) for k, a in node.kwargs.items()}
    conv = table.get(node.target) or _PYTHON_FUNCTIONS.get(node.target)
    if conv is None:
        cx.problems.append((_target_name(node), loc, "no converter"))
        cx.env[node] = _POISON
        return
    if _has_poison(args) or _has_poison(list(kwargs.values())):
        cx.env[node] = _POISON
        return
    cx.b.loc = loc
    try:
        result = conv(cx, *args, **kwargs)
    except Unsupported as e:
        cx.problems.append((_target_name(node), loc, str(e)))
        cx.env[node] = _POISON
        return
    except TypeError as e:
        # The op has an argument form its converter was not written for.
        cx.problems.append((_target_name(node), loc, f"arguments the converter does not handle ({e})"))
        cx.env[node] = _POISON
        return
    except PartitaError as e:
        where = f"{loc}: " if loc else ""
        raise FrontendError(f"{where}converting {_target_name(node)} ({node.name}): {e}") from e
    _check_type(node, result, loc)
    cx.env[node] = result


def import_torch(module: Any, example_args: Sequence[Any], example_kwargs: dict[str, Any] | None = None,
                 *, name: str | None = None, timings: dict[str, float] | None = None, moe_groups: int = 1,
                 capacity_factor: float | None = None) -> Graph:
    """Export ``module`` with ``torch.export`` on the example inputs and convert it to a Graph.

    Parameters become ``param`` inputs and buffers ``state`` inputs, named by their attribute
    path, with their values in ``graph.weights``; user inputs keep their argument names. Each
    node's location is the model source line it came from. Raises ``FrontendError`` listing
    every unsupported ATen op (with its source line) if any op cannot be converted.

    Mixture-of-experts layers of transformers models (Mixtral, Qwen-MoE) are exported in
    GShard's static dispatch form (``partita.frontend.moe``): the tokens cut into
    ``moe_groups`` groups (the expert-parallel strategy needs it to be a multiple of the
    data-parallel width), each expert taking every token of a group it is routed
    (``capacity_factor=None``: none dropped, the eager result) or GShard's capacity.

    With ``timings`` (a dict), the seconds spent in ``torch.export`` plus the decompositions
    (key ``"export"``) and in partita's conversion (key ``"convert"``) are stored there, so the
    import cost can be split between torch and partita (``bench/bench_import.py``).
    """
    import time

    from ..backend.torch_exec import to_numpy
    from ..ir.attrs import DenseAttr

    t0 = time.perf_counter()
    try:
        with _without_kv_cache(module), static_experts(module, moe_groups, capacity_factor):
            ep = torch.export.export(module, tuple(example_args), example_kwargs)
    except PartitaError:
        raise
    except Exception as e:  # torch raises many types; the user needs the message, not the class
        raise FrontendError(f"torch.export failed on {type(module).__name__}: {type(e).__name__}: {e}") from e
    ep = ep.run_decompositions(decomposition_table())
    if ep.graph_signature.buffers_to_mutate or ep.graph_signature.user_inputs_to_mutate:
        mutated = list(ep.graph_signature.buffers_to_mutate.values()) + list(
            ep.graph_signature.user_inputs_to_mutate.values())
        raise FrontendError(f"{type(module).__name__} mutates {', '.join(mutated)} in forward; partita imports "
                            "pure inference graphs (call module.eval() before importing)")

    t1 = time.perf_counter()
    graph = Graph(name or type(module).__name__)
    cx = AtenConverter(graph)
    roles = _input_roles(ep)
    targets = _weight_names(ep)
    tied: dict[int, Value] = {}
    for node in ep.graph.nodes:
        cx.node = node
        if node.op == "placeholder":
            role, value = roles[node.name]
            if role == "python":
                cx.env[node] = value
                continue
            t = tensor_type_of(node.meta["val"], node)
            if role == "constant":
                if getattr(value, "is_meta", False):
                    raise FrontendError(f"{type(module).__name__}: the constant tensor {node.name} is on torch's meta "
                                        f"device and has no values to import; make it a buffer or build it on cpu")
                cx.env[node] = cx.b.emit("constant", value=DenseAttr(to_numpy(value)))
                continue
            if value is not None and id(value) in tied:
                # A tied weight (e.g. GPT-2's lm_head and token embedding): torch.export lists
                # it once per attribute path; it is one parameter, so its gradient sums both uses.
                cx.env[node] = tied[id(value)]
                continue
            input_name = targets.get(node.name, node.name) if role != "input" else node.name
            v = cx.b.input(input_name, t, role)
            cx.env[node] = v
            if value is not None:
                # A module built on torch's meta device has shapes and no values: its params
                # become inputs without arrays (a weightless graph, as partita.models builds).
                if not getattr(value, "is_meta", False):
                    graph.weights[input_name] = to_numpy(value)
                tied[id(value)] = v
        elif node.op == "call_function":
            convert_call(cx, node)
        elif node.op == "output":
            if cx.problems:
                raise FrontendError(_unsupported_message(type(module).__name__, cx.problems))
            outs = []
            for i, a in enumerate(node.args[0]):
                out = cx.env.get(a) if isinstance(a, torch.fx.Node) else None
                if not isinstance(out, Value):
                    raise FrontendError(f"output {i} of {type(module).__name__} is {a!r}, not a tensor; "
                                        "partita graphs return tensors only")
                outs.append(out)
            cx.b.ret(*outs)
        else:
            raise FrontendError(f"FX node '{node.name}' has kind '{node.op}', which the importer does not handle")
    if timings is not None:
        timings["export"] = t1 - t0
        timings["convert"] = time.perf_counter() - t1
    return graph


def decomposition_table() -> Any:
    """The decompositions the importer runs: PyTorch's core ATen table without the ops in
    ``_KEEP_WHOLE``. A converter in ``ATEN_TO_PARTITA`` runs only for an op this table leaves
    whole; for any op in the table torch.export has already broken it into smaller ops
    before a converter could see it (tests/frontend/test_torch_export.py checks this)."""
    table = torch.export.default_decompositions()
    for op in _KEEP_WHOLE:
        if op in table:
            del table[op]
    return table


# Ops the core ATen table would decompose but that partita has whole, so that their converter
# runs (each is an op the table would otherwise break up; the test checks that too):
_KEEP_WHOLE = (
    # Its decomposition fails on common attention code (a view of a transposed tensor), and
    # it converts to one fused ``attention`` op per layer.
    aten.scaled_dot_product_attention.default,
    # The table spells it sigmoid(x) * x; partita's silu has one fused gradient (silu_grad).
    aten.silu.default,
)


def _unsupported_message(model: str, problems: list[tuple[str, Location | None, str]]) -> str:
    ops = sorted({p[0] for p in problems})
    lines = [f"cannot import {model}: {len(problems)} unsupported op use(s) of {len(ops)} op(s) "
             f"({', '.join(ops)}):"]
    for op, loc, why in problems:
        where = str(loc) if loc else "<unknown location>"
        lines.append(f"  {where}: {op}" + ("" if why == "no converter" else f": {why}"))
    lines.append("add a converter to ATEN_TO_PARTITA in partita/frontend/torch_export.py, or rewrite the "
                 "model code at these lines (a converter runs only for an op the decomposition table leaves "
                 "whole: to convert an op that the table breaks up, such as aten.hardswish, also add it to "
                 "_KEEP_WHOLE there; see docs/adding-an-op.md)")
    return "\n".join(lines)
