"""Indexed writes with a reduction, and the product scan: ``scatter_elements`` and ``cumprod``.

- ``scatter_elements(x, index, src, axis, reduction)`` is ``x`` with each element of ``src``
  written (reduction ``none``) or combined (``add``, ``mul``, ``max``, ``min``, the old value
  of ``x`` included) at the position ``index`` names along ``axis``, the other coordinates
  its own: torch.scatter / torch.scatter_reduce(include_self=True), ONNX ScatterElements.
  The index is i32/i64 of the input's rank, no larger than src anywhere nor than x outside
  the axis (src is read over the index's extent); its values must lie in 0..size-1 (the ONNX
  importer normalizes negative ones first); out-of-range values are run-time errors. Where
  ``none`` meets a repeated index, which write wins is unspecified (as in torch and ONNX).
- ``cumprod(x, axis)`` is the inclusive running product along ``axis`` (torch.cumprod);
  bool and integers give i64, as cumsum does. Its exact gradient handles zeros (no
  division).
"""

from __future__ import annotations

import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ir.types import TensorType
from ._lazy import torch
from .reduce import _accumulate_dtype, _compute_np, _reduce_cost
from .registry import AttrSpec, Cost, OpDef, normalize_axis, register

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")
_TORCH_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
_NP_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_infer(ts, a):
    op = "scatter_elements"
    x, idx, src = ts
    if idx.dtype.name not in ("i32", "i64"):
        raise TypeRuleError(f"{op}: the index is {idx}; it must be i32 or i64 (cast it to i64)")
    if x.rank == 0:
        raise TypeRuleError(f"{op}: input is rank 0 ({x}); there is nothing to index")
    axis = normalize_axis(a["axis"], x.rank, op)
    if idx.rank != x.rank or src.rank != x.rank:
        raise TypeRuleError(f"{op}: the index {idx} and src {src} must have the rank of the input {x} "
                            "(torch.scatter semantics)")
    if src.dtype != x.dtype:
        raise TypeRuleError(f"{op}: src has dtype {src.dtype} but the input has {x.dtype}; cast src to {x.dtype}")
    for dim in range(x.rank):
        if idx.shape[dim] > src.shape[dim]:
            raise TypeRuleError(f"{op}: the index {idx} is larger than src {src} in dim {dim}; it must not exceed src")
        if dim != axis and idx.shape[dim] > x.shape[dim]:
            raise TypeRuleError(f"{op}: the index {idx} is larger than the input {x} in dim {dim}; outside axis "
                                f"{axis} it must not exceed the input")
    if x.dtype.is_bool and a["reduction"] != "none":
        raise TypeRuleError(f"{op}: reduction '{a['reduction']}' needs a numeric input, got {x}; "
                            "cast it to an integer dtype")
    if axis in range(x.rank) and x.shape[axis] == 0 and idx.numel:
        raise TypeRuleError(f"{op}: axis {axis} of the input {x} is empty, so no index {idx} can point into it")
    return x


def _np_scatter_elements(args, a):
    x, idx, src = args
    axis = normalize_axis(a["axis"], x.ndim, "scatter_elements")
    size = x.shape[axis]
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = idx.min() if idx.min() < 0 else idx.max()
        raise ExecutionError(f"scatter_elements: index {int(bad)} is out of range for axis {axis} of size {size} "
                             f"(valid: 0..{size - 1})")
    out = _compute_np(x).copy()
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = idx.astype(np.int64)
    crop = tuple(slice(0, n) for n in idx.shape)
    vals = _compute_np(src)[crop]
    if a["reduction"] == "none":
        out[tuple(where)] = vals
    else:
        _NP_REDUCE[a["reduction"]].at(out, tuple(where), vals)
    return out.astype(x.dtype)


def _torch_scatter_elements(args, a):
    x, idx, src = args
    idx = idx.to(torch.int64)
    if a["reduction"] == "none":
        return torch.scatter(x, a["axis"], idx, src)
    return torch.scatter_reduce(x, a["axis"], idx, src, reduce=_TORCH_REDUCE[a["reduction"]], include_self=True)


register(OpDef(
    name="scatter_elements", operands=("x", "index", "src"),
    attrs=(AttrSpec("axis", "int"), AttrSpec("reduction", "str", "none", choices=SCATTER_REDUCTIONS)),
    infer=_scatter_elements_infer, reference=_np_scatter_elements, torch=_torch_scatter_elements,
    cost=lambda ins, outs, a: Cost(ins[1].numel, sum(t.nbytes for t in ins), outs[0].nbytes),
    doc="x with src[i][j][k] written (reduction none) or combined by add/mul/max/min (x's value "
        "included) at [index[i][j][k]][j][k] for axis 0 (torch.scatter, torch.scatter_reduce with "
        "include_self, ONNX ScatterElements): index i32/i64 of the input's rank, no larger than src "
        "nor than x outside axis, values in 0..size-1; a repeated index under none keeps an "
        "unspecified one of its writes. Cost: one operation per index element.",
))


# --- cumprod -------------------------------------------------------------------------------

def _cumprod_axis(rank: int, axis: int) -> int:
    # A rank-0 tensor scans like a rank-1 tensor of one element (as cumsum).
    return normalize_axis(axis, max(rank, 1), "cumprod")


def _cumprod_infer(ts, attrs):
    (t,) = ts
    _cumprod_axis(t.rank, attrs["axis"])
    return TensorType(t.shape, _accumulate_dtype(t.dtype))


def _cumprod_reference(args, attrs):
    x = args[0]
    axis = _cumprod_axis(x.ndim, attrs["axis"])
    acc = np.float32 if x.dtype.name in ("float16", "bfloat16") else (np.int64 if x.dtype.kind in "biu" else x.dtype)
    return np.cumprod(x.reshape(x.shape or (1,)), axis=axis, dtype=acc).reshape(x.shape)


def _cumprod_torch(args, a):
    x = args[0]
    if x.dtype == torch.bool or not (x.is_floating_point() or x.dtype == torch.int64):
        x = x.to(torch.int64)
    return torch.cumprod(x, dim=a["axis"])


register(OpDef(
    name="cumprod", operands=("x",), attrs=(AttrSpec("axis", "int"),), infer=_cumprod_infer,
    reference=_cumprod_reference, torch=_cumprod_torch, cost=_reduce_cost,
    doc="inclusive running product along axis (torch.cumprod); bool and integers give i64",
))
