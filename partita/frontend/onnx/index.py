"""ONNX's indexing, reduction and layout operators, composed from partita's core ops.

Arg- and value reductions (ArgMax, ArgMin, ReduceSum, ReduceMean, ReduceMax, ReduceMin,
ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare, GlobalMaxPool,
Hardmax), scans (CumSum,
CumProd), indexed reads and writes (GatherElements, GatherND, ScatterElements, ScatterND,
Scatter, OneHot, ReverseSequence, TopK), and creation and layout (Range, Trilu, Size, EyeLike,
DepthToSpace, SpaceToDepth).

ONNX allows negative indices (counted from the end of their axis) in the gathers and
scatters; they are normalized here (``where(i < 0, i + size, i)``) before partita's ops,
which take indices in 0..size-1. GatherND and ScatterND linearize each index tuple and work
on the data flattened over the indexed dims (exact integer arithmetic). Operands that set
shapes (axes, CumSum's axis, TopK's K, Range's operands, OneHot's depth, Trilu's k) must be
constants; each refusal names the node and the fix.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.attrs import DenseAttr
from ...ir.graph import Value
from .common import Converter, OnnxNode, attr_text, axes_operand, onnx_dtype, reverse_axis
from .registry import converter

Result = list[Value | None]


def _axis(n: OnnxNode, axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` normalized into [0, rank), or an error naming it."""
    if not -rank <= axis < rank:
        raise n.error(f"{what} {axis} is outside [-{rank}, {rank - 1}] for a rank-{rank} input")
    return axis + rank if axis < 0 else axis


def _const_int(n: OnnxNode, i: int, what: str) -> int:
    """A constant integer scalar (or one-element tensor) input."""
    arr = np.asarray(n.const(i, what))
    if arr.size != 1:
        raise n.error(f"{what} (input {i}) must hold one value; it has shape {list(arr.shape)}")
    if arr.dtype.kind not in "iu":
        raise n.error(f"{what} (input {i}) must be an integer; it is {arr.dtype}")
    return int(arr.reshape(()))


def _i64(n: OnnxNode, v: Value) -> Value:
    return v if v.type.dtype is dt.i64 else n.emit("cast", v, dtype=dt.i64)


def _wrap(n: OnnxNode, idx: Value, size: Value | int) -> Value:
    """Negative indices counted from the end: ``where(idx < 0, idx + size, idx)``."""
    s = n.scalar(size, idx) if isinstance(size, int) else size
    return n.emit("where", n.emit("less", idx, n.scalar(0, idx)), n.emit("add", idx, s), idx)


def _const(n: OnnxNode, arr: np.ndarray, keep: bool = True) -> Value:
    """A constant node; with ``keep`` also readable by later constant operands."""
    if keep:
        n.ctx.consts[n.proto.output[0]] = arr
    return n.emit("constant", value=DenseAttr(arr))


# --- arg reductions -----------------------------------------------------------------------

def _arg(op: str) -> Converter:
    def convert(n: OnnxNode) -> Result:
        x = n.input(0)
        if x.type.rank == 0:
            raise n.error(f"the input {x.type} is rank 0; {op} needs an axis to reduce")
        axis = _axis(n, int(n.attr("axis", 0)), x.type.rank)
        keep = bool(n.attr("keepdims", 1))
        if x.type.dtype.is_bool:
            x = n.emit("cast", x, dtype=dt.u8)
        if not n.attr("select_last_index", 0):
            return [n.emit(op, x, axes=[axis], keepdim=keep)]
        # The last extremum: the first one of the reversed axis, counted from the other end.
        d = x.type.shape[axis]
        first = n.emit(op, reverse_axis(n, x, axis), axes=[axis], keepdim=keep)
        return [n.emit("sub", n.scalar(d - 1, first), first)]
    return convert


# --- value reductions ---------------------------------------------------------------------

def _reduce_args(n: OnnxNode) -> tuple[Value, list[int] | None, bool]:
    """(input, normalized axes or None for noop_with_empty_axes' identity, keepdims)."""
    x = n.input(0)
    axes = axes_operand(n, 1, 18)
    keep = bool(n.attr("keepdims", 1))
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return x, None, keep
        axes = list(range(x.type.rank))
    r = x.type.rank
    out = sorted({_axis(n, a, max(r, 1), "axis") for a in axes}) if r else []
    if len(out) != len(axes) and r:
        raise n.error(f"axes {axes} repeat an axis")
    return x, out, keep


