"""GELU's tanh form with its inner polynomial factored, taken as the op before the library's
anchors (inference; issue 37).

BLOOM (and Megatron's ``bias_gelu``) writes GELU as

    x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

``sqrt(2/pi) x (1 + 0.044715 x^2)`` is ``sqrt(2/pi) (x + 0.044715 x^3)``: the same function as
``gelu(x) {approximate="tanh"}``, only rounded differently in its intermediates (about 1e-7
relative in f32, the ``fuse-activations`` pass's own terms, partita/passes/fuse.py, whose
``gelu-tanh`` rules know the expanded form only). ``take_factored_gelu`` (called by
``fuse-library`` before its anchors) rewrites the factored form into the op, so the GEMM in front
takes it as its ``gelu_tanh`` epilogue: one step fewer per MLP block (BLOOM's fused GELU step
was 8 us of a 170 us call at [32, 256], one thread). Every association of the outer product
(``(0.5 * x) * c``, ``x * (0.5 * c)``, ``(x * c) * 0.5``) and of the square term
(``(0.044715 * x) * x``, ``0.044715 * (x * x)``) is taken; the rewrite DSL tries both operand
orders of ``mul`` and ``add``. The constants match to their dtype's rounding (``Near``); an
intermediate read elsewhere stays for that reader.

GPT-2's ``gelu_new`` (GPT-J, CodeGen and Phi use the same ``NewGELUActivation``) is the expanded
form ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, which the import pipeline
(no ``fuse-activations``) used to leave as a fused elementwise step after ``c_fc``. ``RULES``
also holds the ``gelu-tanh`` rules of ``fuse-activations`` themselves (cube as ``pow(x, 3)`` or
``x * x * x``, the same three associations), so that form becomes the op here too and ``c_fc``
takes it as its epilogue: one step fewer per block (gpt2: 23 -> 21 steps run, 54 -> 50 with
the constant ones; ``bench/zoo_profile.py gpt2 -v``).
"""

from __future__ import annotations

import math

from ..ir.graph import Graph
from ..passes.fuse import RULES as ACTIVATION_RULES
from ..passes.fuse import Near
from ..passes.rewrite import Op, Pattern, Rule, Splat, Var, apply_rules, rule

__all__ = ["RULES", "take_factored_gelu"]

X = Var("x", where=lambda v: v.type.dtype.is_float and not v.type.dtype.storage)

_SQUARES: tuple[Pattern, ...] = (
    Op("mul", Op("mul", X, Near(0.044715)), X),    # (0.044715 * x) * x: BLOOM's
    Op("mul", Op("mul", X, X), Near(0.044715)),    # 0.044715 * (x * x)
)


def _core(square: Pattern) -> Pattern:
    """``1 + tanh(sqrt(2/pi) x * (1 + square))``."""
    inner = Op("mul", Op("mul", X, Near(math.sqrt(2.0 / math.pi))), Op("add", square, Splat(1)))
    return Op("add", Op("tanh", inner), Splat(1))


def _rules() -> list[Rule]:
    """The factored form under each association of the outer product and of the square."""
    out: list[Rule] = []
    for square, sq_name in zip(_SQUARES, ("(c*x)*x", "c*(x*x)")):
        core = _core(square)
        outers = (Op("mul", Op("mul", X, Splat(0.5)), core), Op("mul", X, Op("mul", Splat(0.5), core)),
                  Op("mul", Op("mul", X, core), Splat(0.5)))
        for pat, assoc in zip(outers, ("(0.5*x)*c", "x*(0.5*c)", "(x*c)*0.5")):
            out.append(rule(f"gelu-tanh-factored[{assoc},square={sq_name}]", pat, Op("gelu", X, approximate="tanh"),
                            doc="0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) = gelu(x, tanh)"))
    return out


def _expanded_rules() -> list[Rule]:
    """``fuse-activations``' own ``gelu-tanh`` rules: the expanded (GPT-2 ``gelu_new``) form."""
    return [r for r in ACTIVATION_RULES if r.name.startswith("gelu-tanh[")]


RULES: list[Rule] = _rules() + _expanded_rules()


def take_factored_gelu(graph: Graph) -> int:
    """Rewrite every GELU tanh form of ``graph``, factored or expanded, into ``gelu {approximate="tanh"}``
    (intermediates read by nothing else erased); returns how many were taken."""
    if not any(n.op == "tanh" for n in graph.nodes):
        return 0
    return apply_rules(graph, RULES)
