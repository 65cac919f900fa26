"""Shape and data-movement ops, and the ops that make tensors from attributes.

Movement: reshape, transpose, broadcast_to, slice, concat, split, squeeze, unsqueeze, pad,
gather, index_select. Creation: iota, full, constant. Semantics follow PyTorch; the choices
where it has several, or none:

- ``reshape{shape}`` keeps the shape as written (one -1 allowed, resolved by the type rule),
  so the printed IR shows what the model said.
- ``transpose{perm}``: ``perm`` omitted reverses the dims (NumPy's ``.T``); negative axes
  are accepted.
- ``broadcast_to{shape}``: NumPy broadcasting; -1 keeps the size of an existing dim (as
  ``torch.Tensor.expand``).
- ``slice{axis, start, end, step}``: Python slicing of one axis; start/end clamp, negative
  ones count from the end, ``end`` omitted means to the end; step must be >= 1.
- ``concat{axis}`` and ``split{axis, sizes}`` name the axis explicitly (no default): IR text
  is read more often than written. concat promotes dtypes as ``torch.cat`` does; rank-0
  operands are rejected (as PyTorch rejects them).
- ``squeeze{axes}``: omitted removes every size-1 dim; naming a dim whose size is not 1 is an
  error (PyTorch silently keeps it, which hides shape bugs).
- ``unsqueeze{axes}``: the axes index the output, as ``numpy.expand_dims``.
- ``pad{pads, value}``: ``pads`` is [before_0, after_0, before_1, after_1, ...] over every
  dim in order (not PyTorch's last-dim-first order); negative pads are rejected (use slice).
- ``gather{axis}`` is ``torch.gather`` and ``index_select{axis}`` is ``torch.index_select``;
  indices are i64 or i32, out-of-range or negative indices are run-time errors, and rank-0
  inputs are rejected (index a scalar by using it).
- ``iota{shape, axis, dtype}`` counts 0, 1, 2, ... along ``axis`` (default 0) and repeats the
  count along the other dims; dtype defaults to i64; bool is rejected.
- ``full{shape, value, dtype}`` fills with ``value`` (dtype default f32); a value the dtype
  cannot hold exactly (1.5 as i32, 300 as u8, 2 as bool) is rejected.
- ``constant{value}`` yields its dense attribute; the result type is the attribute's type.
"""

from __future__ import annotations

import functools
import math
from math import prod
from types import SimpleNamespace

import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ir.dtypes import DType, f8e8m0, f32, i64, promote_all
from ..ir.types import TensorType
from ._lazy import from_torch_dtype, ml_dtypes, to_torch_dtype, torch
from .cast_semantics import int_range
from .registry import AttrSpec, OpDef, movement_cost, normalize_axes, normalize_axis, register


