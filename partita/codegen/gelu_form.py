"""GELU's tanh form in a fused kernel as ``x / (1 + exp(-2u))``: one exp and one division a lane.

``gelu(x) {approximate="tanh"}`` is ``0.5 x (1 + tanh(u))`` with
``u = sqrt(2 / pi) (x + 0.044715 x^3)``. Since ``(1 + tanh u) / 2 = 1 / (1 + exp(-2u))``
exactly in real arithmetic, it equals ``x / (1 + exp(-2u))``: no tanh (whose two branches cost
an exp and a division a lane), and no cancellation in ``1 + tanh(u)`` in the negative tail,
where ATen's own float formula keeps only the ulps of 1 (the GEMM's ``gelu_tanh`` epilogue,
gemm.py, computes it the same way). The limits come out right: for large negative u,
``exp(-2u)`` overflows to inf and ``x / inf`` is -0.0 (ATen: -0.0); ``x = +inf`` gives inf,
``x = -inf`` NaN (ATen: ``-inf * 0``, NaN), NaN stays NaN.

GELU's tanh form reaches a fused body in two ways: ``torch.export`` of
``F.gelu(x, approximate="tanh")`` (Gemma2's ``gelu_pytorch_tanh``) imports as the one op
``gelu {approximate="tanh"}``; HF's ``NewGELU`` (GPT-2's ``gelu_new``, GPT-J, CodeGen, Phi)
arrives written out, ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))``, which
the import pipeline leaves as it is. ``spelled_gelu_to_op`` (called by ``lowering.lower`` on
every body with a ``tanh``) rewrites the written-out form in a copy of the body into the op,
with the ``gelu-tanh`` rules of the ``fuse-activations`` pass (partita/passes/fuse.py: every
association of the outer product, the cube as ``pow`` or ``x * x * x``, the constants to
their dtype's rounding, intermediates used elsewhere kept); the lowering of the op calls
``gelu_tanh_ir`` for f32, f64 keeps ATen's order with libm's tanh. Only the kernel's code
changes: the node, its reference and its ATen fallback keep the chain.
``PARTITA_GELU_SIGMOID=0`` (read when a kernel is lowered) turns the rewrite off, for comparisons.

Error against ``torch.nn.functional.gelu(x, approximate="tanh")`` over a dense f32 sweep
(tests/codegen/test_mathlib_gelu.py): within 2e-7 absolute everywhere and a few ulp relative
where |gelu(x)| > 1e-3 (ATen itself is off by up to 6e-8 |x| / 2 in the tail).
"""

from __future__ import annotations

import math
import os
from typing import Callable

from ..ir.graph import Graph

__all__ = ["ENV", "enabled", "gelu_tanh_ir", "spelled_gelu_to_op"]

ENV = "PARTITA_GELU_SIGMOID"

# -2 sqrt(2 / pi): exp's argument is this times (x + 0.044715 x^3)
_MINUS_TWO_K = -2.0 * math.sqrt(2.0 / math.pi)


def enabled() -> bool:
    """Whether fused kernels compute GELU's tanh form as ``x / (1 + exp(-2u))``."""
    return os.environ.get(ENV, "1") != "0"


def gelu_tanh_ir(op: Callable[[str], str], exp: Callable[[str], str], const: Callable[[float], str],
                 x: str, t: str) -> str:
    """Emit ``x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3)))`` of type ``t`` through ``op``
    (one instruction's text -> its result's name), ``exp`` (an exp call) and ``const`` (a
    constant's spelling); the result's name."""
    x2 = op(f"fmul {t} {x}, {x}")
    x3 = op(f"fmul {t} {x2}, {x}")
    k = op(f"fmul {t} {x3}, {const(0.044715)}")
    inner = op(f"fadd {t} {x}, {k}")
    arg = op(f"fmul {t} {inner}, {const(_MINUS_TWO_K)}")
    ex = exp(arg)
    den = op(f"fadd {t} {ex}, {const(1.0)}")
    return op(f"fdiv {t} {x}, {den}")


def spelled_gelu_to_op(body: Graph) -> Graph:
    """``body`` with each GELU tanh form written out replaced by ``gelu {approximate="tanh"}``
    (a rewritten copy; ``body`` itself when it has no ``tanh`` or the rewrite is off)."""
    if not enabled() or not any(n.op == "tanh" for n in body.nodes):
        return body
    from ..passes.dce import DeadCodeElimination
    from ..passes.fuse import RULES
    from ..passes.rewrite import RewriteDriver

    g = body.clone()
    driver = RewriteDriver([r for r in RULES if r.name.startswith("gelu-tanh")])
    driver.run(g)
    if not driver.counts:
        return body
    return DeadCodeElimination().run(g)
