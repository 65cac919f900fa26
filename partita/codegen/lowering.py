"""Lowering of a fused kernel's body (a small partita graph of elementwise ops) to LLVM IR.

The body's outputs all have one shape, the *iteration space*. Every value of the body is
computed at each point of it: an input of a smaller shape is read through broadcast strides
(0 along the dims it lacks or has as 1), and a value computed from such inputs is simply
recomputed per point, which is what broadcasting means. Before the loops are written, adjacent
dims that every operand walks alike are merged, so a kernel over contiguous tensors is one flat
loop and a bias broadcast over rows is two loops with a unit-stride inner one.

The kernel's signature is ``void NAME(ptr in0, ..., ptr out0, ..., i64 lo, i64 hi)``: one
pointer per body input and output (contiguous buffers), and the range of the outermost merged
dim to compute, so that several threads can each take a slice. The innermost loop carries
``llvm.loop.vectorize.width`` (``vector_width()``: 16 lanes of f32 with AVX-512, else 8; LLVM's
own cost model picked 4 on some CPUs and left exp scalar).

Semantics follow the op records: no fast-math and no FMA contraction, so add/mul/div chains
round exactly as the unfused ATen ops do; transcendental functions come from ``mathlib`` (f32)
or libm (f64) and agree with the reference to a few ulp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..ir.dtypes import DType
from ..ir.graph import Graph, Node, Value
from .mathlib import F32_FUNCTIONS, F64_LIBM, declarations, f32 as f32c, f64 as f64c
from . import gelu_form

__all__ = ["LoweringError", "Lowered", "lower", "supported", "KERNEL_DTYPES"]

# The dtypes a generated kernel reads and writes. bool lives in memory as one byte (as torch
# holds it) and in registers as i1.
KERNEL_DTYPES = {"f32": "float", "f64": "double", "i32": "i32", "i64": "i64", "bool": "i1"}
_MEM = {"f32": "float", "f64": "double", "i32": "i32", "i64": "i64", "bool": "i8"}
_VECTOR_WIDTH: int | None = None  # lanes of f32 asked of LLVM's vectorizer (vector_width())


def vector_width() -> int:
    """f32 lanes for the innermost loops: 16 where the CPU has AVX-512 (one zmm register), else
    8 (AVX2). Measured on the clamp-mul-add chain on an AMD EPYC (znver4) with AVX-512: 0.94 ms
    at 16 lanes, 1.80 ms at 8. The host CPU is part of every kernel's cache key."""
    global _VECTOR_WIDTH
    if _VECTOR_WIDTH is None:
        try:
            from .jit import jit

            _VECTOR_WIDTH = 16 if "+avx512f" in jit().features.split(",") else 8
        except Exception:
            _VECTOR_WIDTH = 8
    return _VECTOR_WIDTH


class LoweringError(Exception):
    """A body the code generator cannot lower (the fusion pass asks ``supported`` first)."""