def _fmt(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _movement(name: str, operands, attrs, infer, reference, torch_impl, doc: str, **facts) -> OpDef:
    return register(OpDef(name=name, operands=tuple(operands), attrs=tuple(attrs), infer=infer,
                          reference=reference, torch=torch_impl, cost=movement_cost, doc=doc, **facts))


# --- reshape -------------------------------------------------------------------------------

def resolve_reshape(t: TensorType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The concrete target shape of ``reshape(t, shape)`` (one -1 allowed); raises TypeRuleError."""
    holes = [i for i, d in enumerate(shape) if d == -1]
    bad = [d for d in shape if d < -1]
    if bad:
        raise TypeRuleError(f"reshape: 'shape' {list(shape)} has negative size {bad[0]}; sizes must be >= 0, "
                            "or -1 (once) to infer one dim")
    if len(holes) > 1:
        raise TypeRuleError(f"reshape: 'shape' {list(shape)} has {len(holes)} entries of -1; at most one dim "
                            "can be inferred")
    known = prod(d for d in shape if d != -1)
    if holes:
        if known == 0:
            raise TypeRuleError(f"reshape: cannot infer the -1 in 'shape' {list(shape)} for {t}: the other dims "
                                "multiply to 0, so any size fits; write the size")
        if t.numel % known:
            raise TypeRuleError(f"reshape: cannot reshape {t} ({t.numel} elements) to {list(shape)}: "
                                f"{t.numel} is not a multiple of {known}")
        return tuple(t.numel // known if d == -1 else d for d in shape)
    if known != t.numel:
        raise TypeRuleError(f"reshape: cannot reshape {t} ({t.numel} elements) to {_fmt(shape)} "
                            f"({known} elements); the element counts must match")
    return tuple(shape)


_movement(
    "reshape", ("x",), (AttrSpec("shape", "ints"),),
    lambda ts, a: ts[0].with_shape(resolve_reshape(ts[0], a["shape"])),
    lambda args, a: np.reshape(args[0], resolve_reshape(_type(args[0]), a["shape"])),
    lambda args, a: args[0].reshape(a["shape"]),
    "same elements in row-major order, new shape (one -1 is inferred)", idempotent=True, pad_zeros="all",
    size_attrs=lambda a, outs: {**a, "shape": outs[0].shape})


def _type(a) -> TensorType:
    """A TensorType carrying only the shape of an array (the dtype does not matter here)."""
    return TensorType(tuple(a.shape), f32)


# --- transpose -----------------------------------------------------------------------------

def transpose_perm(rank: int, perm: tuple[int, ...] | None) -> tuple[int, ...]:
    """The normalized permutation of ``transpose`` (``None`` reverses the dims)."""
    if perm is None:
        return tuple(range(rank - 1, -1, -1))
    if len(perm) != rank:
        raise TypeRuleError(f"transpose: 'perm' {list(perm)} has {len(perm)} entries but the input has rank "
                            f"{rank}; list each of the axes 0..{rank - 1} once")
    norm = tuple(normalize_axis(p, rank, "transpose", "perm entry") for p in perm)
    if len(set(norm)) != rank:
        raise TypeRuleError(f"transpose: 'perm' {list(perm)} is not a permutation of 0..{rank - 1} "
                            "(an axis repeats)")
    return norm


def _transpose_infer(ts, a):
    (t,) = ts
    p = transpose_perm(t.rank, a["perm"])
    return t.with_shape(tuple(t.shape[i] for i in p))


_movement(
    "transpose", ("x",), (AttrSpec("perm", "ints", None),), _transpose_infer,
    lambda args, a: np.transpose(args[0], transpose_perm(args[0].ndim, a["perm"])),
    lambda args, a: args[0].permute(transpose_perm(args[0].dim(), a["perm"])),
    "permute dims: result dim i is input dim perm[i] (perm omitted: reverse)", pad_zeros="all")


# --- broadcast_to --------------------------------------------------------------------------

def broadcast_target(t: TensorType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The concrete shape of ``broadcast_to(t, shape)`` (-1 keeps an input dim)."""
    if len(shape) < t.rank:
        raise TypeRuleError(f"broadcast_to: cannot broadcast {t} to {_fmt(shape)}: the target has lower rank "
                            f"({len(shape)} < {t.rank})")
    off = len(shape) - t.rank
    out = []
    for i, d in enumerate(shape):
        src = t.shape[i - off] if i >= off else None
        if d == -1:
            if src is None:
                raise TypeRuleError(f"broadcast_to: -1 at dim {i} of {list(shape)} has no input dim to keep "
                                    f"({t} is aligned to the right); write the size")
            d = src
        elif d < 0:
            raise TypeRuleError(f"broadcast_to: 'shape' {list(shape)} has negative size {d}")
        if src is not None and src != d and src != 1:
            raise TypeRuleError(f"broadcast_to: cannot broadcast {t} to {_fmt(shape)}: input dim {i - off} "
                                f"has size {src}, target {d}; an input dim must equal the target or be 1")
        out.append(d)
    return tuple(out)


_movement(
    "broadcast_to", ("x",), (AttrSpec("shape", "ints"),),
    lambda ts, a: ts[0].with_shape(broadcast_target(ts[0], a["shape"])),
    lambda args, a: np.broadcast_to(args[0], broadcast_target(_type(args[0]), a["shape"])),
    lambda args, a: torch.broadcast_to(args[0], a["shape"]),
    "repeat size-1 (and missing leading) dims to reach shape", idempotent=True, pad_zeros="all")


# --- slice ---------------------------------------------------------------------------------

def _slice_bounds(t_shape, a, op: str = "slice") -> tuple[int, slice]:
    if not t_shape:
        raise TypeRuleError(f"{op}: cannot slice a rank-0 tensor")
    axis = normalize_axis(a["axis"], len(t_shape), op)
    if a["step"] < 1:
        raise TypeRuleError(f"{op}: 'step' is {a['step']}; it must be >= 1 (reverse with a gather or index_select)")
    return axis, slice(a["start"], a["end"], a["step"])


def _slice_infer(ts, a):
    (t,) = ts
    axis, s = _slice_bounds(t.shape, a)
    n = len(range(*s.indices(t.shape[axis])))
    return t.with_shape(t.shape[:axis] + (n,) + t.shape[axis + 1:])


def _slice_ref(args, a):
    x = args[0]
    axis, s = _slice_bounds(x.shape, a)
    return x[(slice(None),) * axis + (s,)]


def _slice_torch(args, a):
    x = args[0]
    axis, s = _slice_bounds(tuple(x.shape), a)
    # Resolve to in-range, non-decreasing bounds so torch sees the plain slice Python means.
    start, stop, step = s.indices(x.shape[axis])
    return x[(slice(None),) * axis + (slice(start, max(stop, start), step),)]


_movement(
    "slice", ("x",),
    (AttrSpec("axis", "int"), AttrSpec("start", "int", 0), AttrSpec("end", "int", None), AttrSpec("step", "int", 1)),
    _slice_infer, _slice_ref, _slice_torch,
    "x[start:end:step] along axis, with Python's clamping and negative indices (end omitted: to the end)",
    pad_zeros="all")


# --- concat and split ----------------------------------------------------------------------

def _concat_infer(ts, a):
    first = ts[0]
    if any(t.rank == 0 for t in ts):
        raise TypeRuleError("concat: operand " + str(next(i for i, t in enumerate(ts) if t.rank == 0)) +
                            " is rank 0; concat joins tensors of rank >= 1 (unsqueeze scalars first)")
    axis = normalize_axis(a["axis"], first.rank, "concat")
    for i, t in enumerate(ts[1:], 1):
        if t.rank != first.rank or any(d != e for k, (d, e) in enumerate(zip(t.shape, first.shape)) if k != axis):
            raise TypeRuleError(
                f"concat: operand {i} is {t} but operand 0 is {first}; along axis {axis} all operands must "
                "have the same rank and equal sizes in every other dim")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    return TensorType(tuple(shape), promote_all(t.dtype for t in ts))


def _concat_ref(args, a):
    dt = promote_all(_dtype_of(x) for x in args).np
    return np.concatenate([x.astype(dt, copy=False) for x in args], axis=a["axis"])


def _dtype_of(arr) -> DType:
    from ..ir.dtypes import from_numpy

    return from_numpy(arr.dtype)


_movement(
    "concat", ("*inputs",), (AttrSpec("axis", "int"),), _concat_infer, _concat_ref,
    lambda args, a: torch.cat(list(args), dim=a["axis"]),
    "join tensors along axis (dtypes promote as torch.cat; rank-0 operands rejected)", pad_zeros="all_operands")


def _split_infer(ts, a):
    (t,) = ts
    if t.rank == 0:
        raise TypeRuleError("split: cannot split a rank-0 tensor")
    axis = normalize_axis(a["axis"], t.rank, "split")
    sizes = a["sizes"]
    if not sizes:
        raise TypeRuleError("split: 'sizes' is empty; list the size of each piece (one result per size)")
    if any(s < 0 for s in sizes):
        raise TypeRuleError(f"split: 'sizes' {list(sizes)} has a negative size")
    if sum(sizes) != t.shape[axis]:
        raise TypeRuleError(f"split: 'sizes' {list(sizes)} sum to {sum(sizes)} but axis {axis} of {t} has size "
                            f"{t.shape[axis]}; the sizes must add up to the dim")
    return [t.with_shape(t.shape[:axis] + (s,) + t.shape[axis + 1:]) for s in sizes]


def _split_ref(args, a):
    x = args[0]
    axis = normalize_axis(a["axis"], x.ndim, "split")
    cuts = np.cumsum(a["sizes"])[:-1]
    return tuple(np.split(x, cuts, axis=axis))


_movement(
    "split", ("x",), (AttrSpec("axis", "int"), AttrSpec("sizes", "ints")), _split_infer, _split_ref,
    lambda args, a: tuple(torch.split(args[0], list(a["sizes"]), dim=a["axis"])),
    "cut x along axis into pieces of the given sizes (one result per size)")


# --- squeeze and unsqueeze ---------------------------------------------------------------------

def squeeze_axes(t: TensorType, axes) -> tuple[int, ...]:
    """The normalized dims ``squeeze`` removes."""
    if axes is None:
        return tuple(i for i, d in enumerate(t.shape) if d == 1)
    norm = normalize_axes(axes, t.rank, "squeeze")
    for i in norm:
        if t.shape[i] != 1:
            raise TypeRuleError(f"squeeze: axis {i} of {t} has size {t.shape[i]}, not 1; only size-1 dims can "
                                "be squeezed (use reshape or a reduction)")
    return norm


def _squeeze_infer(ts, a):
    (t,) = ts
    drop = squeeze_axes(t, a["axes"])
    return t.with_shape(tuple(d for i, d in enumerate(t.shape) if i not in drop))


_movement(
    "squeeze", ("x",), (AttrSpec("axes", "ints", None),), _squeeze_infer,
    lambda args, a: np.squeeze(args[0], axis=squeeze_axes(_type(args[0]), a["axes"])),
    lambda args, a: torch.squeeze(args[0], dim=squeeze_axes(TensorType(tuple(args[0].shape), f32), a["axes"])),
    "remove size-1 dims (axes omitted: all of them); naming a dim of another size is an error", pad_zeros="all")


def unsqueeze_axes(rank: int, axes) -> tuple[int, ...]:
    """The normalized new dims of ``unsqueeze``, as positions in the output."""
    return normalize_axes(axes, rank + len(axes), "unsqueeze")


def _unsqueeze_infer(ts, a):
    (t,) = ts
    new = unsqueeze_axes(t.rank, a["axes"])
    it = iter(t.shape)
    return t.with_shape(tuple(1 if i in new else next(it) for i in range(t.rank + len(new))))


def _unsqueeze_torch(args, a):
    x = args[0]
    for i in unsqueeze_axes(x.dim(), a["axes"]):
        x = torch.unsqueeze(x, i)
    return x


_movement(
    "unsqueeze", ("x",), (AttrSpec("axes", "ints"),), _unsqueeze_infer,
    lambda args, a: np.expand_dims(args[0], unsqueeze_axes(args[0].ndim, a["axes"])),
    _unsqueeze_torch,
    "insert size-1 dims at the given positions of the result", pad_zeros="all")


# --- pad -------------------------------------------------------------------------------------

# Storage floats without infinities, and without NaN (ml_dtypes' finfo does not say).
_NO_INF = frozenset({"f8e4m3fn", "f8e4m3fnuz", "f8e5m2fnuz", "f8e8m0", "f4e2m1"})
_NO_NAN = frozenset({"f4e2m1"})


# bf16's finfo as ml_dtypes gives it (8 exponent bits, 7 mantissa bits), written out so that a
# bf16 fill value is checked without importing ml_dtypes (half a second of import).
BF16_FINFO = SimpleNamespace(max=(2.0 - 2.0 ** -7) * 2.0 ** 127, tiny=2.0 ** -126, nmant=7)


@functools.cache
def _float_limits(dt: DType) -> tuple[float, float, str]:
    """For float dtype ``dt``: the smallest magnitude that rounds (to nearest even) beyond its
    largest finite value, the smallest value it takes (-inf but for f8e8m0, which holds only
    positive powers of two),
    and its finite values as messages write them (the shortest f32 text below 64 bits, as
    the printer and the parser's dense literals do)."""
    fi = BF16_FINFO if dt.name == "bf16" else np.finfo(dt.np) if dt.name in ("f16", "f32", "f64") else \
        ml_dtypes.finfo(dt.np)
    big = float(fi.max)
    text = repr(big) if dt.bits == 64 else str(np.float32(big))
    if dt is f8e8m0:
        return big, float(fi.tiny), f"powers of two {float(fi.tiny)!r}..{big!r}"
    beyond = math.inf if dt.bits == 64 else big + 2.0 ** (math.floor(math.log2(big)) - fi.nmant) / 2
    return beyond, -math.inf, f"finite values -{text}..{text}"


def check_fill_value(op: str, value, dt: DType, attr: str = "value") -> None:
    """Reject a fill value that ``dt`` cannot hold: a non-integer for an integer dtype, an
    integer out of its range, a float that rounds beyond its finite values (NumPy would make it
    inf, torch refuses it; the rule of dense literals), or inf / NaN for a dtype without them."""
    if dt.is_bool:
        if value not in (0, 1):
            raise TypeRuleError(f"{op}: '{attr}' {value!r} is not a bool (use true/false or 0/1)")
        return
    if dt.is_float:
        beyond, smallest, finite_values = _float_limits(dt)
        try:
            v = float(value)
        except OverflowError:  # an integer literal beyond every float
            raise TypeRuleError(f"{op}: '{attr}' {value!r} is out of range of a float (a float holds up to "
                                f"about 1.8e308), so {dt} cannot hold it; use a value in range") from None
        if math.isnan(v):
            if dt.name in _NO_NAN:
                raise TypeRuleError(f"{op}: '{attr}' is nan, but {dt} has no NaN ({finite_values}); "
                                    "use a value in that range or a dtype with NaN (f16, f32, ...)")
            return
        if math.isinf(v) and isinstance(value, float):
            if dt.name in _NO_INF:
                raise TypeRuleError(f"{op}: '{attr}' is {value!r}, but {dt} has no infinities ({finite_values}); "
                                    "use a value in that range or a dtype with infinities (f16, f32, ...)")
            return
        if dt is f8e8m0 and 0 < v < smallest and _rounds_to(v, dt) == smallest:
            return  # the shortest text of 2**-127 (5.87747e-39) is just below it
        if not (smallest <= v and abs(v) < beyond):
            wider = "" if dt.bits == 64 else ", or a wider dtype (f64 holds up to 1.8e308)"
            raise TypeRuleError(f"{op}: '{attr}' {value!r} is out of range for {dt} ({finite_values}); "
                                f"use a value in that range{wider}")
        return
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise TypeRuleError(f"{op}: '{attr}' {value!r} is not an integer, so {dt} cannot hold it; "
                            "use an integer value or a float dtype")
    lo, hi = int_range(dt)
    if not lo <= int(value) <= hi:
        raise TypeRuleError(f"{op}: '{attr}' {value!r} is out of range for {dt} ({lo}..{hi}); "
                            "use a value in that range or a wider dtype")


def _rounds_to(v: float, dt: DType) -> float:
    with np.errstate(all="ignore"):
        return float(np.asarray(v, dtype=np.float64).astype(dt.np).astype(np.float64))


def fill_scalar(value, dt: DType):
    """A checked fill value as the Python scalar of its value in ``dt`` (floats rounded to
    ``dt`` as NumPy rounds them), so torch, which would round through f32 or refuse a value
    beyond the largest finite one, fills exactly what the reference does."""
    if not dt.is_float or dt.bits == 64:
        return value
    return _rounds_to(value, dt)


def _pad_pairs(t: TensorType, pads) -> list[tuple[int, int]]:
    if len(pads) != 2 * t.rank:
        raise TypeRuleError(f"pad: 'pads' has {len(pads)} entries but {t} needs {2 * t.rank} "
                            "([before_0, after_0, before_1, after_1, ...], one pair per dim)")
    if any(p < 0 for p in pads):
        raise TypeRuleError(f"pad: 'pads' {list(pads)} has a negative entry; pads must be >= 0 "
                            "(use slice to crop)")
    return [(pads[2 * i], pads[2 * i + 1]) for i in range(t.rank)]


def _pad_infer(ts, a):
    (t,) = ts
    pairs = _pad_pairs(t, a["pads"])
    check_fill_value("pad", a["value"], t.dtype)
    return t.with_shape(tuple(d + b + e for d, (b, e) in zip(t.shape, pairs)))


def _pad_ref(args, a):
    x = args[0]
    pairs = _pad_pairs(_type(x), a["pads"])
    out = np.full(tuple(d + b + e for d, (b, e) in zip(x.shape, pairs)), a["value"], dtype=x.dtype)
    out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, pairs))] = x
    return out


