"""What eager (uncompiled) PyTorch moves for the ops partita prices as one fused kernel.

``simulate(..., fusion="eager")`` prices a program as an uncompiled PyTorch training loop runs
it: the ops below, one kernel each in partita's program, become the chain of kernels eager
PyTorch launches for them, each reading and writing its operands whole (``eager_kernels``:
bytes moved by each kernel). Every other op is one kernel in both (matmuls, attention, SiLU,
its backward, the elementwise adds and products, the casts), so it is priced alike.

The chains, counted from the PyTorch code a Llama trainer runs (element size ``s`` of the
input, ``E`` its elements, f32 compute as ``x.float()`` does):

- ``rms_norm``: ``x.float()`` (s+4)E, ``pow(2)`` 8E, ``mean(-1)`` 4E, ``+ eps`` and ``rsqrt``
  (a row each), ``x * rstd`` 8E, ``type_as(x)`` (4+s)E, ``* weight`` 2sE; the casts are
  absent for an f32 input.
- ``rms_norm_grad`` (autograd of that chain): ``dy * weight`` 2sE, ``dweight`` as
  ``(dy * out).sum`` 3sE + sE, the cast back to f32 (s+4)E, ``g * rstd`` 8E, ``(g * x).sum(-1)``
  12E + 4E, ``mean``'s backward 4E, ``pow``'s backward 12E, the two gradients of x summed 12E,
  the cast to the input's dtype (4+s)E.
- ``cross_entropy`` (``F.cross_entropy``: ``log_softmax`` then ``nll_loss``): 2V for the logits
  (V their bytes), the loss a row; its grad: ``nll_loss_backward`` writes a zeroed V and
  scatters a row, ``log_softmax_backward`` reads 2V and writes V.
- ``adamw_update`` (``torch.optim.AdamW(foreach=True)``, not fused: eight foreach kernels over
  the f32 states of P elements: ``lerp_`` 12P, ``mul_`` 8P, ``addcmul_`` 12P, weight decay's
  ``mul_`` 8P, ``sqrt`` 8P, ``div_`` 8P, ``add_`` 8P, ``addcdiv_`` 16P).
"""

from __future__ import annotations

from typing import Any, Callable

from ..ir.graph import Node
from ..ir.types import TensorType

FUSIONS = ("fused", "eager")


def _operand(node: Node, i: int) -> TensorType | None:
    """The tensor type of ``node``'s i-th operand, or None."""
    if i >= len(node.operands):
        return None
    ty = node.operands[i].type
    return ty if isinstance(ty, TensorType) else None


def _rows(ty: TensorType) -> int:
    """The rows a norm over the last axis reduces ``ty`` to."""
    return ty.numel // ty.shape[-1] if ty.shape else 1


def rms_norm_kernels(node: Node) -> list[int]:
    """Bytes of each kernel eager PyTorch runs for an RMSNorm forward in f32."""
    x = _operand(node, 0)
    if x is None:
        return []
    e, s, r = x.numel, x.dtype.itemsize, _rows(x)
    cast = [] if s == 4 else [(s + 4) * e]
    back = [] if s == 4 else [(4 + s) * e]
    weight = [2 * s * e] if len(node.operands) > 1 else []
    return cast + [8 * e, 4 * e + 4 * r, 8 * r, 8 * r, 8 * e + 4 * r] + back + weight


def rms_norm_grad_kernels(node: Node) -> list[int]:
    """Bytes of each kernel autograd runs for the backward of ``rms_norm_kernels``' chain."""
    x = _operand(node, 1)
    if x is None:
        return []
    e, s, r = x.numel, x.dtype.itemsize, _rows(x)
    weight = [2 * s * e, 3 * s * e, s * e] if len(node.operands) > 2 else []
    cast = [] if s == 4 else [(s + 4) * e]
    back = [] if s == 4 else [(4 + s) * e]
    return weight + cast + [8 * e + 4 * r, 12 * e, 4 * e + 4 * r, 8 * r, 4 * e + 4 * r, 12 * e, 12 * e] + back


