"""Linear algebra: matmul with full NumPy/PyTorch semantics.

- 1-D x 1-D is a dot product with a rank-0 result;
- a 1-D lhs is treated as a row [1,K] and a 1-D rhs as a column [K,1], and the added
  dim is removed from the result;
- otherwise the last two dims multiply ([..,M,K] x [..,K,N] -> [..,M,N]) and the leading
  (batch) dims broadcast like NumPy.

Both operands must have the same dtype (PyTorch refuses mixed dtypes; a frontend inserts
``cast`` where a model relies on autocast); bool is rejected as PyTorch's CPU kernels do.
Cost: 2*M*N*K FLOPs per batch element. The NumPy reference multiplies f16/bf16 in f32 and
rounds once.
"""

from __future__ import annotations

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.types import TensorType
from .numeric import LOW_PRECISION
from ._lazy import torch
from .registry import Cost, OpDef, broadcast_shapes, register

_LOW_PRECISION = LOW_PRECISION


def _mark(t: TensorType, k_index: int) -> str:
    """``f32[32,K=784]``: the type with its contraction dim labelled."""
    dims = [f"K={d}" if i == k_index else str(d) for i, d in enumerate(t.shape)]
    return f"{t.dtype}[{','.join(dims)}]"


def matmul_shapes(a: TensorType, b: TensorType) -> tuple[tuple[int, ...], int]:
    """The result shape of ``matmul(a, b)`` and its contraction size K; raises TypeRuleError."""
    if a.rank == 0 or b.rank == 0:
        which = "lhs" if a.rank == 0 else "rhs"
        raise TypeRuleError(f"matmul: {which} is a rank-0 tensor ({a if which == 'lhs' else b}); matmul needs "
                            "rank >= 1 operands (use mul to scale by a scalar)")
    ka = a.shape[-1]
    kb = b.shape[0] if b.rank == 1 else b.shape[-2]
    if ka != kb:
        raise TypeRuleError(
            f"matmul: contraction dims differ: lhs {_mark(a, a.rank - 1)} vs rhs {_mark(b, max(b.rank - 2, 0))} "
            "(the last dim of lhs must equal the "
            f"{'only' if b.rank == 1 else 'second-to-last'} dim of rhs)")
    a_batch, m = (a.shape[:-2], (a.shape[-2],)) if a.rank >= 2 else ((), ())
    b_batch, n = (b.shape[:-2], (b.shape[-1],)) if b.rank >= 2 else ((), ())
    try:
        batch = broadcast_shapes(a_batch, b_batch, op="matmul")
    except TypeRuleError:
        raise TypeRuleError(
            f"matmul: batch dims [{','.join(map(str, a_batch))}] of lhs {a} and [{','.join(map(str, b_batch))}] "
            f"of rhs {b} do not broadcast (each pair, aligned from the right, must be equal or 1)") from None
    return batch + m + n, ka


def _matmul_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    a, b = ts
    if a.dtype is not b.dtype:
        raise TypeRuleError(f"matmul: operand dtypes differ (lhs {a}, rhs {b}); cast one of them so both "
                            "have the same dtype")
    if a.dtype.is_bool:
        raise TypeRuleError(f"matmul: bool operands ({a}, {b}) are not supported; cast them to an "
                            "integer or float dtype")
    shape, _ = matmul_shapes(a, b)
    return TensorType(shape, a.dtype)


def _matmul_reference(args, attrs):
    a, b = args
    if a.dtype in _LOW_PRECISION:
        a, b = a.astype(np.float32), b.astype(np.float32)
    return np.matmul(a, b)


def _matmul_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    """2*M*N*K FLOPs per batch element (a multiply and an add per term)."""
    _, k = matmul_shapes(ins[0], ins[1])
    return Cost(2 * outs[0].numel * k, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


register(OpDef(
    name="matmul", operands=("lhs", "rhs"), infer=_matmul_infer, reference=_matmul_reference,
    torch=lambda args, a: torch.matmul(args[0], args[1]), cost=_matmul_cost, pad_zeros="any",
    doc="matrix product with NumPy semantics: dot for 1-D x 1-D, vector promotion, broadcast batch dims",
))
