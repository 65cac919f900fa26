"""Selection along an axis: ``topk`` and ``sort``, each with the indices of what it selects.

Both are stable: among equal values the lower index comes first (what ONNX TopK requires,
and what ``torch.sort(stable=True)`` gives; ``torch.topk`` leaves ties unordered, so the torch
executor sorts stably and keeps the first k). NaN sorts as larger than every number, as in
NumPy and torch.
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes as dt
from ..ir.diagnostics import TypeRuleError
from ..ir.types import TensorType
from ._lazy import torch
from .registry import AttrSpec, Cost, OpDef, normalize_axis, register


def _check(op: str, x: TensorType, axis: int) -> int:
    if x.rank == 0:
        raise TypeRuleError(f"{op}: the input {x} is rank 0; there is no axis to select along")
    if x.dtype.is_bool:
        raise TypeRuleError(f"{op}: bool input {x} is not ordered; cast it to an integer dtype")
    return normalize_axis(axis, x.rank, op)


def _order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable argsort along ``axis``; descending keeps equal values in index order."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    key: np.ndarray | None
    if x.dtype.kind == "f":
        key = -x.astype(np.float64)
        key = np.where(np.isnan(key), -np.inf, key)     # NaN is the largest: first when descending
    elif x.dtype.kind == "u":
        key = -x.astype(np.float64)
    else:
        key = -x.astype(np.float64) if x.dtype.itemsize < 8 else None
    if key is None:
        # i64: negation overflows at the minimum; reverse a stable ascending order of the
        # reversed array instead, which keeps equal values in index order.
        rev = np.flip(x, axis=axis)
        idx = np.argsort(rev, axis=axis, kind="stable")
        return np.flip(x.shape[axis] - 1 - idx, axis=axis)
    return np.argsort(key, axis=axis, kind="stable")


def _compute(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype.name in ("bfloat16", "float16") else x


# --- topk -----------------------------------------------------------------------------------

def _topk_infer(ts, a):
    (x,) = ts
    axis = _check("topk", x, a["axis"])
    k = a["k"]
    if not 0 <= k <= x.shape[axis]:
        raise TypeRuleError(f"topk: k={k} is out of range for dim {axis} of {x} (0..{x.shape[axis]})")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return TensorType(shape, x.dtype), TensorType(shape, dt.i64)


def _topk_reference(args, a):
    (x,) = args
    axis = a["axis"] % x.ndim
    idx = np.take(_order(_compute(x), axis, a["largest"]), np.arange(a["k"]), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def _topk_torch(args, a):
    (x,) = args
    values, idx = torch.sort(x, dim=a["axis"], descending=a["largest"], stable=True)
    return values.narrow(a["axis"], 0, a["k"]).contiguous(), idx.narrow(a["axis"], 0, a["k"]).contiguous()


register(OpDef(
    name="topk", operands=("x",),
    attrs=(AttrSpec("k", "int"), AttrSpec("axis", "int", -1), AttrSpec("largest", "bool", True),
           AttrSpec("sorted", "bool", True)),
    infer=_topk_infer, reference=_topk_reference, torch=_topk_torch,
    cost=lambda ins, outs, a: Cost(ins[0].numel * max(1, int(np.log2(max(2, ins[0].shape[a["axis"]])))),
                                   ins[0].nbytes, sum(t.nbytes for t in outs)),
    doc="the k largest (or smallest) values along axis and their i64 indices (torch.topk, ONNX TopK), "
        "in order, ties by the lower index first; sorted=false is accepted and gives the same "
        "sorted result. Cost: n log2 n comparisons.",
))


# --- sort -----------------------------------------------------------------------------------

def _sort_infer(ts, a):
    (x,) = ts
    _check("sort", x, a["axis"])
    return TensorType(x.shape, x.dtype), TensorType(x.shape, dt.i64)


def _sort_reference(args, a):
    (x,) = args
    axis = a["axis"] % x.ndim
    idx = _order(_compute(x), axis, a["descending"])
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


register(OpDef(
    name="sort", operands=("x",), attrs=(AttrSpec("axis", "int", -1), AttrSpec("descending", "bool", False)),
    infer=_sort_infer, reference=_sort_reference,
    torch=lambda args, a: tuple(torch.sort(args[0], dim=a["axis"], descending=a["descending"], stable=True)),
    cost=lambda ins, outs, a: Cost(ins[0].numel * max(1, int(np.log2(max(2, ins[0].shape[a["axis"]])))),
                                   ins[0].nbytes, sum(t.nbytes for t in outs)),
    doc="values sorted along axis (ascending, or descending) and their i64 source indices "
        "(torch.sort(stable=True)): equal values keep their index order. Cost: n log2 n comparisons.",
))
