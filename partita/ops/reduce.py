"""Reductions: sum, mean, max, min, prod, argmax, argmin, and the scan cumsum.

Semantics follow PyTorch:

- ``axes`` lists the axes to reduce (negative ones count from the end); ``None`` (the
  default) reduces every axis. An empty list reduces nothing (NumPy's reading; PyTorch's
  ``dim=()`` means "all", a quirk it deprecates), so a pass may shrink an axis list to
  empty without changing meaning. ``keepdim=true`` keeps reduced axes as size 1.
- A rank-0 tensor accepts axis 0 or -1, as PyTorch does; reducing it returns it unchanged.
- sum, prod and cumsum of bool or integer tensors give i64; float dtypes are kept.
- mean is defined on float tensors only: an integer or bool input is rejected (PyTorch
  raises too) rather than silently promoted; cast to a float dtype first. The mean over
  zero elements is NaN.
- max and min reduce values only (PyTorch's ``amax``/``amin``); NaN propagates. They and
  argmax/argmin reject reducing an axis of size 0, which has no identity.
- argmax and argmin take one axis (``axes=[k]``) or none (``axes`` omitted: the index into
  the flattened tensor, like ``torch.argmax(dim=None)``); ties and NaN give the first
  index; the result is i64. bool inputs are rejected, as PyTorch rejects them.

The NumPy references accumulate f16/bf16 in f32 and round once, as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import DType, i64
from ..ir.types import TensorType
from ._lazy import torch
from .numeric import LOW_PRECISION, compute_np
from .registry import AttrSpec, Cost, OpDef, normalize_axis, register


_AXES = AttrSpec("axes", "ints", None)
_KEEPDIM = AttrSpec("keepdim", "bool", False)


def reduce_axes(axes: tuple[int, ...] | None, rank: int, op: str) -> tuple[int, ...]:
    """The sorted, non-negative axes an op reduces over (``None`` means all of them).

    A rank-0 tensor accepts axis 0 or -1 and has nothing to reduce: returns ()."""
    if axes is None:
        return tuple(range(rank))
    if rank == 0:
        for a in axes:
            if a not in (0, -1):
                raise TypeRuleError(f"{op}: axis {a} is out of range for a rank-0 tensor (valid: -1, 0)")
        if len(axes) > 1:
            raise TypeRuleError(f"{op}: axes {list(axes)} repeat an axis")
        return ()
    out = tuple(sorted(normalize_axis(a, rank, op) for a in axes))
    if len(set(out)) != len(out):
        raise TypeRuleError(f"{op}: axes {list(axes)} repeat an axis of a rank-{rank} tensor")
    return out


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    """The shape left after reducing ``axes`` (normalized) out of ``shape``."""
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _accumulate_dtype(dt: DType) -> DType:
    """sum/prod/cumsum: bool and integers widen to i64 (PyTorch); floats are kept."""
    return dt if dt.is_float else i64


def _check_nonempty(op: str, t: TensorType, axes: tuple[int, ...]) -> None:
    for a in axes:
        if t.shape[a] == 0:
            raise TypeRuleError(f"{op}: cannot reduce axis {a} of size 0 in {t}: {op} of no elements "
                                "has no value (slice away the empty axis or use sum)")


def reduce_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    """One operation per input element."""
    return Cost(ins[0].numel, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


def _reduction(name: str, dtype_rule: str, np_fn, torch_fn, doc: str, **facts) -> OpDef:
    """dtype_rule: "accumulate" (bool/int -> i64), "same", or "float_only"."""

    def infer(ts: list[TensorType], attrs: dict) -> TensorType:
        (t,) = ts
        axes = reduce_axes(attrs["axes"], t.rank, name)
        dt = t.dtype
        if dtype_rule == "accumulate":
            dt = _accumulate_dtype(dt)
        elif dtype_rule == "float_only" and not dt.is_float:
            raise TypeRuleError(f"{name}: input is {t}, but {name} is defined on float tensors only "
                                f"(PyTorch rejects {dt} too); cast it to f32 or f64 first")
        elif dtype_rule == "same_nonempty":
            _check_nonempty(name, t, axes)
        return TensorType(reduced_shape(t.shape, axes, attrs["keepdim"]), dt)

    def reference(args, attrs):
        x = args[0]
        axes = reduce_axes(attrs["axes"], x.ndim, name)
        return np_fn(x, axes, attrs["keepdim"])

    def torch_impl(args, attrs):
        x = args[0]
        axes = reduce_axes(attrs["axes"], x.dim(), name)
        if not axes:
            return x.clone()
        return torch_fn(x, axes, attrs["keepdim"])

    return register(OpDef(name=name, operands=("x",), attrs=(_AXES, _KEEPDIM), infer=infer,
                          reference=reference, torch=torch_impl, cost=reduce_cost, doc=doc, **facts))


def _np_accumulator(dtype: np.dtype) -> type | np.dtype:
    """The NumPy dtype sums and products accumulate in: f32 for f16/bf16, i64 for bool and
    integers (as PyTorch), the dtype itself otherwise."""
    return np.float32 if dtype in LOW_PRECISION else (np.int64 if dtype.kind in "biu" else dtype)


def _np_sum(x, axes, keepdim):
    acc = _np_accumulator(x.dtype)
    return np.sum(x, axis=axes, keepdims=keepdim, dtype=acc)


def _np_prod(x, axes, keepdim):
    acc = _np_accumulator(x.dtype)
    return np.prod(x, axis=axes, keepdims=keepdim, dtype=acc)


def _np_mean(x, axes, keepdim):
    x = compute_np(x)
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    # sum / count rather than np.mean, which warns on empty input; 0 / 0 gives NaN as PyTorch.
    return np.sum(x, axis=axes, keepdims=keepdim) / np.asarray(count, dtype=x.dtype)


def _np_max(x, axes, keepdim):
    return np.max(compute_np(x), axis=axes, keepdims=keepdim) if axes else x


def _np_min(x, axes, keepdim):
    return np.min(compute_np(x), axis=axes, keepdims=keepdim) if axes else x


def _torch_prod(x, axes, keepdim):
    # torch.prod reduces one dim at a time (or all of them).
    if len(axes) == x.dim():
        out = torch.prod(x)
        return out.reshape((1,) * x.dim()) if keepdim else out
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keepdim)
    return x


_reduction("sum", "accumulate", _np_sum,
           lambda x, axes, k: torch.sum(x, dim=axes, keepdim=k),
           "sum over axes; bool and integers give i64", pad_zeros="all")
_reduction("prod", "accumulate", _np_prod, _torch_prod,
           "product over axes; bool and integers give i64")
_reduction("mean", "float_only", _np_mean,
           lambda x, axes, k: torch.mean(x, dim=axes, keepdim=k),
           "arithmetic mean over axes; float tensors only (NaN over zero elements)")
_reduction("max", "same_nonempty", _np_max,
           lambda x, axes, k: torch.amax(x, dim=axes, keepdim=k),
           "largest value over axes (values only, NaN propagates)")
_reduction("min", "same_nonempty", _np_min,
           lambda x, axes, k: torch.amin(x, dim=axes, keepdim=k),
           "smallest value over axes (values only, NaN propagates)")


# --- argmax / argmin -----------------------------------------------------------------------

def _arg_axis(name: str, t_rank: int, axes) -> int | None:
    """The single axis of an arg-reduction, or None for the flattened tensor."""
    if axes is None:
        return None
    if len(axes) != 1:
        raise TypeRuleError(f"{name}: 'axes' must hold exactly one axis (or be omitted to index the "
                            f"flattened tensor), got {list(axes)}")
    if t_rank == 0:
        reduce_axes(axes, 0, name)
        return 0
    return normalize_axis(axes[0], t_rank, name)


def _arg_reduction(name: str, np_fn, torch_fn) -> OpDef:
    def infer(ts, attrs):
        (t,) = ts
        axis = _arg_axis(name, t.rank, attrs["axes"])
        if t.dtype.is_bool:
            raise TypeRuleError(f"{name}: input is {t}; {name} is not defined on bool tensors "
                                "(PyTorch rejects them); cast to u8 first")
        keepdim = attrs["keepdim"]
        if axis is None or t.rank == 0:
            if t.numel == 0:
                raise TypeRuleError(f"{name}: input {t} has no elements, so there is no index to return")
            return TensorType((1,) * t.rank if keepdim else (), i64)
        _check_nonempty(name, t, (axis,))
        return TensorType(reduced_shape(t.shape, (axis,), keepdim), i64)

    def reference(args, attrs):
        x = compute_np(args[0])
        axis = _arg_axis(name, x.ndim, attrs["axes"])
        if axis is None or x.ndim == 0:
            idx = np_fn(x.reshape(-1))
            return np.full((1,) * x.ndim if attrs["keepdim"] else (), idx, dtype=np.int64)
        return np_fn(x, axis=axis, keepdims=attrs["keepdim"])

    def torch_impl(args, attrs):
        x = args[0]
        axis = _arg_axis(name, x.dim(), attrs["axes"])
        return torch_fn(x, dim=axis, keepdim=attrs["keepdim"])

    return register(OpDef(name=name, operands=("x",), attrs=(_AXES, _KEEPDIM), infer=infer,
                          reference=reference, torch=torch_impl, cost=reduce_cost,
                          doc=f"index (i64) of the first {name[3:]} along one axis, or in the flattened tensor"))


_arg_reduction("argmax", np.argmax, lambda x, dim, keepdim: torch.argmax(x, dim=dim, keepdim=keepdim))
_arg_reduction("argmin", np.argmin, lambda x, dim, keepdim: torch.argmin(x, dim=dim, keepdim=keepdim))


# --- cumsum --------------------------------------------------------------------------------

def _scan_axis(op: str, rank: int, axis: int) -> int:
    # A rank-0 tensor scans like a rank-1 tensor of one element (PyTorch accepts dim 0 or -1).
    return normalize_axis(axis, max(rank, 1), op)


def scan_infer(op: str):
    """The type rule of a running reduction (cumsum, cumprod): x's shape, bool and integers
    accumulating in i64."""
    def infer(ts, attrs):
        (t,) = ts
        _scan_axis(op, t.rank, attrs["axis"])
        return TensorType(t.shape, _accumulate_dtype(t.dtype))
    return infer


def scan_reference(op: str, scan):
    """The NumPy reference of a running reduction: ``scan`` (np.cumsum, np.cumprod) along the
    axis, accumulating f16/bf16 in f32 and bool and integers in i64."""
    def reference(args, attrs):
        x = args[0]
        axis = _scan_axis(op, x.ndim, attrs["axis"])
        acc = _np_accumulator(x.dtype)
        return scan(x.reshape(x.shape or (1,)), axis=axis, dtype=acc).reshape(x.shape)
    return reference


register(OpDef(
    name="cumsum", operands=("x",), attrs=(AttrSpec("axis", "int"),), infer=scan_infer("cumsum"),
    reference=scan_reference("cumsum", np.cumsum),
    torch=lambda args, a: torch.cumsum(args[0], dim=a["axis"]),
    cost=reduce_cost,
    doc="inclusive running sum along axis; bool and integers give i64",
))