def cross_entropy_kernels(node: Node) -> list[int]:
    """Bytes of ``log_softmax`` and ``nll_loss`` over the logits."""
    lg = _operand(node, 0)
    if lg is None:
        return []
    v = lg.nbytes
    return [2 * v, 8 * _rows(lg)]


def cross_entropy_grad_kernels(node: Node) -> list[int]:
    """Bytes of ``nll_loss_backward`` (a zeroed gradient, a scatter) and ``log_softmax_backward``."""
    lg = _operand(node, 1)
    if lg is None:
        return []
    v = lg.nbytes
    return [v, 8 * _rows(lg), 3 * v]


def adamw_kernels(node: Node) -> list[int]:
    """Bytes of the eight foreach kernels of an unfused AdamW step over f32 states."""
    p = _operand(node, 0)
    if p is None:
        return []
    n = p.numel
    return [12 * n, 8 * n, 12 * n, 8 * n, 8 * n, 8 * n, 8 * n, 16 * n]


EAGER_KERNELS: dict[str, Callable[[Node], list[int]]] = {
    "rms_norm": rms_norm_kernels,
    "rms_norm_grad": rms_norm_grad_kernels,
    "cross_entropy": cross_entropy_kernels,
    "cross_entropy_grad": cross_entropy_grad_kernels,
    "adamw_update": adamw_kernels,
}


def transient_bytes(node: Node) -> int:
    """Bytes eager PyTorch's chain for ``node`` holds while it runs beyond the op's own operands
    and results (its largest set of intermediates live at once), 0 for an op without a chain:

    - ``rms_norm``: ``x.float()`` beside ``pow``'s or the product's f32 result, 8E;
    - ``rms_norm_grad``: the f32 gradient of x accumulating over its two paths beside a step's
      f32 operand and result, 12E;
    - ``cross_entropy``: ``log_softmax``'s result beside the logits, V (it is what the backward
      keeps, in place of the logits partita's program keeps: the same size);
    - ``cross_entropy_grad``: ``nll_loss_backward``'s zeroed gradient beside the kept
      ``log_softmax`` result and ``log_softmax_backward``'s result, V;
    - ``adamw_update``: ``_foreach_sqrt``'s copy of the second moment, 4P (the foreach call
      allocates it for every param of the group at once; counted here a param at a time).
    """
    op = node.op
    if op == "rms_norm" and (x := _operand(node, 0)) is not None:
        return 8 * x.numel
    if op == "rms_norm_grad" and (x := _operand(node, 1)) is not None:
        return 12 * x.numel
    if op == "cross_entropy" and (lg := _operand(node, 0)) is not None:
        return lg.nbytes
    if op == "cross_entropy_grad" and (lg := _operand(node, 1)) is not None:
        return lg.nbytes
    if op == "adamw_update" and (p := _operand(node, 0)) is not None:
        return 4 * p.numel
    return 0


def eager_ops(fusion: Any) -> frozenset[str]:
    """The ops priced as eager chains under ``fusion``: ``"fused"`` none, ``"eager"`` all of
    ``EAGER_KERNELS``, or a collection of their names (a run that fused some of them: e.g. a
    fused RMSNorm kernel in an otherwise eager loop). Anything else raises ValueError."""
    if isinstance(fusion, str):
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)} or a collection of op names "
                             f"({', '.join(sorted(EAGER_KERNELS))}), got {fusion!r:.40}")
        return frozenset(EAGER_KERNELS) if fusion == "eager" else frozenset()
    try:
        names = frozenset(fusion)
    except TypeError:
        raise ValueError(f"fusion must be one of {', '.join(FUSIONS)} or a collection of op names, "
                         f"got {fusion!r:.40}") from None
    unknown = sorted(str(n) for n in names - frozenset(EAGER_KERNELS))
    if unknown:
        raise ValueError(f"fusion: no eager chain is known for {', '.join(unknown)}; the ops with one are "
                         f"{', '.join(sorted(EAGER_KERNELS))}")
    return names


def eager_kernels(node: Node) -> list[int] | None:
    """Bytes moved by each kernel eager PyTorch runs for ``node``, or None where eager runs
    the op as partita prices it (one kernel)."""
    f = EAGER_KERNELS.get(node.op)
    if f is None:
        return None
    out = f(node)
    return out or None