_PAD_FLOATS: tuple = ()


def _pad_torch(args, a):
    global _PAD_FLOATS
    x = args[0]
    if not _PAD_FLOATS:
        _PAD_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    # The result keeps a channels-last operand's memory layout (a padded convolution output read
    # by the next channels-last kernel: BiT's stem pad before its max pool was a 2.5x slower NCHW
    # fill and copy, and the pool after it ran on NCHW memory). F.pad where its constant mode
    # applies (these floating dtypes; it keeps the layout; the pads were checked when the node
    # was typed), else a fill and a copy (bool, integers, float8).
    if x.dtype in _PAD_FLOATS and x.dim() >= 1:
        pads = a["pads"]
        flat = [pads[i] for d in range(x.dim() - 1, -1, -1) for i in (2 * d, 2 * d + 1)]
        return torch.nn.functional.pad(x, flat, mode="constant", value=float(a["value"]))
    pairs = _pad_pairs(TensorType(tuple(x.shape), f32), a["pads"])
    value = a["value"] if not x.is_floating_point() else fill_scalar(a["value"], from_torch_dtype(x.dtype))
    layout = torch.channels_last if x.dim() == 4 and not x.is_contiguous() and \
        x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    out = torch.empty(tuple(d + b + e for d, (b, e) in zip(x.shape, pairs)), dtype=x.dtype, memory_format=layout)
    out.fill_(value)
    out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, pairs))] = x
    return out