# Ops by how they lower. Each entry says which operand dtypes it takes.
_FLOAT_UNARY = {"exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "gelu", "silu", "erf"}
_NUM_UNARY = {"neg", "abs", "relu", "sign"}
_ARITH = {"add", "sub", "mul", "div", "maximum", "minimum", "pow"}
_COMPARE = {"equal": ("oeq", "eq"), "not_equal": ("une", "ne"), "less": ("olt", "slt"),
            "less_equal": ("ole", "sle"), "greater": ("ogt", "sgt"), "greater_equal": ("oge", "sge")}
_LOGIC = {"logical_and", "logical_or", "logical_not"}
_GRADS = {"relu_grad", "sigmoid_grad", "tanh_grad", "silu_grad", "gelu_grad"}
_SPLATS = {"full", "constant"}
_PASS = {"broadcast_to", "reshape"}
LOWERED_OPS = _FLOAT_UNARY | _NUM_UNARY | _ARITH | set(_COMPARE) | _LOGIC | _SPLATS | _PASS | _GRADS | {"where", "cast"}


def supported(op: str, operand_dtypes: list[DType], result_dtypes: list[DType], attrs: dict) -> str | None:
    """None when a node of ``op`` with these dtypes lowers; else the reason it does not."""
    if op not in LOWERED_OPS:
        return f"no lowering for {op}"
    for d in (*operand_dtypes, *result_dtypes):
        if d.name not in KERNEL_DTYPES:
            return f"{op} on {d} (kernels take {', '.join(KERNEL_DTYPES)})"
    if op == "constant" and not attrs["value"].is_splat():
        return "a constant that is not one repeated value is read from memory"
    if op in _ARITH and result_dtypes[0].is_int and op in ("div", "pow"):
        return f"{op} on integers"
    if op in _ARITH and result_dtypes[0].is_bool:
        return f"{op} on bool"
    if op in (_FLOAT_UNARY | _GRADS) and not result_dtypes[0].is_float:
        return f"{op} with a {result_dtypes[0]} result"
    return None


@dataclass
class Lowered:
    """One kernel: its LLVM IR and how to call it."""

    name: str
    ir: str
    n_inputs: int
    n_outputs: int
    shape: tuple[int, ...]            # the iteration space (every output's shape)
    loops: tuple[int, ...]            # its dims after merging; the kernel splits loops[0]
    math: set[str] = field(default_factory=set)


class _Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0
        self.math: set[str] = set()
        self.scalar_calls = False  # a libm call in the loop: LLVM cannot vectorize it

    def tmp(self) -> str:
        self.n += 1
        return f"%t{self.n}"

    def op(self, text: str) -> str:
        t = self.tmp()
        self.lines.append(f"  {t} = {text}")
        return t


def _strides_in(shape: tuple[int, ...], space: tuple[int, ...]) -> list[int]:
    """Element strides of a contiguous tensor of ``shape`` over the iteration ``space``
    (right-aligned, 0 where it broadcasts)."""
    out = [0] * len(space)
    s = 1
    for k in range(1, len(shape) + 1):
        d = shape[-k]
        if d != 1:
            out[-k] = s
        s *= d
    return out


def merge_dims(space: tuple[int, ...], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge adjacent dims that every operand walks alike."""
    dims = [(d, [s[k] for s in strides]) for k, d in enumerate(space) if d != 1]
    if not dims:
        return [1], [[0] for _ in strides]
    out_d = [dims[0][0]]
    out_s = [list(dims[0][1])]
    for d, ss in dims[1:]:
        prev = out_s[-1]
        if all(p == s * d for p, s in zip(prev, ss)):
            out_d[-1] *= d
            out_s[-1] = list(ss)
        else:
            out_d.append(d)
            out_s.append(list(ss))
    per_operand = [[out_s[k][i] for k in range(len(out_d))] for i in range(len(strides))]
    return out_d, per_operand


def _ty(dt: DType) -> str:
    return KERNEL_DTYPES[dt.name]


def _const(value: Any, dt: DType) -> str:
    if dt.name == "f32":
        return f32c(float(value))
    if dt.name == "f64":
        return f64c(float(value))
    if dt.is_bool:
        return "true" if bool(value) else "false"
    return str(int(value))


def _convert(e: _Emitter, v: str, src: DType, dst: DType) -> str:
    """``v`` of ``src`` as ``dst`` with the cast op's semantics (docs/ir.md)."""
    if src == dst:
        return v
    s, d = _ty(src), _ty(dst)
    if dst.is_bool:
        if src.is_float:
            return e.op(f"fcmp une {s} {v}, 0.0")
        return e.op(f"icmp ne {s} {v}, 0")
    if src.is_bool:
        return e.op(f"uitofp i1 {v} to {d}") if dst.is_float else e.op(f"zext i1 {v} to {d}")
    if src.is_float and dst.is_float:
        return e.op(f"fpext {s} {v} to {d}") if dst.bits > src.bits else e.op(f"fptrunc {s} {v} to {d}")
    if src.is_float:  # to an integer: toward zero, saturating, NaN to 0
        return e.op(f"call {d} @llvm.fptosi.sat.{d}.{'f32' if s == 'float' else 'f64'}({s} {v})")
    if dst.is_float:
        return e.op(f"sitofp {s} {v} to {d}")
    return e.op(f"sext {s} {v} to {d}") if dst.bits > src.bits else e.op(f"trunc {s} {v} to {d}")


def _is_number_literal(v: str) -> bool:
    """An immediate (a scalar fill) that is a number, not NaN."""
    import struct

    if v.startswith("0x"):
        bits = int(v, 16)
        d = struct.unpack("d", struct.pack("Q", bits))[0]
        return d == d
    try:
        float(v)
        return True
    except ValueError:
        return False


def _fmax(e: _Emitter, t: str, a: str, b: str, greater: bool) -> str:
    """NaN-propagating max/min: a if a is beyond b or a is NaN, else b."""
    c = e.op(f"fcmp {'ogt' if greater else 'olt'} {t} {a}, {b}")
    n = e.op(f"fcmp uno {t} {a}, 0.0")
    k = e.op(f"or i1 {c}, {n}")
    return e.op(f"select i1 {k}, {t} {a}, {t} {b}")


def _call_math(e: _Emitter, fn: str, v: str, dt: DType) -> str:
    if dt.name == "f32":
        name = {"exp": "pt_expf", "log": "pt_logf", "tanh": "pt_tanhf", "erf": "pt_erff"}.get(fn)
        if name is not None:
            e.math.add(name)
            return e.op(f"call float @{name}(float {v})")
        e.scalar_calls = True
        return e.op(f"call float @llvm.{fn}.f32(float {v})")  # sin, cos: libm through the intrinsic
    e.scalar_calls = True
    e.math.add(F64_LIBM[fn])
    return e.op(f"call double @{F64_LIBM[fn]}(double {v})")


def _lower_node(e: _Emitter, op: str, attrs: dict, args: list[tuple[str, DType]], out: DType,
                splat_rhs: float | None) -> str:
    t = _ty(out)
    if op in _PASS:
        return _convert(e, args[0][0], args[0][1], out)
    if op == "cast":
        return _convert(e, args[0][0], args[0][1], out)
    if op in _COMPARE:
        from ..ir.dtypes import promote

        ct = promote(args[0][1], args[1][1])
        a = _convert(e, args[0][0], args[0][1], ct)
        b = _convert(e, args[1][0], args[1][1], ct)
        fp, ip = _COMPARE[op]
        if ct.is_float:
            return e.op(f"fcmp {fp} {_ty(ct)} {a}, {b}")
        if ct.is_bool:
            return e.op(f"icmp {'u' + ip[1:] if ip[0] == 's' else ip} i1 {a}, {b}")
        return e.op(f"icmp {ip} {_ty(ct)} {a}, {b}")
    if op in _LOGIC:
        bs = [_convert(e, v, d, _bool()) for v, d in args]
        if op == "logical_not":
            return e.op(f"xor i1 {bs[0]}, true")
        return e.op(f"{'and' if op == 'logical_and' else 'or'} i1 {bs[0]}, {bs[1]}")
    if op == "where":
        c = _convert(e, args[0][0], args[0][1], _bool())
        a = _convert(e, args[1][0], args[1][1], out)
        b = _convert(e, args[2][0], args[2][1], out)
        return e.op(f"select i1 {c}, {t} {a}, {t} {b}")
    xs = [_convert(e, v, d, out) for v, d in args]
    x = xs[0]
    fl = out.is_float
    if op in _ARITH:
        y = xs[1]
        if op in ("add", "sub", "mul", "div"):
            name = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}[op]
            return e.op(f"{'f' if fl else ''}{name} {t} {x}, {y}")
        if op in ("maximum", "minimum"):
            if fl:
                # Against a constant that is not NaN (a clamp bound): select(x < c, c, x) keeps a
                # NaN x (the compare is false) and is one vmaxps/vminps, where the general form
                # needs a compare, a NaN test, an or and a blend.
                for a, c in ((x, y), (y, x)):
                    if _is_number_literal(c):
                        cmp = e.op(f"fcmp {'olt' if op == 'maximum' else 'ogt'} {t} {a}, {c}")
                        return e.op(f"select i1 {cmp}, {t} {c}, {t} {a}")
                return _fmax(e, t, x, y, op == "maximum")
            c = e.op(f"icmp {'sgt' if op == 'maximum' else 'slt'} {t} {x}, {y}")
            return e.op(f"select i1 {c}, {t} {x}, {t} {y}")
        # pow: small integer and half exponents exactly as multiplications / sqrt
        if splat_rhs == 2.0:
            return e.op(f"fmul {t} {x}, {x}")
        if splat_rhs == 3.0:
            sq = e.op(f"fmul {t} {x}, {x}")
            return e.op(f"fmul {t} {sq}, {x}")
        if splat_rhs == 1.0:
            return x
        if splat_rhs == 0.5:
            return e.op(f"call {t} @llvm.sqrt.{_suffix(out)}({t} {x})")
        e.scalar_calls = True
        return e.op(f"call {t} @llvm.pow.{_suffix(out)}({t} {x}, {t} {y})")
    if op == "neg":
        return e.op(f"fneg {t} {x}") if fl else e.op(f"sub {t} 0, {x}")
    if op == "abs":
        if fl:
            return e.op(f"call {t} @llvm.fabs.{_suffix(out)}({t} {x})")
        n = e.op(f"sub {t} 0, {x}")
        c = e.op(f"icmp slt {t} {x}, 0")
        return e.op(f"select i1 {c}, {t} {n}, {t} {x}")
    if op == "relu":
        zero = "0.0" if fl else "0"
        c = e.op(f"{'fcmp olt' if fl else 'icmp slt'} {t} {x}, {zero}")
        return e.op(f"select i1 {c}, {t} {zero}, {t} {x}")
    if op == "sign":
        one, mone, zero = ("1.0", "-1.0", "0.0") if fl else ("1", "-1", "0")
        pos = e.op(f"{'fcmp ogt' if fl else 'icmp sgt'} {t} {x}, {zero}")
        neg = e.op(f"{'fcmp olt' if fl else 'icmp slt'} {t} {x}, {zero}")
        z = x
        if fl:  # NaN gives 0, as in PyTorch (and the op's reference)
            nan = e.op(f"fcmp uno {t} {x}, 0.0")
            z = e.op(f"select i1 {nan}, {t} 0.0, {t} {x}")
        a = e.op(f"select i1 {neg}, {t} {mone}, {t} {z}")
        return e.op(f"select i1 {pos}, {t} {one}, {t} {a}")
    if op in _GRADS:
        return _lower_grad(e, op, attrs, xs[0], xs[1], out)
    if op == "sqrt":
        return e.op(f"call {t} @llvm.sqrt.{_suffix(out)}({t} {x})")
    if op == "rsqrt":
        s = e.op(f"call {t} @llvm.sqrt.{_suffix(out)}({t} {x})")
        return e.op(f"fdiv {t} {_const(1.0, out)}, {s}")
    if op in ("exp", "log", "tanh", "erf", "sin", "cos"):
        return _call_math(e, op, x, out)
    if op == "sigmoid":
        n = e.op(f"fneg {t} {x}")
        ex = _call_math(e, "exp", n, out)
        d = e.op(f"fadd {t} {_const(1.0, out)}, {ex}")
        return e.op(f"fdiv {t} {_const(1.0, out)}, {d}")
    if op == "silu":
        n = e.op(f"fneg {t} {x}")
        ex = _call_math(e, "exp", n, out)
        d = e.op(f"fadd {t} {_const(1.0, out)}, {ex}")
        return e.op(f"fdiv {t} {x}, {d}")
    if op == "gelu":
        if attrs.get("approximate", "none") == "tanh":
            if out.name == "f32" and gelu_form.enabled():  # x / (1 + exp(-2u)): gelu_form.py
                return gelu_form.gelu_tanh_ir(e.op, lambda v: _call_math(e, "exp", v, out),
                                              lambda v: _const(v, out), x, t)
            # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), ATen's order
            x3 = e.op(f"fmul {t} {x}, {x}")
            x3 = e.op(f"fmul {t} {x3}, {x}")
            k = e.op(f"fmul {t} {x3}, {_const(0.044715, out)}")
            inner = e.op(f"fadd {t} {x}, {k}")
            inner = e.op(f"fmul {t} {inner}, {_const(math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, out)}")
            th = _call_math(e, "tanh", inner, out)
            one = e.op(f"fadd {t} {th}, {_const(1.0, out)}")
            h = e.op(f"fmul {t} {x}, {_const(0.5, out)}")
            return e.op(f"fmul {t} {h}, {one}")
        s = e.op(f"fmul {t} {x}, {_const(math.sqrt(0.5), out)}")
        er = _call_math(e, "erf", s, out)
        one = e.op(f"fadd {t} {er}, {_const(1.0, out)}")
        h = e.op(f"fmul {t} {x}, {_const(0.5, out)}")
        return e.op(f"fmul {t} {h}, {one}")
    raise LoweringError(f"no lowering for {op}")


def _lower_grad(e: _Emitter, op: str, attrs: dict, dy: str, x: str, out: DType) -> str:
    """The activation gradients, in their references' operation order (partita/ops/backward.py)."""
    t = _ty(out)

    def c(v: float) -> str:
        return _const(v, out)

    def f(opname: str, a: str, b: str) -> str:
        return e.op(f"{opname} {t} {a}, {b}")

    if op == "relu_grad":
        pos = e.op(f"fcmp ogt {t} {x}, 0.0")
        return e.op(f"select i1 {pos}, {t} {dy}, {t} 0.0")
    if op == "sigmoid_grad":
        return f("fmul", f("fmul", dy, x), f("fsub", c(1.0), x))
    if op == "tanh_grad":
        return f("fmul", dy, f("fsub", c(1.0), f("fmul", x, x)))
    if op == "silu_grad":
        ex = _call_math(e, "exp", e.op(f"fneg {t} {x}"), out)
        s = f("fdiv", c(1.0), f("fadd", c(1.0), ex))
        return f("fmul", f("fmul", dy, s), f("fadd", c(1.0), f("fmul", x, f("fsub", c(1.0), s))))
    k = math.sqrt(2.0 / math.pi)
    if attrs.get("approximate", "none") == "tanh":
        x3 = f("fmul", f("fmul", x, x), x)
        inner = f("fmul", c(k), f("fadd", x, f("fmul", c(0.044715), x3)))
        th = _call_math(e, "tanh", inner, out)
        dinner = f("fmul", c(k), f("fadd", c(1.0), f("fmul", f("fmul", c(3.0 * 0.044715), x), x)))
        a = f("fmul", c(0.5), f("fadd", c(1.0), th))
        b = f("fmul", f("fmul", f("fmul", c(0.5), x), f("fsub", c(1.0), f("fmul", th, th))), dinner)
        return f("fmul", dy, f("fadd", a, b))
    er = _call_math(e, "erf", f("fdiv", x, c(math.sqrt(2.0))), out)
    cdf = f("fmul", c(0.5), f("fadd", c(1.0), er))
    ex = _call_math(e, "exp", f("fmul", f("fmul", c(-0.5), x), x), out)
    pdf = f("fdiv", ex, c(math.sqrt(2.0 * math.pi)))
    return f("fmul", dy, f("fadd", cdf, f("fmul", x, pdf)))


def _bool() -> DType:
    from ..ir.dtypes import bool_

    return bool_


def _suffix(dt: DType) -> str:
    return "f32" if dt.name == "f32" else "f64"


def _splat_of(v: Value) -> float | None:
    """The one value of a splat constant or a scalar fill, else None."""
    p = v.producer
    if p is None:
        return None
    if p.op == "full":
        return float(p.attrs["value"]) if not isinstance(p.attrs["value"], bool) else None
    if p.op == "constant" and p.attrs["value"].is_splat():
        sv = p.attrs["value"].splat_value()
        try:
            return float(sv)
        except (TypeError, ValueError):
            return None
    return None


def _used_declarations(decls: str, fn: str) -> str:
    """The declarations (and helper bodies) that ``fn`` or a kept helper calls."""
    import re

    blocks = re.split(r"\n(?=declare |define )", decls)
    named: dict[str, str] = {}
    for b in blocks:
        m = re.search(r"@([\w.]+)\(", b)
        if m is not None:
            named[m.group(1)] = b
    keep: list[str] = []
    text = fn
    changed = True
    while changed:
        changed = False
        for nm, b in named.items():
            if b not in keep and re.search(r"@" + re.escape(nm) + r"\(", text):
                keep.append(b)
                text += "\n" + b
                changed = True
    return "\n".join(b for b in blocks if b in keep)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _refine(shapes: list[tuple[int, ...]]) -> list[int]:
    """The coarsest dims (outer to inner) that every shape in ``shapes`` (all of one numel) is
    a grouping of: cut the flat index at every suffix product of every shape."""
    cuts = {1}
    for sh in shapes:
        p = 1
        for d in reversed(sh):
            p *= d
            cuts.add(p)
    c = sorted(cuts)
    return [c[j + 1] // c[j] for j in range(len(c) - 1)][::-1] or [1]


def _to_refined(shape: tuple[int, ...], strides: list[int], refined: list[int]) -> list[int]:
    """Strides over ``refined`` of an operand walked with ``strides`` over ``shape``."""
    out = []
    inner = 1  # product of the refined dims inside the current one
    bounds = []  # (inner product of dim k, stride of dim k), from the innermost dim out
    p = 1
    for d, st in zip(reversed(shape), reversed(strides)):
        bounds.append((p, p * d, st))
        p *= d
    for rd in reversed(refined):
        for lo, hi, st in bounds:
            if lo <= inner < hi:
                out.append(st * (inner // lo))
                break
        else:
            out.append(0)
        inner *= rd
    return out[::-1]


def _check_dtypes(ins: list[Value], outs: list[Value]) -> None:
    """Refuse a kernel whose inputs or outputs have a dtype kernels do not take."""
    for v in (*ins, *outs):
        if v.type.dtype.name not in KERNEL_DTYPES:
            raise LoweringError(f"%{v.name or '?'} is {v.type.dtype} (kernels take {', '.join(KERNEL_DTYPES)})")


def _splat_value(node: Node) -> tuple[str, DType]:
    """The immediate that a ``full`` (or splat constant) node's result is."""
    r = node.results[0]
    sv = node.attrs["value"] if node.op == "full" else node.attrs["value"].splat_value()
    return _const(sv, r.type.dtype), r.type.dtype


def _lower_op(e: _Emitter, node: Node, args: list[tuple[str, DType]]) -> tuple[str, DType]:
    """``node`` computed on ``args``: its result's register and dtype."""
    r = node.results[0]
    splat_rhs = _splat_of(node.operands[1]) if node.op == "pow" else None
    return _lower_node(e, node.op, node.attrs, args, r.type.dtype, splat_rhs), r.type.dtype


def _load(e: _Emitter, arg: int, dt: DType, off: str) -> str:
    """Element ``off`` of kernel argument ``%a{arg}`` loaded (a bool's byte as an i1)."""
    ptr = e.op(f"getelementptr inbounds {_MEM[dt.name]}, ptr %a{arg}, i64 {off}")
    ld = e.op(f"load {_MEM[dt.name]}, ptr {ptr}")
    if dt.is_bool:
        ld = e.op(f"icmp ne i8 {ld}, 0")
    return ld


def _load_once(e: _Emitter, loaded: dict[int, tuple[str, DType]], slot: int, arg: int, dt: DType,
               off: str) -> tuple[str, DType]:
    """The view ``slot`` loaded at ``off``, the first time it is asked for; later, that load."""
    if slot not in loaded:
        loaded[slot] = (_load(e, arg, dt, off), dt)
    return loaded[slot]


def _store(e: _Emitter, val: str, dt: DType, want: DType, arg: int, off: str) -> None:
    """``val`` (of ``dt``) converted to ``want`` and stored at element ``off`` of ``%a{arg}``."""
    val = _convert(e, val, dt, want)
    if want.is_bool:
        val = e.op(f"zext i1 {val} to i8")
    ptr = e.op(f"getelementptr inbounds {_MEM[want.name]}, ptr %a{arg}, i64 {off}")
    e.lines.append(f"  store {_MEM[want.name]} {val}, ptr {ptr}")


def _kernel_ir(name: str, comment: str, n_ins: int, n_outs: int, lines: list[str], e: _Emitter) -> str:
    """The module of one kernel: the comment, the declarations its body uses, the function of
    ``lines`` and the loop metadata."""
    params = ", ".join([f"ptr noalias nocapture readonly %a{i}" for i in range(n_ins)] +
                       [f"ptr noalias nocapture %a{n_ins + i}" for i in range(n_outs)] + ["i64 %lo", "i64 %hi"])
    fn = f"define void @{name}({params}) nounwind {{\n" + "\n".join(lines) + "\n}"
    extra = ["declare i32 @llvm.fptosi.sat.i32.f32(float)", "declare i64 @llvm.fptosi.sat.i64.f32(float)",
             "declare i32 @llvm.fptosi.sat.i32.f64(double)", "declare i64 @llvm.fptosi.sat.i64.f64(double)",
             "declare double @llvm.sin.f64(double)", "declare double @llvm.cos.f64(double)"]
    decls = _used_declarations("\n".join([declarations(e.math)] + extra), fn)
    meta = f'!0 = distinct !{{!0, !1}}\n!1 = !{{!"llvm.loop.vectorize.width", i32 {vector_width()}}}'
    if e.scalar_calls:  # asking for vector lanes LLVM cannot give only makes it print a remark
        fn = fn.replace(", !llvm.loop !0", "")
    return "\n\n".join([comment, decls, fn, meta]) + "\n"


def _flat_views(body: Graph, ins: list[Value], outs: list[Value], n: int) \
        -> tuple[set[Value], dict[Value, int], list[tuple[int, tuple[int, ...], tuple[int, ...]]],
                 dict[tuple[int, tuple[int, ...], tuple[int, ...]], int], list[tuple[int, ...]]]:
    """The values of the kernel's full size read from memory, the argument each value read
    from memory comes from (an input, or a reshape of one that is smaller than the kernel: the
    same memory in another shape, an index map), the views its ops read them through ((argument,
    the shape the memory is taken in, the shape it is read in), in order of first use), each
    view's slot, and every shape the iteration space is walked in."""
    index = {v: i for i, v in enumerate(ins)}
    full = {v for v in ins if _numel(v.type.shape) == n}
    views: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    view_of: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = {}
    shapes = [tuple(o.type.shape) for o in outs] + [tuple(v.type.shape) for v in full]
    for node in body.nodes:
        r = node.results[0]
        if node.op in _SPLATS:
            continue
        if node.op == "reshape" and _numel(r.type.shape) != n and node.operands[0] in index:
            index[r] = index[node.operands[0]]   # a smaller input in another shape: read where it lies
            continue
        if _numel(r.type.shape) != n:
            raise LoweringError(f"{node.op} computes {list(r.type.shape)}, not the kernel's {n} elements "
                                "(a smaller value is computed outside and read as an input)")
        shapes.append(tuple(r.type.shape))
        for v in node.operands:
            if v in index:
                shp = tuple(v.type.shape) if v in full else tuple(r.type.shape)
                key = (index[v], tuple(v.type.shape), shp)
                if key not in view_of:
                    if v not in full and (len(v.type.shape) > len(shp) or any(
                            d not in (1, s) for d, s in zip(v.type.shape[::-1], shp[::-1]))):
                        raise LoweringError(f"input %{v.name} of shape {list(v.type.shape)} does not broadcast to "
                                            f"{list(shp)}")
                    view_of[key] = len(views)
                    views.append(key)
    return full, index, views, view_of, shapes


def _flat_loop_heads(loops: list[int], per: list[list[int]], n_ops: int) -> tuple[list[str], list[str]]:
    """The heads of the loop nest over ``loops`` (the outermost from ``%lo``), and each
    operand's offset expression in the innermost loop."""
    k = len(loops)
    offs = ["0"] * n_ops  # offset expression of each operand at the enclosing level
    blocks: list[str] = []
    for j in range(k):
        prev = "entry" if j == 0 else f"L{j - 1}"
        start = "%lo" if j == 0 else "0"
        blocks.append(f"L{j}:")
        blocks.append(f"  %i{j} = phi i64 [ {start}, %{prev} ], [ %i{j}n, %{'L' + str(j) if j == k - 1 else 'X' + str(j)} ]")
        new_offs = []
        for i in range(n_ops):
            s = per[i][j]
            if s == 0:
                new_offs.append(offs[i])
                continue
            if s == 1:
                term = f"%i{j}"
            else:
                term = f"%s{j}_{i}"
                blocks.append(f"  {term} = mul nsw i64 %i{j}, {s}")
            if offs[i] == "0":
                new_offs.append(term)
            else:
                nm = f"%o{j}_{i}"
                blocks.append(f"  {nm} = add nsw i64 {offs[i]}, {term}")
                new_offs.append(nm)
        offs = new_offs
        if j < k - 1:
            blocks.append(f"  br label %L{j + 1}")
    return blocks, offs


def _flat_body(e: _Emitter, body: Graph, ins: list[Value], outs: list[Value], full: set[Value],
               index: dict[Value, int], view_of: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int],
               offs: list[str]) -> None:
    """The innermost loop's body into ``e``: the inputs' loads, the body's nodes, the stores."""
    env: dict[Value, tuple[str, DType]] = {}
    loaded: dict[int, tuple[str, DType]] = {}

    def load(v: Value, consumer_shape: tuple[int, ...]) -> tuple[str, DType]:
        shp = tuple(v.type.shape) if v in full else consumer_shape
        slot = view_of[(index[v], tuple(v.type.shape), shp)]
        return _load_once(e, loaded, slot, index[v], v.type.dtype, offs[slot])

    for node in body.nodes:
        r = node.results[0]
        if len(node.results) != 1:
            raise LoweringError(f"{node.op} has {len(node.results)} results")
        if r in index:   # an input in another shape (_flat_views): read where it is used
            continue
        why = supported(node.op, [v.type.dtype for v in node.operands], [r.type.dtype], node.attrs)
        if why is not None:
            raise LoweringError(why)
        if node.op in _SPLATS:
            env[r] = _splat_value(node)
            continue
        args = [env[v] if v in env else load(v, tuple(r.type.shape)) for v in node.operands]
        env[r] = _lower_op(e, node, args)
    n_views = len(view_of)
    for i, o in enumerate(outs):
        val, dt = env[o] if o in env else load(o, tuple(o.type.shape))
        _store(e, val, dt, o.type.dtype, len(ins) + i, offs[n_views + i])


def _flat_latches(loops: list[int]) -> list[str]:
    """The loop nest's latches, innermost first, and the exit."""
    blocks: list[str] = []
    inner = len(loops) - 1
    end = "%hi" if inner == 0 else str(loops[inner])
    blocks.append(f"  %i{inner}n = add nsw i64 %i{inner}, 1")
    blocks.append(f"  %d{inner} = icmp eq i64 %i{inner}n, {end}")
    nxt = "exit" if inner == 0 else f"X{inner - 1}"
    blocks.append(f"  br i1 %d{inner}, label %{nxt}, label %L{inner}, !llvm.loop !0")
    for j in range(inner - 1, -1, -1):
        end = "%hi" if j == 0 else str(loops[j])
        blocks.append(f"X{j}:")
        blocks.append(f"  %i{j}n = add nsw i64 %i{j}, 1")
        blocks.append(f"  %d{j} = icmp eq i64 %i{j}n, {end}")
        blocks.append(f"  br i1 %d{j}, label %{'exit' if j == 0 else 'X' + str(j - 1)}, label %L{j}")
    blocks.append("exit:")
    blocks.append("  ret void")
    return blocks


def lower(body: Graph, name: str) -> Lowered:
    """LLVM IR for ``body`` as kernel ``name``; raises LoweringError when it cannot.

    Every computed value and every output has the outputs' element count N; they are walked by
    one flat index (reshapes are free). Inputs with fewer elements are read through broadcast
    strides in the shape of the op that reads them; scalar fills are immediates."""
    body = gelu_form.spelled_gelu_to_op(body)  # GELU's tanh form written out: one op
    outs = list(body.outputs)
    if not outs:
        raise LoweringError("a kernel body without outputs")
    if any(nd.op in REDUCTIONS for nd in body.nodes):
        return _lower_reduction(body, name)
    space = tuple(outs[0].type.shape)
    n = _numel(space)
    ins = list(body.inputs)
    _check_dtypes(ins, outs)
    for o in outs:
        if _numel(o.type.shape) != n:
            raise LoweringError(f"kernel outputs of different sizes ({list(space)} and {list(o.type.shape)})")
    full, index, views, view_of, shapes = _flat_views(body, ins, outs, n)
    refined = _refine(shapes) if n else [0]
    strides = [_to_refined(shp, _strides_in(src, shp), refined) for _, src, shp in views]
    strides += [_to_refined(tuple(o.type.shape), _strides_in(tuple(o.type.shape), tuple(o.type.shape)), refined)
                for o in outs]
    loops, per = merge_dims(tuple(refined), strides)
    e = _Emitter()
    head = ["entry:", "  %empty = icmp sge i64 %lo, %hi", "  br i1 %empty, label %exit, label %L0"]
    blocks, offs = _flat_loop_heads(loops, per, len(views) + len(outs))
    _flat_body(e, body, ins, outs, full, index, view_of, offs)
    blocks += e.lines
    blocks += _flat_latches(loops)
    comment = (f"; partita kernel {name}: {len(ins)} input(s), {len(outs)} output(s), "
               f"space {list(space)}, loops {loops}")
    ir = _kernel_ir(name, comment, len(ins), len(outs), head + blocks, e)
    return Lowered(name, ir, len(ins), len(outs), space, tuple(loops), e.math)


# --- row reductions --------------------------------------------------------------------------
#
# A body with sum/mean/max/min nodes is a row-reduction kernel: its full-size values (the
# prologue, N elements) are reduced over their trailing C elements into R = N / C row values,
# and row-size ops after the reductions (the epilogue: ``rsqrt(mean + eps)``) are computed once
# per row. For each row the kernel runs one loop over the row's C elements that computes the
# prologue and updates every accumulator, then finishes the statistics and the epilogue and
# stores the row's outputs. Sums accumulate with ``reassoc`` so that LLVM vectorizes them with
# several partial sums (ATen's own reductions also add in blocks; the result differs from a
# sequential sum by rounding only). max/min propagate NaN.

REDUCTIONS = {"sum", "mean", "max", "min"}


def reduced_axes(shape: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    axes = attrs.get("axes")
    r = len(shape)
    if axes is None:
        return tuple(range(r))
    return tuple(sorted(a % r if r else 0 for a in axes))


def trailing_reduction(shape: tuple[int, ...], attrs: dict) -> int | None:
    """C, the elements reduced per row, when the reduction is over trailing axes; else None."""
    axes = reduced_axes(shape, attrs)
    r = len(shape)
    if not axes or axes != tuple(range(r - len(axes), r)):
        return None
    c = _numel(shape[r - len(axes):])
    return c if c > 0 else None


def _nest(tag: str, dims: list[int], per: list[list[int]], base: list[str], lo: str | None, hi: str | None,
          body: "Any") -> tuple[list[str], list[str]]:
    """A loop nest over ``dims`` (outer to inner) with operand offsets; ``body(offs)`` gives the
    innermost lines. Returns (lines of the nest, the label the nest exits to is '<tag>.exit')."""
    k = len(dims)
    lines: list[str] = [f"{tag}pre:", f"  br label %{tag}L0"]  # the caller branches to <tag>pre
    offs = list(base)
    for j in range(k):
        prev = f"{tag}pre" if j == 0 else f"{tag}L{j - 1}"
        start = lo if (j == 0 and lo is not None) else "0"
        latch = f"{tag}B" if j == k - 1 else f"{tag}X{j}"
        lines.append(f"{tag}L{j}:")
        lines.append(f"  %{tag}i{j} = phi i64 [ {start}, %{prev} ], [ %{tag}i{j}n, %{latch} ]")
        new = []
        for i, ss in enumerate(per):
            s = ss[j]
            if s == 0:
                new.append(offs[i])
                continue
            term = f"%{tag}i{j}" if s == 1 else f"%{tag}s{j}_{i}"
            if s != 1:
                lines.append(f"  {term} = mul nsw i64 %{tag}i{j}, {s}")
            if offs[i] == "0":
                new.append(term)
            else:
                nm = f"%{tag}o{j}_{i}"
                lines.append(f"  {nm} = add nsw i64 {offs[i]}, {term}")
                new.append(nm)
        offs = new
        if j < k - 1:
            lines.append(f"  br label %{tag}L{j + 1}")
    inner = body(offs)
    lines += inner
    lines.append(f"  br label %{tag}B")
    lines.append(f"{tag}B:")
    end = hi if (k - 1 == 0 and hi is not None) else str(dims[k - 1])
    lines.append(f"  %{tag}i{k - 1}n = add nsw i64 %{tag}i{k - 1}, 1")
    lines.append(f"  %{tag}d{k - 1} = icmp eq i64 %{tag}i{k - 1}n, {end}")
    nxt = f"{tag}exit" if k == 1 else f"{tag}X{k - 2}"
    lines.append(f"  br i1 %{tag}d{k - 1}, label %{nxt}, label %{tag}L{k - 1}, !llvm.loop !0")
    for j in range(k - 2, -1, -1):
        end = hi if (j == 0 and hi is not None) else str(dims[j])
        lines.append(f"{tag}X{j}:")
        lines.append(f"  %{tag}i{j}n = add nsw i64 %{tag}i{j}, 1")
        lines.append(f"  %{tag}d{j} = icmp eq i64 %{tag}i{j}n, {end}")
        lines.append(f"  br i1 %{tag}d{j}, label %{tag + 'exit' if j == 0 else tag + 'X' + str(j - 1)}, label %{tag}L{j}")
    lines.append(f"{tag}exit:")
    return lines, offs


_ViewSlots = dict[tuple[int, tuple[int, ...]], int]   # (input index, shape it is read in) -> slot


@dataclass
class _RowKernel:
    """A row-reduction kernel's body and what the lowering found in it: its reductions, the
    C elements of a row, which values are per row, the views inputs are read through and each
    reduction's accumulator."""
    body: Graph
    ins: list[Value]
    outs: list[Value]
    reds: list[Node]
    c: int
    n_full: int
    n_rows: int
    row: set[Value]
    full_views: _ViewSlots
    row_views: _ViewSlots

    @property
    def index(self) -> dict[Value, int]:
        """Each input's argument index."""
        return {v: i for i, v in enumerate(self.ins)}

    @property
    def acc_of(self) -> dict[Node, str]:
        """Each reduction's accumulator (an alloca)."""
        return {r: f"%acc{k}" for k, r in enumerate(self.reds)}


def _reductions(body: Graph) -> tuple[list[Node], int, int]:
    """The body's reductions, C (the elements each reduces per row) and the full size; refuses
    reductions that are not over the same trailing axes or not of floats."""
    reds = [n for n in body.nodes if n.op in REDUCTIONS]
    src = reds[0].operands[0]
    n_full = src.type.numel
    c = trailing_reduction(tuple(src.type.shape), reds[0].attrs)
    if c is None:
        raise LoweringError("a reduction that is not over trailing axes")
    for r in reds:
        if r.operands[0].type.numel != n_full or trailing_reduction(tuple(r.operands[0].type.shape), r.attrs) != c:
            raise LoweringError("reductions over different rows in one kernel")
        if not r.results[0].type.dtype.is_float:
            raise LoweringError(f"{r.op} on {r.results[0].type.dtype} (reductions take f32 and f64)")
    return reds, c, n_full


def _row_values(body: Graph, outs: list[Value], src_shape: tuple[int, ...], n_full: int, n_rows: int) \
        -> tuple[set[Value], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Which values are per row (the reductions and what is computed from them), and the
    shapes of the full-size and of the row values."""
    row: set[Value] = set()
    full_shapes: list[tuple[int, ...]] = [src_shape]
    row_shapes: list[tuple[int, ...]] = [tuple(o.type.shape) for o in outs]
    for node in body.nodes:
        res = node.results[0]
        if node.op in _SPLATS:
            continue
        if node.op in REDUCTIONS:
            row.add(res)
            row_shapes.append(tuple(res.type.shape))
            continue
        why = supported(node.op, [v.type.dtype for v in node.operands], [res.type.dtype], node.attrs)
        if why is not None:
            raise LoweringError(why)
        if any(v in row for v in node.operands) or res.type.numel == n_rows and n_rows != n_full:
            if res.type.numel != n_rows:
                raise LoweringError(f"{node.op} uses a row statistic at full size (computed in a kernel of its own)")
            row.add(res)
            row_shapes.append(tuple(res.type.shape))
        else:
            if res.type.numel != n_full:
                raise LoweringError(f"{node.op} computes {list(res.type.shape)}, neither a row nor the full size")
            full_shapes.append(tuple(res.type.shape))
    for o in outs:
        if o.type.numel != n_rows or (o not in row and o.producer is not None and o.producer.op not in _SPLATS):
            raise LoweringError("a reduction kernel's outputs are per row")
    return row, full_shapes, row_shapes


def _row_dims(c: int, n_full: int, full_shapes: list[tuple[int, ...]], row_shapes: list[tuple[int, ...]]) \
        -> tuple[list[int], list[int], list[int]]:
    """The dims (outer to inner), the outer ones (over the rows) and the inner ones (over a
    row's C elements): the full index cut at every full shape's boundaries, at C, and at every
    row shape's boundaries (times C)."""
    cuts = {1, c}
    for sh in full_shapes:
        p = 1
        for d in reversed(sh):
            p *= d
            cuts.add(p)
    for sh in row_shapes:
        p = 1
        for d in reversed(sh):
            p *= d
            cuts.add(p * c)
    cs = sorted(x for x in cuts if x <= n_full)
    refined = [cs[j + 1] // cs[j] for j in range(len(cs) - 1)][::-1] or [1]
    n_inner = sum(1 for j in range(len(cs) - 1) if cs[j] < c)
    if n_inner == 0:          # C == 1: one element per row
        refined, n_inner = refined + [1], 1
    if len(refined) == n_inner:  # one row
        refined = [1] + refined
    return refined, refined[:len(refined) - n_inner], refined[len(refined) - n_inner:]


def _row_views(body: Graph, ins: list[Value], row: set[Value], n_full: int, n_rows: int) \
        -> tuple[_ViewSlots, _ViewSlots]:
    """The views inputs are read through per element and per row, each with its slot; refuses
    an input that does not broadcast to the shape it is read in."""
    index = {v: i for i, v in enumerate(ins)}
    full_views: _ViewSlots = {}
    row_views: _ViewSlots = {}
    for node in body.nodes:
        res = node.results[0]
        if node.op in _SPLATS:
            continue
        for v in node.operands:
            if v not in index:
                continue
            if res in row and node.op not in REDUCTIONS:
                shp = tuple(v.type.shape) if v.type.numel == n_rows else tuple(res.type.shape)
                row_views.setdefault((index[v], shp), len(row_views))
            else:
                shp = tuple(v.type.shape) if v.type.numel == n_full else tuple(
                    (node.operands[0] if node.op in REDUCTIONS else res).type.shape)
                full_views.setdefault((index[v], shp), len(full_views))
    for (i, shp) in list(full_views) + list(row_views):
        v = ins[i]
        if v.type.numel not in (_numel(shp),) and (len(v.type.shape) > len(shp) or any(
                d not in (1, s) for d, s in zip(v.type.shape[::-1], shp[::-1]))):
            raise LoweringError(f"input %{v.name} of shape {list(v.type.shape)} does not broadcast to {list(shp)}")
    return full_views, row_views


def _row_loops(k: _RowKernel, refined: list[int], outer_dims: list[int], inner_dims: list[int]) \
        -> tuple[list[int], list[list[int]], list[int], list[list[int]]]:
    """The merged loops over the rows and over a row's elements, each with its operands'
    strides (the outer: full views, row views, outputs; the inner: full views)."""
    ins = k.ins
    full_strides = [_to_refined(shp, _strides_in(tuple(ins[i].type.shape), shp), refined) for (i, shp) in k.full_views]
    row_strides = [_to_refined(shp, _strides_in(tuple(ins[i].type.shape), shp), outer_dims) for (i, shp) in k.row_views]
    out_strides = [_to_refined(tuple(o.type.shape), _strides_in(tuple(o.type.shape), tuple(o.type.shape)), outer_dims)
                   for o in k.outs]
    n_outer = len(outer_dims)
    outer_per = [s[:n_outer] for s in full_strides] + row_strides + out_strides
    inner_per = [s[n_outer:] for s in full_strides]
    o_loops, o_per = merge_dims(tuple(outer_dims), outer_per) if outer_per else (merge_dims(tuple(outer_dims), [[0] * n_outer])[0], [])
    i_loops, i_per = merge_dims(tuple(inner_dims), inner_per) if inner_per else (merge_dims(tuple(inner_dims), [[0] * len(inner_dims)])[0], [])
    if not o_per:
        o_per = [[0] * len(o_loops)]
    return o_loops, o_per, i_loops, i_per


def _accumulate(e: _Emitter, k: _RowKernel, ioffs: list[str]) -> list[str]:
    """One element of a row: the full-size values computed and every accumulator updated."""
    e.lines = []
    env: dict[Value, tuple[str, DType]] = {}
    loaded: dict[int, tuple[str, DType]] = {}
    index, acc_of = k.index, k.acc_of

    def load(v: Value, shp: tuple[int, ...]) -> tuple[str, DType]:
        key = (index[v], tuple(v.type.shape) if v.type.numel == k.n_full else shp)
        slot = k.full_views[key]
        return _load_once(e, loaded, slot, index[v], v.type.dtype, ioffs[slot])

    for node in k.body.nodes:
        res = node.results[0]
        if res in k.row and node.op not in REDUCTIONS:
            continue
        if node.op in _SPLATS:
            env[res] = _splat_value(node)
            continue
        if node.op in REDUCTIONS:
            v = node.operands[0]
            val, dt = env[v] if v in env else load(v, tuple(v.type.shape))
            t = _ty(dt)
            acc = acc_of[node]
            cur = e.op(f"load {t}, ptr {acc}")
            if node.op in ("sum", "mean"):
                nxt = e.op(f"fadd reassoc {t} {cur}, {val}")
            else:  # NaN-propagating, as torch.max; LLVM vectorizes it as a reduction
                fn = "maximum" if node.op == "max" else "minimum"
                nxt = e.op(f"call {t} @llvm.{fn}.{_suffix(dt)}({t} {cur}, {t} {val})")
            e.lines.append(f"  store {t} {nxt}, ptr {acc}")
            continue
        args = [env[v] if v in env else load(v, tuple(res.type.shape)) for v in node.operands]
        env[res] = _lower_op(e, node, args)
    return list(e.lines)


def _finish_row(e: _Emitter, k: _RowKernel, offs: list[str]) -> list[str]:
    """A row's end: the statistics finished, the row epilogue computed, the outputs stored."""
    e.lines = []
    env: dict[Value, tuple[str, DType]] = {}
    index, acc_of = k.index, k.acc_of
    nf, nr = len(k.full_views), len(k.row_views)
    for node in k.body.nodes:
        res = node.results[0]
        if node.op in _SPLATS:
            env[res] = _splat_value(node)
            continue
        if res not in k.row:
            continue
        if node.op in REDUCTIONS:
            dt = res.type.dtype
            t = _ty(dt)
            acc = e.op(f"load {t}, ptr {acc_of[node]}")
            if node.op == "mean":
                acc = e.op(f"fdiv {t} {acc}, {_const(float(k.c), dt)}")
            env[res] = (acc, dt)
            continue
        args = []
        for x in node.operands:
            if x in env:
                args.append(env[x])
                continue
            key = (index[x], tuple(x.type.shape) if x.type.numel == k.n_rows else tuple(res.type.shape))
            slot = nf + k.row_views[key]
            args.append((_load(e, index[x], x.type.dtype, offs[slot]), x.type.dtype))
        env[res] = _lower_op(e, node, args)
    for i, o in enumerate(k.outs):
        val, dt = env[o]
        _store(e, val, dt, o.type.dtype, len(k.ins) + i, offs[nf + nr + i])
    return list(e.lines)


def _row(e: _Emitter, k: _RowKernel, i_loops: list[int], i_per: list[list[int]], offs: list[str]) -> list[str]:
    """One row: the accumulators set to their starts, the loop over its elements, its end."""
    lines: list[str] = []
    for j, r in enumerate(k.reds):
        dt = r.results[0].type.dtype
        init = {"sum": "0.0", "mean": "0.0", "max": "0xFFF0000000000000", "min": "0x7FF0000000000000"}[r.op]
        lines.append(f"  store {_ty(dt)} {init}, ptr %acc{j}")
    inner_base = offs[:len(k.full_views)]
    nest, _ = _nest("I", i_loops, i_per or [[0] * len(i_loops)], inner_base or ["0"], None, None,
                    lambda ioffs: _accumulate(e, k, ioffs))
    lines.append("  br label %Ipre")
    lines += nest
    return lines + _finish_row(e, k, offs)


def _lower_reduction(body: Graph, name: str) -> Lowered:
    """LLVM IR for a body with reductions as a row-reduction kernel (see above)."""
    outs = list(body.outputs)
    ins = list(body.inputs)
    _check_dtypes(ins, outs)
    reds, c, n_full = _reductions(body)
    n_rows = n_full // c
    row, full_shapes, row_shapes = _row_values(body, outs, tuple(reds[0].operands[0].type.shape), n_full, n_rows)
    refined, outer_dims, inner_dims = _row_dims(c, n_full, full_shapes, row_shapes)
    full_views, row_views = _row_views(body, ins, row, n_full, n_rows)
    k = _RowKernel(body, ins, outs, reds, c, n_full, n_rows, row, full_views, row_views)
    o_loops, o_per, i_loops, i_per = _row_loops(k, refined, outer_dims, inner_dims)
    e = _Emitter()
    lines = ["entry:"]
    for j, r in enumerate(reds):
        lines.append(f"  %acc{j} = alloca {_ty(r.results[0].type.dtype)}")
    lines.append("  %empty = icmp sge i64 %lo, %hi")
    lines.append("  br i1 %empty, label %exit, label %Opre")
    nest, _ = _nest("O", o_loops, o_per, ["0"] * len(o_per), "%lo", "%hi",
                    lambda offs: _row(e, k, i_loops, i_per, offs))
    lines += nest
    lines.append("  br label %exit")
    lines.append("exit:")
    lines.append("  ret void")
    comment = (f"; partita kernel {name}: row reduction, {len(ins)} input(s), {len(outs)} output(s), "
               f"{n_rows} rows of {c}, loops {o_loops} x {i_loops}")
    ir = _kernel_ir(name, comment, len(ins), len(outs), lines, e)
    return Lowered(name, ir, len(ins), len(outs), tuple(outs[0].type.shape), tuple(o_loops), e.math)