def _empty_fill(n: OnnxNode, x: Value, axes: list[int], keep: bool, value: float) -> Value:
    """The result of a reduction over no elements: its identity, filled at the reduced shape."""
    shape = [1 if i in axes else d for i, d in enumerate(x.type.shape) if keep or i not in axes]
    if x.type.dtype.is_bool:
        return n.emit("full", shape=shape, value=value > 0, dtype=x.type.dtype)
    if x.type.dtype.is_int and math.isinf(value):
        info = np.iinfo(x.type.dtype.np)
        value = float(info.min if value < 0 else info.max)
    return n.emit("full", shape=shape, value=int(value) if x.type.dtype.is_int else value, dtype=x.type.dtype)


def _is_empty(x: Value, axes: list[int]) -> bool:
    return any(x.type.shape[a] == 0 for a in axes)


def _back(n: OnnxNode, y: Value, like: Value) -> Value:
    """``y`` cast back to ``like``'s dtype (ONNX reductions keep the input's type)."""
    return y if y.type.dtype is like.type.dtype else n.emit("cast", y, dtype=like.type.dtype)


def _float(n: OnnxNode, x: Value) -> Value:
    return x if x.type.dtype.is_float else n.emit("cast", x, dtype=dt.f64)


def _reduce_value(kind: str) -> Converter:
    def convert(n: OnnxNode) -> Result:
        x, axes, keep = _reduce_args(n)
        if axes is None:
            return [x]
        if x.type.dtype.is_bool and kind not in ("max", "min"):
            raise n.error(f"the input {x.type} is bool; cast it to a number type first")
        if kind in ("log_sum", "log_sum_exp") and not x.type.dtype.is_float:
            raise n.error(f"the input {x.type} must be a float tensor (the reduction takes a logarithm; "
                          "cast it first)")
        if kind in ("max", "min"):
            if _is_empty(x, axes):
                return [_empty_fill(n, x, axes, keep, -math.inf if kind == "max" else math.inf)]
            return [n.emit(kind, x, axes=axes, keepdim=keep)]
        if kind == "prod":
            return [_back(n, n.emit("prod", x, axes=axes, keepdim=keep), x)]
        if kind == "l1":
            return [_back(n, n.emit("sum", n.emit("abs", x), axes=axes, keepdim=keep), x)]
        if kind == "sum_square":
            return [_back(n, n.emit("sum", n.emit("mul", x, x), axes=axes, keepdim=keep), x)]
        if kind == "l2":
            f = _float(n, x)
            return [_back(n, n.emit("sqrt", n.emit("sum", n.emit("mul", f, f), axes=axes, keepdim=keep)), x)]
        if kind == "log_sum":
            return [n.emit("log", n.emit("sum", x, axes=axes, keepdim=keep))]
        # log_sum_exp, shifted by the max for range: log(sum(exp(x - m))) + m, with m finite.
        if _is_empty(x, axes):
            return [_empty_fill(n, x, axes, keep, -math.inf)]
        m = n.emit("max", x, axes=axes, keepdim=True)
        inf = n.emit("equal", n.emit("abs", m), n.scalar(math.inf, m))
        m = n.emit("where", inf, n.scalar(0.0, m), m)
        s = n.emit("log", n.emit("sum", n.emit("exp", n.emit("sub", x, m)), axes=axes, keepdim=keep))
        return [n.emit("add", s, m if keep else n.emit("reshape", m, shape=list(s.type.shape)))]
    return convert


@converter("GlobalMaxPool")
def _global_max_pool(n: OnnxNode) -> Result:
    x = n.input(0)
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs rank >= 3 (N, C, spatial...)")
    return [n.emit("max", x, axes=list(range(2, x.type.rank)), keepdim=True)]


@converter("Hardmax")
def _hardmax(n: OnnxNode) -> Result:
    x = n.input(0)
    if x.type.rank == 0:
        raise n.error(f"the input {x.type} is rank 0; Hardmax needs an axis")
    if n.ctx.opset < 13:  # pragma: no cover - models are upgraded to opset 13 first
        raise n.error("Hardmax before opset 13 (the flattened 2-D form) is not supported")
    axis = _axis(n, int(n.attr("axis", -1)), x.type.rank)
    if x.type.numel == 0:
        return [x]
    first = n.emit("argmax", x, axes=[axis], keepdim=True)
    pos = n.emit("iota", shape=list(x.type.shape), axis=axis, dtype=dt.i64)
    return [n.emit("cast", n.emit("equal", pos, first), dtype=x.type.dtype)]