_movement(
    "pad", ("x",), (AttrSpec("pads", "ints"), AttrSpec("value", "scalar", 0)), _pad_infer, _pad_ref, _pad_torch,
    "constant padding; pads = [before_0, after_0, before_1, after_1, ...] over every dim in order, >= 0")


# --- gather and index_select ---------------------------------------------------------------------

def _check_index_dtype(op: str, t: TensorType) -> None:
    if t.dtype.name not in ("i64", "i32"):
        raise TypeRuleError(f"{op}: index is {t}; it must be i64 or i32 (cast it first)")


def _gather_infer(ts, a):
    x, idx = ts
    _check_index_dtype("gather", idx)
    if x.rank == 0:
        raise TypeRuleError(f"gather: input is rank 0 ({x}); there is nothing to index")
    axis = normalize_axis(a["axis"], x.rank, "gather")
    if idx.rank != x.rank:
        raise TypeRuleError(f"gather: index {idx} has rank {idx.rank} but input {x} has rank {x.rank}; "
                            "they must have the same rank (torch.gather semantics)")
    for d in range(x.rank):
        if d != axis and idx.shape[d] > x.shape[d]:
            raise TypeRuleError(f"gather: index {idx} is larger than input {x} in dim {d} "
                                f"({idx.shape[d]} > {x.shape[d]}); outside axis {axis} it must not exceed the input")
    return TensorType(idx.shape, x.dtype)


