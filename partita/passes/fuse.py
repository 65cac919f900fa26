"""Activation fusion: activation functions spelled out as elementwise chains become the one
fused op partita has for them.

Models and exporters often write an activation as its formula: GPT-2's ``gelu_new`` is
``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, eight nodes, where the torch
executor could run one ``gelu`` kernel and autodiff could emit one ``gelu_grad`` instead of
a dozen backward ops. The rules here recognise those chains:

- GELU, tanh form -> ``gelu(x) {approximate="tanh"}``; the cube as ``pow(x, 3)`` or
  ``x * x * x``;
- GELU, erf form -> ``gelu(x)``; the scaling as ``x * 0.70710678`` or ``x / 1.41421356``;
- SiLU ``x * sigmoid(x)`` -> ``silu(x)``;

each with every association of the outer product (``(0.5 * x) * (1 + t)``,
``x * (0.5 * (1 + t))``, ``(x * (1 + t)) * 0.5``); the rewrite DSL tries both operand orders
of ``add`` and ``mul``.

Numerics: the fused kernel computes the same formula in one pass, so it differs from the
chain only by the rounding of the intermediates (about 1e-7 relative in f32). That is why
this is a pass of its own and not part of ``canonicalize``, whose rules are exact.
Conditions: ``x`` is a float tensor (not a storage type), the constants are the formula's
up to the rounding of their own dtype, and the fused op has exactly the root's type (the
driver refuses the rewrite otherwise), so a constant that broadcasts ``x`` to a larger
shape or promotes its dtype keeps the chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


from ..ir.dtypes import DType
from ..ir.graph import Graph, Value
from .manager import Pass, register_pass
from .rewrite import Op, Pattern, RewriteDriver, RewriteEvent, Rule, Splat, Var, rule, splat_value

__all__ = ["FuseActivations", "RULES", "Near"]

# Constants written with fewer digits than f32 holds (0.7978845608, 0.79788456) must still
# match; 1e-6 relative accepts those and nothing a different formula would use.
_REL_TOL = 1e-6


def _float_operand(v: Value) -> bool:
    dt = v.type.dtype
    return dt.is_float and not dt.storage


def _tolerance(dtype: DType) -> float:
    """Relative distance allowed between a constant of ``dtype`` and the formula's value:
    the rounding to that dtype (an f16 or bf16 model holds 0.044715 as its nearest value)."""
    if not dtype.is_float:
        return _REL_TOL
    import ml_dtypes  # on first use: its import is half a second that planning does not need

    return max(_REL_TOL, float(ml_dtypes.finfo(dtype.np).eps))


class Near(Splat):
    """A splat constant within rounding of ``target``: ``|s - target| <= tol * |target|``,
    where ``tol`` is 1e-6, or the machine epsilon of the constant's dtype when that is
    larger (bf16, f16)."""

    __slots__ = ("target",)

    def __init__(self, target: float) -> None:
        super().__init__(None)
        self.target = target

    def _compile(self, ctx: Any) -> Callable[[Value, dict], bool]:
        any_splat = super()._compile(ctx)
        target = self.target

        def match(value: Value, b: dict) -> bool:
            if not any_splat(value, b):
                return False
            s = splat_value(value)
            if isinstance(s, bool) or not isinstance(s, (int, float)):
                return False
            return abs(s - target) <= _tolerance(value.type.dtype) * abs(target)
        return match

    def __repr__(self) -> str:
        return f"Near({self.target!r})"


X = Var("x", where=_float_operand)

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)   # 0.7978845608028654
SQRT_HALF = math.sqrt(0.5)                  # 0.7071067811865476
SQRT_2 = math.sqrt(2.0)                     # 1.4142135623730951

CUBES: tuple[Pattern, ...] = (
    Op("pow", X, Splat(3)),                 # Splat compares with ==: 3 and 3.0 both match
    Op("mul", Op("mul", X, X), X),          # x * x * x, either association (mul commutes)
)


def _tanh_core(cube: Pattern) -> Pattern:
    """``1 + tanh(sqrt(2/pi) * (x + 0.044715 * cube))``."""
    inner = Op("add", X, Op("mul", cube, Near(0.044715)))
    return Op("add", Op("tanh", Op("mul", inner, Near(SQRT_2_OVER_PI))), Splat(1))


ERF_ARGS: tuple[Pattern, ...] = (
    Op("mul", X, Near(SQRT_HALF)),
    Op("div", X, Near(SQRT_2)),
)


def _erf_core(arg: Pattern) -> Pattern:
    """``1 + erf(x / sqrt(2))``."""
    return Op("add", Op("erf", arg), Splat(1))


def _half_x_times(core: Pattern) -> list[Op]:
    """The three associations of ``0.5 * x * core``."""
    return [
        Op("mul", Op("mul", X, Splat(0.5)), core),
        Op("mul", X, Op("mul", Splat(0.5), core)),
        Op("mul", Op("mul", X, core), Splat(0.5)),
    ]


_ASSOCIATIONS = ("(0.5*x)*c", "x*(0.5*c)", "(x*c)*0.5")


def _rules() -> list[Rule]:
    out: list[Rule] = []
    for cube, cube_name in zip(CUBES, ("pow", "mul")):
        for pat, assoc in zip(_half_x_times(_tanh_core(cube)), _ASSOCIATIONS):
            out.append(rule(f"gelu-tanh[{assoc},cube={cube_name}]", pat, Op("gelu", X, approximate="tanh"),
                            doc="0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = gelu(x, tanh)"))
    for arg, arg_name in zip(ERF_ARGS, ("mul", "div")):
        for pat, assoc in zip(_half_x_times(_erf_core(arg)), _ASSOCIATIONS):
            out.append(rule(f"gelu-erf[{assoc},scale={arg_name}]", pat, Op("gelu", X),
                            doc="0.5 x (1 + erf(x / sqrt(2))) = gelu(x)"))
    out.append(rule("silu", Op("mul", X, Op("sigmoid", X)), Op("silu", X), doc="x sigmoid(x) = silu(x)"))
    return out


RULES: list[Rule] = _rules()


@register_pass
class FuseActivations(Pass):
    """Rewrite activations spelled out as elementwise chains (GELU in its tanh and erf forms,
    SiLU) into the single fused op. Values differ from the chain's by rounding only, which
    is why this is not part of ``canonicalize``. ``trace=true`` writes each firing (the
    rule, where it is written, the node's location) to the pass manager's output; dead
    remains of a chain whose intermediates have other users are left for ``dce``.
    """

    name = "fuse-activations"

    @dataclass
    class Options:
        trace: bool = False

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.trace: list[RewriteEvent] = []

    def run(self, graph: Graph) -> Graph:
        trace: list[RewriteEvent] | None = [] if self.options.trace else None
        RewriteDriver(RULES, trace=trace).run(graph)
        if trace is not None:
            self.trace = trace
            for e in trace:
                self.out.write(f"// fuse-activations: {e}\n")
        return graph
