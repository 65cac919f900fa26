"""Optimizer updates as ops: one fused, functional update per parameter.

``sgd_update`` and ``adamw_update`` take a parameter, its gradient and its optimizer state and
return the new versions. They follow ``torch.optim.SGD`` and ``torch.optim.AdamW`` step for
step (same operation order, so the results agree to rounding), but nothing is updated in
place: the graph's outputs carry ``aliases`` to the inputs they replace, and a runtime may
reuse those buffers. One fused op per parameter keeps a training step's graph small and the
torch executor at one kernel sequence per parameter, like PyTorch's own loop; being
elementwise, the update shards like its parameter.
"""

from __future__ import annotations

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.types import TensorType
from ._lazy import torch
from .registry import AttrSpec, Cost, OpDef, numel, register


def _check_like(op: str, p: TensorType, others: list[tuple[str, TensorType]]) -> None:
    if not p.dtype.is_float:
        raise TypeRuleError(f"{op}: the parameter must be a float tensor, got {p}")
    for name, t in others:
        if t != p:
            raise TypeRuleError(f"{op}: {name} {t} must have the parameter's type {p}")


def _scalar_step(op: str, t: TensorType) -> None:
    if t.shape != () or not t.dtype.is_float:
        raise TypeRuleError(f"{op}: step must be a float scalar (the step number, from 1), got {t}")


def _update_cost(flops: int):
    def cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
        n = numel(ins[0].shape)
        return Cost(flops=flops * n, bytes_read=sum(numel(t.shape) * t.dtype.itemsize for t in ins),
                    bytes_written=sum(numel(t.shape) * t.dtype.itemsize for t in outs))
    return cost


# --- sgd ---------------------------------------------------------------------------------------

def _sgd_infer(ts, attrs):
    p, g, *buf = ts
    _check_like("sgd_update", p, [("the gradient", g)] + [("the momentum buffer", b) for b in buf])
    if attrs["momentum"] == 0.0 and buf:
        raise TypeRuleError("sgd_update: a momentum buffer was given but momentum is 0; drop the operand")
    if attrs["momentum"] != 0.0 and not buf:
        raise TypeRuleError(f"sgd_update: momentum={attrs['momentum']} needs the momentum buffer operand")
    if attrs["nesterov"] and attrs["momentum"] == 0.0:
        raise TypeRuleError("sgd_update: nesterov needs a nonzero momentum")
    return [p, p] if buf else p


def _np_sgd(args, attrs):
    p, g, *buf = args
    dt = p.dtype
    lr, mom, wd = (np.asarray(attrs[k], dt) for k in ("lr", "momentum", "weight_decay"))
    d = g + wd * p if attrs["weight_decay"] != 0.0 else g
    if not buf:
        return p - lr * d
    b = mom * buf[0] + d
    step = d + mom * b if attrs["nesterov"] else b
    return p - lr * step, b


def _torch_sgd_step(args, attrs, inplace: bool):
    """torch.optim.SGD's sequence; ``inplace`` updates the parameter and buffer where they are
    (when the runtime donates them), else new tensors are returned."""
    p, g, *buf = args
    lr, mom, wd = attrs["lr"], attrs["momentum"], attrs["weight_decay"]
    d = g.add(p, alpha=wd) if wd != 0.0 else g
    if buf:
        b = buf[0].mul_(mom) if inplace else buf[0].mul(mom)
        b.add_(d)
        d = d.add(b, alpha=mom) if attrs["nesterov"] else b
    new_p = p.add_(d, alpha=-lr) if inplace else p.add(d, alpha=-lr)
    return (new_p, b) if buf else new_p


def _torch_sgd(args, attrs):
    return _torch_sgd_step(args, attrs, inplace=False)


def _torch_sgd_inplace(args, attrs):
    return _torch_sgd_step(args, attrs, inplace=True)