# --- scans --------------------------------------------------------------------------------

def _scan(op: str, identity: float) -> Converter:
    def convert(n: OnnxNode) -> Result:
        x = n.input(0)
        if x.type.rank == 0:
            raise n.error(f"the input {x.type} is rank 0; {n.proto.op_type} scans along an axis of a tensor")
        if x.type.dtype.is_bool:
            raise n.error(f"the input {x.type} is bool; cast it to a number type first")
        axis = _axis(n, _const_int(n, 1, "the axis"), x.type.rank)
        reverse, exclusive = bool(n.attr("reverse", 0)), bool(n.attr("exclusive", 0))
        y = reverse_axis(n, x, axis) if reverse else x
        y = _back(n, n.emit(op, y, axis=axis), x)
        d = x.type.shape[axis]
        if exclusive and d:
            # Shift the inclusive scan one place along the axis, the identity in front.
            pads = [0] * (2 * x.type.rank)
            pads[2 * axis] = 1
            value: Any = int(identity) if not x.type.dtype.is_float else identity
            y = n.emit("slice", n.emit("pad", y, pads=pads, value=value), axis=axis, start=0, end=d)
        return [reverse_axis(n, y, axis) if reverse else y]
    return convert


# --- gathers and scatters -----------------------------------------------------------------

def _index_input(n: OnnxNode, i: int) -> Value:
    idx = n.input(i)
    if idx.type.dtype not in (dt.i32, dt.i64):
        raise n.error(f"the indices (input {i}) are {idx.type}; they must be int32 or int64")
    return idx


@converter("GatherElements")
def _gather_elements(n: OnnxNode) -> Result:
    x, idx = n.input(0), _index_input(n, 1)
    if x.type.rank == 0:
        raise n.error(f"the input {x.type} is rank 0; there is nothing to index")
    axis = _axis(n, int(n.attr("axis", 0)), x.type.rank)
    if idx.type.rank != x.type.rank:
        raise n.error(f"the indices {idx.type} must have the input's rank {x.type.rank}")
    return [n.emit("gather", x, _wrap(n, idx, x.type.shape[axis]), axis=axis)]


def _reduction_attr(n: OnnxNode) -> str:
    red = attr_text(n.attr("reduction", "none"))
    if red not in ("none", "add", "mul", "max", "min"):
        raise n.error(f"reduction '{red}' is not one of none, add, mul, max, min")
    return red


@converter("ScatterElements", "Scatter")
def _scatter_elements(n: OnnxNode) -> Result:
    x, idx, src = n.input(0), _index_input(n, 1), n.input(2)
    if x.type.rank == 0:
        raise n.error(f"the input {x.type} is rank 0; there is nothing to index")
    axis = _axis(n, int(n.attr("axis", 0)), x.type.rank)
    if idx.type.shape != src.type.shape:
        raise n.error(f"the indices {idx.type} and updates {src.type} must have the same shape")
    return [n.emit("scatter_elements", x, _wrap(n, idx, x.type.shape[axis]), src, axis=axis,
                   reduction=_reduction_attr(n))]


def _linear_index(n: OnnxNode, idx: Value, dims: tuple[int, ...]) -> Value:
    """The row-major position, in an array of shape ``dims``, of each index tuple along the
    last axis of ``idx`` (negative entries wrapped); the result drops that axis."""
    k = len(dims)
    idx = _i64(n, idx)
    sizes = n.emit("constant", value=DenseAttr(np.array(dims, np.int64)))
    idx = _wrap(n, idx, sizes)
    strides = np.array([math.prod(dims[j + 1:]) for j in range(k)], np.int64)
    return n.emit("sum", n.emit("mul", idx, n.emit("constant", value=DenseAttr(strides))), axes=[idx.type.rank - 1])


