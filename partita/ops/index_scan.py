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
from ._lazy import torch
from .backward import check_scatter_operands
from .reduce import reduce_cost, scan_infer, scan_reference
from .numeric import compute_np
from .registry import AttrSpec, Cost, OpDef, normalize_axis, register

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")
_TORCH_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
_NP_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_infer(ts, a):
    op = "scatter_elements"
    x, idx, _ = ts
    axis = check_scatter_operands(op, ts, a, "torch.scatter")
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
    out = compute_np(x).copy()
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = idx.astype(np.int64)
    crop = tuple(slice(0, n) for n in idx.shape)
    vals = compute_np(src)[crop]
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

def _cumprod_torch(args, a):
    x = args[0]
    if x.dtype == torch.bool or not (x.is_floating_point() or x.dtype == torch.int64):
        x = x.to(torch.int64)
    return torch.cumprod(x, dim=a["axis"])


register(OpDef(
    name="cumprod", operands=("x",), attrs=(AttrSpec("axis", "int"),), infer=scan_infer("cumprod"),
    reference=scan_reference("cumprod", np.cumprod), torch=_cumprod_torch, cost=reduce_cost,
    doc="inclusive running product along axis (torch.cumprod); bool and integers give i64",
))
