"""The AdamW update as one generated kernel per parameter.

ATen runs ``adamw_update`` as eight kernels (``mul_``, ``lerp_``, ``mul_``, ``addcmul_``,
``sqrt``, ``div``, ``add_``, ``addcdiv_``), each a pass over parameter-sized memory. The kernel
here reads the parameter, its gradient and both moments once and writes the three results
once, in the order of operations of the op's reference (partita/ops/optim.py), with the
constants rounded to the parameter's dtype as the reference rounds them. With a donated
parameter and state (``Trainer``, ``CompiledProgram(donate=True)``), the results are written
where the operands are. The two step-dependent scalars (``lr / (1 - beta1**step)`` and
``sqrt(1 - beta2**step)``) are computed on the host each call, as torch.optim.AdamW does.
"""

from __future__ import annotations

import ctypes
import hashlib
from typing import Any, Callable

from ..ops._lazy import torch
from .mathlib import f32 as f32c, f64 as f64c

__all__ = ["adamw_ir", "prepare_adamw"]


def adamw_ir(name: str, dtype: str, attrs: dict, inplace: bool) -> str:
    t = {"f32": "float", "f64": "double"}[dtype]
    c = f32c if dtype == "f32" else f64c
    sfx = "f32" if dtype == "f32" else "f64"
    b1, b2 = attrs["beta1"], attrs["beta2"]
    w1 = 1.0 - b1
    # torch.lerp(m, g, w): m + w (g - m) for w < 0.5, else g - (g - m)(1 - w)
    if w1 < 0.5:
        lerp = [f"  %gm = fsub {t} %g, %m", f"  %wgm = fmul {t} %gm, {c(w1)}", f"  %mn = fadd {t} %m, %wgm"]
    else:
        lerp = [f"  %gm = fsub {t} %g, %m", f"  %wgm = fmul {t} %gm, {c(1.0 - w1)}", f"  %mn = fsub {t} %g, %wgm"]
    body = "\n".join([
        f"  %pp = getelementptr inbounds {t}, ptr %p, i64 %i",
        f"  %pg = getelementptr inbounds {t}, ptr %gr, i64 %i",
        f"  %pm = getelementptr inbounds {t}, ptr %m0, i64 %i",
        f"  %pv = getelementptr inbounds {t}, ptr %v0, i64 %i",
        f"  %p0 = load {t}, ptr %pp",
        f"  %g = load {t}, ptr %pg",
        f"  %m = load {t}, ptr %pm",
        f"  %v = load {t}, ptr %pv",
        f"  %pd = fmul {t} %p0, {c(1.0 - attrs['lr'] * attrs['weight_decay'])}",
        *lerp,
        f"  %vb = fmul {t} %v, {c(b2)}",
        f"  %gg = fmul {t} %g, %g",
        f"  %wgg = fmul {t} %gg, {c(1.0 - b2)}",
        f"  %vn = fadd {t} %vb, %wgg",
        f"  %sq = call {t} @llvm.sqrt.{sfx}({t} %vn)",
        f"  %sb = fdiv {t} %sq, %bc2",
        f"  %den = fadd {t} %sb, {c(attrs['eps'])}",
        f"  %q = fdiv {t} %mn, %den",
        f"  %u = fmul {t} %ss, %q",
        f"  %pn = fsub {t} %pd, %u",
        f"  %op_ = getelementptr inbounds {t}, ptr {'%p' if inplace else '%op'}, i64 %i",
        f"  %om_ = getelementptr inbounds {t}, ptr {'%m0' if inplace else '%om'}, i64 %i",
        f"  %ov_ = getelementptr inbounds {t}, ptr {'%v0' if inplace else '%ov'}, i64 %i",
        f"  store {t} %pn, ptr %op_",
        f"  store {t} %mn, ptr %om_",
        f"  store {t} %vn, ptr %ov_",
    ])
    # In place, each buffer is read and written through one pointer: all stay noalias, so LLVM
    # vectorizes without run-time overlap checks (which fail when an output is its input).
    outs = "" if inplace else ", ptr noalias %op, ptr noalias %om, ptr noalias %ov"
    return f"""; partita kernel {name}: adamw_update on {dtype}{' (in place)' if inplace else ''}
declare {t} @llvm.sqrt.{sfx}({t})

define void @{name}(ptr noalias %p, ptr noalias readonly %gr, ptr noalias %m0, ptr noalias %v0{outs}, {t} %ss, {t} %bc2, i64 %lo, i64 %hi) nounwind {{
entry:
  %empty = icmp sge i64 %lo, %hi
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ %lo, %entry ], [ %in, %loop ]
{body}
  %in = add nsw i64 %i, 1
  %d = icmp eq i64 %in, %hi
  br i1 %d, label %exit, label %loop, !llvm.loop !0
exit:
  ret void
}}

!0 = distinct !{{!0, !1}}
!1 = !{{!"llvm.loop.vectorize.width", i32 {8 if dtype == 'f32' else 4}}}
"""


def prepare_adamw(node: Any, inplace: bool) -> Callable | None:
    """The step function of one ``adamw_update`` node as a generated kernel, or None when its
    dtype has none (the op's own ATen implementation then runs)."""
    from .jit import CodegenError, jit

    dt = node.operands[0].type.dtype.name
    if dt not in ("f32", "f64"):
        return None
    attrs = node.attrs
    key = repr((dt, sorted(attrs.items()), inplace))
    name = "pk_adamw_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    ir = adamw_ir(name, dt, attrs, inplace)
    scalar = ctypes.c_float if dt == "f32" else ctypes.c_double
    n_ptr = 4 if inplace else 7
    try:
        k = jit().kernel(name, ir, n_ptr,
                         argtypes=[ctypes.c_void_p] * n_ptr + [scalar, scalar, ctypes.c_int64, ctypes.c_int64])
    except CodegenError:
        return None
    fn = k.fn
    from .aten_fallback import op_on_aten

    fallback = op_on_aten("adamw_update", inplace=True)

    lr, b1, b2 = attrs["lr"], attrs["beta1"], attrs["beta2"]
    empty_like = torch.empty_like
    numel = node.operands[0].type.numel

    def step(args: list, a: dict) -> Any:
        p, g, m, v, s = args
        t = float(s)
        step_size = lr / (1 - b1 ** t)
        bc2 = (1 - b2 ** t) ** 0.5
        g = g if g.is_contiguous() else g.contiguous()
        if inplace:
            # donated: distinct, contiguous buffers the program owns (checked, as a caller may
            # donate a view)
            if not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous()) or \
                    len({p.data_ptr(), m.data_ptr(), v.data_ptr(), g.data_ptr()}) < 4:
                return fallback(args, a)
            if numel:
                fn(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), step_size, bc2, 0, numel)
            return p, m, v
        p, m, v = (x if x.is_contiguous() else x.contiguous() for x in (p, m, v))
        op, om, ov = empty_like(p), empty_like(m), empty_like(v)
        if numel:
            fn(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), op.data_ptr(), om.data_ptr(), ov.data_ptr(),
               step_size, bc2, 0, numel)
        return op, om, ov

    return step