@converter("GatherND")
def _gather_nd(n: OnnxNode) -> Result:
    data, idx = n.input(0), _index_input(n, 1)
    b = int(n.attr("batch_dims", 0))
    r, q = data.type.rank, idx.type.rank
    if q < 1 or r < 1:
        raise n.error(f"data {data.type} and indices {idx.type} must both have rank >= 1")
    k = idx.type.shape[-1]
    if not 0 <= b < min(q, r):
        raise n.error(f"batch_dims {b} must be in [0, {min(q, r) - 1}] for data {data.type} and indices {idx.type}")
    if b + k > r:
        raise n.error(f"index tuples of length {k} after {b} batch dims exceed the data's rank {r}")
    if data.type.shape[:b] != idx.type.shape[:b]:
        raise n.error(f"the batch dims of data {data.type} and indices {idx.type} differ")
    batch, indexed, rest = data.type.shape[:b], data.type.shape[b:b + k], data.type.shape[b + k:]
    per = math.prod(indexed)
    linear = _linear_index(n, idx, indexed)
    if b:
        offsets = (np.arange(math.prod(batch), dtype=np.int64) * per).reshape(batch + (1,) * (q - 1 - b))
        linear = n.emit("add", linear, n.emit("constant", value=DenseAttr(offsets)))
    flat = n.emit("reshape", data, shape=[math.prod(batch) * per] + list(rest))
    picked = n.emit("index_select", flat, n.emit("reshape", linear, shape=[linear.type.numel]), axis=0)
    return [n.emit("reshape", picked, shape=list(idx.type.shape[:-1]) + list(rest))]


@converter("ScatterND")
def _scatter_nd(n: OnnxNode) -> Result:
    data, idx, upd = n.input(0), _index_input(n, 1), n.input(2)
    r, q = data.type.rank, idx.type.rank
    if q < 1 or r < 1:
        raise n.error(f"data {data.type} and indices {idx.type} must both have rank >= 1")
    k = idx.type.shape[-1]
    if k > r:
        raise n.error(f"index tuples of length {k} exceed the data's rank {r}")
    want = idx.type.shape[:-1] + data.type.shape[k:]
    if upd.type.shape != want:
        raise n.error(f"updates {upd.type} must have shape {list(want)} (indices.shape[:-1] + data.shape[{k}:])")
    rows, width = math.prod(data.type.shape[:k]), math.prod(data.type.shape[k:])
    m = math.prod(idx.type.shape[:-1])
    linear = n.emit("reshape", _linear_index(n, idx, data.type.shape[:k]), shape=[m, 1])
    where = n.emit("broadcast_to", linear, shape=[m, width])
    flat = n.emit("reshape", data, shape=[rows, width])
    y = n.emit("scatter_elements", flat, where, n.emit("reshape", upd, shape=[m, width]), axis=0,
               reduction=_reduction_attr(n))
    return [n.emit("reshape", y, shape=list(data.type.shape))]


@converter("ReverseSequence")
def _reverse_sequence(n: OnnxNode) -> Result:
    x, lens = n.input(0), n.input(1)
    r = x.type.rank
    if r < 2:
        raise n.error(f"the input {x.type} needs rank >= 2 (a batch axis and a time axis)")
    t_axis, b_axis = int(n.attr("time_axis", 0)), int(n.attr("batch_axis", 1))
    if {t_axis, b_axis} not in ({0, 1},):
        raise n.error(f"time_axis {t_axis} and batch_axis {b_axis} must be 0 and 1 (in either order)")
    if lens.type.shape != (x.type.shape[b_axis],) or not lens.type.dtype.is_int:
        raise n.error(f"sequence_lens {lens.type} must be integers of shape [{x.type.shape[b_axis]}] "
                      "(one length per batch entry)")
    # Position t of sequence b reads t' = len_b - 1 - t inside the sequence, t itself past it.
    shape = [1] * r
    shape[b_axis] = x.type.shape[b_axis]
    ln = n.emit("reshape", _i64(n, lens), shape=shape)
    t = n.emit("iota", shape=list(x.type.shape), axis=t_axis, dtype=dt.i64)
    flipped = n.emit("sub", n.emit("sub", ln, n.scalar(1, ln)), t)
    idx = n.emit("where", n.emit("less", t, ln), flipped, t)
    return [n.emit("gather", x, idx, axis=t_axis)]