def _check_index_range(op: str, idx: np.ndarray, size: int, axis: int) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = idx.min() if idx.min() < 0 else idx.max()
        raise ExecutionError(f"{op}: index value {int(bad)} is out of range for axis {axis} of size {size} "
                             f"(valid: 0..{size - 1})")


def _gather_ref(args, a):
    x, idx = args
    axis = normalize_axis(a["axis"], x.ndim, "gather")
    _check_index_range("gather", idx, x.shape[axis], axis)
    # torch.gather lets the index be smaller than the input outside the axis: crop the input.
    crop = tuple(slice(None) if d == axis else slice(0, idx.shape[d]) for d in range(x.ndim))
    return np.take_along_axis(x[crop], idx.astype(np.int64), axis=axis)


_movement(
    "gather", ("x", "index"), (AttrSpec("axis", "int"),), _gather_infer, _gather_ref,
    lambda args, a: torch.gather(args[0], a["axis"], args[1].to(torch.int64)),
    "out[i][j][k] = x[index[i][j][k]][j][k] for axis 0 (torch.gather); index i64/i32, same rank as x")


def _index_select_infer(ts, a):
    x, idx = ts
    _check_index_dtype("index_select", idx)
    if idx.rank != 1:
        raise TypeRuleError(f"index_select: index {idx} must be 1-D (use gather for an index of the input's rank)")
    if x.rank == 0:
        raise TypeRuleError(f"index_select: input is rank 0 ({x}); there is nothing to index")
    axis = normalize_axis(a["axis"], x.rank, "index_select")
    return x.with_shape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])


