"""ONNX's tensor creation, cast and layout operators: Identity, Cast, Constant,
ConstantOfShape, Shape, Reshape, Flatten, Transpose, Concat, Split, Squeeze, Unsqueeze, Gather,
Expand, Tile, Slice and Pad.

Operands that set shapes (Reshape's target, Split's sizes, Squeeze/Unsqueeze axes, Pad's pads,
Expand's shape, Tile's repeats, Slice's bounds) must be constants; the constants these ops
produce (Shape, small ConstantOfShape fills, Constant) are kept for later such reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.attrs import DenseAttr
from ...ir.graph import Value
from ...ops.registry import TypeRuleError, broadcast_shapes
from .common import SMALL_CONST, OnnxNode, axes_operand, cast_attrs, np_for_partita, onnx_dtype, reverse_axis
from .registry import converter


@converter("Identity")
def _identity(n: OnnxNode) -> list[Value | None]:
    return [n.input(0)]


@converter("Cast")
def _cast(n: OnnxNode) -> list[Value | None]:
    return [n.emit("cast", n.input(0), dtype=onnx_dtype(n.attr("to"), f"{n.where}: attribute 'to'"), **cast_attrs(n))]


@converter("Constant")
def _constant(n: OnnxNode) -> list[Value | None]:
    keys = [k for k in n.attrs if k in ("value", "value_float", "value_int", "value_floats", "value_ints")]
    if len(keys) != 1:
        raise n.error(f"needs exactly one of value/value_float(s)/value_int(s); has {sorted(n.attrs)}")
    k = keys[0]
    v = n.attrs[k]
    if k == "value":
        arr = n.tensor_attr("value")
    elif k in ("value_float", "value_floats"):
        arr = np.array(v, dtype=np.float32)
    else:
        arr = np.array(v, dtype=np.int64)
    n.ctx.consts[n.proto.output[0]] = arr
    return [n.emit("constant", value=DenseAttr(np_for_partita(arr, n.where)))]


@converter("Reshape", constant_operands=(1,))
def _reshape(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    shape = [int(s) for s in n.const(1, "the target shape")]
    allowzero = bool(n.attr("allowzero", 0))
    if not allowzero:
        if any(s == 0 for s in shape[x.type.rank:]):
            raise n.error(f"shape {shape}: a 0 past the input's rank {x.type.rank} has no dim to copy")
        # 0 copies the input's dim at the same position.
        shape = [x.type.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    if shape.count(-1) > 1:
        raise n.error(f"shape {shape} has more than one -1")
    return [n.emit("reshape", x, shape=shape)]


@converter("Flatten")
def _flatten(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    r = x.type.rank
    axis = int(n.attr("axis", 1))
    if not -r <= axis <= r:
        raise n.error(f"axis {axis} is outside [-{r}, {r}] for input {x.type}")
    axis = axis + r if axis < 0 else axis
    outer = int(np.prod(x.type.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.type.shape[axis:], dtype=np.int64))
    return [n.emit("reshape", x, shape=[outer, inner])]


@converter("Transpose")
def _transpose(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    perm = n.attr("perm")
    return [n.emit("transpose", x, perm=list(perm) if perm is not None else list(range(x.type.rank))[::-1])]


@converter("Concat")
def _concat(n: OnnxNode) -> list[Value | None]:
    ins = [v for v in n.inputs if v is not None]
    return [n.emit("concat", *ins, axis=int(n.attr("axis")))]


@converter("Unsqueeze", constant_operands=(1,))
def _unsqueeze(n: OnnxNode) -> list[Value | None]:
    axes = axes_operand(n, 1, 13)
    if axes is None:
        raise n.error("Unsqueeze needs axes")
    return [n.emit("unsqueeze", n.input(0), axes=axes)]


@converter("Squeeze", constant_operands=(1,))
def _squeeze(n: OnnxNode) -> list[Value | None]:
    return [n.emit("squeeze", n.input(0), axes=axes_operand(n, 1, 13))]


@converter("Split", constant_operands=(1,))
def _split(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    axis = int(n.attr("axis", 0))
    r = x.type.rank
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    size = x.type.shape[axis + r if axis < 0 else axis]
    if n.has_input(1):  # opset >= 13: sizes as an input
        split = n.const(1, "the split sizes")
        if split.ndim != 1:
            raise n.error(f"the split sizes must be a 1-D tensor, got shape {list(split.shape)}")
        sizes = [int(s) for s in split]
    else:
        parts = int(n.attr("num_outputs", n.n_outputs()))
        if n.ctx.opset >= 18 and "num_outputs" not in n.attrs:
            raise n.error("since opset 18 Split needs either the 'split' input or 'num_outputs'")
        # ONNX: equal chunks of ceil(size / parts), the last one smaller.
        chunk = -(-size // parts)
        sizes = [min(chunk, size - k * chunk) for k in range(parts)]
        if any(s <= 0 for s in sizes):
            raise n.error(f"cannot split dim of size {size} into {parts} non-empty parts")
    if len(sizes) != n.n_outputs():
        raise n.error(f"{len(sizes)} split sizes {sizes} for {n.n_outputs()} outputs")
    out = n.emit("split", x, axis=axis, sizes=sizes)
    return list(out) if isinstance(out, tuple) else [out]


@converter("Gather")
def _gather(n: OnnxNode) -> list[Value | None]:
    x, idx = n.input(0), n.input(1)
    r = x.type.rank
    axis = int(n.attr("axis", 0))
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    axis = axis + r if axis < 0 else axis
    dim = x.type.shape[axis]
    # ONNX allows negative indices (counted from the end); partita's index_select does not.
    neg = n.emit("less", idx, n.scalar(0, idx))
    idx = n.emit("where", neg, n.emit("add", idx, n.scalar(dim, idx)), idx)
    flat = n.emit("reshape", idx, shape=[idx.type.numel])
    y = n.emit("index_select", x, flat, axis=axis)
    shape = list(x.type.shape[:axis]) + list(idx.type.shape) + list(x.type.shape[axis + 1:])
    return [n.emit("reshape", y, shape=shape)]


@converter("ConstantOfShape", constant_operands=(0,))
def _constant_of_shape(n: OnnxNode) -> list[Value | None]:
    shape = [int(d) for d in np.asarray(n.const(0, "shape")).reshape(-1)]
    arr = np.zeros(1, np.float32) if n.attr("value") is None else n.tensor_attr("value").reshape(-1)
    if arr.size != 1:
        raise n.error(f"attribute 'value' must hold one element (the fill value); it holds {arr.size}")
    dtype = dt.from_numpy(np_for_partita(arr, n.where).dtype)
    if int(np.prod(shape)) <= SMALL_CONST:
        # Small fills can feed operands that must be constants (a Reshape shape, Pad pads).
        n.ctx.consts[n.proto.output[0]] = np.full(shape, arr[0], dtype=arr.dtype)
    return [n.emit("full", shape=shape, value=arr[0].item(), dtype=dtype)]


@converter("Shape")
def _shape(n: OnnxNode) -> list[Value | None]:
    # partita shapes are static, so Shape is a constant.
    dims = list(n.input(0).type.shape)
    r = len(dims)
    start, end = int(n.attr("start", 0)), n.attr("end", None)
    arr = np.array(dims[slice(start, r if end is None else int(end))], dtype=np.int64)
    n.ctx.consts[n.proto.output[0]] = arr
    return [n.emit("constant", value=DenseAttr(arr))]


@converter("Pad", constant_operands=(1, 2, 3))
def _pad(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    mode = n.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise n.error(f"mode '{mode}' is not supported (constant, reflect, edge and wrap are)")
    r = x.type.rank
    pads = [int(p) for p in np.asarray(n.const(1, "pads")).reshape(-1)]
    axes = list(range(r))
    if n.has_input(3):
        axes = [int(v) for v in np.asarray(n.const(3, "axes")).reshape(-1)]
        if any(not -r <= a < r for a in axes):
            raise n.error(f"axes {axes} are outside [-{r}, {r - 1}] for input {x.type}")
        axes = [a + r if a < 0 else a for a in axes]
    if len(pads) != 2 * len(axes):
        raise n.error(f"pads has {len(pads)} entries; {len(axes)} padded axes need {2 * len(axes)}")
    pairs = [0, 0] * r
    for k, a in enumerate(axes):
        pairs[2 * a], pairs[2 * a + 1] = pads[k], pads[k + len(axes)]
    # Negative pads remove elements. Cropping first and padding what is left is what
    # onnxruntime does, and it matters for edge, reflect and wrap (the new border is copied).
    for axis in range(r):
        cut_before, cut_after = max(-pairs[2 * axis], 0), max(-pairs[2 * axis + 1], 0)
        if cut_before or cut_after:
            dim = x.type.shape[axis]
            if cut_before + cut_after > dim:
                raise n.error(f"negative pads remove {cut_before} + {cut_after} elements from axis {axis}, "
                              f"which has only {dim}")
            x = n.emit("slice", x, axis=axis, start=cut_before, end=dim - cut_after)
    pairs = [max(p, 0) for p in pairs]
    if not any(pairs):
        return [x]
    if mode != "constant":
        return [_pad_by_copies(n, x, pairs, mode)]
    value: Any = 0
    if n.has_input(2):
        value = np.asarray(n.const(2, "constant_value")).reshape(-1)[0].item()
    return [n.emit("pad", x, pads=pairs, value=value)]


def _pad_by_copies(n: OnnxNode, x: Value, pairs: list[int], mode: str) -> Value:
    """Reflect, edge or wrap padding as a concat of slices of the input: exact, and built
    from ops partita has (its pad op fills a constant only)."""
    y = x
    for axis in range(x.type.rank):
        before, after = pairs[2 * axis], pairs[2 * axis + 1]
        if before == 0 and after == 0:
            continue
        dim = y.type.shape[axis]
        if dim == 0:
            raise n.error(f"{mode} padding of axis {axis}, which is empty, has no values to copy")
        if mode == "reflect" and (before >= dim or after >= dim):
            raise n.error(f"reflect pads ({before}, {after}) on axis {axis} must be smaller than its size {dim}")

        def part(start: int, end: int) -> Value:
            return n.emit("slice", y, axis=axis, start=start, end=end)

        if mode == "reflect":
            left = [part(i, i + 1) for i in range(before, 0, -1)]
            right = [part(dim - 2 - i, dim - 1 - i) for i in range(after)]
        elif mode == "edge":
            left, right = [part(0, 1)] * before, [part(dim - 1, dim)] * after
        else:
            # Wrap: the input repeats around the axis as on a torus, so a pad longer than
            # the axis is whole copies plus the part that is left over.
            left = ([part(dim - before % dim, dim)] if before % dim else []) + [y] * (before // dim)
            right = [y] * (after // dim) + ([part(0, after % dim)] if after % dim else [])
        y = n.emit("concat", *left, y, *right, axis=axis)
    return y


@converter("Expand", constant_operands=(1,))
def _expand(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    shape = [int(d) for d in np.asarray(n.const(1, "shape")).reshape(-1)]
    # ONNX Expand broadcasts both ways: a 1 in `shape` keeps the input's dim.
    try:
        out = broadcast_shapes(tuple(x.type.shape), tuple(shape), op="Expand")
    except TypeRuleError:
        raise n.error(f"shape {shape} does not broadcast with input {x.type}") from None
    return [n.emit("broadcast_to", x, shape=list(out))]


@converter("Tile", constant_operands=(1,))
def _tile(n: OnnxNode) -> list[Value | None]:
    y = n.input(0)
    reps = [int(r) for r in np.asarray(n.const(1, "repeats")).reshape(-1)]
    if len(reps) != y.type.rank or any(r < 1 for r in reps):
        raise n.error(f"repeats {reps} must hold one count >= 1 per input dim ({y.type})")
    for axis, k in enumerate(reps):
        if k > 1:
            y = n.emit("concat", *([y] * k), axis=axis)
    return [y]


@converter("Slice", constant_operands=(1, 2, 3, 4))
def _slice(n: OnnxNode) -> list[Value | None]:
    y = n.input(0)
    r = y.type.rank
    starts = [int(v) for v in np.asarray(n.const(1, "starts")).reshape(-1)]
    ends = [int(v) for v in np.asarray(n.const(2, "ends")).reshape(-1)]
    axes = list(range(len(starts)))
    if n.has_input(3):
        axes = [int(v) for v in np.asarray(n.const(3, "axes")).reshape(-1)]
    steps = [1] * len(starts)
    if n.has_input(4):
        steps = [int(v) for v in np.asarray(n.const(4, "steps")).reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise n.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have one entry per "
                      "sliced axis")
    seen: set[int] = set()
    for a, s, e, st in zip(axes, starts, ends, steps):
        if not -r <= a < r:
            raise n.error(f"axis {a} is outside [-{r}, {r - 1}] for input {y.type}")
        a = a + r if a < 0 else a
        if a in seen:
            raise n.error(f"axis {a} is sliced twice (axes {axes})")
        seen.add(a)
        if st == 0:
            raise n.error(f"step 0 on axis {a}; steps must be non-zero")
        dim = y.type.shape[a]
        # ONNX's effective bounds: negatives count from the end, then clamp to [0, dim] going
        # forward, or to [0, dim - 1] (start) and [-1, dim - 1] (end) going backward. The
        # INT64 sentinels (INT_MAX, INT_MIN) land on the ends of the axis this way.
        s, e = s + dim if s < 0 else s, e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            if (s, e, st) != (0, dim, 1):
                y = n.emit("slice", y, axis=a, start=s, end=max(e, s), step=st)
            continue
        picked = range(min(max(s, 0), dim - 1), min(max(e, -1), dim - 1), st) if dim else range(0)
        if len(picked) == 0:
            y = n.emit("slice", y, axis=a, start=0, end=0)
            continue
        # partita slices forward only: take the same elements forward, then reverse them.
        lo, hi = picked[-1], picked[0] + 1
        if (lo, hi, -st) != (0, dim, 1):
            y = n.emit("slice", y, axis=a, start=lo, end=hi, step=-st)
        y = reverse_axis(n, y, a)
    return [y]