@converter("OneHot", constant_operands=(1,))
def _one_hot(n: OnnxNode) -> Result:
    idx, values = n.input(0), n.input(2)
    depth_arr = np.asarray(n.const(1, "depth"))
    if depth_arr.size != 1:
        raise n.error(f"depth (input 1) must hold one value; it has shape {list(depth_arr.shape)}")
    depth = int(depth_arr.reshape(()))
    if depth < 1:
        raise n.error(f"depth {depth} must be positive")
    if values.type.numel != 2:
        raise n.error(f"values (input 2) {values.type} must hold two values, [off_value, on_value]")
    q = idx.type.rank
    axis = int(n.attr("axis", -1))
    if not -(q + 1) <= axis <= q:
        raise n.error(f"axis {axis} is outside [{-(q + 1)}, {q}] for indices {idx.type}")
    axis = axis + q + 1 if axis < 0 else axis
    if idx.type.dtype.is_bool:
        raise n.error(f"the indices {idx.type} must be numbers, not bool")
    # Non-integer indices truncate, as a cast to int64 does; negative ones count from depth,
    # and those still out of range match no position (all off_value).
    i = _wrap(n, _i64(n, idx), depth)
    shape = list(idx.type.shape[:axis]) + [depth] + list(idx.type.shape[axis:])
    pos = n.emit("iota", shape=shape, axis=axis, dtype=dt.i64)
    hit = n.emit("equal", pos, n.emit("unsqueeze", i, axes=[axis]))
    flat = n.emit("reshape", values, shape=[2])
    off = n.emit("reshape", n.emit("slice", flat, axis=0, start=0, end=1), shape=[])
    on = n.emit("reshape", n.emit("slice", flat, axis=0, start=1, end=2), shape=[])
    return [n.emit("where", hit, on, off)]


@converter("TopK", constant_operands=(1,))
def _topk(n: OnnxNode) -> Result:
    x = n.input(0)
    if x.type.rank == 0:
        raise n.error(f"the input {x.type} is rank 0; TopK selects along an axis")
    axis = _axis(n, int(n.attr("axis", -1)), x.type.rank)
    k = _const_int(n, 1, "K")
    if not 0 <= k <= x.type.shape[axis]:
        raise n.error(f"K={k} is outside [0, {x.type.shape[axis]}] for axis {axis} of the input {x.type}")
    values, idx = n.emit("topk", x, k=k, axis=axis, largest=bool(n.attr("largest", 1)),
                         sorted=bool(n.attr("sorted", 1)))
    return [values, idx]


# --- creation and layout ------------------------------------------------------------------

@converter("Range", constant_operands=(0, 1, 2))
def _range(n: OnnxNode) -> Result:
    start, limit, delta = (np.asarray(n.const(i, what)) for i, what in enumerate(("start", "limit", "delta")))
    for arr, what in ((start, "start"), (limit, "limit"), (delta, "delta")):
        if arr.size != 1:
            raise n.error(f"{what} must be a scalar; it has shape {list(arr.shape)}")
    if not start.dtype == limit.dtype == delta.dtype:
        raise n.error(f"start ({start.dtype}), limit ({limit.dtype}) and delta ({delta.dtype}) must have one type")
    s, e, d = start.reshape(()).item(), limit.reshape(()).item(), delta.reshape(()).item()
    if d == 0:
        raise n.error("delta is 0; the range would never reach its limit")
    count = max(math.ceil((e - s) / d), 0)
    # start + i * delta, computed in the operands' type as the ONNX function body does.
    arr = (start.reshape(()) + np.arange(count).astype(start.dtype) * delta.reshape(())).astype(start.dtype)
    return [_const(n, arr.reshape(count))]


@converter("Trilu", constant_operands=(1,))
def _trilu(n: OnnxNode) -> Result:
    x = n.input(0)
    if x.type.rank < 2:
        raise n.error(f"the input {x.type} needs rank >= 2 (a batch of matrices)")
    k = _const_int(n, 1, "k") if n.has_input(1) else 0
    rows, cols = x.type.shape[-2:]
    upper = bool(n.attr("upper", 1))
    keep = np.triu(np.ones((rows, cols), bool), k) if upper else np.tril(np.ones((rows, cols), bool), k)
    mask = n.emit("constant", value=DenseAttr(keep))
    zero: Any = False if x.type.dtype.is_bool else 0
    return [n.emit("where", mask, x, n.scalar(zero, x))]


@converter("Size")
def _size(n: OnnxNode) -> Result:
    return [_const(n, np.array(n.input(0).type.numel, np.int64))]


@converter("EyeLike")
def _eye_like(n: OnnxNode) -> Result:
    x = n.input(0)
    if x.type.rank != 2:
        raise n.error(f"the input {x.type} must be 2-D")
    code = n.attr("dtype")
    target = x.type.dtype if code is None else onnx_dtype(code, f"{n.where}: attribute 'dtype'")
    arr = np.eye(x.type.shape[0], x.type.shape[1], int(n.attr("k", 0)), dtype=target.np)
    return [_const(n, arr, keep=arr.size <= 1024)]