def _index_select_ref(args, a):
    x, idx = args
    axis = normalize_axis(a["axis"], x.ndim, "index_select")
    _check_index_range("index_select", idx, x.shape[axis], axis)
    return np.take(x, idx.astype(np.int64), axis=axis)


_movement(
    "index_select", ("x", "index"), (AttrSpec("axis", "int"),), _index_select_infer, _index_select_ref,
    lambda args, a: torch.index_select(args[0], a["axis"], args[1]),
    "pick entries along axis by a 1-D index (torch.index_select)")


# --- creation: iota, full, constant ------------------------------------------------------------

def _check_shape(op: str, shape) -> None:
    if any(d < 0 for d in shape):
        raise TypeRuleError(f"{op}: 'shape' {list(shape)} has a negative size")


def _iota_axis(shape, axis) -> int:
    # A rank-0 iota is the single count 0; accept axis 0/-1 for it as PyTorch does for scans.
    return normalize_axis(axis, max(len(shape), 1), "iota")


def _iota_infer(ts, a):
    _check_shape("iota", a["shape"])
    axis = _iota_axis(a["shape"], a["axis"])
    dt = a["dtype"]
    if dt.is_bool:
        raise TypeRuleError("iota: dtype bool cannot hold counts; use an integer or float dtype")
    last = a["shape"][axis] - 1 if a["shape"] else 0
    if dt.is_int:
        lo, hi = int_range(dt)
        if last > hi:
            raise TypeRuleError(f"iota: the counts 0..{last} along axis {axis} do not fit {dt} ({lo}..{hi}); "
                                f"use a wider dtype")
    elif dt.is_float:
        beyond, _, finite_values = _float_limits(dt)
        if last >= beyond:
            raise TypeRuleError(f"iota: the counts 0..{last} along axis {axis} do not fit {dt} ({finite_values}); "
                                f"use a wider dtype")
    return TensorType(a["shape"], a["dtype"])