register(OpDef(
    name="sgd_update", operands=("param", "grad", "momentum_buffer?"),
    attrs=(AttrSpec("lr", "float", 1e-3), AttrSpec("momentum", "float", 0.0),
           AttrSpec("weight_decay", "float", 0.0), AttrSpec("nesterov", "bool", False)),
    infer=_sgd_infer, reference=_np_sgd, torch=_torch_sgd, cost=_update_cost(4),
    torch_inplace=_torch_sgd_inplace, inplace=((0, 0), (1, 2)), pad_zeros="all",
    doc="one step of torch.optim.SGD (dampening 0): d = grad + weight_decay * param; with momentum, "
        "buf = momentum * buf + d (a zero buffer on the first step gives buf = d, as PyTorch) and "
        "d = buf, or d + momentum * buf with nesterov; returns param - lr * d and, with momentum, the "
        "new buffer.",
))


# --- adamw -------------------------------------------------------------------------------------

def _adamw_infer(ts, attrs):
    p, g, m, v, step = ts
    _check_like("adamw_update", p, [("the gradient", g), ("exp_avg", m), ("exp_avg_sq", v)])
    _scalar_step("adamw_update", step)
    for k in ("beta1", "beta2"):
        if not 0.0 <= attrs[k] < 1.0:
            raise TypeRuleError(f"adamw_update: {k} must be in [0, 1), got {attrs[k]}")
    if attrs["eps"] <= 0.0:
        raise TypeRuleError(f"adamw_update: eps must be positive, got {attrs['eps']}")
    return [p, p, p]


def _bias(attrs, step: float) -> tuple[float, float]:
    bc1 = 1 - attrs["beta1"] ** step
    bc2 = 1 - attrs["beta2"] ** step
    return attrs["lr"] / bc1, bc2 ** 0.5


def _np_adamw(args, attrs):
    p, g, m, v, step = args
    dt = p.dtype
    b1, b2 = attrs["beta1"], attrs["beta2"]
    p = p * np.asarray(1 - attrs["lr"] * attrs["weight_decay"], dt)
    m = m + np.asarray(1 - b1, dt) * (g - m)
    v = v * np.asarray(b2, dt) + np.asarray(1 - b2, dt) * (g * g)
    step_size, bc2_sqrt = _bias(attrs, float(step))
    denom = np.sqrt(v) / np.asarray(bc2_sqrt, dt) + np.asarray(attrs["eps"], dt)
    return p - np.asarray(step_size, dt) * (m / denom), m, v


def _torch_adamw_step(args, attrs, inplace: bool):
    """torch.optim.AdamW's single-tensor sequence; ``inplace`` updates the parameter and state
    where they are (no allocation but the denominator) when the runtime donates them."""
    p, g, m, v, step = args
    b1, b2 = attrs["beta1"], attrs["beta2"]
    decay = 1 - attrs["lr"] * attrs["weight_decay"]
    if inplace:
        p, m, v = p.mul_(decay), m.lerp_(g, 1 - b1), v.mul_(b2)
    else:
        p, m, v = p.mul(decay), m.lerp(g, 1 - b1), v.mul(b2)
    v.addcmul_(g, g, value=1 - b2)
    step_size, bc2_sqrt = _bias(attrs, float(step))
    denom = (v.sqrt() / bc2_sqrt).add_(attrs["eps"])
    return p.addcdiv_(m, denom, value=-step_size), m, v


def _torch_adamw(args, attrs):
    return _torch_adamw_step(args, attrs, inplace=False)


def torch_adamw_inplace(args, attrs):
    """adamw updating the parameter and its state in place (the runtime donated them)."""
    return _torch_adamw_step(args, attrs, inplace=True)


register(OpDef(
    name="adamw_update", operands=("param", "grad", "exp_avg", "exp_avg_sq", "step"),
    attrs=(AttrSpec("lr", "float", 1e-3), AttrSpec("beta1", "float", 0.9), AttrSpec("beta2", "float", 0.999),
           AttrSpec("eps", "float", 1e-8), AttrSpec("weight_decay", "float", 1e-2)),
    infer=_adamw_infer, reference=_np_adamw, torch=_torch_adamw, cost=_update_cost(12),
    torch_inplace=torch_adamw_inplace, inplace=((0, 0), (1, 2), (2, 3)), pad_zeros="all",
    doc="one step of torch.optim.AdamW: param *= 1 - lr * weight_decay; exp_avg = lerp(exp_avg, "
        "grad, 1 - beta1); exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad^2; param -= "
        "lr / (1 - beta1^step) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps). step is "
        "the step number (1 on the first step) as a float scalar. Returns the new param, exp_avg "
        "and exp_avg_sq.",
))