def _blocksize(n: OnnxNode, x: Value) -> int:
    b = int(n.attr("blocksize"))
    if b < 1:
        raise n.error(f"blocksize {b} must be positive")
    if x.type.rank != 4:
        raise n.error(f"the input {x.type} must be 4-D (N, C, H, W)")
    return b


@converter("DepthToSpace")
def _depth_to_space(n: OnnxNode) -> Result:
    x = n.input(0)
    b = _blocksize(n, x)
    N, C, H, W = x.type.shape
    if C % (b * b):
        raise n.error(f"the channels {C} are not divisible by blocksize^2 = {b * b}")
    mode = attr_text(n.attr("mode", "DCR"))
    c = C // (b * b)
    if mode == "DCR":
        y = n.emit("reshape", x, shape=[N, b, b, c, H, W])
        y = n.emit("transpose", y, perm=[0, 3, 4, 1, 5, 2])
    elif mode == "CRD":
        y = n.emit("reshape", x, shape=[N, c, b, b, H, W])
        y = n.emit("transpose", y, perm=[0, 1, 4, 2, 5, 3])
    else:
        raise n.error(f"mode '{mode}' is not DCR or CRD")
    return [n.emit("reshape", y, shape=[N, c, H * b, W * b])]


@converter("SpaceToDepth")
def _space_to_depth(n: OnnxNode) -> Result:
    x = n.input(0)
    b = _blocksize(n, x)
    N, C, H, W = x.type.shape
    if H % b or W % b:
        raise n.error(f"the spatial size {H}x{W} is not divisible by blocksize {b}")
    mode = attr_text(n.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise n.error(f"mode '{mode}' is not DCR or CRD")
    y = n.emit("reshape", x, shape=[N, C, H // b, b, W // b, b])
    # DCR puts the block offsets before the channel in the new depth, CRD after it.
    y = n.emit("transpose", y, perm=[0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return [n.emit("reshape", y, shape=[N, C * b * b, H // b, W // b])]


def _reduce(op: str, axes_input_since: int) -> Converter:
    def convert(n: OnnxNode) -> list[Value | None]:
        x = n.input(0)
        axes = axes_operand(n, 1, axes_input_since)
        keep = bool(n.attr("keepdims", 1))
        if not axes:
            if n.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.type.rank))
        return [n.emit(op, x, axes=axes, keepdim=keep)]
    return convert


# --- the reductions and scans made by a factory ---------------------------------------------

_ARG_REDUCTIONS: dict[str, Converter] = {"ArgMax": _arg("argmax"), "ArgMin": _arg("argmin")}
# ReduceSum takes axes as an input from opset 13, ReduceMean only from opset 18.
_SUM_MEAN: dict[str, Converter] = {"ReduceMean": _reduce("mean", 18), "ReduceSum": _reduce("sum", 13)}
_VALUE_REDUCTIONS: dict[str, Converter] = {
    "ReduceMax": _reduce_value("max"), "ReduceMin": _reduce_value("min"), "ReduceProd": _reduce_value("prod"),
    "ReduceL1": _reduce_value("l1"), "ReduceL2": _reduce_value("l2"), "ReduceLogSum": _reduce_value("log_sum"),
    "ReduceLogSumExp": _reduce_value("log_sum_exp"), "ReduceSumSquare": _reduce_value("sum_square"),
}
_SCANS: dict[str, Converter] = {"CumSum": _scan("cumsum", 0.0), "CumProd": _scan("cumprod", 1.0)}


@converter(*_ARG_REDUCTIONS)
def _arg_reduction(n: OnnxNode) -> Result:
    """ArgMax and ArgMin."""
    return list(_ARG_REDUCTIONS[n.proto.op_type](n))


@converter(*_SUM_MEAN, constant_operands=(1,))
def _sum_or_mean(n: OnnxNode) -> Result:
    """ReduceSum and ReduceMean."""
    return list(_SUM_MEAN[n.proto.op_type](n))


@converter(*_VALUE_REDUCTIONS, constant_operands=(1,))
def _value_reduction(n: OnnxNode) -> Result:
    """The other Reduce* ops."""
    return list(_VALUE_REDUCTIONS[n.proto.op_type](n))


@converter(*_SCANS, constant_operands=(1,))
def _scan_op(n: OnnxNode) -> Result:
    """CumSum and CumProd."""
    return list(_SCANS[n.proto.op_type](n))