def _iota_view_shape(shape, axis) -> tuple[int, ...]:
    return tuple(d if i == axis else 1 for i, d in enumerate(shape))


def _iota_ref(args, a):
    shape = a["shape"]
    if not shape:
        return np.zeros((), a["dtype"].np)
    axis = _iota_axis(shape, a["axis"])
    count = np.arange(shape[axis], dtype=np.int64).astype(a["dtype"].np)
    return np.broadcast_to(count.reshape(_iota_view_shape(shape, axis)), shape)


def _iota_torch(args, a):
    shape = a["shape"]
    dt = to_torch_dtype(a["dtype"])
    if not shape:
        return torch.zeros((), dtype=dt)
    axis = _iota_axis(shape, a["axis"])
    count = torch.arange(shape[axis], dtype=torch.int64).to(dt)
    return count.reshape(_iota_view_shape(shape, axis)).expand(shape)


register(OpDef(
    name="iota", operands=(), infer=_iota_infer, reference=_iota_ref, torch=_iota_torch,
    attrs=(AttrSpec("shape", "ints"), AttrSpec("axis", "int", 0), AttrSpec("dtype", "dtype", i64)),
    cost=movement_cost, doc="0, 1, 2, ... along axis, repeated along the other dims (dtype default i64)",
))


def _full_infer(ts, a):
    _check_shape("full", a["shape"])
    check_fill_value("full", a["value"], a["dtype"])
    return TensorType(a["shape"], a["dtype"])


register(OpDef(
    name="full", operands=(), infer=_full_infer,
    reference=lambda args, a: np.full(a["shape"], a["value"], dtype=a["dtype"].np),
    torch=lambda args, a: torch.full(a["shape"], fill_scalar(a["value"], a["dtype"]), dtype=to_torch_dtype(a["dtype"])),
    attrs=(AttrSpec("shape", "ints"), AttrSpec("value", "scalar"), AttrSpec("dtype", "dtype", f32)),
    cost=movement_cost,
    doc="a tensor of shape filled with value (dtype default f32); the value must be one the dtype holds: an "
        "integer in range for integer dtypes, a float that rounds to a finite value (or inf/nan where "
        "the dtype has them) for float dtypes",
))


def _constant_torch(args, a):
    arr = a["value"].array
    # Copy: the attribute's array is read-only and shared by every run. NumPy has no bf16 that
    # torch.from_numpy understands, so bf16 travels as its bit pattern.
    if arr.dtype.name == "bfloat16":
        t = torch.from_numpy(arr.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(arr, copy=True))
    # from_numpy is always on the CPU; a program on another device (TorchProgram(device=...)
    # sets the default device) wants its constants there.
    device = torch.get_default_device()
    return t if device.type == "cpu" else t.to(device)


register(OpDef(
    name="constant", operands=(), infer=lambda ts, a: a["value"].type,
    reference=lambda args, a: np.array(a["value"].array, copy=True),
    torch=_constant_torch,
    attrs=(AttrSpec("value", "tensor"),), cost=movement_cost,
    doc="the dense tensor held in the value attribute",
))
